/* The lightning indexer's scores (attention/dsa_gpu.h):
 *   score[s, t] = sum_h w[s, h] * relu(softmax_scale * scale_t * (q[s, h, :] . k[t, :]))
 * on tensor cores for the shapes DeepSeek-V3.2 has, and on CUDA cores for the others (the
 * fallback at the end of this file).
 *
 * Work split. CTA (token s, chunk c) scores positions [c * kChunk, (c + 1) * kChunk) of
 * row s, the grid (max_tokens x score_stride / kChunk) fixed by the bucket: a CTA whose
 * token is past the step's total or whose chunk lies past the visible length writes only
 * what it must (-INFINITY) and leaves. Its 4 warps share a cp.async pipeline of kStages
 * tiles of 64 positions; warp w multiplies rows 16w .. 16w + 15 of each tile.
 *
 * The product. One mma.sync m16n8k16 (bf16 in, fp32 accumulators) takes 16 positions (M,
 * A from shared memory) times 8 heads (N, B) over 16 dims (K). q's fragments for every
 * head and dim stay in registers for the whole CTA (up to 64 heads x 128 dims: 128
 * registers a thread), so shared memory carries only the keys, once.
 *
 * Dim order. The sum over K does not care in which order the dims pair up, as long as A
 * and B agree, so both read dims in the order that makes each thread's part of a 16-dim
 * step contiguous: thread (g, t) of the warp holds the A entries k = 2t, 2t+1, 2t+8, 2t+9,
 * and here those are the physical dims 4t .. 4t+3 of the step, for the key rows as for q.
 * One 32-bit shared load then gives the 4 FP8 bytes of a row (a 64-bit load the 4 bf16),
 * with row strides padded so that a warp's loads hit 32 distinct banks.
 *
 * FP8 keys. An e4m3 value has 4 significant bits and an exponent in [-9, 8], so it is
 * exactly a bf16 (and exactly an f16, which the hardware conversion produces first): the
 * mma sees the same key values as the reference. The per-token f32 scale multiplies the
 * dot product instead of each value, since q . (scale k) = scale (q . k) (the reference
 * does the same, in double). It is applied before the relu, scale_t * softmax_scale being
 * one f32 factor c; relu(c x) = c relu(x) would hold for c > 0 anyway, but applying c
 * first needs no assumption about the stored scale's sign.
 *
 * Numerics. Every product q_hd k_d is exact in fp32 (8 + 4 or 8 + 8 significant bits);
 * the tensor core adds them in fp32 in its own order, then the epilogue rounds the
 * scaling, the relu'd weighted terms and the sum over heads in a fixed order: the run is
 * deterministic, and it differs from the reference's double sums by fp32 rounding only
 * (tests/attention/test_dsa_gpu.c states the bound). */
#define INA_LOG_SUBSYS "dsa_gpu"
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "attention/dsa_gpu.h"
#include "attention/dsa_score_common.cuh"
#include "attention/dsa_score_fp8.cuh"
#include "core/cuda_check.h"
#include "core/ptx.cuh"

namespace ina_dsa_score {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 16 * kWarps; /* positions per pipeline stage */
constexpr int kStages = 4;
constexpr int kChunk = 1024; /* positions per CTA */
constexpr int kMaxKSteps = INA_DSA_GPU_MMA_MAX_HEAD_DIM / 16;
static_assert(kChunk * 65535LL == INA_DSA_GPU_MAX_SCORE_STRIDE, "the header's stride limit is this grid's");
static_assert(INA_DSA_GPU_MMA_MAX_HEADS <= 64, "launch_heads keeps at most 8 tiles of 8 heads");

/* The common arguments (dsa_score_common.cuh), then the tensor-core kernel's own. */
struct Args : ina_dsa_score_common::ScoreArgs {
  int32_t row_words;  /* 32-bit words per key row in shared memory (padded) */
  int32_t copy16;     /* key rows are 16-byte aligned: 16-byte cp.async, else 4-byte */
  int32_t copy_units; /* copy units per key row */
  int32_t copy_rstep; /* kThreads / copy_units when that divides, else 0 */
};

/* Padded row strides: FP8 rows are read 32 bits per thread, 8 rows x 4 threads a warp, so
 * the stride in words must be 4 (mod 8) (rows land on distinct groups of 4 banks); bf16
 * rows are read 64 bits per thread, half a warp (4 rows x 4 threads) at a time, so the
 * stride must be 8 (mod 32). */
__host__ __device__ constexpr int fp8_row_words(int head_dim) {
  return head_dim / 4 + ((head_dim / 16) % 2 == 0 ? 4 : 0);
}
__host__ __device__ constexpr int bf16_row_words(int head_dim) {
  return head_dim / 2 + ((8 - (head_dim / 2) % 32) + 32) % 32;
}

__host__ __device__ constexpr size_t smem_bytes(int row_words) {
  return (size_t)kStages * kTileRows * (row_words + 1) * sizeof(uint32_t); /* rows + scales */
}

/* 4 e4m3 bytes -> two bf16x2 (bytes 0, 1 -> lo; 2, 3 -> hi), exactly. */
__device__ __forceinline__ void e4m3x4_to_bf16x2(uint32_t x, uint32_t &lo, uint32_t &hi) {
  const __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x & 0xFFFFu), __NV_E4M3);
  const __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(x >> 16), __NV_E4M3);
  const float2 f0 = __half22float2(__half2(h0)), f1 = __half22float2(__half2(h1));
  const __nv_bfloat162 b0 = __float22bfloat162_rn(f0), b1 = __float22bfloat162_rn(f1);
  lo = *reinterpret_cast<const uint32_t *>(&b0);
  hi = *reinterpret_cast<const uint32_t *>(&b1);
}

/* Position pos's page (within the request) and slot: a shift for a power-of-two page
 * size (every copy unit computes one; a division there costs the loop's issue slots). */
__device__ __forceinline__ void locate(const Args &a, int32_t pos, int32_t &pq, int32_t &slot) {
  if (a.page_shift >= 0) {
    pq = pos >> a.page_shift;
    slot = pos & ((1 << a.page_shift) - 1);
  } else {
    pq = pos / a.page_size;
    slot = pos - pq * a.page_size;
  }
}

/* Enqueues the copies of tile `tile` (positions base .. base + 63) into stage `stage`:
 * the key rows of the visible positions, and for FP8 their scales. */
template <bool FP8>
__device__ __forceinline__ void issue_tile(const Args &a, uint32_t *stage_rows, float *stage_scales,
                                           int32_t base, int32_t visible, const int32_t *pages,
                                           int32_t first_page, int copy_row0, int copy_col) {
  const int unit = a.copy16 ? 16 : 4;
  /* Thread i copies unit copy_col of rows copy_row0, copy_row0 + copy_rstep, ...: the
   * prologue's one division instead of one per unit (units of a row divide kThreads), or
   * unit u = i, i + kThreads, ... of the tile split by division otherwise. */
  const int units = a.copy_units;
  const int by_row = a.copy_rstep > 0;
  const int count = by_row ? (kTileRows - copy_row0 + a.copy_rstep - 1) / a.copy_rstep
                           : (kTileRows * units - (int)threadIdx.x + kThreads - 1) / kThreads;
  for (int j = 0; j < count; j++) {
    int r, c;
    if (by_row) {
      r = copy_row0 + j * a.copy_rstep;
      c = copy_col;
    } else {
      const int u = (int)threadIdx.x + j * kThreads;
      r = u / units;
      c = u - r * units;
    }
    const int32_t pos = base + r;
    if (pos >= visible) continue; /* its row is never used: the epilogue writes -inf */
    int32_t pq, slot;
    locate(a, pos, pq, slot);
    const int64_t page = pages[pq - first_page];
    const char *src = a.keys + page * a.page_stride + (int64_t)slot * a.token_stride + c * unit;
    const uint32_t dst = ina_ptx::smem_addr(stage_rows + r * a.row_words) + c * unit;
    if (a.copy16)
      ina_ptx::cp_async16(dst, src, 16);
    else
      ina_ptx::cp_async4(dst, src, 4);
  }
  if (FP8 && threadIdx.x < kTileRows) {
    const int r = threadIdx.x;
    const int32_t pos = base + r;
    if (pos < visible) {
      int32_t pq, slot;
      locate(a, pos, pq, slot);
      const int64_t page = pages[pq - first_page];
      const char *src = a.keys + page * a.page_stride + a.scale_offset + (int64_t)slot * a.scale_stride;
      ina_ptx::cp_async4(ina_ptx::smem_addr(stage_scales + r), src, 4);
    }
  }
}

/* NT: head tiles of 8 held in registers (num_heads <= 8 NT). */
template <int NT, bool FP8>
__global__ void __launch_bounds__(kThreads, 2) dsa_score_kernel(const Args a) {
  extern __shared__ __align__(16) uint32_t smem[];
  const int32_t s = blockIdx.x;
  if (s >= a.header->total_tokens) return;
  const ina_dsa_gpu_token_row_t row = a.rows[s];
  const int32_t visible = row.visible;
  const int32_t begin = blockIdx.y * kChunk;
  const int32_t end = min(begin + kChunk, a.score_stride);
  float *out = a.scores + (int64_t)s * a.score_stride;
  const int32_t live_end = min(end, visible); /* positions to score */
  const int32_t num_tiles = live_end > begin ? (live_end - begin + kTileRows - 1) / kTileRows : 0;
  /* Past the scored tiles: -inf (the causal bound and the padding alike). */
  for (int32_t t = begin + num_tiles * kTileRows + threadIdx.x; t < end; t += kThreads) out[t] = -INFINITY;
  if (num_tiles == 0) return;

  uint32_t *rows_smem = smem;
  float *scales_smem = reinterpret_cast<float *>(smem + kStages * kTileRows * a.row_words);
  /* The chunk's page ids, read once: the copies then find their page in shared memory
   * instead of waiting on a global load each. */
  __shared__ int32_t pages[kChunk + 1];
  const int32_t page_base = a.kv_indptr[row.request];
  const int32_t first_page = begin / a.page_size, last_page = (live_end - 1) / a.page_size;
  for (int32_t i = threadIdx.x; i <= last_page - first_page; i += kThreads)
    pages[i] = a.kv_indices[page_base + first_page + i];
  __syncthreads();
  const int copy_row0 = a.copy_rstep > 0 ? (int)threadIdx.x / a.copy_units : 0;
  const int copy_col = a.copy_rstep > 0 ? (int)threadIdx.x - copy_row0 * a.copy_units : 0;
  for (int st = 0; st < kStages - 1; st++) {
    if (st < num_tiles)
      issue_tile<FP8>(a, rows_smem + st * kTileRows * a.row_words, scales_smem + st * kTileRows,
                      begin + st * kTileRows, visible, pages, first_page, copy_row0, copy_col);
    ina_ptx::cp_async_commit();
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int ksteps = a.head_dim / 16;
  /* q's B fragments: b0 = dims 4t, 4t+1 and b1 = dims 4t+2, 4t+3 of each 16-dim step,
   * of head 8 n + g (zeros past num_heads, whose weights are zero too). */
  uint32_t qf[NT][kMaxKSteps][2];
  float wf[NT][2];
#pragma unroll
  for (int n = 0; n < NT; n++) {
    const int h = 8 * n + g;
#pragma unroll
    for (int k = 0; k < kMaxKSteps; k++) {
      uint2 v = make_uint2(0, 0);
      if (h < a.num_heads && k < ksteps)
        v = *reinterpret_cast<const uint2 *>(a.q + ((int64_t)s * a.num_heads + h) * a.head_dim + 16 * k + 4 * t4);
      qf[n][k][0] = v.x;
      qf[n][k][1] = v.y;
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
      const int hw = 8 * n + 2 * t4 + j;
      wf[n][j] = hw < a.num_heads ? a.weights[(int64_t)s * a.num_heads + hw] : 0.0f;
    }
  }

  for (int32_t i = 0; i < num_tiles; i++) {
    ina_ptx::cp_async_wait<kStages - 2>();
    __syncthreads(); /* tile i has landed for every thread; tile i - 1 is done with */
    {
      const int32_t next = i + kStages - 1;
      if (next < num_tiles) {
        const int st = next % kStages;
        issue_tile<FP8>(a, rows_smem + st * kTileRows * a.row_words, scales_smem + st * kTileRows,
                        begin + next * kTileRows, visible, pages, first_page, copy_row0, copy_col);
      }
      ina_ptx::cp_async_commit();
    }
    const int st = i % kStages;
    const uint32_t *r0 = rows_smem + (st * kTileRows + 16 * warp + g) * a.row_words;
    const uint32_t *r1 = r0 + 8 * a.row_words;
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxKSteps; k++) {
      if (k >= ksteps) break;
      uint32_t af[4];
      if (FP8) {
        e4m3x4_to_bf16x2(r0[4 * k + t4], af[0], af[2]);
        e4m3x4_to_bf16x2(r1[4 * k + t4], af[1], af[3]);
      } else {
        const uint2 x0 = *reinterpret_cast<const uint2 *>(r0 + 8 * k + 2 * t4);
        const uint2 x1 = *reinterpret_cast<const uint2 *>(r1 + 8 * k + 2 * t4);
        af[0] = x0.x;
        af[2] = x0.y;
        af[1] = x1.x;
        af[3] = x1.y;
      }
#pragma unroll
      for (int n = 0; n < NT; n++) ina_ptx::mma_bf16(acc[n], af, qf[n][k][0], qf[n][k][1]);
    }
    /* Epilogue: rows g (acc 0, 1) and g + 8 (acc 2, 3), heads 8 n + 2 t4 + {0, 1}. */
    const int32_t p0 = begin + i * kTileRows + 16 * warp + g, p1 = p0 + 8;
    float c0 = a.softmax_scale, c1 = a.softmax_scale;
    if (FP8) {
      c0 *= scales_smem[st * kTileRows + 16 * warp + g];
      c1 *= scales_smem[st * kTileRows + 16 * warp + g + 8];
    }
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
      s0 = fmaf(wf[n][0], fmaxf(acc[n][0] * c0, 0.0f), s0);
      s0 = fmaf(wf[n][1], fmaxf(acc[n][1] * c0, 0.0f), s0);
      s1 = fmaf(wf[n][0], fmaxf(acc[n][2] * c1, 0.0f), s1);
      s1 = fmaf(wf[n][1], fmaxf(acc[n][3] * c1, 0.0f), s1);
    }
    /* The 4 threads of a row hold disjoint heads: a fixed butterfly adds them. */
    ina_dsa_score_common::store_row_pair(s0, s1, t4, p0, p1, end, visible, out);
  }
  ina_ptx::cp_async_wait<0>();
}

template <int NT, bool FP8>
static cudaError_t launch(const Args &a, dim3 grid, size_t smem, cudaStream_t stream) {
  cudaError_t e = cudaFuncSetAttribute(dsa_score_kernel<NT, FP8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)smem);
  if (e != cudaSuccess) return e;
  dsa_score_kernel<NT, FP8><<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <bool FP8>
static cudaError_t launch_heads(const Args &a, dim3 grid, size_t smem, cudaStream_t stream) {
  const int tiles = (a.num_heads + 7) / 8;
  if (tiles <= 1) return launch<1, FP8>(a, grid, smem, stream);
  if (tiles <= 2) return launch<2, FP8>(a, grid, smem, stream);
  if (tiles <= 4) return launch<4, FP8>(a, grid, smem, stream);
  return launch<8, FP8>(a, grid, smem, stream);
}

/* ---- the CUDA-core fallback ------------------------------------------------------------
 *
 * For the shapes the tensor-core kernel does not take (head_dim not a multiple of 16 or
 * above 128, more than 64 heads, rows not 4-byte aligned): V3.2's own shape never comes
 * here, so the kernel stays as plain as the reference. The grid is the tensor-core
 * kernel's (token s x chunks of kChunk positions, fixed by the bucket); thread i of a CTA
 * takes positions begin + i, begin + i + kGenThreads, ... of its chunk and, for each,
 * walks the heads in order 0 .. H-1 and the dims in order 0 .. D-1:
 *   dot = fma(q_hd, k_d, dot)                  (d ascending, from 0)
 *   sum = fma(w_h, max(dot * c, 0), sum)       (h ascending, from 0), c = softmax_scale * scale_t
 * with every operation in round-to-nearest (the _rn intrinsics: no contraction or fast-math
 * flag can reorder them), so a run is deterministic and obeys the tensor-core kernel's
 * error model: D fp32 roundings in the dot product, one each for c and dot * c, H in the
 * sum over heads. Keys are read per element (bf16 as 16-bit loads, FP8 bytewise) and q and
 * w straight from global memory (one address per warp: a broadcast the L1 serves), so no
 * shared memory and no alignment beyond the elements' own is needed. A key row is re-read
 * once per head from L1; at the shapes this serves (a few heads) that is cheap. */

constexpr int kGenThreads = 128;

/* An e4m3 byte as f32, exactly (every e4m3 value is an f16). */
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
  return __half2float(__half(h));
}

/* A little-endian f32 at any alignment. */
__device__ __forceinline__ float load_f32_bytes(const char *p) {
  const uint8_t *b = reinterpret_cast<const uint8_t *>(p);
  return __uint_as_float((uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
                         ((uint32_t)b[3] << 24));
}

template <bool FP8>
__device__ __forceinline__ float key_at(const char *row, int d) {
  if (FP8) return e4m3_to_f32((uint8_t)row[d]);
  return __uint_as_float((uint32_t)reinterpret_cast<const uint16_t *>(row)[d] << 16);
}

template <bool FP8>
__global__ void __launch_bounds__(kGenThreads) dsa_score_generic_kernel(const Args a) {
  const int32_t s = blockIdx.x;
  if (s >= a.header->total_tokens) return;
  const ina_dsa_gpu_token_row_t row = a.rows[s];
  const int32_t begin = blockIdx.y * kChunk;
  const int32_t end = min(begin + kChunk, a.score_stride);
  float *out = a.scores + (int64_t)s * a.score_stride;
  const int32_t page_base = a.kv_indptr[row.request];
  const uint16_t *q = a.q + (int64_t)s * a.num_heads * a.head_dim;
  const float *w = a.weights + (int64_t)s * a.num_heads;
  for (int32_t t = begin + (int32_t)threadIdx.x; t < end; t += kGenThreads) {
    if (t >= row.visible) { /* the causal bound and the padding alike */
      out[t] = -INFINITY;
      continue;
    }
    const int32_t pq = t / a.page_size, slot = t - pq * a.page_size;
    const int64_t page = a.kv_indices[page_base + pq];
    const char *page_bytes = a.keys + page * a.page_stride;
    const char *key = page_bytes + (int64_t)slot * a.token_stride;
    float c = a.softmax_scale;
    if (FP8) c = __fmul_rn(c, load_f32_bytes(page_bytes + a.scale_offset + (int64_t)slot * a.scale_stride));
    float sum = 0.0f;
    for (int32_t h = 0; h < a.num_heads; h++) {
      const uint16_t *qh = q + (int64_t)h * a.head_dim;
      float dot = 0.0f;
      for (int32_t d = 0; d < a.head_dim; d++)
        dot = __fmaf_rn(__uint_as_float((uint32_t)__ldg(qh + d) << 16), key_at<FP8>(key, d), dot);
      sum = __fmaf_rn(__ldg(w + h), fmaxf(__fmul_rn(dot, c), 0.0f), sum);
    }
    out[t] = sum;
  }
}

template <bool FP8>
static cudaError_t launch_generic(const Args &a, dim3 grid, cudaStream_t stream) {
  dsa_score_generic_kernel<FP8><<<grid, kGenThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace ina_dsa_score

using namespace ina_dsa_score;

extern "C" ina_status_t ina_dsa_gpu_copy_schedule(void *device_ws, const void *host_ws, size_t bytes,
                                                  void *stream) {
  ina_status_t st = INA_OK;
  INA_CUDA_CHECK(cudaMemcpyAsync(device_ws, host_ws, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream));
fail:
  return st;
}

static bool aligned(int64_t x, int64_t to) { return x % to == 0; }

/* The FP8-query run (dsa_score_fp8.cu): the common checks are done; these are its own. */
static ina_status_t score_run_fp8_query(const ina_dsa_gpu_plan_info_t *info, const void *device_ws,
                                        const ina_dsa_gpu_score_run_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  namespace f8 = ina_dsa_score_fp8;
  f8::Args a = {};
  const int64_t base = (int64_t)(uintptr_t)p->cache.keys;
  INA_REQUIRE(p->cache.format == INA_DSA_KEY_FP8, INA_ERR_UNSUPPORTED,
              "dsa gpu score: the FP8 query needs FP8 index keys (the cache holds bf16)");
  INA_REQUIRE(info->num_heads <= f8::kMaxHeads && info->head_dim % f8::kDimStep == 0 &&
                  info->head_dim <= f8::kMaxHeadDim,
              INA_ERR_UNSUPPORTED,
              "dsa gpu score: the FP8 query takes up to %d heads of a multiple of %d dims up to %d "
              "(planned %d heads x %d dims)", f8::kMaxHeads, f8::kDimStep, f8::kMaxHeadDim,
              info->num_heads, info->head_dim);
  INA_REQUIRE(aligned(base, 16) && aligned(p->cache.page_stride, 16) && aligned(p->cache.token_stride, 16) &&
                  aligned(p->cache.scale_offset, 4) && aligned(p->cache.scale_stride, 4),
              INA_ERR_UNSUPPORTED,
              "dsa gpu score: the FP8 query needs 16-byte aligned key rows and 4-byte aligned scales "
              "(keys %% 16 = %lld, page_stride %lld, token_stride %lld, scale_offset %lld, "
              "scale_stride %lld)", (long long)(base % 16), (long long)p->cache.page_stride,
              (long long)p->cache.token_stride, (long long)p->cache.scale_offset,
              (long long)p->cache.scale_stride);
  INA_REQUIRE(aligned((int64_t)(uintptr_t)p->q, 16), INA_ERR_UNSUPPORTED,
              "dsa gpu score: the FP8 query needs q 16-byte aligned");
  INA_REQUIRE(f8::device_supported(), INA_ERR_UNSUPPORTED,
              "dsa gpu score: the FP8 query runs on FP8 tensor cores of sm_90 (Hopper) only");
  ina_dsa_score_common::fill_score_args(info, device_ws, p, &a);
  INA_CUDA_CHECK(f8::launch(a, info->max_tokens, (cudaStream_t)stream));
fail:
  return st;
}

extern "C" ina_status_t ina_dsa_gpu_score_run(const ina_dsa_gpu_plan_info_t *info, const void *device_ws,
                                              const ina_dsa_gpu_score_run_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  Args a = {};
  bool fp8 = false, mma = false;
  int64_t base = 0;
  ina_dsa_gpu_query_format_t query = INA_DSA_GPU_QUERY_BF16;
  size_t smem = 0;
  dim3 grid;
  INA_REQUIRE(info != NULL && info->magic == INA_DSA_GPU_MAGIC, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu score: info is %s", info ? "not planned (a failed plan zeroes it)" : "NULL");
  INA_REQUIRE(device_ws != NULL, INA_ERR_INVALID_ARGUMENT, "dsa gpu score: device_ws is NULL");
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_gpu_score_run_params_t, scores) + sizeof(float *),
                        "dsa gpu score run params", "INA_DSA_GPU_SCORE_RUN_PARAMS_INIT");
  /* A graph captured now may replay after a plan with more tokens: every pointer counts. */
  INA_REQUIRE(p->q && p->weights && p->scores && p->kv_indptr && p->kv_indices && p->cache.keys,
              INA_ERR_INVALID_ARGUMENT, "dsa gpu score: %s is NULL",
              !p->q ? "q" : !p->weights ? "weights" : !p->scores ? "scores" : !p->kv_indptr ? "kv_indptr"
              : !p->kv_indices ? "kv_indices" : "cache.keys");
  INA_REQUIRE(p->cache.format != INA_DSA_KEY_F32, INA_ERR_UNSUPPORTED,
              "dsa gpu score: f32 index keys have no GPU kernel (bf16 or FP8)");
  INA_REQUIRE(p->cache.format == INA_DSA_KEY_BF16 || p->cache.format == INA_DSA_KEY_FP8,
              INA_ERR_INVALID_ARGUMENT, "dsa gpu score: cache.format %d is not a key format",
              (int)p->cache.format);
  fp8 = p->cache.format == INA_DSA_KEY_FP8;
  INA_REQUIRE(!fp8 || p->cache.scale_stride != 0, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu score: an FP8 index cache needs scale_stride != 0 (describe it with "
              "ina_dsa_index_cache_fp8_inline or _fp8_paged, not _dense)");
  INA_REQUIRE(p->cache.page_size == info->page_size && p->cache.head_dim == info->head_dim,
              INA_ERR_INVALID_ARGUMENT, "dsa gpu score: cache page_size %d / head_dim %d, planned %d / %d",
              p->cache.page_size, p->cache.head_dim, info->page_size, info->head_dim);
  INA_REQUIRE(p->softmax_scale > 0 && isfinite(p->softmax_scale), INA_ERR_INVALID_ARGUMENT,
              "dsa gpu score: softmax_scale %g is not a positive number", (double)p->softmax_scale);
  base = (int64_t)(uintptr_t)p->cache.keys;
  /* Both kernels read bf16 keys as 16-bit values, q as bf16 and the weights as f32. */
  INA_REQUIRE(fp8 || (aligned(base, 2) && aligned(p->cache.page_stride, 2) && aligned(p->cache.token_stride, 2)),
              INA_ERR_UNSUPPORTED,
              "dsa gpu score: bf16 key rows must be 2-byte aligned (keys %% 2 = %lld, page_stride "
              "%lld, token_stride %lld)", (long long)(base % 2), (long long)p->cache.page_stride,
              (long long)p->cache.token_stride);
  INA_REQUIRE(aligned((int64_t)(uintptr_t)p->q, 2) && aligned((int64_t)(uintptr_t)p->weights, 4),
              INA_ERR_UNSUPPORTED, "dsa gpu score: q must be 2-byte and weights 4-byte aligned");
  if (p->struct_size >= offsetof(ina_dsa_gpu_score_run_params_t, query_format) + sizeof(p->query_format))
    query = p->query_format;
  INA_REQUIRE(query == INA_DSA_GPU_QUERY_BF16 || query == INA_DSA_GPU_QUERY_FP8, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu score: query_format %d is not a query format", (int)query);
  if (query == INA_DSA_GPU_QUERY_FP8) return score_run_fp8_query(info, device_ws, p, stream);
  /* The tensor-core kernel's shapes and alignment; anything else takes the fallback. */
  mma = info->num_heads <= INA_DSA_GPU_MMA_MAX_HEADS && info->head_dim % 16 == 0 &&
        info->head_dim <= INA_DSA_GPU_MMA_MAX_HEAD_DIM && aligned(base, 4) &&
        aligned(p->cache.page_stride, 4) && aligned(p->cache.token_stride, 4) &&
        (!fp8 || (aligned(p->cache.scale_offset, 4) && aligned(p->cache.scale_stride, 4))) &&
        aligned((int64_t)(uintptr_t)p->q, 8);
  ina_dsa_score_common::fill_score_args(info, device_ws, p, &a);
  grid = dim3((unsigned)info->max_tokens, (unsigned)((info->score_stride + kChunk - 1) / kChunk));
  if (grid.y == 0) grid.y = 1;
  if (!mma) {
    INA_CUDA_CHECK(fp8 ? launch_generic<true>(a, grid, (cudaStream_t)stream)
                       : launch_generic<false>(a, grid, (cudaStream_t)stream));
    return st;
  }
  a.row_words = fp8 ? fp8_row_words(info->head_dim) : bf16_row_words(info->head_dim);
  a.copy16 = aligned(base, 16) && aligned(a.page_stride, 16) && aligned(a.token_stride, 16);
  a.copy_units = (fp8 ? a.head_dim : 2 * a.head_dim) / (a.copy16 ? 16 : 4);
  a.copy_rstep = kThreads % a.copy_units == 0 ? kThreads / a.copy_units : 0;
  smem = smem_bytes(a.row_words);
  INA_CUDA_CHECK(fp8 ? launch_heads<true>(a, grid, smem, (cudaStream_t)stream)
                     : launch_heads<false>(a, grid, smem, (cudaStream_t)stream));
fail:
  return st;
}
