/* The per-value arithmetic of block-scaled FP8 quantization as the GPU kernel does it,
 * shared by core/fp8_quant.cu and its CPU test (tests/gpu/test_fp8_quant_rule.c), so the
 * test checks the very code the kernel runs. Internal header: plain C, also compiled as
 * CUDA (host and device).
 *
 * The reference (ina_fp8_quantize_blocks) computes q = e4m3(x / scale_inv) with an IEEE
 * division per value. A division costs a dozen instructions; the kernel instead takes
 * the correctly rounded reciprocal once per block and corrects the product with one FMA
 * (Markstein's iteration):
 *     q0 = x * recip;   q = fma(fma(-scale_inv, q0, x), recip, q0)
 * and copies x's sign onto q (for x = -0 the FMAs give +0). For bf16 inputs this gives
 * the reference's e4m3 byte for every amax >= 2^-100 and every |x| <= amax: checked
 * exhaustively over all finite bf16 amax and x, and for random amax in each test run.
 * Below 2^-100 the residual underflows and is no longer exact, and for a non-finite
 * amax the reciprocal is 0; those blocks divide as the reference does.
 *
 * Thread safety: pure functions. */
#ifndef INA_CORE_FP8_QUANT_RULE_H
#define INA_CORE_FP8_QUANT_RULE_H

#include <float.h>
#include <math.h>

#include "core/dtype.h"

#ifdef __CUDACC__
#define INA_FP8_RULE_FN static inline __host__ __device__
#else
#define INA_FP8_RULE_FN static inline
#endif

/* Round-to-nearest operations that no compiler flag may fuse or approximate on the
 * device (--use_fast_math would otherwise turn the divisions approximate). */
#ifdef __CUDA_ARCH__
#define INA_FP8_RULE_DIV(a, b) __fdiv_rn((a), (b))
#define INA_FP8_RULE_MUL(a, b) __fmul_rn((a), (b))
#define INA_FP8_RULE_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#else
#define INA_FP8_RULE_DIV(a, b) ((a) / (b))
#define INA_FP8_RULE_MUL(a, b) ((a) * (b))
#define INA_FP8_RULE_FMA(a, b, c) fmaf((a), (b), (c))
#endif

/* Smallest amax whose blocks take the reciprocal path. */
#define INA_FP8_RULE_MIN_FAST_AMAX 0x1p-100f

/* scale_inv of a block with this amax, exactly as the reference: amax / 448, 1 for an
 * all-zero block, the smallest subnormal if amax / 448 underflows to zero. */
INA_FP8_RULE_FN float ina_fp8_rule_scale_inv(float amax) {
  float scale_inv = INA_FP8_RULE_DIV(amax, INA_FP8_E4M3_MAX);
  if (amax == 0.0f) scale_inv = 1.0f;
  else if (scale_inv == 0.0f) scale_inv = 0x1p-149f;
  return scale_inv;
}

/* The correctly rounded reciprocal the quotient below expects. */
INA_FP8_RULE_FN float ina_fp8_rule_reciprocal(float scale_inv) {
  return INA_FP8_RULE_DIV(1.0f, scale_inv);
}

/* Whether a block with this amax may use the reciprocal path. */
INA_FP8_RULE_FN int ina_fp8_rule_use_reciprocal(float amax) {
  return amax >= INA_FP8_RULE_MIN_FAST_AMAX && amax <= FLT_MAX;
}

/* x / scale_inv as the kernel computes it; recip = 1 / scale_inv (correctly rounded),
 * used only when use_reciprocal. The e4m3 conversion of the result (round to nearest
 * even, saturating) equals the reference's byte. */
INA_FP8_RULE_FN float ina_fp8_rule_quotient(float x, float scale_inv, float recip,
                                            int use_reciprocal) {
  if (!use_reciprocal) return INA_FP8_RULE_DIV(x, scale_inv);
  const float q0 = INA_FP8_RULE_MUL(x, recip);
  const float residual = INA_FP8_RULE_FMA(-scale_inv, q0, x);
  return copysignf(INA_FP8_RULE_FMA(residual, recip, q0), x);
}

#endif
