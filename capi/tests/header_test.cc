// Compiles the public header as C++ with -Wall -Wextra -pedantic -Werror.
#include "distckpt/distckpt.h"

#include <cstdio>
#include <type_traits>

static_assert(std::is_standard_layout<dckpt_save_options>::value, "option structs must be plain C structs");
static_assert(sizeof(dckpt_status) == sizeof(int), "status enum must be int-sized");

int main() {
  dckpt_save_options save = DCKPT_SAVE_OPTIONS_INIT;
  dckpt_read_options read = DCKPT_READ_OPTIONS_INIT;
  if (dckpt_save_options_init(&save, DCKPT_SAVE_OPTIONS_VERSION) != DCKPT_OK) return 1;
  if (dckpt_read_options_init(&read, DCKPT_READ_OPTIONS_VERSION) != DCKPT_OK) return 1;
  if (dckpt_save_options_init(&save, DCKPT_SAVE_OPTIONS_VERSION + 1) != DCKPT_EVERSION) return 1;
  std::printf("header_test (C++): ok\n");
  return 0;
}
