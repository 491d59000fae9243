/* Incremental saves through the C ABI only, in C (capi/API.md "Incremental checkpoints"): a save with a base writes
 * only what changed, says how much it reused, and reads back exactly; the reader reports the base by name. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/tests/c_check.h"
#include "distckpt/distckpt.h"

enum { N = 300000 }; /* 1.2 MB of float per tensor: several checksum blocks */

static dckpt_state *make_state(float *frozen, float *adapter) {
  dckpt_state *state = NULL;
  uint64_t shape[1] = {N}, half[1] = {N / 2}, lo[1] = {0}, hi[1] = {N / 2};
  CHECK_OK(dckpt_state_new(&state));
  CHECK_OK(dckpt_state_add_tensor(state, "frozen", DCKPT_DTYPE_F32, 1, shape));
  CHECK_OK(dckpt_state_add_piece(state, "frozen", lo, half, frozen));
  CHECK_OK(dckpt_state_add_piece(state, "frozen", hi, half, frozen + N / 2));
  CHECK_OK(dckpt_state_add_tensor(state, "adapter", DCKPT_DTYPE_F32, 1, shape));
  CHECK_OK(dckpt_state_add_piece(state, "adapter", lo, shape, adapter));
  return state;
}

int main(void) {
  const char *tmp = getenv("TEST_TMPDIR");
  char dir[4096], full[4200], incr[4200];
  snprintf(dir, sizeof dir, "%s/c_incremental", tmp ? tmp : "/tmp");
  snprintf(full, sizeof full, "%s/step-1", dir);
  snprintf(incr, sizeof incr, "%s/step-2", dir);
  float *frozen = malloc(N * sizeof(float)), *adapter = malloc(N * sizeof(float));
  int i;
  for (i = 0; i < N; i++) frozen[i] = (float)(i % 1000), adapter[i] = 1.0f;

  dckpt_state *state = make_state(frozen, adapter);
  dckpt_save_options opts;
  CHECK_OK(dckpt_save_options_init(&opts, DCKPT_SAVE_OPTIONS_VERSION));
  CHECK(opts.base == NULL && opts.full_every == 0);
  opts.sync = 0;
  dckpt_save_info info = DCKPT_SAVE_INFO_INIT;
  CHECK_OK(dckpt_save(&info, full, state, NULL, &opts));
  CHECK(info.bytes_reused == 0);

  for (i = 0; i < N; i++) adapter[i] = 2.0f; /* the adapter trains, the rest is frozen */
  opts.base = "step-1";
  CHECK_OK(dckpt_save(&info, incr, state, NULL, &opts));
  CHECK(info.bytes_reused == N * sizeof(float));
  CHECK(info.bytes_written == N * sizeof(float));
  dckpt_state_free(state);

  /* An older caller's dckpt_save_info (version 1) is filled as far as it goes. */
  dckpt_save_info old = DCKPT_SAVE_INFO_INIT;
  old.version = 1;
  old.bytes_reused = 12345;
  opts.base = full; /* by path */
  opts.overwrite = 1;
  state = make_state(frozen, adapter);
  CHECK_OK(dckpt_save(&old, incr, state, NULL, &opts));
  CHECK(old.bytes_reused == 12345);
  dckpt_state_free(state);

  dckpt_reader *reader = NULL;
  CHECK_OK(dckpt_reader_open(&reader, incr, NULL, NULL));
  dckpt_checkpoint_info ci = DCKPT_CHECKPOINT_INFO_INIT;
  CHECK_OK(dckpt_reader_info(&ci, reader));
  CHECK(ci.format_major == 2);
  CHECK(ci.num_bases == 1);
  CHECK(ci.chain_length == 1);
  CHECK(ci.bytes_in_bases == N * sizeof(float));
  const char *name = NULL;
  CHECK_OK(dckpt_reader_base(&name, reader, 0));
  CHECK(name != NULL && strcmp(name, "step-1") == 0);
  CHECK(dckpt_reader_base(&name, reader, 1) == DCKPT_EINVAL);
  CHECK(strstr(dckpt_error_last(), "out of range") != NULL);
  CHECK_OK(dckpt_reader_verify(reader, NULL, NULL));
  dckpt_reader_free(reader);

  /* Load resharded (one piece each) and compare. */
  float *f2 = calloc(N, sizeof(float)), *a2 = calloc(N, sizeof(float));
  dckpt_state *back = NULL;
  uint64_t shape[1] = {N}, zero[1] = {0};
  CHECK_OK(dckpt_state_new(&back));
  CHECK_OK(dckpt_state_add_tensor(back, "frozen", DCKPT_DTYPE_F32, 1, shape));
  CHECK_OK(dckpt_state_add_piece(back, "frozen", zero, shape, f2));
  CHECK_OK(dckpt_state_add_tensor(back, "adapter", DCKPT_DTYPE_F32, 1, shape));
  CHECK_OK(dckpt_state_add_piece(back, "adapter", zero, shape, a2));
  CHECK_OK(dckpt_load(NULL, incr, back, NULL, NULL));
  CHECK(memcmp(f2, frozen, N * sizeof(float)) == 0);
  CHECK(memcmp(a2, adapter, N * sizeof(float)) == 0);
  dckpt_state_free(back);

  /* The base cannot go while step-2 refers to it; a flattened copy of step-2 needs no base. */
  CHECK(dckpt_storage_remove_checkpoint(NULL, full) == DCKPT_ESTATE);
  CHECK(strstr(dckpt_error_last(), "'step-2'") != NULL);
  char flat[4200];
  snprintf(flat, sizeof flat, "%s/flat", dir);
  dckpt_flatten_info fi = DCKPT_FLATTEN_INFO_INIT;
  CHECK_OK(dckpt_flatten(&fi, incr, flat, 0, NULL));
  CHECK(fi.bytes_copied == 2 * N * sizeof(float));
  CHECK(fi.bytes_from_bases == N * sizeof(float));
  CHECK_OK(dckpt_reader_open(&reader, flat, NULL, NULL));
  ci = (dckpt_checkpoint_info)DCKPT_CHECKPOINT_INFO_INIT;
  CHECK_OK(dckpt_reader_info(&ci, reader));
  CHECK(ci.num_bases == 0 && ci.format_major == 1 && ci.bytes_in_bases == 0);
  dckpt_reader_free(reader);

  /* A base that is not a sibling is refused, naming the rule. */
  state = make_state(frozen, adapter);
  opts.base = "/somewhere/else";
  CHECK(dckpt_save(NULL, incr, state, NULL, &opts) == DCKPT_EINVAL);
  CHECK(strstr(dckpt_error_last(), "must be a sibling") != NULL);
  dckpt_state_free(state);

  free(frozen), free(adapter), free(f2), free(a2);
  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("c_incremental_test: ok\n");
  return 0;
}
