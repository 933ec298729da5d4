/* The device half of bench/bench_util.h for a build without CUDA: nothing can be timed
 * or measured, so every call says INA_ERR_UNSUPPORTED (the benchmarks skip before). */
#define INA_LOG_SUBSYS "bench"
#include <string.h>

#include "bench/bench_util.h"
#include "core/check.h"

static ina_status_t unsupported(const char *what) {
  ina_error(INA_LOG_SUBSYS, "%s: this build has no CUDA support (configure with -DINA_CUDA=ON)",
            what);
  return INA_ERR_UNSUPPORTED;
}

ina_status_t ina_bench_time_ms(ina_bench_enqueue_fn enqueue, void *ctx,
                               const ina_bench_timing_t *timing, double *median_ms) {
  if (median_ms) *median_ms = 0.0;
  return unsupported("ina_bench_time_ms");
}

ina_status_t ina_bench_measure_ceilings(ina_bench_ceilings_t *out) {
  if (out) memset(out, 0, sizeof *out);
  return unsupported("ina_bench_measure_ceilings");
}

double ina_bench_read_ceiling_tbs(void) {
  (void)unsupported("ina_bench_read_ceiling_tbs");
  return 0.0;
}

ina_status_t ina_bench_fill_random_bf16(uint16_t *dev, size_t n, uint64_t seed, float scale) {
  return unsupported("ina_bench_fill_random_bf16");
}
