//! C strings across the ABI: Rust strings and paths to `CString` (a NUL inside is an error naming what it was), and
//! borrowed C strings from the library back to `&str`. Below every other module (it needs only the error type).

use std::ffi::{CStr, CString};
use std::path::Path;

use crate::{Error, ErrorCode, Result};

pub(crate) fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::new(ErrorCode::InvalidArgument, format!("{what} {s:?} contains a NUL byte")))
}

pub(crate) fn path_cstring(p: &Path) -> Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::new(ErrorCode::InvalidArgument, format!("path {} contains a NUL byte", p.display())))
}

/// A borrowed C string as `&str`. The format guarantees UTF-8 (R-H3); should that ever fail, the valid prefix is
/// returned rather than panicking.
pub(crate) unsafe fn borrowed_str<'a>(p: *const std::os::raw::c_char) -> &'a str {
    if p.is_null() {
        return "";
    }
    let bytes = CStr::from_ptr(p).to_bytes();
    match std::str::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap(),
    }
}
