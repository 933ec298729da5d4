/* Timing of the absorption GEMMs (mla/mla_absorb.h) at DeepSeek-V3's shapes (128 heads,
 * nope 128, v 128, kv_lora_rank 512) for 1, 64, 128 and 1024 tokens, and a probe of what
 * cuBLASLt offers for block-scaled FP8 on this device.
 *
 * Figures:
 *   FLOPs  absorb_q: 2 T H nope C;  absorb_v: 2 T H C v.
 *   bytes  the weight half read once (H nope C or H v C bf16) + input + output, bf16.
 *   ceiling: a device-to-device cudaMemcpy of 1 GiB in the same run, read + write bytes.
 * Each figure is the median over 30 samples of 10 back-to-back calls timed with CUDA
 * events, after warm-up; the calls rotate over 8 weight copies (256 MiB, past the 50 MiB
 * L2) and 4 input/output sets. Inputs are random bf16, never zeros.
 *
 * Usage: bench_mla_absorb (prints a table; exit 0 on success, 77 without a device). */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/log.h"
#include "core/status.h"
#include "mla/mla_absorb.h"

#define H 128
#define NOPE 128
#define V 128
#define ROPE 64
#define C 512
#define WEIGHT_COPIES 8
#define IO_SETS 4
#define SAMPLES 30
#define CALLS_PER_SAMPLE 10

#define CUDA_OK(call)                                                                              \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) {                                                                       \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));       \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

#define INA_OK_OR_DIE(call)                                                                        \
  do {                                                                                             \
    ina_status_t s_ = (call);                                                                      \
    if (s_ != INA_OK) {                                                                            \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, ina_last_error());             \
      exit(1);                                                                                     \
    }                                                                                              \
  } while (0)

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;
static float rng_normalish(void) { /* sum of 4 uniforms, centred: cheap and not zero */
  float s = 0;
  for (int i = 0; i < 4; i++) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    s += (float)(rng_state >> 40) / (float)(1 << 24);
  }
  return (s - 2.0f) * 1.7f;
}

static void *device_random_bf16(size_t elems, float scale) {
  uint16_t *host = malloc(elems * 2);
  void *dev = NULL;
  if (!host) exit(1);
  for (size_t i = 0; i < elems; i++) host[i] = ina_f32_to_bf16(scale * rng_normalish());
  CUDA_OK(cudaMalloc(&dev, elems * 2));
  CUDA_OK(cudaMemcpy(dev, host, elems * 2, cudaMemcpyHostToDevice));
  free(host);
  return dev;
}

static int compare_float(const void *a, const void *b) {
  const float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

static float median(float *v, int n) {
  qsort(v, (size_t)n, sizeof *v, compare_float);
  return v[n / 2];
}

/* Read + write bandwidth of a 1 GiB device-to-device copy, in bytes per second. */
static double copy_ceiling(void) {
  const size_t bytes = (size_t)1 << 30;
  void *a = NULL, *b = NULL;
  cudaEvent_t e0, e1;
  float ms[9];
  CUDA_OK(cudaMalloc(&a, bytes));
  CUDA_OK(cudaMalloc(&b, bytes));
  CUDA_OK(cudaMemset(a, 0x3C, bytes));
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  CUDA_OK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  for (int i = 0; i < 9; i++) {
    CUDA_OK(cudaEventRecord(e0, 0));
    CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
    CUDA_OK(cudaEventRecord(e1, 0));
    CUDA_OK(cudaEventSynchronize(e1));
    CUDA_OK(cudaEventElapsedTime(&ms[i], e0, e1));
  }
  CUDA_OK(cudaFree(a));
  CUDA_OK(cudaFree(b));
  CUDA_OK(cudaEventDestroy(e0));
  CUDA_OK(cudaEventDestroy(e1));
  return 2.0 * (double)bytes / (median(ms, 9) * 1e-3);
}

typedef struct io_set {
  uint16_t *q, *q_abs, *o, *out;
} io_set_t;

static void time_tokens(const ina_mla_absorb_t *a, uint16_t **weights, int32_t T, double ceiling) {
  io_set_t io[IO_SETS];
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  for (int i = 0; i < IO_SETS; i++) {
    io[i].q = device_random_bf16((size_t)T * H * (NOPE + ROPE), 1.0f);
    io[i].o = device_random_bf16((size_t)T * H * C, 1.0f);
    CUDA_OK(cudaMalloc((void **)&io[i].q_abs, (size_t)T * H * C * 2));
    CUDA_OK(cudaMalloc((void **)&io[i].out, (size_t)T * H * V * 2));
  }
  for (int op = 0; op < 2; op++) {
    float ms[SAMPLES];
    int call = 0;
    for (int s = -1; s < SAMPLES; s++) { /* sample -1 is the warm-up */
      CUDA_OK(cudaEventRecord(e0, 0));
      for (int k = 0; k < CALLS_PER_SAMPLE; k++, call++) {
        const uint16_t *w = weights[call % WEIGHT_COPIES];
        const io_set_t *x = &io[call % IO_SETS];
        if (op == 0)
          INA_OK_OR_DIE(ina_mla_absorb_q(a, w, T, x->q, (int64_t)H * (NOPE + ROPE), NOPE + ROPE,
                                         x->q_abs, (int64_t)H * C, C, NULL));
        else
          INA_OK_OR_DIE(
              ina_mla_absorb_v(a, w, T, x->o, (int64_t)H * C, C, x->out, (int64_t)H * V, V, NULL));
      }
      CUDA_OK(cudaEventRecord(e1, 0));
      CUDA_OK(cudaEventSynchronize(e1));
      if (s >= 0) CUDA_OK(cudaEventElapsedTime(&ms[s], e0, e1));
    }
    const double seconds = median(ms, SAMPLES) * 1e-3 / CALLS_PER_SAMPLE;
    const int64_t out_row = op == 0 ? C : V, in_row = op == 0 ? NOPE : C;
    const double flops = 2.0 * T * H * (double)NOPE * C; /* nope == v: same for both */
    const double bytes =
        2.0 * ((double)H * in_row * out_row + (double)T * H * in_row + (double)T * H * out_row);
    printf("%-8s %6d %10.2f %10.1f %10.0f %8.1f%%\n", op == 0 ? "W_UK" : "W_UV", T, seconds * 1e6,
           flops / seconds * 1e-12, bytes / seconds * 1e-9, 100.0 * bytes / seconds / ceiling);
  }
  for (int i = 0; i < IO_SETS; i++) {
    CUDA_OK(cudaFree(io[i].q));
    CUDA_OK(cudaFree(io[i].o));
    CUDA_OK(cudaFree(io[i].q_abs));
    CUDA_OK(cudaFree(io[i].out));
  }
  CUDA_OK(cudaEventDestroy(e0));
  CUDA_OK(cudaEventDestroy(e1));
}

/* ---- cuBLASLt block-scaled FP8 probe ------------------------------------------------ */

/* One FP8 e4m3 GEMM D[m, n] = op(A) . B in cuBLASLt's column-major terms, K = k: A scaled
 * per 128x128 block, B per 128 values along K, D bf16. Prints whether the heuristic finds
 * an algorithm and whether a launch succeeds (not its numerics). */
static void probe_fp8(cublasLtHandle_t lt, const char *what, cublasOperation_t trans_a, int m,
                      int n, int k, int batch) {
  cublasLtMatmulDesc_t desc = NULL;
  cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t result[4];
  int found = 0;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const size_t ws_bytes = (size_t)32 << 20;
  const int64_t a_rows = trans_a == CUBLAS_OP_T ? k : m, a_cols = trans_a == CUBLAS_OP_T ? m : k;
  const int64_t a_stride = a_rows * a_cols, b_stride = (int64_t)k * n, d_stride = (int64_t)m * n;
  void *A = NULL, *B = NULL, *D = NULL, *sa = NULL, *sb = NULL, *ws = NULL;
  const float alpha = 1.0f, beta = 0.0f;
  CUDA_OK(cudaMalloc(&A, (size_t)a_stride * batch));
  CUDA_OK(cudaMalloc(&B, (size_t)b_stride * batch));
  CUDA_OK(cudaMalloc(&D, (size_t)d_stride * batch * 2));
  CUDA_OK(cudaMalloc(&sa, (size_t)1 << 20));
  CUDA_OK(cudaMalloc(&sb, (size_t)1 << 20));
  CUDA_OK(cudaMalloc(&ws, ws_bytes));
  CUDA_OK(cudaMemset(A, 0x38, (size_t)a_stride * batch)); /* e4m3 1.0 */
  CUDA_OK(cudaMemset(B, 0x38, (size_t)b_stride * batch));
  CUDA_OK(cudaMemset(sa, 0, (size_t)1 << 20));
  CUDA_OK(cudaMemset(sb, 0, (size_t)1 << 20));
  cublasStatus_t s = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode,
                                       sizeof a_mode);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode,
                                       sizeof b_mode);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, (uint64_t)a_rows, (uint64_t)a_cols, a_rows);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, (uint64_t)m, (uint64_t)n, m);
  if (batch > 1) {
    cublasLtMatrixLayout_t layouts[3] = {la, lb, ld};
    const int64_t strides[3] = {a_stride, b_stride, d_stride};
    for (int i = 0; i < 3 && s == CUBLAS_STATUS_SUCCESS; i++) {
      s = cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                           sizeof batch);
      if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasLtMatrixLayoutSetAttribute(layouts[i],
                                             CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                             &strides[i], sizeof strides[i]);
    }
  }
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasLtMatmulPreferenceCreate(&pref);
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &ws_bytes, sizeof ws_bytes);
  if (s != CUBLAS_STATUS_SUCCESS) {
    printf("fp8 probe %-44s setup: %s\n", what, cublasLtGetStatusName(s));
  } else {
    s = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 4, result, &found);
    printf("fp8 probe %-44s heuristic: %s, %d algorithm(s)", what, cublasLtGetStatusName(s), found);
    if (s == CUBLAS_STATUS_SUCCESS && found > 0) {
      const cublasStatus_t r = cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld,
                                              &result[0].algo, ws, ws_bytes, 0);
      const cudaError_t e = cudaDeviceSynchronize();
      printf("; launch: %s, sync: %s", cublasLtGetStatusName(r), cudaGetErrorName(e));
    }
    printf("\n");
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (ld) cublasLtMatrixLayoutDestroy(ld);
  if (desc) cublasLtMatmulDescDestroy(desc);
  CUDA_OK(cudaFree(A));
  CUDA_OK(cudaFree(B));
  CUDA_OK(cudaFree(D));
  CUDA_OK(cudaFree(sa));
  CUDA_OK(cudaFree(sb));
  CUDA_OK(cudaFree(ws));
}

static void probe_fp8_support(void) {
  cublasLtHandle_t lt = NULL;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) {
    printf("fp8 probe: cublasLtCreate failed\n");
    return;
  }
  printf("cuBLASLt version %zu\n", cublasLtGetVersion());
  /* W_UV-like: A = weight [K=C, M=v] K-major (op T), B = activations [K, T]. */
  probe_fp8(lt, "TN 128x64x512, batch 1", CUBLAS_OP_T, V, 64, C, 1);
  probe_fp8(lt, "TN 128x64x512, strided batch 128", CUBLAS_OP_T, V, 64, C, H);
  probe_fp8(lt, "TN 256x256x512, batch 1", CUBLAS_OP_T, 256, 256, C, 1);
  /* W_UK as stored: A = weight [M=C, K=nope] M-major (op N). */
  probe_fp8(lt, "NN 512x64x128 (W_UK as stored), batch 1", CUBLAS_OP_N, C, 64, NOPE, 1);
  cublasLtDestroy(lt);
}

int main(void) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    printf("bench_mla_absorb: no CUDA device\n");
    return 77;
  }
  struct cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
         prop.l2CacheSize >> 20);
  const double ceiling = copy_ceiling();
  printf("copy ceiling (read + write): %.0f GB/s\n\n", ceiling * 1e-9);

  ina_mla_absorb_dims_t dims = INA_MLA_ABSORB_DIMS_INIT; /* H 128, nope 128, v 128, C 512 */
  dims.max_tokens = 1024;
  ina_mla_absorb_t *a = NULL;
  INA_OK_OR_DIE(ina_mla_absorb_create(&dims, &a));
  uint16_t *weights[WEIGHT_COPIES];
  for (int i = 0; i < WEIGHT_COPIES; i++)
    weights[i] = device_random_bf16((size_t)H * (NOPE + V) * C, 0.05f);
  printf("%-8s %6s %10s %10s %10s %9s\n", "gemm", "tokens", "us", "TFLOP/s", "GB/s", "of copy");
  static const int32_t tokens[] = {1, 64, 128, 1024};
  for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++)
    time_tokens(a, weights, tokens[i], ceiling);
  for (int i = 0; i < WEIGHT_COPIES; i++) CUDA_OK(cudaFree(weights[i]));
  ina_mla_absorb_destroy(a);
  printf("\n");
  probe_fp8_support();
  return 0;
}
