//! Export to safetensors (`dckpt_export_safetensors`, the header's "Tools" section): a child of `storage`, which
//! re-exports it (`distckpt::storage::export_safetensors`, and `distckpt::export_safetensors` at the crate root). It
//! uses the parent's handles; the parent only re-exports it.

use std::os::raw::c_int;
use std::path::Path;

use distckpt_sys as sys;

use crate::error::{check, Result};
use crate::progress::{self, Progress, ProgressFn};
use crate::storage::{annotate, raw_or_null, StorageHandle};
use crate::util::{cstring, opt_cstring, path_cstring};
use crate::version::check_abi;

/// Options for [`export_safetensors`] (`dckpt_export_options`).
#[derive(Clone, Debug)]
pub struct ExportOptions {
    /// Largest .safetensors file; 0: 5 GB.
    pub max_shard_bytes: u64,
    /// File name prefix; `None`: "model".
    pub prefix: Option<String>,
    /// Check checksums while reading (default true).
    pub verify: bool,
    /// Where the checkpoint is read from; `None`: the POSIX file system.
    pub storage: Option<StorageHandle>,
    /// Where the safetensors files are written; `None`: the POSIX file system.
    pub out_storage: Option<StorageHandle>,
    /// Rename rules `(pattern, replacement)`, applied by the core (`dckpt_rename_rule`; capi/API.md, "Export to the
    /// Hugging Face hub"): ECMAScript patterns matching the whole name, first match wins, `\1` or `\g<N>` in
    /// replacements, an empty replacement leaves the tensors out. Unmatched names are kept.
    pub rename: Vec<(String, String)>,
    /// Tensor bytes held in memory at once; 0: 64 MiB.
    pub buffer_bytes: u64,
    /// Files written at once; 0: 1.
    pub io_threads: u32,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            max_shard_bytes: 0,
            prefix: None,
            verify: true,
            storage: None,
            out_storage: None,
            rename: Vec::new(),
            buffer_bytes: 0,
            io_threads: 0,
        }
    }
}

/// Writes every tensor of the checkpoint at `ckpt` into `out_dir` as safetensors files
/// (`"<prefix>-00001-of-0000N.safetensors"` plus `"<prefix>.safetensors.index.json"`). `progress` (may be `None`)
/// reports bytes written; returning `false` stops the export (`User` error).
pub fn export_safetensors(
    ckpt: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    opts: &ExportOptions,
    progress: Option<ProgressFn<'_>>,
) -> Result<()> {
    check_abi()?;
    let (cin, cout) = (path_cstring(ckpt.as_ref())?, path_cstring(out_dir.as_ref())?);
    let prefix = opt_cstring(&opts.prefix, "prefix")?;
    let mut raw: sys::dckpt_export_options = unsafe { std::mem::zeroed() };
    check(unsafe { sys::dckpt_export_options_init(&mut raw, sys::DCKPT_EXPORT_OPTIONS_VERSION) })?;
    raw.max_shard_bytes = opts.max_shard_bytes;
    raw.prefix = prefix.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
    raw.verify = opts.verify as c_int;
    raw.storage = raw_or_null(&opts.storage);
    raw.out_storage = raw_or_null(&opts.out_storage);
    let mut strings = Vec::with_capacity(opts.rename.len());
    for (pattern, replacement) in &opts.rename {
        strings.push((cstring(pattern, "rename pattern")?, cstring(replacement, "rename replacement")?));
    }
    let rules: Vec<sys::dckpt_rename_rule> =
        strings.iter().map(|(p, r)| sys::dckpt_rename_rule { pattern: p.as_ptr(), replacement: r.as_ptr() }).collect();
    raw.rename_rules = if rules.is_empty() { std::ptr::null() } else { rules.as_ptr() };
    raw.num_rename_rules = rules.len();
    raw.buffer_bytes = opts.buffer_bytes;
    raw.io_threads = opts.io_threads;
    let progress = progress.map(Progress::new);
    (raw.progress, raw.progress_user_data) = progress::c_pair(&progress);
    let rc = unsafe { sys::dckpt_export_safetensors(cin.as_ptr(), cout.as_ptr(), &raw) };
    progress::finish(progress, check(rc).map_err(|e| annotate(&opts.out_storage, annotate(&opts.storage, e))))
}
