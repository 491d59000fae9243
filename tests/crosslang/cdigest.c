/* cdigest: the C reader of tests/crosslang. `cdigest CKPT` prints one line per tensor of a checkpoint: name, dtype,
 * shape and the FNV-1a 64 digest of its row-major bytes, read through the C ABI (dckpt_reader_open with no storage:
 * CKPT is a path or a URL such as s3://bucket/prefix, which the library resolves). On a read error it prints
 * "ERROR <tensor>: <message>" and exits 1. `cdigest --save CKPT` saves a fixed state there first (through dckpt_save
 * with no storage), for the other languages to read: a 12 MiB F32 tensor (more than one S3 part), an I64 vector, a U8
 * 3-d tensor and an F64 scalar. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distckpt/distckpt.h>

static uint64_t fnv1a64(const unsigned char *p, uint64_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

static int save(const char *path) {
  enum { ROWS = 3, COLS = 1 << 20, N = 3000 };
  float *big = malloc(sizeof(float) * ROWS * COLS);
  int64_t ints[N];
  uint8_t cube[5 * 7 * 9];
  double scalar = 2.718281828459045;
  if (big == NULL) return 1;
  for (uint64_t i = 0; i < (uint64_t)ROWS * COLS; i++) big[i] = (float)(i % 100003) * 0.25f - 3.0f;
  for (int i = 0; i < N; i++) ints[i] = (int64_t)i * i * (i % 2 ? -1 : 1);
  for (int i = 0; i < 5 * 7 * 9; i++) cube[i] = (uint8_t)(i * 37);
  uint64_t big_shape[2] = {ROWS, COLS}, zero2[2] = {0, 0}, n_shape[1] = {N}, zero1[1] = {0};
  uint64_t cube_shape[3] = {5, 7, 9}, zero3[3] = {0, 0, 0};
  dckpt_state *s = NULL;
  dckpt_save_options opts = DCKPT_SAVE_OPTIONS_INIT;
  opts.overwrite = 1;
  int rc = dckpt_state_new(&s);
  if (rc == DCKPT_OK) rc = dckpt_state_add_tensor(s, "big", DCKPT_DTYPE_F32, 2, big_shape);
  if (rc == DCKPT_OK) rc = dckpt_state_add_piece_const(s, "big", zero2, big_shape, big);
  if (rc == DCKPT_OK) rc = dckpt_state_add_tensor(s, "ints", DCKPT_DTYPE_I64, 1, n_shape);
  if (rc == DCKPT_OK) rc = dckpt_state_add_piece_const(s, "ints", zero1, n_shape, ints);
  if (rc == DCKPT_OK) rc = dckpt_state_add_tensor(s, "cube", DCKPT_DTYPE_U8, 3, cube_shape);
  if (rc == DCKPT_OK) rc = dckpt_state_add_piece_const(s, "cube", zero3, cube_shape, cube);
  if (rc == DCKPT_OK) rc = dckpt_state_add_tensor(s, "scalar", DCKPT_DTYPE_F64, 0, NULL);
  if (rc == DCKPT_OK) rc = dckpt_state_add_piece_const(s, "scalar", NULL, NULL, &scalar);
  if (rc == DCKPT_OK) rc = dckpt_save(NULL, path, s, NULL, &opts);
  if (rc != DCKPT_OK) fprintf(stderr, "cdigest: saving %s: %s\n", path, dckpt_error_last());
  dckpt_state_free(s);
  free(big);
  return rc == DCKPT_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  int saving = argc == 3 && strcmp(argv[1], "--save") == 0;
  if (argc != 2 && !saving) {
    fprintf(stderr, "usage: cdigest [--save] CHECKPOINT\n");
    return 2;
  }
  const char *path = argv[argc - 1];
  if (saving && save(path) != 0) return 1;
  dckpt_reader *r = NULL;
  dckpt_checkpoint_info info = DCKPT_CHECKPOINT_INFO_INIT;
  if (dckpt_reader_open(&r, path, NULL, NULL) != DCKPT_OK || dckpt_reader_info(&info, r) != DCKPT_OK) {
    printf("ERROR %s: %s\n", path, dckpt_error_last());
    dckpt_reader_free(r);
    return 1;
  }
  int failed = 0;
  for (size_t i = 0; i < info.num_entries; i++) {
    dckpt_entry_info e = DCKPT_ENTRY_INFO_INIT;
    if (dckpt_reader_entry(&e, r, i) != DCKPT_OK) {
      printf("ERROR entry %zu: %s\n", i, dckpt_error_last());
      failed = 1;
      continue;
    }
    if (e.kind != DCKPT_ENTRY_TENSOR) continue;
    uint64_t zeros[DCKPT_MAX_DIMS] = {0};
    unsigned char *buf = malloc(e.nbytes ? e.nbytes : 1);
    if (buf == NULL || dckpt_reader_read(r, e.name, e.ndim, zeros, e.shape, buf, e.nbytes) != DCKPT_OK) {
      printf("ERROR %s: %s\n", e.name, buf ? dckpt_error_last() : "out of memory");
      failed = 1;
      free(buf);
      continue;
    }
    printf("%s %s [", e.name, dckpt_dtype_name(e.dtype));
    for (size_t d = 0; d < e.ndim; d++) printf(d ? ", %llu" : "%llu", (unsigned long long)e.shape[d]);
    printf("] %016llx\n", (unsigned long long)fnv1a64(buf, e.nbytes));
    free(buf);
  }
  dckpt_reader_free(r);
  return failed;
}
