//! What unfinished saves, overwrites and prunes leave beside checkpoints on a file system, and removing it safely
//! (FORMAT.md 6.1). The judge is the core's (`dckpt_scan_leftovers`, `dckpt_remove_leftover`), the same for Python,
//! Go and C: symbolic links are never followed, a live writer's directory is never garbage, and a directory is removed
//! only after being moved to a "deleting" name and found there to be the one judged.
//!
//! ```no_run
//! # fn main() -> distckpt::Result<()> {
//! use std::time::Duration;
//! for l in distckpt::scan_leftovers("/ckpts/run1", Duration::from_secs(3600))? {
//!     println!("{} {:?} {} B: {}", l.name, l.kind, l.bytes, l.reason);
//!     if l.garbage {
//!         distckpt::remove_leftover(&l.path, Duration::from_secs(3600))?;
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use std::ffi::c_void;
use std::os::raw::c_int;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{check, Result};
use crate::util::{lossy_string, path_cstring};
use distckpt_sys as sys;

/// What a leftover directory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeftoverKind {
    /// `<name>.dckpt-staging-<nonce>`: a save in progress, or abandoned.
    Staging,
    /// A staging directory whose save finished every rank but died before its rename (it never reported success).
    CompleteUnrenamed,
    /// `<name>.dckpt-old-<nonce>`: a checkpoint an overwrite moved aside.
    Replaced,
    /// `<name>.dckpt-deleting-<nonce>`: a checkpoint a prune moved aside.
    Deleting,
    /// A kind this crate does not know (a newer library).
    Other(i32),
}

/// Whether the writer a staging directory's marker names is alive (only a process of this host can be asked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriterState {
    Unknown,
    Running,
    Exited,
}

/// One leftover directory, as the core judged it.
#[derive(Clone, Debug)]
pub struct Leftover {
    pub path: PathBuf,
    pub name: String,
    /// The checkpoint name it belongs to.
    pub final_name: String,
    pub kind: LeftoverKind,
    /// Regular files below it (links not followed).
    pub bytes: u64,
    /// Since the newest change of the directory or an entry directly in it.
    pub idle: Duration,
    pub writer: WriterState,
    /// From the staging marker, if it names one.
    pub writer_pid: Option<i64>,
    pub writer_host: String,
    pub writer_started_utc: String,
    /// Removable under the grace period it was judged with.
    pub garbage: bool,
    /// Why, in words ("abandoned: writer pid 12 on this host has exited; idle 2h01m").
    pub reason: String,
}

/// Every leftover directly in `dir` (none if it does not exist), in name order. Garbage: idle for longer than `grace`
/// and, for a staging directory, with no live writer on this host.
pub fn scan_leftovers(dir: impl AsRef<Path>, grace: Duration) -> Result<Vec<Leftover>> {
    scan(dir.as_ref(), None, grace)
}

/// The leftovers of the checkpoint at `path` (those beside it named after it).
pub fn leftovers_of(path: impl AsRef<Path>, grace: Duration) -> Result<Vec<Leftover>> {
    let path = path.as_ref();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    scan(dir, Some(&name), grace)
}

/// Judges the leftover directory at `path` anew and removes it if it is garbage now. `NotFound` if it is not a
/// leftover directory; `State`, saying why, if it is not garbage (a live writer, within `grace`).
pub fn remove_leftover(path: impl AsRef<Path>, grace: Duration) -> Result<()> {
    let cpath = path_cstring(path.as_ref())?;
    check(unsafe { sys::dckpt_remove_leftover(cpath.as_ptr(), grace.as_secs_f64()) })
}

fn scan(dir: &Path, final_name: Option<&str>, grace: Duration) -> Result<Vec<Leftover>> {
    unsafe extern "C" fn each(info: *const sys::dckpt_leftover_info, ud: *mut c_void) -> c_int {
        // Nothing here can panic but an allocation failure; the vector is ours alone during the call.
        let out = &mut *(ud as *mut Vec<Leftover>);
        let i = &*info;
        out.push(Leftover {
            path: PathBuf::from(lossy_string(i.path)),
            name: lossy_string(i.name),
            final_name: lossy_string(i.final_name),
            kind: match i.kind as u32 {
                sys::DCKPT_LEFTOVER_STAGING => LeftoverKind::Staging,
                sys::DCKPT_LEFTOVER_COMPLETE_UNRENAMED => LeftoverKind::CompleteUnrenamed,
                sys::DCKPT_LEFTOVER_REPLACED => LeftoverKind::Replaced,
                sys::DCKPT_LEFTOVER_DELETING => LeftoverKind::Deleting,
                _ => LeftoverKind::Other(i.kind),
            },
            bytes: i.bytes,
            idle: Duration::from_secs_f64(i.idle_seconds.max(0.0)),
            writer: match i.writer as u32 {
                sys::DCKPT_WRITER_RUNNING => WriterState::Running,
                sys::DCKPT_WRITER_EXITED => WriterState::Exited,
                _ => WriterState::Unknown,
            },
            writer_pid: if i.writer_pid > 0 { Some(i.writer_pid) } else { None },
            writer_host: lossy_string(i.writer_host),
            writer_started_utc: lossy_string(i.writer_started_utc),
            garbage: i.garbage != 0,
            reason: lossy_string(i.reason),
        });
        0
    }
    let cdir = path_cstring(dir)?;
    let cname = match final_name {
        Some(n) => Some(crate::util::cstring(n, "checkpoint name")?),
        None => None,
    };
    let mut out: Vec<Leftover> = Vec::new();
    check(unsafe {
        sys::dckpt_scan_leftovers(
            cdir.as_ptr(),
            cname.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            grace.as_secs_f64(),
            Some(each),
            &mut out as *mut Vec<Leftover> as *mut c_void,
        )
    })?;
    Ok(out)
}
