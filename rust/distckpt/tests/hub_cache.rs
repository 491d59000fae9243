//! Issue 38: a Hugging Face hub cache, read in place by the core. The hub fixture (tests/fixtures/safetensors/hub) is
//! filed the way huggingface_hub downloads it: `models--org--tiny/blobs/<hash>`, `refs/main` holding the revision,
//! `snapshots/<revision>/<file>` a relative link `../../blobs/<hash>` (the blobs are named by a content hash, as the
//! hub's are; python/tests/test_hub_cache.py checks the layout with huggingface_hub's own scan_cache_dir). The
//! snapshot, a file of it and the repository open and read what the hub directory reads; links out of the blobs and
//! a hostile refs/main are refused, naming the file. Also: a DCP checkpoint's own format version.
mod common;

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::{fixture, TempDir};
use distckpt::{Checkpoint, ErrorCode, Format};

const REVISION: &str = "8e0c1f2a3b4c5d6e7f8091a2b3c4d5e6f7a8b9c0";

/// A 64-hex-digit content hash (std has no SHA-256; the core only needs a plain name).
fn content_hash(data: &[u8]) -> String {
    (0..4u8)
        .map(|salt| {
            let mut h = DefaultHasher::new();
            (salt, data).hash(&mut h);
            format!("{:016x}", h.finish())
        })
        .collect()
}

/// Files the hub fixture into `cache` as huggingface_hub does; returns (repository, snapshot).
fn hub_cache(cache: &Path) -> (PathBuf, PathBuf) {
    let repo = cache.join("models--org--tiny");
    let snapshot = repo.join("snapshots").join(REVISION);
    for d in [repo.join("blobs"), repo.join("refs"), snapshot.clone()] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(repo.join("refs/main"), REVISION).unwrap();
    for f in std::fs::read_dir(fixture("safetensors/hub")).unwrap() {
        let f = f.unwrap();
        let data = std::fs::read(f.path()).unwrap();
        let blob = content_hash(&data);
        std::fs::write(repo.join("blobs").join(&blob), data).unwrap();
        symlink(format!("../../blobs/{blob}"), snapshot.join(f.file_name())).unwrap();
    }
    (repo, snapshot)
}

#[test]
fn the_snapshot_a_file_of_it_and_the_repository_read_as_the_hub_directory() {
    let tmp = TempDir::new("hub-cache");
    let (repo, snapshot) = hub_cache(tmp.path());
    let hub = Checkpoint::open(fixture("safetensors/hub")).unwrap();
    for path in [snapshot.clone(), repo.clone(), snapshot.join("model.safetensors.index.json")] {
        let ckpt = Checkpoint::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let info = ckpt.info();
        assert_eq!((info.format, info.source_version, info.num_files), (Format::Safetensors, None, 3));
        assert_eq!(ckpt.entries().count(), hub.entries().count());
        for e in hub.entries() {
            assert_eq!(ckpt.read_raw(e.name()).unwrap(), hub.read_raw(e.name()).unwrap(), "{}", e.name());
        }
    }
}

#[test]
fn links_out_of_the_blobs_and_a_hostile_ref_are_refused() {
    for (target, says) in [
        ("/etc/passwd", "does not lead to a file"),
        ("../../../../outside.safetensors", "does not lead to a file"),
        ("../../blobs/adir", "is a directory"),
        ("../../blobs/alias", "never a chain of links"),
    ] {
        let tmp = TempDir::new("hub-cache-hostile");
        let (repo, snapshot) = hub_cache(tmp.path());
        std::fs::create_dir(repo.join("blobs/adir")).unwrap();
        symlink("/etc/passwd", repo.join("blobs/alias")).unwrap();
        let shard = snapshot.join("model-00003-of-00003.safetensors");
        std::fs::remove_file(&shard).unwrap();
        symlink(target, &shard).unwrap();
        for path in [&snapshot, &repo] {
            let err = Checkpoint::open(path).err().unwrap_or_else(|| panic!("{target}: opened"));
            assert_eq!(err.code(), ErrorCode::Corrupt, "{target}: {err}");
            assert!(err.message().contains(shard.to_str().unwrap()) && err.message().contains(says), "{err}");
        }
    }
    let tmp = TempDir::new("hub-cache-ref");
    let (repo, _) = hub_cache(tmp.path());
    std::fs::write(repo.join("refs/main"), "../x").unwrap();
    let err = Checkpoint::open(&repo).err().unwrap();
    assert_eq!(err.code(), ErrorCode::Corrupt, "{err}");
    assert!(err.message().contains("refs/main") && err.message().contains("not a revision name"), "{err}");
}

#[test]
fn a_dcp_checkpoint_gives_its_own_format_version() {
    let info = Checkpoint::open(fixture("dcp/dtensor_2ranks")).unwrap().info();
    assert_eq!((info.format, info.source_version.as_deref()), (Format::TorchDcp, Some("1.0.0")));
    let info = Checkpoint::open(fixture("dcp/torch24_dtensor_2ranks")).unwrap().info();
    assert_eq!((info.format, info.source_version), (Format::TorchDcp, None));
    let info = Checkpoint::open(fixture("safetensors/single.safetensors")).unwrap().info();
    assert_eq!((info.format, info.source_version), (Format::Safetensors, None));
}
