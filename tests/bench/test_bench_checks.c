/* The checks the benchmarks run before they time, on the CPU: each is given a result a
 * correct GPU could produce (computed here on the host) and must pass it, then results
 * with one deliberate fault each and must reject every one.
 *
 *   bench_util: relative L2 (NaN never passes), sampled rows, the bit-for-bit FP8 block
 *     comparison, the pass / fail accounting. */
#include <math.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/dtype.h"
#include "core/log.h"
#include "tests/test_util.h"

/* A check that must be rejected: it returns 0 and counts one more failure. */
#define REJECTS(expr)                                                                     \
  do {                                                                                    \
    const int before_ = ina_bench_checks_failed();                                        \
    const int passed_ = (expr);                                                           \
    CHECKF(!passed_ && ina_bench_checks_failed() > before_, "not rejected: %s", #expr);  \
  } while (0)

static uint16_t bf16_of(float v) { return ina_f32_to_bf16(v); }
static float f32_of(uint16_t h) { return ina_bf16_to_f32(h); }

/* ---- bench_util ----------------------------------------------------------------------- */

static void test_util_helpers(test_rng_t *rng) {
  float got[64];
  double ref[64];
  for (int i = 0; i < 64; i++) ref[i] = got[i] = (float)test_rng_normal(rng);
  CHECK(ina_bench_rel_l2(got, ref, 64) == 0);
  got[3] *= 1.5f;
  const double err = ina_bench_rel_l2(got, ref, 64);
  CHECK(err > 0 && err < 1);
  got[5] = NAN;
  CHECK(ina_bench_rel_l2(got, ref, 64) == INFINITY);
  got[5] = INFINITY;
  CHECK(ina_bench_rel_l2_f32(got, got, 64) == INFINITY);
  float zero[4] = {0, 0, 0, 0}, one[4] = {0, 1, 0, 0};
  CHECK(ina_bench_rel_l2_f32(zero, zero, 4) == 0);
  CHECK(ina_bench_rel_l2_f32(one, zero, 4) == INFINITY);

  /* Sampling: all rows when few, else both ends and distinct ascending others inside. */
  int64_t rows[16];
  uint64_t state = 1;
  CHECK(ina_bench_sample_range(5, 9, 8, &state, rows) == 4 && rows[0] == 5 && rows[3] == 8);
  CHECK(ina_bench_sample_range(3, 3, 8, &state, rows) == 0);
  const int n = ina_bench_sample_range(10, 1000, 16, &state, rows);
  int ordered = n == 16 && rows[0] == 10 && rows[15] == 999;
  for (int i = 1; i < n; i++) ordered &= rows[i] > rows[i - 1];
  CHECK(ordered);

  /* The FP8 comparison: the host rule agrees with itself, a flipped byte or scale not. */
  enum { R = 3, C = 300 };
  uint16_t x[R * C];
  float xf[R * C], scale[R * 3];
  uint8_t q[R * C];
  for (int i = 0; i < R * C; i++) {
    x[i] = bf16_of(4.0f * (float)test_rng_normal(rng));
    xf[i] = f32_of(x[i]);
  }
  CHECK_OK(ina_fp8_quantize_blocks(xf, R, C, 1, 128, q, scale));
  int64_t qd = -1, sd = -1, first = 0;
  CHECK_OK(ina_bench_fp8_blocks_diff(x, R, C, 1, q, scale, &qd, &sd, &first));
  CHECK(qd == 0 && sd == 0 && first == -1);
  q[401] ^= 1;
  scale[4] *= 2;
  CHECK_OK(ina_bench_fp8_blocks_diff(x, R, C, 1, q, scale, &qd, &sd, &first));
  CHECK(qd == 1 && sd == 1 && first == 401);

  /* Accounting. */
  const int run = ina_bench_checks_run(), failed = ina_bench_checks_failed();
  CHECK(ina_bench_check("util_pass", "value", 0.5, 1.0) == 1);
  REJECTS(ina_bench_check("util_over_bound", "value", 1.5, 1.0));
  REJECTS(ina_bench_check("util_nan", "value", NAN, 1.0));
  REJECTS(ina_bench_check_failed("util_failed", "%d of %d outputs are NaN", 3, 7));
  CHECK(ina_bench_checks_run() == run + 4 && ina_bench_checks_failed() == failed + 3);
}

int main(void) {
  test_rng_t rng = {test_seed("test_bench_checks")};
  printf("test_bench_checks: the FAILED lines below are the deliberate faults being rejected\n");
  test_util_helpers(&rng);
  return test_finish("test_bench_checks");
}
