/* Inside comm/: the per-element arithmetic of the custom all-reduce, shared by the kernels
 * (comm/custom_ar.cu) and the CPU model in the tests, so a test predicts the kernels'
 * output bit for bit. Plain C, also compiled as CUDA (host and device).
 *
 * Every step is one correctly rounded fp32 operation, never contracted into an FMA:
 *   sum        acc = x_0, then acc = acc + x_r for r = 1 .. n-1 (rank order, on every rank)
 *   fp8 value  v = fp8(q) * scale_inv
 *   fp8 sum    acc = v_0, then acc = acc + v_r, v_r = fp8(q_r) * scale_inv_r
 *   quantize   scale_inv = ina_fp8_rule_scale_inv(amax) (amax / 448, 1 for a zero block),
 *              q = e4m3_satfinite(x / scale_inv) with an IEEE division: the rule of
 *              ina_fp8_quantize_blocks, so one block quantizes exactly as the reference.
 * bf16 rounding is to nearest even.
 *
 * Thread safety: pure functions. */
#ifndef INA_COMM_CUSTOM_AR_MATH_H
#define INA_COMM_CUSTOM_AR_MATH_H

#include <stdint.h>

#include "comm/custom_ar_plan.h"
#include "core/dtype.h"
#include "core/fp8_quant_rule.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

INA_CAR_HD float ina_car_add(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

INA_CAR_HD float ina_car_mul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

/* Exact: every e4m3 value is an f32. */
INA_CAR_HD float ina_car_fp8_to_f32(uint8_t q) {
#ifdef __CUDA_ARCH__
  return __half2float(__half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, __NV_E4M3)));
#else
  return ina_fp8_e4m3_to_f32(q);
#endif
}

/* Round to nearest even, saturating to +-448. */
INA_CAR_HD uint8_t ina_car_f32_to_fp8(float v) {
#ifdef __CUDA_ARCH__
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
#else
  return ina_f32_to_fp8_e4m3(v, 1);
#endif
}

INA_CAR_HD uint16_t ina_car_f32_to_bf16(float v) {
#ifdef __CUDA_ARCH__
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
#else
  return ina_f32_to_bf16(v);
#endif
}

INA_CAR_HD float ina_car_fp8_value(uint8_t q, float scale_inv) {
  return ina_car_mul(ina_car_fp8_to_f32(q), scale_inv);
}

INA_CAR_HD uint8_t ina_car_quantize(float x, float scale_inv) {
  return ina_car_f32_to_fp8(ina_fp8_rule_quotient(x, scale_inv, 0.0f, 0));
}

#endif
