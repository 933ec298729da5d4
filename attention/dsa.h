/* DeepSeek Sparse Attention (DSA, DeepSeek-V3.2): the lightning indexer's scores over the
 * paged index-key cache, the top-k selection of the cached tokens each query keeps, and
 * absorbed MLA attention over only the selected tokens. Three operations, each in plan /
 * run form:
 *
 *   size:  ina_dsa_<op>_workspace_size(&plan_params, &bytes)
 *   plan:  ina_dsa_<op>_plan(&plan_params, workspace, bytes, &info) -- on the host, per
 *          step (lengths change): validates the shapes and lengths and writes the step's
 *          schedule (the request and the visible length of every query token) into the
 *          workspace.
 *   run:   ina_dsa_<op>_run(&info, workspace, &run_params, pool, stream) -- computes;
 *          never allocates; reads every length from the workspace.
 *
 * Backends. plan_params.backend picks who runs: INA_DSA_BACKEND_REF is the plain-C
 * reference (fp64 accumulation; also the CPU engine's implementation): workspace is host
 * memory, `pool` spreads the work (core/threadpool.h, NULL = the caller's thread) and
 * `stream` is ignored. Other backends are refused here with INA_ERR_UNSUPPORTED: the GPU
 * kernels of the score and the top-k have their own plan / run in attention/dsa_gpu.h
 * (one step plan with a bucket, device workspace, bf16 q, `stream` a cudaStream_t),
 * computing exactly these ops (the top-k bit-identically).
 *
 * Requests (the conventions of mla/mla.h and mla/mla_ref.h). A step has `batch`
 * requests; request b has q_len = qo_indptr[b+1] - qo_indptr[b] query tokens (1 for
 * decode, more for prefill chunks), which are the LAST q_len of its kv_len[b] cached
 * tokens: query j of request b (token qo_indptr[b] + j of the step) sits at position
 * pos = kv_len[b] - q_len + j and sees the positions t <= pos, i.e. visible = pos + 1
 * tokens (causal). 0 <= q_len <= kv_len[b]. Request b's pages are kv_indices[kv_indptr[b]
 * .. kv_indptr[b+1]) (FlashInfer's layout); position t lives in slot t % page_size of
 * page kv_indices[kv_indptr[b] + t / page_size]. Any page size >= 1 works (1 and 64 are
 * tested). The index keys sit beside the latent of the same layer, so the three
 * operations of a step normally share one page table and one page size; nothing here
 * requires it.
 *
 * 1. Index score (Hugging Face's DeepseekV32Indexer after its projections):
 *      score[s, t] = sum_h w[s, h] * relu(softmax_scale * (q[s, h, :] . k[t, :]))
 *    for the visible positions t of query token s, softmax_scale = head_dim^-0.5 in the
 *    model (a parameter here). Inputs are already projected, normalized and rotated:
 *    q f32 [tokens, num_heads, head_dim], w f32 [tokens, num_heads] (weights_proj(x)
 *    already multiplied by num_heads^-0.5), keys in the paged index-key cache
 *    (ina_dsa_index_cache_t: one head_dim vector per token, f32, bf16 or FP8 with one
 *    scale per token; see INA_DSA_KEY_FP8 below).
 *    Output: scores f32 [tokens, score_stride]; row s holds the scores of positions
 *    0 .. visible-1 and -INFINITY at every position from visible to score_stride - 1
 *    (the causal bound and the padding past kv_len alike). Every element is written.
 *
 * 2. Top-k: for query token s, the positions (within its request) of the k best of its
 *    `visible` scores (only positions t < visible compete, whatever their value),
 *    written best first into indices int32 [tokens, k]. Order: higher score first; equal
 *    scores: lower position first; NaN ranks below every number (-INFINITY included),
 *    NaNs among themselves by position. When k > visible the row holds all visible
 *    positions in that order and -1 in its last k - visible entries. The result is
 *    fully determined by the scores (no implementation-defined tie breaking), so two
 *    backends agree exactly on equal inputs.
 *
 * 3. Sparse MLA: absorbed MLA attention (the math of ina_mla_attention_ref) of each
 *    query token over only the positions listed in its row of indices [tokens,
 *    index_stride] (entries -1 skipped; the rest distinct, in [0, visible), any order):
 *      out[s, h, :] = sum_{t in sel(s)} p_t latent[t],  p = softmax_t(softmax_scale *
 *                     (q_nope[s, h] . latent[t] + q_pe[s, h] . rope[t]))
 *      lse[s, h]    = natural log of sum_t exp(scaled score_t)
 *    over the paged latent cache of mla/mla_cache.h (any format). A row with no selected
 *    position gives out = 0 and lse = -INFINITY (as ina_mla_attention_ref does for an
 *    empty context). This equals dense attention with every unselected position masked
 *    (Hugging Face's DeepseekV32Attention with its top-k mask).
 *
 * Layouts are dense and row-major as written ([tokens, heads, dim] has stride dim
 * between heads); tokens = qo_indptr[batch]. Page ids must name pages of the cache
 * buffers (not checked). Errors: INA_ERR_INVALID_ARGUMENT for NULL pointers, bad sizes,
 * lengths or page counts, k < 1, a workspace too small or not planned for the call, an
 * FP8 index cache with scale_stride 0;
 * the reference's sparse MLA also refuses an index out of [-1, visible) or repeated in
 * a row (a kernel may not check: out-of-range indices are undefined behaviour there).
 * The message names the argument, request or token. On a failed plan *info is zeroed
 * and every run refuses it; on a failed run the outputs are unspecified.
 *
 * Ownership: the caller owns the workspaces, the caches and every tensor; nothing is
 * kept after a call returns. The plan reads qo_indptr / kv_len during the call only.
 * Thread safety: reentrant; runs on different workspaces (or the same planned workspace,
 * read-only for score and top-k) may run concurrently, each with its own pool or none
 * (a pool takes one parallel_for at a time). Sparse MLA's run writes scratch into its
 * workspace: one run per workspace at a time. */
#ifndef INA_ATTENTION_DSA_H
#define INA_ATTENTION_DSA_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "mla/mla_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The reference keeps one partial dot product per head on its stack (V3.2: 64 heads). */
#define INA_DSA_MAX_INDEX_HEADS 256

typedef enum ina_dsa_backend {
  INA_DSA_BACKEND_REF = 0, /* plain C on the host */
  INA_DSA_BACKEND_CUDA = 1 /* reserved: refused here; the GPU runs are in dsa_gpu.h */
} ina_dsa_backend_t;

typedef enum ina_dsa_key_format {
  INA_DSA_KEY_F32 = 0,  /* 4 * head_dim bytes per token */
  INA_DSA_KEY_BF16 = 1, /* 2 * head_dim bytes per token */
  INA_DSA_KEY_FP8 = 2,  /* head_dim e4m3 bytes + one f32 scale: head_dim + 4 bytes per token */
} ina_dsa_key_format_t;

/* The paged index-key cache: the key of slot s of page p starts at byte
 *   keys + p * page_stride + s * token_stride
 * and holds head_dim values of `format` (contiguous). A separate buffer and keys stored
 * inside the latent cache's pages are described alike.
 *
 * INA_DSA_KEY_FP8 (how DeepSeek's V3.2 release runs its indexer key cache): the key is
 * head_dim float8 e4m3fn bytes (core/dtype.h) and the token has ONE f32 scale, at byte
 *   keys + p * page_stride + scale_offset + s * scale_stride
 * (any alignment), and the key's value d is  e4m3(byte d) * scale  (the exact product;
 * the reference forms it in double). Two layouts, both head_dim + 4 bytes per token (132
 * for V3.2's 128 dims):
 *   inline (ina_dsa_index_cache_fp8_inline): [e4m3 x head_dim | f32 scale] per token,
 *     scale_offset = head_dim, scale_stride = token_stride = head_dim + 4;
 *   paged (ina_dsa_index_cache_fp8_paged, vLLM's indexer cache): a page is its
 *     page_size keys, then their page_size scales: token_stride = head_dim,
 *     scale_offset = page_size * head_dim, scale_stride = 4,
 *     page_stride = page_size * (head_dim + 4).
 * scale_offset and scale_stride are read only for FP8 (0 otherwise); an FP8 cache with
 * scale_stride 0 (two slots sharing one scale, or a descriptor from
 * ina_dsa_index_cache_dense) is refused by the score run.
 *
 * Quantization (ina_dsa_index_key_quantize_fp8, core's rule ina_fp8_quantize_blocks with
 * the whole key as one block): amax = max_d |k_d|, scale = amax / 448 (f32 division),
 * byte d = e4m3(k_d / scale), rounded to nearest even, saturating at 448. An all-zero
 * key gets scale 1 and all-zero bytes (it dequantizes to exact zeros); a nonzero amax
 * whose amax / 448 underflows gets the smallest subnormal scale, 2^-149. A key with a
 * NaN or an infinity is refused. Error: when amax >= 2^-117 (scale a normal f32), each
 * dequantized value is within (2^-4 + 2^-23) |k_d| + 2^-10 * scale of k_d: 2^-4 from
 * e4m3's 3 mantissa bits (relative half-spacing), 2^-10 * scale from its subnormals
 * (absolute half-spacing 2^-10 below 2^-6), 2^-23 from the f32 division. (DeepSeek's
 * and vLLM's kernels may clamp amax or round the scale to a power of two; the score run
 * reads whatever f32 scale is stored.) */
typedef struct ina_dsa_index_cache {
  ina_dsa_key_format_t format;
  int32_t page_size;
  int32_t head_dim;
  const void *keys;
  int64_t page_stride, token_stride; /* bytes */
  int64_t scale_offset, scale_stride; /* bytes; FP8 only (see above) */
} ina_dsa_index_cache_t;

/* Bytes of one token's key in `format` (FP8: with its scale). */
static inline int64_t ina_dsa_index_key_bytes(ina_dsa_key_format_t format, int32_t head_dim) {
  return format == INA_DSA_KEY_FP8 ? (int64_t)head_dim + 4
                                   : (int64_t)head_dim * (format == INA_DSA_KEY_F32 ? 4 : 2);
}

/* One dense buffer of [num_pages][page_size][head_dim] f32 or bf16 keys. FP8 has no
 * dense form: the result has scale_stride 0 and the score run refuses it (use the two
 * helpers below). */
static inline ina_dsa_index_cache_t ina_dsa_index_cache_dense(ina_dsa_key_format_t format,
                                                              const void *keys,
                                                              int32_t page_size,
                                                              int32_t head_dim) {
  const int64_t token = format == INA_DSA_KEY_FP8 ? (int64_t)head_dim
                                                  : ina_dsa_index_key_bytes(format, head_dim);
  ina_dsa_index_cache_t c = {.format = format, .page_size = page_size, .head_dim = head_dim,
                             .keys = keys, .page_stride = token * page_size,
                             .token_stride = token, .scale_offset = 0, .scale_stride = 0};
  return c;
}

/* FP8 keys, one buffer of [num_pages][page_size][e4m3 x head_dim | f32 scale]. */
static inline ina_dsa_index_cache_t ina_dsa_index_cache_fp8_inline(const void *keys,
                                                                   int32_t page_size,
                                                                   int32_t head_dim) {
  const int64_t token = (int64_t)head_dim + 4;
  ina_dsa_index_cache_t c = {.format = INA_DSA_KEY_FP8, .page_size = page_size,
                             .head_dim = head_dim, .keys = keys,
                             .page_stride = token * page_size, .token_stride = token,
                             .scale_offset = head_dim, .scale_stride = token};
  return c;
}

/* FP8 keys, one buffer of [num_pages][ page_size x (e4m3 x head_dim) | page_size x f32 ]
 * (a page's scales after its keys, as vLLM stores the V3.2 indexer cache). */
static inline ina_dsa_index_cache_t ina_dsa_index_cache_fp8_paged(const void *keys,
                                                                  int32_t page_size,
                                                                  int32_t head_dim) {
  ina_dsa_index_cache_t c = {.format = INA_DSA_KEY_FP8, .page_size = page_size,
                             .head_dim = head_dim, .keys = keys,
                             .page_stride = ((int64_t)head_dim + 4) * page_size,
                             .token_stride = head_dim,
                             .scale_offset = (int64_t)head_dim * page_size, .scale_stride = 4};
  return c;
}

/* Quantizes one key of head_dim f32 values to FP8 by the rule above: head_dim e4m3 bytes
 * into q and the f32 scale into *scale (written with memcpy: any alignment). Refuses
 * (INA_ERR_INVALID_ARGUMENT, nothing written) NULL pointers, head_dim < 1 and a
 * non-finite value. Pure; thread-safe. */
ina_status_t ina_dsa_index_key_quantize_fp8(const float *key, int32_t head_dim, uint8_t *q,
                                            void *scale);

/* The FP8 query of DeepSeek's release indexer (dsa_gpu.h's INA_DSA_GPU_QUERY_FP8) on the
 * host: each of the `rows` rows of head_dim values of q (one row per token and head) is
 * quantized by the rule above and replaced by its dequantized values, e4m3(byte) * scale
 * rounded to f32 (within 2^-24 of the exact product), written to out (which may be q).
 * Fed to the reference score, they give the GPU's FP8-query score up to the GPU's
 * accumulation. Refuses (INA_ERR_INVALID_ARGUMENT, nothing written) NULL pointers,
 * rows < 0, head_dim < 1 and a non-finite value. Thread-safe. */
ina_status_t ina_dsa_index_query_round_fp8(const float *q, int32_t rows, int32_t head_dim,
                                           float *out);

/* Writes one token's key (head_dim f32 values) into slot `slot` of page `page` of the
 * cache, converted to its format (bf16: round to nearest even; FP8: quantized as
 * ina_dsa_index_key_quantize_fp8, key bytes and scale where the descriptor puts them).
 * cache->keys must point to writable memory. Refuses an unknown format, an FP8 cache
 * with scale_stride 0, a slot outside 0 .. page_size - 1, page < 0, a head_dim that is
 * not the cache's, and (FP8) a non-finite value; nothing is written then. The GPU's
 * ina_dsa_gpu_append (dsa_gpu.h) writes bf16 keys the same way, byte for byte. */
ina_status_t ina_dsa_index_key_store(const ina_dsa_index_cache_t *cache, int64_t page,
                                     int32_t slot, const float *key, int32_t head_dim);

/* What every run needs from its plan (plain data, kept by the caller). */
typedef struct ina_dsa_plan_info {
  int32_t op;      /* which operation planned it (1 score, 2 top-k, 3 sparse MLA) */
  int32_t backend; /* ina_dsa_backend_t */
  int32_t batch, total_tokens, max_kv_len, page_size;
  int32_t num_heads, head_dim;     /* score: index heads and dim; sparse MLA: heads */
  int32_t kv_lora_rank, rope_dim;  /* sparse MLA */
  int32_t topk;                    /* top-k: k; sparse MLA: the width of an index row */
  int32_t score_stride;            /* score, top-k: elements per score row */
  size_t workspace_bytes;          /* the part of the workspace the plan uses */
} ina_dsa_plan_info_t;

/* ---- 1. index score ---------------------------------------------------------------- */

typedef struct ina_dsa_score_plan_params {
  size_t struct_size; /* sizeof(ina_dsa_score_plan_params_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  ina_dsa_backend_t backend;
  int32_t batch;            /* >= 0 */
  const int32_t *qo_indptr; /* host [batch + 1], qo_indptr[0] == 0, non-decreasing */
  const int32_t *kv_len;    /* host [batch] */
  int32_t num_heads;        /* index heads, 1 .. INA_DSA_MAX_INDEX_HEADS */
  int32_t head_dim;         /* >= 1 (V3.2: 128) */
  int32_t page_size;        /* >= 1, that of the index cache */
  int32_t score_stride;     /* elements per score row, >= max kv_len; 0: max kv_len */
} ina_dsa_score_plan_params_t;

#define INA_DSA_SCORE_PLAN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_score_plan_params_t), .version = 1}

typedef struct ina_dsa_score_run_params {
  size_t struct_size;
  uint32_t version;
  const float *q;                  /* [tokens, num_heads, head_dim] */
  const float *weights;            /* [tokens, num_heads] */
  ina_dsa_index_cache_t cache;     /* page_size and head_dim must match the plan */
  const int32_t *kv_indptr;        /* [batch + 1] */
  const int32_t *kv_indices;
  float softmax_scale;             /* > 0 (head_dim^-0.5 in the model) */
  float *scores;                   /* [tokens, score_stride] */
} ina_dsa_score_run_params_t;

#define INA_DSA_SCORE_RUN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_score_run_params_t), .version = 1}

ina_status_t ina_dsa_score_workspace_size(const ina_dsa_score_plan_params_t *p, size_t *bytes);
ina_status_t ina_dsa_score_plan(const ina_dsa_score_plan_params_t *p, void *workspace,
                                size_t workspace_bytes, ina_dsa_plan_info_t *info);
ina_status_t ina_dsa_score_run(const ina_dsa_plan_info_t *info, const void *workspace,
                               const ina_dsa_score_run_params_t *p, ina_threadpool_t *pool,
                               void *stream);

/* ---- 2. top-k selection ------------------------------------------------------------ */

typedef struct ina_dsa_topk_plan_params {
  size_t struct_size;
  uint32_t version;
  ina_dsa_backend_t backend;
  int32_t batch;
  const int32_t *qo_indptr; /* host [batch + 1] */
  const int32_t *kv_len;    /* host [batch] */
  int32_t topk;             /* k >= 1 (V3.2: index_topk = 2048) */
  int32_t score_stride;     /* as planned for the scores; 0: max kv_len */
} ina_dsa_topk_plan_params_t;

#define INA_DSA_TOPK_PLAN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_topk_plan_params_t), .version = 1}

typedef struct ina_dsa_topk_run_params {
  size_t struct_size;
  uint32_t version;
  const float *scores; /* [tokens, score_stride]; only positions < visible are read */
  int32_t *indices;    /* [tokens, topk] out */
} ina_dsa_topk_run_params_t;

#define INA_DSA_TOPK_RUN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_topk_run_params_t), .version = 1}

ina_status_t ina_dsa_topk_workspace_size(const ina_dsa_topk_plan_params_t *p, size_t *bytes);
ina_status_t ina_dsa_topk_plan(const ina_dsa_topk_plan_params_t *p, void *workspace,
                               size_t workspace_bytes, ina_dsa_plan_info_t *info);
ina_status_t ina_dsa_topk_run(const ina_dsa_plan_info_t *info, const void *workspace,
                              const ina_dsa_topk_run_params_t *p, ina_threadpool_t *pool,
                              void *stream);

/* ---- 3. sparse MLA ----------------------------------------------------------------- */

typedef struct ina_dsa_mla_plan_params {
  size_t struct_size;
  uint32_t version;
  ina_dsa_backend_t backend;
  int32_t batch;
  const int32_t *qo_indptr; /* host [batch + 1] */
  const int32_t *kv_len;    /* host [batch] */
  int32_t num_heads;        /* >= 1 */
  int32_t kv_lora_rank;     /* >= 1; a multiple of 128 for an FP8 cache */
  int32_t rope_dim;         /* >= 0 */
  int32_t page_size;        /* >= 1, that of the latent cache */
  int32_t index_stride;     /* entries per index row (the top-k's k), >= 1 */
} ina_dsa_mla_plan_params_t;

#define INA_DSA_MLA_PLAN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_mla_plan_params_t), .version = 1}

typedef struct ina_dsa_mla_run_params {
  size_t struct_size;
  uint32_t version;
  const float *q_nope;       /* [tokens, heads, kv_lora_rank] (absorbed) */
  const float *q_pe;         /* [tokens, heads, rope_dim]; may be NULL when rope_dim == 0 */
  ina_mla_cache_t cache;     /* any format; page_size, kv_lora_rank, rope_dim as planned */
  const int32_t *kv_indptr;  /* [batch + 1] */
  const int32_t *kv_indices;
  const int32_t *indices;    /* [tokens, index_stride]: positions within the request, or -1 */
  float softmax_scale;       /* > 0 */
  float *out;                /* [tokens, heads, kv_lora_rank] */
  float *lse;                /* [tokens, heads] or NULL */
} ina_dsa_mla_run_params_t;

#define INA_DSA_MLA_RUN_PARAMS_INIT {.struct_size = sizeof(ina_dsa_mla_run_params_t), .version = 1}

ina_status_t ina_dsa_mla_workspace_size(const ina_dsa_mla_plan_params_t *p, size_t *bytes);
ina_status_t ina_dsa_mla_plan(const ina_dsa_mla_plan_params_t *p, void *workspace,
                              size_t workspace_bytes, ina_dsa_plan_info_t *info);
/* workspace: not const, the reference's duplicate check stamps positions there. */
ina_status_t ina_dsa_mla_run(const ina_dsa_plan_info_t *info, void *workspace,
                             const ina_dsa_mla_run_params_t *p, ina_threadpool_t *pool,
                             void *stream);

#ifdef __cplusplus
}
#endif
#endif
