//! The library links, loads, is the ABI these bindings were generated for, and is linked the way the features say.
use distckpt_sys::*;
use std::ffi::CStr;

#[test]
fn abi_version_matches_the_header() {
    let abi = unsafe { dckpt_abi_version() };
    assert_eq!(abi, DCKPT_ABI_VERSION, "libdistckpt ({LINKED_AS}) from {LINKED_LIB_DIR} ({LINKED_FROM})");
    let v = unsafe { CStr::from_ptr(dckpt_version_string()) }.to_str().unwrap();
    assert!(!v.is_empty());
}

#[test]
fn plain_calls_work() {
    unsafe {
        assert_eq!(dckpt_dtype_size(DCKPT_DTYPE_BF16 as i32), 2);
        let name = CStr::from_ptr(dckpt_status_name(DCKPT_ECORRUPT));
        assert_eq!(name.to_str().unwrap(), "corrupt");
        let mut opts: dckpt_read_options = std::mem::zeroed();
        assert_eq!(dckpt_read_options_init(&mut opts, DCKPT_READ_OPTIONS_VERSION), DCKPT_OK);
        assert_eq!(opts.verify, 1);
        let mut reader = std::ptr::null_mut();
        let rc = dckpt_reader_open(&mut reader, c"/nonexistent/checkpoint".as_ptr(), std::ptr::null_mut(), &opts);
        assert_eq!(rc, DCKPT_ENOTFOUND);
        assert!(reader.is_null());
        assert!(!CStr::from_ptr(dckpt_error_last()).to_bytes().is_empty());
    }
}

/// Static (the default): the library is inside this test binary and no libdistckpt.so is loaded. With the `shared`
/// feature: libdistckpt.so is loaded, from the directory build.rs linked against.
#[test]
fn linked_static_or_shared_as_the_features_say() {
    unsafe { dckpt_abi_version() }; // the library is in use
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let loaded: Vec<&str> =
        maps.lines().filter_map(|l| l.split_whitespace().nth(5)).filter(|p| p.ends_with("/libdistckpt.so")).collect();
    match LINKED_AS {
        "static" => assert!(loaded.is_empty(), "linked static, yet libdistckpt.so is loaded: {loaded:?}"),
        "shared" => assert!(!loaded.is_empty(), "linked shared ({LINKED_LIB_DIR}), yet no libdistckpt.so is loaded"),
        other => panic!("LINKED_AS is {other:?}"),
    }
    assert_eq!(LINKED_AS == "shared", cfg!(feature = "shared"));
}
