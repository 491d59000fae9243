//! An inference server's start, in Rust: every tensor of a checkpoint (a distckpt checkpoint, a safetensors file or a
//! Hugging Face hub directory, a DCP directory) loaded into CUDA device memory through `DeviceBuffer`, then each
//! tensor copied back and its digest printed, one line per tensor exactly as the `digest` example prints it from host
//! reads (rust/run_tests.sh compares the two), and a last line with the load's rate:
//!
//!     gpu_load: N tensors, B bytes into device D in S s: G GB/s (pinned staging, every byte verified)
//!
//! The CUDA driver API is loaded at run time with dlopen (`libcuda.so.1`, or the library DCKPT_CUDA_DRIVER_LIBRARY
//! names, as the core does): no CUDA crate and no CUDA toolkit at build time. Device memory is allocated before the
//! clock starts (a server allocates once); the rate counts the reads, their verification and the copies to the device.
//! On a machine without a GPU, rust/run_tests.sh runs it against the core's fake driver (host memory standing in for
//! device memory, the real copy engine); the GPU check runs it on the GPU.
//!
//!     cargo run --release --example gpu_load -- [--device N] [--no-verify] CHECKPOINT
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::process::ExitCode;
use std::time::Instant;

use distckpt::{Checkpoint, DeviceBuffer, ReadOptions};

#[path = "common/fnv.rs"]
mod fnv;
use fnv::fnv1a64;

#[link(name = "dl")]
extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *mut c_char;
}
const RTLD_NOW: c_int = 2;

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuStream = *mut c_void;
type CuDevicePtr = u64;

/// The driver entry points this program uses, resolved once.
struct Cuda {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, CuStream) -> CuResult,
    error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

/// The symbol at `p` as the function pointer type `F` (its signature in the driver API, which the caller names).
unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    std::mem::transmute_copy(&p)
}

impl Cuda {
    fn load() -> Result<Cuda, String> {
        let path = std::env::var("DCKPT_CUDA_DRIVER_LIBRARY").unwrap_or_else(|_| "libcuda.so.1".to_string());
        let c_path = CString::new(path.clone()).map_err(|_| format!("{path}: a NUL in the path"))?;
        // SAFETY: dlopen and dlsym with NUL-terminated names; each symbol is cast to the driver API's signature.
        unsafe {
            let handle = dlopen(c_path.as_ptr(), RTLD_NOW);
            if handle.is_null() {
                let why = CStr::from_ptr(dlerror()).to_string_lossy().into_owned();
                return Err(format!("cannot load the CUDA driver {path}: {why}"));
            }
            let sym = |name: &str| -> Result<*mut c_void, String> {
                let c = CString::new(name).unwrap();
                let p = dlsym(handle, c.as_ptr());
                if p.is_null() {
                    Err(format!("the CUDA driver {path} has no {name}"))
                } else {
                    Ok(p)
                }
            };
            Ok(Cuda {
                init: as_fn(sym("cuInit")?),
                device_get: as_fn(sym("cuDeviceGet")?),
                primary_ctx_retain: as_fn(sym("cuDevicePrimaryCtxRetain")?),
                primary_ctx_release: as_fn(sym("cuDevicePrimaryCtxRelease_v2")?),
                ctx_set_current: as_fn(sym("cuCtxSetCurrent")?),
                stream_create: as_fn(sym("cuStreamCreate")?),
                stream_destroy: as_fn(sym("cuStreamDestroy_v2")?),
                stream_synchronize: as_fn(sym("cuStreamSynchronize")?),
                mem_alloc: as_fn(sym("cuMemAlloc_v2")?),
                mem_free: as_fn(sym("cuMemFree_v2")?),
                memcpy_dtoh_async: as_fn(sym("cuMemcpyDtoHAsync_v2")?),
                error_string: as_fn(sym("cuGetErrorString")?),
            })
        }
    }

    /// OK, or the driver's name for `r` and what was being done.
    fn check(&self, r: CuResult, what: &str) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
        let name = unsafe {
            if (self.error_string)(r, &mut text) == 0 && !text.is_null() {
                CStr::from_ptr(text).to_string_lossy().into_owned()
            } else {
                "unknown error".to_string()
            }
        };
        Err(format!("{what}: CUDA error {r} ({name})"))
    }
}

/// Device memory of one tensor, freed on drop.
struct Allocation<'a> {
    cuda: &'a Cuda,
    ptr: CuDevicePtr,
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            // SAFETY: ptr came from cuMemAlloc_v2 and every copy into or out of it has completed.
            unsafe { (self.cuda.mem_free)(self.ptr) };
        }
    }
}

fn run(path: &str, ordinal: c_int, verify: bool) -> Result<bool, String> {
    let cuda = Cuda::load()?;
    let (mut device, mut ctx, mut stream): (CuDevice, CuContext, CuStream) =
        (0, std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: the driver API's calls with out-pointers to live locals.
    unsafe {
        cuda.check((cuda.init)(0), "cuInit")?;
        cuda.check((cuda.device_get)(&mut device, ordinal), &format!("device {ordinal}"))?;
        cuda.check((cuda.primary_ctx_retain)(&mut ctx, device), "retaining the primary context")?;
        cuda.check((cuda.ctx_set_current)(ctx), "making the primary context current")?;
        cuda.check((cuda.stream_create)(&mut stream, 0), "creating a stream")?;
    }
    let opts = ReadOptions { verify, ..Default::default() };
    let ckpt = Checkpoint::open_with(path, None, &opts).map_err(|e| format!("{path}: {e}"))?;
    let tensors: Vec<_> = ckpt.entries().filter(|e| e.is_tensor()).collect();
    let mut memory = Vec::with_capacity(tensors.len());
    for e in &tensors {
        let mut ptr: CuDevicePtr = 0;
        // A zero-byte tensor still gets an address of its own (one byte).
        // SAFETY: an out-pointer to a live local.
        cuda.check(
            unsafe { (cuda.mem_alloc)(&mut ptr, e.nbytes().max(1) as usize) },
            &format!("allocating {}", e.name()),
        )?;
        memory.push(Allocation { cuda: &cuda, ptr });
    }
    let total: u64 = tensors.iter().map(|e| e.nbytes()).sum();
    let start = Instant::now();
    for (e, m) in tensors.iter().zip(&memory) {
        let dst = DeviceBuffer { ptr: m.ptr, len: e.nbytes(), device: ordinal, stream };
        // SAFETY: m.ptr is device memory of `ordinal` holding nbytes, and `stream` a live stream of it.
        unsafe { ckpt.read_into_device(e.name(), dst) }.map_err(|err| format!("{}: {err}", e.name()))?;
    }
    let seconds = start.elapsed().as_secs_f64();
    // Each tensor back to the host, its digest printed as `digest` prints it from a host read.
    let mut all_ok = true;
    for (e, m) in tensors.iter().zip(&memory) {
        let mut host = vec![0u8; e.nbytes() as usize];
        // SAFETY: host holds nbytes; the copy has completed when the stream is synchronized.
        let copied = unsafe {
            cuda.check(
                (cuda.memcpy_dtoh_async)(host.as_mut_ptr().cast(), m.ptr, host.len(), stream),
                &format!("copying {} back", e.name()),
            )
            .and_then(|_| cuda.check((cuda.stream_synchronize)(stream), "synchronizing the stream"))
        };
        match copied {
            Ok(()) => println!("{} {:?} {:?} {:016x}", e.name(), e.dtype(), e.shape(), fnv1a64(&host)),
            Err(err) => {
                println!("ERROR {}: {err}", e.name());
                all_ok = false;
            }
        }
    }
    drop(memory);
    // SAFETY: the stream has no work left; the context was retained above.
    unsafe {
        (cuda.stream_destroy)(stream);
        (cuda.primary_ctx_release)(device);
    }
    println!(
        "gpu_load: {} tensors, {} bytes into device {} in {:.3} s: {:.2} GB/s (pinned staging, {})",
        tensors.len(),
        total,
        ordinal,
        seconds,
        total as f64 / seconds.max(1e-9) / 1e9,
        if verify { "every byte verified" } else { "verification off" }
    );
    Ok(all_ok)
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut ordinal: c_int = 0;
    let mut verify = true;
    while args.len() > 1 {
        match args[0].as_str() {
            "--device" => {
                let Some(n) = args.get(1).and_then(|v| v.parse().ok()) else {
                    eprintln!("gpu_load: --device takes a device ordinal");
                    return ExitCode::from(2);
                };
                ordinal = n;
                args.drain(..2);
            }
            "--no-verify" => {
                verify = false;
                args.remove(0);
            }
            _ => break,
        }
    }
    let [path] = args.as_slice() else {
        eprintln!("usage: gpu_load [--device N] [--no-verify] CHECKPOINT");
        return ExitCode::from(2);
    };
    match run(path, ordinal, verify) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            println!("ERROR {path}: {e}");
            ExitCode::from(1)
        }
    }
}
