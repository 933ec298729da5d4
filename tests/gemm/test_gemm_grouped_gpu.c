/* The GPU grouped GEMM of gemm/gemm_grouped.h against its CPU reference.
 *
 *   Shapes: 1, 3 and 64 groups; bf16 n 48, k 80 and FP8 n 144, k 272 (ragged 128-blocks in
 *     n and k); the DeepSeek-V2-Lite experts (n 1408, k 2048 and n 2048, k 1408) at decode
 *     (384 rows over 64 groups) and prefill (4096 rows); rows spread at random, into one
 *     group, skewed, sparse (most groups empty) and evenly with a remainder of one row per
 *     tile, which fills the fixed grid's every M-tile slot; both tile heights (16 and 64
 *     rows) and every tile width (128, 64, 32 weight rows), picked and forced; the
 *     V2-Lite decode shapes at 1 and 8 tokens (max_rows 6, 48); padded ldx / ldy; max_rows
 *     beyond offsets[G].
 *   Bound: relative L2 error per row <= 1e-2 against ina_gemm_grouped_ref (both bf16
 *     outputs; the worst is printed). Every routed row is compared when the reference is
 *     cheap, else 48 rows including each sampled group's first and last. Every routed
 *     output must be finite; everything else of y (rows past offsets[G], the padding past
 *     n) is poisoned with NaN and must keep its bits.
 *   Weights sit in one allocation in shuffled group order, so the kernel must follow the
 *     pointer array. Padding of x and its rows past offsets[G] hold NaN.
 *   CUDA graph: a bf16 and an FP8 grouped run captured once on one offsets buffer, replayed
 *     with new offsets copied into it before each replay (random, one group, none, all
 *     rows), each replay checked.
 *   Offsets that break the contract (decreasing, past max_rows, negative) must not make
 *     the kernel touch rows outside [0, max_rows).
 * Skipped (exit 77) without a CUDA device. */

#include "core/cuda.h"
#include "core/dtype.h"
#include "core/log.h"
#include "gemm/gemm.h"
#include "gemm/gemm_grouped.h"
#include "gemm/gemm_internal.h"
#include "tests/gpu_test_util.h"

#ifdef INA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define Y_POISON 0xFFFFu
#define X_BF16_POISON 0x7FC0u
#define X_FP8_POISON 0x7Fu
#define ROW_TOL 1e-2
#define SAMPLED_ROWS 48
#define FULL_CHECK_MACS ((int64_t)1 << 28)
#define TABLE_SIZE 4096

static double g_worst_row_err = 0;
static int64_t g_rows_compared = 0;

static int64_t kblocks(int64_t k) { return (k + 127) / 128; }

/* ---- fast random data: table lookups of precomputed normal samples ---------------------- */

typedef struct tables {
  uint16_t x_bf16[TABLE_SIZE], w_bf16[TABLE_SIZE];
  uint8_t e4m3[TABLE_SIZE];
} tables_t;

static tables_t g_tables;

static void tables_init(test_rng_t *rng) {
  for (int i = 0; i < TABLE_SIZE; i++) {
    g_tables.x_bf16[i] = ina_f32_to_bf16(test_rng_normal(rng));
    g_tables.w_bf16[i] = ina_f32_to_bf16(0.05f * test_rng_normal(rng));
    g_tables.e4m3[i] = ina_f32_to_fp8_e4m3(64.0f * test_rng_normal(rng), 1);
  }
}

/* count values drawn from `table` (2-byte or 1-byte entries). */
static void fill_from_table(void *dst, int fp8, const uint16_t *table16, int64_t count,
                            test_rng_t *rng) {
  uint64_t bits = 0;
  for (int64_t i = 0; i < count; i++) {
    if (i % 5 == 0) bits = test_rng_next(rng);
    const int idx = (int)(bits & (TABLE_SIZE - 1));
    bits >>= 12;
    if (fp8)
      ((uint8_t *)dst)[i] = g_tables.e4m3[idx];
    else
      ((uint16_t *)dst)[i] = table16[idx];
  }
}

/* ---- a grouped problem on host and device ------------------------------------------------- */

/* How the rows are spread over the groups. */
typedef enum {
  SPREAD_RANDOM,
  SPREAD_ONE_GROUP,
  SPREAD_SKEWED,
  SPREAD_SPARSE,
  SPREAD_EVEN
} spread_t;

typedef struct problem {
  ina_gemm_mode_t mode;
  int32_t groups;
  int64_t max_rows, n, k, ldx, ldy;
  size_t xsize;
  int32_t *offsets; /* host [groups + 1] */
  void *x;          /* host [max_rows, ldx] */
  float *x_scale;   /* host [max_rows, kblocks] (FP8) */
  void *w_all;      /* host: every group's weight, in shuffled order */
  float *ws_all;    /* host: every group's packed scales (FP8) */
  const void **w;   /* host [groups]: pointers into w_all */
  const float **w_scale;
  uint16_t *y;      /* host [max_rows, ldy]: read back */
  uint16_t *y_ref;  /* host [max_rows, ldy] */
  int32_t *slot;    /* group g's place in the allocations */
  /* device */
  int32_t *d_offsets;
  void *d_x, *d_x_scale, *d_w_all, *d_ws_all, *d_w, *d_w_scale, *d_y;
} problem_t;

static void problem_free(problem_t *p) {
  free(p->offsets), free(p->x), free(p->x_scale), free(p->w_all), free(p->ws_all);
  free(p->w), free(p->w_scale), free(p->y), free(p->y_ref), free(p->slot);
  ina_cuda_free(p->d_offsets), ina_cuda_free(p->d_x), ina_cuda_free(p->d_x_scale);
  ina_cuda_free(p->d_w_all), ina_cuda_free(p->d_ws_all), ina_cuda_free(p->d_w);
  ina_cuda_free(p->d_w_scale), ina_cuda_free(p->d_y);
  memset(p, 0, sizeof *p);
}

static void make_offsets(int32_t *offsets, int32_t groups, int64_t rows, spread_t spread,
                         test_rng_t *rng) {
  int64_t *count = calloc((size_t)groups, sizeof *count);
  if (!count) return;
  const int32_t chosen = (int32_t)test_rng_int(rng, 0, groups - 1);
  for (int64_t r = 0; r < rows; r++) {
    int32_t g = (int32_t)test_rng_int(rng, 0, groups - 1);
    if (spread == SPREAD_ONE_GROUP) g = chosen;
    if (spread == SPREAD_SKEWED && test_rng_uniform(rng) < 0.6) g = chosen;
    if (spread == SPREAD_SPARSE) g = (g / 4) * 4;
    if (spread == SPREAD_EVEN) g = (int32_t)(r % groups);
    count[g]++;
  }
  offsets[0] = 0;
  for (int32_t g = 0; g < groups; g++) offsets[g + 1] = offsets[g] + (int32_t)count[g];
  free(count);
}

static uint8_t *byte_ptr(void *base, int64_t offset) { return (uint8_t *)base + offset; }

/* Host inputs, offsets for `rows` routed rows, device copies; y poisoned on both sides. */
static int problem_make(problem_t *p, ina_gemm_mode_t mode, int32_t groups, int64_t n, int64_t k,
                        int64_t rows, int64_t spare_rows, int64_t pad_x, int64_t pad_y,
                        spread_t spread, test_rng_t *rng) {
  const int fp8 = mode == INA_GEMM_FP8_BLOCK;
  memset(p, 0, sizeof *p);
  p->mode = mode, p->groups = groups, p->n = n, p->k = k, p->xsize = fp8 ? 1 : 2;
  p->max_rows = rows + spare_rows, p->ldx = k + pad_x, p->ldy = n + pad_y;
  const int64_t L = kblocks(k), w_bytes = n * k * (int64_t)p->xsize;
  const int64_t ws_count = ina_gemm_w_scale_count(n, k);
  const size_t x_bytes = (size_t)(p->max_rows * p->ldx) * p->xsize;
  const size_t xs_bytes = (size_t)(p->max_rows * L) * sizeof(float);
  const size_t y_bytes = (size_t)(p->max_rows * p->ldy) * 2;
  p->offsets = malloc((size_t)(groups + 1) * sizeof *p->offsets);
  p->x = malloc(x_bytes + 1);
  p->x_scale = malloc(xs_bytes + 4);
  p->w_all = malloc((size_t)(groups * w_bytes));
  p->ws_all = malloc((size_t)(groups * ws_count) * sizeof(float));
  p->w = calloc((size_t)groups, sizeof *p->w);
  p->w_scale = calloc((size_t)groups, sizeof *p->w_scale);
  p->y = malloc(y_bytes + 2);
  p->y_ref = malloc(y_bytes + 2);
  p->slot = malloc((size_t)groups * sizeof *p->slot);
  if (!p->offsets || !p->x || !p->x_scale || !p->w_all || !p->ws_all || !p->w || !p->w_scale ||
      !p->y || !p->y_ref || !p->slot)
    return 0;
  make_offsets(p->offsets, groups, rows, spread, rng);
  /* Shuffled placement: group g's weight is the slot[g]-th of the allocation. */
  for (int32_t g = 0; g < groups; g++) p->slot[g] = g;
  for (int32_t g = groups - 1; g > 0; g--) {
    const int32_t o = (int32_t)test_rng_int(rng, 0, g), t = p->slot[g];
    p->slot[g] = p->slot[o], p->slot[o] = t;
  }
  fill_from_table(p->x, fp8, g_tables.x_bf16, p->max_rows * p->ldx, rng);
  for (int64_t r = 0; r < p->max_rows; r++)
    for (int64_t c = 0; c < p->ldx; c++)
      if (r >= rows || c >= k) {
        if (fp8)
          ((uint8_t *)p->x)[r * p->ldx + c] = X_FP8_POISON;
        else
          ((uint16_t *)p->x)[r * p->ldx + c] = X_BF16_POISON;
      }
  for (int64_t i = 0; i < p->max_rows * L; i++)
    p->x_scale[i] = i / L >= rows ? NAN : (float)(0.5 + test_rng_uniform(rng)) / 64.0f;
  fill_from_table(p->w_all, fp8, g_tables.w_bf16, groups * n * k, rng);
  float *scale_inv = malloc((size_t)(kblocks(n) * L) * sizeof *scale_inv);
  if (!scale_inv) return 0;
  for (int32_t g = 0; fp8 && g < groups; g++) {
    for (int64_t i = 0; i < kblocks(n) * L; i++)
      scale_inv[i] = (float)(0.5 + test_rng_uniform(rng)) / 1280.0f;
    CHECK_OK(ina_gemm_pack_w_scales(scale_inv, n, k, p->ws_all + p->slot[g] * ws_count));
  }
  free(scale_inv);
  for (int64_t i = 0; i < p->max_rows * p->ldy; i++) p->y[i] = p->y_ref[i] = Y_POISON;

  /* Device copies; the pointer arrays point into the device allocations. */
  const void **dw = calloc((size_t)groups, sizeof *dw);
  const float **dws = calloc((size_t)groups, sizeof *dws);
  int ok = dw && dws;
  ok = ok && ina_cuda_malloc(0, (size_t)(groups + 1) * 4, (void **)&p->d_offsets) == INA_OK;
  ok = ok && ina_cuda_malloc(0, x_bytes, &p->d_x) == INA_OK;
  ok = ok && ina_cuda_malloc(0, xs_bytes + 4, &p->d_x_scale) == INA_OK;
  ok = ok && ina_cuda_malloc(0, (size_t)(groups * w_bytes), &p->d_w_all) == INA_OK;
  ok = ok && ina_cuda_malloc(0, (size_t)(groups * ws_count) * 4, &p->d_ws_all) == INA_OK;
  ok = ok && ina_cuda_malloc(0, (size_t)groups * sizeof(void *), &p->d_w) == INA_OK;
  ok = ok && ina_cuda_malloc(0, (size_t)groups * sizeof(void *), &p->d_w_scale) == INA_OK;
  ok = ok && ina_cuda_malloc(0, y_bytes, &p->d_y) == INA_OK;
  for (int32_t g = 0; ok && g < groups; g++) {
    p->w[g] = byte_ptr(p->w_all, p->slot[g] * w_bytes);
    dw[g] = byte_ptr(p->d_w_all, p->slot[g] * w_bytes);
    p->w_scale[g] = fp8 ? p->ws_all + p->slot[g] * ws_count : NULL;
    dws[g] = fp8 ? (const float *)p->d_ws_all + p->slot[g] * ws_count : NULL;
  }
  ok = ok && ina_cuda_memcpy_h2d(p->d_offsets, p->offsets, (size_t)(groups + 1) * 4) == INA_OK;
  ok = ok && ina_cuda_memcpy_h2d(p->d_x, p->x, x_bytes) == INA_OK;
  ok = ok && ina_cuda_memcpy_h2d(p->d_x_scale, p->x_scale, xs_bytes) == INA_OK;
  ok = ok && ina_cuda_memcpy_h2d(p->d_w_all, p->w_all, (size_t)(groups * w_bytes)) == INA_OK;
  ok = ok && ina_cuda_memcpy_h2d(p->d_ws_all, p->ws_all, (size_t)(groups * ws_count) * 4) ==
                 INA_OK;
  ok = ok && ina_cuda_memcpy_h2d(p->d_w, dw, (size_t)groups * sizeof(void *)) == INA_OK;
  ok = ok && ina_cuda_memcpy_h2d(p->d_w_scale, dws, (size_t)groups * sizeof(void *)) == INA_OK;
  ok = ok && ina_cuda_memcpy_h2d(p->d_y, p->y, y_bytes) == INA_OK;
  free(dw), free(dws);
  return ok;
}

static ina_gemm_grouped_args_t device_args(const problem_t *p) {
  ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
  a.mode = p->mode;
  a.num_groups = p->groups;
  a.max_rows = p->max_rows;
  a.n = p->n, a.k = p->k;
  a.offsets = p->d_offsets;
  a.x = p->d_x, a.ldx = p->ldx;
  a.x_scale = p->mode == INA_GEMM_FP8_BLOCK ? p->d_x_scale : NULL;
  a.w = p->d_w;
  a.w_scale = p->mode == INA_GEMM_FP8_BLOCK ? p->d_w_scale : NULL;
  a.y = p->d_y, a.ldy = p->ldy;
  return a;
}

/* The reference of row r of group g alone: a one-row, one-group grouped GEMM. */
static void ref_row(const problem_t *p, int32_t g, int64_t r) {
  int32_t offsets[2] = {0, 1};
  ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
  a.mode = p->mode, a.num_groups = 1, a.max_rows = 1, a.n = p->n, a.k = p->k;
  a.offsets = offsets;
  a.x = byte_ptr(p->x, r * p->ldx * (int64_t)p->xsize);
  a.x_scale = p->x_scale + r * kblocks(p->k);
  a.w = &p->w[g];
  a.w_scale = &p->w_scale[g];
  a.y = p->y_ref + r * p->ldy;
  CHECK_OK(ina_gemm_grouped_ref(&a));
}

static int32_t group_of(const problem_t *p, int64_t r) {
  int32_t g = 0;
  while (p->offsets[g + 1] <= r) g++;
  return g;
}

/* Reads y back and checks it (see the header comment). */
static void check_output(const char *what, problem_t *p, test_rng_t *rng) {
  const int64_t routed = p->offsets[p->groups], n = p->n;
  float *got = malloc((size_t)n * sizeof *got), *want = malloc((size_t)n * sizeof *want);
  int64_t *rows = malloc((size_t)(routed + SAMPLED_ROWS) * sizeof *rows);
  CHECK(got && want && rows);
  if (!got || !want || !rows) goto done;
  CHECK_OK(ina_cuda_memcpy_d2h(p->y, p->d_y, (size_t)(p->max_rows * p->ldy) * 2));
  int64_t changed = 0, nonfinite = 0;
  for (int64_t r = 0; r < p->max_rows; r++)
    for (int64_t c = 0; c < p->ldy; c++) {
      const uint16_t v = p->y[r * p->ldy + c];
      if (r < routed && c < n)
        nonfinite += !isfinite(ina_bf16_to_f32(v));
      else
        changed += v != Y_POISON;
    }
  CHECKF(changed == 0, "%s: %lld values outside the output changed", what, (long long)changed);
  CHECKF(nonfinite == 0, "%s: %lld outputs not finite (unwritten?)", what, (long long)nonfinite);

  /* The rows to compare: all, or a sample with the first and last row of some groups. */
  int64_t count = 0;
  if (routed * n * p->k <= FULL_CHECK_MACS) {
    for (int64_t r = 0; r < routed; r++) rows[count++] = r;
  } else {
    for (int i = 0; i < SAMPLED_ROWS / 2; i++) {
      const int32_t g = group_of(p, test_rng_int(rng, 0, routed - 1));
      rows[count++] = p->offsets[g];
      rows[count++] = p->offsets[g + 1] - 1;
    }
  }
  double worst = 0;
  for (int64_t i = 0; i < count; i++) {
    const int64_t r = rows[i];
    ref_row(p, group_of(p, r), r);
    for (int64_t j = 0; j < n; j++) {
      got[j] = ina_bf16_to_f32(p->y[r * p->ldy + j]);
      want[j] = ina_bf16_to_f32(p->y_ref[r * p->ldy + j]);
    }
    const double err = test_rel_l2(got, want, (size_t)n);
    if (!(err <= worst)) worst = err;
  }
  g_rows_compared += count;
  CHECKF(worst <= ROW_TOL, "%s: worst per-row relative L2 error %.3g over %lld rows", what, worst,
         (long long)count);
  if (!(worst <= g_worst_row_err)) g_worst_row_err = worst;
  printf("  %-78s rows %5lld compared %5lld worst %.2e\n", what, (long long)routed,
         (long long)count, worst);
done:
  free(got), free(want), free(rows);
}

static void describe(char *buf, size_t size, const problem_t *p, const char *tag) {
  snprintf(buf, size, "%s %s G %d n %lld k %lld max_rows %lld ldx %lld ldy %lld",
           p->mode == INA_GEMM_FP8_BLOCK ? "fp8" : "bf16", tag, (int)p->groups, (long long)p->n,
           (long long)p->k, (long long)p->max_rows, (long long)p->ldx, (long long)p->ldy);
}

/* One case with the tile ina_gemm_grouped_run picks (tile_m 0) or the given one, in the
 * given grid order. */
static void run_case_tile(ina_gemm_mode_t mode, int32_t groups, int64_t n, int64_t k, int64_t rows,
                          int64_t spare_rows, int64_t pad_x, int64_t pad_y, spread_t spread,
                          int32_t tile_m, int32_t tile_n, int32_t n_fastest, test_rng_t *rng) {
  static const char *spread_names[] = {"random", "one-group", "skewed", "sparse", "even"};
  problem_t p;
  char what[160], tag[48];
  const int ok = problem_make(&p, mode, groups, n, k, rows, spare_rows, pad_x, pad_y, spread, rng);
  if (tile_m)
    snprintf(tag, sizeof tag, "%s tile %dx%d%s", spread_names[spread], (int)tile_m, (int)tile_n,
             n_fastest ? " n-fastest" : "");
  else
    snprintf(tag, sizeof tag, "%s", spread_names[spread]);
  describe(what, sizeof what, &p, tag);
  CHECKF(ok, "%s: setup failed", what);
  if (ok) {
    const ina_gemm_grouped_args_t a = device_args(&p);
    if (tile_m) {
#ifdef INA_HAVE_CUDA
      ina_gemm_grouped_tiles_t tiles;
      CHECK_OK(ina_gemm_grouped_tiles_fixed(p.max_rows, groups, n, tile_m, tile_n, &tiles));
      tiles.n_fastest = n_fastest;
      CHECK_OK(ina_gemm_grouped_run_tiles(&a, &tiles));
#endif
    } else {
      CHECK_OK(ina_gemm_grouped_run(&a));
    }
    CHECK_OK(ina_cuda_synchronize());
    check_output(what, &p, rng);
  }
  problem_free(&p);
}

static void run_case(ina_gemm_mode_t mode, int32_t groups, int64_t n, int64_t k, int64_t rows,
                     int64_t spare_rows, int64_t pad_x, int64_t pad_y, spread_t spread,
                     test_rng_t *rng) {
  run_case_tile(mode, groups, n, k, rows, spare_rows, pad_x, pad_y, spread, 0, 0, 0, rng);
}

/* Every tile the kernel has, forced, in both grid orders, on ragged shapes and spreads
 * that fill every slot; then the DeepSeek-V2-Lite decode shapes at one and eight tokens
 * (max_rows 6 and 48) with the picked tile (32 or 64 weight rows at one token, 128 at
 * eight). */
static void test_tiles(test_rng_t *rng) {
  static const int32_t tiles[][3] = {{16, 128, 0}, {16, 128, 1}, {16, 64, 1},
                                     {16, 32, 0},  {16, 32, 1},  {64, 128, 0}, {64, 128, 1}};
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const ina_gemm_mode_t mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
    const int64_t n = fp8 ? 144 : 200, k = fp8 ? 272 : 136, pad = fp8 ? 16 : 8;
    printf("%s, forced tiles:\n", fp8 ? "fp8" : "bf16");
    for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
      const int32_t tm = tiles[t][0], tn = tiles[t][1], order = tiles[t][2];
      run_case_tile(mode, 3, n, k, 50, 13, pad, pad, SPREAD_RANDOM, tm, tn, order, rng);
      run_case_tile(mode, 64, n, k, 64, 0, 0, 0, SPREAD_EVEN, tm, tn, order, rng);
      run_case_tile(mode, 8, n, k, 200, 5, 0, pad, SPREAD_SKEWED, tm, tn, order, rng);
      run_case_tile(mode, 64, 256, 512, 6, 2, pad, 0, SPREAD_RANDOM, tm, tn, order, rng);
    }
    printf("%s, DeepSeek-V2-Lite decode:\n", fp8 ? "fp8" : "bf16");
    run_case(mode, 64, 1408, 2048, 6, 0, 0, 0, SPREAD_RANDOM, rng);
    run_case(mode, 64, 2816, 2048, 6, 0, 0, pad, SPREAD_RANDOM, rng);
    run_case(mode, 64, 2048, 1408, 6, 0, pad, 0, SPREAD_RANDOM, rng);
    run_case(mode, 64, 1408, 2048, 48, 0, 0, 0, SPREAD_RANDOM, rng);
  }
}

static void test_shapes(test_rng_t *rng) {
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const ina_gemm_mode_t mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
    const int64_t n = fp8 ? 144 : 48, k = fp8 ? 272 : 80, pad = fp8 ? 16 : 8;
    printf("%s:\n", fp8 ? "fp8" : "bf16");
    run_case(mode, 1, n, k, 37, 0, 0, 0, SPREAD_RANDOM, rng);
    run_case(mode, 1, n, k, 300, 21, pad, pad, SPREAD_RANDOM, rng); /* 64-row tiles */
    run_case(mode, 3, n, k, 50, 13, pad, pad, SPREAD_RANDOM, rng);
    run_case(mode, 3, n, k, 41, 0, 0, pad, SPREAD_ONE_GROUP, rng);
    run_case(mode, 3, n, k, 195, 0, pad, 0, SPREAD_EVEN, rng); /* 3 x 65 rows: every slot */
    run_case(mode, 3, n, k, 200, 5, 0, pad, SPREAD_SKEWED, rng);
    run_case(mode, 64, n, k, 64, 0, 0, 0, SPREAD_EVEN, rng); /* 1 row each: every slot */
    run_case(mode, 64, n, k, 384, 16, pad, 0, SPREAD_SPARSE, rng);
    run_case(mode, 64, n, k, 700, 3, 0, 0, SPREAD_SKEWED, rng);
    run_case(mode, 64, 16 * test_rng_int(rng, 1, 40), 16 * test_rng_int(rng, 1, 40),
             test_rng_int(rng, 0, 500), test_rng_int(rng, 0, 20), pad * test_rng_int(rng, 0, 2),
             pad * test_rng_int(rng, 0, 2), (spread_t)test_rng_int(rng, 0, 4), rng);
    /* DeepSeek-V2-Lite experts: decode (64 tokens x top-6 over 64 experts) and prefill. */
    run_case(mode, 64, 1408, 2048, 384, 16, 0, 0, SPREAD_RANDOM, rng);
    run_case(mode, 64, 2048, 1408, 384, 0, pad, pad, SPREAD_SKEWED, rng);
    run_case(mode, 64, 2048, 1408, 384, 0, 0, 0, SPREAD_ONE_GROUP, rng);
    run_case(mode, 3, 1408, 2048, 61, 2, 0, pad, SPREAD_RANDOM, rng);
    run_case(mode, 64, 1408, 2048, 4096, 0, 0, 0, SPREAD_RANDOM, rng);
  }
}

/* Offsets that break the contract must not move writes outside [0, max_rows): y has
 * extra rows past max_rows, poisoned, and the run must leave them so without a fault. */
static void test_bad_offsets(test_rng_t *rng) {
  problem_t p;
  const int ok = problem_make(&p, INA_GEMM_BF16, 4, 64, 64, 40, 8, 0, 0, SPREAD_RANDOM, rng);
  CHECK(ok);
  if (ok) {
    const int32_t bad[5] = {0, 30, 10, 70, -5};
    ina_gemm_grouped_args_t a = device_args(&p);
    a.max_rows = 40; /* the buffers hold 48 rows */
    CHECK_OK(ina_cuda_memcpy_h2d(p.d_offsets, bad, sizeof bad));
    CHECK_OK(ina_gemm_grouped_run(&a));
    CHECK_OK(ina_cuda_synchronize());
    CHECK_OK(ina_cuda_memcpy_d2h(p.y, p.d_y, (size_t)(p.max_rows * p.ldy) * 2));
    int64_t changed = 0;
    for (int64_t i = 40 * p.ldy; i < p.max_rows * p.ldy; i++) changed += p.y[i] != Y_POISON;
    CHECKF(changed == 0, "bad offsets: %lld values past max_rows changed", (long long)changed);
  }
  problem_free(&p);
}

#ifdef INA_HAVE_CUDA
/* Re-poisons y on the device and copies new offsets into the captured buffer. */
static int set_offsets(problem_t *p, const int32_t *offsets) {
  memcpy(p->offsets, offsets, (size_t)(p->groups + 1) * sizeof *offsets);
  for (int64_t i = 0; i < p->max_rows * p->ldy; i++) p->y[i] = Y_POISON;
  return cudaMemcpy(p->d_offsets, offsets, (size_t)(p->groups + 1) * 4, cudaMemcpyHostToDevice) ==
             cudaSuccess &&
         cudaMemcpy(p->d_y, p->y, (size_t)(p->max_rows * p->ldy) * 2, cudaMemcpyHostToDevice) ==
             cudaSuccess;
}

/* One bf16 and one FP8 grouped run captured once, both reading one offsets buffer, then
 * replayed with new offsets written into that buffer before each replay. */
static void test_graph(test_rng_t *rng) {
  problem_t p16, p8;
  cudaStream_t stream = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  const int32_t groups = 8;
  const int64_t max_rows = 200;
  int32_t offsets[9];
  const int ok = problem_make(&p16, INA_GEMM_BF16, groups, 200, 136, max_rows, 0, 8, 8,
                              SPREAD_RANDOM, rng) &&
                 problem_make(&p8, INA_GEMM_FP8_BLOCK, groups, 256, 512, max_rows, 0, 0, 16,
                              SPREAD_RANDOM, rng);
  CHECK(ok);
  if (!ok) goto done;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  if (!stream) goto done;
  ina_gemm_grouped_args_t a16 = device_args(&p16), a8 = device_args(&p8);
  a8.offsets = p16.d_offsets; /* one routing for both, as in a MoE layer */
  a16.stream = a8.stream = stream;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) == cudaSuccess);
  CHECK_OK(ina_gemm_grouped_run(&a16));
  CHECK_OK(ina_gemm_grouped_run(&a8));
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  CHECK(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  if (!exec) goto done;
  static const char *names[] = {"random 150 rows", "one group, 200 rows", "no rows",
                                "sparse, all 200 rows", "random 37 rows"};
  for (int replay = 0; replay < 5; replay++) {
    switch (replay) {
      case 0: make_offsets(offsets, groups, 150, SPREAD_RANDOM, rng); break;
      case 1: make_offsets(offsets, groups, 200, SPREAD_ONE_GROUP, rng); break;
      case 2: make_offsets(offsets, groups, 0, SPREAD_RANDOM, rng); break;
      case 3: make_offsets(offsets, groups, 200, SPREAD_SPARSE, rng); break;
      default: make_offsets(offsets, groups, 37, SPREAD_SKEWED, rng); break;
    }
    CHECK(set_offsets(&p16, offsets) && set_offsets(&p8, offsets));
    CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    char what[160], base[100];
    describe(base, sizeof base, &p16, "graph");
    snprintf(what, sizeof what, "%s replay %s", base, names[replay]);
    check_output(what, &p16, rng);
    describe(base, sizeof base, &p8, "graph");
    snprintf(what, sizeof what, "%s replay %s", base, names[replay]);
    check_output(what, &p8, rng);
  }
done:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (stream) cudaStreamDestroy(stream);
  problem_free(&p16), problem_free(&p8);
}
#endif

/* Device-side refusals (the host test covers the rest of the checks). */
static void test_arguments(void) {
  void *buf = NULL;
  CHECK_OK(ina_cuda_malloc(0, 4096, &buf));
  if (!buf) return;
  const void *const *w = (const void *const *)buf;
  ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
  a.mode = INA_GEMM_BF16, a.num_groups = 2, a.max_rows = 4, a.n = 64, a.k = 64;
  a.offsets = (const int32_t *)buf, a.x = buf, a.w = w, a.y = (uint16_t *)buf;
  ina_log_set_quiet_errors(1);
  a.x = (const char *)buf + 8;
  CHECK(ina_gemm_grouped_run(&a) == INA_ERR_INVALID_ARGUMENT);
  a.x = buf, a.mode = INA_GEMM_FP8_BLOCK;
  CHECK(ina_gemm_grouped_run(&a) == INA_ERR_INVALID_ARGUMENT); /* no scales */
  ina_log_set_quiet_errors(0);
  a.max_rows = 0;
  CHECK_OK(ina_gemm_grouped_run(&a));
  CHECK_OK(ina_cuda_synchronize());
  ina_cuda_free(buf);
}

/* An expert-parallel rank's share: groups [first, first + count) of a layer, their
 * offsets read where they lie, tiles planned for every group (plan_groups): each of the
 * share's rows must equal the whole layer's run bit for bit, and no other row is written.
 * Then the same with scattered slots (row_ends): groups in another order, with gaps and
 * empty slots between them. */
static void test_share(test_rng_t *rng) {
  static const struct {
    ina_gemm_mode_t mode;
    int64_t rows;
    int32_t first, count;
  } cases[] = {{INA_GEMM_BF16, 6, 0, 32},  {INA_GEMM_BF16, 6, 32, 32}, {INA_GEMM_FP8_BLOCK, 6, 21, 22},
               {INA_GEMM_BF16, 48, 32, 32}, {INA_GEMM_FP8_BLOCK, 48, 0, 32}, {INA_GEMM_FP8_BLOCK, 384, 48, 16}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int32_t groups = 64, first = cases[c].first, count = cases[c].count;
    const int64_t n = 1408, k = 2048, rows = cases[c].rows;
    problem_t p;
    char what[160];
    snprintf(what, sizeof what, "%s share [%d, %d) of %d groups, %lld rows",
             cases[c].mode == INA_GEMM_FP8_BLOCK ? "fp8" : "bf16", (int)first, (int)(first + count), (int)groups,
             (long long)rows);
    if (!problem_make(&p, cases[c].mode, groups, n, k, rows, 0, 0, 0, SPREAD_RANDOM, rng)) {
      CHECKF(0, "%s: setup failed", what);
      problem_free(&p);
      continue;
    }
    const size_t y_bytes = (size_t)(p.max_rows * p.ldy) * 2;
    uint16_t *whole = malloc(y_bytes + 2);
    ina_gemm_grouped_args_t a = device_args(&p);
    CHECK_OK(ina_gemm_grouped_run(&a));
    CHECK_OK(ina_cuda_synchronize());
    if (whole) CHECK_OK(ina_cuda_memcpy_d2h(whole, p.d_y, y_bytes));
    CHECK_OK(ina_cuda_memcpy_h2d(p.d_y, p.y_ref, y_bytes)); /* poisoned again */
    a.num_groups = count;
    a.plan_groups = groups;
    a.offsets = p.d_offsets + first;
    a.w = (const void *const *)p.d_w + first;
    if (cases[c].mode == INA_GEMM_FP8_BLOCK) a.w_scale = (const float *const *)p.d_w_scale + first;
    CHECK_OK(ina_gemm_grouped_run(&a));
    CHECK_OK(ina_cuda_synchronize());
    CHECK_OK(ina_cuda_memcpy_d2h(p.y, p.d_y, y_bytes));
    int64_t wrong = 0, touched = 0;
    const int64_t begin = p.offsets[first], end = p.offsets[first + count];
    for (int64_t r = 0; r < p.max_rows && whole; r++) {
      const int mine = r >= begin && r < end;
      for (int64_t j = 0; j < p.n; j++) {
        const uint16_t v = p.y[r * p.ldy + j];
        if (mine) wrong += v != whole[r * p.ldy + j];
        else touched += v != Y_POISON;
      }
    }
    CHECKF(whole && wrong == 0, "%s: %lld values differ from the whole layer's", what, (long long)wrong);
    CHECKF(touched == 0, "%s: %lld values written outside the share's rows", what, (long long)touched);
    a.plan_groups = count - 1;
    ina_log_set_quiet_errors(1);
    CHECK(ina_gemm_grouped_run(&a) == INA_ERR_INVALID_ARGUMENT);
    ina_log_set_quiet_errors(0);
    /* Scattered slots (row_ends): every other group of the share, in reverse order, with
     * an empty slot (no rows, no weight) between them. */
    {
      const int32_t slots = count + 1;
      int32_t *begins = malloc((size_t)slots * 4), *ends = malloc((size_t)slots * 4);
      const void **w = calloc((size_t)slots, sizeof *w);
      const float **ws = calloc((size_t)slots, sizeof *ws);
      int32_t *d_begins = NULL, *d_ends = NULL;
      void *d_w = NULL, *d_ws = NULL;
      int32_t used = 0;
      uint8_t *picked = calloc((size_t)groups, 1);
      const void **dw_all = calloc((size_t)groups, sizeof *dw_all);
      const float **dws_all = calloc((size_t)groups, sizeof *dws_all);
      if (begins && ends && w && ws && picked && dw_all && dws_all &&
          ina_cuda_memcpy_d2h(dw_all, p.d_w, (size_t)groups * sizeof *dw_all) == INA_OK &&
          ina_cuda_memcpy_d2h(dws_all, p.d_w_scale, (size_t)groups * sizeof *dws_all) == INA_OK) {
        for (int32_t g = first + count - 1; g >= first; g -= 2) {
          begins[used] = p.offsets[g];
          ends[used] = p.offsets[g + 1];
          w[used] = dw_all[g];
          ws[used] = dws_all[g];
          picked[g] = 1;
          used++;
          begins[used] = ends[used] = 0; /* an empty slot */
          used++;
          if (used + 2 > slots) break;
        }
        CHECK_OK(ina_cuda_malloc(0, (size_t)used * 4, (void **)&d_begins));
        CHECK_OK(ina_cuda_malloc(0, (size_t)used * 4, (void **)&d_ends));
        CHECK_OK(ina_cuda_malloc(0, (size_t)used * sizeof(void *), &d_w));
        CHECK_OK(ina_cuda_malloc(0, (size_t)used * sizeof(void *), &d_ws));
        CHECK_OK(ina_cuda_memcpy_h2d(d_begins, begins, (size_t)used * 4));
        CHECK_OK(ina_cuda_memcpy_h2d(d_ends, ends, (size_t)used * 4));
        CHECK_OK(ina_cuda_memcpy_h2d(d_w, w, (size_t)used * sizeof(void *)));
        CHECK_OK(ina_cuda_memcpy_h2d(d_ws, ws, (size_t)used * sizeof(void *)));
        CHECK_OK(ina_cuda_memcpy_h2d(p.d_y, p.y_ref, y_bytes)); /* poisoned again */
        a.num_groups = used;
        a.plan_groups = groups;
        a.offsets = d_begins;
        a.row_ends = d_ends;
        a.w = (const void *const *)d_w;
        if (cases[c].mode == INA_GEMM_FP8_BLOCK) a.w_scale = (const float *const *)d_ws;
        CHECK_OK(ina_gemm_grouped_run(&a));
        CHECK_OK(ina_cuda_synchronize());
        CHECK_OK(ina_cuda_memcpy_d2h(p.y, p.d_y, y_bytes));
        wrong = touched = 0;
        for (int32_t g = 0; g < groups && whole; g++)
          for (int64_t r = p.offsets[g]; r < p.offsets[g + 1]; r++)
            for (int64_t j = 0; j < p.n; j++) {
              const uint16_t v = p.y[r * p.ldy + j];
              if (picked[g]) wrong += v != whole[r * p.ldy + j];
              else touched += v != Y_POISON;
            }
        CHECKF(whole && wrong == 0, "%s, scattered slots: %lld values differ from the whole layer's", what,
               (long long)wrong);
        CHECKF(touched == 0, "%s, scattered slots: %lld values written outside the slots' rows", what,
               (long long)touched);
      } else {
        CHECK(0);
      }
      ina_cuda_free(d_begins), ina_cuda_free(d_ends), ina_cuda_free(d_w), ina_cuda_free(d_ws);
      free(begins), free(ends), free(w), free(ws), free(picked), free(dw_all), free(dws_all);
    }
    free(whole);
    problem_free(&p);
  }
}

int main(void) {
  const int skip = test_require_gpus("test_gemm_grouped_gpu", 1);
  if (skip) return skip;
  test_rng_t rng = {test_seed("test_gemm_grouped_gpu")};
  char name[128];
  printf("device: %s\n", ina_cuda_device_name(0, name, sizeof name));
  tables_init(&rng);
  test_arguments();
  test_shapes(&rng);
  test_tiles(&rng);
  test_bad_offsets(&rng);
  test_share(&rng);
#ifdef INA_HAVE_CUDA
  test_graph(&rng);
#endif
  printf("test_gemm_grouped_gpu: %lld rows compared, worst per-row relative L2 error %.3g "
         "(bound %.0e)\n",
         (long long)g_rows_compared, g_worst_row_err, ROW_TOL);
  return test_finish("test_gemm_grouped_gpu");
}
