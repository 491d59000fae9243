//! Progress callbacks: a Rust closure behind `dckpt_progress_fn`. The library calls it from internal threads, one
//! call at a time; a panic is caught there (it must not unwind into C), stops the operation, and is resumed on the
//! caller's thread once the C call has returned (module `panic`).

use std::ffi::c_void;
use std::os::raw::c_int;
use std::sync::Mutex;

use distckpt_sys as sys;

use crate::error::Result;
use crate::panic::PanicSlot;
use crate::util::lock;

/// `done`, `total` bytes; return `false` to stop the operation (it fails with `ErrorCode::User`).
pub type ProgressFn<'a> = &'a mut (dyn FnMut(u64, u64) -> bool + Send);

pub(crate) struct Progress<'a> {
    f: Mutex<ProgressFn<'a>>,
    panic: PanicSlot,
}

impl<'a> Progress<'a> {
    pub(crate) fn new(f: ProgressFn<'a>) -> Progress<'a> {
        Progress { f: Mutex::new(f), panic: PanicSlot::default() }
    }

    /// The `user_data` to pass with [`Progress::callback`]; valid while `self` is neither moved nor dropped.
    pub(crate) fn user_data(&self) -> *mut c_void {
        self as *const Progress<'a> as *mut c_void
    }

    pub(crate) unsafe extern "C" fn callback(done: u64, total: u64, user_data: *mut c_void) -> c_int {
        let p = &*(user_data as *const Progress<'_>);
        match p.panic.wrap(|| (*lock(&p.f))(done, total)) {
            Some(true) => 0,
            Some(false) | None => 1, // asked to stop, or panicked (resumed by `finish`)
        }
    }

    /// Resumes a panic the closure raised, else returns the call's result.
    pub(crate) fn finish<T>(self, result: Result<T>) -> Result<T> {
        self.panic.resume();
        result
    }
}

/// An optional closure as the `(progress, progress_user_data)` pair of a C call: `(None, null)` without one. The
/// user data is valid while `p` is neither moved nor dropped.
pub(crate) fn c_pair(p: &Option<Progress<'_>>) -> (sys::dckpt_progress_fn, *mut c_void) {
    match p {
        Some(p) => (Some(Progress::callback), p.user_data()),
        None => (None, std::ptr::null_mut()),
    }
}

/// [`Progress::finish`] for an optional closure.
pub(crate) fn finish<T>(p: Option<Progress<'_>>, result: Result<T>) -> Result<T> {
    match p {
        Some(p) => p.finish(result),
        None => result,
    }
}
