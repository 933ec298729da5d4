/* Causal multi-head attention of one request's new tokens over its whole context, in
 * the expanded (non-absorbed) form: the reference for prefill and append kernels (MLA
 * prefill uses qk_dim 192 and v_dim 128 for DeepSeek), and the CPU backend's prefill.
 *
 * q holds the last q_len of the kv_len tokens: query j sees keys t < kv_len - q_len + j + 1.
 * Scores are (q . k) * scale; lse (optional) is the natural log of the softmax sum.
 * Thread safety: reentrant; `pool` as in core/threadpool.h. */
#ifndef INA_ATTENTION_PREFILL_REF_H
#define INA_ATTENTION_PREFILL_REF_H

#include <stdint.h>

#include "core/status.h"
#include "core/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_prefill_ref_params {
  int32_t q_len, kv_len, num_heads, qk_dim, v_dim;
  float scale;
  const float *q; /* [q_len, heads, qk_dim] */
  const float *k; /* [kv_len, heads, qk_dim] */
  const float *v; /* [kv_len, heads, v_dim] */
  float *out;     /* [q_len, heads, v_dim] */
  float *lse;     /* [q_len, heads] or NULL */
} ina_prefill_ref_params_t;

ina_status_t ina_attention_prefill_ref(const ina_prefill_ref_params_t *p, ina_threadpool_t *pool);

#ifdef __cplusplus
}
#endif
#endif
