//! Owned views: views that keep their checkpoint alive through an `Arc`, so a server can hold them in a struct, move
//! them across threads, and free the checkpoint with the last of them.
mod common;

use common::{fixture, same_f32};
use distckpt::{Checkpoint, Dtype, ErrorCode, OwnedChunkView, OwnedTensorView, ReadOptions};
use std::sync::{Arc, Weak};

/// What an inference server keeps: its weights as views, and no checkpoint binding of its own.
struct Model {
    w1: OwnedTensorView<f32>,
    b1: OwnedTensorView<f32>,
    rows: Vec<OwnedChunkView<f32>>,
    whole_rows: OwnedChunkView<f32>,
}

/// Opens the checkpoints, takes the views and returns them: the `Arc<Checkpoint>` bindings end here.
fn load(opts: &ReadOptions) -> (Model, Weak<Checkpoint>, Weak<Checkpoint>) {
    let mlp = Arc::new(Checkpoint::open_with(fixture("mlp"), None, opts).unwrap());
    let sharded = Arc::new(Checkpoint::open_with(fixture("sharded"), None, opts).unwrap());
    let w1 = mlp.view_owned::<f32>("fc1.weight").unwrap();
    assert_eq!(Arc::strong_count(&mlp), 2, "a view holds one share");
    let b1 = mlp.view_owned::<f32>("fc1.bias").unwrap();
    let rows = sharded.chunk_views_owned::<f32>("sharded.rows").unwrap();
    let whole_rows = sharded.view_region_owned::<f32>("sharded.rows", &[70, 0], &[3, 64]).unwrap();
    assert_eq!(Arc::strong_count(&sharded), 1 + rows.len() + 1);
    // A failed view leaves no share behind.
    assert_eq!(mlp.view_owned::<f64>("fc1.weight").unwrap_err().code(), ErrorCode::InvalidArgument);
    assert_eq!(sharded.view_owned::<f32>("sharded.rows").unwrap_err().code(), ErrorCode::Unsupported);
    assert_eq!(Arc::strong_count(&mlp), 3);
    assert_eq!(Arc::strong_count(&sharded), 6);
    (Model { w1, b1, rows, whole_rows }, Arc::downgrade(&mlp), Arc::downgrade(&sharded))
}

fn check_model(m: &Model, reference_w1: &[f32], reference_b1: &[f32]) {
    assert_eq!((m.w1.name(), m.w1.dtype(), m.w1.shape()), ("fc1.weight", Dtype::F32, &[64u64, 32][..]));
    assert_eq!(m.w1.as_slice(), reference_w1, "values exact");
    assert_eq!(&m.b1[..], reference_b1);
    assert_eq!(m.rows.len(), 4);
    for v in &m.rows {
        let r0 = v.offsets()[0] as usize;
        assert_eq!(v.lengths()[1], 64);
        assert!(v.iter().enumerate().all(|(i, x)| *x == (r0 * 64 + i) as f32), "{v:?}");
    }
    assert_eq!((m.whole_rows.offsets(), m.whole_rows.lengths()), (&[70u64, 0][..], &[3u64, 64][..]));
    assert!(m.whole_rows.iter().enumerate().all(|(i, x)| *x == (70 * 64 + i) as f32));
    assert_eq!(m.whole_rows.chunk_index(), 1);
}

#[test]
fn a_struct_of_owned_views_outlives_the_checkpoint_binding_and_frees_it_last() {
    for map_files in [true, false] {
        let opts = ReadOptions { map_files, ..Default::default() };
        let reference = Checkpoint::open(fixture("mlp")).unwrap();
        let (w1, b1) = (reference.read::<f32>("fc1.weight").unwrap(), reference.read::<f32>("fc1.bias").unwrap());
        drop(reference);

        let (model, mlp, sharded) = load(&opts);
        // Nothing but the views holds the checkpoints now.
        assert_eq!(mlp.strong_count(), 2);
        assert_eq!(sharded.strong_count(), 5);
        check_model(&model, &w1, &b1);

        // Moved to another thread (Send), used there and shared by reference across more (Sync).
        let (model, w1, _b1) = std::thread::spawn(move || {
            std::thread::scope(|s| {
                for _ in 0..4 {
                    s.spawn(|| check_model(&model, &w1, &b1));
                }
            });
            (model, w1, b1)
        })
        .join()
        .unwrap();

        // Clones share too; the checkpoint lives while any view does.
        let extra = model.w1.clone();
        assert_eq!(mlp.strong_count(), 3);
        let Model { w1: v1, b1: vb, rows, whole_rows } = model;
        drop(v1);
        drop(vb);
        assert_eq!(mlp.strong_count(), 1);
        assert_eq!(&extra[..], &w1[..], "still valid after the other views dropped");
        assert_eq!(extra.checkpoint().path(), fixture("mlp"));
        drop(extra);
        assert!(mlp.upgrade().is_none(), "the last view freed the checkpoint");

        drop(rows);
        assert_eq!(sharded.strong_count(), 1);
        assert!(whole_rows.iter().enumerate().all(|(i, x)| *x == (70 * 64 + i) as f32));
        drop(whole_rows);
        assert!(sharded.upgrade().is_none());
    }
}

#[test]
fn owned_views_from_any_kind_of_view() {
    let ckpt = Arc::new(Checkpoint::open(fixture("dtypes")).unwrap());
    // view_bytes of a BF16 tensor, converted; view_verified; a borrowed view taken back out.
    let bytes = OwnedTensorView::new(Arc::clone(&ckpt), |c| c.view_bytes("bf16.values")).unwrap();
    assert_eq!(bytes.dtype(), Dtype::BF16);
    let (got, want) = (bytes.to_f32_vec().unwrap(), ckpt.read::<f32>("bf16.expected").unwrap());
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(a, b)| same_f32(*a, *b)), "{got:?} != {want:?}");
    let verified = OwnedTensorView::new(Arc::clone(&ckpt), |c| c.view_verified::<i32>("matrix.i32")).unwrap();
    assert_eq!(verified.view().as_slice(), &(0..12).collect::<Vec<i32>>()[..]);
    assert_eq!(verified.entry().shape(), &[3, 4]);
    let part =
        OwnedChunkView::new(Arc::clone(&ckpt), |c| c.view_region::<i32>("matrix.i32", &[1, 0], &[2, 4])).unwrap();
    assert_eq!(&part[..], &(4..12).collect::<Vec<i32>>()[..]);
    assert_eq!(part.view().offsets(), &[1, 0]);
    let err =
        OwnedChunkView::new(Arc::clone(&ckpt), |c| c.view_region::<i32>("matrix.i32", &[0, 1], &[2, 2])).unwrap_err();
    assert_eq!(err.code(), ErrorCode::Unsupported);
    assert_eq!(Arc::strong_count(&ckpt), 4);
    assert!(format!("{verified:?}").contains("matrix.i32"));
}

#[test]
fn owned_views_are_send_and_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    send_sync::<OwnedTensorView<f32>>();
    send_sync::<OwnedTensorView<u16>>();
    send_sync::<OwnedChunkView<[f64; 2]>>();
    send_sync::<distckpt::ChunkView<'static, i8>>();
}
