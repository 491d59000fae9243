//! Storage written in Rust (`distckpt::Storage`) behind the C callbacks: save, open, read, verify and resharded
//! loads through it; bounded concurrency; errors and panics of the storage; an interrupted save and its prune; the
//! lifetime of a handle a reader or an async save still uses. Plus the built-in memory storage and export.
mod common;

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use distckpt::{
    export_safetensors, Checkpoint, Dtype, ErrorCode, ExportOptions, LoadState, PathKind, ReadOptions, SaveOptions,
    SaveState, Storage, StorageFile, StorageHandle, Upload,
};

/// What a test makes the store do, on top of storing files.
#[derive(Default)]
struct Faults {
    /// Writes, reads, creates... of paths containing this fail with `message` (kind Other).
    fail_on: Option<(String, String, &'static str)>, // (path part, message, op: "read" | "write" | "create")
    /// Reads of paths containing this panic.
    panic_on_read: Option<String>,
    /// Writes of paths containing this panic.
    panic_on_write: Option<String>,
    /// Once a writer marker ("STAGING.") has been created, writing the metadata (the commit) "crashes the process":
    /// from then on every write, close, remove and commit fails, as if nobody were left to finish or clean up.
    crash_after_marker: bool,
}

/// An in-memory store of files: a HashMap behind a Mutex, counting the write and read calls in flight.
#[derive(Default)]
struct MemStore {
    files: Mutex<HashMap<String, Vec<u8>>>,
    faults: Mutex<Faults>,
    marker_seen: AtomicBool,
    crashed: AtomicBool,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    writes: AtomicUsize,
    reads: AtomicUsize,
    /// Each write and read sleeps this long, so that concurrent calls overlap visibly.
    delay: Mutex<Duration>,
    dropped: Mutex<Option<Arc<AtomicBool>>>,
}

impl Drop for MemStore {
    fn drop(&mut self) {
        if let Some(d) = &*self.dropped.lock().unwrap() {
            d.store(true, Ordering::SeqCst);
        }
    }
}

struct Busy<'a>(&'a MemStore);
impl<'a> Busy<'a> {
    fn enter(s: &'a MemStore) -> Busy<'a> {
        let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        s.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let d = *s.delay.lock().unwrap();
        if !d.is_zero() {
            std::thread::sleep(d);
        }
        Busy(s)
    }
}
impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MemStore {
    fn new() -> Arc<MemStore> {
        Arc::new(MemStore::default())
    }
    /// The faults (a panic the test injected never poisons them: none is raised while they are locked).
    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap()
    }
    fn fault(&self, op: &str, path: &str) -> io::Result<()> {
        let f = self.faults();
        if let Some((part, msg, fop)) = &f.fail_on {
            if *fop == op && path.contains(part.as_str()) {
                return Err(io::Error::other(msg.clone()));
            }
        }
        Ok(())
    }
    fn crashed(&self) -> io::Result<()> {
        if self.crashed.load(Ordering::SeqCst) {
            return Err(io::Error::other("the process is gone"));
        }
        Ok(())
    }
    fn paths(&self) -> BTreeSet<String> {
        self.files.lock().unwrap().keys().cloned().collect()
    }
    fn paths_under(&self, dir: &str) -> BTreeSet<String> {
        self.paths().into_iter().filter(|p| p.starts_with(&format!("{dir}/"))).collect()
    }
}

struct MemFile {
    store: Arc<MemStore>,
    path: String,
    data: Mutex<Vec<u8>>,
}

impl StorageFile for MemFile {
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let s = &*self.store;
        let _busy = Busy::enter(s);
        s.writes.fetch_add(1, Ordering::SeqCst);
        s.crashed()?;
        if s.faults().crash_after_marker
            && s.marker_seen.load(Ordering::SeqCst)
            && self.path.ends_with("metadata.dckpt")
        {
            s.crashed.store(true, Ordering::SeqCst);
            s.crashed()?;
        }
        let panic_on = s.faults().panic_on_write.clone();
        if panic_on.is_some_and(|p| self.path.contains(p.as_str())) {
            panic!("injected panic writing {}", self.path);
        }
        s.fault("write", &self.path)?;
        let mut buf = self.data.lock().unwrap();
        let end = offset as usize + data.len();
        if buf.len() < end {
            buf.resize(end, 0);
        }
        buf[offset as usize..end].copy_from_slice(data);
        Ok(())
    }
    fn close(self: Box<Self>, size: u64, discard: bool) -> io::Result<()> {
        if discard {
            return Ok(());
        }
        self.store.crashed()?;
        let mut data = self.data.into_inner().unwrap();
        data.resize(size as usize, 0);
        self.store.files.lock().unwrap().insert(self.path, data);
        Ok(())
    }
}

/// The store as a `Storage`: an `Arc` wrapper, so that the test keeps its own reference to look inside.
struct Shared(Arc<MemStore>, bool /* supports_commit */);

impl Storage for Shared {
    fn create(&self, path: &str, _size_hint: u64) -> io::Result<Box<dyn StorageFile>> {
        self.0.fault("create", path)?;
        if path.contains("STAGING.") {
            self.0.marker_seen.store(true, Ordering::SeqCst);
        }
        Ok(Box::new(MemFile { store: self.0.clone(), path: path.to_string(), data: Mutex::new(Vec::new()) }))
    }
    fn size(&self, path: &str) -> io::Result<u64> {
        match self.0.files.lock().unwrap().get(path) {
            Some(d) => Ok(d.len() as u64),
            None => Err(io::Error::new(io::ErrorKind::NotFound, format!("no file {path}"))),
        }
    }
    fn read_at(&self, path: &str, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let s = &*self.0;
        let _busy = Busy::enter(s);
        s.reads.fetch_add(1, Ordering::SeqCst);
        let panic_on = s.faults().panic_on_read.clone();
        if panic_on.is_some_and(|p| path.contains(p.as_str())) {
            panic!("injected panic reading {path}");
        }
        s.fault("read", path)?;
        let files = s.files.lock().unwrap();
        let d = files.get(path).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no file {path}")))?;
        let start = (offset as usize).min(d.len());
        let n = buf.len().min(d.len() - start);
        buf[..n].copy_from_slice(&d[start..start + n]);
        Ok(n)
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let prefix = format!("{}/", dir.trim_end_matches('/'));
        let names: BTreeSet<String> = self
            .0
            .files
            .lock()
            .unwrap()
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix).map(|rest| rest.split('/').next().unwrap().to_string()))
            .collect();
        Ok(names.into_iter().collect())
    }
    fn remove(&self, path: &str) -> io::Result<()> {
        self.0.crashed()?;
        self.0.files.lock().unwrap().remove(path);
        Ok(())
    }
    fn supports_commit(&self) -> bool {
        self.1
    }
    fn commit(&self, path: &str, data: &[u8], replace: bool) -> io::Result<()> {
        self.0.crashed()?;
        let mut files = self.0.files.lock().unwrap();
        if !replace && files.contains_key(path) {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{path} exists")));
        }
        files.insert(path.to_string(), data.to_vec());
        Ok(())
    }
}

fn handle(store: &Arc<MemStore>, max_in_flight: u32) -> StorageHandle {
    StorageHandle::from_storage(Arc::new(Shared(store.clone(), false)), max_in_flight).unwrap()
}

fn save_opts(h: &StorageHandle) -> SaveOptions {
    SaveOptions { sync: false, ..Default::default() }.with_storage(h)
}

fn read_opts(h: &StorageHandle) -> ReadOptions {
    ReadOptions::default().with_storage(h)
}

/// A [rows, cols] f32 tensor whose value is its flat index.
fn iota(rows: u64, cols: u64) -> Vec<f32> {
    (0..rows * cols).map(|i| i as f32).collect()
}

/// Saves "w" [64, 48] f32, "b" [48] f64 and a bytes entry at `path`.
fn save_small(h: &StorageHandle, path: &str) -> (Vec<f32>, Vec<f64>) {
    let w = iota(64, 48);
    let b: Vec<f64> = (0..48).map(|i| i as f64 * 0.5).collect();
    let mut s = SaveState::new().unwrap();
    s.add_tensor("w", &[64, 48], &w).unwrap();
    s.add_tensor("b", &[48], &b).unwrap();
    s.add_bytes("meta", b"hello storage").unwrap().set_user("step", "7").unwrap();
    s.save(path, &save_opts(h)).unwrap();
    (w, b)
}

#[test]
fn save_open_read_verify_and_resharded_load_through_a_rust_storage() {
    for with_commit in [false, true] {
        let store = MemStore::new();
        let h = StorageHandle::from_storage(Arc::new(Shared(store.clone(), with_commit)), 0).unwrap();
        let path = format!("bucket/run{}/step-7", with_commit as u8);
        let (w, b) = save_small(&h, &path);

        // Everything is in the store, nothing on the file system; the layout is the metadata-last one.
        assert!(!std::path::Path::new(&path).exists());
        let files = store.paths_under(&path);
        assert!(files.contains(&format!("{path}/metadata.dckpt")), "{files:?}");
        assert!(files.iter().any(|f| f.contains("/data-00000.") && f.ends_with(".bin")), "{files:?}");

        let ckpt = Checkpoint::open_with(&path, None, &read_opts(&h)).unwrap();
        assert_eq!(ckpt.read::<f32>("w").unwrap(), w);
        assert_eq!(ckpt.read::<f64>("b").unwrap(), b);
        assert_eq!(ckpt.read_bytes("meta").unwrap(), b"hello storage");
        assert_eq!(ckpt.user("step"), Some("7"));
        ckpt.verify().unwrap();
        // A region spanning rows 10..30, columns 5..20: only those bytes.
        let region = ckpt.read_region::<f32>("w", &[10, 5], &[20, 15]).unwrap();
        for r in 0..20 {
            for c in 0..15 {
                assert_eq!(region[r * 15 + c], ((10 + r) * 48 + 5 + c) as f32);
            }
        }
        // Views work too (a copy: this storage cannot map).
        assert_eq!(&ckpt.view::<f32>("w").unwrap()[..], &w[..]);
        assert!(store.reads.load(Ordering::SeqCst) > 0);

        // A resharded load: rows split 3 ways unevenly, columns split in two, straight into buffers.
        let cuts = [(0u64, 5u64), (5, 40), (40, 64)];
        let mut parts: Vec<Vec<f32>> =
            cuts.iter().flat_map(|&(r0, r1)| [0, 1].map(|_| vec![0f32; ((r1 - r0) * 24) as usize])).collect();
        {
            let mut ls = LoadState::new().unwrap();
            ls.declare_tensor("w", Dtype::F32, &[64, 48]).unwrap();
            let mut it = parts.iter_mut();
            for &(r0, r1) in &cuts {
                for c0 in [0u64, 24] {
                    ls.add_piece("w", &[r0, c0], &[r1 - r0, 24], it.next().unwrap()).unwrap();
                }
            }
            ls.load(&path, &read_opts(&h)).unwrap();
        }
        let mut i = 0;
        for &(r0, r1) in &cuts {
            for c0 in [0u64, 24] {
                for r in r0..r1 {
                    for c in 0..24 {
                        assert_eq!(
                            parts[i][((r - r0) * 24 + c) as usize],
                            (r * 48 + c0 + c) as f32,
                            "part {i} row {r}"
                        );
                    }
                }
                i += 1;
            }
        }

        let info = h.stat(&path, Duration::ZERO).unwrap();
        assert_eq!(info.kind, PathKind::Checkpoint);
        assert_eq!(info.leftover_files, 0, "{info:?}");
        assert!(info.files >= 2 && info.bytes > 0, "{info:?}");

        // Saving again without overwrite is refused; with it, the new one replaces the old.
        let again = SaveState::new().unwrap().save(&path, &save_opts(&h)).unwrap_err();
        assert_eq!(again.code(), ErrorCode::Exists, "{again}");
        let v2 = vec![1.5f32; 4];
        let mut s = SaveState::new().unwrap();
        s.add_tensor("v", &[4], &v2).unwrap();
        s.save(&path, &SaveOptions { overwrite: true, ..save_opts(&h) }).unwrap();
        let ckpt2 = Checkpoint::open_with(&path, None, &read_opts(&h)).unwrap();
        assert_eq!(ckpt2.read::<f32>("v").unwrap(), v2);
        // The first reader still reads its own checkpoint, or fails cleanly: never the other's bytes.
        if let Ok(v) = ckpt.read::<f32>("w") {
            assert_eq!(v, w);
        }

        h.remove_checkpoint(&path).unwrap();
        assert!(store.paths_under(&path).is_empty(), "{:?}", store.paths_under(&path));
        let gone = Checkpoint::open_with(&path, None, &read_opts(&h)).unwrap_err();
        assert_eq!(gone.code(), ErrorCode::NotFound, "{gone}");
    }
}

#[test]
fn calls_run_concurrently_and_never_past_max_in_flight() {
    let store = MemStore::new();
    *store.delay.lock().unwrap() = Duration::from_millis(3);
    let h = handle(&store, 3);
    // 8 tensors of 1 MiB, 4 KiB checksum blocks: plenty of writes for 8 I/O threads.
    let data: Vec<Vec<f32>> = (0..8).map(|t| (0..256 * 1024).map(|i| (t * 1_000_000 + i) as f32).collect()).collect();
    let mut s = SaveState::new().unwrap();
    for (t, d) in data.iter().enumerate() {
        s.add_tensor(&format!("t{t}"), &[256, 1024], d).unwrap();
    }
    let opts = SaveOptions { io_threads: 8, checksum_block_size: 4096, ..save_opts(&h) };
    s.save("conc/ckpt", &opts).unwrap();
    let writes = store.writes.load(Ordering::SeqCst);
    let max_w = store.max_in_flight.swap(0, Ordering::SeqCst);
    eprintln!("save: {writes} writes, at most {max_w} at once");
    assert!(max_w <= 3, "{max_w} write calls ran at once, max_in_flight is 3");
    assert!(max_w > 1, "writes never overlapped ({writes} writes, io_threads 8)");

    let ckpt = Checkpoint::open_with("conc/ckpt", None, &ReadOptions { io_threads: 8, ..read_opts(&h) }).unwrap();
    ckpt.verify().unwrap();
    let mut ls = LoadState::new().unwrap();
    let mut outs: Vec<Vec<f32>> = (0..8).map(|_| vec![0f32; 256 * 1024]).collect();
    for (t, o) in outs.iter_mut().enumerate() {
        ls.add_tensor(&format!("t{t}"), &[256, 1024], o).unwrap();
    }
    ls.load("conc/ckpt", &ReadOptions { io_threads: 8, ..read_opts(&h) }).unwrap();
    drop(ls);
    assert_eq!(outs, data);
    let reads = store.reads.load(Ordering::SeqCst);
    let max_r = store.max_in_flight.load(Ordering::SeqCst);
    eprintln!("verify + load: {reads} reads, at most {max_r} at once");
    assert!(max_r <= 3, "{max_r} read calls ran at once, max_in_flight is 3");
    assert!(max_r > 1, "reads never overlapped ({reads} reads, io_threads 8)");
}

#[test]
fn a_storage_error_names_the_path_and_keeps_the_storage_message() {
    let store = MemStore::new();
    let h = handle(&store, 0);
    save_small(&h, "err/ckpt");
    store.faults().fail_on = Some(("data-".into(), "injected read failure 42".into(), "read"));
    let ckpt = Checkpoint::open_with("err/ckpt", None, &read_opts(&h)).unwrap(); // the metadata reads fine
    let e = ckpt.read::<f32>("w").unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("err/ckpt"), "{msg}");
    assert!(msg.contains("data-00000."), "the error does not name the data file: {msg}");
    assert!(msg.contains("injected read failure 42"), "the storage's message is lost: {msg}");
    let e = ckpt.verify().unwrap_err();
    assert!(e.to_string().contains("injected read failure 42"), "{e}");

    // A failing create during a save: the save fails naming the path, and leaves no checkpoint.
    store.faults().fail_on = Some(("data-".into(), "bucket quota exceeded".into(), "create"));
    let w = vec![1f32; 16];
    let mut s = SaveState::new().unwrap();
    s.add_tensor("w", &[16], &w).unwrap();
    let e = s.save("err/ckpt2", &save_opts(&h)).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("err/ckpt2"), "{msg}");
    assert!(msg.contains("bucket quota exceeded"), "{msg}");
    store.faults().fail_on = None;
    let e = Checkpoint::open_with("err/ckpt2", None, &read_opts(&h)).unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
}

#[test]
fn io_error_kinds_map_to_codes() {
    use distckpt::storage::io_error_code;
    assert_eq!(io_error_code(&io::Error::from(io::ErrorKind::NotFound)), ErrorCode::NotFound);
    assert_eq!(io_error_code(&io::Error::from(io::ErrorKind::AlreadyExists)), ErrorCode::Exists);
    assert_eq!(io_error_code(&io::Error::from(io::ErrorKind::PermissionDenied)), ErrorCode::Io);
    let wrapped: io::Error = distckpt::Error::new(ErrorCode::NoSpace, "full").into();
    assert_eq!(io_error_code(&wrapped), ErrorCode::NoSpace);
}

#[test]
fn a_panicking_storage_gives_an_error_not_an_abort() {
    let store = MemStore::new();
    let h = handle(&store, 0);
    save_small(&h, "panic/ckpt");
    store.faults().panic_on_read = Some("data-".into());
    let ckpt = Checkpoint::open_with("panic/ckpt", None, &read_opts(&h)).unwrap();
    let e = ckpt.read::<f32>("w").unwrap_err();
    assert!(e.to_string().contains("panicked"), "{e}");
    assert!(e.to_string().contains("injected panic reading"), "{e}");

    store.faults().panic_on_write = Some("data-".into());
    let w = vec![2f32; 1024];
    let mut s = SaveState::new().unwrap();
    s.add_tensor("w", &[1024], &w).unwrap();
    let e = s.save("panic/ckpt2", &save_opts(&h)).unwrap_err();
    assert!(e.to_string().contains("panicked"), "{e}");
    // An async save too: the panic happens on a library thread; the future reports it.
    let e = s.save_async("panic/ckpt3", None, &save_opts(&h)).unwrap().wait().unwrap_err();
    assert!(e.to_string().contains("panic/ckpt3"), "{e}");

    let mut f = store.faults();
    f.panic_on_read = None;
    f.panic_on_write = None;
    drop(f);
    // The storage still works afterwards.
    assert_eq!(
        Checkpoint::open_with("panic/ckpt", None, &read_opts(&h)).unwrap().read::<f32>("w").unwrap(),
        iota(64, 48)
    );
}

#[test]
fn an_interrupted_save_leaves_no_checkpoint_and_prune_cleans_up() {
    for overwrite in [false, true] {
        let store = MemStore::new();
        let h = handle(&store, 0);
        let path = "crash/ckpt";
        let old = overwrite.then(|| save_small(&h, path));
        let committed = store.paths();

        store.faults().crash_after_marker = true;
        let w = vec![3f32; 64 * 1024];
        let mut s = SaveState::new().unwrap();
        s.add_tensor("w", &[64 * 1024], &w).unwrap();
        let e = s.save(path, &SaveOptions { overwrite, ..save_opts(&h) }).unwrap_err();
        eprintln!("interrupted save: {e}");
        assert!(store.crashed.load(Ordering::SeqCst));
        // The "process" is back: the storage works again, and looks at what was left.
        store.crashed.store(false, Ordering::SeqCst);
        store.faults().crash_after_marker = false;
        let left: Vec<String> = store.paths().difference(&committed).cloned().collect();
        assert!(left.iter().any(|p| p.contains("STAGING.")), "no marker left: {left:?}");

        match &old {
            None => {
                let e = Checkpoint::open_with(path, None, &read_opts(&h)).unwrap_err();
                assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
            }
            Some((w_old, _)) => {
                let ckpt = Checkpoint::open_with(path, None, &read_opts(&h)).unwrap();
                assert_eq!(&ckpt.read::<f32>("w").unwrap(), w_old);
            }
        }

        assert!(left.iter().any(|p| p.contains("/data-00000.")), "no data file left: {left:?}");
        // Within the grace period the save counts as in progress and nothing is removed.
        let info = h.stat(path, Duration::from_secs(3600)).unwrap();
        assert_eq!(info.kind, if overwrite { PathKind::Checkpoint } else { PathKind::Incomplete }, "{info:?}");
        assert_eq!(info.saves_in_progress, 1, "{info:?}");
        assert!(h.remove_leftovers(path, Duration::from_secs(3600), false).unwrap().is_empty());

        // Markers carry their start time in whole seconds: a grace of zero needs the clock to have moved on.
        std::thread::sleep(Duration::from_millis(1100));
        let info = h.stat(path, Duration::ZERO).unwrap();
        assert_eq!(info.saves_in_progress, 0, "{info:?}");
        assert_eq!(info.leftover_files as usize, left.len(), "{info:?} vs {left:?}");
        let would = h.remove_leftovers(path, Duration::ZERO, true).unwrap();
        assert_eq!(store.paths().difference(&committed).count(), left.len(), "a dry run removed something");
        let removed = h.remove_leftovers(path, Duration::ZERO, false).unwrap();
        assert_eq!(would, removed);
        let removed: BTreeSet<String> = removed.into_iter().collect();
        assert_eq!(removed, left.iter().cloned().collect::<BTreeSet<_>>());
        assert_eq!(store.paths(), committed, "prune removed a committed file or left something");

        let info = h.stat(path, Duration::ZERO).unwrap();
        assert_eq!(info.leftover_files, 0);
        assert_eq!(info.kind, if overwrite { PathKind::Checkpoint } else { PathKind::None }, "{info:?}");
        if overwrite {
            Checkpoint::open_with(path, None, &read_opts(&h)).unwrap().verify().unwrap();
        }
    }
}

#[test]
fn readers_and_async_saves_keep_a_dropped_handle_alive() {
    let dropped = Arc::new(AtomicBool::new(false));
    let store = MemStore::new();
    *store.dropped.lock().unwrap() = Some(dropped.clone());
    let h = StorageHandle::from_storage(Arc::new(Shared(store.clone(), true)), 0).unwrap();
    let (w, _) = save_small(&h, "alive/ckpt");
    let ckpt = Checkpoint::open_with("alive/ckpt", None, &read_opts(&h)).unwrap();

    // An async save holds the storage too.
    let big = vec![4f32; 256 * 1024];
    let mut s = SaveState::new().unwrap();
    s.add_tensor("big", &[256 * 1024], &big).unwrap();
    let future = s.save_async("alive/async", None, &save_opts(&h)).unwrap();
    drop(s);
    drop(h);
    drop(store); // only the storage handle's clones keep the MemStore now
    assert!(!dropped.load(Ordering::SeqCst));
    future.wait().unwrap();

    let reader = std::thread::spawn(move || {
        assert_eq!(ckpt.read::<f32>("w").unwrap(), w);
        ckpt.verify().unwrap();
        let h2 = ckpt.storage().unwrap().clone();
        let ck2 = Checkpoint::open_with("alive/async", None, &read_opts(&h2)).unwrap();
        assert_eq!(ck2.read::<f32>("big").unwrap(), vec![4f32; 256 * 1024]);
        (ckpt, ck2, h2)
    });
    let (ckpt, ck2, h2) = reader.join().unwrap();
    assert!(!dropped.load(Ordering::SeqCst));
    drop(ckpt);
    drop(h2);
    assert!(!dropped.load(Ordering::SeqCst));
    drop(ck2);
    assert!(dropped.load(Ordering::SeqCst), "the storage outlived its last user");
}

#[test]
fn memory_storage_and_export_to_a_rust_storage() {
    let mem = StorageHandle::memory().unwrap();
    let (w, b) = save_small(&mem, "m/ckpt");
    assert!(!std::path::Path::new("m/ckpt").exists());
    let ckpt = Checkpoint::open_with("m/ckpt", None, &read_opts(&mem)).unwrap();
    assert_eq!(ckpt.read::<f32>("w").unwrap(), w);
    assert_eq!(mem.stat("m/ckpt", Duration::ZERO).unwrap().kind, PathKind::Checkpoint);

    let out = MemStore::new();
    let out_h = handle(&out, 0);
    let opts = ExportOptions { storage: Some(mem.clone()), out_storage: Some(out_h.clone()), ..Default::default() };
    export_safetensors("m/ckpt", "hf/model", &opts, None).unwrap();
    let files = out.paths_under("hf/model");
    assert!(files.contains("hf/model/model.safetensors.index.json"), "{files:?}");
    let st: Vec<_> = files.iter().filter(|f| f.ends_with(".safetensors")).collect();
    assert_eq!(st.len(), 1, "{files:?}");
    // The export, read in place from the Rust storage by the core (the one safetensors parser): both tensors.
    let hf = Checkpoint::open_with("hf/model", None, &read_opts(&out_h)).unwrap();
    assert_eq!((hf.format(), hf.checksummed()), (distckpt::Format::Safetensors, false));
    assert_eq!((hf.read::<f32>("w").unwrap(), hf.read::<f64>("b").unwrap()), (w.clone(), b.clone()));
    drop(hf);

    // Rename rules, applied by the core: "w" becomes "model.w", "b" is left out; a clash names both tensors.
    let renamed = ExportOptions {
        rename: vec![(r"(w)".into(), r"model.\1".into()), ("b".into(), String::new())],
        buffer_bytes: 4096,
        ..opts.clone()
    };
    export_safetensors("m/ckpt", "hf/renamed", &renamed, None).unwrap();
    let index = out.files.lock().unwrap()["hf/renamed/model.safetensors.index.json"].clone();
    let index = String::from_utf8(index).unwrap();
    assert!(index.contains("\"model.w\"") && !index.contains("\"b\""), "{index}");
    let clash = ExportOptions { rename: vec![(".".into(), "x".into())], ..opts.clone() };
    let e = export_safetensors("m/ckpt", "hf/clash", &clash, None).unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("'w'") && e.to_string().contains("'b'"), "{e}");

    // Missing source: an error naming it.
    let e = export_safetensors("m/none", "hf/x", &opts, None).unwrap_err();
    assert!(e.to_string().contains("m/none"), "{e}");

    mem.remove_checkpoint("m/ckpt").unwrap();
    assert_eq!(mem.stat("m/ckpt", Duration::ZERO).unwrap().kind, PathKind::None);
    let e = mem.remove_checkpoint("m/ckpt").unwrap_err();
    assert_eq!(e.code(), ErrorCode::NotFound, "{e}");
}

#[cfg(distckpt_has_comm)]
#[test]
fn three_ranks_save_and_two_ranks_load_resharded_through_one_storage() {
    use common::ranks;
    let store = MemStore::new();
    let h = handle(&store, 4);
    let timeout = Some(Duration::from_secs(60));
    // [6, 4] "w" in 2-row pieces per rank, a replicated "bias".
    let hs = h.clone();
    ranks(3, move |r, mut comm| {
        let rows: Vec<f32> = (0..8).map(|i| (r * 8 + i) as f32).collect();
        let bias = vec![0.25f64; 4];
        let mut s = SaveState::new().unwrap();
        s.declare_tensor("w", Dtype::F32, &[6, 4]).unwrap();
        s.add_piece("w", &[2 * r as u64, 0], &[2, 4], &rows).unwrap();
        s.add_tensor("bias", &[4], &bias).unwrap();
        s.save_with_comm("multi/ckpt", &mut comm, &SaveOptions { timeout, ..save_opts(&hs) }).unwrap()
    });
    assert!(store.paths_under("multi/ckpt").contains("multi/ckpt/metadata.dckpt"));
    let hl = h.clone();
    let got = ranks(2, move |r, mut comm| {
        // Rank r loads columns [2r, 2r + 2) of every row.
        let mut cols = vec![0f32; 12];
        let mut bias = vec![0f64; 4];
        let mut ls = LoadState::new().unwrap();
        ls.declare_tensor("w", Dtype::F32, &[6, 4]).unwrap();
        ls.add_piece("w", &[0, 2 * r as u64], &[6, 2], &mut cols).unwrap();
        ls.add_tensor("bias", &[4], &mut bias).unwrap();
        ls.load_with_comm("multi/ckpt", &mut comm, &ReadOptions { timeout, ..read_opts(&hl) }).unwrap();
        drop(ls);
        (cols, bias)
    });
    for (r, (cols, bias)) in got.into_iter().enumerate() {
        assert_eq!(bias, vec![0.25; 4]);
        for row in 0..6 {
            for c in 0..2 {
                assert_eq!(cols[row * 2 + c], (row * 4 + 2 * r + c) as f32, "rank {r} row {row}");
            }
        }
    }
}

#[test]
fn posix_handle_is_the_file_system_and_memory_outlives_its_handle() {
    let tmp = common::TempDir::new("storage-posix");
    let path = tmp.join("ckpt");
    let posix = StorageHandle::posix().unwrap();
    let w = iota(8, 8);
    let mut s = SaveState::new().unwrap();
    s.add_tensor("w", &[8, 8], &w).unwrap();
    s.save(&path, &save_opts(&posix)).unwrap();
    assert!(path.join("metadata.dckpt").is_file());
    assert_eq!(Checkpoint::open(&path).unwrap().read::<f32>("w").unwrap(), w); // no storage: the same files
    assert_eq!(Checkpoint::open_with(&path, None, &read_opts(&posix)).unwrap().read::<f32>("w").unwrap(), w);

    // The memory storage's files live as long as a reader of them does.
    let mem = StorageHandle::memory().unwrap();
    s.save("mem/ckpt", &save_opts(&mem)).unwrap();
    let ckpt = Checkpoint::open_with("mem/ckpt", None, &ReadOptions { map_files: false, ..read_opts(&mem) }).unwrap();
    drop(mem);
    assert_eq!(ckpt.read::<f32>("w").unwrap(), w);
    ckpt.verify().unwrap();
    let h = ckpt.storage().unwrap().clone();
    drop(ckpt);
    assert_eq!(h.stat("mem/ckpt", Duration::ZERO).unwrap().kind, PathKind::Checkpoint);
}

/// The memory store with multipart uploads: parts are kept per upload and become the file on complete; every part
/// sent is logged (number, size), and part `fail_part` fails.
struct Parted {
    store: Arc<MemStore>,
    part: u64,
    log: Arc<Mutex<Vec<(u32, usize)>>>,
    aborted: Arc<AtomicUsize>,
    fail_part: u32,
}

struct PartedUpload {
    store: Arc<MemStore>,
    path: String,
    parts: Mutex<std::collections::BTreeMap<u32, Vec<u8>>>,
    log: Arc<Mutex<Vec<(u32, usize)>>>,
    aborted: Arc<AtomicUsize>,
    fail_part: u32,
}

impl Upload for PartedUpload {
    fn upload_part(&self, number: u32, data: &[u8]) -> io::Result<()> {
        self.log.lock().unwrap().push((number, data.len()));
        if number == self.fail_part {
            return Err(io::Error::new(io::ErrorKind::Other, "connection reset"));
        }
        self.parts.lock().unwrap().insert(number, data.to_vec());
        Ok(())
    }
    fn complete(self: Box<Self>) -> io::Result<()> {
        let parts = self.parts.into_inner().unwrap();
        let mut object = Vec::new();
        for (i, (n, bytes)) in parts.into_iter().enumerate() {
            assert_eq!(n as usize, i + 1, "parts are numbered from 1 without gaps");
            object.extend_from_slice(&bytes);
        }
        self.store.files.lock().unwrap().insert(self.path, object);
        Ok(())
    }
    fn abort(self: Box<Self>) -> io::Result<()> {
        self.aborted.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl Storage for Parted {
    fn create(&self, path: &str, size_hint: u64) -> io::Result<Box<dyn StorageFile>> {
        Shared(self.store.clone(), false).create(path, size_hint)
    }
    fn size(&self, path: &str) -> io::Result<u64> {
        Shared(self.store.clone(), false).size(path)
    }
    fn read_at(&self, path: &str, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        Shared(self.store.clone(), false).read_at(path, offset, buf)
    }
    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        Shared(self.store.clone(), false).list(dir)
    }
    fn remove(&self, path: &str) -> io::Result<()> {
        Shared(self.store.clone(), false).remove(path)
    }
    fn supports_multipart(&self) -> bool {
        true
    }
    fn min_part_size(&self) -> u64 {
        self.part
    }
    fn begin_upload(&self, path: &str, _size_hint: u64) -> io::Result<Box<dyn Upload>> {
        Ok(Box::new(PartedUpload {
            store: self.store.clone(),
            path: path.to_string(),
            parts: Mutex::new(Default::default()),
            log: self.log.clone(),
            aborted: self.aborted.clone(),
            fail_part: self.fail_part,
        }))
    }
}

#[test]
fn multipart_uploads_are_assembled_by_distckpt() {
    for fail_part in [0, 2] {
        let store = MemStore::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let aborted = Arc::new(AtomicUsize::new(0));
        let part = 1u64 << 20;
        let parted = Parted { store: store.clone(), part, log: log.clone(), aborted: aborted.clone(), fail_part };
        let h = StorageHandle::from_storage(Arc::new(parted), 4).unwrap();
        let w = iota(1000, 1100); // 4.2 MiB: 5 parts of 1 MiB, the last short
        let mut s = SaveState::new().unwrap();
        s.add_tensor("w", &[1000, 1100], &w).unwrap();
        let path = format!("bucket/parts{fail_part}");
        let saved = s.save(&path, &save_opts(&h));
        if fail_part != 0 {
            let err = saved.unwrap_err();
            assert!(err.to_string().contains("connection reset"), "{err}");
            assert_eq!(aborted.load(Ordering::SeqCst), 1);
            assert!(store.paths_under(&path).iter().all(|f| !f.contains("/data-")), "{:?}", store.paths_under(&path));
            continue;
        }
        saved.unwrap();
        let data = store.paths_under(&path).into_iter().find(|f| f.contains("/data-")).unwrap();
        let size = store.files.lock().unwrap()[&data].len() as u64;
        let mut sent = log.lock().unwrap().clone();
        sent.sort();
        let n = ((size + part - 1) / part) as u32;
        assert_eq!(sent.len() as u32, n, "{sent:?}");
        for (i, (number, len)) in sent.iter().enumerate() {
            assert_eq!(*number as usize, i + 1);
            let want = if *number < n { part } else { size - (n as u64 - 1) * part };
            assert_eq!(*len as u64, want, "part {number}");
        }
        assert_eq!(aborted.load(Ordering::SeqCst), 0);
        let ckpt = Checkpoint::open_with(&path, None, &read_opts(&h)).unwrap();
        assert_eq!(ckpt.read::<f32>("w").unwrap(), w);
        ckpt.verify().unwrap();
    }
}
