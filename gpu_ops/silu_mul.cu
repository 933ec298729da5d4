/* SiLU(gate) * up with optional FP8 output (gpu_ops/gpu_ops.h).
 *
 * One CTA per row; thread i takes the 8-value lanes i, i + blockDim, ... of the row. The
 * lane count is padded to whole 128-value blocks (16 lanes) and every thread runs the
 * same number of steps, so the 16 lanes of a block are always one half-warp together
 * in one step and the FP8 amax is a half-warp reduction. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "gpu_ops/gpu_ops.h"

#include <limits.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

using namespace ina_gpu;

constexpr int kMaxThreads = 256;

struct SiluArgs {
  int64_t inter;
  int64_t lanes_padded; /* ceil(inter / 128) * 16 */
  const uint16_t *gate, *up;
  int64_t in_stride;
  uint16_t *out;
  uint8_t *out_fp8;
  float *out_scale_inv;
};

__device__ __forceinline__ float silu_mul(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

template <bool kVector>
__global__ void __launch_bounds__(kMaxThreads) silu_mul_kernel(const SiluArgs a) {
  const int64_t row = blockIdx.x;
  const uint16_t *gate = a.gate + row * a.in_stride, *up = a.up + row * a.in_stride;
  uint16_t *out = a.out ? a.out + row * a.inter : nullptr;
  uint8_t *q = a.out_fp8 ? a.out_fp8 + row * a.inter : nullptr;
  float *scale = a.out_fp8 ? a.out_scale_inv + row * (a.lanes_padded / kLanesPerFp8Block) : nullptr;
  for (int64_t lane = threadIdx.x; lane - threadIdx.x < a.lanes_padded; lane += blockDim.x) {
    const int64_t c = lane * kLaneValues;
    const Bf16x8 g = load_bf16x8<kVector>(gate, c, a.inter);
    const Bf16x8 u = load_bf16x8<kVector>(up, c, a.inter);
    Bf16x8 y;
#pragma unroll
    for (int i = 0; i < 4; i++)
      y.w[i] = pack_bf16(silu_mul(bf16_lo(g.w[i]), bf16_lo(u.w[i])),
                         silu_mul(bf16_hi(g.w[i]), bf16_hi(u.w[i])));
    /* Past the row the inputs read as +0 and silu(0) * 0 = +0: the block amax holds. */
    if (out) store_bf16x8<kVector>(out, c, a.inter, y);
    if (q) store_fp8x8<kVector>(y, q, scale, c, a.inter);
  }
}

ina_status_t check_args(int64_t rows, int64_t inter, const uint16_t *gate, const uint16_t *up,
                        int64_t in_stride, const uint16_t *out, const uint8_t *out_fp8,
                        const float *out_scale_inv) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(rows >= 0 && rows <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_silu_mul: rows %lld must be in [0, %d]", (long long)rows, INT_MAX);
  INA_REQUIRE(inter >= 1 && inter <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_silu_mul: inter %lld must be in [1, %d]", (long long)inter, INT_MAX);
  INA_REQUIRE(in_stride >= inter, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_silu_mul: in_stride %lld is below inter %lld", (long long)in_stride,
              (long long)inter);
  INA_REQUIRE(out != NULL || out_fp8 != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_silu_mul: no output (out and out_fp8 are both NULL)");
  INA_REQUIRE((out_fp8 == NULL) == (out_scale_inv == NULL), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_silu_mul: out_fp8 and out_scale_inv must be given together");
  INA_REQUIRE(rows == 0 || (gate && up), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_silu_mul: NULL gate or up for %lld rows", (long long)rows);
  INA_REQUIRE(ina_gpu_aligned(gate, 2) && ina_gpu_aligned(up, 2) && ina_gpu_aligned(out, 2) &&
                  ina_gpu_aligned(out_scale_inv, 4),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_silu_mul: pointers must be aligned to their element size");
fail:
  return st;
}

}  // namespace

extern "C" ina_status_t ina_gpu_silu_mul(int64_t rows, int64_t inter, const uint16_t *gate,
                                         const uint16_t *up, int64_t in_stride, uint16_t *out,
                                         uint8_t *out_fp8, float *out_scale_inv, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  SiluArgs a = {};
  bool vector = false;
  int threads = 0;
  INA_CHECK(check_args(rows, inter, gate, up, in_stride, out, out_fp8, out_scale_inv));
  if (rows == 0) return INA_OK;
  a.inter = inter;
  a.lanes_padded = (inter + kFp8Block - 1) / kFp8Block * kLanesPerFp8Block;
  a.gate = gate;
  a.up = up;
  a.in_stride = in_stride;
  a.out = out;
  a.out_fp8 = out_fp8;
  a.out_scale_inv = out_scale_inv;
  vector = inter % kLaneValues == 0 && in_stride % kLaneValues == 0 && ina_gpu_aligned(gate, 16) &&
           ina_gpu_aligned(up, 16) && ina_gpu_aligned(out, 16) && ina_gpu_aligned(out_fp8, 8);
  threads = a.lanes_padded >= kMaxThreads ? kMaxThreads
                                          : (int)((a.lanes_padded + kWarp - 1) / kWarp * kWarp);
  if (vector)
    silu_mul_kernel<true><<<(unsigned)rows, threads, 0, s>>>(a);
  else
    silu_mul_kernel<false><<<(unsigned)rows, threads, 0, s>>>(a);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
