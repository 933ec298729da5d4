/* The combine pass of split-KV MLA attention: for every split unit of the schedule, merge
 * its chunks' partial results by log-sum-exp and write bf16 out and lse.
 *
 * Chunk s of a row has a normalized partial o_s and its lse_s; the merged row is
 *   lse = log(sum_s exp(lse_s)),  o = sum_s exp(lse_s - lse) o_s
 * computed with the largest lse_s subtracted first. A chunk in which the row saw no
 * position (a causal row ending before the chunk) has lse_s = -inf and weight 0.
 *
 * Fixed grid (the plan's CTA count), so a CUDA graph of run stays valid for any plan of
 * the bucket. Work is spread as finely as the data allows: one warp per (merge, row,
 * 128-dim segment), each lane owning 4 dims, with the split loop unrolled so that the
 * loads of several splits are in flight at once. One long request cut into a hundred
 * chunks is then merged by 64 warps, not one. */
#define INA_LOG_SUBSYS "mla"
#include <math.h>

#include "mla/mla_device.cuh"

namespace ina_mla {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kSegment = 128; /* dims per warp: 32 lanes x 4 */
constexpr int kUnroll = 4;

__global__ void __launch_bounds__(kThreads) mla_combine_kernel(const Args a, int max_slots) {
  extern __shared__ float weights[]; /* [warp][max_slots] */
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, C = a.kv_lora_rank;
  float *wt = weights + w * max_slots;
  const int segments = (C + kSegment - 1) / kSegment;
  const int units = a.header->num_merges * INA_MLA_TILE_ROWS * segments;
  const bool vec = C % 4 == 0; /* partial rows are then 16-byte aligned */
  for (int u = blockIdx.x * kWarps + w; u < units; u += gridDim.x * kWarps) {
    const int seg = u % segments, r = (u / segments) % INA_MLA_TILE_ROWS;
    const ina_mla_sched_merge_t mg = a.merges[u / (segments * INA_MLA_TILE_ROWS)];
    const ina_mla_sched_request_t req = a.requests[mg.request];
    const Row row = tile_row(req, mg.tile, r, a.num_heads);
    if (!row.valid) continue;
    const int n = mg.num_splits;
    const float *lse = a.partial_lse + (int64_t)mg.first_slot * INA_MLA_TILE_ROWS + r;
    float mx = -INFINITY;
    for (int s = lane; s < n; s += 32) mx = fmaxf(mx, lse[s * INA_MLA_TILE_ROWS]);
    mx = warp_max(mx);
    /* Every row sees position 0, which lies in the unit's first chunk: mx is finite. */
    float sum = 0.0f;
    for (int s = lane; s < n; s += 32) {
      const float v = exp2f((lse[s * INA_MLA_TILE_ROWS] - mx) * 1.4426950408889634f);
      wt[s] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    __syncwarp();
    const float inv = 1.0f / sum;
    const int64_t split_stride = (int64_t)INA_MLA_TILE_ROWS * C;
    const float *part = a.partial_o + ((int64_t)mg.first_slot * INA_MLA_TILE_ROWS + r) * C;
    __nv_bfloat16 *dst = a.out + row.token * a.out_ts + row.head * a.out_hs;
    const int d0 = seg * kSegment + 4 * lane;
    if (vec) {
      if (d0 < C) {
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        int s = 0;
        for (; s + kUnroll <= n; s += kUnroll) {
          float4 v[kUnroll];
#pragma unroll
          for (int i = 0; i < kUnroll; i++) v[i] = *reinterpret_cast<const float4 *>(part + (s + i) * split_stride + d0);
#pragma unroll
          for (int i = 0; i < kUnroll; i++) {
            acc.x = fmaf(wt[s + i], v[i].x, acc.x);
            acc.y = fmaf(wt[s + i], v[i].y, acc.y);
            acc.z = fmaf(wt[s + i], v[i].z, acc.z);
            acc.w = fmaf(wt[s + i], v[i].w, acc.w);
          }
        }
        for (; s < n; s++) {
          const float4 v = *reinterpret_cast<const float4 *>(part + s * split_stride + d0);
          acc.x = fmaf(wt[s], v.x, acc.x);
          acc.y = fmaf(wt[s], v.y, acc.y);
          acc.z = fmaf(wt[s], v.z, acc.z);
          acc.w = fmaf(wt[s], v.w, acc.w);
        }
        dst[d0] = __float2bfloat16_rn(acc.x * inv);
        dst[d0 + 1] = __float2bfloat16_rn(acc.y * inv);
        dst[d0 + 2] = __float2bfloat16_rn(acc.z * inv);
        dst[d0 + 3] = __float2bfloat16_rn(acc.w * inv);
      }
    } else {
      for (int d = seg * kSegment + lane; d < C && d < (seg + 1) * kSegment; d += 32) {
        float acc = 0.0f;
        for (int s = 0; s < n; s++) acc = fmaf(wt[s], part[s * split_stride + d], acc);
        dst[d] = __float2bfloat16_rn(acc * inv);
      }
    }
    if (seg == 0 && lane == 0 && a.lse) a.lse[(int64_t)row.token * a.num_heads + row.head] = mx + __logf(sum);
    __syncwarp(); /* wt is rewritten for the next unit */
  }
}

}  // namespace

cudaError_t launch_combine(const Args &a, int num_ctas, int max_slots, cudaStream_t stream) {
  const size_t bytes = sizeof(float) * kWarps * (size_t)max_slots;
  cudaError_t e = cudaFuncSetAttribute(mla_combine_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes);
  if (e != cudaSuccess) return e;
  mla_combine_kernel<<<num_ctas, kThreads, bytes, stream>>>(a, max_slots);
  return cudaGetLastError();
}

}  // namespace ina_mla
