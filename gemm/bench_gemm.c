/* Throughput of gemm/gemm.h on DeepSeek-V3 shapes: y[M, N] = x[M, K] . W[N, K]^T for
 * M = 1 .. 4096 and N x K = 7168x2048 (MoE down), 4096x7168 (MoE gate+up), 2048x7168,
 * 24576x1536 (q_b_proj), 7168x16384 (o_proj), in bf16 and in block-scaled FP8 (AUTO path,
 * and for M <= 256 also the kernel path forced), bf16 output.
 *
 * With --small-m: the DeepSeek-V2-Lite decode GEMMs at M = 1 and 8, N x K = 3072x2048
 * (q_proj), 576x2048 (kv_a_proj_with_mqa), 2048x2048 (o_proj), 2816x2048 (shared experts'
 * gate+up), 2048x1408 (shared experts' down), 102400x2048 (LM head), bf16 and FP8, each
 * through cuBLASLt as before the small-M kernel (INA_GEMM_PATH_CUBLASLT: for FP8 that is
 * cuBLASLt's rows plus the FP8 kernel's, all rows on the FP8 kernel at M < 4), the FP8
 * kernel alone, AUTO (the small-M kernel with its own plan where the routing rule of
 * gemm_internal.h picks it), and the small-M kernel with its own plan without PDL and with
 * other plans (warps x splits), so that the routing and the plan's constants rest on
 * measurements.
 *
 * Figures per (variant, M, N, K):
 *   time    median over 7 graph replays of (replay time / GEMMs in the graph); each graph
 *           holds enough GEMMs for about 2 ms (at least 1), after warm-up replays.
 *   TFLOP/s 2 M N K / time.
 *   TB/s    (W bytes + x bytes + y bytes [+ fp32 scales]) / time, the bytes a GEMM must
 *           move at least; printed for M <= 256, with its ratio to the read ceiling
 *           measured in the same run (bench/bench_util.h).
 * Weights, activations and outputs rotate over `sets` copies whose weights total at least
 * 4x the L2, so a GEMM does not find its weight in L2 from an earlier one. Inputs are
 * random (never zeros); FP8 operands are quantized from random bf16 on the GPU (weights
 * 128x128, activations 1x128 by ina_gemm_quantize_x for each M: the scale layout depends
 * on M). The last lines are a table, and one JSON line with every figure.
 *
 * Checks, before timing: every timed (variant, M, N, K) first runs once on operand set 0
 * into an output poisoned with NaN, and is compared with the CPU reference
 * (ina_gemm_ref_row, double) on the operands the GPU read (gemm/bench_gemm_check.h gives
 * the error model and bounds): every output finite, the row past M untouched, and a
 * sampled set of rows x all N columns within relative L2 1e-2 of the reference on the same
 * operands (FP8: also within 5e-2 of the bf16 product it was quantized from). Sampled rows:
 * 0..7, and for each range between consecutive M of the sweep its first, its last and 6
 * random rows (64 rows at M = 4096; all rows for M <= 8). The FP8 weights and activations
 * are compared bit for bit with ina_fp8_quantize_blocks on the host. A failed check prints
 * the case and the error, no figure for the case, and makes the program exit 1.
 *
 * Usage: bench_gemm [--small-m] (exit 0 on success, 1 when a check failed, 77 without a
 * device).
 * gemm/gemm_torch_ref.py prints torch's figures for the same shapes in the same format. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/cuda.h"
#include "core/fp8_quant.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "gemm/bench_gemm_check.h"
#include "gemm/gemm.h"
#include "gemm/gemm_internal.h"

#define MAX_SETS 256
#define LARGE_M_MAX_SETS 16
#define TIMED_REPLAYS 7
#define WARMUP_REPLAYS 2
#define TARGET_GRAPH_MS 2.0
#define MAX_CALLS_PER_GRAPH 256
#define LARGE_M_MAX_CALLS_PER_GRAPH 64
#define KERNEL_MAX_BENCH_M 256
#define MAX_M 4096
#define CHECK_ROWS_PER_RANGE 8 /* sampled rows per range between consecutive M */
#define MAX_CHECK_ROWS 128

static const int64_t g_ms[] = {1, 8, 64, 128, 256, 512, 1024, 2048, 4096};
#define NUM_MS ((int)(sizeof g_ms / sizeof g_ms[0]))
static const int64_t g_shapes[][2] = {
    {7168, 2048}, {4096, 7168}, {2048, 7168}, {24576, 1536}, {7168, 16384}};
#define NUM_SHAPES ((int)(sizeof g_shapes / sizeof g_shapes[0]))

typedef enum { V_BF16 = 0, V_FP8, V_FP8_KERNEL, NUM_VARIANTS } variant_t;
static const char *g_variant_names[NUM_VARIANTS] = {"bf16", "fp8", "fp8_kernel"};

/* How one timed GEMM runs: mode, path, and for the small-M kernel a forced plan. */
typedef struct how {
  char name[48];
  int fp8;
  ina_gemm_path_t path;
  int forced; /* ina_gemm_run_small_m with `plan` */
  ina_gemm_small_m_plan_t plan;
} how_t;

/* TFLOP/s of every (shape, M, variant), 0 when not measured, NaN when its check failed:
 * the closing table. */
static double g_tflops[NUM_SHAPES][NUM_MS][NUM_VARIANTS];

#define CUDA_OK(call)                                                           \
  do {                                                                          \
    cudaError_t e_ = (call);                                                    \
    if (e_ != cudaSuccess) {                                                    \
      fprintf(stderr, "bench_gemm: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
              cudaGetErrorString(e_));                                          \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

#define INA_OK(call)                                                                               \
  do {                                                                                             \
    ina_status_t s_ = (call);                                                                      \
    if (s_ != INA_OK) {                                                                            \
      fprintf(stderr, "bench_gemm: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, ina_last_error()); \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CUDA_OK(cudaMalloc(&p, bytes));
  return p;
}

/* The rotating operand sets of one N x K shape, sized for max_m rows. */
typedef struct operands {
  int64_t n, k, max_m;
  int sets, max_calls; /* GEMMs per graph at most: at least the sets when they are many */
  uint16_t *w16[MAX_SETS], *x16[MAX_SETS], *y[MAX_SETS];
  uint8_t *w8[MAX_SETS], *x8[MAX_SETS];
  float *w_scale[MAX_SETS], *x_scale[MAX_SETS];
} operands_t;

static void operands_make(operands_t *o, int64_t n, int64_t k, int64_t max_m, int max_sets,
                          int64_t l2_bytes) {
  const int64_t kb = (k + 127) / 128, nb = (n + 127) / 128;
  const int64_t w_scales = ina_gemm_w_scale_count(n, k);
  float *rows = malloc((size_t)(nb * kb) * sizeof *rows);
  float *packed = malloc((size_t)w_scales * sizeof *packed);
  float *raw = dev_alloc((size_t)(nb * kb) * sizeof(float));
  if (!rows || !packed) exit(1);
  memset(o, 0, sizeof *o);
  o->n = n, o->k = k, o->max_m = max_m;
  o->sets = (int)((4 * l2_bytes + n * k - 1) / (n * k)); /* fp8 weights past 4x L2 */
  if (o->sets < 2) o->sets = 2;
  if (o->sets > max_sets) o->sets = max_sets;
  o->max_calls = max_sets > LARGE_M_MAX_SETS ? MAX_CALLS_PER_GRAPH : LARGE_M_MAX_CALLS_PER_GRAPH;
  for (int s = 0; s < o->sets; s++) {
    o->w16[s] = dev_alloc((size_t)(n * k) * 2);
    o->x16[s] = dev_alloc((size_t)(max_m * k) * 2);
    o->y[s] = dev_alloc((size_t)(max_m * n) * 2);
    o->w8[s] = dev_alloc((size_t)(n * k));
    o->x8[s] = dev_alloc((size_t)(max_m * k));
    o->w_scale[s] = dev_alloc((size_t)w_scales * sizeof(float));
    o->x_scale[s] = dev_alloc((size_t)(max_m * kb) * sizeof(float));
    INA_OK(ina_bench_fill_random_bf16(o->w16[s], (size_t)(n * k), 1000 + s, 0.05f));
    INA_OK(ina_bench_fill_random_bf16(o->x16[s], (size_t)(max_m * k), 2000 + s, 2.0f));
    INA_OK(ina_cuda_fp8_quantize_blocks(o->w16[s], n, k, 128, 128, o->w8[s], raw, NULL));
    CUDA_OK(cudaMemcpy(rows, raw, (size_t)(nb * kb) * sizeof(float), cudaMemcpyDeviceToHost));
    INA_OK(ina_gemm_pack_w_scales(rows, n, k, packed));
    CUDA_OK(cudaMemcpy(o->w_scale[s], packed, (size_t)w_scales * sizeof(float),
                       cudaMemcpyHostToDevice));
  }
  CUDA_OK(cudaDeviceSynchronize());
  free(rows);
  free(packed);
  CUDA_OK(cudaFree(raw));
}

static void operands_free(operands_t *o) {
  for (int s = 0; s < o->sets; s++) {
    CUDA_OK(cudaFree(o->w16[s]));
    CUDA_OK(cudaFree(o->x16[s]));
    CUDA_OK(cudaFree(o->y[s]));
    CUDA_OK(cudaFree(o->w8[s]));
    CUDA_OK(cudaFree(o->x8[s]));
    CUDA_OK(cudaFree(o->w_scale[s]));
    CUDA_OK(cudaFree(o->x_scale[s]));
  }
}

static how_t how_of_variant(variant_t v) {
  how_t how;
  memset(&how, 0, sizeof how);
  snprintf(how.name, sizeof how.name, "%s", g_variant_names[v]);
  how.fp8 = v != V_BF16;
  how.path = v == V_FP8_KERNEL ? INA_GEMM_PATH_KERNEL : INA_GEMM_PATH_AUTO;
  return how;
}

static ina_gemm_args_t args_for(const operands_t *o, const how_t *how, int64_t m, int set,
                                cudaStream_t stream) {
  ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
  a.mode = how->fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
  a.path = how->path;
  a.m = m, a.n = o->n, a.k = o->k;
  a.x = how->fp8 ? (const void *)o->x8[set] : (const void *)o->x16[set];
  a.w = how->fp8 ? (const void *)o->w8[set] : (const void *)o->w16[set];
  a.x_scale = o->x_scale[set];
  a.w_scale = o->w_scale[set];
  a.out_dtype = INA_DTYPE_BF16;
  a.y = o->y[set];
  a.stream = stream;
  return a;
}

static void run_how(const ina_gemm_t *h, const operands_t *o, const how_t *how, int64_t m,
                    int set, cudaStream_t stream) {
  const ina_gemm_args_t a = args_for(o, how, m, set, stream);
  if (how->forced)
    INA_OK(ina_gemm_run_small_m(h, &a, &how->plan));
  else
    INA_OK(ina_gemm_run(h, &a));
}

typedef struct gemm_run {
  const ina_gemm_t *h;
  const operands_t *o;
  const how_t *how;
  int64_t m;
} gemm_run_t;

/* Run i of a graph: rotate over the operand sets. */
static ina_status_t enqueue_gemm(void *ctx, int64_t i, void *stream) {
  const gemm_run_t *r = ctx;
  run_how(r->h, r->o, r->how, r->m, (int)(i % r->o->sets), (cudaStream_t)stream);
  return INA_OK;
}

/* Median milliseconds per GEMM run as `how` says at M rows, from graph replays. */
static double time_gemm(const ina_gemm_t *h, const operands_t *o, const how_t *how, int64_t m,
                        cudaStream_t stream) {
  cudaEvent_t e0, e1;
  float ms = 0.0f;
  double per_run = 0.0;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  /* Warm-up and a first estimate from one eager call, to size the graph. */
  run_how(h, o, how, m, 0, stream);
  CUDA_OK(cudaEventRecord(e0, stream));
  run_how(h, o, how, m, 0, stream);
  CUDA_OK(cudaEventRecord(e1, stream));
  CUDA_OK(cudaEventSynchronize(e1));
  CUDA_OK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_OK(cudaEventDestroy(e0));
  CUDA_OK(cudaEventDestroy(e1));
  int calls = ms > 0.0f ? (int)(TARGET_GRAPH_MS / ms) : o->max_calls;
  if (calls < 1) calls = 1;
  if (calls > o->max_calls) calls = o->max_calls;
  const gemm_run_t run = {h, o, how, m};
  const ina_bench_timing_t timing = {WARMUP_REPLAYS, TIMED_REPLAYS, 1};
  INA_OK(ina_bench_time_graph_ms(enqueue_gemm, (void *)&run, calls, &timing, stream, &per_run));
  return per_run;
}

/* ---- checks ----------------------------------------------------------------------------- */

/* The checks of one N x K shape: the references of the sampled rows of set 0. */
typedef struct shape_check {
  ina_bench_gemm_ref_t ref;
  int ready;  /* the references exist */
  int w8_ok;  /* the FP8 weight equals the host quantization */
  int x8_ok;  /* the FP8 activations at the current M equal the host quantization */
  uint16_t *y_host; /* [max_m, n], the read-back output */
} shape_check_t;

/* Rows 0..7 and, for every range [ms[i - 1], ms[i]) above 8, CHECK_ROWS_PER_RANGE of it
 * (its first, its last and random ones): each M of the sweep checks the rows below it. */
static int check_rows(const int64_t *ms, int count, int64_t max_m, int64_t *rows) {
  uint64_t state = 0xC4ECull;
  int n = 0;
  for (int64_t r = 0; r < 8 && r < max_m; r++) rows[n++] = r;
  for (int i = 0; i < count; i++) {
    const int64_t lo = i == 0 || ms[i - 1] < 8 ? 8 : ms[i - 1], hi = ms[i];
    if (hi > lo && n + CHECK_ROWS_PER_RANGE <= MAX_CHECK_ROWS)
      n += ina_bench_sample_range(lo, hi, CHECK_ROWS_PER_RANGE, &state, rows + n);
  }
  return n;
}

/* Reads set 0's operands back, checks the FP8 weight bit for bit and computes the
 * references (FP8 and bf16) of the sampled rows. */
static void shape_check_make(shape_check_t *c, const operands_t *o, const int64_t *ms, int count,
                             ina_threadpool_t *pool) {
  const int64_t n = o->n, k = o->k, w_scales = ina_gemm_w_scale_count(n, k);
  int64_t rows[MAX_CHECK_ROWS];
  char what[96];
  memset(c, 0, sizeof *c);
  const int nrows = check_rows(ms, count, o->max_m, rows);
  uint16_t *x16 = malloc((size_t)(nrows * k) * 2), *w16 = malloc((size_t)(n * k) * 2);
  uint8_t *w8 = malloc((size_t)(n * k));
  float *w_scale = malloc((size_t)w_scales * sizeof(float));
  c->y_host = malloc((size_t)(o->max_m * n) * 2);
  if (!x16 || !w16 || !w8 || !w_scale || !c->y_host) {
    fprintf(stderr, "bench_gemm: out of memory for the checks of n %lld k %lld\n", (long long)n,
            (long long)k);
    exit(1);
  }
  for (int i = 0; i < nrows; i++)
    CUDA_OK(cudaMemcpy(x16 + i * k, o->x16[0] + rows[i] * k, (size_t)k * 2,
                       cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(w16, o->w16[0], (size_t)(n * k) * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(w8, o->w8[0], (size_t)(n * k), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(w_scale, o->w_scale[0], (size_t)w_scales * sizeof(float),
                     cudaMemcpyDeviceToHost));
  snprintf(what, sizeof what, "gemm_fp8_n%lld_k%lld_weight", (long long)n, (long long)k);
  c->w8_ok = ina_bench_gemm_check_w8(what, n, k, w16, w8, w_scale);
  const double t0 = ina_bench_now_s();
  if (ina_bench_gemm_ref_init(&c->ref, n, k, rows, nrows, x16, w16, w8, w_scale, pool) == INA_OK) {
    c->ready = 1;
    printf("reference n %lld k %lld: %d sampled rows, bf16 and fp8, %.1f s on %d threads\n",
           (long long)n, (long long)k, nrows, ina_bench_now_s() - t0, ina_threadpool_size(pool));
  } else {
    snprintf(what, sizeof what, "gemm_n%lld_k%lld_reference", (long long)n, (long long)k);
    ina_bench_check_failed(what, "%s", ina_last_error());
  }
  free(x16);
  free(w16);
  free(w8);
  free(w_scale);
}

static void shape_check_free(shape_check_t *c) {
  ina_bench_gemm_ref_free(&c->ref);
  free(c->y_host);
}

/* After ina_gemm_quantize_x for m rows: set 0's sampled rows and scales, bit for bit. */
static void check_quantized_x(shape_check_t *c, const operands_t *o, int64_t m) {
  const int64_t k = o->k, scales = ina_gemm_x_scale_count(m, k);
  char what[96];
  c->x8_ok = 0;
  if (!c->ready) return;
  uint8_t *x8 = malloc((size_t)(c->ref.nrows * k));
  float *x_scale = malloc((size_t)scales * sizeof *x_scale);
  if (!x8 || !x_scale) exit(1);
  for (int i = 0; i < c->ref.nrows; i++)
    if (c->ref.rows[i] < m)
      CUDA_OK(cudaMemcpy(x8 + i * k, o->x8[0] + c->ref.rows[i] * k, (size_t)k,
                         cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(x_scale, o->x_scale[0], (size_t)scales * sizeof(float),
                     cudaMemcpyDeviceToHost));
  snprintf(what, sizeof what, "gemm_fp8_m%lld_n%lld_k%lld_quantize_x", (long long)m,
           (long long)o->n, (long long)k);
  c->x8_ok = ina_bench_gemm_check_x8(what, &c->ref, m, x8, x_scale);
  free(x8);
  free(x_scale);
}

/* One run as `how` says at M rows on set 0, into a poisoned output, against the
 * references. Returns 1 when the case may be timed. */
static int check_gemm(const ina_gemm_t *h, const operands_t *o, shape_check_t *c, const how_t *how,
                      int64_t m, cudaStream_t stream) {
  char what[128];
  snprintf(what, sizeof what, "gemm_%s_m%lld_n%lld_k%lld", how->name, (long long)m,
           (long long)o->n, (long long)o->k);
  if (!c->ready) return ina_bench_check_failed(what, "no reference");
  if (how->fp8 && !(c->w8_ok && c->x8_ok))
    return ina_bench_check_failed(what, "its FP8 operands failed their check");
  const int64_t y_rows = m < o->max_m ? m + 1 : m; /* the row past M must keep its poison */
  CUDA_OK(cudaMemsetAsync(o->y[0], 0xFF, (size_t)(y_rows * o->n) * 2, stream));
  run_how(h, o, how, m, 0, stream);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(c->y_host, o->y[0], (size_t)(y_rows * o->n) * 2, cudaMemcpyDeviceToHost));
  return ina_bench_gemm_check_y(what, &c->ref, how->fp8, m, c->y_host, y_rows);
}

/* Reports the figures of one timing; returns the TB/s. */
static double report(const operands_t *o, const how_t *how, int64_t m, double ms,
                     double ceiling_tbs) {
  char name[128], formula[256];
  const char *vn = how->name;
  const double seconds = ms * 1e-3, n = (double)o->n, k = (double)o->k;
  const double in_bytes = how->fp8 ? 1.0 : 2.0;
  const double scale_bytes =
      !how->fp8
          ? 0.0
          : 4.0 * (double)(ina_gemm_w_scale_count(o->n, o->k) + ina_gemm_x_scale_count(m, o->k));
  const double bytes = in_bytes * (n * k + (double)m * k) + 2.0 * m * n + scale_bytes;
  const double tflops = 2.0 * m * n * k / seconds * 1e-12;
  snprintf(name, sizeof name, "gemm_%s_m%lld_n%lld_k%lld_time", vn, (long long)m, (long long)o->n,
           (long long)o->k);
  snprintf(formula, sizeof formula,
           "median over %d CUDA-graph replays of replay time / GEMMs per graph, %d rotating sets",
           TIMED_REPLAYS, o->sets);
  ina_bench_result(name, ms * 1e3, "us", formula);
  snprintf(name, sizeof name, "gemm_%s_m%lld_n%lld_k%lld_tflops", vn, (long long)m, (long long)o->n,
           (long long)o->k);
  ina_bench_result(name, tflops, "TFLOP/s", "2*M*N*K / time");
  const double tbs = bytes / seconds * 1e-12;
  if (m <= 256) {
    snprintf(name, sizeof name, "gemm_%s_m%lld_n%lld_k%lld_tbs", vn, (long long)m, (long long)o->n,
             (long long)o->k);
    snprintf(formula, sizeof formula,
             "(W %s + x + bf16 y%s) = %.0f bytes / time; %.3f of the read ceiling %.3f TB/s",
             how->fp8 ? "fp8" : "bf16", how->fp8 ? " + fp32 scales" : "", bytes,
             tbs / ceiling_tbs, ceiling_tbs);
    ina_bench_result(name, tbs, "TB/s", formula);
  }
  return tbs;
}

/* Prints how many checks passed; the exit status: 1 when one failed. */
static int checks_summary(void) {
  const int failed = ina_bench_checks_failed(), run = ina_bench_checks_run();
  printf("checks: %d of %d passed%s\n", run - failed, run,
         failed ? "; the failed cases have no figures" : "");
  return failed ? 1 : 0;
}

/* ---- --small-m ------------------------------------------------------------------------------ */

static const int64_t g_lite_shapes[][2] = {{3072, 2048}, {576, 2048},  {2048, 2048},
                                           {2816, 2048}, {2048, 1408}, {102400, 2048}};
#define NUM_LITE_SHAPES ((int)(sizeof g_lite_shapes / sizeof g_lite_shapes[0]))
static const int64_t g_lite_ms[] = {1, 8};
#define NUM_LITE_MS ((int)(sizeof g_lite_ms / sizeof g_lite_ms[0]))
/* Forced small-M plans: warps, splits, PDL. */
static const int32_t g_sweep[][3] = {{4, 1, 1}, {8, 1, 1}, {16, 1, 1}, {8, 2, 1}, {16, 2, 1},
                                     {4, 4, 1}};
#define NUM_SWEEP ((int)(sizeof g_sweep / sizeof g_sweep[0]))

/* The ways one (mode, shape) runs; returns how many. */
static int small_m_hows(const ina_gemm_t *h, int fp8, const operands_t *o, int sm_count,
                        how_t *hows) {
  int count = 0;
  const int64_t k_bytes = o->k * (fp8 ? 1 : 2);
  how_t *w = &hows[count++];
  memset(w, 0, sizeof *w);
  w->fp8 = fp8, w->path = INA_GEMM_PATH_CUBLASLT;
  snprintf(w->name, sizeof w->name, "%s_cublaslt", fp8 ? "fp8" : "bf16");
  if (fp8) {
    w = &hows[count++];
    memset(w, 0, sizeof *w);
    w->fp8 = 1, w->path = INA_GEMM_PATH_KERNEL;
    snprintf(w->name, sizeof w->name, "fp8_kernel");
  }
  w = &hows[count++];
  memset(w, 0, sizeof *w);
  w->fp8 = fp8, w->path = INA_GEMM_PATH_AUTO;
  snprintf(w->name, sizeof w->name, "%s_auto", fp8 ? "fp8" : "bf16");
  /* AUTO's own plan without PDL, then the sweep. */
  ina_gemm_args_t probe = INA_GEMM_ARGS_INIT;
  ina_gemm_path_info_t info;
  probe.mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16, probe.m = 1, probe.n = o->n;
  probe.k = o->k;
  INA_OK(ina_gemm_query_path(h, &probe, &info));
  w = &hows[count++];
  memset(w, 0, sizeof *w);
  w->fp8 = fp8, w->forced = 1;
  /* The handle's defaults: 8 MiB of partial sums, 1024 counters. */
  INA_OK(ina_gemm_small_m_plan(o->n, k_bytes, sm_count, (size_t)8 << 20, 1024, &w->plan));
  w->plan.pdl = 0;
  snprintf(w->name, sizeof w->name, "%s_sm_w%d_s%d_nopdl", fp8 ? "fp8" : "bf16", w->plan.warps,
           w->plan.splits);
  for (int i = 0; i < NUM_SWEEP; i++) {
    w = &hows[count];
    memset(w, 0, sizeof *w);
    w->fp8 = fp8, w->forced = 1;
    ina_log_set_quiet_errors(1);
    const ina_status_t st =
        ina_gemm_small_m_plan_fixed(o->n, k_bytes, g_sweep[i][0], g_sweep[i][1], g_sweep[i][2],
                                    (size_t)8 << 20, 1024, &w->plan);
    ina_log_set_quiet_errors(0);
    if (st != INA_OK) continue; /* a split this shape's workspace cannot hold */
    snprintf(w->name, sizeof w->name, "%s_sm_w%d_s%d%s", fp8 ? "fp8" : "bf16", w->plan.warps,
             w->plan.splits, w->plan.pdl ? "" : "_nopdl");
    count++;
  }
  printf("path %s n %lld k %lld: %s\n", fp8 ? "fp8" : "bf16", (long long)o->n, (long long)o->k,
         info.description);
  return count;
}

static int bench_small_m(ina_gemm_t *h, cudaStream_t stream, double ceiling, int l2,
                         int sm_count, ina_threadpool_t *pool) {
  printf("\n%-7s %-12s %-4s %-26s %10s %8s %8s\n", "M", "N x K", "mode", "variant", "time us",
         "TB/s", "/ceiling");
  static char table[NUM_LITE_SHAPES * NUM_LITE_MS * 2 * (NUM_SWEEP + 4)][192];
  int rows = 0;
  for (int s = 0; s < NUM_LITE_SHAPES; s++) {
    operands_t o;
    operands_make(&o, g_lite_shapes[s][0], g_lite_shapes[s][1], INA_GEMM_SMALL_M_MAX_ROWS,
                  MAX_SETS, l2);
    shape_check_t check;
    shape_check_make(&check, &o, g_lite_ms, NUM_LITE_MS, pool);
    INA_OK(ina_gemm_prepare(h, INA_GEMM_BF16, INA_DTYPE_BF16, o.n, o.k));
    INA_OK(ina_gemm_prepare(h, INA_GEMM_FP8_BLOCK, INA_DTYPE_BF16, o.n, o.k));
    for (int i = 0; i < NUM_LITE_MS; i++) {
      const int64_t m = g_lite_ms[i];
      for (int set = 0; set < o.sets; set++)
        INA_OK(ina_gemm_quantize_x(o.x16[set], 0, m, o.k, o.x8[set], 0, o.x_scale[set], stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      check_quantized_x(&check, &o, m);
      for (int fp8 = 0; fp8 < 2; fp8++) {
        how_t hows[NUM_SWEEP + 4];
        const int count = small_m_hows(h, fp8, &o, sm_count, hows);
        for (int v = 0; v < count; v++) {
          if (hows[v].path == INA_GEMM_PATH_CUBLASLT && fp8) {
            /* cuBLASLt may have no algorithm for this shape (AUTO then took the FP8 kernel,
             * measured as fp8_kernel). */
            const ina_gemm_args_t trial = args_for(&o, &hows[v], m, 0, stream);
            ina_log_set_quiet_errors(1);
            const ina_status_t st = ina_gemm_run(h, &trial);
            ina_log_set_quiet_errors(0);
            CUDA_OK(cudaStreamSynchronize(stream));
            if (st != INA_OK) {
              printf("note: %s m %lld n %lld k %lld: %s, skipped\n", hows[v].name, (long long)m,
                     (long long)o.n, (long long)o.k, ina_status_string(st));
              continue;
            }
          }
          if (!check_gemm(h, &o, &check, &hows[v], m, stream)) continue;
          const double ms = time_gemm(h, &o, &hows[v], m, stream);
          const double tbs = report(&o, &hows[v], m, ms, ceiling);
          snprintf(table[rows++], sizeof table[0],
                   "%-7lld %5lldx%-6lld %-4s %-26.40s %10.2f %8.3f %8.3f", (long long)m,
                   (long long)o.n, (long long)o.k, fp8 ? "fp8" : "bf16", hows[v].name, ms * 1e3,
                   tbs, tbs / ceiling);
        }
      }
    }
    shape_check_free(&check);
    operands_free(&o);
  }
  printf("\n%-7s %-12s %-4s %-26s %10s %8s %8s   (read ceiling %.3f TB/s)\n", "M", "N x K",
         "mode", "variant", "time us", "TB/s", "/ceiling", ceiling);
  for (int r = 0; r < rows; r++) printf("%s\n", table[r]);
  ina_bench_print_json("gemm_small_m");
  return checks_summary();
}

int main(int argc, char **argv) {
  int small_m = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--small-m") == 0) {
      small_m = 1;
    } else {
      fprintf(stderr, "usage: bench_gemm [--small-m]\n");
      return 2;
    }
  }
  if (ina_bench_no_device("bench_gemm")) return INA_BENCH_SKIP;
  const double ceiling = ina_bench_read_ceiling_tbs();
  if (ceiling <= 0.0) {
    fprintf(stderr, "bench_gemm: read ceiling: %s\n", ina_last_error());
    return 1;
  }
  ina_bench_result("read_ceiling", ceiling, "TB/s",
                   "read-only reduction over rotating 1 GiB slices (bench_read_ceiling), same run");
  int device = 0, l2 = 0, sm_count = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  CUDA_OK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  printf("cuBLASLt version %zu, L2 %d MiB\n", cublasLtGetVersion(), l2 >> 20);

  ina_gemm_t *h = NULL;
  ina_gemm_config_t config = INA_GEMM_CONFIG_INIT;
  config.max_m = MAX_M;
  INA_OK(ina_gemm_create(&config, &h));
  ina_threadpool_t *pool = NULL; /* the CPU references */
  INA_OK(ina_threadpool_create(0, &pool));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (small_m) {
    const int rc = bench_small_m(h, stream, ceiling, l2, sm_count, pool);
    CUDA_OK(cudaStreamDestroy(stream));
    ina_threadpool_destroy(pool);
    ina_gemm_destroy(h);
    return rc;
  }

  for (int s = 0; s < NUM_SHAPES; s++) {
    operands_t o;
    operands_make(&o, g_shapes[s][0], g_shapes[s][1], MAX_M, LARGE_M_MAX_SETS, l2);
    shape_check_t check;
    shape_check_make(&check, &o, g_ms, NUM_MS, pool);
    INA_OK(ina_gemm_prepare(h, INA_GEMM_BF16, INA_DTYPE_BF16, o.n, o.k));
    INA_OK(ina_gemm_prepare(h, INA_GEMM_FP8_BLOCK, INA_DTYPE_BF16, o.n, o.k));
    for (int i = 0; i < NUM_MS; i++) {
      const int64_t m = g_ms[i];
      for (int set = 0; set < o.sets; set++)
        INA_OK(ina_gemm_quantize_x(o.x16[set], 0, m, o.k, o.x8[set], 0, o.x_scale[set], stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      check_quantized_x(&check, &o, m);
      const how_t fp8_auto = how_of_variant(V_FP8);
      ina_gemm_args_t probe = args_for(&o, &fp8_auto, m, 0, stream);
      ina_gemm_path_info_t info;
      INA_OK(ina_gemm_query_path(h, &probe, &info));
      printf("path fp8 m %lld n %lld k %lld: %s\n", (long long)m, (long long)o.n, (long long)o.k,
             info.description);
      for (int v = 0; v < NUM_VARIANTS; v++) {
        if (v == V_FP8_KERNEL && m > KERNEL_MAX_BENCH_M) continue;
        const how_t how = how_of_variant((variant_t)v);
        if (!check_gemm(h, &o, &check, &how, m, stream)) {
          g_tflops[s][i][v] = NAN;
          continue;
        }
        const double ms = time_gemm(h, &o, &how, m, stream);
        report(&o, &how, m, ms, ceiling);
        g_tflops[s][i][v] = 2.0 * m * (double)o.n * (double)o.k / (ms * 1e-3) * 1e-12;
      }
    }
    shape_check_free(&check);
    operands_free(&o);
  }

  printf("\n%6s %13s %10s %10s %12s %9s   (TFLOP/s; failed: its check failed)\n", "M", "N x K",
         "bf16", "fp8", "fp8_kernel", "fp8/bf16");
  for (int s = 0; s < NUM_SHAPES; s++)
    for (int i = 0; i < NUM_MS; i++) {
      char shape[32], cells[NUM_VARIANTS][16], ratio[16] = "-";
      snprintf(shape, sizeof shape, "%lldx%lld", (long long)g_shapes[s][0],
               (long long)g_shapes[s][1]);
      const double *t = g_tflops[s][i];
      for (int v = 0; v < NUM_VARIANTS; v++) {
        if (isnan(t[v])) snprintf(cells[v], sizeof cells[v], "failed");
        else snprintf(cells[v], sizeof cells[v], "%.1f", t[v]);
      }
      if (t[V_BF16] > 0 && t[V_FP8] > 0)
        snprintf(ratio, sizeof ratio, "%.2f", t[V_FP8] / t[V_BF16]);
      printf("%6lld %13s %10s %10s %12s %9s\n", (long long)g_ms[i], shape, cells[V_BF16],
             cells[V_FP8], cells[V_FP8_KERNEL], ratio);
    }
  ina_bench_print_json("gemm");
  CUDA_OK(cudaStreamDestroy(stream));
  ina_threadpool_destroy(pool);
  ina_gemm_destroy(h);
  return checks_summary();
}
