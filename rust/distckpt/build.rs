//! Lets this crate's tests, examples and binaries find libdistckpt.so at run time without LD_LIBRARY_PATH: an rpath
//! to the directory distckpt-sys linked against (its `links = "distckpt"` metadata).
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DISTCKPT_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_DISTCKPT_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
