/* The manager's versioned options and counters through the C ABI, in one process: a caller built against version 1
 * of dckpt_manager_options has its struct read only that far, dckpt_manager_stats counts a step, and version 3's
 * persisting options (compressed, incremental) are taken and counted. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "c_check.h"

int main(void) {
  /* Version 1: the fields appended in version 2 are neither written by the init function nor read by new. */
  dckpt_manager_options v1;
  memset(&v1, 0xAB, sizeof v1);
  CHECK_OK(dckpt_manager_options_init(&v1, 1));
  CHECK(v1.version == 1 && v1.replicas == DCKPT_REPLICAS_AUTO && v1.exchange_round_bytes == 0);
  CHECK(v1.threads == 0xABABABABu && v1.background_priority == (int)0xABABABABu);
  dckpt_manager_options v2;
  memset(&v2, 0xAB, sizeof v2);
  CHECK_OK(dckpt_manager_options_init(&v2, 2));
  CHECK(v2.version == 2 && v2.threads == 0 && v2.background_priority == DCKPT_PRIORITY_DEFAULT);
  CHECK(v2.persist_compression == (int)0xABABABABu && v2.persist_full_every == 0xABABABABu);
  dckpt_manager_options v3;
  memset(&v3, 0xAB, sizeof v3);
  CHECK_OK(dckpt_manager_options_init(&v3, DCKPT_MANAGER_OPTIONS_VERSION));
  CHECK(v3.version == 3 && v3.persist_compression == DCKPT_COMPRESSION_NONE && v3.persist_incremental == 0);
  CHECK(dckpt_manager_options_init(&v2, DCKPT_MANAGER_OPTIONS_VERSION + 1) == DCKPT_EVERSION);

  char dir[] = "/tmp/c_manager_test-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char local[64];
  snprintf(local, sizeof local, "%s/local", dir);
  v1.local_dir = local;
  v1.replicas = 0;
  dckpt_manager *m = NULL;
  CHECK_OK(dckpt_manager_new(&m, NULL, &v1)); /* 0xAB... past version 1's fields would be an invalid priority */
  dckpt_manager_free(m);

  /* The default replicas on a job of one node: 0, said in the restore report. One replica asked for explicitly
   * cannot be placed: refused before the local directory is created. */
  char fresh[96];
  snprintf(fresh, sizeof fresh, "%s/fresh/tier", dir);
  dckpt_manager_options d = DCKPT_MANAGER_OPTIONS_INIT;
  d.local_dir = fresh;
  d.replicas = 1;
  CHECK(dckpt_manager_new(&m, NULL, &d) == DCKPT_EINVAL && m == NULL);
  CHECK(strstr(dckpt_error_last(), "nothing was created") != NULL);
  char parent[96];
  snprintf(parent, sizeof parent, "%s/fresh", dir);
  CHECK(access(parent, F_OK) != 0);
  d.replicas = DCKPT_REPLICAS_AUTO;
  CHECK_OK(dckpt_manager_new(&m, NULL, &d));
  dckpt_state *empty = NULL;
  CHECK_OK(dckpt_state_new(&empty));
  CHECK_OK(dckpt_manager_restore(NULL, m, empty, NULL));
  CHECK(strstr(dckpt_manager_restore_report(m), "replicas: 0 (the default: the job has one node") != NULL);
  dckpt_state_free(empty);
  dckpt_manager_free(m);

  v2.local_dir = local;
  v2.replicas = 0;
  v2.background_priority = 7;
  CHECK(dckpt_manager_new(&m, NULL, &v2) == DCKPT_EINVAL && m == NULL);
  CHECK(strstr(dckpt_error_last(), "background_priority") != NULL);
  v2.background_priority = DCKPT_PRIORITY_IDLE;
  v2.threads = 1;
  CHECK_OK(dckpt_manager_new(&m, NULL, &v2));

  dckpt_manager_counters c = DCKPT_MANAGER_COUNTERS_INIT;
  CHECK_OK(dckpt_manager_stats(&c, m));
  CHECK(c.steps_saved == 0 && c.steps_completed == 0 && c.bytes_written == 0);

  float w[1024];
  for (int i = 0; i < 1024; ++i) w[i] = (float)i;
  uint64_t shape[1] = {1024}, off[1] = {0};
  dckpt_state *s = NULL;
  CHECK_OK(dckpt_state_new(&s));
  CHECK_OK(dckpt_state_add_tensor(s, "w", DCKPT_DTYPE_F32, 1, shape));
  CHECK_OK(dckpt_state_add_piece(s, "w", off, shape, w));
  for (uint64_t step = 1; step <= 3; ++step) {
    CHECK_OK(dckpt_manager_save(m, step, s, 0));
    CHECK_OK(dckpt_manager_wait(m, DCKPT_WAIT_FOREVER));
  }
  CHECK_OK(dckpt_manager_stats(&c, m));
  CHECK(c.steps_saved == 3 && c.steps_completed == 3 && c.steps_failed == 0);
  CHECK(c.saves_waited == 0 && c.saves_waited_for_budget == 0 && c.wait_seconds == 0.0);
  CHECK(c.bytes_written >= 3 * sizeof w && c.bytes_replicated == 0);

  dckpt_manager_counters bad = DCKPT_MANAGER_COUNTERS_INIT;
  bad.version = 0;
  CHECK(dckpt_manager_stats(&bad, m) == DCKPT_EINVAL);
  bad.version = DCKPT_MANAGER_COUNTERS_VERSION + 1;
  CHECK(dckpt_manager_stats(&bad, m) == DCKPT_EVERSION);
  CHECK(dckpt_manager_stats(NULL, m) == DCKPT_EINVAL);
  CHECK(dckpt_manager_stats(&c, NULL) == DCKPT_EINVAL);

  dckpt_manager_free(m);

  /* Version 3: persisted steps compressed and incremental. w is the same at every step: steps 2 and 3 refer to
   * step 1's bytes, and only step 1's (compressed) are written. */
  char persistent[64];
  snprintf(persistent, sizeof persistent, "%s/persistent", dir);
  v3.local_dir = local;
  v3.replicas = 0;
  v3.persistent_path = persistent;
  v3.persist_every = 1;
  v3.persist_compression = 9;
  CHECK(dckpt_manager_new(&m, NULL, &v3) == DCKPT_EINVAL && m == NULL);
  CHECK(strstr(dckpt_error_last(), "persist_compression") != NULL);
  v3.persist_compression = DCKPT_COMPRESSION_ZSTD;
  v3.persist_compression_level = 99;
  CHECK(dckpt_manager_new(&m, NULL, &v3) == DCKPT_EINVAL && m == NULL);
  v3.persist_compression_level = 0;
  v3.persist_incremental = 1;
  v3.persist_full_every = 0;
  CHECK_OK(dckpt_manager_new(&m, NULL, &v3));
  for (uint64_t step = 11; step <= 13; ++step) CHECK_OK(dckpt_manager_save(m, step, s, 0));
  CHECK_OK(dckpt_manager_wait(m, DCKPT_WAIT_FOREVER));
  dckpt_manager_counters c2 = DCKPT_MANAGER_COUNTERS_INIT;
  CHECK_OK(dckpt_manager_stats(&c2, m));
  CHECK(c2.bytes_persisted > 0 && c2.bytes_persisted < sizeof w);
  CHECK(c2.bytes_persist_reused == 2 * sizeof w && c2.persist_seconds > 0.0);
  dckpt_manager_counters c1;
  memset(&c1, 0xAB, sizeof c1);
  c1.version = 1;
  CHECK_OK(dckpt_manager_stats(&c1, m));
  CHECK(c1.steps_completed == 3 && c1.bytes_persisted == 0xABABABABABABABABull);

  dckpt_state_free(s);
  dckpt_manager_free(m);
  char cmd[96];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  CHECK(system(cmd) == 0);
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  return failures ? 1 : 0;
}
