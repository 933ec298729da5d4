/* INA_ENGINE_NUMERICS_GPU: the CPU engine rounding where the CUDA engine rounds.
 *
 * The CUDA engine (engine_gpu.c, engine_gpu_weights.c) keeps every activation between
 * ops in bf16 and accumulates in fp32 inside them. Its rules, mirrored here:
 *   - weights: bf16 as stored, f32 rounded to bf16 at upload; an FP8 e4m3 weight with
 *     128 x 128 scales stays FP8 when its GEMM takes it (N and K multiples of 16, and not
 *     kv_b_proj, which the absorption reads as bf16), else it is dequantized on the
 *     device as bf16(e4m3 * scale); norm weights f32 (kv_a_layernorm bf16); the router
 *     f32 (split into bf16 hi + lo, exact to 2^-17);
 *   - an FP8 GEMM quantizes its input rows to e4m3 with one scale per 1 x 128 block
 *     (ina_fp8_quantize_blocks' rule) and multiplies the dequantized values;
 *   - every op's output is rounded to bf16 but the router logits and the LM head's
 *     logits, which stay fp32.
 * What is not mirrored is the order of fp32 sums and the kernels' fp32 intrinsics (the
 * oracle's error model, tests/model/oracle.h, accounts for those). */
#define INA_LOG_SUBSYS "model"
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/dtype.h"
#include "model/cpu_ops.h"
#include "model/engine_cpu_numerics.h"

void ina_cpu_round_bf16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = ina_bf16_to_f32(ina_f32_to_bf16(x[i]));
}

int ina_cpu_gpu_takes_fp8(const ina_linear_t *lin, int allow_fp8) {
  return allow_fp8 && lin->weight.dtype == INA_DTYPE_FP8_E4M3 && lin->weight.shape[0] % 16 == 0 &&
         lin->weight.shape[1] % 16 == 0;
}

void ina_cpu_gpu_weight_row(const ina_linear_t *lin, int64_t n, int fp8_gemm, int transposed_scales, float *out) {
  const ina_tensor_t *w = &lin->weight;
  const int64_t k = w->shape[1];
  if (w->dtype != INA_DTYPE_FP8_E4M3) {
    ina_cpu_tensor_row(w, n, out);
    ina_cpu_round_bf16(out, k); /* f32 uploaded as bf16; bf16 unchanged */
    return;
  }
  ina_cpu_tensor_row(w, n, out);
  /* Scale block (i, j) of the grid [rows_b, cols_b]; the mutation reads block (j, i)
   * where that exists. */
  const int64_t rows_b = lin->scale_inv.shape[0], cols_b = lin->scale_inv.shape[1];
  const float *scales = (const float *)lin->scale_inv.data;
  const int64_t i = n / lin->block_rows;
  for (int64_t c = 0; c < k; c++) {
    const int64_t j = c / lin->block_cols;
    const int swap = transposed_scales && j < rows_b && i < cols_b;
    out[c] *= swap ? scales[j * cols_b + i] : scales[i * cols_b + j];
  }
  if (!fp8_gemm) ina_cpu_round_bf16(out, k); /* dequantized to bf16 on the device */
}

typedef struct gpu_linear_job {
  const ina_linear_t *lin;
  const float *x; /* [m, k], already as the GPU's GEMM reads it */
  int64_t m, k, n;
  int fp8, transposed_scales;
  float *y;
  float *scratch; /* [workers, k] */
} gpu_linear_job_t;

static void gpu_linear_rows(void *ctx, int64_t begin, int64_t end, int worker) {
  const gpu_linear_job_t *j = ctx;
  float *row = j->scratch + (size_t)worker * (size_t)j->k;
  for (int64_t n = begin; n < end; n++) {
    ina_cpu_gpu_weight_row(j->lin, n, j->fp8, j->transposed_scales, row);
    for (int64_t i = 0; i < j->m; i++) j->y[i * j->n + n] = ina_cpu_dot(j->x + i * j->k, row, j->k);
  }
}

ina_status_t ina_cpu_gpu_linear(ina_threadpool_t *pool, const ina_linear_t *lin, const float *x, int64_t m,
                                float *y, const ina_cpu_gpu_linear_opts_t *o) {
  ina_status_t st = INA_OK;
  const int64_t n = lin->weight.shape[0], k = lin->weight.shape[1];
  gpu_linear_job_t job = {lin, x, m, k, n, ina_cpu_gpu_takes_fp8(lin, o->allow_fp8), o->transposed_scales, y, NULL};
  float *xq = NULL;
  uint8_t *q = NULL;
  float *xs = NULL;
  INA_REQUIRE(lin->weight.ndim == 2 && lin->weight.data && ina_tensor_is_empty(&lin->bias), INA_ERR_INVALID_ARGUMENT,
              "linear (gpu numerics): weight is not a loaded 2-D tensor without bias");
  if (m == 0 || n == 0) return INA_OK;
  if (job.fp8) {
    /* The activations as the FP8 GEMM sees them: e4m3 with a scale per 1 x 128 block. */
    const int64_t blocks = (k + 127) / 128;
    xq = malloc((size_t)(m * k) * sizeof *xq);
    q = malloc((size_t)(m * k));
    xs = malloc((size_t)(m * blocks) * sizeof *xs);
    INA_CHECK_ALLOC(xq);
    INA_CHECK_ALLOC(q);
    INA_CHECK_ALLOC(xs);
    INA_CHECK(ina_fp8_quantize_blocks(x, m, k, 1, 128, q, xs));
    INA_CHECK(ina_fp8_dequantize_blocks(q, xs, m, k, 1, 128, xq));
    job.x = xq;
  }
  const int workers = ina_threadpool_size(pool);
  job.scratch = malloc((size_t)workers * (size_t)k * sizeof(float));
  INA_CHECK_ALLOC(job.scratch);
  {
    int64_t grain = 4096 / k;
    ina_parallel_for(pool, n, grain < 1 ? 1 : grain, gpu_linear_rows, &job);
  }
  if (!o->f32_out) ina_cpu_round_bf16(y, m * n);
fail:
  free(job.scratch);
  free(xq);
  free(q);
  free(xs);
  return st;
}
