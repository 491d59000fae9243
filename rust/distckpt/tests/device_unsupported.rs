//! Without the CUDA driver (this process does not emulate one), a read into device memory fails cleanly with
//! `Unsupported` naming `libcuda.so.1`: the device path is attempted, never a silent host fallback. Where a driver is
//! installed, the same host pointer is refused as not being device memory.
mod common;

use common::TempDir;
use distckpt::{Checkpoint, DeviceBuffer, ErrorCode, SaveOptions, SaveState};

#[test]
fn without_a_driver_device_reads_are_unsupported() {
    let tmp = TempDir::new("device-unsupported");
    let path = tmp.join("ckpt");
    let mut s = SaveState::new().unwrap();
    s.add_tensor("w", &[4], &[1f32, 2.0, 3.0, 4.0]).unwrap();
    s.save(&path, &SaveOptions { sync: false, ..Default::default() }).unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let mut dst = [0f32; 4];
    let buf = DeviceBuffer { ptr: dst.as_mut_ptr() as u64, len: 16, device: 0, stream: std::ptr::null_mut() };
    let e = unsafe { ckpt.read_into_device("w", buf) }.unwrap_err();
    match e.code() {
        ErrorCode::Unsupported => assert!(e.message().contains("libcuda.so.1"), "{e}"),
        ErrorCode::InvalidArgument => assert!(e.message().contains("not CUDA device memory"), "{e}"),
        other => panic!("unexpected {other:?}: {e}"),
    }
    assert_eq!(dst, [0.0; 4]);
}
