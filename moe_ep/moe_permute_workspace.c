/* Workspace size of the MoE permutation (moe_ep/moe_gpu.h): one int32 per (chunk of
 * entries, expert), a pure function of the shape, the same with and without CUDA. */
#include "moe_ep/moe_gpu.h"
#include "moe_ep/moe_permute_layout.h"

size_t ina_gpu_moe_permute_workspace_size(int64_t tokens, int32_t top_k, int32_t num_experts) {
  if (tokens <= 0 || top_k <= 0 || num_experts <= 0) return 0;
  const int64_t entries = tokens * top_k;
  const size_t chunks = (size_t)((entries + INA_GPU_MOE_PERMUTE_CHUNK_ENTRIES - 1) /
                                 INA_GPU_MOE_PERMUTE_CHUNK_ENTRIES);
  const size_t bytes = chunks * (size_t)num_experts * sizeof(int32_t);
  return (bytes + INA_GPU_MOE_PERMUTE_WORKSPACE_ALIGN - 1) / INA_GPU_MOE_PERMUTE_WORKSPACE_ALIGN *
         INA_GPU_MOE_PERMUTE_WORKSPACE_ALIGN;
}
