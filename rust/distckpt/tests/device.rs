//! Reads into device memory through `read_region_into_device`, with the library's host copy engine standing in for
//! CUDA (`DCKPT_TEST_CUDA_ON_HOST=1`, set before this process's first device call): the "device" buffers are host
//! memory, so everything but the copy itself (pinned staging, host verification, strided copies) is what a GPU
//! machine runs.
mod common;

use std::sync::Once;

use common::TempDir;
use distckpt::{Checkpoint, DeviceBuffer, ErrorCode, ReadOptions, SaveOptions, SaveState};

fn emulate() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| std::env::set_var("DCKPT_TEST_CUDA_ON_HOST", "1"));
}

const ROWS: u64 = 40;
const COLS: u64 = 24;

fn value(r: u64, c: u64) -> f32 {
    (r * 1000 + c) as f32
}

/// A [ROWS, COLS] f32 tensor saved in 4 row blocks (as 4 ranks would have), 4 KiB checksum blocks.
fn saved(tmp: &TempDir) -> std::path::PathBuf {
    let path = tmp.join("ckpt");
    let m: Vec<f32> = (0..ROWS * COLS).map(|i| value(i / COLS, i % COLS)).collect();
    let mut s = SaveState::new().unwrap();
    s.declare_tensor("m", distckpt::Dtype::F32, &[ROWS, COLS]).unwrap();
    for b in 0..4u64 {
        let rows = &m[(b * 10 * COLS) as usize..((b + 1) * 10 * COLS) as usize];
        s.add_piece("m", &[b * 10, 0], &[10, COLS], rows).unwrap();
    }
    s.save(&path, &SaveOptions { sync: false, checksum_block_size: 4096, ..Default::default() }).unwrap();
    path
}

fn device(buf: &mut [f32]) -> DeviceBuffer {
    DeviceBuffer {
        ptr: buf.as_mut_ptr() as u64,
        len: std::mem::size_of_val(buf) as u64,
        device: 0,
        stream: std::ptr::null_mut(),
    }
}

#[test]
fn a_strided_region_lands_in_device_memory() {
    emulate();
    let tmp = TempDir::new("device-region");
    let ckpt = Checkpoint::open_with(
        saved(&tmp),
        None,
        &ReadOptions { staging_buffer_bytes: 4096, staging_buffers: 2, ..Default::default() },
    )
    .unwrap();
    // Rows 5..35 (across all four saved blocks), columns 3..17: every row is a run of its own.
    let mut dst = vec![-1f32; 30 * 14];
    unsafe { ckpt.read_region_into_device("m", &[5, 3], &[30, 14], device(&mut dst)).unwrap() };
    for r in 0..30u64 {
        for c in 0..14u64 {
            assert_eq!(dst[(r * 14 + c) as usize], value(5 + r, 3 + c), "element ({}, {})", 5 + r, 3 + c);
        }
    }
    // The whole tensor.
    let mut all = vec![0f32; (ROWS * COLS) as usize];
    unsafe { ckpt.read_into_device("m", device(&mut all)).unwrap() };
    assert_eq!(all, ckpt.read::<f32>("m").unwrap());
}

#[test]
fn bad_device_reads_are_clear_errors() {
    emulate();
    let tmp = TempDir::new("device-errors");
    let ckpt = Checkpoint::open(saved(&tmp)).unwrap();
    let mut dst = vec![0f32; 10];
    // Wrong size, wrong rank, unknown tensor, negative ordinal: errors naming the tensor, nothing written.
    let mut short = device(&mut dst);
    let e = unsafe { ckpt.read_region_into_device("m", &[0, 0], &[1, 11], short) }.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.message().contains("'m'"), "{e}");
    let e = unsafe { ckpt.read_region_into_device("m", &[0], &[10], short) }.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    let e = unsafe { ckpt.read_into_device("nope", short) }.unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
    short.device = -2; // -1 is DCKPT_DEVICE_OF_POINTER: the device the driver says
    let e = unsafe { ckpt.read_region_into_device("m", &[0, 0], &[1, 10], short) }.unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(dst.iter().all(|&x| x == 0.0));
}

#[test]
fn the_device_can_come_from_the_pointer_and_the_stream_can_be_none() {
    emulate();
    let tmp = TempDir::new("device-of-pointer");
    let ckpt = Checkpoint::open(saved(&tmp)).unwrap();
    let mut dst = vec![0f32; 10];
    let mut buf = device(&mut dst);
    buf.device = DeviceBuffer::DEVICE_OF_POINTER;
    buf.stream = DeviceBuffer::stream_ready();
    unsafe { ckpt.read_region_into_device("m", &[3, 0], &[1, 10], buf) }.unwrap();
    assert_eq!(dst, (0..10).map(|c| value(3, c)).collect::<Vec<_>>());
}

extern "C" {
    fn posix_fadvise(fd: i32, offset: i64, len: i64, advice: i32) -> i32;
}
const POSIX_FADV_DONTNEED: i32 = 4;

/// Drops the checkpoint's data files from the page cache (written back first).
fn evict(dir: &std::path::Path) {
    use std::os::unix::io::AsRawFd;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.file_name().unwrap().to_string_lossy().starts_with("data-") {
            continue;
        }
        let f = std::fs::File::open(&path).unwrap();
        f.sync_data().unwrap();
        assert_eq!(unsafe { posix_fadvise(f.as_raw_fd(), 0, 0, POSIX_FADV_DONTNEED) }, 0);
    }
}

#[test]
fn data_not_in_the_page_cache_is_read_past_it_and_counted() {
    emulate();
    let tmp = TempDir::new("device-direct");
    let path = saved(&tmp);
    evict(&path);
    let ckpt = Checkpoint::open(&path).unwrap();
    let mut all = vec![0f32; (ROWS * COLS) as usize];
    unsafe { ckpt.read_into_device("m", device(&mut all)).unwrap() };
    for (i, v) in all.iter().enumerate() {
        assert_eq!(*v, value(i as u64 / COLS, i as u64 % COLS), "element {i}");
    }
    let io = ckpt.io_stats();
    // O_DIRECT where the test directory's file system takes it (ext4, xfs; tmpfs before Linux 6.6 does not).
    if io.bytes_read_direct == 0 {
        eprintln!("SKIPPED: no direct reads here (the file system refused O_DIRECT?): {io:?}");
        return;
    }
    assert_eq!(io.bytes_read_direct, ROWS * COLS * 4, "{io:?}");
    assert!(io.bytes_read >= io.bytes_read_direct, "{io:?}");
}
