/* ina_gpu_layernorm against ina_cpu_layernorm on fresh random bf16 rows, element by
 * element within the error bound gpu_ops.h states. With u = 2^-24, S = ceil(cols / 512)
 * + 10, and per row the exact mean, inv = 1 / sqrt(var + eps) and m1 = sum|x| / cols
 * (in double, from the bf16 inputs), element (r, c) with t = (x - mean) * inv, w, b has
 *   slack = (1 + 2^-10) * (u * ((S / 2 + 12) |t w| + (S + 1) |w| inv m1 + 2 |b|)
 *                          + |t w| (delta inv)^2 / 2),     delta = (S + 1) u m1
 * (the header's first-order bound, the mean error's second-order effect on the
 * variance, and 2^-10 for the other second-order terms), and must satisfy
 *   |gpu - cpu| <= half_ulp_bf16(|cpu| + slack) + slack
 * where half_ulp_bf16(v) = 2^(floor(log2 v) - 8), at least 2^-134: the GPU's fp32 value
 * lies within slack of the CPU's and its bf16 rounding moves it by at most half an ulp of
 * its own magnitude. NaN never passes.
 *
 * Rows of magnitudes 2^-7 .. 2^6, some with a mean four times their spread; f32 weights
 * 1 + 0.25 N(0, 1) and biases 0.5 N(0, 1); widths 1, 7, 16, 40, 128, 7168, 32768 and
 * random ones; rows 0 .. 100; padded strides, unaligned starts, in place. Outputs are
 * poisoned (NaN) before each run; nothing outside the rows may be written. Mutations
 * on the reference's side (the CPU rerun with the bias dropped, the weight scaled by
 * 1.05, eps x 10) must make the comparison fail wherever they move some element by more
 * than 4 times its bound, and each must be caught on some case (eps x 10 on rows of
 * variance near eps). Skipped (exit 77) without a CUDA device. */
#include "tests/gpu_ops/gpu_ops_test.h"

#include <limits.h>

#include "gpu_ops/gpu_ops.h"
#include "model/cpu_ops.h"

typedef struct {
  int64_t rows, cols;
  int in_place; /* y = x */
  int64_t pad;  /* extra elements per row of x / y (strides) */
  int offset;   /* elements the buffers start past an aligned address */
  int scale_exp; /* every row's magnitude 2^scale_exp; INT_MIN: random per row */
  float eps;
} case_t;

enum { MUT_BIAS, MUT_SCALE, MUT_EPS, MUT_COUNT };
static const char *const mut_name[MUT_COUNT] = {"bias dropped", "weight x1.05", "eps x10"};
static int mut_caught[MUT_COUNT]; /* cases on which each mutation was measurable and caught */

static void describe(const case_t *c, char *buf, size_t n) {
  snprintf(buf, n, "layernorm [%lld x %lld]%s pad %lld off %d eps %g", (long long)c->rows,
           (long long)c->cols, c->in_place ? " in-place" : "", (long long)c->pad, c->offset,
           (double)c->eps);
}

static double half_ulp_bf16(double v) {
  if (!(v >= 0x1p-126)) return 0x1p-134;
  int e = 0;
  frexp(v, &e); /* v in [2^(e-1), 2^e): a bf16 ulp there is 2^(e-8) */
  return ldexp(1.0, e - 9);
}

/* Elements of got (bf16, dense [R, C]) outside the bound around ref; *worst is the
 * largest |got - ref| / bound (infinite for NaN). */
static size_t count_over(const uint16_t *got, const float *ref, const double *slack, size_t n,
                         double *worst, const char *what) {
  size_t bad = 0;
  *worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double g = ina_bf16_to_f32(got[i]), r = ref[i];
    const double bound = half_ulp_bf16(fabs(r) + slack[i]) + slack[i];
    const double d = fabs(g - r);
    if (!(d <= bound)) {
      if (what && bad < 5)
        fprintf(stderr, "%s: element %zu = %.9g, reference %.9g, bound %.3g\n", what, i, g, r, bound);
      bad++;
    }
    const double ratio = d == d ? d / bound : INFINITY;
    if (ratio > *worst) *worst = ratio;
  }
  return bad;
}

/* Runs the kernel on a fresh device copy of x; y_host gets the whole y (or x) buffer. */
static void launch(const case_t *c, const uint16_t *x, const float *w, const float *b, uint16_t *y_host,
                   const char *what) {
  const int64_t stride = c->cols + c->pad;
  const size_t n = (size_t)(c->rows * stride) + (size_t)c->offset;
  dev_buf_t dx = dev_buf_from(x, n * 2, 0x11);
  dev_buf_t dy = !c->in_place ? dev_buf_make(n * 2, 0xFF) : (dev_buf_t){0};
  dev_buf_t dw = dev_buf_from(w, (size_t)c->cols * 4, 0);
  dev_buf_t db = dev_buf_from(b, (size_t)c->cols * 4, 0);
  ina_gpu_layernorm_params_t p = INA_GPU_LAYERNORM_PARAMS_INIT;
  p.rows = c->rows;
  p.cols = c->cols;
  p.x = (const uint16_t *)dx.p + c->offset;
  p.x_stride = stride;
  p.weight = dw.p;
  p.bias = db.p;
  p.eps = c->eps;
  p.y = c->in_place ? (uint16_t *)dx.p + c->offset : (uint16_t *)dy.p + c->offset;
  p.y_stride = stride;
  CHECK_OK(ina_gpu_layernorm(&p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(c->in_place ? &dx : &dy, y_host, what);
  dev_buf_free(&dx);
  dev_buf_free(&dy);
  dev_buf_free(&dw);
  dev_buf_free(&db);
}

/* The bound's slack per element of the dense [R, C] rows h (see the top). */
static void slack_of(const float *h, const float *w, const float *b, int64_t R, int64_t C, float eps,
                     double *slack) {
  const double u = 0x1p-24, S = (double)((C + 511) / 512 + 10);
  for (int64_t r = 0; r < R; r++) {
    const float *x = h + r * C;
    double sum = 0.0, ss = 0.0, m1 = 0.0;
    for (int64_t i = 0; i < C; i++) sum += x[i], m1 += fabs(x[i]);
    const double mean = sum / (double)C;
    for (int64_t i = 0; i < C; i++) ss += (x[i] - mean) * (x[i] - mean);
    const double inv = 1.0 / sqrt(ss / (double)C + (double)eps);
    m1 /= (double)C;
    const double delta = (S + 1.0) * u * m1;
    for (int64_t i = 0; i < C; i++) {
      const double tw = fabs((x[i] - mean) * inv * w[i]);
      slack[r * C + i] = (1.0 + 0x1p-10) * (u * ((S / 2.0 + 12.0) * tw + (S + 1.0) * fabs(w[i]) * inv * m1 +
                                                 2.0 * fabs(b[i])) +
                                            0.5 * tw * (delta * inv) * (delta * inv));
    }
  }
}

static void cpu_reference(const float *h, const float *w, const float *b, int64_t R, int64_t C, float eps,
                          float *out) {
  ina_tensor_t tw = ina_tensor_wrap((void *)w, INA_DTYPE_F32, 1, (int64_t[]){C}, INA_CPU);
  ina_tensor_t tb = ina_tensor_wrap((void *)b, INA_DTYPE_F32, 1, (int64_t[]){C}, INA_CPU);
  ina_cpu_layernorm(h, &tw, &tb, R, C, eps, out);
}

static void run_case(const case_t *c, test_rng_t *rng) {
  char what[200];
  describe(c, what, sizeof what);
  const int64_t stride = c->cols + c->pad, R = c->rows, C = c->cols;
  const size_t n = (size_t)(R * stride) + (size_t)c->offset, rc = (size_t)(R * C);
  uint16_t *x = malloc(n * 2 + 2), *y = malloc(n * 2 + 2), *y_dense = malloc(rc * 2 + 2);
  float *w = malloc((size_t)C * 4), *b = malloc((size_t)C * 4), *w_alt = malloc((size_t)C * 4),
        *b_zero = calloc((size_t)C, 4);
  float *h = malloc(rc * 4 + 4), *ref = malloc(rc * 4 + 4), *alt = malloc(rc * 4 + 4);
  double *slack = malloc(rc * 8 + 8);
  const int ok = x && y && y_dense && w && b && w_alt && b_zero && h && ref && alt && slack;
  CHECK(ok);
  if (!ok) goto done;

  /* Rows of different magnitudes, some shifted far from zero; the padding holds data the
   * kernel must ignore. */
  for (int64_t r = 0; r < R; r++) {
    const int e = c->scale_exp != INT_MIN ? c->scale_exp : (int)test_rng_int(rng, -7, 6);
    const float scale = ldexpf(1.0f, e);
    const float shift = test_rng_int(rng, 0, 3) == 0 ? (float)test_rng_int(rng, -4, 4) * scale : 0.0f;
    uint16_t *xr = x + c->offset + r * stride;
    for (int64_t i = 0; i < stride; i++) xr[i] = ina_f32_to_bf16(shift + test_rng_normal(rng) * scale);
  }
  for (int i = 0; i < c->offset; i++) x[i] = ina_f32_to_bf16(test_rng_normal(rng));
  for (int64_t i = 0; i < C; i++) {
    w[i] = 1.0f + 0.25f * test_rng_normal(rng);
    b[i] = 0.5f * test_rng_normal(rng);
    w_alt[i] = w[i] * 1.05f;
  }
  for (int64_t r = 0; r < R; r++)
    for (int64_t i = 0; i < C; i++) h[r * C + i] = ina_bf16_to_f32(x[(size_t)c->offset + (size_t)(r * stride + i)]);
  cpu_reference(h, w, b, R, C, c->eps, ref);
  slack_of(h, w, b, R, C, c->eps, slack);

  launch(c, x, w, b, y, what);
  for (int64_t r = 0; r < R; r++) memcpy(y_dense + r * C, y + c->offset + r * stride, (size_t)C * 2);
  double worst = 0.0;
  const size_t over = count_over(y_dense, ref, slack, rc, &worst, what);
  CHECKF(over == 0, "%s: %zu of %zu elements outside the bound (worst %.3g x bound)", what, over, rc, worst);

  /* Padding between rows, and everything before the first row, stays as it was. */
  size_t pad_bad = 0;
  for (size_t i = 0; i < n; i++) {
    const int64_t r = ((int64_t)i - c->offset) / stride, col = ((int64_t)i - c->offset) % stride;
    if ((int64_t)i >= c->offset && col < C && r < R) continue;
    pad_bad += y[i] != (c->in_place ? x[i] : 0xFFFFu);
  }
  CHECKF(pad_bad == 0, "%s: %zu elements outside the rows of y written", what, pad_bad);

  /* Mutations of the reference: where one moves an element by more than 4 bounds, the
   * GPU's output must fail against it. */
  char caught_text[128] = "";
  for (int m = 0; m < MUT_COUNT && rc > 0; m++) {
    cpu_reference(h, m == MUT_SCALE ? w_alt : w, m == MUT_BIAS ? b_zero : b, R, C,
                  m == MUT_EPS ? c->eps * 10.0f : c->eps, alt);
    int measurable = 0;
    for (size_t i = 0; i < rc && !measurable; i++)
      measurable = fabs((double)alt[i] - ref[i]) > 4.0 * (half_ulp_bf16(fabs(ref[i]) + slack[i]) + slack[i]);
    double w_alt_worst = 0.0;
    const int caught = count_over(y_dense, alt, slack, rc, &w_alt_worst, NULL) > 0;
    CHECKF(!measurable || caught, "%s: the mutation '%s' passed the bound", what, mut_name[m]);
    mut_caught[m] += measurable && caught;
    const size_t len = strlen(caught_text);
    snprintf(caught_text + len, sizeof caught_text - len, "%s%s %s", m ? ", " : "", mut_name[m],
             !measurable ? "n/a" : caught ? "caught" : "MISSED");
  }
  if (!gpu_test_quick || c->cols >= 1024)
    printf("  %-52s worst %.3f of the bound; %s\n", what, worst, rc > 0 ? caught_text : "no rows");
done:
  free(x);
  free(y);
  free(y_dense);
  free(w);
  free(b);
  free(w_alt);
  free(b_zero);
  free(h);
  free(ref);
  free(alt);
  free(slack);
}

static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 1 << 16, &d));
  if (!d) return;
  uint16_t *x = d, *y = (uint16_t *)d + 4096;
  float *w = (float *)((uint16_t *)d + 8192), *b = (float *)((uint16_t *)d + 12288);
  ina_gpu_layernorm_params_t p = INA_GPU_LAYERNORM_PARAMS_INIT;
  p.rows = 2;
  p.cols = 64;
  p.x = x;
  p.weight = w;
  p.bias = b;
  p.y = y;
  ina_log_set_quiet_errors(1);
  CHECK(ina_gpu_layernorm(NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_gpu_layernorm_params_t a = p;
  a.struct_size = 8;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.version = 0;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.rows = -1;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.cols = 0;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.cols = 32769;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_UNSUPPORTED);
  a = p;
  a.eps = -1e-6f;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.eps = NAN;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.bias = NULL;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "bias") != NULL);
  a = p;
  a.weight = NULL;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.x = NULL;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.y = NULL;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.x_stride = 10;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.y_stride = -1;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.y = x + 32; /* overlaps x without being x */
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "overlaps") != NULL);
  a = p;
  a.y = x; /* in place with another stride */
  a.y_stride = 128;
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.weight = (const float *)((const char *)w + 2);
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  a = p;
  a.x = (const uint16_t *)((const char *)x + 1);
  CHECK(ina_gpu_layernorm(&a, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  a = p;
  a.rows = 0;
  CHECK_OK(ina_gpu_layernorm(&a, NULL));
  a = p;
  a.y = x; /* in place, same stride */
  CHECK_OK(ina_gpu_layernorm(&a, NULL));
  CHECK_OK(ina_cuda_synchronize());
  ina_cuda_free(d);
}

int main(int argc, char **argv) {
  test_rng_t rng;
  const int skip = gpu_test_start("test_gpu_layernorm", argc, argv, &rng);
  if (skip) return skip;
  test_arguments();
  static const case_t fixed[] = {
      /* rows, cols, in_place, pad, offset, scale_exp, eps */
      {1, 1, 0, 0, 0, INT_MIN, 1e-6f},      {5, 1, 1, 3, 1, INT_MIN, 1e-5f},
      {3, 7, 0, 0, 0, INT_MIN, 1e-6f},      {0, 16, 0, 0, 0, INT_MIN, 1e-6f},
      {4, 16, 1, 0, 0, INT_MIN, 1e-6f},     {9, 40, 0, 5, 3, INT_MIN, 1e-6f},
      {64, 128, 0, 0, 0, INT_MIN, 1e-6f},   {64, 128, 1, 0, 0, INT_MIN, 1e-6f},
      {33, 128, 0, 128, 0, INT_MIN, 1e-6f}, {8, 128, 0, 0, 0, -7, 1e-5f}, /* variance near eps */
      {7, 129, 0, 1, 1, INT_MIN, 1e-6f},    {16, 511, 0, 0, 0, INT_MIN, 1e-6f},
      {16, 513, 1, 2, 0, INT_MIN, 1e-6f},   {0, 7168, 1, 0, 0, INT_MIN, 1e-6f},
      {32, 7168, 0, 0, 0, INT_MIN, 1e-6f},  {32, 7168, 1, 0, 0, INT_MIN, 1e-6f},
      {5, 7168, 0, 0, 3, INT_MIN, 1e-6f},   {3, 32768, 0, 0, 0, INT_MIN, 1e-6f},
      {2, 32768, 1, 0, 0, INT_MIN, 1e-6f},  {300, 100, 0, 3, 0, INT_MIN, 1e-5f},
  };
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) run_case(&fixed[i], &rng);
  static const int64_t widths[] = {1, 7, 16, 40, 128, 7168};
  const int random_cases = gpu_test_quick ? 8 : 48;
  for (int i = 0; i < random_cases; i++) {
    case_t c = {0};
    c.rows = test_rng_int(&rng, 0, 7) == 0 ? 0 : test_rng_int(&rng, 1, 100);
    c.cols = i % 3 == 0   ? widths[test_rng_int(&rng, 0, 5)]
             : i % 3 == 1 ? test_rng_int(&rng, 1, 3000)
                          : test_rng_int(&rng, 1, 32768);
    c.in_place = test_rng_int(&rng, 0, 3) == 0;
    c.pad = test_rng_int(&rng, 0, 2) == 0 ? test_rng_int(&rng, 1, 40) : 0;
    c.offset = test_rng_int(&rng, 0, 4) == 0 ? (int)test_rng_int(&rng, 1, 7) : 0;
    c.scale_exp = INT_MIN;
    c.eps = test_rng_int(&rng, 0, 1) ? 1e-6f : 1e-5f;
    run_case(&c, &rng);
  }
  printf("test_gpu_layernorm: mutations caught on %d (bias dropped), %d (weight x1.05), %d (eps x10) cases\n",
         mut_caught[MUT_BIAS], mut_caught[MUT_SCALE], mut_caught[MUT_EPS]);
  for (int m = 0; m < MUT_COUNT; m++)
    CHECKF(mut_caught[m] > 0, "the mutation '%s' was caught on no case", mut_name[m]);
  return test_finish("test_gpu_layernorm");
}
