//! Reads the checkpoints the C++ code wrote (tests/fixtures, tests/golden) and checks every value.
mod common;

use common::{fixture, golden, same_f32};
use distckpt::float::{bf16_to_f32, f16_to_f32, f8_e4m3fn_to_f32, f8_e5m2_to_f32};
use distckpt::{Checkpoint, Dtype, EntryKind, ErrorCode};

#[test]
fn mlp_entries_info_and_user_metadata() {
    let ckpt = Checkpoint::open(fixture("mlp")).unwrap();
    let names: Vec<_> = ckpt.entries().map(|e| (e.name(), e.dtype(), e.shape().to_vec(), e.nbytes())).collect();
    assert_eq!(
        names,
        vec![
            ("config.json", Dtype::U8, vec![46], 46),
            ("fc1.bias", Dtype::F32, vec![64], 256),
            ("fc1.weight", Dtype::F32, vec![64, 32], 8192),
            ("fc2.bias", Dtype::F32, vec![10], 40),
            ("fc2.weight", Dtype::F32, vec![10, 64], 2560),
            ("input", Dtype::F32, vec![32], 128),
            ("reference.output", Dtype::F32, vec![10], 40),
        ]
    );
    let info = ckpt.info();
    assert_eq!((info.format_major, info.num_entries, info.num_files), (1, 7, 1));
    assert!(info.writer.starts_with("distckpt"), "{}", info.writer);
    assert_eq!(ckpt.len(), 7);
    assert_eq!(ckpt.user("step"), Some("1000"));
    assert_eq!(ckpt.user("nope"), None);
    assert_eq!(
        ckpt.user_metadata(),
        vec![("framework", "distckpt-fixtures"), ("model", "mlp-32-64-10"), ("step", "1000")]
    );
    let cfg = ckpt.entry("config.json").unwrap();
    assert_eq!(cfg.kind(), EntryKind::Bytes);
    assert_eq!(ckpt.read_bytes("config.json").unwrap(), br#"{"layers": [32, 64, 10], "activation": "relu"}"#);
    assert!(ckpt.structure().is_empty());
    ckpt.verify().unwrap();
}

#[test]
fn read_checks_the_dtype_and_kind() {
    let ckpt = Checkpoint::open(fixture("mlp")).unwrap();
    let w: Vec<f32> = ckpt.read("fc1.weight").unwrap();
    assert_eq!(w.len(), 64 * 32);
    let err = ckpt.read::<f64>("fc1.weight").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("fc1.weight") && err.message().contains("F32"), "{err}");
    let err = ckpt.read::<u8>("config.json").unwrap_err();
    assert!(err.message().contains("bytes entry"), "{err}");
    let err = ckpt.read::<f32>("missing").unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(err.to_string().contains("missing"), "{err}");
    assert_eq!(err.raw_code(), distckpt::sys::DCKPT_ENOTFOUND);
}

#[test]
fn bf16_and_f16_decode_to_the_values_cpp_wrote() {
    let ckpt = Checkpoint::open(fixture("dtypes")).unwrap();
    for (name, decode) in [("bf16", bf16_to_f32 as fn(u16) -> f32), ("f16", f16_to_f32)] {
        let bits: Vec<u16> = ckpt.read(&format!("{name}.values")).unwrap();
        let want: Vec<f32> = ckpt.read(&format!("{name}.expected")).unwrap();
        assert_eq!(bits.len(), want.len());
        for (i, (b, w)) in bits.iter().zip(&want).enumerate() {
            assert!(same_f32(decode(*b), *w), "{name}[{i}] {b:#06x}: {} != {w}", decode(*b));
        }
        // read_f32 converts by the dtype tag.
        let conv = ckpt.read_f32(&format!("{name}.values")).unwrap();
        assert!(conv.iter().zip(&want).all(|(a, b)| same_f32(*a, *b)));
        // and the zero-copy view carries the tag
        let v = ckpt.view::<u16>(&format!("{name}.values")).unwrap();
        assert_eq!(v.dtype(), if name == "bf16" { Dtype::BF16 } else { Dtype::F16 });
        assert_eq!(&v[..], &bits[..]);
    }
}

#[test]
fn every_float8_code_decodes_to_the_value_cpp_computed() {
    let ckpt = Checkpoint::open(fixture("dtypes")).unwrap();
    for (name, dtype, decode) in
        [("f8_e4m3fn", Dtype::F8E4M3FN, f8_e4m3fn_to_f32 as fn(u8) -> f32), ("f8_e5m2", Dtype::F8E5M2, f8_e5m2_to_f32)]
    {
        let e = ckpt.entry(&format!("{name}.all")).unwrap();
        assert_eq!((e.dtype(), e.shape()), (dtype, &[16u64, 16][..]));
        let codes: Vec<u8> = ckpt.read(&format!("{name}.all")).unwrap();
        let want: Vec<f32> = ckpt.read(&format!("{name}.expected")).unwrap();
        assert_eq!(codes, (0..=255).collect::<Vec<u8>>());
        for c in 0..256 {
            assert!(same_f32(decode(codes[c]), want[c]), "{name} {c:#04x}: {} vs {}", decode(codes[c]), want[c]);
        }
        let view = ckpt.view_bytes(&format!("{name}.all")).unwrap();
        let conv = view.to_f32_vec().unwrap();
        assert!(conv.iter().zip(&want).all(|(a, b)| same_f32(*a, *b)));
    }
}

#[test]
fn integer_types_scalar_empty_complex_and_bytes() {
    let ckpt = Checkpoint::open(fixture("dtypes")).unwrap();
    assert_eq!(ckpt.read::<u8>("bool.values").unwrap(), [1, 0, 0, 1]);
    assert_eq!(ckpt.entry("bool.values").unwrap().dtype(), Dtype::Bool);
    assert_eq!(ckpt.read::<u8>("u8.values").unwrap(), [0, 1, 127, 255]);
    assert_eq!(ckpt.read::<i8>("i8.values").unwrap(), [0, -1, 127, -128]);
    assert_eq!(ckpt.read::<u16>("u16.values").unwrap(), [0, 1000, 65535]);
    assert_eq!(ckpt.read::<i16>("i16.values").unwrap(), [i16::MIN, 0, i16::MAX]);
    assert_eq!(ckpt.read::<u32>("u32.values").unwrap(), [0, 123456789, u32::MAX]);
    assert_eq!(ckpt.read::<i32>("i32.values").unwrap(), [i32::MIN, -7, i32::MAX]);
    assert_eq!(ckpt.read::<u64>("u64.values").unwrap(), [0, u64::MAX]);
    assert_eq!(ckpt.read::<i64>("i64.values").unwrap(), [i64::MIN, 42, i64::MAX]);
    assert_eq!(ckpt.read::<f64>("f64.values").unwrap(), [0.1, -1e300, 2.5]);
    assert_eq!(ckpt.read::<[f32; 2]>("c64.values").unwrap(), [[1.0, -1.0], [0.5, 2.0]]);
    assert!(ckpt.read::<u16>("i16.values").is_err(), "u16 must not read I16");
    assert_eq!(ckpt.read_f32("i16.values").unwrap(), [-32768.0, 0.0, 32767.0]);

    let s = ckpt.entry("scalar.f32").unwrap();
    assert_eq!((s.shape(), s.numel(), s.num_chunks()), (&[][..], 1, 1));
    assert_eq!(ckpt.read::<f32>("scalar.f32").unwrap(), [3.5]);
    assert_eq!(&ckpt.view::<f32>("scalar.f32").unwrap()[..], &[3.5]);

    let e = ckpt.entry("empty.f32").unwrap();
    assert_eq!((e.shape(), e.numel(), e.nbytes()), (&[0u64, 4][..], 0, 0));
    assert!(ckpt.read::<f32>("empty.f32").unwrap().is_empty());
    assert!(ckpt.view::<f32>("empty.f32").unwrap().is_empty());

    assert_eq!(ckpt.read_bytes("notes.txt").unwrap(), b"fixture written by tests/fixtures/make_fixtures.cc\n");
    assert_eq!(ckpt.read_bytes("empty.bytes").unwrap(), b"");
}

#[test]
fn read_region_into_reads_a_box() {
    let ckpt = Checkpoint::open(fixture("dtypes")).unwrap();
    // matrix.i32 is [3, 4] = 0..11; rows 1..3, columns 1..3.
    let mut dst = [0i32; 4];
    ckpt.read_region_into("matrix.i32", &[1, 1], &[2, 2], &mut dst).unwrap();
    assert_eq!(dst, [5, 6, 9, 10]);
    assert_eq!(ckpt.read_region::<i32>("matrix.i32", &[2, 0], &[1, 4]).unwrap(), [8, 9, 10, 11]);
    // Wrong buffer size, rank, out of bounds: errors, nothing written.
    let mut small = [0i32; 3];
    let err = ckpt.read_region_into("matrix.i32", &[0, 0], &[2, 2], &mut small).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(ckpt.read_region_into("matrix.i32", &[0], &[2], &mut small[..2]).is_err());
    let err = ckpt.read_region_into("matrix.i32", &[2, 2], &[2, 2], &mut dst).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
}

#[test]
fn sharded_tensors_read_whole_and_across_chunks() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    let rows = ckpt.entry("sharded.rows").unwrap();
    assert_eq!((rows.num_chunks(), rows.shape()), (4, &[256u64, 64][..]));
    let c1 = ckpt.chunk(&rows, 1).unwrap();
    assert_eq!((c1.offsets, c1.lengths, c1.length), (&[64u64, 0][..], &[64u64, 64][..], 64 * 64 * 4));
    assert_eq!(c1.file_offset % 4096, 0);
    assert_eq!(c1.file, "data-00000.bin");
    let all: Vec<f32> = ckpt.read("sharded.rows").unwrap();
    assert!(all.iter().enumerate().all(|(i, v)| *v == i as f32));
    // A box straddling the row chunks 0/1 and 1/2.
    let region = ckpt.read_region::<f32>("sharded.rows", &[60, 10], &[70, 3]).unwrap();
    for r in 0..70 {
        for c in 0..3 {
            assert_eq!(region[r * 3 + c], ((60 + r) * 64 + 10 + c) as f32);
        }
    }
    // Column chunks: a row of [16, 32] spans both.
    let cols = ckpt.read_region::<f32>("sharded.cols", &[5, 0], &[1, 32]).unwrap();
    assert_eq!(cols, (0..32).map(|c| -((5 * 32 + c) as f32)).collect::<Vec<_>>());
    ckpt.verify().unwrap();
    let whole = ckpt.entry("whole").unwrap();
    ckpt.verify_chunk(&whole, 0).unwrap();
    assert!(ckpt.verify_chunk(&whole, 1).is_err());
    assert_eq!(ckpt.info().checksum_block_size, 4096);
}

/// tests/golden/golden_values.h: the value of byte `byte` of element `element` of tensor `name`.
fn golden_byte(name: &str, element: u64, byte: u64) -> u8 {
    let mut h: u64 = 1469598103934665603;
    for c in name.bytes() {
        h = (h ^ c as u64).wrapping_mul(1099511628211);
    }
    ((h >> 24).wrapping_add(element * 29).wrapping_add(byte * 7).wrapping_add(element >> 7)) as u8
}

#[test]
fn golden_checkpoint_v1_all_dtypes_reads_byte_exact() {
    let path = golden("v1_all_dtypes");
    let ckpt = Checkpoint::open(&path).unwrap();
    let mut tensors = 0;
    for e in ckpt.entries().filter(|e| e.is_tensor()) {
        let bytes = ckpt.read_raw(e.name()).unwrap();
        let size = e.dtype().size() as u64;
        assert_eq!(bytes.len() as u64, e.nbytes());
        for (i, b) in bytes.iter().enumerate() {
            let i = i as u64;
            assert_eq!(*b, golden_byte(e.name(), i / size, i % size), "{} byte {i}", e.name());
        }
        // The same through a view where it is one chunk, and the region reads where it is several.
        if e.num_chunks() == 1 {
            assert_eq!(&ckpt.view_bytes(e.name()).unwrap()[..], &bytes[..]);
        }
        tensors += 1;
    }
    assert!(tensors >= 22, "{tensors} tensors");
    let dtypes: Vec<Dtype> = ckpt.entries().filter(|e| e.name().starts_with("dtypes.")).map(|e| e.dtype()).collect();
    for d in Dtype::ALL {
        assert!(dtypes.contains(&d), "golden has no {d}");
    }
}

#[test]
fn open_errors_name_the_checkpoint() {
    let err = Checkpoint::open("/nonexistent/ckpt").unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    assert!(err.to_string().contains("/nonexistent/ckpt"), "{err}");
    let e: Box<dyn std::error::Error + Send + Sync> = Box::new(err.clone());
    assert!(!e.to_string().is_empty());
    let io: std::io::Error = err.into();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}
