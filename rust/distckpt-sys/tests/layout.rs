//! Compares the Rust layout of every struct in the bindings (size, alignment, field offsets) and every integer
//! constant with what the system C compiler makes of distckpt.h. build.rs compiles and runs the C side.
use distckpt_sys::*;

include!(concat!(env!("OUT_DIR"), "/layout_rust.rs"));

const C_LAYOUT: &str = include_str!(concat!(env!("OUT_DIR"), "/layout_c.txt"));

#[test]
fn structs_and_constants_match_c() {
    if let Some(why) = C_LAYOUT.strip_prefix("skipped ") {
        eprintln!("SKIPPED: the C layout probe did not run: {why}");
        return;
    }
    assert!(!C_LAYOUT.starts_with("error "), "{C_LAYOUT}");
    let c: Vec<&str> = C_LAYOUT.lines().collect();
    let rust = rust_layout();
    assert_eq!(rust.len(), c.len(), "the probe printed a different number of lines");
    let mismatches: Vec<String> =
        rust.iter().zip(&c).filter(|(r, c)| r.as_str() != **c).map(|(r, c)| format!("rust: {r}\n   c: {c}")).collect();
    assert!(mismatches.is_empty(), "layout differs from C:\n{}", mismatches.join("\n"));
    // Every public struct of the header is covered (a struct the parser missed would silently go unchecked).
    let structs = rust.iter().filter(|l| l.starts_with("size ")).count();
    let fields = rust.iter().filter(|l| l.starts_with("field ")).count();
    let consts = rust.iter().filter(|l| l.starts_with("const ")).count();
    let header = include_str!("../../../capi/include/distckpt/distckpt.h");
    let c_structs = header.lines().filter(|l| l.starts_with("typedef struct dckpt_") && l.ends_with('{')).count();
    assert_eq!(structs, c_structs, "structs checked vs `typedef struct ... {{` in distckpt.h");
    println!("checked {structs} structs, {fields} fields and {consts} constants against C");
}
