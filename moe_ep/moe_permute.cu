/* MoE permutation (moe_ep/moe_gpu.h): a stable counting sort of the (token, k) entries
 * by expert, in three kernels that never depend on scheduling order:
 *
 *   count:  CTA c counts the experts of its chunk of kChunkEntries entries
 *           (workspace[c][x]); integer counts do not depend on the atomics' order.
 *   scan:   one CTA; thread x turns workspace[.][x] into the exclusive prefix over the
 *           chunks and writes the expert's total; the totals' exclusive scan gives the
 *           offsets.
 *   place:  CTA c again; warp w of it owns a contiguous run of kWarpEntries entries,
 *           32 per round. A warp's entries for expert x land at
 *             offsets[x] + (earlier chunks) + (earlier warps of this chunk)
 *                        + (earlier rounds of this warp) + (earlier lanes of this round)
 *           with the lanes of one expert found by __match_any_sync. That is exactly the
 *           entry's rank in increasing entry order among the entries of its expert. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "moe_ep/moe_gpu.h"

#include <limits.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"
#include "moe_ep/moe_permute_layout.h"

namespace {

using namespace ina_gpu;

constexpr int kMaxExperts = 1024;
constexpr int kChunkWarps = 8;
constexpr int kChunkThreads = kChunkWarps * kWarp;
constexpr int kRounds = 8;
constexpr int kWarpEntries = kRounds * kWarp;             /* 256 */
constexpr int kChunkEntries = kChunkWarps * kWarpEntries; /* 2048 */
constexpr int kScanThreads = kMaxExperts;
static_assert(kChunkEntries == INA_GPU_MOE_PERMUTE_CHUNK_ENTRIES, "workspace layout");
static_assert(kMaxExperts == INA_GPU_MOE_PERMUTE_MAX_EXPERTS, "workspace layout");

/* Bytes of the version-1 params: everything up to and including error_flags. */
constexpr size_t kParamsV1Size =
    offsetof(ina_gpu_moe_permute_params_t, error_flags) + sizeof(uint32_t *);
/* Version 2 adds first_expert and total_experts. */
constexpr size_t kParamsV2Size = offsetof(ina_gpu_moe_permute_params_t, total_experts) + sizeof(int32_t);

struct PermuteArgs {
  int64_t entries; /* tokens * top_k */
  int32_t top_k, experts;
  int32_t first_expert, all_experts; /* an expert-parallel rank's range (params v2) */
  const int32_t *ids;
  int32_t *counts, *offsets, *sorted_token, *slot_of;
  int32_t *chunk_base; /* workspace [chunks][experts] */
  uint32_t *error_flags;
};

/* The expert of entry i among those kept (its id - first_expert), or -1 when it is
 * dropped (past the end, negative, another rank's, too large). */
__device__ __forceinline__ int32_t entry_expert(const PermuteArgs &a, int64_t i) {
  if (i >= a.entries) return -1;
  const int32_t id = a.ids[i] - a.first_expert;
  return id >= 0 && id < a.experts ? id : -1;
}

__global__ void __launch_bounds__(kChunkThreads) count_kernel(const PermuteArgs a) {
  __shared__ int32_t hist[kMaxExperts];
  const int64_t begin = (int64_t)blockIdx.x * kChunkEntries;
  for (int x = threadIdx.x; x < a.experts; x += blockDim.x) hist[x] = 0;
  __syncthreads();
  bool bad = false;
  for (int k = threadIdx.x; k < kChunkEntries; k += blockDim.x) {
    const int64_t i = begin + k;
    if (i >= a.entries) break;
    const int32_t id = a.ids[i] - a.first_expert;
    if (id >= 0 && id < a.experts)
      atomicAdd(&hist[id], 1);
    else if (a.ids[i] >= a.all_experts)
      bad = true;
  }
  if (bad) raise_flag(a.error_flags, INA_GPU_OPS_FLAG_EXPERT_ID);
  __syncthreads();
  for (int x = threadIdx.x; x < a.experts; x += blockDim.x)
    a.chunk_base[(int64_t)blockIdx.x * a.experts + x] = hist[x];
}

__global__ void __launch_bounds__(kScanThreads) scan_kernel(const PermuteArgs a, int64_t chunks) {
  __shared__ int32_t warp_totals[kWarp];
  const int x = threadIdx.x;
  int32_t running = 0;
  if (x < a.experts) {
    int32_t *col = a.chunk_base + x;
    for (int64_t c = 0; c < chunks; c++) {
      const int32_t n = col[c * a.experts];
      col[c * a.experts] = running;
      running += n;
    }
    a.counts[x] = running;
  }
  int32_t total = 0;
  const int32_t offset = block_exclusive_scan(running, warp_totals, &total);
  if (x < a.experts) a.offsets[x] = offset;
  if (x == 0) a.offsets[a.experts] = total;
}

__global__ void __launch_bounds__(kChunkThreads) place_kernel(const PermuteArgs a) {
  __shared__ int32_t cursor[kChunkWarps][kMaxExperts];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t chunk = blockIdx.x;
  const int64_t first = chunk * kChunkEntries + (int64_t)warp * kWarpEntries + lane;
  const uint32_t lanes_below = (1u << lane) - 1u;

  for (int x = lane; x < a.experts; x += kWarp) cursor[warp][x] = 0;
  __syncwarp();
  /* This warp's count per expert. */
  for (int r = 0; r < kRounds; r++) {
    const int32_t x = entry_expert(a, first + r * kWarp);
    const uint32_t same = __match_any_sync(0xFFFFFFFFu, x);
    if (x >= 0 && lane == __ffs(same) - 1) cursor[warp][x] += __popc(same);
    __syncwarp();
  }
  __syncthreads();
  /* Turn the counts into each warp's first slot per expert. */
  for (int x = threadIdx.x; x < a.experts; x += blockDim.x) {
    int32_t slot = a.offsets[x] + a.chunk_base[chunk * a.experts + x];
    for (int w = 0; w < kChunkWarps; w++) {
      const int32_t n = cursor[w][x];
      cursor[w][x] = slot;
      slot += n;
    }
  }
  __syncthreads();
  const int32_t kept = a.offsets[a.experts];
  for (int r = 0; r < kRounds; r++) {
    const int64_t i = first + r * kWarp;
    const int32_t x = entry_expert(a, i);
    const uint32_t same = __match_any_sync(0xFFFFFFFFu, x);
    if (i < a.entries) {
      if (x >= 0) {
        const int32_t slot = cursor[warp][x] + __popc(same & lanes_below);
        a.sorted_token[slot] = (int32_t)(i / a.top_k);
        a.slot_of[i] = slot;
      } else {
        a.slot_of[i] = -1;
      }
      /* Slots past the kept entries: -1 (slot numbers and entry numbers share a range). */
      if (i >= kept) a.sorted_token[i] = -1;
    }
    __syncwarp();
    if (x >= 0 && lane == __ffs(same) - 1) cursor[warp][x] += __popc(same);
    __syncwarp();
  }
}

int64_t chunk_count(int64_t entries) { return (entries + kChunkEntries - 1) / kChunkEntries; }

ina_status_t check_params(const ina_gpu_moe_permute_params_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(p, kParamsV1Size, "ina_gpu_moe_permute: params",
                        "INA_GPU_MOE_PERMUTE_PARAMS_INIT");
  INA_REQUIRE(p->tokens >= 0 && p->top_k >= 1, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_permute: tokens %lld must be >= 0 and top_k %d >= 1",
              (long long)p->tokens, (int)p->top_k);
  INA_REQUIRE(p->tokens <= (INT_MAX - kChunkEntries) / p->top_k, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_permute: %lld tokens x top_k %d entries exceed the int32 slot range",
              (long long)p->tokens, (int)p->top_k);
  INA_REQUIRE(p->num_experts >= 1 && p->num_experts <= kMaxExperts, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_permute: num_experts %d must be in [1, %d]", (int)p->num_experts,
              kMaxExperts);
  if (p->struct_size >= kParamsV2Size)
    INA_REQUIRE(p->first_expert >= 0 &&
                    (p->total_experts == 0 || p->first_expert + p->num_experts <= p->total_experts),
                INA_ERR_INVALID_ARGUMENT,
                "ina_gpu_moe_permute: experts [%d, %d) are not a range of the %d experts",
                (int)p->first_expert, (int)(p->first_expert + p->num_experts), (int)p->total_experts);
  INA_REQUIRE(p->expert_counts && p->expert_offsets, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_permute: expert_counts and expert_offsets must not be NULL");
  INA_REQUIRE(p->tokens == 0 || (p->ids && p->sorted_token && p->slot_of && p->workspace),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_permute: NULL ids, sorted_token, slot_of or workspace for %lld tokens",
              (long long)p->tokens);
  INA_REQUIRE(
      p->workspace_bytes >= ina_gpu_moe_permute_workspace_size(p->tokens, p->top_k, p->num_experts),
      INA_ERR_INVALID_ARGUMENT,
      "ina_gpu_moe_permute: workspace of %zu bytes is below the %zu needed", p->workspace_bytes,
      ina_gpu_moe_permute_workspace_size(p->tokens, p->top_k, p->num_experts));
  INA_REQUIRE(ina_gpu_aligned(p->workspace, INA_GPU_MOE_PERMUTE_WORKSPACE_ALIGN),
              INA_ERR_INVALID_ARGUMENT, "ina_gpu_moe_permute: workspace must be %d-byte aligned",
              INA_GPU_MOE_PERMUTE_WORKSPACE_ALIGN);
  INA_REQUIRE(ina_gpu_aligned(p->ids, 4) && ina_gpu_aligned(p->expert_counts, 4) &&
                  ina_gpu_aligned(p->expert_offsets, 4) && ina_gpu_aligned(p->sorted_token, 4) &&
                  ina_gpu_aligned(p->slot_of, 4),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_moe_permute: pointers must be aligned to their element size");
fail:
  return st;
}

}  // namespace

extern "C" ina_status_t ina_gpu_moe_permute(const ina_gpu_moe_permute_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  PermuteArgs a = {};
  int64_t chunks = 0;
  INA_CHECK(check_params(p));
  a.entries = p->tokens * p->top_k;
  a.top_k = p->top_k;
  a.experts = p->num_experts;
  a.first_expert = 0;
  a.all_experts = p->num_experts;
  if (p->struct_size >= kParamsV2Size) {
    a.first_expert = p->first_expert;
    a.all_experts = p->total_experts > 0 ? p->total_experts : p->num_experts;
  }
  a.ids = p->ids;
  a.counts = p->expert_counts;
  a.offsets = p->expert_offsets;
  a.sorted_token = p->sorted_token;
  a.slot_of = p->slot_of;
  a.chunk_base = static_cast<int32_t *>(p->workspace);
  a.error_flags = p->error_flags;
  chunks = chunk_count(a.entries);
  if (chunks > 0) {
    count_kernel<<<(unsigned)chunks, kChunkThreads, 0, s>>>(a);
    INA_CUDA_CHECK_LAUNCH();
  }
  /* With no entries the scan still writes zero counts and offsets. */
  scan_kernel<<<1, kScanThreads, 0, s>>>(a, chunks);
  INA_CUDA_CHECK_LAUNCH();
  if (chunks > 0) {
    place_kernel<<<(unsigned)chunks, kChunkThreads, 0, s>>>(a);
    INA_CUDA_CHECK_LAUNCH();
  }
fail:
  return st;
}
