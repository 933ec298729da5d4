/* MLA attention on the GPU in FlashInfer's plan/run shape: absorbed queries over the
 * paged latent cache, split-KV with load balancing across all SMs.
 *
 *   size:  ina_mla_workspace_size(&plan_params, &host_bytes, &device_bytes)
 *   plan:  ina_mla_plan(&plan_params, host_ws, device_ws, stream, &info)  -- on the host,
 *          per step (lengths change); writes the schedule into host_ws (pinned memory,
 *          cudaHostAlloc) and copies it to device_ws asynchronously on `stream`.
 *   run:   ina_mla_run(&info, device_ws, &run_params, stream)            -- never
 *          allocates, never waits on the host, launches a grid that depends only on the
 *          plan's bucket (max_batch, max_q_len, heads, SM count), so a CUDA graph of run
 *          can be replayed after a new plan with new lengths.
 *
 * Semantics are those of the CPU reference mla/mla_ref.h: request b has
 * q_len = qo_indptr[b+1] - qo_indptr[b] query tokens, the last of its kv_len[b] tokens;
 * query j sees cache positions t < kv_len[b] - q_len + j + 1 (causal); its pages are
 * kv_indices[kv_indptr[b] .. kv_indptr[b+1]). out[token, head, :] = softmax(scale *
 * (q_nope . latent + q_pe . rope)) . latent; lse = natural log of the softmax sum.
 *
 * Ownership: the caller owns both workspaces and every tensor. Thread safety: plan and
 * run on different workspaces may run concurrently. */
#ifndef INA_MLA_MLA_H
#define INA_MLA_MLA_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "mla/mla_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_mla_plan_params {
  size_t struct_size; /* sizeof(ina_mla_plan_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  int32_t batch;      /* requests this step, <= max_batch */
  int32_t max_batch;  /* bucket: workspace and grid are sized for it */
  int32_t max_q_len;  /* bucket: the longest q_len a request may have (1 for decode) */
  const int32_t *qo_indptr; /* host [batch + 1] */
  const int32_t *kv_len;    /* host [batch] */
  int32_t num_heads;        /* 1..128 */
  int32_t kv_lora_rank;     /* 512 for DeepSeek (fast path); other dims take a generic path */
  int32_t rope_dim;         /* 64 for DeepSeek */
  int32_t page_size;        /* >= 1 */
  int32_t num_sms;          /* 0: the current device's */
} ina_mla_plan_params_t;

#define INA_MLA_PLAN_PARAMS_INIT \
  {sizeof(ina_mla_plan_params_t), 1, 0, 0, 1, NULL, NULL, 0, 512, 64, 64, 0}

/* What run needs from the plan (plain data, kept by the caller). */
typedef struct ina_mla_plan_info {
  int32_t batch, max_batch, max_q_len, num_heads, kv_lora_rank, rope_dim, page_size;
  int32_t num_ctas;       /* fixed grid of the attention kernel */
  int32_t num_splits_max; /* partial results per (token, head) at most */
  int32_t total_tokens;   /* qo_indptr[batch] */
  size_t device_bytes;    /* used part of the device workspace */
  int32_t path;           /* kernel variant chosen (implementation detail, for reports) */
  int32_t sparse_topk;    /* sparse plans: entries per index row; 0 for dense plans */
} ina_mla_plan_info_t;

ina_status_t ina_mla_workspace_size(const ina_mla_plan_params_t *p, size_t *host_bytes,
                                    size_t *device_bytes);

/* stream: a cudaStream_t (NULL = default stream).
 * host_ws: host_bytes from ina_mla_workspace_size, preferably pinned; the copy reads it
 *   asynchronously, so it must not be planned into again before that copy has run on
 *   `stream` (alternate two host workspaces, or synchronize).
 * device_ws: device_bytes, or NULL to write the schedule into host_ws only (no copy, no
 *   GPU needed: for tests and host-cost benchmarks; num_sms must then be given).
 * Validates the step: qo_indptr[0] == 0 and non-decreasing, 0 <= q_len <= max_q_len,
 * q_len <= kv_len, batch <= max_batch; INA_ERR_INVALID_ARGUMENT names the request. On
 * failure *info is zeroed, and run refuses it. */
ina_status_t ina_mla_plan(const ina_mla_plan_params_t *p, void *host_ws, void *device_ws,
                          void *stream, ina_mla_plan_info_t *info);

typedef struct ina_mla_run_params {
  size_t struct_size;
  uint32_t version;
  const void *q_nope;        /* bf16 [tokens, heads, kv_lora_rank] */
  int64_t q_nope_token_stride, q_nope_head_stride; /* elements */
  const void *q_pe;          /* bf16 [tokens, heads, rope_dim] */
  int64_t q_pe_token_stride, q_pe_head_stride;     /* elements */
  ina_mla_cache_t cache;     /* any format (F32 only on the generic kernel), device pointers */
  const int32_t *kv_indptr;  /* device [batch + 1] */
  const int32_t *kv_indices; /* device */
  float softmax_scale;       /* > 0 */
  void *out;                 /* bf16 [tokens, heads, kv_lora_rank] */
  int64_t out_token_stride, out_head_stride;       /* elements */
  float *lse;                /* device [tokens, heads] or NULL */
  /* version 2: sparse plans only (NULL for dense ones): device int32 [tokens,
   * sparse_topk], each query token's selected positions within its request. */
  const int32_t *indices;
} ina_mla_run_params_t;

/* Designated, so that -Wmissing-field-initializers stays quiet; the rest is zero. */
#define INA_MLA_RUN_PARAMS_INIT {.struct_size = sizeof(ina_mla_run_params_t), .version = 2}

/* Enqueues the attention kernel and the combine pass on `stream`. The kernels read every
 * length from device_ws; only pointers, strides, the softmax scale and the bucket are
 * baked into a captured graph. kv_lora_rank 512 + rope 64 with a bf16 or FP8 cache in
 * 16-byte aligned layouts (and 4-byte aligned queries and outputs with even strides)
 * take the tensor-core kernel (its FP8 variant computes in f16: query values must stay
 * below 65504 and cached latent values below 28000 in magnitude); anything else takes a
 * generic fp32 kernel
 * (kv_lora_rank + rope_dim <= 640). */
ina_status_t ina_mla_run(const ina_mla_plan_info_t *info, void *device_ws,
                         const ina_mla_run_params_t *p, void *stream);

/* ---- sparse MLA (DeepSeek-V3.2's sparse attention) ---------------------------------
 * Each query token attends only to the cache positions its row of run_params.indices
 * lists (attention/dsa.h's "sparse MLA": the math above over the selected positions
 * instead of all visible ones; out and lse as there). Query token s of request b sees
 * visible(s) = kv_len[b] - q_len + j + 1 positions (j its place in the request); its row
 * has topk entries, of which the kernel reads the first min(topk, visible(s)): they must
 * be distinct positions in [0, visible(s)), and the rest of the row is not read. That is
 * what the top-k selection writes (best first, -1 past the visible positions); an entry
 * -1 or out of range among those read is undefined behaviour. Decode (q_len 1), MTP
 * (q_len 2-4) and prefill chunks go through the same plan: every query token is a work
 * unit of its own, since each has its own positions.
 *
 * The plan is ina_mla_plan's with the bucket in query tokens (max_tokens): the same
 * workspaces, the same fixed grid, the same run (which sees info.sparse_topk and reads
 * run_params.indices) and picks its kernel as for a dense plan. The sparse plan takes
 * the dims the dense plan takes: DeepSeek's 512 + 64 on the tensor-core kernels (and on
 * the generic one for an f32 cache or unaligned layouts), any other kv_lora_rank >= 1,
 * rope_dim >= 0 with kv_lora_rank + rope_dim <= 640 on the generic fp32 kernel; larger
 * dims are INA_ERR_UNSUPPORTED. */
typedef struct ina_mla_sparse_plan_params {
  size_t struct_size; /* sizeof(ina_mla_sparse_plan_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  int32_t batch;      /* requests this step */
  int32_t max_tokens; /* bucket: query tokens a step may have (workspace and grid) */
  const int32_t *qo_indptr; /* host [batch + 1] */
  const int32_t *kv_len;    /* host [batch] */
  int32_t topk;             /* entries per index row, >= 1 */
  int32_t num_heads;        /* 1..128 */
  int32_t kv_lora_rank;     /* 512 for DeepSeek; other dims as for ina_mla_plan */
  int32_t rope_dim;         /* 64 for DeepSeek */
  int32_t page_size;        /* >= 1 */
  int32_t num_sms;          /* 0: the current device's */
} ina_mla_sparse_plan_params_t;

#define INA_MLA_SPARSE_PLAN_PARAMS_INIT \
  {.struct_size = sizeof(ina_mla_sparse_plan_params_t), .version = 1, .kv_lora_rank = 512, \
   .rope_dim = 64, .page_size = 64}

ina_status_t ina_mla_sparse_workspace_size(const ina_mla_sparse_plan_params_t *p,
                                           size_t *host_bytes, size_t *device_bytes);
/* As ina_mla_plan (workspaces, stream, device_ws NULL), for the sparse run. Validates the
 * step as ina_mla_plan does, plus qo_indptr[batch] <= max_tokens and topk >= 1. */
ina_status_t ina_mla_sparse_plan(const ina_mla_sparse_plan_params_t *p, void *host_ws,
                                 void *device_ws, void *stream, ina_mla_plan_info_t *info);

#ifdef __cplusplus
}
#endif
#endif
