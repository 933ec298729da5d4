/* GPU kernels of the MoE layer: the CUDA counterparts of the CPU engine's routing and
 * expert steps (moe_ep/router.h, model/engine_cpu.c) that the GPU forward pass strings
 * together: the router, the permutation (per-expert token lists), the weighted combine,
 * the per-expert token counts, the dropping of padding rows and the rows of each expert
 * slot.
 *
 * Every launcher follows the common contract of gpu_ops/gpu_ops.h (device pointers,
 * asynchronous on `stream`, nothing allocated, deterministic, INA_ERR_UNSUPPORTED without
 * CUDA) and reports device-side errors in its error word (INA_GPU_OPS_FLAG_*). */
#ifndef INA_MOE_EP_MOE_GPU_H
#define INA_MOE_EP_MOE_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "gpu_ops/gpu_ops.h"
#include "moe_ep/router.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- 1. MoE router -------------------------------------------------------------------- */

/* moe_ep/router.h's routing on the GPU, one warp per token: the same methods, masking
 * (-inf or 0.0), group selection, norm_topk_prob and routed_scaling_factor, the same
 * output order (descending choice score) and ties (the lower index first, for groups
 * and for experts). Numerics: fp32 as the reference; sigmoid and softmax use the
 * device's expf (within 2 ulp of libm's) and the reference's summation order, so the
 * weights agree to a few ulp and the ids are identical unless two choice scores are
 * within a few ulp of each other. NaN logits give valid, distinct ids (unspecified
 * choice), as in the reference.
 *   cfg              host struct, checked by ina_router_config_validate; supported:
 *                    num_experts <= 256, top_k <= 32, n_group <= 32.
 *   logits           f32 [tokens, num_experts].
 *   correction_bias  f32 [num_experts] for NOAUX_TC (finite: not checked on the device),
 *                    NULL for the other methods.
 *   ids, weights     [tokens, top_k] out (int32, f32). */
ina_status_t ina_gpu_router(const ina_router_config_t *cfg, const float *logits,
                            const float *correction_bias, int64_t tokens, int32_t *ids,
                            float *weights, void *stream);

/* ---- 2. MoE permutation and combine ----------------------------------------------------- */

/* Groups the (token, k) entries of ids [tokens, top_k] by expert: a stable counting sort
 * of the entries e = t * top_k + j by ids[e], so within an expert the entries keep
 * increasing (t, j) order (the CPU engine's loop order), and the result does not depend
 * on scheduling.
 *   expert_counts  [num_experts] out: entries routed to each expert.
 *   expert_offsets [num_experts + 1] out: exclusive scan of the counts; offsets[E] is the
 *                  number of kept entries.
 *   sorted_token   [tokens * top_k] out: for sorted slot s < offsets[E], the token whose
 *                  row feeds slot s (the gather index of the grouped GEMM input; expert
 *                  x owns slots [offsets[x], offsets[x+1])); slots past offsets[E] are -1.
 *   slot_of        [tokens, top_k] out: the sorted slot of entry (t, j), -1 if dropped.
 * Entries with a negative id are dropped (not routed here: padding rows, or experts of
 * another rank mapped to -1); ids >= num_experts are dropped too and set
 * INA_GPU_OPS_FLAG_EXPERT_ID. Needs a caller-owned device workspace of
 * ina_gpu_moe_permute_workspace_size() bytes (256-byte aligned; its contents on entry do
 * not matter). With tokens == 0 the counts and offsets are still written (zeros).
 * Expert parallelism (version 2): a rank holding experts [first_expert, first_expert +
 * num_experts) of total_experts keeps the entries of those as expert id - first_expert
 * and drops the others; only ids >= total_experts set the flag. */
typedef struct ina_gpu_moe_permute_params {
  size_t struct_size; /* sizeof(ina_gpu_moe_permute_params_t), set by the INIT macro */
  uint32_t version;   /* 2 */
  int64_t tokens;     /* >= 0; tokens * top_k < 2^31 */
  int32_t top_k;      /* >= 1 */
  int32_t num_experts; /* 1 .. 1024 */
  const int32_t *ids;  /* [tokens, top_k] */
  int32_t *expert_counts;
  int32_t *expert_offsets;
  int32_t *sorted_token;
  int32_t *slot_of;
  void *workspace;
  size_t workspace_bytes;
  uint32_t *error_flags; /* NULL = no reporting */
  /* Version 2. */
  int32_t first_expert;  /* 0 unless expert-parallel */
  int32_t total_experts; /* 0: num_experts (every expert is this rank's) */
} ina_gpu_moe_permute_params_t;

#define INA_GPU_MOE_PERMUTE_PARAMS_INIT                                                  \
  {sizeof(ina_gpu_moe_permute_params_t), 2, 0, 1, 0, NULL, NULL, NULL, NULL, NULL, NULL, \
   0, NULL, 0, 0}

/* Workspace bytes for a permutation of this shape (0 when tokens * top_k == 0). */
size_t ina_gpu_moe_permute_workspace_size(int64_t tokens, int32_t top_k, int32_t num_experts);

ina_status_t ina_gpu_moe_permute(const ina_gpu_moe_permute_params_t *p, void *stream);

/* out[t, :] = bf16( sum_j weights[t, j] * expert_out[slot_of[t, j], :]  (+ shared_out[t, :]) )
 * accumulated in fp32, j in increasing order, the shared expert's output added last.
 * Entries whose slot is outside [0, expert_rows) (dropped: -1) contribute nothing.
 * top_k is 1 .. 64. One CTA per token.
 *   expert_out  bf16 [expert_rows, hidden] contiguous: the down-projection output in
 *               sorted-slot order.
 *   slot_of     int32 [tokens, top_k] (from ina_gpu_moe_permute); weights f32 [tokens, top_k].
 *   shared_out  bf16 [tokens, hidden] or NULL; out may be shared_out itself (in place).
 *   out         bf16 [tokens, hidden] contiguous. */
ina_status_t ina_gpu_moe_combine(int64_t tokens, int32_t top_k, int64_t hidden,
                                 const uint16_t *expert_out, int64_t expert_rows,
                                 const int32_t *slot_of, const float *weights,
                                 const uint16_t *shared_out, uint16_t *out, void *stream);

/* Tokens routed to each expert, accumulated for load statistics: counts[ids[t, j]] += 1
 * for every entry (t, j) whose row is kept (row_mask NULL, or row_mask[t] >= 0: a step's
 * padding rows, marked negative, are left out); ids outside [0, num_experts) are skipped.
 *   ids     int32 [tokens, top_k]; row_mask int32 [tokens] or NULL.
 *   counts  uint64 [num_experts], device, 8-byte aligned: added to, never cleared. */
ina_status_t ina_gpu_moe_count(const int32_t *ids, int64_t tokens, int32_t top_k, const int32_t *row_mask,
                               int32_t num_experts, uint64_t *counts, void *stream);

/* Takes a step's padding rows out of routing: ids[t, j] = -1 for every j of each row with
 * row_mask[t] < 0 (other rows unchanged), so the permutation drops their entries and no
 * expert computes them (ina_gpu_moe_permute, ina_gpu_moe_combine: a dropped entry adds
 * nothing).
 *   ids       int32 [tokens, top_k], in place; row_mask int32 [tokens]. */
ina_status_t ina_gpu_moe_drop_rows(int32_t *ids, int64_t tokens, int32_t top_k, const int32_t *row_mask,
                                   void *stream);

/* The rows each expert slot of an expert-parallel rank computes, in the permutation by
 * expert (offsets [num_experts + 1] from ina_gpu_moe_permute): slot s holds expert
 * slot_info[3s] (-1: empty) as replica slot_info[3s + 1] of slot_info[3s + 2]; an
 * expert's n entries [offsets[x], offsets[x + 1]) are cut into contiguous runs, run j of
 * R being [n * j / R, n * (j + 1) / R) (the CPU engine's cut), and the slot's run goes to
 * [begins[s], ends[s]). Empty or malformed slots get an empty range. For the grouped
 * GEMM's scattered groups (gemm/gemm_grouped.h, row_ends). */
ina_status_t ina_gpu_moe_slot_rows(const int32_t *offsets, int32_t num_experts, const int32_t *slot_info,
                                   int32_t slots, int32_t *begins, int32_t *ends, void *stream);

#ifdef __cplusplus
}
#endif
#endif
