/* ina_gemm_quantize_x (gemm/gemm.h): bf16 activations -> e4m3 with 1 x 128 blocks, the
 * scales written straight into the M-major layout the GEMMs read, so no transpose pass
 * sits between the quantizer and cuBLASLt.
 *
 * A half-warp (16 lanes x 8 values, one 16-byte load each) quantizes one block. Blocks
 * are numbered with the row fastest (block = kb * m + row), so the half-warps of a CTA
 * take one K block of consecutive rows and their scale stores land side by side in the
 * M-major layout; each reads a 256-byte row segment, whole cache lines either way.
 *
 * The arithmetic per value is core/fp8_quant_rule.h's, as in core/fp8_quant.cu, so the
 * bytes and scales equal ina_fp8_quantize_blocks'. */
#define INA_LOG_SUBSYS "gemm"
#include <cuda_fp8.h>
#include <limits.h>

#include "core/cuda_check.h"
#include "core/cuda_math.cuh"
#include "core/fp8_quant_rule.h"
#include "gemm/gemm.h"
#include "gemm/gemm_scale_layout.h"

namespace {

constexpr int kThreads = 256;
constexpr int kLanesPerBlock = 16; /* 16 lanes x 8 values = one 128-value block */
constexpr int kBlocksPerCta = kThreads / kLanesPerBlock;

using ina_cuda::bf16_hi;
using ina_cuda::bf16_lo;

__global__ void __launch_bounds__(kThreads)
    quantize_x_kernel(const uint16_t *__restrict__ x, int64_t ldx, int64_t rows, int64_t k,
                      int64_t kblocks, uint8_t *__restrict__ q, int64_t ldq,
                      float *__restrict__ scale) {
  const int lane = threadIdx.x % kLanesPerBlock;
  const int64_t block = (int64_t)blockIdx.x * kBlocksPerCta + threadIdx.x / kLanesPerBlock;
  const bool active = block < rows * kblocks;
  const int64_t kb = active ? block / rows : 0, row = active ? block % rows : 0;
  const int64_t col = kb * 128 + lane * 8;
  const bool in_matrix = active && col < k; /* k % 8 == 0: all 8 values or none */

  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (in_matrix) v = __ldg(reinterpret_cast<const uint4 *>(x + row * ldx + col));
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) amax = fmaxf(amax, fmaxf(fabsf(bf16_lo(w[i])), fabsf(bf16_hi(w[i]))));
#pragma unroll
  for (int offset = kLanesPerBlock / 2; offset > 0; offset >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));

  const float scale_inv = ina_fp8_rule_scale_inv(amax);
  const float recip = ina_fp8_rule_reciprocal(scale_inv);
  const int use_reciprocal = ina_fp8_rule_use_reciprocal(amax);
  uint32_t packed[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const float lo = ina_fp8_rule_quotient(bf16_lo(w[i]), scale_inv, recip, use_reciprocal);
    const float hi = ina_fp8_rule_quotient(bf16_hi(w[i]), scale_inv, recip, use_reciprocal);
    packed[i] = __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
  }
  if (in_matrix)
    *reinterpret_cast<uint2 *>(q + row * ldq + col) =
        make_uint2(packed[0] | (packed[1] << 16), packed[2] | (packed[3] << 16));
  if (active && lane == 0)
    scale[ina_gemm_scale_offset(rows, ina_gemm_cublaslt_rows(rows), kblocks, row, kb)] = scale_inv;
}

}  // namespace

extern "C" ina_status_t ina_gemm_quantize_x(const uint16_t *x, int64_t ldx, int64_t m, int64_t k,
                                            uint8_t *q, int64_t ldq, float *x_scale, void *stream) {
  ina_status_t st = INA_OK;
  int64_t kblocks = 0, grid = 0;
  if (ldx == 0) ldx = k;
  if (ldq == 0) ldq = k;
  INA_REQUIRE(
      m >= 0 && k > 0 && k % 16 == 0 && ldx >= k && ldq >= k && ldx % 8 == 0 && ldq % 16 == 0,
      INA_ERR_INVALID_ARGUMENT,
      "ina_gemm_quantize_x: m %lld, k %lld (a positive multiple of 16), ldx %lld (a "
      "multiple of 8 >= k), ldq %lld (a multiple of 16 >= k)",
      (long long)m, (long long)k, (long long)ldx, (long long)ldq);
  if (m == 0) return INA_OK;
  INA_REQUIRE(x && q && x_scale, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_quantize_x: NULL x, q or x_scale");
  INA_REQUIRE((uintptr_t)x % 16 == 0 && (uintptr_t)q % 16 == 0 && (uintptr_t)x_scale % 16 == 0,
              INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_quantize_x: x %p, q %p and x_scale %p must be 16-byte aligned",
              (const void *)x, (void *)q, (void *)x_scale);
  kblocks = ina_gemm_kblocks(k);
  INA_REQUIRE(m <= INT64_MAX / 2 / ldx && m <= INT64_MAX / 2 / ldq, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_quantize_x: [%lld, %lld] overflows the address space", (long long)m,
              (long long)k);
  grid = (m * kblocks + kBlocksPerCta - 1) / kBlocksPerCta;
  INA_REQUIRE(grid <= INT_MAX, INA_ERR_UNSUPPORTED,
              "ina_gemm_quantize_x: [%lld, %lld] needs %lld CTAs, over the grid limit",
              (long long)m, (long long)k, (long long)grid);
  quantize_x_kernel<<<(unsigned)grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, ldx, m, k, kblocks, q, ldq, x_scale);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
