//! A program of a user's own that reads a checkpoint through the `distckpt` crate (see README.md beside it).
//!
//!     distckpt-consumer [--fixture-values] CHECKPOINT
//!
//! For each F32 tensor: reads it, takes owned views of it (the whole tensor where it is one chunk, each chunk where it
//! is sharded), checks every element of the views against the read on another thread, and prints a checksum. With
//! `--fixture-values`, also checks the values tests/fixtures/sharded was written with. Then prints the bytes entries
//! that hold JSON values and the user metadata's step. Exit status: 0 when everything matches, 1 on a mismatch, 2 on a
//! usage or open error.
use std::process::ExitCode;
use std::sync::Arc;

use distckpt::{Checkpoint, Dtype, OwnedChunkView, OwnedTensorView};

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
    if fixture_values {
        for name in ["sharded.rows", "sharded.cols", "whole"] {
            if !names.iter().any(|n| n == name) {
                return Err(format!("--fixture-values: {path} has no F32 tensor '{name}' (is it tests/fixtures/sharded?)"));
            }
        }
    }
    // Values saved as JSON (Python's non-array leaves, or a config blob): printed; a blob that is not JSON is skipped.
    for e in ckpt.entries().filter(|e| !e.is_tensor()) {
        if let Ok(v) = ckpt.value(e.name()) {
            println!("{}: {v}", e.name());
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
