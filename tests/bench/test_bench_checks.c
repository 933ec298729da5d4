/* The checks the benchmarks run before they time, on the CPU: each is given a result a
 * correct GPU could produce (computed here on the host) and must pass it, then results
 * with one deliberate fault each and must reject every one.
 *
 *   bench_util: relative L2 (NaN never passes), sampled rows, the bit-for-bit FP8 block
 *     comparison, the pass / fail accounting.
 *   bench_gemm / bench_gemm_grouped (gemm/bench_gemm_check.h): a bf16 and an FP8 GEMM with
 *     a ragged 128-block in N and K, outputs rounded to bf16 from fp32 sums (a correct
 *     GPU's numerics) pass; a 5 % scale error, a wrong weight row, one NaN, an overwritten
 *     row past M, an FP8 result computed from the bf16 operands, a flipped quantized byte
 *     or scale are rejected; the grouped GEMM likewise (a row with the wrong group's
 *     weight, one NaN, a write past the routed rows, a 3 % row error).
 *   bench_custom_ar (bench/bench_custom_ar_check.h): the model's BF16 and FP8 sums of three
 *     ranks pass bit for bit and an NCCL-like sum (the exact sum rounded once) passes the
 *     NCCL bound; one element one ulp off, a 5 % error, a NaN are rejected; the epilogue's
 *     outputs pass and a residual one ulp off, a normalized value 2 % off or a flipped FP8
 *     byte are rejected. */
#include <math.h>
#include <string.h>

#include "bench/bench_custom_ar_check.h"
#include "bench/bench_util.h"
#include "core/dtype.h"
#include "core/log.h"
#include "gemm/bench_gemm_check.h"
#include "gemm/gemm.h"
#include "tests/comm/custom_ar_model.h"
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

/* ---- dense GEMM ----------------------------------------------------------------------- */

#define GN 272 /* two 128-blocks and a ragged 16 */
#define GK 400 /* three 128-blocks and a ragged 16 */
#define GM 40

typedef struct gemm_case {
  uint16_t x16[GM * GK], w16[GN * GK];
  uint8_t w8[GN * GK];
  float w_scale[3 * 4]; /* ceil(272 / 128) x L4 */
  int64_t rows[64];
  int nrows;
  ina_bench_gemm_ref_t ref;
} gemm_case_t;

/* What a correct GPU writes for m rows: fp32 sums of the products of the operands it read
 * (bf16, or e4m3 times the scales per 128-block), rounded to bf16; one poisoned row past
 * them. x8 / x_scale: the quantized activations in the m-row layout. */
static void gemm_device(const gemm_case_t *g, int fp8, int64_t m, const uint16_t *w16,
                        uint16_t *y, uint8_t *x8, float *x_scale) {
  const int64_t kb = (GK + 127) / 128, kb4 = 4;
  float xf[GM * GK], rows_scale[GM * 4];
  for (int64_t i = 0; i < m * GK; i++) xf[i] = f32_of(g->x16[i]);
  CHECK_OK(ina_fp8_quantize_blocks(xf, m, GK, 1, 128, x8, rows_scale));
  CHECK_OK(ina_gemm_pack_x_scales(rows_scale, m, GK, x_scale));
  for (int64_t r = 0; r < m; r++)
    for (int64_t j = 0; j < GN; j++) {
      float acc = 0;
      for (int64_t b = 0; b < kb; b++) {
        float part = 0;
        for (int64_t kk = b * 128; kk < GK && kk < (b + 1) * 128; kk++)
          part += fp8 ? ina_fp8_e4m3_to_f32(x8[r * GK + kk]) *
                            ina_fp8_e4m3_to_f32(g->w8[j * GK + kk])
                      : f32_of(g->x16[r * GK + kk]) * f32_of(w16[j * GK + kk]);
        acc += fp8 ? part * rows_scale[r * kb + b] * g->w_scale[(j / 128) * kb4 + b] : part;
      }
      y[r * GN + j] = bf16_of(acc);
    }
  for (int64_t j = 0; j < GN; j++) y[m * GN + j] = INA_BENCH_BF16_POISON;
}

/* The device's bytes of the sampled rows (below m), as the benchmark reads them back. */
static void sampled_x8(const gemm_case_t *g, int64_t m, const uint8_t *x8, uint8_t *rows_out) {
  for (int i = 0; i < g->nrows; i++)
    if (g->rows[i] < m) memcpy(rows_out + i * GK, x8 + g->rows[i] * GK, GK);
}

static void test_gemm(test_rng_t *rng) {
  static gemm_case_t g;
  static uint16_t y[(GM + 1) * GN], x16_rows[64 * GK], w_wrong[GN * GK];
  static uint8_t x8[GM * GK], x8_rows[64 * GK];
  static float x_scale[GM * 4], wf[GN * GK], w_rows[3 * 4];
  for (int i = 0; i < GM * GK; i++) g.x16[i] = bf16_of(2.0f * (float)test_rng_uniform(rng) - 1.0f);
  for (int i = 0; i < GN * GK; i++) {
    g.w16[i] = bf16_of(0.05f * (float)test_rng_normal(rng));
    wf[i] = f32_of(g.w16[i]);
  }
  CHECK_OK(ina_fp8_quantize_blocks(wf, GN, GK, 128, 128, g.w8, w_rows));
  CHECK_OK(ina_gemm_pack_w_scales(w_rows, GN, GK, g.w_scale));
  /* Rows 0..7 and samples of [8, 40), as bench_gemm picks them. */
  uint64_t state = 7;
  g.nrows = 0;
  for (int r = 0; r < 8; r++) g.rows[g.nrows++] = r;
  g.nrows += ina_bench_sample_range(8, GM, 8, &state, g.rows + g.nrows);
  for (int i = 0; i < g.nrows; i++) memcpy(x16_rows + i * GK, g.x16 + g.rows[i] * GK, GK * 2);
  CHECK_OK(ina_bench_gemm_ref_init(&g.ref, GN, GK, g.rows, g.nrows, x16_rows, g.w16, g.w8,
                                   g.w_scale, NULL));
  if (!g.ref.bf16) return;

  CHECK(ina_bench_gemm_check_w8("gemm_w8", GN, GK, g.w16, g.w8, g.w_scale));
  g.w8[GN * GK - 5] ^= 0x10;
  REJECTS(ina_bench_gemm_check_w8("gemm_w8_flipped_byte", GN, GK, g.w16, g.w8, g.w_scale));
  g.w8[GN * GK - 5] ^= 0x10;
  g.w_scale[5] *= 1.0001f;
  REJECTS(ina_bench_gemm_check_w8("gemm_w8_scale_off", GN, GK, g.w16, g.w8, g.w_scale));
  g.w_scale[5] /= 1.0001f;
  CHECK(ina_bench_gemm_check_w8("gemm_w8_restored", GN, GK, g.w16, g.w8, g.w_scale));

  static const int64_t ms[] = {1, 8, GM};
  for (int fp8 = 0; fp8 < 2; fp8++)
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      const int64_t m = ms[i];
      char what[64];
      snprintf(what, sizeof what, "gemm_%s_m%lld", fp8 ? "fp8" : "bf16", (long long)m);
      gemm_device(&g, fp8, m, g.w16, y, x8, x_scale);
      sampled_x8(&g, m, x8, x8_rows);
      CHECK(ina_bench_gemm_check_x8(what, &g.ref, m, x8_rows, x_scale));
      CHECK(ina_bench_gemm_check_y(what, &g.ref, fp8, m, y, m + 1));
      /* A 5 % scale error of every output. */
      for (int64_t v = 0; v < m * GN; v++) y[v] = bf16_of(1.05f * f32_of(y[v]));
      REJECTS(ina_bench_gemm_check_y(what, &g.ref, fp8, m, y, m + 1));
      gemm_device(&g, fp8, m, g.w16, y, x8, x_scale);
      /* One NaN (an unwritten output) in the last row. */
      y[(m - 1) * GN + 7] = INA_BENCH_BF16_POISON;
      REJECTS(ina_bench_gemm_check_y(what, &g.ref, fp8, m, y, m + 1));
      gemm_device(&g, fp8, m, g.w16, y, x8, x_scale);
      /* A write past the m rows. */
      y[m * GN + 3] = bf16_of(1.0f);
      REJECTS(ina_bench_gemm_check_y(what, &g.ref, fp8, m, y, m + 1));
      /* A quantized activation byte of a sampled row. */
      x8_rows[0] ^= 0x01;
      REJECTS(ina_bench_gemm_check_x8(what, &g.ref, m, x8_rows, x_scale));
    }
  /* bf16: one weight row wrong (rows 5 and 6 swapped). */
  memcpy(w_wrong, g.w16, sizeof w_wrong);
  memcpy(w_wrong + 5 * GK, g.w16 + 6 * GK, GK * 2);
  memcpy(w_wrong + 6 * GK, g.w16 + 5 * GK, GK * 2);
  gemm_device(&g, 0, GM, w_wrong, y, x8, x_scale);
  REJECTS(ina_bench_gemm_check_y("gemm_bf16_m40_rows_swapped", &g.ref, 0, GM, y, GM + 1));
  /* FP8 GEMM that computed with the bf16 operands: the quantization error (~0.036) is
   * far above the FP8 bound, so a kernel ignoring its fp8 inputs cannot pass. */
  gemm_device(&g, 0, GM, g.w16, y, x8, x_scale);
  REJECTS(ina_bench_gemm_check_y("gemm_fp8_m40_from_bf16", &g.ref, 1, GM, y, GM + 1));
  ina_bench_gemm_ref_free(&g.ref);
}

/* ---- grouped GEMM --------------------------------------------------------------------- */

#define GG 5
#define GRN 144
#define GRK 272

static void test_grouped(test_rng_t *rng) {
  enum { MAX_ROWS = 80 };
  static uint16_t x16[MAX_ROWS * GRK], w16[GG][GRN * GRK], y[MAX_ROWS * GRN];
  static uint8_t x8[MAX_ROWS * GRK], w8[GG][GRN * GRK];
  static float x_scale[MAX_ROWS * 3], w_scale[GG][2 * 4], tmp[GRN * GRK], rows_s[2 * 3];
  static float xf[MAX_ROWS * GRK];
  const void *w16_p[GG], *w8_p[GG];
  const float *ws_p[GG];
  for (int i = 0; i < MAX_ROWS * GRK; i++) {
    x16[i] = bf16_of((float)test_rng_normal(rng));
    xf[i] = f32_of(x16[i]);
  }
  CHECK_OK(ina_fp8_quantize_blocks(xf, MAX_ROWS, GRK, 1, 128, x8, x_scale));
  for (int g = 0; g < GG; g++) {
    for (int i = 0; i < GRN * GRK; i++) {
      w16[g][i] = bf16_of(0.05f * (float)test_rng_normal(rng));
      tmp[i] = f32_of(w16[g][i]);
    }
    CHECK_OK(ina_fp8_quantize_blocks(tmp, GRN, GRK, 128, 128, w8[g], rows_s));
    CHECK_OK(ina_gemm_pack_w_scales(rows_s, GRN, GRK, w_scale[g]));
    w16_p[g] = w16[g], w8_p[g] = w8[g], ws_p[g] = w_scale[g];
  }
  /* 70 routed rows (more than the 64 sampled) and 12 (all compared); group 3 empty. */
  static const int32_t offsets_many[GG + 1] = {0, 20, 41, 55, 55, 70};
  static const int32_t offsets_few[GG + 1] = {0, 3, 5, 9, 9, 12};
  for (int fp8 = 0; fp8 < 2; fp8++)
    for (int few = 0; few < 2; few++) {
      const int32_t *offsets = few ? offsets_few : offsets_many;
      const int64_t routed = offsets[GG];
      char what[64];
      snprintf(what, sizeof what, "grouped_%s_%lld_rows", fp8 ? "fp8" : "bf16", (long long)routed);
      ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
      a.mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
      a.num_groups = GG, a.max_rows = MAX_ROWS - 2, a.n = GRN, a.k = GRK;
      a.offsets = offsets;
      a.x = fp8 ? (const void *)x8 : (const void *)x16;
      a.x_scale = x_scale;
      a.w = fp8 ? w8_p : w16_p;
      a.w_scale = ws_p;
      a.y = y;
      ina_bench_grouped_ref_t ref;
      uint64_t state = 99;
      CHECK_OK(ina_bench_grouped_ref_init(&ref, &a, 64, &state, NULL));
      if (!ref.y) continue;
      CHECK(ref.nrows == (routed < 64 ? routed : 64));
      /* The device: the reference itself, poison past the routed rows. */
      for (int i = 0; i < MAX_ROWS * GRN; i++) y[i] = INA_BENCH_BF16_POISON;
      CHECK_OK(ina_gemm_grouped_ref(&a));
      CHECK(ina_bench_grouped_check_y(what, &ref, y, MAX_ROWS));
      /* Row 0 (always sampled) computed with the next group's weight. */
      uint16_t saved[GRN];
      memcpy(saved, y, sizeof saved);
      ina_gemm_grouped_args_t wrong = a;
      const int32_t one[GG + 1] = {0, 0, 1, 1, 1, 1};
      wrong.offsets = one, wrong.max_rows = 1;
      CHECK_OK(ina_gemm_grouped_ref(&wrong));
      REJECTS(ina_bench_grouped_check_y(what, &ref, y, MAX_ROWS));
      /* Row 0 3 % too large. */
      for (int j = 0; j < GRN; j++) y[j] = bf16_of(1.03f * f32_of(saved[j]));
      REJECTS(ina_bench_grouped_check_y(what, &ref, y, MAX_ROWS));
      memcpy(y, saved, sizeof saved);
      CHECK(ina_bench_grouped_check_y(what, &ref, y, MAX_ROWS));
      /* A NaN in the last routed row; a write past the routed rows. */
      y[(routed - 1) * GRN + 1] = INA_BENCH_BF16_POISON;
      REJECTS(ina_bench_grouped_check_y(what, &ref, y, MAX_ROWS));
      CHECK_OK(ina_gemm_grouped_ref(&a));
      y[routed * GRN + 5] = 0;
      REJECTS(ina_bench_grouped_check_y(what, &ref, y, MAX_ROWS));
      ina_bench_grouped_ref_free(&ref);
    }
}

/* ---- custom all-reduce ---------------------------------------------------------------- */

#define AR_RANKS 3
#define AR_COUNT (128 * 24)

static void test_custom_ar(test_rng_t *rng) {
  static uint16_t in[AR_RANKS][AR_COUNT], out[AR_COUNT];
  const void *in_p[AR_RANKS];
  const uint16_t *in_u[AR_RANKS];
  for (int r = 0; r < AR_RANKS; r++) {
    for (int i = 0; i < AR_COUNT; i++) {
      /* Blocks of different magnitudes, as in test_custom_ar. */
      const float v = ldexpf((float)test_rng_normal(rng), (i / 128 * 7 + r * 3) % 9 - 4);
      in[r][i] = bf16_of(v);
    }
    in_p[r] = in[r], in_u[r] = in[r];
  }
  ina_bench_ar_ref_t ref;
  ina_threadpool_t *pool = NULL;
  CHECK_OK(ina_threadpool_create(2, &pool));
  CHECK_OK(ina_bench_ar_ref_init(&ref, AR_RANKS, in_u, AR_COUNT, pool));
  ina_threadpool_destroy(pool);
  if (!ref.bf16) return;
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const char *what = fp8 ? "ar_fp8" : "ar_bf16";
    car_model_all_reduce(fp8 ? INA_CAR_MODE_FP8 : INA_CAR_MODE_BF16, AR_RANKS, in_p, AR_COUNT, out);
    CHECK(ina_bench_ar_check_sum(what, &ref, fp8, 0, out, AR_COUNT));
    CHECK(ina_bench_ar_check_sum(what, &ref, fp8, 0, out, AR_COUNT / 2)); /* a prefix */
    out[1000] ^= 1; /* one ulp */
    REJECTS(ina_bench_ar_check_sum(what, &ref, fp8, 0, out, AR_COUNT));
  }
  /* NCCL-like: the exact sum rounded once to bf16. */
  for (int i = 0; i < AR_COUNT; i++) {
    double s = 0;
    for (int r = 0; r < AR_RANKS; r++) s += f32_of(in[r][i]);
    out[i] = bf16_of((float)s);
  }
  CHECK(ina_bench_ar_check_sum("ar_nccl", &ref, 0, 1, out, AR_COUNT));
  for (int i = 0; i < AR_COUNT; i++) out[i] = bf16_of(1.05f * f32_of(out[i]));
  REJECTS(ina_bench_ar_check_sum("ar_nccl_5pct", &ref, 0, 1, out, AR_COUNT));
  out[7] = INA_BENCH_BF16_POISON;
  REJECTS(ina_bench_ar_check_sum("ar_nccl_nan", &ref, 0, 1, out, AR_COUNT));

  /* The epilogue over [3, 1024]: a correct GPU's outputs, then one fault each. */
  enum { ROWS = 3, COLS = 1024, N = ROWS * COLS };
  static uint16_t res0[N], res1[N], y[N], x[N], weight[COLS];
  static uint8_t q[N];
  static float yf[N], scale[N / 128], wf[COLS];
  static double y_ref[N];
  for (int fp8 = 0; fp8 < 2; fp8++)
    for (int nccl = 0; nccl < 2; nccl++) {
      char what[64];
      snprintf(what, sizeof what, "ar_epilogue_%s%s", fp8 ? "fp8" : "bf16", nccl ? "_nccl" : "");
      for (int i = 0; i < N; i++) res0[i] = res1[i] = bf16_of(4.0f * (float)test_rng_normal(rng));
      for (int c = 0; c < COLS; c++) {
        weight[c] = bf16_of(1.0f + 0.25f * (float)test_rng_normal(rng));
        wf[c] = f32_of(weight[c]);
      }
      if (nccl) {
        for (int i = 0; i < N; i++) {
          double s = 0;
          for (int r = 0; r < AR_RANKS; r++) s += f32_of(in[r][i]);
          x[i] = bf16_of((float)s);
        }
      } else {
        car_model_all_reduce(fp8 ? INA_CAR_MODE_FP8 : INA_CAR_MODE_BF16, AR_RANKS, in_p, N, x);
      }
      car_model_epilogue(x, ROWS, COLS, res1, wf, 1e-6f, y_ref);
      for (int i = 0; i < N; i++) {
        y[i] = bf16_of((float)y_ref[i]);
        yf[i] = f32_of(y[i]);
      }
      CHECK_OK(ina_fp8_quantize_blocks(yf, ROWS, COLS, 1, 128, q, scale));
      ina_bench_ar_epilogue_t e = {.rows = ROWS, .cols = COLS, .fp8 = fp8, .nccl = nccl,
                                   .residual_before = res0, .residual_after = res1,
                                   .weight = weight, .eps = 1e-6f, .y = y, .y_fp8 = q,
                                   .y_scale = scale};
      CHECK(ina_bench_ar_check_epilogue(what, &ref, &e));
      q[17] ^= 0x02;
      REJECTS(ina_bench_ar_check_epilogue(what, &ref, &e));
      q[17] ^= 0x02;
      if (nccl) continue; /* under NCCL the residual and rows are compared in L2 only */
      res1[100] ^= 1;
      REJECTS(ina_bench_ar_check_epilogue(what, &ref, &e));
      res1[100] ^= 1;
      const uint16_t saved = y[2000];
      y[2000] = bf16_of(1.02f * f32_of(saved));
      REJECTS(ina_bench_ar_check_epilogue(what, &ref, &e));
      y[2000] = saved;
      CHECK(ina_bench_ar_check_epilogue(what, &ref, &e));
    }
  ina_bench_ar_ref_free(&ref);
}

int main(void) {
  test_rng_t rng = {test_seed("test_bench_checks")};
  printf("test_bench_checks: the FAILED lines below are the deliberate faults being rejected\n");
  test_util_helpers(&rng);
  test_gemm(&rng);
  test_grouped(&rng);
  test_custom_ar(&rng);
  return test_finish("test_bench_checks");
}
