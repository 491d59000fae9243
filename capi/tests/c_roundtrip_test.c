/* A single-process round trip through the C ABI only, written in C: save a state made of several pieces, load it
 * into differently sharded buffers, read regions and bytes with the offline reader, and check error reporting. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/tests/c_check.h"
#include "distckpt/distckpt.h"

enum { ROWS = 6, COLS = 4 };

/* Records (done, total) in user_data, a uint64_t[2]. */
static int on_progress(uint64_t done, uint64_t total, void *user_data) {
  uint64_t *last = (uint64_t *)user_data;
  last[0] = done;
  last[1] = total;
  return 0;
}

int main(void) {
  const char *tmp = getenv("TEST_TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/c_roundtrip_ckpt", tmp ? tmp : "/tmp");

  /* --- Save: w (f32 6x4) as two row pieces, b (i64 5), a scalar, and a bytes entry. --- */
  float w[ROWS * COLS];
  int64_t b[5];
  double step = 1234.5;
  const char config[] = "{\"lr\": 0.001}";
  int i, r, c;
  for (i = 0; i < ROWS * COLS; i++) w[i] = (float)i * 0.5f;
  for (i = 0; i < 5; i++) b[i] = -7 * i;

  dckpt_state *state = NULL;
  CHECK_OK(dckpt_state_new(&state));
  uint64_t wshape[2] = {ROWS, COLS};
  CHECK_OK(dckpt_state_add_tensor(state, "model.w", DCKPT_DTYPE_F32, 2, wshape));
  uint64_t top_off[2] = {0, 0}, top_len[2] = {2, COLS};
  uint64_t bot_off[2] = {2, 0}, bot_len[2] = {4, COLS};
  CHECK_OK(dckpt_state_add_piece(state, "model.w", top_off, top_len, w));
  CHECK_OK(dckpt_state_add_piece(state, "model.w", bot_off, bot_len, w + 2 * COLS));
  uint64_t bshape[1] = {5}, zero1[1] = {0};
  CHECK_OK(dckpt_state_add_tensor(state, "model.b", DCKPT_DTYPE_I64, 1, bshape));
  CHECK_OK(dckpt_state_add_piece(state, "model.b", zero1, bshape, b));
  CHECK_OK(dckpt_state_add_tensor(state, "step", DCKPT_DTYPE_F64, 0, NULL));
  CHECK_OK(dckpt_state_add_piece(state, "step", NULL, NULL, &step));
  CHECK_OK(dckpt_state_add_bytes(state, "config", (void *)config, sizeof config));
  CHECK_OK(dckpt_state_set_user(state, "framework", "plain-c"));

  dckpt_save_options opts;
  CHECK_OK(dckpt_save_options_init(&opts, DCKPT_SAVE_OPTIONS_VERSION));
  dckpt_save_info info = DCKPT_SAVE_INFO_INIT;
  CHECK_OK(dckpt_save(&info, path, state, NULL, &opts));
  CHECK(info.num_entries == 4);
  CHECK(info.num_files == 1);
  CHECK(info.total_bytes == sizeof w + sizeof b + sizeof step + sizeof config);

  /* Saving again to the same path fails with EEXISTS and a message naming the path. */
  CHECK(dckpt_save(NULL, path, state, NULL, &opts) == DCKPT_EEXISTS);
  CHECK(strstr(dckpt_error_last(), "c_roundtrip_ckpt") != NULL);
  dckpt_state_free(state);

  /* --- Load w as three column pieces, b as two pieces, the scalar and the bytes. --- */
  float col0[ROWS * 1], col1[ROWS * 2], col2[ROWS * 1];
  int64_t b_lo[2], b_hi[3];
  double step_back = 0;
  char config_back[64];
  memset(col0, 0xff, sizeof col0);
  memset(col1, 0xff, sizeof col1);
  memset(col2, 0xff, sizeof col2);
  dckpt_state *dst = NULL;
  CHECK_OK(dckpt_state_new(&dst));
  CHECK_OK(dckpt_state_add_tensor(dst, "model.w", DCKPT_DTYPE_F32, 2, wshape));
  uint64_t c0_off[2] = {0, 0}, c0_len[2] = {ROWS, 1};
  uint64_t c1_off[2] = {0, 1}, c1_len[2] = {ROWS, 2};
  uint64_t c2_off[2] = {0, 3}, c2_len[2] = {ROWS, 1};
  CHECK_OK(dckpt_state_add_piece(dst, "model.w", c0_off, c0_len, col0));
  CHECK_OK(dckpt_state_add_piece(dst, "model.w", c1_off, c1_len, col1));
  CHECK_OK(dckpt_state_add_piece(dst, "model.w", c2_off, c2_len, col2));
  uint64_t blo_len[1] = {2}, bhi_off[1] = {2}, bhi_len[1] = {3};
  CHECK_OK(dckpt_state_add_tensor(dst, "model.b", DCKPT_DTYPE_I64, 1, bshape));
  CHECK_OK(dckpt_state_add_piece(dst, "model.b", zero1, blo_len, b_lo));
  CHECK_OK(dckpt_state_add_piece(dst, "model.b", bhi_off, bhi_len, b_hi));
  CHECK_OK(dckpt_state_add_tensor(dst, "step", DCKPT_DTYPE_F64, 0, NULL));
  CHECK_OK(dckpt_state_add_piece(dst, "step", NULL, NULL, &step_back));
  CHECK_OK(dckpt_state_add_bytes(dst, "config", config_back, sizeof config_back));
  dckpt_io_stats stats = DCKPT_IO_STATS_INIT;
  CHECK_OK(dckpt_load(&stats, path, dst, NULL, NULL));
  for (r = 0; r < ROWS; r++) {
    CHECK(col0[r] == w[r * COLS + 0]);
    CHECK(col1[r * 2 + 0] == w[r * COLS + 1]);
    CHECK(col1[r * 2 + 1] == w[r * COLS + 2]);
    CHECK(col2[r] == w[r * COLS + 3]);
  }
  for (i = 0; i < 2; i++) CHECK(b_lo[i] == b[i]);
  for (i = 0; i < 3; i++) CHECK(b_hi[i] == b[2 + i]);
  CHECK(step_back == step);
  uint64_t config_size = 0;
  CHECK_OK(dckpt_state_bytes_size(&config_size, dst, "config"));
  CHECK(config_size == sizeof config);
  CHECK(memcmp(config_back, config, sizeof config) == 0);
  CHECK(stats.bytes_delivered == sizeof w + sizeof b + sizeof step + sizeof config);
  /* Small files are written through the page cache, so the tensors came through the mapping, not read(). */
  CHECK(stats.bytes_mapped + stats.bytes_read >= sizeof w + sizeof b + sizeof step);

  /* A caller built against older struct versions: nothing past its fields is written. */
  {
    dckpt_read_options old_opts;
    memset(&old_opts, 0xEE, sizeof old_opts);
    CHECK_OK(dckpt_read_options_init(&old_opts, 2));
    CHECK(old_opts.version == 2 && old_opts.verify == 1 && old_opts.progress == NULL);
    CHECK(old_opts.map_files == (int)0xEEEEEEEE && old_opts.share_verification == (int)0xEEEEEEEE);
    dckpt_io_stats old_stats;
    memset(&old_stats, 0xEE, sizeof old_stats);
    old_stats.version = 1;
    CHECK_OK(dckpt_load(&old_stats, path, dst, NULL, &old_opts));
    CHECK(old_stats.bytes_delivered == stats.bytes_delivered);
    CHECK(old_stats.bytes_mapped == 0xEEEEEEEEEEEEEEEEull);
    /* A version 3 struct has no pin_files: init must not write it. */
    {
      dckpt_read_options v3;
      memset(&v3, 0xEE, sizeof v3);
      CHECK_OK(dckpt_read_options_init(&v3, 3));
      CHECK(v3.version == 3 && v3.map_files == 1 && v3.share_verification == 1);
      CHECK(v3.pin_files == (int)0xEEEEEEEE);
    }
    /* Version 4 has no fan-out fields; a version 2 stats struct no peer counters. */
    {
      dckpt_read_options v4;
      memset(&v4, 0xEE, sizeof v4);
      CHECK_OK(dckpt_read_options_init(&v4, 4));
      CHECK(v4.version == 4 && v4.pin_files == 1);
      CHECK(v4.fanout == (int)0xEEEEEEEE && v4.fanout_round_bytes == 0xEEEEEEEEEEEEEEEEull);
      dckpt_io_stats v2_stats;
      memset(&v2_stats, 0xEE, sizeof v2_stats);
      v2_stats.version = 2;
      CHECK_OK(dckpt_load(&v2_stats, path, dst, NULL, &v4));
      CHECK(v2_stats.bytes_delivered == stats.bytes_delivered && v2_stats.bytes_mapped != 0xEEEEEEEEEEEEEEEEull);
      CHECK(v2_stats.bytes_received_from_peers == 0xEEEEEEEEEEEEEEEEull);
      CHECK(v2_stats.bytes_sent_to_peers == 0xEEEEEEEEEEEEEEEEull);
    }
    /* Version 5: the fan-out mode is checked; one process has no peers to exchange with. */
    {
      dckpt_read_options v5 = DCKPT_READ_OPTIONS_INIT;
      CHECK(v5.fanout == DCKPT_FANOUT_AUTO && v5.fanout_round_bytes == 0);
      v5.fanout = DCKPT_FANOUT_ALWAYS;
      dckpt_io_stats v3_stats = DCKPT_IO_STATS_INIT;
      CHECK_OK(dckpt_load(&v3_stats, path, dst, NULL, &v5));
      CHECK(v3_stats.bytes_received_from_peers == 0 && v3_stats.bytes_sent_to_peers == 0);
      v5.fanout = 7;
      CHECK(dckpt_load(NULL, path, dst, NULL, &v5) == DCKPT_EINVAL);
      CHECK(strstr(dckpt_error_last(), "fanout") != NULL);
    }
    /* Loading through an open reader (everything from the checkpoint it opened), files opened on first use. */
    {
      dckpt_read_options lazy = DCKPT_READ_OPTIONS_INIT;
      CHECK(lazy.pin_files == 1);
      lazy.pin_files = 0;
      dckpt_reader *opened = NULL;
      CHECK_OK(dckpt_reader_open(&opened, path, NULL, &lazy));
      memset(col0, 0xff, sizeof col0);
      step_back = 0;
      dckpt_io_stats via_reader = DCKPT_IO_STATS_INIT;
      CHECK_OK(dckpt_reader_load(&via_reader, opened, dst, NULL, NULL, NULL));
      for (r = 0; r < ROWS; r++) CHECK(col0[r] == w[r * COLS + 0]);
      CHECK(step_back == step);
      CHECK(via_reader.bytes_delivered == sizeof w + sizeof b + sizeof step + sizeof config);
      CHECK(dckpt_reader_load(NULL, NULL, dst, NULL, NULL, NULL) == DCKPT_EINVAL);
      dckpt_reader_free(opened);
    }
    /* Version 3 options: mapping off means every byte comes through read(). */
    dckpt_read_options no_map = DCKPT_READ_OPTIONS_INIT;
    no_map.map_files = 0;
    CHECK_OK(dckpt_load(&stats, path, dst, NULL, &no_map));
    CHECK(stats.bytes_mapped == 0 && stats.bytes_read >= sizeof w + sizeof b + sizeof step);
  }
  dckpt_state_free(dst);

  /* --- Offline reader. --- */
  dckpt_reader *reader = NULL;
  CHECK_OK(dckpt_reader_open(&reader, path, NULL, NULL));
  dckpt_checkpoint_info ci = DCKPT_CHECKPOINT_INFO_INIT;
  CHECK_OK(dckpt_reader_info(&ci, reader));
  CHECK(ci.num_entries == 4);
  CHECK(ci.format_major == 1);
  CHECK(strcmp(ci.source, "") == 0 && strcmp(ci.source_version, "") == 0 && ci.checksummed == 1);
  size_t idx = 0;
  CHECK_OK(dckpt_reader_find(&idx, reader, "model.w"));
  dckpt_entry_info ei = DCKPT_ENTRY_INFO_INIT;
  CHECK_OK(dckpt_reader_entry(&ei, reader, idx));
  CHECK(strcmp(ei.name, "model.w") == 0);
  CHECK(ei.dtype == DCKPT_DTYPE_F32 && ei.ndim == 2 && ei.shape[0] == ROWS && ei.shape[1] == COLS);
  CHECK(ei.num_chunks == 2);
  dckpt_chunk_info chunk = DCKPT_CHUNK_INFO_INIT;
  CHECK_OK(dckpt_reader_chunk(&chunk, reader, idx, 1));
  CHECK(chunk.offsets[0] == 2 && chunk.lengths[0] == 4 && chunk.file_offset % 4096 == 0);
  /* Entries are sorted by name. */
  CHECK_OK(dckpt_reader_entry(&ei, reader, 0));
  CHECK(strcmp(ei.name, "config") == 0 && ei.kind == DCKPT_ENTRY_BYTES);

  float region[3 * 2];
  uint64_t reg_off[2] = {1, 1}, reg_len[2] = {3, 2};
  CHECK_OK(dckpt_reader_read(reader, "model.w", 2, reg_off, reg_len, region, sizeof region));
  for (r = 0; r < 3; r++)
    for (c = 0; c < 2; c++) CHECK(region[r * 2 + c] == w[(1 + r) * COLS + 1 + c]);
  /* A wrong buffer size is EINVAL; a missing entry ENOTFOUND. */
  CHECK(dckpt_reader_read(reader, "model.w", 2, reg_off, reg_len, region, sizeof region - 1) == DCKPT_EINVAL);
  CHECK(dckpt_reader_read(reader, "nope", 2, reg_off, reg_len, region, sizeof region) == DCKPT_ENOTFOUND);
  CHECK(strstr(dckpt_error_last(), "nope") != NULL);

  uint64_t size = 0;
  CHECK(dckpt_reader_read_bytes(&size, reader, "config", NULL, 0) == DCKPT_EBUFSIZE);
  CHECK(size == sizeof config);
  const char *value = NULL;
  CHECK_OK(dckpt_reader_user_get(&value, reader, "framework"));
  CHECK(strcmp(value, "plain-c") == 0);
  CHECK_OK(dckpt_reader_verify(reader, NULL, NULL));

  /* Zero-copy: chunk 1 of model.w (rows 2..5) straight from the mapping of the pinned data file. */
  {
    const void *mapped = NULL;
    uint64_t mapped_size = 0;
    CHECK_OK(dckpt_reader_map_chunk(&mapped, &mapped_size, reader, idx, 1));
    CHECK(mapped_size == 4 * COLS * sizeof(float));
    CHECK(mapped != NULL && memcmp(mapped, w + 2 * COLS, (size_t)mapped_size) == 0);
    CHECK(dckpt_reader_map_chunk(&mapped, &mapped_size, reader, idx, 2) == DCKPT_EINVAL);
    CHECK(dckpt_reader_map_chunk(&mapped, &mapped_size, reader, 99, 0) == DCKPT_EINVAL);
    /* map_files = 0: the mode in which nothing is mapped (so nothing can raise SIGBUS). */
    dckpt_read_options no_map = DCKPT_READ_OPTIONS_INIT;
    no_map.map_files = 0;
    dckpt_reader *unmapped = NULL;
    CHECK_OK(dckpt_reader_open(&unmapped, path, NULL, &no_map));
    CHECK(dckpt_reader_map_chunk(&mapped, &mapped_size, unmapped, idx, 1) == DCKPT_EUNSUPPORTED);
    CHECK(strstr(dckpt_error_last(), "SIGBUS") != NULL);
    /* ... and a whole-checkpoint zero-copy load refuses rather than loading nothing. */
    CHECK(dckpt_reader_map_all(unmapped, NULL) == DCKPT_EUNSUPPORTED);
    dckpt_reader_free(unmapped);
  }

  /* Whole-checkpoint load for servers: every entry paged in, mapped and verified; the progress callback sees the
   * total; the chunk mappings then show the saved bytes. */
  {
    dckpt_reader *all = NULL;
    CHECK_OK(dckpt_reader_open(&all, path, NULL, NULL));
    dckpt_map_all_options mo;
    CHECK_OK(dckpt_map_all_options_init(&mo, DCKPT_MAP_ALL_OPTIONS_VERSION));
    CHECK(mo.entries == NULL && mo.num_entries == 0 && mo.progress == NULL);
    mo.progress = on_progress;
    uint64_t last[2] = {0, 0};
    mo.progress_user_data = last;
    CHECK_OK(dckpt_reader_map_all(all, &mo));
    CHECK(last[1] == sizeof w + sizeof b + sizeof step + sizeof config && last[0] == last[1]);
    dckpt_io_stats io = DCKPT_IO_STATS_INIT;
    CHECK_OK(dckpt_reader_io_stats(&io, all));
    CHECK(io.bytes_mapped == last[1] && io.bytes_read == 0);
    const void *mapped = NULL;
    uint64_t mapped_size = 0;
    CHECK_OK(dckpt_reader_map_chunk(&mapped, &mapped_size, all, idx, 0));
    CHECK(mapped_size == 2 * COLS * sizeof(float) && memcmp(mapped, w, (size_t)mapped_size) == 0);
    /* One entry; a bad index names it; a wrong version and a NULL list with a count are refused. */
    size_t one = idx;
    mo.entries = &one;
    mo.num_entries = 1;
    mo.progress = NULL;
    CHECK_OK(dckpt_reader_map_all(all, &mo));
    size_t bad_index = 99;
    mo.entries = &bad_index;
    CHECK(dckpt_reader_map_all(all, &mo) == DCKPT_EINVAL);
    CHECK(strstr(dckpt_error_last(), "no entry #99") != NULL);
    mo.entries = NULL;
    CHECK(dckpt_reader_map_all(all, &mo) == DCKPT_EINVAL);
    mo.version = 99;
    mo.num_entries = 0;
    CHECK(dckpt_reader_map_all(all, &mo) == DCKPT_EVERSION);
    CHECK(dckpt_reader_map_all(NULL, NULL) == DCKPT_EINVAL);
    dckpt_reader_free(all);
  }
  dckpt_reader_free(reader);
  dckpt_reader_free(NULL); /* _free accepts NULL */
  dckpt_state_free(NULL);

  /* Errors: missing checkpoint, bad options version. */
  CHECK(dckpt_reader_open(&reader, "/nonexistent/ckpt", NULL, NULL) == DCKPT_ENOTFOUND);
  CHECK(reader == NULL);
  CHECK(dckpt_error_last_code() == DCKPT_ENOTFOUND);
  dckpt_read_options bad = DCKPT_READ_OPTIONS_INIT;
  bad.version = 99;
  CHECK(dckpt_reader_open(&reader, path, NULL, &bad) == DCKPT_EVERSION);

  if (failures) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("c_roundtrip_test: ok\n");
  return 0;
}
