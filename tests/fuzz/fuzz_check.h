/* Invariant checks of the fuzz targets. A violated invariant prints what failed and
 * traps, so that libFuzzer reports it as a crash and saves the input that caused it.
 *
 * FUZZ_REQUIRE(cond, fmt, ...): fmt is a printf format (a plain literal is fine).
 * Thread safety: the targets run single-threaded; nothing here keeps state. */
#ifndef INA_TESTS_FUZZ_FUZZ_CHECK_H
#define INA_TESTS_FUZZ_FUZZ_CHECK_H

#include <stdio.h>

#define FUZZ_REQUIRE(cond, ...)                                                          \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      fprintf(stderr, "%s:%d: invariant violated: %s: ", __FILE__, __LINE__, #cond);     \
      fprintf(stderr, __VA_ARGS__);                                                      \
      fputc('\n', stderr);                                                               \
      __builtin_trap();                                                                  \
    }                                                                                    \
  } while (0)

#endif
