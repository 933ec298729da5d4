/* The lightning indexer of DeepSeek Sparse Attention on the GPU: the index scores over the
 * paged index-key cache and the top-k selection (attention/dsa.h defines both; the GPU
 * computes the same thing), and the append of new index keys into that cache
 * (ina_dsa_gpu_append, at the end; it needs no plan). One step plan serves both runs:
 *
 *   size:  ina_dsa_gpu_workspace_size(&plan_params, &host_bytes, &device_bytes)
 *   plan:  ina_dsa_gpu_plan(&plan_params, host_ws, device_ws, stream, &info) -- on the
 *          host, per step: validates the lengths against the bucket and writes the
 *          request and the visible length of every query token into host_ws (pinned,
 *          cudaHostAlloc), then copies them to device_ws asynchronously on `stream`.
 *   run:   ina_dsa_gpu_score_run(&info, device_ws, &score_params, stream)
 *          ina_dsa_gpu_topk_run(&info, device_ws, &topk_params, stream) -- never
 *          allocate, never wait on the host; the kernels read every length (the step's
 *          token count included) from device_ws, and their grids depend only on the
 *          bucket (max_tokens) and the shape (score_stride, heads, dims, k). A CUDA graph
 *          of the runs therefore replays correctly after a new plan of the same bucket and
 *          shape with other lengths (batch, qo_indptr, kv_len), page tables and data in
 *          the same buffers.
 *
 * Semantics: exactly dsa.h's ops 1 and 2 (requests, causal visibility, -INFINITY from the
 * visible length to score_stride - 1, the top-k order and tie rule, -1 tails), with q in
 * bf16 instead of f32. The top-k is bit-exact: the reference (INA_DSA_BACKEND_REF) given
 * the same scores returns the same indices. The scores are fp32 sums (bf16 q times bf16
 * or FP8-converted keys, fp32 accumulation), so they differ from the reference's double
 * sums by rounding only; each kernel's order of summation is fixed, so a run is
 * deterministic. With query_format FP8 (below) the score is that of the FP8-rounded q,
 * with the FP8 tensor cores' accumulation.
 *
 * Two score kernels for the bf16 query; the run picks one from the shape and the
 * alignment it is given (the FP8 query has a third, attention/dsa_score_fp8.cu):
 *   tensor cores (mma.sync): num_heads 1 .. INA_DSA_GPU_MMA_MAX_HEADS (64), head_dim a
 *     multiple of 16 in 16 .. INA_DSA_GPU_MMA_MAX_HEAD_DIM (128), key rows, page_stride,
 *     token_stride and FP8 scales 4-byte aligned, q 8-byte aligned (16-byte aligned rows
 *     take a faster copy path). V3.2's 64 heads x 128 dims run here.
 *   CUDA cores (fp32 fma, one thread per position): every other shape within the GPU
 *     limits below, and the shapes above with misaligned rows; much slower, meant for
 *     small models and test fixtures (e.g. 4 heads x 40 dims). It needs only natural
 *     alignment: bf16 key rows (keys, page_stride, token_stride) 2-byte aligned, FP8
 *     rows and scales any alignment.
 * Both compute the same function with the same rounding model (tests/attention/
 * test_dsa_gpu.c bounds each element against the reference with one formula), but not
 * bit-identically to each other.
 *
 * GPU limits (INA_ERR_UNSUPPORTED with a message): num_heads 1 .. INA_DSA_GPU_MAX_HEADS
 * (128), head_dim 1 .. INA_DSA_GPU_MAX_HEAD_DIM (256), topk 1 .. INA_DSA_GPU_MAX_TOPK, key
 * formats INA_DSA_KEY_BF16 and INA_DSA_KEY_FP8 (inline or paged layout), bf16 key rows
 * 2-byte aligned, q 2-byte and weights 4-byte aligned. Page ids and kv_indptr live in
 * device memory and are not checked (a page table that does not cover a request's kv_len
 * is undefined behaviour).
 *
 * Ownership: the caller owns both workspaces and every tensor; nothing is kept after a
 * call. Thread safety: plans and runs on different workspaces may run concurrently; runs
 * only read device_ws, so several runs of one plan may be in flight at once. */
#ifndef INA_ATTENTION_DSA_GPU_H
#define INA_ATTENTION_DSA_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "attention/dsa.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define INA_DSA_GPU_MAX_HEADS 128
#define INA_DSA_GPU_MAX_HEAD_DIM 256
#define INA_DSA_GPU_MAX_TOPK 2048
/* The tensor-core score kernel's shapes (the rest take the CUDA-core kernel). */
#define INA_DSA_GPU_MMA_MAX_HEADS 64
#define INA_DSA_GPU_MMA_MAX_HEAD_DIM 128
/* 65535 score CTAs of 1024 positions per row (both score kernels). */
#define INA_DSA_GPU_MAX_SCORE_STRIDE (65535 * 1024)

typedef struct ina_dsa_gpu_plan_params {
  size_t struct_size; /* sizeof(ina_dsa_gpu_plan_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  int32_t batch;            /* >= 0 requests this step */
  const int32_t *qo_indptr; /* host [batch + 1], qo_indptr[0] == 0, non-decreasing */
  const int32_t *kv_len;    /* host [batch], q_len <= kv_len[b] <= max_kv_len */
  int32_t max_tokens;       /* bucket: query tokens a step may have (>= 1; grid and workspace) */
  int32_t max_kv_len;       /* bucket: the longest kv_len a step may have (>= 1) */
  int32_t page_size;        /* >= 1, that of the index cache */
  int32_t num_heads;        /* index heads, 1 .. INA_DSA_GPU_MAX_HEADS (V3.2: 64) */
  int32_t head_dim;         /* 1 .. INA_DSA_GPU_MAX_HEAD_DIM (V3.2: 128) */
  int32_t topk;             /* k, 1 .. INA_DSA_GPU_MAX_TOPK (V3.2: 2048) */
  int32_t score_stride;     /* elements per score row, >= max_kv_len; 0: max_kv_len */
} ina_dsa_gpu_plan_params_t;

#define INA_DSA_GPU_PLAN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_gpu_plan_params_t), .version = 1}

/* What the runs need from the plan (plain data, kept by the caller). */
typedef struct ina_dsa_gpu_plan_info {
  uint32_t magic;               /* nonzero once planned; a failed plan zeroes the struct */
  int32_t batch, total_tokens;  /* this step */
  int32_t step_max_kv_len;      /* this step's longest kv_len */
  int32_t max_tokens, max_kv_len; /* the bucket */
  int32_t page_size, num_heads, head_dim, topk, score_stride;
  size_t host_bytes, device_bytes; /* the parts of the workspaces the plan uses */
} ina_dsa_gpu_plan_info_t;

/* Workspace sizes of a bucket (they do not depend on the step's lengths, which are not
 * read; qo_indptr / kv_len may be NULL here). */
ina_status_t ina_dsa_gpu_workspace_size(const ina_dsa_gpu_plan_params_t *p, size_t *host_bytes,
                                        size_t *device_bytes);

/* stream: a cudaStream_t (NULL = the default stream).
 * host_ws: host_bytes, preferably pinned; the copy reads it asynchronously, so it must not
 *   be planned into again before that copy has run on `stream` (alternate two host
 *   workspaces, or synchronize).
 * device_ws: device_bytes, or NULL to write the schedule into host_ws only (no copy, no
 *   CUDA call: planning and validation work without a GPU; the runs then refuse nothing
 *   they can see, so give them a device workspace that holds this plan).
 * Errors: INA_ERR_INVALID_ARGUMENT (naming the argument or request) for NULL pointers,
 *   a bad bucket, lengths outside it or inconsistent; INA_ERR_UNSUPPORTED for shapes
 *   outside the GPU limits above; INA_ERR_CUDA when the copy cannot be enqueued. On
 *   failure *info is zeroed. */
ina_status_t ina_dsa_gpu_plan(const ina_dsa_gpu_plan_params_t *p, void *host_ws, void *device_ws,
                              void *stream, ina_dsa_gpu_plan_info_t *info);

/* How the score run multiplies q by the keys (score_run_params.query_format).
 *   BF16 (0, the default): bf16 q times bf16 or FP8-converted keys, fp32 accumulation (the
 *     kernels above).
 *   FP8: DeepSeek's release indexer. Each head's q row (the bf16 values) is quantized as an
 *     index key is (ina_dsa_index_key_quantize_fp8's rule: scale sq = amax / 448, e4m3 bytes
 *     rounded to nearest even and saturated), and
 *       score[s, t] = sum_h (w[s, h] * sq_h) * relu(softmax_scale * sk_t * (q8_h . k8_t))
 *     with the e4m3 products on FP8 tensor cores (wgmma), added at their FP8 accumulation
 *     precision (13 fraction bits after aligning to the largest term: not fp32's; the
 *     bound is in tests/attention/test_dsa_gpu.c). The host computes the same function by
 *     rounding q with ina_dsa_index_query_round_fp8 (dsa.h) before the reference score.
 *     Needs FP8 keys, num_heads <= 64, head_dim a multiple of 32 up to 128, key rows
 *     (keys, page_stride, token_stride) 16-byte and scales 4-byte aligned, q 16-byte
 *     aligned, an sm_90 GPU; INA_ERR_UNSUPPORTED otherwise. Key scales are read as
 *     stored (negative ones included); the q scales are positive by the rule. */
typedef enum ina_dsa_gpu_query_format {
  INA_DSA_GPU_QUERY_BF16 = 0,
  INA_DSA_GPU_QUERY_FP8 = 1,
} ina_dsa_gpu_query_format_t;

typedef struct ina_dsa_gpu_score_run_params {
  size_t struct_size;
  uint32_t version;
  const uint16_t *q;            /* device, bf16 bits [tokens, num_heads, head_dim] */
  const float *weights;         /* device [tokens, num_heads] (already times num_heads^-0.5) */
  ina_dsa_index_cache_t cache;  /* keys in device memory; BF16 or FP8; page_size, head_dim as planned */
  const int32_t *kv_indptr;     /* device [batch + 1] */
  const int32_t *kv_indices;    /* device page ids */
  float softmax_scale;          /* > 0 and finite (head_dim^-0.5 in the model) */
  float *scores;                /* device [tokens, score_stride] out, every element written */
  ina_dsa_gpu_query_format_t query_format; /* BF16 (default) or FP8, see above; read when struct_size covers it */
} ina_dsa_gpu_score_run_params_t;

#define INA_DSA_GPU_SCORE_RUN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_gpu_score_run_params_t), .version = 1}

/* Enqueues one score kernel on `stream` (which one: see above; the choice depends only on
 * the plan's shape and the pointers and strides given here, so a captured graph keeps
 * it). The FP8 descriptor must have scale_stride != 0 (ina_dsa_index_cache_fp8_inline or
 * _fp8_paged). Errors: INA_ERR_INVALID_ARGUMENT for an unplanned info, NULL pointers, a
 * cache that does not match the plan, a bad scale; INA_ERR_UNSUPPORTED for F32 keys,
 * bf16 key rows that are not 2-byte aligned, q not 2-byte or weights not 4-byte aligned;
 * INA_ERR_CUDA for a failed launch. */
ina_status_t ina_dsa_gpu_score_run(const ina_dsa_gpu_plan_info_t *info, const void *device_ws,
                                   const ina_dsa_gpu_score_run_params_t *p, void *stream);

typedef struct ina_dsa_gpu_topk_run_params {
  size_t struct_size;
  uint32_t version;
  const float *scores; /* device [tokens, score_stride]; only positions < visible are read */
  int32_t *indices;    /* device [tokens, topk] out, every element written */
} ina_dsa_gpu_topk_run_params_t;

#define INA_DSA_GPU_TOPK_RUN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_gpu_topk_run_params_t), .version = 1}

/* Enqueues the top-k kernel on `stream` (one CTA per query token of the bucket). */
ina_status_t ina_dsa_gpu_topk_run(const ina_dsa_gpu_plan_info_t *info, const void *device_ws,
                                  const ina_dsa_gpu_topk_run_params_t *p, void *stream);

/* ---- index-key append ---------------------------------------------------------------- */

/* Writes each token's index key into the paged index-key cache, converted to the cache's
 * format exactly as ina_dsa_index_key_store does on the host (dsa.h), byte for byte:
 *   BF16: the bf16 row, copied (NaN payloads aside: a copy keeps a signaling NaN's bits,
 *         where the host's f32 -> bf16 conversion sets its quiet bit);
 *   FP8:  the row's values (bf16 widened to f32) quantized by ina_dsa_index_key_quantize_fp8's
 *         rule (amax / 448 as the scale, e4m3 bytes of value / scale rounded to nearest
 *         even and saturated), bytes and f32 scale where the descriptor puts them (inline
 *         or paged layout; the scale is written bytewise, any alignment).
 * Row i goes to slot slots[i] of page page_ids[i]; a negative page id (the padding rows of
 * a CUDA-graph bucket) or a slot outside 0 .. page_size - 1 skips the row (the kernel
 * cannot report it), and nothing else in the cache is touched. Two rows naming the same
 * slot race (undefined which one lands). A key with a NaN or an infinity, which the host
 * quantizer refuses, is written as an FP8 row of unspecified bytes. */
typedef struct ina_dsa_gpu_append_params {
  size_t struct_size;  /* sizeof, set by the INIT macro */
  uint32_t version;    /* 1 */
  int32_t num_tokens;  /* >= 0 rows of k */
  const uint16_t *k;   /* device bf16 [num_tokens, k_stride]: the keys, already normalized and roped */
  int64_t k_stride;    /* elements between rows, >= head_dim; 0 = head_dim */
  const int32_t *page_ids; /* device [num_tokens]: page of each token; a negative id skips the row (padding rows of a CUDA-graph bucket) */
  const int32_t *slots;    /* device [num_tokens]: slot within the page, 0 .. page_size-1 */
  ina_dsa_index_cache_t cache; /* device keys, written (BF16 or FP8, inline or paged layout) */
} ina_dsa_gpu_append_params_t;

#define INA_DSA_GPU_APPEND_PARAMS_INIT {.struct_size = sizeof(ina_dsa_gpu_append_params_t), .version = 1}

/* Enqueues the append on `stream` (a cudaStream_t, NULL = the default stream); returns at
 * once. The grid depends only on num_tokens (one warp per row), so a graph captured for a
 * bucket of num_tokens rows replays with other page ids, slots and keys in the same
 * buffers. num_tokens 0 enqueues nothing (the pointers may then be NULL). Every argument
 * is checked before anything is enqueued. Errors: INA_ERR_INVALID_ARGUMENT (naming the
 * argument) for NULL params, a missing INIT, num_tokens < 0, NULL k / page_ids / slots /
 * cache.keys, k_stride < head_dim, page_size or head_dim < 1, an unknown format,
 * token_stride shorter than a key, page_stride < 1, an FP8 cache whose scale_stride is
 * under 4 (0: ina_dsa_index_cache_dense's FP8 descriptor); INA_ERR_UNSUPPORTED for F32
 * keys (no GPU kernel), a BF16 cache whose keys, page_stride or token_stride is odd, k
 * not 2-byte aligned, and in builds without CUDA; INA_ERR_CUDA for a failed launch. The
 * caller owns every buffer; nothing is kept. Thread safety: as the CUDA runtime; appends
 * into disjoint slots may run concurrently. */
ina_status_t ina_dsa_gpu_append(const ina_dsa_gpu_append_params_t *p, void *stream);

/* ---- internal: shared by the plan (C) and the kernels (CUDA) ---------------------- */

#define INA_DSA_GPU_MAGIC 0x47415344u /* "DSAG" */

/* The schedule in both workspaces: this header, then one row per token of the bucket. */
typedef struct ina_dsa_gpu_ws_header {
  uint32_t magic;
  int32_t total_tokens, batch, max_kv_len; /* this step's */
} ina_dsa_gpu_ws_header_t;

typedef struct ina_dsa_gpu_token_row {
  int32_t request; /* b */
  int32_t visible; /* kv_len[b] - q_len + j + 1 */
} ina_dsa_gpu_token_row_t;

/* Enqueues the host -> device copy of `bytes` of the schedule (INA_ERR_UNSUPPORTED
 * without CUDA). */
ina_status_t ina_dsa_gpu_copy_schedule(void *device_ws, const void *host_ws, size_t bytes,
                                       void *stream);

#ifdef __cplusplus
}
#endif
#endif
