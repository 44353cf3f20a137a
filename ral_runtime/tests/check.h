/* The C tests' check macro: counts checks and failures, reports each failure with its line. */
#ifndef RAL_TESTS_CHECK_H
#define RAL_TESTS_CHECK_H

#include <stdio.h>

static int failures = 0, checks = 0;
#define CHECK(cond)                                                            \
  do {                                                                         \
    checks++;                                                                  \
    if (!(cond)) {                                                             \
      failures++;                                                              \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                          \
  } while (0)

#endif
