//! Incremental saves from Rust (`SaveOptions::base`): only what changed is written, the checkpoint reports its bases
//! and where each chunk lies, reads follow the references, and the base cannot be removed while it is referred to.
mod common;

use common::TempDir;
use distckpt::{Checkpoint, ErrorCode, SaveOptions, SaveState, StorageHandle};

#[test]
fn an_incremental_save_refers_to_its_base_and_reads_back_exactly() {
    let tmp = TempDir::new("incremental");
    let frozen: Vec<f32> = (0..300_000).map(|i| (i % 977) as f32).collect();
    let mut head = vec![1i64; 1000];
    let save = |path: &str, head: &[i64], base: Option<&str>| {
        let mut s = SaveState::new().unwrap();
        s.add_tensor("frozen", &[300_000], &frozen).unwrap().add_tensor("head", &[1000], head).unwrap();
        s.save(tmp.join(path), &SaveOptions { sync: false, base: base.map(String::from), ..Default::default() })
            .unwrap()
    };
    assert_eq!(save("a", &head, None).bytes_reused, 0);
    head.iter_mut().for_each(|x| *x = 2);
    let info = save("b", &head, Some("a"));
    assert_eq!(info.bytes_reused, 300_000 * 4);
    assert_eq!(info.bytes_written, 1000 * 8);

    let ckpt = Checkpoint::open(tmp.join("b")).unwrap();
    let ci = ckpt.info();
    assert_eq!(
        (ci.format_major, ci.bases.clone(), ci.chain_length, ci.bytes_in_bases),
        (2, vec!["a".to_string()], 1, 300_000 * 4)
    );
    let entry = ckpt.entry("frozen").unwrap();
    assert_eq!(ckpt.chunk(&entry, 0).unwrap().base, "a");
    let head_entry = ckpt.entry("head").unwrap();
    assert_eq!(ckpt.chunk(&head_entry, 0).unwrap().base, "");
    assert_eq!(ckpt.read::<f32>("frozen").unwrap(), frozen);
    assert_eq!(ckpt.read::<i64>("head").unwrap(), head);
    ckpt.verify().unwrap();
    drop(ckpt);

    let posix = StorageHandle::posix().unwrap();
    let e = posix.remove_checkpoint(tmp.join("a")).unwrap_err();
    assert_eq!(e.code(), ErrorCode::State, "{e}");
    assert!(e.to_string().contains("'b'"), "{e}");
    let self_info = Checkpoint::open(tmp.join("a")).unwrap().info();
    assert!(self_info.bases.is_empty() && self_info.format_major == 1);
}
