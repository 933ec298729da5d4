/* The byte accounting of bench_decode's roofline (bench/decode_roofline.h): every
 * component against sizes derived here from the configuration fields alone (the
 * DeepSeek-V2/V3 layer shapes and the CUDA engine's storage rules written out by hand),
 * for V2-Lite and tiny variants (q LoRA, router bias, tied embeddings, FP8 dims the GEMM
 * cannot take), bf16 and FP8, at random batch and context; the expected number of
 * experts hit against a simulation of uniform routing; and the refused arguments. */
#include <math.h>
#include <string.h>

#include "bench/decode_roofline.h"
#include "core/log.h"
#include "model/config.h"
#include "../test_util.h"

/* ---- sizes by hand ------------------------------------------------------------------ */

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* One [n, k] linear as the engine stores it: FP8 (1 byte + an f32 per 128x128 block)
 * when fp8 and the GEMM takes the dims, else bf16. */
static int64_t linear(int64_t n, int64_t k, int fp8) {
  if (fp8 && n % 16 == 0 && k % 16 == 0) return n * k + 4 * ceil_div(n, 128) * ceil_div(k, 128);
  return 2 * n * k;
}

static int64_t mlp(int64_t hidden, int64_t inter, int fp8) {
  return 2 * linear(inter, hidden, fp8) + linear(hidden, inter, fp8);
}

typedef struct expected {
  int64_t embedding, lm_head, other, expert, model;
  int32_t moe_layers;
} expected_t;

static expected_t expect(const ina_model_config_t *c, int fp8, int64_t batch) {
  expected_t e;
  const int64_t H = c->hidden_size, heads = c->num_heads, C = c->kv_lora_rank, R = c->qk_rope_head_dim;
  const int64_t qk = c->qk_nope_head_dim + R, E = c->n_routed_experts;
  memset(&e, 0, sizeof e);
  e.embedding = (batch < c->vocab_size ? batch : c->vocab_size) * H * 2;
  e.lm_head = (int64_t)c->vocab_size * H * 2; /* lm_head stays bf16 */
  e.expert = mlp(H, c->moe_intermediate_size, fp8);
  for (int32_t l = 0; l < c->num_layers; l++) {
    int64_t b = 2 * H * 4; /* input and post-attention norms, f32 */
    if (c->q_lora_rank > 0)
      b += linear(c->q_lora_rank, H, fp8) + c->q_lora_rank * 4 + linear(heads * qk, c->q_lora_rank, fp8);
    else
      b += linear(heads * qk, H, fp8);
    b += linear(C + R, H, fp8) + C * 2;                   /* kv_a, its norm in bf16 */
    b += 2 * heads * (c->qk_nope_head_dim + c->v_head_dim) * C; /* kv_b, always bf16 */
    b += linear(H, heads * c->v_head_dim, fp8);           /* o_proj */
    if (E > 0 && l >= c->first_k_dense_replace) {
      e.moe_layers++;
      b += E * H * 2; /* router, bf16 */
      if (c->scoring == INA_SCORING_SIGMOID_NOAUX_TC) b += E * 4;
      if (c->n_shared_experts > 0) b += mlp(H, (int64_t)c->n_shared_experts * c->moe_intermediate_size, fp8);
    } else {
      b += mlp(H, c->intermediate_size, fp8);
    }
    e.other += b;
  }
  e.other += H * 4; /* final norm */
  e.model = e.other + (int64_t)e.moe_layers * E * e.expert + 2 * e.lm_head;
  return e;
}

/* ---- checks ------------------------------------------------------------------------- */

static void check_config(const char *what, const ina_model_config_t *c, ina_dtype_t dtype, int64_t batch,
                         int64_t context) {
  ina_decode_roofline_t r;
  const int fp8 = dtype == INA_DTYPE_FP8_E4M3;
  const expected_t e = expect(c, fp8, batch);
  CHECK_OK(ina_decode_roofline(c, dtype, batch, context, &r));
  const double hit = c->n_routed_experts * (1.0 - pow(1.0 - (double)c->num_experts_per_tok / c->n_routed_experts,
                                                      (double)batch));
  const double routed = (double)e.moe_layers * hit * (double)e.expert;
  const int64_t kv = batch * context * (c->kv_lora_rank + c->qk_rope_head_dim) * 2 * c->num_layers;
  const int64_t act = batch * c->hidden_size * 2 * 8 * c->num_layers + batch * (int64_t)c->vocab_size * 4;
  const double total = (double)(e.embedding + e.lm_head + e.other) + routed + (double)(kv + act);
  CHECKF(r.embedding_bytes == e.embedding, "%s B%lld: embedding %lld, expected %lld", what, (long long)batch,
         (long long)r.embedding_bytes, (long long)e.embedding);
  CHECKF(r.lm_head_bytes == e.lm_head, "%s: lm_head %lld, expected %lld", what, (long long)r.lm_head_bytes,
         (long long)e.lm_head);
  CHECKF(r.other_weight_bytes == e.other, "%s: other weights %lld, expected %lld", what,
         (long long)r.other_weight_bytes, (long long)e.other);
  CHECKF(r.expert_bytes == e.expert, "%s: expert %lld, expected %lld", what, (long long)r.expert_bytes,
         (long long)e.expert);
  CHECKF(r.moe_layers == e.moe_layers, "%s: %d MoE layers, expected %d", what, r.moe_layers, e.moe_layers);
  CHECKF(fabs(r.experts_hit - hit) <= 1e-9 * hit, "%s B%lld: %.9g experts hit, expected %.9g", what,
         (long long)batch, r.experts_hit, hit);
  CHECKF(fabs(r.routed_bytes - routed) <= 1e-9 * routed, "%s: routed %.6g, expected %.6g", what, r.routed_bytes,
         routed);
  CHECKF(r.kv_bytes == kv, "%s B%lld ctx%lld: kv %lld, expected %lld", what, (long long)batch, (long long)context,
         (long long)r.kv_bytes, (long long)kv);
  CHECKF(r.activation_bytes == act, "%s: activations %lld, expected %lld", what, (long long)r.activation_bytes,
         (long long)act);
  CHECKF(fabs(r.total_bytes - total) <= 1e-9 * total, "%s: total %.6g, expected %.6g", what, r.total_bytes, total);
  CHECKF(fabs(r.weight_bytes + (double)(r.kv_bytes + r.activation_bytes) - r.total_bytes) <= 1e-9 * total,
         "%s: the components do not add up to the total", what);
  CHECKF(r.model_bytes == e.model, "%s: model %lld, expected %lld", what, (long long)r.model_bytes,
         (long long)e.model);
}

/* Fixed facts of V2-Lite that do not depend on the derivation above: its size (15.7B
 * parameters), one token reading top_k experts, a large batch reading all of them. */
static void test_v2_lite_facts(void) {
  ina_model_config_t c;
  ina_decode_roofline_t b1, big, fp8;
  CHECK_OK(ina_model_config_builtin("v2-lite", &c));
  CHECK_OK(ina_decode_roofline(&c, INA_DTYPE_BF16, 1, 1024, &b1));
  CHECK_OK(ina_decode_roofline(&c, INA_DTYPE_BF16, 4096, 1, &big));
  CHECK_OK(ina_decode_roofline(&c, INA_DTYPE_FP8_E4M3, 1, 1024, &fp8));
  CHECKF(b1.model_bytes > 2 * 15.5e9 && b1.model_bytes < 2 * 16.0e9, "v2-lite bf16: %lld bytes of weights",
         (long long)b1.model_bytes);
  CHECK(b1.moe_layers == 26 && fabs(b1.experts_hit - 6.0) < 1e-12);
  CHECK(fabs(b1.routed_bytes - 26.0 * 6.0 * (double)b1.expert_bytes) < 1.0);
  CHECK(b1.expert_bytes == 3 * 2048 * 1408 * 2);
  CHECK(b1.embedding_bytes == 2048 * 2 && b1.lm_head_bytes == 102400LL * 2048 * 2);
  CHECK(b1.kv_bytes == 1024LL * 576 * 2 * 27);
  /* Every expert of every layer, so the weights read are the model's but the unused
   * embedding rows. */
  CHECK(fabs(big.experts_hit - 64.0) < 1e-9);
  CHECKF(fabs(big.weight_bytes - (double)(big.model_bytes - (102400LL - 4096) * 2048 * 2)) < 1e3,
         "weights read %.6g vs model %lld", big.weight_bytes, (long long)big.model_bytes);
  /* FP8 halves the linears, not the LM head, kv_b or the rest. */
  CHECK(fp8.expert_bytes == 3 * (2048LL * 1408 + 4 * 16 * 11));
  CHECK(fp8.lm_head_bytes == b1.lm_head_bytes && fp8.embedding_bytes == b1.embedding_bytes);
  CHECK(fp8.model_bytes > b1.model_bytes / 2 && fp8.model_bytes < b1.model_bytes * 6 / 10);
}

static void test_configs(test_rng_t *rng) {
  ina_model_config_t v2, tiny, odd, tied;
  CHECK_OK(ina_model_config_builtin("v2-lite", &v2));
  CHECK_OK(ina_model_config_builtin("tiny", &tiny));
  odd = tiny; /* expert and o_proj dims the FP8 GEMM does not take: those stay bf16 */
  odd.moe_intermediate_size = 72;
  odd.v_head_dim = 24;
  tied = tiny;
  tied.tie_word_embeddings = 1;
  const struct {
    const char *name;
    const ina_model_config_t *cfg;
  } configs[] = {{"v2-lite", &v2}, {"tiny", &tiny}, {"tiny-odd", &odd}, {"tiny-tied", &tied}};
  const ina_dtype_t dtypes[] = {INA_DTYPE_BF16, INA_DTYPE_FP8_E4M3};
  const int64_t fixed_batches[] = {1, 8, 64, 256};
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
    for (int d = 0; d < 2; d++) {
      for (int b = 0; b < 4; b++) check_config(configs[i].name, configs[i].cfg, dtypes[d], fixed_batches[b], 4096);
      for (int r = 0; r < 3; r++)
        check_config(configs[i].name, configs[i].cfg, dtypes[d], test_rng_int(rng, 1, 5000),
                     test_rng_int(rng, 1, 200000));
    }
}

/* Mean distinct experts over simulated steps of uniform top-k routing. */
static double simulate_hits(test_rng_t *rng, int32_t experts, int32_t top_k, int64_t tokens, int trials) {
  int perm[256];
  double sum = 0.0;
  for (int t = 0; t < trials; t++) {
    int hit[256] = {0};
    int distinct = 0;
    for (int64_t tok = 0; tok < tokens; tok++) {
      for (int x = 0; x < experts; x++) perm[x] = x;
      for (int j = 0; j < top_k; j++) { /* partial Fisher-Yates: top_k distinct experts */
        const int pick = (int)test_rng_int(rng, j, experts - 1), tmp = perm[j];
        perm[j] = perm[pick];
        perm[pick] = tmp;
        if (!hit[perm[j]]) distinct++;
        hit[perm[j]] = 1;
      }
    }
    sum += distinct;
  }
  return sum / trials;
}

static void test_experts_hit(test_rng_t *rng) {
  CHECK(ina_decode_experts_hit(64, 6, 1) == 6.0);
  CHECK(fabs(ina_decode_experts_hit(64, 64, 3) - 64.0) < 1e-12);
  CHECK(ina_decode_experts_hit(64, 6, 0) == 0.0 && ina_decode_experts_hit(0, 6, 8) == 0.0);
  CHECK(ina_decode_experts_hit(64, 0, 8) == 0.0);
  CHECK(fabs(ina_decode_experts_hit(8, 20, 2) - 8.0) < 1e-12); /* top_k clamped to E */
  double last = 0.0;
  for (int64_t b = 1; b <= 512; b *= 2) {
    const double h = ina_decode_experts_hit(64, 6, b);
    CHECK(h > last && h <= 64.0);
    last = h;
  }
  for (int i = 0; i < 6; i++) {
    const int32_t E = (int32_t)test_rng_int(rng, 2, 256), k = (int32_t)test_rng_int(rng, 1, E < 8 ? E : 8);
    const int64_t B = test_rng_int(rng, 1, 300);
    const double expected = ina_decode_experts_hit(E, k, B);
    const double mean = simulate_hits(rng, E, k, B, 400);
    /* The count has variance below E / 4; 400 trials put the mean within 0.15 sqrt(E). */
    CHECKF(fabs(mean - expected) <= 0.15 * sqrt((double)E) + 1e-9,
           "E %d top-k %d tokens %lld: simulated %.3f, formula %.3f", E, k, (long long)B, mean, expected);
  }
}

static void test_refused(void) {
  ina_model_config_t c;
  ina_decode_roofline_t r;
  CHECK_OK(ina_model_config_builtin("tiny", &c));
  ina_log_set_quiet_errors(1);
  memset(&r, 0x5a, sizeof r);
  CHECK(ina_decode_roofline(&c, INA_DTYPE_BF16, 0, 10, &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(r.total_bytes == 0.0 && r.model_bytes == 0);
  CHECK(ina_decode_roofline(&c, INA_DTYPE_BF16, 4, 0, &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_decode_roofline(&c, INA_DTYPE_I32, 4, 10, &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(r.total_bytes == 0.0);
  CHECK(ina_decode_roofline(NULL, INA_DTYPE_BF16, 4, 10, &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_decode_roofline(&c, INA_DTYPE_BF16, 4, 10, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_decode_roofline(&c, INA_DTYPE_BF16, INT64_MAX / 2, INT64_MAX / 2, &r) == INA_ERR_INVALID_ARGUMENT);
  c.num_layers = 0;
  CHECK(ina_decode_roofline(&c, INA_DTYPE_BF16, 4, 10, &r) != INA_OK);
  ina_log_set_quiet_errors(0);
}

int main(void) {
  test_rng_t rng = {test_seed("test_decode_roofline")};
  test_v2_lite_facts();
  test_configs(&rng);
  test_experts_hit(&rng);
  test_refused();
  return test_finish("test_decode_roofline");
}
