//! Reading a checkpoint: `Checkpoint` (a `dckpt_reader`), its entries and chunks, typed reads and region reads.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distckpt_sys as sys;

use crate::comm::Comm;
use crate::copied::CopiedChunk;
use crate::dtype::{check_element, Dtype, Element};
use crate::error::{check, Error, ErrorCode, Result};
use crate::float;
use crate::progress::Progress;
use crate::storage::{self, StorageHandle};
use crate::util::{borrowed_str, cstring, path_cstring, timeout_ms, volume};
use crate::version::check_abi;

/// Options for [`Checkpoint::open_with`] and [`crate::LoadState::load`] (`dckpt_read_options`).
#[derive(Clone, Debug)]
pub struct ReadOptions {
    /// Check the checksum of every byte read (default true). Views never read through the library; see
    /// [`Checkpoint::view_verified`].
    pub verify: bool,
    /// I/O threads; 0 means the library's default.
    pub io_threads: u32,
    /// Collective timeout; `None` means the library's default (10 minutes).
    pub timeout: Option<Duration>,
    /// Read data already in the page cache through a mapping of the file, and view tensors in place (default true). A
    /// mapped file truncated in place by another process raises SIGBUS. Off: nothing is mapped, so nothing can raise
    /// SIGBUS; reads use pread and [`Checkpoint::view`] returns a verified copy kept by the `Checkpoint`.
    pub map_files: bool,
    /// In a collective load, ranks on one host hash each shared checksum block once (default true).
    pub share_verification: bool,
    /// Reads into device memory ([`Checkpoint::read_region_into_device`]) go through a process-wide pool of
    /// `staging_buffers` pinned buffers of `staging_buffer_bytes` (0: the library's defaults, 4 of 16 MiB).
    pub staging_buffer_bytes: u64,
    pub staging_buffers: u32,
    /// Where the checkpoint is read from; `None`: the POSIX file system. A [`Checkpoint`] keeps a clone of the
    /// handle until it is dropped.
    pub storage: Option<StorageHandle>,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            verify: true,
            io_threads: 0,
            timeout: None,
            map_files: true,
            share_verification: true,
            staging_buffer_bytes: 0,
            staging_buffers: 0,
            storage: None,
        }
    }
}

impl ReadOptions {
    pub(crate) fn to_raw(&self) -> Result<sys::dckpt_read_options> {
        let mut raw: sys::dckpt_read_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::dckpt_read_options_init(&mut raw, sys::DCKPT_READ_OPTIONS_VERSION) })?;
        raw.verify = self.verify as i32;
        raw.io_threads = self.io_threads;
        raw.timeout_ms = timeout_ms(self.timeout);
        raw.map_files = self.map_files as i32;
        raw.share_verification = self.share_verification as i32;
        raw.staging_buffer_bytes = self.staging_buffer_bytes;
        raw.staging_buffers = self.staging_buffers;
        raw.storage = storage::raw_or_null(&self.storage);
        Ok(raw)
    }

    /// These options, reading from `storage`.
    pub fn with_storage(mut self, storage: &StorageHandle) -> ReadOptions {
        self.storage = Some(storage.clone());
        self
    }
}

/// A CUDA device buffer, given as a raw device pointer (a `CUdeviceptr` from the driver API, `cudaMalloc`, cudarc, a
/// framework's allocator), for [`Checkpoint::read_region_into_device`]. distckpt loads the CUDA driver
/// (`libcuda.so.1`) on first use; without it the read fails with [`ErrorCode::Unsupported`].
#[derive(Clone, Copy, Debug)]
pub struct DeviceBuffer {
    /// The device address of the first byte.
    pub ptr: u64,
    /// Bytes available at `ptr`: must equal the region's size.
    pub len: u64,
    /// The CUDA device ordinal the memory belongs to, or [`DeviceBuffer::DEVICE_OF_POINTER`].
    pub device: i32,
    /// The `CUstream` / `cudaStream_t` whose queued work the copies must follow (null: the legacy default stream;
    /// [`DeviceBuffer::stream_ready`]: no stream). The copies have completed when the read returns, so the data is
    /// ready for any stream.
    pub stream: *mut c_void,
}

impl DeviceBuffer {
    /// A `device` asking the driver which device `ptr` is on (the C ABI's `DCKPT_DEVICE_OF_POINTER`).
    pub const DEVICE_OF_POINTER: i32 = sys::DCKPT_DEVICE_OF_POINTER;

    /// A `stream` that waits for nothing (the C ABI's `DCKPT_STREAM_READY`): the destination has no pending work.
    pub fn stream_ready() -> *mut c_void {
        usize::MAX as *mut c_void
    }
}

/// Whether an entry is a tensor or an opaque blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryKind {
    Tensor,
    Bytes,
}

/// One entry of a checkpoint: name, dtype, global shape and size. Borrowed from its [`Checkpoint`].
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    index: usize,
    name: &'a str,
    kind: EntryKind,
    dtype: Dtype,
    shape: &'a [u64],
    nbytes: u64,
    num_chunks: usize,
}

impl<'a> Entry<'a> {
    /// Position in the checkpoint (entries are sorted by name).
    pub fn index(&self) -> usize {
        self.index
    }
    pub fn name(&self) -> &'a str {
        self.name
    }
    pub fn kind(&self) -> EntryKind {
        self.kind
    }
    pub fn is_tensor(&self) -> bool {
        self.kind == EntryKind::Tensor
    }
    /// The element type (`U8` for a bytes entry).
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
    /// The global shape; empty for a scalar. A bytes entry has shape `[size]`.
    pub fn shape(&self) -> &'a [u64] {
        self.shape
    }
    /// Size of the whole entry in bytes.
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }
    /// Chunks the entry is stored as (a tensor saved from one piece has one).
    pub fn num_chunks(&self) -> usize {
        self.num_chunks
    }
}

/// Where one chunk of an entry lives: its box in the tensor and its byte range in a data file.
#[derive(Clone, Copy, Debug)]
pub struct ChunkInfo<'a> {
    pub offsets: &'a [u64],
    pub lengths: &'a [u64],
    /// Data file name inside the checkpoint directory.
    pub file: &'a str,
    /// A multiple of the format's alignment (at least 4 KiB) in a distckpt checkpoint; any offset in a foreign one
    /// (where the other library put the tensor).
    pub file_offset: u64,
    pub length: u64,
    /// XXH3-64 checksum, as FORMAT.md section 5 defines it; 0 in a foreign checkpoint, which has none.
    pub checksum: u64,
    /// `""` when `file` is the checkpoint's own; else the base checkpoint ([`CheckpointInfo::bases`]) it lies in.
    pub base: &'a str,
    /// How the chunk is stored: [`Compression::None`] (raw: its `length` bytes lie in `file` as the tensor has them),
    /// or compressed ([`Compression::Zstd`]), when its bytes exist only decoded: reads decode it, and a view of it is
    /// a decoded copy, not a mapping (the view module says more). `None` from a library older than compression.
    pub codec: Compression,
    /// Bytes the chunk takes in `file` from `file_offset`: `length` when stored raw, less when compressed.
    pub stored_length: u64,
}

/// How chunks are stored (`dckpt_compression`): what [`SaveOptions::compression`](crate::SaveOptions::compression)
/// asks a save for, and what [`ChunkInfo::codec`] says of each chunk. The values are the C ABI's, never renumbered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Compression {
    /// Raw: every chunk's bytes lie in its data file as the tensor has them, so views map them in place.
    #[default]
    None,
    /// zstd, per checksum block, the bytes of its elements grouped by position first (2-, 4- and 8-byte dtypes: the
    /// exponent bytes of floats together). A block that does not shrink is stored raw, and a chunk none of whose
    /// blocks shrink is a raw chunk; device pieces are written raw. The checkpoint is format 3.0, which releases
    /// before compression refuse (`Version`). Reads decode in the read threads, checking the stored bytes and the
    /// decoded ones; a compressed chunk cannot be mapped (its bytes exist only decoded).
    Zstd,
    /// A codec newer than this crate (the raw value). As a save option, the library judges it.
    Unknown(i32),
}

impl Compression {
    /// The value of a C `dckpt_compression`.
    pub fn from_raw(v: i32) -> Compression {
        match v {
            v if v == sys::DCKPT_COMPRESSION_NONE as i32 => Compression::None,
            v if v == sys::DCKPT_COMPRESSION_ZSTD as i32 => Compression::Zstd,
            other => Compression::Unknown(other),
        }
    }

    /// The C value (`DCKPT_COMPRESSION_*`).
    pub fn raw(self) -> i32 {
        match self {
            Compression::None => sys::DCKPT_COMPRESSION_NONE as i32,
            Compression::Zstd => sys::DCKPT_COMPRESSION_ZSTD as i32,
            Compression::Unknown(v) => v,
        }
    }

    /// Whether a chunk stored so is compressed (anything but [`Compression::None`]).
    pub fn is_compressed(self) -> bool {
        self != Compression::None
    }
}

/// "none", "zstd" (Python's `codec` strings), or "codec N" for one newer than this crate.
impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Zstd => f.write_str("zstd"),
            Compression::Unknown(v) => write!(f, "codec {v}"),
        }
    }
}

/// What wrote a checkpoint: distckpt, or another library whose files the core reads in place, with no conversion
/// (FORMAT.md section 2.4): `dckpt_checkpoint_info.source`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Format {
    /// A distckpt checkpoint (`metadata.dckpt`): every chunk carries checksums.
    Distckpt,
    /// Hugging Face safetensors: a hub directory (an index and its shards, or `.safetensors` files), one
    /// `.safetensors` file, or a `*.safetensors.index.json` path. No checksums.
    Safetensors,
    /// A PyTorch Distributed Checkpoint (DCP) directory. No checksums.
    TorchDcp,
    /// A format of a library newer than this crate, by the name the library gives it.
    Other(String),
}

impl Format {
    /// The format of a `source` string of the C ABI ("" for distckpt).
    pub fn from_source(source: &str) -> Format {
        match source {
            "" | "distckpt" => Format::Distckpt,
            "safetensors" => Format::Safetensors,
            "torch-dcp" => Format::TorchDcp,
            other => Format::Other(other.to_string()),
        }
    }

    /// "distckpt", "safetensors", "torch-dcp" (Python's `metadata.format`, the Go CLI's `format`), or the other name.
    pub fn as_str(&self) -> &str {
        match self {
            Format::Distckpt => "distckpt",
            Format::Safetensors => "safetensors",
            Format::TorchDcp => "torch-dcp",
            Format::Other(name) => name,
        }
    }

    /// Whether another library wrote it (anything but [`Format::Distckpt`]): read in place, without checksums.
    pub fn is_foreign(&self) -> bool {
        *self != Format::Distckpt
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Summary of a checkpoint (`dckpt_checkpoint_info`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointInfo {
    pub format_major: u32,
    pub format_minor: u32,
    /// The writing software, e.g. "distckpt 0.1.0".
    pub writer: String,
    pub num_entries: usize,
    pub num_files: usize,
    /// Data bytes.
    pub total_bytes: u64,
    pub metadata_bytes: u64,
    pub checksum_block_size: u64,
    /// Who wrote it: distckpt, or a library whose checkpoint the core reads in place.
    pub format: Format,
    /// Whether its chunks carry checksums: true for distckpt; false for a foreign checkpoint, whose bytes cannot be
    /// verified ([`Checkpoint::verify`] is then `Unsupported`, and reads are not checked).
    pub checksummed: bool,
    /// The version a foreign format records of itself, as it records it (`Some("1.0.0")` for a DCP `.metadata` that
    /// has one); `None` for safetensors (which records none), an older DCP checkpoint, and a distckpt checkpoint,
    /// whose format version is `format_major.format_minor` (those of a foreign checkpoint describe the library's
    /// in-memory description of it, not the foreign format).
    pub source_version: Option<String>,
    /// An incremental checkpoint's bases: the checkpoints beside it (same directory or prefix) whose data files it
    /// reads; empty for a self-contained checkpoint. Removing one of them breaks this checkpoint.
    pub bases: Vec<String>,
    /// Saves since the last self-contained checkpoint of its chain (0: it reads no base).
    pub chain_length: u32,
    /// Of `total_bytes`, those that lie in its bases' data files.
    pub bytes_in_bases: u64,
    /// What the chunks take in data files (its own and its bases'): `total_bytes` less what compression saved
    /// ([`SaveOptions::compression`](crate::SaveOptions::compression)); `total_bytes` without compression.
    pub stored_bytes: u64,
    /// Chunks stored compressed ([`ChunkInfo::codec`]); 0 without compression. Views of them are decoded copies.
    pub compressed_chunks: usize,
}

/// I/O counters (`dckpt_io_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IoStats {
    pub bytes_read: u64,
    pub read_calls: u64,
    pub bytes_verified: u64,
    pub bytes_delivered: u64,
    /// For a load: wall time of the call.
    pub seconds: f64,
    /// Bytes delivered straight from the page cache through a mapping (not counted in `bytes_read`).
    pub bytes_mapped: u64,
    /// Of `bytes_read`, those read past the page cache (O_DIRECT) into the pinned staging buffers of device reads.
    pub bytes_read_direct: u64,
}

impl IoStats {
    pub(crate) fn from_raw(s: &sys::dckpt_io_stats) -> IoStats {
        IoStats {
            bytes_read: s.bytes_read,
            read_calls: s.read_calls,
            bytes_verified: s.bytes_verified,
            bytes_delivered: s.bytes_delivered,
            seconds: s.seconds,
            bytes_mapped: s.bytes_mapped,
            bytes_read_direct: s.bytes_read_direct,
        }
    }
}

/// An open, committed checkpoint. Its metadata was verified and validated when it was opened.
///
/// `Send` and `Sync`: the C reader is thread-safe (capi/API.md), so any number of threads may read, view and verify
/// through one `Checkpoint` at once. Dropping it frees the reader and unmaps the data files, which the borrow
/// checker keeps from racing with any of that.
///
/// The reader pins the checkpoint's data files when it opens (descriptors opened relative to the checkpoint directory,
/// never through a link): an overwrite or a removal of the path afterwards does not change what it reads or views.
pub struct Checkpoint {
    raw: *mut sys::dckpt_reader,
    path: PathBuf,
    /// Views' copies of the raw chunks the reader does not map (with `map_files: false`; compressed ones are the
    /// library's decoded copies), by entry and chunk index, kept until drop: views borrow from them, so entries are
    /// never removed.
    pub(crate) copies: Mutex<HashMap<(usize, usize), Arc<CopiedChunk>>>,
    /// The storage it reads from, kept alive while the reader may call it (dropped after the reader: see Drop).
    storage: Option<StorageHandle>,
}

unsafe impl Send for Checkpoint {}
unsafe impl Sync for Checkpoint {}

impl Drop for Checkpoint {
    fn drop(&mut self) {
        unsafe { sys::dckpt_reader_free(self.raw) }
    }
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint").field("path", &self.path).field("entries", &self.len()).finish()
    }
}

impl Checkpoint {
    /// Opens the committed checkpoint at `path` (single process, default options: checksums verified on read).
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        Checkpoint::open_with(path, None, &ReadOptions::default())
    }

    /// Opens a checkpoint. With a communicator the call is collective: rank 0 reads the metadata and broadcasts it.
    pub fn open_with(path: impl AsRef<Path>, comm: Option<&mut Comm>, opts: &ReadOptions) -> Result<Checkpoint> {
        check_abi()?;
        let path = path.as_ref().to_path_buf();
        let cpath = path_cstring(&path)?;
        let raw_opts = opts.to_raw()?;
        let mut raw = std::ptr::null_mut();
        let comm_ptr = comm.as_ref().map_or(std::ptr::null_mut(), |c| c.raw);
        let rc = unsafe { sys::dckpt_reader_open(&mut raw, cpath.as_ptr(), comm_ptr, &raw_opts) };
        let result = check(rc).map_err(|e| storage::annotate(&opts.storage, e));
        if let Some(c) = comm {
            c.after_call(result)?;
        } else {
            result?;
        }
        Ok(Checkpoint { raw, path, copies: Mutex::new(HashMap::new()), storage: opts.storage.clone() })
    }

    /// The path it was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn raw(&self) -> *mut sys::dckpt_reader {
        self.raw
    }

    pub fn info(&self) -> CheckpointInfo {
        let mut raw: sys::dckpt_checkpoint_info = unsafe { std::mem::zeroed() };
        raw.version = sys::DCKPT_CHECKPOINT_INFO_VERSION;
        let mut rc = unsafe { sys::dckpt_reader_info(&mut raw, self.raw) };
        let mut older = sys::DCKPT_CHECKPOINT_INFO_VERSION - 1;
        while rc == sys::DCKPT_EVERSION && older >= 1 {
            // A libdistckpt.so (feature `shared`) from before this version of the struct: version 4 has no
            // `stored_bytes` (read as `total_bytes`) or `compressed_chunks` (0), version 3 no bases, version 2 no
            // `source_version` (read as None), and version 1, from a library that reads distckpt checkpoints only,
            // leaves `source` NULL, read below as distckpt, checksummed.
            raw = unsafe { std::mem::zeroed() };
            raw.version = older;
            rc = unsafe { sys::dckpt_reader_info(&mut raw, self.raw) };
            older -= 1;
        }
        // Cannot fail otherwise on a valid reader.
        check(rc).expect("dckpt_reader_info");
        let (format, checksummed) = if raw.source.is_null() {
            (Format::Distckpt, true)
        } else {
            (Format::from_source(unsafe { borrowed_str(raw.source) }), raw.checksummed != 0)
        };
        CheckpointInfo {
            format_major: raw.format_major,
            format_minor: raw.format_minor,
            writer: unsafe { borrowed_str(raw.writer) }.to_string(),
            num_entries: raw.num_entries,
            num_files: raw.num_files,
            total_bytes: raw.total_bytes,
            metadata_bytes: raw.metadata_bytes,
            checksum_block_size: raw.checksum_block_size,
            format,
            checksummed,
            source_version: if raw.version >= 3 && !raw.source_version.is_null() {
                Some(unsafe { borrowed_str(raw.source_version) }.to_string()).filter(|v| !v.is_empty())
            } else {
                None
            },
            bases: if raw.version >= 4 { self.bases(raw.num_bases) } else { Vec::new() },
            chain_length: if raw.version >= 4 { raw.chain_length } else { 0 },
            bytes_in_bases: if raw.version >= 4 { raw.bytes_in_bases } else { 0 },
            stored_bytes: if raw.version >= 5 { raw.stored_bytes } else { raw.total_bytes },
            compressed_chunks: if raw.version >= 5 { raw.compressed_chunks } else { 0 },
        }
    }

    /// The names of the `n` bases (`dckpt_reader_base`).
    fn bases(&self, n: usize) -> Vec<String> {
        (0..n)
            .map(|k| {
                let mut name: *const std::os::raw::c_char = std::ptr::null();
                // Cannot fail for k < num_bases on a valid reader.
                check(unsafe { sys::dckpt_reader_base(&mut name, self.raw, k) }).expect("dckpt_reader_base");
                unsafe { borrowed_str(name) }.to_string()
            })
            .collect()
    }

    /// Who wrote the checkpoint: [`Format::Distckpt`], or the format of a checkpoint another library wrote that the
    /// core reads in place (a safetensors file or hub directory, a PyTorch DCP directory). Every read path (typed and
    /// region reads, resharded loads, [`map_all`](Self::map_all) and views) works on either.
    pub fn format(&self) -> Format {
        self.info().format
    }

    /// Whether the checkpoint's chunks carry checksums (distckpt's do). A foreign checkpoint's do not: nothing read
    /// from it is verified, [`verify`](Self::verify), [`verify_chunk`](Self::verify_chunk) and
    /// [`view_verified`](Self::view_verified) are `Unsupported` saying so, and its [`ChunkInfo::checksum`]s are 0.
    pub fn checksummed(&self) -> bool {
        self.info().checksummed
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.info().num_entries
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The entries, sorted by name.
    pub fn entries(&self) -> Entries<'_> {
        Entries { ckpt: self, next: 0, end: self.len() }
    }

    /// The entry at `index` (0..len()).
    pub fn entry_at(&self, index: usize) -> Result<Entry<'_>> {
        let mut info: sys::dckpt_entry_info = unsafe { std::mem::zeroed() };
        info.version = sys::DCKPT_ENTRY_INFO_VERSION;
        check(unsafe { sys::dckpt_reader_entry(&mut info, self.raw, index) })?;
        let shape = if info.ndim == 0 || info.shape.is_null() {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(info.shape, info.ndim) }
        };
        Ok(Entry {
            index,
            name: unsafe { borrowed_str(info.name) },
            kind: if info.kind == sys::DCKPT_ENTRY_BYTES as i32 { EntryKind::Bytes } else { EntryKind::Tensor },
            dtype: Dtype::from_raw(info.dtype),
            shape,
            nbytes: info.nbytes,
            num_chunks: info.num_chunks,
        })
    }

    /// The entry called `name` (binary search); `NotFound` if there is none.
    pub fn entry(&self, name: &str) -> Result<Entry<'_>> {
        let cname = cstring(name, "entry name")?;
        let mut index = 0usize;
        // The library's message names the checkpoint and the entry.
        check(unsafe { sys::dckpt_reader_find(&mut index, self.raw, cname.as_ptr()) })?;
        self.entry_at(index)
    }

    /// Whether the checkpoint has an entry called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.entry(name).is_ok()
    }

    /// Chunk `chunk` of `entry` (0..entry.num_chunks()).
    pub fn chunk(&self, entry: &Entry<'_>, chunk: usize) -> Result<ChunkInfo<'_>> {
        let mut info: sys::dckpt_chunk_info = unsafe { std::mem::zeroed() };
        info.version = sys::DCKPT_CHUNK_INFO_VERSION;
        let mut rc = unsafe { sys::dckpt_reader_chunk(&mut info, self.raw, entry.index, chunk) };
        let mut older = sys::DCKPT_CHUNK_INFO_VERSION - 1;
        while rc == sys::DCKPT_EVERSION && older >= 1 {
            // A libdistckpt.so from before this version of the struct: version 2 has no `codec` or `stored_length`
            // (read as raw, `length`), version 1 no `base`.
            info = unsafe { std::mem::zeroed() };
            info.version = older;
            rc = unsafe { sys::dckpt_reader_chunk(&mut info, self.raw, entry.index, chunk) };
            older -= 1;
        }
        check(rc)?;
        let dims = |p: *const u64| {
            if info.ndim == 0 || p.is_null() {
                &[][..]
            } else {
                unsafe { std::slice::from_raw_parts(p, info.ndim) }
            }
        };
        Ok(ChunkInfo {
            offsets: dims(info.offsets),
            lengths: dims(info.lengths),
            file: unsafe { borrowed_str(info.file) },
            file_offset: info.file_offset,
            length: info.length,
            checksum: info.checksum,
            base: if info.version >= 2 && !info.base.is_null() { unsafe { borrowed_str(info.base) } } else { "" },
            codec: if info.version >= 3 { Compression::from_raw(info.codec) } else { Compression::None },
            stored_length: if info.version >= 3 { info.stored_length } else { info.length },
        })
    }

    pub(crate) fn describe(&self, name: &str) -> String {
        format!("entry '{name}' of checkpoint '{}'", self.path.display())
    }

    fn tensor(&self, name: &str) -> Result<Entry<'_>> {
        let e = self.entry(name)?;
        if e.kind != EntryKind::Tensor {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("{} is a bytes entry, not a tensor: use read_bytes()", self.describe(name)),
            ));
        }
        Ok(e)
    }

    /// Reads the box `[offsets, offsets + lengths)` of a tensor into `dst`: raw little-endian bytes, row-major.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `dst_size` bytes.
    unsafe fn read_box_raw(
        &self,
        e: &Entry<'_>,
        offsets: &[u64],
        lengths: &[u64],
        dst: *mut c_void,
        dst_size: u64,
    ) -> Result<()> {
        self.read_box_in(e, offsets, lengths, dst, dst_size, std::ptr::null())
    }

    /// [`read_box_raw`](Self::read_box_raw) into the memory `opts` describes (null: host memory).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `dst_size` bytes in that memory; `opts` null or valid.
    unsafe fn read_box_in(
        &self,
        e: &Entry<'_>,
        offsets: &[u64],
        lengths: &[u64],
        dst: *mut c_void,
        dst_size: u64,
        opts: *const sys::dckpt_piece_options,
    ) -> Result<()> {
        let cname = cstring(e.name, "entry name")?;
        let ptr = |s: &[u64]| if s.is_empty() { std::ptr::null() } else { s.as_ptr() };
        check(sys::dckpt_reader_read_ex(
            self.raw,
            cname.as_ptr(),
            offsets.len(),
            ptr(offsets),
            ptr(lengths),
            dst,
            dst_size,
            opts,
        ))
        .map_err(|e| self.storage_error(e))
    }

    /// `InvalidArgument` unless `offsets` and `lengths` have one value per dimension of `e`.
    fn check_box_rank(&self, e: &Entry<'_>, offsets: &[u64], lengths: &[u64]) -> Result<()> {
        if offsets.len() == e.shape.len() && lengths.len() == e.shape.len() {
            return Ok(());
        }
        Err(Error::new(
            ErrorCode::InvalidArgument,
            format!(
                "{} has {} dimensions; got {} offsets and {} lengths",
                self.describe(e.name),
                e.shape.len(),
                offsets.len(),
                lengths.len()
            ),
        ))
    }

    /// Reads a whole tensor. `T` must hold its dtype (`f32` for F32, `u16` for F16/BF16 bits, `u8` for BOOL and
    /// float8 bits; see [`Element`]). Checksums are verified unless the checkpoint was opened with `verify: false`.
    pub fn read<T: Element>(&self, name: &str) -> Result<Vec<T>> {
        let e = self.tensor(name)?;
        check_element::<T>(e.dtype, || self.describe(name))?;
        let n = volume(e.shape, || self.describe(name))?;
        let mut v: Vec<T> = Vec::with_capacity(n);
        let zeros = [0u64; sys::DCKPT_MAX_DIMS as usize];
        let bytes = (n * std::mem::size_of::<T>()) as u64;
        // The library writes exactly `bytes` bytes (the whole tensor) or fails.
        unsafe {
            self.read_box_raw(&e, &zeros[..e.shape.len()], e.shape, v.as_mut_ptr().cast(), bytes)?;
            v.set_len(n);
        }
        Ok(v)
    }

    /// Reads the box `[offsets, offsets + lengths)` of a tensor into `dst` (row-major), reading only the bytes
    /// it needs from whichever chunks hold them. `dst.len()` must be the box's volume.
    pub fn read_region_into<T: Element>(
        &self,
        name: &str,
        offsets: &[u64],
        lengths: &[u64],
        dst: &mut [T],
    ) -> Result<()> {
        let e = self.tensor(name)?;
        check_element::<T>(e.dtype, || self.describe(name))?;
        self.check_box_rank(&e, offsets, lengths)?;
        let n = volume(lengths, || self.describe(name))?;
        if dst.len() != n {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("{}: the box {lengths:?} holds {n} elements but dst holds {}", self.describe(name), dst.len()),
            ));
        }
        unsafe { self.read_box_raw(&e, offsets, lengths, dst.as_mut_ptr().cast(), std::mem::size_of_val(dst) as u64) }
    }

    /// Reads the box `[offsets, offsets + lengths)` of a tensor straight into device memory: the needed bytes are read
    /// into pinned staging buffers, verified on the host (unless opened with `verify: false`), and copied to the
    /// device (strided copies where the box's rows are apart in the chunk), overlapped with the next reads. Nothing
    /// goes through a host copy of the tensor. `dst.len` must be the box's size in bytes.
    ///
    /// # Safety
    /// `dst.ptr` must be CUDA device memory of `dst.device`, valid for writes of `dst.len` bytes until the call
    /// returns, and `dst.stream` a live stream of that device (or null).
    pub unsafe fn read_region_into_device(
        &self,
        name: &str,
        offsets: &[u64],
        lengths: &[u64],
        dst: DeviceBuffer,
    ) -> Result<()> {
        let e = self.tensor(name)?;
        self.check_box_rank(&e, offsets, lengths)?;
        let mut opts: sys::dckpt_piece_options = std::mem::zeroed();
        check(sys::dckpt_piece_options_init(&mut opts, sys::DCKPT_PIECE_OPTIONS_VERSION))?;
        opts.memory = sys::DCKPT_MEMORY_CUDA as i32;
        opts.device = dst.device;
        opts.stream = dst.stream;
        self.read_box_in(&e, offsets, lengths, dst.ptr as usize as *mut c_void, dst.len, &opts)
    }

    /// A whole tensor into device memory; see [`read_region_into_device`](Self::read_region_into_device).
    ///
    /// # Safety
    /// As for [`read_region_into_device`](Self::read_region_into_device).
    pub unsafe fn read_into_device(&self, name: &str, dst: DeviceBuffer) -> Result<()> {
        let e = self.tensor(name)?;
        let zeros = [0u64; sys::DCKPT_MAX_DIMS as usize];
        self.read_region_into_device(name, &zeros[..e.shape.len()], e.shape, dst)
    }

    /// [`read_region_into`](Self::read_region_into) into a new vector.
    pub fn read_region<T: Element>(&self, name: &str, offsets: &[u64], lengths: &[u64]) -> Result<Vec<T>> {
        let n = volume(lengths, || self.describe(name))?;
        let mut v = vec![unsafe { std::mem::zeroed::<T>() }; n]; // every Element is valid when zeroed
        self.read_region_into(name, offsets, lengths, &mut v)?;
        Ok(v)
    }

    /// Reads a tensor of any dtype as its raw little-endian bytes.
    pub fn read_raw(&self, name: &str) -> Result<Vec<u8>> {
        let e = self.tensor(name)?;
        let n = usize::try_from(e.nbytes).map_err(|_| Error::new(ErrorCode::NoMemory, self.describe(name)))?;
        let mut v: Vec<u8> = Vec::with_capacity(n);
        let zeros = [0u64; sys::DCKPT_MAX_DIMS as usize];
        unsafe {
            self.read_box_raw(&e, &zeros[..e.shape.len()], e.shape, v.as_mut_ptr().cast(), n as u64)?;
            v.set_len(n);
        }
        Ok(v)
    }

    /// Reads a tensor of any real dtype converted to `f32` (F16, BF16, the float8 formats, F64, integers, bool);
    /// see [`crate::float`].
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let e = self.tensor(name)?;
        if e.dtype == Dtype::F32 {
            return self.read(name);
        }
        float::to_f32_vec(e.dtype, &self.read_raw(name)?).map_err(|err| err.context(&self.describe(name)))
    }

    /// Reads a bytes entry.
    pub fn read_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let cname = cstring(name, "entry name")?;
        let mut size = 0u64;
        check(unsafe { sys::dckpt_reader_read_bytes(&mut size, self.raw, cname.as_ptr(), std::ptr::null_mut(), 0) })
            .or_else(|e| if e.code() == ErrorCode::BufferSize { Ok(()) } else { Err(e) })?;
        let n = usize::try_from(size).map_err(|_| Error::new(ErrorCode::NoMemory, self.describe(name)))?;
        let mut v: Vec<u8> = Vec::with_capacity(n);
        let mut got = 0u64;
        unsafe {
            check(sys::dckpt_reader_read_bytes(&mut got, self.raw, cname.as_ptr(), v.as_mut_ptr().cast(), size))?;
            v.set_len(got.min(size) as usize);
        }
        Ok(v)
    }

    /// The user metadata value of `key`, if present.
    pub fn user(&self, key: &str) -> Option<&str> {
        let ckey = CString::new(key).ok()?;
        let mut value = std::ptr::null();
        let rc = unsafe { sys::dckpt_reader_user_get(&mut value, self.raw, ckey.as_ptr()) };
        (rc == sys::DCKPT_OK).then(|| unsafe { borrowed_str(value) })
    }

    /// Every user metadata key/value, sorted by key.
    pub fn user_metadata(&self) -> Vec<(&str, &str)> {
        let mut n = 0usize;
        if unsafe { sys::dckpt_reader_num_user(&mut n, self.raw) } != sys::DCKPT_OK {
            return Vec::new();
        }
        (0..n)
            .filter_map(|i| {
                let (mut k, mut v) = (std::ptr::null(), std::ptr::null());
                let rc = unsafe { sys::dckpt_reader_user(&mut k, &mut v, self.raw, i) };
                (rc == sys::DCKPT_OK).then(|| unsafe { (borrowed_str(k), borrowed_str(v)) })
            })
            .collect()
    }

    /// The structure description a binding saved to rebuild nested state (empty if none).
    pub fn structure(&self) -> &[u8] {
        let (mut data, mut size) = (std::ptr::null(), 0usize);
        let rc = unsafe { sys::dckpt_reader_structure(&mut data, &mut size, self.raw) };
        if rc != sys::DCKPT_OK || data.is_null() || size == 0 {
            return &[];
        }
        unsafe { std::slice::from_raw_parts(data.cast(), size) }
    }

    /// Reads and checks every chunk; a `Corrupt` error names the entry, chunk, file and byte range of the first bad
    /// block. A checkpoint another library wrote ([`checksummed`](Self::checksummed) false) has no checksums to check:
    /// `Unsupported`, with the library's message saying so (its structure was checked when it was opened).
    pub fn verify(&self) -> Result<()> {
        check(unsafe { sys::dckpt_reader_verify(self.raw, None, std::ptr::null_mut()) })
            .map_err(|e| self.storage_error(e))
    }

    /// The storage it reads from (`None`: the POSIX file system).
    pub fn storage(&self) -> Option<&StorageHandle> {
        self.storage.as_ref()
    }

    /// Adds what a Rust [`crate::Storage`] said to an error of a call that read through it.
    pub(crate) fn storage_error(&self, e: Error) -> Error {
        storage::annotate(&self.storage, e)
    }

    /// [`verify`](Self::verify), reporting (done, total) bytes; return `false` to stop (a `User` error).
    pub fn verify_with_progress(&self, progress: &mut (dyn FnMut(u64, u64) -> bool + Send)) -> Result<()> {
        let p = Progress::new(progress);
        let rc = unsafe { sys::dckpt_reader_verify(self.raw, Some(Progress::callback), p.user_data()) };
        p.finish(check(rc))
    }

    /// Reads and checks one chunk of an entry.
    pub fn verify_chunk(&self, entry: &Entry<'_>, chunk: usize) -> Result<()> {
        check(unsafe { sys::dckpt_reader_verify_chunk(self.raw, entry.index, chunk) })
    }

    /// I/O counters of this reader since it was opened (views read nothing through the library).
    pub fn io_stats(&self) -> IoStats {
        let mut raw: sys::dckpt_io_stats = unsafe { std::mem::zeroed() };
        raw.version = sys::DCKPT_IO_STATS_VERSION;
        check(unsafe { sys::dckpt_reader_io_stats(&mut raw, self.raw) }).expect("dckpt_reader_io_stats");
        IoStats::from_raw(&raw)
    }
}

/// Iterator over a checkpoint's entries, in name order.
pub struct Entries<'a> {
    ckpt: &'a Checkpoint,
    next: usize,
    end: usize,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Entry<'a>;
    fn next(&mut self) -> Option<Entry<'a>> {
        while self.next < self.end {
            let i = self.next;
            self.next += 1;
            if let Ok(e) = self.ckpt.entry_at(i) {
                return Some(e);
            }
        }
        None
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.end - self.next))
    }
}
