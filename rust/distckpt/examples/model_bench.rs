//! Whole-model loads, as an inference server does before it serves: every tensor of a transformer-like checkpoint
//! made ready for use in one process, with checksums verified. bench/run's scenario (g) drives it against
//! safetensors loading the same model (bench/peers.py `st-model`), cold and warm; it also runs on its own:
//!
//!     cargo run --release --example model_bench -- make --dir DIR [--gib G]
//!     cargo run --release --example model_bench -- run --dir DIR --mode MODE [--cold] [--threads N]
//!
//! `make` saves the checkpoint DIR/ckpt (bf16: embedding, then per layer q/k/v/o, gate/up/down and two norms, as
//! many layers as fit in G GiB, default 2) and exports the same tensors as DIR/st/model-00001-of-00001.safetensors
//! with the library's exporter. `run` times one load in a fresh process and prints one JSON line:
//! {"mode", "seconds", "bytes", "check"}. Modes:
//!   map_all    open + `map_all()` (read into the page cache, mapped, verified in place), then one byte of every
//!              4 KiB page of every tensor read through its view: the zero-copy path
//!   read_all   open + `read_all()` into page-aligned buffers the library allocates (verified), then the same bytes
//!   views      open + views without verification, then the same bytes: what an unverified mmap loader does
//! `check` is the sum of the bytes read (one per page, at tensor offsets 0, 4096, ...); safetensors' side reports
//! the same sum, and bench/driver.py compares them. `--cold` first drops the files from the page cache
//! (posix_fadvise DONTNEED; the data was fsync'd by `make`). `--threads`: the reader's I/O threads (0: default).
use std::hint::black_box;
use std::os::raw::c_int;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use distckpt::{export_safetensors, Checkpoint, Dtype, ExportOptions, SaveOptions, SaveState};

extern "C" {
    fn posix_fadvise(fd: c_int, offset: i64, len: i64, advice: c_int) -> c_int;
}
const POSIX_FADV_DONTNEED: c_int = 4;

fn evict(dir: &Path) {
    for f in std::fs::read_dir(dir).unwrap() {
        let p = f.unwrap().path();
        if p.is_dir() {
            evict(&p);
            continue;
        }
        let file = std::fs::File::open(&p).unwrap();
        assert_eq!(unsafe { posix_fadvise(file.as_raw_fd(), 0, 0, POSIX_FADV_DONTNEED) }, 0, "posix_fadvise");
    }
}

/// The model: (name, shape) in bf16, about `gib` GiB.
fn layout(gib: f64) -> Vec<(String, Vec<u64>)> {
    let (h, i, v) = (2048u64, 5632u64, 32000u64);
    let per_layer = (4 * h * h + 3 * h * i + 2 * h) * 2;
    let embed = v * h * 2;
    let target = (gib * (1u64 << 30) as f64) as u64;
    let layers = (target.saturating_sub(2 * embed) / per_layer).max(1);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for l in 0..layers {
        let p = format!("model.layers.{l}.");
        for (n, s) in [
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![h, h]),
            ("self_attn.v_proj.weight", vec![h, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            out.push((p.clone() + n, s));
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    out.push(("lm_head.weight".to_string(), vec![v, h]));
    out
}

/// Deterministic bytes for tensor `t` (not constant, so that a misplaced block shows in the check).
fn fill(t: usize, buf: &mut [u8]) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    for c in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        c.copy_from_slice(&b[..c.len()]);
    }
}

/// One byte of every 4 KiB page, summed: the touch that makes a lazily mapped tensor resident, and the value check.
fn touch(bytes: &[u8]) -> u64 {
    bytes.iter().step_by(4096).map(|&b| b as u64).sum()
}

fn make(dir: &Path, gib: f64) {
    let ckpt = dir.join("ckpt");
    let st = dir.join("st");
    let layout = layout(gib);
    let bufs: Vec<Vec<u8>> = layout
        .iter()
        .enumerate()
        .map(|(t, (_, shape))| {
            let mut b = vec![0u8; shape.iter().product::<u64>() as usize * 2];
            fill(t, &mut b);
            b
        })
        .collect();
    let mut s = SaveState::new().unwrap();
    for ((name, shape), b) in layout.iter().zip(&bufs) {
        let bits: &[u16] = unsafe { std::slice::from_raw_parts(b.as_ptr().cast(), b.len() / 2) };
        s.add_tensor_as(name, Dtype::BF16, shape, bits).unwrap();
    }
    let info = s.save(&ckpt, &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
    let check: u64 = bufs.iter().map(|b| touch(b)).sum();
    drop(bufs);
    std::fs::create_dir_all(&st).unwrap();
    export_safetensors(&ckpt, &st, &ExportOptions::default(), None).unwrap();
    for f in std::fs::read_dir(&st).unwrap() {
        std::fs::File::open(f.unwrap().path()).unwrap().sync_all().unwrap();
    }
    println!(
        "{{\"mode\": \"make\", \"tensors\": {}, \"bytes\": {}, \"check\": {check}}}",
        layout.len(),
        info.bytes_written
    );
}

fn run(dir: &Path, mode: &str, cold: bool, threads: u32) {
    let path = dir.join("ckpt");
    if cold {
        evict(&path);
    }
    let t = Instant::now();
    let ckpt = Checkpoint::open_with(&path, None, &distckpt::ReadOptions { io_threads: threads, ..Default::default() })
        .unwrap();
    let mut bytes = 0u64;
    let mut check = 0u64;
    match mode {
        "map_all" | "views" => {
            if mode == "map_all" {
                ckpt.map_all().unwrap();
            }
            for e in ckpt.entries().filter(|e| e.is_tensor()) {
                let v = ckpt.view_bytes(e.name()).unwrap();
                bytes += v.len() as u64;
                check += touch(&v);
            }
        }
        "read_all" => {
            for t in ckpt.read_all(None).unwrap() {
                bytes += t.as_bytes().len() as u64;
                check += touch(t.as_bytes());
            }
        }
        other => panic!("unknown mode {other}"),
    }
    let seconds = t.elapsed().as_secs_f64();
    black_box(&ckpt);
    println!(
        "{{\"mode\": \"{mode}\", \"seconds\": {seconds:.6}, \"bytes\": {bytes}, \"check\": {check}, \"cold\": {cold}}}"
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().expect("model_bench make|run ...");
    let (mut dir, mut gib, mut mode, mut cold, mut threads) =
        (PathBuf::new(), 2.0f64, String::from("map_all"), false, 0u32);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => dir = PathBuf::from(args.next().expect("--dir DIR")),
            "--gib" => gib = args.next().and_then(|v| v.parse().ok()).expect("--gib G"),
            "--mode" => mode = args.next().expect("--mode MODE"),
            "--cold" => cold = true,
            "--threads" => threads = args.next().and_then(|v| v.parse().ok()).expect("--threads N"),
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(!dir.as_os_str().is_empty(), "--dir is required");
    match cmd.as_str() {
        "make" => make(&dir, gib),
        "run" => run(&dir, &mode, cold, threads),
        other => panic!("unknown command {other}"),
    }
}
