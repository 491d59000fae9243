//! Compressed saves from Rust (`SaveOptions::compression`): the checkpoint is format 3.0 and smaller on disk, says
//! which chunks are compressed, reads back exactly (whole tensors, regions, async saves), verifies, and its views
//! work without a mapping: a compressed chunk's view is its decoded, verified copy, kept by the `Checkpoint` (made up
//! front by `map_all`), while raw chunks stay mapped. Damage is an error naming the entry; a bad level is refused.
mod common;

use common::TempDir;
use distckpt::{Checkpoint, Compression, Dtype, ErrorCode, ReadOptions, SaveOptions, SaveState};
use std::path::Path;

const ROWS: u64 = 64;
const COLS: u64 = 1024;
const PIECE_ROWS: u64 = 16;
const MIXED: u64 = 65_536;

/// xorshift64: incompressible bytes, the same on every run.
fn random_u64s(n: usize, mut x: u64) -> Vec<u64> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        })
        .collect()
}

/// What the test saves: floats of one exponent (compressible once their bytes are grouped), random bytes (stored
/// raw), a tensor saved in four pieces, one whose two pieces compress differently, and a repetitive bytes entry.
struct Data {
    weights: Vec<f32>,
    noise: Vec<u8>,
    rows: Vec<f32>,
    mixed: Vec<u32>,
    notes: Vec<u8>,
}

impl Data {
    fn new() -> Data {
        let weights = (0..600_000).map(|i| 1.0 + (i % 4096) as f32 / 4096.0).collect();
        let noise = random_u64s(40_000, 0x9e37_79b9_7f4a_7c15).iter().flat_map(|x| x.to_le_bytes()).collect();
        let rows = (0..ROWS * COLS).map(|i| -2.0 - (i % 512) as f32 / 256.0).collect();
        let mut mixed: Vec<u32> = (0..MIXED as u32).map(|i| i % 16).collect();
        mixed.extend(random_u64s(MIXED as usize, 7).iter().map(|x| (x >> 11) as u32));
        let notes = b"step 100, lr 3e-4; ".repeat(4000);
        Data { weights, noise, rows, mixed, notes }
    }

    fn state(&self) -> SaveState<'_> {
        let mut s = SaveState::new().unwrap();
        s.add_tensor("weights", &[600_000], &self.weights).unwrap();
        s.add_tensor("noise", &[self.noise.len() as u64], &self.noise).unwrap();
        s.declare_tensor("rows", Dtype::F32, &[ROWS, COLS]).unwrap();
        for p in 0..ROWS / PIECE_ROWS {
            let (from, to) = ((p * PIECE_ROWS * COLS) as usize, ((p + 1) * PIECE_ROWS * COLS) as usize);
            s.add_piece("rows", &[p * PIECE_ROWS, 0], &[PIECE_ROWS, COLS], &self.rows[from..to]).unwrap();
        }
        s.declare_tensor("mixed", Dtype::U32, &[2, MIXED]).unwrap();
        s.add_piece("mixed", &[0, 0], &[1, MIXED], &self.mixed[..MIXED as usize]).unwrap();
        s.add_piece("mixed", &[1, 0], &[1, MIXED], &self.mixed[MIXED as usize..]).unwrap();
        s.add_bytes("notes", &self.notes).unwrap();
        s
    }

    fn total_bytes(&self) -> u64 {
        (self.weights.len() * 4 + self.noise.len() + self.rows.len() * 4 + self.mixed.len() * 4 + self.notes.len())
            as u64
    }
}

fn zstd(level: i32) -> SaveOptions {
    SaveOptions {
        sync: false,
        checksum_block_size: 64 << 10,
        compression: Compression::Zstd,
        compression_level: level,
        ..Default::default()
    }
}

fn save(data: &Data, path: &Path) {
    let info = data.state().save(path, &zstd(3)).unwrap();
    assert_eq!(info.total_bytes, data.total_bytes());
    assert!(info.bytes_written < info.total_bytes, "{info:?}");
}

/// The codec of every chunk of `name`.
fn codecs(ckpt: &Checkpoint, name: &str) -> Vec<Compression> {
    let e = ckpt.entry(name).unwrap();
    (0..e.num_chunks()).map(|c| ckpt.chunk(&e, c).unwrap().codec).collect()
}

fn delivered(ckpt: &Checkpoint) -> u64 {
    ckpt.io_stats().bytes_delivered
}

#[test]
fn a_compressed_save_is_format_3_smaller_and_says_which_chunks_are_compressed() {
    let tmp = TempDir::new("compression-info");
    let data = Data::new();
    save(&data, &tmp.join("z"));
    let ckpt = Checkpoint::open(tmp.join("z")).unwrap();
    let info = ckpt.info();
    assert_eq!((info.format_major, info.format_minor), (3, 0), "{info:?}");
    assert_eq!(info.total_bytes, data.total_bytes());
    assert!(info.stored_bytes < info.total_bytes / 2, "{info:?}");
    // weights 1, rows 4, mixed 1 of 2, notes 1; noise stays raw.
    assert_eq!(info.compressed_chunks, 7, "{info:?}");

    assert_eq!(codecs(&ckpt, "weights"), [Compression::Zstd]);
    assert_eq!(codecs(&ckpt, "rows"), [Compression::Zstd; 4]);
    assert_eq!(codecs(&ckpt, "mixed"), [Compression::Zstd, Compression::None]);
    assert_eq!(codecs(&ckpt, "noise"), [Compression::None]);
    assert_eq!(codecs(&ckpt, "notes"), [Compression::Zstd]);
    let e = ckpt.entry("weights").unwrap();
    let w = ckpt.chunk(&e, 0).unwrap();
    assert!(w.stored_length > 0 && w.stored_length < w.length / 2, "{w:?}");
    let e = ckpt.entry("noise").unwrap();
    let n = ckpt.chunk(&e, 0).unwrap();
    assert_eq!(n.stored_length, n.length);
    let stored: u64 = ckpt
        .entries()
        .map(|e| (0..e.num_chunks()).map(|c| ckpt.chunk(&e, c).unwrap().stored_length).sum::<u64>())
        .sum();
    assert_eq!(stored, info.stored_bytes);

    // Without compression: the earlier format, every chunk raw.
    data.state().save(tmp.join("raw"), &SaveOptions { sync: false, ..Default::default() }).unwrap();
    let raw = Checkpoint::open(tmp.join("raw")).unwrap().info();
    assert!(raw.format_major < 3, "{raw:?}");
    assert_eq!((raw.compressed_chunks, raw.stored_bytes), (0, raw.total_bytes));
}

#[test]
fn a_compressed_checkpoint_reads_back_exactly_and_verifies() {
    let tmp = TempDir::new("compression-read");
    let data = Data::new();
    save(&data, &tmp.join("z"));
    for opts in [ReadOptions::default(), ReadOptions { map_files: false, ..Default::default() }] {
        let ckpt = Checkpoint::open_with(tmp.join("z"), None, &opts).unwrap();
        assert_eq!(ckpt.read::<f32>("weights").unwrap(), data.weights);
        assert_eq!(ckpt.read::<u8>("noise").unwrap(), data.noise);
        assert_eq!(ckpt.read::<f32>("rows").unwrap(), data.rows);
        assert_eq!(ckpt.read::<u32>("mixed").unwrap(), data.mixed);
        assert_eq!(ckpt.read_bytes("notes").unwrap(), data.notes);
        // Regions decode only the blocks they touch: one inside a block, one across blocks, one across pieces.
        assert_eq!(ckpt.read_region::<f32>("weights", &[70_000], &[10]).unwrap(), data.weights[70_000..70_010]);
        assert_eq!(ckpt.read_region::<f32>("weights", &[10_000], &[300_000]).unwrap(), data.weights[10_000..310_000]);
        let mut region = vec![0f32; 20 * 300];
        ckpt.read_region_into("rows", &[10, 100], &[20, 300], &mut region).unwrap();
        for (r, row) in region.chunks(300).enumerate() {
            let at = ((10 + r as u64) * COLS + 100) as usize;
            assert_eq!(row, &data.rows[at..at + 300], "row {}", 10 + r);
        }
        assert_eq!(ckpt.read_region::<u32>("mixed", &[0, 5], &[2, 3]).unwrap(), {
            let m = MIXED as usize;
            [&data.mixed[5..8], &data.mixed[m + 5..m + 8]].concat()
        });
        let loaded = ckpt.read_all(None).unwrap();
        let weights = loaded.iter().find(|t| t.name() == "weights").unwrap();
        assert_eq!(weights.as_slice::<f32>().unwrap(), &data.weights[..]);
        ckpt.verify().unwrap();
    }
}

#[test]
fn an_async_compressed_save_reads_back_exactly() {
    let tmp = TempDir::new("compression-async");
    let data = Data::new();
    let future = data.state().save_async(tmp.join("z"), None, &zstd(0)).unwrap();
    let info = future.wait().unwrap();
    assert!(info.bytes_written < info.total_bytes, "{info:?}");
    let ckpt = Checkpoint::open(tmp.join("z")).unwrap();
    assert!(ckpt.info().compressed_chunks > 0);
    assert_eq!(ckpt.read::<f32>("rows").unwrap(), data.rows);
    ckpt.verify().unwrap();
}

#[test]
fn views_of_compressed_chunks_are_decoded_copies_and_raw_chunks_stay_mapped() {
    let tmp = TempDir::new("compression-views");
    let data = Data::new();
    save(&data, &tmp.join("z"));
    for map_files in [true, false] {
        let ckpt = std::sync::Arc::new(
            Checkpoint::open_with(tmp.join("z"), None, &ReadOptions { map_files, ..Default::default() }).unwrap(),
        );
        let what = format!("map_files {map_files}");

        // A compressed tensor: read (and verified) through the library once, then kept.
        let before = delivered(&ckpt);
        let v = ckpt.view::<f32>("weights").unwrap();
        assert_eq!(&v[..], &data.weights[..], "{what}");
        assert_eq!(delivered(&ckpt) - before, data.weights.len() as u64 * 4, "{what}");
        let again = ckpt.view::<f32>("weights").unwrap();
        assert_eq!(again.as_ptr(), v.as_ptr(), "{what}: the same copy");
        assert_eq!(delivered(&ckpt) - before, data.weights.len() as u64 * 4, "{what}: no second read");
        assert!(matches!(ckpt.view_or_read::<f32>("weights").unwrap(), std::borrow::Cow::Borrowed(_)), "{what}");
        assert_eq!(ckpt.view_verified::<f32>("weights").unwrap().as_ptr(), v.as_ptr(), "{what}");
        assert_eq!(&ckpt.view_owned::<f32>("weights").unwrap()[..], &data.weights[..], "{what}");
        assert_eq!(ckpt.view_bytes("weights").unwrap().to_f32_vec().unwrap(), data.weights, "{what}");

        // Chunk views and regions of a tensor in compressed pieces.
        let chunks = ckpt.chunk_views::<f32>("rows").unwrap();
        assert_eq!(chunks.len(), 4, "{what}");
        for c in &chunks {
            let from = (c.offsets()[0] * COLS) as usize;
            assert_eq!(c.lengths(), &[PIECE_ROWS, COLS][..], "{what}");
            assert_eq!(&c[..], &data.rows[from..from + (PIECE_ROWS * COLS) as usize], "{what}");
        }
        let region = ckpt.view_region::<f32>("rows", &[18, 0], &[3, COLS]).unwrap();
        assert_eq!(&region[..], &data.rows[(18 * COLS) as usize..(21 * COLS) as usize], "{what}");
        let owned = ckpt.view_region_owned::<f32>("rows", &[40, 0], &[1, COLS]).unwrap();
        assert_eq!(&owned[..], &data.rows[(40 * COLS) as usize..(41 * COLS) as usize], "{what}");
        // A view still needs one chunk: a region across pieces is refused, compressed or not.
        let err = ckpt.view_region::<f32>("rows", &[10, 0], &[10, COLS]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unsupported, "{what}: {err}");
        assert!(err.to_string().contains("rows"), "{err}");

        // A tensor with one compressed and one raw chunk: both views exact.
        let mixed = ckpt.chunk_views::<u32>("mixed").unwrap();
        assert_eq!(&mixed[0][..], &data.mixed[..MIXED as usize], "{what}");
        assert_eq!(&mixed[1][..], &data.mixed[MIXED as usize..], "{what}");

        // A raw chunk of the same checkpoint is still mapped: nothing read through the library.
        let before = delivered(&ckpt);
        let noise = ckpt.view::<u8>("noise").unwrap();
        assert_eq!(&noise[..], &data.noise[..], "{what}");
        if map_files {
            assert_eq!(delivered(&ckpt), before, "{what}: a raw chunk is mapped, not read");
            assert_eq!(noise.as_ptr() as usize % 4096, 0, "{what}");
        }
    }
}

#[test]
fn map_all_decodes_compressed_chunks_once_and_maps_the_rest() {
    let tmp = TempDir::new("compression-map-all");
    let data = Data::new();
    save(&data, &tmp.join("z"));
    let ckpt = Checkpoint::open(tmp.join("z")).unwrap();
    let mut last = (0u64, 0u64);
    let mut calls = 0;
    let mut progress = |done: u64, total: u64| {
        assert!(done >= last.0 && done <= total, "{done}/{total} after {last:?}");
        last = (done, total);
        calls += 1;
        true
    };
    ckpt.map_entries(None, Some(&mut progress)).unwrap();
    assert!(calls > 0);
    assert_eq!(last, (data.total_bytes(), data.total_bytes()));

    // Every view is now ready: none reads anything.
    let before = delivered(&ckpt);
    assert_eq!(&ckpt.view::<f32>("weights").unwrap()[..], &data.weights[..]);
    assert_eq!(&ckpt.view::<u8>("noise").unwrap()[..], &data.noise[..]);
    for (c, view) in ckpt.chunk_views::<f32>("rows").unwrap().iter().enumerate() {
        let from = c * (PIECE_ROWS * COLS) as usize;
        assert_eq!(&view[..], &data.rows[from..from + (PIECE_ROWS * COLS) as usize]);
    }
    let mixed: Vec<u32> = ckpt.chunk_views::<u32>("mixed").unwrap().iter().flat_map(|v| v.to_vec()).collect();
    assert_eq!(mixed, data.mixed);
    assert_eq!(delivered(&ckpt), before, "views after map_all read nothing");
    ckpt.map_all().unwrap(); // again: the copies are kept

    // Only some entries; a progress callback that stops; a reader that maps nothing.
    let fresh = Checkpoint::open(tmp.join("z")).unwrap();
    fresh.map_entries(Some(&["rows", "noise"]), None).unwrap();
    let before = delivered(&fresh);
    assert_eq!(fresh.chunk_views::<f32>("rows").unwrap().len(), 4);
    assert_eq!(delivered(&fresh), before);
    let mut stop = |_: u64, _: u64| false;
    let err = Checkpoint::open(tmp.join("z")).unwrap().map_entries(None, Some(&mut stop)).unwrap_err();
    assert_eq!(err.code(), ErrorCode::User, "{err}");
    let unmapped =
        Checkpoint::open_with(tmp.join("z"), None, &ReadOptions { map_files: false, ..Default::default() }).unwrap();
    let err = unmapped.map_all().unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported, "{err}");
    assert!(err.to_string().contains("map_files"), "{err}");
}

#[test]
fn a_damaged_compressed_block_is_an_error_naming_the_entry_never_wrong_bytes() {
    let tmp = TempDir::new("compression-corrupt");
    let data = Data::new();
    let dir = tmp.join("z");
    save(&data, &dir);
    let (file, at) = {
        let ckpt = Checkpoint::open(&dir).unwrap();
        let e = ckpt.entry("weights").unwrap();
        let c = ckpt.chunk(&e, 0).unwrap();
        assert_eq!(c.codec, Compression::Zstd);
        (dir.join(c.file), (c.file_offset + c.stored_length / 2) as usize)
    };
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[at] ^= 0x5a;
    std::fs::write(&file, bytes).unwrap();

    let ckpt = Checkpoint::open(&dir).unwrap();
    for err in [
        ckpt.view::<f32>("weights").unwrap_err(),
        ckpt.view_verified::<f32>("weights").unwrap_err(),
        ckpt.read::<f32>("weights").unwrap_err(),
        ckpt.map_all().unwrap_err(),
        ckpt.verify().unwrap_err(),
    ] {
        assert_eq!(err.code(), ErrorCode::Corrupt, "{err}");
        assert!(err.to_string().contains("weights"), "{err}");
    }
    // The rest of the checkpoint still reads and views.
    assert_eq!(&ckpt.view::<u8>("noise").unwrap()[..], &data.noise[..]);
    assert_eq!(ckpt.read::<f32>("rows").unwrap(), data.rows);
}

#[test]
fn a_bad_compression_level_or_codec_is_refused_and_nothing_is_saved() {
    let tmp = TempDir::new("compression-bad");
    let data = Data::new();
    for level in [23, -8, i32::MAX] {
        let err = data.state().save(tmp.join("bad"), &zstd(level)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument, "level {level}: {err}");
        assert!(err.to_string().contains(&level.to_string()), "{err}");
        assert!(!tmp.join("bad").exists());
    }
    let opts = SaveOptions { compression: Compression::Unknown(7), ..zstd(0) };
    let err = data.state().save(tmp.join("bad"), &opts).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(!tmp.join("bad").exists());
    // zstd's range ends, and the default.
    let small: Vec<u32> = (0..16_384).map(|i| i % 7).collect();
    for level in [-7, 22, 0] {
        let path = tmp.join(&format!("level{level}"));
        let mut s = SaveState::new().unwrap();
        s.add_tensor("small", &[small.len() as u64], &small).unwrap();
        s.save(&path, &zstd(level)).unwrap();
        let ckpt = Checkpoint::open(&path).unwrap();
        assert_eq!(ckpt.info().compressed_chunks, 1, "level {level}");
        assert_eq!(ckpt.read::<u32>("small").unwrap(), small, "level {level}");
    }
}

#[test]
fn compression_values_are_the_c_abis() {
    assert_eq!(Compression::default(), Compression::None);
    for c in [Compression::None, Compression::Zstd, Compression::Unknown(9)] {
        assert_eq!(Compression::from_raw(c.raw()), c);
    }
    assert_eq!((Compression::None.raw(), Compression::Zstd.raw()), (0, 1));
    assert_eq!(
        (Compression::None.to_string(), Compression::Zstd.to_string(), Compression::Unknown(9).to_string()),
        ("none".to_string(), "zstd".to_string(), "codec 9".to_string())
    );
    assert!(Compression::Zstd.is_compressed() && !Compression::None.is_compressed());
    assert_eq!(SaveOptions::default().compression, Compression::None);
}
