//! Safe Rust API of distckpt, a distributed checkpointing library (C++ core behind the C ABI of `distckpt.h`).
//!
//! ```no_run
//! # fn main() -> distckpt::Result<()> {
//! use distckpt::{Checkpoint, Dtype, SaveOptions, SaveState};
//!
//! // Save from Rust (one process; see `SaveState::save_with_comm` for several ranks).
//! let w = vec![0.5f32; 64 * 32];
//! let mut state = SaveState::new()?;
//! state.add_tensor("fc1.weight", &[64, 32], &w)?.set_user("step", "100")?;
//! state.save("/tmp/ckpt", &SaveOptions::default())?;
//!
//! // Read it back: entries, typed reads with a dtype check, region reads, zero-copy views.
//! let ckpt = Checkpoint::open("/tmp/ckpt")?;
//! for e in ckpt.entries() {
//!     println!("{} {} {:?} {} bytes", e.name(), e.dtype(), e.shape(), e.nbytes());
//! }
//! let v: Vec<f32> = ckpt.read("fc1.weight")?;
//! let view = ckpt.view::<f32>("fc1.weight")?; // &[f32] straight out of an mmap
//! assert_eq!(&view[..], &v[..]);
//! # Ok(()) }
//! ```
//!
//! Modules follow the header's sections: [`checkpoint`] (reader), [`view`] (mmap views: whole tensors, chunks of
//! sharded tensors and contiguous regions, borrowed or owned through an `Arc<Checkpoint>`), [`state`] (save and
//! load), [`comm`] (communicators), [`dtype`] and [`float`] (element types; F16, BF16 and float8 as raw bits with
//! conversions), [`json`] (values saved from Python: [`Checkpoint::value`], [`Checkpoint::structure_json`]),
//! [`storage`] (where checkpoints live: POSIX, in memory, or a Rust [`Storage`] such as an object store client),
//! [`error`].
//!
//! Threading follows capi/API.md: [`Checkpoint`] is `Send + Sync`; [`SaveState`]/[`LoadState`] and [`Comm`] are
//! `Send` only; [`SaveFuture`] and [`StorageHandle`] are `Send + Sync`; views, owned views included, are `Send + Sync`. Every handle is
//! freed on `Drop`.

pub mod checkpoint;
pub mod comm;
mod copied;
mod cstr;
pub mod dtype;
pub mod error;
pub mod float;
pub mod json;
mod progress;
pub mod state;
pub mod storage;
mod values;
pub mod view;
pub mod whole;

pub use checkpoint::{
    Checkpoint, CheckpointInfo, ChunkInfo, DeviceBuffer, Entries, Entry, EntryKind, IoStats, ReadOptions,
};
pub use comm::{Collectives, Comm, GlooOptions, ThreadGroup};
pub use dtype::{Dtype, Element};
pub use error::{Error, ErrorCode, Result};
pub use state::{LoadState, SaveFuture, SaveInfo, SaveOptions, SaveState};
pub use storage::{export_safetensors, ExportOptions, PathInfo, PathKind, Storage, StorageFile, StorageHandle};
pub use view::{Advice, ChunkView, OwnedChunkView, OwnedTensorView, TensorView};
pub use whole::LoadedTensor;

pub use distckpt_sys as sys;

use std::sync::OnceLock;
use std::time::Duration;

/// Version of the loaded library ("0.1.0").
pub fn library_version() -> String {
    let p = unsafe { sys::dckpt_version_string() };
    if p.is_null() {
        return String::new();
    }
    unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Checks once that the loaded libdistckpt.so has the ABI these bindings were generated for (every binding does
/// this when it loads). Called by every constructor.
pub fn check_abi() -> Result<()> {
    static ABI: OnceLock<Result<()>> = OnceLock::new();
    ABI.get_or_init(|| {
        let loaded = unsafe { sys::dckpt_abi_version() };
        if loaded == sys::DCKPT_ABI_VERSION {
            Ok(())
        } else {
            Err(Error::new(
                ErrorCode::Version,
                format!(
                    "libdistckpt.so {} has ABI version {loaded}, but these bindings were generated for ABI {}: \
                     rebuild the library (scripts/build_lib.sh) or the bindings (rust/distckpt-sys/generate.sh)",
                    library_version(),
                    sys::DCKPT_ABI_VERSION
                ),
            ))
        }
    })
    .clone()
}

/// A timeout for the C ABI: 0 means the library's default.
pub(crate) fn timeout_ms(t: Option<Duration>) -> u64 {
    t.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1))
}
