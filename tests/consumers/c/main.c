/* A C program of a user's own, built outside the repository exactly as the README's C section says
 * (pkg-config after the sources) and run without LD_LIBRARY_PATH: saves weights held in const memory, loads them back
 * resharded into two halves, reads the step from the user metadata, and exits non-zero on any mismatch. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <distckpt/distckpt.h>

enum { ROWS = 8, COLS = 16 };

static int fail(const char *what) {
  fprintf(stderr, "consumer: %s failed: %s\n", what, dckpt_error_last());
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s CKPT_PATH\n", argv[0]);
    return 2;
  }
  static float weights[ROWS * COLS];
  for (int i = 0; i < ROWS * COLS; i++) weights[i] = (float)i * 0.5f - 7.0f;
  const float *frozen = weights; /* what a server holds: read-only weights */

  dckpt_state *s = NULL;
  uint64_t shape[2] = {ROWS, COLS}, origin[2] = {0, 0};
  if (dckpt_state_new(&s) != DCKPT_OK) return fail("dckpt_state_new");
  if (dckpt_state_add_tensor(s, "w", DCKPT_DTYPE_F32, 2, shape) != DCKPT_OK) return fail("add_tensor");
  if (dckpt_state_add_piece_const(s, "w", origin, shape, frozen) != DCKPT_OK) return fail("add_piece_const");
  if (dckpt_state_set_user(s, "step", "100") != DCKPT_OK) return fail("set_user");
  dckpt_save_options opts = DCKPT_SAVE_OPTIONS_INIT;
  opts.overwrite = 1;
  if (dckpt_save(NULL, argv[1], s, NULL, &opts) != DCKPT_OK) return fail("dckpt_save");
  dckpt_state_free(s);

  /* Load back as two column halves (a different sharding). */
  float left[ROWS * COLS / 2], right[ROWS * COLS / 2];
  uint64_t half[2] = {ROWS, COLS / 2}, at_left[2] = {0, 0}, at_right[2] = {0, COLS / 2};
  dckpt_state *d = NULL;
  if (dckpt_state_new(&d) != DCKPT_OK) return fail("dckpt_state_new");
  if (dckpt_state_add_tensor(d, "w", DCKPT_DTYPE_F32, 2, shape) != DCKPT_OK) return fail("add_tensor");
  if (dckpt_state_add_piece(d, "w", at_left, half, left) != DCKPT_OK) return fail("add_piece");
  if (dckpt_state_add_piece(d, "w", at_right, half, right) != DCKPT_OK) return fail("add_piece");
  if (dckpt_load(NULL, argv[1], d, NULL, NULL) != DCKPT_OK) return fail("dckpt_load");
  dckpt_state_free(d);
  for (int r = 0; r < ROWS; r++) {
    for (int c = 0; c < COLS; c++) {
      float got = c < COLS / 2 ? left[r * (COLS / 2) + c] : right[r * (COLS / 2) + c - COLS / 2];
      if (got != weights[r * COLS + c]) {
        fprintf(stderr, "consumer: w[%d][%d] = %g, saved %g\n", r, c, got, weights[r * COLS + c]);
        return 1;
      }
    }
  }

  dckpt_reader *reader = NULL;
  const char *step = NULL;
  if (dckpt_reader_open(&reader, argv[1], NULL, NULL) != DCKPT_OK) return fail("dckpt_reader_open");
  if (dckpt_reader_user_get(&step, reader, "step") != DCKPT_OK) return fail("dckpt_reader_user_get");
  if (strcmp(step, "100") != 0) {
    fprintf(stderr, "consumer: step is '%s', saved '100'\n", step);
    return 1;
  }
  /* A failed lookup sets the last error; dckpt_error_clear forgets it. */
  if (dckpt_reader_user_get(&step, reader, "epoch") != DCKPT_ENOTFOUND) return fail("user_get of a missing key");
  dckpt_error_clear();
  if (dckpt_error_last_code() != DCKPT_OK || dckpt_error_last()[0] != '\0') return fail("dckpt_error_clear");
  dckpt_reader_free(reader);
  printf("consumer: libdistckpt %s, %d values and the step read back exactly\n", dckpt_version_string(), ROWS * COLS);
  return 0;
}
