/* Small device functions shared by the CUDA kernels (CUDA C++ only, never included from
 * C): bf16 bit conversions and warp reductions. */
#ifndef INA_CORE_CUDA_MATH_CUH
#define INA_CORE_CUDA_MATH_CUH

#include <cuda_bf16.h>
#include <stdint.h>

namespace ina_cuda {

/* bf16 is the top half of an f32: widening is a shift, narrowing rounds to nearest even. */
__device__ __forceinline__ float bf16_to_f32(uint32_t bits16) { return __uint_as_float(bits16 << 16); }
/* The low / high bf16 of a packed pair. */
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }
__device__ __forceinline__ uint16_t f32_to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}
/* Two floats as a bf16 pair, lo in the low half (the operand order of mma fragments). */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return (uint32_t)f32_to_bf16(lo) | ((uint32_t)f32_to_bf16(hi) << 16);
}

/* Butterfly reductions: every lane of the warp gets the result. */
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

}  // namespace ina_cuda

#endif
