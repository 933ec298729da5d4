/* The plain-C reference of DeepSeek Sparse Attention (attention/dsa.h): the indexer's
 * scores, the top-k selection and sparse absorbed MLA, each in plan / run form.
 *
 * The plan writes a small schedule into the workspace: a header that ties it to the
 * plan (so that a run given another op's or a stale workspace refuses it), then the
 * request and the visible length of every query token, and for sparse MLA a stamp array
 * of max_kv_len entries for the run's duplicate check. Runs read lengths only from
 * there, as a GPU run reads them from its device workspace.
 *
 * FP8 index keys: the e4m3 bytes convert to f32 exactly, each product q_d * e4m3_d
 * (24 + 4 significant bits) is exact in double and the sum rounds as for f32 keys; the
 * head's dot product is then multiplied by the token's scale once, in double (one more
 * rounding of 2^-53, instead of one f32 rounding per dequantized value).
 *
 * Numerics: dot products and sums in double, rounded to f32 once at the end, so the
 * reference's own error stays far below the f32 error model its tests allow for
 * kernels. The top-k keeps a k-entry heap in the output row itself and needs no scratch;
 * sparse MLA makes two passes over the selected entries (maximum, then the weighted
 * sum) rather than keeping their scores, so its scratch does not grow with k. */
#define INA_LOG_SUBSYS "dsa"
#include "attention/dsa.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/dtype.h"

#define DSA_MAGIC 0x31415344u /* "DSA1" */
#define DSA_OP_SCORE 1
#define DSA_OP_TOPK 2
#define DSA_OP_MLA 3
#define DSA_CHUNK 128 /* values converted from the cache at a time, on the stack */

typedef struct dsa_ws_header {
  uint32_t magic;
  int32_t op, batch, total_tokens, max_kv_len, pad_;
} dsa_ws_header_t;

/* Workspace layout: header, token_request [tokens], visible [tokens], stamp [max_kv]. */
static size_t ws_bytes(int32_t op, int32_t tokens, int32_t max_kv) {
  size_t n = sizeof(dsa_ws_header_t) + 2 * sizeof(int32_t) * (size_t)tokens;
  if (op == DSA_OP_MLA) n += sizeof(int32_t) * (size_t)max_kv;
  return n;
}
static const int32_t *ws_token_request(const void *ws) {
  return (const int32_t *)((const char *)ws + sizeof(dsa_ws_header_t));
}
static const int32_t *ws_visible(const void *ws, int32_t tokens) {
  return ws_token_request(ws) + tokens;
}
static int32_t *ws_stamp(void *ws, int32_t tokens) {
  return (int32_t *)((char *)ws + sizeof(dsa_ws_header_t)) + 2 * (size_t)tokens;
}

/* Validates a step's lengths; *tokens and *max_kv receive its totals. */
static ina_status_t check_step(const char *op, int32_t batch, const int32_t *qo_indptr,
                               const int32_t *kv_len, int32_t *tokens, int32_t *max_kv) {
  ina_status_t st = INA_OK;
  *tokens = 0;
  *max_kv = 0;
  INA_REQUIRE(batch >= 0, INA_ERR_INVALID_ARGUMENT, "dsa %s: batch %d < 0", op, batch);
  INA_REQUIRE(qo_indptr != NULL, INA_ERR_INVALID_ARGUMENT, "dsa %s: qo_indptr is NULL", op);
  INA_REQUIRE(batch == 0 || kv_len != NULL, INA_ERR_INVALID_ARGUMENT, "dsa %s: kv_len is NULL", op);
  INA_REQUIRE(qo_indptr[0] == 0, INA_ERR_INVALID_ARGUMENT, "dsa %s: qo_indptr[0] is %d, not 0", op,
              qo_indptr[0]);
  for (int32_t b = 0; b < batch; b++) {
    const int32_t q_len = qo_indptr[b + 1] - qo_indptr[b];
    INA_REQUIRE(qo_indptr[b + 1] >= qo_indptr[b], INA_ERR_INVALID_ARGUMENT,
                "dsa %s: qo_indptr decreases at request %d (%d -> %d)", op, b, qo_indptr[b],
                qo_indptr[b + 1]);
    INA_REQUIRE(kv_len[b] >= 0 && q_len <= kv_len[b], INA_ERR_INVALID_ARGUMENT,
                "dsa %s: request %d has %d query tokens but kv_len %d", op, b, q_len, kv_len[b]);
    if (kv_len[b] > *max_kv) *max_kv = kv_len[b];
  }
  *tokens = qo_indptr[batch];
fail:
  return st;
}

/* The common part of the three plans: checks, then the schedule into the workspace. */
static ina_status_t plan_step(const char *name, int32_t op, ina_dsa_backend_t backend,
                              int32_t batch, const int32_t *qo_indptr, const int32_t *kv_len,
                              void *workspace, size_t workspace_bytes, ina_dsa_plan_info_t *info) {
  ina_status_t st = INA_OK;
  int32_t tokens = 0, max_kv = 0;
  INA_REQUIRE(backend == INA_DSA_BACKEND_REF, INA_ERR_UNSUPPORTED,
              "dsa %s: backend %d has no kernels in this build (only the reference, %d)", name,
              (int)backend, (int)INA_DSA_BACKEND_REF);
  INA_CHECK(check_step(name, batch, qo_indptr, kv_len, &tokens, &max_kv));
  const size_t need = ws_bytes(op, tokens, max_kv);
  INA_REQUIRE(workspace != NULL, INA_ERR_INVALID_ARGUMENT, "dsa %s: workspace is NULL", name);
  INA_REQUIRE(workspace_bytes >= need, INA_ERR_INVALID_ARGUMENT,
              "dsa %s: workspace of %zu bytes, the step needs %zu", name, workspace_bytes, need);
  dsa_ws_header_t h = {DSA_MAGIC, op, batch, tokens, max_kv, 0};
  memcpy(workspace, &h, sizeof h);
  int32_t *request = (int32_t *)((char *)workspace + sizeof h), *visible = request + tokens;
  for (int32_t b = 0; b < batch; b++) {
    const int32_t q_len = qo_indptr[b + 1] - qo_indptr[b];
    for (int32_t j = 0; j < q_len; j++) {
      request[qo_indptr[b] + j] = b;
      visible[qo_indptr[b] + j] = kv_len[b] - q_len + j + 1;
    }
  }
  info->op = op;
  info->backend = (int32_t)backend;
  info->batch = batch;
  info->total_tokens = tokens;
  info->max_kv_len = max_kv;
  info->workspace_bytes = need;
fail:
  return st;
}

/* The run's checks of the plan and the workspace. */
static ina_status_t check_planned(const char *name, int32_t op, const ina_dsa_plan_info_t *info,
                                  const void *workspace) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(info != NULL, INA_ERR_INVALID_ARGUMENT, "dsa %s: info is NULL", name);
  INA_REQUIRE(info->op == op, INA_ERR_INVALID_ARGUMENT,
              "dsa %s: info was not planned for this operation (op %d, want %d; a failed plan "
              "zeroes it)", name, info->op, op);
  INA_REQUIRE(info->backend == INA_DSA_BACKEND_REF, INA_ERR_UNSUPPORTED,
              "dsa %s: backend %d has no kernels in this build", name, info->backend);
  INA_REQUIRE(workspace != NULL, INA_ERR_INVALID_ARGUMENT, "dsa %s: workspace is NULL", name);
  dsa_ws_header_t h;
  memcpy(&h, workspace, sizeof h);
  INA_REQUIRE(h.magic == DSA_MAGIC && h.op == op && h.batch == info->batch &&
                  h.total_tokens == info->total_tokens && h.max_kv_len == info->max_kv_len,
              INA_ERR_INVALID_ARGUMENT,
              "dsa %s: the workspace does not hold this plan (planned for another step or op)",
              name);
fail:
  return st;
}

/* Pages listed for each request must hold its tokens. */
static ina_status_t check_pages(const char *name, const ina_dsa_plan_info_t *info,
                                const int32_t *kv_indptr, const int32_t *kv_indices,
                                const int32_t *visible, const int32_t *request) {
  ina_status_t st = INA_OK;
  if (info->total_tokens == 0) return INA_OK; /* nothing is read */
  INA_REQUIRE(kv_indptr != NULL, INA_ERR_INVALID_ARGUMENT, "dsa %s: kv_indptr is NULL", name);
  INA_REQUIRE(info->max_kv_len == 0 || kv_indices != NULL, INA_ERR_INVALID_ARGUMENT,
              "dsa %s: kv_indices is NULL", name);
  /* The last query token of a request sees its whole context, kv_len. */
  for (int32_t s = 0; s < info->total_tokens; s++) {
    if (s + 1 < info->total_tokens && request[s + 1] == request[s]) continue;
    const int32_t b = request[s];
    const int64_t pages = (int64_t)kv_indptr[b + 1] - kv_indptr[b];
    INA_REQUIRE(pages >= 0 && pages * info->page_size >= visible[s], INA_ERR_INVALID_ARGUMENT,
                "dsa %s: request %d: %lld pages of %d cannot hold its %d tokens", name, b,
                (long long)pages, info->page_size, visible[s]);
  }
fail:
  return st;
}

/* Converts n values of a cache row to f32. */
static void load_f32(const char *src, int bf16, int32_t from, int32_t n, float *dst) {
  if (bf16)
    ina_to_f32(src + 2 * (size_t)from, INA_DTYPE_BF16, dst, (size_t)n);
  else
    memcpy(dst, src + 4 * (size_t)from, sizeof(float) * (size_t)n);
}

/* ---- FP8 index keys ------------------------------------------------------------------ */

ina_status_t ina_dsa_index_key_quantize_fp8(const float *key, int32_t head_dim, uint8_t *q,
                                            void *scale) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(key != NULL && q != NULL && scale != NULL, INA_ERR_INVALID_ARGUMENT,
              "dsa fp8 key: %s is NULL", !key ? "key" : !q ? "q" : "scale");
  INA_REQUIRE(head_dim >= 1, INA_ERR_INVALID_ARGUMENT, "dsa fp8 key: head_dim %d < 1", head_dim);
  for (int32_t d = 0; d < head_dim; d++)
    INA_REQUIRE(isfinite(key[d]), INA_ERR_INVALID_ARGUMENT,
                "dsa fp8 key: value %d is %g (an FP8 key must be finite)", d, (double)key[d]);
  /* core's rule: the whole key is one 1 x head_dim block. */
  float s = 0;
  INA_CHECK(ina_fp8_quantize_blocks(key, 1, head_dim, 1, head_dim, q, &s));
  memcpy(scale, &s, sizeof s);
fail:
  return st;
}

ina_status_t ina_dsa_index_query_round_fp8(const float *q, int32_t rows, int32_t head_dim,
                                           float *out) {
  ina_status_t st = INA_OK;
  uint8_t *bytes = NULL;
  float *values = NULL;
  INA_REQUIRE(q != NULL && out != NULL, INA_ERR_INVALID_ARGUMENT, "dsa fp8 query: %s is NULL",
              !q ? "q" : "out");
  INA_REQUIRE(rows >= 0 && head_dim >= 1, INA_ERR_INVALID_ARGUMENT,
              "dsa fp8 query: rows %d / head_dim %d (rows >= 0, head_dim >= 1)", rows, head_dim);
  bytes = malloc((size_t)head_dim);
  values = malloc(sizeof(float) * (size_t)head_dim);
  INA_CHECK_ALLOC(bytes && values ? bytes : NULL);
  for (int32_t r = 0; r < rows; r++) { /* every row is checked before any is written */
    float scale;
    INA_CHECK(ina_dsa_index_key_quantize_fp8(q + (int64_t)r * head_dim, head_dim, bytes, &scale));
  }
  for (int32_t r = 0; r < rows; r++) {
    float scale;
    INA_CHECK(ina_dsa_index_key_quantize_fp8(q + (int64_t)r * head_dim, head_dim, bytes, &scale));
    ina_to_f32(bytes, INA_DTYPE_FP8_E4M3, values, (size_t)head_dim);
    for (int32_t d = 0; d < head_dim; d++)
      out[(int64_t)r * head_dim + d] = (float)((double)values[d] * scale);
  }
fail:
  free(bytes);
  free(values);
  return st;
}

ina_status_t ina_dsa_index_key_store(const ina_dsa_index_cache_t *cache, int64_t page,
                                     int32_t slot, const float *key, int32_t head_dim) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(cache != NULL && key != NULL, INA_ERR_INVALID_ARGUMENT, "dsa key store: %s is NULL",
              !cache ? "cache" : "key");
  INA_REQUIRE(cache->keys != NULL, INA_ERR_INVALID_ARGUMENT, "dsa key store: cache.keys is NULL");
  INA_REQUIRE(head_dim == cache->head_dim && head_dim >= 1, INA_ERR_INVALID_ARGUMENT,
              "dsa key store: head_dim %d, the cache's is %d", head_dim, cache->head_dim);
  INA_REQUIRE(page >= 0 && slot >= 0 && slot < cache->page_size, INA_ERR_INVALID_ARGUMENT,
              "dsa key store: page %lld slot %d (page_size %d)", (long long)page, slot,
              cache->page_size);
  char *base = (char *)(uintptr_t)cache->keys + page * cache->page_stride;
  char *dst = base + (int64_t)slot * cache->token_stride;
  switch (cache->format) {
  case INA_DSA_KEY_F32: memcpy(dst, key, sizeof(float) * (size_t)head_dim); break;
  case INA_DSA_KEY_BF16:
    for (int32_t d = 0; d < head_dim; d++) {
      const uint16_t v = ina_f32_to_bf16(key[d]);
      memcpy(dst + 2 * (size_t)d, &v, sizeof v);
    }
    break;
  case INA_DSA_KEY_FP8:
    INA_REQUIRE(cache->scale_stride != 0, INA_ERR_INVALID_ARGUMENT,
                "dsa key store: an FP8 cache needs scale_stride != 0 (describe it with "
                "ina_dsa_index_cache_fp8_inline or _fp8_paged)");
    INA_CHECK(ina_dsa_index_key_quantize_fp8(
        key, head_dim, (uint8_t *)dst,
        base + cache->scale_offset + (int64_t)slot * cache->scale_stride));
    break;
  default:
    INA_REQUIRE(0, INA_ERR_INVALID_ARGUMENT, "dsa key store: cache.format %d is not a key format",
                (int)cache->format);
  }
fail:
  return st;
}

/* ---- 1. index score ---------------------------------------------------------------- */

ina_status_t ina_dsa_score_workspace_size(const ina_dsa_score_plan_params_t *p, size_t *bytes) {
  ina_status_t st = INA_OK;
  int32_t tokens, max_kv;
  INA_REQUIRE(bytes != NULL, INA_ERR_INVALID_ARGUMENT, "dsa score: bytes is NULL");
  *bytes = 0;
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_score_plan_params_t, score_stride) + sizeof(int32_t),
                        "dsa score plan params", "INA_DSA_SCORE_PLAN_PARAMS_INIT");
  INA_CHECK(check_step("score", p->batch, p->qo_indptr, p->kv_len, &tokens, &max_kv));
  *bytes = ws_bytes(DSA_OP_SCORE, tokens, max_kv);
fail:
  return st;
}

ina_status_t ina_dsa_score_plan(const ina_dsa_score_plan_params_t *p, void *workspace,
                                size_t workspace_bytes, ina_dsa_plan_info_t *info) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(info != NULL, INA_ERR_INVALID_ARGUMENT, "dsa score: info is NULL");
  memset(info, 0, sizeof *info);
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_score_plan_params_t, score_stride) + sizeof(int32_t),
                        "dsa score plan params", "INA_DSA_SCORE_PLAN_PARAMS_INIT");
  INA_REQUIRE(p->num_heads >= 1 && p->num_heads <= INA_DSA_MAX_INDEX_HEADS,
              INA_ERR_INVALID_ARGUMENT, "dsa score: num_heads %d outside 1..%d", p->num_heads,
              INA_DSA_MAX_INDEX_HEADS);
  INA_REQUIRE(p->head_dim >= 1, INA_ERR_INVALID_ARGUMENT, "dsa score: head_dim %d < 1", p->head_dim);
  INA_REQUIRE(p->page_size >= 1, INA_ERR_INVALID_ARGUMENT, "dsa score: page_size %d < 1",
              p->page_size);
  INA_CHECK(plan_step("score", DSA_OP_SCORE, p->backend, p->batch, p->qo_indptr, p->kv_len,
                      workspace, workspace_bytes, info));
  const int32_t stride = p->score_stride ? p->score_stride : info->max_kv_len;
  INA_REQUIRE(stride >= info->max_kv_len && stride >= 0, INA_ERR_INVALID_ARGUMENT,
              "dsa score: score_stride %d is shorter than the longest context, %d", p->score_stride,
              info->max_kv_len);
  info->num_heads = p->num_heads;
  info->head_dim = p->head_dim;
  info->page_size = p->page_size;
  info->score_stride = stride;
fail:
  if (st != INA_OK && info) memset(info, 0, sizeof *info);
  return st;
}

typedef struct score_job {
  const ina_dsa_plan_info_t *info;
  const ina_dsa_score_run_params_t *p;
  const int32_t *request, *visible;
} score_job_t;

/* One query token per item: every head against each visible key. */
static void score_items(void *ctx, int64_t begin, int64_t end, int worker) {
  (void)worker;
  const score_job_t *j = ctx;
  const ina_dsa_score_run_params_t *p = j->p;
  const int32_t H = j->info->num_heads, D = j->info->head_dim, ps = j->info->page_size;
  const int bf16 = p->cache.format == INA_DSA_KEY_BF16, fp8 = p->cache.format == INA_DSA_KEY_FP8;
  float key[DSA_CHUNK];
  double dot[INA_DSA_MAX_INDEX_HEADS];
  for (int64_t s = begin; s < end; s++) {
    const int32_t b = j->request[s], visible = j->visible[s];
    const float *q = p->q + s * H * D, *w = p->weights + s * H;
    float *row = p->scores + s * j->info->score_stride;
    for (int32_t t = 0; t < visible; t++) {
      const int64_t page = p->kv_indices[p->kv_indptr[b] + t / ps], slot = t % ps;
      const char *base = (const char *)p->cache.keys + page * p->cache.page_stride;
      const char *k = base + slot * p->cache.token_stride;
      for (int32_t h = 0; h < H; h++) dot[h] = 0;
      for (int32_t d0 = 0; d0 < D; d0 += DSA_CHUNK) {
        const int32_t n = D - d0 < DSA_CHUNK ? D - d0 : DSA_CHUNK;
        if (fp8)
          ina_to_f32(k + d0, INA_DTYPE_FP8_E4M3, key, (size_t)n); /* exact */
        else
          load_f32(k, bf16, d0, n, key);
        for (int32_t h = 0; h < H; h++) {
          const float *qh = q + (int64_t)h * D + d0;
          double acc = 0;
          for (int32_t d = 0; d < n; d++) acc += (double)qh[d] * key[d];
          dot[h] += acc;
        }
      }
      if (fp8) { /* value = e4m3 * the token's scale */
        float kscale;
        memcpy(&kscale, base + p->cache.scale_offset + slot * p->cache.scale_stride, sizeof kscale);
        for (int32_t h = 0; h < H; h++) dot[h] *= kscale;
      }
      /* Hugging Face's order: scale, relu, weight, sum over heads. */
      double score = 0;
      for (int32_t h = 0; h < H; h++) {
        const double x = dot[h] * p->softmax_scale;
        score += (double)w[h] * (x > 0 ? x : 0);
      }
      row[t] = (float)score;
    }
    for (int32_t t = visible; t < j->info->score_stride; t++) row[t] = -INFINITY;
  }
}

ina_status_t ina_dsa_score_run(const ina_dsa_plan_info_t *info, const void *workspace,
                               const ina_dsa_score_run_params_t *p, ina_threadpool_t *pool,
                               void *stream) {
  ina_status_t st = INA_OK;
  (void)stream;
  INA_CHECK(check_planned("score", DSA_OP_SCORE, info, workspace));
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_score_run_params_t, scores) + sizeof(float *),
                        "dsa score run params", "INA_DSA_SCORE_RUN_PARAMS_INIT");
  const int32_t tokens = info->total_tokens;
  INA_REQUIRE(tokens == 0 || (p->q && p->weights && p->scores), INA_ERR_INVALID_ARGUMENT,
              "dsa score: %s is NULL", !p->q ? "q" : !p->weights ? "weights" : "scores");
  INA_REQUIRE(p->cache.format == INA_DSA_KEY_F32 || p->cache.format == INA_DSA_KEY_BF16 ||
                  p->cache.format == INA_DSA_KEY_FP8,
              INA_ERR_INVALID_ARGUMENT, "dsa score: cache.format %d is not a key format",
              (int)p->cache.format);
  INA_REQUIRE(p->cache.format != INA_DSA_KEY_FP8 || p->cache.scale_stride != 0,
              INA_ERR_INVALID_ARGUMENT,
              "dsa score: an FP8 index cache needs scale_stride != 0 (describe it with "
              "ina_dsa_index_cache_fp8_inline or _fp8_paged, not _dense)");
  INA_REQUIRE(p->cache.page_size == info->page_size && p->cache.head_dim == info->head_dim,
              INA_ERR_INVALID_ARGUMENT,
              "dsa score: cache page_size %d / head_dim %d, planned %d / %d", p->cache.page_size,
              p->cache.head_dim, info->page_size, info->head_dim);
  INA_REQUIRE(info->max_kv_len == 0 || p->cache.keys != NULL, INA_ERR_INVALID_ARGUMENT,
              "dsa score: cache.keys is NULL");
  INA_REQUIRE(p->softmax_scale > 0 && isfinite(p->softmax_scale), INA_ERR_INVALID_ARGUMENT,
              "dsa score: softmax_scale %g is not a positive number", (double)p->softmax_scale);
  const int32_t *request = ws_token_request(workspace), *visible = ws_visible(workspace, tokens);
  INA_CHECK(check_pages("score", info, p->kv_indptr, p->kv_indices, visible, request));
  score_job_t job = {info, p, request, visible};
  ina_parallel_for(pool, tokens, 1, score_items, &job);
fail:
  return st;
}

/* ---- 2. top-k ---------------------------------------------------------------------- */

ina_status_t ina_dsa_topk_workspace_size(const ina_dsa_topk_plan_params_t *p, size_t *bytes) {
  ina_status_t st = INA_OK;
  int32_t tokens, max_kv;
  INA_REQUIRE(bytes != NULL, INA_ERR_INVALID_ARGUMENT, "dsa topk: bytes is NULL");
  *bytes = 0;
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_topk_plan_params_t, score_stride) + sizeof(int32_t),
                        "dsa topk plan params", "INA_DSA_TOPK_PLAN_PARAMS_INIT");
  INA_CHECK(check_step("topk", p->batch, p->qo_indptr, p->kv_len, &tokens, &max_kv));
  *bytes = ws_bytes(DSA_OP_TOPK, tokens, max_kv);
fail:
  return st;
}

ina_status_t ina_dsa_topk_plan(const ina_dsa_topk_plan_params_t *p, void *workspace,
                               size_t workspace_bytes, ina_dsa_plan_info_t *info) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(info != NULL, INA_ERR_INVALID_ARGUMENT, "dsa topk: info is NULL");
  memset(info, 0, sizeof *info);
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_topk_plan_params_t, score_stride) + sizeof(int32_t),
                        "dsa topk plan params", "INA_DSA_TOPK_PLAN_PARAMS_INIT");
  INA_REQUIRE(p->topk >= 1, INA_ERR_INVALID_ARGUMENT, "dsa topk: topk (k) %d < 1", p->topk);
  INA_CHECK(plan_step("topk", DSA_OP_TOPK, p->backend, p->batch, p->qo_indptr, p->kv_len,
                      workspace, workspace_bytes, info));
  const int32_t stride = p->score_stride ? p->score_stride : info->max_kv_len;
  INA_REQUIRE(stride >= info->max_kv_len && stride >= 0, INA_ERR_INVALID_ARGUMENT,
              "dsa topk: score_stride %d is shorter than the longest context, %d", p->score_stride,
              info->max_kv_len);
  info->topk = p->topk;
  info->score_stride = stride;
fail:
  if (st != INA_OK && info) memset(info, 0, sizeof *info);
  return st;
}

/* Whether position a ranks before position b: higher score, then NaN last, then lower
 * position. A strict total order, so the selection is unique. */
static int better(const float *s, int32_t a, int32_t b) {
  const int na = isnan(s[a]), nb = isnan(s[b]);
  if (na != nb) return nb;
  if (!na && s[a] != s[b]) return s[a] > s[b];
  return a < b;
}

/* Sift-down in a heap whose root is the worst entry (heap order: parent worse). */
static void sift_worst(const float *s, int32_t *heap, int32_t n, int32_t i) {
  for (;;) {
    int32_t worst = i;
    const int32_t l = 2 * i + 1, r = l + 1;
    if (l < n && better(s, heap[worst], heap[l])) worst = l;
    if (r < n && better(s, heap[worst], heap[r])) worst = r;
    if (worst == i) return;
    const int32_t tmp = heap[i];
    heap[i] = heap[worst];
    heap[worst] = tmp;
    i = worst;
  }
}

typedef struct topk_job {
  const ina_dsa_plan_info_t *info;
  const ina_dsa_topk_run_params_t *p;
  const int32_t *visible;
} topk_job_t;

static void topk_items(void *ctx, int64_t begin, int64_t end, int worker) {
  (void)worker;
  const topk_job_t *j = ctx;
  const int32_t k = j->info->topk;
  for (int64_t s = begin; s < end; s++) {
    const float *row = j->p->scores + s * j->info->score_stride;
    int32_t *heap = j->p->indices + s * k;
    const int32_t visible = j->visible[s], m = visible < k ? visible : k;
    for (int32_t i = 0; i < m; i++) heap[i] = i;
    for (int32_t i = m / 2 - 1; i >= 0; i--) sift_worst(row, heap, m, i);
    for (int32_t t = m; t < visible; t++) {
      if (better(row, t, heap[0])) {
        heap[0] = t;
        sift_worst(row, heap, m, 0);
      }
    }
    /* Heap sort: the worst goes to the end each round, leaving the best first. */
    for (int32_t n = m - 1; n > 0; n--) {
      const int32_t tmp = heap[0];
      heap[0] = heap[n];
      heap[n] = tmp;
      sift_worst(row, heap, n, 0);
    }
    for (int32_t i = m; i < k; i++) heap[i] = -1;
  }
}

ina_status_t ina_dsa_topk_run(const ina_dsa_plan_info_t *info, const void *workspace,
                              const ina_dsa_topk_run_params_t *p, ina_threadpool_t *pool,
                              void *stream) {
  ina_status_t st = INA_OK;
  (void)stream;
  INA_CHECK(check_planned("topk", DSA_OP_TOPK, info, workspace));
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_topk_run_params_t, indices) + sizeof(int32_t *),
                        "dsa topk run params", "INA_DSA_TOPK_RUN_PARAMS_INIT");
  INA_REQUIRE(info->total_tokens == 0 || (p->scores && p->indices), INA_ERR_INVALID_ARGUMENT,
              "dsa topk: %s is NULL", !p->scores ? "scores" : "indices");
  topk_job_t job = {info, p, ws_visible(workspace, info->total_tokens)};
  ina_parallel_for(pool, info->total_tokens, 1, topk_items, &job);
fail:
  return st;
}

/* ---- 3. sparse MLA ----------------------------------------------------------------- */

ina_status_t ina_dsa_mla_workspace_size(const ina_dsa_mla_plan_params_t *p, size_t *bytes) {
  ina_status_t st = INA_OK;
  int32_t tokens, max_kv;
  INA_REQUIRE(bytes != NULL, INA_ERR_INVALID_ARGUMENT, "dsa mla: bytes is NULL");
  *bytes = 0;
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_mla_plan_params_t, index_stride) + sizeof(int32_t),
                        "dsa mla plan params", "INA_DSA_MLA_PLAN_PARAMS_INIT");
  INA_CHECK(check_step("mla", p->batch, p->qo_indptr, p->kv_len, &tokens, &max_kv));
  *bytes = ws_bytes(DSA_OP_MLA, tokens, max_kv);
fail:
  return st;
}

ina_status_t ina_dsa_mla_plan(const ina_dsa_mla_plan_params_t *p, void *workspace,
                              size_t workspace_bytes, ina_dsa_plan_info_t *info) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(info != NULL, INA_ERR_INVALID_ARGUMENT, "dsa mla: info is NULL");
  memset(info, 0, sizeof *info);
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_mla_plan_params_t, index_stride) + sizeof(int32_t),
                        "dsa mla plan params", "INA_DSA_MLA_PLAN_PARAMS_INIT");
  INA_REQUIRE(p->num_heads >= 1, INA_ERR_INVALID_ARGUMENT, "dsa mla: num_heads %d < 1", p->num_heads);
  INA_REQUIRE(p->kv_lora_rank >= 1 && p->rope_dim >= 0, INA_ERR_INVALID_ARGUMENT,
              "dsa mla: kv_lora_rank %d / rope_dim %d (need >= 1 / >= 0)", p->kv_lora_rank,
              p->rope_dim);
  INA_REQUIRE(p->page_size >= 1, INA_ERR_INVALID_ARGUMENT, "dsa mla: page_size %d < 1", p->page_size);
  INA_REQUIRE(p->index_stride >= 1, INA_ERR_INVALID_ARGUMENT,
              "dsa mla: index_stride (k) %d < 1", p->index_stride);
  INA_CHECK(plan_step("mla", DSA_OP_MLA, p->backend, p->batch, p->qo_indptr, p->kv_len, workspace,
                      workspace_bytes, info));
  info->num_heads = p->num_heads;
  info->kv_lora_rank = p->kv_lora_rank;
  info->rope_dim = p->rope_dim;
  info->page_size = p->page_size;
  info->topk = p->index_stride;
fail:
  if (st != INA_OK && info) memset(info, 0, sizeof *info);
  return st;
}

typedef struct mla_job {
  const ina_dsa_plan_info_t *info;
  const ina_dsa_mla_run_params_t *p;
  const int32_t *request;
} mla_job_t;

/* Where the parts of position t of request b live. */
typedef struct entry_ptrs {
  const char *latent, *rope;
  const float *scale;
} entry_ptrs_t;

static entry_ptrs_t entry_at(const ina_dsa_mla_run_params_t *p, int32_t b, int32_t t) {
  const ina_mla_cache_t *c = &p->cache;
  const int64_t page = p->kv_indices[p->kv_indptr[b] + t / c->page_size], slot = t % c->page_size;
  entry_ptrs_t e;
  e.latent = (const char *)c->latent + page * c->latent_page_stride + slot * c->latent_token_stride;
  e.rope = (const char *)c->rope + page * c->rope_page_stride + slot * c->rope_token_stride;
  e.scale = c->format == INA_MLA_CACHE_FP8
                ? (const float *)((const char *)c->scale + page * c->scale_page_stride +
                                  slot * c->scale_token_stride)
                : NULL;
  return e;
}

/* Latent values [from, from + n) of an entry as f32 (FP8: times its block scale, as
 * ina_mla_attention_ref dequantizes). n <= DSA_CHUNK and, for FP8, within one block. */
static void load_latent(const ina_mla_cache_t *c, const entry_ptrs_t *e, int32_t from, int32_t n,
                        float *dst) {
  switch (c->format) {
  case INA_MLA_CACHE_F32: memcpy(dst, e->latent + 4 * (size_t)from, sizeof(float) * (size_t)n); break;
  case INA_MLA_CACHE_BF16: ina_to_f32(e->latent + 2 * (size_t)from, INA_DTYPE_BF16, dst, (size_t)n); break;
  case INA_MLA_CACHE_FP8: {
    ina_to_f32(e->latent + from, INA_DTYPE_FP8_E4M3, dst, (size_t)n);
    const float scale = e->scale[from / 128];
    for (int32_t i = 0; i < n; i++) dst[i] *= scale;
    break;
  }
  }
}

static void load_rope(const ina_mla_cache_t *c, const entry_ptrs_t *e, int32_t from, int32_t n,
                      float *dst) {
  load_f32(e->rope, c->format != INA_MLA_CACHE_F32, from, n, dst);
}

/* Unscaled score of one entry for one (token, head): q_nope . latent + q_pe . rope. */
static double entry_dot(const ina_mla_cache_t *c, const entry_ptrs_t *e, const float *qn,
                        const float *qp, int32_t C, int32_t R) {
  float buf[DSA_CHUNK];
  double s = 0;
  for (int32_t c0 = 0; c0 < C; c0 += DSA_CHUNK) {
    const int32_t n = C - c0 < DSA_CHUNK ? C - c0 : DSA_CHUNK;
    load_latent(c, e, c0, n, buf);
    for (int32_t i = 0; i < n; i++) s += (double)qn[c0 + i] * buf[i];
  }
  for (int32_t r0 = 0; r0 < R; r0 += DSA_CHUNK) {
    const int32_t n = R - r0 < DSA_CHUNK ? R - r0 : DSA_CHUNK;
    load_rope(c, e, r0, n, buf);
    for (int32_t i = 0; i < n; i++) s += (double)qp[r0 + i] * buf[i];
  }
  return s;
}

/* One (token, head) pair per item. The output row accumulates the weighted latents. */
static void mla_items(void *ctx, int64_t begin, int64_t end, int worker) {
  (void)worker;
  const mla_job_t *j = ctx;
  const ina_dsa_mla_run_params_t *p = j->p;
  const ina_mla_cache_t *c = &p->cache;
  const int32_t H = j->info->num_heads, C = j->info->kv_lora_rank, R = j->info->rope_dim;
  const int32_t K = j->info->topk;
  float buf[DSA_CHUNK];
  for (int64_t item = begin; item < end; item++) {
    const int64_t s = item / H;
    const int32_t h = (int32_t)(item % H), b = j->request[s];
    const int32_t *sel = p->indices + s * K;
    const float *qn = p->q_nope + (s * H + h) * C;
    const float *qp = R > 0 ? p->q_pe + (s * H + h) * R : NULL;
    float *out = p->out + (s * H + h) * C;
    /* Scores are rounded to f32 before the softmax, as ina_mla_attention_ref does. */
    float max_score = -INFINITY;
    int32_t count = 0;
    for (int32_t i = 0; i < K; i++) {
      if (sel[i] < 0) continue;
      const entry_ptrs_t e = entry_at(p, b, sel[i]);
      const float score = (float)(entry_dot(c, &e, qn, qp, C, R) * p->softmax_scale);
      if (score > max_score) max_score = score;
      count++;
    }
    for (int32_t x = 0; x < C; x++) out[x] = 0;
    double denom = 0;
    for (int32_t i = 0; i < K && count > 0; i++) {
      if (sel[i] < 0) continue;
      const entry_ptrs_t e = entry_at(p, b, sel[i]);
      const float score = (float)(entry_dot(c, &e, qn, qp, C, R) * p->softmax_scale);
      const double w = exp((double)score - max_score);
      denom += w;
      for (int32_t c0 = 0; c0 < C; c0 += DSA_CHUNK) {
        const int32_t n = C - c0 < DSA_CHUNK ? C - c0 : DSA_CHUNK;
        load_latent(c, &e, c0, n, buf);
        for (int32_t x = 0; x < n; x++) out[c0 + x] += (float)w * buf[x];
      }
    }
    if (count > 0)
      for (int32_t x = 0; x < C; x++) out[x] = (float)(out[x] / denom);
    if (p->lse) p->lse[s * H + h] = count > 0 ? (float)(max_score + log(denom)) : -INFINITY;
  }
}

ina_status_t ina_dsa_mla_run(const ina_dsa_plan_info_t *info, void *workspace,
                             const ina_dsa_mla_run_params_t *p, ina_threadpool_t *pool,
                             void *stream) {
  ina_status_t st = INA_OK;
  (void)stream;
  INA_CHECK(check_planned("mla", DSA_OP_MLA, info, workspace));
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_mla_run_params_t, lse) + sizeof(float *),
                        "dsa mla run params", "INA_DSA_MLA_RUN_PARAMS_INIT");
  const int32_t tokens = info->total_tokens, K = info->topk;
  INA_REQUIRE(tokens == 0 || (p->q_nope && (p->q_pe || info->rope_dim == 0) && p->indices && p->out),
              INA_ERR_INVALID_ARGUMENT, "dsa mla: %s is NULL",
              !p->q_nope ? "q_nope" : !p->indices ? "indices" : !p->out ? "out" : "q_pe");
  const ina_mla_cache_t *c = &p->cache;
  INA_REQUIRE(c->format == INA_MLA_CACHE_F32 || c->format == INA_MLA_CACHE_BF16 ||
                  c->format == INA_MLA_CACHE_FP8,
              INA_ERR_INVALID_ARGUMENT, "dsa mla: cache.format %d is unknown", (int)c->format);
  INA_REQUIRE(c->page_size == info->page_size && c->kv_lora_rank == info->kv_lora_rank &&
                  c->rope_dim == info->rope_dim,
              INA_ERR_INVALID_ARGUMENT,
              "dsa mla: cache page_size %d / kv_lora_rank %d / rope_dim %d, planned %d / %d / %d",
              c->page_size, c->kv_lora_rank, c->rope_dim, info->page_size, info->kv_lora_rank,
              info->rope_dim);
  INA_REQUIRE(c->format != INA_MLA_CACHE_FP8 || info->kv_lora_rank % 128 == 0, INA_ERR_UNSUPPORTED,
              "dsa mla: an FP8 cache needs kv_lora_rank divisible by 128 (got %d)",
              info->kv_lora_rank);
  INA_REQUIRE(info->max_kv_len == 0 ||
                  (c->latent && (c->rope || info->rope_dim == 0) &&
                   (c->scale || c->format != INA_MLA_CACHE_FP8)),
              INA_ERR_INVALID_ARGUMENT, "dsa mla: a cache buffer (latent, rope or scale) is NULL");
  INA_REQUIRE(p->softmax_scale > 0 && isfinite(p->softmax_scale), INA_ERR_INVALID_ARGUMENT,
              "dsa mla: softmax_scale %g is not a positive number", (double)p->softmax_scale);
  const int32_t *request = ws_token_request(workspace), *visible = ws_visible(workspace, tokens);
  INA_CHECK(check_pages("mla", info, p->kv_indptr, p->kv_indices, visible, request));
  /* Every index in [-1, visible), none twice in its row: stamp[t] holds the last row
   * (plus one) that listed t. */
  int32_t *stamp = ws_stamp(workspace, tokens);
  if (info->max_kv_len > 0) memset(stamp, 0, sizeof(int32_t) * (size_t)info->max_kv_len);
  for (int32_t s = 0; s < tokens; s++) {
    const int32_t *sel = p->indices + (int64_t)s * K;
    for (int32_t i = 0; i < K; i++) {
      if (sel[i] == -1) continue;
      INA_REQUIRE(sel[i] >= 0 && sel[i] < visible[s], INA_ERR_INVALID_ARGUMENT,
                  "dsa mla: token %d: indices[%d] = %d is outside -1 .. %d (its visible tokens)",
                  s, i, sel[i], visible[s] - 1);
      INA_REQUIRE(stamp[sel[i]] != s + 1, INA_ERR_INVALID_ARGUMENT,
                  "dsa mla: token %d: position %d is listed twice (indices[%d])", s, sel[i], i);
      stamp[sel[i]] = s + 1;
    }
  }
  mla_job_t job = {info, p, request};
  ina_parallel_for(pool, (int64_t)tokens * info->num_heads, 1, mla_items, &job);
fail:
  return st;
}
