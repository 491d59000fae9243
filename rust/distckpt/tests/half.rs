//! The `half` feature: `half::bf16` and `half::f16` as element types, against the checkpoints C++ wrote
//! (tests/fixtures/dtypes, tests/golden) and against Rust saves of sharded BF16/F16 tensors. Every value is compared
//! bit for bit; the f32 values go through half's own `to_f32`.
mod common;

use std::sync::Arc;

use common::{fixture, golden, same_f32, TempDir};
use distckpt::{Checkpoint, Dtype, ErrorCode, LoadState, ReadOptions, SaveOptions, SaveState};
use half::{bf16, f16};

#[test]
fn dtypes_fixture_reads_and_views_as_half_types_with_the_values_cpp_wrote() {
    let ckpt = Arc::new(Checkpoint::open(fixture("dtypes")).unwrap());

    let bits: Vec<u16> = ckpt.read("bf16.values").unwrap();
    let want: Vec<f32> = ckpt.read("bf16.expected").unwrap();
    let read: Vec<bf16> = ckpt.read("bf16.values").unwrap();
    let view = ckpt.view::<bf16>("bf16.values").unwrap();
    assert_eq!(view.dtype(), Dtype::BF16);
    assert_eq!(read.len(), want.len());
    for (i, w) in want.iter().enumerate() {
        assert_eq!((read[i].to_bits(), view[i].to_bits()), (bits[i], bits[i]), "bf16 [{i}]");
        assert!(same_f32(view[i].to_f32(), *w), "bf16 [{i}] {:#06x}: {} vs {w}", bits[i], view[i].to_f32());
    }
    // Zero-copy: the same mapped memory as the u16 view of the same tensor.
    let raw = ckpt.view::<u16>("bf16.values").unwrap();
    assert_eq!(view.as_ptr().cast::<u16>(), raw.as_ptr());
    assert_eq!(view.as_bytes(), raw.as_bytes());

    let bits: Vec<u16> = ckpt.read("f16.values").unwrap();
    let want: Vec<f32> = ckpt.read("f16.expected").unwrap();
    let owned = ckpt.view_owned::<f16>("f16.values").unwrap();
    let read: Vec<f16> = ckpt.read("f16.values").unwrap();
    let checked = std::thread::spawn(move || {
        owned.iter().zip(&want).zip(&bits).all(|((v, w), b)| v.to_bits() == *b && same_f32(v.to_f32(), *w))
    });
    assert!(checked.join().unwrap(), "f16 view on another thread");
    assert_eq!(read.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), ckpt.read::<u16>("f16.values").unwrap());

    // The crate's own conversions (read_f32) and half's agree on every value C++ wrote.
    for name in ["bf16.values", "f16.values"] {
        let ours = ckpt.read_f32(name).unwrap();
        let theirs: Vec<f32> = match ckpt.entry(name).unwrap().dtype() {
            Dtype::BF16 => ckpt.read::<bf16>(name).unwrap().iter().map(|v| v.to_f32()).collect(),
            _ => ckpt.read::<f16>(name).unwrap().iter().map(|v| v.to_f32()).collect(),
        };
        assert!(ours.iter().zip(&theirs).all(|(a, b)| same_f32(*a, *b)), "{name}: {ours:?} vs {theirs:?}");
    }
}

#[test]
fn each_half_type_holds_only_its_own_dtype() {
    let ckpt = Checkpoint::open(fixture("dtypes")).unwrap();
    for err in [
        ckpt.view::<f16>("bf16.values").unwrap_err(),
        ckpt.read::<bf16>("f16.values").unwrap_err(),
        ckpt.read::<bf16>("u16.values").unwrap_err(),
        ckpt.chunk_views::<f16>("i16.values").unwrap_err(),
    ] {
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
        assert!(err.message().contains("not readable as half::"), "{err}");
    }
}

/// tests/golden/golden_values.h: the value of byte `byte` of element `element` of tensor `name`.
fn golden_byte(name: &str, element: u64, byte: u64) -> u8 {
    let mut h: u64 = 1469598103934665603;
    for c in name.bytes() {
        h = (h ^ c as u64).wrapping_mul(1099511628211);
    }
    ((h >> 24).wrapping_add(element * 29).wrapping_add(byte * 7).wrapping_add(element >> 7)) as u8
}

/// Reads the tensor `e` whole and views each of its chunks as `H`, and compares their bits with `want` (the
/// tensor's values, row-major).
fn check_as<H: distckpt::Element>(ckpt: &Checkpoint, e: &distckpt::Entry<'_>, bits: fn(&H) -> u16, want: &[u16]) {
    let name = e.name();
    let read: Vec<u16> = ckpt.read::<H>(name).unwrap().iter().map(bits).collect();
    assert_eq!(read, want, "{name}");
    // Each chunk view holds the values of its box (row-major within the box).
    for (c, view) in ckpt.chunk_views::<H>(name).unwrap().iter().enumerate() {
        let region = ckpt.read_region::<u16>(name, view.offsets(), view.lengths()).unwrap();
        assert_eq!(view.iter().map(bits).collect::<Vec<_>>(), region, "{name} chunk {c}");
    }
}

#[test]
fn golden_checkpoints_read_byte_exact_as_half_types() {
    let mut seen = 0;
    for dir in ["v1_all_dtypes", "v1_1_all_dtypes"] {
        let ckpt = Checkpoint::open(golden(dir)).unwrap();
        ckpt.map_all().unwrap();
        for e in ckpt.entries().filter(|e| e.is_tensor() && matches!(e.dtype(), Dtype::BF16 | Dtype::F16)) {
            let want: Vec<u16> = (0..e.numel())
                .map(|i| u16::from_le_bytes([golden_byte(e.name(), i, 0), golden_byte(e.name(), i, 1)]))
                .collect();
            match e.dtype() {
                Dtype::BF16 => check_as::<bf16>(&ckpt, &e, |v| v.to_bits(), &want),
                _ => check_as::<f16>(&ckpt, &e, |v| v.to_bits(), &want),
            }
            seen += 1;
        }
    }
    assert!(seen >= 4, "the goldens hold {seen} BF16/F16 tensors");
}

/// A [rows, cols] tensor saved by Rust from half values, in row pieces, and every way of reading it back.
#[test]
fn sharded_bf16_and_f16_saved_from_rust_read_back_bit_exact() {
    let tmp = TempDir::new("half");
    let path = tmp.join("ckpt");
    let (rows, cols) = (96usize, 40usize);
    // Every 16-bit pattern class: normals of both signs, subnormals, zeros, infinities, NaN.
    let bf: Vec<bf16> = (0..rows * cols).map(|i| bf16::from_bits((i as u16).wrapping_mul(40503))).collect();
    let hf: Vec<f16> = (0..rows * cols).map(|i| f16::from_f32(i as f32 * 0.25 - 100.0)).collect();
    let mut state = SaveState::new().unwrap();
    let shape = [rows as u64, cols as u64];
    state.declare_tensor("w.bf16", Dtype::BF16, &shape).unwrap();
    for (k, piece) in bf.chunks(32 * cols).enumerate() {
        state.add_piece("w.bf16", &[(k * 32) as u64, 0], &[(piece.len() / cols) as u64, cols as u64], piece).unwrap();
    }
    state.add_tensor("w.f16", &shape, &hf).unwrap();
    state.save(&path, &SaveOptions { sync: false, ..Default::default() }).unwrap();

    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.entry("w.bf16").unwrap().dtype(), Dtype::BF16);
    assert_eq!(ckpt.entry("w.f16").unwrap().dtype(), Dtype::F16, "add_tensor takes the dtype from the type");
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&ckpt.read::<bf16>("w.bf16").unwrap()), bits(&bf));

    // Zero-copy: each row chunk, and whole rows inside one chunk.
    let views = ckpt.chunk_views::<bf16>("w.bf16").unwrap();
    assert_eq!(views.len(), 3);
    for v in &views {
        let start = v.offsets()[0] as usize * cols;
        assert_eq!(bits(v), bits(&bf[start..start + v.len()]));
        assert_eq!(v.as_ptr() as usize % std::mem::align_of::<bf16>(), 0);
    }
    let rows_40_to_50 = ckpt.view_region::<bf16>("w.bf16", &[40, 0], &[10, cols as u64]).unwrap();
    assert_eq!(bits(&rows_40_to_50), bits(&bf[40 * cols..50 * cols]));
    let err = ckpt.view::<bf16>("w.bf16").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported, "three chunks have no single view: {err}");

    // A region across the chunks, copied.
    let region = ckpt.read_region::<bf16>("w.bf16", &[30, 5], &[4, 3]).unwrap();
    for r in 0..4 {
        for c in 0..3 {
            assert_eq!(region[r * 3 + c].to_bits(), bf[(30 + r) * cols + 5 + c].to_bits());
        }
    }

    // The whole-checkpoint loads: map_all then a view, and read_all's page-aligned buffers.
    ckpt.map_all().unwrap();
    let view = ckpt.view::<f16>("w.f16").unwrap();
    assert!(view.iter().zip(&hf).all(|(a, b)| a.to_bits() == b.to_bits()));
    assert!(view.iter().zip(&hf).all(|(a, b)| a.to_f32() == b.to_f32()));
    for t in ckpt.read_all(None).unwrap() {
        match t.dtype() {
            Dtype::BF16 => assert_eq!(bits(t.as_slice::<bf16>().unwrap()), bits(&bf)),
            _ => assert!(t.as_slice::<f16>().unwrap().iter().zip(&hf).all(|(a, b)| a.to_bits() == b.to_bits())),
        }
    }

    // A load into the caller's half buffers.
    let mut into_bf = vec![bf16::ZERO; rows * cols];
    let mut into_hf = vec![f16::ZERO; rows * cols];
    let mut load = LoadState::new().unwrap();
    load.add_tensor("w.bf16", &shape, &mut into_bf).unwrap();
    load.add_tensor("w.f16", &shape, &mut into_hf).unwrap();
    load.load(&path, &ReadOptions::default()).unwrap();
    drop(load);
    assert_eq!(bits(&into_bf), bits(&bf));
    assert!(into_hf.iter().zip(&hf).all(|(a, b)| a.to_bits() == b.to_bits()));
}
