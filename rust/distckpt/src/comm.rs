//! Communicators: the group of ranks a collective save, load or open runs over (`dckpt_comm`).
//!
//! - [`Comm::gloo`] / [`Comm::gloo_from_env`]: Gloo over TCP, the library's own transport.
//! - [`Comm::external`]: collectives the host application supplies (an MPI binding, a custom launcher...), as a
//!   Rust [`Collectives`] implementation behind the C callbacks.
//! - [`ThreadGroup`]: an in-process [`Collectives`] whose ranks are threads, for tests and for emulating several
//!   ranks in one process.
//!
//! A `Comm` is `Send` but not `Sync`: the C library allows one collective at a time on a communicator, so every
//! collective takes `&mut Comm`.

use std::ffi::{c_void, CString};
use std::os::raw::c_int;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use distckpt_sys as sys;

use crate::error::{check, Error, ErrorCode, Result};
use crate::panic::PanicSlot;
use crate::util::{lock, opt_cstring, timeout_ms};
use crate::version::check_abi;

/// The error type a [`Collectives`] implementation returns.
pub type CollectiveError = Box<dyn std::error::Error + Send + Sync>;

/// Collectives supplied by the host application (`dckpt_comm_callbacks`). Every rank of the group calls the same
/// collectives in the same order. `timeout` is the library's deadline for the call (zero: the implementation's
/// own default). An error aborts the distckpt operation with `ErrorCode::User`, and its message is appended to the
/// operation's error.
pub trait Collectives: Send {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Every rank passes `send` of the same length; `recv` (size × that length) receives every rank's bytes in rank
    /// order.
    fn allgather(&mut self, send: &[u8], recv: &mut [u8], timeout: Duration) -> Result<(), CollectiveError>;
    /// The `root` rank's `buf` is sent; every other rank's is overwritten with it.
    fn broadcast(&mut self, buf: &mut [u8], root: usize, timeout: Duration) -> Result<(), CollectiveError>;
    /// Waits for every rank. The default is an allgather of one byte.
    fn barrier(&mut self, timeout: Duration) -> Result<(), CollectiveError> {
        let mut recv = vec![0u8; self.size()];
        self.allgather(&[0], &mut recv, timeout)
    }
}

/// Options for [`Comm::gloo`] (`dckpt_gloo_options`); `None` fields come from the environment.
#[derive(Clone, Debug, Default)]
pub struct GlooOptions {
    /// None: DCKPT_RANK, else RANK.
    pub rank: Option<usize>,
    /// None: DCKPT_WORLD_SIZE, else WORLD_SIZE.
    pub world_size: Option<usize>,
    /// "file:///shared/dir" or "redis://host:port"; None: DCKPT_RENDEZVOUS.
    pub rendezvous: Option<String>,
    /// Namespace of this group in the store (e.g. a job id).
    pub prefix: Option<String>,
    /// Network interface to bind; None: DCKPT_GLOO_IFACE, else Gloo's default.
    pub iface: Option<String>,
    /// Address to bind; None: DCKPT_GLOO_HOSTNAME, else Gloo's default.
    pub hostname: Option<String>,
    /// Rendezvous and default collective timeout; None: DCKPT_TIMEOUT_MS, else 10 minutes.
    pub timeout: Option<Duration>,
}

/// The state behind an external communicator's callbacks. Boxed, so its address (the callbacks' `user_data`)
/// stays fixed for the communicator's life.
struct External {
    inner: Mutex<Box<dyn Collectives>>,
    /// The last error a collective returned, appended to the operation's error.
    error: Mutex<Option<String>>,
    /// A panic caught in a callback (it must not unwind into C), resumed on the caller's thread.
    panic: PanicSlot,
}

impl External {
    unsafe fn from(user_data: *mut c_void) -> &'static External {
        &*(user_data as *const External)
    }

    fn run(&self, f: impl FnOnce(&mut dyn Collectives) -> Result<(), CollectiveError>) -> c_int {
        match self.panic.wrap(|| f(&mut **lock(&self.inner))) {
            Some(Ok(())) => 0,
            Some(Err(e)) => {
                *lock(&self.error) = Some(e.to_string());
                1
            }
            None => {
                *lock(&self.error) = Some("a collective panicked".into());
                1
            }
        }
    }

    unsafe extern "C" fn allgather(
        send: *const c_void,
        n: usize,
        recv: *mut c_void,
        timeout_ms: u64,
        ud: *mut c_void,
    ) -> c_int {
        let this = External::from(ud);
        let size = lock(&this.inner).size();
        let send = if n == 0 { &[][..] } else { std::slice::from_raw_parts(send.cast::<u8>(), n) };
        let recv = if n == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(recv.cast::<u8>(), n * size) };
        this.run(|c| c.allgather(send, recv, Duration::from_millis(timeout_ms)))
    }

    unsafe extern "C" fn broadcast(buf: *mut c_void, n: usize, root: c_int, timeout_ms: u64, ud: *mut c_void) -> c_int {
        let this = External::from(ud);
        let buf = if n == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(buf.cast::<u8>(), n) };
        this.run(|c| c.broadcast(buf, root.max(0) as usize, Duration::from_millis(timeout_ms)))
    }

    unsafe extern "C" fn barrier(timeout_ms: u64, ud: *mut c_void) -> c_int {
        External::from(ud).run(|c| c.barrier(Duration::from_millis(timeout_ms)))
    }
}

/// A group of ranks (`dckpt_comm`). Dropping it frees the communicator.
pub struct Comm {
    pub(crate) raw: *mut sys::dckpt_comm,
    external: Option<Box<External>>,
}

// The C communicator may be used from any thread, one collective at a time (`&mut self` enforces that); an
// external one's state is `Send` (Collectives: Send) and behind mutexes.
unsafe impl Send for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // Frees the C side first: it may still hold `external`'s address.
        unsafe { sys::dckpt_comm_free(self.raw) };
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm").field("rank", &self.rank()).field("size", &self.size()).finish()
    }
}

fn to_int(v: Option<usize>, what: &str) -> Result<c_int> {
    match v {
        None => Ok(-1),
        Some(v) => {
            c_int::try_from(v).map_err(|_| Error::new(ErrorCode::InvalidArgument, format!("{what} {v} is too large")))
        }
    }
}

impl Comm {
    /// Connects this rank to the others through Gloo over TCP. Collective: every rank calls it.
    pub fn gloo(opts: &GlooOptions) -> Result<Comm> {
        check_abi()?;
        let strings = [
            opt_cstring(&opts.rendezvous, "rendezvous")?,
            opt_cstring(&opts.prefix, "prefix")?,
            opt_cstring(&opts.iface, "iface")?,
            opt_cstring(&opts.hostname, "hostname")?,
        ];
        let ptr = |s: &Option<CString>| s.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let mut raw_opts: sys::dckpt_gloo_options = unsafe { std::mem::zeroed() };
        check(unsafe { sys::dckpt_gloo_options_init(&mut raw_opts, sys::DCKPT_GLOO_OPTIONS_VERSION) })?;
        raw_opts.rank = to_int(opts.rank, "rank")?;
        raw_opts.world_size = to_int(opts.world_size, "world_size")?;
        raw_opts.rendezvous = ptr(&strings[0]);
        raw_opts.prefix = ptr(&strings[1]);
        raw_opts.iface = ptr(&strings[2]);
        raw_opts.hostname = ptr(&strings[3]);
        raw_opts.timeout_ms = timeout_ms(opts.timeout);
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::dckpt_comm_new_gloo(&mut raw, &raw_opts) })?;
        Ok(Comm { raw, external: None })
    }

    /// [`Comm::gloo`] with everything from the environment (DCKPT_RANK, DCKPT_WORLD_SIZE, DCKPT_RENDEZVOUS, ...).
    pub fn gloo_from_env() -> Result<Comm> {
        check_abi()?;
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::dckpt_comm_new_gloo(&mut raw, std::ptr::null()) })?;
        Ok(Comm { raw, external: None })
    }

    /// Wraps collectives supplied by the host application.
    pub fn external(collectives: impl Collectives + 'static) -> Result<Comm> {
        check_abi()?;
        let (rank, size) = (collectives.rank(), collectives.size());
        let ext = Box::new(External {
            inner: Mutex::new(Box::new(collectives)),
            error: Mutex::new(None),
            panic: PanicSlot::default(),
        });
        let mut cb: sys::dckpt_comm_callbacks = unsafe { std::mem::zeroed() };
        check(unsafe { sys::dckpt_comm_callbacks_init(&mut cb, sys::DCKPT_COMM_CALLBACKS_VERSION) })?;
        cb.rank = to_int(Some(rank), "rank")?;
        cb.size = to_int(Some(size), "size")?;
        cb.allgather = Some(External::allgather);
        cb.broadcast = Some(External::broadcast);
        cb.barrier = Some(External::barrier);
        cb.user_data = &*ext as *const External as *mut c_void;
        let mut raw = std::ptr::null_mut();
        check(unsafe { sys::dckpt_comm_new_external(&mut raw, &cb) })?;
        Ok(Comm { raw, external: Some(ext) })
    }

    /// This rank, 0..size().
    pub fn rank(&self) -> usize {
        let mut r = 0;
        unsafe { sys::dckpt_comm_rank(&mut r, self.raw) };
        r.max(0) as usize
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        let mut s = 0;
        unsafe { sys::dckpt_comm_size(&mut s, self.raw) };
        s.max(0) as usize
    }

    /// Waits until every rank arrives; `Timeout` naming a missing rank after `timeout` (None: the default).
    pub fn barrier(&mut self, timeout: Option<Duration>) -> Result<()> {
        let rc = unsafe { sys::dckpt_comm_barrier(self.raw, timeout_ms(timeout)) };
        self.after_call(check(rc))
    }

    /// After a collective C call on this communicator: resumes a panic raised in a callback, and adds the message
    /// of a failed host collective to the error.
    pub(crate) fn after_call<T>(&self, result: Result<T>) -> Result<T> {
        let Some(ext) = &self.external else { return result };
        ext.panic.resume();
        let err = lock(&ext.error).take();
        match (result, err) {
            (Err(e), Some(msg)) => Err(e.context(&format!("host collective failed: {msg}"))),
            (r, _) => r,
        }
    }
}

/// An in-process group whose ranks are threads: `ThreadGroup::new(n)` gives one [`Collectives`] per rank, to be
/// moved to its thread and wrapped with [`Comm::external`]. For tests, and for running several ranks in one
/// process.
pub struct ThreadGroup {
    rank: usize,
    shared: Arc<Shared>,
}

struct Shared {
    size: usize,
    state: Mutex<Round>,
    cv: Condvar,
}

/// One exchange at a time: each rank deposits its bytes; the last to arrive publishes them all and starts the next
/// round. A rank cannot deposit for round k+1 before every rank has left round k, since round k+1 needs all of them.
struct Round {
    generation: u64,
    deposited: Vec<Option<Vec<u8>>>,
    arrived: usize,
    published: Arc<Vec<Vec<u8>>>,
}

impl ThreadGroup {
    pub fn new(size: usize) -> Vec<ThreadGroup> {
        assert!(size > 0, "a group has at least one rank");
        let shared = Arc::new(Shared {
            size,
            state: Mutex::new(Round {
                generation: 0,
                deposited: vec![None; size],
                arrived: 0,
                published: Arc::new(Vec::new()),
            }),
            cv: Condvar::new(),
        });
        (0..size).map(|rank| ThreadGroup { rank, shared: shared.clone() }).collect()
    }

    fn exchange(&self, data: Vec<u8>, timeout: Duration) -> Result<Arc<Vec<Vec<u8>>>, CollectiveError> {
        let s = &self.shared;
        let mut st = lock(&s.state);
        let generation = st.generation;
        st.deposited[self.rank] = Some(data);
        st.arrived += 1;
        if st.arrived == s.size {
            st.published = Arc::new(st.deposited.iter_mut().map(|d| d.take().unwrap()).collect());
            st.arrived = 0;
            st.generation += 1;
            s.cv.notify_all();
            return Ok(st.published.clone());
        }
        let timeout = if timeout.is_zero() { Duration::from_secs(600) } else { timeout };
        let deadline = Instant::now() + timeout;
        while st.generation == generation {
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..s.size).filter(|r| st.deposited[*r].is_none()).collect();
                return Err(format!("rank {}: ranks {missing:?} did not arrive within {timeout:?}", self.rank).into());
            }
            st = s.cv.wait_timeout(st, deadline - now).unwrap_or_else(|e| e.into_inner()).0;
        }
        Ok(st.published.clone())
    }
}

impl Collectives for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.shared.size
    }
    fn allgather(&mut self, send: &[u8], recv: &mut [u8], timeout: Duration) -> Result<(), CollectiveError> {
        let all = self.exchange(send.to_vec(), timeout)?;
        if recv.len() != send.len() * all.len() {
            return Err(
                format!("allgather: recv holds {} bytes, not {} x {}", recv.len(), all.len(), send.len()).into()
            );
        }
        for (r, bytes) in all.iter().enumerate() {
            if bytes.len() != send.len() {
                return Err(format!("allgather: rank {r} sent {} bytes, this rank {}", bytes.len(), send.len()).into());
            }
            recv[r * send.len()..(r + 1) * send.len()].copy_from_slice(bytes);
        }
        Ok(())
    }
    fn broadcast(&mut self, buf: &mut [u8], root: usize, timeout: Duration) -> Result<(), CollectiveError> {
        let mine = if self.rank == root { buf.to_vec() } else { Vec::new() };
        let all = self.exchange(mine, timeout)?;
        let from = all.get(root).ok_or_else(|| format!("broadcast: root {root} is not a rank"))?;
        if from.len() != buf.len() {
            return Err(format!("broadcast: root sent {} bytes, this rank expects {}", from.len(), buf.len()).into());
        }
        buf.copy_from_slice(from);
        Ok(())
    }
    fn barrier(&mut self, timeout: Duration) -> Result<(), CollectiveError> {
        self.exchange(Vec::new(), timeout).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_group_collectives() {
        let handles: Vec<_> = ThreadGroup::new(3)
            .into_iter()
            .map(|mut g| {
                std::thread::spawn(move || {
                    let t = Duration::from_secs(10);
                    for round in 0..50u8 {
                        let mut recv = vec![0u8; 6];
                        g.allgather(&[g.rank() as u8, round], &mut recv, t).unwrap();
                        assert_eq!(recv, [0, round, 1, round, 2, round]);
                        let mut buf = if g.rank() == 1 { vec![round; 4] } else { vec![0; 4] };
                        g.broadcast(&mut buf, 1, t).unwrap();
                        assert_eq!(buf, vec![round; 4]);
                        g.barrier(t).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn thread_group_times_out_naming_the_missing_rank() {
        let mut g = ThreadGroup::new(2).remove(0);
        let err = g.barrier(Duration::from_millis(50)).unwrap_err();
        assert!(err.to_string().contains("ranks [1]"), "{err}");
    }
}
