/* Device helpers shared by the gpu_ops and moe_ep kernels (internal; CUDA only): bf16
 * packing, 8-value lane loads and stores with a vectorized and a bounds-checked flavour,
 * warp and block reductions, the fused 1 x 128 FP8 quantization of a half-warp's block,
 * the ordered keys used for deterministic arg-max selection, and the host-side checks
 * the launchers share. */
#ifndef INA_GPU_OPS_GPU_OPS_DEVICE_CUH
#define INA_GPU_OPS_GPU_OPS_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "core/fp8_quant_rule.h"
#include "core/cuda_math.cuh"

namespace ina_gpu {

constexpr int kWarp = 32;
constexpr int kLaneValues = 8; /* values per lane: one 16-byte bf16 load */
constexpr int kFp8Block = 128; /* 1 x 128 activation blocks */
constexpr int kLanesPerFp8Block = kFp8Block / kLaneValues; /* 16: a half-warp */

/* ---- bf16 ----------------------------------------------------------------------------- */

using ina_cuda::bf16_hi;
using ina_cuda::bf16_lo;
using ina_cuda::bf16_to_f32;
using ina_cuda::f32_to_bf16;
using ina_cuda::pack_bf16;

/* Eight bf16 values as four little-endian pairs: value 2i is the low half of w[i]. */
struct Bf16x8 {
  uint32_t w[4];
};

__device__ __forceinline__ float bf16x8_get(const Bf16x8 &v, int i) {
  return (i & 1) ? bf16_hi(v.w[i >> 1]) : bf16_lo(v.w[i >> 1]);
}

/* Columns [c, c + 8) of a bf16 row; values at or past `cols` read as +0. kVector: the
 * row start is 16-byte aligned and cols % 8 == 0, so the 8 are all in or all out. */
template <bool kVector>
__device__ __forceinline__ Bf16x8 load_bf16x8(const uint16_t *row, int64_t c, int64_t cols) {
  Bf16x8 v = {{0u, 0u, 0u, 0u}};
  if (kVector) {
    if (c < cols) {
      const uint4 p = *reinterpret_cast<const uint4 *>(row + c);
      v.w[0] = p.x;
      v.w[1] = p.y;
      v.w[2] = p.z;
      v.w[3] = p.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t lo = c + 2 * i < cols ? row[c + 2 * i] : 0u;
      const uint32_t hi = c + 2 * i + 1 < cols ? row[c + 2 * i + 1] : 0u;
      v.w[i] = lo | (hi << 16);
    }
  }
  return v;
}

/* Stores the in-bounds part of columns [c, c + 8); kVector as for load_bf16x8. */
template <bool kVector>
__device__ __forceinline__ void store_bf16x8(uint16_t *row, int64_t c, int64_t cols,
                                             const Bf16x8 &v) {
  if (kVector) {
    if (c < cols) *reinterpret_cast<uint4 *>(row + c) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      if (c + 2 * i < cols) row[c + 2 * i] = (uint16_t)(v.w[i] & 0xFFFFu);
      if (c + 2 * i + 1 < cols) row[c + 2 * i + 1] = (uint16_t)(v.w[i] >> 16);
    }
  }
}

/* Eight weights as f32 from a bf16 or f32 vector; out-of-range values read as 0.
 * kVector: 16-byte aligned start and cols % 8 == 0. */
template <bool kVector>
__device__ __forceinline__ void load_weight8(const void *weight, bool weight_f32, int64_t c,
                                             int64_t cols, float w[kLaneValues]) {
  if (weight_f32) {
    const float *wf = static_cast<const float *>(weight);
    if (kVector) {
      if (c < cols) {
        const float4 a = __ldg(reinterpret_cast<const float4 *>(wf + c));
        const float4 b = __ldg(reinterpret_cast<const float4 *>(wf + c + 4));
        w[0] = a.x;
        w[1] = a.y;
        w[2] = a.z;
        w[3] = a.w;
        w[4] = b.x;
        w[5] = b.y;
        w[6] = b.z;
        w[7] = b.w;
      } else {
#pragma unroll
        for (int i = 0; i < kLaneValues; i++) w[i] = 0.0f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kLaneValues; i++) w[i] = c + i < cols ? __ldg(wf + c + i) : 0.0f;
    }
  } else {
    const Bf16x8 v = load_bf16x8<kVector>(static_cast<const uint16_t *>(weight), c, cols);
#pragma unroll
    for (int i = 0; i < kLaneValues; i++) w[i] = bf16x8_get(v, i);
  }
}

/* ---- reductions -------------------------------------------------------------------------- */

using ina_cuda::warp_max;
using ina_cuda::warp_sum;

__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1) {
    const uint64_t o = __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    v = o > v ? o : v;
  }
  return v;
}

/* Sum over the CTA in a fixed order (lanes, then warps); every thread gets the result.
 * `scratch` holds 32 floats; the call starts and ends with a barrier so it can be reused. */
__device__ __forceinline__ float block_sum(float v, float *scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

/* Max of a u64 over the CTA; `scratch` holds 32 values; barriers as block_sum. */
__device__ __forceinline__ uint64_t block_max_u64(uint64_t v, uint64_t *scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  v = warp_max_u64(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0u;
  return warp_max_u64(v);
}

/* Exclusive scan of v over the CTA in thread order (blockDim.x a multiple of 32); every
 * thread gets the sum in *total. `warp_totals` holds 32 values; the call starts with a
 * barrier so it can be reused. */
__device__ __forceinline__ int32_t block_exclusive_scan(int32_t v, int32_t *warp_totals,
                                                        int32_t *total) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int32_t inclusive = v;
  __syncthreads();
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const int32_t o = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += o;
  }
  if (lane == kWarp - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x / kWarp;
    int32_t t = lane < warps ? warp_totals[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < kWarp; offset <<= 1) {
      const int32_t o = __shfl_up_sync(0xFFFFFFFFu, t, offset);
      if (lane >= offset) t += o;
    }
    warp_totals[lane] = t; /* inclusive over warps */
  }
  __syncthreads();
  *total = warp_totals[kWarp - 1];
  return (warp > 0 ? warp_totals[warp - 1] : 0) + inclusive - v;
}

/* ---- ordered selection keys ------------------------------------------------------------ */

/* A float as an unsigned integer with the same order: -inf < ... < -0 = +0 < ... < +inf
 * map to increasing values >= 1 (zeros of both signs to the same key, as they compare
 * equal); NaN maps to 0, below everything. */
__device__ __forceinline__ uint32_t ordered_key(float v) {
  if (isnan(v)) return 0u;
  uint32_t b = __float_as_uint(v);
  if ((b & 0x7FFFFFFFu) == 0u) b = 0u; /* -0 -> +0 */
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* Selection key of (value, index): larger value first, then the lower index; any valid
 * entry's key is > 0, so 0 can mark "taken" or "absent". index < 2^32 - 1. */
__device__ __forceinline__ uint64_t select_key(float v, uint32_t index) {
  return ((uint64_t)ordered_key(v) << 32) | (uint64_t)(0xFFFFFFFFu - index);
}
__device__ __forceinline__ uint32_t select_key_index(uint64_t key) {
  return 0xFFFFFFFFu - (uint32_t)key;
}

/* ---- FP8 e4m3, 1 x 128 blocks ------------------------------------------------------------ */

/* Quantizes columns [c, c + 8) of one row, the lane's share of a 128-value block that a
 * half-warp (16 consecutive lanes, c = 128 * block + 8 * (lane % 16)) covers, with the
 * rule of ina_fp8_quantize_blocks (core/fp8_quant_rule.h). Values at or past `cols` must
 * be +0 in v. Every lane of the warp must call it (it shuffles); the lane whose c starts
 * a block in the row writes the block's scale. kVector: cols % 8 == 0 and the q row
 * 8-byte aligned. */
template <bool kVector>
__device__ __forceinline__ void store_fp8x8(const Bf16x8 &v, uint8_t *q_row, float *scale_row,
                                            int64_t c, int64_t cols) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++)
    amax = fmaxf(amax, fmaxf(fabsf(bf16_lo(v.w[i])), fabsf(bf16_hi(v.w[i]))));
#pragma unroll
  for (int offset = kLanesPerFp8Block / 2; offset > 0; offset >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  if (c >= cols) return;
  const float scale_inv = ina_fp8_rule_scale_inv(amax);
  const float recip = ina_fp8_rule_reciprocal(scale_inv);
  const int fast = ina_fp8_rule_use_reciprocal(amax);
  uint32_t pairs[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float lo = ina_fp8_rule_quotient(bf16_lo(v.w[i]), scale_inv, recip, fast);
    const float hi = ina_fp8_rule_quotient(bf16_hi(v.w[i]), scale_inv, recip, fast);
    pairs[i] = __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
  }
  if (kVector) {
    *reinterpret_cast<uint2 *>(q_row + c) =
        make_uint2(pairs[0] | (pairs[1] << 16), pairs[2] | (pairs[3] << 16));
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      if (c + 2 * i < cols) q_row[c + 2 * i] = (uint8_t)(pairs[i] & 0xFFu);
      if (c + 2 * i + 1 < cols) q_row[c + 2 * i + 1] = (uint8_t)(pairs[i] >> 8);
    }
  }
  if (c % kFp8Block == 0) scale_row[c / kFp8Block] = scale_inv;
}

/* ---- device error word ------------------------------------------------------------------- */

__device__ __forceinline__ void raise_flag(uint32_t *flags, uint32_t bit) {
  if (flags) atomicOr(flags, bit);
}

}  // namespace ina_gpu

/* ---- host-side helpers of the launchers ------------------------------------------------ */

/* Whether a device pointer is aligned to `bytes`. */
static inline bool ina_gpu_aligned(const void *p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

#endif
