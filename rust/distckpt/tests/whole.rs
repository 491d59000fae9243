//! Whole-checkpoint loads for servers: `map_all` (zero-copy, verified in place) and `read_all` / `read_all_into`
//! (verified copies) deliver exactly what `read_raw` reads, catch damage that plain views do not check, report
//! progress, and fail clearly where they cannot serve.
mod common;

use common::{fixture, TempDir};
use distckpt::{Checkpoint, Dtype, ErrorCode, ReadOptions};
use std::path::{Path, PathBuf};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in std::fs::read_dir(from).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
    }
}

/// Every tensor's bytes as its chunk views show them, laid out row-major (chunks of the fixtures tile by rows or
/// are whole, so placing each chunk's bytes at its box is enough for 1-D and row-split tensors; others are compared
/// chunk by chunk against read_region).
fn check_views_match_reads(ckpt: &Checkpoint) -> usize {
    let mut tensors = 0;
    for e in ckpt.entries().filter(|e| e.is_tensor()) {
        tensors += 1;
        for c in 0..e.num_chunks() {
            let info = ckpt.chunk(&e, c).unwrap();
            let views = ckpt.chunk_views::<u8>(e.name());
            let view: Vec<u8> = match views {
                Ok(v) => v[c].as_slice().to_vec(),
                // A dtype u8 cannot hold: compare through the byte view of a whole single-chunk tensor.
                Err(_) if e.num_chunks() == 1 => ckpt.view_bytes(e.name()).unwrap().as_slice().to_vec(),
                Err(_) => continue,
            };
            if e.num_chunks() == 1 {
                assert_eq!(view, ckpt.read_raw(e.name()).unwrap(), "{}", e.name());
            } else {
                let n: u64 = info.lengths.iter().product();
                assert_eq!(view.len() as u64, n * e.dtype().size() as u64, "{} chunk {c}", e.name());
            }
        }
    }
    tensors
}

fn copy_fixture(tmp: &TempDir, name: &str) -> PathBuf {
    let dir = tmp.join(name);
    copy_dir(&fixture(name), &dir);
    dir
}

#[test]
fn map_all_verifies_and_the_views_show_the_saved_bytes() {
    for name in ["sharded", "mlp", "dtypes"] {
        let ckpt = Checkpoint::open(fixture(name)).unwrap();
        let mut calls = 0u64;
        let mut last = (0u64, 0u64);
        let mut progress = |done: u64, total: u64| {
            calls += 1;
            assert!(done >= last.0 && done <= total);
            last = (done, total);
            true
        };
        ckpt.map_entries(None, Some(&mut progress)).unwrap();
        let total: u64 = ckpt.entries().map(|e| e.nbytes()).sum();
        assert_eq!(last, (total, total), "{name}");
        assert!(calls >= 1);
        let io = ckpt.io_stats();
        assert_eq!(io.bytes_mapped, total, "{name}");
        assert_eq!(io.bytes_verified, total, "{name}");
        assert_eq!(io.bytes_read, 0, "{name}: nothing copied");
        assert!(check_views_match_reads(&ckpt) > 0);
    }
}

#[test]
fn map_all_catches_a_flipped_byte_that_a_plain_view_does_not_check() {
    let tmp = TempDir::new("whole-corrupt");
    let dir = copy_fixture(&tmp, "sharded");
    let (offset, file) = {
        let ckpt = Checkpoint::open(&dir).unwrap();
        let e = ckpt.entry("whole").unwrap();
        let c = ckpt.chunk(&e, 0).unwrap();
        (c.file_offset, c.file.to_string())
    };
    let path = dir.join(&file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[offset as usize + 1234 * 4] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();

    let ckpt = Checkpoint::open(&dir).unwrap();
    let err = ckpt.map_all().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Corrupt);
    let msg = err.to_string();
    assert!(msg.contains("entry 'whole'") && msg.contains(&file) && msg.contains("chunk #0"), "{msg}");
    // The other entries load on their own; view_verified goes through the same in-place check.
    let others: Vec<&str> = ckpt.entries().filter(|e| e.name() != "whole").map(|e| e.name()).collect();
    ckpt.map_entries(Some(&others), None).unwrap();
    assert_eq!(ckpt.view_verified::<f32>("whole").unwrap_err().code(), ErrorCode::Corrupt);
    assert_eq!(ckpt.read_all(None).unwrap_err().code(), ErrorCode::Corrupt);
    // Without verification the same load maps the bytes as they are.
    let unchecked = Checkpoint::open_with(&dir, None, &ReadOptions { verify: false, ..Default::default() }).unwrap();
    unchecked.map_all().unwrap();
    assert_eq!(unchecked.io_stats().bytes_verified, 0);
}

#[test]
fn map_all_without_mappings_is_unsupported_and_read_all_serves_instead() {
    let dir = fixture("mlp");
    let ckpt = Checkpoint::open_with(&dir, None, &ReadOptions { map_files: false, ..Default::default() }).unwrap();
    let err = ckpt.map_all().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported);
    assert!(err.to_string().contains("map_files"), "{err}");
    let all = ckpt.read_all(None).unwrap();
    let reference = Checkpoint::open(&dir).unwrap();
    assert_eq!(all.len(), reference.entries().filter(|e| e.is_tensor()).count());
    for t in &all {
        assert_eq!(t.as_bytes(), &reference.read_raw(t.name()).unwrap()[..], "{}", t.name());
        assert_eq!(t.as_bytes().as_ptr() as usize % 4096, 0, "{}: page-aligned", t.name());
        let e = reference.entry(t.name()).unwrap();
        assert_eq!((t.dtype(), t.shape()), (e.dtype(), e.shape()));
    }
}

#[test]
fn read_all_gives_typed_slices_and_checks_the_type() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    let mut done = 0;
    let mut progress = |d: u64, _t: u64| {
        done = d;
        true
    };
    let all = ckpt.read_all(Some(&mut progress)).unwrap();
    assert!(done > 0);
    let whole = all.iter().find(|t| t.name() == "whole").unwrap();
    assert_eq!(whole.dtype(), Dtype::F32);
    assert_eq!(whole.as_slice::<f32>().unwrap(), &ckpt.read::<f32>("whole").unwrap()[..]);
    assert_eq!(whole.as_slice::<u16>().unwrap_err().code(), ErrorCode::InvalidArgument);
}

#[test]
fn read_all_into_fills_caller_buffers_and_refuses_wrong_sizes() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    let e = ckpt.entry("whole").unwrap();
    let mut buf = vec![0u8; e.nbytes() as usize];
    let stats = ckpt.read_all_into(&mut [("whole", &mut buf[..])], None).unwrap();
    assert!(stats.bytes_delivered >= e.nbytes());
    assert_eq!(buf, ckpt.read_raw("whole").unwrap());

    let mut short = vec![0u8; e.nbytes() as usize - 1];
    let err = ckpt.read_all_into(&mut [("whole", &mut short[..])], None).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("whole"), "{err}");
    let err = ckpt.read_all_into(&mut [("no.such", &mut buf[..])], None).unwrap_err();
    assert_eq!(err.code(), ErrorCode::NotFound);
    // A progress callback that says stop fails the load with a User error.
    let mut stop = |_d: u64, _t: u64| false;
    let err = ckpt.read_all_into(&mut [("whole", &mut buf[..])], Some(&mut stop)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::User);
}

#[test]
fn a_panic_in_the_progress_callback_comes_back_on_the_callers_thread() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut boom = |_d: u64, _t: u64| -> bool { panic!("progress exploded") };
        let _ = ckpt.map_entries(None, Some(&mut boom));
    }));
    let payload = caught.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"progress exploded"));
}
