/* The GEMM handle of gemm/gemm.h: cuBLASLt calls, the algorithm cache, and the split of
 * a GEMM's rows between cuBLASLt and ina's kernels.
 *
 * Routing of the AUTO path: a GEMM of at most INA_GEMM_SMALL_M_MAX_ROWS rows whose
 * operands suit the small-M kernel (gemm_small_m.cu; bf16 and FP8; 16-byte aligned x and
 * W, K in whole 16-byte pieces) runs there entirely when ina_gemm_small_m_wins says so
 * (weights up to 16 MiB, and FP8 with M % 4 != 0 beyond: the measured rule in
 * gemm_internal.h): at decode sizes cuBLASLt and the FP8 kernel leave most SMs idle.
 * Anything else takes cuBLASLt (bf16), or cuBLASLt for the first M & ~3 rows and the FP8
 * kernel for the rest.
 * INA_GEMM_PATH_CUBLASLT and INA_GEMM_PATH_KERNEL keep their paths (no small-M kernel).
 *
 * Every call builds its matmul descriptor, matrix layouts and (when needed) heuristic
 * preference on the stack (the cublasLt*Init functions, no heap), so a run allocates
 * nothing and the handle stays read-only after prepare. The cached algorithm of a call is
 * the one cuBLASLt's heuristic chose at prepare for the call's M bucket (the next power
 * of two) with dense, 16-byte aligned operands. When a call's operands are less aligned,
 * or cuBLASLt refuses the cached algorithm for the call's own size or strides, the call
 * asks the heuristic again for its exact shape and alignment. */
#define INA_LOG_SUBSYS "gemm"
#include "gemm/gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/cuda.h"
#include "gemm/gemm_internal.h"
#include "gemm/gemm_scale_layout.h"

enum {
  MAX_BUCKETS = 32,
  ALIGN_BYTES = 16,
  MAX_SPLIT_TILES = 1024, /* split-K counters: tiles one split launch may have */
  DUMMY_SCALE_BYTES = 256,
};

#define DEFAULT_WORKSPACE_BYTES ((size_t)32 << 20)
#define DEFAULT_KERNEL_WORKSPACE_BYTES ((size_t)8 << 20)
#define CONFIG_V1_SIZE (offsetof(ina_gemm_config_t, kernel_workspace_bytes) + sizeof(size_t))

/* Cached algorithms of one (mode, out dtype, n, k), per M bucket. */
typedef struct gemm_entry {
  ina_gemm_mode_t mode;
  ina_dtype_t out_dtype;
  int64_t n, k;
  uint8_t has_algo[MAX_BUCKETS];
  cublasLtMatmulAlgo_t algo[MAX_BUCKETS];
} gemm_entry_t;

struct ina_gemm {
  ina_gemm_config_t config;
  int sm_count, num_buckets;
  cublasLtHandle_t lt;
  void *workspace;
  size_t workspace_bytes;
  float *partials; /* the kernel's split-K partial sums */
  size_t partial_bytes;
  int *counters;       /* the kernel's split-K arrival counters, zero between launches */
  float *dummy_scales; /* aligned stand-in for the scale pointers of heuristic queries */
  gemm_entry_t *entries;
  int num_entries;
};

/* One cuBLASLt GEMM y^T [n, rows] = W [n, k] . x^T [k, rows] (+ beta residual^T). */
typedef struct lt_gemm {
  ina_gemm_mode_t mode;
  ina_dtype_t out_dtype;
  int64_t rows, n, k, ldx, ldy, ldr;
  const void *x, *w;
  const float *x_scale, *w_scale;
  void *y;
  const void *residual;
  float beta;
  cudaStream_t stream;
} lt_gemm_t;

/* The descriptor and layouts of one call, on the caller's stack. */
typedef struct lt_desc {
  cublasLtMatmulDescOpaque_t desc;
  cublasLtMatrixLayoutOpaque_t a, b, c, d;
} lt_desc_t;

#define LT_TRY(call)                                          \
  do {                                                        \
    const cublasStatus_t lt_try_s_ = (call);                  \
    if (lt_try_s_ != CUBLAS_STATUS_SUCCESS) return lt_try_s_; \
  } while (0)

static ina_status_t lt_status(cublasStatus_t s, const char *what) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s == CUBLAS_STATUS_SUCCESS,
              s == CUBLAS_STATUS_NOT_SUPPORTED ? INA_ERR_UNSUPPORTED : INA_ERR_CUDA,
              "%s failed: %s (%s)", what, cublasLtGetStatusName(s), cublasLtGetStatusString(s));
fail:
  return st;
}

static int refused(cublasStatus_t s) {
  return s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE;
}

static int bucket_of(int64_t m) {
  int b = 0;
  while (((int64_t)1 << b) < m) b++;
  return b;
}

static uint32_t alignment_of(const void *p, int64_t row_bytes) {
  const uint64_t bits = (uint64_t)(uintptr_t)p | (uint64_t)row_bytes;
  uint32_t a = 1;
  while (a < ALIGN_BYTES && !(bits & a)) a <<= 1;
  return a;
}

static size_t in_size(ina_gemm_mode_t mode) { return mode == INA_GEMM_FP8_BLOCK ? 1 : 2; }

static cublasStatus_t lt_describe(const lt_gemm_t *g, lt_desc_t *s) {
  const cudaDataType_t in_type = g->mode == INA_GEMM_FP8_BLOCK ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  const cudaDataType_t out_type = g->out_dtype == INA_DTYPE_F32 ? CUDA_R_32F : CUDA_R_16BF;
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  cublasLtMatmulDesc_t desc = &s->desc;
  LT_TRY(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT_TRY(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
  LT_TRY(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
  if (g->mode == INA_GEMM_FP8_BLOCK) {
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                          sizeof a_mode));
    LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                          sizeof b_mode));
    LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g->w_scale,
                                          sizeof g->w_scale));
    LT_TRY(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g->x_scale,
                                          sizeof g->x_scale));
  }
  LT_TRY(cublasLtMatrixLayoutInit(&s->a, in_type, (uint64_t)g->k, (uint64_t)g->n, g->k));
  LT_TRY(cublasLtMatrixLayoutInit(&s->b, in_type, (uint64_t)g->k, (uint64_t)g->rows, g->ldx));
  LT_TRY(cublasLtMatrixLayoutInit(&s->c, out_type, (uint64_t)g->n, (uint64_t)g->rows,
                                  g->residual ? g->ldr : g->ldy));
  LT_TRY(cublasLtMatrixLayoutInit(&s->d, out_type, (uint64_t)g->n, (uint64_t)g->rows, g->ldy));
  return CUBLAS_STATUS_SUCCESS;
}

/* The heuristic's first algorithm for g at the operands' real alignment; *found = 0 when
 * it has none. */
static cublasStatus_t lt_heuristic(const ina_gemm_t *h, const lt_gemm_t *g, lt_desc_t *d,
                                   cublasLtMatmulAlgo_t *algo, int *found) {
  cublasLtMatmulPreferenceOpaque_t pref_storage;
  cublasLtMatmulPreference_t pref = &pref_storage;
  cublasLtMatmulHeuristicResult_t result;
  const size_t esize = in_size(g->mode), osize = ina_gemm_out_size(g->out_dtype);
  const uint32_t align_a = alignment_of(g->w, g->k * (int64_t)esize);
  const uint32_t align_b = alignment_of(g->x, g->ldx * (int64_t)esize);
  const uint32_t align_c = g->residual ? alignment_of(g->residual, g->ldr * (int64_t)osize)
                                       : alignment_of(g->y, g->ldy * (int64_t)osize);
  const uint32_t align_d = alignment_of(g->y, g->ldy * (int64_t)osize);
  int count = 0;
  *found = 0;
  LT_TRY(cublasLtMatmulPreferenceInit(pref));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &h->workspace_bytes, sizeof h->workspace_bytes));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &align_a, sizeof align_a));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &align_b, sizeof align_b));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &align_c, sizeof align_c));
  LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &align_d, sizeof align_d));
  const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(h->lt, &d->desc, &d->a, &d->b, &d->c,
                                                          &d->d, pref, 1, &result, &count);
  if (s == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    *algo = result.algo;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
  }
  return refused(s) ? CUBLAS_STATUS_SUCCESS : s; /* no algorithm is an answer, not a failure */
}

static int aligned16(const lt_gemm_t *g) {
  const size_t esize = in_size(g->mode), osize = ina_gemm_out_size(g->out_dtype);
  return alignment_of(g->w, g->k * (int64_t)esize) == ALIGN_BYTES &&
         alignment_of(g->x, g->ldx * (int64_t)esize) == ALIGN_BYTES &&
         alignment_of(g->y, g->ldy * (int64_t)osize) == ALIGN_BYTES &&
         (!g->residual || alignment_of(g->residual, g->ldr * (int64_t)osize) == ALIGN_BYTES);
}

/* Runs g with the cached algorithm when it applies, else (or when cuBLASLt refuses it)
 * with the heuristic's choice for g's exact shape. Returns cuBLASLt's status, logging
 * nothing: a refusal may be answered by the kernel. */
static cublasStatus_t lt_run(const ina_gemm_t *h, const lt_gemm_t *g,
                             const cublasLtMatmulAlgo_t *cached) {
  lt_desc_t d;
  cublasLtMatmulAlgo_t algo;
  int found = 0;
  const float alpha = 1.0f, beta = g->residual ? g->beta : 0.0f;
  const void *c = g->residual ? g->residual : g->y;
  LT_TRY(lt_describe(g, &d));
  if (cached && aligned16(g)) {
    const cublasStatus_t s =
        cublasLtMatmul(h->lt, &d.desc, &alpha, g->w, &d.a, g->x, &d.b, &beta, c, &d.c, g->y, &d.d,
                       cached, h->workspace, h->workspace_bytes, g->stream);
    if (!refused(s)) return s;
    INA_LOG_D(INA_LOG_SUBSYS, "cached algorithm refused %lld x %lld x %lld (%s); asking again",
              (long long)g->rows, (long long)g->n, (long long)g->k, cublasLtGetStatusName(s));
  }
  LT_TRY(lt_heuristic(h, g, &d, &algo, &found));
  if (!found) return CUBLAS_STATUS_NOT_SUPPORTED;
  return cublasLtMatmul(h->lt, &d.desc, &alpha, g->w, &d.a, g->x, &d.b, &beta, c, &d.c, g->y, &d.d,
                        &algo, h->workspace, h->workspace_bytes, g->stream);
}

static const gemm_entry_t *find_entry(const ina_gemm_t *h, ina_gemm_mode_t mode,
                                      ina_dtype_t out_dtype, int64_t n, int64_t k) {
  for (int i = 0; i < h->num_entries; i++) {
    const gemm_entry_t *e = &h->entries[i];
    if (e->mode == mode && e->out_dtype == out_dtype && e->n == n && e->k == k) return e;
  }
  return NULL;
}

/* A dense, aligned stand-in of a GEMM for heuristic queries (prepare, query_path). */
static lt_gemm_t probe_gemm(const ina_gemm_t *h, ina_gemm_mode_t mode, ina_dtype_t out_dtype,
                            int64_t rows, int64_t n, int64_t k) {
  lt_gemm_t g;
  memset(&g, 0, sizeof g);
  g.mode = mode;
  g.out_dtype = out_dtype;
  g.rows = rows, g.n = n, g.k = k;
  g.ldx = k, g.ldy = n, g.ldr = n;
  /* Aligned addresses that are never dereferenced by a heuristic query. */
  g.x = g.w = g.y = h->dummy_scales;
  g.x_scale = g.w_scale = h->dummy_scales;
  return g;
}

/* ---- handle ------------------------------------------------------------------------- */

static ina_status_t device_alloc(void **p, size_t bytes, const char *what) {
  ina_status_t st = INA_OK;
  const cudaError_t e = cudaMalloc(p, bytes);
  if (e != cudaSuccess) (void)cudaGetLastError();
  INA_REQUIRE(e == cudaSuccess,
              e == cudaErrorMemoryAllocation ? INA_ERR_OUT_OF_MEMORY : INA_ERR_CUDA,
              "ina_gemm_create: cudaMalloc of %zu bytes for the %s failed: %s", bytes, what,
              cudaGetErrorString(e));
fail:
  return st;
}

ina_status_t ina_gemm_create(const ina_gemm_config_t *config, ina_gemm_t **out) {
  ina_status_t st = INA_OK;
  const ina_gemm_config_t defaults = INA_GEMM_CONFIG_INIT;
  ina_gemm_t *h = NULL;
  int device = 0;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_gemm_create: out is NULL");
  *out = NULL;
  if (!config) config = &defaults;
  INA_REQUIRE_VERSIONED(config, CONFIG_V1_SIZE, "ina_gemm_create: config", "INA_GEMM_CONFIG_INIT");
  INA_REQUIRE(config->max_m > 0 && config->max_shapes > 0 && config->kernel_max_m >= 0,
              INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_create: max_m %d and max_shapes %d must be positive, kernel_max_m %d "
              "not negative",
              config->max_m, config->max_shapes, config->kernel_max_m);
  INA_REQUIRE(ina_cuda_device_count() > 0, INA_ERR_UNSUPPORTED,
              "ina_gemm_create: no CUDA device is present");

  h = calloc(1, sizeof *h);
  INA_CHECK_ALLOC(h);
  memcpy(&h->config, config, CONFIG_V1_SIZE);
  h->config.struct_size = sizeof h->config;
  h->num_buckets = bucket_of(config->max_m) + 1; /* <= 32 for an int32 max_m */
  h->workspace_bytes = config->workspace_bytes ? config->workspace_bytes : DEFAULT_WORKSPACE_BYTES;
  h->partial_bytes = config->kernel_workspace_bytes ? config->kernel_workspace_bytes
                                                    : DEFAULT_KERNEL_WORKSPACE_BYTES;
  h->entries = calloc((size_t)config->max_shapes, sizeof *h->entries);
  INA_CHECK_ALLOC(h->entries);
  {
    const cudaError_t e1 = cudaGetDevice(&device);
    const cudaError_t e2 =
        e1 == cudaSuccess
            ? cudaDeviceGetAttribute(&h->sm_count, cudaDevAttrMultiProcessorCount, device)
            : e1;
    if (e2 != cudaSuccess) (void)cudaGetLastError();
    INA_REQUIRE(e2 == cudaSuccess, INA_ERR_CUDA, "ina_gemm_create: reading the device failed: %s",
                cudaGetErrorString(e2));
  }
  INA_CHECK(lt_status(cublasLtCreate(&h->lt), "ina_gemm_create: cublasLtCreate"));
  INA_CHECK(device_alloc(&h->workspace, h->workspace_bytes, "cuBLASLt workspace"));
  INA_CHECK(device_alloc((void **)&h->partials, h->partial_bytes, "split-K partial sums"));
  INA_CHECK(device_alloc((void **)&h->counters, MAX_SPLIT_TILES * sizeof(int), "split-K counters"));
  INA_CHECK(device_alloc((void **)&h->dummy_scales, DUMMY_SCALE_BYTES, "heuristic stand-in"));
  {
    cudaError_t e = cudaMemsetAsync(h->counters, 0, MAX_SPLIT_TILES * sizeof(int), 0);
    if (e == cudaSuccess) e = cudaStreamSynchronize(0);
    if (e != cudaSuccess) (void)cudaGetLastError();
    INA_REQUIRE(e == cudaSuccess, INA_ERR_CUDA, "ina_gemm_create: zeroing the counters failed: %s",
                cudaGetErrorString(e));
  }
  INA_CHECK(ina_gemm_kernel_init());
  *out = h;
  h = NULL;
fail:
  ina_gemm_destroy(h);
  return st;
}

static void device_free(void *p) {
  if (p && cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
}

void ina_gemm_destroy(ina_gemm_t *h) {
  if (!h) return;
  device_free(h->workspace);
  device_free(h->partials);
  device_free(h->counters);
  device_free(h->dummy_scales);
  if (h->lt) cublasLtDestroy(h->lt);
  free(h->entries);
  free(h);
}

ina_status_t ina_gemm_prepare(ina_gemm_t *h, ina_gemm_mode_t mode, ina_dtype_t out_dtype, int64_t n,
                              int64_t k) {
  ina_status_t st = INA_OK;
  ina_gemm_args_t probe = INA_GEMM_ARGS_INIT, checked;
  INA_REQUIRE(h != NULL, INA_ERR_INVALID_ARGUMENT, "ina_gemm_prepare: handle is NULL");
  probe.mode = mode, probe.out_dtype = out_dtype, probe.n = n, probe.k = k;
  INA_CHECK(ina_gemm_check_args(&probe, "ina_gemm_prepare", 0, &checked));
  if (find_entry(h, mode, out_dtype, n, k)) return INA_OK;
  INA_REQUIRE(h->num_entries < h->config.max_shapes, INA_ERR_UNSUPPORTED,
              "ina_gemm_prepare: the algorithm cache is full (%d shapes; raise max_shapes)",
              h->config.max_shapes);
  gemm_entry_t *e = &h->entries[h->num_entries];
  memset(e, 0, sizeof *e);
  e->mode = mode, e->out_dtype = out_dtype, e->n = n, e->k = k;
  for (int b = 0; b < h->num_buckets; b++) {
    const int64_t rows = (int64_t)1 << b;
    if (mode == INA_GEMM_FP8_BLOCK && rows < 4) continue; /* those rows go to the kernel */
    lt_gemm_t g = probe_gemm(h, mode, out_dtype, rows, n, k);
    lt_desc_t d;
    int found = 0;
    cublasStatus_t s = lt_describe(&g, &d);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_heuristic(h, &g, &d, &e->algo[b], &found);
    INA_CHECK(lt_status(s, "ina_gemm_prepare: cuBLASLt heuristic"));
    e->has_algo[b] = (uint8_t)found;
    if (!found)
      INA_LOG_I(INA_LOG_SUBSYS, "no cuBLASLt algorithm for %s %lld x %lld x %lld (out %s)",
                mode == INA_GEMM_FP8_BLOCK ? "fp8 block-scaled" : "bf16", (long long)rows,
                (long long)n, (long long)k, ina_dtype_name(out_dtype));
  }
  h->num_entries++;
fail:
  return st;
}

/* ---- run ---------------------------------------------------------------------------- */

static lt_gemm_t lt_gemm_of(const ina_gemm_args_t *a, int64_t rows) {
  lt_gemm_t g;
  g.mode = a->mode;
  g.out_dtype = a->out_dtype;
  g.rows = rows, g.n = a->n, g.k = a->k;
  g.ldx = a->ldx, g.ldy = a->ldy, g.ldr = a->ldr;
  g.x = a->x, g.w = a->w;
  g.x_scale = a->x_scale, g.w_scale = a->w_scale;
  g.y = a->y;
  g.residual = a->residual;
  g.beta = a->beta;
  g.stream = (cudaStream_t)a->stream;
  return g;
}

/* Rows the FP8 GEMM of `a` offers cuBLASLt before asking it: the first m & ~3, unless
 * the caller or the configuration sends everything to the kernel. */
static int64_t fp8_cublaslt_rows(const ina_gemm_t *h, const ina_gemm_args_t *a) {
  if (a->path == INA_GEMM_PATH_KERNEL) return 0;
  if (a->path == INA_GEMM_PATH_AUTO && a->m <= h->config.kernel_max_m) return 0;
  return ina_gemm_cublaslt_rows(a->m);
}

/* The rows [row0, m) of the FP8 GEMM of `a` on the kernel; row0 is 0 or m & ~3, so the
 * rows' scales are the whole layout or its second block. */
static ina_status_t kernel_run(const ina_gemm_t *h, const ina_gemm_args_t *a, int64_t row0) {
  ina_status_t st = INA_OK;
  ina_gemm_kernel_problem_t p;
  ina_gemm_kernel_plan_t plan;
  const size_t osize = ina_gemm_out_size(a->out_dtype);
  p.rows = a->m - row0, p.n = a->n, p.k = a->k;
  p.x = (const uint8_t *)a->x + row0 * a->ldx;
  p.ldx = a->ldx;
  p.x_scale = a->x_scale + row0 * ina_gemm_kblocks(a->k);
  p.x_scale_split = row0 == 0 ? ina_gemm_cublaslt_rows(a->m) : 0;
  p.w = a->w;
  p.w_scale = a->w_scale;
  p.y_f32 = a->out_dtype == INA_DTYPE_F32;
  p.y = (char *)a->y + (size_t)(row0 * a->ldy) * osize;
  p.ldy = a->ldy;
  p.residual = a->residual ? (const char *)a->residual + (size_t)(row0 * a->ldr) * osize : NULL;
  p.ldr = a->ldr;
  p.beta = a->beta;
  INA_CHECK(ina_gemm_kernel_plan(p.rows, p.n, p.k, h->sm_count, h->partial_bytes, MAX_SPLIT_TILES,
                                 &plan));
  INA_CHECK(ina_gemm_kernel_launch(&p, &plan, h->partials, h->counters, a->stream));
fail:
  return st;
}

/* Every row of `a` on the small-M kernel, with `plan` or (NULL) the handle's plan. */
static ina_status_t small_m_run(const ina_gemm_t *h, const ina_gemm_args_t *a,
                                const ina_gemm_small_m_plan_t *plan) {
  ina_status_t st = INA_OK;
  ina_gemm_kernel_problem_t p;
  ina_gemm_small_m_plan_t own;
  const int fp8 = a->mode == INA_GEMM_FP8_BLOCK;
  if (!plan) {
    INA_CHECK(ina_gemm_small_m_plan(a->n, a->k * (fp8 ? 1 : 2), h->sm_count, h->partial_bytes,
                                    MAX_SPLIT_TILES, &own));
    plan = &own;
  }
  p.rows = a->m, p.n = a->n, p.k = a->k;
  p.x = (const uint8_t *)a->x;
  p.ldx = a->ldx;
  p.x_scale = a->x_scale;
  p.x_scale_split = ina_gemm_cublaslt_rows(a->m); /* gemm.h's layout for all m rows */
  p.w = (const uint8_t *)a->w;
  p.w_scale = a->w_scale;
  p.y_f32 = a->out_dtype == INA_DTYPE_F32;
  p.y = a->y;
  p.ldy = a->ldy;
  p.residual = a->residual;
  p.ldr = a->ldr;
  p.beta = a->beta;
  INA_CHECK(ina_gemm_small_m_launch(&p, fp8, plan, h->partials, h->counters, a->stream));
fail:
  return st;
}

ina_status_t ina_gemm_run_small_m(const ina_gemm_t *h, const ina_gemm_args_t *args,
                                  const ina_gemm_small_m_plan_t *plan) {
  ina_status_t st = INA_OK;
  ina_gemm_args_t a;
  INA_REQUIRE(h != NULL, INA_ERR_INVALID_ARGUMENT, "ina_gemm_run_small_m: handle is NULL");
  INA_CHECK(ina_gemm_check_args(args, "ina_gemm_run_small_m",
                                INA_GEMM_CHECK_POINTERS | INA_GEMM_CHECK_ALIGNMENT, &a));
  if (a.m == 0) return INA_OK;
  INA_REQUIRE(ina_gemm_small_m_fits(&a, 1), INA_ERR_UNSUPPORTED,
              "ina_gemm_run_small_m: the small-M kernel cannot take m %lld, k %lld with x %p, "
              "w %p, ldx %lld (at most %d rows, 16-byte aligned x and W, rows of whole "
              "16-byte pieces)",
              (long long)a.m, (long long)a.k, a.x, a.w, (long long)a.ldx,
              INA_GEMM_SMALL_M_MAX_ROWS);
  if (plan)
    INA_REQUIRE(plan->tiles == (a.n + INA_GEMM_SMALL_M_TILE_N - 1) / INA_GEMM_SMALL_M_TILE_N &&
                    (plan->splits == 1 || (plan->tiles <= MAX_SPLIT_TILES &&
                                           (uint64_t)(plan->tiles * plan->splits) *
                                                   INA_GEMM_SMALL_M_TILE_N *
                                                   INA_GEMM_SMALL_M_MAX_ROWS * sizeof(float) <=
                                               (uint64_t)h->partial_bytes)),
                INA_ERR_INVALID_ARGUMENT,
                "ina_gemm_run_small_m: plan of %lld tiles x %d splits does not fit n %lld or "
                "the handle's workspace",
                (long long)plan->tiles, (int)plan->splits, (long long)a.n);
  INA_CHECK(small_m_run(h, &a, plan));
fail:
  return st;
}

ina_status_t ina_gemm_run(const ina_gemm_t *h, const ina_gemm_args_t *args) {
  ina_status_t st = INA_OK;
  ina_gemm_args_t a;
  INA_REQUIRE(h != NULL, INA_ERR_INVALID_ARGUMENT, "ina_gemm_run: handle is NULL");
  INA_CHECK(ina_gemm_check_args(args, "ina_gemm_run",
                                INA_GEMM_CHECK_POINTERS | INA_GEMM_CHECK_ALIGNMENT, &a));
  if (a.m == 0) return INA_OK;
  if (a.path == INA_GEMM_PATH_AUTO && ina_gemm_small_m_fits(&a, 1) &&
      ina_gemm_small_m_wins(a.mode, a.m, a.n, a.k))
    return small_m_run(h, &a, NULL);

  const gemm_entry_t *entry = find_entry(h, a.mode, a.out_dtype, a.n, a.k);
  int64_t lt_rows = a.mode == INA_GEMM_FP8_BLOCK ? fp8_cublaslt_rows(h, &a) : a.m;
  if (lt_rows > 0) {
    const int b = bucket_of(lt_rows);
    const int cached = entry && b < h->num_buckets;
    if (cached && !entry->has_algo[b] && a.mode == INA_GEMM_FP8_BLOCK &&
        a.path == INA_GEMM_PATH_AUTO) {
      lt_rows = 0; /* prepare found no cuBLASLt algorithm for this bucket */
    } else {
      const lt_gemm_t g = lt_gemm_of(&a, lt_rows);
      const cublasStatus_t s = lt_run(h, &g, cached && entry->has_algo[b] ? &entry->algo[b] : NULL);
      if (refused(s) && a.mode == INA_GEMM_FP8_BLOCK && a.path == INA_GEMM_PATH_AUTO) {
        INA_LOG_D(INA_LOG_SUBSYS, "cuBLASLt refused fp8 %lld x %lld x %lld (%s): kernel instead",
                  (long long)lt_rows, (long long)a.n, (long long)a.k, cublasLtGetStatusName(s));
        lt_rows = 0;
      } else {
        INA_CHECK(lt_status(s, "ina_gemm_run: cublasLtMatmul"));
      }
    }
  }
  if (lt_rows < a.m) INA_CHECK(kernel_run(h, &a, lt_rows));
fail:
  return st;
}

ina_status_t ina_gemm_query_path(const ina_gemm_t *h, const ina_gemm_args_t *args,
                                 ina_gemm_path_info_t *info) {
  ina_status_t st = INA_OK;
  ina_gemm_args_t a;
  INA_REQUIRE(h != NULL && info != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_query_path: NULL handle or info");
  memset(info, 0, sizeof *info);
  INA_CHECK(ina_gemm_check_args(args, "ina_gemm_query_path", 0, &a));
  if (a.m > 0 && a.path == INA_GEMM_PATH_AUTO && ina_gemm_small_m_fits(&a, 0) &&
      ina_gemm_small_m_wins(a.mode, a.m, a.n, a.k)) {
    ina_gemm_small_m_plan_t plan;
    INA_CHECK(ina_gemm_small_m_plan(a.n, a.k * (a.mode == INA_GEMM_FP8_BLOCK ? 1 : 2),
                                    h->sm_count, h->partial_bytes, MAX_SPLIT_TILES, &plan));
    info->kernel_rows = a.m;
    info->kernel_tile_m = INA_GEMM_SMALL_M_MAX_ROWS;
    info->kernel_splits = plan.warps * plan.splits;
    snprintf(info->description, sizeof info->description,
             "small-M kernel %lld rows (%d-row CTAs, K in %d warps x %d splits%s)",
             (long long)a.m, INA_GEMM_SMALL_M_TILE_N, (int)plan.warps, (int)plan.splits,
             plan.pdl ? ", PDL" : "");
    return INA_OK;
  }
  int64_t lt_rows = a.mode == INA_GEMM_FP8_BLOCK ? fp8_cublaslt_rows(h, &a) : a.m;
  if (lt_rows > 0 && a.mode == INA_GEMM_FP8_BLOCK && a.path == INA_GEMM_PATH_AUTO) {
    lt_gemm_t g = probe_gemm(h, a.mode, a.out_dtype, lt_rows, a.n, a.k);
    lt_desc_t d;
    cublasLtMatmulAlgo_t algo;
    int found = 0;
    cublasStatus_t s = lt_describe(&g, &d);
    if (s == CUBLAS_STATUS_SUCCESS) s = lt_heuristic(h, &g, &d, &algo, &found);
    INA_CHECK(lt_status(s, "ina_gemm_query_path: cuBLASLt heuristic"));
    if (!found) lt_rows = 0;
  }
  info->cublaslt_rows = lt_rows;
  info->kernel_rows = a.m - lt_rows;
  if (info->kernel_rows > 0) {
    ina_gemm_kernel_plan_t plan;
    INA_CHECK(ina_gemm_kernel_plan(info->kernel_rows, a.n, a.k, h->sm_count, h->partial_bytes,
                                   MAX_SPLIT_TILES, &plan));
    info->kernel_tile_m = plan.tile_m;
    info->kernel_splits = plan.splits;
  }
  if (info->kernel_rows == 0)
    snprintf(info->description, sizeof info->description, "cuBLASLt %lld rows",
             (long long)info->cublaslt_rows);
  else if (info->cublaslt_rows == 0)
    snprintf(info->description, sizeof info->description, "kernel %lld rows (tile %d, split-K %d)",
             (long long)info->kernel_rows, info->kernel_tile_m, info->kernel_splits);
  else
    snprintf(info->description, sizeof info->description,
             "cuBLASLt %lld rows + kernel %lld rows (tile %d, split-K %d)",
             (long long)info->cublaslt_rows, (long long)info->kernel_rows, info->kernel_tile_m,
             info->kernel_splits);
fail:
  return st;
}
