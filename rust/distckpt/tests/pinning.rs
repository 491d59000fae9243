//! A `Checkpoint` reads and views the checkpoint it opened, and nothing outside it (issue 10): after the path is
//! overwritten or removed, reads (verified or not) and views keep returning the opened checkpoint's values; with
//! `map_files: false` a data file truncated in place under a held view cannot raise SIGBUS; a data file that is a
//! symbolic link is refused; a link to the checkpoint directory itself works.
mod common;

use common::TempDir;
use distckpt::{Checkpoint, ErrorCode, ReadOptions, SaveOptions, SaveState};
use std::path::Path;

fn values(version: u32) -> Vec<f32> {
    (0..4096).map(|i| (version * 100_000 + i) as f32).collect()
}

fn save(path: &Path, version: u32, overwrite: bool) {
    let w = values(version);
    let mut s = SaveState::new().unwrap();
    s.add_tensor("w", &[64, 64], &w).unwrap();
    s.save(path, &SaveOptions { sync: false, overwrite, ..Default::default() }).unwrap();
}

fn opened(path: &Path, verify: bool, map_files: bool) -> Checkpoint {
    Checkpoint::open_with(path, None, &ReadOptions { verify, map_files, ..Default::default() }).unwrap()
}

#[test]
fn an_open_checkpoint_keeps_reading_what_it_opened_after_an_overwrite_and_a_removal() {
    for (verify, map_files) in [(true, true), (false, true), (true, false), (false, false)] {
        let tmp = TempDir::new("pin");
        let path = tmp.join("ckpt");
        save(&path, 1, false);
        let ckpt = opened(&path, verify, map_files);
        let view = ckpt.view::<f32>("w").unwrap();
        save(&path, 2, true);
        let what = format!("verify={verify} map_files={map_files}");
        assert_eq!(ckpt.read::<f32>("w").unwrap(), values(1), "read after an overwrite, {what}");
        assert_eq!(&view[..], &values(1)[..], "view taken before the overwrite, {what}");
        assert_eq!(&ckpt.view::<f32>("w").unwrap()[..], &values(1)[..], "view taken after the overwrite, {what}");
        ckpt.verify().unwrap();
        assert_eq!(Checkpoint::open(&path).unwrap().read::<f32>("w").unwrap(), values(2), "a new open, {what}");

        std::fs::remove_dir_all(&path).unwrap();
        assert_eq!(ckpt.read::<f32>("w").unwrap(), values(1), "read after a removal, {what}");
        assert_eq!(&view[..], &values(1)[..], "view after a removal, {what}");
    }
}

// With map_files off nothing is mapped: a view is a verified copy, so a data file truncated in place (sabotage: no
// distckpt operation does that) under a held view cannot kill the process, and reads report a clean error.
#[test]
fn without_mapping_a_truncated_file_under_a_held_view_cannot_raise_sigbus() {
    let tmp = TempDir::new("nosigbus");
    let path = tmp.join("ckpt");
    save(&path, 1, false);
    let ckpt = opened(&path, true, false);
    let view = ckpt.view::<f32>("w").unwrap();
    std::fs::OpenOptions::new().write(true).open(path.join("data-00000.bin")).unwrap().set_len(0).unwrap();
    let sum: f32 = view.iter().sum(); // touches every element: a mapping of the truncated file would SIGBUS here
    assert_eq!(sum, values(1).iter().sum::<f32>());
    let err = ckpt.read::<f32>("w").unwrap_err();
    assert_eq!(err.code(), ErrorCode::Corrupt, "{err}");
    assert!(err.to_string().contains("data-00000.bin"), "{err}");
}

#[test]
fn a_data_file_that_is_a_symbolic_link_is_refused_and_a_link_to_the_directory_works() {
    let tmp = TempDir::new("links");
    let path = tmp.join("step-100");
    save(&path, 1, false);
    std::os::unix::fs::symlink("step-100", tmp.join("latest")).unwrap();
    assert_eq!(Checkpoint::open(tmp.join("latest")).unwrap().view::<f32>("w").unwrap()[7], values(1)[7]);

    let data = path.join("data-00000.bin");
    std::fs::rename(&data, tmp.join("outside.bin")).unwrap();
    std::os::unix::fs::symlink(tmp.join("outside.bin"), &data).unwrap();
    for map_files in [true, false] {
        let ckpt = opened(&path, true, map_files);
        for err in [ckpt.view::<f32>("w").unwrap_err(), ckpt.read::<f32>("w").unwrap_err()] {
            assert_eq!(err.code(), ErrorCode::Corrupt, "{err}");
            assert!(err.to_string().contains("data-00000.bin' is a symbolic link"), "{err}");
        }
    }
}
