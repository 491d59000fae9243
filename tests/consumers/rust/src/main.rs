//! A program of a user's own that reads a checkpoint through the `distckpt` crate (see README.md beside it).
//!
//!     distckpt-consumer [--fixture-values] CHECKPOINT
//!
//! For each F32 tensor: reads it, takes owned views of it (the whole tensor where it is one chunk, each chunk where it
//! is sharded), checks every element of the views against the read on another thread, and prints a checksum. Then,
//! through the `half` feature, maps the whole checkpoint and views each BF16/F16 tensor as `&[half::bf16]` /
//! `&[half::f16]`, checked against its raw bits; and through the `serde` feature, reads the bytes entries that hold
//! JSON values into `serde_json::Value` and prints them, and the user metadata's step. With `--fixture-values`, also
//! checks the values the fixture was written with: tests/fixtures/sharded's tensors, tests/fixtures/dtypes' BF16 and
//! F16 codes against the exact f32 values beside them, or the values rust/distckpt/tests/data/python_values was saved
//! with (read into Rust types with serde). Exit status: 0 when everything matches, 1 on a mismatch, 2 on a usage or
//! open error.
use std::process::ExitCode;
use std::sync::Arc;

use distckpt::{Checkpoint, Dtype, OwnedChunkView, OwnedTensorView};
use half::{bf16, f16};
use serde::Deserialize;

/// The zero-copy views of one tensor, owned: they keep the checkpoint open by themselves.
enum Views {
    Whole(OwnedTensorView<f32>),
    Chunks(Vec<OwnedChunkView<f32>>),
}

/// FNV-1a over the bit patterns, so a checksum tells apart values that compare equal (0.0 and -0.0).
fn fnv1a(values: &[f32]) -> u64 {
    values.iter().flat_map(|v| v.to_bits().to_le_bytes()).fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The value tests/fixtures/make_fixtures.cc wrote at flat index `i` of `name`, if it is one of the sharded fixture's.
fn fixture_value(name: &str, i: usize) -> Option<f32> {
    match name {
        "sharded.rows" => Some(i as f32),
        "sharded.cols" => Some(-(i as f32)),
        "whole" => Some(0.5 * i as f32),
        _ => None,
    }
}

/// Compares the views with the tensor as read (row-major, `shape`); returns the number of elements that differ.
fn compare(views: &Views, shape: &[u64], read: &[f32]) -> usize {
    match views {
        Views::Whole(v) => v.iter().zip(read).filter(|(a, b)| a.to_bits() != b.to_bits()).count() + v.len().abs_diff(read.len()),
        Views::Chunks(chunks) => {
            let mut bad = 0;
            let mut seen = 0;
            for c in chunks {
                // Walk the chunk's box row-major, mapping each element to its flat index in the tensor.
                let (o, l) = (c.offsets(), c.lengths());
                let mut coords = o.to_vec();
                for x in c.iter() {
                    let flat = coords.iter().zip(shape).fold(0u64, |acc, (k, s)| acc * s + k) as usize;
                    if read.get(flat).map(|r| r.to_bits()) != Some(x.to_bits()) {
                        bad += 1;
                    }
                    for d in (0..coords.len()).rev() {
                        coords[d] += 1;
                        if coords[d] < o[d] + l[d] {
                            break;
                        }
                        coords[d] = o[d];
                    }
                }
                seen += c.len();
            }
            bad + seen.abs_diff(read.len())
        }
    }
}

/// Views every one-chunk BF16 and F16 tensor as half's types after mapping the whole checkpoint (`map_all`, as a
/// server loads its weights: read, verified, resident), and compares the view with the raw bits `read()` gives; where
/// `<stem>.expected` (F32) sits beside `<stem>.values`, as in tests/fixtures/dtypes, compares half's `to_f32` of every
/// element with it. Returns (tensors viewed, of them checked against `.expected`, mismatches).
fn check_half(ckpt: &Checkpoint) -> Result<(usize, usize, usize), String> {
    ckpt.map_all().map_err(|e| e.to_string())?;
    let (mut viewed, mut against_expected, mut bad) = (0, 0, 0);
    for e in ckpt.entries().filter(|e| e.is_tensor() && e.num_chunks() == 1) {
        let name = e.name();
        let err = |e: distckpt::Error| e.to_string();
        // Each view is `&[half::bf16]` / `&[half::f16]` straight out of the mapping.
        let (kind, bits, values): (&str, Vec<u16>, Vec<f32>) = match e.dtype() {
            Dtype::BF16 => {
                let view: &[bf16] = &ckpt.view::<bf16>(name).map_err(err)?;
                ("bf16", view.iter().map(|v| v.to_bits()).collect(), view.iter().map(|v| v.to_f32()).collect())
            }
            Dtype::F16 => {
                let view: &[f16] = &ckpt.view::<f16>(name).map_err(err)?;
                ("f16", view.iter().map(|v| v.to_bits()).collect(), view.iter().map(|v| v.to_f32()).collect())
            }
            _ => continue,
        };
        let raw: Vec<u16> = ckpt.read(name).map_err(err)?;
        let mut wrong = usize::from(raw != bits);
        let mut against = "";
        if let Some(stem) = name.strip_suffix(".values").filter(|s| ckpt.contains(&format!("{s}.expected"))) {
            let want: Vec<f32> = ckpt.read(&format!("{stem}.expected")).map_err(err)?;
            let same = |(a, b): (&f32, &f32)| (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits();
            wrong += values.len().abs_diff(want.len()) + values.iter().zip(&want).filter(|p| !same(*p)).count();
            against = " and the exact values beside it";
            against_expected += 1;
        }
        println!(
            "{name}: {} values viewed as &[half::{kind}] ({}): {}",
            values.len(),
            values.iter().take(4).map(|v| v.to_string()).collect::<Vec<_>>().join(", "),
            if wrong == 0 { format!("match read(){against}") } else { "MISMATCH".to_string() }
        );
        viewed += 1;
        bad += wrong;
    }
    Ok((viewed, against_expected, bad))
}

/// `cfg[1]` of the Python values checkpoint, `{"a": {"b": [1]}}`, as a struct of the user's own.
#[derive(Deserialize, Debug, PartialEq)]
struct CfgEntry {
    a: Inner,
}

#[derive(Deserialize, Debug, PartialEq)]
struct Inner {
    b: Vec<u32>,
}

/// The values rust/distckpt/tests/data/make_python_values.py saved, read into Rust types through the `serde` feature.
/// Returns the number that differ.
fn check_python_values(ckpt: &Checkpoint) -> Result<usize, String> {
    let err = |e: distckpt::Error| e.to_string();
    let step: u64 = ckpt.value_as("step").map_err(err)?;
    let lr: f64 = ckpt.value_as("lr").map_err(err)?;
    let shape: (u32, u32) = ckpt.value_as("shape").map_err(err)?;
    let (_, cfg): (serde::de::IgnoredAny, CfgEntry) = ckpt.value_as("cfg").map_err(err)?;
    let blob: Vec<u8> = ckpt.value_as("blob").map_err(err)?;
    let big: u128 = ckpt.value_as("big").map_err(err)?;
    let checks = [
        step == 100 && ckpt.user("step") == Some("100"),
        lr == 0.001,
        shape == (2, 3),
        cfg == CfgEntry { a: Inner { b: vec![1] } },
        blob == [0, 1, 0xff],
        big == (1 << 64) + 1,
    ];
    println!("python values into Rust types: step {step}, lr {lr}, shape {shape:?}, cfg[1] {cfg:?}, blob {blob:?}, big {big}");
    Ok(checks.iter().filter(|ok| !**ok).count())
}

fn run(path: &str, fixture_values: bool) -> Result<usize, String> {
    let ckpt = Arc::new(Checkpoint::open(path).map_err(|e| e.to_string())?);
    println!("{path}: {} entries, written by {}, library {}", ckpt.len(), ckpt.info().writer, distckpt::library_version());
    let names: Vec<String> =
        ckpt.entries().filter(|e| e.is_tensor() && e.dtype() == Dtype::F32).map(|e| e.name().to_string()).collect();
    if names.is_empty() {
        return Err(format!("{path} has no F32 tensor to check"));
    }
    let mut mismatches = 0;
    for name in &names {
        let read: Vec<f32> = ckpt.read(name).map_err(|e| e.to_string())?;
        let entry = ckpt.entry(name).map_err(|e| e.to_string())?;
        let shape = entry.shape().to_vec();
        let views = if entry.num_chunks() == 1 {
            Views::Whole(ckpt.view_owned(name).map_err(|e| e.to_string())?)
        } else {
            Views::Chunks(ckpt.chunk_views_owned(name).map_err(|e| e.to_string())?)
        };
        // The owned views go to another thread with their own share of the checkpoint.
        let (bad, read, shape) = std::thread::spawn(move || (compare(&views, &shape, &read), read, shape))
            .join()
            .map_err(|_| "the checking thread panicked".to_string())?;
        let mut wrong_values = 0;
        if fixture_values {
            wrong_values = (0..read.len()).filter(|&i| fixture_value(name, i).is_some_and(|v| v != read[i])).count();
        }
        let sum: f64 = read.iter().map(|v| f64::from(*v)).sum();
        println!(
            "{name}: shape {shape:?}, {} chunk(s), {} values, sum {sum}, fnv1a {:#018x}: {}",
            entry.num_chunks(),
            read.len(),
            fnv1a(&read),
            if bad + wrong_values == 0 { "views match" } else { "MISMATCH" }
        );
        if bad > 0 {
            eprintln!("{name}: {bad} elements of the views differ from read()");
        }
        if wrong_values > 0 {
            eprintln!("{name}: {wrong_values} elements differ from the values the fixture was written with");
        }
        mismatches += bad + wrong_values;
    }
    let (viewed, against_expected, bad) = check_half(&ckpt)?;
    mismatches += bad;
    // Values saved as JSON (Python's non-array leaves, or a config blob), into serde_json: printed. Skipped: a blob
    // that is not JSON, and a value serde_json::Value cannot hold (a dict with tuple keys).
    for e in ckpt.entries().filter(|e| !e.is_tensor()) {
        if let Ok(v) = ckpt.value_as::<serde_json::Value>(e.name()) {
            println!("{}: {v}", e.name());
        }
    }
    if fixture_values {
        if ckpt.contains("sharded.rows") {
            for name in ["sharded.rows", "sharded.cols", "whole"] {
                if !names.iter().any(|n| n == name) {
                    return Err(format!("--fixture-values: {path} has no F32 tensor '{name}'"));
                }
            }
        } else if ckpt.contains("bf16.values") {
            if (viewed, against_expected) != (2, 2) {
                return Err(format!("--fixture-values: {viewed} BF16/F16 tensors viewed, {against_expected} checked against their exact values; want 2 and 2"));
            }
        } else if ckpt.contains("cfg") {
            mismatches += check_python_values(&ckpt)?;
        } else {
            return Err(format!("--fixture-values: {path} is none of tests/fixtures/sharded, tests/fixtures/dtypes and python_values"));
        }
    }
    if let Some(step) = ckpt.user("step") {
        println!("user metadata step = {step}");
    }
    // Every view is gone: this binding is the checkpoint's last owner.
    if Arc::strong_count(&ckpt) != 1 {
        return Err(format!("{} owners of the checkpoint remain after the views dropped", Arc::strong_count(&ckpt)));
    }
    Ok(mismatches)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let fixture_values = args.first().is_some_and(|a| a == "--fixture-values");
    if fixture_values {
        args.remove(0);
    }
    let [path] = &args[..] else {
        eprintln!("usage: distckpt-consumer [--fixture-values] CHECKPOINT");
        return ExitCode::from(2);
    };
    match run(path, fixture_values) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(n) => {
            eprintln!("distckpt-consumer: {n} mismatches");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("distckpt-consumer: {e}");
            ExitCode::from(2)
        }
    }
}
