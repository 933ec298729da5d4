/* The CUDA engine's device copy of the weights (engine_gpu_weights.c) and what the
 * forward pass (engine_gpu.c) reads of it. Internal to model/; host C over the CUDA
 * runtime, built only with CUDA.
 *
 * Upload rules (ina_gpu_weights_upload):
 *   - FP8 e4m3 linears (128 x 128 block scales) stay FP8, their scales packed for
 *     gemm/gemm.h (ina_gemm_pack_w_scales), when the FP8 GEMM takes the shape (N and K
 *     multiples of 16). Other FP8 linears, and kv_b_proj always (the absorption GEMMs
 *     are bf16, mla/mla_absorb.h), are dequantized once to bf16 on the device.
 *   - f32, f16 and bf16 linears, the embedding and the router become bf16 (f32 and f16
 *     rounded to nearest even): the GPU computes with bf16 operands and fp32
 *     accumulation. An f32 (or f16) router is kept as two bf16 matrices hi + lo (hi = bf16(W),
 *     lo = bf16(W - hi)) whose two GEMMs add up in fp32, so routing sees the weights to
 *     about 16 significant bits (routing still sees bf16 activations).
 *   - RMSNorm weights become f32 (exact for every stored dtype), except kv_a_layernorm,
 *     which the fused append reads in bf16; the router's correction bias f32; so do
 *     V3.2's indexer k_norm weight and bias. Its weights_proj is split hi + lo as an
 *     f32 router is.
 *   - Linear biases (attention_bias, V2 mlp_bias) are INA_ERR_UNSUPPORTED for now.
 *   - The routed experts of a MoE layer also get device tables of their weight pointers
 *     for the grouped GEMM, when all of them are FP8 or all bf16 and their dims suit it.
 * Ownership: every device buffer is recorded in gpu_weights_t.allocs and freed by
 * ina_gpu_weights_free, but those handed over by ina_gpu_weights_disown (an
 * expert-parallel engine's routed experts, which its slots own). */
#ifndef INA_MODEL_ENGINE_GPU_H
#define INA_MODEL_ENGINE_GPU_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "core/status.h"
#include "model/weights.h"

typedef struct gpu_linear {
  int64_t n, k;   /* weight [n, k] */
  int fp8;        /* 1: e4m3 weight + packed scales; 0: bf16 weight */
  void *w;        /* device */
  float *w_scale; /* FP8 only: ina_gemm_w_scale_count(n, k) packed scales */
} gpu_linear_t;

typedef struct gpu_mlp {
  gpu_linear_t gate, up, down;
} gpu_mlp_t;

typedef struct gpu_layer {
  float *input_norm, *post_attention_norm, *q_a_norm; /* f32 [hidden] / [q_lora_rank] */
  uint16_t *kv_a_norm;                                /* bf16 [kv_lora_rank] */
  gpu_linear_t q_proj, q_a_proj, q_b_proj, kv_a_proj, o_proj;
  uint16_t *kv_b;      /* bf16 [heads * (nope + v), kv_lora_rank] */
  int is_moe, has_shared;
  gpu_mlp_t mlp;       /* dense MLP, or the shared experts of a MoE layer */
  uint16_t *router_hi; /* bf16 [experts, hidden] */
  uint16_t *router_lo; /* bf16 [experts, hidden]: the f32 router's remainder; NULL if none */
  float *router_bias;  /* f32 [experts] or NULL */
  /* [expert_end - expert_begin] (gpu_weights_t): the routed experts this rank holds, in
   * order (host array of device weights). */
  gpu_mlp_t *experts;
  /* Those experts as the grouped GEMM (gemm/gemm_grouped.h) reads them: device arrays
   * [held experts] of weight and scale pointers for gate, up and down; NULL when the
   * experts cannot run grouped (mixed FP8 and bf16, or dims it does not take). */
  const void **grouped_w[3];
  const float **grouped_scale[3];
  int grouped_fp8;
  /* DeepSeek-V3.2's lightning indexer (ina_cfg_has_indexer), whole on every rank:
   * wq_b and wk as linears, k_norm's LayerNorm weight and bias f32 [index_head_dim], and
   * weights_proj [index heads, hidden] as bf16 hi + lo like an f32 router (lo NULL when
   * it is stored bf16), since Hugging Face keeps it in fp32. */
  gpu_linear_t index_wq_b, index_wk;
  float *index_k_norm, *index_k_norm_bias;
  uint16_t *index_w_hi, *index_w_lo;
} gpu_layer_t;

typedef struct gpu_weights {
  /* The shard held (model/weights.h): routed experts [expert_begin, expert_end), and
   * tensor-parallel slice tp_rank of tp_size (heads and intermediates sliced). */
  int32_t expert_begin, expert_end;
  int32_t tp_rank, tp_size;
  uint16_t *embed;     /* bf16 [vocab, hidden] */
  float *final_norm;   /* f32 [hidden] */
  gpu_linear_t lm_head;
  gpu_layer_t *layers; /* [num_layers] */
  int32_t num_layers;
  int64_t fp8_max_k;   /* largest K of an FP8 linear; 0 when none */
  int64_t max_expert_inter; /* widest gate/up output of any MLP (dense, shared, routed) */
  int64_t device_bytes;
  void **allocs;       /* every device buffer, for ina_gpu_weights_free */
  int64_t num_allocs, cap_allocs;
} gpu_weights_t;

/* Upload w for cfg onto the current device (synchronously, through `stream`), with the
 * shard w holds. On failure everything allocated is freed and *out is zeroed. */
ina_status_t ina_gpu_weights_upload(const ina_weights_t *w, const ina_model_config_t *cfg,
                                    cudaStream_t stream, gpu_weights_t *out);
/* Seeded random weights made on the current device: bit for bit what
 * ina_gpu_weights_upload(w, cfg, ...) makes of w = ina_weights_random(cfg, seed, dtype,
 * shard), without host tensors (engine_gpu_random.c). shard may be NULL (all experts,
 * whole tensors); otherwise each tensor is generated as the shard's slice of the whole
 * tensor's values, and only the experts [expert_begin, expert_end) are made. Same
 * ownership and failure behaviour as ina_gpu_weights_upload, with the host path's
 * statuses: a dtype other than f32, bf16 or fp8_e4m3, invalid configs and invalid shards
 * as ina_weights_random; an FP8 slice off the 128x128 block grid, linear biases and FP8
 * blocks other than 128x128 INA_ERR_UNSUPPORTED, naming the tensor. Synchronous through
 * `stream`. */
ina_status_t ina_gpu_weights_random(const ina_model_config_t *cfg, const ina_shard_t *shard /* NULL: whole */,
                                    uint64_t seed, ina_dtype_t dtype, cudaStream_t stream, gpu_weights_t *out);
/* Free every device buffer; *g becomes zeroed. NULL is a no-op. */
void ina_gpu_weights_free(gpu_weights_t *g);

/* Hands the `count` buffers in ptrs over to the caller, who frees them from then on: they
 * leave g->allocs. A pointer g does not hold (or NULL) becomes NULL in ptrs and stays
 * g's. O((allocs + count) log count). */
ina_status_t ina_gpu_weights_disown(gpu_weights_t *g, void **ptrs, int64_t count);

/* Shared by the upload and the random generation. */
/* A device buffer of `bytes` (16 when 0), recorded in g->allocs and g->device_bytes. */
ina_status_t ina_gpu_weights_alloc(gpu_weights_t *g, size_t bytes, void **out);
/* Whether an FP8 linear [n, k] stays FP8 (the FP8 GEMM takes its shape) rather than being
 * dequantized to bf16. */
int ina_gpu_weights_fp8_gemm_takes(int64_t n, int64_t k);
/* The grouped-GEMM pointer tables of L's routed experts (gpu_layer_t.grouped_*), when
 * the experts suit the grouped GEMM; otherwise L is left as it is. */
ina_status_t ina_gpu_weights_expert_tables(gpu_weights_t *g, int32_t num_experts, gpu_layer_t *L);

#endif
