/* Throughput of the grouped expert GEMM (gemm/gemm_grouped.h) on DeepSeek-V2-Lite's routed
 * experts: 64 experts, top-6 routing, expert weights n x k = 1408 x 2048 (gate or up),
 * 2816 x 2048 (gate and up fused) and 2048 x 1408 (down), bf16 and block-scaled FP8, at
 * 1, 8 and 64 tokens (decode: max_rows 6, 48 and 384), 128 and 256 tokens (larger decode
 * batches: 768 and 1536, 12 and 24 rows per expert) and 1024 tokens (prefill: 6144).
 * Decode runs with the launch used before narrower tiles existed ("tile16x128_before": 16
 * rows by 128 weight rows, (max_rows + 15 groups) / 16 M-tile slots without the bound by
 * max_rows, slots fastest in the grid), with every decode tile (16 by 128, 64 or 32,
 * weight tiles fastest) and with the tile ina_gemm_grouped_run picks ("auto"); 128 and 256
 * tokens with 16 x 128 and 64 x 128 tiles and the pick; prefill with the picked tile.
 *
 * Routing: each token picks 6 distinct experts uniformly at random (fixed seed); the rows
 * come sorted by expert, offsets on the device. Each case rotates over 8 routings (8
 * offsets buffers), so that one run's experts are rarely the previous run's: at one token
 * (6 experts, 17-35 MB) the experts of a fixed routing would stay in the 50 MB L2. At one
 * token the 8 routings draw their experts from a shuffled deck, so consecutive runs share
 * none.
 * Figures per (mode, tokens, n, k, tile):
 *   time     median over 7 replays of a CUDA graph of 40 runs (after 2 warm-up replays) of
 *            replay time / 40: the launch gaps of a captured decode step, not the host's
 *            launch rate.
 *   TB/s     (W bytes of the experts that received rows + x bytes + y bytes [+ fp32
 *            scales]) / time, averaged over the routings: the bytes the GEMM must move at
 *            least; with its ratio to the read ceiling measured in the same run.
 *   TFLOP/s  2 rows n k / time.
 * Inputs are random, never zeros: bf16 from ina_bench_fill_random_bf16, FP8 quantized from
 * it on the GPU (weights 128 x 128, their scales packed by ina_gemm_pack_w_scales;
 * activations 1 x 128, row-major). The last lines are a table of every figure.
 *
 * Checks, before timing: the FP8 activations and every expert's FP8 weight are compared
 * bit for bit with ina_fp8_quantize_blocks on the host. Every timed (mode, tokens, n, k,
 * tile) first runs once with the first routing into an output poisoned with NaN and is
 * compared with ina_gemm_grouped_ref on the operands the GPU read (error model and bounds:
 * gemm/bench_gemm_check.h): every routed output finite, the row past them untouched, and
 * each of up to 64 sampled rows (all rows up to 64 routed rows; else the first, the last
 * and random ones) x all n columns within relative L2 1e-2 of the reference row. A failed
 * check prints the case and the error, no figure for the case, and makes the program
 * exit 1.
 *
 * Usage: bench_gemm_grouped (exit 0 on success, 1 when a check failed, 77 without a
 * device). */
#include <cuda_runtime.h>
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
#include "gemm/gemm_grouped.h"
#include "gemm/gemm_internal.h"

#define EXPERTS 64
#define TOP_K 6
#define MAX_TOKENS 1024
#define MAX_ROWS (MAX_TOKENS * TOP_K)
#define ROUTINGS 8
#define RUNS_PER_GRAPH 40
#define WARMUP_REPLAYS 2
#define TIMED_REPLAYS 7
#define DECODE_MAX_TOKENS 64
#define CHECK_ROWS 64 /* sampled rows per checked case */

#define CUDA_OK(call)                                                                   \
  do {                                                                                  \
    cudaError_t e_ = (call);                                                            \
    if (e_ != cudaSuccess) {                                                            \
      fprintf(stderr, "bench_gemm_grouped: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
              cudaGetErrorString(e_));                                                  \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define INA_OK(call)                                                                   \
  do {                                                                                 \
    ina_status_t s_ = (call);                                                          \
    if (s_ != INA_OK) {                                                                \
      fprintf(stderr, "bench_gemm_grouped: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
              ina_last_error());                                                       \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CUDA_OK(cudaMalloc(&p, bytes));
  return p;
}

/* splitmix64, fixed seed: the same routing every run. */
static uint64_t next_random(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t g_state = 42;

/* The next expert of a shuffled deck of all experts, reshuffled when fewer than `need`
 * remain: consecutive draws are distinct until the deck runs out. */
static int deck_draw(int need) {
  static int deck[EXPERTS], left = 0;
  if (left < need) {
    for (int e = 0; e < EXPERTS; e++) deck[e] = e;
    for (int e = EXPERTS - 1; e > 0; e--) {
      const int o = (int)(next_random(&g_state) % (uint64_t)(e + 1)), t = deck[e];
      deck[e] = deck[o], deck[o] = t;
    }
    left = EXPERTS;
  }
  return deck[--left];
}

/* Top-6 of 64 experts per token, uniformly (one token: from the deck, so consecutive
 * routings share no expert): offsets[e] = rows of experts below e. Returns how many
 * experts received rows. */
static int route(int64_t tokens, int32_t *offsets) {
  int64_t count[EXPERTS] = {0};
  for (int64_t t = 0; t < tokens; t++) {
    int chosen[TOP_K];
    for (int i = 0; i < TOP_K; i++) {
      int e, dup;
      do {
        e = tokens == 1 ? deck_draw(TOP_K - i) : (int)(next_random(&g_state) % EXPERTS), dup = 0;
        for (int j = 0; j < i; j++) dup |= chosen[j] == e;
      } while (dup);
      chosen[i] = e;
      count[e]++;
    }
  }
  int active = 0;
  offsets[0] = 0;
  for (int e = 0; e < EXPERTS; e++) {
    offsets[e + 1] = offsets[e] + (int32_t)count[e];
    active += count[e] > 0;
  }
  return active;
}

/* The experts of one n x k shape, bf16 and FP8, and activations for MAX_ROWS rows. */
typedef struct experts {
  int64_t n, k;
  uint16_t *w16_all, *x16, *y;
  uint8_t *w8_all, *x8;
  float *w_scale_all, *x_scale;
  const void **d_w16, **d_w8; /* device arrays of device pointers */
  const float **d_w_scale;
  int32_t *d_offsets[ROUTINGS];
  /* Host copies of everything the runs read, for the checks, and the read-back output. */
  uint16_t *h_x16, *h_w16, *h_y;
  uint8_t *h_x8, *h_w8;
  float *h_x_scale, *h_w_scale;
  const void *h_w16_ptrs[EXPERTS], *h_w8_ptrs[EXPERTS];
  const float *h_w_scale_ptrs[EXPERTS];
  int quantized_ok; /* the FP8 operands equal the host quantization */
} experts_t;

static void experts_make(experts_t *e, int64_t n, int64_t k) {
  const int64_t kb = (k + 127) / 128, nb = (n + 127) / 128, ws = ina_gemm_w_scale_count(n, k);
  const void *w16[EXPERTS], *w8[EXPERTS];
  const float *w_scale[EXPERTS];
  float *raw = dev_alloc((size_t)(nb * kb) * sizeof(float));
  float *rows = malloc((size_t)(nb * kb) * sizeof *rows), *packed = malloc((size_t)ws * 4);
  if (!rows || !packed) exit(1);
  memset(e, 0, sizeof *e);
  e->n = n, e->k = k;
  e->w16_all = dev_alloc((size_t)(EXPERTS * n * k) * 2);
  e->w8_all = dev_alloc((size_t)(EXPERTS * n * k));
  e->w_scale_all = dev_alloc((size_t)(EXPERTS * ws) * sizeof(float));
  e->x16 = dev_alloc((size_t)(MAX_ROWS * k) * 2);
  e->x8 = dev_alloc((size_t)(MAX_ROWS * k));
  e->x_scale = dev_alloc((size_t)(MAX_ROWS * kb) * sizeof(float));
  e->y = dev_alloc((size_t)(MAX_ROWS * n) * 2);
  e->d_w16 = dev_alloc(sizeof w16);
  e->d_w8 = dev_alloc(sizeof w8);
  e->d_w_scale = dev_alloc(sizeof w_scale);
  for (int r = 0; r < ROUTINGS; r++) e->d_offsets[r] = dev_alloc((EXPERTS + 1) * sizeof(int32_t));
  INA_OK(ina_bench_fill_random_bf16(e->w16_all, (size_t)(EXPERTS * n * k), 7, 0.05f));
  INA_OK(ina_bench_fill_random_bf16(e->x16, (size_t)(MAX_ROWS * k), 8, 2.0f));
  INA_OK(ina_cuda_fp8_quantize_blocks(e->x16, MAX_ROWS, k, 1, 128, e->x8, e->x_scale, NULL));
  for (int g = 0; g < EXPERTS; g++) {
    w16[g] = e->w16_all + g * n * k;
    w8[g] = e->w8_all + g * n * k;
    w_scale[g] = e->w_scale_all + g * ws;
    INA_OK(ina_cuda_fp8_quantize_blocks(e->w16_all + g * n * k, n, k, 128, 128,
                                        e->w8_all + g * n * k, raw, NULL));
    CUDA_OK(cudaMemcpy(rows, raw, (size_t)(nb * kb) * sizeof(float), cudaMemcpyDeviceToHost));
    INA_OK(ina_gemm_pack_w_scales(rows, n, k, packed));
    CUDA_OK(cudaMemcpy((void *)w_scale[g], packed, (size_t)ws * 4, cudaMemcpyHostToDevice));
  }
  CUDA_OK(cudaMemcpy(e->d_w16, w16, sizeof w16, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(e->d_w8, w8, sizeof w8, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(e->d_w_scale, w_scale, sizeof w_scale, cudaMemcpyHostToDevice));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaFree(raw));
  free(rows), free(packed);
}

typedef struct w8_job {
  const experts_t *e;
  int64_t q_diff[EXPERTS], s_diff[EXPERTS];
  ina_status_t status[EXPERTS];
} w8_job_t;

static void w8_experts(void *ctx, int64_t begin, int64_t end, int worker) {
  (void)worker;
  w8_job_t *j = ctx;
  const experts_t *e = j->e;
  for (int64_t g = begin; g < end; g++)
    j->status[g] = ina_bench_gemm_w8_diff(e->n, e->k, e->h_w16_ptrs[g], e->h_w8_ptrs[g],
                                          e->h_w_scale_ptrs[g], &j->q_diff[g], &j->s_diff[g]);
}

/* Reads back what the runs read and checks the FP8 operands bit for bit against the host
 * quantization of the bf16 ones. */
static void experts_check_make(experts_t *e, ina_threadpool_t *pool) {
  const int64_t n = e->n, k = e->k, kb = (k + 127) / 128, ws = ina_gemm_w_scale_count(n, k);
  const size_t w_elems = (size_t)(EXPERTS * n * k);
  char what[96];
  e->h_x16 = malloc((size_t)(MAX_ROWS * k) * 2);
  e->h_x8 = malloc((size_t)(MAX_ROWS * k));
  e->h_x_scale = malloc((size_t)(MAX_ROWS * kb) * sizeof(float));
  e->h_w16 = malloc(w_elems * 2);
  e->h_w8 = malloc(w_elems);
  e->h_w_scale = malloc((size_t)(EXPERTS * ws) * sizeof(float));
  e->h_y = malloc((size_t)(MAX_ROWS * n) * 2);
  if (!e->h_x16 || !e->h_x8 || !e->h_x_scale || !e->h_w16 || !e->h_w8 || !e->h_w_scale || !e->h_y) {
    fprintf(stderr, "bench_gemm_grouped: out of memory for the checks\n");
    exit(1);
  }
  CUDA_OK(cudaMemcpy(e->h_x16, e->x16, (size_t)(MAX_ROWS * k) * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(e->h_x8, e->x8, (size_t)(MAX_ROWS * k), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(e->h_x_scale, e->x_scale, (size_t)(MAX_ROWS * kb) * sizeof(float),
                     cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(e->h_w16, e->w16_all, w_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(e->h_w8, e->w8_all, w_elems, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(e->h_w_scale, e->w_scale_all, (size_t)(EXPERTS * ws) * sizeof(float),
                     cudaMemcpyDeviceToHost));
  for (int g = 0; g < EXPERTS; g++) {
    e->h_w16_ptrs[g] = e->h_w16 + g * n * k;
    e->h_w8_ptrs[g] = e->h_w8 + g * n * k;
    e->h_w_scale_ptrs[g] = e->h_w_scale + g * ws;
  }
  int64_t q_diff = 0, s_diff = 0, first = -1;
  snprintf(what, sizeof what, "grouped_fp8_n%lld_k%lld_activations", (long long)n, (long long)k);
  if (ina_bench_fp8_blocks_diff(e->h_x16, MAX_ROWS, k, 1, e->h_x8, e->h_x_scale, &q_diff, &s_diff,
                                &first) != INA_OK)
    e->quantized_ok = ina_bench_check_failed(what, "%s", ina_last_error());
  else if (q_diff || s_diff)
    e->quantized_ok = ina_bench_check_failed(
        what, "%lld bytes (first %lld) and %lld scales differ from ina_fp8_quantize_blocks",
        (long long)q_diff, (long long)first, (long long)s_diff);
  else
    e->quantized_ok = ina_bench_check(what, "fp8_bytes_and_scales_differing", 0, 0);
  w8_job_t *job = calloc(1, sizeof *job);
  if (!job) exit(1);
  job->e = e;
  ina_parallel_for(pool, EXPERTS, 1, w8_experts, job);
  q_diff = s_diff = 0;
  int bad_status = 0;
  for (int g = 0; g < EXPERTS; g++) {
    bad_status |= job->status[g] != INA_OK;
    q_diff += job->q_diff[g], s_diff += job->s_diff[g];
  }
  snprintf(what, sizeof what, "grouped_fp8_n%lld_k%lld_weights", (long long)n, (long long)k);
  int ok;
  if (bad_status)
    ok = ina_bench_check_failed(what, "weight quantization reference failed");
  else if (q_diff || s_diff)
    ok = ina_bench_check_failed(what,
                                "%lld bytes and %lld scales of the %d experts differ from "
                                "ina_fp8_quantize_blocks",
                                (long long)q_diff, (long long)s_diff, EXPERTS);
  else
    ok = ina_bench_check(what, "fp8_bytes_and_scales_differing", 0, 0);
  e->quantized_ok &= ok;
  free(job);
}

static void experts_free(experts_t *e) {
  void *ptrs[] = {e->w16_all, e->x16,    e->y,     e->w8_all,    e->x8,
                  e->w_scale_all, e->x_scale, e->d_w16, e->d_w8, e->d_w_scale};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) CUDA_OK(cudaFree(ptrs[i]));
  for (int r = 0; r < ROUTINGS; r++) CUDA_OK(cudaFree(e->d_offsets[r]));
  free(e->h_x16), free(e->h_x8), free(e->h_x_scale);
  free(e->h_w16), free(e->h_w8), free(e->h_w_scale), free(e->h_y);
}

typedef struct grouped_run {
  const experts_t *e;
  const ina_gemm_grouped_args_t *a;
  const ina_gemm_grouped_tiles_t *tiles;
} grouped_run_t;

/* Run i of a graph: rotate over the routings. */
static ina_status_t enqueue_grouped(void *ctx, int64_t i, void *stream) {
  const grouped_run_t *r = ctx;
  ina_gemm_grouped_args_t run = *r->a;
  run.offsets = r->e->d_offsets[i % ROUTINGS];
  run.stream = stream;
  return r->tiles ? ina_gemm_grouped_run_tiles(&run, r->tiles) : ina_gemm_grouped_run(&run);
}

/* Median milliseconds per run of `a` with `tiles` (NULL: ina_gemm_grouped_run's own), the
 * runs rotating over the routings, from graph replays. */
static double time_runs(const experts_t *e, const ina_gemm_grouped_args_t *a,
                        const ina_gemm_grouped_tiles_t *tiles, cudaStream_t stream) {
  const grouped_run_t run = {e, a, tiles};
  const ina_bench_timing_t timing = {WARMUP_REPLAYS, TIMED_REPLAYS, 1};
  double per_run = 0.0;
  INA_OK(ina_bench_time_graph_ms(enqueue_grouped, (void *)&run, RUNS_PER_GRAPH, &timing, stream,
                                 &per_run));
  return per_run;
}

static char g_table[256][160];
static int g_table_rows = 0;

/* One run of `run` with the first routing into a poisoned output, against the reference.
 * Returns 1 when the case may be timed. */
static int check_case(const char *what, const grouped_run_t *run,
                      const ina_bench_grouped_ref_t *ref, cudaStream_t stream) {
  const experts_t *e = run->e;
  const int64_t y_rows = ref->routed < MAX_ROWS ? ref->routed + 1 : ref->routed;
  CUDA_OK(cudaMemsetAsync(e->y, 0xFF, (size_t)(y_rows * e->n) * 2, stream));
  const ina_status_t st = enqueue_grouped((void *)run, 0, stream);
  if (st != INA_OK) return ina_bench_check_failed(what, "the run failed: %s", ina_last_error());
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(e->h_y, e->y, (size_t)(y_rows * e->n) * 2, cudaMemcpyDeviceToHost));
  return ina_bench_grouped_check_y(what, ref, e->h_y, y_rows);
}

static void bench_one(const experts_t *e, int fp8, int64_t tokens, double ceiling_tbs,
                      int sm_count, ina_threadpool_t *pool, cudaStream_t stream) {
  int32_t offsets[EXPERTS + 1], first_offsets[EXPERTS + 1];
  double active = 0;
  for (int r = 0; r < ROUTINGS; r++) {
    active += route(tokens, offsets) / (double)ROUTINGS;
    CUDA_OK(cudaMemcpy(e->d_offsets[r], offsets, sizeof offsets, cudaMemcpyHostToDevice));
    if (r == 0) memcpy(first_offsets, offsets, sizeof offsets);
  }
  const int64_t rows = tokens * TOP_K, n = e->n, k = e->k, kb = (k + 127) / 128;
  ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
  a.mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
  a.num_groups = EXPERTS, a.max_rows = rows, a.n = n, a.k = k;
  a.x = fp8 ? (const void *)e->x8 : (const void *)e->x16;
  a.x_scale = e->x_scale;
  a.w = fp8 ? e->d_w8 : e->d_w16;
  a.w_scale = e->d_w_scale;
  a.y = e->y;
  /* The reference of the first routing, on host copies of the same operands. */
  ina_gemm_grouped_args_t host = a;
  host.offsets = first_offsets;
  host.x = fp8 ? (const void *)e->h_x8 : (const void *)e->h_x16;
  host.x_scale = e->h_x_scale;
  host.w = fp8 ? e->h_w8_ptrs : e->h_w16_ptrs;
  host.w_scale = e->h_w_scale_ptrs;
  host.y = e->h_y;
  ina_bench_grouped_ref_t ref;
  uint64_t sample_state = 0x6A0Full + (uint64_t)tokens;
  char case_name[96];
  snprintf(case_name, sizeof case_name, "grouped_%s_t%lld_n%lld_k%lld", fp8 ? "fp8" : "bf16",
           (long long)tokens, (long long)n, (long long)k);
  int ref_ok = 1;
  if (fp8 && !e->quantized_ok)
    ref_ok = ina_bench_check_failed(case_name, "its FP8 operands failed their check");
  else if (ina_bench_grouped_ref_init(&ref, &host, CHECK_ROWS, &sample_state, pool) != INA_OK)
    ref_ok = ina_bench_check_failed(case_name, "reference: %s", ina_last_error());
  const double esize = fp8 ? 1 : 2;
  double bytes = active * (double)(n * k) * esize + rows * (double)k * esize + rows * (double)n * 2;
  if (fp8) bytes += 4.0 * (active * (double)ina_gemm_w_scale_count(n, k) + rows * (double)kb);

  /* The launches: the one before narrower tiles existed, every decode tile with weight
   * tiles fastest, then the picked one ("auto"). */
  ina_gemm_grouped_tiles_t picked, tiles[5];
  int num_tiles = 0;
  INA_OK(ina_gemm_grouped_tiles(rows, EXPERTS, n, fp8, sm_count, &picked));
  if (tokens > DECODE_MAX_TOKENS && tokens < MAX_TOKENS) {
    /* Larger decode batches: the two tile heights side by side. */
    INA_OK(ina_gemm_grouped_tiles_fixed(rows, EXPERTS, n, 16, 128, &tiles[num_tiles++]));
    INA_OK(ina_gemm_grouped_tiles_fixed(rows, EXPERTS, n, 64, 128, &tiles[num_tiles++]));
  } else if (tokens <= DECODE_MAX_TOKENS && picked.tile_m == 16) {
    INA_OK(ina_gemm_grouped_tiles_fixed(rows, EXPERTS, n, 16, 128, &tiles[num_tiles]));
    tiles[num_tiles].m_slots = (rows + EXPERTS * 15) / 16;
    tiles[num_tiles++].n_fastest = 0;
    for (int32_t tn = 128; tn >= 32; tn /= 2)
      INA_OK(ina_gemm_grouped_tiles_fixed(rows, EXPERTS, n, 16, tn, &tiles[num_tiles++]));
  }
  for (int v = 0; ref_ok && v <= num_tiles; v++) {
    const int is_auto = v == num_tiles;
    const ina_gemm_grouped_tiles_t *t = is_auto ? &picked : &tiles[v];
    char name[128], formula[256], tile[32];
    if (is_auto)
      snprintf(tile, sizeof tile, "auto");
    else
      snprintf(tile, sizeof tile, "tile%dx%d%s", t->tile_m, t->tile_n,
               t->n_fastest || t->tile_m != 16 ? "" : "_before");
    snprintf(name, sizeof name, "grouped_%s_t%lld_n%lld_k%lld_%s", fp8 ? "fp8" : "bf16",
             (long long)tokens, (long long)n, (long long)k, tile);
    const grouped_run_t first = {e, &a, is_auto ? NULL : t};
    if (!check_case(name, &first, &ref, stream)) {
      if (g_table_rows < (int)(sizeof g_table / sizeof g_table[0]))
        snprintf(g_table[g_table_rows++], sizeof g_table[0],
                 "%-4s %6lld %5lldx%-5lld %-4s %2dx%-3d %-5s %10s", fp8 ? "fp8" : "bf16",
                 (long long)tokens, (long long)n, (long long)k, is_auto ? "auto" : "", t->tile_m,
                 t->tile_n, t->n_fastest ? "n" : "slots", "failed");
      continue;
    }
    const double ms = time_runs(e, &a, is_auto ? NULL : t, stream);
    const double tbs = bytes / (ms * 1e-3) / 1e12, tflops = 2.0 * rows * n * k / (ms * 1e-3) / 1e12;
    snprintf(formula, sizeof formula,
             "%lld rows over %.1f experts (mean of %d routings), tile %d x %d, %s fastest; median "
             "of graph replay time / %d runs",
             (long long)rows, active, ROUTINGS, t->tile_m, t->tile_n,
             t->n_fastest ? "weight tiles" : "slots", RUNS_PER_GRAPH);
    ina_bench_result(name, ms * 1e3, "us", formula);
    snprintf(formula, sizeof formula,
             "(W of %.1f experts + x + y%s) / time = %.1f MB / time; %.3f of the read ceiling",
             active, fp8 ? " + scales" : "", bytes / 1e6, ceiling_tbs > 0 ? tbs / ceiling_tbs : 0);
    snprintf(name, sizeof name, "grouped_%s_t%lld_n%lld_k%lld_%s_bw", fp8 ? "fp8" : "bf16",
             (long long)tokens, (long long)n, (long long)k, tile);
    ina_bench_result(name, tbs, "TB/s", formula);
    snprintf(name, sizeof name, "grouped_%s_t%lld_n%lld_k%lld_%s_flops", fp8 ? "fp8" : "bf16",
             (long long)tokens, (long long)n, (long long)k, tile);
    ina_bench_result(name, tflops, "TFLOP/s", "2 rows n k / time");
    if (g_table_rows < (int)(sizeof g_table / sizeof g_table[0]))
      snprintf(g_table[g_table_rows++], sizeof g_table[0],
               "%-4s %6lld %5lldx%-5lld %-4s %2dx%-3d %-5s %10.2f %8.3f %8.3f %8.1f",
               fp8 ? "fp8" : "bf16", (long long)tokens, (long long)n, (long long)k,
               is_auto ? "auto" : "", t->tile_m, t->tile_n, t->n_fastest ? "n" : "slots", ms * 1e3,
               tbs,
               ceiling_tbs > 0 ? tbs / ceiling_tbs : 0, tflops);
  }
  if (ref_ok) ina_bench_grouped_ref_free(&ref);
}

int main(void) {
  if (ina_bench_no_device("bench_gemm_grouped")) return INA_BENCH_SKIP;
  const double ceiling = ina_bench_read_ceiling_tbs();
  ina_bench_result("read_ceiling", ceiling, "TB/s", "read-only reduction (bench/bench_util.h)");
  int device = 0, sm_count = 0;
  cudaStream_t stream;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ina_threadpool_t *pool = NULL; /* the CPU references */
  INA_OK(ina_threadpool_create(0, &pool));
  static const int64_t shapes[][2] = {{1408, 2048}, {2816, 2048}, {2048, 1408}};
  static const int64_t tokens[] = {1, 8, DECODE_MAX_TOKENS, 128, 256, MAX_TOKENS};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    experts_t e;
    experts_make(&e, shapes[s][0], shapes[s][1]);
    experts_check_make(&e, pool);
    for (int fp8 = 1; fp8 >= 0; fp8--)
      for (size_t t = 0; t < sizeof tokens / sizeof tokens[0]; t++)
        bench_one(&e, fp8, tokens[t], ceiling, sm_count, pool, stream);
    experts_free(&e);
  }
  printf("\n%-4s %6s %-11s %-4s %-6s %-5s %10s %8s %8s %8s   (read ceiling %.3f TB/s)\n",
         "mode", "tokens", "n x k", "", "tile", "order", "time us", "TB/s", "/ceiling", "TFLOP/s",
         ceiling);
  for (int r = 0; r < g_table_rows; r++) printf("%s\n", g_table[r]);
  ina_bench_print_json("bench_gemm_grouped");
  CUDA_OK(cudaStreamDestroy(stream));
  ina_threadpool_destroy(pool);
  const int failed = ina_bench_checks_failed(), run = ina_bench_checks_run();
  printf("checks: %d of %d passed%s\n", run - failed, run,
         failed ? "; the failed cases have no figures" : "");
  return failed ? 1 : 0;
}
