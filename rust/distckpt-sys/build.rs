//! Finds libdistckpt and links it; then compiles a small C program that prints the C compiler's view of every
//! struct in src/bindings.rs (size, alignment, field offsets) and every integer constant, for tests/layout.rs.
//!
//! How it links:
//! - by default, the static archive `libdistckpt.a` (the whole core, flatbuffers and xxhash in one object that
//!   defines only `dckpt_*`), bundled into this crate's rlib, plus the system libraries it needs (STATIC_SYSTEM_LIBS).
//!   A dependent's binary then carries the library inside it: no `build.rs`, rpath or `LD_LIBRARY_PATH` anywhere.
//! - with the cargo feature `shared`, `libdistckpt.so`: an rpath for this crate's own tests, the directory passed on
//!   to dependents as `links` metadata, and a link in OUT_DIR that `cargo run` puts on the loader's path.
//!
//! Where the library is looked for, first match wins (the file is `libdistckpt.a`, or `libdistckpt.so` with `shared`):
//!   1. `DISTCKPT_LIB_DIR` (a directory holding the file; headers from `DISTCKPT_INCLUDE_DIR`, else
//!      `$DISTCKPT_LIB_DIR/../include`, else the repository's capi/include);
//!   2. pkg-config: `distckpt-static`, then `distckpt` (static), or `distckpt` (shared); scripts/build_lib.sh writes
//!      both .pc files: point PKG_CONFIG_PATH at them;
//!   3. the repository's install tree `build/dist` that scripts/build_lib.sh lays out.
//!
//! Metadata for the build script of a direct dependent (the `distckpt` crate): `DEP_DISTCKPT_LIB_DIR`,
//! `DEP_DISTCKPT_INCLUDE`, `DEP_DISTCKPT_LINK` (`static` or `shared`) and, for static, `DEP_DISTCKPT_SYSTEM_LIBS`.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const HOW_TO_BUILD: &str = "\
Build it from the repository root with

    scripts/build_lib.sh        # bazel build -c opt //capi:libdistckpt.so; lays out lib/libdistckpt.{a,so}

and point cargo at it with one of

    export DISTCKPT_LIB_DIR=$(scripts/build_lib.sh)/lib
    export PKG_CONFIG_PATH=$(scripts/build_lib.sh)/lib/pkgconfig

(rust/run_tests.sh does all of this and runs the tests).";

/// What a static link needs besides libdistckpt.a, as scripts/build_lib.sh writes it into distckpt-static.pc: parts
/// of the C library only (the archive carries its C++ runtime, libc++, inside), libdl and pthread among them for what
/// the library loads at run time (the Gloo plugin libdistckpt_gloo.so, CUDA, NCCL, libcurl). A binary that uses Gloo
/// finds the plugin beside itself or through DCKPT_GLOO_PLUGIN (README.md).
const STATIC_SYSTEM_LIBS: &[&str] = &["m", "dl", "pthread"];

#[derive(Clone, Copy, PartialEq)]
enum Link {
    Static,
    Shared,
}

impl Link {
    fn name(self) -> &'static str {
        match self {
            Link::Static => "static",
            Link::Shared => "shared",
        }
    }
    fn file(self) -> &'static str {
        match self {
            Link::Static => "libdistckpt.a",
            Link::Shared => "libdistckpt.so",
        }
    }
    /// The pkg-config packages to ask, in order.
    fn packages(self) -> &'static [&'static str] {
        match self {
            Link::Static => &["distckpt-static", "distckpt"],
            Link::Shared => &["distckpt"],
        }
    }
}

struct Found {
    lib_dir: PathBuf,
    include_dir: PathBuf,
    how: &'static str,
}

fn main() {
    for var in ["DISTCKPT_LIB_DIR", "DISTCKPT_INCLUDE_DIR", "PKG_CONFIG_PATH", "CC"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=src/bindings.rs");
    println!("cargo:rerun-if-changed=build.rs");

    let link = if env::var_os("CARGO_FEATURE_SHARED").is_some() { Link::Shared } else { Link::Static };
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let repo_include = manifest_dir.join("../../capi/include");
    let found = find_library(link, &manifest_dir, &repo_include).unwrap_or_else(|why| {
        let feature =
            if link == Link::Static { " (the default; the `shared` feature links libdistckpt.so)" } else { "" };
        eprintln!("\n{} was not found{feature}. {HOW_TO_BUILD}\n\nLooked in: {why}\n", link.file());
        std::process::exit(1);
    });
    let lib_dir = found.lib_dir.display().to_string();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rustc-link-search=native={lib_dir}");
    match link {
        Link::Static => {
            // Bundled into this crate's rlib (rustc's default for a static library), so a dependent's final link
            // needs neither this directory nor the archive. The system libraries reach every final link through the
            // rlib's metadata, after the archive, as the linker needs them.
            println!("cargo:rustc-link-lib=static=distckpt");
            for lib in STATIC_SYSTEM_LIBS {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
            println!("cargo:system_libs={}", STATIC_SYSTEM_LIBS.join(" "));
        }
        Link::Shared => {
            // `cargo run` and `cargo test` of any crate that depends on this one, directly or not, put the link
            // search directories that lie inside the target directory on the dynamic loader's path (and drop those
            // outside it). A link to the library in OUT_DIR, searched first, is therefore what makes `cargo run` of
            // a dependent's binary find libdistckpt.so with no setup of its own. A binary started directly needs an
            // rpath: see rust/README.md.
            if let Some(dir) = link_into(&out_dir, &found.lib_dir) {
                println!("cargo:rustc-link-search=native={}", dir.display());
            }
            println!("cargo:rustc-link-lib=dylib=distckpt");
            // This crate's own tests find the library at run time without LD_LIBRARY_PATH. Cargo passes link
            // arguments to this package's own targets only: dependents read the DEP_DISTCKPT_LIB_DIR metadata below
            // and do the same.
            println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
        }
    }
    println!("cargo:rerun-if-changed={lib_dir}/{}", link.file());
    println!("cargo:lib_dir={lib_dir}");
    println!("cargo:include={}", found.include_dir.display());
    println!("cargo:link={}", link.name());
    println!("cargo:rustc-env=DISTCKPT_SYS_FOUND_BY={}", found.how);
    println!("cargo:rustc-env=DISTCKPT_SYS_LIB_DIR={lib_dir}");
    println!("cargo:rustc-env=DISTCKPT_SYS_LINK={}", link.name());

    let bindings = fs::read_to_string(manifest_dir.join("src/bindings.rs")).expect("read src/bindings.rs");
    let items = parse_bindings(&bindings);
    fs::write(out_dir.join("layout_rust.rs"), rust_layout_source(&items)).unwrap();
    let c_layout = match probe_c_layout(&items, &found.include_dir, &out_dir) {
        Ok(text) => text,
        Err(why) => {
            println!("cargo:warning=distckpt-sys: the C layout probe did not run ({why}); tests/layout.rs will skip");
            format!("skipped {why}\n")
        }
    };
    fs::write(out_dir.join("layout_c.txt"), c_layout).unwrap();
}

/// Makes `OUT_DIR/lib/libdistckpt.so` a symbolic link to the found library, and `OUT_DIR/lib/distckpt.libs` one to
/// the directory of vendored libraries beside it (the library finds them through `$ORIGIN/distckpt.libs`, and the
/// loader takes `$ORIGIN` from the path it opened, the link's); returns that directory, or None (with a warning)
/// where no link can be made: then only binaries with an rpath find the library at run time.
fn link_into(out_dir: &Path, lib_dir: &Path) -> Option<PathBuf> {
    let dir = out_dir.join("lib");
    let names = ["libdistckpt.so", "distckpt.libs"];
    let made = fs::create_dir_all(&dir).and_then(|()| {
        for name in names {
            let link = dir.join(name);
            match fs::remove_file(&link) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let target = lib_dir.join(name);
            if name != names[0] && !target.exists() {
                continue; // a library built without vendored dependencies
            }
            std::os::unix::fs::symlink(target.canonicalize().unwrap_or(target), &link)?;
        }
        Ok(())
    });
    match made {
        Ok(()) => Some(dir),
        Err(e) => {
            println!("cargo:warning=distckpt-sys: cannot link libdistckpt.so into {}: {e}", dir.display());
            None
        }
    }
}

fn header_dir(candidates: &[PathBuf]) -> Option<PathBuf> {
    candidates.iter().find(|d| d.join("distckpt/distckpt.h").is_file()).cloned()
}

fn find_library(link: Link, manifest_dir: &Path, repo_include: &Path) -> Result<Found, String> {
    let file = link.file();
    let has_lib = |dir: &Path| dir.join(file).is_file();
    let mut looked = Vec::new();
    if let Some(dir) = env::var_os("DISTCKPT_LIB_DIR") {
        let dir = PathBuf::from(dir);
        if !has_lib(&dir) {
            return Err(format!("DISTCKPT_LIB_DIR={} has no {file}", dir.display()));
        }
        let mut cands: Vec<PathBuf> = env::var_os("DISTCKPT_INCLUDE_DIR").map(PathBuf::from).into_iter().collect();
        cands.push(dir.join("../include"));
        cands.push(repo_include.to_path_buf());
        let include_dir = header_dir(&cands).ok_or("no distckpt/distckpt.h next to DISTCKPT_LIB_DIR")?;
        return Ok(Found { lib_dir: dir, include_dir, how: "DISTCKPT_LIB_DIR" });
    }
    looked.push("DISTCKPT_LIB_DIR (unset)".to_string());

    for package in link.packages() {
        match pkg_config_var(package, "libdir") {
            Ok(lib) if has_lib(Path::new(&lib)) => {
                let inc = pkg_config_var(package, "includedir").map(PathBuf::from).ok();
                let cands: Vec<PathBuf> = inc.into_iter().chain([repo_include.to_path_buf()]).collect();
                let include_dir = header_dir(&cands).ok_or("pkg-config's includedir has no distckpt/distckpt.h")?;
                return Ok(Found { lib_dir: PathBuf::from(lib), include_dir, how: "pkg-config" });
            }
            Ok(lib) => looked.push(format!("pkg-config {package}: libdir {lib} (no {file})")),
            Err(e) => looked.push(format!("pkg-config {package} ({e})")),
        }
    }

    let dist = manifest_dir.join("../../build/dist");
    if has_lib(&dist.join("lib")) {
        let include_dir =
            header_dir(&[dist.join("include"), repo_include.to_path_buf()]).ok_or("build/dist has no header")?;
        let lib_dir = dist.join("lib").canonicalize().unwrap_or(dist.join("lib"));
        let include_dir = include_dir.canonicalize().unwrap_or(include_dir);
        return Ok(Found { lib_dir, include_dir, how: "build/dist" });
    }
    looked.push(format!("{} (no {file})", dist.join("lib").display()));
    Err(looked.join("; "))
}

fn pkg_config_var(package: &str, var: &str) -> Result<String, String> {
    let out = Command::new("pkg-config")
        .args([&format!("--variable={var}"), package])
        .output()
        .map_err(|e| format!("cannot run pkg-config: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if v.is_empty() {
        Err(format!("no {var}"))
    } else {
        Ok(v)
    }
}

/// What the layout check covers: every `pub struct` with its fields, and every integer `pub const`.
struct Items {
    structs: Vec<(String, Vec<String>)>,
    consts: Vec<String>,
}

/// Reads bindgen's (rustfmt-formatted) output line by line; the format is regular enough that no parser is needed.
fn parse_bindings(src: &str) -> Items {
    let mut items = Items { structs: Vec::new(), consts: Vec::new() };
    let mut current: Option<(String, Vec<String>)> = None;
    for line in src.lines() {
        if let Some(rest) = line.strip_prefix("pub struct ") {
            let name = rest.trim_end_matches(" {").trim();
            if rest.ends_with('{') {
                current = Some((name.to_string(), Vec::new()));
            }
            continue; // an opaque handle (`pub struct dckpt_reader { _unused: [u8; 0] }`) has private fields only
        }
        if let Some((_, fields)) = current.as_mut() {
            if line == "}" {
                let done = current.take().unwrap();
                if !done.1.is_empty() {
                    items.structs.push(done);
                }
            } else if let Some(rest) = line.strip_prefix("    pub ") {
                if let Some((field, _)) = rest.split_once(':') {
                    fields.push(field.trim().to_string());
                }
            }
            continue;
        }
        if let Some(rest) = line.strip_prefix("pub const ") {
            // `pub const DCKPT_X: type = value;` with an integer value (skips the byte-string version macro).
            if let Some((name, rhs)) = rest.split_once(':') {
                let value = rhs.rsplit('=').next().unwrap_or("").trim().trim_end_matches(';');
                if value.trim_start_matches('-').chars().all(|c| c.is_ascii_digit()) && !value.is_empty() {
                    items.consts.push(name.trim().to_string());
                }
            }
        }
    }
    items
}

fn rust_layout_source(items: &Items) -> String {
    let mut s = String::from(
        "// Generated by build.rs from src/bindings.rs.\npub fn rust_layout() -> Vec<String> {\n    vec![\n",
    );
    for (name, fields) in &items.structs {
        writeln!(
            s,
            "        format!(\"size {name} {{}} {{}}\", ::std::mem::size_of::<{name}>(), ::std::mem::align_of::<{name}>()),"
        )
        .unwrap();
        for f in fields {
            writeln!(s, "        format!(\"field {name}.{f} {{}}\", ::std::mem::offset_of!({name}, {f})),").unwrap();
        }
    }
    for c in &items.consts {
        writeln!(s, "        format!(\"const {c} {{}}\", {c} as i64),").unwrap();
    }
    s.push_str("    ]\n}\n");
    s
}

fn probe_c_layout(items: &Items, include_dir: &Path, out_dir: &Path) -> Result<String, String> {
    if env::var("HOST").ok() != env::var("TARGET").ok() {
        return Err("cross-compiling: the probe cannot run on the build machine".into());
    }
    let mut c = String::from(
        "/* Generated by distckpt-sys/build.rs. */\n#include <stddef.h>\n#include <stdio.h>\n\
         #include \"distckpt/distckpt.h\"\nint main(void) {\n",
    );
    for (name, fields) in &items.structs {
        writeln!(c, "  printf(\"size {name} %zu %zu\\n\", sizeof({name}), (size_t)_Alignof({name}));").unwrap();
        for f in fields {
            writeln!(c, "  printf(\"field {name}.{f} %zu\\n\", offsetof({name}, {f}));").unwrap();
        }
    }
    for k in &items.consts {
        writeln!(c, "  printf(\"const {k} %lld\\n\", (long long)({k}));").unwrap();
    }
    c.push_str("  return 0;\n}\n");
    let src = out_dir.join("layout_probe.c");
    let exe = out_dir.join("layout_probe");
    fs::write(&src, c).map_err(|e| e.to_string())?;
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(include_dir)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("cannot run {cc}: {e}"))?;
    if !out.status.success() {
        // A header the bindings do not match is a real failure, not a skip: tests/layout.rs reports it.
        return Ok(format!(
            "error compiling the layout probe {} against {} failed (is the installed header older than the \
             bindings? rebuild with scripts/build_lib.sh):\n{}",
            src.display(),
            include_dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let run = Command::new(&exe).output().map_err(|e| format!("cannot run the probe: {e}"))?;
    if !run.status.success() {
        return Err(format!("the probe exited with {}", run.status));
    }
    Ok(String::from_utf8_lossy(&run.stdout).into_owned())
}
