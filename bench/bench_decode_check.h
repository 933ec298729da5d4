/* bench_decode's check of its engine before it times it (bench_decode_check.c). */
#ifndef INA_BENCH_BENCH_DECODE_CHECK_H
#define INA_BENCH_BENCH_DECODE_CHECK_H
#include <stdint.h>

#include "model/model.h"

/* Runs `batch` short random sequences (prefill, then one decode step) on gpu, an engine of
 * model `spec` with random weights `weights` (random_on_device) and page size `page_size`,
 * and compares the first of them with the oracle on the host's copy of those weights.
 * Prints the verdict to stderr, naming `what`; returns 1 when every row held.
 * *undecided is 1 when every compared row sat at a routing near-tie, so that only their
 * finiteness was checked. The sequences are released before it returns. */
int bench_decode_check(ina_engine_t *gpu, const char *spec, const ina_model_options_t *weights, int32_t page_size,
                       int64_t batch, uint64_t *rng, const char *what, int *undecided);

#endif
