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
//! nothing is mapped: a view is then a verified copy of the tensor, made once and kept by the `Checkpoint`, and nothing
//! can raise SIGBUS.

use std::ffi::c_void;
use std::ops::Deref;
use std::os::raw::{c_int, c_long};
use std::sync::Arc;

use crate::checkpoint::{Checkpoint, Entry};
use crate::dtype::check_element;
use crate::error::check;
use crate::{Dtype, Element, Error, ErrorCode, Result};

#[cfg(target_os = "linux")]
mod libc {
    use super::*;
    pub const SC_PAGESIZE: c_int = 30;
    extern "C" {
        pub fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
        pub fn sysconf(name: c_int) -> c_long;
    }
}

/// A tensor copied out of the checkpoint (views of a reader opened with `map_files: false`), 8-byte aligned.
pub(crate) struct OwnedChunk {
    words: Vec<u64>,
    len: usize,
}

impl OwnedChunk {
    fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
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

/// A borrowed, typed, zero-copy view of a whole tensor, backed by a memory map of the checkpoint's data file.
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
        #[cfg(target_os = "linux")]
        {
            let bytes = std::mem::size_of_val(self.data);
            if bytes == 0 {
                return Ok(());
            }
            let start = self.data.as_ptr() as usize;
            let aligned = start & !(page_size() - 1);
            let code = match advice {
                Advice::Normal => 0,
                Advice::Random => 1,
                Advice::Sequential => 2,
                Advice::WillNeed => 3,
                Advice::PopulateRead => 22, // MADV_POPULATE_READ
            };
            let rc = unsafe { libc::madvise(aligned as *mut c_void, bytes + (start - aligned), code) };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                if advice == Advice::PopulateRead && err.raw_os_error() == Some(22) {
                    // EINVAL: a kernel older than 5.14. Fault the pages in by reading one byte of each.
                    let b = self.as_bytes();
                    let mut i = 0;
                    while i < b.len() {
                        unsafe { std::ptr::read_volatile(b.as_ptr().add(i)) };
                        i += page_size();
                    }
                    return Ok(());
                }
                return Err(Error::new(ErrorCode::Io, format!("madvise of view '{}': {err}", self.name())));
            }
        }
        let _ = advice;
        Ok(())
    }
}

impl<'a> TensorView<'a, u8> {
    /// Converts the elements of any real dtype to `f32` (see [`crate::float`]).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        crate::float::to_f32_vec(self.dtype(), self.as_bytes())
    }
}

impl<T> Deref for TensorView<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.data
    }
}

impl<T> AsRef<[T]> for TensorView<'_, T> {
    fn as_ref(&self) -> &[T] {
        self.data
    }
}

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

impl Checkpoint {
    /// A zero-copy view of a whole tensor: `&[T]` straight out of a memory map of its data file, with no read and no
    /// copy. `T` must hold the tensor's dtype (as for [`Checkpoint::read`]).
    ///
    /// Only a tensor stored as **one contiguous chunk** has such a view; one saved in several pieces (sharded) gives
    /// an `Unsupported` error saying so, and is read with [`Checkpoint::read`] or
    /// [`Checkpoint::read_region_into`] instead. A view does not verify checksums; see
    /// [`view_verified`](Self::view_verified).
    pub fn view<T: Element>(&self, name: &str) -> Result<TensorView<'_, T>> {
        let entry = self.entry(name)?;
        check_element::<T>(entry.dtype(), || self.describe(name))?;
        self.view_entry(entry)
    }

    /// Like [`view`](Self::view), after reading the chunk once through the library and checking its checksum
    /// (`dckpt_reader_verify_chunk`). The check reads the file with ordinary I/O; the view still maps it.
    pub fn view_verified<T: Element>(&self, name: &str) -> Result<TensorView<'_, T>> {
        let entry = self.entry(name)?;
        check_element::<T>(entry.dtype(), || self.describe(name))?;
        for c in 0..entry.num_chunks() {
            check(unsafe { distckpt_sys::dckpt_reader_verify_chunk(self.raw(), entry.index(), c) })?;
        }
        self.view_entry(entry)
    }

    /// A zero-copy view of a tensor of any dtype as bytes (the safetensors/candle loading path: bytes + dtype +
    /// shape).
    pub fn view_bytes(&self, name: &str) -> Result<TensorView<'_, u8>> {
        let entry = self.entry(name)?;
        self.view_entry(entry)
    }

    fn view_entry<'s, T>(&'s self, entry: Entry<'s>) -> Result<TensorView<'s, T>> {
        let name = entry.name();
        if !entry.is_tensor() {
            return Err(Error::new(
                ErrorCode::InvalidArgument,
                format!("{} is a bytes entry, not a tensor: use read_bytes()", self.describe(name)),
            ));
        }
        if !cfg!(target_endian = "little") {
            return Err(Error::new(ErrorCode::Unsupported, "views need a little-endian machine; use read()"));
        }
        let elem = std::mem::size_of::<T>();
        let data: &[T] = match entry.num_chunks() {
            0 => &[], // a tensor with no elements
            1 => {
                let chunk = self.chunk(&entry, 0)?;
                let len = usize::try_from(chunk.length).ok().filter(|l| l % elem == 0 && chunk.length == entry.nbytes());
                let Some(len) = len else {
                    return Err(Error::new(
                        ErrorCode::Corrupt,
                        format!("{}: its chunk holds {} bytes, the tensor {}", self.describe(name), chunk.length, entry.nbytes()),
                    ));
                };
                let bytes = self.chunk_bytes(&entry, len)?;
                let ptr = bytes.as_ptr();
                if (ptr as usize) % std::mem::align_of::<T>() != 0 {
                    return Err(Error::new(
                        ErrorCode::Unsupported,
                        format!(
                            "{}: its chunk at offset {} is not aligned for {}",
                            self.describe(name),
                            chunk.file_offset,
                            std::any::type_name::<T>()
                        ),
                    ));
                }
                // Sound: `len` bytes inside the reader's mapping (or an owned copy never removed from `owned`), both
                // living as long as `self`; aligned; every bit pattern is a valid `T` (Element is sealed to plain old
                // data); read-only.
                unsafe { std::slice::from_raw_parts(ptr.cast::<T>(), len / elem) }
            }
            n => {
                return Err(Error::new(
                    ErrorCode::Unsupported,
                    format!(
                        "{} is stored as {n} chunks (it was saved in {n} pieces), not one contiguous chunk, so it has \
                         no zero-copy view: use read() or read_region_into() to assemble it",
                        self.describe(name)
                    ),
                ))
            }
        };
        Ok(TensorView { data, entry })
    }

    /// The `len` bytes of the single chunk of `entry`: the reader's mapping of its pinned data file, or, where the
    /// reader maps nothing (`map_files: false`), a verified copy made on first use and kept until drop.
    fn chunk_bytes(&self, entry: &Entry<'_>, len: usize) -> Result<&[u8]> {
        let mut data: *const c_void = std::ptr::null();
        let mut size: u64 = 0;
        let rc = unsafe { distckpt_sys::dckpt_reader_map_chunk(&mut data, &mut size, self.raw(), entry.index(), 0) };
        if rc == distckpt_sys::DCKPT_EUNSUPPORTED {
            return self.owned_copy(entry, len);
        }
        check(rc)?;
        if size != len as u64 {
            return Err(Error::new(ErrorCode::Internal, format!("{}: mapped {size} bytes, expected {len}", self.describe(entry.name()))));
        }
        // Sound: the C reader keeps the mapping until dckpt_reader_free, which only Drop calls.
        Ok(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) })
    }

    fn owned_copy(&self, entry: &Entry<'_>, len: usize) -> Result<&[u8]> {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(chunk) = owned.get(&entry.index()) {
            let bytes: &[u8] = chunk.bytes();
            // Sound: the Arc's buffer is never moved or freed while `self` lives (entries are never removed).
            return Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) });
        }
        let mut chunk = OwnedChunk { words: vec![0u64; len.div_ceil(8)], len };
        let shape = entry.shape();
        let zeros = vec![0u64; shape.len()];
        let name = crate::checkpoint::cstring(entry.name(), "entry name")?;
        check(unsafe {
            distckpt_sys::dckpt_reader_read(
                self.raw(),
                name.as_ptr(),
                shape.len(),
                zeros.as_ptr(),
                shape.as_ptr(),
                chunk.words.as_mut_ptr().cast(),
                len as u64,
            )
        })?;
        let chunk = Arc::new(chunk);
        let bytes: &[u8] = chunk.bytes();
        let out = unsafe { std::slice::from_raw_parts(bytes.as_ptr(), bytes.len()) };
        owned.insert(entry.index(), chunk);
        Ok(out)
    }
}
