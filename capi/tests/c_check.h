/* CHECK and CHECK_OK for the C tests of the ABI: CHECK counts a failed condition in `failures` and goes on;
 * CHECK_OK stops the test at once with the library's message when a call does not return DCKPT_OK. */
#ifndef DISTCKPT_CAPI_TESTS_C_CHECK_H_
#define DISTCKPT_CAPI_TESTS_C_CHECK_H_

#include <stdio.h>
#include <stdlib.h>

#include "distckpt/distckpt.h"

static int failures = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);   \
      failures++;                                                                \
    }                                                                            \
  } while (0)

#define CHECK_OK(call)                                                                    \
  do {                                                                                    \
    int rc_ = (call);                                                                     \
    if (rc_ != DCKPT_OK) {                                                                \
      fprintf(stderr, "%s:%d: %s returned %d (%s): %s\n", __FILE__, __LINE__, #call, rc_, \
              dckpt_status_name(rc_), dckpt_error_last());                                \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

#endif /* DISTCKPT_CAPI_TESTS_C_CHECK_H_ */
