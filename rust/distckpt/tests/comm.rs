//! Collective saves and loads from Rust: ranks as threads over external (host-supplied) collectives, and ranks as
//! processes over Gloo. Skipped, with a message, where the library predates the communicator functions.
mod common;

#[cfg(not(distckpt_has_comm))]
#[test]
fn communicator_tests_skipped() {
    eprintln!("SKIPPED: libdistckpt.so exports no dckpt_comm_* functions; rebuild it (scripts/build_lib.sh)");
}

#[cfg(distckpt_has_comm)]
mod with_comm {
    use super::common::{ranks, TempDir};
    use distckpt::comm::CollectiveError;
    use distckpt::{
        Checkpoint, Collectives, Comm, Dtype, ErrorCode, GlooOptions, LoadState, ReadOptions, SaveOptions, SaveState,
        ThreadGroup,
    };
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    fn opts() -> SaveOptions {
        SaveOptions { sync: false, timeout: Some(Duration::from_secs(60)), ..Default::default() }
    }

    /// [6, 4] tensor "w" (value = flat index) in row pieces of 2 rows per rank, a replicated "bias", rank 0's bytes.
    fn save_three_ranks(path: PathBuf) {
        ranks(3, move |r, mut comm| {
            assert_eq!((comm.rank(), comm.size()), (r, 3));
            comm.barrier(Some(Duration::from_secs(30))).unwrap();
            let rows: Vec<f32> = (0..8).map(|i| (r * 8 + i) as f32).collect();
            let bias = vec![0.5f64; 4];
            let meta = b"from rank 0".to_vec();
            let mut s = SaveState::new().unwrap();
            s.declare_tensor("w", Dtype::F32, &[6, 4]).unwrap();
            s.add_piece("w", &[2 * r as u64, 0], &[2, 4], &rows).unwrap();
            s.add_tensor("bias", &[4], &bias).unwrap(); // the same box on every rank: a replica, written once
            if r == 0 {
                s.add_bytes("meta", &meta).unwrap().set_user("world", "3").unwrap();
            }
            s.save_with_comm(&path, &mut comm, &opts()).unwrap()
        });
    }

    #[test]
    fn three_thread_ranks_save_then_load_resharded() {
        let tmp = TempDir::new("comm-save");
        let path = tmp.join("ckpt");
        save_three_ranks(path.clone());

        let ckpt = Checkpoint::open(&path).unwrap();
        assert_eq!(ckpt.read::<f32>("w").unwrap(), (0..24).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(ckpt.entry("w").unwrap().num_chunks(), 3);
        assert_eq!(ckpt.entry("bias").unwrap().num_chunks(), 1, "replicas are written once");
        assert_eq!(ckpt.read::<f64>("bias").unwrap(), vec![0.5; 4]);
        assert_eq!(ckpt.read_bytes("meta").unwrap(), b"from rank 0");
        assert_eq!(ckpt.user("world"), Some("3"));

        // Two ranks load it back as column halves, with a collective open first.
        let p = path.clone();
        let cols = ranks(2, move |r, mut comm| {
            let ckpt = Checkpoint::open_with(&p, Some(&mut comm), &ReadOptions::default()).unwrap();
            assert_eq!(ckpt.entry("w").unwrap().shape(), &[6, 4]);
            let mut half = vec![0f32; 12];
            let mut l = LoadState::new().unwrap();
            l.declare_tensor("w", Dtype::F32, &[6, 4]).unwrap();
            l.add_piece("w", &[0, 2 * r as u64], &[6, 2], &mut half).unwrap();
            l.load_with_comm(&p, &mut comm, &ReadOptions::default()).unwrap();
            drop(l);
            half
        });
        for (r, half) in cols.iter().enumerate() {
            let want: Vec<f32> =
                (0..6).flat_map(|row| [row * 4 + 2 * r, row * 4 + 2 * r + 1]).map(|v| v as f32).collect();
            assert_eq!(half, &want, "rank {r}");
        }
    }

    #[test]
    fn async_save_over_a_communicator() {
        let tmp = TempDir::new("comm-async");
        let path = tmp.join("ckpt");
        let p = path.clone();
        let infos = ranks(2, move |r, mut comm| {
            let mut data = vec![r as i64; 1000];
            let fut = {
                let mut s = SaveState::new().unwrap();
                s.declare_tensor("x", Dtype::I64, &[2, 1000]).unwrap();
                s.add_piece("x", &[r as u64, 0], &[1, 1000], &data).unwrap();
                s.save_async(&p, Some(&mut comm), &opts()).unwrap()
            };
            data.fill(-1);
            fut.wait().unwrap()
        });
        assert_eq!(infos[0].total_bytes, 16000);
        let x = Checkpoint::open(&path).unwrap().read::<i64>("x").unwrap();
        assert!(x[..1000].iter().all(|v| *v == 0) && x[1000..].iter().all(|v| *v == 1));
    }

    /// Rank 1's collectives fail (or panic) on the first allgather.
    struct Faulty {
        inner: ThreadGroup,
        panic: bool,
    }

    impl Collectives for Faulty {
        fn rank(&self) -> usize {
            self.inner.rank()
        }
        fn size(&self) -> usize {
            self.inner.size()
        }
        fn allgather(&mut self, send: &[u8], recv: &mut [u8], t: Duration) -> Result<(), CollectiveError> {
            if self.inner.rank() == 1 {
                if self.panic {
                    panic!("collective panicked on rank 1");
                }
                return Err("the host's transport is down".into());
            }
            self.inner.allgather(send, recv, t)
        }
        fn broadcast(&mut self, buf: &mut [u8], root: usize, t: Duration) -> Result<(), CollectiveError> {
            self.inner.broadcast(buf, root, t)
        }
    }

    fn faulty_save(panic: bool) -> Vec<std::thread::Result<distckpt::Result<distckpt::SaveInfo>>> {
        let tmp = TempDir::new("comm-fail");
        let path = tmp.join("ckpt");
        let handles: Vec<_> = ThreadGroup::new(2)
            .into_iter()
            .map(|g| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut comm = Comm::external(Faulty { inner: g, panic }).unwrap();
                    let v = [1u8; 8];
                    let mut s = SaveState::new().unwrap();
                    s.add_tensor("v", &[8], &v).unwrap();
                    let o = SaveOptions { timeout: Some(Duration::from_millis(1500)), ..opts() };
                    s.save_with_comm(&path, &mut comm, &o)
                })
            })
            .collect();
        let results = handles.into_iter().map(|h| h.join()).collect();
        assert!(!path.exists(), "a failed collective save leaves nothing at the path");
        results
    }

    #[test]
    fn a_failing_host_collective_fails_every_rank_with_its_message() {
        let results = faulty_save(false);
        let err1 = results[1].as_ref().unwrap().as_ref().unwrap_err();
        assert_eq!(err1.code(), ErrorCode::User, "{err1}");
        assert!(err1.to_string().contains("the host's transport is down"), "{err1}");
        let err0 = results[0].as_ref().unwrap().as_ref().unwrap_err();
        assert!(matches!(err0.code(), ErrorCode::User | ErrorCode::Timeout | ErrorCode::Peer), "{err0}");
    }

    #[test]
    fn a_panicking_collective_is_resumed_on_its_rank() {
        let results = faulty_save(true);
        let payload = results[1].as_ref().unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"collective panicked on rank 1"));
        assert!(results[0].as_ref().unwrap().is_err());
    }

    /// Gloo over TCP on loopback, ranks as processes: this test binary re-runs itself as each rank.
    #[test]
    fn gloo_two_processes_save_collectively() {
        if let Ok(dir) = std::env::var("DISTCKPT_RS_GLOO_DIR") {
            return gloo_rank(Path::new(&dir));
        }
        let tmp = TempDir::new("gloo");
        std::fs::create_dir_all(tmp.join("rdzv")).unwrap();
        let children: Vec<_> = (0..2)
            .map(|r| {
                std::process::Command::new(std::env::current_exe().unwrap())
                    .args([
                        "--exact",
                        "with_comm::gloo_two_processes_save_collectively",
                        "--nocapture",
                        "--test-threads=1",
                    ])
                    .env("DISTCKPT_RS_GLOO_DIR", tmp.path())
                    .env("DCKPT_RANK", r.to_string())
                    .env("DCKPT_WORLD_SIZE", "2")
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outputs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
        let log = |o: &std::process::Output| {
            format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
        };
        for (r, o) in outputs.iter().enumerate() {
            assert!(o.status.success(), "rank {r} failed:\n{}", log(o));
        }
        let ckpt = Checkpoint::open(tmp.join("ckpt")).unwrap();
        assert_eq!(ckpt.read::<u32>("ranks").unwrap(), [0, 0, 0, 1, 1, 1]);
    }

    /// Without the Gloo plugin a Gloo communicator is `Unsupported`, naming the file it tried and the alternatives. In a
    /// child process (this test binary re-run), since a process that has loaded the plugin keeps it.
    #[test]
    fn gloo_without_its_plugin_is_unsupported_naming_it() {
        let tmp = TempDir::new("gloo-missing");
        let missing = tmp.join("libdistckpt_gloo.so");
        if std::env::var_os("DISTCKPT_RS_GLOO_MISSING").is_some() {
            let o = GlooOptions {
                rank: Some(0),
                world_size: Some(1),
                rendezvous: Some(format!("file://{}", tmp.join("rdzv").display())),
                ..Default::default()
            };
            let Err(e) = Comm::gloo(&o) else { panic!("a Gloo communicator without its plugin") };
            assert_eq!(e.code(), ErrorCode::Unsupported, "{e}");
            let plugin = std::env::var("DCKPT_GLOO_PLUGIN").unwrap();
            for words in [plugin.as_str(), "No such file or directory", "DCKPT_GLOO_PLUGIN", "Comm::external"] {
                assert!(e.to_string().contains(words), "{words:?} is not in: {e}");
            }
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "with_comm::gloo_without_its_plugin_is_unsupported_naming_it", "--nocapture"])
            .env("DISTCKPT_RS_GLOO_MISSING", "1")
            .env("DCKPT_GLOO_PLUGIN", &missing)
            .output()
            .unwrap();
        let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && log.contains("1 passed"), "the child failed:\n{log}");
    }

    fn gloo_rank(dir: &Path) {
        let o = GlooOptions {
            rendezvous: Some(format!("file://{}", dir.join("rdzv").display())),
            hostname: Some("127.0.0.1".into()),
            timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        };
        // The Gloo plugin: beside libdistckpt.so (the `shared` feature), or, linked statically, from DCKPT_GLOO_PLUGIN
        // (rust/run_tests.sh sets it); without it the error says where it was looked for and what to set.
        let mut comm = Comm::gloo(&o).unwrap();
        let r = comm.rank();
        assert_eq!(comm.size(), 2);
        let mine = [r as u32; 3];
        let mut s = SaveState::new().unwrap();
        s.declare_tensor("ranks", Dtype::U32, &[6]).unwrap();
        s.add_piece("ranks", &[3 * r as u64], &[3], &mine).unwrap();
        s.save_with_comm(dir.join("ckpt"), &mut comm, &opts()).unwrap();
        let ckpt = Checkpoint::open_with(dir.join("ckpt"), Some(&mut comm), &ReadOptions::default()).unwrap();
        assert_eq!(ckpt.read::<u32>("ranks").unwrap(), [0, 0, 0, 1, 1, 1]);
        comm.barrier(None).unwrap();
    }
}
