/* Host-side helpers the benchmarks share (bench/bench_util.h): clock, random tokens,
 * medians, option lists, and the checks a benchmark runs before it times. */
#define INA_LOG_SUBSYS "bench"
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "core/check.h"
#include "core/dtype.h"

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

/* ---- checks before timing ---------------------------------------------------------------- */

static int g_checks_run, g_checks_failed, g_checks_quiet;

double ina_bench_rel_l2(const float *got, const double *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i]) || !isfinite(ref[i])) return INFINITY;
    const double d = (double)got[i] - ref[i];
    num += d * d;
    den += ref[i] * ref[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return sqrt(num / den);
}

double ina_bench_rel_l2_f32(const float *got, const float *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    if (!isfinite(got[i]) || !isfinite(ref[i])) return INFINITY;
    const double d = (double)got[i] - (double)ref[i];
    num += d * d;
    den += (double)ref[i] * (double)ref[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return sqrt(num / den);
}

void ina_bench_bf16_to_f32(const uint16_t *in, float *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const uint32_t bits = (uint32_t)in[i] << 16;
    memcpy(&out[i], &bits, sizeof bits);
  }
}

int64_t ina_bench_count_nonfinite(const float *x, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += !isfinite(x[i]);
  return bad;
}

int64_t ina_bench_count_not_bf16(const uint16_t *x, int64_t n, uint16_t pattern) {
  int64_t other = 0;
  for (int64_t i = 0; i < n; i++) other += x[i] != pattern;
  return other;
}

static int cmp_i64(const void *a, const void *b) {
  const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

int ina_bench_sample_range(int64_t lo, int64_t hi, int max, uint64_t *state, int64_t *out) {
  if (hi <= lo || max < 1) return 0;
  if (hi - lo <= max) {
    for (int64_t i = lo; i < hi; i++) out[i - lo] = i;
    return (int)(hi - lo);
  }
  if (max < 2) max = 2;
  int count = 0;
  out[count++] = lo;
  out[count++] = hi - 1;
  while (count < max) { /* hi - lo > max: a fresh value always exists */
    const int64_t v = lo + 1 + (int64_t)(ina_bench_splitmix64(state) % (uint64_t)(hi - lo - 2));
    int seen = 0;
    for (int i = 0; i < count; i++) seen |= out[i] == v;
    if (!seen) out[count++] = v;
  }
  qsort(out, (size_t)count, sizeof *out, cmp_i64);
  return count;
}

ina_status_t ina_bench_fp8_blocks_diff(const uint16_t *x, int64_t rows, int64_t cols,
                                       int block_rows, const uint8_t *q, const float *scale_inv,
                                       int64_t *q_diff, int64_t *scale_diff, int64_t *first) {
  ina_status_t st = INA_OK;
  const int64_t n = rows * cols;
  const int64_t scales =
      block_rows > 0 ? (rows + block_rows - 1) / block_rows * ((cols + 127) / 128) : 0;
  float *xf = NULL, *want_s = NULL;
  uint8_t *want_q = NULL;
  *q_diff = *scale_diff = 0;
  *first = -1;
  INA_REQUIRE(rows >= 0 && cols >= 0 && block_rows >= 1, INA_ERR_INVALID_ARGUMENT,
              "ina_bench_fp8_blocks_diff: shape %lld x %lld, block rows %d", (long long)rows,
              (long long)cols, block_rows);
  xf = calloc((size_t)(n > 0 ? n : 1), sizeof *xf);
  want_s = malloc((size_t)(scales > 0 ? scales : 1) * sizeof *want_s);
  want_q = malloc((size_t)(n > 0 ? n : 1));
  INA_CHECK_ALLOC(xf);
  INA_CHECK_ALLOC(want_s);
  INA_CHECK_ALLOC(want_q);
  ina_bench_bf16_to_f32(x, xf, n);
  INA_CHECK(ina_fp8_quantize_blocks(xf, rows, cols, block_rows, 128, want_q, want_s));
  for (int64_t i = 0; i < n; i++) {
    const int nan_pair = (q[i] & 0x7F) == 0x7F && (want_q[i] & 0x7F) == 0x7F;
    if (q[i] != want_q[i] && !nan_pair) {
      if (*first < 0) *first = i;
      ++*q_diff;
    }
  }
  for (int64_t i = 0; i < scales; i++) *scale_diff += memcmp(&scale_inv[i], &want_s[i], 4) != 0;
fail:
  free(xf);
  free(want_s);
  free(want_q);
  return st;
}

int ina_bench_check(const char *what, const char *measure, double value, double bound) {
  g_checks_run++;
  if (value <= bound) {
    if (!g_checks_quiet) printf("check %s %s %.3g <= %.3g: ok\n", what, measure, value, bound);
    fflush(stdout);
    return 1;
  }
  g_checks_failed++;
  fflush(stdout);
  fprintf(stderr, "check %s FAILED: %s %.3g exceeds the bound %.3g; no figure for this case\n",
          what, measure, value, bound);
  return 0;
}

int ina_bench_check_failed(const char *what, const char *fmt, ...) {
  va_list ap;
  g_checks_run++;
  g_checks_failed++;
  fflush(stdout);
  fprintf(stderr, "check %s FAILED: ", what);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "; no figure for this case\n");
  return 0;
}

int ina_bench_checks_run(void) { return g_checks_run; }
void ina_bench_check_set_quiet(int quiet) { g_checks_quiet = quiet; }
int ina_bench_checks_failed(void) { return g_checks_failed; }
