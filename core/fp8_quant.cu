/* Block-scaled FP8 e4m3 quantization of bf16 matrices (core/fp8_quant.h).
 *
 * Work split: a half-warp (16 lanes x 8 values) covers one 128-wide row segment of a
 * block, so a lane moves one 16-byte load and one 8-byte store per segment, and the amax
 * of a segment is four xor-shuffles away.
 *   1x128 blocks:   each half-warp quantizes whole blocks; a CTA takes kUnits groups of
 *                   16 consecutive blocks (4 KiB of input each) and issues all their
 *                   loads before the first reduction.
 *   128x128 blocks: one CTA per block; its 16 half-warps take 8 rows each, keep the
 *                   values in registers (packed bf16 pairs) and meet in shared memory for
 *                   the block amax, so the input is read once.
 *
 * Bit-exactness with ina_fp8_quantize_blocks: bf16 -> f32 is exact, max is
 * order-independent, the scale is the reference's IEEE division, the quotient follows
 * core/fp8_quant_rule.h (a reciprocal and one correcting FMA instead of a division per
 * value, proven to give the reference's byte), and cvt.rn.satfinite.e4m3x2.f32 rounds
 * to nearest even and clamps to +-448 exactly as the reference does. */
#define INA_LOG_SUBSYS "fp8"
#include "core/fp8_quant.h"

#include <cuda_fp8.h>
#include <limits.h>

#include "core/cuda_check.h"
#include "core/fp8_quant_rule.h"

namespace {

constexpr int kBlockCols = 128;
constexpr int kValuesPerLane = 8;                                /* one 16-byte bf16 load */
constexpr int kLanesPerSegment = kBlockCols / kValuesPerLane;    /* 16: a half-warp */
constexpr int kThreads = 256;
constexpr int kSegmentsPerPass = kThreads / kLanesPerSegment;    /* 16 half-warps per CTA */
constexpr int kUnits = 2;                                        /* 1x128: groups per CTA */
constexpr int kBlocksPerCta1x128 = kUnits * kSegmentsPerPass;    /* 32 blocks */
constexpr int kPasses128 = 128 / kSegmentsPerPass;               /* 8 rows per half-warp */

/* The 8 bf16 values of one lane, as 4 little-endian pairs: element 2i is the low half
 * of word i. Values outside the matrix are +0, which leaves amax unchanged. */
struct Lane8 {
  uint32_t w[4];
};

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

/* Loads columns [c, c + 8) of `row`. kVector: cols % 8 == 0 and the row start is
 * 16-byte aligned, so the 8 values are all inside or all outside the matrix. */
template <bool kVector>
__device__ __forceinline__ Lane8 load_lane(const uint16_t *__restrict__ row, int64_t c,
                                           int64_t cols) {
  Lane8 v = {{0u, 0u, 0u, 0u}};
  if (kVector) {
    if (c < cols) {
      uint4 p = __ldg(reinterpret_cast<const uint4 *>(row + c));
      v.w[0] = p.x;
      v.w[1] = p.y;
      v.w[2] = p.z;
      v.w[3] = p.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      uint32_t lo = c + 2 * i < cols ? row[c + 2 * i] : 0u;
      uint32_t hi = c + 2 * i + 1 < cols ? row[c + 2 * i + 1] : 0u;
      v.w[i] = lo | (hi << 16);
    }
  }
  return v;
}

__device__ __forceinline__ float lane_amax(const Lane8 &v) {
  float a = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) a = fmaxf(a, fmaxf(fabsf(bf16_lo(v.w[i])), fabsf(bf16_hi(v.w[i]))));
  return a;
}

/* Max over the 16 lanes of this half-warp; every lane of the warp must call it. */
__device__ __forceinline__ float half_warp_amax(float a) {
#pragma unroll
  for (int offset = kLanesPerSegment / 2; offset > 0; offset >>= 1)
    a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, offset));
  return a;
}

/* How one block's values are divided by its scale: fp8_quant_rule.h. */
struct BlockScale {
  float scale_inv, recip;
  int use_reciprocal;
};

__device__ __forceinline__ BlockScale block_scale(float amax) {
  BlockScale b;
  b.scale_inv = ina_fp8_rule_scale_inv(amax);
  b.recip = ina_fp8_rule_reciprocal(b.scale_inv);
  b.use_reciprocal = ina_fp8_rule_use_reciprocal(amax);
  return b;
}

/* kReciprocal is the block's use_reciprocal, hoisted out of the per-value code. */
template <bool kReciprocal>
__device__ __forceinline__ uint32_t quantize_pair(uint32_t w, const BlockScale &b) {
  const float lo = ina_fp8_rule_quotient(bf16_lo(w), b.scale_inv, b.recip, kReciprocal);
  const float hi = ina_fp8_rule_quotient(bf16_hi(w), b.scale_inv, b.recip, kReciprocal);
  return __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
}

/* Quantizes and stores columns [c, c + 8) of `row`; kVector as for load_lane, plus q's
 * row start 8-byte aligned. */
template <bool kVector, bool kReciprocal>
__device__ __forceinline__ void store_lane_with(uint8_t *__restrict__ row, int64_t c,
                                                int64_t cols, const Lane8 &v,
                                                const BlockScale &scale) {
  uint32_t p[4];
#pragma unroll
  for (int i = 0; i < 4; i++) p[i] = quantize_pair<kReciprocal>(v.w[i], scale);
  if (kVector) {
    if (c < cols)
      *reinterpret_cast<uint2 *>(row + c) = make_uint2(p[0] | (p[1] << 16), p[2] | (p[3] << 16));
  } else {
#pragma unroll
    for (int i = 0; i < 4; i++) {
      if (c + 2 * i < cols) row[c + 2 * i] = (uint8_t)(p[i] & 0xFFu);
      if (c + 2 * i + 1 < cols) row[c + 2 * i + 1] = (uint8_t)(p[i] >> 8);
    }
  }
}

template <bool kVector>
__device__ __forceinline__ void store_lane(uint8_t *__restrict__ row, int64_t c, int64_t cols,
                                           const Lane8 &v, const BlockScale &scale) {
  if (scale.use_reciprocal) store_lane_with<kVector, true>(row, c, cols, v, scale);
  else store_lane_with<kVector, false>(row, c, cols, v, scale);
}

/* 1x128 blocks. Block b (row b / nbc, block column b % nbc) is also the index of its
 * scale. Half-warps past the last block still shuffle (with zeros) but store nothing. */
template <bool kVector>
__global__ void __launch_bounds__(kThreads)
    quantize_1x128_kernel(const uint16_t *__restrict__ x, int64_t rows, int64_t cols, int64_t nbc,
                          uint8_t *__restrict__ q, float *__restrict__ scale_inv) {
  const int segment = threadIdx.x / kLanesPerSegment;
  const int lane = threadIdx.x % kLanesPerSegment;
  const int64_t nblocks = rows * nbc;
  int64_t block[kUnits], row[kUnits], col[kUnits];
  Lane8 v[kUnits];
#pragma unroll
  for (int u = 0; u < kUnits; u++) {
    block[u] = ((int64_t)blockIdx.x * kUnits + u) * kSegmentsPerPass + segment;
    row[u] = block[u] / nbc;
    col[u] = (block[u] - row[u] * nbc) * kBlockCols + lane * kValuesPerLane;
    v[u] = block[u] < nblocks ? load_lane<kVector>(x + row[u] * cols, col[u], cols) : Lane8{};
  }
#pragma unroll
  for (int u = 0; u < kUnits; u++) {
    const BlockScale scale = block_scale(half_warp_amax(lane_amax(v[u])));
    if (block[u] < nblocks) {
      store_lane<kVector>(q + row[u] * cols, col[u], cols, v[u], scale);
      if (lane == 0) scale_inv[block[u]] = scale.scale_inv;
    }
  }
}

/* 128x128 blocks: CTA blockIdx.x quantizes block (blockIdx.x / nbc, blockIdx.x % nbc).
 * Three CTAs per SM (the register cap) keep 96 KiB of loads in flight per SM. */
template <bool kVector>
__global__ void __launch_bounds__(kThreads, 3)
    quantize_128x128_kernel(const uint16_t *__restrict__ x, int64_t rows, int64_t cols,
                            int64_t nbc, uint8_t *__restrict__ q, float *__restrict__ scale_inv) {
  __shared__ float warp_amax[kThreads / 32];
  const int segment = threadIdx.x / kLanesPerSegment;
  const int lane = threadIdx.x % kLanesPerSegment;
  const int64_t block_row = blockIdx.x / nbc;
  const int64_t block_col = blockIdx.x - block_row * nbc;
  const int64_t col = block_col * kBlockCols + lane * kValuesPerLane;
  Lane8 v[kPasses128];
  float amax = 0.0f;
#pragma unroll
  for (int p = 0; p < kPasses128; p++) {
    const int64_t r = block_row * 128 + p * kSegmentsPerPass + segment;
    v[p] = r < rows ? load_lane<kVector>(x + r * cols, col, cols) : Lane8{};
  }
#pragma unroll
  for (int p = 0; p < kPasses128; p++) amax = fmaxf(amax, lane_amax(v[p]));
  amax = half_warp_amax(amax);
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 16)); /* the warp's two rows */
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kThreads / 32; w++) amax = fmaxf(amax, warp_amax[w]);
  const BlockScale scale = block_scale(amax);
  if (threadIdx.x == 0) scale_inv[blockIdx.x] = scale.scale_inv;
#pragma unroll
  for (int p = 0; p < kPasses128; p++) {
    const int64_t r = block_row * 128 + p * kSegmentsPerPass + segment;
    if (r < rows) store_lane<kVector>(q + r * cols, col, cols, v[p], scale);
  }
}

ina_status_t check_args(const uint16_t *x, int64_t rows, int64_t cols, int block_rows,
                        int block_cols, const uint8_t *q, const float *scale_inv) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(rows >= 0 && cols >= 0, INA_ERR_INVALID_ARGUMENT,
              "ina_cuda_fp8_quantize_blocks: negative shape [%lld, %lld]", (long long)rows,
              (long long)cols);
  INA_REQUIRE(block_cols == kBlockCols && (block_rows == 1 || block_rows == 128),
              INA_ERR_UNSUPPORTED,
              "ina_cuda_fp8_quantize_blocks: block %d x %d is not supported (1 x 128 or "
              "128 x 128)",
              block_rows, block_cols);
  INA_REQUIRE(rows == 0 || cols == 0 || (x != NULL && q != NULL && scale_inv != NULL),
              INA_ERR_INVALID_ARGUMENT,
              "ina_cuda_fp8_quantize_blocks: NULL buffer for a [%lld, %lld] matrix",
              (long long)rows, (long long)cols);
  INA_REQUIRE(cols == 0 || rows <= INT64_MAX / 2 / cols, INA_ERR_INVALID_ARGUMENT,
              "ina_cuda_fp8_quantize_blocks: shape [%lld, %lld] overflows the address space",
              (long long)rows, (long long)cols);
fail:
  return st;
}

}  // namespace

extern "C" ina_status_t ina_cuda_fp8_quantize_blocks(const uint16_t *x_bf16, int64_t rows,
                                                     int64_t cols, int block_rows,
                                                     int block_cols, uint8_t *q,
                                                     float *scale_inv, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  int64_t nbc = 0, nblocks = 0, grid = 0;
  bool vector = false;
  INA_CHECK(check_args(x_bf16, rows, cols, block_rows, block_cols, q, scale_inv));
  if (rows == 0 || cols == 0) return INA_OK;

  nbc = (cols + kBlockCols - 1) / kBlockCols;
  nblocks = ((rows + block_rows - 1) / block_rows) * nbc;
  grid = block_rows == 1 ? (nblocks + kBlocksPerCta1x128 - 1) / kBlocksPerCta1x128 : nblocks;
  INA_REQUIRE(grid <= INT_MAX, INA_ERR_UNSUPPORTED,
              "ina_cuda_fp8_quantize_blocks: [%lld, %lld] needs %lld CTAs, over the grid limit",
              (long long)rows, (long long)cols, (long long)grid);
  vector = cols % kValuesPerLane == 0 && reinterpret_cast<uintptr_t>(x_bf16) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(q) % 8 == 0;

  if (block_rows == 1) {
    if (vector)
      quantize_1x128_kernel<true><<<(unsigned)grid, kThreads, 0, s>>>(x_bf16, rows, cols, nbc, q,
                                                                      scale_inv);
    else
      quantize_1x128_kernel<false><<<(unsigned)grid, kThreads, 0, s>>>(x_bf16, rows, cols, nbc, q,
                                                                       scale_inv);
  } else {
    if (vector)
      quantize_128x128_kernel<true><<<(unsigned)grid, kThreads, 0, s>>>(x_bf16, rows, cols, nbc,
                                                                        q, scale_inv);
    else
      quantize_128x128_kernel<false><<<(unsigned)grid, kThreads, 0, s>>>(x_bf16, rows, cols, nbc,
                                                                         q, scale_inv);
  }
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
