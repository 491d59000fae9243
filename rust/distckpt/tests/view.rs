//! Zero-copy views: the mapped data is the tensor, nothing is read or copied, and every case without a view fails
//! clearly.
mod common;

use common::{fixture, TempDir};
use distckpt::{Advice, Checkpoint, Dtype, ErrorCode, ReadOptions};
use std::path::Path;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for f in std::fs::read_dir(from).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
    }
}

#[test]
fn view_is_the_mapped_file_and_reads_nothing() {
    let ckpt = Checkpoint::open(fixture("mlp")).unwrap();
    let before = ckpt.io_stats();
    let v = ckpt.view::<f32>("fc1.weight").unwrap();
    assert_eq!((v.name(), v.dtype(), v.shape()), ("fc1.weight", Dtype::F32, &[64u64, 32][..]));
    assert_eq!(v.len(), 64 * 32);
    // Chunks sit on 4 KiB boundaries of a file mapped at a page boundary.
    assert_eq!(v.as_ptr() as usize % 4096, 0, "{v:?}");
    // Every view of the file shares one mapping: same address again, no I/O through the library.
    let again = ckpt.view::<f32>("fc1.weight").unwrap();
    assert_eq!(again.as_ptr(), v.as_ptr());
    let bias = ckpt.view::<f32>("fc1.bias").unwrap();
    let chunk_w = ckpt.chunk(v.entry(), 0).unwrap().file_offset as isize;
    let chunk_b = ckpt.chunk(bias.entry(), 0).unwrap().file_offset as isize;
    assert_eq!(unsafe { bias.as_ptr().cast::<u8>().offset_from(v.as_ptr().cast::<u8>()) }, chunk_b - chunk_w);
    assert_eq!(ckpt.io_stats().bytes_read, before.bytes_read);
    // Same values as a read through the library.
    let read: Vec<f32> = ckpt.read("fc1.weight").unwrap();
    assert_eq!(&v[..], &read[..]);
    assert_eq!(v.as_bytes().len(), 64 * 32 * 4);
    v.advise(Advice::WillNeed).unwrap();
    v.advise(Advice::Sequential).unwrap();
    v.advise(Advice::PopulateRead).unwrap();
    v.advise(Advice::Normal).unwrap();
}

#[test]
fn sharded_tensor_has_no_view_and_says_what_to_do() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    let err = ckpt.view::<f32>("sharded.rows").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported);
    let msg = err.to_string();
    for needle in ["sharded.rows", "4 chunks", "read()", "read_region_into()", "fixtures/sharded"] {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    assert_eq!(ckpt.view_bytes("sharded.cols").unwrap_err().code(), ErrorCode::Unsupported);
    // The single-chunk tensor of the same checkpoint has one (its chunk spans four checksum blocks).
    let whole = ckpt.view::<f32>("whole").unwrap();
    assert!(whole.iter().enumerate().all(|(i, v)| *v == 0.5 * i as f32));
}

#[test]
fn view_checks_dtype_and_kind() {
    let ckpt = Checkpoint::open(fixture("dtypes")).unwrap();
    let err = ckpt.view::<i16>("u16.values").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("U16"), "{err}");
    assert!(ckpt.view::<f32>("bf16.values").is_err());
    assert_eq!(ckpt.view::<u8>("notes.txt").unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(ckpt.view::<f32>("nope").unwrap_err().code(), ErrorCode::NotFound);
    assert_eq!(&ckpt.view::<[f32; 2]>("c64.values").unwrap()[..], &[[1.0, -1.0], [0.5, 2.0]]);
    assert_eq!(&ckpt.view::<i64>("i64.values").unwrap()[..], &[i64::MIN, 42, i64::MAX]);
}

#[test]
fn view_verified_catches_a_flipped_byte_that_view_does_not_check() {
    let tmp = TempDir::new("corrupt");
    let dir = tmp.join("sharded");
    copy_dir(&fixture("sharded"), &dir);
    let (offset, file) = {
        let ckpt = Checkpoint::open(&dir).unwrap();
        ckpt.view_verified::<f32>("whole").unwrap();
        let e = ckpt.entry("whole").unwrap();
        let c = ckpt.chunk(&e, 0).unwrap();
        (c.file_offset, c.file.to_string())
    };
    // Element 1234 (in the second 4 KiB checksum block) becomes 1.0 instead of 617.0.
    let path = dir.join(&file);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = offset as usize + 1234 * 4;
    bytes[at..at + 4].copy_from_slice(&1.0f32.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();

    let ckpt = Checkpoint::open(&dir).unwrap();
    let err = ckpt.view_verified::<f32>("whole").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Corrupt);
    assert!(err.to_string().contains("whole"), "{err}");
    assert_eq!(ckpt.read::<f32>("whole").unwrap_err().code(), ErrorCode::Corrupt);
    assert_eq!(ckpt.view::<f32>("whole").unwrap()[1234], 1.0, "view() maps without checking");
    // With verification off, reads deliver the bytes as they are.
    let unchecked = Checkpoint::open_with(&dir, None, &ReadOptions { verify: false, ..Default::default() }).unwrap();
    assert_eq!(unchecked.read::<f32>("whole").unwrap()[1234], 1.0);
}

#[test]
fn truncated_data_file_is_an_error_not_a_crash() {
    let tmp = TempDir::new("truncated");
    let dir = tmp.join("mlp");
    copy_dir(&fixture("mlp"), &dir);
    let f = std::fs::OpenOptions::new().write(true).open(dir.join("data-00000.bin")).unwrap();
    f.set_len(4096).unwrap();
    drop(f);
    match Checkpoint::open(&dir) {
        Err(e) => assert_eq!(e.code(), ErrorCode::Corrupt, "{e}"),
        Ok(ckpt) => {
            let last =
                ckpt.entries().filter(|e| e.is_tensor()).max_by_key(|e| ckpt.chunk(e, 0).unwrap().file_offset).unwrap();
            let err = ckpt.view::<f32>(last.name()).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Corrupt);
            assert!(err.to_string().contains("truncated") && err.to_string().contains("data-00000.bin"), "{err}");
        }
    }
}

#[test]
fn views_from_many_threads_share_one_checkpoint() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    let want: f64 = (0..4096).map(|i| 0.5 * i as f64).sum();
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..50 {
                    let v = ckpt.view::<f32>("whole").unwrap();
                    assert_eq!(v.iter().map(|x| *x as f64).sum::<f64>(), want);
                    assert_eq!(ckpt.read::<f32>("sharded.rows").unwrap()[300], 300.0);
                }
            });
        }
    });
}

#[test]
fn handles_are_send_and_sync_as_the_c_threading_page_says() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Checkpoint>();
    sync::<Checkpoint>();
    send::<distckpt::TensorView<'static, f32>>();
    sync::<distckpt::TensorView<'static, f32>>();
    send::<distckpt::SaveState<'static>>();
    send::<distckpt::LoadState<'static>>();
    send::<distckpt::Comm>();
    send::<distckpt::SaveFuture<'static>>();
    sync::<distckpt::SaveFuture<'static>>();
    send::<distckpt::Error>();
    sync::<distckpt::Error>();
}

#[test]
fn reads_with_and_without_mapping_agree() {
    let mapped = Checkpoint::open(fixture("mlp")).unwrap();
    let opts = ReadOptions { map_files: false, ..Default::default() };
    let plain = Checkpoint::open_with(fixture("mlp"), None, &opts).unwrap();
    let a: Vec<f32> = mapped.read("fc1.weight").unwrap();
    let b: Vec<f32> = plain.read("fc1.weight").unwrap();
    assert_eq!(a, b);
    let s = plain.io_stats();
    assert_eq!(s.bytes_mapped, 0);
    assert!(s.bytes_read >= (a.len() * 4) as u64, "{s:?}");
    let m = mapped.io_stats();
    assert!(m.bytes_read + m.bytes_mapped >= (a.len() * 4) as u64, "{m:?}");
}
