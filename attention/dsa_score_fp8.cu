/* The lightning indexer's scores with an FP8 query (attention/dsa_gpu.h,
 * INA_DSA_GPU_QUERY_FP8), as DeepSeek's V3.2 release computes them:
 *   score[s, t] = sum_h (w[s, h] * sq[s, h]) * relu(softmax_scale * sk[t] * (q8[s, h, :] . k8[t, :]))
 * with q8 / sq each head's q quantized to e4m3 by the index-key rule and k8 / sk the cached
 * FP8 key and its scale. The products run on Hopper's FP8 tensor cores (wgmma), so a
 * position costs 128 bytes of key and no conversion.
 *
 * Work split: CTA (token s, span c) scores positions [c * Span, (c + 1) * Span) of row s,
 * the grid (max_tokens x score_stride / Span) fixed by the bucket as in dsa_score.cu; a CTA
 * past the step's tokens leaves, and positions past the visible length get -INFINITY. One
 * warpgroup per CTA with a short pipeline, so that six CTAs share an SM: while one waits
 * or multiplies, the others' copies are in flight (more CTAs beat deeper pipelines here).
 *
 * Per CTA:
 *   1. the chunk's page ids into shared memory, then the first kStages - 1 tiles of 64 key
 *      rows (cp.async, 16 bytes a copy, 128-byte swizzle) and their scales;
 *   2. q quantized: thread t takes half of head t / 2's dims; the pair's amax gives the
 *      scale (core/fp8_quant_rule.h, the rule ina_dsa_gpu_append uses, so the bytes are
 *      what the host quantizer makes of the same bf16 values), the bytes go into the
 *      swizzled B tile (64 heads x 128 bytes, zeros past num_heads), and w * sq into a
 *      factor per head;
 *   3. per tile: wait for its copies, enqueue the tile kStages - 1 ahead, then
 *      D[64 positions x 64 heads] = A (keys, K-major) B (q, K-major) as head_dim / 32
 *      m64n64k32 e4m3 wgmmas, and the epilogue: relu(acc * softmax_scale * sk), times the
 *      head factors, summed over the heads (a thread's 16 heads, then the 4 threads of a
 *      row by a fixed butterfly: the run is deterministic).
 *
 * Numerics. Each product of two e4m3 values is exact; the tensor core adds them with its
 * FP8 accumulation (13 fraction bits after aligning to the largest term, truncated), not
 * fp32's: tests/attention/test_dsa_gpu.c bounds it per element. */
#define INA_LOG_SUBSYS "dsa_gpu"
#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

#include "attention/dsa_score_fp8.cuh"
#include "core/fp8_quant_rule.h"
#include "core/ptx.cuh"
#include "mla/mla_wgmma.cuh"

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define INA_DSA_FP8_CODE 1
#else
#define INA_DSA_FP8_CODE 0
#endif

namespace ina_dsa_score_fp8 {
namespace {

namespace wg = ina_mla::wg;

constexpr int kThreads = 128;   /* one warpgroup */
constexpr int kTileRows = 64;   /* positions per tile: M of the wgmma */
constexpr int kRowBytes = 128;  /* a swizzled row: up to 128 e4m3 */
constexpr int kTileBytes = kTileRows * kRowBytes;
static_assert(kMaxHeads * kRowBytes == kTileBytes, "the q tile is one tile");

/* Dynamic shared memory, from a 1024-byte aligned base: q tile (at 0), Stages key tiles, then
 * the scales, the head factors and the span's page ids. */
template <int Stages, int Span>
struct Layout {
  static constexpr int kStageOffset = kTileBytes;
  static constexpr int kScaleOffset = kStageOffset + Stages * kTileBytes;
  static constexpr int kFactorOffset = kScaleOffset + Stages * kTileRows * 4;
  static constexpr int kPagesOffset = kFactorOffset + kMaxHeads * 4;
  /* The span's page ids: (Span - 1) / page_size + 2 at most. */
  static int smem_bytes(int page_size) {
    return kPagesOffset + ((Span - 1) / page_size + 2) * 4 + 1024; /* + room for the alignment pad */
  }
};

[[maybe_unused]] __device__ __forceinline__ uint32_t swizzled(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + (((chunk & 7) ^ (row & 7)) << 4));
}

#if INA_DSA_FP8_CODE
/* D[64 x 64] (+)= A[64 x 32] B[32 x 64], e4m3, both K-major in shared memory. */
__device__ __forceinline__ void wgmma_m64n64k32_e4m3(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                     int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      INA_WGMMA_ACC32_REGS
      "}, %32, %33, p, 1, 1;\n}\n"
      : INA_WGMMA_ACC32_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

__device__ __forceinline__ void locate(const Args &a, int32_t pos, int32_t &pq, int32_t &slot) {
  if (a.page_shift >= 0) {
    pq = pos >> a.page_shift;
    slot = pos & ((1 << a.page_shift) - 1);
  } else {
    pq = pos / a.page_size;
    slot = pos - pq * a.page_size;
  }
}

/* The copies of the tile at positions base .. base + 63 into stage memory `stage` (shared
 * address) and its scales: thread t copies 16-byte chunk t % 8 of rows t / 8 + 16 j. */
__device__ __forceinline__ void issue_tile(const Args &a, uint32_t stage, uint32_t scales, int32_t base,
                                           int32_t visible, const int32_t *pages, int32_t first_page) {
  const int chunk = threadIdx.x & 7;
  if (chunk * 16 < a.head_dim) {
#pragma unroll
    for (int j = 0; j < kTileRows / 16; j++) {
      const int r = (threadIdx.x >> 3) + 16 * j;
      const int32_t pos = base + r;
      if (pos >= visible) continue; /* never read: the epilogue writes -inf there */
      int32_t pq, slot;
      locate(a, pos, pq, slot);
      const char *src = a.keys + (int64_t)pages[pq - first_page] * a.page_stride +
                        (int64_t)slot * a.token_stride + chunk * 16;
      ina_ptx::cp_async16(stage + swizzled(r, chunk), src, 16);
    }
  }
  if (threadIdx.x < kTileRows) {
    const int32_t pos = base + (int)threadIdx.x;
    if (pos < visible) {
      int32_t pq, slot;
      locate(a, pos, pq, slot);
      const char *src = a.keys + (int64_t)pages[pq - first_page] * a.page_stride + a.scale_offset +
                        (int64_t)slot * a.scale_stride;
      ina_ptx::cp_async4(scales + 4 * threadIdx.x, src, 4);
    }
  }
}

/* Step 2 of the header: thread t quantizes dims 64 (t % 2) .. + 63 of head t / 2. */
__device__ __forceinline__ void quantize_query(const Args &a, int32_t s, char *q_tile, float *factors) {
  const int h = threadIdx.x >> 1, half = threadIdx.x & 1;
  const int d0 = 64 * half;
  const bool live = h < a.num_heads;
  uint4 v[8];
#pragma unroll
  for (int j = 0; j < 8; j++) {
    v[j] = make_uint4(0, 0, 0, 0);
    if (live && d0 + 8 * j < a.head_dim)
      v[j] = *reinterpret_cast<const uint4 *>(a.q + ((int64_t)s * a.num_heads + h) * a.head_dim + d0 + 8 * j);
  }
  /* |value| of a widened bf16 is its bits without the sign, shifted up; the integer order
   * of finite non-negative floats is their order. */
  uint32_t amax_bits = 0;
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      amax_bits = max(amax_bits, (w[i] << 16) & 0x7FFFFFFFu);
      amax_bits = max(amax_bits, w[i] & 0x7FFF0000u);
    }
  }
  amax_bits = max(amax_bits, __shfl_xor_sync(0xFFFFFFFFu, amax_bits, 1));
  const float scale = ina_fp8_rule_scale_inv(__uint_as_float(amax_bits));
#pragma unroll
  for (int c = 0; c < 4; c++) { /* 16 values -> 16 bytes, chunk 4 half + c of the row */
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const uint32_t w0 = i < 2 ? (i == 0 ? v[2 * c].x : v[2 * c].z) : (i == 2 ? v[2 * c + 1].x : v[2 * c + 1].z);
      const uint32_t w1 = i < 2 ? (i == 0 ? v[2 * c].y : v[2 * c].w) : (i == 2 ? v[2 * c + 1].y : v[2 * c + 1].w);
      const float x[4] = {__uint_as_float(w0 << 16), __uint_as_float(w0 & 0xFFFF0000u),
                          __uint_as_float(w1 << 16), __uint_as_float(w1 & 0xFFFF0000u)};
      uint32_t packed = 0;
#pragma unroll
      for (int k = 0; k < 4; k++)
        packed |= (uint32_t)__nv_cvt_float_to_fp8(__fdiv_rn(x[k], scale), __NV_SATFINITE, __NV_E4M3) << (8 * k);
      out[i] = packed;
    }
    *reinterpret_cast<uint4 *>(q_tile + swizzled(h, 4 * half + c)) = make_uint4(out[0], out[1], out[2], out[3]);
  }
  if (half == 0) factors[h] = live ? a.weights[(int64_t)s * a.num_heads + h] * scale : 0.0f;
}
#endif  // INA_DSA_FP8_CODE

/* KSteps = head_dim / 32: a fixed count keeps the wgmmas of a tile back to back. Span:
 * positions per CTA. */
template <int KSteps, int Stages, int Span>
__global__ void __launch_bounds__(kThreads) dsa_score_fp8_kernel(const Args a) {
#if defined(__CUDA_ARCH__) && INA_DSA_FP8_CODE
  using L = Layout<Stages, Span>;
  constexpr int kStages = Stages;
  constexpr int kQOffset = 0, kStageOffset = L::kStageOffset, kScaleOffset = L::kScaleOffset;
  constexpr int kFactorOffset = L::kFactorOffset, kPagesOffset = L::kPagesOffset;
  extern __shared__ __align__(128) char smem_raw[];
  const uint32_t raw = wg::smem_u32(smem_raw);
  const uint32_t pad = (1024 - (raw & 1023)) & 1023;
  char *base_ptr = smem_raw + pad;
  const uint32_t base = raw + pad;
  const int32_t s = blockIdx.x;
  if (s >= a.header->total_tokens) return;
  const ina_dsa_gpu_token_row_t row = a.rows[s];
  const int32_t visible = row.visible;
  const int32_t begin = blockIdx.y * Span;
  const int32_t end = min(begin + Span, a.score_stride);
  float *out = a.scores + (int64_t)s * a.score_stride;
  const int32_t live_end = min(end, visible);
  const int32_t num_tiles = live_end > begin ? (live_end - begin + kTileRows - 1) / kTileRows : 0;
  for (int32_t t = begin + num_tiles * kTileRows + threadIdx.x; t < end; t += kThreads) out[t] = -INFINITY;
  if (num_tiles == 0) return;

  const float *scales = reinterpret_cast<const float *>(base_ptr + kScaleOffset);
  float *factors = reinterpret_cast<float *>(base_ptr + kFactorOffset);
  int32_t *pages = reinterpret_cast<int32_t *>(base_ptr + kPagesOffset);
  const int32_t page_base = a.kv_indptr[row.request];
  const int32_t first_page = begin / a.page_size, last_page = (live_end - 1) / a.page_size;
  for (int32_t i = threadIdx.x; i <= last_page - first_page; i += kThreads)
    pages[i] = a.kv_indices[page_base + first_page + i];
  __syncthreads();
  for (int st = 0; st < kStages - 1; st++) {
    if (st < num_tiles)
      issue_tile(a, base + kStageOffset + st * kTileBytes, base + kScaleOffset + st * kTileRows * 4,
                 begin + st * kTileRows, visible, pages, first_page);
    ina_ptx::cp_async_commit();
  }
  quantize_query(a, s, base_ptr + kQOffset, factors);
  wg::fence_proxy_async(); /* the q tile's stores before the wgmmas read it */
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  float f[8][2]; /* factors of heads 8 n + 2 t4 + {0, 1}: the accumulator's columns */
#pragma unroll
  for (int n = 0; n < 8; n++) {
    f[n][0] = factors[8 * n + 2 * t4];
    f[n][1] = factors[8 * n + 2 * t4 + 1];
  }
  const uint32_t q_addr = base + kQOffset;
  for (int32_t i = 0; i < num_tiles; i++) {
    ina_ptx::cp_async_wait<kStages - 2>();
    wg::fence_proxy_async(); /* this thread's landed copies before the wgmma reads */
    __syncthreads();          /* every thread's copies of tile i; tile i - 1 is done with */
    {
      const int32_t next = i + kStages - 1;
      if (next < num_tiles) {
        const int st = next % kStages;
        issue_tile(a, base + kStageOffset + st * kTileBytes, base + kScaleOffset + st * kTileRows * 4,
                   begin + next * kTileRows, visible, pages, first_page);
      }
      ina_ptx::cp_async_commit();
    }
    const int st = i % kStages;
    const uint32_t tile = base + kStageOffset + st * kTileBytes;
    float acc[32];
#pragma unroll
    for (int j = 0; j < 32; j++) acc[j] = 0.0f;
    wg::wgmma_fence();
#pragma unroll
    for (int k = 0; k < KSteps; k++)
      wgmma_m64n64k32_e4m3(acc, wg::desc_k_major(tile + 32 * k), wg::desc_k_major(q_addr + 32 * k), k);
    wg::wgmma_commit();
    wg::wgmma_wait<0>();
    wg::fence_regs(acc);
    /* Rows 16 warp + g (acc 4n, 4n+1) and + 8 (acc 4n+2, 4n+3), heads 8 n + 2 t4 + {0, 1}. */
    const int r0 = 16 * warp + g;
    const int32_t p0 = begin + i * kTileRows + r0, p1 = p0 + 8;
    const float c0 = a.softmax_scale * scales[st * kTileRows + r0];
    const float c1 = a.softmax_scale * scales[st * kTileRows + r0 + 8];
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; n++) {
      s0 = fmaf(f[n][0], fmaxf(acc[4 * n] * c0, 0.0f), s0);
      s0 = fmaf(f[n][1], fmaxf(acc[4 * n + 1] * c0, 0.0f), s0);
      s1 = fmaf(f[n][0], fmaxf(acc[4 * n + 2] * c1, 0.0f), s1);
      s1 = fmaf(f[n][1], fmaxf(acc[4 * n + 3] * c1, 0.0f), s1);
    }
    ina_dsa_score_common::store_row_pair(s0, s1, t4, p0, p1, end, visible, out);
  }
  ina_ptx::cp_async_wait<0>();
#else
  __trap(); /* launched only on sm_90 devices, which run the sm_90a code above */
#endif
}

}  // namespace

bool device_supported(void) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
  return major == 9 && minor == 0;
}

template <int Stages, int Span>
static cudaError_t launch_variant(const Args &a, int max_tokens, cudaStream_t stream) {
  const int ksteps = a.head_dim / kDimStep;
  void (*kernel)(const Args) = ksteps <= 1   ? dsa_score_fp8_kernel<1, Stages, Span>
                               : ksteps == 2 ? dsa_score_fp8_kernel<2, Stages, Span>
                               : ksteps == 3 ? dsa_score_fp8_kernel<3, Stages, Span>
                                             : dsa_score_fp8_kernel<4, Stages, Span>;
  static_assert(kMaxHeadDim / kDimStep == 4, "one kernel per dim step count");
  const int bytes = Layout<Stages, Span>::smem_bytes(a.page_size);
  cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid((unsigned)max_tokens, (unsigned)((a.score_stride + Span - 1) / Span));
  kernel<<<grid, kThreads, bytes, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch(const Args &a, int max_tokens, cudaStream_t stream) {
  /* 3 stages: six CTAs share an SM (34 KB of shared memory each at page size 64); on the
   * H200 at 64k context this beat 2, 4, 5, 6 and 8 stages (bench/RESULTS.md). The longest
   * span that still gives every SM three CTAs: long spans spread the prologue (page ids, q)
   * over more positions, but a short context must not leave SMs idle. The choice depends
   * on the bucket alone, so a captured graph keeps it. */
  int device = 0, sms = 132;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    sms = 132;
  const int64_t want = 3LL * sms;
  auto ctas = [&](int64_t span) { return (int64_t)max_tokens * ((a.score_stride + span - 1) / span); };
  if (ctas(4096) >= want) return launch_variant<3, 4096>(a, max_tokens, stream);
  if (ctas(2048) >= want) return launch_variant<3, 2048>(a, max_tokens, stream);
  return launch_variant<3, 1024>(a, max_tokens, stream);
}

}  // namespace ina_dsa_score_fp8
