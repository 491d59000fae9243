//! S3 through the core's client against a real moto server on loopback (tests/common/moto.rs): checkpoints saved
//! from Rust to `s3://` URLs, read back value by value, loaded, listed, stat'ed and removed, once through a handle
//! made from explicit `S3Options` and once with no handle at all (URLs configured from the AWS_* environment, as an
//! inference server would be deployed). Errors: a missing checkpoint or bucket is an error naming the URL, an unknown
//! scheme is `Unsupported` naming it, and without libcurl (the core's variable for its file pointing nowhere, in a child
//! process, since the library is loaded once per process) S3 is `Unsupported` naming libcurl.
//!
//! Every test holds `moto::lock_env()`: some set AWS_* variables, and the core reads them whenever it makes S3 storage.
mod common;

use std::process::Command;
use std::time::Duration;

use common::moto::{self, AwsEnv, Moto};
use distckpt::{
    Checkpoint, Dtype, ErrorCode, LoadState, PathKind, ReadOptions, S3Addressing, S3Options, SaveOptions, SaveState,
    StorageHandle,
};

fn moto_or_skip(test: &str) -> Option<Moto> {
    match Moto::start() {
        Ok(m) => Some(m),
        Err(why) => {
            eprintln!("SKIPPED: {test}: moto S3 server unavailable: {why}");
            None
        }
    }
}

/// What the tests save: a tensor larger than a 5 MiB part (a multipart upload with the explicit options' part size),
/// other dtypes, a bytes entry and user metadata.
struct Weights {
    w: Vec<f32>,
    ids: Vec<i64>,
    half: Vec<u16>,
    blob: Vec<u8>,
}

const ROWS: u64 = 1600;
const COLS: u64 = 1024;

impl Weights {
    fn new() -> Weights {
        Weights {
            w: (0..ROWS * COLS).map(|i| (i % 9973) as f32 * 0.5 - 1000.0).collect(),
            ids: vec![-5, 0, 1 << 40, i64::MAX],
            half: (0..256u16).map(|i| i.wrapping_mul(257)).collect(),
            blob: b"tokenizer: 32000 pieces".to_vec(),
        }
    }

    fn save(&self, url: &str, opts: &SaveOptions) -> distckpt::Result<distckpt::SaveInfo> {
        let mut s = SaveState::new()?;
        s.add_tensor("w", &[ROWS, COLS], &self.w)?
            .add_tensor("ids", &[4], &self.ids)?
            .add_tensor_as("half", Dtype::BF16, &[16, 16], &self.half)?
            .add_bytes("tokenizer", &self.blob)?
            .set_user("step", "100")?;
        s.save(url, opts)
    }

    /// Every value, through each way of reading: whole reads, a view (a verified copy on S3), a region, bytes, user
    /// metadata, the checksums.
    fn check(&self, ckpt: &Checkpoint) {
        assert_eq!(ckpt.len(), 4);
        assert!(ckpt.read::<f32>("w").unwrap() == self.w, "w differs");
        assert!(ckpt.view::<f32>("w").unwrap()[..] == self.w[..], "the view of w differs");
        let rows = ckpt.read_region::<f32>("w", &[700, 0], &[3, COLS]).unwrap();
        assert!(rows[..] == self.w[700 * COLS as usize..703 * COLS as usize], "rows 700..703 of w differ");
        assert_eq!(ckpt.read::<i64>("ids").unwrap(), self.ids);
        assert_eq!(ckpt.entry("half").unwrap().dtype(), Dtype::BF16);
        assert_eq!(ckpt.read::<u16>("half").unwrap(), self.half);
        assert_eq!(ckpt.read_bytes("tokenizer").unwrap(), self.blob);
        assert_eq!(ckpt.user("step"), Some("100"));
        ckpt.verify().unwrap();
        // Nothing to map on S3: map_all says so (the README sends servers to read_all).
        assert_eq!(ckpt.map_all().unwrap_err().code(), ErrorCode::Unsupported);
        // What a server does: every tensor in one planned pass.
        let all = ckpt.read_all(None).unwrap();
        let w = all.iter().find(|t| t.name() == "w").expect("read_all has w");
        assert!(w.as_slice::<f32>().unwrap() == &self.w[..], "read_all's w differs");
        assert_eq!(all.len(), 3, "read_all: the tensors, not the bytes entry");
    }

    /// A resharded load: w in two row halves.
    fn check_load(&self, url: &str, opts: &ReadOptions) {
        let half = (ROWS / 2 * COLS) as usize;
        let (mut top, mut bottom) = (vec![0f32; half], vec![0f32; half]);
        let mut ids = vec![0i64; 4];
        let mut blob = vec![0u8; 64];
        let mut l = LoadState::new().unwrap();
        l.declare_tensor("w", Dtype::F32, &[ROWS, COLS])
            .unwrap()
            .add_piece("w", &[0, 0], &[ROWS / 2, COLS], &mut top)
            .unwrap()
            .add_piece("w", &[ROWS / 2, 0], &[ROWS / 2, COLS], &mut bottom)
            .unwrap()
            .add_tensor("ids", &[4], &mut ids)
            .unwrap()
            .add_bytes("tokenizer", &mut blob)
            .unwrap();
        l.load(url, opts).unwrap();
        assert_eq!(l.bytes_len("tokenizer").unwrap(), self.blob.len() as u64);
        drop(l);
        assert!(top[..] == self.w[..half] && bottom[..] == self.w[half..], "the loaded halves of w differ");
        assert_eq!(ids, self.ids);
        assert_eq!(blob[..self.blob.len()], self.blob[..]);
    }
}

fn expect_err<T: std::fmt::Debug>(r: distckpt::Result<T>, code: ErrorCode, names: &[&str], what: &str) {
    let e = r.expect_err(what);
    assert_eq!(e.code(), code, "{what}: {e}");
    for n in names {
        assert!(e.message().contains(n), "{what}: the message does not name {n:?}: {e}");
    }
}

#[test]
fn explicit_options_save_read_list_stat_remove() {
    let _env = moto::lock_env();
    let Some(m) = moto_or_skip("explicit_options_save_read_list_stat_remove") else { return };
    let _vars = AwsEnv::set(&[]); // nothing from the environment: the options say it all
    m.create_bucket("rust-explicit");
    let opts = S3Options {
        endpoint: Some(m.endpoint.clone()),
        region: Some(moto::REGION.into()),
        access_key_id: Some(moto::KEY_ID.into()),
        secret_access_key: Some(moto::SECRET.into()),
        addressing: S3Addressing::Path,
        max_in_flight: 8,
        max_attempts: 3,
        request_timeout: Some(Duration::from_secs(20)),
        part_size: 5 << 20,
        read_block_size: 1 << 20,
        ..Default::default()
    };
    let secret = S3Options {
        secret_access_key: Some("wJalrXUtnFEMI".into()),
        session_token: Some("FwoGZXIvYXdz".into()),
        ..opts.clone()
    };
    let shown = format!("{secret:?}");
    assert!(!shown.contains("wJalrXUtnFEMI") && !shown.contains("FwoGZXIvYXdz"), "Debug shows a secret: {shown}");
    let store = StorageHandle::s3(&opts).unwrap();
    let url = "s3://rust-explicit/run1/step-100";
    let w = Weights::new();
    let info = w.save(url, &SaveOptions::default().with_storage(&store)).unwrap();
    assert_eq!((info.num_entries, info.num_files), (4, 1));
    assert!(m.open_uploads("rust-explicit").is_empty(), "a multipart upload was left open");

    let read = ReadOptions::default().with_storage(&store);
    let ckpt = Checkpoint::open_with(url, None, &read).unwrap();
    assert_eq!(ckpt.path().to_str(), Some(url));
    w.check(&ckpt);
    drop(ckpt);
    w.check_load(url, &read);

    assert_eq!(store.list("s3://rust-explicit/run1").unwrap(), ["step-100"]);
    assert_eq!(store.list("s3://rust-explicit").unwrap(), ["run1"]);
    let files = store.list(url).unwrap();
    assert!(files.iter().any(|f| f == "metadata.dckpt"), "{files:?}");
    assert!(files.iter().any(|f| f.starts_with("data-")), "{files:?}");
    let keys = m.keys("rust-explicit", "run1/step-100/");
    assert_eq!(keys.len(), files.len(), "moto has {keys:?}, the listing {files:?}");
    assert!(store.list("s3://rust-explicit/nothing-here").unwrap().is_empty());
    let stat = store.stat(url, Duration::from_secs(3600)).unwrap();
    assert_eq!((stat.kind, stat.leftover_files), (PathKind::Checkpoint, 0), "{stat:?}");
    assert!(stat.bytes >= ROWS * COLS * 4, "{stat:?}");

    // A second save without overwrite finds the committed metadata; the conditional commit leaves it as it was.
    let w2 = Weights { ids: vec![1, 2, 3, 4], ..Weights::new() };
    expect_err(w2.save(url, &SaveOptions::default().with_storage(&store)), ErrorCode::Exists, &[url], "save again");
    assert_eq!(Checkpoint::open_with(url, None, &read).unwrap().read::<i64>("ids").unwrap(), w.ids);
    assert!(m.open_uploads("rust-explicit").is_empty(), "a multipart upload was left open");

    let missing = "s3://rust-explicit/run1/step-999";
    expect_err(Checkpoint::open_with(missing, None, &read), ErrorCode::NotFound, &[missing], "open a missing one");
    expect_err(store.remove_checkpoint(missing), ErrorCode::NotFound, &[missing], "remove a missing one");

    store.remove_checkpoint(url).unwrap();
    assert_eq!(store.stat(url, Duration::ZERO).unwrap().kind, PathKind::None);
    assert!(m.keys("rust-explicit", "run1/").is_empty(), "{:?}", m.keys("rust-explicit", "run1/"));
}

#[test]
fn urls_configured_from_the_environment() {
    let _env = moto::lock_env();
    let Some(m) = moto_or_skip("urls_configured_from_the_environment") else { return };
    let _vars = AwsEnv::set(&m.env());
    m.create_bucket("rust-env");
    let url = "s3://rust-env/models/llm/step-1";
    let w = Weights::new();
    // No storage anywhere: the URL is all the core needs.
    w.save(url, &SaveOptions::default()).unwrap();
    assert!(m.open_uploads("rust-env").is_empty(), "a multipart upload was left open");
    w.check(&Checkpoint::open(url).unwrap());
    w.check_load(url, &ReadOptions::default());

    assert_eq!(distckpt::list("s3://rust-env/models/llm").unwrap(), ["step-1"]);
    assert_eq!(distckpt::list("s3://rust-env/models/llm/").unwrap(), ["step-1"]);
    assert_eq!(distckpt::list("s3://rust-env").unwrap(), ["models"]);
    assert!(distckpt::list("s3://rust-env/nothing-here").unwrap().is_empty());

    // A handle from the URL, and one from the environment: the same bucket, the same answers.
    let by_url = StorageHandle::open_url(url).unwrap();
    assert!(format!("{by_url:?}").contains(url), "{by_url:?}");
    let stat = by_url.stat(url, Duration::from_secs(3600)).unwrap();
    assert_eq!((stat.kind, stat.leftover_files), (PathKind::Checkpoint, 0), "{stat:?}");
    let from_env = StorageHandle::s3_from_env().unwrap();
    assert_eq!(from_env.list("s3://rust-env/models/llm").unwrap(), ["step-1"]);
    w.check(&Checkpoint::open_with(url, None, &ReadOptions::default().with_storage(&from_env)).unwrap());

    let missing = "s3://rust-env/models/llm/step-2";
    expect_err(Checkpoint::open(missing), ErrorCode::NotFound, &[missing], "open a missing checkpoint");
    let mut ids = vec![0i64; 4];
    let mut l = LoadState::new().unwrap();
    l.add_tensor("ids", &[4], &mut ids).unwrap();
    expect_err(l.load(missing, &ReadOptions::default()), ErrorCode::NotFound, &[missing], "load a missing one");
    let no_bucket = "s3://rust-no-such-bucket/step-1";
    let e = Checkpoint::open(no_bucket).expect_err("open in a missing bucket");
    assert!(e.message().contains(no_bucket), "the error does not name the URL: {e}");
    let e = distckpt::list(no_bucket).expect_err("list in a missing bucket");
    assert!(
        e.message().contains(no_bucket) && e.message().contains("does not exist"),
        "the error does not say the bucket is missing: {e}"
    );

    by_url.remove_checkpoint(url).unwrap();
    assert!(distckpt::list("s3://rust-env/models/llm").unwrap().is_empty());
}

#[test]
fn an_unknown_scheme_is_unsupported_naming_it() {
    let _env = moto::lock_env();
    let url = "gs://bucket/run1/step-1";
    let names = ["gs://"];
    expect_err(Checkpoint::open(url), ErrorCode::Unsupported, &names, "Checkpoint::open");
    expect_err(StorageHandle::open_url(url), ErrorCode::Unsupported, &names, "StorageHandle::open_url");
    expect_err(distckpt::list(url), ErrorCode::Unsupported, &names, "list");
    expect_err(Weights::new().save(url, &SaveOptions::default()), ErrorCode::Unsupported, &names, "save");
}

/// The environment variable that tells the child test below to run.
const CHILD: &str = "DISTCKPT_RS_TEST_NO_LIBCURL_CHILD";
/// The core's variable naming the libcurl file to load (instead of libcurl.so.4).
const CURL_LIBRARY: &str = "DCKPT_CURL_LIBRARY";

#[test]
fn without_libcurl_s3_is_unsupported_naming_it() {
    let _env = moto::lock_env();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_without_libcurl", "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env(CURL_LIBRARY, "/nonexistent/curl-library.so") // the name alone must not say "libcurl"
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "the child test failed:\n{text}");
}

#[test]
#[ignore = "run in a child process with libcurl pointed nowhere, by without_libcurl_s3_is_unsupported_naming_it"]
fn child_without_libcurl() {
    if std::env::var_os(CHILD).is_none() {
        return; // run by hand: the variable that points libcurl nowhere is not set
    }
    let _vars = AwsEnv::set(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:9".into())]);
    let url = "s3://bucket/run1/step-1";
    let names = ["libcurl"];
    expect_err(StorageHandle::s3(&S3Options::default()), ErrorCode::Unsupported, &names, "StorageHandle::s3");
    expect_err(StorageHandle::s3_from_env(), ErrorCode::Unsupported, &names, "StorageHandle::s3_from_env");
    expect_err(StorageHandle::open_url(url), ErrorCode::Unsupported, &names, "StorageHandle::open_url");
    expect_err(Checkpoint::open(url), ErrorCode::Unsupported, &names, "Checkpoint::open");
    expect_err(distckpt::list(url), ErrorCode::Unsupported, &names, "list");
    expect_err(Weights::new().save(url, &SaveOptions::default()), ErrorCode::Unsupported, &names, "save");
}
