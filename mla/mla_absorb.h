/* The matrix absorption around MLA attention on the GPU: W_UK folded into the query
 * before the attention kernel, W_UV applied to its latent output after it, as batched
 * GEMMs over the heads (cuBLASLt, bf16 operands, fp32 accumulation, bf16 results).
 *
 * kv_b_proj's weight W is [H * (nope + v), C] (row-major, C = kv_lora_rank); head h owns
 * rows h*(nope+v) .. +nope (W_UK[h], [nope, C]) and the next v rows (W_UV[h], [v, C]):
 *   ina_mla_absorb_q:  q_abs[t, h, :] = q_nope[t, h, :] . W_UK[h]      ([C] per token, head)
 *   ina_mla_absorb_v:  out[t, h, :]   = o_latent[t, h, :] . W_UV[h]^T  ([v] per token, head)
 * Inputs and outputs are strided: q_nope usually lives inside q [T, H, nope + rope]
 * (token stride H*(nope+rope), head stride nope+rope), out inside attn [T, H, v].
 *
 * FP8 weights (e4m3 with 128x128 block scales, the DeepSeek-V3 checkpoint) are
 * dequantized once at load into a bf16 copy of W with ina_mla_absorb_dequantize_weight,
 * and the same bf16 GEMMs run on it. cuBLASLt's block-scaled FP8 modes (BLK128x128_32F
 * for the weight, VEC128_32F for the activations) need both operands in FP8 and K-major
 * (the "TN" form); on an H200 with cuBLASLt 13.1 its heuristic finds an algorithm for a
 * single such GEMM but none for a strided batch of them, nor for W_UK as stored (its
 * contraction runs along its rows), as tests/mla_absorb/bench_mla_absorb shows. Using it
 * would also mean quantizing the activations to e4m3 on every call (a few percent of
 * error per value, carried into every attention score). The GEMMs read the weight once
 * per call, so at decode batch sizes bf16 costs at most twice the bytes of fp8.
 *
 * Shape of use: create once per (dims, device) with ina_mla_absorb_create, which makes
 * the cuBLASLt handle and descriptors, allocates the workspace and picks the algorithms
 * for token-count buckets (powers of two up to max_tokens); then per layer and step call
 * ina_mla_absorb_q / ina_mla_absorb_v with that layer's weight. They allocate nothing,
 * never wait on the host and can be captured in a CUDA graph.
 *
 * Alignment (checked): weight, inputs and outputs 16-byte aligned, every stride a
 * multiple of 8 elements, kv_lora_rank a multiple of 8.
 *
 * Ownership: the handle owns its cuBLASLt handle, descriptors and device workspace; the
 * caller owns every tensor. Thread safety: calls through one handle share its workspace,
 * so they must be ordered on one stream (or otherwise serialized on the device); use one
 * handle per concurrent stream. The functions are safe to call from several host
 * threads. */
#ifndef INA_MLA_MLA_ABSORB_H
#define INA_MLA_MLA_ABSORB_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_mla_absorb ina_mla_absorb_t;

typedef struct ina_mla_absorb_dims {
  size_t struct_size;       /* sizeof(ina_mla_absorb_dims_t), set by the INIT macro */
  uint32_t version;         /* 1 */
  int32_t num_heads;        /* heads on this rank */
  int32_t qk_nope_head_dim; /* 128 for DeepSeek-V2/V3 */
  int32_t v_head_dim;       /* 128 */
  int32_t kv_lora_rank;     /* 512; a multiple of 8 */
  int32_t max_tokens;       /* most tokens one call may carry */
  size_t workspace_bytes;   /* cuBLASLt workspace; 0: 4 MiB */
} ina_mla_absorb_dims_t;

#define INA_MLA_ABSORB_DIMS_INIT {sizeof(ina_mla_absorb_dims_t), 1, 128, 128, 128, 512, 1024, 0}

/* On the current CUDA device. INA_ERR_UNSUPPORTED without a device or without CUDA in
 * the build; *out = NULL on failure. */
ina_status_t ina_mla_absorb_create(const ina_mla_absorb_dims_t *dims, ina_mla_absorb_t **out);
/* NULL is a no-op. Waits for nothing: the caller must have finished the handle's work. */
void ina_mla_absorb_destroy(ina_mla_absorb_t *a);

/* q_abs[t, h, :] = q_nope[t, h, :] . W_UK[h] for t < num_tokens (0 <= num_tokens <=
 * max_tokens). kv_b_weight: bf16 [H*(nope+v), C], contiguous. q_nope element (t, h, k)
 * at q_nope[t * q_token_stride + h * q_head_stride + k]; q_abs element (t, h, c) at
 * q_abs[t * q_abs_token_stride + h * q_abs_head_stride + c]; strides in elements, the
 * output's must keep its elements apart (q_abs_head_stride >= C, q_abs_token_stride >= C
 * and no two (t, h) rows overlapping). stream: a cudaStream_t, NULL = legacy default. */
ina_status_t ina_mla_absorb_q(const ina_mla_absorb_t *a, const uint16_t *kv_b_weight,
                              int32_t num_tokens, const uint16_t *q_nope, int64_t q_token_stride,
                              int64_t q_head_stride, uint16_t *q_abs, int64_t q_abs_token_stride,
                              int64_t q_abs_head_stride, void *stream);

/* out[t, h, :] = o_latent[t, h, :] . W_UV[h]^T; same conventions (o_latent rows have C
 * values, out rows v values). */
ina_status_t ina_mla_absorb_v(const ina_mla_absorb_t *a, const uint16_t *kv_b_weight,
                              int32_t num_tokens, const uint16_t *o_latent,
                              int64_t o_token_stride, int64_t o_head_stride, uint16_t *out,
                              int64_t out_token_stride, int64_t out_head_stride, void *stream);

/* Load-time conversion of an FP8 e4m3 weight with 128x128 block scales (scale_inv
 * [ceil(rows/128), ceil(cols/128)], value = fp8 * scale_inv) to bf16:
 * w_bf16[r, c] = bf16(float(w_fp8[r, c]) * scale_inv[r/128, c/128]), the product rounded
 * to fp32 and then to bf16, nearest even, as ina_fp8_dequantize_blocks followed by
 * ina_f32_to_bf16 does. Device pointers; asynchronous on `stream`. */
ina_status_t ina_mla_absorb_dequantize_weight(const uint8_t *w_fp8, const float *scale_inv,
                                              int64_t rows, int64_t cols, uint16_t *w_bf16,
                                              void *stream);

#ifdef __cplusplus
}
#endif
#endif
