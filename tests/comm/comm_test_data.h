/* Deterministic per-rank test data for the multi-rank comm tests: every rank can
 * regenerate any rank's input from (seed, rank, stream id), so each computes the fp64
 * reference of a collective locally. */
#ifndef INA_TESTS_COMM_TEST_DATA_H
#define INA_TESTS_COMM_TEST_DATA_H

#include <mpi.h>

#include "core/dtype.h"
#include "core/log.h"
#include "tests/test_util.h"

/* The seed of rank 0 (TEST_SEED or the clock), shared with every rank. */
static inline uint64_t comm_test_seed(const char *name) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  uint64_t seed = 0;
  if (rank == 0) seed = test_seed(name);
  MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return seed;
}

static inline test_rng_t comm_test_rng(uint64_t seed, int rank, uint64_t stream) {
  test_rng_t r = {seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(rank + 1)) ^ (stream << 32)};
  test_rng_next(&r);
  return r;
}

/* n values of rank `rank`'s input as f32; values representable in bf16 when bf16 is
 * set, so the reference sees exactly what was sent. */
static inline void comm_test_fill(float *dst, size_t n, uint64_t seed, int rank, uint64_t stream,
                                  int bf16) {
  test_rng_t r = comm_test_rng(seed, rank, stream);
  for (size_t i = 0; i < n; i++) {
    float v = test_rng_normal(&r);
    dst[i] = bf16 ? ina_bf16_to_f32(ina_f32_to_bf16(v)) : v;
  }
}

#endif
