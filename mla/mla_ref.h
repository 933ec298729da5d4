/* MLA attention in absorbed form over the paged latent cache: the plain-C reference
 * (fp32 math, double softmax sums) that GPU kernels are checked against, and the CPU
 * backend's decode attention.
 *
 * Each cache entry (mla/mla_cache.h) holds the normalized compressed kv (kv_lora_rank
 * values, also the "value" of absorbed attention) and the rope'd key (rope_dim values);
 * FP8 latents are dequantized with their block scales. With the
 * query already absorbed (q_nope x W_UK per head, kv_lora_rank values) the score of token
 * t for head h is (q_abs[h] . latent[t] + q_pe[h] . k_pe[t]) * softmax_scale and the
 * output is sum_t p_t latent[t]; W_UV is applied afterwards by the caller.
 *
 * Requests are ragged: request b has qo_indptr[b+1] - qo_indptr[b] query tokens (1 for
 * decode, more for speculative steps or chunks) which are the last of its kv_len[b]
 * tokens; query j of the request sees positions t < kv_len[b] - q_len + j + 1 (causal).
 * Its pages are kv_indices[kv_indptr[b] .. kv_indptr[b+1]) in FlashInfer's layout.
 *
 * lse (optional) is the natural log of sum_t exp(score_t), scores already scaled.
 * Thread safety: reentrant; `pool` as in core/threadpool.h. */
#ifndef INA_MLA_MLA_REF_H
#define INA_MLA_MLA_REF_H

#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "mla/mla_cache.h"
#include "core/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_mla_ref_params {
  int32_t batch;
  int32_t num_heads;
  int32_t kv_lora_rank;
  int32_t rope_dim;
  float softmax_scale;
  const int32_t *qo_indptr; /* [batch + 1] */
  const int32_t *kv_len;    /* [batch] */
  const int32_t *kv_indptr; /* [batch + 1] */
  const int32_t *kv_indices;
  const float *q_nope; /* [tokens, heads, kv_lora_rank] (absorbed) */
  const float *q_pe;   /* [tokens, heads, rope_dim] */
  ina_mla_cache_t cache; /* any format; its kv_lora_rank / rope_dim must match */
  float *out;              /* [tokens, heads, kv_lora_rank] */
  float *lse;              /* [tokens, heads] or NULL */
} ina_mla_ref_params_t;

ina_status_t ina_mla_attention_ref(const ina_mla_ref_params_t *p, ina_threadpool_t *pool);

#ifdef __cplusplus
}
#endif
#endif
