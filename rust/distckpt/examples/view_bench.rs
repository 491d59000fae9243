//! Times `view()` of a large tensor against `read::<f32>()` of it, cold (file evicted from the page cache with
//! posix_fadvise DONTNEED, no root needed) and warm (in the page cache).
//!
//!     cargo run --release --example view_bench -- [--gib N] [--dir DIR] [--keep] [--reps N] [--shards K]
//!
//! Saves a checkpoint holding one N-GiB F32 tensor (default 1) under DIR (default: the temp dir), then measures
//!   view:  open + view() (returns the slice), first byte, one byte of every page touched, every element summed;
//!   read:  read::<f32>() with checksums verified (the default) and without, then the same sum.
//! Each warm figure is the best of --reps runs (default 3). Not a test: numbers depend on the machine.
//!
//! Then the same tensor saved as K row shards (default 4; 0 skips it), as several ranks save it: `chunk_views()`
//! (one zero-copy view per chunk, every element summed) against `read()` (a copy into one contiguous Vec), and
//! `read_region_into()` of one shard's rows into a caller buffer against `view_region()` of the same rows.
use std::hint::black_box;
use std::os::raw::c_int;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use distckpt::{Advice, Checkpoint, Dtype, ReadOptions, SaveOptions, SaveState};

extern "C" {
    fn posix_fadvise(fd: c_int, offset: i64, len: i64, advice: c_int) -> c_int;
}
const POSIX_FADV_DONTNEED: c_int = 4;

/// Drops the checkpoint's files from the page cache (clean pages only; the data was fsync'd by the save).
fn evict(dir: &Path) {
    for f in std::fs::read_dir(dir).unwrap() {
        let file = std::fs::File::open(f.unwrap().path()).unwrap();
        let rc = unsafe { posix_fadvise(file.as_raw_fd(), 0, 0, POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise");
    }
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1e3;
    if ms < 1.0 {
        format!("{:.1} us", ms * 1e3)
    } else {
        format!("{ms:.1} ms")
    }
}

fn gibps(bytes: u64, d: Duration) -> String {
    format!("{:.2} GiB/s", bytes as f64 / (1u64 << 30) as f64 / d.as_secs_f64())
}

fn sum(v: &[f32]) -> f64 {
    // 8 independent accumulators so the loop streams memory instead of waiting on one add chain.
    let mut acc = [0f32; 8];
    let chunks = v.chunks_exact(8);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for i in 0..8 {
            acc[i] += c[i];
        }
    }
    acc.iter().map(|a| *a as f64).sum::<f64>() + rest as f64
}

struct ViewTimes {
    /// The view() call alone, the checkpoint being open already.
    view_call: Duration,
    open_view: Duration,
    first_byte: Duration,
    touch_pages: Duration,
    sum_all: Duration,
}

/// Every time is counted from the open call but `view_call`. With `advice`, the madvise call is part of "open + view".
fn time_view(path: &Path, advice: Option<Advice>) -> ViewTimes {
    let t = Instant::now();
    let ckpt = Checkpoint::open(path).unwrap();
    let t_view = Instant::now();
    let v = ckpt.view::<f32>("weight").unwrap();
    let view_call = t_view.elapsed();
    if let Some(a) = advice {
        v.advise(a).unwrap();
    }
    let open_view = t.elapsed();
    black_box(v[0]);
    let first_byte = t.elapsed();
    let per_page = 4096 / 4;
    let mut s = 0f32;
    for i in (0..v.len()).step_by(per_page) {
        s += v[i];
    }
    black_box(s);
    let touch_pages = t.elapsed();
    black_box(sum(&v));
    let sum_all = t.elapsed();
    ViewTimes { view_call, open_view, first_byte, touch_pages, sum_all }
}

/// Once its file is mapped, a view is a metadata lookup: the mean of 1000.
fn time_view_again(path: &Path) -> Duration {
    let ckpt = Checkpoint::open(path).unwrap();
    black_box(ckpt.view::<f32>("weight").unwrap().as_ptr());
    let t = Instant::now();
    for _ in 0..1000 {
        black_box(ckpt.view::<f32>("weight").unwrap().as_ptr());
    }
    t.elapsed() / 1000
}

fn time_read(path: &Path, verify: bool) -> (Duration, Duration) {
    let t = Instant::now();
    let ckpt = Checkpoint::open_with(path, None, &ReadOptions { verify, ..Default::default() }).unwrap();
    let v: Vec<f32> = ckpt.read("weight").unwrap();
    let read = t.elapsed();
    black_box(sum(&v));
    (read, t.elapsed())
}

/// The physical reference: the chunk's bytes read with std::fs into a fresh Vec (one read_exact call).
fn time_std_read(path: &Path) -> Duration {
    let (file, offset, len) = {
        let ckpt = Checkpoint::open(path).unwrap();
        let e = ckpt.entry("weight").unwrap();
        let c = ckpt.chunk(&e, 0).unwrap();
        (path.join(c.file), c.file_offset, c.length as usize)
    };
    let t = Instant::now();
    let mut f = std::fs::File::open(file).unwrap();
    std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(offset)).unwrap();
    let mut buf = vec![0u8; len];
    std::io::Read::read_exact(&mut f, &mut buf).unwrap();
    black_box(&buf);
    t.elapsed()
}

fn main() {
    let mut gib = 1u64;
    let mut dir = std::env::temp_dir();
    let mut keep = false;
    let mut reps = 3;
    let mut shards = 4u64;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--gib" => gib = args.next().and_then(|v| v.parse().ok()).expect("--gib N"),
            "--dir" => dir = PathBuf::from(args.next().expect("--dir DIR")),
            "--keep" => keep = true,
            "--reps" => reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--shards" => shards = args.next().and_then(|v| v.parse().ok()).expect("--shards K"),
            other => panic!("unknown argument {other}"),
        }
    }
    let bytes = gib << 30;
    let path = dir.join(format!("distckpt-view-bench-{gib}g"));
    println!("view_bench: one F32 tensor of {gib} GiB, checkpoint {}", path.display());

    if !path.join("metadata.dckpt").exists() {
        let n = (bytes / 4) as usize;
        let data: Vec<f32> = (0..n).map(|i| (i % 1024) as f32).collect();
        let t = Instant::now();
        let mut s = SaveState::new().unwrap();
        s.add_tensor("weight", &[n as u64 / 1024, 1024], &data).unwrap();
        let info = s.save(&path, &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
        let d = t.elapsed();
        println!("save (fsync'd, checksummed): {} ({}), {} bytes", ms(d), gibps(bytes, d), info.bytes_written);
    }
    let want = sum(&Checkpoint::open(&path).unwrap().read::<f32>("weight").unwrap());

    // Cold: each measurement starts with the file evicted. Warm: in the page cache, best of `reps`.
    let cold = |f: &dyn Fn() -> Duration| {
        evict(&path);
        f()
    };
    let warm = |f: &dyn Fn() -> Duration| {
        f();
        (0..reps).map(|_| f()).min().unwrap()
    };
    let both = |f: &dyn Fn() -> Duration| (cold(f), warm(f));
    type Row<'a> = (&'a str, Box<dyn Fn() -> Duration + 'a>);
    let p = &path;
    let rows: Vec<Row> = vec![
        ("std::fs read_exact of the chunk into a Vec (reference)", Box::new(move || time_std_read(p))),
        ("view(): the view() call alone (checkpoint open)", Box::new(move || time_view(p, None).view_call)),
        ("view(): view() again, file already mapped (mean of 1000)", Box::new(move || time_view_again(p))),
        ("view(): open + view() returns &[f32]", Box::new(move || time_view(p, None).open_view)),
        ("view(): first element read", Box::new(move || time_view(p, None).first_byte)),
        ("view(): one f32 of every 4 KiB page read", Box::new(move || time_view(p, None).touch_pages)),
        ("view(): every element summed", Box::new(move || time_view(p, None).sum_all)),
        ("view() + Advice::PopulateRead returns", Box::new(move || time_view(p, Some(Advice::PopulateRead)).open_view)),
        (
            "view() + Advice::PopulateRead: every element summed",
            Box::new(move || time_view(p, Some(Advice::PopulateRead)).sum_all),
        ),
        (
            "view() + Advice::WillNeed: every element summed",
            Box::new(move || time_view(p, Some(Advice::WillNeed)).sum_all),
        ),
        (
            "view() + Advice::Sequential: every element summed",
            Box::new(move || time_view(p, Some(Advice::Sequential)).sum_all),
        ),
        ("read::<f32>() (checksums verified, the default)", Box::new(move || time_read(p, true).0)),
        ("read::<f32>() then every element summed", Box::new(move || time_read(p, true).1)),
        ("read::<f32>() with verify: false", Box::new(move || time_read(p, false).0)),
    ];
    let results: Vec<(Duration, Duration)> = rows.iter().map(|(_, f)| both(f.as_ref())).collect();

    let got = sum(&Checkpoint::open(&path).unwrap().view::<f32>("weight").unwrap());
    assert_eq!(got, want, "view and read disagree");

    println!();
    println!("{:<56} {:>12} {:>12}", "(times counted from the open call)", "cold cache", "warm cache");
    for ((name, _), (c, w)) in rows.iter().zip(&results) {
        println!("{name:<56} {:>12} {:>12}", ms(*c), ms(*w));
    }
    let get = |name: &str| results[rows.iter().position(|(n, _)| n.starts_with(name)).unwrap()];
    let (first_c, first_w) = get("view(): first element");
    let (read_c, read_w) = get("read::<f32>() (checksums");
    let (sum_c, sum_w) = get("view(): every element");
    let (rsum_c, rsum_w) = get("read::<f32>() then");
    let (std_c, std_w) = get("std::fs");
    println!();
    println!(
        "time to first element: view {} vs read {} cold ({:.0}x); {} vs {} warm ({:.0}x)",
        ms(first_c),
        ms(read_c),
        read_c.as_secs_f64() / first_c.as_secs_f64(),
        ms(first_w),
        ms(read_w),
        read_w.as_secs_f64() / first_w.as_secs_f64()
    );
    println!(
        "whole tensor used once: view {} vs read {} cold; {} vs {} warm",
        ms(sum_c),
        ms(rsum_c),
        ms(sum_w),
        ms(rsum_w)
    );
    println!(
        "throughput: view+sum {} cold / {} warm; read {} / {}; std::fs read {} / {}",
        gibps(bytes, sum_c),
        gibps(bytes, sum_w),
        gibps(bytes, read_c),
        gibps(bytes, read_w),
        gibps(bytes, std_c),
        gibps(bytes, std_w)
    );
    if !keep {
        std::fs::remove_dir_all(&path).unwrap();
    }
    if shards > 0 {
        sharded(&dir, gib, shards, reps, keep);
    }
}

/// The tensor saved as `shards` row pieces (so `shards` chunks): chunk views against copies, cold and warm.
fn sharded(dir: &Path, gib: u64, shards: u64, reps: usize, keep: bool) {
    let path = dir.join(format!("distckpt-view-bench-{gib}g-{shards}shards"));
    let rows = ((gib << 30) / 4 / 1024) as usize;
    assert!(rows as u64 % shards == 0, "--gib rows must divide into --shards");
    let per = rows / shards as usize;
    println!();
    println!("sharded: the same {gib} GiB tensor saved as {shards} row shards ({per} rows each), {}", path.display());
    let data: Vec<f32> = (0..rows * 1024).map(|i| (i % 1024) as f32).collect();
    {
        let mut s = SaveState::new().unwrap();
        s.declare_tensor("weight", Dtype::F32, &[rows as u64, 1024]).unwrap();
        for k in 0..shards as usize {
            s.add_piece(
                "weight",
                &[(k * per) as u64, 0],
                &[per as u64, 1024],
                &data[k * per * 1024..(k + 1) * per * 1024],
            )
            .unwrap();
        }
        s.save(&path, &SaveOptions { overwrite: true, ..Default::default() }).unwrap();
    }
    // Summed per shard, as the chunk views are (f32 sums depend on where the slices start).
    let want: f64 = data.chunks(per * 1024).map(sum).sum();
    drop(data);
    let p = &path;
    let chunk_views = move || {
        let t = Instant::now();
        let ckpt = Checkpoint::open(p).unwrap();
        let views = ckpt.chunk_views::<f32>("weight").unwrap();
        assert_eq!(views.len() as u64, shards);
        let total: f64 = views.iter().map(|v| sum(v)).sum();
        let d = t.elapsed();
        assert_eq!(total, want, "chunk views disagree with the saved data");
        d
    };
    let read_all = move || {
        let t = Instant::now();
        let ckpt = Checkpoint::open(p).unwrap();
        let v: Vec<f32> = ckpt.read("weight").unwrap();
        black_box(sum(&v));
        t.elapsed()
    };
    let mid = (shards / 2) as usize * per;
    let region_view = move || {
        let t = Instant::now();
        let ckpt = Checkpoint::open(p).unwrap();
        let v = ckpt.view_region::<f32>("weight", &[mid as u64, 0], &[per as u64, 1024]).unwrap();
        black_box(sum(&v));
        t.elapsed()
    };
    let region_read = move || {
        let mut buf = vec![0f32; per * 1024];
        let t = Instant::now();
        let ckpt = Checkpoint::open(p).unwrap();
        ckpt.read_region_into("weight", &[mid as u64, 0], &[per as u64, 1024], &mut buf).unwrap();
        black_box(sum(&buf));
        t.elapsed()
    };
    type Row<'a> = (&'a str, u64, Box<dyn Fn() -> Duration + 'a>);
    let table: Vec<Row> = vec![
        ("chunk_views(): open + every element of every chunk summed", gib << 30, Box::new(chunk_views)),
        ("read(): open + copy into one Vec + sum", gib << 30, Box::new(read_all)),
        ("view_region() of one shard's rows + sum", (gib << 30) / shards, Box::new(region_view)),
        ("read_region_into() of the same rows + sum", (gib << 30) / shards, Box::new(region_read)),
    ];
    println!("{:<60} {:>22} {:>22}", "", "cold cache", "warm cache");
    for (name, bytes, f) in &table {
        evict(&path);
        let c = f();
        f();
        let w = (0..reps).map(|_| f()).min().unwrap();
        println!("{name:<60} {:>9} {:>12} {:>9} {:>12}", ms(c), gibps(*bytes, c), ms(w), gibps(*bytes, w));
    }
    if !keep {
        std::fs::remove_dir_all(&path).unwrap();
    }
}
