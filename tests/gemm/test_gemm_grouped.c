/* Host side of gemm/gemm_grouped.h: the argument checks of ina_gemm_grouped_run and
 * ina_gemm_grouped_ref, and the CPU reference against a naive loop over the groups that
 * computes each row with the dense reference (ina_gemm_ref_row on a one-row GEMM, whose
 * activation-scale layout is then plain row-major) and a known-answer FP8 case that pins
 * down the scale indexing. Shapes: 1, 3, 8 and 64 groups (empty first, middle and last
 * groups, one group with every row, skewed), ragged 128-blocks, the DeepSeek-V2-Lite
 * expert shapes, padded strides, max_rows beyond offsets[G]. Everything the reference must
 * not write (rows past offsets[G], columns past n) is poisoned and must stay so; the
 * padding of x and its rows past offsets[G] hold NaN and must not leak in.
 * Runs everywhere; without CUDA, ina_gemm_grouped_run must answer INA_ERR_UNSUPPORTED. */

#include "core/dtype.h"
#include "core/log.h"
#include "gemm/gemm.h"
#include "gemm/gemm_grouped.h"
#include "gemm/gemm_internal.h"
#include "tests/test_util.h"

#define Y_POISON 0xFFFFu     /* a bf16 NaN */
#define X_BF16_POISON 0x7FC0u /* a bf16 NaN */
#define X_FP8_POISON 0x7Fu    /* the e4m3 NaN */
#define ROW_TOL 1e-2

static double g_worst_row_err = 0;
static int64_t g_rows_checked = 0;

static int64_t kblocks(int64_t k) { return (k + 127) / 128; }

/* ---- a grouped problem in host memory --------------------------------------------------- */

typedef struct problem {
  ina_gemm_mode_t mode;
  int32_t groups;
  int64_t max_rows, n, k, ldx, ldy;
  int32_t *offsets;
  void *x;         /* [max_rows, ldx] */
  float *x_scale;  /* FP8: [max_rows, kblocks] */
  void **w;        /* [groups] of [n, k] */
  float **w_scale; /* FP8: [groups] of packed scales */
  uint16_t *y;     /* [max_rows, ldy] */
} problem_t;

static void problem_free(problem_t *p) {
  for (int32_t g = 0; p->w && g < p->groups; g++) free(p->w[g]);
  for (int32_t g = 0; p->w_scale && g < p->groups; g++) free(p->w_scale[g]);
  free(p->offsets), free(p->x), free(p->x_scale), free(p->w), free(p->w_scale), free(p->y);
  memset(p, 0, sizeof *p);
}

static uint8_t random_e4m3(test_rng_t *rng) {
  /* A normal value of unit scale quantized: the distribution real activations have. */
  return ina_f32_to_fp8_e4m3(64.0f * test_rng_normal(rng), 1);
}

/* Row counts per group: how the rows are spread. */
typedef enum { SPREAD_RANDOM, SPREAD_ONE_GROUP, SPREAD_SKEWED, SPREAD_SPARSE } spread_t;

static void make_offsets(problem_t *p, int64_t rows, spread_t spread, test_rng_t *rng) {
  int64_t *count = calloc((size_t)p->groups, sizeof *count);
  if (!count) return;
  const int32_t chosen = (int32_t)test_rng_int(rng, 0, p->groups - 1);
  for (int64_t r = 0; r < rows; r++) {
    int32_t g = (int32_t)test_rng_int(rng, 0, p->groups - 1);
    if (spread == SPREAD_ONE_GROUP) g = chosen;
    if (spread == SPREAD_SKEWED && test_rng_uniform(rng) < 0.6) g = chosen;
    if (spread == SPREAD_SPARSE) g = (g / 4) * 4; /* three groups of four stay empty */
    count[g]++;
  }
  p->offsets[0] = 0;
  for (int32_t g = 0; g < p->groups; g++) p->offsets[g + 1] = p->offsets[g] + (int32_t)count[g];
  free(count);
}

/* Random inputs; `rows` rows routed, max_rows rows in the buffers. */
static int problem_make(problem_t *p, ina_gemm_mode_t mode, int32_t groups, int64_t n, int64_t k,
                        int64_t rows, int64_t spare_rows, int64_t pad_x, int64_t pad_y,
                        spread_t spread, test_rng_t *rng) {
  const int fp8 = mode == INA_GEMM_FP8_BLOCK;
  const size_t xsize = fp8 ? 1 : 2;
  memset(p, 0, sizeof *p);
  p->mode = mode, p->groups = groups, p->n = n, p->k = k;
  p->max_rows = rows + spare_rows, p->ldx = k + pad_x, p->ldy = n + pad_y;
  p->offsets = malloc((size_t)(groups + 1) * sizeof *p->offsets);
  p->x = malloc((size_t)(p->max_rows * p->ldx) * xsize + 1);
  p->x_scale = malloc((size_t)(p->max_rows * kblocks(k)) * sizeof(float) + 1);
  p->w = calloc((size_t)groups, sizeof *p->w);
  p->w_scale = calloc((size_t)groups, sizeof *p->w_scale);
  p->y = malloc((size_t)(p->max_rows * p->ldy) * 2 + 1);
  if (!p->offsets || !p->x || !p->x_scale || !p->w || !p->w_scale || !p->y) return 0;
  make_offsets(p, rows, spread, rng);
  const int64_t routed = p->offsets[groups];
  for (int64_t r = 0; r < p->max_rows; r++)
    for (int64_t c = 0; c < p->ldx; c++) {
      const int poison = r >= routed || c >= k;
      if (fp8)
        ((uint8_t *)p->x)[r * p->ldx + c] = poison ? X_FP8_POISON : random_e4m3(rng);
      else
        ((uint16_t *)p->x)[r * p->ldx + c] =
            poison ? X_BF16_POISON : ina_f32_to_bf16(test_rng_normal(rng));
    }
  for (int64_t i = 0; i < p->max_rows * kblocks(k); i++)
    p->x_scale[i] = i / kblocks(k) >= routed ? NAN : (float)(0.5 + test_rng_uniform(rng)) / 64.0f;
  for (int64_t i = 0; i < p->max_rows * p->ldy; i++) p->y[i] = Y_POISON;
  const int64_t scale_rows = kblocks(n) * kblocks(k);
  float *scale_inv = malloc((size_t)scale_rows * sizeof *scale_inv);
  if (!scale_inv) return 0;
  for (int32_t g = 0; g < groups; g++) {
    p->w[g] = malloc((size_t)(n * k) * xsize);
    if (!p->w[g]) break;
    for (int64_t i = 0; i < n * k; i++) {
      if (fp8)
        ((uint8_t *)p->w[g])[i] = random_e4m3(rng);
      else
        ((uint16_t *)p->w[g])[i] = ina_f32_to_bf16(0.05f * test_rng_normal(rng));
    }
    if (!fp8) continue;
    p->w_scale[g] = malloc((size_t)ina_gemm_w_scale_count(n, k) * sizeof(float));
    if (!p->w_scale[g]) break;
    for (int64_t i = 0; i < scale_rows; i++)
      scale_inv[i] = (float)(0.5 + test_rng_uniform(rng)) / 1280.0f;
    CHECK_OK(ina_gemm_pack_w_scales(scale_inv, n, k, p->w_scale[g]));
  }
  free(scale_inv);
  for (int32_t g = 0; g < groups; g++)
    if (!p->w[g] || (fp8 && !p->w_scale[g])) return 0;
  return 1;
}

static ina_gemm_grouped_args_t problem_args(const problem_t *p) {
  ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
  a.mode = p->mode;
  a.num_groups = p->groups;
  a.max_rows = p->max_rows;
  a.n = p->n, a.k = p->k;
  a.offsets = p->offsets;
  a.x = p->x, a.ldx = p->ldx;
  a.x_scale = p->x_scale;
  a.w = (const void *const *)p->w;
  a.w_scale = (const float *const *)p->w_scale;
  a.y = p->y, a.ldy = p->ldy;
  return a;
}

/* ---- checks ------------------------------------------------------------------------------- */

/* bf16 values as ordered integers: adjacent values differ by 1. */
static int64_t bf16_ordinal(uint16_t h) { return h & 0x8000u ? -(int64_t)(h & 0x7FFFu) : h; }

/* Everything outside the routed rows' first n columns still holds the poison. */
static void check_untouched(const char *what, const problem_t *p) {
  int64_t changed = 0;
  for (int64_t r = 0; r < p->max_rows; r++)
    for (int64_t c = 0; c < p->ldy; c++)
      if (r >= p->offsets[p->groups] || c >= p->n) changed += p->y[r * p->ldy + c] != Y_POISON;
  CHECKF(changed == 0, "%s: %lld values outside the output changed", what, (long long)changed);
}

/* The reference's rows against the naive loop: ina_gemm_ref_row on one-row GEMMs. */
static void check_against_rows(const char *what, const problem_t *p) {
  const int fp8 = p->mode == INA_GEMM_FP8_BLOCK;
  const size_t xsize = fp8 ? 1 : 2;
  double *row = malloc((size_t)p->n * sizeof *row);
  float *got = malloc((size_t)p->n * sizeof *got), *want = malloc((size_t)p->n * sizeof *want);
  uint16_t dummy_y[8];
  CHECK(row && got && want);
  if (!row || !got || !want) goto done;
  double worst = 0;
  int64_t max_ulps = 0;
  for (int32_t g = 0; g < p->groups; g++)
    for (int64_t r = p->offsets[g]; r < p->offsets[g + 1]; r++) {
      ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
      a.mode = p->mode, a.m = 1, a.n = p->n, a.k = p->k;
      a.x = (const char *)p->x + (size_t)(r * p->ldx) * xsize;
      a.x_scale = p->x_scale + r * kblocks(p->k); /* one row: the layout is row-major */
      a.w = p->w[g];
      a.w_scale = p->w_scale[g];
      a.y = dummy_y;
      CHECK_OK(ina_gemm_ref_row(&a, 0, row));
      for (int64_t j = 0; j < p->n; j++) {
        const uint16_t ref = ina_f32_to_bf16((float)row[j]), out = p->y[r * p->ldy + j];
        const int64_t ulps = llabs(bf16_ordinal(ref) - bf16_ordinal(out));
        if (ulps > max_ulps) max_ulps = ulps;
        want[j] = ina_bf16_to_f32(ref);
        got[j] = ina_bf16_to_f32(out);
      }
      const double err = test_rel_l2(got, want, (size_t)p->n);
      if (!(err <= worst)) worst = err;
      g_rows_checked++;
    }
  CHECKF(worst <= ROW_TOL, "%s: worst per-row relative L2 error %.3g", what, worst);
  /* Both sum in double: only the double rounding to bf16 can differ, by one step. */
  CHECKF(max_ulps <= 1, "%s: outputs differ by up to %lld bf16 steps", what, (long long)max_ulps);
  if (!(worst <= g_worst_row_err)) g_worst_row_err = worst;
done:
  free(row), free(got), free(want);
}

static void run_case(ina_gemm_mode_t mode, int32_t groups, int64_t n, int64_t k, int64_t rows,
                     int64_t spare_rows, int64_t pad_x, int64_t pad_y, spread_t spread,
                     test_rng_t *rng) {
  char what[160];
  snprintf(what, sizeof what, "%s G %d n %lld k %lld rows %lld (+%lld) pads %lld/%lld spread %d",
           mode == INA_GEMM_FP8_BLOCK ? "fp8" : "bf16", (int)groups, (long long)n, (long long)k,
           (long long)rows, (long long)spare_rows, (long long)pad_x, (long long)pad_y, (int)spread);
  problem_t p;
  const int ok = problem_make(&p, mode, groups, n, k, rows, spare_rows, pad_x, pad_y, spread, rng);
  CHECKF(ok, "%s: setup failed", what);
  if (ok) {
    const ina_gemm_grouped_args_t a = problem_args(&p);
    CHECK_OK(ina_gemm_grouped_ref(&a));
    check_untouched(what, &p);
    check_against_rows(what, &p);
  }
  problem_free(&p);
}

static void test_reference(test_rng_t *rng) {
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const ina_gemm_mode_t mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
    /* Small odd shapes: ragged 128-blocks in n and k for FP8. */
    const int64_t n = fp8 ? 144 : 48, k = fp8 ? 272 : 80, pad = fp8 ? 16 : 8;
    run_case(mode, 1, n, k, 37, 0, 0, 0, SPREAD_RANDOM, rng);
    run_case(mode, 1, n, k, 5, 11, pad, pad, SPREAD_RANDOM, rng);
    run_case(mode, 3, n, k, 50, 7, pad, 0, SPREAD_RANDOM, rng);
    run_case(mode, 3, n, k, 29, 3, 0, pad, SPREAD_ONE_GROUP, rng);
    run_case(mode, 8, n, k, 60, 20, pad, pad, SPREAD_SPARSE, rng);
    run_case(mode, 8, n, k, 41, 0, 0, 0, SPREAD_SKEWED, rng);
    run_case(mode, 64, 32, 128, 300, 84, pad, pad, SPREAD_RANDOM, rng);
    run_case(mode, 64, 32, 128, 100, 0, 0, 0, SPREAD_SPARSE, rng);
    run_case(mode, 3, 256, 384, 0, 9, 0, 0, SPREAD_RANDOM, rng); /* nothing routed */
    for (int i = 0; i < 4; i++) {
      const int64_t rn = 16 * test_rng_int(rng, 1, 24), rk = 16 * test_rng_int(rng, 1, 24);
      run_case(mode, (int32_t)test_rng_int(rng, 1, 12), rn, rk, test_rng_int(rng, 0, 90),
               test_rng_int(rng, 0, 9), pad * test_rng_int(rng, 0, 2),
               pad * test_rng_int(rng, 0, 2), (spread_t)test_rng_int(rng, 0, 3), rng);
    }
  }
  /* The DeepSeek-V2-Lite experts (gate/up per expert half: n 1408, k 2048; down: n 2048,
   * k 1408), a few rows. */
  run_case(INA_GEMM_FP8_BLOCK, 3, 1408, 2048, 6, 2, 0, 0, SPREAD_RANDOM, rng);
  run_case(INA_GEMM_FP8_BLOCK, 3, 2048, 1408, 5, 0, 16, 8, SPREAD_SKEWED, rng);
  run_case(INA_GEMM_BF16, 3, 1408, 2048, 5, 1, 8, 0, SPREAD_RANDOM, rng);
  run_case(INA_GEMM_BF16, 3, 2048, 1408, 6, 0, 0, 8, SPREAD_ONE_GROUP, rng);
}

/* FP8 with every value 1.0 and scales that name their block: y[r, j] = sum over K blocks
 * of (block length) * x_scale[r, kb] * w_scale[j / 128, kb], exact in bf16 by choice of
 * the scales. Ragged blocks: n 144 = 128 + 16, k 272 = 2 x 128 + 16. */
static void test_fp8_known_answer(void) {
  const int64_t n = 144, k = 272, L = kblocks(k), rows = 3;
  int32_t offsets[3] = {0, 1, 3};
  uint8_t *x = malloc((size_t)(rows * k)), *w0 = malloc((size_t)(n * k)),
          *w1 = malloc((size_t)(n * k));
  float x_scale[3 * 3], scale_inv[2][2 * 3], packed[2][2 * 4];
  uint16_t y[3 * 144];
  CHECK(x && w0 && w1);
  if (!x || !w0 || !w1) goto done;
  memset(x, 0x38, (size_t)(rows * k)); /* e4m3 0x38 = 1.0 */
  memset(w0, 0x38, (size_t)(n * k));
  memset(w1, 0x38, (size_t)(n * k));
  for (int64_t r = 0; r < rows; r++)
    for (int64_t kb = 0; kb < L; kb++) x_scale[r * L + kb] = (float)(r + 1); /* 1, 2, 3 */
  for (int g = 0; g < 2; g++) {
    for (int64_t rb = 0; rb < 2; rb++)
      for (int64_t kb = 0; kb < L; kb++)
        scale_inv[g][rb * L + kb] = (float)((g + 1) * (rb + 1)) * (kb == 2 ? 4.0f : 1.0f);
    CHECK_OK(ina_gemm_pack_w_scales(scale_inv[g], n, k, packed[g]));
  }
  const void *w[2] = {w0, w1};
  const float *ws[2] = {packed[0], packed[1]};
  ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
  a.mode = INA_GEMM_FP8_BLOCK, a.num_groups = 2, a.max_rows = rows, a.n = n, a.k = k;
  a.offsets = offsets, a.x = x, a.x_scale = x_scale, a.w = w, a.w_scale = ws, a.y = y;
  CHECK_OK(ina_gemm_grouped_ref(&a));
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; r++) {
    const int g = r < 1 ? 0 : 1;
    for (int64_t j = 0; j < n; j++) {
      const double rb = (double)(j / 128 + 1);
      /* blocks of 128, 128 and 16 values, the last with a 4x weight scale */
      const double want = (r + 1) * (g + 1) * rb * (128 + 128 + 16 * 4);
      bad += ina_bf16_to_f32(y[r * n + j]) != (float)want;
    }
  }
  CHECKF(bad == 0, "FP8 known answer: %lld outputs wrong", (long long)bad);
done:
  free(x), free(w0), free(w1);
}

/* ---- argument checks ------------------------------------------------------------------------ */

/* A status the device entry point must give: without CUDA in the build, always
 * INA_ERR_UNSUPPORTED; with it, the status of the argument checks. */
static ina_status_t run_status(ina_status_t with_cuda) {
#ifdef INA_HAVE_CUDA
  return with_cuda;
#else
  (void)with_cuda;
  return INA_ERR_UNSUPPORTED;
#endif
}

static void test_arguments(void) {
  _Alignas(16) static uint8_t buf[4096];
  int32_t offsets[4] = {0, 2, 2, 5};
  const void *w[3] = {buf, buf, buf};
  const float *ws[3] = {(const float *)buf, (const float *)buf, (const float *)buf};
  ina_gemm_grouped_args_t good = INA_GEMM_GROUPED_ARGS_INIT, a;
  good.mode = INA_GEMM_FP8_BLOCK, good.num_groups = 3, good.max_rows = 6;
  good.n = 32, good.k = 64;
  good.offsets = offsets, good.x = buf, good.x_scale = (const float *)buf;
  good.w = w, good.w_scale = ws, good.y = (uint16_t *)(buf + 2048);
  ina_log_set_quiet_errors(1);
#define EXPECT_BOTH(args_expr, code)                                              \
  do {                                                                            \
    a = good;                                                                     \
    args_expr;                                                                    \
    CHECK(ina_gemm_grouped_ref(&a) == (code));                                    \
    CHECK(ina_gemm_grouped_run(&a) == run_status(code));                          \
  } while (0)
  CHECK(ina_gemm_grouped_ref(NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gemm_grouped_run(NULL) == run_status(INA_ERR_INVALID_ARGUMENT));
  EXPECT_BOTH(a.struct_size = 8, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.version = 0, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.mode = (ina_gemm_mode_t)7, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.num_groups = 0, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.max_rows = -1, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.max_rows = (int64_t)1 << 31, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.n = 24, INA_ERR_INVALID_ARGUMENT);   /* FP8: multiples of 16 */
  EXPECT_BOTH(a.k = 40, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.k = 0, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH((a.mode = INA_GEMM_BF16, a.n = 20), INA_ERR_INVALID_ARGUMENT); /* bf16: of 8 */
  EXPECT_BOTH(a.ldx = 48, INA_ERR_INVALID_ARGUMENT);                        /* < k */
  EXPECT_BOTH(a.ldy = 16, INA_ERR_INVALID_ARGUMENT);                        /* < n */
  EXPECT_BOTH(a.x = NULL, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.y = NULL, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.offsets = NULL, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.w = NULL, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.x_scale = NULL, INA_ERR_INVALID_ARGUMENT);
  EXPECT_BOTH(a.w_scale = NULL, INA_ERR_INVALID_ARGUMENT);
  /* Alignment: the device's rule only (the reference computes; the run refuses). */
  a = good, a.x = buf + 4;
  CHECK(ina_gemm_grouped_run(&a) == run_status(INA_ERR_INVALID_ARGUMENT));
  a = good, a.y = (uint16_t *)(buf + 2050);
  CHECK(ina_gemm_grouped_run(&a) == run_status(INA_ERR_INVALID_ARGUMENT));
  a = good, a.ldx = 72; /* FP8 rows 72 bytes apart */
  CHECK(ina_gemm_grouped_run(&a) == run_status(INA_ERR_INVALID_ARGUMENT));
  a = good, a.ldy = 36; /* 72-byte output rows */
  CHECK(ina_gemm_grouped_run(&a) == run_status(INA_ERR_INVALID_ARGUMENT));
  a = good, a.mode = INA_GEMM_BF16, a.ldx = 68; /* 136-byte bf16 rows */
  CHECK(ina_gemm_grouped_run(&a) == run_status(INA_ERR_INVALID_ARGUMENT));
  /* Offsets: only the reference can read them. */
  offsets[0] = 1;
  CHECK(ina_gemm_grouped_ref(&good) == INA_ERR_INVALID_ARGUMENT);
  offsets[0] = 0, offsets[2] = 1; /* decreasing */
  CHECK(ina_gemm_grouped_ref(&good) == INA_ERR_INVALID_ARGUMENT);
  offsets[2] = 2, offsets[3] = 7; /* past max_rows */
  CHECK(ina_gemm_grouped_ref(&good) == INA_ERR_INVALID_ARGUMENT);
  offsets[3] = 5, w[1] = NULL;
  CHECK(ina_gemm_grouped_ref(&good) == INA_ERR_INVALID_ARGUMENT);
  w[1] = buf, ws[2] = NULL;
  CHECK(ina_gemm_grouped_ref(&good) == INA_ERR_INVALID_ARGUMENT);
  ws[2] = (const float *)buf;
  ina_log_set_quiet_errors(0);
  /* max_rows 0 does nothing and dereferences nothing. */
  a = (ina_gemm_grouped_args_t)INA_GEMM_GROUPED_ARGS_INIT;
  a.num_groups = 4, a.n = 64, a.k = 64;
  CHECK_OK(ina_gemm_grouped_ref(&a));
  ina_log_set_quiet_errors(1);
  CHECK(ina_gemm_grouped_run(&a) == run_status(INA_OK));
  ina_log_set_quiet_errors(0);
  /* A valid call on the same buffers passes the reference: the checks are not too strict. */
  memset(buf, 0x38, sizeof buf);
  CHECK_OK(ina_gemm_grouped_ref(&good));
#undef EXPECT_BOTH
}

/* The number of M tiles a routing of `rows` rows over `groups` groups makes, the groups'
 * sizes drawn at random (some empty, some large). */
static int64_t random_routing_tiles(int64_t rows, int32_t groups, int32_t tile_m,
                                    test_rng_t *rng) {
  int64_t tiles = 0, left = rows;
  for (int32_t g = 0; g < groups && left > 0; g++) {
    int64_t take = g + 1 < groups ? test_rng_int(rng, 0, 2 * tile_m + 1) : left;
    if (take > left) take = left;
    tiles += (take + tile_m - 1) / tile_m;
    left -= take;
  }
  return tiles;
}

/* The grouped kernel's tiles: the slots bound the M tiles of any routing, the N tiles
 * cover n, the width follows the measured thresholds of gemm_internal.h (64 and 32 only for
 * decode-sized groups), weight tiles fastest in the grid for decode tiles, and the choice
 * on the DeepSeek-V2-Lite decode shapes (64 experts; 1, 8 and 64 tokens x top-6). */
static void test_tiles(test_rng_t *rng) {
  ina_gemm_grouped_tiles_t t;
  static const int64_t ns[] = {1408, 2048, 2816};
  static const int64_t max_rows[] = {6, 48, 384, 6144};
  /* The widths picked on 132 SMs, [n][max_rows] (64-row tiles at 6144 rows: 96 per group). */
  static const int32_t widths[3][4] = {{32, 64, 128, 128}, {64, 64, 128, 128}, {64, 128, 128, 128}};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
    for (size_t r = 0; r < sizeof max_rows / sizeof max_rows[0]; r++) {
      CHECK_OK(ina_gemm_grouped_tiles(max_rows[r], 64, ns[i], 0, 132, &t));
      printf("grouped tiles max_rows %4lld n %4lld: %d x %d, grid %lld slots x %lld tiles\n",
             (long long)max_rows[r], (long long)ns[i], t.tile_m, t.tile_n, (long long)t.m_slots,
             (long long)t.n_tiles);
      CHECK(t.tile_m == (max_rows[r] >= INA_GEMM_GROUPED_LARGE_TILE_ROWS * 64 ? 64 : 16));
      CHECKF(t.tile_n == widths[i][r], "max_rows %lld n %lld: width %d, expected %d",
             (long long)max_rows[r], (long long)ns[i], t.tile_n, widths[i][r]);
    }
  /* One token: 6 slots, one per row, not 60. */
  CHECK_OK(ina_gemm_grouped_tiles(6, 64, 1408, 0, 132, &t));
  CHECK(t.m_slots == 6 && t.n_tiles == 44);
  for (int it = 0; it < 5000; it++) {
    const int64_t rows = test_rng_int(rng, 0, 20000), n = 8 * test_rng_int(rng, 1, 2000);
    const int32_t groups = (int32_t)test_rng_int(rng, 1, 300);
    const int sms = (int)test_rng_int(rng, 1, 200), fp8 = (int)test_rng_int(rng, 0, 1);
    CHECK_OK(ina_gemm_grouped_tiles(rows, groups, n, fp8, sms, &t));
    const int64_t bound = (rows + (int64_t)groups * (t.tile_m - 1)) / t.tile_m;
    const int64_t slots = bound < rows ? bound : rows;
    int32_t width = 128;
    if (t.tile_m == 16 && slots * ((n + 127) / 128) < INA_GEMM_GROUPED_WIDE_CTAS_PER_SM * sms)
      width = slots * ((n + 63) / 64) * 100 < INA_GEMM_GROUPED_NARROW_CTAS_PER_100_SMS * sms ? 32
                                                                                            : 64;
    const int64_t large = fp8 ? INA_GEMM_GROUPED_LARGE_TILE_ROWS_FP8 : INA_GEMM_GROUPED_LARGE_TILE_ROWS;
    const int ok = (t.tile_m == 64) == (rows >= large * (int64_t)groups) &&
                   (t.tile_m == 16 || t.tile_m == 64) && t.tile_n == width &&
                   t.m_slots == slots && t.n_tiles * t.tile_n >= n &&
                   (t.n_tiles - 1) * t.tile_n < n &&
                   t.n_fastest == (t.tile_m == 16 && t.m_slots <= 65535);
    CHECKF(ok, "tiles rows %lld groups %d n %lld fp8 %d sms %d: %d x %d, %lld x %lld", (long long)rows,
           (int)groups, (long long)n, fp8, sms, t.tile_m, t.tile_n, (long long)t.m_slots,
           (long long)t.n_tiles);
    /* The slot bound: no routing of the rows makes more tiles, e.g. one row in each of the
     * first groups and the rest in the last, or random group sizes. */
    if (rows > 0) {
      int64_t tiles = 0, left = rows;
      for (int32_t g = 0; g < groups && left > 0; g++) {
        const int64_t take = g + 1 < groups ? 1 : left;
        tiles += (take + t.tile_m - 1) / t.tile_m;
        left -= take;
      }
      CHECK(tiles <= t.m_slots);
      CHECK(random_routing_tiles(rows, groups, t.tile_m, rng) <= t.m_slots);
    }
  }
  ina_log_set_quiet_errors(1);
  CHECK(ina_gemm_grouped_tiles_fixed(6, 64, 1408, 64, 32, &t) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gemm_grouped_tiles_fixed(6, 64, 1408, 16, 48, &t) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gemm_grouped_tiles(6, 0, 1408, 0, 132, &t) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gemm_grouped_tiles(6, 64, 1408, 0, 0, &t) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_gemm_grouped_tiles_fixed(6, 64, 1408, 16, 64, &t));
  CHECK(t.tile_m == 16 && t.tile_n == 64 && t.m_slots == 6 && t.n_tiles == 22 && t.n_fastest == 1);
  CHECK_OK(ina_gemm_grouped_tiles_fixed(6144, 64, 1408, 64, 128, &t));
  CHECK(t.m_slots == (6144 + 64 * 63) / 64 && t.n_tiles == 11 && t.n_fastest == 0);
  CHECK_OK(ina_gemm_grouped_tiles_fixed(1 << 21, 1, 64, 16, 128, &t)); /* slots past grid.y */
  CHECK(t.m_slots == 1 << 17 && t.n_fastest == 0);
}

int main(void) {
  test_rng_t rng = {test_seed("test_gemm_grouped")};
  test_arguments();
  test_tiles(&rng);
  test_fp8_known_answer();
  test_reference(&rng);
  printf("test_gemm_grouped: %lld rows against the dense reference, worst per-row relative L2 "
         "error %.3g (bound %.0e)\n",
         (long long)g_rows_checked, g_worst_row_err, ROW_TOL);
  return test_finish("test_gemm_grouped");
}
