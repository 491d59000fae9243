//! Shared by the integration tests: the committed fixture checkpoints and scratch directories; `moto`, a moto S3
//! server on loopback.
#![allow(dead_code)]

pub mod moto;

use std::path::{Path, PathBuf};

/// tests/fixtures/<name> of the repository (written by tests/fixtures/make_fixtures.cc through the C ABI).
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(name)
}

/// tests/golden/<name>: the C++ golden checkpoints.
pub fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(name)
}

/// rust/distckpt/tests/data/<name>: checkpoints written by other bindings for these tests (see its README).
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)
}

/// A scratch directory removed on drop (std only: no tempfile crate here).
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = std::env::var_os("DISTCKPT_TEST_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("distckpt-rs-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Same value, NaN equal to NaN, and -0.0 told apart from 0.0.
pub fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Runs `f(rank, comm)` on `n` threads, one rank each over external (host-supplied) collectives, and returns their
/// results in rank order.
#[cfg(distckpt_has_comm)]
pub fn ranks<T: Send + 'static>(
    n: usize,
    f: impl Fn(usize, distckpt::Comm) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let handles: Vec<_> = distckpt::ThreadGroup::new(n)
        .into_iter()
        .enumerate()
        .map(|(r, g)| {
            let f = f.clone();
            std::thread::spawn(move || f(r, distckpt::Comm::external(g).unwrap()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
