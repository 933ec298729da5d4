/* MoE weighted combine (moe_ep/moe_gpu.h): one CTA per token. The token's top_k slots
 * and weights are staged in shared memory once; each thread then owns 8-value lanes of
 * the hidden row and accumulates the weighted expert rows in fp32 in increasing k,
 * adds the shared expert's row last and rounds once to bf16. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "moe_ep/moe_gpu.h"

#include <limits.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

using namespace ina_gpu;

constexpr int kMaxThreads = 256;
constexpr int kMaxTopK = 64;

struct CombineArgs {
  int32_t top_k;
  int64_t hidden;
  const uint16_t *expert_out;
  int64_t expert_rows;
  const int32_t *slot_of;
  const float *weights;
  const uint16_t *shared_out;
  uint16_t *out;
};

template <bool kVector>
__global__ void __launch_bounds__(kMaxThreads) combine_kernel(const CombineArgs a) {
  __shared__ int32_t slot_s[kMaxTopK];
  __shared__ float weight_s[kMaxTopK];
  const int64_t t = blockIdx.x;
  for (int j = threadIdx.x; j < a.top_k; j += blockDim.x) {
    const int32_t slot = a.slot_of[t * a.top_k + j];
    slot_s[j] = slot >= 0 && slot < a.expert_rows ? slot : -1;
    weight_s[j] = a.weights[t * a.top_k + j];
  }
  __syncthreads();
  const uint16_t *shared = a.shared_out ? a.shared_out + t * a.hidden : nullptr;
  uint16_t *out = a.out + t * a.hidden;
  for (int64_t c = (int64_t)threadIdx.x * kLaneValues; c < a.hidden;
       c += (int64_t)blockDim.x * kLaneValues) {
    float acc[kLaneValues];
#pragma unroll
    for (int i = 0; i < kLaneValues; i++) acc[i] = 0.0f;
    for (int j = 0; j < a.top_k; j++) {
      const int32_t slot = slot_s[j];
      if (slot < 0) continue;
      const float w = weight_s[j];
      const Bf16x8 y = load_bf16x8<kVector>(a.expert_out + (int64_t)slot * a.hidden, c, a.hidden);
#pragma unroll
      for (int i = 0; i < kLaneValues; i++) acc[i] = __fmaf_rn(bf16x8_get(y, i), w, acc[i]);
    }
    if (shared) {
      const Bf16x8 s = load_bf16x8<kVector>(shared, c, a.hidden);
#pragma unroll
      for (int i = 0; i < kLaneValues; i++) acc[i] = __fadd_rn(acc[i], bf16x8_get(s, i));
    }
    Bf16x8 o;
#pragma unroll
    for (int i = 0; i < 4; i++) o.w[i] = pack_bf16(acc[2 * i], acc[2 * i + 1]);
    store_bf16x8<kVector>(out, c, a.hidden, o);
  }
}

}  // namespace

extern "C" ina_status_t ina_gpu_moe_combine(int64_t tokens, int32_t top_k, int64_t hidden,
                                            const uint16_t *expert_out, int64_t expert_rows,
                                            const int32_t *slot_of, const float *weights,
                                            const uint16_t *shared_out, uint16_t *out,
                                            void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  CombineArgs a = {};
  int64_t lanes = 0;
  int threads = 0;
  bool vector = false;
  INA_REQUIRE(tokens >= 0 && tokens <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_combine: tokens %lld must be in [0, %d]", (long long)tokens, INT_MAX);
  INA_REQUIRE(top_k >= 1 && top_k <= kMaxTopK, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_combine: top_k %d must be in [1, %d]", (int)top_k, kMaxTopK);
  INA_REQUIRE(hidden >= 1 && expert_rows >= 0, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_combine: hidden %lld must be >= 1 and expert_rows %lld >= 0",
              (long long)hidden, (long long)expert_rows);
  INA_REQUIRE(expert_rows <= INT64_MAX / 2 / hidden, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_combine: expert_out [%lld, %lld] overflows the address space",
              (long long)expert_rows, (long long)hidden);
  if (tokens == 0) return INA_OK;
  INA_REQUIRE(slot_of && weights && out && (expert_out || expert_rows == 0),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_combine: NULL expert_out, slot_of, weights or out for %lld tokens",
              (long long)tokens);
  INA_REQUIRE(ina_gpu_aligned(expert_out, 2) && ina_gpu_aligned(slot_of, 4) &&
                  ina_gpu_aligned(weights, 4) && ina_gpu_aligned(shared_out, 2) &&
                  ina_gpu_aligned(out, 2),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_combine: pointers must be aligned to their element size");
  INA_REQUIRE(!shared_out || shared_out == out ||
                  (shared_out + tokens * hidden <= out || out + tokens * hidden <= shared_out),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_combine: shared_out overlaps out without being out itself");

  a.top_k = top_k;
  a.hidden = hidden;
  a.expert_out = expert_out;
  a.expert_rows = expert_rows;
  a.slot_of = slot_of;
  a.weights = weights;
  a.shared_out = shared_out;
  a.out = out;
  vector = hidden % kLaneValues == 0 && ina_gpu_aligned(expert_out, 16) &&
           ina_gpu_aligned(shared_out, 16) && ina_gpu_aligned(out, 16);
  lanes = (hidden + kLaneValues - 1) / kLaneValues;
  threads = lanes >= kMaxThreads ? kMaxThreads : (int)((lanes + kWarp - 1) / kWarp * kWarp);
  if (vector)
    combine_kernel<true><<<(unsigned)tokens, threads, 0, s>>>(a);
  else
    combine_kernel<false><<<(unsigned)tokens, threads, 0, s>>>(a);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
