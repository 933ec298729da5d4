/* What the indexer's score kernels share (attention/dsa_score.cu, dsa_score_fp8.cu),
 * internal to attention/: the arguments every one of them takes, filled from the run's
 * parameters by one function, and the end of an epilogue whose 4 threads of a row hold
 * disjoint heads' terms. */
#ifndef INA_ATTENTION_DSA_SCORE_COMMON_CUH
#define INA_ATTENTION_DSA_SCORE_COMMON_CUH

#include <math.h>
#include <stdint.h>

#include "attention/dsa_gpu.h"

namespace ina_dsa_score_common {

struct ScoreArgs {
  const uint16_t *q;
  const float *weights;
  const char *keys;
  int64_t page_stride, token_stride, scale_offset, scale_stride;
  const int32_t *kv_indptr, *kv_indices;
  const ina_dsa_gpu_ws_header_t *header;
  const ina_dsa_gpu_token_row_t *rows;
  float softmax_scale;
  float *scores;
  int32_t score_stride, page_size, num_heads, head_dim;
  int32_t page_shift; /* log2(page_size) for a power of two, else -1 */
};

/* The fields above from a planned run (the run has checked p and info). */
static inline void fill_score_args(const ina_dsa_gpu_plan_info_t *info, const void *device_ws,
                                   const ina_dsa_gpu_score_run_params_t *p, ScoreArgs *a) {
  a->q = p->q;
  a->weights = p->weights;
  a->keys = (const char *)p->cache.keys;
  a->page_stride = p->cache.page_stride;
  a->token_stride = p->cache.token_stride;
  a->scale_offset = p->cache.scale_offset;
  a->scale_stride = p->cache.scale_stride;
  a->kv_indptr = p->kv_indptr;
  a->kv_indices = p->kv_indices;
  a->header = (const ina_dsa_gpu_ws_header_t *)device_ws;
  a->rows = (const ina_dsa_gpu_token_row_t *)((const char *)device_ws + sizeof(ina_dsa_gpu_ws_header_t));
  a->softmax_scale = p->softmax_scale;
  a->scores = p->scores;
  a->score_stride = info->score_stride;
  a->page_size = info->page_size;
  a->page_shift = -1;
  for (int shift = 0; shift < 31; shift++)
    if (info->page_size == (1 << shift)) a->page_shift = shift;
  a->num_heads = info->num_heads;
  a->head_dim = info->head_dim;
}

/* Rows p0 (partial sum s0) and p1 = p0 + 8 (s1) of a 16-row fragment: the 4 threads t4
 * of a row add their heads' parts by a fixed butterfly (a deterministic order), and
 * threads 0 and 1 write the two scores, -inf past the visible length; nothing past
 * `end`, the CTA's last position. */
__device__ __forceinline__ void store_row_pair(float s0, float s1, int t4, int32_t p0, int32_t p1, int32_t end,
                                               int32_t visible, float *out) {
  s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
  s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
  s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
  s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
  if (t4 == 0 && p0 < end) out[p0] = p0 < visible ? s0 : -INFINITY;
  if (t4 == 1 && p1 < end) out[p1] = p1 < visible ? s1 : -INFINITY;
}

}  // namespace ina_dsa_score_common

#endif
