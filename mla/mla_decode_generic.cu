/* The generic MLA attention kernel: any kv_lora_rank and rope_dim the plan accepts
 * (kv_lora_rank + rope_dim <= 640), any cache format (f32, bf16, FP8) and any layout
 * (no alignment needs). Same schedule, same outputs as the fast kernel (mla_decode.cu);
 * plain fp32 arithmetic, meant to be obviously right rather than fast: test configs with
 * small dims and odd layouts take it.
 *
 * One CTA of 4 warps per work item at a time; each warp owns 4 of the tile's 16 query
 * rows. A block of 32 KV positions is dequantized to fp32 in shared memory, lane t
 * scores position t (a dot product over the row's query held in shared memory), the
 * warp runs the online softmax of its rows, then updates the rows' outputs (kept in
 * shared memory, lane-strided over dims). */
#define INA_LOG_SUBSYS "mla"
#include <cuda_fp8.h>
#include <math.h>

#include "mla/mla_device.cuh"

namespace ina_mla {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = INA_MLA_TILE_ROWS / kWarps;
constexpr int kBlock = 32; /* one position per lane */

/* Shared memory in floats: query [16][D], kv [32][D + 1] (odd stride: lanes reading
 * different positions hit different banks), output [16][C], probabilities [4][32], then
 * three pointer arrays [32] (latent, rope, scale entry of each position). */
__host__ __device__ constexpr size_t smem_floats(int C, int R) {
  return (size_t)INA_MLA_TILE_ROWS * (C + R) + (size_t)kBlock * (C + R + 1) +
         (size_t)INA_MLA_TILE_ROWS * C + (size_t)kWarps * 32;
}
size_t smem_bytes(int C, int R) { return smem_floats(C, R) * sizeof(float) + 3 * kBlock * sizeof(void *); }

__device__ __forceinline__ float bf16_at(const void *p, int i) {
  return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
}

/* Value d of a cache entry (latent d < C, rope d - C otherwise) as fp32. */
__device__ float entry_value(const ina_mla_cache_t &c, const char *lat, const char *rope,
                             const char *scale, int d) {
  const int C = c.kv_lora_rank;
  if (d >= C) {
    return c.format == INA_MLA_CACHE_F32 ? reinterpret_cast<const float *>(rope)[d - C]
                                         : bf16_at(rope, d - C);
  }
  switch (c.format) {
  case INA_MLA_CACHE_F32: return reinterpret_cast<const float *>(lat)[d];
  case INA_MLA_CACHE_BF16: return bf16_at(lat, d);
  case INA_MLA_CACHE_FP8: {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(lat[d]), __NV_E4M3);
    return __half2float(__half(h)) * reinterpret_cast<const float *>(scale)[d / 128];
  }
  }
  return 0.0f;
}

__global__ void __launch_bounds__(kThreads) mla_generic_kernel(const Args a) {
  allow_dependent_launch(); /* the combine pass may be scheduled behind this grid */
  extern __shared__ __align__(16) float sm[];
  const int C = a.kv_lora_rank, R = a.rope_dim, D = C + R, H = a.num_heads;
  float *q = sm;
  float *kv = q + INA_MLA_TILE_ROWS * D;
  float *o = kv + kBlock * (D + 1);
  float *probs = o + INA_MLA_TILE_ROWS * C;
  const char **lat_ptr = reinterpret_cast<const char **>(probs + kWarps * 32);
  const char **rope_ptr = lat_ptr + kBlock, **scale_ptr = rope_ptr + kBlock;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
  const ina_mla_cache_t &c = a.cache;

  const int it_end = a.cta_indptr[blockIdx.x + 1];
  for (int it = a.cta_indptr[blockIdx.x]; it < it_end; it++) {
    const ina_mla_sched_item_t item = a.items[it];
    const ina_mla_sched_request_t req = a.requests[item.request];
    const int page_base = a.sel ? request_pages<true>(a, item.request) : request_pages<false>(a, item.request);
    for (int i = tid; i < INA_MLA_TILE_ROWS * D; i += kThreads) {
      const int r = i / D, d = i % D;
      const Row row = tile_row(req, item.tile, r, H);
      float v = 0.0f;
      if (row.valid)
        v = d < C ? __bfloat162float(a.q_nope[row.token * a.q_nope_ts + row.head * a.q_nope_hs + d])
                  : __bfloat162float(a.q_pe[row.token * a.q_pe_ts + row.head * a.q_pe_hs + d - C]);
      q[i] = v;
    }
    for (int i = tid; i < INA_MLA_TILE_ROWS * C; i += kThreads) o[i] = 0.0f;
    float m[kRowsPerWarp], l[kRowsPerWarp];
    int limit[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; i++) {
      m[i] = -INFINITY;
      l[i] = 0.0f;
      limit[i] = row_kv_limit(req, item.tile, w * kRowsPerWarp + i, H, item.kv_end);
    }

    for (int blk = item.kv_begin; blk < item.kv_end; blk += kBlock) {
      __syncthreads(); /* the previous block (or item) is done with kv, q and o */
      if (tid < kBlock) {
        const bool ok = blk + tid < item.kv_end;
        const int t = !ok ? 0 : a.sel ? kv_position<true>(a, item.request, blk + tid) : blk + tid;
        lat_ptr[tid] = ok ? cache_entry(a, c.latent, c.latent_page_stride, c.latent_token_stride, page_base, t)
                          : nullptr;
        rope_ptr[tid] = ok && R > 0 ? cache_entry(a, c.rope, c.rope_page_stride, c.rope_token_stride, page_base, t)
                                    : nullptr;
        scale_ptr[tid] = ok && c.format == INA_MLA_CACHE_FP8
                             ? cache_entry(a, c.scale, c.scale_page_stride, c.scale_token_stride, page_base, t)
                             : nullptr;
      }
      __syncthreads();
      for (int i = tid; i < kBlock * D; i += kThreads) {
        const int t = i / D, d = i % D;
        kv[t * (D + 1) + d] = lat_ptr[t] ? entry_value(c, lat_ptr[t], rope_ptr[t], scale_ptr[t], d) : 0.0f;
      }
      __syncthreads();

      const int t = blk + lane;
      for (int i = 0; i < kRowsPerWarp; i++) {
        const int r = w * kRowsPerWarp + i;
        float s = 0.0f;
        for (int d = 0; d < D; d++) s = fmaf(q[r * D + d], kv[lane * (D + 1) + d], s);
        s = t < limit[i] ? s * a.scale_log2 : -INFINITY;
        const float m_new = fmaxf(m[i], warp_max(s));
        const float use = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = fast_exp2(m[i] - use);
        const float p = fast_exp2(s - use);
        l[i] = l[i] * alpha + warp_sum(p);
        m[i] = m_new;
        probs[w * 32 + lane] = p;
        __syncwarp();
        for (int d = lane; d < C; d += 32) {
          float acc = o[r * C + d] * alpha;
          for (int tt = 0; tt < kBlock; tt++) acc = fmaf(probs[w * 32 + tt], kv[tt * (D + 1) + d], acc);
          o[r * C + d] = acc;
        }
        __syncwarp();
      }
    }

    for (int i = 0; i < kRowsPerWarp; i++) {
      const int r = w * kRowsPerWarp + i;
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
      const float lse = l[i] > 0.0f ? (m[i] + log2f(l[i])) * kLn2 : -INFINITY;
      if (item.slot >= 0) {
        float *dst = a.partial_o + ((int64_t)item.slot * INA_MLA_TILE_ROWS + r) * C;
        for (int d = lane; d < C; d += 32) dst[d] = o[r * C + d] * inv;
        if (lane == 0) a.partial_lse[item.slot * INA_MLA_TILE_ROWS + r] = lse;
      } else {
        const Row row = tile_row(req, item.tile, r, H);
        if (!row.valid) continue;
        __nv_bfloat16 *dst = a.out + row.token * a.out_ts + row.head * a.out_hs;
        for (int d = lane; d < C; d += 32) dst[d] = __float2bfloat16_rn(o[r * C + d] * inv);
        if (lane == 0 && a.lse) a.lse[(int64_t)row.token * H + row.head] = lse;
      }
    }
    __syncthreads(); /* the next item overwrites q and o */
  }
}

}  // namespace

cudaError_t launch_generic(const Args &a, int num_ctas, cudaStream_t stream) {
  const size_t bytes = smem_bytes(a.kv_lora_rank, a.rope_dim);
  cudaError_t e = cudaFuncSetAttribute(mla_generic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)bytes);
  if (e != cudaSuccess) return e;
  mla_generic_kernel<<<num_ctas, kThreads, bytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ina_mla
