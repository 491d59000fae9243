//! Conversions across the C ABI, shared by every module that calls the library (private; the model is git2-rs's
//! `util.rs`): Rust strings and paths to `CString` (a NUL inside is an error naming what it was), C strings from the
//! library or from a callback's arguments back to Rust, timeouts, checked box volumes, and the poison-tolerant lock
//! the callbacks' state is kept behind. Below every other module but `error`: nothing here reaches into another
//! module's helpers.

use std::ffi::{CStr, CString};
use std::io;
use std::os::raw::c_char;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::error::{Error, ErrorCode, Result};

pub(crate) fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(ErrorCode::InvalidArgument, format!("{what} {s:?} contains a NUL byte")))
}

pub(crate) fn path_cstring(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::new(ErrorCode::InvalidArgument, format!("path {} contains a NUL byte", p.display())))
}

/// An optional string as an optional `CString` (`None` stays `None`, for a NULL field).
pub(crate) fn opt_cstring(s: &Option<String>, what: &str) -> Result<Option<CString>> {
    s.as_deref().map(|v| cstring(v, what)).transpose()
}

/// A borrowed C string as `&str`. The format guarantees UTF-8 (R-H3); should that ever fail, the valid prefix is
/// returned rather than panicking.
pub(crate) unsafe fn borrowed_str<'a>(p: *const c_char) -> &'a str {
    if p.is_null() {
        return "";
    }
    let bytes = CStr::from_ptr(p).to_bytes();
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap(),
    }
}

/// A path the library passed to a callback, as `&str`: an `InvalidInput` error (returned to the library as a code)
/// when it is NULL or not UTF-8.
pub(crate) unsafe fn callback_path<'a>(p: *const c_char) -> io::Result<&'a str> {
    if p.is_null() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "null path"));
    }
    CStr::from_ptr(p).to_str().map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the path is not UTF-8"))
}

/// A C string as an owned `String` for messages: invalid UTF-8 replaced, NULL empty.
pub(crate) unsafe fn lossy_string(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// A timeout for the C ABI: 0 means the library's default.
pub(crate) fn timeout_ms(t: Option<Duration>) -> u64 {
    t.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1))
}

/// Checked product of a shape, as a `usize` element count.
pub(crate) fn volume(lengths: &[u64], what: impl Fn() -> String) -> Result<usize> {
    lengths
        .iter()
        .try_fold(1u64, |acc, &l| acc.checked_mul(l))
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| Error::new(ErrorCode::InvalidArgument, format!("{}: the box {lengths:?} is too large", what())))
}

/// Locks `m`, poisoned or not: a panic under the lock was caught (module `panic`) and is reported by the operation,
/// so the state behind it is still used for the calls that follow.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
