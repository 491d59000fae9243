//! Loads a small MLP checkpoint and runs a forward pass in plain Rust: relu(x W1^T + b1) W2^T + b2.
//!
//!     cargo run --example serve [CHECKPOINT]        (default: tests/fixtures/mlp, written by the C++ fixtures)
//!
//! As a server does before it serves, every weight is loaded up front with `map_all()`: read in, mapped and verified
//! in place, in parallel. The weights are then zero-copy views into the mapping when stored as F32 in one chunk (the
//! safetensors/candle loading path); BF16/F16/float8 weights are converted to f32 once, and sharded ones are read.
//! A compressed chunk (a checkpoint saved with `SaveOptions::compression`) has no mapping: `map_all()` decodes it
//! into a verified copy that the checkpoint keeps, and its view is that copy.
//! The input is the checkpoint's "input" tensor. Prints one `output[i] = value` line per output; tests/serve.rs
//! compares them with the checkpoint's "reference.output", which the writer computed independently.
use std::borrow::Cow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use distckpt::{Checkpoint, Dtype, ErrorCode, Result};

/// A weight as f32: borrowed from the mapping when possible, else converted or assembled once.
fn weight<'a>(ckpt: &'a Checkpoint, name: &str) -> Result<(Cow<'a, [f32]>, &'static str)> {
    let e = ckpt.entry(name)?;
    if e.dtype() == Dtype::F32 {
        match ckpt.view::<f32>(name) {
            Ok(v) => {
                let compressed = e.num_chunks() == 1 && ckpt.chunk(&e, 0)?.codec.is_compressed();
                let how = if compressed { "decoded copy (compressed)" } else { "zero-copy view" };
                return Ok((Cow::Borrowed(v.as_slice()), how));
            }
            Err(err) if err.code() == ErrorCode::Unsupported => {} // sharded: assemble it below
            Err(err) => return Err(err),
        }
    }
    Ok((Cow::Owned(ckpt.read_f32(name)?), if e.dtype() == Dtype::F32 { "read (sharded)" } else { "converted to f32" }))
}

/// y = W x + b for W of shape [out, in], row-major.
fn linear(w: &[f32], b: &[f32], x: &[f32]) -> Vec<f32> {
    let n_in = x.len();
    assert_eq!(w.len(), b.len() * n_in, "weight shape does not match the input");
    w.chunks_exact(n_in).zip(b).map(|(row, bias)| bias + row.iter().zip(x).map(|(a, b)| a * b).sum::<f32>()).collect()
}

fn run(path: PathBuf) -> Result<()> {
    let t0 = Instant::now();
    let ckpt = Checkpoint::open(&path)?;
    // Every checksum checked before the first request; the views below then touch resident, verified pages. Where
    // the reader cannot map (map_files off, a storage without mappings) the reads below verify as they go.
    match ckpt.map_all() {
        Err(e) if e.code() == ErrorCode::Unsupported => {}
        other => other?,
    }
    let info = ckpt.info();
    println!(
        "checkpoint {} ({}, {} entries, model {}, step {})",
        path.display(),
        info.writer,
        info.num_entries,
        ckpt.user("model").unwrap_or("?"),
        ckpt.user("step").unwrap_or("?")
    );
    let mut params = Vec::new();
    for name in ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"] {
        let e = ckpt.entry(name)?;
        let (w, how) = weight(&ckpt, name)?;
        println!("  {name:<11} {:<4} {:?} {how}", e.dtype().to_string(), e.shape());
        params.push(w);
    }
    let x = ckpt.read_f32("input")?;
    let loaded = t0.elapsed();

    let t1 = Instant::now();
    let hidden: Vec<f32> = linear(&params[0], &params[1], &x).into_iter().map(|h| h.max(0.0)).collect();
    let out = linear(&params[2], &params[3], &hidden);
    let forward = t1.elapsed();

    println!("input: {} values; hidden: {} (relu); output: {}", x.len(), hidden.len(), out.len());
    for (i, v) in out.iter().enumerate() {
        println!("output[{i}] = {v:?}");
    }
    let argmax = out.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i).unwrap_or(0);
    println!("argmax = {argmax}");
    if ckpt.contains("reference.output") {
        let reference = ckpt.read::<f32>("reference.output")?;
        let diff = out.iter().zip(&reference).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        println!("max |output - reference.output| = {diff:e}");
    }
    println!("open + load {:.3} ms, forward {:.3} ms", loaded.as_secs_f64() * 1e3, forward.as_secs_f64() * 1e3);
    Ok(())
}

fn main() -> ExitCode {
    let path = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/mlp"));
    let path = path.canonicalize().unwrap_or(path);
    match run(path) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serve: {e}");
            ExitCode::FAILURE
        }
    }
}
