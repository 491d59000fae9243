//! Prints one line per tensor: name, dtype, shape and the FNV-1a 64 digest of its row-major bytes (independent of
//! how the tensor was sharded when saved). Used by tests/crosslang to check that every language reads the same
//! values. On a read error prints `ERROR <tensor>: <message>` and exits 1.
//!
//!     cargo run --example digest -- CHECKPOINT
use std::process::ExitCode;

use distckpt::Checkpoint;

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: digest CHECKPOINT");
        return ExitCode::from(2);
    };
    let ckpt = match Checkpoint::open(&path) {
        Ok(c) => c,
        Err(e) => {
            println!("ERROR {path}: {e}");
            return ExitCode::from(1);
        }
    };
    let mut failed = false;
    for e in ckpt.entries().filter(|e| e.is_tensor()) {
        match ckpt.read_raw(e.name()) {
            Ok(bytes) => println!("{} {:?} {:?} {:016x}", e.name(), e.dtype(), e.shape(), fnv1a64(&bytes)),
            Err(err) => {
                println!("ERROR {}: {}", e.name(), err);
                failed = true;
            }
        }
    }
    if failed { ExitCode::from(1) } else { ExitCode::SUCCESS }
}
