/* A C caller with no current CUDA context (tests/test_gpu_cases.py compiles and runs it on a GPU machine):
 *
 *   cc -std=c99 -I<kit>/include _c_no_context.c -L<kit>/lib -ldistckpt -Wl,-rpath,<kit>/lib -ldl -lpthread
 *   ./a.out DIR
 *
 * Device memory is made through the driver API (libcuda.so.1, opened with dlopen: nothing is linked against CUDA)
 * under the primary context of GPU 0, which is then popped, so that no thread of the program has a current context
 * when it calls distckpt. The main thread saves a device buffer (dckpt_save) and the same buffer asynchronously with
 * a device snapshot (dckpt_save_async); a fresh thread loads the checkpoint into a second device buffer (dckpt_load)
 * and reads a region into a third (dckpt_reader_read_ex). Each call must succeed and leave the thread with no current
 * context; the buffers are then copied back and compared. Prints "OK ..." and exits 0, or prints what failed and
 * exits 1 (2: no usable GPU, the caller skips). DCKPT_CUDA_DRIVER_LIBRARY names another driver library, as for the
 * core (core/cuda/testdata/fake_cuda.cc, which it also runs against).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distckpt/distckpt.h"

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static CUresult (*p_cuInit)(unsigned);
static CUresult (*p_cuDeviceGetCount)(int *);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*p_cuDevicePrimaryCtxRelease)(CUdevice);
static CUresult (*p_cuCtxPushCurrent)(CUcontext);
static CUresult (*p_cuCtxPopCurrent)(CUcontext *);
static CUresult (*p_cuCtxGetDevice)(CUdevice *);
static CUresult (*p_cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*p_cuMemFree)(CUdeviceptr);
static CUresult (*p_cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, void *);
static CUresult (*p_cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, void *);
static CUresult (*p_cuStreamSynchronize)(void *);

/* Copies on the legacy default stream, waited for (only the entry points distckpt itself uses: the program also runs
 * against core/cuda/testdata's fake driver through DCKPT_CUDA_DRIVER_LIBRARY). */
static int to_device(CUdeviceptr dst, const void *src, size_t n) {
  return p_cuMemcpyHtoDAsync(dst, src, n, NULL) != 0 || p_cuStreamSynchronize(NULL) != 0;
}
static int to_host(void *dst, CUdeviceptr src, size_t n) {
  return p_cuMemcpyDtoHAsync(dst, src, n, NULL) != 0 || p_cuStreamSynchronize(NULL) != 0;
}

#define ROWS 1024
#define COLS 1536
#define N ((size_t)ROWS * COLS)
/* The region read back: rows [100, 900), columns [64, 1000) (strided in the saved chunk). */
#define R0 100
#define RN 800
#define C0 64
#define CN 936

static const char *g_dir;
static CUdeviceptr g_loaded, g_region;
static char g_failure[1024];

static void *sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (p == NULL) {
    fprintf(stderr, "libcuda.so.1 has no %s\n", name);
    exit(2);
  }
  return p;
}

/* 1 where the calling thread has no current context (what each distckpt call must find and leave):
 * cuCtxGetDevice then fails (CUDA_ERROR_INVALID_CONTEXT). */
static int no_context(void) {
  CUdevice d = -1;
  return p_cuCtxGetDevice(&d) != 0;
}

static int fail(const char *what, int rc) {
  snprintf(g_failure, sizeof g_failure, "%s failed: %d (%s): %s", what, rc, dckpt_status_name(rc), dckpt_error_last());
  return 1;
}

/* A state of one f32 tensor "x" of ROWS x COLS held whole in device memory at `ptr`. */
static int device_state(dckpt_state **out, CUdeviceptr ptr) {
  const uint64_t shape[2] = {ROWS, COLS}, offsets[2] = {0, 0};
  dckpt_piece_options piece = DCKPT_PIECE_OPTIONS_INIT;
  int rc;
  piece.memory = DCKPT_MEMORY_CUDA;
  piece.device = 0;
  piece.stream = NULL; /* the legacy default stream: everything here is synchronous */
  if ((rc = dckpt_state_new(out)) != 0) return fail("dckpt_state_new", rc);
  rc = dckpt_state_add_tensor(*out, "x", DCKPT_DTYPE_F32, 2, shape);
  if (rc != 0) return fail("dckpt_state_add_tensor", rc);
  if ((rc = dckpt_state_add_piece_ex(*out, "x", offsets, shape, (void *)(uintptr_t)ptr, &piece)) != 0) {
    return fail("dckpt_state_add_piece_ex (a device buffer, no current context)", rc);
  }
  return 0;
}

static void *load_thread(void *arg) {
  char path[4096];
  dckpt_state *state = NULL;
  dckpt_reader *reader = NULL;
  dckpt_piece_options piece = DCKPT_PIECE_OPTIONS_INIT;
  const uint64_t offsets[2] = {R0, C0}, lengths[2] = {RN, CN};
  int rc;
  (void)arg;
  if (!no_context()) {
    snprintf(g_failure, sizeof g_failure, "a fresh thread has a current context");
    return NULL;
  }
  snprintf(path, sizeof path, "%s/sync", g_dir);
  if (device_state(&state, g_loaded) != 0) return NULL;
  if ((rc = dckpt_load(NULL, path, state, NULL, NULL)) != 0) {
    fail("dckpt_load into device memory from a thread with no context", rc);
    dckpt_state_free(state);
    return NULL;
  }
  dckpt_state_free(state);
  if (!no_context()) {
    snprintf(g_failure, sizeof g_failure, "dckpt_load left a context current on the thread");
    return NULL;
  }
  snprintf(path, sizeof path, "%s/async", g_dir);
  if ((rc = dckpt_reader_open(&reader, path, NULL, NULL)) != 0) {
    fail("dckpt_reader_open", rc);
    return NULL;
  }
  piece.memory = DCKPT_MEMORY_CUDA;
  piece.device = 0;
  rc = dckpt_reader_read_ex(reader, "x", 2, offsets, lengths, (void *)(uintptr_t)g_region,
                            (uint64_t)RN * CN * sizeof(float), &piece);
  if (rc != 0) fail("dckpt_reader_read_ex into device memory from a thread with no context", rc);
  dckpt_reader_free(reader);
  if (rc == 0 && !no_context()) {
    snprintf(g_failure, sizeof g_failure, "dckpt_reader_read_ex left a context current on the thread");
  }
  return NULL;
}

int main(int argc, char **argv) {
  void *lib;
  const char *driver;
  CUdevice dev;
  CUcontext ctx = NULL, popped = NULL;
  CUdeviceptr src = 0;
  float *host, *back;
  dckpt_state *state = NULL;
  dckpt_save_options opts = DCKPT_SAVE_OPTIONS_INIT;
  dckpt_save_future *future = NULL;
  pthread_t thread;
  char path[4096];
  int count = 0, rc, bad = 0;
  size_t i, r, c;

  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  g_dir = argv[1];
  driver = getenv("DCKPT_CUDA_DRIVER_LIBRARY"); /* as the core: another driver library for tests */
  if (driver == NULL || driver[0] == '\0') driver = "libcuda.so.1";
  lib = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "no CUDA driver: %s\n", dlerror());
    return 2;
  }
  *(void **)&p_cuInit = sym(lib, "cuInit");
  *(void **)&p_cuDeviceGetCount = sym(lib, "cuDeviceGetCount");
  *(void **)&p_cuDeviceGet = sym(lib, "cuDeviceGet");
  *(void **)&p_cuDevicePrimaryCtxRetain = sym(lib, "cuDevicePrimaryCtxRetain");
  *(void **)&p_cuDevicePrimaryCtxRelease = sym(lib, "cuDevicePrimaryCtxRelease_v2");
  *(void **)&p_cuCtxPushCurrent = sym(lib, "cuCtxPushCurrent_v2");
  *(void **)&p_cuCtxPopCurrent = sym(lib, "cuCtxPopCurrent_v2");
  *(void **)&p_cuCtxGetDevice = sym(lib, "cuCtxGetDevice");
  *(void **)&p_cuMemAlloc = sym(lib, "cuMemAlloc_v2");
  *(void **)&p_cuMemFree = sym(lib, "cuMemFree_v2");
  *(void **)&p_cuMemcpyHtoDAsync = sym(lib, "cuMemcpyHtoDAsync_v2");
  *(void **)&p_cuMemcpyDtoHAsync = sym(lib, "cuMemcpyDtoHAsync_v2");
  *(void **)&p_cuStreamSynchronize = sym(lib, "cuStreamSynchronize");
  if (p_cuInit(0) != 0 || p_cuDeviceGetCount(&count) != 0 || count < 1) {
    fprintf(stderr, "no usable GPU (cuInit / cuDeviceGetCount)\n");
    return 2;
  }

  /* Device memory, made under GPU 0's primary context, which is then popped. */
  host = malloc(N * sizeof(float));
  back = malloc(N * sizeof(float));
  if (host == NULL || back == NULL) return 1;
  for (i = 0; i < N; i++) host[i] = (float)((i * 2654435761u) % 100003u) * 0.5f - 7.0f;
  if (p_cuDeviceGet(&dev, 0) != 0 || p_cuDevicePrimaryCtxRetain(&ctx, dev) != 0 || p_cuCtxPushCurrent(ctx) != 0 ||
      p_cuMemAlloc(&src, N * sizeof(float)) != 0 || p_cuMemAlloc(&g_loaded, N * sizeof(float)) != 0 ||
      p_cuMemAlloc(&g_region, (size_t)RN * CN * sizeof(float)) != 0 ||
      to_device(src, host, N * sizeof(float))) {
    fprintf(stderr, "setting up device memory failed\n");
    return 1;
  }
  memset(back, 0xff, N * sizeof(float));  /* NaNs: what the loads must overwrite */
  if (to_device(g_loaded, back, N * sizeof(float)) || to_device(g_region, back, (size_t)RN * CN * sizeof(float)) ||
      p_cuCtxPopCurrent(&popped) != 0 ||
      !no_context()) {
    fprintf(stderr, "could not leave the main thread without a context\n");
    return 1;
  }

  /* The main thread, with no current context: a save and an asynchronous save with a device snapshot. */
  if (device_state(&state, src) != 0) goto failed;
  snprintf(path, sizeof path, "%s/sync", g_dir);
  if ((rc = dckpt_save(NULL, path, state, NULL, NULL)) != 0) {
    fail("dckpt_save of device memory with no current context", rc);
    goto failed;
  }
  if (!no_context()) {
    snprintf(g_failure, sizeof g_failure, "dckpt_save left a context current on the main thread");
    goto failed;
  }
  snprintf(path, sizeof path, "%s/async", g_dir);
  opts.device_snapshot = 1;
  if ((rc = dckpt_save_async(&future, path, state, NULL, &opts)) != 0) {
    fail("dckpt_save_async (device snapshot) with no current context", rc);
    goto failed;
  }
  rc = dckpt_save_future_wait(NULL, future, DCKPT_WAIT_FOREVER);
  dckpt_save_future_free(future);
  if (rc != 0) {
    fail("the asynchronous save", rc);
    goto failed;
  }
  if (!no_context()) {
    snprintf(g_failure, sizeof g_failure, "dckpt_save_async left a context current on the main thread");
    goto failed;
  }
  dckpt_state_free(state);
  state = NULL;

  /* A fresh thread, which never had a context: a load and a region read into device memory. */
  if (pthread_create(&thread, NULL, load_thread, NULL) != 0 || pthread_join(thread, NULL) != 0) {
    fprintf(stderr, "pthread_create/join failed\n");
    return 1;
  }
  if (g_failure[0] != '\0') goto failed;

  /* The values, copied back under the context. */
  if (p_cuCtxPushCurrent(ctx) != 0 || to_host(back, g_loaded, N * sizeof(float))) return 1;
  for (i = 0; i < N; i++) bad += back[i] != host[i];
  if (bad != 0) {
    fprintf(stderr, "the loaded buffer differs from the saved one in %d values\n", bad);
    return 1;
  }
  if (to_host(back, g_region, (size_t)RN * CN * sizeof(float))) return 1;
  for (r = 0; r < RN; r++) {
    for (c = 0; c < CN; c++) bad += back[r * CN + c] != host[(R0 + r) * COLS + C0 + c];
  }
  if (bad != 0) {
    fprintf(stderr, "the region read differs from the saved one in %d values\n", bad);
    return 1;
  }
  (void)p_cuMemFree(src);
  (void)p_cuMemFree(g_loaded);
  (void)p_cuMemFree(g_region);
  (void)p_cuCtxPopCurrent(&popped);
  (void)p_cuDevicePrimaryCtxRelease(dev);
  free(host);
  free(back);
  printf("OK: save, async save (device snapshot), load and region read with no current context\n");
  return 0;

failed:
  dckpt_state_free(state);
  fprintf(stderr, "%s\n", g_failure);
  return 1;
}
