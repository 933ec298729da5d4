/* The memory roofline of one decode step of a DeepSeek-V2/V3/V3.2 model on the CUDA engine:
 * the bytes a step of `batch` sequences (one new token each) attending `context` cached
 * positions must move at least once, counted from the model's weight spec list
 * (model/weights.h) with the storage rules of the CUDA engine (model/engine_gpu.h).
 * bench_decode divides the total by the read ceiling measured in the same run.
 *
 * What is counted (bytes):
 *   embedding   batch rows of the bf16 embedding (one row per token; the rest is never
 *               read)
 *   lm_head     the whole LM head (every token's logits need every row)
 *   other       every other weight that is not a routed expert, once: attention
 *               projections, dense MLPs, shared experts, routers, norms
 *   routed      per MoE layer, the expected number of distinct routed experts that
 *               batch tokens hit under uniform routing (each token picks top_k of E
 *               experts): E * (1 - (1 - top_k / E)^batch), times one expert's bytes
 *   kv          the cache entries the step reads, bf16 (2 bytes), per layer:
 *               dense MLA (V2, V3): batch * context * (kv_lora_rank + qk_rope_head_dim)
 *               * 2 * layers: every visible latent entry;
 *               DeepSeek-V3.2 (ina_cfg_has_indexer): the indexer scores every visible
 *               position and sparse MLA reads only the index_topk it keeps, so per
 *               sequence and layer context * index_head_dim * 2 (the index keys, which
 *               the engine stores in bf16 beside the latent in each cache entry) plus
 *               min(context, index_topk) * (kv_lora_rank + qk_rope_head_dim) * 2; times
 *               batch * layers
 *   scores      V3.2 only: the indexer's f32 score rows, written once and read once by
 *               the top-k: batch * context * 4 * 2 * layers (0 for dense models)
 *   activations batch * hidden * 2 (bf16) * INA_DECODE_ACT_PASSES_PER_LAYER * layers
 *               + batch * vocab * 4 (the f32 logits, written once)
 * total = weights + kv + scores + activations. The indexer's own weights (wq_b, wk,
 * k_norm, weights_proj) are among `other`; its queries and keys of the new tokens are
 * activations too small to count.
 * Stored sizes per element, as the CUDA engine keeps them: FP8 linears (dtype fp8_e4m3,
 * N and K multiples of 16) 1 byte plus one f32 scale per 128 x 128 block; kv_b_proj
 * (the absorption GEMMs read bf16), other linears, the LM head, the embedding and the
 * router 2 bytes (an f32 router is kept as two bf16 matrices: 4); RMSNorm weights 4
 * (f32), except kv_a_layernorm 2; the router's correction bias 4; linear biases 2, but
 * V3.2's index k_norm bias 4 (f32, as its weight); the indexer's weights_proj as a router.
 *
 * Thread safety: pure functions, thread-safe. */
#ifndef INA_BENCH_DECODE_ROOFLINE_H
#define INA_BENCH_DECODE_ROOFLINE_H

#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Passes over the [batch, hidden] bf16 residual rows per layer: each of the layer's two
 * fused residual add + RMSNorm ops reads the block output and the residual stream and
 * writes the new residual stream and the normalized input of the next block. The
 * smaller intermediates (q, latent queries, expert activations) are not counted. */
#define INA_DECODE_ACT_PASSES_PER_LAYER 8

typedef struct ina_decode_roofline {
  int64_t embedding_bytes; /* batch rows of the embedding */
  int64_t lm_head_bytes;
  int64_t other_weight_bytes;  /* non-routed weights but embedding and LM head, all layers */
  int32_t moe_layers;
  int64_t expert_bytes;        /* one routed expert: gate + up + down (+ scales) */
  double experts_hit;          /* expected distinct routed experts per MoE layer */
  double routed_bytes;         /* moe_layers * experts_hit * expert_bytes */
  int64_t kv_bytes;            /* cache entries read: latent (+ V3.2's index keys) */
  int64_t activation_bytes;
  double weight_bytes;         /* embedding + lm_head + other + routed */
  double total_bytes;          /* weight_bytes + kv_bytes + score_bytes + activation_bytes */
  int64_t model_bytes;         /* every weight as the engine stores it (all experts, the
                                  whole embedding): what its device copy should take */
  /* DeepSeek-V3.2 (0 for dense models): the parts of kv_bytes, and the score rows. */
  int64_t index_key_bytes;     /* batch * context * index_head_dim * 2 * layers */
  int64_t latent_bytes;        /* batch * min(context, index_topk) * (kv_lora_rank + rope) * 2 * layers */
  int64_t score_bytes;         /* batch * context * 4 * 2 * layers */
} ina_decode_roofline_t;

/* Expected number of distinct experts that `tokens` tokens hit when each picks top_k
 * distinct experts of `experts` uniformly at random, independently of the others:
 * experts * (1 - (1 - top_k / experts)^tokens). 0 when experts <= 0 or tokens <= 0;
 * top_k is clamped to [0, experts]. */
double ina_decode_experts_hit(int32_t experts, int32_t top_k, int64_t tokens);

/* The roofline bytes of one decode step of cfg's model, its random weights made as
 * `dtype` (f32, bf16 or fp8_e4m3, as ina_weights_random) and held by one rank (all
 * experts), for `batch` >= 1 sequences whose new token attends `context` >= 1 positions
 * (its own included). Errors: INA_ERR_INVALID_ARGUMENT for a NULL pointer, batch or
 * context < 1, or a dtype random weights do not take; the config's own errors
 * (ina_model_config_validate). On failure *out is zeroed. */
ina_status_t ina_decode_roofline(const ina_model_config_t *cfg, ina_dtype_t dtype, int64_t batch,
                                 int64_t context, ina_decode_roofline_t *out);

#ifdef __cplusplus
}
#endif
#endif
