/* Device helpers of the sampling kernels (internal; CUDA only): reading a logit of
 * either dtype, and the CTA-wide arg-max of a row with model/sampler.h's rule. */
#ifndef INA_GPU_OPS_SAMPLING_DEVICE_CUH
#define INA_GPU_OPS_SAMPLING_DEVICE_CUH

#include "gpu_ops/gpu_ops_device.cuh"

namespace ina_gpu {

constexpr int kSamplingThreads = 512;

/* Logit i of a row stored as f32 (float) or bf16 (uint16_t bits). */
__device__ __forceinline__ float logit_at(const float *row, int64_t i) { return __ldg(row + i); }
__device__ __forceinline__ float logit_at(const uint16_t *row, int64_t i) {
  return bf16_to_f32(__ldg(row + i));
}

/* The selection key of the row's first maximum (ina_argmax_f32: NaN skipped; -0 equals
 * +0). Every thread gets it; select_key_index gives the token. When every entry is NaN
 * the key's value part is 0 and its index 0, matching ina_argmax_f32's answer. */
template <typename T>
__device__ __forceinline__ uint64_t row_argmax_key(const T *row, int64_t vocab, uint64_t *scratch) {
  uint64_t best = 0u;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const uint64_t k = select_key(logit_at(row, i), (uint32_t)i);
    best = k > best ? k : best;
  }
  return block_max_u64(best, scratch);
}

/* Whether the key's value was NaN (the row had no number at all when it won). */
__device__ __forceinline__ bool key_is_nan(uint64_t key) { return (key >> 32) == 0u; }

}  // namespace ina_gpu

#endif
