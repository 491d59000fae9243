//! Zero-copy views: a tensor stored as one chunk is a typed slice of a read-only memory map of its data file.
//!
//! The format puts every chunk at a multiple of 4 KiB (FORMAT.md section 4) and stores elements little-endian in
//! row-major order, so a single-chunk tensor is already laid out as a Rust `[T]` on a little-endian machine. The
//! mapping is the C reader's (`dckpt_reader_map_chunk`): of the data file it pinned when it opened, reached through the
//! checkpoint's directory and never through a link. An overwrite or a removal of the checkpoint therefore never changes
//! a view, and a view costs a metadata lookup and no system call once the file is mapped. Pages are read by the kernel
//! on first touch, and only those touched.
//!
//! Like every mmap-based loader (safetensors, candle), a view faults (SIGBUS) if someone truncates its data file in
//! place; distckpt itself never modifies a committed checkpoint. Opened with `ReadOptions { map_files: false, .. }`
//! nothing is mapped: a view is then a verified copy of the chunk, made once and kept by the `Checkpoint`, and nothing
//! can raise SIGBUS.
//!
//! Compressed chunks (saved with [`SaveOptions::compression`](crate::SaveOptions::compression); [`ChunkInfo::codec`])
//! have no mapping: their bytes exist only decoded. Every view below still works on them, the same way: the view is
//! the library's copy of the chunk (`dckpt_reader_map_chunk`), read, decoded and verified (unless the reader was
//! opened with `verify: false`) on first use, and kept until the `Checkpoint` drops, so later views of it cost no I/O
//! ([`Checkpoint::map_all`] makes these copies up front, in its one pass). Such a view is not zero-copy: the chunk's decoded size
//! stays in memory for the `Checkpoint`'s lifetime. Where that matters, read compressed tensors into your own buffers
//! instead ([`Checkpoint::read_region_into`], [`Checkpoint::read_all_into`]), or save without compression the
//! checkpoints that servers map ([`CheckpointInfo::compressed_chunks`](crate::CheckpointInfo::compressed_chunks)
//! says whether there are any).
//!
//! Which view, when:
//! - [`TensorView`] (`Checkpoint::view`): a whole tensor stored as one chunk (saved from one piece).
//! - [`ChunkView`] (`Checkpoint::chunk_views`): each chunk of a tensor saved in several pieces (sharded), with its box
//!   in the tensor (`offsets()`/`lengths()`). Every chunk is contiguous in its data file, so each has a view.
//! - [`ChunkView`] (`Checkpoint::view_region`): a region that lies in one chunk and is contiguous in that chunk's
//!   row-major layout, e.g. whole rows of a row-sharded chunk.
//! - Anything else (a region across chunks, a column slice, a whole sharded tensor as one slice) is not contiguous
//!   anywhere: copy it with `Checkpoint::read` or into your own buffer with `Checkpoint::read_region_into`.
//!
//! Borrowed views live as long as the borrow of their `Checkpoint`. The owned kinds ([`OwnedTensorView`],
//! [`OwnedChunkView`]) hold an `Arc<Checkpoint>` instead, so a struct can keep its views next to (or without) the
//! checkpoint, move them across threads, and free the checkpoint when the last view drops.

use std::borrow::Cow;
use std::ffi::c_void;
use std::ops::Deref;
use std::os::raw::{c_int, c_long};
use std::sync::Arc;

use crate::checkpoint::{Checkpoint, ChunkInfo, Entry, Format};
use crate::copied::CopiedChunk;
use crate::dtype::{check_element, Dtype, Element};
use crate::error::{check, Error, ErrorCode, Result};
use crate::float;
use crate::util::{cstring, lock};

/// Most dimensions a tensor has (`DCKPT_MAX_DIMS`).
const MAX_DIMS: usize = distckpt_sys::DCKPT_MAX_DIMS as usize;

#[cfg(target_os = "linux")]
mod libc {
    use super::*;
    pub const SC_PAGESIZE: c_int = 30;
    extern "C" {
        pub fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
        pub fn sysconf(name: c_int) -> c_long;
    }
}

fn page_size() -> usize {
    #[cfg(target_os = "linux")]
    {
        static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::SC_PAGESIZE) } {
            n if n > 0 => n as usize,
            _ => 4096,
        })
    }
    #[cfg(not(target_os = "linux"))]
    4096
}

/// `madvise` over the pages of `bytes` (a view named `name`).
fn advise_bytes(bytes: &[u8], advice: Advice, name: &str) -> Result<()> {
    #[cfg(target_os = "linux")]
    {
        if bytes.is_empty() {
            return Ok(());
        }
        let start = bytes.as_ptr() as usize;
        let aligned = start & !(page_size() - 1);
        let code = match advice {
            Advice::Normal => 0,
            Advice::Random => 1,
            Advice::Sequential => 2,
            Advice::WillNeed => 3,
            Advice::PopulateRead => 22, // MADV_POPULATE_READ
        };
        let rc = unsafe { libc::madvise(aligned as *mut c_void, bytes.len() + (start - aligned), code) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if advice == Advice::PopulateRead && err.raw_os_error() == Some(22) {
                // EINVAL: a kernel older than 5.14. Fault the pages in by reading one byte of each.
                let mut i = 0;
                while i < bytes.len() {
                    unsafe { std::ptr::read_volatile(bytes.as_ptr().add(i)) };
                    i += page_size();
                }
                return Ok(());
            }
            return Err(Error::new(ErrorCode::Io, format!("madvise of view '{name}': {err}")));
        }
    }
    let _ = (bytes, advice, name);
    Ok(())
}

/// How a view's pages will be used (`madvise`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// The kernel's default read-ahead.
    Normal,
    /// Random access: no read-ahead.
    Random,
    /// Sequential access: aggressive read-ahead, pages freed soon after use.
    Sequential,
    /// Start reading the pages in now, in the background (prefetch a tensor before it is needed).
    WillNeed,
    /// Fault every page in now and return when all are mapped (`MADV_POPULATE_READ`, Linux 5.14+; touches each page
    /// on older kernels): later accesses take no page faults. Costs the time to read the tensor up front.
    PopulateRead,
}

/// What the view types share, written once: `Deref`/`AsRef` to `[T]` through the type's own `as_slice()`,
/// `to_f32_vec()` on byte views through its `dtype()` and `as_bytes()`, and for the owned views (fields `view`, the
/// borrowed view, and `ckpt`) the accessors that forward to the borrowed view.
macro_rules! slice_view_impls {
    (borrowed $name:ident) => {
        impl<T> Deref for $name<'_, T> {
            type Target = [T];
            fn deref(&self) -> &[T] {
                self.as_slice()
            }
        }
        impl<T> AsRef<[T]> for $name<'_, T> {
            fn as_ref(&self) -> &[T] {
                self.as_slice()
            }
        }
        impl $name<'_, u8> {
            /// Converts the elements of any real dtype to `f32` (see [`crate::float`]).
            pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
                float::to_f32_vec(self.dtype(), self.as_bytes())
            }
        }
    };
    (owned $name:ident) => {
        impl<T: 'static> $name<T> {
            /// The elements, row-major (the box's, for a chunk view).
            pub fn as_slice(&self) -> &[T] {
                self.view.data
            }
            /// The same memory as little-endian bytes.
            pub fn as_bytes(&self) -> &[u8] {
                self.view.as_bytes()
            }
            pub fn entry(&self) -> &Entry<'_> {
                &self.view.entry
            }
            pub fn name(&self) -> &str {
                self.view.name()
            }
            /// The dtype tag (see [`TensorView::dtype`]).
            pub fn dtype(&self) -> Dtype {
                self.view.dtype()
            }
            /// The shape of the whole tensor (a chunk view's box is `lengths()`).
            pub fn shape(&self) -> &[u64] {
                self.view.shape()
            }
            /// The checkpoint this view keeps alive.
            pub fn checkpoint(&self) -> &Arc<Checkpoint> {
                &self.ckpt
            }
            /// Tells the kernel how the view will be read (`madvise` over its pages).
            pub fn advise(&self, advice: Advice) -> Result<()> {
                self.view.advise(advice)
            }
        }
        impl<T: 'static> Deref for $name<T> {
            type Target = [T];
            fn deref(&self) -> &[T] {
                self.as_slice()
            }
        }
        impl<T: 'static> AsRef<[T]> for $name<T> {
            fn as_ref(&self) -> &[T] {
                self.as_slice()
            }
        }
        impl $name<u8> {
            /// Converts the elements of any real dtype to `f32` (see [`crate::float`]).
            pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
                float::to_f32_vec(self.dtype(), self.as_bytes())
            }
        }
    };
}

/// A borrowed, typed, zero-copy view of a whole tensor, backed by a memory map of the checkpoint's data file (or by
/// a copy of a chunk that is not mapped: the library's decoded copy of a compressed one, or the `Checkpoint`'s of any
/// with `map_files: false`).
/// Dereferences to `&[T]`. Lives as long as the borrow of its [`Checkpoint`].
#[derive(Clone, Copy)]
pub struct TensorView<'a, T> {
    data: &'a [T],
    entry: Entry<'a>,
}

impl<'a, T> TensorView<'a, T> {
    /// The elements, row-major.
    pub fn as_slice(&self) -> &'a [T] {
        self.data
    }
    /// The same memory as little-endian bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast(), std::mem::size_of_val(self.data)) }
    }
    pub fn entry(&self) -> &Entry<'a> {
        &self.entry
    }
    pub fn name(&self) -> &'a str {
        self.entry.name()
    }
    /// The dtype tag: tells `u16` data apart as U16, F16 or BF16, and `u8` data as U8, BOOL or a float8 format.
    pub fn dtype(&self) -> Dtype {
        self.entry.dtype()
    }
    pub fn shape(&self) -> &'a [u64] {
        self.entry.shape()
    }

    /// Tells the kernel how the view will be read (`madvise` over its pages).
    pub fn advise(&self, advice: Advice) -> Result<()> {
        advise_bytes(self.as_bytes(), advice, self.name())
    }
}

slice_view_impls!(borrowed TensorView);

impl<T> std::fmt::Debug for TensorView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.name())
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("addr", &self.data.as_ptr())
            .finish()
    }
}

/// A box of a tensor held inline (at most `DCKPT_MAX_DIMS` dimensions), so views of regions need no allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Region {
    ndim: usize,
    offsets: [u64; MAX_DIMS],
    lengths: [u64; MAX_DIMS],
}

impl Region {
    /// `offsets` and `lengths` have the same length, at most `MAX_DIMS` (the callers check the entry's rank).
    fn new(offsets: &[u64], lengths: &[u64]) -> Region {
        let mut r = Region { ndim: offsets.len().min(MAX_DIMS), offsets: [0; MAX_DIMS], lengths: [0; MAX_DIMS] };
        r.offsets[..r.ndim].copy_from_slice(&offsets[..r.ndim]);
        r.lengths[..r.ndim].copy_from_slice(&lengths[..r.ndim]);
        r
    }
    fn offsets(&self) -> &[u64] {
        &self.offsets[..self.ndim]
    }
    fn lengths(&self) -> &[u64] {
        &self.lengths[..self.ndim]
    }
}

/// A borrowed, typed, zero-copy view of a box of a tensor that lies in one chunk: a whole chunk of a sharded tensor
/// ([`Checkpoint::chunk_views`]) or a contiguous region of a chunk ([`Checkpoint::view_region`]). Dereferences to the
/// box's elements, row-major; [`offsets`](Self::offsets) and [`lengths`](Self::lengths) say where the box lies in the
/// tensor. Lives as long as the borrow of its [`Checkpoint`].
pub struct ChunkView<'a, T> {
    data: &'a [T],
    entry: Entry<'a>,
    chunk: usize,
    region: Region,
}

impl<T> Clone for ChunkView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ChunkView<'_, T> {}

impl<'a, T> ChunkView<'a, T> {
    /// The box's elements, row-major.
    pub fn as_slice(&self) -> &'a [T] {
        self.data
    }
    /// The same memory as little-endian bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast(), std::mem::size_of_val(self.data)) }
    }
    pub fn entry(&self) -> &Entry<'a> {
        &self.entry
    }
    pub fn name(&self) -> &'a str {
        self.entry.name()
    }
    /// The dtype tag (see [`TensorView::dtype`]).
    pub fn dtype(&self) -> Dtype {
        self.entry.dtype()
    }
    /// The shape of the whole tensor; the box's own is [`lengths`](Self::lengths).
    pub fn shape(&self) -> &'a [u64] {
        self.entry.shape()
    }
    /// The chunk the box lies in (`0..entry().num_chunks()`, as in [`Checkpoint::chunk`]). For an empty region, 0
    /// where no chunk holds it.
    pub fn chunk_index(&self) -> usize {
        self.chunk
    }
    /// Where the box starts in the tensor, per dimension.
    pub fn offsets(&self) -> &[u64] {
        self.region.offsets()
    }
    /// The box's extent per dimension: `as_slice()` holds their product elements.
    pub fn lengths(&self) -> &[u64] {
        self.region.lengths()
    }
    /// Tells the kernel how the view will be read (`madvise` over its pages).
    pub fn advise(&self, advice: Advice) -> Result<()> {
        advise_bytes(self.as_bytes(), advice, self.name())
    }
}

slice_view_impls!(borrowed ChunkView);

impl<T> std::fmt::Debug for ChunkView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkView")
            .field("name", &self.name())
            .field("dtype", &self.dtype())
            .field("chunk", &self.chunk)
            .field("offsets", &self.offsets())
            .field("lengths", &self.lengths())
            .field("addr", &self.data.as_ptr())
            .finish()
    }
}

/// A [`TensorView`] that owns a share of its checkpoint (`Arc<Checkpoint>`) instead of borrowing it, so it has no
/// lifetime: a server keeps it in a struct beside (or without) the checkpoint, and moves or shares it across threads
/// (`Send + Sync`). The checkpoint, its reader and its mappings are freed when the last owner (the `Arc`s and every
/// owned view) drops. Made by [`Checkpoint::view_owned`] or [`OwnedTensorView::new`]; dereferences to `&[T]`.
pub struct OwnedTensorView<T: 'static> {
    // Borrows from `*ckpt` in truth. The 'static never leaves this type: every accessor reborrows for `&self`.
    view: TensorView<'static, T>,
    ckpt: Arc<Checkpoint>,
}

impl<T: 'static> OwnedTensorView<T> {
    /// Keeps the view that `make` takes of `ckpt` together with `ckpt`: e.g.
    /// `OwnedTensorView::new(ckpt, |c| c.view_verified::<f32>("w"))` or `|c| c.view_bytes("w")`.
    pub fn new<F>(ckpt: Arc<Checkpoint>, make: F) -> Result<OwnedTensorView<T>>
    where
        F: for<'c> FnOnce(&'c Checkpoint) -> Result<TensorView<'c, T>>,
    {
        let view = make(&ckpt)?;
        // Sound: `make` works for every lifetime of its argument, so what it returns borrows from `*ckpt` (or from
        // 'static data), never from anything shorter-lived; the Arc keeps that Checkpoint, with its reader, mappings
        // and copies, alive and in place for as long as `self`, and no accessor hands the 'static out.
        let view = unsafe { std::mem::transmute::<TensorView<'_, T>, TensorView<'static, T>>(view) };
        Ok(OwnedTensorView { view, ckpt })
    }
    /// The borrowed view, for as long as `self` is borrowed.
    pub fn view(&self) -> TensorView<'_, T> {
        TensorView { data: self.view.data, entry: self.view.entry }
    }
}

impl<T: 'static> Clone for OwnedTensorView<T> {
    fn clone(&self) -> Self {
        OwnedTensorView {
            view: TensorView { data: self.view.data, entry: self.view.entry },
            ckpt: Arc::clone(&self.ckpt),
        }
    }
}

slice_view_impls!(owned OwnedTensorView);

impl<T: 'static> std::fmt::Debug for OwnedTensorView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedTensorView")
            .field("name", &self.name())
            .field("dtype", &self.dtype())
            .field("shape", &self.shape())
            .field("addr", &self.view.data.as_ptr())
            .field("checkpoint", &self.ckpt.path())
            .finish()
    }
}

/// A [`ChunkView`] that owns a share of its checkpoint (`Arc<Checkpoint>`), as [`OwnedTensorView`] does: no
/// lifetime, `Send + Sync`, the checkpoint freed when the last owner drops. Made by
/// [`Checkpoint::chunk_views_owned`], [`Checkpoint::view_region_owned`] or [`OwnedChunkView::new`].
pub struct OwnedChunkView<T: 'static> {
    // Borrows from `*ckpt` in truth, as in OwnedTensorView.
    view: ChunkView<'static, T>,
    ckpt: Arc<Checkpoint>,
}

impl<T: 'static> OwnedChunkView<T> {
    /// Keeps the view that `make` takes of `ckpt` together with `ckpt`, e.g.
    /// `OwnedChunkView::new(ckpt, |c| c.view_region::<f32>("w", &[0, 0], &[8, 64]))`.
    pub fn new<F>(ckpt: Arc<Checkpoint>, make: F) -> Result<OwnedChunkView<T>>
    where
        F: for<'c> FnOnce(&'c Checkpoint) -> Result<ChunkView<'c, T>>,
    {
        // Sound for the reasons given in OwnedTensorView::new.
        let view = unsafe { OwnedChunkView::extend(make(&ckpt)?) };
        Ok(OwnedChunkView { view, ckpt })
    }
    /// # Safety
    /// `view` must borrow from a `Checkpoint` (or from 'static data) that the caller keeps alive as long as the result.
    unsafe fn extend(view: ChunkView<'_, T>) -> ChunkView<'static, T> {
        std::mem::transmute::<ChunkView<'_, T>, ChunkView<'static, T>>(view)
    }
    /// The borrowed view, for as long as `self` is borrowed.
    pub fn view(&self) -> ChunkView<'_, T> {
        self.view
    }
    /// See [`ChunkView::chunk_index`].
    pub fn chunk_index(&self) -> usize {
        self.view.chunk
    }
    /// Where the box starts in the tensor, per dimension.
    pub fn offsets(&self) -> &[u64] {
        self.view.region.offsets()
    }
    /// The box's extent per dimension.
    pub fn lengths(&self) -> &[u64] {
        self.view.region.lengths()
    }
}

impl<T: 'static> Clone for OwnedChunkView<T> {
    fn clone(&self) -> Self {
        OwnedChunkView { view: self.view, ckpt: Arc::clone(&self.ckpt) }
    }
}

slice_view_impls!(owned OwnedChunkView);

impl<T: 'static> std::fmt::Debug for OwnedChunkView<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedChunkView")
            .field("name", &self.name())
            .field("dtype", &self.dtype())
            .field("chunk", &self.view.chunk)
            .field("offsets", &self.offsets())
            .field("lengths", &self.lengths())
            .field("addr", &self.view.data.as_ptr())
            .field("checkpoint", &self.ckpt.path())
            .finish()
    }
}

/// "chunks 1 to 3", "chunks 0, 2 and 5" (at most 8 named).
fn chunk_list(chunks: &[usize]) -> String {
    match chunks {
        [] => "no chunk".to_string(),
        [c] => format!("chunk {c}"),
        _ if chunks.windows(2).all(|w| w[1] == w[0] + 1) => {
            format!("chunks {} to {}", chunks[0], chunks[chunks.len() - 1])
        }
        _ => {
            let shown: Vec<String> = chunks.iter().take(8).map(|c| c.to_string()).collect();
            let more = chunks.len().saturating_sub(8);
            if more > 0 {
                format!("chunks {} and {more} more", shown.join(", "))
            } else {
                let (last, rest) = shown.split_last().unwrap();
                format!("chunks {} and {last}", rest.join(", "))
            }
        }
    }
}

/// Whether the box (`o`, `l`) lies inside the box (`co`, `cl`).
fn box_contains(co: &[u64], cl: &[u64], o: &[u64], l: &[u64]) -> bool {
    (0..o.len()).all(|d| o[d] >= co[d] && o[d] + l[d] <= co[d].saturating_add(cl[d]))
}

/// Whether two non-empty boxes share an element.
fn box_intersects(co: &[u64], cl: &[u64], o: &[u64], l: &[u64]) -> bool {
    (0..o.len()).all(|d| o[d].max(co[d]) < (o[d] + l[d]).min(co[d].saturating_add(cl[d])))
}

impl Checkpoint {
    /// A zero-copy view of a whole tensor: `&[T]` straight out of a memory map of its data file, with no read and no
    /// copy. `T` must hold the tensor's dtype (as for [`Checkpoint::read`]).
    ///
    /// Only a tensor stored as **one contiguous chunk** has such a view; one saved in several pieces (sharded) gives
    /// an `Unsupported` error saying so. View its chunks with [`chunk_views`](Self::chunk_views) (or a region inside
    /// one chunk with [`view_region`](Self::view_region)), or copy it whole with [`Checkpoint::read`] or into your own
    /// buffer with [`Checkpoint::read_region_into`]. A view does not verify checksums; see
    /// [`view_verified`](Self::view_verified).
    ///
    /// A compressed chunk ([`ChunkInfo::codec`]) cannot be mapped: its view is a decoded copy, read and verified
    /// through the library on first use and kept by the `Checkpoint` (see the [module](crate::view) documentation).
    /// This holds for every view below.
    pub fn view<T: Element>(&self, name: &str) -> Result<TensorView<'_, T>> {
        let entry = self.entry(name)?;
        check_element::<T>(entry.dtype(), || self.describe(name))?;
        self.view_entry(entry)
    }

    /// Like [`view`](Self::view), after checking the tensor's checksums: its pages are read in, mapped and hashed in
    /// place ([`map_entries`](Self::map_entries)), so the view is resident when it returns. Where the reader maps
    /// nothing (`map_files: false`) each chunk is checked with ordinary reads instead (`dckpt_reader_verify_chunk`).
    /// A checkpoint another library wrote has no checksums: `Unsupported`, as from [`Checkpoint::verify`] (take
    /// [`view`](Self::view) after [`map_all`](Self::map_all) there). A compressed chunk is decoded into its copy and
    /// verified there.
    pub fn view_verified<T: Element>(&self, name: &str) -> Result<TensorView<'_, T>> {
        let entry = self.entry(name)?;
        check_element::<T>(entry.dtype(), || self.describe(name))?;
        if !self.checksummed() {
            // The library's own message: the format, and that its structure was checked on open.
            check(unsafe { distckpt_sys::dckpt_reader_verify(self.raw(), None, std::ptr::null_mut()) })?;
        }
        match self.map_entries(Some(&[name]), None) {
            Err(e) if e.code() == ErrorCode::Unsupported => {
                for c in 0..entry.num_chunks() {
                    check(unsafe { distckpt_sys::dckpt_reader_verify_chunk(self.raw(), entry.index(), c) })?;
                }
            }
            other => other?,
        }
        self.view_entry(entry)
    }

    /// A zero-copy view of the tensor where it has one ([`view`](Self::view)), else a copy ([`read`](Self::read)):
    /// for loaders that take whatever checkpoint they are given. The copy is made where a view is `Unsupported`: a
    /// tensor stored as several chunks, or one whose bytes are not aligned for `T` (a tensor that a foreign file, such
    /// as a safetensors file with an unpadded header, put at an odd offset). Other errors are returned.
    pub fn view_or_read<T: Element>(&self, name: &str) -> Result<Cow<'_, [T]>> {
        match self.view::<T>(name) {
            Ok(v) => Ok(Cow::Borrowed(v.as_slice())),
            Err(e) if e.code() == ErrorCode::Unsupported => Ok(Cow::Owned(self.read::<T>(name)?)),
            Err(e) => Err(e),
        }
    }

    /// A zero-copy view of a tensor of any dtype as bytes (the safetensors/candle loading path: bytes + dtype +
    /// shape).
    pub fn view_bytes(&self, name: &str) -> Result<TensorView<'_, u8>> {
        let entry = self.entry(name)?;
        self.view_entry(entry)
    }

    /// [`view`](Self::view) that keeps a share of the checkpoint instead of borrowing it: call it on an
    /// `Arc<Checkpoint>`. For other kinds of view, see [`OwnedTensorView::new`].
    pub fn view_owned<T: Element>(self: &Arc<Self>, name: &str) -> Result<OwnedTensorView<T>> {
        OwnedTensorView::new(Arc::clone(self), |c| c.view::<T>(name))
    }

    /// A zero-copy view of every chunk of a tensor, in chunk order, each with its box in the tensor
    /// ([`ChunkView::offsets`], [`ChunkView::lengths`]). This is the zero-copy path for a tensor saved in several
    /// pieces (by several ranks): each chunk is contiguous in its data file even though the tensor is not. A tensor
    /// saved from one piece gives one view, of the whole tensor; a tensor with no elements gives none. Like
    /// [`view`](Self::view), no checksum is checked: call [`Checkpoint::verify_chunk`] first where that matters. A
    /// compressed chunk's view is its decoded copy, as for [`view`](Self::view).
    pub fn chunk_views<T: Element>(&self, name: &str) -> Result<Vec<ChunkView<'_, T>>> {
        let entry = self.entry(name)?;
        check_element::<T>(entry.dtype(), || self.describe(name))?;
        self.check_viewable(&entry)?;
        (0..entry.num_chunks())
            .map(|c| {
                let info = self.chunk(&entry, c)?;
                let data = self.chunk_slice::<T>(&entry, c, &info)?;
                Ok(ChunkView { data, entry, chunk: c, region: Region::new(info.offsets, info.lengths) })
            })
            .collect()
    }

    /// [`chunk_views`](Self::chunk_views) that keep a share of the checkpoint: call it on an `Arc<Checkpoint>`.
    pub fn chunk_views_owned<T: Element>(self: &Arc<Self>, name: &str) -> Result<Vec<OwnedChunkView<T>>> {
        let views = self.chunk_views::<T>(name)?;
        // Sound: the views borrow from `**self`, whose Arc each owned view keeps.
        Ok(views
            .into_iter()
            .map(|v| OwnedChunkView { view: unsafe { OwnedChunkView::extend(v) }, ckpt: Arc::clone(self) })
            .collect())
    }

    /// A zero-copy view of the box `[offsets, offsets + lengths)` of a tensor, row-major, where that box lies in one
    /// chunk and is contiguous in the chunk's row-major layout: it is whole in every dimension after its first one
    /// longer than 1. Whole rows of a row-sharded chunk qualify (`offsets = [r, 0]`, `lengths = [n, cols]`), as
    /// does any part of one row, or any box of a tensor stored as one chunk that is contiguous in the tensor.
    ///
    /// Any other box gives an `Unsupported` error that says why (which chunks it spans, or which dimension breaks it
    /// up): its elements are not adjacent anywhere, so it needs a copy, with [`Checkpoint::read_region_into`] into
    /// your own buffer (or [`Checkpoint::read_region`]). In a compressed chunk the region is part of the chunk's
    /// decoded copy (the whole chunk is decoded and kept), as for [`view`](Self::view).
    pub fn view_region<T: Element>(&self, name: &str, offsets: &[u64], lengths: &[u64]) -> Result<ChunkView<'_, T>> {
        let entry = self.entry(name)?;
        check_element::<T>(entry.dtype(), || self.describe(name))?;
        self.check_viewable(&entry)?;
        let shape = entry.shape();
        if offsets.len() != shape.len() || lengths.len() != shape.len() {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{} has {} dimensions; got {} offsets and {} lengths",
                    self.describe(name),
                    shape.len(),
                    offsets.len(),
                    lengths.len()
                ),
            ));
        }
        if let Some(d) = (0..shape.len()).find(|&d| offsets[d].checked_add(lengths[d]).is_none_or(|end| end > shape[d]))
        {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{}: the region at offsets {offsets:?} with lengths {lengths:?} is outside its shape {shape:?} in \
                     dimension {d}",
                    self.describe(name)
                ),
            ));
        }
        let region = Region::new(offsets, lengths);
        let empty = lengths.contains(&0);
        let mut touched = Vec::new();
        for c in 0..entry.num_chunks() {
            let info = self.chunk(&entry, c)?;
            if box_contains(info.offsets, info.lengths, offsets, lengths) {
                if empty {
                    return Ok(ChunkView { data: &[], entry, chunk: c, region });
                }
                let data = self.region_in_chunk::<T>(&entry, c, &info, offsets, lengths)?;
                return Ok(ChunkView { data, entry, chunk: c, region });
            }
            if !empty && box_intersects(info.offsets, info.lengths, offsets, lengths) {
                touched.push(c);
            }
        }
        if empty {
            return Ok(ChunkView { data: &[], entry, chunk: 0, region });
        }
        Err(Error::new(
            ErrorCode::Unsupported,
            format!(
                "{}: the region at offsets {offsets:?} with lengths {lengths:?} spans {} of its {} chunks, and a \
                 zero-copy view lies in one chunk: copy the region into your own buffer with read_region_into() (or \
                 read() the whole tensor), or view each chunk with chunk_views()",
                self.describe(name),
                chunk_list(&touched),
                entry.num_chunks()
            ),
        ))
    }

    /// [`view_region`](Self::view_region) that keeps a share of the checkpoint: call it on an `Arc<Checkpoint>`.
    pub fn view_region_owned<T: Element>(
        self: &Arc<Self>,
        name: &str,
        offsets: &[u64],
        lengths: &[u64],
    ) -> Result<OwnedChunkView<T>> {
        OwnedChunkView::new(Arc::clone(self), |c| c.view_region::<T>(name, offsets, lengths))
    }

    /// The part of chunk `chunk` (box `info`) that is the box (`offsets`, `lengths`), which lies inside it.
    fn region_in_chunk<'s, T>(
        &'s self,
        entry: &Entry<'s>,
        chunk: usize,
        info: &ChunkInfo<'s>,
        offsets: &[u64],
        lengths: &[u64],
    ) -> Result<&'s [T]> {
        let (co, cl) = (info.offsets, info.lengths);
        if let Some(first) = lengths.iter().position(|&l| l != 1) {
            if let Some(d) = (first + 1..lengths.len()).find(|&d| lengths[d] != cl[d]) {
                return Err(Error::new(
                    ErrorCode::Unsupported,
                    format!(
                        "{}: the region at offsets {offsets:?} with lengths {lengths:?} lies in chunk {chunk} (offsets \
                         {co:?}, lengths {cl:?}) but is not contiguous in it: it takes {} of the chunk's {} elements in \
                         dimension {d} after taking {} in dimension {first}, so its elements are not adjacent in the \
                         chunk's row-major layout. A view needs a region that is whole in every dimension after its \
                         first one longer than 1 (e.g. whole rows of a row-sharded chunk); copy this one into your own \
                         buffer with read_region_into() (or read() the whole tensor)",
                        self.describe(entry.name()),
                        lengths[d],
                        cl[d],
                        lengths[first]
                    ),
                ));
            }
        }
        let all = self.chunk_slice::<T>(entry, chunk, info)?;
        // Row-major position of the region's first element in the chunk. No overflow: every index is below the
        // chunk's element count, which fits in `all`.
        let mut start = 0u64;
        for d in 0..cl.len() {
            start = start * cl[d] + (offsets[d] - co[d]);
        }
        let n: u64 = lengths.iter().product();
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(n).ok())
            .and_then(|(s, n)| all.get(s..s.checked_add(n)?))
            .ok_or_else(|| {
                Error::new(
                    ErrorCode::Internal,
                    format!(
                        "{}: the region {offsets:?}+{lengths:?} is outside chunk {chunk}",
                        self.describe(entry.name())
                    ),
                )
            })
    }

    /// Views exist for tensors, on little-endian machines.
    fn check_viewable(&self, entry: &Entry<'_>) -> Result<()> {
        if !entry.is_tensor() {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("{} is a bytes entry, not a tensor: use read_bytes()", self.describe(entry.name())),
            ));
        }
        if !cfg!(target_endian = "little") {
            return Err(Error::new(ErrorCode::Unsupported, "views need a little-endian machine; use read()"));
        }
        Ok(())
    }

    fn view_entry<'s, T>(&'s self, entry: Entry<'s>) -> Result<TensorView<'s, T>> {
        let name = entry.name();
        self.check_viewable(&entry)?;
        let data: &[T] = match entry.num_chunks() {
            0 => &[], // a tensor with no elements
            1 => {
                let chunk = self.chunk(&entry, 0)?;
                if chunk.length != entry.nbytes() {
                    return Err(Error::new(
                        ErrorCode::Corrupt,
                        format!(
                            "{}: its chunk holds {} bytes, the tensor {}",
                            self.describe(name),
                            chunk.length,
                            entry.nbytes()
                        ),
                    ));
                }
                self.chunk_slice::<T>(&entry, 0, &chunk)?
            }
            n => {
                return Err(Error::new(
                    ErrorCode::Unsupported,
                    format!(
                        "{} is stored as {n} chunks (it was saved in {n} pieces), not one contiguous chunk, so it has \
                         no zero-copy view as one slice: view each chunk with chunk_views() (or a region inside one \
                         chunk with view_region()), or use read() or read_region_into() to assemble it",
                        self.describe(name)
                    ),
                ))
            }
        };
        Ok(TensorView { data, entry })
    }

    /// Chunk `chunk` of `entry` (box `info`) as `&[T]`: checks its length against its box and its alignment.
    fn chunk_slice<'s, T>(&'s self, entry: &Entry<'s>, chunk: usize, info: &ChunkInfo<'s>) -> Result<&'s [T]> {
        let name = entry.name();
        let elem = std::mem::size_of::<T>();
        // `T` is the dtype's element type, or u8 for view_bytes(); a dtype newer than this crate has no known size.
        let dsize = entry.dtype().size() as u64;
        let want = info.lengths.iter().try_fold(dsize, |acc, &l| acc.checked_mul(l));
        let fits = (dsize == 0 || want == Some(info.length)) && info.length % elem as u64 == 0;
        let len = usize::try_from(info.length).ok().filter(|_| fits);
        let Some(len) = len else {
            return Err(Error::new(
                ErrorCode::Corrupt,
                format!(
                    "{}: chunk {chunk} holds {} bytes, but its box {:?} of {}-byte elements needs {}",
                    self.describe(name),
                    info.length,
                    info.lengths,
                    dsize,
                    want.map_or("more than 2^64".to_string(), |w| w.to_string())
                ),
            ));
        };
        if len == 0 {
            return Ok(&[]);
        }
        let bytes = self.chunk_bytes(entry, chunk, info, len)?;
        let ptr = bytes.as_ptr();
        // Checked before any `&[T]` exists: a misaligned reference is undefined behaviour even if never read.
        if (ptr as usize) % std::mem::align_of::<T>() != 0 {
            return Err(self.misaligned::<T>(entry, chunk, info));
        }
        // Sound: `len` bytes inside the reader's mapping (or a copy never removed from `copies`), both living as long
        // as `self`; aligned; every bit pattern is a valid `T` (Element is sealed to plain old data); read-only.
        Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len / elem) })
    }

    /// The error for a chunk whose bytes do not start on a multiple of `T`'s alignment. distckpt puts every chunk on a
    /// 4 KiB boundary; another library's file may put a tensor anywhere (safetensors does not require its header to
    /// be padded), and a `&[T]` there would be a misaligned reference. Bytes have no alignment, and copies are
    /// aligned.
    fn misaligned<T>(&self, entry: &Entry<'_>, chunk: usize, info: &ChunkInfo<'_>) -> Error {
        let written_by = match self.format() {
            Format::Distckpt => "the writer".to_string(),
            other => format!("the {other} file"),
        };
        Error::new(
            ErrorCode::Unsupported,
            format!(
                "{}: chunk {chunk} starts at byte {} of file '{}', which is not a multiple of the {}-byte alignment \
                 of {} ({written_by} put it there), so it has no zero-copy typed view: copy it with read() or \
                 read_region_into() (view_or_read() does either), or view its bytes with view_bytes()",
                self.describe(entry.name()),
                info.file_offset,
                info.file,
                std::mem::align_of::<T>(),
                std::any::type_name::<T>()
            ),
        )
    }

    /// The `len` bytes of chunk `chunk` of `entry`: the reader's mapping of its pinned data file, or the library's
    /// decoded copy of a compressed chunk (both kept until `dckpt_reader_free`), or, where the reader maps nothing
    /// (`map_files: false`), a verified copy of a raw chunk made on first use and kept until drop.
    fn chunk_bytes(&self, entry: &Entry<'_>, chunk: usize, info: &ChunkInfo<'_>, len: usize) -> Result<&[u8]> {
        let mut data: *const c_void = std::ptr::null();
        let mut size: u64 = 0;
        let rc =
            unsafe { distckpt_sys::dckpt_reader_map_chunk(&mut data, &mut size, self.raw(), entry.index(), chunk) };
        if rc == distckpt_sys::DCKPT_EUNSUPPORTED {
            return self.copied_chunk(entry, chunk, info, len);
        }
        check(rc)?;
        if size != len as u64 || data.is_null() {
            return Err(Error::new(
                ErrorCode::Internal,
                format!("{}: mapped {size} bytes of chunk {chunk}, expected {len}", self.describe(entry.name())),
            ));
        }
        // Sound: the C reader keeps the mapping (or its decoded copy) until dckpt_reader_free, which only Drop calls.
        Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
    }

    fn copied_chunk(&self, entry: &Entry<'_>, chunk: usize, info: &ChunkInfo<'_>, len: usize) -> Result<&[u8]> {
        let mut copies = lock(&self.copies);
        if let Some(copy) = copies.get(&(entry.index(), chunk)) {
            let bytes: &[u8] = copy.bytes();
            // Sound: the Arc's buffer is never moved or freed while `self` lives (entries are never removed).
            return Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) });
        }
        let mut copy = CopiedChunk { words: vec![0u64; len.div_ceil(8)], len };
        let name = cstring(entry.name(), "entry name")?;
        let dims = |s: &[u64]| if s.is_empty() { std::ptr::null() } else { s.as_ptr() };
        // The chunk's box, read through the library (checksums verified unless the reader was opened without).
        check(unsafe {
            distckpt_sys::dckpt_reader_read(
                self.raw(),
                name.as_ptr(),
                info.offsets.len(),
                dims(info.offsets),
                dims(info.lengths),
                copy.words.as_mut_ptr().cast(),
                len as u64,
            )
        })?;
        let copy = Arc::new(copy);
        let bytes: &[u8] = copy.bytes();
        let out = unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) };
        copies.insert((entry.index(), chunk), copy);
        Ok(out)
    }
}
