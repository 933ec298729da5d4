/* CPU model of the custom all-reduce (comm/custom_ar.h), shared by its CPU unit test and
 * its GPU test. car_model_all_reduce computes every rank's `out` with the kernels' own
 * element arithmetic (comm/custom_ar_math.h), so a GPU result must match it bit for bit;
 * the fp64 helpers give the exact sum and the error bounds each mode promises.
 *
 * FP8 error bound (per element i of a 128-element block; the derivation the tests check):
 *   u = 2^-4 is e4m3's unit roundoff (3 stored mantissa bits: a normal value moves by at
 *   most half a spacing, 2^-4 of itself). Scaled by s = A / 448 (A = block amax), values
 *   below e4m3's smallest normal 2^-6 are subnormal, spaced 2^-9, so they move by at most
 *   2^-10 * s = m * A with m = 2^-10 / 448. The scale, the quotient and the dequantizing
 *   product are fp32 roundings (2^-24 each), folded into a factor f = 1 + 2^-20.
 *   Stage 1, rank r:  |d_ri - x_ri| <= f (u |x_ri| + m A_r)
 *   fp32 sum in rank order: |acc_i - sum_r d_ri| <= n 2^-24 sum_r |d_ri|
 *   so  E1_i = sum_r f (u |x_ri| + m A_r) + n 2^-24 sum_r ((1 + u) |x_ri| + m A_r)
 *   bounds |acc_i - S_i| (S the exact sum). Stage 2 re-quantizes acc with the block amax
 *   A' <= Ahat = max_j (|S_j| + E1_j):  |d'_i - acc_i| <= f (u |acc_i| + m Ahat), and the
 *   bf16 output adds at most 2^-8 |d'_i|. With |acc_i| <= |S_i| + E1_i:
 *   B_i = E1_i + f (u (|S_i| + E1_i) + m Ahat) + 2^-8 ((1 + u) f (|S_i| + E1_i) + m Ahat).
 *   Coarsely, B_i <= (2 u + u^2 + 2^-7 + ...) sum_r A_r ~ 2.15 * 2^-4 * sum_r A_r: two e4m3
 *   roundings relative to the block max. */
#ifndef INA_TESTS_COMM_CUSTOM_AR_MODEL_H
#define INA_TESTS_COMM_CUSTOM_AR_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/custom_ar_math.h"
#include "comm/custom_ar_plan.h"
#include "core/dtype.h"

/* inputs[r]: rank r's count elements (bf16 bits for BF16/FP8, f32 for F32); out likewise. */
static inline void car_model_all_reduce(int mode, int nranks, const void *const *inputs,
                                        size_t count, void *out) {
  if (mode == INA_CAR_MODE_F32) {
    for (size_t i = 0; i < count; i++) {
      float acc = ((const float *)inputs[0])[i];
      for (int r = 1; r < nranks; r++) acc = ina_car_add(acc, ((const float *)inputs[r])[i]);
      ((float *)out)[i] = acc;
    }
    return;
  }
  if (mode == INA_CAR_MODE_BF16) {
    for (size_t i = 0; i < count; i++) {
      float acc = ina_bf16_to_f32(((const uint16_t *)inputs[0])[i]);
      for (int r = 1; r < nranks; r++)
        acc = ina_car_add(acc, ina_bf16_to_f32(((const uint16_t *)inputs[r])[i]));
      ((uint16_t *)out)[i] = ina_car_f32_to_bf16(acc);
    }
    return;
  }
  /* FP8: 128-element blocks of the flattened vector; a partial last block has fewer. */
  for (size_t g0 = 0; g0 < count; g0 += INA_CAR_GRANULE) {
    const size_t len = count - g0 < INA_CAR_GRANULE ? count - g0 : INA_CAR_GRANULE;
    float acc[INA_CAR_GRANULE];
    for (int r = 0; r < nranks; r++) {
      const uint16_t *x = (const uint16_t *)inputs[r] + g0;
      float amax = 0.0f;
      for (size_t i = 0; i < len; i++) amax = fmaxf(amax, fabsf(ina_bf16_to_f32(x[i])));
      const float s = ina_fp8_rule_scale_inv(amax);
      for (size_t i = 0; i < len; i++) {
        const float v = ina_car_fp8_value(ina_car_quantize(ina_bf16_to_f32(x[i]), s), s);
        acc[i] = r == 0 ? v : ina_car_add(acc[i], v);
      }
    }
    float amax = 0.0f;
    for (size_t i = 0; i < len; i++) amax = fmaxf(amax, fabsf(acc[i]));
    const float s = ina_fp8_rule_scale_inv(amax);
    for (size_t i = 0; i < len; i++)
      ((uint16_t *)out)[g0 + i] =
          ina_car_f32_to_bf16(ina_car_fp8_value(ina_car_quantize(acc[i], s), s));
  }
}

/* The exact sum (fp64) of f32 values xs[r][i], and sum_r |x_ri|. */
static inline void car_model_exact(int nranks, const float *const *xs, size_t count,
                                   double *sum, double *abs_sum) {
  for (size_t i = 0; i < count; i++) {
    double s = 0, a = 0;
    for (int r = 0; r < nranks; r++) {
      s += xs[r][i];
      a += fabs(xs[r][i]);
    }
    sum[i] = s;
    abs_sum[i] = a;
  }
}

/* bound[i] of the FP8 mode's |out_i - S_i| (see the top of this file). */
static inline void car_model_fp8_bound(int nranks, const float *const *xs, size_t count,
                                       double *bound) {
  const double u = 0x1p-4, m = 0x1p-10 / 448.0, f = 1.0 + 0x1p-20, eps32 = 0x1p-24;
  double e1[INA_CAR_GRANULE], s_abs[INA_CAR_GRANULE];
  for (size_t g0 = 0; g0 < count; g0 += INA_CAR_GRANULE) {
    const size_t len = count - g0 < INA_CAR_GRANULE ? count - g0 : INA_CAR_GRANULE;
    double amax[INA_CAR_MAX_RANKS] = {0};
    for (int r = 0; r < nranks; r++)
      for (size_t i = 0; i < len; i++) amax[r] = fmax(amax[r], fabs(xs[r][g0 + i]));
    double ahat = 0;
    for (size_t i = 0; i < len; i++) {
      double stage = 0, terms = 0, s = 0;
      for (int r = 0; r < nranks; r++) {
        const double x = fabs(xs[r][g0 + i]);
        stage += f * (u * x + m * amax[r]);
        terms += (1 + u) * x + m * amax[r];
        s += xs[r][g0 + i];
      }
      e1[i] = stage + nranks * eps32 * terms;
      s_abs[i] = fabs(s);
      ahat = fmax(ahat, s_abs[i] + e1[i]);
    }
    for (size_t i = 0; i < len; i++) {
      const double acc = s_abs[i] + e1[i];
      bound[g0 + i] = e1[i] + f * (u * acc + m * ahat) + 0x1p-8 * ((1 + u) * f * acc + m * ahat);
    }
  }
}

/* sum_r (block amax of rank r) for the block holding each element: the coarse FP8 scale. */
static inline void car_model_block_amax_sum(int nranks, const float *const *xs, size_t count,
                                            double *out) {
  for (size_t g0 = 0; g0 < count; g0 += INA_CAR_GRANULE) {
    const size_t len = count - g0 < INA_CAR_GRANULE ? count - g0 : INA_CAR_GRANULE;
    double total = 0;
    for (int r = 0; r < nranks; r++) {
      double a = 0;
      for (size_t i = 0; i < len; i++) a = fmax(a, fabs(xs[r][g0 + i]));
      total += a;
    }
    for (size_t i = 0; i < len; i++) out[g0 + i] = total;
  }
}

/* The epilogue on the all-reduced bf16 rows x [rows, cols]: residual (bf16, may be NULL)
 * becomes bf16(residual + x) exactly as the kernel rounds it; y_ref gets the normalized
 * rows in fp64 (weight as f32 values). */
static inline void car_model_epilogue(const uint16_t *x, int64_t rows, int64_t cols,
                                      uint16_t *residual, const float *weight, float eps,
                                      double *y_ref) {
  double *v = malloc((size_t)cols * sizeof(double));
  for (int64_t r = 0; r < rows; r++) {
    double ss = 0;
    for (int64_t c = 0; c < cols; c++) {
      const size_t i = (size_t)(r * cols + c);
      float h = ina_bf16_to_f32(x[i]);
      if (residual) {
        h = ina_bf16_to_f32(ina_car_f32_to_bf16(ina_car_add(ina_bf16_to_f32(residual[i]), h)));
        residual[i] = ina_f32_to_bf16(h);
      }
      v[c] = h;
      ss += (double)h * h;
    }
    const double inv = 1.0 / sqrt(ss / (double)cols + (double)eps);
    for (int64_t c = 0; c < cols; c++) y_ref[r * cols + c] = (double)weight[c] * (v[c] * inv);
  }
  free(v);
}

#endif
