//! Whole-checkpoint loads, for inference servers that load every weight before they serve: zero-copy
//! ([`Checkpoint::map_all`], then views) or into memory ([`Checkpoint::read_all`], [`Checkpoint::read_all_into`]).
//! Both spread reading and verification over the reader's I/O threads, one sequential stream of the data files each,
//! so that checksums are checked while the next bytes come in from storage.

use std::alloc::{alloc, dealloc, Layout};

use distckpt_sys as sys;

use crate::checkpoint::{Checkpoint, IoStats};
use crate::dtype::{check_element, Dtype, Element};
use crate::error::{check, Error, ErrorCode, Result};
use crate::progress::{self, Progress, ProgressFn};
use crate::state::LoadState;

/// Page alignment of [`LoadedTensor`] buffers: any element type can be viewed in place, and the bytes can be handed
/// to APIs that want aligned memory (O_DIRECT, device registration).
const ALIGN: usize = 4096;

/// Memory the library allocated for one tensor of [`Checkpoint::read_all`]: page-aligned, exactly the tensor's bytes.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Uninitialised: only handed to the library, which fills every byte or fails (and then the buffer is dropped).
    fn uninit(len: usize) -> Result<AlignedBuf> {
        if len == 0 {
            return Ok(AlignedBuf { ptr: ALIGN as *mut u8, len });
        }
        let layout = Layout::from_size_align(len, ALIGN)
            .map_err(|_| Error::new(ErrorCode::InvalidArgument, format!("a buffer of {len} bytes is too large")))?;
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            return Err(Error::new(ErrorCode::NoMemory, format!("cannot allocate {len} bytes")));
        }
        Ok(AlignedBuf { ptr, len })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            unsafe { dealloc(self.ptr, Layout::from_size_align_unchecked(self.len, ALIGN)) }
        }
    }
}

/// A tensor loaded by [`Checkpoint::read_all`]: its name, dtype, shape and bytes (page-aligned, verified).
pub struct LoadedTensor {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    buf: AlignedBuf,
}

impl std::fmt::Debug for LoadedTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedTensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

impl LoadedTensor {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }
    /// The tensor's bytes, row-major, little-endian.
    pub fn as_bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.buf.ptr, self.buf.len) }
    }
    /// The elements, with `T` holding the dtype as for [`Checkpoint::read`].
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        check_element::<T>(self.dtype, || format!("tensor '{}'", self.name))?;
        // Page-aligned, and the length is a whole number of elements (volume × dtype size).
        Ok(unsafe { std::slice::from_raw_parts(self.buf.ptr.cast(), self.buf.len / std::mem::size_of::<T>()) })
    }
}

impl Checkpoint {
    /// Loads every entry for zero-copy use (`dckpt_reader_map_all`): each chunk is read into the page cache, mapped,
    /// and its checksums checked in place (unless the checkpoint was opened with `verify: false`), spread over the
    /// reader's I/O threads. Afterwards [`view`](Self::view), [`chunk_views`](Self::chunk_views) and the other views
    /// return verified bytes that are already resident: touching them costs no I/O and no page fault. Nothing is
    /// copied; the process's resident set grows by the checkpoint's size (the pages are shared with the page cache).
    ///
    /// A compressed checkpoint ([`CheckpointInfo::compressed_chunks`](crate::CheckpointInfo::compressed_chunks) > 0,
    /// saved with [`SaveOptions::compression`](crate::SaveOptions::compression)) is loaded for views too: its
    /// compressed chunks have no bytes to map, so the library reads, decodes and verifies them (as the reader
    /// verifies) in the same pass into memory it keeps until the `Checkpoint` drops, which is what their views then
    /// return, with no further I/O. Those copies add their decoded size to the resident set.
    ///
    /// A checkpoint another library wrote (safetensors, DCP) is paged in and mapped the same way, but has no
    /// checksums to check ([`Checkpoint::checksummed`]); its typed views need their bytes aligned for their type
    /// ([`Checkpoint::view_or_read`] copies where they are not).
    ///
    /// `Unsupported` where nothing can be mapped (`map_files: false`, a storage without mappings): use
    /// [`read_all`](Self::read_all) there. A damaged block is a `Corrupt` error naming the entry, chunk, file and
    /// byte range; an I/O error while paging in is an `Io` error naming the file, never SIGBUS.
    pub fn map_all(&self) -> Result<()> {
        self.map_entries(None, None)
    }

    /// [`map_all`](Self::map_all) for the named entries only (`None`: all), reporting (done, total) bytes to
    /// `progress`; return `false` from it to stop (a `User` error).
    pub fn map_entries(&self, names: Option<&[&str]>, progress: Option<ProgressFn<'_>>) -> Result<()> {
        let indices: Vec<usize> = match names {
            None => Vec::new(),
            Some(names) => names.iter().map(|n| self.entry(n).map(|e| e.index())).collect::<Result<_>>()?,
        };
        if names.is_some() && indices.is_empty() {
            return Ok(());
        }
        self.map_in_library(&indices, progress)
    }

    /// `dckpt_reader_map_all` of the entries `indices` (empty: every entry).
    fn map_in_library(&self, indices: &[usize], progress: Option<ProgressFn<'_>>) -> Result<()> {
        let mut opts: sys::dckpt_map_all_options = unsafe { std::mem::zeroed() };
        opts.version = sys::DCKPT_MAP_ALL_OPTIONS_VERSION;
        opts.entries = if indices.is_empty() { std::ptr::null() } else { indices.as_ptr() };
        opts.num_entries = indices.len();
        let p = progress.map(Progress::new);
        (opts.progress, opts.progress_user_data) = progress::c_pair(&p);
        let rc = check(unsafe { sys::dckpt_reader_map_all(self.raw(), &opts) }).map_err(|e| self.storage_error(e));
        progress::finish(p, rc)
    }

    /// Reads every tensor into memory the library allocates (page-aligned, one buffer per tensor), verified, in one
    /// parallel pass over the data files: the path for storage that cannot be mapped, or for a server that wants
    /// private copies. Bytes entries are left out (read them with [`read_bytes`](Self::read_bytes)).
    pub fn read_all(&self, progress: Option<ProgressFn<'_>>) -> Result<Vec<LoadedTensor>> {
        let mut out = Vec::new();
        for e in self.entries() {
            if !e.is_tensor() {
                continue;
            }
            let len = usize::try_from(e.nbytes()).map_err(|_| {
                Error::new(ErrorCode::InvalidArgument, format!("{} is too large", self.describe(e.name())))
            })?;
            out.push(LoadedTensor {
                name: e.name().to_string(),
                dtype: e.dtype(),
                shape: e.shape().to_vec(),
                buf: AlignedBuf::uninit(len)?,
            });
        }
        let mut state = LoadState::new()?;
        for t in &out {
            // Sound: the buffers outlive the state, which is dropped at the end of this function.
            let bytes = unsafe { std::slice::from_raw_parts_mut(t.buf.ptr, t.buf.len) };
            state.add_tensor_bytes(&t.name, t.dtype, &t.shape, bytes)?;
        }
        state.load_from(self, progress)?;
        Ok(out)
    }

    /// Reads whole tensors into the caller's buffers, `(name, bytes)` each (`bytes.len()` must be the tensor's size),
    /// in one parallel, verified pass (`dckpt_reader_load`). Returns the reader's I/O counters.
    pub fn read_all_into(
        &self,
        targets: &mut [(&str, &mut [u8])],
        progress: Option<ProgressFn<'_>>,
    ) -> Result<IoStats> {
        let mut state = LoadState::new()?;
        for (name, bytes) in targets.iter_mut() {
            let e = self.entry(name)?;
            if !e.is_tensor() {
                return Err(Error::new(
                    ErrorCode::InvalidArgument,
                    format!("{} is a bytes entry", self.describe(name)),
                ));
            }
            state.add_tensor_bytes(name, e.dtype(), e.shape(), bytes)?;
        }
        state.load_from(self, progress)
    }
}
