//! Conversions between `f32` and the float formats Rust's std lacks: IEEE binary16 (`F16`), bfloat16 (`BF16`),
//! float8 e4m3fn (`F8_E4M3`) and float8 e5m2 (`F8_E5M2`). Values are held as raw `u16`/`u8` bits.
//!
//! Decoding is exact (every value of these formats is an `f32`). Encoding rounds to nearest, ties to even, the
//! same as ml_dtypes and PyTorch: too-large values become infinity (F16, BF16, F8_E5M2) or NaN (F8_E4M3, which has
//! no infinity); NaN stays NaN (sign kept).
//!
//! With the `half` feature, `half::bf16` and `half::f16` are element types of their own (see [`crate::Element`]),
//! and their `to_f32`/`from_f32` are half's. The functions here stay the crate's one implementation whatever the
//! features, so that no result of this crate changes when some crate in the build turns `half` on: they agree with
//! half on every F16 and BF16 code and every `f32` but NaNs, whose bits half changes (it sets the quiet bit when it
//! decodes, and keeps payload bits when it encodes, where these functions decode bit-exactly and encode the one
//! canonical NaN). The tests below check that agreement; half has no float8 formats.

use crate::dtype::Dtype;
use crate::error::{Error, ErrorCode, Result};

const TWO_POW_112: f32 = f32::from_bits(0x7780_0000); // rebiases binary16 exponents (15) to binary32 (127)
const TWO_POW_120: f32 = f32::from_bits(0x7B80_0000); // rebiases e4m3 exponents (7) to binary32

/// bfloat16 bits to `f32` (bfloat16 is the upper half of a binary32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// IEEE 754 binary16 bits to `f32`.
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    let sign = ((bits & 0x8000) as u32) << 16;
    let mag = ((bits & 0x7fff) as u32) << 13; // exponent and mantissa moved into binary32 position
    let v = if bits & 0x7c00 == 0x7c00 {
        f32::from_bits(mag | 0x7f80_0000) // infinity or NaN (payload kept)
    } else {
        // The shifted bits read as binary32 are the value times 2^-112, subnormals included: one exact multiply.
        f32::from_bits(mag) * TWO_POW_112
    };
    f32::from_bits(v.to_bits() | sign)
}

/// float8 e4m3fn bits to `f32` (bias 7, no infinities, S.1111.111 is NaN).
#[inline]
pub fn f8_e4m3fn_to_f32(bits: u8) -> f32 {
    let sign = ((bits & 0x80) as u32) << 24;
    if bits & 0x7f == 0x7f {
        return f32::from_bits(sign | 0x7fc0_0000);
    }
    let v = f32::from_bits(((bits & 0x7f) as u32) << 20) * TWO_POW_120;
    f32::from_bits(v.to_bits() | sign)
}

/// float8 e5m2 bits to `f32` (the upper byte of a binary16).
#[inline]
pub fn f8_e5m2_to_f32(bits: u8) -> f32 {
    f16_to_f32((bits as u16) << 8)
}

/// Rounds a finite or non-finite `f32` to a small float format with `ebits` exponent bits and `mbits` mantissa
/// bits (IEEE-style bias), ties to even. Returns the bits without the sign. `ieee_inf`: the top exponent encodes
/// infinity/NaN (binary16, bfloat16, e5m2); otherwise only all-ones is NaN and there is no infinity (e4m3fn).
#[inline]
fn encode_small(x: f32, ebits: u32, mbits: u32, ieee_inf: bool) -> (u32, u32) {
    let b = x.to_bits();
    let sign = b >> 31;
    let abs = b & 0x7fff_ffff;
    let all_ones = (1u32 << (ebits + mbits)) - 1;
    let inf = ((1u32 << ebits) - 1) << mbits;
    let nan = if ieee_inf { inf | (1 << (mbits - 1)) } else { all_ones };
    let max_finite = if ieee_inf { inf - 1 } else { all_ones - 1 };
    if abs > 0x7f80_0000 {
        return (sign, nan);
    }
    if abs == 0x7f80_0000 {
        return (sign, if ieee_inf { inf } else { nan });
    }
    if abs == 0 {
        return (sign, 0);
    }
    // x = sig * 2^e exactly, sig with its implicit bit.
    let fexp = (abs >> 23) as i32;
    let (sig, e) = if fexp == 0 { (abs & 0x7f_ffff, -149) } else { ((abs & 0x7f_ffff) | 0x80_0000, fexp - 150) };
    let top = e + 31 - sig.leading_zeros() as i32; // floor(log2 |x|)
    let bias = (1i32 << (ebits - 1)) - 1;
    let emin = 1 - bias;
    // The target's spacing around x is 2^q_exp (fixed at the subnormal spacing below emin).
    let q_exp = top.max(emin) - mbits as i32;
    let shift = (q_exp - e) as u32; // > 0: f32 always has more precision than the target here
    let q = if shift >= 32 {
        0 // |x| < half the smallest subnormal
    } else {
        let q = sig >> shift;
        let rem = sig & ((1u32 << shift) - 1);
        let half = 1u32 << (shift - 1);
        if rem > half || (rem == half && q & 1 == 1) {
            q + 1
        } else {
            q
        }
    };
    // Subnormals have q < 2^mbits and exponent field 0; normals carry (top - emin) into the exponent field, and a
    // rounding carry of q into 2^(mbits+1) lands on the next binade by itself.
    let code = (((q_exp + mbits as i32 - emin) as u32) << mbits) + q;
    if code > max_finite {
        return (sign, if ieee_inf { inf } else { nan });
    }
    (sign, code)
}

/// `f32` to bfloat16 bits, rounding to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let (s, c) = encode_small(x, 8, 7, true);
    ((s << 15) | c) as u16
}

/// `f32` to IEEE binary16 bits, rounding to nearest even; overflow gives infinity.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    let (s, c) = encode_small(x, 5, 10, true);
    ((s << 15) | c) as u16
}

/// `f32` to float8 e4m3fn bits, rounding to nearest even; overflow (|x| > 464) and infinities give NaN.
#[inline]
pub fn f32_to_f8_e4m3fn(x: f32) -> u8 {
    let (s, c) = encode_small(x, 4, 3, false);
    ((s << 7) | c) as u8
}

/// `f32` to float8 e5m2 bits, rounding to nearest even; overflow gives infinity.
#[inline]
pub fn f32_to_f8_e5m2(x: f32) -> u8 {
    let (s, c) = encode_small(x, 5, 2, true);
    ((s << 7) | c) as u8
}

/// Converts little-endian tensor bytes of any real dtype (floats, integers, bool) to `f32` values, appending to
/// `out`. Integers and F64 round to the nearest `f32`. Complex dtypes are refused.
pub fn extend_f32(dtype: Dtype, bytes: &[u8], out: &mut Vec<f32>) -> Result<()> {
    let size = dtype.size();
    if size == 0 || bytes.len() % size != 0 {
        return Err(Error::new(
            ErrorCode::InvalidArgument,
            format!("{} bytes are not a whole number of {dtype} elements", bytes.len()),
        ));
    }
    out.reserve(bytes.len() / size);
    macro_rules! each {
        ($n:literal, |$a:ident| $e:expr) => {
            out.extend(bytes.chunks_exact($n).map(|c| {
                let $a: [u8; $n] = c.try_into().unwrap();
                $e
            }))
        };
    }
    match dtype {
        Dtype::F32 => each!(4, |a| f32::from_le_bytes(a)),
        Dtype::F64 => each!(8, |a| f64::from_le_bytes(a) as f32),
        Dtype::BF16 => each!(2, |a| bf16_to_f32(u16::from_le_bytes(a))),
        Dtype::F16 => each!(2, |a| f16_to_f32(u16::from_le_bytes(a))),
        Dtype::F8E4M3FN => {
            let table = e4m3_table();
            out.extend(bytes.iter().map(|&b| table[b as usize]))
        }
        Dtype::F8E5M2 => out.extend(bytes.iter().map(|&b| f8_e5m2_to_f32(b))),
        Dtype::Bool => out.extend(bytes.iter().map(|&b| if b != 0 { 1.0 } else { 0.0 })),
        Dtype::U8 => out.extend(bytes.iter().map(|&b| b as f32)),
        Dtype::I8 => out.extend(bytes.iter().map(|&b| b as i8 as f32)),
        Dtype::U16 => each!(2, |a| u16::from_le_bytes(a) as f32),
        Dtype::I16 => each!(2, |a| i16::from_le_bytes(a) as f32),
        Dtype::U32 => each!(4, |a| u32::from_le_bytes(a) as f32),
        Dtype::I32 => each!(4, |a| i32::from_le_bytes(a) as f32),
        Dtype::U64 => each!(8, |a| u64::from_le_bytes(a) as f32),
        Dtype::I64 => each!(8, |a| i64::from_le_bytes(a) as f32),
        Dtype::C64 | Dtype::C128 | Dtype::Unknown(_) => {
            return Err(Error::new(ErrorCode::InvalidArgument, format!("{dtype} has no f32 conversion")))
        }
    }
    Ok(())
}

/// [`extend_f32`] into a new vector.
pub fn to_f32_vec(dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    extend_f32(dtype, bytes, &mut out)?;
    Ok(out)
}

fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|i| f8_e4m3fn_to_f32(i as u8)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An independent decoder: sign * mantissa * 2^exponent in f64, from the format's definition.
    fn reference(bits: u32, ebits: u32, mbits: u32, ieee_inf: bool) -> f64 {
        let sign = if bits >> (ebits + mbits) & 1 == 1 { -1.0 } else { 1.0 };
        let exp = (bits >> mbits) & ((1 << ebits) - 1);
        let man = bits & ((1 << mbits) - 1);
        let bias = (1i32 << (ebits - 1)) - 1;
        let top = (1 << ebits) - 1;
        if ieee_inf && exp == top {
            return if man == 0 { sign * f64::INFINITY } else { f64::NAN };
        }
        if !ieee_inf && exp == top && man == (1 << mbits) - 1 {
            return f64::NAN;
        }
        let (m, e) = if exp == 0 { (man as f64, 1 - bias) } else { ((man | 1 << mbits) as f64, exp as i32 - bias) };
        sign * m * 2f64.powi(e - mbits as i32)
    }

    fn same(a: f32, b: f64) -> bool {
        (a.is_nan() && b.is_nan()) || (a as f64 == b && a.is_sign_negative() == b.is_sign_negative())
    }

    type Dec = fn(u32) -> f32;
    type Enc = fn(f32) -> u32;
    const FORMATS: [(&str, u32, u32, bool, Dec, Enc); 4] = [
        ("f16", 5, 10, true, |b| f16_to_f32(b as u16), |x| f32_to_f16(x) as u32),
        ("bf16", 8, 7, true, |b| bf16_to_f32(b as u16), |x| f32_to_bf16(x) as u32),
        ("e4m3fn", 4, 3, false, |b| f8_e4m3fn_to_f32(b as u8), |x| f32_to_f8_e4m3fn(x) as u32),
        ("e5m2", 5, 2, true, |b| f8_e5m2_to_f32(b as u8), |x| f32_to_f8_e5m2(x) as u32),
    ];

    #[test]
    fn decoders_match_the_definition_for_every_code() {
        for (name, e, m, inf, dec, _) in FORMATS {
            for bits in 0..1u32 << (1 + e + m) {
                let want = reference(bits, e, m, inf);
                assert!(same(dec(bits), want), "{name} {bits:#x}: {} vs {want}", dec(bits));
            }
        }
    }

    #[test]
    fn encoders_round_trip_every_code() {
        for (name, e, m, _, dec, enc) in FORMATS {
            for bits in 0..1u32 << (1 + e + m) {
                let v = dec(bits);
                if v.is_nan() {
                    assert!(dec(enc(v)).is_nan(), "{name} NaN {bits:#x}");
                } else {
                    assert_eq!(enc(v), bits, "{name} {bits:#x} = {v}");
                }
            }
        }
    }

    #[test]
    fn encoders_round_to_nearest_even() {
        for (name, e, m, _, dec, enc) in FORMATS {
            let n = 1u32 << (e + m);
            for bits in 0..n - 1 {
                let (lo, hi) = (dec(bits), dec(bits + 1));
                if !lo.is_finite() || !hi.is_finite() {
                    continue;
                }
                let mid = ((lo as f64 + hi as f64) / 2.0) as f32; // exact: f32 has the bits to spare
                assert_eq!(mid as f64, (lo as f64 + hi as f64) / 2.0);
                let even = if bits & 1 == 0 { bits } else { bits + 1 };
                assert_eq!(enc(mid), even, "{name}: tie between {lo} and {hi}");
                assert_eq!(enc(f32::from_bits(mid.to_bits() - 1)), bits, "{name}: just below the tie {lo}..{hi}");
                assert_eq!(enc(f32::from_bits(mid.to_bits() + 1)), bits + 1, "{name}: just above the tie {lo}..{hi}");
                assert_eq!(enc(-mid), even | n, "{name}: negative tie");
            }
        }
    }

    #[test]
    fn overflow_and_specials() {
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.99), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00); // the tie with the next (missing) binade rounds to infinity
        assert_eq!(f32_to_f16(-1e10), 0xfc00);
        assert_eq!(f32_to_f16(f32::NAN) & 0x7e00, 0x7e00);
        assert_eq!(f32_to_f16(1e-10), 0);
        assert_eq!(f32_to_f16(-1e-10), 0x8000);
        assert_eq!(f32_to_f16(f32::from_bits(1)), 0); // an f32 subnormal
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80); // rounds up past the largest bf16
        assert_eq!(f32_to_bf16(f32::from_bits(1)), 0);
        assert_eq!(f32_to_bf16(f32::from_bits(0x0001_8000)), 2); // 1.5 ulp of bf16's smallest subnormal: tie to 2
        assert_eq!(f32_to_f8_e4m3fn(448.0), 0x7e);
        assert_eq!(f32_to_f8_e4m3fn(463.99), 0x7e);
        assert_eq!(f32_to_f8_e4m3fn(464.0), 0x7e); // the tie with 480 (odd, and NaN's code) goes to even 448
        assert_eq!(f32_to_f8_e4m3fn(464.01), 0x7f); // no infinity: NaN
        assert_eq!(f32_to_f8_e4m3fn(f32::INFINITY), 0x7f);
        assert_eq!(f32_to_f8_e4m3fn(f32::NEG_INFINITY), 0xff);
        assert_eq!(f8_e4m3fn_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(f8_e4m3fn_to_f32(0x38), 1.0);
        assert_eq!(f32_to_f8_e5m2(57344.0), 0x7b);
        assert_eq!(f32_to_f8_e5m2(61440.0), 0x7c);
        assert_eq!(f8_e5m2_to_f32(0x01), 2f32.powi(-16));
        assert!(f8_e5m2_to_f32(0x7d).is_nan());
    }

    /// The `f32` bit patterns the half cross-checks encode: every value of the top 16 bits (sign, exponent, the
    /// mantissa bits that F16 and BF16 keep) with low halves at and around every rounding boundary of both formats.
    #[cfg(feature = "half")]
    fn encoding_probes() -> impl Iterator<Item = f32> {
        const LOW: [u32; 14] =
            [0, 1, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xffff];
        (0..=0xffffu32).flat_map(|hi| LOW.iter().map(move |lo| f32::from_bits(hi << 16 | lo)))
    }

    /// Every BF16 and F16 code decodes as half decodes it; every probe encodes as half encodes it. NaNs only have to
    /// stay NaNs of the same sign (see the module's documentation).
    #[cfg(feature = "half")]
    #[test]
    fn bf16_and_f16_agree_with_the_half_crate() {
        for bits in 0..=u16::MAX {
            for (name, ours, theirs) in [
                ("bf16", bf16_to_f32(bits), half::bf16::from_bits(bits).to_f32()),
                ("f16", f16_to_f32(bits), half::f16::from_bits(bits).to_f32()),
            ] {
                if theirs.is_nan() {
                    assert!(
                        ours.is_nan() && ours.is_sign_negative() == theirs.is_sign_negative(),
                        "{name} {bits:#06x}"
                    );
                } else {
                    assert_eq!(ours.to_bits(), theirs.to_bits(), "{name} {bits:#06x}: {ours} vs half's {theirs}");
                }
            }
        }
        let mut probes = 0;
        for x in encoding_probes() {
            for (name, ours, theirs) in [
                ("bf16", f32_to_bf16(x), half::bf16::from_f32(x).to_bits()),
                ("f16", f32_to_f16(x), half::f16::from_f32(x).to_bits()),
            ] {
                if x.is_nan() {
                    let nan = if name == "bf16" {
                        half::bf16::from_bits(ours).is_nan()
                    } else {
                        half::f16::from_bits(ours).is_nan()
                    };
                    assert!(nan && ours >> 15 == theirs >> 15, "{name} of NaN {:#010x}: {ours:#06x}", x.to_bits());
                } else {
                    assert_eq!(
                        ours,
                        theirs,
                        "{name} of {x:e} ({:#010x}): {ours:#06x} vs half's {theirs:#06x}",
                        x.to_bits()
                    );
                }
            }
            probes += 1;
        }
        assert_eq!(probes, 65536 * 14);
    }

    /// The same agreement over all 2^32 `f32` values: about two minutes in a release build on a busy 2-core machine,
    /// far longer in a debug one, so not part of the suite (it passed with half 1.6.0):
    /// `cargo test --release --features half -p distckpt --lib -- --ignored every_f32`.
    #[cfg(feature = "half")]
    #[test]
    #[ignore]
    fn every_f32_encodes_as_half_encodes_it() {
        for b in 0..=u32::MAX {
            let x = f32::from_bits(b);
            if x.is_nan() {
                continue;
            }
            assert_eq!(f32_to_bf16(x), half::bf16::from_f32(x).to_bits(), "bf16 of {b:#010x}");
            assert_eq!(f32_to_f16(x), half::f16::from_f32(x).to_bits(), "f16 of {b:#010x}");
        }
    }

    #[test]
    fn bulk_conversion() {
        let bytes: Vec<u8> = [0x3c00u16, 0xc000].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(to_f32_vec(Dtype::F16, &bytes).unwrap(), vec![1.0, -2.0]);
        assert_eq!(to_f32_vec(Dtype::BF16, &bytes).unwrap()[0], bf16_to_f32(0x3c00));
        assert_eq!(to_f32_vec(Dtype::I16, &bytes).unwrap(), vec![15360.0, -16384.0]);
        assert_eq!(to_f32_vec(Dtype::F8E4M3FN, &[0x38, 0xb8]).unwrap(), vec![1.0, -1.0]);
        assert!(to_f32_vec(Dtype::C64, &[0; 8]).is_err());
        assert!(to_f32_vec(Dtype::F32, &[0; 3]).is_err());
    }
}
