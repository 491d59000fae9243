/* The C conveniences of issue 11, in C with -Wcast-qual -Werror (a const buffer passed where the ABI wants void *
 * would not compile): saving from const buffers, a load refusing them, clearing the last error, and byte progress
 * within one large chunk while verifying it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/tests/c_check.h"
#include "distckpt/distckpt.h"

static const float kBias[4] = {0.5f, -1.0f, 2.25f, 3.0f};
static const char kConfig[] = "{\"lr\": 0.001}";

struct progress_log {
  unsigned calls;
  uint64_t last_done, total;
  int monotonic;
};

static int on_progress(uint64_t done, uint64_t total, void *user_data) {
  struct progress_log *log = (struct progress_log *)user_data;
  if (done < log->last_done || (log->calls > 0 && total != log->total)) log->monotonic = 0;
  log->calls++;
  log->last_done = done;
  log->total = total;
  return 0;
}

static int abort_progress(uint64_t done, uint64_t total, void *user_data) {
  (void)done;
  (void)total;
  (void)user_data;
  return 1;
}

int main(void) {
  const char *tmp = getenv("TEST_TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/c_const_ckpt", tmp ? tmp : "/tmp");

  /* A 24 MiB one-chunk tensor (three 8 MiB verify segments), a const bias and const bytes. */
  enum { N = 6 * 1024 * 1024 };
  float *big = (float *)malloc(sizeof(float) * N);
  size_t i;
  CHECK(big != NULL);
  for (i = 0; i < N; i++) big[i] = (float)(i % 1000) * 0.25f;
  const float *big_ro = big;

  dckpt_state *state = NULL;
  CHECK_OK(dckpt_state_new(&state));
  uint64_t big_shape[1] = {N}, four[1] = {4}, zero[1] = {0};
  CHECK_OK(dckpt_state_add_tensor(state, "big", DCKPT_DTYPE_F32, 1, big_shape));
  CHECK_OK(dckpt_state_add_piece_const(state, "big", zero, big_shape, big_ro));
  CHECK_OK(dckpt_state_add_tensor(state, "bias", DCKPT_DTYPE_F32, 1, four));
  CHECK_OK(dckpt_state_add_piece_const(state, "bias", zero, four, kBias));
  CHECK_OK(dckpt_state_add_bytes_const(state, "config", kConfig, sizeof kConfig));
  dckpt_save_options opts = DCKPT_SAVE_OPTIONS_INIT;
  opts.overwrite = 1;
  CHECK_OK(dckpt_save(NULL, path, state, NULL, &opts));

  /* The same state as a load destination: refused before anything is read, naming the tensor. */
  CHECK(dckpt_load(NULL, path, state, NULL, NULL) == DCKPT_EINVAL);
  CHECK(strstr(dckpt_error_last(), "'big'") != NULL || strstr(dckpt_error_last(), "'bias'") != NULL);
  CHECK(strstr(dckpt_error_last(), "read-only") != NULL);
  dckpt_state_free(state);

  /* A const bytes entry alone is refused too. */
  dckpt_state *bytes_only = NULL;
  CHECK_OK(dckpt_state_new(&bytes_only));
  CHECK_OK(dckpt_state_add_bytes_const(bytes_only, "config", kConfig, sizeof kConfig));
  CHECK(dckpt_load(NULL, path, bytes_only, NULL, NULL) == DCKPT_EINVAL);
  CHECK(strstr(dckpt_error_last(), "'config'") != NULL);
  dckpt_state_free(bytes_only);

  /* dckpt_error_clear forgets the failure; a later success leaves the cleared state alone. */
  CHECK(dckpt_error_last_code() == DCKPT_EINVAL);
  dckpt_error_clear();
  CHECK(dckpt_error_last_code() == DCKPT_OK);
  CHECK(strcmp(dckpt_error_last(), "") == 0);

  /* A writable destination loads the values saved from the const buffers. */
  float bias_back[4] = {0};
  char config_back[64] = {0};
  dckpt_state *dst = NULL;
  CHECK_OK(dckpt_state_new(&dst));
  CHECK_OK(dckpt_state_add_tensor(dst, "bias", DCKPT_DTYPE_F32, 1, four));
  CHECK_OK(dckpt_state_add_piece(dst, "bias", zero, four, bias_back));
  CHECK_OK(dckpt_state_add_bytes(dst, "config", config_back, sizeof config_back));
  CHECK_OK(dckpt_load(NULL, path, dst, NULL, NULL));
  CHECK(memcmp(bias_back, kBias, sizeof kBias) == 0);
  CHECK(strcmp(config_back, kConfig) == 0);
  dckpt_state_free(dst);
  CHECK(dckpt_error_last_code() == DCKPT_OK);

  /* Verifying the one 24 MiB chunk reports progress within it: several calls, monotonic, ending at its size. */
  dckpt_reader *reader = NULL;
  CHECK_OK(dckpt_reader_open(&reader, path, NULL, NULL));
  size_t idx = 0;
  CHECK_OK(dckpt_reader_find(&idx, reader, "big"));
  dckpt_chunk_info chunk = DCKPT_CHUNK_INFO_INIT;
  CHECK_OK(dckpt_reader_chunk(&chunk, reader, idx, 0));
  struct progress_log log = {0, 0, 0, 1};
  CHECK_OK(dckpt_reader_verify_chunk_progress(reader, idx, 0, on_progress, &log));
  CHECK(log.calls >= 3);
  CHECK(log.monotonic);
  CHECK(log.last_done == chunk.length && log.total == chunk.length);
  CHECK(chunk.length == sizeof(float) * (uint64_t)N);
  CHECK_OK(dckpt_reader_verify_chunk_progress(reader, idx, 0, NULL, NULL));
  CHECK(dckpt_reader_verify_chunk_progress(reader, idx, 0, abort_progress, NULL) == DCKPT_EUSER);
  CHECK(dckpt_reader_verify_chunk_progress(reader, idx, 1, on_progress, &log) == DCKPT_EINVAL);
  CHECK(dckpt_reader_verify_chunk_progress(NULL, idx, 0, NULL, NULL) == DCKPT_EINVAL);
  dckpt_reader_free(reader);
  free(big);

  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("c_const_test: ok\n");
  return 0;
}
