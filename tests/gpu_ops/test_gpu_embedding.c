/* ina_gpu_embedding against the CPU engine's gather (ina_cpu_tensor_row rounded to
 * bf16): bf16 tables must be copied bit for bit and f32 tables rounded exactly as
 * ina_f32_to_bf16, on the vectorized and the element-wise paths, for odd widths; ids out
 * of range must be clamped and raise INA_GPU_OPS_FLAG_TOKEN_ID, and nothing past the
 * output may be written. Skipped (exit 77) without a CUDA device. */
#include "tests/gpu_ops/gpu_ops_test.h"

#include "gpu_ops/gpu_ops.h"
#include "model/cpu_ops.h"

typedef struct {
  int64_t vocab, hidden, tokens;
  ina_dtype_t dtype;
  int out_offset; /* elements: > 0 forces the element-wise path */
  int bad_ids;    /* include ids < 0 and >= vocab */
} case_t;

static void run_case(const case_t *c, test_rng_t *rng) {
  const size_t wsize = ina_dtype_size(c->dtype);
  const size_t nw = (size_t)(c->vocab * c->hidden), nout = (size_t)(c->tokens * c->hidden);
  char what[160];
  snprintf(what, sizeof what, "embedding [%lld x %lld] %s, %lld tokens, out+%d%s",
           (long long)c->vocab, (long long)c->hidden, ina_dtype_name(c->dtype),
           (long long)c->tokens, c->out_offset, c->bad_ids ? ", bad ids" : "");
  void *w = malloc(nw * wsize);
  int32_t *ids = malloc((size_t)c->tokens * sizeof *ids);
  uint16_t *got = malloc((nout + (size_t)c->out_offset) * sizeof *got);
  float *row = malloc((size_t)c->hidden * sizeof *row);
  CHECK(w && ids && got && row);
  if (!(w && ids && got && row)) goto done;
  if (c->dtype == INA_DTYPE_BF16) {
    fill_bf16(w, nw, 1.0f, rng);
  } else {
    for (size_t i = 0; i < nw; i++) ((float *)w)[i] = test_rng_normal(rng);
  }
  int expect_flag = 0;
  for (int64_t t = 0; t < c->tokens; t++) {
    ids[t] = (int32_t)test_rng_int(rng, 0, c->vocab - 1);
    if (c->bad_ids && t % 3 == 1) {
      ids[t] =
          t % 2 ? (int32_t)(c->vocab + test_rng_int(rng, 0, 5)) : -(int32_t)test_rng_int(rng, 1, 9);
      expect_flag = 1;
    }
  }

  dev_buf_t dw = dev_buf_from(w, nw * wsize, 0);
  dev_buf_t dids = dev_buf_from(ids, (size_t)c->tokens * 4, 0);
  dev_buf_t dout = dev_buf_make((nout + (size_t)c->out_offset) * 2, 0xFF);
  uint32_t zero = 0, flags = 0;
  dev_buf_t dflags = dev_buf_from(&zero, 4, 0);
  if (!dw.p || !dids.p || !dout.p || !dflags.p) goto free_dev;
  CHECK_OK(ina_gpu_embedding(dids.p, c->tokens, dw.p, c->dtype, c->vocab, c->hidden,
                             (uint16_t *)dout.p + c->out_offset, dflags.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dout, got, what);
  dev_buf_read(&dflags, &flags, what);

  CHECKF(flags == (expect_flag ? INA_GPU_OPS_FLAG_TOKEN_ID : 0u), "%s: error flags 0x%x", what,
         flags);
  for (int i = 0; i < c->out_offset; i++)
    CHECKF(got[i] == 0xFFFFu, "%s: element %d before the output written", what, i);
  ina_tensor_t tw = ina_tensor_wrap(w, c->dtype, 2, (int64_t[]){c->vocab, c->hidden}, INA_CPU);
  int64_t bad = 0;
  for (int64_t t = 0; t < c->tokens; t++) {
    const int64_t id = ids[t] < 0 ? 0 : ids[t] >= c->vocab ? c->vocab - 1 : ids[t];
    ina_cpu_tensor_row(&tw, id, row);
    for (int64_t h = 0; h < c->hidden; h++) {
      const uint16_t want = c->dtype == INA_DTYPE_BF16 ? ((uint16_t *)w)[id * c->hidden + h]
                                                       : ina_f32_to_bf16(row[h]);
      const uint16_t have = got[c->out_offset + t * c->hidden + h];
      if (have != want && bad++ < 5)
        fprintf(stderr, "%s: out[%lld, %lld] = 0x%04x, want 0x%04x\n", what, (long long)t,
                (long long)h, have, want);
    }
  }
  CHECKF(bad == 0, "%s: %lld elements differ", what, (long long)bad);
free_dev:
  dev_buf_free(&dw);
  dev_buf_free(&dids);
  dev_buf_free(&dout);
  dev_buf_free(&dflags);
done:
  free(w);
  free(ids);
  free(got);
  free(row);
}

static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 4096, &d));
  if (!d) return;
  int32_t *ids = d;
  uint16_t *w = (uint16_t *)((char *)d + 1024), *out = (uint16_t *)((char *)d + 2048);
  ina_log_set_quiet_errors(1);
  CHECK(ina_gpu_embedding(NULL, 1, w, INA_DTYPE_BF16, 4, 8, out, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_embedding(ids, 1, w, INA_DTYPE_BF16, 0, 8, out, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_embedding(ids, -1, w, INA_DTYPE_BF16, 4, 8, out, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_embedding(ids, 1, w, INA_DTYPE_FP8_E4M3, 4, 8, out, NULL, NULL) ==
        INA_ERR_UNSUPPORTED);
  CHECK(strstr(ina_last_error(), "fp8_e4m3") != NULL);
  CHECK(ina_gpu_embedding(ids, 1, (char *)w + 1, INA_DTYPE_BF16, 4, 8, out, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_gpu_embedding(NULL, 0, NULL, INA_DTYPE_BF16, 4, 8, NULL, NULL, NULL));
  ina_cuda_free(d);
}

int main(int argc, char **argv) {
  test_rng_t rng;
  const int skip = gpu_test_start("test_gpu_embedding", argc, argv, &rng);
  if (skip) return skip;
  test_arguments();
  static const case_t fixed[] = {
      {1, 1, 1, INA_DTYPE_BF16, 0, 0},        {5, 3, 4, INA_DTYPE_BF16, 0, 0},
      {100, 8, 33, INA_DTYPE_BF16, 0, 0},     {100, 8, 33, INA_DTYPE_BF16, 1, 0},
      {1000, 7168, 17, INA_DTYPE_BF16, 0, 0}, {1000, 7168, 17, INA_DTYPE_F32, 0, 0},
      {300, 1001, 64, INA_DTYPE_BF16, 0, 1},  {300, 1001, 64, INA_DTYPE_F32, 3, 1},
      {50, 2048, 64, INA_DTYPE_F32, 0, 1},    {7, 5120, 200, INA_DTYPE_BF16, 0, 0},
  };
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) run_case(&fixed[i], &rng);
  const int random_cases = gpu_test_quick ? 4 : 24;
  for (int i = 0; i < random_cases; i++) {
    case_t c = {0};
    c.vocab = test_rng_int(&rng, 1, 1000);
    c.hidden = test_rng_int(&rng, 1, 3000);
    if (i % 2) c.hidden = (c.hidden + 7) / 8 * 8;
    c.tokens = test_rng_int(&rng, 1, 300);
    c.dtype = i % 3 == 0 ? INA_DTYPE_F32 : INA_DTYPE_BF16;
    c.out_offset = i % 5 == 0 ? (int)test_rng_int(&rng, 1, 7) : 0;
    c.bad_ids = i % 4 == 0;
    run_case(&c, &rng);
  }
  return test_finish("test_gpu_embedding");
}
