/* Roofline bytes of a decode step (bench/decode_roofline.h): the weight spec list walked
 * with the CUDA engine's storage rules. */
#define INA_LOG_SUBSYS "bench"
#include "bench/decode_roofline.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/weights.h"

/* int64 byte counts stay far below this (2^62). */
#define MAX_COUNTED_BYTES 4.6e18

double ina_decode_experts_hit(int32_t experts, int32_t top_k, int64_t tokens) {
  if (experts <= 0 || tokens <= 0) return 0.0;
  if (top_k < 0) top_k = 0;
  if (top_k > experts) top_k = experts;
  const double miss = 1.0 - (double)top_k / (double)experts; /* one token skips an expert */
  return (double)experts * (1.0 - pow(miss, (double)tokens));
}

static int64_t spec_numel(const ina_weight_spec_t *s) {
  return s->ndim == 2 ? s->shape[0] * s->shape[1] : s->shape[0];
}

/* Bytes of one tensor as the CUDA engine stores it (the rules of engine_gpu.h). */
static int64_t stored_bytes(const ina_weights_t *w, const ina_weight_spec_t *s, ina_dtype_t dtype) {
  const int64_t n = spec_numel(s);
  const ina_layer_weights_t *L = s->layer >= 0 ? &w->layers[s->layer] : NULL;
  switch (s->role) {
  case INA_WEIGHT_LINEAR: {
    const int64_t rows = s->shape[0], cols = s->shape[1];
    /* kv_b_proj feeds the bf16 absorption GEMMs; the FP8 GEMM needs N, K % 16 == 0. */
    const int is_kv_b = L && s->linear == &L->kv_b_proj;
    if (dtype != INA_DTYPE_FP8_E4M3 || is_kv_b || rows % 16 != 0 || cols % 16 != 0) return 2 * n;
    const int64_t br = w->config.fp8_block_rows, bc = w->config.fp8_block_cols;
    const int64_t blocks = ((rows + br - 1) / br) * ((cols + bc - 1) / bc);
    return n + 4 * blocks; /* e4m3 values + f32 block scales */
  }
  case INA_WEIGHT_LINEAR_BF16:
  case INA_WEIGHT_EMBEDDING: return 2 * n;
  case INA_WEIGHT_BIAS: /* V3.2's index k_norm bias is kept in f32 like its weight */
    return L && s->tensor == &L->index_k_norm_bias ? 4 * n : 2 * n;
  case INA_WEIGHT_ROUTER: return dtype == INA_DTYPE_F32 ? 4 * n : 2 * n; /* f32: bf16 hi + lo */
  case INA_WEIGHT_NORM: return L && s->tensor == &L->kv_a_norm ? 2 * n : 4 * n;
  case INA_WEIGHT_ROUTER_BIAS: return 4 * n;
  }
  return 2 * n;
}

ina_status_t ina_decode_roofline(const ina_model_config_t *cfg, ina_dtype_t dtype, int64_t batch,
                                 int64_t context, ina_decode_roofline_t *out) {
  ina_status_t st = INA_OK;
  ina_weights_t w;
  ina_weight_spec_t *specs = NULL;
  int32_t count = 0;
  int64_t routed_all = 0; /* every routed expert of every layer */
  memset(&w, 0, sizeof w);
  INA_REQUIRE(out != NULL && cfg != NULL, INA_ERR_INVALID_ARGUMENT, "decode roofline: NULL argument");
  memset(out, 0, sizeof *out);
  INA_REQUIRE(batch >= 1 && context >= 1, INA_ERR_INVALID_ARGUMENT,
              "decode roofline: batch (%lld) and context (%lld) must be >= 1", (long long)batch,
              (long long)context);
  /* The shell has the config random weights of dtype get (FP8 block sizes) and lists
   * every tensor with its shape and role; it holds no data. */
  INA_CHECK(ina_weights_random_shell(cfg, dtype, NULL, &w));
  INA_CHECK(ina_weight_specs(&w, &specs, &count));
  const ina_model_config_t *c = &w.config;
  const int64_t hidden = c->hidden_size, layers = c->num_layers, vocab = c->vocab_size;
  const double entry = (double)(c->kv_lora_rank + c->qk_rope_head_dim) * 2.0; /* one latent entry, bf16 */
  double kv, index_keys = 0.0, latent, scores = 0.0;
  if (ina_cfg_has_indexer(c)) {
    /* The indexer reads every visible position's index key and writes and reads back one
     * f32 score per position; sparse MLA then reads the index_topk entries it kept. */
    const double kept = (double)(context < c->index_topk ? context : c->index_topk);
    index_keys = (double)batch * (double)context * (double)c->index_head_dim * 2.0 * (double)layers;
    latent = (double)batch * kept * entry * (double)layers;
    scores = (double)batch * (double)context * 4.0 * 2.0 * (double)layers;
  } else {
    latent = (double)batch * (double)context * entry * (double)layers;
  }
  kv = latent + index_keys;
  const double act = (double)batch * (double)hidden * 2.0 * INA_DECODE_ACT_PASSES_PER_LAYER * (double)layers +
                     (double)batch * (double)vocab * 4.0;
  INA_REQUIRE(kv < MAX_COUNTED_BYTES && scores < MAX_COUNTED_BYTES && act < MAX_COUNTED_BYTES,
              INA_ERR_INVALID_ARGUMENT,
              "decode roofline: batch %lld x context %lld is too large to count", (long long)batch,
              (long long)context);

  for (int32_t i = 0; i < count; i++) {
    const ina_weight_spec_t *s = &specs[i];
    const int64_t bytes = stored_bytes(&w, s, dtype);
    out->model_bytes += bytes;
    if (s->role == INA_WEIGHT_EMBEDDING) {
      const int64_t rows = batch < s->shape[0] ? batch : s->shape[0];
      out->embedding_bytes = rows * s->shape[1] * 2;
      if (c->tie_word_embeddings) {
        /* The LM head reads the whole matrix; the engine holds it as a second copy. */
        out->lm_head_bytes = bytes;
        out->model_bytes += bytes;
      }
    } else if (s->linear == &w.lm_head) {
      out->lm_head_bytes = bytes;
    } else if (s->expert >= 0) {
      routed_all += bytes;
    } else {
      out->other_weight_bytes += bytes;
    }
  }
  for (int32_t l = 0; l < c->num_layers; l++) out->moe_layers += ina_cfg_layer_is_moe(c, l);
  if (out->moe_layers > 0 && c->n_routed_experts > 0) {
    const int64_t experts = (int64_t)out->moe_layers * c->n_routed_experts;
    out->expert_bytes = routed_all / experts;
    out->experts_hit = ina_decode_experts_hit(c->n_routed_experts, c->num_experts_per_tok, batch);
    out->routed_bytes = (double)routed_all * out->experts_hit / (double)c->n_routed_experts;
  }
  out->kv_bytes = (int64_t)kv;
  if (ina_cfg_has_indexer(c)) {
    out->index_key_bytes = (int64_t)index_keys;
    out->latent_bytes = (int64_t)latent;
    out->score_bytes = (int64_t)scores;
  }
  out->activation_bytes = (int64_t)act;
  out->weight_bytes = (double)out->embedding_bytes + (double)out->lm_head_bytes +
                      (double)out->other_weight_bytes + out->routed_bytes;
  out->total_bytes =
      out->weight_bytes + (double)out->kv_bytes + (double)out->score_bytes + (double)out->activation_bytes;
fail:
  free(specs);
  ina_weights_release(&w);
  if (st != INA_OK && out) memset(out, 0, sizeof *out);
  return st;
}
