/* ina_gpu_silu_mul against ina_cpu_silu_mul on fresh random bf16 gate / up values
 * (including large magnitudes where exp overflows): the bf16 output within bf16
 * rounding of the fp32 reference (rel-L2 <= 1e-2 and elementwise), the FP8 output
 * bit-identical to ina_fp8_quantize_blocks of the GPU's bf16 output and the same when
 * only FP8 is requested; two tensors and one fused [gate | up] input, odd widths,
 * unaligned buffers; nothing past the outputs written. Skipped (exit 77) without a
 * CUDA device. */
#include "tests/gpu_ops/gpu_ops_test.h"

#include "gpu_ops/gpu_ops.h"
#include "model/cpu_ops.h"

typedef struct {
  int64_t rows, inter;
  int fused; /* one [rows, 2 * inter] input */
  int fp8;
  int offset; /* elements past an aligned address, inputs and outputs */
} case_t;

/* Runs the kernel; out / q / s may be NULL (not requested). */
static void launch(const case_t *c, const uint16_t *in, size_t in_elems, int want_out,
                   uint16_t *out, uint8_t *q, float *s, const char *what) {
  const int64_t R = c->rows, I = c->inter, nbc = (I + 127) / 128;
  dev_buf_t din = dev_buf_from(in, in_elems * 2, 0x44);
  dev_buf_t dout = want_out ? dev_buf_make((size_t)(R * I + c->offset) * 2, 0xFF) : (dev_buf_t){0};
  dev_buf_t dq = c->fp8 ? dev_buf_make((size_t)(R * I + c->offset), 0xFF) : (dev_buf_t){0};
  dev_buf_t ds = c->fp8 ? dev_buf_make((size_t)(R * nbc) * 4, 0xFF) : (dev_buf_t){0};
  const uint16_t *gate = (const uint16_t *)din.p + c->offset;
  const uint16_t *up = c->fused ? gate + I : gate + R * I;
  CHECK_OK(ina_gpu_silu_mul(
      R, I, gate, up, c->fused ? 2 * I : I, want_out ? (uint16_t *)dout.p + c->offset : NULL,
      c->fp8 ? (uint8_t *)dq.p + c->offset : NULL, c->fp8 ? ds.p : NULL, NULL));
  CHECK_OK(ina_cuda_synchronize());
  if (out) {
    uint16_t *all = malloc((size_t)(R * I + c->offset) * 2);
    CHECK(all != NULL);
    if (all) {
      dev_buf_read(&dout, all, what);
      for (int i = 0; i < c->offset; i++) CHECKF(all[i] == 0xFFFFu, "%s: written before out", what);
      memcpy(out, all + c->offset, (size_t)(R * I) * 2);
      free(all);
    }
  }
  if (q) {
    uint8_t *all = malloc((size_t)(R * I + c->offset));
    CHECK(all != NULL);
    if (all) {
      dev_buf_read(&dq, all, what);
      memcpy(q, all + c->offset, (size_t)(R * I));
      free(all);
    }
    dev_buf_read(&ds, s, what);
  }
  dev_buf_read(&din, NULL, what);
  dev_buf_free(&din);
  dev_buf_free(&dout);
  dev_buf_free(&dq);
  dev_buf_free(&ds);
}

static void run_case(const case_t *c, test_rng_t *rng) {
  char what[160];
  snprintf(what, sizeof what, "silu_mul [%lld x %lld]%s%s off %d", (long long)c->rows,
           (long long)c->inter, c->fused ? " fused" : "", c->fp8 ? " +fp8" : "", c->offset);
  const int64_t R = c->rows, I = c->inter, nbc = (I + 127) / 128;
  const size_t in_elems = (size_t)(2 * R * I) + (size_t)c->offset, n = (size_t)(R * I);
  uint16_t *in = malloc(in_elems * 2), *out = malloc(n * 2);
  float *g = malloc(n * 4), *u = malloc(n * 4), *ref = malloc(n * 4), *wide = malloc(n * 4);
  uint8_t *q = malloc(n), *q_ref = malloc(n), *q_only = malloc(n);
  float *s = malloc((size_t)(R * nbc) * 4), *s_ref = malloc((size_t)(R * nbc) * 4),
        *s_only = malloc((size_t)(R * nbc) * 4);
  CHECK(in && out && g && u && ref && wide && q && q_ref && q_only && s && s_ref && s_only);
  if (!(in && out && g && u && ref && wide && q && q_ref && q_only && s && s_ref && s_only))
    goto done;
  fill_bf16(in, in_elems, 1.0f, rng);
  /* Some rows with large gates: exp(-g) overflows to inf for g < -88. */
  for (int64_t r = 0; r < R; r += 3)
    for (int64_t i = 0; i < I; i++)
      in[c->offset + (c->fused ? r * 2 * I : r * I) + i] =
          ina_f32_to_bf16(test_rng_normal(rng) * 60.0f);
  for (int64_t r = 0; r < R; r++) {
    const uint16_t *grow = in + c->offset + (c->fused ? r * 2 * I : r * I);
    const uint16_t *urow = c->fused ? grow + I : in + c->offset + R * I + r * I;
    widen_bf16(grow, g + r * I, (size_t)I);
    widen_bf16(urow, u + r * I, (size_t)I);
  }
  ina_cpu_silu_mul(g, u, (int64_t)n, ref);

  launch(c, in, in_elems, 1, out, c->fp8 ? q : NULL, s, what);
  check_bf16_close(out, ref, n, 1e-2, 1e-30, what);
  if (c->fp8) {
    widen_bf16(out, wide, n);
    CHECK_OK(ina_fp8_quantize_blocks(wide, R, I, 1, 128, q_ref, s_ref));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += q[i] != q_ref[i];
    CHECKF(bad == 0, "%s: %zu FP8 bytes differ from quantizing the bf16 output", what, bad);
    CHECKF(memcmp(s, s_ref, (size_t)(R * nbc) * 4) == 0, "%s: FP8 scales differ", what);
    launch(c, in, in_elems, 0, NULL, q_only, s_only, what);
    CHECKF(memcmp(q_only, q, n) == 0 && memcmp(s_only, s, (size_t)(R * nbc) * 4) == 0,
           "%s: FP8-only output differs", what);
  }
done:
  free(in);
  free(out);
  free(g);
  free(u);
  free(ref);
  free(wide);
  free(q);
  free(q_ref);
  free(q_only);
  free(s);
  free(s_ref);
  free(s_only);
}

static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 4096, &d));
  if (!d) return;
  uint16_t *a = d, *b = (uint16_t *)d + 512, *o = (uint16_t *)d + 1024;
  ina_log_set_quiet_errors(1);
  CHECK(ina_gpu_silu_mul(2, 64, a, b, 64, NULL, NULL, NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "no output") != NULL);
  CHECK(ina_gpu_silu_mul(2, 64, a, b, 32, o, NULL, NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_silu_mul(2, 0, a, b, 64, o, NULL, NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_silu_mul(2, 64, NULL, b, 64, o, NULL, NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_silu_mul(2, 64, a, b, 64, NULL, (uint8_t *)o, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_gpu_silu_mul(0, 64, NULL, NULL, 64, o, NULL, NULL, NULL));
  ina_cuda_free(d);
}

int main(int argc, char **argv) {
  test_rng_t rng;
  const int skip = gpu_test_start("test_gpu_silu_mul", argc, argv, &rng);
  if (skip) return skip;
  test_arguments();
  static const case_t fixed[] = {
      {1, 1, 0, 0, 0},     {1, 1, 1, 1, 0},     {3, 7, 1, 1, 0},      {4, 128, 0, 1, 0},
      {4, 129, 1, 1, 0},   {64, 2048, 1, 1, 0}, {64, 2048, 0, 1, 3},  {5, 18432, 1, 1, 0},
      {17, 1408, 1, 0, 0}, {33, 1000, 0, 1, 1}, {256, 2048, 1, 1, 0},
  };
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) run_case(&fixed[i], &rng);
  const int random_cases = gpu_test_quick ? 6 : 40;
  for (int i = 0; i < random_cases; i++) {
    case_t c = {0};
    c.rows = test_rng_int(&rng, 1, 120);
    c.inter = test_rng_int(&rng, 1, i % 5 == 0 ? 20000 : 3000);
    if (i % 2) c.inter = (c.inter + 7) / 8 * 8;
    c.fused = (int)test_rng_int(&rng, 0, 1);
    c.fp8 = (int)test_rng_int(&rng, 0, 1);
    c.offset = test_rng_int(&rng, 0, 4) == 0 ? (int)test_rng_int(&rng, 1, 7) : 0;
    run_case(&c, &rng);
  }
  return test_finish("test_gpu_silu_mul");
}
