//! Saving from Rust and reading back: every dtype, pieces, bytes, metadata, resharded loads, async saves,
//! progress callbacks, and the errors a caller can hit.
mod common;

use common::{same_f32, TempDir};
use distckpt::float::*;
use distckpt::{Checkpoint, Dtype, ErrorCode, LoadState, ReadOptions, SaveOptions, SaveState};

fn quick() -> SaveOptions {
    SaveOptions { sync: false, ..Default::default() } // tests need no fsync
}

#[test]
fn save_every_kind_of_entry_and_read_it_back() {
    let tmp = TempDir::new("roundtrip");
    let path = tmp.join("ckpt");
    let w: Vec<f32> = (0..8 * 6).map(|i| i as f32 * 0.25 - 3.0).collect();
    let bf16: Vec<u16> = w.iter().map(|&x| f32_to_bf16(x)).collect();
    let f16: Vec<u16> = w.iter().map(|&x| f32_to_f16(x)).collect();
    let e4m3: Vec<u8> = w.iter().map(|&x| f32_to_f8_e4m3fn(x)).collect();
    let e5m2: Vec<u8> = w.iter().map(|&x| f32_to_f8_e5m2(x)).collect();
    let ids: Vec<i64> = vec![-5, 0, 1 << 40];
    let mask: Vec<u8> = vec![1, 0, 1];
    let scalar = [2.5f64];
    let empty: Vec<i32> = vec![];
    let blob = b"tokenizer state".to_vec();
    let mut s = SaveState::new().unwrap();
    s.add_tensor("w.f32", &[8, 6], &w)
        .unwrap()
        .add_tensor_as("w.bf16", Dtype::BF16, &[8, 6], &bf16)
        .unwrap()
        .add_tensor_as("w.f16", Dtype::F16, &[8, 6], &f16)
        .unwrap()
        .add_tensor_as("w.e4m3", Dtype::F8E4M3FN, &[8, 6], &e4m3)
        .unwrap()
        .add_tensor_as("w.e5m2", Dtype::F8E5M2, &[48], &e5m2)
        .unwrap()
        .add_tensor("ids", &[3], &ids)
        .unwrap()
        .add_tensor_as("mask", Dtype::Bool, &[3], &mask)
        .unwrap()
        .add_tensor("scalar", &[], &scalar)
        .unwrap()
        .add_tensor("empty", &[0, 7], &empty)
        .unwrap()
        .add_bytes("tokenizer", &blob)
        .unwrap()
        .set_user("step", "7")
        .unwrap()
        .set_structure(br#"{"w": "w.f32"}"#)
        .unwrap();
    let info = s.save(&path, &quick()).unwrap();
    assert_eq!((info.num_entries, info.num_files), (10, 1));
    assert!(info.bytes_written >= 48 * 4 && info.total_bytes == info.bytes_written, "{info:?}");

    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.read::<f32>("w.f32").unwrap(), w);
    assert_eq!(&ckpt.view::<f32>("w.f32").unwrap()[..], &w[..]);
    assert_eq!(ckpt.read::<u16>("w.bf16").unwrap(), bf16);
    assert_eq!(ckpt.entry("w.bf16").unwrap().dtype(), Dtype::BF16);
    // These values are exact in bf16/f16; e4m3/e5m2 round them, so compare with the f32 of the rounded code.
    assert_eq!(ckpt.read_f32("w.bf16").unwrap(), w);
    assert_eq!(ckpt.read_f32("w.f16").unwrap(), w);
    let e4: Vec<f32> = e4m3.iter().map(|&b| f8_e4m3fn_to_f32(b)).collect();
    assert!(ckpt.read_f32("w.e4m3").unwrap().iter().zip(&e4).all(|(a, b)| same_f32(*a, *b)));
    assert_eq!(&ckpt.view::<u8>("w.e5m2").unwrap()[..], &e5m2[..]);
    assert_eq!(ckpt.read::<i64>("ids").unwrap(), ids);
    assert_eq!(ckpt.read::<u8>("mask").unwrap(), mask);
    assert_eq!(ckpt.read::<f64>("scalar").unwrap(), scalar);
    assert!(ckpt.read::<i32>("empty").unwrap().is_empty());
    assert_eq!(ckpt.read_bytes("tokenizer").unwrap(), blob);
    assert_eq!(ckpt.user("step"), Some("7"));
    assert_eq!(ckpt.structure(), br#"{"w": "w.f32"}"#);
    ckpt.verify().unwrap();
}

#[test]
fn pieces_become_chunks_and_load_reshards() {
    let tmp = TempDir::new("pieces");
    let path = tmp.join("ckpt");
    // [8, 6] saved as two row halves, loaded back as three column pieces.
    let full: Vec<i32> = (0..48).collect();
    let (top, bottom) = full.split_at(24);
    let mut s = SaveState::new().unwrap();
    s.declare_tensor("t", Dtype::I32, &[8, 6]).unwrap();
    s.add_piece("t", &[0, 0], &[4, 6], top).unwrap();
    s.add_piece("t", &[4, 0], &[4, 6], bottom).unwrap();
    s.save(&path, &quick()).unwrap();

    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(ckpt.entry("t").unwrap().num_chunks(), 2);
    assert_eq!(ckpt.read::<i32>("t").unwrap(), full);
    assert_eq!(ckpt.view::<i32>("t").unwrap_err().code(), ErrorCode::Unsupported);

    let mut cols = vec![vec![0i32; 16]; 3];
    let mut l = LoadState::new().unwrap();
    l.declare_tensor("t", Dtype::I32, &[8, 6]).unwrap();
    for (k, buf) in cols.iter_mut().enumerate() {
        l.add_piece("t", &[0, 2 * k as u64], &[8, 2], buf).unwrap();
    }
    let stats = l.load(&path, &ReadOptions::default()).unwrap();
    assert_eq!(stats.bytes_delivered, 48 * 4);
    drop(l);
    for (k, col) in cols.iter().enumerate() {
        let want: Vec<i32> = (0..8).flat_map(|r| [r * 6 + 2 * k as i32, r * 6 + 2 * k as i32 + 1]).collect();
        assert_eq!(col, &want, "column piece {k}");
    }
}

#[test]
fn load_whole_tensors_and_bytes() {
    let tmp = TempDir::new("load");
    let path = tmp.join("ckpt");
    let w = vec![1.5f64; 10];
    let blob = vec![7u8; 100];
    let mut s = SaveState::new().unwrap();
    s.add_tensor("w", &[10], &w).unwrap().add_bytes("b", &blob).unwrap();
    s.save(&path, &quick()).unwrap();

    let mut w2 = vec![0f64; 10];
    let mut b2 = vec![0u8; 128];
    let mut l = LoadState::new().unwrap();
    l.add_tensor("w", &[10], &mut w2).unwrap().add_bytes("b", &mut b2).unwrap();
    l.load(&path, &ReadOptions::default()).unwrap();
    assert_eq!(l.bytes_len("b").unwrap(), 100);
    drop(l);
    assert_eq!(w2, w);
    assert_eq!(&b2[..100], &blob[..]);

    // A shape or dtype that differs from the saved one is refused.
    let mut wrong = vec![0f32; 10];
    let mut l = LoadState::new().unwrap();
    l.add_tensor("w", &[10], &mut wrong).unwrap();
    let err = l.load(&path, &ReadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("'w'"), "{err}");
}

#[test]
fn buffers_are_checked_before_the_library_sees_them() {
    let data = vec![0f32; 10];
    let mut s = SaveState::new().unwrap();
    let err = s.add_tensor("x", &[3, 4], &data).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.message().contains("12 elements") && err.message().contains("10"), "{err}");
    let err = s.add_tensor_as("y", Dtype::F64, &[10], &data).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    let err = s.add_piece("undeclared", &[0], &[10], &data).unwrap_err();
    assert!(err.message().contains("not declared"), "{err}");
    s.declare_tensor("z", Dtype::F32, &[10, 2]).unwrap();
    assert!(s.add_piece("z", &[0], &[10], &data).is_err(), "rank mismatch");
    let bits = vec![0u16; 4];
    assert!(s.add_tensor_as("b", Dtype::I16, &[4], &bits).is_err(), "u16 does not hold I16");
    assert!(s.add_tensor("bad\0name", &[10], &data).is_err());
}

#[test]
fn overwrite_is_explicit() {
    let tmp = TempDir::new("overwrite");
    let path = tmp.join("ckpt");
    let a = [1u32, 2, 3];
    let b = [4u32, 5, 6];
    let mut s = SaveState::new().unwrap();
    s.add_tensor("v", &[3], &a).unwrap();
    s.save(&path, &quick()).unwrap();
    let err = s.save(&path, &quick()).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Exists, "{err}");
    let mut s2 = SaveState::new().unwrap();
    s2.add_tensor("v", &[3], &b).unwrap();
    s2.save(&path, &SaveOptions { overwrite: true, ..quick() }).unwrap();
    assert_eq!(Checkpoint::open(&path).unwrap().read::<u32>("v").unwrap(), b);
}

#[test]
fn progress_reports_and_can_abort() {
    let tmp = TempDir::new("progress");
    let data = vec![3u8; 3 << 20];
    let mut s = SaveState::new().unwrap();
    s.add_tensor("big", &[data.len() as u64], &data).unwrap();

    let mut calls = Vec::new();
    let mut record = |done: u64, total: u64| {
        calls.push((done, total));
        true
    };
    s.save_with_progress(tmp.join("a"), None, &quick(), &mut record).unwrap();
    assert!(!calls.is_empty());
    let (done, total) = *calls.last().unwrap();
    assert_eq!((done, total), (data.len() as u64, data.len() as u64), "{calls:?}");

    let mut stop = |_: u64, _: u64| false;
    let err = s.save_with_progress(tmp.join("b"), None, &quick(), &mut stop).unwrap_err();
    assert_eq!(err.code(), ErrorCode::User, "{err}");
    assert!(!tmp.join("b").exists(), "an aborted save leaves nothing at the path");

    // A panic in the callback does not unwind into C: it aborts the save and is resumed here.
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut boom = |_: u64, _: u64| -> bool { panic!("progress callback panicked") };
        let _ = s.save_with_progress(tmp.join("c"), None, &quick(), &mut boom);
    }));
    let payload = caught.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"progress callback panicked"));
    assert!(!tmp.join("c").exists());

    let ckpt = Checkpoint::open(tmp.join("a")).unwrap();
    let mut seen = 0;
    ckpt.verify_with_progress(&mut |d, t| {
        seen += 1;
        d <= t
    })
    .unwrap();
    assert!(seen > 0);
}

#[test]
fn async_save_copies_the_state_before_returning() {
    let tmp = TempDir::new("async");
    let path = tmp.join("ckpt");
    let mut data: Vec<f32> = (0..1 << 20).map(|i| i as f32).collect();
    let mut fut = {
        let mut s = SaveState::new().unwrap();
        s.add_tensor("x", &[data.len() as u64], &data).unwrap();
        s.save_async(&path, None, &quick()).unwrap()
    }; // the state (and its borrow of `data`) ends here
    data.iter_mut().for_each(|v| *v = -1.0); // allowed at once: the save owns a copy
    let (_, staged) = fut.staging();
    assert_eq!(staged, 4 << 20);
    let info = loop {
        if let Some(info) = fut.wait_timeout(std::time::Duration::from_millis(20)).unwrap() {
            break info;
        }
    };
    assert!(fut.is_done());
    assert_eq!(info.num_entries, 1);
    drop(fut);
    let back: Vec<f32> = Checkpoint::open(&path).unwrap().read("x").unwrap();
    assert!(back.iter().enumerate().all(|(i, v)| *v == i as f32));

    // wait() consumes the future; a failing save reports its error there or at the start.
    let mut s = SaveState::new().unwrap();
    s.add_tensor("x", &[4], &data[..4]).unwrap();
    let r = s.save_async(&path, None, &quick()).and_then(|f| f.wait());
    assert_eq!(r.unwrap_err().code(), ErrorCode::Exists);
}
