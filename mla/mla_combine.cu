/* The combine pass of split-KV MLA attention: for every split unit of the schedule, merge
 * its chunks' partial results by log-sum-exp and write bf16 out and lse.
 *
 * Chunk s of a row has a normalized partial o_s and its lse_s; the merged row is
 *   lse = log(sum_s exp(lse_s)),  o = sum_s exp(lse_s - lse) o_s
 * computed with the largest lse_s subtracted first. A chunk in which the row saw no
 * position (a causal row ending before the chunk) has lse_s = -inf and weight 0.
 *
 * The pass is short and latency-bound: each row is a chain of dependent loads (merge,
 * request, lses, partials). So it runs many warps, one row per warp: for rank 512 a lane
 * owns 4 consecutive dims of every 128-dim segment and issues the loads of all segments
 * and two splits before using any. The grid is fixed (the plan's CTA count), so a CUDA
 * graph of run stays valid for any plan of the bucket. The kernel is launched with
 * programmatic dependent launch behind the attention kernel: its CTAs take the SMs as
 * the attention CTAs leave and wait for that grid's writes only where they need them. */
#define INA_LOG_SUBSYS "mla"
#include <math.h>

#include "mla/mla_device.cuh"

namespace ina_mla {
namespace {

constexpr int kThreads = 256; /* two CTAs per SM at ~95 registers: one wave of the plan's grid */
constexpr int kWarps = kThreads / 32;
constexpr int kSegment = 128;                  /* dims per segment: 32 lanes x 4 */
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ void fma4(float4 &acc, float w, const float4 v) {
  acc.x = fmaf(w, v.x, acc.x);
  acc.y = fmaf(w, v.y, acc.y);
  acc.z = fmaf(w, v.z, acc.z);
  acc.w = fmaf(w, v.w, acc.w);
}

/* Merges one row of kSegs full segments (DeepSeek's rank 512: 16-byte aligned partial
 * rows, 4-byte aligned bf16 pairs out). */
template <int kSegs>
__device__ __forceinline__ void merge_row_vec(const float *part, int64_t split_stride, const float *lse,
                                              int n, float mx, float inv, int C, __nv_bfloat16 *dst) {
  const int lane = threadIdx.x & 31;
  float4 acc[kSegs];
#pragma unroll
  for (int k = 0; k < kSegs; k++) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  int s = 0;
  for (; s + 2 <= n; s += 2) { /* two splits' loads in flight together */
    float4 v0[kSegs], v1[kSegs];
#pragma unroll
    for (int k = 0; k < kSegs; k++) {
      const int d = k * kSegment + 4 * lane;
      if (d < C) {
        v0[k] = __ldcg(reinterpret_cast<const float4 *>(part + s * split_stride + d));
        v1[k] = __ldcg(reinterpret_cast<const float4 *>(part + (s + 1) * split_stride + d));
      }
    }
    const float w0 = exp2f((__ldcg(lse + s * INA_MLA_TILE_ROWS) - mx) * kLog2e);
    const float w1 = exp2f((__ldcg(lse + (s + 1) * INA_MLA_TILE_ROWS) - mx) * kLog2e);
#pragma unroll
    for (int k = 0; k < kSegs; k++) {
      if (k * kSegment + 4 * lane < C) {
        fma4(acc[k], w0, v0[k]);
        fma4(acc[k], w1, v1[k]);
      }
    }
  }
  if (s < n) {
    const float w0 = exp2f((__ldcg(lse + s * INA_MLA_TILE_ROWS) - mx) * kLog2e);
#pragma unroll
    for (int k = 0; k < kSegs; k++) {
      const int d = k * kSegment + 4 * lane;
      if (d < C) fma4(acc[k], w0, __ldcg(reinterpret_cast<const float4 *>(part + s * split_stride + d)));
    }
  }
#pragma unroll
  for (int k = 0; k < kSegs; k++) {
    const int d = k * kSegment + 4 * lane;
    if (d < C) {
      *reinterpret_cast<__nv_bfloat162 *>(dst + d) = __floats2bfloat162_rn(acc[k].x * inv, acc[k].y * inv);
      *reinterpret_cast<__nv_bfloat162 *>(dst + d + 2) = __floats2bfloat162_rn(acc[k].z * inv, acc[k].w * inv);
    }
  }
}

__global__ void __launch_bounds__(kThreads) mla_combine_kernel(const Args a) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, C = a.kv_lora_rank;
  /* The schedule was copied before the attention kernel ran; only the partial results
   * come from that kernel. */
  const int rows = a.header->num_merges * INA_MLA_TILE_ROWS;
  const int first = blockIdx.x * kWarps + w;
  if (first >= rows) return;
  wait_for_prerequisite_grids();
  /* The vector path: rank 512, bf16 pairs stored with even strides on a 4-byte aligned output. */
  const bool vec = C == 4 * kSegment && a.out_ts % 2 == 0 && a.out_hs % 2 == 0 &&
                   (reinterpret_cast<uintptr_t>(a.out) & 3) == 0;
  for (int u = first; u < rows; u += gridDim.x * kWarps) {
    const int r = u % INA_MLA_TILE_ROWS;
    const ina_mla_sched_merge_t mg = a.merges[u / INA_MLA_TILE_ROWS];
    const ina_mla_sched_request_t req = a.requests[mg.request];
    const Row row = tile_row(req, mg.tile, r, a.num_heads);
    if (!row.valid) continue;
    const int n = mg.num_splits;
    const float *lse = a.partial_lse + (int64_t)mg.first_slot * INA_MLA_TILE_ROWS + r;
    float mx = -INFINITY;
    for (int s = lane; s < n; s += 32) mx = fmaxf(mx, __ldcg(lse + s * INA_MLA_TILE_ROWS));
    mx = warp_max(mx);
    /* Every row sees position 0, which lies in the unit's first chunk: mx is finite. */
    float sum = 0.0f;
    for (int s = lane; s < n; s += 32) sum += exp2f((__ldcg(lse + s * INA_MLA_TILE_ROWS) - mx) * kLog2e);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    const int64_t split_stride = (int64_t)INA_MLA_TILE_ROWS * C;
    const float *part = a.partial_o + ((int64_t)mg.first_slot * INA_MLA_TILE_ROWS + r) * C;
    __nv_bfloat16 *dst = a.out + row.token * a.out_ts + row.head * a.out_hs;
    if (vec) {
      merge_row_vec<4>(part, split_stride, lse, n, mx, inv, C, dst);
    } else { /* other ranks (the generic kernel's test dims): plain loops */
      for (int d = lane; d < C; d += 32) {
        float acc = 0.0f;
        for (int s = 0; s < n; s++)
          acc = fmaf(exp2f((__ldcg(lse + s * INA_MLA_TILE_ROWS) - mx) * kLog2e), __ldcg(part + s * split_stride + d), acc);
        dst[d] = __float2bfloat16_rn(acc * inv);
      }
    }
    if (lane == 0 && a.lse) a.lse[(int64_t)row.token * a.num_heads + row.head] = mx + __logf(sum);
  }
}

}  // namespace

cudaError_t launch_combine(const Args &a, int num_ctas, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.gridDim = dim3(num_ctas);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, mla_combine_kernel, a);
}

}  // namespace ina_mla
