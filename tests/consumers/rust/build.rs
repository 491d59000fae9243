fn main() {
    // The distckpt crate passes on where it linked libdistckpt.so (its `links` metadata); an rpath to that directory
    // lets this crate's binaries start without LD_LIBRARY_PATH.
    let dir = std::env::var("DEP_DISTCKPT_RS_LIB_DIR").expect("the distckpt crate sets DEP_DISTCKPT_RS_LIB_DIR");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
}
