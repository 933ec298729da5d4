/* Host-side helpers the benchmarks share (bench/bench_util.h): clock, random tokens,
 * medians, option lists. */
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "bench/bench_util.h"

double ina_bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t ina_bench_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void ina_bench_random_tokens(uint64_t *state, int32_t vocab, int32_t *tokens, int64_t n) {
  for (int64_t i = 0; i < n; i++) tokens[i] = (int32_t)(ina_bench_splitmix64(state) % (uint64_t)vocab);
}

void ina_bench_poison_nan(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

double ina_bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int ina_bench_parse_list(const char *text, int64_t lo, int64_t hi, int64_t *out, int max, int *count) {
  *count = 0;
  for (const char *p = text; *p;) {
    char *end = NULL;
    const long long v = strtoll(p, &end, 10);
    if (end == p || v < lo || v > hi || *count == max || (*end && *end != ',')) return 1;
    out[(*count)++] = v;
    p = *end ? end + 1 : end;
  }
  return *count == 0;
}
