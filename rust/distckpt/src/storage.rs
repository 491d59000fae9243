//! Where checkpoints live (`dckpt_storage`): the POSIX file system, an in-process memory store, or storage written in
//! Rust ([`Storage`]: an object store client, an SDK) plugged in through the C callbacks. A [`StorageHandle`] goes in
//! the `storage` field of [`crate::SaveOptions`], [`crate::ReadOptions`] and [`ExportOptions`], and runs the prune
//! operations of the metadata-last layout ([`StorageHandle::stat`], [`StorageHandle::remove_leftovers`],
//! [`StorageHandle::remove_checkpoint`]).
//!
//! Lifetimes. The C storage is reference counted (readers and async saves keep it alive), but the callbacks have no
//! destructor: the C library never says when it stops calling them. So the Rust side keeps the [`Storage`] alive
//! itself: every [`crate::Checkpoint`] and [`crate::SaveFuture`] opened with a handle holds a clone of it, and the
//! storage (C object, trampolines' context, the `Arc<dyn Storage>`) is freed when the last clone goes.
//!
//! Panics. Every trampoline runs the Rust code under `catch_unwind` (module `panic`): a panic in a [`Storage`] method
//! becomes an error (`ErrorCode::User`) of the operation that called it, whose message says so; it never unwinds into
//! C.
//!
//! [`export_safetensors`] (the header's "Tools" section, in the child module `storage::export`) is re-exported here,
//! where its options name the storages it reads from and writes to; so are [`S3Options`] and the constructors of S3
//! and URL handles ([`StorageHandle::s3`], [`StorageHandle::open_url`], in the child module `storage::s3`).
//!
//! With no handle, the paths these calls take may be URLs: `"s3://bucket/prefix"` is S3 configured from the AWS_*
//! environment, and another scheme is an `Unsupported` error naming it ([`list`] is the handle-less form of
//! [`StorageHandle::list`]).

use std::borrow::Cow;
use std::ffi::{c_void, CString};
use std::io;
use std::os::raw::{c_char, c_int};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distckpt_sys as sys;

use crate::error::{check, Error, ErrorCode, Result};
use crate::panic;
use crate::util::{callback_path, lock, lossy_string, path_cstring};
use crate::version::check_abi;

mod export;
mod s3;

pub use export::{export_safetensors, ExportOptions};
pub use s3::{S3Addressing, S3Options};

/// A file being written through a [`Storage`] (what [`Storage::create`] returns). Nothing is visible at its path
/// before [`close`](Self::close) succeeds with `discard == false`.
pub trait StorageFile: Send + Sync {
    /// Writes `data` at `offset`. Called from several threads at once, for disjoint ranges, in any order; bytes never
    /// written read as zeros.
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Makes what was written so far durable (default: nothing to do).
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    /// Finishes the file: `discard == false` publishes it, durably, with `size` bytes (the rest past what was written
    /// is zeros); `discard == true` abandons it. Called exactly once.
    fn close(self: Box<Self>, size: u64, discard: bool) -> io::Result<()>;
}

/// A multipart upload a [`Storage`] is sending (what [`Storage::begin_upload`] returns): distckpt assembles the file
/// into parts and sends them, then completes or aborts the upload, exactly once.
pub trait Upload: Send + Sync {
    /// Sends part `number` (from 1, started in order; several parts may be in flight at once from different threads).
    /// Every part but the last has the same size, at least [`Storage::min_part_size`]'s.
    fn upload_part(&self, number: u32, data: &[u8]) -> io::Result<()>;
    /// Publishes the object from the parts sent. The last call: after an error here the upload cleans up itself.
    fn complete(self: Box<Self>) -> io::Result<()>;
    /// Abandons the upload and its parts (instead of `complete`, when the file is discarded or a call failed).
    fn abort(self: Box<Self>) -> io::Result<()>;
}

/// Storage written in Rust. Paths are '/'-separated strings exactly as given to the save or open call, joined with
/// plain file names (`"<checkpoint>/metadata.dckpt"`); there are no directories to create or rename. Every method may
/// be called from several threads at once (at most `max_in_flight` writes and reads together).
///
/// Errors are `std::io::Error`s, mapped to the C codes by kind: `NotFound` is `DCKPT_ENOTFOUND`, `AlreadyExists`
/// `DCKPT_EEXISTS`, `StorageFull` `DCKPT_ENOSPC`, an `io::Error` wrapping a [`crate::Error`] its code, anything else
/// `DCKPT_EIO`. The message is appended to the error of the distckpt call that failed (which names the path).
pub trait Storage: Send + Sync {
    /// Starts writing `path` (`size_hint`: its final size, 0 when unknown).
    fn create(&self, path: &str, size_hint: u64) -> io::Result<Box<dyn StorageFile>>;
    /// The size of the file at `path`; a `NotFound` error when there is none.
    fn size(&self, path: &str) -> io::Result<u64>;
    /// Reads into `buf` from `offset` of `path`; returns the bytes read (fewer than `buf.len()` only at the end).
    fn read_at(&self, path: &str, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// The names directly below `dir` (files, and the first component of longer paths), each once, in any order.
    /// Nothing below `dir` is an empty list, not an error.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;
    /// Removes the file at `path`; `Ok` when there is none.
    fn remove(&self, path: &str) -> io::Result<()>;
    /// Whether [`commit`](Self::commit) is implemented (default false: distckpt commits with create/write/close
    /// after checking that nothing is there, a check another writer can race). Read once, by
    /// [`StorageHandle::from_storage`].
    fn supports_commit(&self) -> bool {
        false
    }
    /// The commit: writes `data` to `path` as one atomic, durable step. With `replace == false` it must fail with
    /// `AlreadyExists` when something is at `path` (S3: a conditional PUT, If-None-Match: *). Called only when
    /// [`supports_commit`](Self::supports_commit) returns true.
    fn commit(&self, path: &str, data: &[u8], replace: bool) -> io::Result<()> {
        let _ = (path, data, replace);
        Err(io::Error::new(io::ErrorKind::Unsupported, "this storage has no atomic commit"))
    }
    /// Whether [`begin_upload`](Self::begin_upload) is implemented (default false). With it, distckpt assembles every
    /// file of more than one part itself: it buffers a few parts per file (never the whole file), sends each as soon
    /// as its bytes are written, and completes the upload on close or aborts it on discard or failure; smaller files
    /// still go through [`create`](Self::create). Read once, by [`StorageHandle::from_storage`].
    fn supports_multipart(&self) -> bool {
        false
    }
    /// The size of every part but the last (0: distckpt's 8 MiB; grown so a file needs at most 10000 parts). Read
    /// once, by [`StorageHandle::from_storage`].
    fn min_part_size(&self) -> u64 {
        0
    }
    /// Starts a multipart upload of `path` (`size_hint`: its final size, 0 when unknown); nothing is visible there
    /// before the upload's `complete` succeeds. Called only when
    /// [`supports_multipart`](Self::supports_multipart) returns true.
    fn begin_upload(&self, path: &str, size_hint: u64) -> io::Result<Box<dyn Upload>> {
        let _ = (path, size_hint);
        Err(io::Error::new(io::ErrorKind::Unsupported, "this storage has no multipart uploads"))
    }
}

/// The C code of an `io::Error` a [`Storage`] returned.
pub fn io_error_code(e: &io::Error) -> ErrorCode {
    if let Some(inner) = e.get_ref().and_then(|r| r.downcast_ref::<Error>()) {
        return inner.code();
    }
    match e.kind() {
        io::ErrorKind::NotFound => ErrorCode::NotFound,
        io::ErrorKind::AlreadyExists => ErrorCode::Exists,
        io::ErrorKind::StorageFull => ErrorCode::NoSpace,
        io::ErrorKind::OutOfMemory => ErrorCode::NoMemory,
        io::ErrorKind::Unsupported => ErrorCode::Unsupported,
        io::ErrorKind::InvalidInput => ErrorCode::InvalidArgument,
        _ => ErrorCode::Io,
    }
}

/// What the trampolines share: the Rust storage, and the messages of its latest failures (by path), which the C
/// library cannot carry (its callbacks return a code only).
struct Bridge {
    storage: Arc<dyn Storage>,
    errors: Mutex<Vec<(String, String)>>,
}

/// How many storage failure messages are kept for the errors of the calls that hit them.
const KEPT_ERRORS: usize = 16;

impl Bridge {
    fn record(&self, path: &str, message: String) {
        let mut errors = lock(&self.errors);
        if errors.len() >= KEPT_ERRORS {
            errors.remove(0);
        }
        errors.push((path.to_string(), message));
    }

    /// Runs `f` under `catch_unwind`; an error or a panic becomes a C code, its message kept for `path`.
    fn run(&self, op: &str, path: &str, f: impl FnOnce() -> io::Result<()>) -> c_int {
        match panic::catch(f) {
            Ok(Ok(())) => sys::DCKPT_OK,
            Ok(Err(e)) => {
                self.record(path, format!("{op} '{path}': {e}"));
                io_error_code(&e).raw()
            }
            Err(payload) => {
                self.record(path, format!("{op} '{path}': the storage panicked: {}", panic::message(&payload)));
                sys::DCKPT_EUSER
            }
        }
    }
}

/// The file handle the C library holds: the Rust file and the path it was created for (for messages).
struct OpenFile {
    file: Box<dyn StorageFile>,
    path: String,
}

/// The `size` bytes at `data` a callback was given (C may pass NULL for none).
unsafe fn c_bytes<'a>(data: *const c_void, size: usize) -> &'a [u8] {
    if size == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(data.cast::<u8>(), size)
    }
}

unsafe fn bridge<'a>(user_data: *mut c_void) -> &'a Bridge {
    &*(user_data as *const Bridge)
}

unsafe extern "C" fn t_create(
    file: *mut *mut sys::dckpt_storage_file,
    path: *const c_char,
    size_hint: u64,
    ud: *mut c_void,
) -> c_int {
    let b = bridge(ud);
    let name = lossy_string(path);
    b.run("create", &name, || {
        let p = callback_path(path)?;
        let f = b.storage.create(p, size_hint)?;
        *file = Box::into_raw(Box::new(OpenFile { file: f, path: p.to_string() })).cast();
        Ok(())
    })
}

unsafe extern "C" fn t_write(
    file: *mut sys::dckpt_storage_file,
    offset: u64,
    data: *const c_void,
    size: usize,
    ud: *mut c_void,
) -> c_int {
    let b = bridge(ud);
    let f = &*(file as *const OpenFile);
    b.run("write", &f.path, || {
        let bytes = c_bytes(data, size);
        f.file.write_at(offset, bytes)
    })
}

unsafe extern "C" fn t_sync(file: *mut sys::dckpt_storage_file, ud: *mut c_void) -> c_int {
    let b = bridge(ud);
    let f = &*(file as *const OpenFile);
    b.run("sync", &f.path, || f.file.sync())
}

unsafe extern "C" fn t_close(file: *mut sys::dckpt_storage_file, size: u64, discard: c_int, ud: *mut c_void) -> c_int {
    let b = bridge(ud);
    // Called exactly once per file: the box is taken back here whatever happens.
    let f = Box::from_raw(file as *mut OpenFile);
    let OpenFile { file, path } = *f;
    b.run("close", &path, move || file.close(size, discard != 0))
}

unsafe extern "C" fn t_size(size: *mut u64, path: *const c_char, ud: *mut c_void) -> c_int {
    let b = bridge(ud);
    let name = lossy_string(path);
    let rc = b.run("size", &name, || {
        *size = b.storage.size(callback_path(path)?)?;
        Ok(())
    });
    if rc == sys::DCKPT_ENOTFOUND {
        // Asking is how distckpt looks for files: a missing one is no failure worth reporting.
        b.forget(&name);
    }
    rc
}

unsafe extern "C" fn t_read(
    got: *mut usize,
    path: *const c_char,
    offset: u64,
    data: *mut c_void,
    size: usize,
    ud: *mut c_void,
) -> c_int {
    let b = bridge(ud);
    let name = lossy_string(path);
    b.run("read", &name, || {
        let buf = if size == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(data.cast::<u8>(), size) };
        let n = b.storage.read_at(callback_path(path)?, offset, buf)?;
        if n > size {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("read_at returned {n} for a {size}-byte buffer"),
            ));
        }
        *got = n;
        Ok(())
    })
}

unsafe extern "C" fn t_list(out: *mut sys::dckpt_storage_list, dir: *const c_char, ud: *mut c_void) -> c_int {
    let b = bridge(ud);
    let name = lossy_string(dir);
    b.run("list", &name, || {
        for n in b.storage.list(callback_path(dir)?)? {
            let c = CString::new(n)
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a listed name holds a NUL byte"))?;
            let rc = sys::dckpt_storage_list_add(out, c.as_ptr());
            if rc != sys::DCKPT_OK {
                let msg = Error::last(rc).to_string();
                return Err(io::Error::new(io::ErrorKind::InvalidData, msg));
            }
        }
        Ok(())
    })
}

unsafe extern "C" fn t_remove(path: *const c_char, ud: *mut c_void) -> c_int {
    let b = bridge(ud);
    let name = lossy_string(path);
    b.run("remove", &name, || b.storage.remove(callback_path(path)?))
}

unsafe extern "C" fn t_commit(
    path: *const c_char,
    data: *const c_void,
    size: usize,
    replace: c_int,
    ud: *mut c_void,
) -> c_int {
    let b = bridge(ud);
    let name = lossy_string(path);
    let rc = b.run("commit", &name, || {
        let bytes = c_bytes(data, size);
        b.storage.commit(callback_path(path)?, bytes, replace != 0)
    });
    if rc == sys::DCKPT_EEXISTS {
        b.forget(&name); // the C error already says what is there
    }
    rc
}

/// The upload handle the C library holds: the Rust upload and its path (for messages).
struct OpenUpload {
    upload: Box<dyn Upload>,
    path: String,
}

unsafe extern "C" fn t_upload_begin(
    up: *mut *mut sys::dckpt_upload,
    path: *const c_char,
    size_hint: u64,
    ud: *mut c_void,
) -> c_int {
    let b = bridge(ud);
    let name = lossy_string(path);
    b.run("upload_begin", &name, || {
        let p = callback_path(path)?;
        let u = b.storage.begin_upload(p, size_hint)?;
        *up = Box::into_raw(Box::new(OpenUpload { upload: u, path: p.to_string() })).cast();
        Ok(())
    })
}

unsafe extern "C" fn t_upload_part(
    up: *mut sys::dckpt_upload,
    number: std::os::raw::c_uint,
    data: *const c_void,
    size: usize,
    ud: *mut c_void,
) -> c_int {
    let b = bridge(ud);
    let u = &*(up as *const OpenUpload);
    b.run("upload_part", &u.path, || {
        let bytes = c_bytes(data, size);
        u.upload.upload_part(number, bytes)
    })
}

unsafe extern "C" fn t_upload_complete(up: *mut sys::dckpt_upload, ud: *mut c_void) -> c_int {
    let b = bridge(ud);
    // The last call on the upload: the box is taken back here whatever happens.
    let OpenUpload { upload, path } = *Box::from_raw(up as *mut OpenUpload);
    b.run("upload_complete", &path, move || upload.complete())
}

unsafe extern "C" fn t_upload_abort(up: *mut sys::dckpt_upload, ud: *mut c_void) -> c_int {
    let b = bridge(ud);
    let OpenUpload { upload, path } = *Box::from_raw(up as *mut OpenUpload);
    b.run("upload_abort", &path, move || upload.abort())
}

impl Bridge {
    fn forget(&self, path: &str) {
        lock(&self.errors).retain(|(p, _)| p != path);
    }

    /// The messages of failures on paths that `message` (a distckpt error) names, taken out of the record.
    fn take_for(&self, message: &str) -> Vec<String> {
        let mut errors = lock(&self.errors);
        let mut found = Vec::new();
        errors.retain(|(p, m)| {
            let named = !p.is_empty()
                && (message.contains(p.as_str())
                    || p.rsplit('/').next().is_some_and(|f| !f.is_empty() && message.contains(f)));
            if named {
                found.push(m.clone());
            }
            !named
        });
        found
    }
}

struct Inner {
    raw: *mut sys::dckpt_storage,
    kind: Cow<'static, str>,
    bridge: Option<Box<Bridge>>,
}

// The C storage is thread-safe (distckpt.h); the bridge holds a `Send + Sync` storage and mutexes.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // Every reader and async save that used this storage held a clone of the handle and is gone, so the C
        // library calls the trampolines no more: the bridge may go after the C reference.
        unsafe { sys::dckpt_storage_free(self.raw) };
        self.bridge.take();
    }
}

/// A storage (`dckpt_storage`): cheap to clone (shared), `Send + Sync`, freed with its last clone. Readers and
/// async saves opened with it keep a clone, so dropping the caller's handle while they run is safe.
#[derive(Clone)]
pub struct StorageHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StorageHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageHandle").field("kind", &self.inner.kind).finish()
    }
}

/// What is at a path of a storage ([`StorageHandle::stat`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathKind {
    /// Nothing, or nothing distckpt wrote.
    None,
    /// A committed checkpoint (its metadata is there).
    Checkpoint,
    /// No checkpoint, only what unfinished saves left.
    Incomplete,
    /// A kind newer than this crate.
    Other(i32),
}

/// [`StorageHandle::stat`]'s answer (`dckpt_path_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathInfo {
    pub kind: PathKind,
    /// Files distckpt wrote there (committed and leftover), and their total size.
    pub files: u64,
    pub bytes: u64,
    /// Files no committed checkpoint refers to: unfinished or superseded saves.
    pub leftover_files: u64,
    pub leftover_bytes: u64,
    /// Unfinished saves whose marker is younger than the grace period.
    pub saves_in_progress: u32,
}

impl StorageHandle {
    fn wrap(raw: *mut sys::dckpt_storage, kind: Cow<'static, str>, bridge: Option<Box<Bridge>>) -> StorageHandle {
        StorageHandle { inner: Arc::new(Inner { raw, kind, bridge }) }
    }

    /// The POSIX file system (what no storage means for a plain path).
    pub fn posix() -> Result<StorageHandle> {
        check_abi()?;
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::dckpt_storage_new_posix(&mut raw) })?;
        Ok(Self::wrap(raw, "posix".into(), None))
    }

    /// An in-process store of files, lost with the last clone of the handle (for tests and examples); checkpoints
    /// on it are committed by writing the metadata last.
    pub fn memory() -> Result<StorageHandle> {
        check_abi()?;
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::dckpt_storage_new_memory(&mut raw) })?;
        Ok(Self::wrap(raw, "memory".into(), None))
    }

    /// Storage written in Rust, behind the C callbacks. `max_in_flight`: the most write, read and part upload calls
    /// running at once (0: the library's default, 16). Checkpoints on it are committed by writing the metadata last.
    pub fn from_storage(storage: Arc<dyn Storage>, max_in_flight: u32) -> Result<StorageHandle> {
        check_abi()?;
        let has_commit = storage.supports_commit();
        let multipart = storage.supports_multipart();
        let min_part_size = if multipart { storage.min_part_size() } else { 0 };
        let bridge = Box::new(Bridge { storage, errors: Mutex::new(Vec::new()) });
        let mut cb: sys::dckpt_storage_callbacks = unsafe { std::mem::zeroed() };
        check(unsafe { sys::dckpt_storage_callbacks_init(&mut cb, sys::DCKPT_STORAGE_CALLBACKS_VERSION) })?;
        cb.create = Some(t_create);
        cb.write = Some(t_write);
        cb.sync = Some(t_sync);
        cb.close = Some(t_close);
        cb.size = Some(t_size);
        cb.read = Some(t_read);
        cb.list = Some(t_list);
        cb.remove = Some(t_remove);
        cb.commit = if has_commit { Some(t_commit) } else { None };
        if multipart {
            cb.upload_begin = Some(t_upload_begin);
            cb.upload_part = Some(t_upload_part);
            cb.upload_complete = Some(t_upload_complete);
            cb.upload_abort = Some(t_upload_abort);
            cb.min_part_size = min_part_size;
        }
        // The box's address is stable; it lives in `Inner` until after dckpt_storage_free.
        cb.user_data = &*bridge as *const Bridge as *mut c_void;
        cb.max_in_flight = max_in_flight;
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::dckpt_storage_new_callbacks(&mut raw, &cb) })?;
        Ok(Self::wrap(raw, "callbacks".into(), Some(bridge)))
    }

    pub(crate) fn raw(&self) -> *mut sys::dckpt_storage {
        self.inner.raw
    }

    /// Adds to `err` what the [`Storage`] said about the paths it names (the C error carries only a code).
    pub(crate) fn annotate(&self, err: Error) -> Error {
        let Some(b) = &self.inner.bridge else { return err };
        let said = b.take_for(err.message());
        if said.is_empty() {
            err
        } else {
            err.context(&format!("storage: {}", said.join("; ")))
        }
    }

    /// Describes what is at `path` for a checkpoint laid out for storage without rename. Saves whose marker is
    /// younger than `grace` count as in progress.
    pub fn stat(&self, path: impl AsRef<Path>, grace: Duration) -> Result<PathInfo> {
        let cpath = path_cstring(path.as_ref())?;
        let mut raw: sys::dckpt_path_info = unsafe { std::mem::zeroed() };
        raw.version = sys::DCKPT_PATH_INFO_VERSION;
        check(unsafe { sys::dckpt_storage_stat(&mut raw, self.raw(), cpath.as_ptr(), grace.as_secs_f64()) })
            .map_err(|e| self.annotate(e))?;
        let kind = match raw.kind as u32 {
            sys::DCKPT_PATH_NONE => PathKind::None,
            sys::DCKPT_PATH_CHECKPOINT => PathKind::Checkpoint,
            sys::DCKPT_PATH_INCOMPLETE => PathKind::Incomplete,
            _ => PathKind::Other(raw.kind),
        };
        Ok(PathInfo {
            kind,
            files: raw.files,
            bytes: raw.bytes,
            leftover_files: raw.leftover_files,
            leftover_bytes: raw.leftover_bytes,
            saves_in_progress: raw.saves_in_progress,
        })
    }

    /// Removes the leftovers at `path` (files of unfinished saves whose marker is older than `grace`, files no
    /// committed checkpoint refers to), never the committed checkpoint nor a file distckpt did not write. Returns the
    /// paths removed (with `dry_run`, those that would be, removing nothing).
    pub fn remove_leftovers(&self, path: impl AsRef<Path>, grace: Duration, dry_run: bool) -> Result<Vec<String>> {
        unsafe extern "C" fn removed(path: *const c_char, ud: *mut c_void) -> c_int {
            let out = &*(ud as *const Mutex<Vec<String>>);
            lock(out).push(lossy_string(path));
            0
        }
        let cpath = path_cstring(path.as_ref())?;
        let out: Mutex<Vec<String>> = Mutex::new(Vec::new());
        let rc = unsafe {
            sys::dckpt_storage_remove_leftovers(
                self.raw(),
                cpath.as_ptr(),
                grace.as_secs_f64(),
                dry_run as c_int,
                Some(removed),
                &out as *const Mutex<Vec<String>> as *mut c_void,
            )
        };
        check(rc).map_err(|e| self.annotate(e))?;
        Ok(out.into_inner().unwrap_or_else(|e| e.into_inner()))
    }

    /// The names directly below `dir` (`dckpt_storage_list_dir`), each once, in byte order: files and directories (on an
    /// object store, the first component of longer keys). A `dir` with nothing below it has none. On S3, `dir` is an
    /// `"s3://bucket/prefix"` URL.
    pub fn list(&self, dir: impl AsRef<Path>) -> Result<Vec<String>> {
        list_on(self.raw(), dir.as_ref()).map_err(|e| self.annotate(e))
    }

    /// Removes the checkpoint at `path` and its leftovers: the metadata first (it stops existing in one step), then
    /// its data files. `NotFound` when nothing distckpt wrote is there.
    pub fn remove_checkpoint(&self, path: impl AsRef<Path>) -> Result<()> {
        let cpath = path_cstring(path.as_ref())?;
        check(unsafe { sys::dckpt_storage_remove_checkpoint(self.raw(), cpath.as_ptr()) }).map_err(|e| self.annotate(e))
    }
}

/// The names directly below `dir` with no handle (`dckpt_storage_list_dir` with a NULL storage): `dir` is an
/// `"s3://bucket/prefix"` URL (S3 configured from the AWS_* environment) or a path of the POSIX file system; another
/// scheme is `Unsupported`, naming it. As [`StorageHandle::list`] otherwise.
pub fn list(dir: impl AsRef<Path>) -> Result<Vec<String>> {
    check_abi()?;
    list_on(std::ptr::null_mut(), dir.as_ref())
}

fn list_on(storage: *mut sys::dckpt_storage, dir: &Path) -> Result<Vec<String>> {
    unsafe extern "C" fn each(name: *const c_char, ud: *mut c_void) -> c_int {
        // Nothing here can panic but an allocation failure; the vector is ours alone during the call.
        (*(ud as *mut Vec<String>)).push(lossy_string(name));
        0
    }
    let cdir = path_cstring(dir)?;
    let mut out: Vec<String> = Vec::new();
    check(unsafe {
        sys::dckpt_storage_list_dir(storage, cdir.as_ptr(), Some(each), &mut out as *mut Vec<String> as *mut c_void)
    })?;
    Ok(out)
}

/// The raw pointer of an optional handle (null: the POSIX file system).
pub(crate) fn raw_or_null(s: &Option<StorageHandle>) -> *mut sys::dckpt_storage {
    s.as_ref().map_or(std::ptr::null_mut(), |h| h.raw())
}

/// [`StorageHandle::annotate`] for an optional handle.
pub(crate) fn annotate(s: &Option<StorageHandle>, err: Error) -> Error {
    match s {
        Some(h) => h.annotate(err),
        None => err,
    }
}
