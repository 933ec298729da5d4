/* Appending new tokens to the paged MLA latent cache (mla/mla_cache.h): the fused step
 * between the kv down-projection and attention.
 *
 * For each new token the input row is the raw kv_a_proj output, bf16
 * [kv_lora_rank | rope_dim]. The append
 *   1. RMS-normalizes the latent part with the kv_a_layernorm weight:
 *        y = w * (x * inv),  inv = 1 / sqrt(float(sum(x^2) / kv_lora_rank) + eps)
 *      with the sum of squares in double (exact for bf16 inputs, so independent of the
 *      summation order) and every other step one correctly rounded fp32 operation;
 *   2. rotates the rope part by the token's position:
 *        angle = float(pos) * inv_freq[i]
 *        c = float(cos(double(angle))) * attention_factor, s likewise with sin
 *        a' = a * c - b * s,  b' = b * c + a * s   (fp32, no fused multiply-add)
 *      where (a, b) are dims (2i, 2i+1) in the PAIRS layout and (i, i + rope_dim/2) in
 *      the HALVES layout, written back in place (the cache keeps the input's layout);
 *      sin and cos are taken in double and rounded, so the GPU kernel and the reference
 *      agree to the bit (the model's CPU rope uses sinf/cosf, within an ulp of these);
 *   3. writes both into the cache entry of (page_ids[i], slots[i]):
 *        BF16: latent and rope rounded to bf16 (nearest even);
 *        FP8:  each 128-value block of y quantized to e4m3 with scale_inv = amax / 448
 *              (1 for an all-zero block), q = e4m3_satfinite(y / scale_inv), exactly the
 *              rule of ina_fp8_quantize_blocks; rope in bf16;
 *        F32:  (reference only) both parts as f32.
 *
 * The GPU kernel (ina_mla_append) and the CPU reference (ina_mla_append_ref) follow the
 * same arithmetic and write the same bytes.
 *
 * Thread safety: both functions are reentrant; concurrent appends must not write the same
 * cache entries. */
#ifndef INA_MLA_MLA_APPEND_H
#define INA_MLA_MLA_APPEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "mla/mla_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which rope dims rotate together; the values equal model/config.h's ina_rope_layout_t. */
typedef enum ina_mla_rope_layout {
  INA_MLA_ROPE_PAIRS = 0,  /* (2i, 2i+1) */
  INA_MLA_ROPE_HALVES = 1, /* (i, i + rope_dim/2) */
} ina_mla_rope_layout_t;

/* All pointers are device pointers for ina_mla_append and host pointers for
 * ina_mla_append_ref. None may be NULL unless num_tokens == 0 (scale only for FP8). The
 * dimensions come from the cache descriptor: C = cache.kv_lora_rank, R = cache.rope_dim
 * (even, >= 2). */
typedef struct ina_mla_append_params {
  size_t struct_size; /* sizeof(ina_mla_append_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  int32_t num_tokens;
  const uint16_t *kv;  /* bf16 [num_tokens, kv_stride]: latent (C) then rope key (R) */
  int64_t kv_stride;   /* elements between tokens, >= C + R */
  const uint16_t *norm_weight; /* bf16 [C]: kv_a_layernorm */
  float eps;                   /* 1e-6 for DeepSeek's latent norm */
  const float *inv_freq;       /* [R / 2], from ina_cfg_rope_inv_freq */
  float attention_factor;      /* cos/sin scale (YaRN), 1 for default rope */
  ina_mla_rope_layout_t rope_layout;
  const void *positions;       /* [num_tokens] */
  ina_dtype_t positions_dtype; /* INA_DTYPE_I32 or INA_DTYPE_I64 */
  /* Destination of token i: slot slots[i] of page page_ids[i]. A negative page id skips
   * the token (padding rows of a captured batch). Destinations must be distinct. */
  const int32_t *page_ids;
  const int32_t *slots; /* [0, page_size); the reference rejects others, the kernel skips them */
  ina_mla_cache_t cache; /* GPU: BF16 or FP8; reference: any format */
} ina_mla_append_params_t;

#define INA_MLA_APPEND_PARAMS_INIT                                                       \
  {sizeof(ina_mla_append_params_t), 1, 0, NULL, 0, NULL, 1e-6f, NULL, 1.0f,              \
   INA_MLA_ROPE_PAIRS, NULL, INA_DTYPE_I64, NULL, NULL, {INA_MLA_CACHE_BF16, 0, 0, 0,    \
   NULL, 0, 0, NULL, 0, 0, NULL, 0, 0}}

/* The GPU kernel: one warp per token, enqueued on `stream` (a cudaStream_t, NULL for the
 * legacy default stream). Asynchronous; allocates nothing and never waits on the host,
 * so it can be captured in a CUDA graph. Returns INA_ERR_INVALID_ARGUMENT for bad
 * parameters, INA_ERR_UNSUPPORTED for an F32 cache, an FP8 cache whose kv_lora_rank is
 * not a multiple of 128, or a build without CUDA; INA_ERR_CUDA for a launch failure.
 * Pointers, strides and offsets must be aligned to their element size (2 bytes for bf16,
 * 4 for the fp32 scales). num_tokens == 0 enqueues nothing. Page ids are not checked
 * against the cache's size: the caller owns the page table. */
ina_status_t ina_mla_append(const ina_mla_append_params_t *p, void *stream);

/* The CPU reference, same parameters with host pointers; any cache format. */
ina_status_t ina_mla_append_ref(const ina_mla_append_params_t *p);

#ifdef __cplusplus
}
#endif
#endif
