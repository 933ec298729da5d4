/* Device checks for the tests that need GPUs, over core/cuda.h (link ina_core) and
 * tests/test_util.h: whether N CUDA devices are visible, and why not, named in the skip
 * message. Under INA_REQUIRE_GPU=1 a missing GPU fails the test instead of skipping it
 * (test_skip_gpu).
 *
 *   int rc = test_require_gpus("test_x", 1);   // a single-GPU test
 *   if (rc) return rc;
 *
 * A test of R ranks under mpirun on one node needs R GPUs there (each rank its own):
 * test_require_gpus(name, local ranks) on the rank that prints, test_gpus_missing and
 * test_gpu_skip_status on the others. Header-only; no state. */
#ifndef INA_TESTS_GPU_TEST_UTIL_H
#define INA_TESTS_GPU_TEST_UTIL_H

#include <stdio.h>

#include "core/cuda.h"
#include "tests/test_util.h"

/* NULL when at least n CUDA devices are visible; otherwise why not, written into buf:
 * ina_cuda_no_device_reason's text (the CUDA error among it) when there is none, else
 * "needs N GPUs, M visible". */
static inline const char *test_gpus_missing(int n, char *buf, size_t size) {
  const int count = ina_cuda_device_count();
  if (count >= n) return NULL;
  if (count == 0) {
    const char *why = ina_cuda_no_device_reason(buf, size);
    if (why) return why;
  }
  snprintf(buf, size, "needs %d GPU%s, %d visible", n, n == 1 ? "" : "s", count);
  return buf;
}

/* 0 when at least n CUDA devices are visible; otherwise test_skip_gpu(name, why): the
 * test's exit status (TEST_SKIP, or 1 under INA_REQUIRE_GPU), printed with the reason. */
static inline int test_require_gpus(const char *name, int n) {
  char why[256];
  const char *missing = test_gpus_missing(n, why, sizeof why);
  return missing ? test_skip_gpu(name, missing) : 0;
}

#endif
