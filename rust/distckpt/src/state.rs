//! Saving and loading: what a rank saves ([`SaveState`]) or loads into ([`LoadState`]), borrowed from Rust buffers
//! (`dckpt_state`), and the save/load calls themselves.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::path::Path;
use std::time::Duration;

use distckpt_sys as sys;

use crate::checkpoint::{Checkpoint, Compression, IoStats, ReadOptions};
use crate::comm::Comm;
use crate::dtype::{check_element, Dtype, Element};
use crate::error::{check, Error, ErrorCode, Result};
use crate::progress::{self, Progress, ProgressFn};
use crate::storage::{annotate, raw_or_null, StorageHandle};
use crate::util::{cstring, path_cstring, timeout_ms, volume};
use crate::version::check_abi;

/// Options for a save (`dckpt_save_options`).
#[derive(Clone, Debug)]
pub struct SaveOptions {
    /// I/O threads; 0: the library's default.
    pub io_threads: u32,
    /// Replace an existing checkpoint at the path (default false).
    pub overwrite: bool,
    /// fsync data, metadata and directories (default true).
    pub sync: bool,
    /// Checksum block size: 0 for the default (1 MiB), else a power of two >= 4096.
    pub checksum_block_size: u64,
    /// Collective timeout; None: the library's default (10 minutes).
    pub timeout: Option<Duration>,
    /// Where the checkpoint is written; `None`: the POSIX file system. An async save keeps a clone of the handle
    /// until it finishes.
    pub storage: Option<StorageHandle>,
    /// An incremental save: an earlier checkpoint beside the path (its path in the same directory, or its name) whose
    /// chunks are not written again where the bytes are equal (same entry and region, same XXH3-128); the checkpoint
    /// refers to them and needs those checkpoints to be read ([`CheckpointInfo::bases`]). `None`: self-contained.
    ///
    /// [`CheckpointInfo::bases`]: crate::CheckpointInfo::bases
    pub base: Option<String>,
    /// With `base`: the `full_every`-th save of a chain (counted from the last self-contained one) is written whole
    /// instead; 0: no bound.
    pub full_every: u32,
    /// Lossless compression of the data ([`Compression::Zstd`]; default [`Compression::None`]): every checksum block
    /// of a host piece is compressed on its own, and what does not shrink is stored raw. The checkpoint is format
    /// 3.0. Reads decode it; a compressed chunk has no mapping, so its views are decoded copies ([`crate::view`]).
    /// [`CheckpointInfo::stored_bytes`] says what it saved.
    ///
    /// [`CheckpointInfo::stored_bytes`]: crate::CheckpointInfo::stored_bytes
    pub compression: Compression,
    /// zstd's level with `compression`, -7 (fastest) to 22; 0: the default (1). Outside that range the save fails
    /// (`InvalidArgument`).
    pub compression_level: i32,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            io_threads: 0,
            overwrite: false,
            sync: true,
            checksum_block_size: 0,
            timeout: None,
            storage: None,
            base: None,
            full_every: 0,
            compression: Compression::None,
            compression_level: 0,
        }
    }
}

impl SaveOptions {
    /// The C options, and the C string `base` points into (keep it alive for the call).
    fn to_raw(&self) -> Result<(sys::dckpt_save_options, Option<std::ffi::CString>)> {
        let mut raw: sys::dckpt_save_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::dckpt_save_options_init(&mut raw, sys::DCKPT_SAVE_OPTIONS_VERSION) })?;
        raw.io_threads = self.io_threads;
        raw.overwrite = self.overwrite as i32;
        raw.sync = self.sync as i32;
        raw.checksum_block_size = self.checksum_block_size;
        raw.timeout_ms = timeout_ms(self.timeout);
        raw.storage = raw_or_null(&self.storage);
        let base = self.base.as_deref().map(|b| cstring(b, "base")).transpose()?;
        raw.base = base.as_ref().map_or(std::ptr::null(), |b| b.as_ptr());
        raw.full_every = self.full_every;
        raw.compression = self.compression.raw();
        raw.compression_level = self.compression_level;
        Ok((raw, base))
    }

    /// These options, writing to `storage`.
    pub fn with_storage(mut self, storage: &StorageHandle) -> SaveOptions {
        self.storage = Some(storage.clone());
        self
    }
}

/// What a save reports (`dckpt_save_info`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SaveInfo {
    pub num_files: u32,
    pub num_entries: u32,
    /// Bytes this rank wrote (compressed chunks at their stored size).
    pub bytes_written: u64,
    /// Data bytes of the whole checkpoint.
    pub total_bytes: u64,
    pub metadata_bytes: u64,
    /// Wall time of the call on this rank.
    pub seconds: f64,
    /// Of `total_bytes`, those an incremental save refers to in its bases instead of writing them.
    pub bytes_reused: u64,
}

fn new_save_info() -> sys::dckpt_save_info {
    let mut raw: sys::dckpt_save_info = unsafe { std::mem::zeroed() };
    raw.version = sys::DCKPT_SAVE_INFO_VERSION;
    raw
}

impl SaveInfo {
    fn from_raw(r: &sys::dckpt_save_info) -> SaveInfo {
        SaveInfo {
            num_files: r.num_files,
            num_entries: r.num_entries,
            bytes_written: r.bytes_written,
            total_bytes: r.total_bytes,
            metadata_bytes: r.metadata_bytes,
            seconds: r.seconds,
            bytes_reused: r.bytes_reused,
        }
    }
}

/// The C state plus what Rust must know to check every buffer's length before handing it over (the C library
/// trusts `volume × dtype size`).
struct RawState {
    raw: *mut sys::dckpt_state,
    tensors: HashMap<String, (Dtype, Vec<u64>)>,
}

impl Drop for RawState {
    fn drop(&mut self) {
        unsafe { sys::dckpt_state_free(self.raw) }
    }
}

impl RawState {
    fn new() -> Result<RawState> {
        check_abi()?;
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::dckpt_state_new(&mut raw) })?;
        Ok(RawState { raw, tensors: HashMap::new() })
    }

    fn declare(&mut self, name: &str, dtype: Dtype, shape: &[u64]) -> Result<()> {
        let cname = cstring(name, "entry name")?;
        check(unsafe {
            sys::dckpt_state_add_tensor(self.raw, cname.as_ptr(), dtype.raw(), shape.len(), shape.as_ptr())
        })?;
        self.tensors.insert(name.to_string(), (dtype, shape.to_vec()));
        Ok(())
    }

    /// Checks `T`, the box's rank and the buffer's length, then adds the piece. `data` must stay valid (and, for a
    /// load, writable) for the state's lifetime: the callers' lifetimes guarantee it.
    fn piece<T: Element>(
        &mut self,
        name: &str,
        offsets: &[u64],
        lengths: &[u64],
        data: *mut T,
        len: usize,
    ) -> Result<()> {
        let what = || format!("tensor '{name}'");
        let Some((dtype, shape)) = self.tensors.get(name) else {
            return Err(Error::new(ErrorCode::InvalidArgument, format!("tensor '{name}' was not declared")));
        };
        check_element::<T>(*dtype, what)?;
        if offsets.len() != shape.len() || lengths.len() != shape.len() {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "tensor '{name}' has {} dimensions; the piece has {} offsets and {} lengths",
                    shape.len(),
                    offsets.len(),
                    lengths.len()
                ),
            ));
        }
        let n = volume(lengths, what)?;
        if n != len {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("tensor '{name}': the piece {lengths:?} holds {n} elements, but the buffer has {len}"),
            ));
        }
        let cname = cstring(name, "entry name")?;
        let ptr = |s: &[u64]| if s.is_empty() { std::ptr::null() } else { s.as_ptr() };
        check(unsafe { sys::dckpt_state_add_piece(self.raw, cname.as_ptr(), ptr(offsets), ptr(lengths), data.cast()) })
    }

    fn bytes(&mut self, name: &str, data: *mut u8, len: usize) -> Result<()> {
        let cname = cstring(name, "entry name")?;
        check(unsafe { sys::dckpt_state_add_bytes(self.raw, cname.as_ptr(), data.cast(), len as u64) })
    }
}

fn comm_ptr(comm: &Option<&mut Comm>) -> *mut sys::dckpt_comm {
    comm.as_ref().map_or(std::ptr::null_mut(), |c| c.raw)
}

fn finish_collective<T>(comm: Option<&mut Comm>, result: Result<T>) -> Result<T> {
    match comm {
        Some(c) => c.after_call(result),
        None => result,
    }
}

/// What this rank saves: named tensors (as pieces of their global shape) and bytes entries, **borrowed** from Rust
/// buffers for `'a` (nothing is copied until the save runs).
///
/// `Send`, not `Sync` (a `dckpt_state` is built on one thread and may be handed to another between calls).
pub struct SaveState<'a> {
    inner: RawState,
    _borrows: PhantomData<&'a [u8]>,
}

unsafe impl Send for SaveState<'_> {}

impl std::fmt::Debug for SaveState<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveState").field("tensors", &self.inner.tensors.len()).finish_non_exhaustive()
    }
}

impl<'a> SaveState<'a> {
    pub fn new() -> Result<SaveState<'a>> {
        Ok(SaveState { inner: RawState::new()?, _borrows: PhantomData })
    }

    /// Adds a whole tensor held by this rank, with `T`'s dtype.
    pub fn add_tensor<T: Element>(&mut self, name: &str, shape: &[u64], data: &'a [T]) -> Result<&mut Self> {
        self.add_tensor_as(name, T::DTYPE, shape, data)
    }

    /// Adds a whole tensor with an explicit dtype: raw `u16` bits as `Dtype::BF16`/`F16`, `u8` bits as a float8
    /// format or `BOOL`.
    pub fn add_tensor_as<T: Element>(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[u64],
        data: &'a [T],
    ) -> Result<&mut Self> {
        check_element::<T>(dtype, || format!("tensor '{name}'"))?;
        self.inner.declare(name, dtype, shape)?;
        let zeros = vec![0u64; shape.len()];
        self.add_piece(name, &zeros, shape, data)
    }

    /// Declares a tensor by its global shape; add this rank's parts with [`add_piece`](Self::add_piece).
    pub fn declare_tensor(&mut self, name: &str, dtype: Dtype, shape: &[u64]) -> Result<&mut Self> {
        self.inner.declare(name, dtype, shape)?;
        Ok(self)
    }

    /// Adds the box `[offsets, offsets + lengths)` of a declared tensor, held row-major in `data`. The same box on
    /// several ranks is a replica (written once).
    pub fn add_piece<T: Element>(
        &mut self,
        name: &str,
        offsets: &[u64],
        lengths: &[u64],
        data: &'a [T],
    ) -> Result<&mut Self> {
        // A save only reads the piece; the C signature is shared with load, hence `*mut`.
        self.inner.piece(name, offsets, lengths, data.as_ptr() as *mut T, data.len())?;
        Ok(self)
    }

    /// Adds an opaque bytes entry.
    pub fn add_bytes(&mut self, name: &str, data: &'a [u8]) -> Result<&mut Self> {
        self.inner.bytes(name, data.as_ptr() as *mut u8, data.len())?;
        Ok(self)
    }

    /// Free-form metadata saved with the checkpoint (rank 0's values are stored).
    pub fn set_user(&mut self, key: &str, value: &str) -> Result<&mut Self> {
        let (k, v) = (cstring(key, "user key")?, cstring(value, "user value")?);
        check(unsafe { sys::dckpt_state_set_user(self.inner.raw, k.as_ptr(), v.as_ptr()) })?;
        Ok(self)
    }

    /// The description a binding uses to rebuild nested state (rank 0's value is stored).
    pub fn set_structure(&mut self, data: &[u8]) -> Result<&mut Self> {
        check(unsafe { sys::dckpt_state_set_structure(self.inner.raw, data.as_ptr().cast(), data.len()) })?;
        Ok(self)
    }

    /// Saves to the directory `path`, atomically, from this process alone.
    pub fn save(&self, path: impl AsRef<Path>, opts: &SaveOptions) -> Result<SaveInfo> {
        self.save_impl(path.as_ref(), None, opts, None)
    }

    /// Saves collectively: every rank of `comm` calls it with the same path. If any rank fails, every rank returns
    /// an error and nothing appears at `path`.
    pub fn save_with_comm(&self, path: impl AsRef<Path>, comm: &mut Comm, opts: &SaveOptions) -> Result<SaveInfo> {
        self.save_impl(path.as_ref(), Some(comm), opts, None)
    }

    /// A save reporting the bytes this rank has written; return `false` from `progress` to abort (`User` error).
    pub fn save_with_progress(
        &self,
        path: impl AsRef<Path>,
        comm: Option<&mut Comm>,
        opts: &SaveOptions,
        progress: ProgressFn<'_>,
    ) -> Result<SaveInfo> {
        self.save_impl(path.as_ref(), comm, opts, Some(progress))
    }

    fn save_impl(
        &self,
        path: &Path,
        comm: Option<&mut Comm>,
        opts: &SaveOptions,
        progress: Option<ProgressFn<'_>>,
    ) -> Result<SaveInfo> {
        let cpath = path_cstring(path)?;
        let (mut raw_opts, _base) = opts.to_raw()?;
        let progress = progress.map(Progress::new);
        (raw_opts.progress, raw_opts.progress_user_data) = progress::c_pair(&progress);
        let mut info = new_save_info();
        let rc = unsafe { sys::dckpt_save(&mut info, cpath.as_ptr(), self.inner.raw, comm_ptr(&comm), &raw_opts) };
        let result = check(rc).map(|_| SaveInfo::from_raw(&info)).map_err(|e| annotate(&opts.storage, e));
        finish_collective(comm, progress::finish(progress, result))
    }

    /// Starts a save and returns once every piece and bytes entry has been copied into buffers the library owns:
    /// the borrowed buffers are free again as soon as this returns (the future does not borrow them). Writing and
    /// the commit run in the background; the communicator belongs to the save until the future completes.
    pub fn save_async<'c>(
        &self,
        path: impl AsRef<Path>,
        comm: Option<&'c mut Comm>,
        opts: &SaveOptions,
    ) -> Result<SaveFuture<'c>> {
        let cpath = path_cstring(path.as_ref())?;
        let (raw_opts, _base) = opts.to_raw()?;
        let mut raw = std::ptr::null_mut();
        let rc = unsafe { sys::dckpt_save_async(&mut raw, cpath.as_ptr(), self.inner.raw, comm_ptr(&comm), &raw_opts) };
        if let Err(e) = check(rc) {
            return Err(finish_collective(comm, Err::<(), _>(annotate(&opts.storage, e))).unwrap_err());
        }
        Ok(SaveFuture { raw, comm, storage: opts.storage.clone() })
    }
}

/// The outcome of [`SaveState::save_async`] (`dckpt_save_future`). `Send` and `Sync` (the C future is
/// thread-safe). Dropping it waits for the save to finish (it cannot be cancelled midway), then frees it.
pub struct SaveFuture<'c> {
    raw: *mut sys::dckpt_save_future,
    comm: Option<&'c mut Comm>,
    /// The storage the save writes to, kept alive until the save has finished (dropped after the future: see Drop).
    storage: Option<StorageHandle>,
}

unsafe impl Send for SaveFuture<'_> {}
unsafe impl Sync for SaveFuture<'_> {}

impl std::fmt::Debug for SaveFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaveFuture").field("done", &self.is_done()).finish()
    }
}

impl Drop for SaveFuture<'_> {
    fn drop(&mut self) {
        unsafe { sys::dckpt_save_future_free(self.raw) }
    }
}

impl SaveFuture<'_> {
    /// Waits until the save has finished and returns its outcome.
    pub fn wait(mut self) -> Result<SaveInfo> {
        let mut info = new_save_info();
        let rc = unsafe { sys::dckpt_save_future_wait(&mut info, self.raw, u64::MAX) }; // DCKPT_WAIT_FOREVER (UINT64_MAX; bindgen cannot expand it)
        let result = check(rc).map(|_| SaveInfo::from_raw(&info)).map_err(|e| annotate(&self.storage, e));
        finish_collective(self.comm.take(), result)
    }

    /// Waits up to `timeout`: `Ok(None)` while the save is still running, else its outcome.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<SaveInfo>> {
        let mut info = new_save_info();
        let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX - 1).min(u64::MAX - 1);
        let rc = unsafe { sys::dckpt_save_future_wait(&mut info, self.raw, ms) };
        if rc == sys::DCKPT_ETIMEOUT {
            // Still running, or finished with a timeout of its own (a rank died): tell them apart.
            let err = Error::last(rc);
            if !self.is_done() {
                return Ok(None);
            }
            return finish_collective(self.comm.as_deref_mut(), Err(annotate(&self.storage, err)));
        }
        let result = check(rc).map(|_| Some(SaveInfo::from_raw(&info))).map_err(|e| annotate(&self.storage, e));
        finish_collective(self.comm.as_deref_mut(), result)
    }

    /// Whether the save has finished, successfully or not.
    pub fn is_done(&self) -> bool {
        let mut done = 0;
        unsafe { sys::dckpt_save_future_test(&mut done, self.raw) };
        done != 0
    }

    /// Time the caller was blocked copying the state, and the bytes copied.
    pub fn staging(&self) -> (Duration, u64) {
        let (mut secs, mut bytes) = (0f64, 0u64);
        unsafe { sys::dckpt_save_future_staging(&mut secs, &mut bytes, self.raw) };
        (Duration::from_secs_f64(secs.max(0.0)), bytes)
    }
}

/// Where this rank loads to: pieces of named tensors and bytes entries, **mutably borrowed** from Rust buffers for
/// `'a`. The load reads each piece's bytes from whichever saved chunks hold them (resharding as needed).
pub struct LoadState<'a> {
    inner: RawState,
    _borrows: PhantomData<&'a mut [u8]>,
}

unsafe impl Send for LoadState<'_> {}

impl std::fmt::Debug for LoadState<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadState").field("tensors", &self.inner.tensors.len()).finish_non_exhaustive()
    }
}

impl<'a> LoadState<'a> {
    pub fn new() -> Result<LoadState<'a>> {
        Ok(LoadState { inner: RawState::new()?, _borrows: PhantomData })
    }

    /// Loads a whole tensor into `data` (the checkpoint must hold it with `T`'s dtype and this shape).
    pub fn add_tensor<T: Element>(&mut self, name: &str, shape: &[u64], data: &'a mut [T]) -> Result<&mut Self> {
        self.add_tensor_as(name, T::DTYPE, shape, data)
    }

    /// [`add_tensor`](Self::add_tensor) with an explicit dtype (raw bits of BF16, F16, float8, BOOL).
    pub fn add_tensor_as<T: Element>(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[u64],
        data: &'a mut [T],
    ) -> Result<&mut Self> {
        check_element::<T>(dtype, || format!("tensor '{name}'"))?;
        self.inner.declare(name, dtype, shape)?;
        let zeros = vec![0u64; shape.len()];
        self.add_piece(name, &zeros, shape, data)
    }

    /// Declares a tensor by its global shape (as saved); add the boxes to load with [`add_piece`](Self::add_piece).
    pub fn declare_tensor(&mut self, name: &str, dtype: Dtype, shape: &[u64]) -> Result<&mut Self> {
        self.inner.declare(name, dtype, shape)?;
        Ok(self)
    }

    /// Loads a whole tensor of any dtype into `data` as raw bytes (row-major, little-endian); `data.len()` must be
    /// its volume × dtype size.
    pub fn add_tensor_bytes(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[u64],
        data: &'a mut [u8],
    ) -> Result<&mut Self> {
        let what = || format!("tensor '{name}'");
        let need = volume(shape, what)?.checked_mul(dtype.size());
        if need != Some(data.len()) {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "tensor '{name}' ({} {shape:?}) needs {need:?} bytes; the buffer has {}",
                    dtype.name(),
                    data.len()
                ),
            ));
        }
        self.inner.declare(name, dtype, shape)?;
        let zeros = vec![0u64; shape.len()];
        let ptr = |s: &[u64]| if s.is_empty() { std::ptr::null() } else { s.as_ptr() };
        let cname = cstring(name, "entry name")?;
        check(unsafe {
            sys::dckpt_state_add_piece(
                self.inner.raw,
                cname.as_ptr(),
                ptr(&zeros),
                ptr(shape),
                data.as_mut_ptr().cast(),
            )
        })?;
        Ok(self)
    }

    /// Loads the box `[offsets, offsets + lengths)` of a declared tensor into `data`, row-major.
    pub fn add_piece<T: Element>(
        &mut self,
        name: &str,
        offsets: &[u64],
        lengths: &[u64],
        data: &'a mut [T],
    ) -> Result<&mut Self> {
        self.inner.piece(name, offsets, lengths, data.as_mut_ptr(), data.len())?;
        Ok(self)
    }

    /// Loads a bytes entry into `data` (its capacity); [`bytes_len`](Self::bytes_len) gives the stored size.
    pub fn add_bytes(&mut self, name: &str, data: &'a mut [u8]) -> Result<&mut Self> {
        self.inner.bytes(name, data.as_mut_ptr(), data.len())?;
        Ok(self)
    }

    /// After a load: the stored size of a bytes entry (may exceed the buffer given to `add_bytes`).
    pub fn bytes_len(&self, name: &str) -> Result<u64> {
        let cname = cstring(name, "entry name")?;
        let mut n = 0u64;
        check(unsafe { sys::dckpt_state_bytes_size(&mut n, self.inner.raw, cname.as_ptr()) })?;
        Ok(n)
    }

    /// Fills every piece and bytes entry from the checkpoint at `path` in this process alone.
    pub fn load(&mut self, path: impl AsRef<Path>, opts: &ReadOptions) -> Result<IoStats> {
        self.load_impl(path.as_ref(), None, opts)
    }

    /// Loads collectively over `comm` (each rank reads only the bytes its pieces need).
    pub fn load_with_comm(&mut self, path: impl AsRef<Path>, comm: &mut Comm, opts: &ReadOptions) -> Result<IoStats> {
        self.load_impl(path.as_ref(), Some(comm), opts)
    }

    /// Fills every piece and bytes entry from a checkpoint this process has open already (`dckpt_reader_load`): the
    /// metadata is not read again, and what is loaded comes from the checkpoint the reader opened (with its options).
    /// `progress` gets (done, total) bytes; return `false` to stop (a `User` error).
    pub fn load_from(&mut self, ckpt: &Checkpoint, progress: Option<ProgressFn<'_>>) -> Result<IoStats> {
        let mut stats: sys::dckpt_io_stats = unsafe { std::mem::zeroed() };
        stats.version = sys::DCKPT_IO_STATS_VERSION;
        let p = progress.map(Progress::new);
        let (cb, ud) = progress::c_pair(&p);
        let rc =
            unsafe { sys::dckpt_reader_load(&mut stats, ckpt.raw(), self.inner.raw, std::ptr::null_mut(), cb, ud) };
        progress::finish(p, check(rc).map(|_| IoStats::from_raw(&stats)).map_err(|e| ckpt.storage_error(e)))
    }

    fn load_impl(&mut self, path: &Path, comm: Option<&mut Comm>, opts: &ReadOptions) -> Result<IoStats> {
        let cpath = path_cstring(path)?;
        let raw_opts = opts.to_raw()?;
        let mut stats: sys::dckpt_io_stats = unsafe { std::mem::zeroed() };
        stats.version = sys::DCKPT_IO_STATS_VERSION;
        let rc = unsafe { sys::dckpt_load(&mut stats, cpath.as_ptr(), self.inner.raw, comm_ptr(&comm), &raw_opts) };
        finish_collective(comm, check(rc).map(|_| IoStats::from_raw(&stats)).map_err(|e| annotate(&opts.storage, e)))
    }
}
