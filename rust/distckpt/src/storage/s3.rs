//! S3 and storage named by a URL (the header's "S3 and URLs" section): a child of `storage`, which re-exports it. The
//! S3 client is the core's (HTTP and AWS Signature Version 4 through libcurl, loaded at run time; parallel ranged
//! reads, multipart uploads, the metadata committed last with a conditional PUT, retries); this module only passes
//! options to it.
//!
//! No handle is needed for the common case: with no storage given, every path a save, open, load, export or
//! [`list`](super::list) takes may be an `"s3://bucket/prefix"` URL, and the core reaches S3 as the AWS CLI would
//! from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` /
//! `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`). [`StorageHandle::s3`] sets those in code
//! instead, and tunes the client; paths on that handle are `"s3://bucket/key"` URLs as well.

use std::path::Path;
use std::time::Duration;

use distckpt_sys as sys;

use crate::error::{check, Result};
use crate::storage::StorageHandle;
use crate::util::{opt_cstring, path_cstring};
use crate::version::check_abi;

/// How requests name the bucket (`dckpt_s3_addressing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum S3Addressing {
    /// Path style with a custom endpoint, virtual-hosted on AWS (path style for a bucket name with dots).
    #[default]
    Auto,
    /// `<endpoint>/<bucket>/<key>`.
    Path,
    /// `<scheme>://<bucket>.<endpoint host>/<key>`.
    Virtual,
}

impl S3Addressing {
    fn raw(self) -> i32 {
        (match self {
            S3Addressing::Auto => sys::DCKPT_S3_ADDRESSING_AUTO,
            S3Addressing::Path => sys::DCKPT_S3_ADDRESSING_PATH,
            S3Addressing::Virtual => sys::DCKPT_S3_ADDRESSING_VIRTUAL,
        }) as i32
    }
}

/// Where and how to reach S3 ([`StorageHandle::s3`], `dckpt_s3_options`). Every `None` or zero field takes what the
/// AWS CLI reads from the environment, or else the default given; `S3Options::default()` is all environment.
/// `Debug` leaves the secret key and the session token out.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// `"http://127.0.0.1:9000"`; `None`: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, else
    /// `https://s3.<region>.amazonaws.com`.
    pub endpoint: Option<String>,
    /// `None`: `AWS_REGION`, `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// `None`: `AWS_ACCESS_KEY_ID` (with neither, requests go unsigned).
    pub access_key_id: Option<String>,
    /// `None`: `AWS_SECRET_ACCESS_KEY`.
    pub secret_access_key: Option<String>,
    /// `None`: `AWS_SESSION_TOKEN` (sent as `x-amz-security-token`).
    pub session_token: Option<String>,
    pub addressing: S3Addressing,
    /// Requests running at once; 0: 16.
    pub max_in_flight: u32,
    /// Tries per request, the first included (1: no retry); 0: 6. Network errors, HTTP 500/502/503/504, 429 and S3's
    /// throttling and timeout codes are retried with exponential backoff and jitter.
    pub max_attempts: u32,
    /// A request that moves no byte for this long fails (and is retried); `None` (or zero): 30 s.
    pub request_timeout: Option<Duration>,
    /// Multipart upload part size; 0: 8 MiB; at least 5 MiB.
    pub part_size: u64,
    /// A read shorter than half of this fetches the aligned block around it, which the reads that follow share; 0:
    /// 4 MiB; 1: every read is its own ranged GET.
    pub read_block_size: u64,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hidden = |s: &Option<String>| s.as_ref().map(|_| "<hidden>");
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &hidden(&self.secret_access_key))
            .field("session_token", &hidden(&self.session_token))
            .field("addressing", &self.addressing)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_attempts", &self.max_attempts)
            .field("request_timeout", &self.request_timeout)
            .field("part_size", &self.part_size)
            .field("read_block_size", &self.read_block_size)
            .finish()
    }
}

impl StorageHandle {
    /// S3 storage with these options (`dckpt_storage_new_s3`); paths on it are `"s3://bucket/key"` URLs. Making it
    /// loads libcurl: without it, an `Unsupported` error naming the library.
    pub fn s3(opts: &S3Options) -> Result<StorageHandle> {
        check_abi()?;
        let endpoint = opt_cstring(&opts.endpoint, "endpoint")?;
        let region = opt_cstring(&opts.region, "region")?;
        let key_id = opt_cstring(&opts.access_key_id, "access key id")?;
        let secret = opt_cstring(&opts.secret_access_key, "secret access key")?;
        let token = opt_cstring(&opts.session_token, "session token")?;
        let ptr = |c: &Option<std::ffi::CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let mut raw: sys::dckpt_s3_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::dckpt_s3_options_init(&mut raw, sys::DCKPT_S3_OPTIONS_VERSION) })?;
        raw.endpoint = ptr(&endpoint);
        raw.region = ptr(&region);
        raw.access_key_id = ptr(&key_id);
        raw.secret_access_key = ptr(&secret);
        raw.session_token = ptr(&token);
        raw.addressing = opts.addressing.raw();
        raw.max_in_flight = opts.max_in_flight;
        raw.max_attempts = opts.max_attempts;
        raw.request_timeout_seconds = opts.request_timeout.map_or(0.0, |d| d.as_secs_f64());
        raw.part_size = opts.part_size;
        raw.read_block_size = opts.read_block_size;
        let mut out = std::ptr::null_mut();
        // The strings are copied by the call: they need to outlive it only.
        check(unsafe { sys::dckpt_storage_new_s3(&mut out, &raw) })?;
        Ok(Self::wrap(out, "s3".into(), None))
    }

    /// S3 configured from the environment alone, as the AWS CLI reads it (`dckpt_storage_new_s3` with no options).
    pub fn s3_from_env() -> Result<StorageHandle> {
        check_abi()?;
        let mut out = std::ptr::null_mut();
        check(unsafe { sys::dckpt_storage_new_s3(&mut out, std::ptr::null()) })?;
        Ok(Self::wrap(out, "s3".into(), None))
    }

    /// The storage a URL names (`dckpt_storage_open_url`): `"s3://..."` S3 from the environment, a plain path (no
    /// `scheme://`) the POSIX file system; any other scheme is `Unsupported`, naming it. The same URL (or paths below
    /// it) then goes to the calls on the handle.
    pub fn open_url(url: impl AsRef<Path>) -> Result<StorageHandle> {
        check_abi()?;
        let url = url.as_ref();
        let curl = path_cstring(url)?;
        let mut out = std::ptr::null_mut();
        check(unsafe { sys::dckpt_storage_open_url(&mut out, curl.as_ptr()) })?;
        Ok(Self::wrap(out, format!("url {}", url.display()).into(), None))
    }
}
