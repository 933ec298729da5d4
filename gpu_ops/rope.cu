/* RoPE of the query's rope part, in place (gpu_ops/gpu_ops.h).
 *
 * CTA (token, group of kHeadsPerCta heads): the threads first take the cos and sin of
 * the token's rope_dim / 2 angles into shared memory (in double, rounded to float, the
 * arithmetic of mla/mla_append.cu's key rotation), then rotate (head, pair) elements,
 * consecutive threads on consecutive pairs of a head so the accesses stay contiguous. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "gpu_ops/gpu_ops.h"

#include <limits.h>
#include <math.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

using namespace ina_gpu;

constexpr int kThreads = 128;
constexpr int kHeadsPerCta = 16;
constexpr int kMaxRopeDim = 1024;
constexpr int kMaxHeads = 65535 * kHeadsPerCta; /* the grid's y limit */

/* Bytes of the version-1 params: everything up to and including positions_dtype. */
constexpr size_t kParamsV1Size =
    offsetof(ina_gpu_rope_params_t, positions_dtype) + sizeof(ina_dtype_t);

struct RopeArgs {
  uint16_t *x;
  int64_t token_stride, head_stride;
  int32_t heads, rope_offset, half;
  const float *inv_freq;
  float attention_factor;
  const void *positions;
};

template <bool kPairs, typename Position>
__global__ void __launch_bounds__(kThreads) rope_kernel(const RopeArgs a) {
  __shared__ float cos_s[kMaxRopeDim / 2], sin_s[kMaxRopeDim / 2];
  const int64_t t = blockIdx.x;
  const int head0 = blockIdx.y * kHeadsPerCta;
  const int heads = min(kHeadsPerCta, a.heads - head0);
  const float pos = (float)static_cast<const Position *>(a.positions)[t];
  for (int i = threadIdx.x; i < a.half; i += blockDim.x) {
    const float angle = __fmul_rn(pos, __ldg(&a.inv_freq[i]));
    double sin_d, cos_d;
    sincos((double)angle, &sin_d, &cos_d);
    cos_s[i] = __fmul_rn(__double2float_rn(cos_d), a.attention_factor);
    sin_s[i] = __fmul_rn(__double2float_rn(sin_d), a.attention_factor);
  }
  __syncthreads();
  uint16_t *base = a.x + t * a.token_stride + (int64_t)head0 * a.head_stride + a.rope_offset;
  for (int idx = threadIdx.x; idx < heads * a.half; idx += blockDim.x) {
    const int h = idx / a.half, i = idx - h * a.half;
    uint16_t *v = base + (int64_t)h * a.head_stride;
    const int ia = kPairs ? 2 * i : i, ib = kPairs ? 2 * i + 1 : i + a.half;
    const float c = cos_s[i], s = sin_s[i];
    const float xa = bf16_to_f32(v[ia]), xb = bf16_to_f32(v[ib]);
    v[ia] = f32_to_bf16(__fsub_rn(__fmul_rn(xa, c), __fmul_rn(xb, s)));
    v[ib] = f32_to_bf16(__fadd_rn(__fmul_rn(xb, c), __fmul_rn(xa, s)));
  }
}

template <bool kPairs>
void launch(const RopeArgs &a, ina_dtype_t positions_dtype, dim3 grid, cudaStream_t s) {
  if (positions_dtype == INA_DTYPE_I64)
    rope_kernel<kPairs, int64_t><<<grid, kThreads, 0, s>>>(a);
  else
    rope_kernel<kPairs, int32_t><<<grid, kThreads, 0, s>>>(a);
}

ina_status_t check_params(const ina_gpu_rope_params_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(p, kParamsV1Size, "ina_gpu_rope: params", "INA_GPU_ROPE_PARAMS_INIT");
  INA_REQUIRE(p->tokens >= 0 && p->tokens <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rope: tokens %lld must be in [0, %d]", (long long)p->tokens, INT_MAX);
  INA_REQUIRE(p->heads >= 1 && p->heads <= kMaxHeads, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rope: heads %d must be in [1, %d]", (int)p->heads, kMaxHeads);
  INA_REQUIRE(p->rope_dim >= 2 && p->rope_dim <= kMaxRopeDim && p->rope_dim % 2 == 0,
              INA_ERR_INVALID_ARGUMENT, "ina_gpu_rope: rope_dim %d must be even, in [2, %d]",
              (int)p->rope_dim, kMaxRopeDim);
  INA_REQUIRE(p->rope_offset >= 0 && p->token_stride >= 0 && p->head_stride >= 0,
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rope: negative rope_offset %d, token_stride %lld or head_stride %lld",
              (int)p->rope_offset, (long long)p->token_stride, (long long)p->head_stride);
  INA_REQUIRE(p->heads == 1 || p->head_stride >= p->rope_dim, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rope: head_stride %lld is below rope_dim %d: heads would overlap",
              (long long)p->head_stride, (int)p->rope_dim);
  INA_REQUIRE(
      p->tokens <= 1 || p->token_stride >= (int64_t)(p->heads - 1) * p->head_stride + p->rope_dim,
      INA_ERR_INVALID_ARGUMENT,
      "ina_gpu_rope: token_stride %lld is below the %lld elements a token's heads span",
      (long long)p->token_stride,
      (long long)((int64_t)(p->heads - 1) * p->head_stride + p->rope_dim));
  INA_REQUIRE(isfinite(p->attention_factor), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rope: attention_factor %g must be finite", (double)p->attention_factor);
  INA_REQUIRE(p->positions_dtype == INA_DTYPE_I32 || p->positions_dtype == INA_DTYPE_I64,
              INA_ERR_INVALID_ARGUMENT, "ina_gpu_rope: positions dtype %s must be i32 or i64",
              ina_dtype_name(p->positions_dtype));
  INA_REQUIRE(p->tokens == 0 || (p->x && p->inv_freq && p->positions), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rope: NULL x, inv_freq or positions for %lld tokens", (long long)p->tokens);
  INA_REQUIRE(ina_gpu_aligned(p->x, 2) && ina_gpu_aligned(p->inv_freq, 4) &&
                  ina_gpu_aligned(p->positions, ina_dtype_size(p->positions_dtype)),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rope: pointers must be aligned to their element size");
fail:
  return st;
}

}  // namespace

extern "C" ina_status_t ina_gpu_rope(const ina_gpu_rope_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  RopeArgs a = {};
  dim3 grid;
  INA_CHECK(check_params(p));
  if (p->tokens == 0) return INA_OK;
  a.x = p->x;
  a.token_stride = p->token_stride;
  a.head_stride = p->head_stride;
  a.heads = p->heads;
  a.rope_offset = p->rope_offset;
  a.half = p->rope_dim / 2;
  a.inv_freq = p->inv_freq;
  a.attention_factor = p->attention_factor;
  a.positions = p->positions;
  grid = dim3((unsigned)p->tokens, (unsigned)((p->heads + kHeadsPerCta - 1) / kHeadsPerCta));
  if (p->pairs_layout)
    launch<true>(a, p->positions_dtype, grid, s);
  else
    launch<false>(a, p->positions_dtype, grid, s);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
