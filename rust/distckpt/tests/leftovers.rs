//! The core's leftover judge through the Rust API: a directory an overwrite moved aside is garbage once idle, a
//! staging directory of this (live) process never is, a link named like a leftover is not one, and removal takes only
//! garbage.
use std::fs;
use std::path::Path;
use std::time::Duration;

use distckpt::{leftovers_of, remove_leftover, scan_leftovers, ErrorCode, LeftoverKind, WriterState};

fn marker(pid: u32) -> String {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("host: {}\npid: {}\nstarted_utc: 2026-01-01T00:00:00Z\nfinal_path: x\n", host.trim(), pid)
}

#[test]
fn scan_and_remove_leftovers() {
    let tmp = std::env::temp_dir().join(format!("dckpt-rust-leftovers-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::create_dir_all(tmp.join("ckpt.dckpt-old-00000000000000aa/sub")).unwrap();
    fs::write(tmp.join("ckpt.dckpt-old-00000000000000aa/sub/data-00000.bin"), b"0123456789").unwrap();
    fs::create_dir_all(tmp.join("ckpt.dckpt-staging-00000000000000bb")).unwrap();
    fs::write(tmp.join("ckpt.dckpt-staging-00000000000000bb/STAGING"), marker(std::process::id())).unwrap();
    fs::create_dir_all(tmp.join("outside")).unwrap();
    std::os::unix::fs::symlink(tmp.join("outside"), tmp.join("x.dckpt-old-00000000000000cc")).unwrap();

    let all = scan_leftovers(&tmp, Duration::ZERO).unwrap();
    let names: Vec<&str> = all.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["ckpt.dckpt-old-00000000000000aa", "ckpt.dckpt-staging-00000000000000bb"]);
    assert_eq!(all[0].kind, LeftoverKind::Replaced);
    assert_eq!(all[0].final_name, "ckpt");
    assert_eq!(all[0].bytes, 10);
    assert!(all[0].garbage, "{}", all[0].reason);
    assert_eq!(all[1].kind, LeftoverKind::Staging);
    assert_eq!(all[1].writer, WriterState::Running);
    assert_eq!(all[1].writer_pid, Some(std::process::id() as i64));
    assert!(!all[1].garbage);
    assert!(all[1].reason.contains("is running"), "{}", all[1].reason);
    assert_eq!(leftovers_of(tmp.join("ckpt"), Duration::ZERO).unwrap().len(), 2);
    assert!(leftovers_of(tmp.join("other"), Duration::ZERO).unwrap().is_empty());

    let kept = remove_leftover(&all[0].path, Duration::from_secs(3600)).unwrap_err();
    assert_eq!(kept.code(), ErrorCode::State, "{kept}");
    let running = remove_leftover(&all[1].path, Duration::ZERO).unwrap_err();
    assert_eq!(running.code(), ErrorCode::State, "{running}");
    let link = remove_leftover(tmp.join("x.dckpt-old-00000000000000cc"), Duration::ZERO).unwrap_err();
    assert_eq!(link.code(), ErrorCode::NotFound, "{link}");
    remove_leftover(&all[0].path, Duration::ZERO).unwrap();
    assert!(!all[0].path.exists());
    assert!(Path::new(&all[1].path).exists());
    assert!(tmp.join("outside").exists());
    fs::remove_dir_all(&tmp).unwrap();
}
