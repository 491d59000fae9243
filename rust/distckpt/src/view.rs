//! Zero-copy views: a tensor stored as one chunk is a typed slice of a read-only memory map of its data file.
//!
//! The format puts every chunk at a multiple of 4 KiB (FORMAT.md section 4) and stores elements little-endian in
//! row-major order, so a single-chunk tensor is already laid out as a Rust `[T]` on a little-endian machine. Each data
//! file is mapped once, whole, on first use (offset 0, so the page size never matters) and stays mapped until the
//! `Checkpoint` is dropped; a view costs a metadata lookup and no system call after that. Pages are read by the
//! kernel on first touch, and only those touched.
//!
//! Like every mmap-based loader (safetensors, candle), this relies on committed checkpoints being immutable: a data
//! file truncated or rewritten in place while views exist makes reads fault (SIGBUS) or change under the view.
//! distckpt itself never modifies a committed checkpoint; an overwrite replaces the directory by rename.

use std::ffi::c_void;
use std::fs::File;
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
    pub const PROT_READ: c_int = 1;
    pub const MAP_SHARED: c_int = 1;
    pub const SC_PAGESIZE: c_int = 30;
    extern "C" {
        pub fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
        pub fn munmap(addr: *mut c_void, len: usize) -> c_int;
        pub fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
        pub fn sysconf(name: c_int) -> c_long;
    }
}

/// A read-only mapping of a whole data file.
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// The mapping is read-only and never remapped while it exists.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.len > 0 {
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}

impl Mapping {
    #[cfg(target_os = "linux")]
    fn map(file: &File) -> std::io::Result<Mapping> {
        use std::os::unix::io::AsRawFd;
        let len = usize::try_from(file.metadata()?.len()).map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))?;
        if len == 0 {
            return Ok(Mapping { ptr: std::ptr::NonNull::<u64>::dangling().as_ptr().cast(), len: 0 });
        }
        // MAP_SHARED: pages come straight from the page cache, with no private copy-on-write bookkeeping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if p as isize == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    #[cfg(not(target_os = "linux"))]
    fn map(_file: &File) -> std::io::Result<Mapping> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "memory-mapped views are implemented for Linux only"))
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
                let map = self.mapping(chunk.file)?;
                let start = usize::try_from(chunk.file_offset).ok();
                let end = start.and_then(|s| s.checked_add(len)).filter(|e| *e <= map.len);
                let (Some(start), Some(_)) = (start, end) else {
                    return Err(Error::new(
                        ErrorCode::Corrupt,
                        format!(
                            "{}: bytes {}..{} of data file '{}' lie past its end ({} bytes): the file is truncated",
                            self.describe(name),
                            chunk.file_offset,
                            chunk.file_offset.saturating_add(chunk.length),
                            chunk.file,
                            map.len
                        ),
                    ));
                };
                let ptr = unsafe { map.ptr.add(start) };
                if (ptr as usize) % std::mem::align_of::<T>() != 0 {
                    return Err(Error::new(
                        ErrorCode::Unsupported,
                        format!("{}: its chunk at offset {start} is not aligned for {}", self.describe(name), std::any::type_name::<T>()),
                    ));
                }
                // Sound: in bounds of a mapping that lives as long as `self` (never removed from `maps`), aligned,
                // every bit pattern is a valid `T` (Element is sealed to plain old data), and read-only.
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

    /// The mapping of data file `file`, made on first use.
    fn mapping(&self, file: &str) -> Result<Arc<Mapping>> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = maps.get(file) {
            return Ok(m.clone());
        }
        // The file name comes from validated metadata: a plain name, no separators or "..".
        let path = self.path().join(file);
        let io = |what: &str, e: std::io::Error| {
            let code = if e.kind() == std::io::ErrorKind::NotFound { ErrorCode::Corrupt } else { ErrorCode::Io };
            Error::new(code, format!("{what} data file '{file}' of checkpoint '{}': {e}", self.path().display()))
        };
        let f = File::open(&path).map_err(|e| io("opening", e))?;
        let m = Arc::new(Mapping::map(&f).map_err(|e| io("mapping", e))?);
        maps.insert(file.to_string(), m.clone());
        Ok(m)
    }
}
