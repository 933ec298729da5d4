/* The padding rows of a step's routing (moe_ep/moe_gpu.h): counting tokens routed per
 * expert without them (ina_gpu_moe_count: one thread per (token, k) entry adds one to its
 * expert's 64-bit counter; integer sums do not depend on the order of the atomics, so the
 * counts are exact and deterministic), and dropping them (ina_gpu_moe_drop_rows). */
#define INA_LOG_SUBSYS "gpu_ops"
#include "moe_ep/moe_gpu.h"

#include <limits.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    count_kernel(const int32_t *ids, int64_t entries, int32_t top_k, const int32_t *row_mask, int32_t experts,
                 unsigned long long *counts) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (i >= entries) return;
  if (row_mask && row_mask[i / top_k] < 0) return;
  const int32_t x = ids[i];
  if (x >= 0 && x < experts) atomicAdd(&counts[x], 1ull);
}

__global__ void __launch_bounds__(kThreads)
    drop_kernel(int32_t *ids, int64_t entries, int32_t top_k, const int32_t *row_mask) {
  const int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x;
  if (i < entries && row_mask[i / top_k] < 0) ids[i] = -1;
}

}  // namespace

extern "C" ina_status_t ina_gpu_moe_count(const int32_t *ids, int64_t tokens, int32_t top_k, const int32_t *row_mask,
                                          int32_t num_experts, uint64_t *counts, void *stream) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(tokens >= 0 && top_k >= 1 && num_experts >= 1 && tokens <= INT_MAX / top_k, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_count: tokens %lld, top_k %d and num_experts %d out of range", (long long)tokens,
              (int)top_k, (int)num_experts);
  if (tokens == 0) return INA_OK;
  INA_REQUIRE(ids && counts, INA_ERR_INVALID_ARGUMENT, "ina_gpu_moe_count: NULL ids or counts");
  INA_REQUIRE(ina_gpu_aligned(ids, 4) && ina_gpu_aligned(row_mask, 4) && ina_gpu_aligned(counts, 8),
              INA_ERR_INVALID_ARGUMENT, "ina_gpu_moe_count: pointers must be aligned to their element size");
  {
    const int64_t entries = tokens * top_k;
    count_kernel<<<(unsigned)((entries + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        ids, entries, top_k, row_mask, num_experts, reinterpret_cast<unsigned long long *>(counts));
    INA_CUDA_CHECK_LAUNCH();
  }
fail:
  return st;
}

extern "C" ina_status_t ina_gpu_moe_drop_rows(int32_t *ids, int64_t tokens, int32_t top_k, const int32_t *row_mask,
                                              void *stream) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(tokens >= 0 && top_k >= 1 && tokens <= INT_MAX / top_k, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_drop_rows: tokens %lld and top_k %d out of range", (long long)tokens, (int)top_k);
  if (tokens == 0) return INA_OK;
  INA_REQUIRE(ids && row_mask, INA_ERR_INVALID_ARGUMENT, "ina_gpu_moe_drop_rows: NULL ids or row_mask");
  INA_REQUIRE(ina_gpu_aligned(ids, 4) && ina_gpu_aligned(row_mask, 4), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_drop_rows: pointers must be 4-byte aligned");
  {
    const int64_t entries = tokens * top_k;
    drop_kernel<<<(unsigned)((entries + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        ids, entries, top_k, row_mask);
    INA_CUDA_CHECK_LAUNCH();
  }
fail:
  return st;
}
