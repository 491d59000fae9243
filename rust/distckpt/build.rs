//! 1. Lets this crate's tests, examples and binaries find libdistckpt.so at run time without LD_LIBRARY_PATH: an
//!    rpath to the directory distckpt-sys linked against (its `links = "distckpt"` metadata). Cargo gives that
//!    metadata, and link arguments, to direct dependents only; so this crate passes the directory on as its own
//!    `links = "distckpt-rs"` metadata: the build script of a crate that depends on `distckpt` reads it as
//!    `DEP_DISTCKPT_RS_LIB_DIR` and gives its binaries the same rpath (rust/README.md, "Use it from your crate").
//! 2. Sets `cfg(distckpt_has_comm)` when that library exports the communicator functions. They are declared in
//!    distckpt.h but were added by a later issue than the reader; a library built before them links everything
//!    else, and the tests that need a communicator then report themselves skipped instead of failing to link.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(distckpt_has_comm)");
    println!("cargo:rerun-if-env-changed=DEP_DISTCKPT_LIB_DIR");
    println!("cargo:rerun-if-env-changed=CC");
    println!("cargo:rerun-if-env-changed=DEP_DISTCKPT_INCLUDE");
    let Ok(dir) = std::env::var("DEP_DISTCKPT_LIB_DIR") else { return };
    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    println!("cargo:lib_dir={dir}");
    if let Ok(include) = std::env::var("DEP_DISTCKPT_INCLUDE") {
        println!("cargo:include={include}");
    }
    println!("cargo:rerun-if-changed={dir}/libdistckpt.so");
    if exports(&dir, &["dckpt_comm_new_external", "dckpt_comm_new_gloo", "dckpt_comm_free", "dckpt_comm_barrier"]) {
        println!("cargo:rustc-cfg=distckpt_has_comm");
    } else {
        println!("cargo:warning=libdistckpt.so in {dir} has no communicator functions yet: the multi-rank tests will be skipped");
    }
}

/// Whether a C program calling `symbols` links against the library (the system `cc`, as an application would).
fn exports(dir: &str, symbols: &[&str]) -> bool {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let src = out.join("probe_comm.c");
    let decls: String = symbols.iter().map(|s| format!("extern void {s}(void);\n")).collect();
    let calls: String = symbols.iter().map(|s| format!("  {s}();\n")).collect();
    std::fs::write(&src, format!("{decls}int main(void) {{\n  if (0) {{\n{calls}  }}\n  return 0;\n}}\n")).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    Command::new(cc)
        .arg(&src)
        .arg("-o")
        .arg(out.join("probe_comm"))
        .arg(format!("-L{dir}"))
        .arg("-ldistckpt")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
