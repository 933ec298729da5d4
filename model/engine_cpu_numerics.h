/* The CPU engine's GPU-rounding arithmetic (INA_ENGINE_NUMERICS_GPU, rules in
 * engine_cpu_numerics.c). Internal to model/; reentrant. */
#ifndef INA_MODEL_ENGINE_CPU_NUMERICS_H
#define INA_MODEL_ENGINE_CPU_NUMERICS_H
#include <stdint.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "model/weights.h"

/* x[i] = bf16(x[i]), round to nearest even, in place. */
void ina_cpu_round_bf16(float *x, int64_t n);

/* Whether the CUDA engine multiplies this linear in FP8 (allow_fp8 0: never, as for
 * kv_b_proj). */
int ina_cpu_gpu_takes_fp8(const ina_linear_t *lin, int allow_fp8);

/* Row n of the weight as the CUDA engine holds it, in f32: bf16-rounded, or for FP8
 * weights e4m3 * scale (rounded to bf16 unless fp8_gemm). transposed_scales reads scale
 * block (j, i) for (i, j) where it exists (a deliberate bug, for the oracle's tests). */
void ina_cpu_gpu_weight_row(const ina_linear_t *lin, int64_t n, int fp8_gemm, int transposed_scales, float *out);

typedef struct ina_cpu_gpu_linear_opts {
  int allow_fp8;         /* FP8 weights may take the FP8 GEMM */
  int f32_out;           /* logits: y stays fp32; else rounded to bf16 */
  int transposed_scales; /* see ina_cpu_gpu_weight_row */
} ina_cpu_gpu_linear_opts_t;

/* y[m, n] = x[m, k] . W^T as the CUDA engine's GEMM computes it: x holds bf16 values
 * (quantized here to e4m3 1 x 128 for an FP8 GEMM), fp32 sums, y rounded to bf16 unless
 * f32_out. No bias (DeepSeek's linears have none). */
ina_status_t ina_cpu_gpu_linear(ina_threadpool_t *pool, const ina_linear_t *lin, const float *x, int64_t m,
                                float *y, const ina_cpu_gpu_linear_opts_t *opts);

#endif
