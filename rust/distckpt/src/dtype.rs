//! Element types of the format (FORMAT.md section 8) and the Rust types that hold them.

use std::fmt;

use distckpt_sys as sys;

use crate::error::{Error, ErrorCode, Result};

/// The element type of a tensor. Values and names are those of `distckpt.h` and the format; names match
/// safetensors' dtype strings. `F16`, `BF16` and the two float8 formats have no Rust type: they are held as raw
/// `u16`/`u8` bits (see [`Element`]) and converted with the functions of the `float` module (which builds on this
/// one, not the reverse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dtype {
    Bool,
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
    F16,
    BF16,
    F32,
    F64,
    /// Complex: real F32, then imaginary F32.
    C64,
    /// Complex: real F64, then imaginary F64.
    C128,
    /// float8 e4m3fn: no infinities, NaN = S.1111.111.
    F8E4M3FN,
    /// float8 e5m2.
    F8E5M2,
    /// A dtype newer than this crate (the raw value).
    Unknown(i32),
}

impl Dtype {
    /// Every dtype this crate knows, in value order.
    pub const ALL: [Dtype; 17] = [
        Dtype::Bool,
        Dtype::U8,
        Dtype::I8,
        Dtype::U16,
        Dtype::I16,
        Dtype::U32,
        Dtype::I32,
        Dtype::U64,
        Dtype::I64,
        Dtype::F16,
        Dtype::BF16,
        Dtype::F32,
        Dtype::F64,
        Dtype::C64,
        Dtype::C128,
        Dtype::F8E4M3FN,
        Dtype::F8E5M2,
    ];

    pub fn from_raw(v: i32) -> Dtype {
        match v {
            1..=17 => Dtype::ALL[(v - 1) as usize],
            other => Dtype::Unknown(other),
        }
    }

    /// The C value (`DCKPT_DTYPE_*`).
    pub fn raw(self) -> i32 {
        match self {
            Dtype::Unknown(v) => v,
            known => Dtype::ALL.iter().position(|d| *d == known).unwrap() as i32 + 1,
        }
    }

    /// Bytes per element; 0 for an unknown dtype.
    pub const fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E4M3FN | Dtype::F8E5M2 => 1,
            Dtype::U16 | Dtype::I16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::U64 | Dtype::I64 | Dtype::F64 | Dtype::C64 => 8,
            Dtype::C128 => 16,
            Dtype::Unknown(_) => 0,
        }
    }

    /// The canonical (safetensors) name: "F32", "BF16", "F8_E4M3", ...
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::U16 => "U16",
            Dtype::I16 => "I16",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::U64 => "U64",
            Dtype::I64 => "I64",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::C64 => "C64",
            Dtype::C128 => "C128",
            Dtype::F8E4M3FN => "F8_E4M3",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::Unknown(_) => "UNKNOWN",
        }
    }

    /// Parses a canonical or numpy-style name ("F32", "float32", "bfloat16"), through the C library.
    pub fn from_name(name: &str) -> Option<Dtype> {
        let c = std::ffi::CString::new(name).ok()?;
        let mut out = 0;
        let rc = unsafe { sys::dckpt_dtype_from_name(&mut out, c.as_ptr()) };
        (rc == sys::DCKPT_OK).then(|| Dtype::from_raw(out))
    }

    /// F16, BF16, F32, F64 and the float8 formats.
    pub const fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64 | Dtype::F8E4M3FN | Dtype::F8E5M2)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dtype::Unknown(v) => write!(f, "UNKNOWN({v})"),
            d => f.write_str(d.name()),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust type that tensor data can be read into or viewed as: plain old data, valid for every bit pattern, with
/// the size of its dtype. `u16` also holds the raw bits of `F16` and `BF16`, and `u8` those of `BOOL` and the two
/// float8 formats; the entry's dtype tag says which (convert with the `float` module). Complex numbers are `[f32; 2]`
/// and `[f64; 2]` (real, imaginary). With the `half` feature, `half::bf16` holds `BF16` and `half::f16` holds `F16`
/// (each only its own dtype: a BF16 tensor is not readable as `half::f16`).
///
/// Sealed: the zero-copy views reinterpret mapped bytes as `Self`, which is sound only for the types listed here.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The dtype a tensor of this type is saved as.
    const DTYPE: Dtype;
    /// Whether data of dtype `d` is stored exactly as values of this type.
    fn holds(d: Dtype) -> bool {
        d == Self::DTYPE
    }
}

macro_rules! element {
    ($t:ty, $d:expr $(, $also:pat)?) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: Dtype = $d;
            fn holds(d: Dtype) -> bool {
                d == $d $(|| matches!(d, $also))?
            }
        }
    };
}

element!(u8, Dtype::U8, Dtype::Bool | Dtype::F8E4M3FN | Dtype::F8E5M2);
element!(i8, Dtype::I8);
element!(u16, Dtype::U16, Dtype::F16 | Dtype::BF16);
element!(i16, Dtype::I16);
element!(u32, Dtype::U32);
element!(i32, Dtype::I32);
element!(u64, Dtype::U64);
element!(i64, Dtype::I64);
element!(f32, Dtype::F32);
element!(f64, Dtype::F64);
element!([f32; 2], Dtype::C64);
element!([f64; 2], Dtype::C128);
// `#[repr(transparent)]` over `u16` in half, so plain old data like `u16`, valid for every bit pattern.
#[cfg(feature = "half")]
element!(half::bf16, Dtype::BF16);
#[cfg(feature = "half")]
element!(half::f16, Dtype::F16);

// Each element type has exactly the size of the dtype it holds.
const _: () = {
    assert!(std::mem::size_of::<[f32; 2]>() == Dtype::C64.size());
    assert!(std::mem::size_of::<[f64; 2]>() == Dtype::C128.size());
    assert!(std::mem::size_of::<u16>() == Dtype::BF16.size());
};
#[cfg(feature = "half")]
const _: () = {
    assert!(std::mem::size_of::<half::bf16>() == Dtype::BF16.size());
    assert!(std::mem::align_of::<half::bf16>() == std::mem::align_of::<u16>());
    assert!(std::mem::size_of::<half::f16>() == Dtype::F16.size());
    assert!(std::mem::align_of::<half::f16>() == std::mem::align_of::<u16>());
};

/// What every tensor operation checks before it touches memory: that `T` holds `dtype`.
pub(crate) fn check_element<T: Element>(dtype: Dtype, what: impl FnOnce() -> String) -> Result<()> {
    if T::holds(dtype) && std::mem::size_of::<T>() == dtype.size() {
        Ok(())
    } else {
        Err(Error::new(
            ErrorCode::InvalidArgument,
            format!(
                "{}: stored as {dtype}, not readable as {} (which holds {}); read it as the matching type, or use read_f32()",
                what(),
                std::any::type_name::<T>(),
                T::DTYPE
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn dtype_table_matches_the_library() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::from_raw(d.raw()), d);
            assert_eq!(unsafe { sys::dckpt_dtype_size(d.raw()) }, d.size(), "{d}");
            let name = unsafe { CStr::from_ptr(sys::dckpt_dtype_name(d.raw())) }.to_str().unwrap();
            assert_eq!(name, d.name());
            assert_eq!(Dtype::from_name(name), Some(d));
        }
        assert_eq!(Dtype::from_raw(99), Dtype::Unknown(99));
        assert_eq!(Dtype::Unknown(99).size(), 0);
        assert_eq!(Dtype::from_name("float32"), Some(Dtype::F32));
        assert_eq!(Dtype::from_name("no-such-type"), None);
    }

    #[test]
    fn elements_hold_their_raw_dtypes() {
        assert!(u16::holds(Dtype::BF16) && u16::holds(Dtype::F16) && u16::holds(Dtype::U16));
        assert!(!u16::holds(Dtype::I16) && !f32::holds(Dtype::BF16) && !i8::holds(Dtype::U8));
        assert!(u8::holds(Dtype::F8E4M3FN) && u8::holds(Dtype::Bool));
        assert!(check_element::<f32>(Dtype::F64, || "x".into()).is_err());
    }

    #[cfg(feature = "half")]
    #[test]
    fn half_types_hold_only_their_own_dtype() {
        assert_eq!((half::bf16::DTYPE, half::f16::DTYPE), (Dtype::BF16, Dtype::F16));
        assert!(half::bf16::holds(Dtype::BF16) && !half::bf16::holds(Dtype::F16) && !half::bf16::holds(Dtype::U16));
        assert!(half::f16::holds(Dtype::F16) && !half::f16::holds(Dtype::BF16) && !half::f16::holds(Dtype::I16));
        let err = check_element::<half::f16>(Dtype::BF16, || "tensor 'w'".into()).unwrap_err();
        assert!(err.message().contains("stored as BF16") && err.message().contains("half"), "{err}");
    }
}
