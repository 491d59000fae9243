//! Runs `examples/serve.rs` on the MLP fixture and compares what it prints with the reference output the C++
//! writer computed (in double) and stored in the checkpoint.
mod common;

use common::{fixture, TempDir};
use distckpt::float::f32_to_bf16;
use distckpt::{Checkpoint, Compression, Dtype, SaveOptions, SaveState};
use std::path::{Path, PathBuf};
use std::process::Command;

/// target/<profile>/examples/serve: cargo builds examples along with the tests; build it if this run did not.
fn serve_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap(); // target/<profile>/deps/serve-<hash>
    let bin = exe.parent().unwrap().parent().unwrap().join("examples").join("serve");
    if !bin.is_file() {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--offline", "--example", "serve", "-p", "distckpt"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build --example serve");
        assert!(status.success());
    }
    bin
}

fn run_serve(ckpt: &Path) -> (String, Vec<f32>) {
    let out = Command::new(serve_binary()).arg(ckpt).output().expect("run examples/serve");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "serve failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let mut values = Vec::new();
    for line in stdout.lines() {
        if let Some(rest) = line.strip_prefix("output[") {
            let (idx, v) = rest.split_once("] = ").unwrap();
            assert_eq!(idx.parse::<usize>().unwrap(), values.len());
            values.push(v.parse::<f32>().unwrap());
        }
    }
    (stdout, values)
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "output[{i}] = {g}, reference {w}");
    }
}

#[test]
fn serve_matches_the_reference_output() {
    let path = fixture("mlp");
    let (stdout, got) = run_serve(&path);
    let reference: Vec<f32> = Checkpoint::open(&path).unwrap().read("reference.output").unwrap();
    assert_eq!(got.len(), 10, "{stdout}");
    // f32 accumulation against a double reference: a few ulps.
    assert_close(&got, &reference, 1e-5);
    assert_eq!(stdout.matches("zero-copy view").count(), 4, "{stdout}");
}

#[test]
fn serve_runs_bf16_weights_saved_from_rust() {
    // The same MLP re-saved from Rust with BF16 weights: the example converts them; the output moves by about
    // bf16's precision.
    let src = Checkpoint::open(fixture("mlp")).unwrap();
    let tmp = TempDir::new("serve-bf16");
    let names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "input", "reference.output"];
    let data: Vec<(Vec<u64>, Vec<f32>)> =
        names.iter().map(|n| (src.entry(n).unwrap().shape().to_vec(), src.read::<f32>(n).unwrap())).collect();
    let bits: Vec<Vec<u16>> = data.iter().map(|(_, v)| v.iter().map(|x| f32_to_bf16(*x)).collect()).collect();
    let mut s = SaveState::new().unwrap();
    for (i, name) in names.iter().enumerate() {
        if name.starts_with("fc") {
            s.add_tensor_as(name, Dtype::BF16, &data[i].0, &bits[i]).unwrap();
        } else {
            s.add_tensor(name, &data[i].0, &data[i].1).unwrap();
        }
    }
    s.save(tmp.join("mlp-bf16"), &SaveOptions { sync: false, ..Default::default() }).unwrap();
    let (stdout, got) = run_serve(&tmp.join("mlp-bf16"));
    assert_eq!(stdout.matches("converted to f32").count(), 4, "{stdout}");
    assert_close(&got, &data[5].1, 0.03);
}

#[test]
fn serve_runs_a_compressed_copy_of_the_checkpoint_with_the_same_output() {
    // The MLP re-saved from Rust with compression: map_all() decodes the compressed weights into copies, their views
    // are those copies, and the output is bit for bit the uncompressed checkpoint's.
    let src = Checkpoint::open(fixture("mlp")).unwrap();
    let tmp = TempDir::new("serve-zstd");
    let names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "input", "reference.output"];
    let data: Vec<(Vec<u64>, Vec<f32>)> =
        names.iter().map(|n| (src.entry(n).unwrap().shape().to_vec(), src.read::<f32>(n).unwrap())).collect();
    let mut s = SaveState::new().unwrap();
    for (name, (shape, values)) in names.iter().zip(&data) {
        s.add_tensor(name, shape, values).unwrap();
    }
    let opts = SaveOptions { sync: false, compression: Compression::Zstd, ..Default::default() };
    s.save(tmp.join("mlp-zstd"), &opts).unwrap();
    let ckpt = Checkpoint::open(tmp.join("mlp-zstd")).unwrap();
    let compressed = names[..4]
        .iter()
        .filter(|n| ckpt.chunk(&ckpt.entry(n).unwrap(), 0).unwrap().codec == Compression::Zstd)
        .count();
    assert!(compressed > 0, "no weight of the MLP compressed");
    let (stdout, got) = run_serve(&tmp.join("mlp-zstd"));
    let (_, want) = run_serve(&fixture("mlp"));
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(stdout.matches("decoded copy (compressed)").count(), compressed, "{stdout}");
    assert_eq!(stdout.matches("zero-copy view").count(), 4 - compressed, "{stdout}");
}
