//! Fails when the committed src/bindings.rs is not what generate.sh produces from the current distckpt.h.
//! Skips (with a printed reason) where bindgen is not installed.
use std::path::Path;
use std::process::Command;

#[test]
fn committed_bindings_are_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    if !crate_dir.join("../../capi/include/distckpt/distckpt.h").is_file() {
        eprintln!("SKIPPED: capi/include/distckpt/distckpt.h is not beside this crate (not a repository checkout)");
        return;
    }
    if Command::new("bindgen").arg("--version").output().is_err() {
        eprintln!("SKIPPED: bindgen is not on PATH (apt-get install bindgen), so the staleness check cannot run");
        return;
    }
    let fresh = std::env::temp_dir().join(format!("distckpt-sys-bindings-{}.rs", std::process::id()));
    let out = Command::new(crate_dir.join("generate.sh")).arg(&fresh).output().expect("run generate.sh");
    assert!(out.status.success(), "generate.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let generated = std::fs::read(&fresh).unwrap();
    let _ = std::fs::remove_file(&fresh);
    let committed = std::fs::read(crate_dir.join("src/bindings.rs")).unwrap();
    if generated != committed {
        let squash = |b: &[u8]| b.iter().filter(|c| !c.is_ascii_whitespace()).copied().collect::<Vec<u8>>();
        let hint = if squash(&generated) == squash(&committed) {
            "they differ only in whitespace: a different rustfmt version formatted them"
        } else {
            "the header changed: run rust/distckpt-sys/generate.sh and commit src/bindings.rs"
        };
        let (g, c) = (String::from_utf8_lossy(&generated), String::from_utf8_lossy(&committed));
        let first =
            g.lines().zip(c.lines()).position(|(a, b)| a != b).unwrap_or(g.lines().count().min(c.lines().count()));
        panic!(
            "src/bindings.rs is stale ({hint}). First difference at line {}:\n  generated: {:?}\n  committed: {:?}",
            first + 1,
            g.lines().nth(first),
            c.lines().nth(first)
        );
    }
}
