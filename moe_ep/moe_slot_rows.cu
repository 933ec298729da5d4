/* The rows of an expert-parallel rank's expert slots (moe_ep/moe_gpu.h,
 * ina_gpu_moe_slot_rows): one thread per slot. The cut of an expert's entries among its
 * replicas is the CPU engine's (moe_ep/expert_parallel.h): run j of R is
 * [n * j / R, n * (j + 1) / R) of the expert's n entries. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "moe_ep/moe_gpu.h"

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    slot_rows_kernel(const int32_t *offsets, int32_t num_experts, const int32_t *slot_info, int32_t slots,
                     int32_t *begins, int32_t *ends) {
  const int32_t s = blockIdx.x * kThreads + threadIdx.x;
  if (s >= slots) return;
  const int32_t x = slot_info[3 * s], j = slot_info[3 * s + 1], r = slot_info[3 * s + 2];
  if (x < 0 || x >= num_experts || r < 1 || j < 0 || j >= r) {
    begins[s] = ends[s] = 0;
    return;
  }
  const int64_t first = offsets[x], n = offsets[x + 1] - first;
  begins[s] = (int32_t)(first + n * j / r);
  ends[s] = (int32_t)(first + n * (j + 1) / r);
}

}  // namespace

extern "C" ina_status_t ina_gpu_moe_slot_rows(const int32_t *offsets, int32_t num_experts, const int32_t *slot_info,
                                              int32_t slots, int32_t *begins, int32_t *ends, void *stream) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(num_experts >= 1 && slots >= 0, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_slot_rows: %d experts and %d slots", (int)num_experts, (int)slots);
  if (slots == 0) return INA_OK;
  INA_REQUIRE(offsets && slot_info && begins && ends, INA_ERR_INVALID_ARGUMENT, "ina_gpu_moe_slot_rows: NULL argument");
  slot_rows_kernel<<<(unsigned)((slots + kThreads - 1) / kThreads), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      offsets, num_experts, slot_info, slots, begins, ends);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
