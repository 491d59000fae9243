//! 1. With the `shared` feature (libdistckpt.so; distckpt-sys's `links = "distckpt"` metadata says
//!    `DEP_DISTCKPT_LINK=shared`): lets this crate's tests, examples and binaries find libdistckpt.so at run time
//!    without LD_LIBRARY_PATH, through an rpath to the directory distckpt-sys linked against. Cargo gives that metadata,
//!    and link arguments, to direct dependents only; so this crate passes the directory on as its own
//!    `links = "distckpt-rs"` metadata: the build script of a crate that depends on `distckpt` reads it as
//!    `DEP_DISTCKPT_RS_LIB_DIR` and gives its binaries the same rpath (rust/README.md, "The `shared` feature").
//!    By default (the static archive, inside every binary) no rpath is needed and none is set; the metadata is
//!    passed on all the same, with `DEP_DISTCKPT_RS_LINK` saying which.
//! 2. Sets `cfg(distckpt_has_comm)` when that library exports the communicator functions. They are declared in
//!    distckpt.h but were added by a later issue than the reader; a library built before them links everything
//!    else, and the tests that need a communicator then report themselves skipped instead of failing to link.
use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(distckpt_has_comm)");
    for var in ["DEP_DISTCKPT_LIB_DIR", "DEP_DISTCKPT_LINK", "DEP_DISTCKPT_SYSTEM_LIBS", "DEP_DISTCKPT_INCLUDE", "CC"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let Ok(dir) = std::env::var("DEP_DISTCKPT_LIB_DIR") else { return };
    let shared = std::env::var("DEP_DISTCKPT_LINK").as_deref() == Ok("shared");
    println!("cargo:lib_dir={dir}");
    println!("cargo:link={}", if shared { "shared" } else { "static" });
    if let Ok(include) = std::env::var("DEP_DISTCKPT_INCLUDE") {
        println!("cargo:include={include}");
    }
    // How a C program links the library, as an application would.
    let link_args: Vec<String> = if shared {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        println!("cargo:rerun-if-changed={dir}/libdistckpt.so");
        vec![format!("-L{dir}"), "-ldistckpt".into()]
    } else {
        println!("cargo:rerun-if-changed={dir}/libdistckpt.a");
        let system = std::env::var("DEP_DISTCKPT_SYSTEM_LIBS").unwrap_or_default();
        std::iter::once(format!("{dir}/libdistckpt.a"))
            .chain(system.split_whitespace().map(|l| format!("-l{l}")))
            .collect()
    };
    let lib = if shared { "libdistckpt.so" } else { "libdistckpt.a" };
    if exports(&link_args, &["dckpt_comm_new_external", "dckpt_comm_new_gloo", "dckpt_comm_free", "dckpt_comm_barrier"])
    {
        println!("cargo:rustc-cfg=distckpt_has_comm");
    } else {
        println!(
            "cargo:warning={lib} in {dir} has no communicator functions yet: the multi-rank tests will be skipped"
        );
    }
}

/// Whether a C program calling `symbols` links with `link_args` (the system `cc`, as an application would).
fn exports(link_args: &[String], symbols: &[&str]) -> bool {
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
        .args(link_args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}
