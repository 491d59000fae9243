//! A moto S3 server on loopback for the S3 tests: `python -m moto.server` from the repository's venv (`.venv`, found
//! by walking up from the working directory, as go/internal/mototest does; python/run_tests.sh creates it with
//! moto[server]), and plain HTTP to it over `std::net::TcpStream` (moto takes unsigned requests) to make buckets and
//! look at what a test left there. Without the venv or moto, [`Moto::start`] says why and the tests skip.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The credentials and region the server is started with, and which the tests sign with.
pub const KEY_ID: &str = "testing";
pub const SECRET: &str = "testing";
pub const REGION: &str = "us-east-1";

/// The AWS_* variables a test may set, all of them, so that a test can clear what it does not set.
pub const AWS_VARS: [&str; 7] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
];

/// The venv's interpreter, found above the working directory.
fn python() -> Result<PathBuf, String> {
    let mut dir = std::env::current_dir().map_err(|e| e.to_string())?;
    loop {
        let p = dir.join(".venv/bin/python");
        if p.exists() {
            return Ok(p);
        }
        if !dir.pop() {
            return Err("no .venv/bin/python above the working directory (python/run_tests.sh creates it)".into());
        }
    }
}

/// A running moto server, stopped (killed and waited for) on drop.
pub struct Moto {
    child: Child,
    port: u16,
    log: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

impl Moto {
    /// Starts a server on a free port of 127.0.0.1 and waits until it answers; `Err(why)` when the venv or moto is
    /// missing (the caller skips, saying so). Panics if moto starts but does not serve.
    pub fn start() -> Result<Moto, String> {
        let py = python()?;
        let probe = Command::new(&py).args(["-c", "import moto.server"]).output().map_err(|e| e.to_string())?;
        if !probe.status.success() {
            return Err(format!(
                "{} cannot import moto.server (install it with `.venv/bin/pip install 'moto[server]'`): {}",
                py.display(),
                String::from_utf8_lossy(&probe.stderr).lines().last().unwrap_or("")
            ));
        }
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::env::temp_dir().join(format!("distckpt-rs-moto-{}-{port}.log", std::process::id()));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(&py)
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
            .env("AWS_ACCESS_KEY_ID", KEY_ID)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_DEFAULT_REGION", REGION)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", py.display()))?;
        let mut moto = Moto { child, port, log, endpoint: format!("http://127.0.0.1:{port}") };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if moto.try_request("GET", "/moto-api/").is_ok() {
                return Ok(moto);
            }
            if let Ok(Some(status)) = moto.child.try_wait() {
                panic!("moto exited ({status}) before it served: {}", moto.log_text());
            }
            assert!(Instant::now() < deadline, "moto did not answer on {} within 60 s", moto.endpoint);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn try_request(&self, method: &str, target: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let host = format!("127.0.0.1:{}", self.port);
        write!(s, "{method} {target} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let status =
            text.split(' ').nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("no HTTP status: {text}"))
            })?;
        let body = text.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
        Ok((status, body))
    }

    /// An unsigned request (no body): the status and the body (chunked bodies come back with their chunk sizes).
    pub fn request(&self, method: &str, target: &str) -> (u16, String) {
        self.try_request(method, target).unwrap_or_else(|e| panic!("{method} {target} to moto: {e}"))
    }

    /// Creates `bucket` (PUT /<bucket>).
    pub fn create_bucket(&self, bucket: &str) {
        let (status, body) = self.request("PUT", &format!("/{bucket}"));
        assert_eq!(status, 200, "creating bucket {bucket}: {body}");
    }

    /// The keys of `bucket` below `prefix` (ListObjectsV2, one page: the tests keep few objects).
    pub fn keys(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let (status, body) = self.request("GET", &format!("/{bucket}?list-type=2&prefix={prefix}"));
        assert_eq!(status, 200, "listing {bucket}/{prefix}: {body}");
        tag_values(&body, "Key")
    }

    /// The keys of the multipart uploads open in `bucket` (ListMultipartUploads).
    pub fn open_uploads(&self, bucket: &str) -> Vec<String> {
        let (status, body) = self.request("GET", &format!("/{bucket}?uploads"));
        assert_eq!(status, 200, "listing the uploads of {bucket}: {body}");
        body.split("<Upload>").skip(1).flat_map(|u| tag_values(u, "Key").into_iter().take(1)).collect()
    }

    /// The variables that point the AWS CLI (and distckpt's S3 from the environment) at this server; the other
    /// [`AWS_VARS`] are to be unset.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", KEY_ID.to_string()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.to_string()),
            ("AWS_REGION", REGION.to_string()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The texts of every `<tag>...</tag>` in `xml`, in order.
fn tag_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(open.as_str()).skip(1).filter_map(|s| s.split_once(close.as_str()).map(|(v, _)| v.to_string())).collect()
}

/// Serialises the tests of one binary that set AWS_* variables or make S3 storage (the core reads the variables for
/// every option left unset): `setenv` beside a `getenv` on another thread is undefined behaviour in C.
pub fn lock_env() -> std::sync::MutexGuard<'static, ()> {
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ENV.lock().unwrap_or_else(|e| e.into_inner())
}

/// The AWS_* variables set to `vars` (the other [`AWS_VARS`] unset) until drop, which restores them. Hold
/// [`lock_env`] around it.
pub struct AwsEnv(Vec<(&'static str, Option<std::ffi::OsString>)>);

impl AwsEnv {
    pub fn set(vars: &[(&'static str, String)]) -> AwsEnv {
        let saved = AWS_VARS.iter().map(|&k| (k, std::env::var_os(k))).collect();
        for k in AWS_VARS {
            std::env::remove_var(k);
        }
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
        AwsEnv(saved)
    }
}

impl Drop for AwsEnv {
    fn drop(&mut self) {
        for (k, v) in &self.0 {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
    }
}
