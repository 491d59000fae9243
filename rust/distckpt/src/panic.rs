//! Panics in callbacks (private; the model is git2-rs's `panic.rs`). The library calls Rust code through C function
//! pointers, often from its own threads: progress closures (`progress`), host collectives (`comm`) and [`Storage`]
//! methods (`storage`). A panic must not unwind into C, so every trampoline runs the Rust code through [`catch`]. A
//! caught panic is then either kept in a [`PanicSlot`], which the caller's thread resumes once the C call has returned
//! (progress, collectives: the panic is the caller's own bug and surfaces as one), or described with [`message`] and
//! turned into the operation's error (storage, whose failures are I/O errors to report).
//!
//! git2-rs keeps the caught panic in a thread-local; that does not work here, since the callbacks run on the library's
//! threads and not on the thread that made the call. Each operation's context owns its slot instead.
//!
//! [`Storage`]: crate::Storage

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use crate::util::lock;

/// What a panic carries (`std::panic::catch_unwind`'s error).
pub(crate) type Payload = Box<dyn Any + Send>;

/// Runs `f`, catching a panic. Unwind safety is asserted: after a panic the operation fails, and the state `f`
/// touched is either dropped with it or kept behind poison-tolerant locks (`util::lock`) that the next call may use.
pub(crate) fn catch<T>(f: impl FnOnce() -> T) -> Result<T, Payload> {
    catch_unwind(AssertUnwindSafe(f))
}

/// The panic's message (`panic!("...")` carries a `&str` or a `String`), or "a panic" for any other payload.
pub(crate) fn message(payload: &Payload) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".to_string())
}

/// A panic caught in a callback, kept for the thread that made the C call (which resumes it with
/// [`resume`](Self::resume)). The latest panic is kept.
#[derive(Default)]
pub(crate) struct PanicSlot {
    payload: Mutex<Option<Payload>>,
}

impl PanicSlot {
    /// Runs `f` under [`catch`]; a panic is kept and gives `None`.
    pub(crate) fn wrap<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        match catch(f) {
            Ok(v) => Some(v),
            Err(payload) => {
                *lock(&self.payload) = Some(payload);
                None
            }
        }
    }

    /// Resumes the kept panic, if any, on the calling thread (and empties the slot).
    pub(crate) fn resume(&self) {
        if let Some(payload) = lock(&self.payload).take() {
            resume_unwind(payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_of_str_string_and_other_payloads() {
        assert_eq!(message(&catch(|| panic!("plain")).unwrap_err()), "plain");
        assert_eq!(message(&catch(|| panic!("formatted {}", 7)).unwrap_err()), "formatted 7");
        assert_eq!(message(&catch(|| std::panic::panic_any(42u32)).unwrap_err()), "a panic");
        assert_eq!(catch(|| 5).ok(), Some(5));
    }

    #[test]
    fn slot_keeps_the_panic_until_resumed() {
        let slot = PanicSlot::default();
        assert_eq!(slot.wrap(|| 1), Some(1));
        slot.resume(); // nothing kept: returns
        assert_eq!(slot.wrap(|| -> i32 { panic!("in a callback") }), None);
        let resumed = catch(|| slot.resume()).unwrap_err();
        assert_eq!(message(&resumed), "in a callback");
        slot.resume(); // taken: the slot is empty again
    }
}
