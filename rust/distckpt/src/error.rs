//! `Error`: a status code of the C ABI plus the message that explains it.

use std::ffi::CStr;
use std::fmt;

use distckpt_sys as sys;

/// The stable status codes of `distckpt.h` (`DCKPT_E*`). Codes are never renumbered; a code this crate does not
/// know yet (from a newer library) is kept as `Other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `DCKPT_ERROR`: an error that fits no other code.
    Generic,
    /// `DCKPT_EINVAL`
    InvalidArgument,
    /// `DCKPT_ENOTFOUND`: checkpoint, entry or file not found.
    NotFound,
    /// `DCKPT_ECORRUPT`: checksum mismatch, bad metadata, truncated or missing data file.
    Corrupt,
    /// `DCKPT_EVERSION`: unsupported format or ABI version.
    Version,
    /// `DCKPT_EIO`
    Io,
    /// `DCKPT_ETIMEOUT`: a collective or wait ran past its timeout.
    Timeout,
    /// `DCKPT_EUSER`: a callback asked to stop (or failed).
    User,
    /// `DCKPT_ENOMEM`
    NoMemory,
    /// `DCKPT_EUNSUPPORTED`: not supported by this build, backend or layout.
    Unsupported,
    /// `DCKPT_EEXISTS`
    Exists,
    /// `DCKPT_EBUFSIZE`: the caller's buffer is too small.
    BufferSize,
    /// `DCKPT_EPEER`: another rank failed, so this one did too.
    Peer,
    /// `DCKPT_ENOSPC`
    NoSpace,
    /// `DCKPT_ESTATE`: wrong state for this call.
    State,
    /// `DCKPT_EINTERNAL`: a bug in distckpt.
    Internal,
    /// A code newer than this crate.
    Other(i32),
}

impl ErrorCode {
    pub fn from_raw(code: i32) -> ErrorCode {
        use ErrorCode::*;
        match code {
            sys::DCKPT_ERROR => Generic,
            sys::DCKPT_EINVAL => InvalidArgument,
            sys::DCKPT_ENOTFOUND => NotFound,
            sys::DCKPT_ECORRUPT => Corrupt,
            sys::DCKPT_EVERSION => Version,
            sys::DCKPT_EIO => Io,
            sys::DCKPT_ETIMEOUT => Timeout,
            sys::DCKPT_EUSER => User,
            sys::DCKPT_ENOMEM => NoMemory,
            sys::DCKPT_EUNSUPPORTED => Unsupported,
            sys::DCKPT_EEXISTS => Exists,
            sys::DCKPT_EBUFSIZE => BufferSize,
            sys::DCKPT_EPEER => Peer,
            sys::DCKPT_ENOSPC => NoSpace,
            sys::DCKPT_ESTATE => State,
            sys::DCKPT_EINTERNAL => Internal,
            other => Other(other),
        }
    }

    /// The C status value (`DCKPT_E*`).
    pub fn raw(self) -> i32 {
        use ErrorCode::*;
        match self {
            Generic => sys::DCKPT_ERROR,
            InvalidArgument => sys::DCKPT_EINVAL,
            NotFound => sys::DCKPT_ENOTFOUND,
            Corrupt => sys::DCKPT_ECORRUPT,
            Version => sys::DCKPT_EVERSION,
            Io => sys::DCKPT_EIO,
            Timeout => sys::DCKPT_ETIMEOUT,
            User => sys::DCKPT_EUSER,
            NoMemory => sys::DCKPT_ENOMEM,
            Unsupported => sys::DCKPT_EUNSUPPORTED,
            Exists => sys::DCKPT_EEXISTS,
            BufferSize => sys::DCKPT_EBUFSIZE,
            Peer => sys::DCKPT_EPEER,
            NoSpace => sys::DCKPT_ENOSPC,
            State => sys::DCKPT_ESTATE,
            Internal => sys::DCKPT_EINTERNAL,
            Other(c) => c,
        }
    }

    /// The library's short name for the code, e.g. "corrupt".
    pub fn name(self) -> String {
        // dckpt_status_name is callable from any thread and returns a static string.
        let p = unsafe { sys::dckpt_status_name(self.raw()) };
        if p.is_null() {
            format!("status {}", self.raw())
        } else {
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    }
}

/// An error from distckpt: the status code and the message (which names the checkpoint, entry and file involved).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    code: ErrorCode,
    message: String,
}

/// `std::result::Result` with this crate's `Error`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error { code, message: message.into() }
    }

    /// The calling thread's last error from the C library, for a call that returned `rc`. Must be called right
    /// after that call, on the same thread (the message is per thread and valid until the next call).
    pub(crate) fn last(rc: i32) -> Error {
        let msg = unsafe { sys::dckpt_error_last() };
        let message =
            if msg.is_null() { String::new() } else { unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned() };
        Error { code: ErrorCode::from_raw(rc), message }
    }

    pub fn code(&self) -> ErrorCode {
        self.code
    }

    /// The C status value (`DCKPT_E*`).
    pub fn raw_code(&self) -> i32 {
        self.code.raw()
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub(crate) fn context(mut self, extra: &str) -> Error {
        if !extra.is_empty() {
            self.message =
                if self.message.is_empty() { extra.to_string() } else { format!("{}: {extra}", self.message) };
        }
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "distckpt: {}", self.code.name())
        } else {
            write!(f, "{} ({})", self.message, self.code.name())
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let kind = match e.code {
            ErrorCode::NotFound => std::io::ErrorKind::NotFound,
            ErrorCode::InvalidArgument => std::io::ErrorKind::InvalidInput,
            ErrorCode::Corrupt => std::io::ErrorKind::InvalidData,
            ErrorCode::Timeout => std::io::ErrorKind::TimedOut,
            ErrorCode::Exists => std::io::ErrorKind::AlreadyExists,
            ErrorCode::Unsupported => std::io::ErrorKind::Unsupported,
            ErrorCode::NoMemory => std::io::ErrorKind::OutOfMemory,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// Turns a C status into a `Result`, reading the thread's message on failure.
#[inline]
pub(crate) fn check(rc: i32) -> Result<()> {
    if rc == sys::DCKPT_OK {
        Ok(())
    } else {
        Err(Error::last(rc))
    }
}
