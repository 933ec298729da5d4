/* GPU sparse MLA decode (DeepSeek-V3.2; mla/mla.h: ina_mla_sparse_plan + ina_mla_run with
 * run_params.indices) on the shapes of its issue, against the read ceiling measured in the
 * same run and FlashMLA's sparse decode figure.
 *
 * Each shape has uniform context lengths; its requests' pages are drawn in shuffled order
 * from one random cache pool per format (bf16 1152-byte entries or packed FP8 656-byte
 * ones, quantized from random bf16 as the model does), allocated once at the largest size
 * the selected shapes need. Every query token's index row is a random distinct subset of
 * its visible positions (visible = kv_len - q_len + j + 1), in random order, of top-k
 * entries. When one run's bytes are under ~4x L2, several sets rotate (each its own
 * pages, index rows, queries and outputs), so that a run does not find its data in L2.
 *
 * Check before timing, on the timed configuration itself (its plan, its batch): set 0's
 * outputs and lse are poisoned with NaN, one run must leave all of them finite, and a
 * sample of its requests (the first, the last and random ones; every query token and head
 * of each) is compared with the CPU reference attention/dsa.h (sparse MLA,
 * INA_DSA_BACKEND_REF, f32 queries from the same bf16 values, the same host-copied cache
 * pages): relative L2 of each token's out [heads x 512] <= 1e-2, |lse - ref| <= 1e-3.
 * A shape that fails is not timed. After timing, set 0's output must be unchanged.
 *
 * Figures per shape (tokens = b * s_q query tokens, h heads, k = top-k, n_t = min(k,
 * visible) positions attended by token t; n_t = k on every shape here):
 *   FLOPs = h * (2*576 + 2*512) * sum_t n_t              (= b*h*s_q*k*2176)
 *   bytes = sum_t n_t * entry (656 FP8, 1152 bf16) + queries (tokens*h*576*2)
 *           + outputs (tokens*h*512*2); index rows, page tables and lse not counted.
 * Time: runs captured back to back in one CUDA graph (~20 ms of work per replay), the
 * median replay time / runs.
 *
 * Usage: bench_mla_sparse [--quick] [--shapes SUBSTR[,SUBSTR...]] [--seed N] [--list]
 * Exit 77 without a device; 1 when a check or a shape failed; targets are reported. */
#define INA_LOG_SUBSYS "bench"
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/dsa.h"
#include "bench/bench_util.h"
#include "core/check.h"
#include "core/cuda_check.h"
#include "core/fp8_quant.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "mla/mla.h"

#define KV_LORA 512
#define ROPE 64
#define QK_DIM (KV_LORA + ROPE)
#define PAGE 64
#define FLOPS_PER_HEAD_POSITION (2.0 * QK_DIM + 2.0 * KV_LORA)
#define SOFTMAX_SCALE 0.07216878364870322f /* 1/sqrt(192): DeepSeek's qk_head_dim */
#define ANCHOR_TFLOPS 410.0 /* FlashMLA sparse decode, FP8, H800: b128 h128 s_q 2 k 2048 */
#define BW_TARGET 0.8       /* of the read ceiling, on the 16-head shapes */

#define ROTATE_BYTES 200e6 /* a run's bytes under this (~4x the 50 MB L2): rotate sets */
#define MAX_SETS 16
#define GRAPH_TARGET_MS 20.0
#define MAX_GRAPH_RUNS 512
#define SHAPE_BUDGET_MS 1500.0
#define FILL_CHUNK_TOKENS (1 << 20)
#define CHECK_REQUESTS 3
#define OUT_TOL 1e-2
#define LSE_TOL 1e-3

/* ---- shapes --------------------------------------------------------------------------- */

/* GOAL_REPORT: a diagnostic beside the targets (where the 16-head shapes lose time). */
typedef enum { GOAL_ANCHOR, GOAL_FLOPS, GOAL_BW, GOAL_FLAT, GOAL_REPORT } goal_t;

typedef struct {
  const char *name; /* result names and --shapes filter */
  const char *what;
  int heads, batch, q_len, kv_len, topk;
  ina_mla_cache_format_t format;
  goal_t goal;
  int sorted; /* index rows in ascending position order instead of a random one */
} shape_t;

#define BF16 INA_MLA_CACHE_BF16
#define FP8 INA_MLA_CACHE_FP8
static const shape_t g_shapes[] = {
    {"h128_b128_sq2_fp8", "128 heads, batch 128, s_q 2 (MTP), top-k 2048, ctx 8192, FP8",
     128, 128, 2, 8192, 2048, FP8, GOAL_ANCHOR, 0},
    {"h128_b128_sq2_bf16", "128 heads, batch 128, s_q 2 (MTP), top-k 2048, ctx 8192, bf16",
     128, 128, 2, 8192, 2048, BF16, GOAL_FLOPS, 0},
    {"h128_b128_sq1_fp8", "128 heads, batch 128, s_q 1, top-k 2048, ctx 8192, FP8",
     128, 128, 1, 8192, 2048, FP8, GOAL_FLOPS, 0},
    {"h128_b128_sq1_bf16", "128 heads, batch 128, s_q 1, top-k 2048, ctx 8192, bf16",
     128, 128, 1, 8192, 2048, BF16, GOAL_FLOPS, 0},
    {"h16_b128_sq1_fp8", "16 heads (TP8), batch 128, s_q 1, top-k 2048, ctx 8192, FP8",
     16, 128, 1, 8192, 2048, FP8, GOAL_BW, 0},
    {"h16_b128_sq2_fp8", "16 heads (TP8), batch 128, s_q 2, top-k 2048, ctx 8192, FP8",
     16, 128, 2, 8192, 2048, FP8, GOAL_BW, 0},
    {"h16_b128_sq1_bf16", "16 heads (TP8), batch 128, s_q 1, top-k 2048, ctx 8192, bf16",
     16, 128, 1, 8192, 2048, BF16, GOAL_BW, 0},
    {"h16_b128_sq2_bf16", "16 heads (TP8), batch 128, s_q 2, top-k 2048, ctx 8192, bf16",
     16, 128, 2, 8192, 2048, BF16, GOAL_BW, 0},
    {"h128_b64_ctx4k_fp8", "128 heads, batch 64, s_q 1, top-k 2048, ctx 4096, FP8",
     128, 64, 1, 4096, 2048, FP8, GOAL_FLAT, 0},
    {"h128_b64_ctx32k_fp8", "128 heads, batch 64, s_q 1, top-k 2048, ctx 32768, FP8",
     128, 64, 1, 32768, 2048, FP8, GOAL_FLAT, 0},
    {"h128_b64_ctx128k_fp8", "128 heads, batch 64, s_q 1, top-k 2048, ctx 131072, FP8",
     128, 64, 1, 131072, 2048, FP8, GOAL_FLAT, 0},
    /* Diagnostics of the 16-head gap: the same gather in position order (sorted), all of a
     * 2048-position context in order (the dense kernel's access pattern through the sparse
     * path), and four times the batch (what fixed costs per run weigh). */
    {"h16_b128_sq1_bf16_sorted", "16 heads, batch 128, s_q 1, top-k 2048, ctx 8192, bf16, rows sorted",
     16, 128, 1, 8192, 2048, INA_MLA_CACHE_BF16, GOAL_REPORT, 1},
    {"h16_b128_sq1_bf16_ctx2k", "16 heads, batch 128, s_q 1, top-k 2048, ctx 2048 (all), bf16, rows sorted",
     16, 128, 1, 2048, 2048, INA_MLA_CACHE_BF16, GOAL_REPORT, 1},
    {"h16_b512_sq1_bf16", "16 heads, batch 512, s_q 1, top-k 2048, ctx 8192, bf16",
     16, 512, 1, 8192, 2048, INA_MLA_CACHE_BF16, GOAL_REPORT, 0},
    {"h16_b512_sq1_fp8", "16 heads, batch 512, s_q 1, top-k 2048, ctx 8192, FP8",
     16, 512, 1, 8192, 2048, INA_MLA_CACHE_FP8, GOAL_REPORT, 0},
    {"h16_b128_sq1_fp8_sorted", "16 heads, batch 128, s_q 1, top-k 2048, ctx 8192, FP8, rows sorted",
     16, 128, 1, 8192, 2048, INA_MLA_CACHE_FP8, GOAL_REPORT, 1},
};
#undef BF16
#undef FP8
#define NUM_SHAPES ((int)(sizeof g_shapes / sizeof g_shapes[0]))

static int64_t entry_bytes(ina_mla_cache_format_t f) {
  return f == INA_MLA_CACHE_FP8 ? ina_mla_cache_fp8_entry_bytes(KV_LORA, ROPE) : 2 * QK_DIM;
}

static ina_mla_cache_t cache_at(ina_mla_cache_format_t f, void *base) {
  return f == INA_MLA_CACHE_FP8 ? ina_mla_cache_fp8_packed(base, PAGE, KV_LORA, ROPE)
                                : ina_mla_cache_interleaved(f, base, PAGE, KV_LORA, ROPE);
}

/* Sizes of a shape, host arithmetic only (lengths are uniform). */
typedef struct {
  int32_t tokens, pages_per_request, sets;
  int64_t pages;                /* of one set */
  double attended;              /* sum over tokens of min(topk, visible) */
  double bytes, flops;          /* per run, by the file comment's formulas */
} sizes_t;

static sizes_t shape_sizes(const shape_t *s) {
  sizes_t z;
  memset(&z, 0, sizeof z);
  z.tokens = s->batch * s->q_len;
  z.pages_per_request = (s->kv_len + PAGE - 1) / PAGE;
  z.pages = (int64_t)s->batch * z.pages_per_request;
  for (int j = 0; j < s->q_len; j++) {
    const int visible = s->kv_len - s->q_len + j + 1;
    z.attended += (double)s->batch * (visible < s->topk ? visible : s->topk);
  }
  z.bytes = z.attended * (double)entry_bytes(s->format) +
            (double)z.tokens * s->heads * (2.0 * QK_DIM + 2.0 * KV_LORA);
  z.flops = (double)s->heads * FLOPS_PER_HEAD_POSITION * z.attended;
  const double touched = z.bytes + 4.0 * z.tokens * s->topk; /* + the index rows */
  z.sets = touched < ROTATE_BYTES ? (int32_t)ceil(ROTATE_BYTES / touched) : 1;
  if (z.sets > MAX_SETS) z.sets = MAX_SETS;
  return z;
}

/* ---- random numbers ------------------------------------------------------------------- */

static int64_t rng_range(uint64_t *state, int64_t lo, int64_t hi) { /* uniform in [lo, hi] */
  return lo + (int64_t)(ina_bench_splitmix64(state) % (uint64_t)(hi - lo + 1));
}

/* ---- cache pools ---------------------------------------------------------------------- */

typedef struct {
  ina_mla_cache_format_t format;
  int64_t tokens;
  void *base;
} pool_t;

/* FP8 entries in chunks: random bf16 latents quantized in 1x128 blocks (core/fp8_quant.h),
 * scattered with their scales and a random bf16 rope into the packed entries. */
static ina_status_t fill_fp8(pool_t *p, uint64_t seed) {
  ina_status_t st = INA_OK;
  void *bf = NULL, *q = NULL, *sc = NULL;
  const size_t pitch = (size_t)entry_bytes(INA_MLA_CACHE_FP8), sbytes = 4 * (KV_LORA / 128);
  INA_CUDA_CHECK(cudaMalloc(&bf, (size_t)FILL_CHUNK_TOKENS * KV_LORA * 2));
  INA_CUDA_CHECK(cudaMalloc(&q, (size_t)FILL_CHUNK_TOKENS * KV_LORA));
  INA_CUDA_CHECK(cudaMalloc(&sc, (size_t)FILL_CHUNK_TOKENS * sbytes));
  for (int64_t t0 = 0; t0 < p->tokens; t0 += FILL_CHUNK_TOKENS) {
    const int64_t n = p->tokens - t0 < FILL_CHUNK_TOKENS ? p->tokens - t0 : FILL_CHUNK_TOKENS;
    const ina_mla_cache_t e = ina_mla_cache_fp8_packed((char *)p->base + t0 * (int64_t)pitch,
                                                       1, KV_LORA, ROPE);
    const uint64_t chunk_seed = seed + 7919ull * (uint64_t)(t0 / FILL_CHUNK_TOKENS);
    INA_CHECK(ina_bench_fill_random_bf16(bf, (size_t)n * KV_LORA, chunk_seed, 1.0f));
    INA_CHECK(ina_cuda_fp8_quantize_blocks(bf, n, KV_LORA, 1, 128, q, sc, NULL));
    INA_CUDA_CHECK(cudaMemcpy2D(e.latent, pitch, q, KV_LORA, KV_LORA, (size_t)n, cudaMemcpyDeviceToDevice));
    INA_CUDA_CHECK(cudaMemcpy2D(e.scale, pitch, sc, sbytes, sbytes, (size_t)n, cudaMemcpyDeviceToDevice));
    INA_CHECK(ina_bench_fill_random_bf16(bf, (size_t)n * ROPE, chunk_seed + 1, 1.0f));
    INA_CUDA_CHECK(cudaMemcpy2D(e.rope, pitch, bf, ROPE * 2, ROPE * 2, (size_t)n, cudaMemcpyDeviceToDevice));
  }
  INA_CUDA_CHECK(cudaDeviceSynchronize());
fail:
  cudaFree(bf);
  cudaFree(q);
  cudaFree(sc);
  return st;
}

static ina_status_t pool_create(pool_t *p, int64_t tokens, uint64_t seed) {
  ina_status_t st = INA_OK;
  p->tokens = (tokens + PAGE - 1) / PAGE * PAGE;
  INA_CUDA_CHECK(cudaMalloc(&p->base, (size_t)(p->tokens * entry_bytes(p->format))));
  if (p->format == INA_MLA_CACHE_FP8) INA_CHECK(fill_fp8(p, seed));
  else INA_CHECK(ina_bench_fill_random_bf16(p->base, (size_t)p->tokens * QK_DIM, seed, 1.0f));
  return INA_OK;
fail:
  cudaFree(p->base);
  p->base = NULL;
  return st;
}

/* ---- one shape on the device ---------------------------------------------------------- */

typedef struct {
  const shape_t *s;
  const pool_t *pool;
  sizes_t z;
  int32_t *kv_len, *qo_indptr, *kv_indptr; /* host; kv_indptr in pages of one set */
  int32_t *kv_indices;                     /* host [sets][pages] */
  int32_t *rows0;                          /* host index rows of set 0 [tokens][topk] */
  int32_t *d_kv_indptr, *d_kv_indices, *d_rows; /* device; d_rows [sets][tokens][topk] */
  uint16_t *q_nope, *q_pe, *out;                /* device [sets][tokens][heads][dim] */
  float *lse;                                   /* device [sets][tokens][heads] */
  void *host_ws, *device_ws;
  ina_mla_plan_info_t info;
  cudaStream_t stream;
} ctx_t;

static int64_t out_elems(const ctx_t *c) { return (int64_t)c->z.tokens * c->s->heads * KV_LORA; }

static ina_mla_run_params_t run_params(const ctx_t *c, int set) {
  const int64_t h = c->s->heads, tokens = c->z.tokens;
  ina_mla_run_params_t p = INA_MLA_RUN_PARAMS_INIT;
  p.q_nope = c->q_nope + set * tokens * h * KV_LORA;
  p.q_nope_token_stride = h * KV_LORA;
  p.q_nope_head_stride = KV_LORA;
  p.q_pe = c->q_pe + set * tokens * h * ROPE;
  p.q_pe_token_stride = h * ROPE;
  p.q_pe_head_stride = ROPE;
  p.cache = cache_at(c->pool->format, c->pool->base);
  p.kv_indptr = c->d_kv_indptr;
  p.kv_indices = c->d_kv_indices + set * c->z.pages;
  p.softmax_scale = SOFTMAX_SCALE;
  p.out = c->out + set * out_elems(c);
  p.out_token_stride = h * KV_LORA;
  p.out_head_stride = KV_LORA;
  p.lse = c->lse + set * tokens * h;
  p.indices = c->d_rows + set * tokens * c->s->topk;
  return p;
}

static ina_status_t enqueue_run(void *ctx, int64_t iteration, void *stream) {
  const ctx_t *c = ctx;
  const ina_mla_run_params_t p = run_params(c, (int)(iteration % c->z.sets));
  return ina_mla_run(&c->info, c->device_ws, &p, stream);
}

static void ctx_free(ctx_t *c) {
  if (c->stream) cudaStreamDestroy(c->stream);
  cudaFree(c->d_kv_indptr);
  cudaFree(c->d_kv_indices);
  cudaFree(c->d_rows);
  cudaFree(c->q_nope);
  cudaFree(c->q_pe);
  cudaFree(c->out);
  cudaFree(c->lse);
  cudaFreeHost(c->host_ws);
  cudaFree(c->device_ws);
  free(c->kv_len);
  free(c->qo_indptr);
  free(c->kv_indptr);
  free(c->kv_indices);
  free(c->rows0);
  memset(c, 0, sizeof *c);
}

static int cmp_i32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* Index rows of one set: per query token, min(topk, visible) distinct visible positions in
 * random order (a partial Fisher-Yates shuffle; ascending for the sorted diagnostics), then -1. */
static void draw_rows(const ctx_t *c, uint64_t *rng, int32_t *perm, int32_t *rows) {
  const shape_t *s = c->s;
  for (int b = 0; b < s->batch; b++)
    for (int j = 0; j < s->q_len; j++) {
      const int32_t visible = s->kv_len - s->q_len + j + 1;
      const int32_t m = visible < s->topk ? visible : s->topk;
      int32_t *row = rows + (int64_t)(c->qo_indptr[b] + j) * s->topk;
      for (int32_t t = 0; t < visible; t++) perm[t] = t;
      for (int32_t i = 0; i < m; i++) {
        const int32_t k = (int32_t)rng_range(rng, i, visible - 1), x = perm[i];
        perm[i] = perm[k];
        perm[k] = x;
      }
      if (s->sorted) qsort(perm, (size_t)m, sizeof perm[0], cmp_i32);
      for (int32_t i = 0; i < s->topk; i++) row[i] = i < m ? perm[i] : -1;
    }
}

/* Lengths, page tables (every set's pages distinct, drawn from a shuffled order of the
 * pool's pages), index rows, random queries, outputs, and the plan. */
static ina_status_t ctx_setup(ctx_t *c, const shape_t *s, const pool_t *pool, uint64_t seed) {
  ina_status_t st = INA_OK;
  int32_t *order = NULL, *perm = NULL, *rows = NULL;
  uint64_t rng = seed;
  size_t host_bytes = 0, device_bytes = 0;
  memset(c, 0, sizeof *c);
  c->s = s;
  c->pool = pool;
  c->z = shape_sizes(s);
  const int64_t sets = c->z.sets, tokens = c->z.tokens, pool_pages = pool->tokens / PAGE;
  const int64_t need = sets * c->z.pages, row_elems = tokens * s->topk;
  const size_t q_rows = (size_t)(sets * tokens * s->heads);
  INA_REQUIRE(need <= pool_pages, INA_ERR_INTERNAL, "bench_mla_sparse: %lld pages needed of %lld",
              (long long)need, (long long)pool_pages);
  c->kv_len = malloc(sizeof(int32_t) * (size_t)s->batch);
  c->qo_indptr = malloc(sizeof(int32_t) * (size_t)(s->batch + 1));
  c->kv_indptr = malloc(sizeof(int32_t) * (size_t)(s->batch + 1));
  c->kv_indices = malloc(sizeof(int32_t) * (size_t)need);
  c->rows0 = malloc(sizeof(int32_t) * (size_t)row_elems);
  order = malloc(sizeof(int32_t) * (size_t)pool_pages);
  perm = malloc(sizeof(int32_t) * (size_t)s->kv_len);
  rows = malloc(sizeof(int32_t) * (size_t)row_elems);
  INA_CHECK_ALLOC(c->kv_len);
  INA_CHECK_ALLOC(c->qo_indptr);
  INA_CHECK_ALLOC(c->kv_indptr);
  INA_CHECK_ALLOC(c->kv_indices);
  INA_CHECK_ALLOC(c->rows0);
  INA_CHECK_ALLOC(order);
  INA_CHECK_ALLOC(perm);
  INA_CHECK_ALLOC(rows);
  c->qo_indptr[0] = c->kv_indptr[0] = 0;
  for (int b = 0; b < s->batch; b++) {
    c->kv_len[b] = s->kv_len;
    c->qo_indptr[b + 1] = c->qo_indptr[b] + s->q_len;
    c->kv_indptr[b + 1] = c->kv_indptr[b] + c->z.pages_per_request;
  }
  for (int64_t i = 0; i < pool_pages; i++) order[i] = (int32_t)i;
  for (int64_t i = 0; i < need; i++) {
    const int64_t j = rng_range(&rng, i, pool_pages - 1);
    const int32_t t = order[i];
    order[i] = order[j];
    order[j] = t;
    c->kv_indices[i] = order[i];
  }

  INA_CUDA_CHECK(cudaMalloc((void **)&c->d_kv_indptr, sizeof(int32_t) * (size_t)(s->batch + 1)));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->d_kv_indices, sizeof(int32_t) * (size_t)need));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->d_rows, sizeof(int32_t) * (size_t)(sets * row_elems)));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->q_nope, q_rows * KV_LORA * 2));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->q_pe, q_rows * ROPE * 2));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->out, q_rows * KV_LORA * 2));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->lse, q_rows * sizeof(float)));
  INA_CUDA_CHECK(cudaMemcpy(c->d_kv_indptr, c->kv_indptr, sizeof(int32_t) * (size_t)(s->batch + 1),
                     cudaMemcpyHostToDevice));
  INA_CUDA_CHECK(cudaMemcpy(c->d_kv_indices, c->kv_indices, sizeof(int32_t) * (size_t)need,
                     cudaMemcpyHostToDevice));
  for (int64_t set = 0; set < sets; set++) {
    draw_rows(c, &rng, perm, set == 0 ? c->rows0 : rows);
    INA_CUDA_CHECK(cudaMemcpy(c->d_rows + set * row_elems, set == 0 ? c->rows0 : rows,
                       sizeof(int32_t) * (size_t)row_elems, cudaMemcpyHostToDevice));
  }
  INA_CHECK(ina_bench_fill_random_bf16(c->q_nope, q_rows * KV_LORA, seed + 1, 1.0f));
  INA_CHECK(ina_bench_fill_random_bf16(c->q_pe, q_rows * ROPE, seed + 2, 1.0f));

  ina_mla_sparse_plan_params_t pp = INA_MLA_SPARSE_PLAN_PARAMS_INIT;
  pp.batch = s->batch;
  pp.max_tokens = (int32_t)tokens;
  pp.qo_indptr = c->qo_indptr;
  pp.kv_len = c->kv_len;
  pp.topk = s->topk;
  pp.num_heads = s->heads;
  pp.page_size = PAGE;
  INA_CHECK(ina_mla_sparse_workspace_size(&pp, &host_bytes, &device_bytes));
  INA_CUDA_CHECK(cudaHostAlloc(&c->host_ws, host_bytes ? host_bytes : 1, cudaHostAllocDefault));
  INA_CUDA_CHECK(cudaMalloc(&c->device_ws, device_bytes ? device_bytes : 1));
  INA_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  INA_CHECK(ina_mla_sparse_plan(&pp, c->host_ws, c->device_ws, c->stream, &c->info));
  INA_CUDA_CHECK(cudaStreamSynchronize(c->stream));
fail:
  free(order);
  free(perm);
  free(rows);
  return st;
}

static int64_t count_nonfinite_bf16(const uint16_t *v, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += (v[i] & 0x7F80u) == 0x7F80u;
  return bad;
}

/* ---- the check against attention/dsa.h ------------------------------------------------ */

/* Request b of set 0 through the reference: its pages copied to the host (renumbered
 * 0..), its queries widened to f32; *worst_rel is the largest relative L2 of one token's
 * out [heads x 512], *worst_lse the largest |lse - ref|. */
static ina_status_t check_request(const ctx_t *c, int b, const uint16_t *out_bits,
                                  const float *lse, ina_threadpool_t *threads,
                                  double *worst_rel, double *worst_lse) {
  ina_status_t st = INA_OK;
  const shape_t *s = c->s;
  const int32_t H = s->heads, q_len = s->q_len, t0 = c->qo_indptr[b];
  const int32_t pages = c->z.pages_per_request;
  const int64_t page_bytes = (int64_t)PAGE * entry_bytes(s->format), rows = (int64_t)q_len * H;
  char *host_pages = malloc((size_t)(pages * page_bytes));
  uint16_t *bits = malloc(sizeof(uint16_t) * (size_t)(rows * KV_LORA));
  float *qn = malloc(sizeof(float) * (size_t)(rows * KV_LORA));
  float *qp = malloc(sizeof(float) * (size_t)(rows * ROPE));
  float *got = malloc(sizeof(float) * (size_t)(rows * KV_LORA));
  float *ref = malloc(sizeof(float) * (size_t)(rows * KV_LORA));
  float *ref_lse = malloc(sizeof(float) * (size_t)rows);
  int32_t *ids = malloc(sizeof(int32_t) * (size_t)pages);
  void *ws = NULL;
  size_t ws_bytes = 0;
  INA_CHECK_ALLOC(host_pages);
  INA_CHECK_ALLOC(bits);
  INA_CHECK_ALLOC(qn);
  INA_CHECK_ALLOC(qp);
  INA_CHECK_ALLOC(got);
  INA_CHECK_ALLOC(ref);
  INA_CHECK_ALLOC(ref_lse);
  INA_CHECK_ALLOC(ids);
  for (int32_t i = 0; i < pages; i++) {
    const int64_t id = c->kv_indices[c->kv_indptr[b] + i]; /* set 0 */
    ids[i] = i;
    INA_CUDA_CHECK(cudaMemcpy(host_pages + i * page_bytes, (char *)c->pool->base + id * page_bytes,
                       (size_t)page_bytes, cudaMemcpyDeviceToHost));
  }
  INA_CUDA_CHECK(cudaMemcpy(bits, c->q_nope + (int64_t)t0 * H * KV_LORA,
                     sizeof(uint16_t) * (size_t)(rows * KV_LORA), cudaMemcpyDeviceToHost));
  ina_bench_bf16_to_f32(bits, qn, rows * KV_LORA);
  INA_CUDA_CHECK(cudaMemcpy(bits, c->q_pe + (int64_t)t0 * H * ROPE, sizeof(uint16_t) * (size_t)(rows * ROPE),
                     cudaMemcpyDeviceToHost));
  ina_bench_bf16_to_f32(bits, qp, rows * ROPE);
  ina_bench_bf16_to_f32(out_bits + (int64_t)t0 * H * KV_LORA, got, rows * KV_LORA);

  const int32_t qo[2] = {0, q_len}, kv[1] = {s->kv_len}, kv_indptr[2] = {0, pages};
  ina_dsa_mla_plan_params_t pp = INA_DSA_MLA_PLAN_PARAMS_INIT;
  ina_dsa_plan_info_t info;
  pp.backend = INA_DSA_BACKEND_REF;
  pp.batch = 1;
  pp.qo_indptr = qo;
  pp.kv_len = kv;
  pp.num_heads = H;
  pp.kv_lora_rank = KV_LORA;
  pp.rope_dim = ROPE;
  pp.page_size = PAGE;
  pp.index_stride = s->topk;
  INA_CHECK(ina_dsa_mla_workspace_size(&pp, &ws_bytes));
  ws = malloc(ws_bytes ? ws_bytes : 1);
  INA_CHECK_ALLOC(ws);
  INA_CHECK(ina_dsa_mla_plan(&pp, ws, ws_bytes, &info));
  ina_dsa_mla_run_params_t rp = INA_DSA_MLA_RUN_PARAMS_INIT;
  rp.q_nope = qn;
  rp.q_pe = qp;
  rp.cache = cache_at(s->format, host_pages);
  rp.kv_indptr = kv_indptr;
  rp.kv_indices = ids;
  rp.indices = c->rows0 + (int64_t)t0 * s->topk;
  rp.softmax_scale = SOFTMAX_SCALE;
  rp.out = ref;
  rp.lse = ref_lse;
  INA_CHECK(ina_dsa_mla_run(&info, ws, &rp, threads, NULL));
  for (int32_t j = 0; j < q_len; j++) {
    const double e = ina_bench_rel_l2_f32(got + (int64_t)j * H * KV_LORA,
                                          ref + (int64_t)j * H * KV_LORA, (int64_t)H * KV_LORA);
    if (!(e <= *worst_rel)) *worst_rel = e; /* NaN sticks */
    for (int32_t h = 0; h < H; h++) {
      const double d = fabs((double)lse[(int64_t)(t0 + j) * H + h] - ref_lse[j * H + h]);
      if (!(d <= *worst_lse)) *worst_lse = d;
    }
  }
fail:
  free(host_pages);
  free(bits);
  free(qn);
  free(qp);
  free(got);
  free(ref);
  free(ref_lse);
  free(ids);
  free(ws);
  return st;
}

/* Poisons set 0's out and lse, runs it once, requires every value finite and the sampled
 * requests within the bounds. Returns 1 when the shape may be timed; `first` keeps the
 * output for the comparison after timing. */
static int first_run_checked(const ctx_t *c, uint64_t seed, ina_threadpool_t *threads,
                             uint16_t *first) {
  ina_status_t st = INA_OK;
  const shape_t *s = c->s;
  const int64_t n = out_elems(c), rows = (int64_t)c->z.tokens * s->heads;
  float *lse = malloc(sizeof(float) * (size_t)rows);
  int64_t req[CHECK_REQUESTS];
  uint64_t rng = seed;
  double worst_rel = 0.0, worst_lse = 0.0;
  char what[128];
  int ok = 0;
  snprintf(what, sizeof what, "mla_sparse_%s", s->name);
  INA_CHECK_ALLOC(lse);
  const ina_mla_run_params_t p = run_params(c, 0);
  INA_CUDA_CHECK(cudaMemsetAsync(c->out, 0xFF, (size_t)n * 2, c->stream)); /* bf16 NaN */
  INA_CUDA_CHECK(cudaMemsetAsync(c->lse, 0xFF, sizeof(float) * (size_t)rows, c->stream));
  INA_CHECK(ina_mla_run(&c->info, c->device_ws, &p, c->stream));
  INA_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  INA_CUDA_CHECK(cudaMemcpy(first, c->out, (size_t)n * 2, cudaMemcpyDeviceToHost));
  INA_CUDA_CHECK(cudaMemcpy(lse, c->lse, sizeof(float) * (size_t)rows, cudaMemcpyDeviceToHost));
  const int64_t bad = count_nonfinite_bf16(first, n) + ina_bench_count_nonfinite(lse, rows);
  if (bad) {
    ina_bench_check_failed(what, "%lld of %lld out + lse values are NaN or infinite (poisoned "
                           "before the run)", (long long)bad, (long long)(n + rows));
    goto fail;
  }
  const int nreq = ina_bench_sample_range(0, s->batch, CHECK_REQUESTS, &rng, req);
  for (int i = 0; i < nreq; i++)
    INA_CHECK(check_request(c, (int)req[i], first, lse, threads, &worst_rel, &worst_lse));
  snprintf(what, sizeof what, "mla_sparse_%s (%d of %d requests, all %d tokens and heads of "
           "each, vs attention/dsa.h ref)", s->name, nreq, s->batch, s->q_len);
  ok = ina_bench_check(what, "max_rel_l2_out_per_token", worst_rel, OUT_TOL);
  ok &= ina_bench_check(what, "max_abs_lse_diff", worst_lse, LSE_TOL);
fail:
  if (st != INA_OK)
    ina_bench_check_failed(what, "%s: %s", ina_status_string(st), ina_last_error());
  free(lse);
  return ok && st == INA_OK;
}

/* ---- timing and figures --------------------------------------------------------------- */

typedef struct {
  int ran, error;
  double ms, tflops, gbs;
  int runs_per_replay, batches, graph;
  int64_t differing;
} result_t;

static ina_status_t time_shape(const ctx_t *c, int quick, result_t *r) {
  ina_status_t st = INA_OK;
  double est = 0.0, ms = 0.0;
  ina_bench_timing_t rough = {1, 3, c->z.sets};
  INA_CHECK(ina_bench_time_ms(enqueue_run, (void *)c, &rough, &est));
  const int sets = c->z.sets;
  const double target = quick ? GRAPH_TARGET_MS / 2 : GRAPH_TARGET_MS;
  int runs = (int)ceil(target / (est > 1e-3 ? est : 1e-3) / sets) * sets;
  if (runs < sets) runs = sets;
  if (runs > MAX_GRAPH_RUNS) runs = MAX_GRAPH_RUNS / sets * sets;
  ina_bench_timing_t t = {quick ? 1 : 3, quick ? 7 : 25, 1};
  const double replay_ms = est * runs;
  if (replay_ms * (t.batches + t.warmup_batches) > SHAPE_BUDGET_MS) {
    t.batches = (int)(SHAPE_BUDGET_MS / replay_ms) | 1;
    if (t.batches < 5) t.batches = 5;
    t.warmup_batches = 1;
  }
  r->graph = ina_bench_time_graph_ms(enqueue_run, (void *)c, runs, &t, c->stream, &ms) == INA_OK;
  if (!r->graph) {
    fprintf(stderr, "bench_mla_sparse: %s: graph timing failed (%s), timing plain launches\n",
            c->s->name, ina_last_error());
    t.launches_per_batch = runs;
    INA_CHECK(ina_bench_time_ms(enqueue_run, (void *)c, &t, &ms));
  }
  r->ms = ms;
  r->runs_per_replay = runs;
  r->batches = t.batches;
  r->tflops = c->z.flops / (ms * 1e-3) / 1e12;
  r->gbs = c->z.bytes / (ms * 1e-3) / 1e9;
fail:
  return st;
}

static void report_shape(const ctx_t *c, const result_t *r, double ceiling_tbs) {
  const shape_t *s = c->s;
  char name[96], formula[320];
  snprintf(name, sizeof name, "mla_sparse_%s_time", s->name);
  snprintf(formula, sizeof formula,
           "%s; median over %d batches of %d runs (%s) / runs; %d rotating sets; plan path %d, "
           "num_ctas %d, num_splits_max %d",
           s->what, r->batches, r->runs_per_replay,
           r->graph ? "one CUDA graph replay" : "plain launches", c->z.sets, c->info.path,
           c->info.num_ctas, c->info.num_splits_max);
  ina_bench_result(name, r->ms * 1e3, "us", formula);
  snprintf(name, sizeof name, "mla_sparse_%s_flops", s->name);
  snprintf(formula, sizeof formula, "b*h*s_q*topk*(2*576+2*512) = %d*%d*%d*%d*2176 = %.4g FLOP / time",
           s->batch, s->heads, s->q_len, s->topk, c->z.flops);
  ina_bench_result(name, r->tflops, "TFLOP/s", formula);
  snprintf(name, sizeof name, "mla_sparse_%s_bw", s->name);
  snprintf(formula, sizeof formula,
           "(tokens*topk*%lld B gathered + queries tokens*h*1152 B + outputs tokens*h*1024 B) = "
           "%.4g bytes / time",
           (long long)entry_bytes(s->format), c->z.bytes);
  ina_bench_result(name, r->gbs, "GB/s", formula);
  snprintf(name, sizeof name, "mla_sparse_%s_bw_ratio", s->name);
  snprintf(formula, sizeof formula, "bw / read ceiling (%.3f TB/s, same run)%s", ceiling_tbs,
           s->goal == GOAL_BW ? "; target >= 0.8" : "");
  ina_bench_result(name, r->gbs / (ceiling_tbs * 1e3), "x", formula);
  if (s->goal == GOAL_ANCHOR) {
    snprintf(name, sizeof name, "mla_sparse_%s_vs_flashmla", s->name);
    ina_bench_result(name, r->tflops / ANCHOR_TFLOPS, "x",
                     "TFLOP/s / 410 (FlashMLA sparse decode, FP8 cache, H800, this shape)");
  }
}

static ina_status_t run_shape(const shape_t *s, const pool_t *pool, uint64_t seed, int quick,
                              ina_threadpool_t *threads, double ceiling, result_t *r) {
  ina_status_t st = INA_OK;
  ctx_t c;
  uint16_t *first = NULL, *again = NULL;
  INA_CHECK(ctx_setup(&c, s, pool, seed));
  printf("plan %s: path %d, num_ctas %d, num_splits_max %d, tokens %d, %d rotating sets\n",
         s->name, c.info.path, c.info.num_ctas, c.info.num_splits_max, c.z.tokens, c.z.sets);
  fflush(stdout);
  const int64_t n = out_elems(&c);
  first = malloc(sizeof(uint16_t) * (size_t)n);
  again = malloc(sizeof(uint16_t) * (size_t)n);
  INA_CHECK_ALLOC(first);
  INA_CHECK_ALLOC(again);
  if (!first_run_checked(&c, seed + 3, threads, first)) {
    r->error = 1;
    goto fail; /* reported by the check; not timed */
  }
  INA_CHECK(time_shape(&c, quick, r));
  /* Set 0's output after all the replays must equal the first run's. */
  INA_CUDA_CHECK(cudaDeviceSynchronize());
  INA_CUDA_CHECK(cudaMemcpy(again, c.out, (size_t)n * 2, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < n; i++) r->differing += first[i] != again[i];
  if (r->differing)
    fprintf(stderr, "bench_mla_sparse: %s: WARNING: %lld of %lld output values differ between "
            "the first run and the last replay (race?)\n", s->name, (long long)r->differing,
            (long long)n);
  r->ran = 1;
  report_shape(&c, r, ceiling);
fail:
  free(first);
  free(again);
  ctx_free(&c);
  return st;
}

/* ---- command line and main ------------------------------------------------------------- */

static int matches(const char *name, const char *filter) {
  char item[96];
  for (const char *p = filter; *p;) {
    const size_t len = strcspn(p, ",");
    if (len > 0 && len < sizeof item) {
      memcpy(item, p, len);
      item[len] = '\0';
      if (strstr(name, item)) return 1;
    }
    p += len + (p[len] == ',');
  }
  return 0;
}

static void usage(const char *prog, FILE *f) {
  fprintf(f,
          "usage: %s [--quick] [--shapes SUBSTR[,SUBSTR...]] [--seed N] [--list] [--help]\n"
          "  --quick   fewer timed batches (7) and ~10 ms graph replays\n"
          "  --shapes  only shapes whose names contain one of the substrings (--list)\n"
          "  --seed N  seed of the page order, index rows and queries (default fixed)\n",
          prog);
}

int main(int argc, char **argv) {
  int quick = 0, list = 0, failed = 0, selected[NUM_SHAPES];
  const char *filter = NULL;
  uint64_t seed = 0x53504D4Cull;
  result_t results[NUM_SHAPES];
  pool_t pools[2] = {{INA_MLA_CACHE_BF16, 0, NULL}, {INA_MLA_CACHE_FP8, 0, NULL}};
  int64_t need[2] = {0, 0};
  ina_threadpool_t *threads = NULL;
  memset(results, 0, sizeof results);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) quick = 1;
    else if (strcmp(argv[i], "--list") == 0) list = 1;
    else if (strcmp(argv[i], "--shapes") == 0 && i + 1 < argc) filter = argv[++i];
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
    else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(argv[0], stdout);
      return 0;
    } else {
      usage(argv[0], stderr);
      return 2;
    }
  }
  int any = 0;
  for (int i = 0; i < NUM_SHAPES; i++) {
    selected[i] = !filter || matches(g_shapes[i].name, filter);
    any |= selected[i];
  }
  if (list || !any) {
    for (int i = 0; i < NUM_SHAPES; i++)
      printf("%c %-22s %s\n", selected[i] ? '*' : ' ', g_shapes[i].name, g_shapes[i].what);
    if (!any) fprintf(stderr, "bench_mla_sparse: no shape name contains any of '%s'\n", filter);
    return any ? 0 : 2;
  }
  if (ina_bench_no_device("bench_mla_sparse")) return INA_BENCH_SKIP;

  const double ceiling = ina_bench_read_ceiling_tbs();
  if (ceiling <= 0.0) {
    fprintf(stderr, "bench_mla_sparse: read ceiling: %s\n", ina_last_error());
    return 1;
  }
  ina_bench_result("read_ceiling", ceiling, "TB/s",
                   "read-only reduction over rotating 1 GiB slices (bench_read_ceiling), same run");
  if (ina_threadpool_create(0, &threads) != INA_OK) {
    fprintf(stderr, "bench_mla_sparse: thread pool: %s\n", ina_last_error());
    return 1;
  }
  for (int i = 0; i < NUM_SHAPES; i++) {
    if (!selected[i]) continue;
    const sizes_t z = shape_sizes(&g_shapes[i]);
    const int f = g_shapes[i].format == INA_MLA_CACHE_FP8;
    if (z.sets * z.pages * PAGE > need[f]) need[f] = z.sets * z.pages * PAGE;
  }
  for (int f = 0; f < 2; f++) {
    if (!need[f]) continue;
    if (pool_create(&pools[f], need[f], 0x4D4C41ull + 101ull * (uint64_t)f) != INA_OK) {
      fprintf(stderr, "bench_mla_sparse: cache pool of %lld tokens: %s\n", (long long)need[f],
              ina_last_error());
      failed = 1;
      goto done;
    }
    printf("cache pool %s: %lld tokens, %.2f GB\n", f ? "fp8" : "bf16", (long long)pools[f].tokens,
           (double)pools[f].tokens * (double)entry_bytes(pools[f].format) / 1e9);
  }

  int base4k = -1, ctx32k = -1, ctx128k = -1;
  for (int i = 0; i < NUM_SHAPES; i++) {
    const shape_t *s = &g_shapes[i];
    if (!selected[i]) continue;
    const ina_status_t st = run_shape(s, &pools[s->format == INA_MLA_CACHE_FP8],
                                      seed * 31 + (uint64_t)i, quick, threads, ceiling, &results[i]);
    if (st != INA_OK) {
      fprintf(stderr, "bench_mla_sparse: %s: %s: %s\n", s->name, ina_status_string(st),
              ina_last_error());
      results[i].error = 1;
      results[i].ran = 0;
      (void)cudaGetLastError();
    }
    failed |= results[i].error || !results[i].ran;
    if (strcmp(s->name, "h128_b64_ctx4k_fp8") == 0) base4k = i;
    if (strcmp(s->name, "h128_b64_ctx32k_fp8") == 0) ctx32k = i;
    if (strcmp(s->name, "h128_b64_ctx128k_fp8") == 0) ctx128k = i;
  }
  const int longer[2] = {ctx32k, ctx128k};
  for (int k = 0; k < 2; k++) {
    if (base4k < 0 || longer[k] < 0 || !results[base4k].ran || !results[longer[k]].ran) continue;
    char name[96], formula[160];
    snprintf(name, sizeof name, "mla_sparse_h128_b64_%s_vs_4k_time", k ? "128k" : "32k");
    snprintf(formula, sizeof formula, "time of %s / time of h128_b64_ctx4k_fp8 (same top-k: ~1 "
             "when the cost does not grow with the context)", g_shapes[longer[k]].name);
    ina_bench_result(name, results[longer[k]].ms / results[base4k].ms, "x", formula);
  }
  ina_bench_print_json("mla_sparse");

  printf("\n== bench_mla_sparse summary: read ceiling %.3f TB/s (same run); checks %d run, %d "
         "failed ==\n", ceiling, ina_bench_checks_run(), ina_bench_checks_failed());
  printf("%-22s %9s %8s %8s %6s %8s %s\n", "shape", "time_us", "TFLOP/s", "GB/s", "/ceil",
         "vsFlMLA", "goal");
  for (int i = 0; i < NUM_SHAPES; i++) {
    const shape_t *s = &g_shapes[i];
    const result_t *r = &results[i];
    if (!selected[i]) continue;
    if (!r->ran) {
      printf("%-22s %s\n", s->name, "ERROR or check failed (see above)");
      continue;
    }
    const double ratio = r->gbs / (ceiling * 1e3);
    char vs[16] = "-", goal[48] = "report";
    if (s->goal == GOAL_ANCHOR) snprintf(vs, sizeof vs, "%.3f", r->tflops / ANCHOR_TFLOPS);
    if (s->goal == GOAL_BW)
      snprintf(goal, sizeof goal, "bw >= %.1f ceil: %s", BW_TARGET, ratio >= BW_TARGET ? "yes" : "NO");
    printf("%-22s %9.2f %8.1f %8.0f %6.3f %8s %s%s\n", s->name, r->ms * 1e3, r->tflops, r->gbs,
           ratio, vs, goal, r->differing ? "  (output changed between runs: race?)" : "");
  }
  fflush(stdout);
done:
  cudaFree(pools[0].base);
  cudaFree(pools[1].base);
  ina_threadpool_destroy(threads);
  return failed || ina_bench_checks_failed() > 0;
}
