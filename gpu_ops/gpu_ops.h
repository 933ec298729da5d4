/* GPU kernels of the model's dense ops: the CUDA counterparts of the CPU engine's steps
 * (model/engine_cpu.c, model/cpu_ops.h, model/sampler.h) that the GPU forward pass
 * strings together:
 *   embedding gather, RMSNorm (optionally fused with the residual add and FP8
 *   quantization), LayerNorm with bias (DeepSeek-V3.2's indexer key norm), RoPE of the
 *   query's rope part, SiLU(gate) * up (optionally FP8), greedy argmax and
 *   temperature / top-k / top-p sampling.
 * The MoE ops (router, permutation, combine) are in moe_ep/moe_gpu.h, under the same
 * contract and error word.
 *
 * Common contract of every launcher:
 *   - Pointers are device pointers (the config / params structs themselves live on the
 *     host). bf16 values are uint16_t bit patterns, FP8 e4m3 values uint8_t bytes.
 *   - Asynchronous: the kernels are enqueued on `stream` (a cudaStream_t; NULL is the
 *     legacy default stream) and the call returns. A bad argument is reported here
 *     (INA_ERR_INVALID_ARGUMENT, or INA_ERR_UNSUPPORTED for a valid shape the kernels do
 *     not cover), a launch failure as INA_ERR_CUDA, a fault during execution at the next
 *     synchronization. A zero-sized call enqueues nothing and returns INA_OK.
 *   - Nothing is allocated and the host never waits, so every call can be captured in a
 *     CUDA graph; the grid depends only on the shape arguments.
 *   - Results are deterministic: the same inputs give the same bits on every run (no
 *     floating-point atomics; every reduction has a fixed order).
 *   - The caller owns every buffer (and the MoE permutation's workspace); nothing is
 *     retained after the call returns.
 *   - Without CUDA (INA_CUDA=OFF) every launcher returns INA_ERR_UNSUPPORTED.
 *
 * Device-side errors. Some inputs can only be checked on the device (token and expert
 * ids, sampling parameters, logits). Launchers that read such inputs take
 * `uint32_t *error_flags`: a device pointer to one word, or NULL to skip reporting. A
 * kernel that meets a bad input handles it safely (as documented per op: clamps,
 * drops, or writes -1; it never reads or writes out of bounds) and ORs the matching
 * INA_GPU_OPS_FLAG_* bit into the word with atomicOr. Kernels never clear the word: the
 * caller zeroes it (cudaMemsetAsync) before the work it wants to watch, and reads it
 * after synchronizing (once per step is enough; several ops may share one word).
 *
 * Numerics follow the CPU reference op for op (fp32 arithmetic, one rounding to bf16
 * at the end, FP8 by the rule of ina_fp8_quantize_blocks); each function says where it
 * may differ and by how much.
 *
 * Thread safety: as the CUDA runtime; calls on different streams are independent as
 * long as their outputs do not overlap. */
#ifndef INA_GPU_OPS_GPU_OPS_H
#define INA_GPU_OPS_GPU_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bits of the device error word. */
#define INA_GPU_OPS_FLAG_TOKEN_ID 0x1u   /* embedding: an id outside [0, vocab) */
#define INA_GPU_OPS_FLAG_EXPERT_ID 0x2u  /* MoE permute: an expert id >= num_experts */
#define INA_GPU_OPS_FLAG_LOGITS 0x4u     /* sampling: a row's logits cannot be sampled */
#define INA_GPU_OPS_FLAG_SAMPLING_PARAMS 0x8u /* sampling: a row's parameters are invalid */

/* ---- 1. Embedding ------------------------------------------------------------------- */

/* out[t, :] = bf16(weight[ids[t], :]) for t < tokens.
 *   ids     int32 [tokens].
 *   weight  [vocab, hidden] row-major, weight_dtype INA_DTYPE_BF16 (copied bit for bit)
 *           or INA_DTYPE_F32 (rounded to nearest even).
 *   out     bf16 [tokens, hidden], contiguous.
 * An id outside [0, vocab) is clamped into it (the row of 0 or vocab - 1 is copied, so
 * nothing is read out of bounds) and sets INA_GPU_OPS_FLAG_TOKEN_ID. */
ina_status_t ina_gpu_embedding(const int32_t *ids, int64_t tokens, const void *weight,
                               ina_dtype_t weight_dtype, int64_t vocab, int64_t hidden,
                               uint16_t *out, uint32_t *error_flags, void *stream);

/* ---- 2. RMSNorm ----------------------------------------------------------------------- */

/* Row by row over [rows, cols]:
 *   with a residual:  residual = bf16(residual + x);  y = rmsnorm(residual) * weight
 *   without:          y = rmsnorm(x) * weight
 * where rmsnorm(v) * w = w[c] * (v[c] * inv), inv = 1 / sqrt(sum(v^2) / cols + eps),
 * every operation one correctly rounded fp32 operation (the sum of squares is fp32 in a
 * fixed order), y rounded once to bf16. This is ina_cpu_rmsnorm on the bf16 inputs;
 * the residual add rounds to bf16 as Hugging Face's `residual + hidden` in the model
 * dtype does.
 *
 * Outputs: y in bf16, and/or y quantized to FP8 e4m3 with 1 x 128 block scales. The FP8
 * output quantizes the bf16-rounded y, so it is bit-identical to ina_cuda_fp8_quantize_
 * blocks (and ina_fp8_quantize_blocks) applied to the bf16 y: scale_inv = amax / 448 per
 * 128 values of a row, q = e4m3_satfinite(y / scale_inv).
 *
 * Aliasing: y may be x itself (same pointer and stride); residual must overlap neither. */
typedef struct ina_gpu_rmsnorm_params {
  size_t struct_size; /* sizeof(ina_gpu_rmsnorm_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  int64_t rows;       /* >= 0 */
  int64_t cols;       /* 1 .. 32768 (the normalized width; 7168, 1536, 512 in V3) */
  const uint16_t *x;  /* bf16 [rows, x_stride] */
  int64_t x_stride;   /* elements between rows, >= cols; 0 = cols */
  uint16_t *residual; /* bf16 [rows, residual_stride], read and written; NULL = none */
  int64_t residual_stride; /* 0 = cols */
  const void *weight;      /* [cols] */
  ina_dtype_t weight_dtype; /* INA_DTYPE_BF16 or INA_DTYPE_F32 */
  float eps;                /* finite, >= 0 */
  uint16_t *y;              /* bf16 [rows, y_stride]; NULL = no bf16 output */
  int64_t y_stride;         /* 0 = cols */
  uint8_t *y_fp8;           /* e4m3 [rows, cols] contiguous; NULL = no FP8 output */
  float *y_scale_inv;       /* [rows, ceil(cols / 128)]; with y_fp8 */
} ina_gpu_rmsnorm_params_t;

#define INA_GPU_RMSNORM_PARAMS_INIT                                                      \
  {sizeof(ina_gpu_rmsnorm_params_t), 1, 0, 0, NULL, 0, NULL, 0, NULL, INA_DTYPE_BF16,     \
   1e-6f, NULL, 0, NULL, NULL}

/* At least one of y and y_fp8 must be given. Pointers are aligned to their element
 * size; 16-byte aligned rows (and 8-byte aligned y_fp8) with cols % 8 == 0 take the
 * vectorized path. One CTA per row. */
ina_status_t ina_gpu_rmsnorm(const ina_gpu_rmsnorm_params_t *p, void *stream);

/* ---- 3. LayerNorm ---------------------------------------------------------------------- */

/* Row by row over [rows, cols], torch.nn.LayerNorm with the biased variance (DeepSeek-
 * V3.2's indexer k_norm, eps 1e-6):
 *   mean = sum(x) / cols,  var = sum((x - mean)^2) / cols,  inv = 1 / sqrt(var + eps),
 *   y = bf16(((x - mean) * inv) * weight + bias)
 * in fp32, every operation one correctly rounded fp32 operation (the two sums in a fixed
 * order: each thread's columns in order, then the warp tree, then the warps; no fused
 * multiply-add in the last line), y rounded once to bf16.
 *
 * Error against ina_cpu_layernorm (model/cpu_ops.c, mean and variance in double) on the
 * same bf16 inputs, for rows whose sums stay finite in fp32: with u = 2^-24, t and inv
 * the exact values, m1 = sum|x| / cols and S = ceil(cols / 512) + 10 (the longest chain
 * of roundings in either sum: a thread's columns, then the two 32-lane trees), the fp32
 * value before the bf16 rounding differs from the CPU's float by at most
 *   u * ((S / 2 + 12) |t w| + (S + 1) |w| inv m1 + 2 |b|)
 * to first order in u. The mean's error, up to (S + 1) u m1, enters through x - mean;
 * the variance gets its S + 3 roundings, not the mean's error, which cancels to first
 * order because the deviations from the mean sum to zero; the square root and the
 * reciprocal halve the first and add two; the CPU's own float roundings are counted in
 * the bound. That is a few fp32 ulp of the result for rows whose mean is small against
 * their spread; the bf16 rounding then adds at most half a bf16 ulp. A constant row with
 * eps 0 gives 0 * inf = NaN, as the CPU and torch do.
 *
 * Aliasing: y may be x itself (same pointer and stride); otherwise they must not
 * overlap. */
typedef struct ina_gpu_layernorm_params {
  size_t struct_size; /* sizeof(ina_gpu_layernorm_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  int64_t rows;       /* >= 0 */
  int64_t cols;       /* 1 .. 32768 (128, the indexer's head_dim, in V3.2) */
  const uint16_t *x;  /* bf16 [rows, x_stride] */
  int64_t x_stride;   /* elements between rows, >= cols; 0 = cols */
  const float *weight; /* f32 [cols] */
  const float *bias;   /* f32 [cols] */
  float eps;           /* finite, >= 0 */
  uint16_t *y;         /* bf16 [rows, y_stride]; may be x itself (same pointer and stride) */
  int64_t y_stride;    /* 0 = cols */
} ina_gpu_layernorm_params_t;

#define INA_GPU_LAYERNORM_PARAMS_INIT                                                    \
  {sizeof(ina_gpu_layernorm_params_t), 1, 0, 0, NULL, 0, NULL, NULL, 1e-6f, NULL, 0}

/* x, weight, bias and y must not be NULL and are aligned to their element size (no
 * other alignment is needed). One CTA per row (the grid is rows), of one thread per
 * column up to 512 threads. */
ina_status_t ina_gpu_layernorm(const ina_gpu_layernorm_params_t *p, void *stream);

/* ---- 4. RoPE -------------------------------------------------------------------------- */

/* Rotates, in place, the rope part of every head of every token, as ina_cpu_rope:
 * for i < rope_dim / 2, with (a, b) = dims (2i, 2i+1) when pairs_layout is nonzero
 * (DeepSeek's interleaved checkpoints) or (i, i + rope_dim/2) otherwise,
 *   angle = float(pos) * inv_freq[i]
 *   c = float(cos(double(angle))) * attention_factor, s likewise with sin
 *   a' = a * c - b * s,  b' = b * c + a * s      (fp32, no fused multiply-add)
 * rounded to bf16. The cos and sin are those of mla/mla_append.h's key rotation, so the
 * query and the cached key turn by bit-identical angles (the CPU's cosf / sinf agree to
 * an ulp).
 *
 * Element (t, h, j) of the rope part is x[t * token_stride + h * head_stride +
 * rope_offset + j]; for the MLA query q [T, heads, nope + rope]: head_stride = nope +
 * rope, token_stride = heads * head_stride, rope_offset = nope. The same call rotates the
 * key rope of a [T, kv_lora_rank + rope] row with heads = 1, rope_offset = kv_lora_rank. */
typedef struct ina_gpu_rope_params {
  size_t struct_size; /* sizeof(ina_gpu_rope_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  int64_t tokens;     /* >= 0 */
  int32_t heads;      /* >= 1 */
  uint16_t *x;        /* bf16, rotated in place */
  int64_t token_stride, head_stride; /* elements; >= 0 */
  int32_t rope_offset; /* >= 0 */
  int32_t rope_dim;    /* even, 2 .. 1024 */
  const float *inv_freq;  /* [rope_dim / 2], from ina_cfg_rope_inv_freq */
  float attention_factor; /* finite; 1 for plain rope, YaRN's mscale otherwise */
  int pairs_layout;       /* nonzero: (2i, 2i+1); zero: (i, i + rope_dim/2) */
  const void *positions;  /* [tokens] */
  ina_dtype_t positions_dtype; /* INA_DTYPE_I32 or INA_DTYPE_I64 */
} ina_gpu_rope_params_t;

#define INA_GPU_ROPE_PARAMS_INIT                                                         \
  {sizeof(ina_gpu_rope_params_t), 1, 0, 1, NULL, 0, 0, 0, 64, NULL, 1.0f, 1, NULL,       \
   INA_DTYPE_I64}

/* The heads of a token must not overlap one another (nor other tokens' rope parts). */
ina_status_t ina_gpu_rope(const ina_gpu_rope_params_t *p, void *stream);

/* ---- 5. SiLU(gate) * up ---------------------------------------------------------------- */

/* out[r, i] = bf16(silu(gate[r, i]) * up[r, i]) with silu(g) = g / (1 + exp(-g)) in fp32
 * (ina_cpu_silu_mul), for r < rows, i < inter. Row r of gate starts at
 * gate + r * in_stride, of up at up + r * in_stride:
 *   two tensors [rows, inter]:       gate, up, in_stride = inter
 *   one fused [rows, 2 * inter]:     gate = gu, up = gu + inter, in_stride = 2 * inter
 * Outputs, at least one: out bf16 [rows, inter] contiguous; out_fp8 e4m3 [rows, inter]
 * contiguous with out_scale_inv [rows, ceil(inter / 128)], the 1 x 128 quantization of
 * the bf16-rounded result (bit-identical to ina_cuda_fp8_quantize_blocks of `out`).
 * Outputs must not overlap the inputs. inter % 8 == 0 with 16-byte aligned inputs and
 * out (8-byte aligned out_fp8) takes the vectorized path. */
ina_status_t ina_gpu_silu_mul(int64_t rows, int64_t inter, const uint16_t *gate,
                              const uint16_t *up, int64_t in_stride, uint16_t *out,
                              uint8_t *out_fp8, float *out_scale_inv, void *stream);

/* ---- 6. Sampling ----------------------------------------------------------------------- */

/* Greedy: out[r] = the first index of the largest logit of row r, NaN entries skipped;
 * 0 when every entry is NaN (ina_argmax_f32, which it matches exactly).
 *   logits  [rows, row_stride], dtype INA_DTYPE_F32 or INA_DTYPE_BF16; vocab >= 1,
 *           row_stride >= vocab (0 = vocab). One CTA per row. */
ina_status_t ina_gpu_argmax(const void *logits, ina_dtype_t dtype, int64_t rows, int64_t vocab,
                            int64_t row_stride, int32_t *out, void *stream);

/* One row's sampling parameters, in device memory (so a captured graph reads the
 * current values): model/sampler.h's ina_sampling_params_t plus the draw number. */
typedef struct ina_gpu_sampling_row {
  float temperature; /* finite, >= 0; 0 = greedy */
  int32_t top_k;     /* >= 0; 0 = off */
  float top_p;       /* (0, 1]; 1 = off */
  uint32_t reserved; /* 0 */
  uint64_t seed;     /* the request's random stream */
  uint64_t step;     /* draw number n within the stream */
} ina_gpu_sampling_row_t;

/* Draws one token per row from the distribution of model/sampler.h: temperature, then
 * top-k (ties with the k-th logit kept), then top-p (the smallest most-probable head
 * reaching top_p, lower ids first among equal probabilities, at least one token), then
 * a draw; temperature 0 is greedy (ina_gpu_argmax). Logits NaN or +inf, or all -inf, in
 * a sampled row (NaN in every entry of a greedy row) are errors, as in the CPU sampler.
 *
 * The draw is a pure function of (seed, step) and the logits, an exponential race: with
 *   s = splitmix64(seed + (step + 1) * G),  G = 0x9E3779B97F4A7C15 (the CPU's draw key),
 *   v_i = float(splitmix64(s + (i + 1) * G) | 1) * 2^-64,  E_i = -log1p(-v_i),
 * the kept token with the largest w_i / E_i wins (ties: the lower id). Since
 * E_i ~ Exp(1) and E_i / w_i is exponential with rate w_i, token i wins with probability
 * w_i / sum(w), the distribution the CPU's inverse-CDF draw samples (to within float
 * precision); the individual draws differ from the CPU sampler's. Rows with equal
 * (seed, step) and logits draw the same token: give independent requests distinct
 * seeds. The row index does not enter, so a request's tokens do not depend on its place
 * in the batch.
 *
 * Masses for top-p are summed in 64-bit fixed point (2^-40 units of the largest
 * weight), so the result is independent of summation order; a token whose cumulative
 * mass lies within ~1e-7 of the top_p boundary may fall on the other side than in the
 * CPU sampler's double sum.
 *
 *   params        device [rows]; with advance_step nonzero, each row whose draw succeeds
 *                 gets step += 1 (so a replayed graph draws the next number).
 *   tokens        int32 [rows] out; -1 for a row with an error (which sets
 *                 INA_GPU_OPS_FLAG_LOGITS or INA_GPU_OPS_FLAG_SAMPLING_PARAMS).
 *   vocab         1 .. 2^24; logits [rows, row_stride] as for ina_gpu_argmax.
 * One CTA per row, a dozen passes over the row at most (radix selections for top-k and
 * top-p, each 4 passes; see sample.cu). */
ina_status_t ina_gpu_sample(const void *logits, ina_dtype_t dtype, int64_t rows, int64_t vocab,
                            int64_t row_stride, ina_gpu_sampling_row_t *params,
                            int advance_step, int32_t *tokens, uint32_t *error_flags,
                            void *stream);

/* The distribution ina_gpu_sample draws from, as ina_sampler_probs: probs [rows, vocab]
 * f32, contiguous (0 for every filtered token, one-hot at the argmax when greedy, all 0
 * for a row with an error). Steps are not advanced; params are only read. */
ina_status_t ina_gpu_sampling_probs(const void *logits, ina_dtype_t dtype, int64_t rows,
                                    int64_t vocab, int64_t row_stride,
                                    const ina_gpu_sampling_row_t *params, float *probs,
                                    uint32_t *error_flags, void *stream);

#ifdef __cplusplus
}
#endif
#endif
