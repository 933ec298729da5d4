/* What the MLA kernels share (CUDA C++, internal to mla/): the arguments of a run as the
 * kernels see them, the schedule's device view, the query-row mapping, cache address
 * arithmetic and a few PTX wrappers. The launchers are declared here and defined next to
 * their kernels (mla_decode.cu, mla_decode_fp8.cu, mla_decode_wgmma.cu, mla_decode_generic.cu,
 * mla_combine.cu); mla_run.cu
 * validates a run and calls them. */
#ifndef INA_MLA_MLA_DEVICE_CUH
#define INA_MLA_MLA_DEVICE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/cuda_math.cuh"
#include "core/ptx.cuh"
#include "mla/mla_cache.h"
#include "mla/mla_schedule.h"

namespace ina_mla {

/* Everything a kernel needs, by value. Lengths come from the schedule in the device
 * workspace, never from here, so a captured graph stays valid across plans. */
struct Args {
  /* schedule (device workspace) */
  const ina_mla_sched_header_t *header;
  const int32_t *cta_indptr;
  const ina_mla_sched_request_t *requests;
  const ina_mla_sched_item_t *items;
  const ina_mla_sched_merge_t *merges;
  float *partial_o;   /* [slot][INA_MLA_TILE_ROWS][kv_lora_rank] */
  float *partial_lse; /* [slot][INA_MLA_TILE_ROWS] */
  /* shapes of the bucket */
  int num_heads, kv_lora_rank, rope_dim;
  /* inputs */
  const __nv_bfloat16 *q_nope;
  int64_t q_nope_ts, q_nope_hs;
  const __nv_bfloat16 *q_pe;
  int64_t q_pe_ts, q_pe_hs;
  ina_mla_cache_t cache;
  int page_shift; /* log2(cache.page_size) when that is a power of two, else -1 */
  const int32_t *kv_indptr, *kv_indices;
  float scale_log2; /* softmax_scale * log2(e): scores are kept in base 2 */
  /* Sparse plans (mla_sparse_plan.c): every schedule request is one query token, whose
   * KV positions 0, 1, ... are the entries of its row of sel; token_request gives the
   * step's request of each, for its page list. sel is NULL for dense plans. */
  const int32_t *sel;
  int64_t sel_stride;
  const int32_t *token_request;
  /* outputs */
  __nv_bfloat16 *out;
  int64_t out_ts, out_hs;
  float *lse; /* may be NULL */
};

constexpr float kLn2 = 0.69314718055994530942f;

/* Query row `row` of a request's tile -> its token (global index) and head. */
struct Row {
  int token, head;
  bool valid;
};

__device__ __forceinline__ Row tile_row(const ina_mla_sched_request_t &r, int tile, int local,
                                        int num_heads) {
  const int row = tile * INA_MLA_TILE_ROWS + local;
  Row out;
  out.valid = row < r.q_len * num_heads;
  out.token = r.q_begin + (out.valid ? row / num_heads : 0);
  out.head = out.valid ? row % num_heads : 0;
  return out;
}

/* KV positions a row may see within an item: its causal limit, capped at the chunk end;
 * rows past the request's last (padding of the tile) just see the chunk. */
__device__ __forceinline__ int row_kv_limit(const ina_mla_sched_request_t &r, int tile, int local,
                                            int num_heads, int kv_end) {
  const int row = tile * INA_MLA_TILE_ROWS + local;
  if (row >= r.q_len * num_heads) return kv_end;
  const int limit = ina_mla_row_limit(row, num_heads, r.q_len, r.kv_len);
  return limit < kv_end ? limit : kv_end;
}

/* Position t of a request -> its page (index into the request's page list) and slot in
 * that page: shifts for the power-of-two page sizes caches use in practice, a division
 * (some twenty instructions, on every position of every block) otherwise. */
__device__ __forceinline__ int page_index(const Args &a, int t) {
  return a.page_shift >= 0 ? t >> a.page_shift : t / a.cache.page_size;
}
__device__ __forceinline__ int page_slot(const Args &a, int t) {
  return a.page_shift >= 0 ? t & (a.cache.page_size - 1) : t % a.cache.page_size;
}

/* Where the page list of schedule request `request` starts in kv_indices. kSparse: the
 * plan is sparse (a.sel is set); the fast kernels are instantiated for each case, so the
 * dense ones carry none of the sparse path's work. */
template <bool kSparse>
__device__ __forceinline__ int request_pages(const Args &a, int request) {
  return __ldg(a.kv_indptr + (kSparse ? __ldg(a.token_request + request) : request));
}

/* The cache position that KV position t of schedule request `request` reads: t itself,
 * or in a sparse plan the t-th selected position of that query token. */
template <bool kSparse>
__device__ __forceinline__ int kv_position(const Args &a, int request, int t) {
  return kSparse ? __ldg(a.sel + (int64_t)request * a.sel_stride + t) : t;
}

/* Byte address of part `base` (latent, rope or scale) of cache position t of a request
 * whose pages start at kv_indices[page_base]. */
__device__ __forceinline__ const char *cache_entry(const Args &a, const void *base, int64_t page_stride,
                                                   int64_t token_stride, int page_base, int t) {
  const int64_t page = __ldg(a.kv_indices + page_base + page_index(a, t));
  return static_cast<const char *>(base) + page * page_stride + (int64_t)page_slot(a, t) * token_stride;
}

/* The FP8 kernels' P V takes P' = p * scale * kFp8PScale in f16 (mla_decode_fp8.cu,
 * mla_decode_wgmma.cu), so that small probabilities stay in f16's normal range; the output
 * is multiplied back by its inverse. */
constexpr float kFp8PScale = 1024.0f;

/* Two e4m3 values (the low 16 bits, low byte first) -> an f16 pair (low half first); exact. */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

/* Two floats as an f16 pair, lo in the low half; and back. */
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&h);
}
__device__ __forceinline__ float2 unpack_f16(uint32_t v) {
  return __half22float2(*reinterpret_cast<const __half2 *>(&v));
}

/* A bf16 pair -> an f16 pair (exact for magnitudes in f16's normal range). */
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v) {
  return pack_f16(__uint_as_float(v << 16), __uint_as_float(v & 0xFFFF0000u));
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/* Programmatic dependent launch (sm_90): the attention kernels let the combine pass be
 * launched while they run, so its launch latency hides behind their tail; the combine
 * pass waits for them to finish (and their writes to be visible) before reading partial
 * results. Both are no-ops for a kernel launched without the PDL attribute. */
__device__ __forceinline__ void allow_dependent_launch() { ina_ptx::griddep_launch_dependents(); }
__device__ __forceinline__ void wait_for_prerequisite_grids() { ina_ptx::griddep_wait(); }

using ina_cuda::warp_max;
using ina_cuda::warp_sum;

/* Launchers: enqueue on `stream`, report launch errors. The fast and wgmma kernels take
 * a sparse plan (a.sel set) in instantiations of their own. */
cudaError_t launch_fast(const Args &a, bool fp8, int num_ctas, cudaStream_t stream);
cudaError_t launch_fast_fp8(const Args &a, int num_ctas, cudaStream_t stream); /* mla_decode_fp8.cu */
cudaError_t launch_generic(const Args &a, int num_ctas, cudaStream_t stream);
cudaError_t launch_combine(const Args &a, int num_ctas, cudaStream_t stream);
/* The sm_90a wgmma kernel (mla_decode_wgmma.cu) for grouped plans with a bf16 or FP8 cache;
 * num_ctas is the plan's (it launches one CTA per INA_MLA_CTAS_PER_SM lists). It runs only
 * where wgmma_supported() (a compute capability 9.0 device). */
cudaError_t launch_wgmma(const Args &a, int num_ctas, cudaStream_t stream);
bool wgmma_supported();

}  // namespace ina_mla

#endif
