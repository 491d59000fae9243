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
//! [`storage`] (where checkpoints live: POSIX, in memory, S3 through the core's client (every path may be an
//! `"s3://bucket/prefix"` URL; [`S3Options`] to configure it in code), or a Rust [`Storage`]),
//! [`error`].
//!
//! Features (none by default; the default build uses the standard library only): `half` makes `half::bf16` and
//! `half::f16` element types (typed reads, zero-copy views and saves of BF16/F16 tensors); `serde` makes
//! [`json::Value`] `Serialize`/`Deserialize` and adds `Checkpoint::value_as` and `json::from_value`, which read
//! values saved from Python into any `Deserialize` type; `shared` links libdistckpt.so instead of the static archive.
//!
//! Threading follows capi/API.md: [`Checkpoint`] is `Send + Sync`; [`SaveState`]/[`LoadState`] and [`Comm`] are
//! `Send` only; [`SaveFuture`] and [`StorageHandle`] are `Send + Sync`; views, owned views included, are `Send + Sync`. Every handle is
//! freed on `Drop`.

// The module graph runs one way (`use crate::...` edges; each module uses only those listed after it, nothing uses
// the crate root, which declares the modules and re-exports their items):
//
//   whole      -> checkpoint, state, progress, dtype, error
//   state      -> checkpoint, comm, storage, progress, dtype, util, version, error
//   values     -> checkpoint, json, error
//   view       -> checkpoint, copied, float, dtype, util, error
//   checkpoint -> comm, storage, progress, copied, float, dtype, util, version, error
//   storage    -> panic, util, version, error      (its children storage::export -> storage, progress, util, version,
//                                                   error, and storage::s3 -> storage, util, version, error; storage
//                                                   only re-exports them)
//   comm       -> panic, util, version, error
//   leftovers  -> util, error
//   progress   -> panic, util, error
//   panic      -> util          (catch_unwind for the storage, comm and progress trampolines)
//   float      -> dtype, error
//   dtype, util, version -> error
//   error, json, copied  -> nothing in the crate
//
// External crates, each behind its feature: `half` (dtype: Element for half::bf16/f16; float's tests cross-check
// against it) and `serde` (json::serde_support, and Checkpoint::value_as in values).
//
// Helpers shared across modules live at the bottom (util: C strings, paths, timeouts, volumes, locks; panic; version:
// the ABI check), never in a module that uses others, so a new helper cannot close a circle.
pub mod checkpoint;
pub mod comm;
mod copied;
pub mod dtype;
pub mod error;
pub mod float;
pub mod json;
pub mod leftovers;
mod panic;
mod progress;
pub mod state;
pub mod storage;
mod util;
mod values;
mod version;
pub mod view;
pub mod whole;

pub use checkpoint::{
    Checkpoint, CheckpointInfo, ChunkInfo, Compression, DeviceBuffer, Entries, Entry, EntryKind, Format, IoStats,
    ReadOptions,
};
pub use comm::{Collectives, Comm, GlooOptions, ThreadGroup};
pub use dtype::{Dtype, Element};
pub use error::{Error, ErrorCode, Result};
pub use leftovers::{leftovers_of, remove_leftover, scan_leftovers, Leftover, LeftoverKind, WriterState};
pub use state::{LoadState, SaveFuture, SaveInfo, SaveOptions, SaveState};
pub use storage::{
    export_safetensors, list, ExportOptions, PathInfo, PathKind, S3Addressing, S3Options, Storage, StorageFile,
    StorageHandle, Upload,
};
pub use version::{check_abi, library_version};
pub use view::{Advice, ChunkView, OwnedChunkView, OwnedTensorView, TensorView};
pub use whole::LoadedTensor;

pub use distckpt_sys as sys;

/// The Rust code blocks of rust/README.md, run as doctests (`cargo test --doc`) so that the README cannot drift from
/// the API. Lines starting with `# ` are hidden setup: a `main` returning a `Result`, and the repository root as the
/// working directory, since the README's paths (`tests/fixtures/mlp`) are relative to it. Blocks marked `no_run`
/// are compiled only: a build script, and reads into GPU memory (tests/device.rs runs those).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
mod rust_readme {}

/// The Rust block of the repository's README.md ("Using it from Python, Rust and Go"), compiled only (`no_run`): it
/// opens the absolute path the Python line above it saves to.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}
