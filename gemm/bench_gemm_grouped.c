/* Throughput of the grouped expert GEMM (gemm/gemm_grouped.h) on DeepSeek-V2-Lite's routed
 * experts: 64 experts, top-6 routing, expert weights n x k = 1408 x 2048 (gate or up),
 * 2816 x 2048 (gate and up fused) and 2048 x 1408 (down), bf16 and block-scaled FP8, at
 * 8 and 64 tokens (decode: 48 and 384 rows) and 1024 tokens (prefill: 6144 rows).
 *
 * Routing: each token picks 6 distinct experts uniformly at random (fixed seed); the rows
 * come sorted by expert, offsets on the device.
 * Figures per (mode, tokens, n, k):
 *   time     median over 7 batches of 20 back-to-back runs (after 3 warm-up batches) of
 *            batch time / 20, CUDA events (bench/bench_util.h).
 *   TB/s     (W bytes of the experts that received rows + x bytes + y bytes [+ fp32
 *            scales]) / time: the bytes the GEMM must move at least; with its ratio to the
 *            read ceiling measured in the same run.
 *   TFLOP/s  2 rows n k / time.
 * Every expert's weights together (FP8 at least 184 MB) exceed the 50 MB L2 several times
 * over, so back-to-back runs do not find them in L2. Inputs are random, never zeros: bf16
 * from ina_bench_fill_random_bf16, FP8 quantized from it on the GPU (weights 128 x 128,
 * their scales packed by ina_gemm_pack_w_scales; activations 1 x 128, row-major).
 *
 * Usage: bench_gemm_grouped (exit 0 on success, 77 without a device). */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/cuda.h"
#include "core/fp8_quant.h"
#include "core/log.h"
#include "gemm/gemm.h"
#include "gemm/gemm_grouped.h"

#define EXPERTS 64
#define TOP_K 6
#define MAX_TOKENS 1024
#define MAX_ROWS (MAX_TOKENS * TOP_K)

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

/* Top-6 of 64 experts per token, uniformly: offsets[e] = rows of experts below e. Returns
 * how many experts received rows. */
static int route(int64_t tokens, int32_t *offsets) {
  static uint64_t state = 42;
  int64_t count[EXPERTS] = {0};
  for (int64_t t = 0; t < tokens; t++) {
    int chosen[TOP_K];
    for (int i = 0; i < TOP_K; i++) {
      int e, dup;
      do {
        e = (int)(next_random(&state) % EXPERTS), dup = 0;
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
  int32_t *d_offsets;
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
  e->d_offsets = dev_alloc((EXPERTS + 1) * sizeof(int32_t));
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

static void experts_free(experts_t *e) {
  void *ptrs[] = {e->w16_all, e->x16,    e->y,     e->w8_all,    e->x8,       e->w_scale_all,
                  e->x_scale, e->d_w16, e->d_w8, e->d_w_scale, e->d_offsets};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) CUDA_OK(cudaFree(ptrs[i]));
}

static ina_status_t enqueue(void *ctx, int64_t iteration, void *stream) {
  ina_gemm_grouped_args_t a = *(const ina_gemm_grouped_args_t *)ctx;
  (void)iteration;
  a.stream = stream;
  return ina_gemm_grouped_run(&a);
}

static void bench_one(const experts_t *e, int fp8, int64_t tokens, double ceiling_tbs) {
  int32_t offsets[EXPERTS + 1];
  const int active = route(tokens, offsets);
  const int64_t rows = offsets[EXPERTS], n = e->n, k = e->k, kb = (k + 127) / 128;
  CUDA_OK(cudaMemcpy(e->d_offsets, offsets, sizeof offsets, cudaMemcpyHostToDevice));
  ina_gemm_grouped_args_t a = INA_GEMM_GROUPED_ARGS_INIT;
  a.mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
  a.num_groups = EXPERTS, a.max_rows = rows, a.n = n, a.k = k;
  a.offsets = e->d_offsets;
  a.x = fp8 ? (const void *)e->x8 : (const void *)e->x16;
  a.x_scale = e->x_scale;
  a.w = fp8 ? e->d_w8 : e->d_w16;
  a.w_scale = e->d_w_scale;
  a.y = e->y;
  const ina_bench_timing_t timing = {3, 7, 20};
  double ms = 0;
  INA_OK(ina_bench_time_ms(enqueue, &a, &timing, &ms));
  const double esize = fp8 ? 1 : 2;
  double bytes = active * (double)(n * k) * esize + rows * (double)k * esize + rows * (double)n * 2;
  if (fp8)
    bytes += 4.0 * (active * (double)ina_gemm_w_scale_count(n, k) + rows * (double)kb);
  const double tbs = bytes / (ms * 1e-3) / 1e12, tflops = 2.0 * rows * n * k / (ms * 1e-3) / 1e12;
  char name[128], formula[256];
  snprintf(name, sizeof name, "grouped_%s_t%lld_n%lld_k%lld", fp8 ? "fp8" : "bf16",
           (long long)tokens, (long long)n, (long long)k);
  snprintf(formula, sizeof formula,
           "%lld rows over %d experts; median of batch time / 20 runs", (long long)rows, active);
  ina_bench_result(name, ms * 1e3, "us", formula);
  snprintf(formula, sizeof formula,
           "(W of %d experts + x + y%s) / time = %.1f MB / time; %.2f of the read ceiling",
           active, fp8 ? " + scales" : "", bytes / 1e6, ceiling_tbs > 0 ? tbs / ceiling_tbs : 0);
  snprintf(name, sizeof name, "grouped_%s_t%lld_n%lld_k%lld_bw", fp8 ? "fp8" : "bf16",
           (long long)tokens, (long long)n, (long long)k);
  ina_bench_result(name, tbs, "TB/s", formula);
  snprintf(name, sizeof name, "grouped_%s_t%lld_n%lld_k%lld_flops", fp8 ? "fp8" : "bf16",
           (long long)tokens, (long long)n, (long long)k);
  ina_bench_result(name, tflops, "TFLOP/s", "2 rows n k / time");
}

int main(void) {
  if (ina_bench_no_device("bench_gemm_grouped")) return INA_BENCH_SKIP;
  const double ceiling = ina_bench_read_ceiling_tbs();
  ina_bench_result("read_ceiling", ceiling, "TB/s", "read-only reduction (bench/bench_util.h)");
  static const int64_t shapes[][2] = {{1408, 2048}, {2816, 2048}, {2048, 1408}};
  static const int64_t tokens[] = {8, 64, MAX_TOKENS};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    experts_t e;
    experts_make(&e, shapes[s][0], shapes[s][1]);
    for (int fp8 = 1; fp8 >= 0; fp8--)
      for (size_t t = 0; t < sizeof tokens / sizeof tokens[0]; t++)
        bench_one(&e, fp8, tokens[t], ceiling);
    experts_free(&e);
  }
  ina_bench_print_json("bench_gemm_grouped");
  return 0;
}
