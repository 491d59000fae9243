//! Prints one line per tensor: name, dtype, shape and the FNV-1a 64 digest of its row-major bytes (independent of
//! how the tensor was sharded when saved). Used by tests/crosslang to check that every language reads the same
//! values. On a read error prints `ERROR <tensor>: <message>` and exits 1.
//!
//! With `--values`, prints instead what a Python save's non-array values look like from Rust: `user KEY VALUE` for
//! each user metadata pair, and `value NAME JSON` for each bytes entry read with `Checkpoint::value` (Python's JSON,
//! re-serialised), for tests/crosslang to compare with what Python saved.
//!
//!     cargo run --example digest -- [--values] CHECKPOINT
use std::process::ExitCode;

use distckpt::Checkpoint;

#[path = "common/fnv.rs"]
mod fnv;
use fnv::fnv1a64;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let values = args.first().map(String::as_str) == Some("--values");
    if values {
        args.remove(0);
    }
    let [path] = args.as_slice() else {
        eprintln!("usage: digest [--values] CHECKPOINT");
        return ExitCode::from(2);
    };
    let ckpt = match Checkpoint::open(path) {
        Ok(c) => c,
        Err(e) => {
            println!("ERROR {path}: {e}");
            return ExitCode::from(1);
        }
    };
    if values {
        return print_values(&ckpt);
    }
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
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn print_values(ckpt: &Checkpoint) -> ExitCode {
    for (key, value) in ckpt.user_metadata() {
        println!("user {key} {value}");
    }
    let mut failed = false;
    for e in ckpt.entries().filter(|e| !e.is_tensor()) {
        match ckpt.value(e.name()) {
            Ok(v) => println!("value {} {v}", e.name()),
            Err(err) => {
                println!("ERROR {}: {}", e.name(), err);
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
