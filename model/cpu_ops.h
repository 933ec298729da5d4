/* The CPU backend's dense ops, in fp32 with weights converted on the fly from their
 * stored dtype (f32, bf16, f16, or fp8 e4m3 with block scales). These are the reference
 * implementations the GPU kernels are checked against, and the engine's CPU path.
 *
 * All matrices are row-major and contiguous. `pool` may be NULL (serial).
 * Thread safety: calls on different outputs may run concurrently only with different
 * pools (a pool runs one parallel loop at a time). */
#ifndef INA_MODEL_CPU_OPS_H
#define INA_MODEL_CPU_OPS_H

#include <stdint.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "model/weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n]) for a [N, K] linear. */
ina_status_t ina_cpu_linear(ina_threadpool_t *pool, const ina_linear_t *lin, const float *x,
                            int64_t m, float *y);
/* Row n of a linear's weight as f32 (block scales applied). */
void ina_cpu_linear_row(const ina_linear_t *lin, int64_t n, float *out);
/* Same for a plain 2-D tensor of any float dtype. */
void ina_cpu_tensor_row(const ina_tensor_t *t, int64_t n, float *out);

/* y = x / sqrt(mean(x^2) + eps) * weight, row by row over [m, n] (x and y may alias). */
void ina_cpu_rmsnorm(const float *x, const ina_tensor_t *weight, int64_t m, int64_t n, float eps,
                     int64_t x_stride, float *y, int64_t y_stride);

/* LayerNorm of rows [m, n] (stride n) into y: (x - mean) / sqrt(var + eps) * weight +
 * bias, the biased variance, as torch.nn.LayerNorm; mean and variance in double. */
void ina_cpu_layernorm(const float *x, const ina_tensor_t *weight, const ina_tensor_t *bias, int64_t m,
                       int64_t n, float eps, float *y);

/* out[m, i] = silu(g[m, i]) * u[m, i]. */
void ina_cpu_silu_mul(const float *g, const float *u, int64_t count, float *out);

/* Rotate `x` (rope_dim values) in place for position `pos`; inv_freq has rope_dim/2
 * entries, attention_factor scales cos and sin (YaRN). */
void ina_cpu_rope(float *x, int32_t rope_dim, int64_t pos, const float *inv_freq,
                  float attention_factor, int pairs_layout);

float ina_cpu_dot(const float *a, const float *b, int64_t n);
void ina_cpu_axpy(float a, const float *x, float *y, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
