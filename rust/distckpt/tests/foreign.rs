//! Checkpoints other libraries wrote, read in place through the core: the safetensors fixtures of
//! tests/fixtures/safetensors, written by the real `safetensors` package (make_fixtures.py). Every tensor is compared
//! byte for byte with what safetensors itself loads (`expected/<checkpoint>/<tensor>.bin`, listed with dtype and shape
//! in expected.json); nothing here parses a safetensors file. The hub's third shard has an unpadded header, so its
//! multi-byte tensors are not aligned for their type: typed views of those must be errors, never misaligned slices.
mod common;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;

use common::fixture;
use distckpt::json;
use distckpt::{Checkpoint, Dtype, ErrorCode, Format, LoadState, ReadOptions};

fn dir() -> PathBuf {
    fixture("safetensors")
}

/// What expected.json says of one tensor, and the bytes safetensors loaded for it.
struct Expected {
    dtype: String,
    shape: Vec<u64>,
    file: String,
    file_offset: u64,
    aligned: bool,
    bytes: Vec<u8>,
}

/// expected.json's part for `ckpt` ("hub" or "single"), by tensor name.
fn expected(ckpt: &str) -> BTreeMap<String, Expected> {
    let text = std::fs::read(dir().join("expected.json")).unwrap();
    let doc = json::parse(&text).unwrap();
    let mut out = BTreeMap::new();
    for (name, v) in doc[ckpt].as_object().unwrap() {
        let bytes = std::fs::read(dir().join("expected").join(ckpt).join(format!("{name}.bin"))).unwrap();
        assert_eq!(bytes.len() as u64, v["bytes"].as_u64().unwrap(), "{name}: expected/{ckpt}/{name}.bin");
        let shape = v["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
        out.insert(
            name.clone(),
            Expected {
                dtype: v["dtype"].as_str().unwrap().to_string(),
                shape,
                file: v["file"].as_str().unwrap().to_string(),
                file_offset: v["file_offset"].as_u64().unwrap(),
                aligned: v["aligned"].as_bool().unwrap(),
                bytes,
            },
        );
    }
    out
}

/// The three ways to name the hub, and the single file.
fn forms() -> Vec<(PathBuf, &'static str)> {
    vec![
        (dir().join("hub"), "hub"),
        (dir().join("hub/model.safetensors.index.json"), "hub"),
        (dir().join("single.safetensors"), "single"),
    ]
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn i64s(b: &[u8]) -> Vec<i64> {
    b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
}

fn u16s(b: &[u8]) -> Vec<u16> {
    b.chunks_exact(2).map(|c| u16::from_le_bytes(c.try_into().unwrap())).collect()
}

/// The box `[off, off + len)` of a row-major 2-D array of `elem`-byte elements with `cols` columns, as bytes.
fn box2(all: &[u8], elem: usize, cols: usize, off: [usize; 2], len: [usize; 2]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in off[0]..off[0] + len[0] {
        let start = (r * cols + off[1]) * elem;
        out.extend_from_slice(&all[start..start + len[1] * elem]);
    }
    out
}

#[test]
fn every_tensor_of_the_hub_its_index_and_the_single_file_reads_as_safetensors_loads_it() {
    for (path, which) in forms() {
        let want = expected(which);
        let ckpt = Checkpoint::open(&path).unwrap();
        let info = ckpt.info();
        assert_eq!((ckpt.format(), ckpt.checksummed()), (Format::Safetensors, false), "{}", path.display());
        assert_eq!((info.format.as_str(), info.checksummed), ("safetensors", false));
        assert!(info.format.is_foreign());
        assert_eq!(info.num_files, if which == "hub" { 3 } else { 1 }, "{}", path.display());
        let names: Vec<&str> = ckpt.entries().map(|e| e.name()).collect();
        assert_eq!(names, want.keys().map(String::as_str).collect::<Vec<_>>(), "{}", path.display());
        for (name, w) in &want {
            let e = ckpt.entry(name).unwrap();
            assert_eq!(e.dtype(), Dtype::from_name(&w.dtype).unwrap(), "{name}");
            assert_eq!(e.dtype().name(), w.dtype, "{name}");
            assert_eq!(e.shape(), &w.shape[..], "{name}");
            assert_eq!(e.nbytes(), w.bytes.len() as u64, "{name}");
            assert_eq!(ckpt.read_raw(name).unwrap(), w.bytes, "{} {name}", path.display());
            // One chunk per tensor, where the file holds it, with no checksum (the format has none).
            if e.numel() > 0 {
                let c = ckpt.chunk(&e, 0).unwrap();
                assert_eq!((c.file, c.file_offset, c.checksum), (w.file.as_str(), w.file_offset, 0), "{name}");
            }
        }
    }
    // Python's scalar and empty tensors.
    let hub = Checkpoint::open(dir().join("hub")).unwrap();
    assert_eq!(hub.read::<i64>("step").unwrap(), vec![1234]);
    assert!(hub.entry("step").unwrap().shape().is_empty());
    assert_eq!(hub.read::<f32>("empty").unwrap(), Vec::<f32>::new());
    let single = Checkpoint::open(dir().join("single.safetensors")).unwrap();
    assert_eq!(single.read::<f64>("scale").unwrap(), vec![0.5]);
    assert_eq!(single.read::<f32>("matrix").unwrap(), (0..48).map(|i| i as f32).collect::<Vec<_>>());
    // __metadata__ is the user metadata.
    assert_eq!(single.user("format"), Some("np"));
}

#[test]
fn one_shard_opens_on_its_own() {
    let want = expected("hub");
    let shard = "model-00002-of-00003.safetensors";
    let ckpt = Checkpoint::open(dir().join("hub").join(shard)).unwrap();
    let names: Vec<&str> = ckpt.entries().map(|e| e.name()).collect();
    let in_shard: Vec<&str> = want.iter().filter(|(_, w)| w.file == shard).map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, in_shard);
    for n in names {
        assert_eq!(ckpt.read_raw(n).unwrap(), want[n].bytes, "{n}");
    }
    assert_eq!(ckpt.user("format"), Some("np"));
}

#[test]
fn verify_says_the_format_has_no_checksums() {
    for (path, _) in forms() {
        let ckpt = Checkpoint::open(&path).unwrap();
        let err = ckpt.verify().unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unsupported, "{err}");
        let msg = err.message();
        assert!(msg.contains("safetensors") && msg.contains("no checksums"), "{msg}");
        assert!(msg.contains(path.to_str().unwrap()), "names the checkpoint: {msg}");
        // The same from every path that promises verified bytes.
        let err = ckpt.verify_with_progress(&mut |_, _| true).unwrap_err();
        assert_eq!((err.code(), err.message()), (ErrorCode::Unsupported, msg));
        let e = ckpt.entries().find(|e| e.numel() > 0).unwrap();
        assert_eq!(ckpt.verify_chunk(&e, 0).unwrap_err().message(), msg);
        let err = ckpt.view_verified::<u8>(ckpt.entries().find(|e| e.dtype().size() == 1).unwrap().name());
        assert_eq!(err.unwrap_err().message(), msg);
    }
    // A distckpt checkpoint is what it was.
    let mlp = Checkpoint::open(fixture("mlp")).unwrap();
    assert_eq!((mlp.format(), mlp.checksummed()), (Format::Distckpt, true));
    mlp.verify().unwrap();
}

#[test]
fn regions_read_only_their_box_aligned_or_not() {
    let want = expected("hub");
    let hub = Checkpoint::open(dir().join("hub")).unwrap();
    // F32 [16, 8], aligned.
    let w = &want["layers.0.mlp.up.weight"];
    let got = hub.read_region::<f32>("layers.0.mlp.up.weight", &[3, 2], &[4, 3]).unwrap();
    assert_eq!(got, f32s(&box2(&w.bytes, 4, 8, [3, 2], [4, 3])));
    // F32 [10, 3] and I64 [4, 5] in the unpadded shard: not aligned in the file; reads copy, so they work.
    let w = &want["rope.inv_freq"];
    assert!(!w.aligned);
    let got = hub.read_region::<f32>("rope.inv_freq", &[2, 1], &[5, 2]).unwrap();
    assert_eq!(got, f32s(&box2(&w.bytes, 4, 3, [2, 1], [5, 2])));
    let w = &want["token_type_ids"];
    let got = hub.read_region::<i64>("token_type_ids", &[1, 0], &[2, 5]).unwrap();
    assert_eq!(got, i64s(&box2(&w.bytes, 8, 5, [1, 0], [2, 5])));
    // BF16 [6, 4], unaligned, as raw bits.
    let w = &want["rope.bias"];
    let got = hub.read_region::<u16>("rope.bias", &[0, 1], &[6, 2]).unwrap();
    assert_eq!(got, u16s(&box2(&w.bytes, 2, 4, [0, 1], [6, 2])));
    // The single file's "matrix" holds its flat index.
    let single = Checkpoint::open(dir().join("single.safetensors")).unwrap();
    let got = single.read_region::<f32>("matrix", &[4, 5], &[2, 3]).unwrap();
    assert_eq!(got, vec![37.0, 38.0, 39.0, 45.0, 46.0, 47.0]);
    // Outside the shape: the core says so.
    let err = single.read_region::<f32>("matrix", &[5, 0], &[2, 8]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
}

/// The typed view of `name` as `T` where its bytes are aligned for `T`, else the error (checked against expected.json).
fn check_view<T: distckpt::Element + PartialEq + std::fmt::Debug>(
    ckpt: &Checkpoint,
    name: &str,
    w: &Expected,
    decode: impl Fn(&[u8]) -> Vec<T>,
) {
    let typed = decode(&w.bytes);
    match ckpt.view::<T>(name) {
        Ok(v) => {
            assert!(w.aligned, "{name}: a view of a tensor at file offset {} for {}", w.file_offset, w.dtype);
            assert_eq!(v.as_ptr() as usize % std::mem::align_of::<T>(), 0, "{name}");
            assert_eq!(&v[..], &typed[..], "{name}");
            assert!(matches!(ckpt.view_or_read::<T>(name).unwrap(), Cow::Borrowed(_)), "{name}");
        }
        Err(e) => {
            assert!(!w.aligned || w.bytes.is_empty(), "{name}: {e}");
            assert_eq!(e.code(), ErrorCode::Unsupported, "{name}: {e}");
            let msg = e.message();
            let offset = format!("byte {} of file '{}'", w.file_offset, w.file);
            assert!(msg.contains(&offset) && msg.contains("safetensors") && msg.contains("read()"), "{msg}");
            // The same for the other views, and view_or_read copies.
            assert_eq!(ckpt.chunk_views::<T>(name).unwrap_err().message(), msg);
            let zeros = vec![0u64; w.shape.len()];
            assert_eq!(ckpt.view_region::<T>(name, &zeros, &w.shape).unwrap_err().message(), msg);
            match ckpt.view_or_read::<T>(name).unwrap() {
                Cow::Owned(copy) => assert_eq!(copy, typed, "{name}"),
                Cow::Borrowed(_) => panic!("{name}: view_or_read borrowed a misaligned tensor"),
            }
        }
    }
}

#[test]
fn map_all_then_views_where_aligned_and_clear_errors_where_not() {
    let want = expected("hub");
    let hub = Checkpoint::open(dir().join("hub")).unwrap();
    hub.map_all().unwrap(); // pages every file in; nothing to verify
    let before = hub.io_stats();
    for (name, w) in &want {
        // Bytes have no alignment: every tensor has a byte view, the mapped file as it is.
        let bytes = hub.view_bytes(name).unwrap();
        assert_eq!(bytes.as_bytes(), &w.bytes[..], "{name}");
        assert_eq!(bytes.dtype().name(), w.dtype);
        match w.dtype.as_str() {
            "F32" => check_view::<f32>(&hub, name, w, f32s),
            "I64" => check_view::<i64>(&hub, name, w, i64s),
            "BF16" | "F16" => check_view::<u16>(&hub, name, w, u16s),
            "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => check_view::<u8>(&hub, name, w, |b| b.to_vec()),
            other => panic!("{name}: no check for {other}"),
        }
    }
    assert_eq!(hub.io_stats().bytes_read, before.bytes_read, "views read nothing through the library");
    // The fixture has both kinds (make_fixtures.py asserts it too).
    assert!(want.values().any(|w| !w.aligned) && want.values().any(|w| w.aligned && w.dtype == "F32"));
    // F8 in the unaligned shard: one byte per element, so it has a view.
    let f8 = hub.view::<u8>("lm_head.weight").unwrap();
    assert_eq!((f8.dtype(), &f8[..]), (Dtype::F8E4M3FN, &want["lm_head.weight"].bytes[..]));
    assert!(f8.to_f32_vec().unwrap().iter().all(|v| v.is_finite()));
}

#[test]
fn without_mapping_views_are_aligned_copies() {
    let want = expected("hub");
    let opts = ReadOptions { map_files: false, ..ReadOptions::default() };
    let hub = Checkpoint::open_with(dir().join("hub"), None, &opts).unwrap();
    let v = hub.view::<f32>("rope.inv_freq").unwrap();
    assert_eq!(&v[..], &f32s(&want["rope.inv_freq"].bytes)[..]);
    assert_eq!(hub.map_all().unwrap_err().code(), ErrorCode::Unsupported);
}

#[test]
fn read_all_gives_every_tensor() {
    let want = expected("hub");
    let hub = Checkpoint::open(dir().join("hub")).unwrap();
    let loaded = hub.read_all(None).unwrap();
    assert_eq!(loaded.len(), want.len());
    for t in &loaded {
        assert_eq!(t.as_bytes(), &want[t.name()].bytes[..], "{}", t.name());
    }
    let inv = loaded.iter().find(|t| t.name() == "rope.inv_freq").unwrap();
    assert_eq!(inv.as_slice::<f32>().unwrap(), &f32s(&want["rope.inv_freq"].bytes)[..]);
}

#[test]
fn a_resharded_load_of_regions_from_the_hub() {
    let want = expected("hub");
    let up = f32s(&want["layers.0.mlp.up.weight"].bytes);
    let inv = f32s(&want["rope.inv_freq"].bytes);
    let ids = i64s(&want["token_type_ids"].bytes);
    // Row halves of one tensor, a column block of an unaligned one, a corner of another: pieces in one load.
    let (mut top, mut bottom) = (vec![0f32; 8 * 8], vec![0f32; 8 * 8]);
    let mut cols = vec![0f32; 10 * 2];
    let mut corner = vec![0i64; 2 * 2];
    let mut l = LoadState::new().unwrap();
    l.declare_tensor("layers.0.mlp.up.weight", Dtype::F32, &[16, 8]).unwrap();
    l.add_piece("layers.0.mlp.up.weight", &[0, 0], &[8, 8], &mut top).unwrap();
    l.add_piece("layers.0.mlp.up.weight", &[8, 0], &[8, 8], &mut bottom).unwrap();
    l.declare_tensor("rope.inv_freq", Dtype::F32, &[10, 3]).unwrap();
    l.add_piece("rope.inv_freq", &[0, 1], &[10, 2], &mut cols).unwrap();
    l.declare_tensor("token_type_ids", Dtype::I64, &[4, 5]).unwrap();
    l.add_piece("token_type_ids", &[2, 3], &[2, 2], &mut corner).unwrap();
    l.load(dir().join("hub"), &ReadOptions::default()).unwrap();
    drop(l);
    assert_eq!((&top[..], &bottom[..]), (&up[..64], &up[64..]));
    assert_eq!(cols, (0..10).flat_map(|r| [inv[r * 3 + 1], inv[r * 3 + 2]]).collect::<Vec<_>>());
    assert_eq!(corner, vec![ids[13], ids[14], ids[18], ids[19]]);
}

#[cfg(distckpt_has_comm)]
#[test]
fn two_ranks_load_column_halves_of_the_single_file_and_the_hub() {
    let want = expected("hub");
    let ids = i64s(&want["token_type_ids"].bytes);
    let single = dir().join("single.safetensors");
    let hub = dir().join("hub");
    let got = common::ranks(2, move |r, mut comm| {
        let ckpt = Checkpoint::open_with(&single, Some(&mut comm), &ReadOptions::default()).unwrap();
        assert_eq!(ckpt.format(), Format::Safetensors);
        drop(ckpt);
        let r = r as u64;
        let mut matrix = vec![0f32; 6 * 4];
        let mut l = LoadState::new().unwrap();
        l.declare_tensor("matrix", Dtype::F32, &[6, 8]).unwrap();
        l.add_piece("matrix", &[0, 4 * r], &[6, 4], &mut matrix).unwrap();
        l.load_with_comm(&single, &mut comm, &ReadOptions::default()).unwrap();
        drop(l);
        let mut rows = vec![0i64; 2 * 5];
        let mut l = LoadState::new().unwrap();
        l.declare_tensor("token_type_ids", Dtype::I64, &[4, 5]).unwrap();
        l.add_piece("token_type_ids", &[2 * r, 0], &[2, 5], &mut rows).unwrap();
        l.load_with_comm(&hub, &mut comm, &ReadOptions::default()).unwrap();
        drop(l);
        (matrix, rows)
    });
    for (r, (matrix, rows)) in got.iter().enumerate() {
        let want_m: Vec<f32> = (0..6).flat_map(|row| (0..4).map(move |c| (row * 8 + 4 * r + c) as f32)).collect();
        assert_eq!(matrix, &want_m, "rank {r}");
        assert_eq!(rows[..], ids[r * 10..r * 10 + 10], "rank {r}");
    }
}

#[cfg(feature = "half")]
#[test]
fn half_views_of_bf16_and_f16_where_aligned() {
    use half::{bf16, f16};
    let want = expected("hub");
    let hub = Checkpoint::open(dir().join("hub")).unwrap();
    hub.map_all().unwrap();
    let embed = hub.view::<bf16>("embed.weight").unwrap();
    let bits = u16s(&want["embed.weight"].bytes);
    assert_eq!(embed.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), bits);
    for (v, b) in embed.iter().zip(&bits) {
        assert_eq!(v.to_f32().to_bits(), distckpt::float::bf16_to_f32(*b).to_bits());
    }
    let q = hub.view::<f16>("layers.0.attn.q.weight").unwrap();
    assert_eq!(q.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), u16s(&want["layers.0.attn.q.weight"].bytes));
    // rope.bias is BF16 at an odd offset: an error, and view_or_read copies.
    let err = hub.view::<bf16>("rope.bias").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported, "{err}");
    let copy = hub.view_or_read::<bf16>("rope.bias").unwrap();
    assert!(matches!(copy, Cow::Owned(_)));
    assert_eq!(copy.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), u16s(&want["rope.bias"].bytes));
}
