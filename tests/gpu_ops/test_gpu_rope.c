/* ina_gpu_rope against ina_cpu_rope on fresh random bf16 queries: every rope pair within
 * bf16 rounding of the fp32 reference (relative to the pair's length, as a rotation
 * moves value between the two), rel-L2 <= 1e-2, and every element outside the rope
 * parts (nope dims, padding) untouched; pairs and halves layouts, int32 and int64
 * positions up to 160k, YaRN attention factors, MLA query and key-rope shapes, odd head
 * counts and rope widths. Skipped (exit 77) without a CUDA device. */
#include "tests/gpu_ops/gpu_ops_test.h"

#include "gpu_ops/gpu_ops.h"
#include "model/cpu_ops.h"

typedef struct {
  int64_t tokens;
  int32_t heads, nope, rope;
  int64_t head_pad, token_pad; /* extra elements per head / per token */
  int pairs;
  ina_dtype_t pos_dtype;
  float attention_factor;
} case_t;

static void run_case(const case_t *c, test_rng_t *rng) {
  const int64_t head_stride = c->nope + c->rope + c->head_pad;
  const int64_t token_stride = c->heads * head_stride + c->token_pad;
  const size_t n = (size_t)(c->tokens * token_stride);
  const int32_t half = c->rope / 2;
  char what[200];
  snprintf(what, sizeof what, "rope T %lld H %d nope %d rope %d pads %lld/%lld %s pos %s af %g",
           (long long)c->tokens, c->heads, c->nope, c->rope, (long long)c->head_pad,
           (long long)c->token_pad, c->pairs ? "pairs" : "halves", ina_dtype_name(c->pos_dtype),
           (double)c->attention_factor);
  uint16_t *x = malloc(n * 2), *got = malloc(n * 2);
  float *inv_freq = malloc((size_t)half * 4), *pair = malloc((size_t)c->rope * 4);
  int64_t *pos = malloc((size_t)c->tokens * 8);
  int32_t *pos32 = malloc((size_t)c->tokens * 4);
  float *ref = malloc((size_t)(c->tokens * c->heads * c->rope) * 4);
  float *gpu = malloc((size_t)(c->tokens * c->heads * c->rope) * 4);
  CHECK(x && got && inv_freq && pair && pos && pos32 && ref && gpu);
  if (!(x && got && inv_freq && pair && pos && pos32 && ref && gpu)) goto done;
  fill_bf16(x, n, 1.0f, rng);
  /* theta 10000, optionally YaRN-like scaling of the low frequencies */
  const float theta = test_rng_int(rng, 0, 1) ? 10000.0f : 500000.0f;
  for (int32_t i = 0; i < half; i++) {
    inv_freq[i] = 1.0f / powf(theta, (float)(2 * i) / (float)c->rope);
    if (i > half / 2 && test_rng_int(rng, 0, 1)) inv_freq[i] /= 40.0f;
  }
  for (int64_t t = 0; t < c->tokens; t++) {
    pos[t] = t % 7 == 3 ? 163839 - t : test_rng_int(rng, 0, t % 2 ? 4096 : 163839);
    pos32[t] = (int32_t)pos[t];
  }

  dev_buf_t dx = dev_buf_from(x, n * 2, 0x33);
  dev_buf_t df = dev_buf_from(inv_freq, (size_t)half * 4, 0);
  dev_buf_t dp = c->pos_dtype == INA_DTYPE_I64 ? dev_buf_from(pos, (size_t)c->tokens * 8, 0)
                                               : dev_buf_from(pos32, (size_t)c->tokens * 4, 0);
  if (!dx.p || !df.p || !dp.p) goto free_dev;
  ina_gpu_rope_params_t p = INA_GPU_ROPE_PARAMS_INIT;
  p.tokens = c->tokens;
  p.heads = c->heads;
  p.x = dx.p;
  p.token_stride = token_stride;
  p.head_stride = head_stride;
  p.rope_offset = c->nope;
  p.rope_dim = c->rope;
  p.inv_freq = df.p;
  p.attention_factor = c->attention_factor;
  p.pairs_layout = c->pairs;
  p.positions = dp.p;
  p.positions_dtype = c->pos_dtype;
  CHECK_OK(ina_gpu_rope(&p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dx, got, what);

  size_t outside = 0, bad = 0, k = 0;
  for (int64_t t = 0; t < c->tokens; t++) {
    for (int32_t h = 0; h < c->heads; h++) {
      const int64_t at = t * token_stride + h * head_stride + c->nope;
      ina_to_f32(x + at, INA_DTYPE_BF16, pair, (size_t)c->rope);
      ina_cpu_rope(pair, c->rope, pos[t], inv_freq, c->attention_factor, c->pairs);
      for (int32_t i = 0; i < c->rope; i++) {
        ref[k + i] = pair[i];
        gpu[k + i] = ina_bf16_to_f32(got[at + i]);
      }
      /* Each rotated pair: error within bf16 rounding of the pair's length. */
      for (int32_t i = 0; i < half; i++) {
        const int32_t a = c->pairs ? 2 * i : i, b = c->pairs ? 2 * i + 1 : i + half;
        const double len = hypot(ref[k + a], ref[k + b]);
        const double tol = 0x1p-8 * len + 1e-30;
        if (!(fabs(gpu[k + a] - ref[k + a]) <= tol && fabs(gpu[k + b] - ref[k + b]) <= tol) &&
            bad++ < 5)
          fprintf(stderr, "%s: token %lld head %d pair %d: (%g, %g), reference (%g, %g)\n", what,
                  (long long)t, h, i, gpu[k + a], gpu[k + b], ref[k + a], ref[k + b]);
      }
      k += (size_t)c->rope;
    }
  }
  /* Everything but the rope parts keeps its bits. */
  for (size_t i = 0; i < n; i++) {
    const int64_t t = (int64_t)i / token_stride, in_token = (int64_t)i % token_stride;
    const int64_t h = in_token / head_stride, in_head = in_token % head_stride;
    const int rope_part = h < c->heads && in_head >= c->nope && in_head < c->nope + c->rope;
    (void)t;
    if (!rope_part) outside += got[i] != x[i];
  }
  CHECKF(bad == 0, "%s: %zu pairs outside the bf16 tolerance", what, bad);
  CHECKF(outside == 0, "%s: %zu elements outside the rope parts changed", what, outside);
  const double err = test_rel_l2(gpu, ref, k);
  CHECKF(err <= 1e-2, "%s: relative L2 error %.3g", what, err);
free_dev:
  dev_buf_free(&dx);
  dev_buf_free(&df);
  dev_buf_free(&dp);
done:
  free(x);
  free(got);
  free(inv_freq);
  free(pair);
  free(pos);
  free(pos32);
  free(ref);
  free(gpu);
}

static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 4096, &d));
  if (!d) return;
  ina_gpu_rope_params_t p = INA_GPU_ROPE_PARAMS_INIT;
  p.tokens = 2;
  p.heads = 2;
  p.x = d;
  p.head_stride = 192;
  p.token_stride = 384;
  p.rope_offset = 128;
  p.rope_dim = 64;
  p.inv_freq = (const float *)((char *)d + 1024);
  p.positions = (char *)d + 2048;
  ina_log_set_quiet_errors(1);
  ina_gpu_rope_params_t b = p;
  b.rope_dim = 63;
  CHECK(ina_gpu_rope(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.head_stride = 32; /* heads overlap */
  CHECK(ina_gpu_rope(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.token_stride = 100;
  CHECK(ina_gpu_rope(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.positions_dtype = INA_DTYPE_F32;
  CHECK(ina_gpu_rope(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.inv_freq = NULL;
  CHECK(ina_gpu_rope(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  b = p;
  b.attention_factor = NAN;
  CHECK(ina_gpu_rope(&b, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  b = p;
  b.tokens = 0;
  CHECK_OK(ina_gpu_rope(&b, NULL));
  ina_cuda_free(d);
}

int main(int argc, char **argv) {
  test_rng_t rng;
  const int skip = gpu_test_start("test_gpu_rope", argc, argv, &rng);
  if (skip) return skip;
  test_arguments();
  static const case_t fixed[] = {
      /* tokens, heads, nope, rope, head_pad, token_pad, pairs, positions, factor */
      {1, 1, 0, 2, 0, 0, 1, INA_DTYPE_I64, 1.0f},
      {3, 128, 128, 64, 0, 0, 1, INA_DTYPE_I64, 1.0f},  /* V3 query, TP1 */
      {17, 16, 128, 64, 0, 0, 1, INA_DTYPE_I32, 1.2f},  /* TP8 with a YaRN factor */
      {64, 16, 128, 64, 0, 0, 0, INA_DTYPE_I64, 1.0f},  /* halves layout */
      {33, 1, 512, 64, 0, 0, 1, INA_DTYPE_I64, 1.0f},   /* key rope of [kv_lora | rope] */
      {9, 3, 5, 6, 3, 7, 0, INA_DTYPE_I32, 0.9f},       /* odd everything */
      {200, 20, 64, 32, 0, 11, 1, INA_DTYPE_I64, 1.0f}, /* 20 heads: two head groups */
  };
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) run_case(&fixed[i], &rng);
  const int random_cases = gpu_test_quick ? 5 : 30;
  for (int i = 0; i < random_cases; i++) {
    case_t c = {0};
    c.tokens = test_rng_int(&rng, 1, 150);
    c.heads = (int32_t)test_rng_int(&rng, 1, 40);
    c.nope = (int32_t)test_rng_int(&rng, 0, 130);
    c.rope = 2 * (int32_t)test_rng_int(&rng, 1, 64);
    c.head_pad = test_rng_int(&rng, 0, 1) ? test_rng_int(&rng, 0, 9) : 0;
    c.token_pad = test_rng_int(&rng, 0, 1) ? test_rng_int(&rng, 0, 9) : 0;
    c.pairs = (int)test_rng_int(&rng, 0, 1);
    c.pos_dtype = test_rng_int(&rng, 0, 1) ? INA_DTYPE_I64 : INA_DTYPE_I32;
    c.attention_factor = test_rng_int(&rng, 0, 1) ? 1.0f : 0.5f + (float)test_rng_uniform(&rng);
    run_case(&c, &rng);
  }
  return test_finish("test_gpu_rope");
}
