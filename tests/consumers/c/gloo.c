/* A program of a user's own that runs as one rank of a Gloo group: rank, world size and rendezvous come from the
 * environment (DCKPT_RANK, DCKPT_WORLD_SIZE, DCKPT_RENDEZVOUS), as `dckpt_comm_new_gloo(&comm, NULL)` reads them. Each
 * rank saves its rows of a tensor, then loads another rank's rows back (a different sharding) and checks every value.
 * The first Gloo communicator loads the Gloo plugin, libdistckpt_gloo.so: beside libdistckpt.so for a program linked
 * to the shared library, beside the executable (or from DCKPT_GLOO_PLUGIN) for one linked statically.
 *
 *   gloo CKPT_PATH                       one rank of the group
 *   gloo CKPT_PATH --expect-no-plugin    checks that the communicator is refused with DCKPT_EUNSUPPORTED, the message
 *                                        naming DCKPT_GLOO_PLUGIN and dckpt_comm_new_external (no plugin to be found) */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <distckpt/distckpt.h>

enum { ROWS_PER_RANK = 4, COLS = 8, MAX_RANKS = 16 };

static int fail(const char *what) {
  fprintf(stderr, "gloo consumer: %s failed: %s\n", what, dckpt_error_last());
  return 1;
}

static float value(int row, int col) { return (float)(row * COLS + col) * 0.25f - 3.0f; }

int main(int argc, char **argv) {
  if (argc < 2 || (argc == 3 && strcmp(argv[2], "--expect-no-plugin") != 0) || argc > 3) {
    fprintf(stderr, "usage: %s CKPT_PATH [--expect-no-plugin]\n", argv[0]);
    return 2;
  }
  dckpt_comm *comm = NULL;
  int rc = dckpt_comm_new_gloo(&comm, NULL);
  if (argc == 3) {
    const char *msg = dckpt_error_last();
    if (rc != DCKPT_EUNSUPPORTED || !strstr(msg, "DCKPT_GLOO_PLUGIN") || !strstr(msg, "dckpt_comm_new_external")) {
      fprintf(stderr, "gloo consumer: expected DCKPT_EUNSUPPORTED naming the plugin, got %d: %s\n", rc, msg);
      return 1;
    }
    printf("gloo consumer: refused as expected: %s\n", msg);
    return 0;
  }
  if (rc != DCKPT_OK) return fail("dckpt_comm_new_gloo");
  int rank = 0, size = 0;
  if (dckpt_comm_rank(&rank, comm) != DCKPT_OK || dckpt_comm_size(&size, comm) != DCKPT_OK) return fail("rank/size");
  if (size > MAX_RANKS) return fail("a world size of at most 16");

  static float mine[ROWS_PER_RANK * COLS], theirs[ROWS_PER_RANK * COLS];
  for (int r = 0; r < ROWS_PER_RANK; r++) {
    for (int c = 0; c < COLS; c++) mine[r * COLS + c] = value(rank * ROWS_PER_RANK + r, c);
  }
  uint64_t shape[2] = {(uint64_t)size * ROWS_PER_RANK, COLS}, rows[2] = {ROWS_PER_RANK, COLS};
  uint64_t at[2] = {(uint64_t)rank * ROWS_PER_RANK, 0};
  dckpt_state *s = NULL;
  if (dckpt_state_new(&s) != DCKPT_OK || dckpt_state_add_tensor(s, "w", DCKPT_DTYPE_F32, 2, shape) != DCKPT_OK ||
      dckpt_state_add_piece(s, "w", at, rows, mine) != DCKPT_OK) {
    return fail("the state");
  }
  dckpt_save_options opts = DCKPT_SAVE_OPTIONS_INIT;
  opts.overwrite = 1;
  if (dckpt_save(NULL, argv[1], s, comm, &opts) != DCKPT_OK) return fail("dckpt_save");
  dckpt_state_free(s);

  const int other = (rank + 1) % size;
  uint64_t at_other[2] = {(uint64_t)other * ROWS_PER_RANK, 0};
  if (dckpt_state_new(&s) != DCKPT_OK || dckpt_state_add_tensor(s, "w", DCKPT_DTYPE_F32, 2, shape) != DCKPT_OK ||
      dckpt_state_add_piece(s, "w", at_other, rows, theirs) != DCKPT_OK) {
    return fail("the state");
  }
  if (dckpt_load(NULL, argv[1], s, comm, NULL) != DCKPT_OK) return fail("dckpt_load");
  dckpt_state_free(s);
  for (int r = 0; r < ROWS_PER_RANK; r++) {
    for (int c = 0; c < COLS; c++) {
      if (theirs[r * COLS + c] != value(other * ROWS_PER_RANK + r, c)) {
        fprintf(stderr, "gloo consumer: rank %d: row %d col %d differs\n", rank, other * ROWS_PER_RANK + r, c);
        return 1;
      }
    }
  }
  dckpt_comm_free(comm);
  printf("gloo consumer: rank %d of %d saved its rows and read rank %d's back exactly\n", rank, size, other);
  return 0;
}
