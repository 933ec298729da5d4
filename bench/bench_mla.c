/* GPU MLA decode attention (mla/mla.h) on the DeepSeek shapes of its issue, against the
 * read ceiling measured in the same run and FlashMLA's figures (bench/RESULTS.md).
 *
 * Each shape gets random bf16 (or packed FP8) latent caches whose pages are drawn in
 * shuffled order from one pool allocated once at the largest size any selected shape
 * needs, random absorbed queries, and one plan. The first run's output is poisoned
 * beforehand and must come back finite everywhere, or the shape is not timed. Runs are
 * captured N at a time in a CUDA graph (plain launches if capture fails) and the median
 * replay time over N is reported. When one run's working set is under ~4x L2, several
 * cache + query sets rotate so that a run does not find its data in L2.
 *
 * Figures (s_q query tokens per request, s_k its kv length, h heads):
 *   bytes = sum over requests of s_k * entry (bf16 1152, fp8 656; each entry once per
 *           request) + queries (tokens*h*576*2) + outputs (tokens*h*512*2);
 *           page-table reads and lse are not counted (lse is not requested).
 *   FLOPs = h * (2*576 + 2*512) * sum over query tokens of the positions it attends
 *           (= b*h*(2*576*s_k + 2*512*s_k) for s_q = 1).
 * Before timing, a few small shapes are checked against mla/mla_ref.h (relative L2).
 *
 * Usage: bench_mla [--quick] [--shape SUBSTR[,SUBSTR...]] [--no-check] [--seed N] [--list]
 * Exit 77 without a device; 1 when a check or a shape failed; missed targets are
 * reported, not failures. */
#define INA_LOG_SUBSYS "bench"
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "core/check.h"
#include "core/cuda_check.h"
#include "core/dtype.h"
#include "core/fp8_quant.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "mla/mla.h"
#include "mla/mla_ref.h"

#define KV_LORA 512
#define ROPE 64
#define QK_DIM (KV_LORA + ROPE)
#define BF16_ENTRY_BYTES (2 * QK_DIM)
#define FLOPS_PER_HEAD_POSITION (2.0 * QK_DIM + 2.0 * KV_LORA)
#define SOFTMAX_SCALE 0.07216878364870322f /* 1/sqrt(192): DeepSeek-V3's qk_head_dim */

#define ROTATE_BYTES 200e6 /* a run's working set under this (~4x the 50 MB L2): rotate */
#define MAX_SETS 16
#define GRAPH_TARGET_MS 20.0 /* runs per graph: about this much work per replay */
#define MAX_GRAPH_RUNS 512
#define TIMED_BATCHES 25
#define WARMUP_BATCHES 3
#define SHAPE_BUDGET_MS 1500.0 /* fewer timed batches when one replay is slow */
#define POOL_SEED 0x4D4C41ull
#define SKEW_SEED 0x5EEDull
#define CHECK_POOL_TOKENS 32768
#define CHECK_MAX_KV 3000
#define BF16_NAN 0xFFFFu /* poison: every unwritten output element reads as NaN */

/* ---- shapes --------------------------------------------------------------------------- */

typedef enum { LENS_UNIFORM, LENS_SKEWED, LENS_ONE_LONG } lens_kind_t;

typedef enum {
  GOAL_REPORT,    /* no target */
  GOAL_TBS,       /* TB/s >= target */
  GOAL_TFLOPS,    /* TFLOP/s >= target */
  GOAL_SAME_TIME, /* time / baseline time <= target */
  GOAL_SPEEDUP,   /* baseline time / time (tokens/s ratio at the same shape) >= target */
} goal_t;

typedef struct {
  const char *name; /* result names and --shape filter */
  const char *what;
  int heads, batch, q_len, kv_len, page_size;
  ina_mla_cache_format_t format;
  lens_kind_t lens;
  int quick;        /* part of --quick */
  double flashmla;  /* FlashMLA's figure in the goal's unit (TB/s or TFLOP/s), 0: none */
  goal_t goal;
  double target;
  const char *baseline; /* shape compared against (GOAL_SAME_TIME, GOAL_SPEEDUP) */
} shape_t;

#define BF16 INA_MLA_CACHE_BF16
#define FP8 INA_MLA_CACHE_FP8
/* The issue gives FlashMLA 538-590 TFLOP/s over the eight 128-head uniform shapes without
 * a per-shape split; those rows are compared with the top of that range. Baselines come
 * before the shapes that compare against them. */
static const shape_t g_shapes[] = {
    {"h16_b128_kv4k", "16 heads, batch 128, kv 4096",
     16, 128, 1, 4096, 64, BF16, LENS_UNIFORM, 0, 3.63, GOAL_TBS, 1.05 * 3.63, NULL},
    {"h16_b128_kv8k", "16 heads, batch 128, kv 8192",
     16, 128, 1, 8192, 64, BF16, LENS_UNIFORM, 1, 3.84, GOAL_TBS, 1.05 * 3.84, NULL},
    {"h16_b128_kv16k", "16 heads, batch 128, kv 16384",
     16, 128, 1, 16384, 64, BF16, LENS_UNIFORM, 0, 3.90, GOAL_TBS, 1.05 * 3.90, NULL},
    {"h16_b128_kv32k", "16 heads, batch 128, kv 32768",
     16, 128, 1, 32768, 64, BF16, LENS_UNIFORM, 0, 4.06, GOAL_TBS, 1.05 * 4.06, NULL},
    {"h128_b64_kv4k", "128 heads, batch 64, kv 4096",
     128, 64, 1, 4096, 64, BF16, LENS_UNIFORM, 1, 590, GOAL_TFLOPS, 600, NULL},
    {"h128_b64_kv8k", "128 heads, batch 64, kv 8192",
     128, 64, 1, 8192, 64, BF16, LENS_UNIFORM, 0, 590, GOAL_TFLOPS, 600, NULL},
    {"h128_b64_kv16k", "128 heads, batch 64, kv 16384",
     128, 64, 1, 16384, 64, BF16, LENS_UNIFORM, 0, 590, GOAL_TFLOPS, 600, NULL},
    {"h128_b64_kv32k", "128 heads, batch 64, kv 32768",
     128, 64, 1, 32768, 64, BF16, LENS_UNIFORM, 0, 590, GOAL_TFLOPS, 600, NULL},
    {"h128_b128_kv4k", "128 heads, batch 128, kv 4096",
     128, 128, 1, 4096, 64, BF16, LENS_UNIFORM, 0, 590, GOAL_TFLOPS, 600, NULL},
    {"h128_b128_kv8k", "128 heads, batch 128, kv 8192",
     128, 128, 1, 8192, 64, BF16, LENS_UNIFORM, 0, 590, GOAL_TFLOPS, 600, NULL},
    {"h128_b128_kv16k", "128 heads, batch 128, kv 16384",
     128, 128, 1, 16384, 64, BF16, LENS_UNIFORM, 0, 590, GOAL_TFLOPS, 600, NULL},
    {"h128_b128_kv32k", "128 heads, batch 128, kv 32768",
     128, 128, 1, 32768, 64, BF16, LENS_UNIFORM, 1, 590, GOAL_TFLOPS, 600, NULL},
    {"h16_b128_skew", "16 heads, batch 128, kv log-uniform 32..32768 (fixed seed)",
     16, 128, 1, 0, 64, BF16, LENS_SKEWED, 1, 3.53, GOAL_TBS, 3.8, NULL},
    {"h128_b128_skew", "128 heads, batch 128, kv log-uniform 32..32768 (fixed seed)",
     128, 128, 1, 0, 64, BF16, LENS_SKEWED, 1, 529, GOAL_TFLOPS, 580, NULL},
    {"h16_b128_kv8k_page1", "16 heads, batch 128, kv 8192, page size 1",
     16, 128, 1, 8192, 1, BF16, LENS_UNIFORM, 1, 0, GOAL_SAME_TIME, 1.10, "h16_b128_kv8k"},
    {"h16_b128_kv8k_fp8", "16 heads, batch 128, kv 8192, FP8 cache",
     16, 128, 1, 8192, 64, FP8, LENS_UNIFORM, 1, 0, GOAL_SPEEDUP, 1.6, "h16_b128_kv8k"},
    {"h16_lb_1x32k_127x64", "16 heads, one kv 32768 request among 127 of kv 64",
     16, 128, 1, 0, 64, BF16, LENS_ONE_LONG, 1, 0, GOAL_REPORT, 0, NULL},
    {"h16_b64_kv8k_sq2", "16 heads, batch 64, kv 8192, 2 query tokens (MTP)",
     16, 64, 2, 8192, 64, BF16, LENS_UNIFORM, 1, 0, GOAL_REPORT, 0, NULL},
    {"h16_b64_kv8k_sq4", "16 heads, batch 64, kv 8192, 4 query tokens (MTP)",
     16, 64, 4, 8192, 64, BF16, LENS_UNIFORM, 0, 0, GOAL_REPORT, 0, NULL},
    /* Beside the sparse benchmark's 16-head shapes (2048 positions per query token): the
     * same volume per request read densely, at batch 128 and 512. */
    {"h16_b128_kv2k", "16 heads, batch 128, kv 2048",
     16, 128, 1, 2048, 64, BF16, LENS_UNIFORM, 0, 0, GOAL_REPORT, 0, NULL},
    {"h16_b512_kv2k", "16 heads, batch 512, kv 2048",
     16, 512, 1, 2048, 64, BF16, LENS_UNIFORM, 0, 0, GOAL_REPORT, 0, NULL},
    {"h128_b64_kv8k_fp8", "128 heads, batch 64, kv 8192, FP8 cache",
     128, 64, 1, 8192, 64, FP8, LENS_UNIFORM, 0, 0, GOAL_REPORT, 0, NULL},
};
#undef BF16
#undef FP8
#define NUM_SHAPES ((int)(sizeof g_shapes / sizeof g_shapes[0]))

/* Small shapes checked against the CPU reference before timing. */
typedef struct {
  const char *name;
  int heads, batch, q_len, page_size;
  ina_mla_cache_format_t format;
  double tol; /* relative L2 of the output; FP8 leaves the kernel room for reduced precision */
} check_case_t;

static const check_case_t g_checks[] = {
    {"bf16_h16_b6_p64", 16, 6, 1, 64, INA_MLA_CACHE_BF16, 1e-2},
    {"bf16_h128_b4_p64", 128, 4, 1, 64, INA_MLA_CACHE_BF16, 1e-2},
    {"bf16_h16_b5_p1_sq2", 16, 5, 2, 1, INA_MLA_CACHE_BF16, 1e-2},
    {"bf16_h16_b4_p64_sq4", 16, 4, 4, 64, INA_MLA_CACHE_BF16, 1e-2},
    {"fp8_h16_b4_p64", 16, 4, 1, 64, INA_MLA_CACHE_FP8, 2e-2},
};
#define NUM_CHECKS ((int)(sizeof g_checks / sizeof g_checks[0]))
#define LSE_TOL 1e-3

/* ---- random numbers (deterministic, for lengths and page order) ------------------------ */

static double rng_uniform(uint64_t *state) { return (double)(ina_bench_splitmix64(state) >> 11) * 0x1p-53; }

/* Uniform in [lo, hi]. */
static int64_t rng_range(uint64_t *state, int64_t lo, int64_t hi) {
  return lo + (int64_t)(ina_bench_splitmix64(state) % (uint64_t)(hi - lo + 1));
}

/* ---- cache pools ---------------------------------------------------------------------- */

/* `tokens` cache entries on the device, random, addressed as pages of any size. */
typedef struct {
  ina_mla_cache_format_t format;
  int64_t tokens;
  void *base;
} pool_t;

static int64_t entry_bytes(ina_mla_cache_format_t format) {
  return format == INA_MLA_CACHE_FP8 ? ina_mla_cache_fp8_entry_bytes(KV_LORA, ROPE)
                                     : BF16_ENTRY_BYTES;
}

static ina_mla_cache_t pool_cache(const pool_t *p, void *base, int32_t page_size) {
  return p->format == INA_MLA_CACHE_FP8
             ? ina_mla_cache_fp8_packed(base, page_size, KV_LORA, ROPE)
             : ina_mla_cache_interleaved(INA_MLA_CACHE_BF16, base, page_size, KV_LORA, ROPE);
}

/* FP8 entries are made the way the model makes them: random bf16 latents quantized in
 * 1x128 blocks (core/fp8_quant.h), then scattered with the scales and a random bf16 rope
 * into the packed layout of mla/mla_cache.h. */
static ina_status_t fill_fp8_pool(pool_t *p, uint64_t seed) {
  ina_status_t st = INA_OK;
  void *latent_bf16 = NULL, *latent_fp8 = NULL, *scales = NULL;
  const ina_mla_cache_t layout = ina_mla_cache_fp8_packed(p->base, 1, KV_LORA, ROPE);
  const size_t pitch = (size_t)layout.latent_token_stride, n = (size_t)p->tokens;
  const size_t scale_bytes = sizeof(float) * (KV_LORA / 128);
  INA_CUDA_CHECK(cudaMalloc(&latent_bf16, n * KV_LORA * 2));
  INA_CUDA_CHECK(cudaMalloc(&latent_fp8, n * KV_LORA));
  INA_CUDA_CHECK(cudaMalloc(&scales, n * scale_bytes));
  INA_CHECK(ina_bench_fill_random_bf16(latent_bf16, n * KV_LORA, seed, 1.0f));
  INA_CHECK(ina_cuda_fp8_quantize_blocks(latent_bf16, p->tokens, KV_LORA, 1, 128, latent_fp8,
                                         scales, NULL));
  INA_CUDA_CHECK(cudaMemcpy2D(layout.latent, pitch, latent_fp8, KV_LORA, KV_LORA, n,
                       cudaMemcpyDeviceToDevice));
  INA_CUDA_CHECK(cudaMemcpy2D(layout.scale, pitch, scales, scale_bytes, scale_bytes, n,
                       cudaMemcpyDeviceToDevice));
  /* The bf16 buffer is free again: its first n * ROPE values become the rope parts. */
  INA_CHECK(ina_bench_fill_random_bf16(latent_bf16, n * ROPE, seed + 1, 1.0f));
  INA_CUDA_CHECK(cudaMemcpy2D(layout.rope, pitch, latent_bf16, ROPE * 2, ROPE * 2, n,
                       cudaMemcpyDeviceToDevice));
  INA_CUDA_CHECK(cudaDeviceSynchronize());
fail:
  cudaFree(latent_bf16);
  cudaFree(latent_fp8);
  cudaFree(scales);
  return st;
}

static ina_status_t pool_create(pool_t *p, ina_mla_cache_format_t format, int64_t tokens,
                                uint64_t seed) {
  ina_status_t st = INA_OK;
  p->format = format;
  p->tokens = (tokens + 63) / 64 * 64; /* whole pages of 64 */
  p->base = NULL;
  INA_CUDA_CHECK(cudaMalloc(&p->base, (size_t)(p->tokens * entry_bytes(format))));
  if (format == INA_MLA_CACHE_FP8) {
    INA_CHECK(fill_fp8_pool(p, seed));
  } else {
    INA_CHECK(ina_bench_fill_random_bf16(p->base, (size_t)p->tokens * QK_DIM, seed, 1.0f));
  }
  return INA_OK;
fail:
  cudaFree(p->base);
  p->base = NULL;
  return st;
}

static void pool_destroy(pool_t *p) {
  cudaFree(p->base);
  p->base = NULL;
}

/* ---- batch layout: lengths, page tables, figures ------------------------------------- */

typedef struct {
  int32_t heads, batch, q_len, page_size, sets;
  ina_mla_cache_format_t format;
  int32_t *kv_len, *qo_indptr, *kv_indptr; /* host; kv_indptr counts pages of one set */
  int32_t *kv_indices;                     /* host [sets * index_stride] */
  int64_t pages;        /* pages of one set */
  int64_t index_stride; /* pages rounded up to 64: every set's page ids start 256-aligned */
  int64_t kv_tokens; /* sum of kv_len: entries read per run */
  int64_t q_tokens;
  double bytes, flops; /* per run, by the formulas of the file comment */
  double working_set;  /* bytes one run touches: its pages, queries and outputs */
} layout_t;

static void layout_free(layout_t *l) {
  free(l->kv_len);
  free(l->qo_indptr);
  free(l->kv_indptr);
  free(l->kv_indices);
  memset(l, 0, sizeof *l);
}

/* Lengths of a benchmark shape, deterministic. */
static void shape_lengths(const shape_t *s, int32_t *kv_len) {
  uint64_t rng = SKEW_SEED;
  for (int b = 0; b < s->batch; b++) {
    switch (s->lens) {
    case LENS_UNIFORM: kv_len[b] = s->kv_len; break;
    case LENS_SKEWED:
      kv_len[b] = (int32_t)lround(exp(log(32.0) + rng_uniform(&rng) * (log(32768.0) - log(32.0))));
      break;
    case LENS_ONE_LONG: kv_len[b] = b == 0 ? 32768 : 64; break;
    }
  }
}

/* Everything but the page ids; `rotate`: several sets when the working set is small. */
static ina_status_t layout_init(layout_t *l, int heads, int batch, int q_len, int page_size,
                                ina_mla_cache_format_t format, const int32_t *kv_len,
                                int rotate) {
  ina_status_t st = INA_OK;
  memset(l, 0, sizeof *l);
  l->heads = heads;
  l->batch = batch;
  l->q_len = q_len;
  l->page_size = page_size;
  l->format = format;
  l->kv_len = malloc(sizeof(int32_t) * (size_t)batch);
  l->qo_indptr = malloc(sizeof(int32_t) * (size_t)(batch + 1));
  l->kv_indptr = malloc(sizeof(int32_t) * (size_t)(batch + 1));
  INA_CHECK_ALLOC(l->kv_len);
  INA_CHECK_ALLOC(l->qo_indptr);
  INA_CHECK_ALLOC(l->kv_indptr);
  l->qo_indptr[0] = l->kv_indptr[0] = 0;
  double positions = 0; /* (query token, cache position) pairs attended, per head */
  for (int b = 0; b < batch; b++) {
    INA_REQUIRE(kv_len[b] >= q_len, INA_ERR_INVALID_ARGUMENT,
                "bench_mla: request %d: kv length %d < %d query tokens", b, kv_len[b], q_len);
    l->kv_len[b] = kv_len[b];
    l->qo_indptr[b + 1] = l->qo_indptr[b] + q_len;
    l->kv_indptr[b + 1] = l->kv_indptr[b] + (kv_len[b] + page_size - 1) / page_size;
    l->kv_tokens += kv_len[b];
    for (int j = 0; j < q_len; j++) positions += kv_len[b] - q_len + j + 1;
  }
  l->pages = l->kv_indptr[batch];
  l->index_stride = (l->pages + 63) / 64 * 64;
  l->q_tokens = l->qo_indptr[batch];
  const double q_out_bytes = (double)l->q_tokens * heads * (2.0 * QK_DIM + 2.0 * KV_LORA);
  l->bytes = (double)l->kv_tokens * (double)entry_bytes(format) + q_out_bytes;
  l->flops = (double)heads * FLOPS_PER_HEAD_POSITION * positions;
  l->working_set = (double)l->pages * page_size * (double)entry_bytes(format) + q_out_bytes;
  l->sets = 1;
  if (rotate && l->working_set < ROTATE_BYTES) {
    l->sets = (int32_t)ceil(ROTATE_BYTES / l->working_set);
    if (l->sets > MAX_SETS) l->sets = MAX_SETS;
  }
fail:
  return st;
}

/* Cache tokens a pool needs for this layout's sets. */
static int64_t layout_pool_tokens(const layout_t *l) {
  return (int64_t)l->sets * l->pages * l->page_size;
}

/* Draws every set's pages without repetition from a shuffled order of all the pool's
 * pages, so that neighbouring pages of a request lie anywhere in the pool. */
static ina_status_t layout_assign_pages(layout_t *l, int64_t pool_tokens, uint64_t seed) {
  ina_status_t st = INA_OK;
  const int64_t pool_pages = pool_tokens / l->page_size, need = (int64_t)l->sets * l->pages;
  int32_t *order = NULL;
  INA_REQUIRE(need <= pool_pages && pool_pages <= INT32_MAX, INA_ERR_INTERNAL,
              "bench_mla: %lld pages needed from a pool of %lld", (long long)need,
              (long long)pool_pages);
  order = malloc(sizeof(int32_t) * (size_t)pool_pages);
  l->kv_indices = calloc((size_t)(l->sets * l->index_stride + 1), sizeof(int32_t));
  INA_CHECK_ALLOC(order);
  INA_CHECK_ALLOC(l->kv_indices);
  for (int64_t i = 0; i < pool_pages; i++) order[i] = (int32_t)i;
  uint64_t rng = seed;
  for (int64_t i = 0; i < need; i++) { /* the first `need` steps of Fisher-Yates */
    const int64_t j = rng_range(&rng, i, pool_pages - 1);
    const int32_t t = order[i];
    order[i] = order[j];
    order[j] = t;
  }
  for (int32_t set = 0; set < l->sets; set++)
    memcpy(l->kv_indices + set * l->index_stride, order + set * l->pages,
           sizeof(int32_t) * (size_t)l->pages);
fail:
  free(order);
  return st;
}

/* ---- one shape on the device ------------------------------------------------------------ */

typedef struct {
  layout_t lay;
  const pool_t *pool;
  int32_t *kv_indptr, *kv_indices; /* device */
  uint16_t *q_nope, *q_pe, *out;   /* device, [sets][tokens][heads][dim] */
  float *lse;                      /* device [sets][tokens][heads] or NULL */
  void *host_ws, *device_ws;
  ina_mla_plan_info_t info;
  cudaStream_t stream;
  cudaGraphExec_t graph;
  int graph_runs;
} run_ctx_t;

static int64_t out_elems(const layout_t *l) { return l->q_tokens * l->heads * KV_LORA; }

static ina_mla_run_params_t run_params(const run_ctx_t *c, int set) {
  const int64_t heads = c->lay.heads, tokens = c->lay.q_tokens;
  ina_mla_run_params_t p = INA_MLA_RUN_PARAMS_INIT;
  p.q_nope = c->q_nope + set * tokens * heads * KV_LORA;
  p.q_nope_token_stride = heads * KV_LORA;
  p.q_nope_head_stride = KV_LORA;
  p.q_pe = c->q_pe + set * tokens * heads * ROPE;
  p.q_pe_token_stride = heads * ROPE;
  p.q_pe_head_stride = ROPE;
  p.cache = pool_cache(c->pool, c->pool->base, c->lay.page_size);
  p.kv_indptr = c->kv_indptr;
  p.kv_indices = c->kv_indices + set * c->lay.index_stride;
  p.softmax_scale = SOFTMAX_SCALE;
  p.out = c->out + set * out_elems(&c->lay);
  p.out_token_stride = heads * KV_LORA;
  p.out_head_stride = KV_LORA;
  p.lse = c->lse ? c->lse + set * tokens * heads : NULL;
  return p;
}

static ina_status_t enqueue_run(void *ctx, int64_t iteration, void *stream) {
  const run_ctx_t *c = ctx;
  const ina_mla_run_params_t p = run_params(c, (int)(iteration % c->lay.sets));
  return ina_mla_run(&c->info, c->device_ws, &p, stream);
}

static ina_status_t enqueue_graph(void *ctx, int64_t iteration, void *stream) {
  ina_status_t st = INA_OK;
  const run_ctx_t *c = ctx;
  INA_CUDA_CHECK(cudaGraphLaunch(c->graph, (cudaStream_t)stream));
fail:
  return st;
}

static void ctx_free(run_ctx_t *c) {
  if (c->graph) cudaGraphExecDestroy(c->graph);
  if (c->stream) cudaStreamDestroy(c->stream);
  cudaFree(c->kv_indptr);
  cudaFree(c->kv_indices);
  cudaFree(c->q_nope);
  cudaFree(c->q_pe);
  cudaFree(c->out);
  cudaFree(c->lse);
  cudaFreeHost(c->host_ws);
  cudaFree(c->device_ws);
  layout_free(&c->lay);
  memset(c, 0, sizeof *c);
}

/* Page tables and random queries to the device, output buffers, and the plan. */
static ina_status_t ctx_setup(run_ctx_t *c, int with_lse, uint64_t seed) {
  ina_status_t st = INA_OK;
  const layout_t *l = &c->lay;
  const size_t q_rows = (size_t)l->sets * (size_t)l->q_tokens * (size_t)l->heads;
  const size_t index_count = (size_t)l->sets * (size_t)l->index_stride;
  size_t host_bytes = 0, device_bytes = 0;
  ina_mla_plan_params_t pp = INA_MLA_PLAN_PARAMS_INIT;
  INA_CUDA_CHECK(cudaMalloc((void **)&c->kv_indptr, sizeof(int32_t) * (size_t)(l->batch + 1)));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->kv_indices, sizeof(int32_t) * (index_count ? index_count : 1)));
  INA_CUDA_CHECK(cudaMemcpy(c->kv_indptr, l->kv_indptr, sizeof(int32_t) * (size_t)(l->batch + 1),
                     cudaMemcpyHostToDevice));
  INA_CUDA_CHECK(cudaMemcpy(c->kv_indices, l->kv_indices, sizeof(int32_t) * index_count,
                     cudaMemcpyHostToDevice));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->q_nope, q_rows * KV_LORA * 2));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->q_pe, q_rows * ROPE * 2));
  INA_CUDA_CHECK(cudaMalloc((void **)&c->out, q_rows * KV_LORA * 2));
  if (with_lse) INA_CUDA_CHECK(cudaMalloc((void **)&c->lse, q_rows * sizeof(float)));
  INA_CHECK(ina_bench_fill_random_bf16(c->q_nope, q_rows * KV_LORA, seed, 1.0f));
  INA_CHECK(ina_bench_fill_random_bf16(c->q_pe, q_rows * ROPE, seed + 1, 1.0f));

  pp.batch = pp.max_batch = l->batch;
  pp.max_q_len = l->q_len;
  pp.qo_indptr = l->qo_indptr;
  pp.kv_len = l->kv_len;
  pp.num_heads = l->heads;
  pp.kv_lora_rank = KV_LORA;
  pp.rope_dim = ROPE;
  pp.page_size = l->page_size;
  INA_CHECK(ina_mla_workspace_size(&pp, &host_bytes, &device_bytes));
  INA_CUDA_CHECK(cudaHostAlloc(&c->host_ws, host_bytes ? host_bytes : 1, cudaHostAllocDefault));
  INA_CUDA_CHECK(cudaMalloc(&c->device_ws, device_bytes ? device_bytes : 1));
  INA_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  INA_CHECK(ina_mla_plan(&pp, c->host_ws, c->device_ws, c->stream, &c->info));
  INA_CUDA_CHECK(cudaStreamSynchronize(c->stream));
fail:
  return st;
}

static int64_t count_nonfinite_bf16(const uint16_t *v, int64_t n) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += (v[i] & 0x7F80u) == 0x7F80u;
  return bad;
}

/* Poisons set 0's output, runs once and copies the output to `host`; *nonfinite counts
 * NaN and infinite values (unwritten elements among them). */
static ina_status_t first_run(run_ctx_t *c, uint16_t *host, int64_t *nonfinite) {
  ina_status_t st = INA_OK;
  const int64_t n = out_elems(&c->lay);
  const ina_mla_run_params_t p = run_params(c, 0);
  INA_CUDA_CHECK(cudaMemsetAsync(c->out, 0xFF, (size_t)n * 2, c->stream)); /* bf16 0xFFFF: NaN */
  if (c->lse)
    INA_CUDA_CHECK(cudaMemsetAsync(c->lse, 0xFF, sizeof(float) * (size_t)(c->lay.q_tokens * c->lay.heads),
                            c->stream)); /* f32 0xFFFFFFFF: NaN */
  INA_CHECK(ina_mla_run(&c->info, c->device_ws, &p, c->stream));
  INA_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  INA_CUDA_CHECK(cudaMemcpy(host, c->out, (size_t)n * 2, cudaMemcpyDeviceToHost));
  *nonfinite = count_nonfinite_bf16(host, n);
fail:
  return st;
}

/* ---- the reference check ---------------------------------------------------------------- */

static double rel_l2(const float *out, const float *ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; i++) {
    const double d = (double)out[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void bf16_to_f32(const uint16_t *in, float *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = ina_bf16_to_f32(in[i]);
}

/* Runs one small random shape on the device and through ina_mla_attention_ref on the
 * same bf16 / FP8 data; *out_err and *lse_err are relative L2 errors. */
static ina_status_t check_case(const check_case_t *k, const pool_t *pool, uint64_t seed,
                               ina_threadpool_t *threads, double *out_err, double *lse_err) {
  ina_status_t st = INA_OK;
  run_ctx_t c;
  int32_t kv_len[16];
  uint16_t *out_bits = NULL, *qn_bits = NULL, *qp_bits = NULL;
  float *qn = NULL, *qp = NULL, *out = NULL, *ref = NULL, *lse = NULL, *ref_lse = NULL;
  void *host_pool = NULL;
  uint64_t rng = seed;
  int64_t nonfinite = 0;
  memset(&c, 0, sizeof c);
  *out_err = *lse_err = NAN;
  INA_REQUIRE(k->batch <= 16, INA_ERR_INTERNAL, "bench_mla: check %s: batch %d > 16", k->name,
              k->batch);
  /* Edge lengths first (as short as the queries allow, one past a page), then random. */
  for (int b = 0; b < k->batch; b++) {
    kv_len[b] = b == 0 ? k->q_len
                : b == 1 ? k->page_size + 1
                         : (int32_t)rng_range(&rng, k->q_len, CHECK_MAX_KV);
    if (kv_len[b] < k->q_len) kv_len[b] = k->q_len;
  }
  INA_CHECK(layout_init(&c.lay, k->heads, k->batch, k->q_len, k->page_size, k->format, kv_len, 0));
  INA_CHECK(layout_assign_pages(&c.lay, pool->tokens, ina_bench_splitmix64(&rng)));
  c.pool = pool;
  INA_CHECK(ctx_setup(&c, 1, ina_bench_splitmix64(&rng)));

  const int64_t rows = c.lay.q_tokens * k->heads, n = out_elems(&c.lay);
  out_bits = malloc(sizeof(uint16_t) * (size_t)n);
  qn_bits = malloc(sizeof(uint16_t) * (size_t)n);
  qp_bits = malloc(sizeof(uint16_t) * (size_t)(rows * ROPE));
  qn = malloc(sizeof(float) * (size_t)n);
  qp = malloc(sizeof(float) * (size_t)(rows * ROPE));
  out = malloc(sizeof(float) * (size_t)n);
  ref = malloc(sizeof(float) * (size_t)n);
  lse = malloc(sizeof(float) * (size_t)rows);
  ref_lse = malloc(sizeof(float) * (size_t)rows);
  host_pool = malloc((size_t)(pool->tokens * entry_bytes(pool->format)));
  INA_CHECK_ALLOC(out_bits);
  INA_CHECK_ALLOC(qn_bits);
  INA_CHECK_ALLOC(qp_bits);
  INA_CHECK_ALLOC(qn);
  INA_CHECK_ALLOC(qp);
  INA_CHECK_ALLOC(out);
  INA_CHECK_ALLOC(ref);
  INA_CHECK_ALLOC(lse);
  INA_CHECK_ALLOC(ref_lse);
  INA_CHECK_ALLOC(host_pool);

  INA_CHECK(first_run(&c, out_bits, &nonfinite));
  INA_REQUIRE(nonfinite == 0, INA_ERR_INTERNAL,
              "bench_mla: check %s: %lld of %lld output values are NaN or infinite", k->name,
              (long long)nonfinite, (long long)n);
  INA_CUDA_CHECK(cudaMemcpy(lse, c.lse, sizeof(float) * (size_t)rows, cudaMemcpyDeviceToHost));
  INA_CUDA_CHECK(cudaMemcpy(qn_bits, c.q_nope, sizeof(uint16_t) * (size_t)n, cudaMemcpyDeviceToHost));
  INA_CUDA_CHECK(cudaMemcpy(qp_bits, c.q_pe, sizeof(uint16_t) * (size_t)(rows * ROPE),
                     cudaMemcpyDeviceToHost));
  INA_CUDA_CHECK(cudaMemcpy(host_pool, pool->base, (size_t)(pool->tokens * entry_bytes(pool->format)),
                     cudaMemcpyDeviceToHost));
  bf16_to_f32(out_bits, out, n);
  bf16_to_f32(qn_bits, qn, n);
  bf16_to_f32(qp_bits, qp, rows * ROPE);

  ina_mla_ref_params_t rp = {k->batch, k->heads, KV_LORA, ROPE, SOFTMAX_SCALE,
                             c.lay.qo_indptr, c.lay.kv_len, c.lay.kv_indptr, c.lay.kv_indices,
                             qn, qp, pool_cache(pool, host_pool, k->page_size), ref, ref_lse};
  INA_CHECK(ina_mla_attention_ref(&rp, threads));
  *out_err = rel_l2(out, ref, n);
  *lse_err = rel_l2(lse, ref_lse, rows);
fail:
  ctx_free(&c);
  free(out_bits);
  free(qn_bits);
  free(qp_bits);
  free(qn);
  free(qp);
  free(out);
  free(ref);
  free(lse);
  free(ref_lse);
  free(host_pool);
  return st;
}

/* Runs every check; returns the number that failed. */
static int run_checks(uint64_t seed, char *summary, size_t summary_size) {
  pool_t pools[2] = {{INA_MLA_CACHE_BF16, 0, NULL}, {INA_MLA_CACHE_FP8, 0, NULL}};
  ina_threadpool_t *threads = NULL;
  int failed = 0;
  char name[96], formula[256];
  printf("checks against mla/mla_ref.h, seed %llu\n", (unsigned long long)seed);
  if (ina_threadpool_create(0, &threads) != INA_OK ||
      pool_create(&pools[0], INA_MLA_CACHE_BF16, CHECK_POOL_TOKENS, seed) != INA_OK ||
      pool_create(&pools[1], INA_MLA_CACHE_FP8, CHECK_POOL_TOKENS, seed + 2) != INA_OK) {
    fprintf(stderr, "bench_mla: check setup: %s\n", ina_last_error());
    snprintf(summary, summary_size, "checks: setup failed");
    failed = NUM_CHECKS;
    goto done;
  }
  for (int i = 0; i < NUM_CHECKS; i++) {
    const check_case_t *k = &g_checks[i];
    const pool_t *pool = k->format == INA_MLA_CACHE_FP8 ? &pools[1] : &pools[0];
    double out_err = NAN, lse_err = NAN;
    const ina_status_t st = check_case(k, pool, seed + 1000003ull * (uint64_t)(i + 1), threads,
                                       &out_err, &lse_err);
    const int ok = st == INA_OK && out_err <= k->tol && lse_err <= LSE_TOL;
    if (st != INA_OK)
      fprintf(stderr, "bench_mla: check %s: %s: %s\n", k->name, ina_status_string(st),
              ina_last_error());
    snprintf(name, sizeof name, "mla_check_%s_rel_l2", k->name);
    snprintf(formula, sizeof formula,
             "||out - ref|| / ||ref|| against ina_mla_attention_ref (limit %.0e; lse %.2e, "
             "limit %.0e): %s",
             k->tol, lse_err, LSE_TOL, ok ? "ok" : "FAILED");
    ina_bench_result(name, out_err, "", formula);
    failed += !ok;
  }
  snprintf(summary, summary_size, "checks: %d/%d passed (seed %llu)", NUM_CHECKS - failed,
           NUM_CHECKS, (unsigned long long)seed);
done:
  pool_destroy(&pools[0]);
  pool_destroy(&pools[1]);
  ina_threadpool_destroy(threads);
  return failed;
}

/* ---- timing ----------------------------------------------------------------------------- */

typedef struct {
  int ran;        /* timed */
  int error;      /* failed (message printed) */
  double ms, tbs, tflops;
  double kv_mean; /* mean kv length */
  int64_t kv_tokens;
  double bytes, flops; /* per run */
  int sets, runs_per_replay, batches, graph, path;
  double compare; /* GOAL_SAME_TIME: time ratio; GOAL_SPEEDUP: tokens/s ratio */
  int met;        /* target met (-1: no target or no baseline) */
  int64_t differing; /* output values that changed between the first run and the last */
} shape_result_t;

/* Captures c->graph_runs rotating runs into one graph; on failure leaves c->graph NULL
 * (the caller times plain launches instead). */
static void capture_graph(run_ctx_t *c) {
  cudaGraph_t graph = NULL;
  ina_status_t run_st = INA_OK;
  if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  for (int i = 0; i < c->graph_runs && run_st == INA_OK; i++) {
    const ina_mla_run_params_t p = run_params(c, i % c->lay.sets);
    run_st = ina_mla_run(&c->info, c->device_ws, &p, c->stream);
  }
  const cudaError_t end = cudaStreamEndCapture(c->stream, &graph);
  if (run_st == INA_OK && end == cudaSuccess &&
      cudaGraphInstantiate(&c->graph, graph, 0) != cudaSuccess)
    c->graph = NULL;
  if (!c->graph)
    fprintf(stderr, "bench_mla: graph capture failed (%s; %s), timing plain launches\n",
            cudaGetErrorString(end), run_st != INA_OK ? ina_last_error() : "run ok");
  (void)cudaGetLastError();
  if (graph) cudaGraphDestroy(graph);
}

static ina_status_t time_shape(const shape_t *s, const pool_t *pool, uint64_t seed,
                               shape_result_t *r) {
  ina_status_t st = INA_OK;
  run_ctx_t c;
  int32_t *kv_len = NULL;
  uint16_t *first = NULL, *again = NULL;
  int64_t nonfinite = 0, differing = 0;
  double est_ms = 0.0, ms = 0.0;
  memset(&c, 0, sizeof c);
  kv_len = malloc(sizeof(int32_t) * (size_t)s->batch);
  INA_CHECK_ALLOC(kv_len);
  shape_lengths(s, kv_len);
  INA_CHECK(layout_init(&c.lay, s->heads, s->batch, s->q_len, s->page_size, s->format, kv_len, 1));
  INA_CHECK(layout_assign_pages(&c.lay, pool->tokens, seed));
  c.pool = pool;
  INA_CHECK(ctx_setup(&c, 0, seed + 1));
  r->sets = c.lay.sets;
  r->path = c.info.path;
  r->kv_mean = (double)c.lay.kv_tokens / c.lay.batch;
  r->kv_tokens = c.lay.kv_tokens;
  r->bytes = c.lay.bytes;
  r->flops = c.lay.flops;

  const int64_t n = out_elems(&c.lay);
  first = malloc(sizeof(uint16_t) * (size_t)n);
  again = malloc(sizeof(uint16_t) * (size_t)n);
  INA_CHECK_ALLOC(first);
  INA_CHECK_ALLOC(again);
  INA_CHECK(first_run(&c, first, &nonfinite));
  INA_REQUIRE(nonfinite == 0, INA_ERR_INTERNAL,
              "bench_mla: %s: %lld of %lld output values of the first run are NaN or infinite; "
              "not timed",
              s->name, (long long)nonfinite, (long long)n);

  /* A rough time per run from plain launches sizes the graph. */
  ina_bench_timing_t rough = {1, 3, c.lay.sets};
  INA_CHECK(ina_bench_time_ms(enqueue_run, &c, &rough, &est_ms));
  int runs = (int)ceil(GRAPH_TARGET_MS / (est_ms > 1e-3 ? est_ms : 1e-3) / c.lay.sets) * c.lay.sets;
  if (runs < c.lay.sets) runs = c.lay.sets;
  if (runs > MAX_GRAPH_RUNS) runs = MAX_GRAPH_RUNS / c.lay.sets * c.lay.sets;
  c.graph_runs = runs;
  capture_graph(&c);

  ina_bench_timing_t timing = {WARMUP_BATCHES, TIMED_BATCHES, 1};
  const double batch_ms = est_ms * runs;
  if (batch_ms * (TIMED_BATCHES + WARMUP_BATCHES) > SHAPE_BUDGET_MS) {
    timing.batches = (int)(SHAPE_BUDGET_MS / batch_ms) | 1;
    if (timing.batches < 5) timing.batches = 5;
    timing.warmup_batches = 1;
  }
  if (c.graph) {
    INA_CHECK(ina_bench_time_ms(enqueue_graph, &c, &timing, &ms));
  } else {
    timing.launches_per_batch = runs;
    INA_CHECK(ina_bench_time_ms(enqueue_run, &c, &timing, &ms));
    runs = 1; /* the helper already divided by the launches */
  }
  r->ms = ms / runs;
  r->runs_per_replay = c.graph_runs;
  r->batches = timing.batches;
  r->graph = c.graph != NULL;

  /* Set 0's output after all those replays must equal the first run's: a difference
   * means a race or a read of something the run did not write. */
  INA_CUDA_CHECK(cudaDeviceSynchronize());
  INA_CUDA_CHECK(cudaMemcpy(again, c.out, (size_t)n * 2, cudaMemcpyDeviceToHost));
  for (int64_t i = 0; i < n; i++) differing += first[i] != again[i];
  r->differing = differing;
  if (differing)
    fprintf(stderr, "bench_mla: %s: WARNING: %lld of %lld output values differ between the "
            "first run and the last replay (race?)\n", s->name, (long long)differing,
            (long long)n);
  INA_REQUIRE(count_nonfinite_bf16(again, n) == 0, INA_ERR_INTERNAL,
              "bench_mla: %s: NaN or infinity in the output after timing", s->name);

  r->tbs = c.lay.bytes / (r->ms * 1e-3) / 1e12;
  r->tflops = c.lay.flops / (r->ms * 1e-3) / 1e12;
  r->ran = 1;
fail:
  ctx_free(&c);
  free(kv_len);
  free(first);
  free(again);
  return st;
}

static int shape_index(const char *name) {
  for (int i = 0; i < NUM_SHAPES; i++)
    if (strcmp(g_shapes[i].name, name) == 0) return i;
  return -1;
}

/* Reports one timed shape's figures; compares against its baseline when it has one. */
static void report_shape(const shape_t *s, shape_result_t *r, const shape_result_t *results,
                         double ceiling) {
  char name[96], formula[256];
  const double units = s->goal == GOAL_TFLOPS ? r->tflops : r->tbs;
  snprintf(name, sizeof name, "mla_%s_time", s->name);
  snprintf(formula, sizeof formula,
           "%s; median over %d timed batches of %d runs (%s), batch time / runs; %d rotating "
           "cache + query sets",
           s->what, r->batches, r->runs_per_replay,
           r->graph ? "one CUDA graph replay" : "plain launches, graph capture failed", r->sets);
  ina_bench_result(name, r->ms * 1e3, "us", formula);
  snprintf(name, sizeof name, "mla_%s_bw", s->name);
  snprintf(formula, sizeof formula,
           "(%lld cache entries x %lld B + queries + outputs) = %.4g bytes / time",
           (long long)r->kv_tokens, (long long)entry_bytes(s->format), r->bytes);
  ina_bench_result(name, r->tbs, "TB/s", formula);
  snprintf(name, sizeof name, "mla_%s_flops", s->name);
  snprintf(formula, sizeof formula,
           "heads x (2x576 + 2x512) x attended positions = %.4g FLOP / time", r->flops);
  ina_bench_result(name, r->tflops, "TFLOP/s", formula);
  snprintf(name, sizeof name, "mla_%s_ratio", s->name);
  snprintf(formula, sizeof formula, "bw / read_ceiling (%.3f TB/s, same run)", ceiling);
  ina_bench_result(name, r->tbs / ceiling, "x", formula);
  if (s->flashmla > 0) {
    snprintf(name, sizeof name, "mla_%s_vs_flashmla", s->name);
    const int tflops = s->goal == GOAL_TFLOPS;
    snprintf(formula, sizeof formula, "%s / FlashMLA's %.4g %s", tflops ? "TFLOP/s" : "TB/s",
             s->flashmla, tflops ? "TFLOP/s (top of its 538-590 range)" : "TB/s");
    ina_bench_result(name, units / s->flashmla, "x", formula);
  }
  r->met = -1;
  r->compare = NAN;
  switch (s->goal) {
  case GOAL_REPORT: break;
  case GOAL_TBS: r->met = r->tbs >= s->target; break;
  case GOAL_TFLOPS: r->met = r->tflops >= s->target; break;
  case GOAL_SAME_TIME:
  case GOAL_SPEEDUP: {
    const int b = shape_index(s->baseline);
    if (b < 0 || !results[b].ran) break;
    const int same = s->goal == GOAL_SAME_TIME;
    r->compare = same ? r->ms / results[b].ms : results[b].ms / r->ms;
    r->met = same ? r->compare <= s->target : r->compare >= s->target;
    snprintf(name, sizeof name, same ? "mla_%s_time_vs_base" : "mla_%s_speedup_vs_base", s->name);
    snprintf(formula, sizeof formula,
             same ? "time / time of %s (target <= %.2f)"
                  : "tokens/s / tokens/s of %s = its time / time (target >= %.2f)",
             s->baseline, s->target);
    ina_bench_result(name, r->compare, "x", formula);
    break;
  }
  }
}

/* ---- command line and main ---------------------------------------------------------------- */

typedef struct {
  int quick, check, list;
  const char *filter; /* comma-separated substrings of shape names, NULL: all */
  uint64_t seed;
} options_t;

static int matches_filter(const char *name, const char *filter) {
  char item[96];
  const char *p = filter;
  while (*p) {
    size_t len = strcspn(p, ",");
    if (len > 0 && len < sizeof item) {
      memcpy(item, p, len);
      item[len] = '\0';
      if (strstr(name, item)) return 1;
    }
    p += len + (p[len] == ',');
  }
  return 0;
}

static int parse_options(int argc, char **argv, options_t *o) {
  memset(o, 0, sizeof *o);
  o->check = 1;
  o->seed = (uint64_t)time(NULL);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) o->quick = 1;
    else if (strcmp(argv[i], "--no-check") == 0) o->check = 0;
    else if (strcmp(argv[i], "--list") == 0) o->list = 1;
    else if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc) o->filter = argv[++i];
    else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) o->seed = strtoull(argv[++i], NULL, 0);
    else {
      fprintf(stderr,
              "usage: %s [--quick] [--shape SUBSTR[,SUBSTR...]] [--no-check] [--seed N] [--list]\n"
              "  --quick   one or two shapes per row of the issue's table\n"
              "  --shape   shapes whose names contain one of the substrings, and their\n"
              "            baselines\n",
              argv[0]);
      return 1;
    }
  }
  return 0;
}

static void goal_text(const shape_t *s, char *buf, size_t size) {
  switch (s->goal) {
  case GOAL_REPORT: snprintf(buf, size, "report"); break;
  case GOAL_TBS: snprintf(buf, size, ">=%.2f TB/s", s->target); break;
  case GOAL_TFLOPS: snprintf(buf, size, ">=%.0f TFLOP/s", s->target); break;
  case GOAL_SAME_TIME: snprintf(buf, size, "t/t_base<=%.2f", s->target); break;
  case GOAL_SPEEDUP: snprintf(buf, size, "tok/s x>=%.2f", s->target); break;
  }
}

static void print_summary(const int *selected, const shape_result_t *results, double ceiling,
                          const char *check_summary) {
  char goal[32], vs[16], cmp[16];
  printf("\n== bench_mla summary: read ceiling %.3f TB/s (same run); %s ==\n", ceiling,
         check_summary);
  printf("%-20s %6s %4s %4s %4s %9s %6s %7s %5s %6s %8s %-15s %s\n", "shape", "kv_avg",
         "sets", "runs", "path", "time_us", "TB/s", "TFLOP/s", "/ceil", "vsFlMLA", "vs_base",
         "goal", "met");
  for (int i = 0; i < NUM_SHAPES; i++) {
    const shape_t *s = &g_shapes[i];
    const shape_result_t *r = &results[i];
    if (!selected[i]) continue;
    goal_text(s, goal, sizeof goal);
    if (!r->ran) {
      printf("%-20s %6s %s\n", s->name, "", r->error ? "ERROR (see above)" : "not run");
      continue;
    }
    const double units = s->goal == GOAL_TFLOPS ? r->tflops : r->tbs;
    if (s->flashmla > 0) snprintf(vs, sizeof vs, "%.3f", units / s->flashmla);
    else snprintf(vs, sizeof vs, "-");
    if (isfinite(r->compare)) snprintf(cmp, sizeof cmp, "%.3f", r->compare);
    else snprintf(cmp, sizeof cmp, "-");
    printf("%-20s %6.0f %4d %4d %4d %9.2f %6.3f %7.1f %5.3f %6s %8s %-15s %s%s\n", s->name,
           r->kv_mean, r->sets, r->runs_per_replay, r->path, r->ms * 1e3, r->tbs, r->tflops,
           r->tbs / ceiling, vs, cmp, goal, r->met < 0 ? "-" : r->met ? "yes" : "NO",
           r->differing ? "  (output changed between runs: race?)" : "");
  }
  fflush(stdout);
}

int main(int argc, char **argv) {
  options_t opt;
  int selected[NUM_SHAPES] = {0};
  shape_result_t results[NUM_SHAPES];
  pool_t pools[2] = {{INA_MLA_CACHE_BF16, 0, NULL}, {INA_MLA_CACHE_FP8, 0, NULL}};
  int64_t need[2] = {0, 0};
  char check_summary[96] = "checks: skipped (--no-check)";
  int failed = 0;

  memset(results, 0, sizeof results);
  if (parse_options(argc, argv, &opt)) return 2;
  for (int i = 0; i < NUM_SHAPES; i++) {
    selected[i] = opt.filter ? matches_filter(g_shapes[i].name, opt.filter)
                             : !opt.quick || g_shapes[i].quick;
    const int base = g_shapes[i].baseline ? shape_index(g_shapes[i].baseline) : -1;
    if (selected[i] && base >= 0) selected[base] = 1;
  }
  int any = 0;
  for (int i = 0; i < NUM_SHAPES; i++) any |= selected[i];
  if (!any) {
    fprintf(stderr, "bench_mla: no shape name contains any of '%s' (--list shows them)\n",
            opt.filter);
    return 2;
  }
  if (opt.list) {
    for (int i = 0; i < NUM_SHAPES; i++)
      printf("%c %-20s %s\n", selected[i] ? '*' : ' ', g_shapes[i].name, g_shapes[i].what);
    return 0;
  }
  if (ina_bench_no_device("bench_mla")) return INA_BENCH_SKIP;

  const double ceiling = ina_bench_read_ceiling_tbs();
  if (ceiling <= 0.0) {
    fprintf(stderr, "bench_mla: read ceiling: %s\n", ina_last_error());
    return 1;
  }
  ina_bench_result("read_ceiling", ceiling, "TB/s",
                   "read-only reduction over rotating 1 GiB slices (bench_read_ceiling), same run");

  if (opt.check) failed += run_checks(opt.seed, check_summary, sizeof check_summary) > 0;

  /* One pool per format, at the largest size any selected shape needs (its rotating sets
   * included); every shape draws its pages from it in shuffled order. */
  for (int i = 0; i < NUM_SHAPES; i++) {
    const shape_t *s = &g_shapes[i];
    int32_t *kv_len = malloc(sizeof(int32_t) * (size_t)s->batch);
    layout_t l;
    if (!selected[i] || !kv_len) {
      free(kv_len);
      continue;
    }
    shape_lengths(s, kv_len);
    if (layout_init(&l, s->heads, s->batch, s->q_len, s->page_size, s->format, kv_len, 1) ==
        INA_OK) {
      const int f = s->format == INA_MLA_CACHE_FP8;
      if (layout_pool_tokens(&l) > need[f]) need[f] = layout_pool_tokens(&l);
    }
    layout_free(&l);
    free(kv_len);
  }
  for (int f = 0; f < 2; f++) {
    if (need[f] == 0) continue;
    if (pool_create(&pools[f], pools[f].format, need[f], POOL_SEED + 101 * (uint64_t)f) != INA_OK) {
      fprintf(stderr, "bench_mla: cache pool of %lld tokens: %s\n", (long long)need[f],
              ina_last_error());
      failed = 1;
      goto done;
    }
    printf("cache pool %s: %lld tokens, %.2f GB\n", f ? "fp8" : "bf16", (long long)pools[f].tokens,
           (double)pools[f].tokens * (double)entry_bytes(pools[f].format) / 1e9);
  }

  for (int i = 0; i < NUM_SHAPES; i++) {
    const shape_t *s = &g_shapes[i];
    if (!selected[i]) continue;
    const pool_t *pool = &pools[s->format == INA_MLA_CACHE_FP8];
    const ina_status_t st = time_shape(s, pool, POOL_SEED * 31 + (uint64_t)i, &results[i]);
    if (st != INA_OK) {
      fprintf(stderr, "bench_mla: %s: %s: %s\n", s->name, ina_status_string(st), ina_last_error());
      results[i].error = 1;
      results[i].ran = 0;
      failed = 1;
      (void)cudaGetLastError();
      continue;
    }
    report_shape(s, &results[i], results, ceiling);
  }
  ina_bench_print_json("mla");
  print_summary(selected, results, ceiling, check_summary);
done:
  pool_destroy(&pools[0]);
  pool_destroy(&pools[1]);
  return failed;
}
