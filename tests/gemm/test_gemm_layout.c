/* Host-side logic of gemm/: the FP8 scale layouts (weight-scale packing, the activation-
 * scale index and packing), the FP8 and small-M kernels' launch plans, which GEMMs the
 * small-M kernel takes and which AUTO gives it, argument checks, and the CPU
 * reference against an independent computation from ina_fp8_dequantize_blocks. Runs
 * everywhere; also checks that the device entry points refuse cleanly without a device. */

#include "core/cuda.h"
#include "core/dtype.h"
#include "core/log.h"
#include "gemm/gemm.h"
#include "gemm/gemm_internal.h"
#include "gemm/gemm_scale_layout.h"
#include "tests/test_util.h"

static int64_t kblocks(int64_t k) { return (k + 127) / 128; }

static void test_w_scales(test_rng_t *rng) {
  static const int64_t shapes[][2] = {{7168, 2048},  {4096, 7168}, {2048, 7168}, {24576, 1536},
                                      {7168, 16384}, {128, 128},   {16, 16},     {1040, 2112},
                                      {300, 640},    {256, 384}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int64_t n = shapes[i][0], k = shapes[i][1];
    const int64_t rb = kblocks(n), kb = kblocks(k), kb4 = (kb + 3) / 4 * 4;
    CHECKF(ina_gemm_w_scale_count(n, k) == rb * kb4, "[%lld, %lld]: %lld scales", (long long)n,
           (long long)k, (long long)ina_gemm_w_scale_count(n, k));
    float *src = malloc((size_t)(rb * kb) * sizeof *src);
    float *dst = malloc((size_t)(rb * kb4) * sizeof *dst);
    CHECK(src && dst);
    if (!src || !dst) goto next;
    for (int64_t j = 0; j < rb * kb; j++) src[j] = (float)(test_rng_uniform(rng) + 0.01);
    for (int64_t j = 0; j < rb * kb4; j++) dst[j] = NAN;
    CHECK_OK(ina_gemm_pack_w_scales(src, n, k, dst));
    int64_t bad = 0;
    for (int64_t r = 0; r < rb; r++)
      for (int64_t c = 0; c < kb4; c++)
        bad += c < kb ? dst[r * kb4 + c] != src[r * kb + c] : dst[r * kb4 + c] != 0.0f;
    CHECKF(bad == 0, "[%lld, %lld]: %lld packed scales wrong", (long long)n, (long long)k,
           (long long)bad);
    /* K a multiple of 512: the checkpoint layout is already cuBLASLt's. */
    if (k % 512 == 0) CHECK(memcmp(src, dst, (size_t)(rb * kb) * sizeof *src) == 0);
  next:
    free(src);
    free(dst);
  }
  CHECK(ina_gemm_w_scale_count(0, 128) == 0 && ina_gemm_w_scale_count(128, -1) == 0);
  ina_log_set_quiet_errors(1);
  float one = 1.0f;
  CHECK(ina_gemm_pack_w_scales(NULL, 128, 128, &one) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gemm_pack_w_scales(&one, 0, 128, &one) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
}

/* The activation-scale layout: a bijection onto [0, m L); rows below m & ~3 M-major with
 * column stride m & ~3 (what cuBLASLt reads), the rest M-major after them. */
static void check_x_layout(int64_t m, int64_t k, test_rng_t *rng) {
  const int64_t L = kblocks(k), m4 = m & ~(int64_t)3, count = m * L;
  CHECK(ina_gemm_x_scale_count(m, k) == count);
  unsigned char *seen = calloc((size_t)count, 1);
  float *rows = malloc((size_t)count * sizeof *rows),
        *packed = malloc((size_t)count * sizeof *packed);
  CHECK(seen && rows && packed);
  if (!seen || !rows || !packed) goto done;
  int64_t bad = 0;
  for (int64_t r = 0; r < m; r++)
    for (int64_t b = 0; b < L; b++) {
      const int64_t i = ina_gemm_x_scale_index(m, k, r, b);
      const int64_t want = r < m4 ? b * m4 + r : m4 * L + b * (m - m4) + (r - m4);
      if (i != want || i < 0 || i >= count || seen[i]) {
        bad++;
        continue;
      }
      seen[i] = 1;
    }
  CHECKF(bad == 0, "x scales m %lld k %lld: %lld bad indices", (long long)m, (long long)k,
         (long long)bad);
  CHECK(ina_gemm_x_scale_index(m, k, m, 0) == -1 && ina_gemm_x_scale_index(m, k, 0, L) == -1 &&
        ina_gemm_x_scale_index(m, k, -1, 0) == -1);
  for (int64_t i = 0; i < count; i++) rows[i] = (float)test_rng_uniform(rng);
  CHECK_OK(ina_gemm_pack_x_scales(rows, m, k, packed));
  bad = 0;
  for (int64_t r = 0; r < m; r++)
    for (int64_t b = 0; b < L; b++)
      bad += packed[ina_gemm_x_scale_index(m, k, r, b)] != rows[r * L + b];
  CHECKF(bad == 0, "x scales m %lld k %lld: %lld packed wrong", (long long)m, (long long)k,
         (long long)bad);
done:
  free(seen);
  free(rows);
  free(packed);
}

static void test_x_scales(test_rng_t *rng) {
  static const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 64, 65, 127, 300};
  static const int64_t ks[] = {16, 128, 144, 2048, 2112};
  for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
    for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) check_x_layout(ms[i], ks[j], rng);
  for (int r = 0; r < 20; r++)
    check_x_layout(test_rng_int(rng, 1, 500), 16 * test_rng_int(rng, 1, 300), rng);
}

static void test_plan(test_rng_t *rng) {
  const size_t partial_bytes = (size_t)8 << 20;
  ina_gemm_kernel_plan_t plan;
  /* Decode on DeepSeek-V3 shapes: about two CTAs per SM, at least two K blocks each. */
  static const int64_t shapes[][2] = {
      {7168, 2048}, {4096, 7168}, {2048, 7168}, {24576, 1536}, {7168, 16384}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int64_t n = shapes[i][0], k = shapes[i][1];
    CHECK_OK(ina_gemm_kernel_plan(1, n, k, 132, partial_bytes, 1024, &plan));
    const int64_t ctas = plan.tiles_n * plan.tiles_m * plan.splits;
    printf("kernel plan m 1, n %lld, k %lld: tile %d, %lld x %lld tiles, split-K %d, %lld CTAs\n",
           (long long)n, (long long)k, plan.tile_m, (long long)plan.tiles_n,
           (long long)plan.tiles_m, plan.splits, (long long)ctas);
    CHECK(plan.tile_m == 8 && plan.tiles_n == n / 128 && plan.tiles_m == 1);
    CHECK(ctas >= 132);
    CHECK(plan.splits == 1 || kblocks(k) / plan.splits >= 2);
  }
  for (int r = 0; r < 2000; r++) {
    const int64_t rows = test_rng_int(rng, 1, 5000), n = 16 * test_rng_int(rng, 1, 2000);
    const int64_t k = 16 * test_rng_int(rng, 1, 1200);
    const int sms = (int)test_rng_int(rng, 1, 200);
    const size_t bytes = (size_t)test_rng_int(rng, 0, 16 << 20);
    const int64_t max_tiles = test_rng_int(rng, 1, 2048);
    CHECK_OK(ina_gemm_kernel_plan(rows, n, k, sms, bytes, max_tiles, &plan));
    const int64_t tiles = plan.tiles_n * plan.tiles_m;
    const int ok =
        (plan.tile_m == 8 || plan.tile_m == 16 || plan.tile_m == 32) &&
        (plan.tile_m == 32 || rows <= plan.tile_m) && plan.tiles_m * plan.tile_m >= rows &&
        (plan.tiles_m - 1) * plan.tile_m < rows && plan.tiles_n * 128 >= n &&
        (plan.tiles_n - 1) * 128 < n && plan.splits >= 1 &&
        plan.splits <= INA_GEMM_KERNEL_MAX_SPLITS &&
        (plan.splits == 1 || (tiles < sms && tiles <= max_tiles && kblocks(k) / plan.splits >= 2 &&
                              (size_t)(tiles * plan.splits * plan.tile_m * 128 * 4) <= bytes));
    CHECKF(ok, "plan rows %lld n %lld k %lld sms %d bytes %zu: tile %d splits %d", (long long)rows,
           (long long)n, (long long)k, sms, bytes, plan.tile_m, plan.splits);
  }
  ina_log_set_quiet_errors(1);
  CHECK(ina_gemm_kernel_plan((int64_t)1 << 30, 128, 128, 132, partial_bytes, 1024, &plan) ==
        INA_ERR_UNSUPPORTED);
  CHECK(ina_gemm_kernel_plan(0, 128, 128, 132, partial_bytes, 1024, &plan) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
}

/* The small-M kernel's plan: the K slices cover K exactly once in whole batches, a split
 * launch fits the workspace, and on the DeepSeek-V2-Lite decode shapes the warps that
 * stream reach the target per SM whenever K has that many batches. */
static void check_small_m_plan(const ina_gemm_small_m_plan_t *plan, int64_t n, int64_t k_bytes,
                               size_t bytes, int64_t max_tiles, const char *what) {
  const int64_t units = (k_bytes + INA_GEMM_SMALL_M_UNIT_BYTES - 1) / INA_GEMM_SMALL_M_UNIT_BYTES;
  const int64_t slices = (int64_t)plan->warps * plan->splits;
  const int ok =
      plan->warps >= 1 && plan->warps <= INA_GEMM_SMALL_M_MAX_WARPS && plan->splits >= 1 &&
      plan->tiles == (n + 15) / 16 && plan->units_per_warp > 0 &&
      plan->units_per_warp % INA_GEMM_SMALL_M_BATCH_UNITS == 0 &&
      slices * plan->units_per_warp >= units && /* every unit has a warp */
      (slices - 1) * plan->units_per_warp < units + INA_GEMM_SMALL_M_BATCH_UNITS * slices &&
      (plan->splits == 1 ||
       (plan->tiles <= max_tiles && (size_t)(plan->tiles * plan->splits * 128 * 4) <= bytes));
  CHECKF(ok, "%s: n %lld k bytes %lld: %d warps x %d splits, %lld tiles, %lld units per warp",
         what, (long long)n, (long long)k_bytes, plan->warps, plan->splits,
         (long long)plan->tiles, (long long)plan->units_per_warp);
}

static void test_small_m_plan(test_rng_t *rng) {
  const size_t partial_bytes = (size_t)8 << 20;
  ina_gemm_small_m_plan_t plan;
  static const int64_t shapes[][2] = {{3072, 2048}, {576, 2048}, {2048, 2048},
                                      {2816, 2048}, {2048, 1408}, {102400, 2048}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (int esize = 1; esize <= 2; esize++) {
      const int64_t n = shapes[i][0], k_bytes = shapes[i][1] * esize;
      CHECK_OK(ina_gemm_small_m_plan(n, k_bytes, 132, partial_bytes, 1024, &plan));
      check_small_m_plan(&plan, n, k_bytes, partial_bytes, 1024, "V2-Lite");
      const int64_t batches = ((k_bytes + 127) / 128 + 1) / 2;
      const int64_t warps = plan.tiles * plan.warps * plan.splits;
      printf("small-M plan n %6lld k %4lld %s: %lld CTAs of %d warps x %d splits, %lld units per "
             "warp, %lld warps\n",
             (long long)n, (long long)shapes[i][1], esize == 1 ? "fp8 " : "bf16",
             (long long)plan.tiles * plan.splits, plan.warps, plan.splits,
             (long long)plan.units_per_warp, (long long)warps);
      CHECKF(warps >= INA_GEMM_SMALL_M_TARGET_WARPS_PER_SM * 132 ||
                 plan.warps * plan.splits * plan.units_per_warp ==
                     batches * INA_GEMM_SMALL_M_BATCH_UNITS,
             "n %lld: %lld warps stream, below the target, though K has more batches",
             (long long)n, (long long)warps);
      CHECK(plan.pdl == 1);
    }
  for (int r = 0; r < 3000; r++) {
    const int64_t n = test_rng_int(rng, 1, 200000), k_bytes = 16 * test_rng_int(rng, 1, 2000);
    const int sms = (int)test_rng_int(rng, 1, 200);
    const size_t bytes = (size_t)test_rng_int(rng, 0, 16 << 20);
    const int64_t max_tiles = test_rng_int(rng, 1, 2048);
    CHECK_OK(ina_gemm_small_m_plan(n, k_bytes, sms, bytes, max_tiles, &plan));
    check_small_m_plan(&plan, n, k_bytes, bytes, max_tiles, "random");
    const int32_t warps = (int32_t)test_rng_int(rng, 1, 16);
    const int32_t splits = (int32_t)test_rng_int(rng, 1, 8);
    ina_log_set_quiet_errors(1);
    const ina_status_t st =
        ina_gemm_small_m_plan_fixed(n, k_bytes, warps, splits, 0, bytes, max_tiles, &plan);
    ina_log_set_quiet_errors(0);
    const int fits = splits == 1 || ((n + 15) / 16 <= max_tiles &&
                                     (size_t)((n + 15) / 16 * splits * 128 * 4) <= bytes);
    CHECKF(fits ? st == INA_OK : st == INA_ERR_UNSUPPORTED, "fixed plan %d x %d, n %lld: %s",
           warps, splits, (long long)n, ina_status_string(st));
    if (st == INA_OK) {
      check_small_m_plan(&plan, n, k_bytes, bytes, max_tiles, "fixed");
      CHECK(plan.warps == warps && plan.splits == splits && plan.pdl == 0);
    }
  }
  ina_log_set_quiet_errors(1);
  CHECK(ina_gemm_small_m_plan(0, 128, 132, partial_bytes, 1024, &plan) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gemm_small_m_plan_fixed(128, 128, 17, 1, 0, partial_bytes, 1024, &plan) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gemm_small_m_plan_fixed(128, 128, 4, 0, 0, partial_bytes, 1024, &plan) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
}

/* Which GEMMs the small-M kernel takes: 1..8 rows, rows of whole 16-byte pieces, and with
 * operands checked 16-byte aligned x and W and x rows. */
static void test_small_m_fits(void) {
  static uint8_t buf[256] __attribute__((aligned(16)));
  ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
  a.mode = INA_GEMM_BF16, a.n = 100, a.k = 64, a.ldx = 64;
  a.x = buf, a.w = buf;
  for (int64_t m = 0; m <= 10; m++) {
    a.m = m;
    CHECK(ina_gemm_small_m_fits(&a, 1) == (m >= 1 && m <= INA_GEMM_SMALL_M_MAX_ROWS));
  }
  a.m = 3;
  a.k = 60, a.ldx = 64; /* 120-byte rows */
  CHECK(!ina_gemm_small_m_fits(&a, 0));
  a.k = 72, a.ldx = 72;
  CHECK(ina_gemm_small_m_fits(&a, 0) && ina_gemm_small_m_fits(&a, 1));
  a.ldx = 73; /* x rows not 16-byte aligned: only the shape fits */
  CHECK(ina_gemm_small_m_fits(&a, 0) && !ina_gemm_small_m_fits(&a, 1));
  a.ldx = 80, a.x = buf + 2;
  CHECK(!ina_gemm_small_m_fits(&a, 1));
  a.x = buf, a.w = buf + 8;
  CHECK(!ina_gemm_small_m_fits(&a, 1));
  a.mode = INA_GEMM_FP8_BLOCK, a.w = buf, a.k = 16, a.ldx = 32;
  CHECK(ina_gemm_small_m_fits(&a, 1));
  a.k = 8; /* not an FP8 shape, nor whole pieces */
  CHECK(!ina_gemm_small_m_fits(&a, 0));
}

/* AUTO's rule: the small-M kernel for every DeepSeek-V2-Lite projection at M = 1..8, and
 * for the LM head only FP8 with M % 4 != 0 (cuBLASLt won at M = 8 and tied at bf16 M = 1);
 * never beyond 8 rows; the weight-size bound is inclusive. */
static void test_small_m_wins(void) {
  static const int64_t projections[][2] = {{3072, 2048}, {576, 2048}, {2048, 2048},
                                           {2816, 2048}, {2048, 1408}};
  for (int fp8 = 0; fp8 < 2; fp8++) {
    const ina_gemm_mode_t mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
    for (size_t s = 0; s < sizeof projections / sizeof projections[0]; s++)
      for (int64_t m = 0; m <= 10; m++)
        CHECK(ina_gemm_small_m_wins(mode, m, projections[s][0], projections[s][1]) ==
              (m >= 1 && m <= INA_GEMM_SMALL_M_MAX_ROWS));
    for (int64_t m = 1; m <= 10; m++)
      CHECK(ina_gemm_small_m_wins(mode, m, 102400, 2048) ==
            (fp8 && m % 4 != 0 && m <= INA_GEMM_SMALL_M_MAX_ROWS));
    const int64_t esize = fp8 ? 1 : 2, k = 2048;
    const int64_t n_max = INA_GEMM_SMALL_M_MAX_WEIGHT_BYTES / (k * esize);
    CHECK(ina_gemm_small_m_wins(mode, 8, n_max, k));
    CHECK(!ina_gemm_small_m_wins(mode, 8, n_max + 1, k));
  }
}

static void test_args(void) {
  static uint8_t buf[4096] __attribute__((aligned(16)));
  float *scale = (float *)(void *)buf;
  ina_gemm_args_t a = INA_GEMM_ARGS_INIT, out;
  const int all = INA_GEMM_CHECK_POINTERS | INA_GEMM_CHECK_ALIGNMENT;
  a.mode = INA_GEMM_FP8_BLOCK, a.m = 3, a.n = 128, a.k = 256;
  a.x = buf, a.w = buf, a.y = buf, a.x_scale = scale, a.w_scale = scale;
  CHECK_OK(ina_gemm_check_args(&a, "test", all, &out));
  CHECK(out.ldx == 256 && out.ldy == 128 && out.ldr == 128 && out.struct_size == sizeof out);
  ina_log_set_quiet_errors(1);
  CHECK(ina_gemm_check_args(NULL, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  ina_gemm_args_t b = a;
  b.struct_size = 8;
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.mode = (ina_gemm_mode_t)7;
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.n = 136; /* FP8 needs multiples of 16 */
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.k = 200;
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.ldx = 128; /* shorter than a row */
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.x = buf + 1;
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  CHECK_OK(ina_gemm_check_args(&b, "test", INA_GEMM_CHECK_POINTERS, &out)); /* the reference */
  b = a, b.ldx = 264; /* not a multiple of 16 bytes */
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.ldy = 132; /* 264 bytes of bf16 */
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.x_scale = NULL;
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  CHECK_OK(ina_gemm_check_args(&b, "test", 0, &out)); /* query_path: pointers ignored */
  b = a, b.out_dtype = INA_DTYPE_F16;
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.residual = buf, b.ldr = 256; /* in place needs ldr == ldy */
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  b = a, b.mode = INA_GEMM_BF16, b.path = INA_GEMM_PATH_KERNEL;
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_UNSUPPORTED);
  b = a, b.m = -1;
  CHECK(ina_gemm_check_args(&b, "test", all, &out) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  b = a, b.m = 0, b.x = b.w = b.y = NULL, b.x_scale = b.w_scale = NULL;
  CHECK_OK(ina_gemm_check_args(&b, "test", all, &out)); /* nothing to read or write */
  b = a, b.mode = INA_GEMM_BF16, b.n = 131, b.k = 97, b.x = buf + 2, b.x_scale = NULL;
  CHECK_OK(ina_gemm_check_args(&b, "test", all, &out)); /* bf16: any shape and alignment */
}

/* The reference against a computation from ina_fp8_dequantize_blocks' floats (FP8) and
 * from the bf16 values (bf16), with residual, beta and both output dtypes. */
static void test_reference(test_rng_t *rng) {
  static const int64_t shapes[][3] = {
      {1, 16, 16}, {5, 48, 160}, {9, 272, 400}, {4, 128, 256}, {13, 144, 2112}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
    const int64_t L = kblocks(k), rb = kblocks(n);
    float *xf = malloc((size_t)(m * k) * sizeof *xf), *wf = malloc((size_t)(n * k) * sizeof *wf);
    float *xd = malloc((size_t)(m * k) * sizeof *xd), *wd = malloc((size_t)(n * k) * sizeof *wd);
    uint8_t *xq = malloc((size_t)(m * k)), *wq = malloc((size_t)(n * k));
    float *xs_rows = malloc((size_t)(m * L) * sizeof(float)),
          *xs = malloc((size_t)(m * L) * sizeof(float));
    float *ws_rows = malloc((size_t)(rb * L) * sizeof(float));
    float *ws = malloc((size_t)ina_gemm_w_scale_count(n, k) * sizeof(float));
    uint16_t *xb = malloc((size_t)(m * k) * 2), *wb = malloc((size_t)(n * k) * 2);
    float *res = malloc((size_t)(m * n) * sizeof(float)),
          *y = malloc((size_t)(m * n) * sizeof(float));
    uint16_t *y16 = malloc((size_t)(m * n) * 2);
    double *row = malloc((size_t)n * sizeof(double));
    CHECK(xf && wf && xd && wd && xq && wq && xs_rows && xs && ws_rows && ws && xb && wb && res &&
          y && y16 && row);
    if (!(xf && wf && xd && wd && xq && wq && xs_rows && xs && ws_rows && ws && xb && wb && res &&
          y && y16 && row))
      goto next;
    for (int64_t i = 0; i < m * k; i++) {
      xb[i] = ina_f32_to_bf16(test_rng_normal(rng));
      xf[i] = ina_bf16_to_f32(xb[i]);
    }
    for (int64_t i = 0; i < n * k; i++) {
      wb[i] = ina_f32_to_bf16(0.05f * test_rng_normal(rng));
      wf[i] = ina_bf16_to_f32(wb[i]);
    }
    for (int64_t i = 0; i < m * n; i++) res[i] = test_rng_normal(rng);
    CHECK_OK(ina_fp8_quantize_blocks(xf, m, k, 1, 128, xq, xs_rows));
    CHECK_OK(ina_fp8_quantize_blocks(wf, n, k, 128, 128, wq, ws_rows));
    CHECK_OK(ina_fp8_dequantize_blocks(xq, xs_rows, m, k, 1, 128, xd));
    CHECK_OK(ina_fp8_dequantize_blocks(wq, ws_rows, n, k, 128, 128, wd));
    CHECK_OK(ina_gemm_pack_x_scales(xs_rows, m, k, xs));
    CHECK_OK(ina_gemm_pack_w_scales(ws_rows, n, k, ws));

    const float beta = (float)(test_rng_uniform(rng) * 2.0 - 1.0);
    for (int fp8 = 0; fp8 < 2; fp8++) {
      ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
      a.mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
      a.m = m, a.n = n, a.k = k;
      a.x = fp8 ? (const void *)xq : (const void *)xb;
      a.w = fp8 ? (const void *)wq : (const void *)wb;
      a.x_scale = xs, a.w_scale = ws;
      a.out_dtype = INA_DTYPE_F32, a.y = y, a.residual = res, a.beta = beta;
      /* Dequantized floats carry one fp32 rounding each (fp8 * scale), so compare norms. */
      double diff2 = 0, ref2 = 0;
      for (int64_t r = 0; r < m; r++) {
        CHECK_OK(ina_gemm_ref_row(&a, r, row));
        for (int64_t j = 0; j < n; j++) {
          const float *xv = fp8 ? xd : xf, *wv = fp8 ? wd : wf;
          double want = (double)beta * res[r * n + j];
          for (int64_t kk = 0; kk < k; kk++) want += (double)xv[r * k + kk] * wv[j * k + kk];
          diff2 += (row[j] - want) * (row[j] - want);
          ref2 += want * want;
        }
      }
      const double err = sqrt(diff2 / ref2);
      CHECKF(err <= (fp8 ? 1e-6 : 1e-12),
             "reference %s m %lld n %lld k %lld: relative L2 error %.3g", fp8 ? "fp8" : "bf16",
             (long long)m, (long long)n, (long long)k, err);
      /* The whole-matrix reference rounds the same values into y. */
      CHECK_OK(ina_gemm_ref(&a));
      a.out_dtype = INA_DTYPE_BF16, a.y = y16, a.residual = NULL;
      CHECK_OK(ina_gemm_ref(&a));
      int64_t bad = 0;
      for (int64_t r = 0; r < m; r++) {
        a.out_dtype = INA_DTYPE_F32, a.residual = res;
        CHECK_OK(ina_gemm_ref_row(&a, r, row));
        for (int64_t j = 0; j < n; j++) bad += y[r * n + j] != (float)row[j];
        a.residual = NULL;
        CHECK_OK(ina_gemm_ref_row(&a, r, row));
        for (int64_t j = 0; j < n; j++) bad += y16[r * n + j] != ina_f32_to_bf16((float)row[j]);
      }
      CHECKF(bad == 0, "ina_gemm_ref %s: %lld values differ from ina_gemm_ref_row",
             fp8 ? "fp8" : "bf16", (long long)bad);
    }
  next:
    free(xf), free(wf), free(xd), free(wd), free(xq), free(wq), free(xs_rows), free(xs);
    free(ws_rows), free(ws), free(xb), free(wb), free(res), free(y), free(y16), free(row);
  }
}

static void test_no_device(void) {
  ina_gemm_t *h = (ina_gemm_t *)&h;
  if (ina_cuda_device_count() > 0) return; /* covered by test_gemm_gpu */
  ina_log_set_quiet_errors(1);
  CHECK(ina_gemm_create(NULL, &h) == INA_ERR_UNSUPPORTED && h == NULL);
  CHECK(ina_gemm_quantize_x(NULL, 0, 1, 128, NULL, 0, NULL, NULL) != INA_OK);
  ina_log_set_quiet_errors(0);
  ina_gemm_destroy(NULL);
}

int main(void) {
  test_rng_t rng = {test_seed("test_gemm_layout")};
  test_w_scales(&rng);
  test_x_scales(&rng);
  test_plan(&rng);
  test_small_m_plan(&rng);
  test_small_m_fits();
  test_small_m_wins();
  test_args();
  test_reference(&rng);
  test_no_device();
  return test_finish("test_gemm_layout");
}
