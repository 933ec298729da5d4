/* The append kernel of mla/mla_append.h: RMSNorm of the latent, rope of the key and the
 * write into a BF16 or FP8 paged cache, fused, one warp per token.
 *
 * The arithmetic is the reference's, operation for operation, with the rounding spelled
 * out (__fmul_rn and friends) so that no contraction into FMAs and no fast-math flag can
 * change a result:
 *   - the sum of squares is taken in double; every square of a bf16 value is exact there
 *     and so is the sum, so the warp's summation order gives the reference's value;
 *   - the FP8 quotient is an IEEE division per value (a few hundred per token; the
 *     append is far from bound by them), the scale is core/fp8_quant_rule.h's rule and
 *     cvt.rn.satfinite.e4m3 rounds and saturates as ina_f32_to_fp8_e4m3 does;
 *   - sin and cos are taken in double and rounded to float, as the reference does.
 *
 * Layout of the work: lane l of the warp handles latent values l, l + 32, ... (bf16), or
 * values 4l .. 4l+3 of each 128-value block (FP8, so a block's amax is one warp
 * reduction), and rope pairs l, l + 32, .... Stores are per element and coalesced across
 * the warp; a token moves about a kilobyte, so the kernel is bound by launch latency,
 * not bandwidth, at any batch an append sees. */
#define INA_LOG_SUBSYS "mla"
#include "mla/mla_append.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <limits.h>

#include "core/cuda_check.h"
#include "core/cuda_math.cuh"
#include "core/fp8_quant_rule.h"
#include "mla/mla_append_args.h"

namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerCta = 4;
constexpr int kThreads = kWarpsPerCta * kWarpSize;
constexpr int kFp8Block = 128;
constexpr int kFp8ValuesPerLane = kFp8Block / kWarpSize; /* 4 */

/* What the kernel reads from the parameters, flattened to plain values. */
struct AppendArgs {
  int32_t num_tokens;
  int32_t C, R, page_size;
  const uint16_t *kv;
  int64_t kv_stride;
  const uint16_t *norm_weight;
  float eps;
  const float *inv_freq;
  float attention_factor;
  const void *positions;
  const int32_t *page_ids, *slots;
  char *latent, *rope, *scale;
  int64_t latent_page_stride, latent_token_stride;
  int64_t rope_page_stride, rope_token_stride;
  int64_t scale_page_stride, scale_token_stride;
};

using ina_cuda::bf16_to_f32;
using ina_cuda::f32_to_bf16;
using ina_cuda::warp_max;
using ina_cuda::warp_sum;

/* The normalized latent value c of the row: w[c] * (x[c] * inv). */
__device__ __forceinline__ float normalized(const AppendArgs &a, const uint16_t *x, int c,
                                            float inv) {
  return __fmul_rn(bf16_to_f32(__ldg(&a.norm_weight[c])),
                   __fmul_rn(bf16_to_f32(__ldg(&x[c])), inv));
}

/* Quantizes the normalized latent block by block: lane l takes values 4l .. 4l+3 of each
 * 128-value block; lane 0 writes the block's scale. */
__device__ __forceinline__ void write_latent_fp8(const AppendArgs &a, const uint16_t *x, float inv,
                                                 uint8_t *latent, float *scale, int lane) {
  for (int block = 0; block < a.C / kFp8Block; block++) {
    const int c0 = block * kFp8Block + lane * kFp8ValuesPerLane;
    float y[kFp8ValuesPerLane];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kFp8ValuesPerLane; j++) {
      y[j] = normalized(a, x, c0 + j, inv);
      amax = fmaxf(amax, fabsf(y[j]));
    }
    amax = warp_max(amax);
    const float scale_inv = ina_fp8_rule_scale_inv(amax);
#pragma unroll
    for (int j = 0; j < kFp8ValuesPerLane; j++)
      latent[c0 + j] =
          (uint8_t)__nv_cvt_float_to_fp8(__fdiv_rn(y[j], scale_inv), __NV_SATFINITE, __NV_E4M3);
    if (lane == 0) scale[block] = scale_inv;
  }
}

template <bool kFp8, bool kPairs, typename Position>
__global__ void __launch_bounds__(kThreads) append_kernel(const AppendArgs a) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t token = (int64_t)blockIdx.x * kWarpsPerCta + threadIdx.x / kWarpSize;
  if (token >= a.num_tokens) return; /* whole warps leave together */
  const int64_t page = a.page_ids[token], slot = a.slots[token];
  if (page < 0 || slot < 0 || slot >= a.page_size) return;
  const uint16_t *x = a.kv + token * a.kv_stride;

  double sum_squares = 0;
  for (int c = lane; c < a.C; c += kWarpSize) {
    const double v = bf16_to_f32(__ldg(&x[c]));
    sum_squares += v * v;
  }
  sum_squares = warp_sum(sum_squares);
  const float mean = __double2float_rn(__ddiv_rn(sum_squares, (double)a.C));
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.eps)));

  char *latent = a.latent + page * a.latent_page_stride + slot * a.latent_token_stride;
  if (kFp8) {
    float *scale = reinterpret_cast<float *>(a.scale + page * a.scale_page_stride +
                                             slot * a.scale_token_stride);
    write_latent_fp8(a, x, inv, reinterpret_cast<uint8_t *>(latent), scale, lane);
  } else {
    uint16_t *out = reinterpret_cast<uint16_t *>(latent);
    for (int c = lane; c < a.C; c += kWarpSize) out[c] = f32_to_bf16(normalized(a, x, c, inv));
  }

  const float pos = (float)static_cast<const Position *>(a.positions)[token];
  const uint16_t *key = x + a.C;
  uint16_t *rope =
      reinterpret_cast<uint16_t *>(a.rope + page * a.rope_page_stride + slot * a.rope_token_stride);
  const int half = a.R / 2;
  for (int i = lane; i < half; i += kWarpSize) {
    const float angle = __fmul_rn(pos, __ldg(&a.inv_freq[i]));
    double sin_d, cos_d;
    sincos((double)angle, &sin_d, &cos_d);
    const float c = __fmul_rn(__double2float_rn(cos_d), a.attention_factor);
    const float s = __fmul_rn(__double2float_rn(sin_d), a.attention_factor);
    const int ia = kPairs ? 2 * i : i, ib = kPairs ? 2 * i + 1 : i + half;
    const float xa = bf16_to_f32(__ldg(&key[ia])), xb = bf16_to_f32(__ldg(&key[ib]));
    rope[ia] = f32_to_bf16(__fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s)));
    rope[ib] = f32_to_bf16(__fadd_rn(__fmul_rn(xb, c), __fmul_rn(xa, s)));
  }
}

template <bool kFp8, bool kPairs>
void launch_with_layout(const AppendArgs &a, ina_dtype_t positions_dtype, unsigned grid,
                        cudaStream_t s) {
  if (positions_dtype == INA_DTYPE_I64)
    append_kernel<kFp8, kPairs, int64_t><<<grid, kThreads, 0, s>>>(a);
  else
    append_kernel<kFp8, kPairs, int32_t><<<grid, kThreads, 0, s>>>(a);
}

template <bool kFp8>
void launch_with_format(const AppendArgs &a, const ina_mla_append_params_t *p, unsigned grid,
                        cudaStream_t s) {
  if (p->rope_layout == INA_MLA_ROPE_PAIRS)
    launch_with_layout<kFp8, true>(a, p->positions_dtype, grid, s);
  else
    launch_with_layout<kFp8, false>(a, p->positions_dtype, grid, s);
}

}  // namespace

extern "C" ina_status_t ina_mla_append(const ina_mla_append_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  AppendArgs a = {};
  unsigned grid = 0;
  INA_CHECK(ina_mla_append_check_args(p, "ina_mla_append"));
  INA_REQUIRE(p->cache.format == INA_MLA_CACHE_BF16 || p->cache.format == INA_MLA_CACHE_FP8,
              INA_ERR_UNSUPPORTED,
              "ina_mla_append: the GPU writes BF16 and FP8 caches only (got format %d)",
              (int)p->cache.format);
  if (p->num_tokens == 0) return INA_OK;

  a.num_tokens = p->num_tokens;
  a.C = p->cache.kv_lora_rank;
  a.R = p->cache.rope_dim;
  a.page_size = p->cache.page_size;
  a.kv = p->kv;
  a.kv_stride = p->kv_stride;
  a.norm_weight = p->norm_weight;
  a.eps = p->eps;
  a.inv_freq = p->inv_freq;
  a.attention_factor = p->attention_factor;
  a.positions = p->positions;
  a.page_ids = p->page_ids;
  a.slots = p->slots;
  a.latent = static_cast<char *>(p->cache.latent);
  a.rope = static_cast<char *>(p->cache.rope);
  a.scale = static_cast<char *>(p->cache.scale);
  a.latent_page_stride = p->cache.latent_page_stride;
  a.latent_token_stride = p->cache.latent_token_stride;
  a.rope_page_stride = p->cache.rope_page_stride;
  a.rope_token_stride = p->cache.rope_token_stride;
  a.scale_page_stride = p->cache.scale_page_stride;
  a.scale_token_stride = p->cache.scale_token_stride;
  grid = (unsigned)((p->num_tokens + kWarpsPerCta - 1) / kWarpsPerCta);

  if (p->cache.format == INA_MLA_CACHE_FP8)
    launch_with_format<true>(a, p, grid, s);
  else
    launch_with_format<false>(a, p, grid, s);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
