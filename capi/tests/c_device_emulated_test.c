/* The device path of the C ABI end to end with the host copy engine standing in for CUDA (DCKPT_TEST_CUDA_ON_HOST=1,
 * set before the first call): DCKPT_MEMORY_CUDA pieces are saved from and loaded into (resharded) through the
 * staging pools, and dckpt_reader_read_ex reads a strided region into "device" memory. Everything but the copy itself
 * is the code a GPU machine runs; the values are checked element by element. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_check.h"
#include "distckpt/distckpt.h"

#define ROWS 64
#define COLS 48

static float value(uint64_t r, uint64_t c) { return (float)(r * 1000 + c); }

int main(void) {
  char dir[] = "/tmp/dckpt_c_device_emu_XXXXXX";
  char path[256];
  static float m[ROWS * COLS], left[ROWS * 20], right[ROWS * (COLS - 20)], box[10 * 5];
  const uint64_t shape[2] = {ROWS, COLS};
  dckpt_piece_options cuda = DCKPT_PIECE_OPTIONS_INIT, bad;
  dckpt_save_options so = DCKPT_SAVE_OPTIONS_INIT;
  dckpt_read_options ro = DCKPT_READ_OPTIONS_INIT, old;
  dckpt_state *save = NULL, *load = NULL;
  dckpt_reader *reader = NULL;
  uint64_t r, c, b;

  if (setenv("DCKPT_TEST_CUDA_ON_HOST", "1", 1) != 0) return 1;
  if (mkdtemp(dir) == NULL) return 1;
  snprintf(path, sizeof path, "%s/ckpt", dir);
  for (r = 0; r < ROWS; ++r)
    for (c = 0; c < COLS; ++c) m[r * COLS + c] = value(r, c);

  /* Saved from "device" memory in 4 row blocks, as 4 ranks would hold them. */
  cuda.memory = DCKPT_MEMORY_CUDA;
  cuda.device = 0;
  cuda.stream = NULL;
  CHECK_OK(dckpt_state_new(&save));
  CHECK_OK(dckpt_state_add_tensor(save, "m", DCKPT_DTYPE_F32, 2, shape));
  for (b = 0; b < 4; ++b) {
    const uint64_t off[2] = {b * 16, 0}, len[2] = {16, COLS};
    CHECK_OK(dckpt_state_add_piece_ex(save, "m", off, len, m + b * 16 * COLS, &cuda));
  }
  so.checksum_block_size = 4096;
  so.sync = 0;
  so.staging_buffer_bytes = 4096;
  so.staging_buffers = 2;
  CHECK_OK(dckpt_save(NULL, path, save, NULL, &so));

  /* Loaded into "device" memory by columns: every row of each piece is a strided run. */
  CHECK(ro.version == DCKPT_READ_OPTIONS_VERSION && ro.storage == NULL && ro.staging_buffer_bytes == 0 && ro.staging_buffers == 0);
  ro.staging_buffer_bytes = 4096;
  ro.staging_buffers = 2;
  memset(left, 0, sizeof left);
  memset(right, 0, sizeof right);
  CHECK_OK(dckpt_state_new(&load));
  CHECK_OK(dckpt_state_add_tensor(load, "m", DCKPT_DTYPE_F32, 2, shape));
  {
    const uint64_t o1[2] = {0, 0}, l1[2] = {ROWS, 20}, o2[2] = {0, 20}, l2[2] = {ROWS, COLS - 20};
    CHECK_OK(dckpt_state_add_piece_ex(load, "m", o1, l1, left, &cuda));
    CHECK_OK(dckpt_state_add_piece_ex(load, "m", o2, l2, right, &cuda));
  }
  CHECK_OK(dckpt_load(NULL, path, load, NULL, &ro));
  for (r = 0; r < ROWS; ++r) {
    for (c = 0; c < 20; ++c) CHECK(left[r * 20 + c] == value(r, c));
    for (c = 20; c < COLS; ++c) CHECK(right[r * (COLS - 20) + (c - 20)] == value(r, c));
  }

  /* A region through the reader, into "device" memory; options checked as for pieces. */
  CHECK_OK(dckpt_reader_open(&reader, path, NULL, &ro));
  {
    const uint64_t off[2] = {30, 7}, len[2] = {10, 5};
    CHECK_OK(dckpt_reader_read_ex(reader, "m", 2, off, len, box, sizeof box, &cuda));
    for (r = 0; r < 10; ++r)
      for (c = 0; c < 5; ++c) CHECK(box[r * 5 + c] == value(30 + r, 7 + c));
    bad = cuda;
    bad.version = DCKPT_PIECE_OPTIONS_VERSION + 1;
    CHECK(dckpt_reader_read_ex(reader, "m", 2, off, len, box, sizeof box, &bad) == DCKPT_EVERSION);
    bad = cuda;
    bad.memory = 9;
    CHECK(dckpt_reader_read_ex(reader, "m", 2, off, len, box, sizeof box, &bad) == DCKPT_EINVAL);
    bad = cuda;
    bad.device = -2;
    CHECK(dckpt_reader_read_ex(reader, "m", 2, off, len, box, sizeof box, &bad) == DCKPT_EINVAL);
    /* The device asked of the driver (emulated: device 0), and data that waits for no stream. */
    bad = cuda;
    bad.device = DCKPT_DEVICE_OF_POINTER;
    bad.stream = DCKPT_STREAM_READY;
    memset(box, 0, sizeof box);
    CHECK_OK(dckpt_reader_read_ex(reader, "m", 2, off, len, box, sizeof box, &bad));
    CHECK(box[9 * 5 + 4] == value(39, 11));
    CHECK(dckpt_reader_read_ex(reader, "m", 2, off, len, box, sizeof box - 4, &cuda) == DCKPT_EINVAL);
    CHECK(strstr(dckpt_error_last(), "'m'") != NULL);
  }
  dckpt_reader_free(reader);

  /* An asynchronous save with a device snapshot: the caller overwrites its "device" memory as soon as the call
   * returns; the checkpoint holds the values of the call. */
  {
    char p2[300];
    dckpt_save_future *f = NULL;
    dckpt_save_options so4;
    snprintf(p2, sizeof p2, "%s/async", dir);
    CHECK(so.version == DCKPT_SAVE_OPTIONS_VERSION && so.storage == NULL && so.device_snapshot == 0);
    so.device_snapshot = 1;
    CHECK_OK(dckpt_save_async(&f, p2, save, NULL, &so));
    for (r = 0; r < ROWS * COLS; ++r) m[r] = -1.0f;
    CHECK_OK(dckpt_save_future_wait(NULL, f, DCKPT_WAIT_FOREVER));
    dckpt_save_future_free(f);
    CHECK_OK(dckpt_reader_open(&reader, p2, NULL, NULL));
    {
      static float back[ROWS * COLS];
      const uint64_t zero[2] = {0, 0};
      CHECK_OK(dckpt_reader_read(reader, "m", 2, zero, shape, back, sizeof back));
      for (r = 0; r < ROWS; ++r)
        for (c = 0; c < COLS; ++c) CHECK(back[r * COLS + c] == value(r, c));
    }
    dckpt_reader_free(reader);
    /* A version-4 caller's struct ends before device_snapshot. */
    memset(&so4, 0xAB, sizeof so4);
    CHECK_OK(dckpt_save_options_init(&so4, 4));
    CHECK(so4.version == 4 && so4.max_async_staging_bytes == 0 && so4.device_snapshot == (int)0xABABABABu);
  }

  /* A version-5 caller's struct has no staging fields: init must not write past them. */
  memset(&old, 0xAB, sizeof old);
  CHECK_OK(dckpt_read_options_init(&old, 5));
  CHECK(old.version == 5 && old.fanout == DCKPT_FANOUT_AUTO && old.staging_buffers == 0xABABABABu);

  dckpt_state_free(load);
  dckpt_state_free(save);
  if (failures) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("ok\n");
  return 0;
}
