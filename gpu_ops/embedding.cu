/* Embedding gather (gpu_ops/gpu_ops.h): one CTA per token copies its weight row, eight
 * values (16 bytes of output) per thread per step. A bf16 table is copied bit for bit;
 * an f32 table is rounded to bf16. The id is read once per CTA, clamped into the table
 * (so a bad id can never address memory outside it) and reported through the error word. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "gpu_ops/gpu_ops.h"

#include <limits.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

using namespace ina_gpu;

constexpr int kMaxThreads = 256;

template <bool kVector, bool kF32>
__global__ void __launch_bounds__(kMaxThreads)
    embedding_kernel(const int32_t *__restrict__ ids, const void *__restrict__ weight,
                     int64_t vocab, int64_t hidden, uint16_t *__restrict__ out,
                     uint32_t *error_flags) {
  const int64_t t = blockIdx.x;
  int64_t id = ids[t];
  if (id < 0 || id >= vocab) {
    if (threadIdx.x == 0) raise_flag(error_flags, INA_GPU_OPS_FLAG_TOKEN_ID);
    id = id < 0 ? 0 : vocab - 1;
  }
  uint16_t *dst = out + t * hidden;
  for (int64_t c = (int64_t)threadIdx.x * kLaneValues; c < hidden;
       c += (int64_t)blockDim.x * kLaneValues) {
    Bf16x8 v;
    if (kF32) {
      float w[kLaneValues];
      load_weight8<kVector>(static_cast<const float *>(weight) + id * hidden, true, c, hidden, w);
#pragma unroll
      for (int i = 0; i < 4; i++) v.w[i] = pack_bf16(w[2 * i], w[2 * i + 1]);
    } else {
      v = load_bf16x8<kVector>(static_cast<const uint16_t *>(weight) + id * hidden, c, hidden);
    }
    store_bf16x8<kVector>(dst, c, hidden, v);
  }
}

ina_status_t check_args(const int32_t *ids, int64_t tokens, const void *weight,
                        ina_dtype_t weight_dtype, int64_t vocab, int64_t hidden,
                        const uint16_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(tokens >= 0 && tokens <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_embedding: tokens %lld must be in [0, %d]", (long long)tokens, INT_MAX);
  INA_REQUIRE(weight_dtype == INA_DTYPE_BF16 || weight_dtype == INA_DTYPE_F32, INA_ERR_UNSUPPORTED,
              "ina_gpu_embedding: weight dtype %s is not supported (bf16 or f32)",
              ina_dtype_name(weight_dtype));
  INA_REQUIRE(vocab >= 1 && hidden >= 1, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_embedding: weight shape [%lld, %lld] must be non-empty", (long long)vocab,
              (long long)hidden);
  INA_REQUIRE(vocab <= INT64_MAX / 4 / hidden, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_embedding: weight shape [%lld, %lld] overflows the address space",
              (long long)vocab, (long long)hidden);
  INA_REQUIRE(tokens == 0 || (ids && weight && out), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_embedding: NULL ids, weight or out for %lld tokens", (long long)tokens);
  INA_REQUIRE(ina_gpu_aligned(weight, ina_dtype_size(weight_dtype)) && ina_gpu_aligned(out, 2) &&
                  ina_gpu_aligned(ids, 4),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_embedding: ids, weight and out must be aligned to their element size");
fail:
  return st;
}

}  // namespace

extern "C" ina_status_t ina_gpu_embedding(const int32_t *ids, int64_t tokens, const void *weight,
                                          ina_dtype_t weight_dtype, int64_t vocab, int64_t hidden,
                                          uint16_t *out, uint32_t *error_flags, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const bool f32 = weight_dtype == INA_DTYPE_F32;
  bool vector = false;
  int64_t lanes = 0;
  int threads = 0;
  INA_CHECK(check_args(ids, tokens, weight, weight_dtype, vocab, hidden, out));
  if (tokens == 0) return INA_OK;

  vector = hidden % kLaneValues == 0 && ina_gpu_aligned(weight, 16) && ina_gpu_aligned(out, 16);
  lanes = (hidden + kLaneValues - 1) / kLaneValues;
  threads = lanes >= kMaxThreads ? kMaxThreads : (int)((lanes + kWarp - 1) / kWarp * kWarp);
  if (vector && f32)
    embedding_kernel<true, true>
        <<<(unsigned)tokens, threads, 0, s>>>(ids, weight, vocab, hidden, out, error_flags);
  else if (vector)
    embedding_kernel<true, false>
        <<<(unsigned)tokens, threads, 0, s>>>(ids, weight, vocab, hidden, out, error_flags);
  else if (f32)
    embedding_kernel<false, true>
        <<<(unsigned)tokens, threads, 0, s>>>(ids, weight, vocab, hidden, out, error_flags);
  else
    embedding_kernel<false, false>
        <<<(unsigned)tokens, threads, 0, s>>>(ids, weight, vocab, hidden, out, error_flags);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
