/* ina_gpu_rmsnorm against ina_cpu_rmsnorm on fresh random bf16 rows:
 *   - the residual add is bf16(residual + x), bit for bit;
 *   - y is within bf16 rounding of the fp32 reference (rel-L2 <= 1e-2 and elementwise);
 *   - the FP8 output is bit-identical to ina_fp8_quantize_blocks of the GPU's own bf16 y,
 *     and the same when y is not requested;
 *   - in place (y = x), strided rows, f32 and bf16 weights, odd widths, unaligned
 *     buffers (element-wise path); nothing past the outputs is written.
 * Skipped (exit 77) without a CUDA device. */
#include "tests/gpu_ops/gpu_ops_test.h"

#include "gpu_ops/gpu_ops.h"
#include "model/cpu_ops.h"

typedef struct {
  int64_t rows, cols;
  int residual; /* fused residual add */
  int fp8;      /* FP8 output too */
  int in_place; /* y = x */
  int64_t pad;  /* extra elements per row of x / residual / y (strides) */
  int offset;   /* elements the buffers start past an aligned address */
  ina_dtype_t wdtype;
} case_t;

static void describe(const case_t *c, char *buf, size_t n) {
  snprintf(buf, n, "rmsnorm [%lld x %lld] w %s%s%s%s pad %lld off %d", (long long)c->rows,
           (long long)c->cols, ina_dtype_name(c->wdtype), c->residual ? " +residual" : "",
           c->fp8 ? " +fp8" : "", c->in_place ? " in-place" : "", (long long)c->pad, c->offset);
}

/* Runs the kernel on fresh device copies of x and residual; y_host / q / s may be NULL. */
static void launch(const case_t *c, const uint16_t *x, const uint16_t *res, const void *w,
                   float eps, int want_y, uint16_t *y_host, uint16_t *res_host, uint8_t *q_host,
                   float *s_host, const char *what) {
  const int64_t stride = c->cols + c->pad;
  const size_t n = (size_t)(c->rows * stride) + (size_t)c->offset;
  const int64_t nbc = (c->cols + 127) / 128;
  dev_buf_t dx = dev_buf_from(x, n * 2, 0x11);
  dev_buf_t dres = c->residual ? dev_buf_from(res, n * 2, 0x22) : (dev_buf_t){0};
  dev_buf_t dy = want_y && !c->in_place ? dev_buf_make(n * 2, 0xFF) : (dev_buf_t){0};
  dev_buf_t dw = dev_buf_from(w, (size_t)c->cols * ina_dtype_size(c->wdtype), 0);
  dev_buf_t dq =
      c->fp8 ? dev_buf_make((size_t)(c->rows * c->cols) + (size_t)c->offset, 0xFF) : (dev_buf_t){0};
  dev_buf_t ds = c->fp8 ? dev_buf_make((size_t)(c->rows * nbc) * 4, 0xFF) : (dev_buf_t){0};
  ina_gpu_rmsnorm_params_t p = INA_GPU_RMSNORM_PARAMS_INIT;
  p.rows = c->rows;
  p.cols = c->cols;
  p.x = (const uint16_t *)dx.p + c->offset;
  p.x_stride = stride;
  p.residual = c->residual ? (uint16_t *)dres.p + c->offset : NULL;
  p.residual_stride = stride;
  p.weight = dw.p;
  p.weight_dtype = c->wdtype;
  p.eps = eps;
  p.y = !want_y ? NULL : c->in_place ? (uint16_t *)dx.p + c->offset : (uint16_t *)dy.p + c->offset;
  p.y_stride = stride;
  p.y_fp8 = c->fp8 ? (uint8_t *)dq.p + c->offset : NULL;
  p.y_scale_inv = c->fp8 ? ds.p : NULL;
  CHECK_OK(ina_gpu_rmsnorm(&p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  if (y_host) dev_buf_read(c->in_place ? &dx : &dy, y_host, what);
  if (res_host) dev_buf_read(&dres, res_host, what);
  if (q_host) {
    uint8_t *all = malloc((size_t)(c->rows * c->cols) + (size_t)c->offset);
    CHECK(all != NULL);
    if (all) {
      dev_buf_read(&dq, all, what);
      memcpy(q_host, all + c->offset, (size_t)(c->rows * c->cols));
      free(all);
    }
    dev_buf_read(&ds, s_host, what);
  }
  dev_buf_free(&dx);
  dev_buf_free(&dres);
  dev_buf_free(&dy);
  dev_buf_free(&dw);
  dev_buf_free(&dq);
  dev_buf_free(&ds);
}

static void run_case(const case_t *c, test_rng_t *rng) {
  char what[200];
  describe(c, what, sizeof what);
  const int64_t stride = c->cols + c->pad, R = c->rows, C = c->cols, nbc = (C + 127) / 128;
  const size_t n = (size_t)(R * stride) + (size_t)c->offset;
  const float eps = test_rng_int(rng, 0, 1) ? 1e-6f : 1e-5f;
  uint16_t *x = malloc(n * 2), *res = malloc(n * 2), *y = malloc(n * 2), *res_out = malloc(n * 2);
  void *w = malloc((size_t)C * 4);
  float *h = malloc((size_t)(R * C) * 4), *ref = malloc((size_t)(R * C) * 4);
  uint16_t *y_dense = malloc((size_t)(R * C) * 2);
  float *y_wide = malloc((size_t)(R * C) * 4);
  uint8_t *q = malloc((size_t)(R * C)), *q_ref = malloc((size_t)(R * C)),
          *q_only = malloc((size_t)(R * C));
  float *s = malloc((size_t)(R * nbc) * 4), *s_ref = malloc((size_t)(R * nbc) * 4),
        *s_only = malloc((size_t)(R * nbc) * 4);
  CHECK(x && res && y && res_out && w && h && ref && y_dense && y_wide && q && q_ref && q_only &&
        s && s_ref && s_only);
  if (!(x && res && y && res_out && w && h && ref && y_dense && y_wide && q && q_ref && q_only &&
        s && s_ref && s_only))
    goto done;

  /* Rows of different magnitudes; the padding holds data the kernel must ignore. */
  for (int64_t r = 0; r < R; r++) {
    const float scale = ldexpf(1.0f, (int)test_rng_int(rng, -6, 6));
    fill_bf16(x + c->offset + r * stride, (size_t)stride, scale, rng);
    fill_bf16(res + c->offset + r * stride, (size_t)stride, scale * 4, rng);
  }
  if (c->wdtype == INA_DTYPE_BF16) {
    for (int64_t i = 0; i < C; i++)
      ((uint16_t *)w)[i] = ina_f32_to_bf16(1.0f + 0.25f * test_rng_normal(rng));
  } else {
    for (int64_t i = 0; i < C; i++) ((float *)w)[i] = 1.0f + 0.25f * test_rng_normal(rng);
  }

  /* Reference: h = bf16(residual + x) (or x), then ina_cpu_rmsnorm in fp32. */
  for (int64_t r = 0; r < R; r++)
    for (int64_t i = 0; i < C; i++) {
      const size_t at = (size_t)c->offset + (size_t)(r * stride + i);
      const float xv = ina_bf16_to_f32(x[at]);
      h[r * C + i] =
          c->residual ? ina_bf16_to_f32(ina_f32_to_bf16(ina_bf16_to_f32(res[at]) + xv)) : xv;
    }
  ina_tensor_t tw = ina_tensor_wrap(w, c->wdtype, 1, (int64_t[]){C}, INA_CPU);
  ina_cpu_rmsnorm(h, &tw, R, C, eps, C, ref, C);

  launch(c, x, res, w, eps, 1, y, c->residual ? res_out : NULL, c->fp8 ? q : NULL, s, what);
  for (int64_t r = 0; r < R; r++)
    memcpy(y_dense + r * C, y + c->offset + r * stride, (size_t)C * 2);
  check_bf16_close(y_dense, ref, (size_t)(R * C), 1e-2, 0.0, what);

  /* Padding between rows, and everything before the first row, stays as it was. */
  size_t pad_bad = 0;
  const uint16_t *orig_y = c->in_place ? x : NULL;
  for (size_t i = 0; i < n; i++) {
    const int64_t r = ((int64_t)i - c->offset) / stride, col = ((int64_t)i - c->offset) % stride;
    if ((int64_t)i >= c->offset && col < C && r < R) continue;
    pad_bad += y[i] != (orig_y ? orig_y[i] : 0xFFFFu);
  }
  CHECKF(pad_bad == 0, "%s: %zu elements outside the rows of y written", what, pad_bad);

  if (c->residual) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
      const int64_t r = ((int64_t)i - c->offset) / stride, col = ((int64_t)i - c->offset) % stride;
      const int inside = (int64_t)i >= c->offset && col < C && r < R;
      const uint16_t want = inside ? ina_f32_to_bf16(h[r * C + col]) : res[i];
      bad += res_out[i] != want;
    }
    CHECKF(bad == 0, "%s: %zu residual elements differ from bf16(residual + x)", what, bad);
  }

  if (c->fp8) {
    widen_bf16(y_dense, y_wide, (size_t)(R * C));
    CHECK_OK(ina_fp8_quantize_blocks(y_wide, R, C, 1, 128, q_ref, s_ref));
    size_t bad = 0;
    for (int64_t i = 0; i < R * C; i++) bad += q[i] != q_ref[i];
    CHECKF(bad == 0, "%s: %zu FP8 bytes differ from quantizing the bf16 y", what, bad);
    CHECKF(memcmp(s, s_ref, (size_t)(R * nbc) * 4) == 0, "%s: FP8 scales differ", what);
    /* FP8 alone gives the same bytes. */
    if (!c->in_place) {
      launch(c, x, res, w, eps, 0, NULL, NULL, q_only, s_only, what);
      CHECKF(
          memcmp(q_only, q, (size_t)(R * C)) == 0 && memcmp(s_only, s, (size_t)(R * nbc) * 4) == 0,
          "%s: FP8 output without y differs", what);
    }
  }
done:
  free(x);
  free(res);
  free(y);
  free(res_out);
  free(w);
  free(h);
  free(ref);
  free(y_dense);
  free(y_wide);
  free(q);
  free(q_ref);
  free(q_only);
  free(s);
  free(s_ref);
  free(s_only);
}

static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 1 << 16, &d));
  if (!d) return;
  uint16_t *x = d, *res = (uint16_t *)d + 4096, *y = (uint16_t *)d + 8192,
           *w = (uint16_t *)d + 12288;
  ina_gpu_rmsnorm_params_t p = INA_GPU_RMSNORM_PARAMS_INIT;
  p.rows = 2;
  p.cols = 64;
  p.x = x;
  p.weight = w;
  p.y = y;
  ina_log_set_quiet_errors(1);
  ina_gpu_rmsnorm_params_t b = p;
  b.y = NULL;
  CHECK(ina_gpu_rmsnorm(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "no output") != NULL);
  b = p;
  b.cols = 40000;
  CHECK(ina_gpu_rmsnorm(&b, NULL) == INA_ERR_UNSUPPORTED);
  b = p;
  b.weight_dtype = INA_DTYPE_FP8_E4M3;
  CHECK(ina_gpu_rmsnorm(&b, NULL) == INA_ERR_UNSUPPORTED);
  b = p;
  b.x_stride = 10;
  CHECK(ina_gpu_rmsnorm(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.residual = x + 32; /* overlaps x */
  CHECK(ina_gpu_rmsnorm(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.y_fp8 = (uint8_t *)res; /* scales missing */
  CHECK(ina_gpu_rmsnorm(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.eps = -1.0f;
  CHECK(ina_gpu_rmsnorm(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.struct_size = 8;
  CHECK(ina_gpu_rmsnorm(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  b = p;
  b.rows = 0;
  CHECK_OK(ina_gpu_rmsnorm(&b, NULL));
  CHECK_OK(ina_cuda_synchronize());
  ina_cuda_free(d);
}

int main(int argc, char **argv) {
  test_rng_t rng;
  const int skip = gpu_test_start("test_gpu_rmsnorm", argc, argv, &rng);
  if (skip) return skip;
  test_arguments();
  static const case_t fixed[] = {
      /* rows, cols, residual, fp8, in_place, pad, offset, weight dtype */
      {1, 1, 0, 0, 0, 0, 0, INA_DTYPE_BF16},     {3, 7, 1, 1, 0, 0, 0, INA_DTYPE_BF16},
      {4, 128, 1, 1, 0, 0, 0, INA_DTYPE_BF16},   {4, 129, 0, 1, 0, 0, 0, INA_DTYPE_F32},
      {16, 512, 0, 0, 0, 64, 0, INA_DTYPE_BF16}, {16, 1536, 0, 1, 0, 576, 0, INA_DTYPE_BF16},
      {64, 7168, 1, 1, 0, 0, 0, INA_DTYPE_BF16}, {64, 7168, 1, 0, 1, 0, 0, INA_DTYPE_BF16},
      {5, 7168, 1, 1, 0, 0, 3, INA_DTYPE_BF16},  {8, 18432, 0, 1, 0, 0, 0, INA_DTYPE_F32},
      {3, 18432, 1, 1, 0, 0, 1, INA_DTYPE_BF16}, {2, 32768, 1, 1, 0, 0, 0, INA_DTYPE_BF16},
      {7, 8200, 0, 1, 1, 8, 0, INA_DTYPE_F32},   {300, 1000, 1, 1, 0, 3, 0, INA_DTYPE_BF16},
  };
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) run_case(&fixed[i], &rng);
  const int random_cases = gpu_test_quick ? 6 : 40;
  for (int i = 0; i < random_cases; i++) {
    case_t c = {0};
    c.rows = test_rng_int(&rng, 1, 100);
    c.cols = test_rng_int(&rng, 1, i % 4 == 0 ? 32768 : 3000);
    if (i % 2) c.cols = (c.cols + 7) / 8 * 8;
    c.residual = (int)test_rng_int(&rng, 0, 1);
    c.fp8 = (int)test_rng_int(&rng, 0, 1);
    c.in_place = test_rng_int(&rng, 0, 3) == 0;
    c.pad = test_rng_int(&rng, 0, 2) == 0 ? test_rng_int(&rng, 1, 40) : 0;
    c.offset = test_rng_int(&rng, 0, 4) == 0 ? (int)test_rng_int(&rng, 1, 7) : 0;
    c.wdtype = test_rng_int(&rng, 0, 2) == 0 ? INA_DTYPE_F32 : INA_DTYPE_BF16;
    run_case(&c, &rng);
  }
  return test_finish("test_gpu_rmsnorm");
}
