/* Device memory through the C ABI on a machine without the CUDA driver (the default CI): dckpt_piece_options, host
 * pieces through dckpt_state_add_piece_ex, DCKPT_EUNSUPPORTED naming libcuda.so.1 for DCKPT_MEMORY_CUDA, a load
 * refusing device pieces, and dckpt_save_options version 3. Where libcuda.so.1 exists the driver-less checks skip. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "c_check.h"
#include "distckpt/distckpt.h"

static int driver_present(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return 0;
  dlclose(h);
  return 1;
}

int main(void) {
  char dir[] = "/tmp/dckpt_c_device_XXXXXX";
  char path[256];
  float w[8] = {0, 1, 2, 3, 4, 5, 6, 7}, back[8] = {0};
  const uint64_t shape[1] = {8}, off0[1] = {0}, len4[1] = {4}, off4[1] = {4};
  dckpt_state *state = NULL, *load = NULL;
  dckpt_piece_options host = DCKPT_PIECE_OPTIONS_INIT, cuda, bad;
  dckpt_save_options so, so2;
  int i, rc;

  if (mkdtemp(dir) == NULL) return 1;
  snprintf(path, sizeof path, "%s/ckpt", dir);

  /* Options: the macro and the function agree; version 0 and a future version are refused. */
  CHECK_OK(dckpt_piece_options_init(&cuda, DCKPT_PIECE_OPTIONS_VERSION));
  CHECK(cuda.version == DCKPT_PIECE_OPTIONS_VERSION && cuda.memory == DCKPT_MEMORY_HOST && cuda.device == 0 &&
        cuda.stream == NULL);
  CHECK(dckpt_piece_options_init(&bad, 0) == DCKPT_EINVAL);
  CHECK(dckpt_piece_options_init(&bad, DCKPT_PIECE_OPTIONS_VERSION + 1) == DCKPT_EVERSION);

  /* Host pieces through _ex (NULL options and DCKPT_MEMORY_HOST) save and load like dckpt_state_add_piece. */
  CHECK_OK(dckpt_state_new(&state));
  CHECK_OK(dckpt_state_add_tensor(state, "w", DCKPT_DTYPE_F32, 1, shape));
  CHECK_OK(dckpt_state_add_piece_ex(state, "w", off0, len4, w, NULL));
  CHECK_OK(dckpt_state_add_piece_ex(state, "w", off4, len4, w + 4, &host));
  CHECK_OK(dckpt_save_options_init(&so, DCKPT_SAVE_OPTIONS_VERSION));
  CHECK(so.staging_buffer_bytes == 0 && so.staging_buffers == 0 && so.max_async_staging_bytes == 0);
  so.staging_buffers = 2;
  so.staging_buffer_bytes = 1 << 20;
  so.sync = 0;
  CHECK_OK(dckpt_save(NULL, path, state, NULL, &so));
  CHECK_OK(dckpt_state_new(&load));
  CHECK_OK(dckpt_state_add_tensor(load, "w", DCKPT_DTYPE_F32, 1, shape));
  CHECK_OK(dckpt_state_add_piece_ex(load, "w", off0, shape, back, &host));
  CHECK_OK(dckpt_load(NULL, path, load, NULL, NULL));
  CHECK(memcmp(w, back, sizeof w) == 0);

  /* A version-2 caller's struct has no staging fields: init must not write past them. */
  memset(&so2, 0xAB, sizeof so2);
  CHECK_OK(dckpt_save_options_init(&so2, 2));
  CHECK(so2.version == 2 && so2.progress == NULL && so2.staging_buffers == 0xABABABABu);
  memset(&so2, 0xAB, sizeof so2);
  CHECK_OK(dckpt_save_options_init(&so2, 3));
  CHECK(so2.version == 3 && so2.staging_buffers == 0 && so2.max_async_staging_bytes == 0xABABABABABABABABull);

  /* Async saves under a cap of one save's staging at a time: the second waits for the first, both succeed. */
  {
    dckpt_save_future *f1 = NULL, *f2 = NULL;
    char p1[300], p2[300];
    snprintf(p1, sizeof p1, "%s/async1", dir);
    snprintf(p2, sizeof p2, "%s/async2", dir);
    so.max_async_staging_bytes = 1;
    CHECK_OK(dckpt_save_async(&f1, p1, state, NULL, &so));
    CHECK_OK(dckpt_save_async(&f2, p2, state, NULL, &so));
    CHECK_OK(dckpt_save_future_wait(NULL, f1, DCKPT_WAIT_FOREVER));
    CHECK_OK(dckpt_save_future_wait(NULL, f2, DCKPT_WAIT_FOREVER));
    dckpt_save_future_free(f1);
    dckpt_save_future_free(f2);
    so.max_async_staging_bytes = 0;
  }

  /* Unknown memory kinds are DCKPT_EINVAL. */
  bad = host;
  bad.memory = 7;
  CHECK(dckpt_state_add_piece_ex(state, "w", off0, len4, w, &bad) == DCKPT_EINVAL);

  /* DCKPT_MEMORY_CUDA without a driver: DCKPT_EUNSUPPORTED naming libcuda.so.1, and the state is unchanged. */
  cuda.memory = DCKPT_MEMORY_CUDA;
  cuda.device = 0;
  cuda.stream = NULL;
  if (driver_present()) {
    printf("libcuda.so.1 is present: skipping the driver-less checks\n");
  } else {
    for (i = 0; i < 2; ++i) { /* the second call reports the same, without loading again */
      dckpt_error_clear();
      rc = dckpt_state_add_piece_ex(state, "w", off0, len4, w, &cuda);
      CHECK(rc == DCKPT_EUNSUPPORTED);
      CHECK(strstr(dckpt_error_last(), "libcuda.so.1 not found") != NULL);
      CHECK(strstr(dckpt_error_last(), "tensor 'w'") != NULL);
      if (rc != DCKPT_EUNSUPPORTED) fprintf(stderr, "message: %s\n", dckpt_error_last());
    }
  }

  dckpt_state_free(load);
  dckpt_state_free(state);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
