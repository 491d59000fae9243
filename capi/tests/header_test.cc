// Compiles the public header as C++ with -Wall -Wextra -pedantic -Werror.
#include "distckpt/distckpt.h"

#include <cstdio>
#include <type_traits>

static_assert(std::is_standard_layout<dckpt_save_options>::value, "option structs must be plain C structs");
static_assert(sizeof(dckpt_status) == sizeof(int), "status enum must be int-sized");

// The named callback types are the very types the declarations spelled inline before they existed: a caller that
// wrote a pointer of the inline type still compiles, and nothing changed in the ABI.
#define DCKPT_SAME_TYPE(a, b) static_assert(std::is_same<a, b>::value, #a " changed type")
DCKPT_SAME_TYPE(decltype(dckpt_comm_callbacks::allgather), int (*)(const void *, size_t, void *, uint64_t, void *));
DCKPT_SAME_TYPE(decltype(dckpt_comm_callbacks::broadcast), int (*)(void *, size_t, int, uint64_t, void *));
DCKPT_SAME_TYPE(decltype(dckpt_comm_callbacks::barrier), int (*)(uint64_t, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::create),
                int (*)(dckpt_storage_file **, const char *, uint64_t, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::write),
                int (*)(dckpt_storage_file *, uint64_t, const void *, size_t, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::sync), int (*)(dckpt_storage_file *, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::close), int (*)(dckpt_storage_file *, uint64_t, int, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::size), int (*)(uint64_t *, const char *, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::read),
                int (*)(size_t *, const char *, uint64_t, void *, size_t, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::list), int (*)(dckpt_storage_list *, const char *, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::remove), int (*)(const char *, void *));
DCKPT_SAME_TYPE(decltype(dckpt_storage_callbacks::commit), int (*)(const char *, const void *, size_t, int, void *));
DCKPT_SAME_TYPE(decltype(&dckpt_storage_remove_leftovers),
                int (*)(dckpt_storage *, const char *, double, int, int (*)(const char *, void *), void *));
DCKPT_SAME_TYPE(decltype(&dckpt_scan_leftovers),
                int (*)(const char *, const char *, double, int (*)(const dckpt_leftover_info *, void *), void *));
DCKPT_SAME_TYPE(decltype(&dckpt_reader_verify), int (*)(dckpt_reader *, int (*)(uint64_t, uint64_t, void *), void *));
#undef DCKPT_SAME_TYPE

int main() {
  dckpt_save_options save = DCKPT_SAVE_OPTIONS_INIT;
  dckpt_read_options read = DCKPT_READ_OPTIONS_INIT;
  if (dckpt_save_options_init(&save, DCKPT_SAVE_OPTIONS_VERSION) != DCKPT_OK) return 1;
  if (dckpt_read_options_init(&read, DCKPT_READ_OPTIONS_VERSION) != DCKPT_OK) return 1;
  if (dckpt_save_options_init(&save, DCKPT_SAVE_OPTIONS_VERSION + 1) != DCKPT_EVERSION) return 1;
  std::printf("header_test (C++): ok\n");
  return 0;
}
