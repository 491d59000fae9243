//! The loaded library's version, and the ABI check every constructor makes before its first C call (re-exported at
//! the crate root as [`crate::library_version`] and [`crate::check_abi`]).

use std::sync::OnceLock;

use distckpt_sys as sys;

use crate::error::{Error, ErrorCode, Result};

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
