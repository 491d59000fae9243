//! Zero-copy views of sharded tensors: one view per chunk with its box, and views of regions that are contiguous in
//! one chunk. Every element is compared with what `read()` assembles; every region without a view fails clearly.
mod common;

use common::{fixture, TempDir};
use distckpt::{Checkpoint, ChunkView, Dtype, Element, ErrorCode, ReadOptions, SaveOptions, SaveState};
use std::path::Path;

/// Row-major flat index of `coords` in `shape`.
fn flat(shape: &[u64], coords: &[u64]) -> usize {
    coords.iter().zip(shape).fold(0u64, |acc, (c, s)| acc * s + c) as usize
}

/// Calls `f(global_coords, position_in_box)` for every element of the box, row-major.
fn for_each_in_box(offsets: &[u64], lengths: &[u64], mut f: impl FnMut(&[u64], usize)) {
    let n: u64 = lengths.iter().product();
    let mut coords = offsets.to_vec();
    for i in 0..n as usize {
        f(&coords, i);
        for d in (0..coords.len()).rev() {
            coords[d] += 1;
            if coords[d] < offsets[d] + lengths[d] {
                break;
            }
            coords[d] = offsets[d];
        }
    }
}

/// Checks the chunk views of `name` against `read()`: every element of every chunk equal (bit for bit), and the
/// chunks' boxes tiling the tensor exactly. `mapped`: the reader maps its files (else views are copies). Returns the
/// number of chunks.
fn check_chunk_views<T: Element + PartialEq + std::fmt::Debug>(ckpt: &Checkpoint, name: &str, mapped: bool) -> usize {
    let whole: Vec<T> = ckpt.read(name).unwrap();
    let entry = ckpt.entry(name).unwrap();
    let shape = entry.shape();
    let views: Vec<ChunkView<'_, T>> = ckpt.chunk_views(name).unwrap();
    assert_eq!(views.len(), entry.num_chunks());
    let mut covered = vec![0u8; whole.len()];
    for (k, v) in views.iter().enumerate() {
        assert_eq!((v.chunk_index(), v.name(), v.dtype(), v.shape()), (k, name, entry.dtype(), shape));
        let info = ckpt.chunk(&entry, k).unwrap();
        assert_eq!((v.offsets(), v.lengths()), (info.offsets, info.lengths), "chunk {k}");
        assert_eq!(v.len() as u64, v.lengths().iter().product::<u64>());
        assert_eq!(v.as_bytes().len() as u64, info.length);
        if mapped {
            assert_eq!(v.as_ptr() as usize % 4096, 0, "chunks start on 4 KiB boundaries: {v:?}");
        }
        for_each_in_box(v.offsets(), v.lengths(), |coords, i| {
            let g = flat(shape, coords);
            assert_eq!(v[i], whole[g], "{name} chunk {k} element {i} at {coords:?}");
            covered[g] += 1;
        });
    }
    assert!(covered.iter().all(|c| *c == 1), "{name}: the chunks do not tile the tensor");
    views.len()
}

#[test]
fn chunk_views_of_the_sharded_fixture_match_read() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    // Views read nothing through the library.
    let before = ckpt.io_stats();
    assert_eq!(ckpt.chunk_views::<f32>("sharded.rows").unwrap().len(), 4);
    assert_eq!(ckpt.io_stats(), before);
    assert_eq!(check_chunk_views::<f32>(&ckpt, "sharded.rows", true), 4);
    assert_eq!(check_chunk_views::<f32>(&ckpt, "sharded.cols", true), 2);
    assert_eq!(check_chunk_views::<f32>(&ckpt, "whole", true), 1);

    // The values the fixture's generator wrote (value = flat index; -flat index for the column-sharded one).
    for v in ckpt.chunk_views::<f32>("sharded.rows").unwrap() {
        for_each_in_box(v.offsets(), v.lengths(), |c, i| assert_eq!(v[i], flat(&[256, 64], c) as f32));
    }
    for v in ckpt.chunk_views::<f32>("sharded.cols").unwrap() {
        assert_eq!(v.lengths()[0], 16, "column chunks span every row");
        for_each_in_box(v.offsets(), v.lengths(), |c, i| assert_eq!(v[i], -(flat(&[16, 32], c) as f32)));
    }
}

#[test]
fn whole_rows_of_a_row_sharded_chunk_are_a_view() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    let rows = ckpt.chunk_views::<f32>("sharded.rows").unwrap();
    let second = &rows[1];
    let (r0, n) = (second.offsets()[0], second.lengths()[0]);
    // Whole rows inside the second chunk, part of one row, one element, the whole chunk.
    for (offsets, lengths) in [
        ([r0 + 3, 0], [5, 64]),
        ([r0, 0], [n, 64]),
        ([r0 + n - 1, 0], [1, 64]),
        ([r0 + 7, 10], [1, 20]),
        ([r0 + 2, 63], [1, 1]),
    ] {
        let v = ckpt.view_region::<f32>("sharded.rows", &offsets, &lengths).unwrap();
        assert_eq!((v.offsets(), v.lengths(), v.chunk_index()), (&offsets[..], &lengths[..], 1));
        assert_eq!(&v[..], &ckpt.read_region::<f32>("sharded.rows", &offsets, &lengths).unwrap()[..], "{offsets:?}");
        // It is the chunk's own memory: no copy.
        let at = flat(&[n, 64], &[offsets[0] - r0, offsets[1]]);
        assert_eq!(v.as_ptr(), second[at..].as_ptr());
    }
    // A column slice of the column-sharded tensor's second chunk: whole rows of that chunk, so contiguous in it.
    let cols = ckpt.chunk_views::<f32>("sharded.cols").unwrap();
    let c1 = cols.iter().find(|v| v.offsets()[1] > 0).unwrap();
    let (o, l) = ([4, c1.offsets()[1]], [3, c1.lengths()[1]]);
    let v = ckpt.view_region::<f32>("sharded.cols", &o, &l).unwrap();
    assert_eq!(v.chunk_index(), c1.chunk_index());
    assert_eq!(&v[..], &ckpt.read_region::<f32>("sharded.cols", &o, &l).unwrap()[..]);
    // Any contiguous box of a single-chunk tensor.
    let v = ckpt.view_region::<f32>("whole", &[10, 0], &[4, 64]).unwrap();
    assert!(v.iter().enumerate().all(|(i, x)| *x == 0.5 * (640 + i) as f32));
    let e = ckpt.view_region::<f32>("whole", &[64, 0], &[0, 64]).unwrap();
    assert!(e.is_empty());
}

#[test]
fn regions_without_a_view_say_why_and_what_to_use() {
    let ckpt = Checkpoint::open(fixture("sharded")).unwrap();
    let rows = ckpt.chunk_views::<f32>("sharded.rows").unwrap();
    let (r1, r2) = (rows[1].offsets()[0], rows[2].offsets()[0]);
    // Across the boundary of chunks 1 and 2, and across all four.
    let err = ckpt.view_region::<f32>("sharded.rows", &[r2 - 1, 0], &[2, 64]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported);
    let msg = err.to_string();
    for needle in
        ["sharded.rows", "fixtures/sharded", "spans chunks 1 to 2 of its 4 chunks", "read_region_into()", "read()"]
    {
        assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
    }
    let err = ckpt.view_region::<f32>("sharded.rows", &[0, 0], &[256, 64]).unwrap_err();
    assert!(err.to_string().contains("spans chunks 0 to 3"), "{err}");
    // Across the two column chunks of one row.
    let err = ckpt.view_region::<f32>("sharded.cols", &[3, 0], &[1, 32]).unwrap_err();
    assert!(err.to_string().contains("spans chunks 0 to 1"), "{err}");
    // In one chunk but strided: a column, and two part-rows.
    for (o, l, dims) in
        [([r1, 5], [4, 1], "dimension 1 after taking 4 in dimension 0"), ([r1 + 1, 0], [2, 63], "dimension 1")]
    {
        let err = ckpt.view_region::<f32>("sharded.rows", &o, &l).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Unsupported);
        let msg = err.to_string();
        for needle in ["lies in chunk 1", "not contiguous", dims, "read_region_into()", "sharded.rows"] {
            assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
        }
        // And the path the message names works.
        let mut dst = vec![0f32; (l[0] * l[1]) as usize];
        ckpt.read_region_into("sharded.rows", &o, &l, &mut dst).unwrap();
        let mut want = Vec::new();
        for_each_in_box(&o, &l, |c, _| want.push(flat(&[256, 64], c) as f32));
        assert_eq!(dst, want);
    }
    // Bad arguments are invalid, not unsupported.
    assert_eq!(ckpt.view_region::<f32>("sharded.rows", &[0], &[1]).unwrap_err().code(), ErrorCode::InvalidArgument);
    let err = ckpt.view_region::<f32>("sharded.rows", &[250, 0], &[7, 64]).unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("outside its shape [256, 64] in dimension 0"), "{err}");
    assert_eq!(
        ckpt.view_region::<f32>("sharded.rows", &[u64::MAX, 0], &[2, 1]).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        ckpt.view_region::<f64>("sharded.rows", &[0, 0], &[1, 1]).unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
    assert_eq!(ckpt.chunk_views::<i32>("whole").unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(ckpt.chunk_views::<f32>("no.such").unwrap_err().code(), ErrorCode::NotFound);
    // The whole-tensor view of a sharded tensor now points at the chunk views too.
    let msg = ckpt.view::<f32>("sharded.rows").unwrap_err().to_string();
    assert!(msg.contains("chunk_views()") && msg.contains("view_region()"), "{msg}");
}

#[test]
fn bytes_entries_have_no_chunk_views() {
    let ckpt = Checkpoint::open(fixture("mlp")).unwrap();
    let err = ckpt.chunk_views::<u8>("config.json").unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert!(err.to_string().contains("bytes entry"), "{err}");
    assert_eq!(ckpt.view_region::<u8>("config.json", &[0], &[1]).unwrap_err().code(), ErrorCode::InvalidArgument);
}

/// A 3-d tensor [6, 5, 4] of i64 saved by one process as 6 pieces: 2 along dimension 0 times 3 uneven ones along
/// dimension 1 (value = flat index), plus a u16 (BF16 bits) tensor in 2 row pieces.
fn save_pieces(path: &Path) {
    let shape = [6u64, 5, 4];
    let value = |c: &[u64]| flat(&shape, c) as i64;
    let mut pieces = Vec::new();
    for (o0, l0) in [(0u64, 3u64), (3, 3)] {
        for (o1, l1) in [(0u64, 1u64), (1, 3), (4, 1)] {
            let (o, l) = ([o0, o1, 0], [l0, l1, 4]);
            let mut data = Vec::new();
            for_each_in_box(&o, &l, |c, _| data.push(value(c)));
            pieces.push((o, l, data));
        }
    }
    let bits: Vec<u16> = (0..64u16).map(|i| i.wrapping_mul(977)).collect();
    let mut s = SaveState::new().unwrap();
    s.declare_tensor("grid", Dtype::I64, &shape).unwrap();
    for (o, l, data) in &pieces {
        s.add_piece("grid", o, l, data).unwrap();
    }
    s.declare_tensor("half", Dtype::BF16, &[8, 8]).unwrap();
    s.add_piece("half", &[0, 0], &[4, 8], &bits[..32]).unwrap();
    s.add_piece("half", &[4, 0], &[4, 8], &bits[32..]).unwrap();
    s.save(path, &SaveOptions { sync: false, ..Default::default() }).unwrap();
}

#[test]
fn chunk_views_of_a_tensor_saved_in_pieces_match_read() {
    let tmp = TempDir::new("chunk-pieces");
    let path = tmp.join("ckpt");
    save_pieces(&path);
    for opts in [ReadOptions::default(), ReadOptions { map_files: false, ..Default::default() }] {
        let ckpt = Checkpoint::open_with(&path, None, &opts).unwrap();
        assert_eq!(check_chunk_views::<i64>(&ckpt, "grid", opts.map_files), 6, "map_files {}", opts.map_files);
        assert_eq!(check_chunk_views::<u16>(&ckpt, "half", opts.map_files), 2);
        let halves = ckpt.chunk_views::<u16>("half").unwrap();
        assert_eq!(halves[0].dtype(), Dtype::BF16);
        // In the chunk [3.., 1..4, ..]: whole rows of dimension 1 (contiguous), and a slab that is not.
        let v = ckpt.view_region::<i64>("grid", &[4, 2, 0], &[1, 2, 4]).unwrap();
        assert_eq!(&v[..], &ckpt.read_region::<i64>("grid", &[4, 2, 0], &[1, 2, 4]).unwrap()[..]);
        let v = ckpt.view_region::<i64>("grid", &[5, 1, 1], &[1, 1, 3]).unwrap();
        assert_eq!(&v[..], &[105, 106, 107][..]); // 5 * 20 + 1 * 4 + 1.., 3
        let err = ckpt.view_region::<i64>("grid", &[3, 1, 0], &[2, 2, 4]).unwrap_err();
        assert!(err.to_string().contains("not contiguous") && err.to_string().contains("lies in chunk"), "{err}");
        let err = ckpt.view_region::<i64>("grid", &[2, 0, 0], &[2, 5, 4]).unwrap_err();
        assert!(err.to_string().contains("spans chunks 0 to 5 of its 6 chunks"), "{err}");
        let err = ckpt.view_region::<i64>("grid", &[0, 0, 0], &[1, 5, 4]).unwrap_err();
        assert!(err.to_string().contains("spans chunks 0 to 2 of its 6 chunks"), "{err}");
        let err = ckpt.view_region::<i64>("grid", &[2, 0, 0], &[2, 1, 4]).unwrap_err();
        assert!(err.to_string().contains("spans chunks 0 and 3 of its 6"), "{err}");
    }
}

#[cfg(distckpt_has_comm)]
#[test]
fn chunk_views_of_a_tensor_saved_by_three_ranks() {
    use distckpt::{Comm, ThreadGroup};
    use std::time::Duration;
    let tmp = TempDir::new("chunk-ranks");
    let path = tmp.join("ckpt");
    // [9, 8] f32 in 3 row blocks of 3 rows, one per rank (value = flat index + 0.25), and a replicated bias.
    let handles: Vec<_> = ThreadGroup::new(3)
        .into_iter()
        .enumerate()
        .map(|(r, g)| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut comm = Comm::external(g).unwrap();
                let rows: Vec<f32> = (0..24).map(|i| (r * 24 + i) as f32 + 0.25).collect();
                let bias = vec![1.5f32; 8];
                let mut s = SaveState::new().unwrap();
                s.declare_tensor("w", Dtype::F32, &[9, 8]).unwrap();
                s.add_piece("w", &[3 * r as u64, 0], &[3, 8], &rows).unwrap();
                s.add_tensor("bias", &[8], &bias).unwrap();
                let opts = SaveOptions { sync: false, timeout: Some(Duration::from_secs(60)), ..Default::default() };
                s.save_with_comm(&path, &mut comm, &opts).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let ckpt = Checkpoint::open(&path).unwrap();
    assert_eq!(check_chunk_views::<f32>(&ckpt, "w", true), 3);
    assert_eq!(check_chunk_views::<f32>(&ckpt, "bias", true), 1, "a replicated tensor is one chunk");
    let views = ckpt.chunk_views::<f32>("w").unwrap();
    let mut starts: Vec<u64> = views.iter().map(|v| v.offsets()[0]).collect();
    starts.sort();
    assert_eq!(starts, [0, 3, 6]);
    for v in &views {
        assert_eq!(v.lengths(), &[3, 8]);
        let r0 = v.offsets()[0] as usize;
        assert!(v.iter().enumerate().all(|(i, x)| *x == (r0 * 8 + i) as f32 + 0.25), "{v:?}");
    }
    // Each rank's rows are a view; two ranks' rows are not.
    let v = ckpt.view_region::<f32>("w", &[4, 0], &[2, 8]).unwrap();
    assert_eq!(&v[..], &ckpt.read_region::<f32>("w", &[4, 0], &[2, 8]).unwrap()[..]);
    assert!(ckpt.view_region::<f32>("w", &[2, 0], &[2, 8]).unwrap_err().to_string().contains("spans chunks"));
}

#[test]
fn scalars_and_empty_tensors() {
    let ckpt = Checkpoint::open(fixture("dtypes")).unwrap();
    // A 0-d tensor: one chunk with an empty box, one element.
    let views = ckpt.chunk_views::<f32>("scalar.f32").unwrap();
    assert_eq!(views.len(), 1);
    assert_eq!((views[0].offsets(), views[0].lengths(), &views[0][..]), (&[][..], &[][..], &[3.5f32][..]));
    assert_eq!(&ckpt.view_region::<f32>("scalar.f32", &[], &[]).unwrap()[..], &[3.5]);
    // A tensor with no elements: no chunk to view, and every empty region of it is an empty view.
    let e = ckpt.entry("empty.f32").unwrap();
    assert_eq!(ckpt.chunk_views::<f32>("empty.f32").unwrap().len(), e.num_chunks());
    assert!(ckpt.view_region::<f32>("empty.f32", &[0, 1], &[0, 3]).unwrap().is_empty());
    assert_eq!(ckpt.view_region::<f32>("empty.f32", &[0, 1], &[0, 4]).unwrap_err().code(), ErrorCode::InvalidArgument);
}
