/* Prints the device's memory ceilings: the read ceiling (read-only reduction over a buffer
 * far larger than L2) and device-to-device copy bandwidth. Exit 77 without a device. */
#include <stdio.h>

#include "bench/bench_util.h"
#include "core/log.h"

int main(void) {
  ina_bench_ceilings_t c;
  char formula[256];
  if (ina_bench_no_device("bench_read_ceiling")) return INA_BENCH_SKIP;
  if (ina_bench_measure_ceilings(&c) != INA_OK) {
    fprintf(stderr, "bench_read_ceiling: %s\n", ina_last_error());
    return 1;
  }
  snprintf(formula, sizeof formula,
           "read_bytes / median_time; read_bytes = %lld per run (1 of 4 rotating slices of a "
           "%lld-byte buffer); median of %d runs after warm-up; %s",
           (long long)c.read_bytes, (long long)c.buffer_bytes, c.runs, c.read_variant);
  ina_bench_result("read_ceiling", c.read_tbs, "TB/s", formula);
  snprintf(formula, sizeof formula,
           "2 * copy_bytes / median_time (read + write); copy_bytes = %lld per cudaMemcpyAsync "
           "device-to-device between rotating slices; median of %d runs after warm-up",
           (long long)c.copy_bytes, c.runs);
  ina_bench_result("d2d_copy", c.copy_tbs, "TB/s", formula);
  ina_bench_print_json("read_ceiling");
  return 0;
}
