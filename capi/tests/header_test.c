/* Compiles the public header as strict C99 (-std=c99 -pedantic -Werror) and checks its macros are usable. */
#include "distckpt/distckpt.h"

#include <stdio.h>

int main(void) {
  dckpt_save_options save = DCKPT_SAVE_OPTIONS_INIT;
  dckpt_read_options read = DCKPT_READ_OPTIONS_INIT;
  dckpt_save_info info = DCKPT_SAVE_INFO_INIT;
  dckpt_io_stats stats = DCKPT_IO_STATS_INIT;
  dckpt_entry_info entry = DCKPT_ENTRY_INFO_INIT;
  dckpt_chunk_info chunk = DCKPT_CHUNK_INFO_INIT;
  dckpt_checkpoint_info ckpt = DCKPT_CHECKPOINT_INFO_INIT;
  dckpt_status status = DCKPT_OK;
  dckpt_dtype dtype = DCKPT_DTYPE_BF16;
  if (save.version != DCKPT_SAVE_OPTIONS_VERSION || read.version != DCKPT_READ_OPTIONS_VERSION ||
      info.version != DCKPT_SAVE_INFO_VERSION || stats.version != DCKPT_IO_STATS_VERSION ||
      entry.version != DCKPT_ENTRY_INFO_VERSION || chunk.version != DCKPT_CHUNK_INFO_VERSION ||
      ckpt.version != DCKPT_CHECKPOINT_INFO_VERSION || status != DCKPT_OK || dtype != 11 || save.sync != 1 ||
      read.verify != 1) {
    fprintf(stderr, "header macros are inconsistent\n");
    return 1;
  }
  if (dckpt_abi_version() != DCKPT_ABI_VERSION) {
    fprintf(stderr, "ABI version mismatch: header %d, library %u\n", DCKPT_ABI_VERSION, dckpt_abi_version());
    return 1;
  }
  if (dckpt_version() != DCKPT_VERSION_MAJOR * 10000 + DCKPT_VERSION_MINOR * 100 + DCKPT_VERSION_PATCH) {
    fprintf(stderr, "version mismatch: %u vs %s\n", dckpt_version(), DCKPT_VERSION_STRING);
    return 1;
  }
  printf("header_test (C99): ok, distckpt %s\n", dckpt_version_string());
  return 0;
}
