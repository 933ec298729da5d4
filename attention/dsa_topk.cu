/* The top-k of the lightning indexer on the GPU (attention/dsa_gpu.h): for each query
 * token, the positions of its k best visible scores, best first, exactly dsa.h's order.
 *
 * One order, one key. Each position t < visible gets the 64-bit key
 *   X(t) = order(score[t]) << pbits | (pmask - t),      pmask = 2^pbits - 1 >= score_stride
 * where order() maps a float to a 32-bit integer that compares as dsa.h ranks scores:
 * positive floats get the sign bit set, negative ones are inverted, -0 counts as +0, and
 * every NaN maps to 0, below -INFINITY (whose key is 0x007FFFFF). The low bits make lower
 * positions larger among equal scores. Keys are distinct, so "the k largest keys" is one
 * well-defined set and its descending order is dsa.h's order: the result depends on the
 * scores only, not on thread timing (atomics only decide where in shared memory an entry
 * sits before the sort). Every real key is >= 1 (pmask - t >= 1), so 0 pads the sort.
 *
 * Radix select. One CTA per token row. The kth largest key is found digit by digit from
 * the top, 12 bits a pass: a pass histograms the digit of the keys that still match the
 * prefix found so far ("in"), and the bin holding the kth key extends the prefix. It
 * stops as soon as every "in" key is needed (at most 32 + pbits bits; usually after the
 * score bits, or earlier). The selection is then every key whose top L bits are >= the
 * prefix: exactly k' = min(k, visible) keys.
 *
 * Passes read the row from global memory until the "in" keys are few enough
 * (kCandidates): then one pass moves them into shared memory (and the keys already above
 * the prefix into the selection), and the remaining passes read only those. For a typical
 * row of 64k scores that is two reads of the row.
 *
 * The k' selected keys are sorted descending by a bitonic sort (sort_descending:
 * registers and warp shuffles for the short strides, shared memory for the long ones)
 * and written as positions; entries k' .. k - 1 get -1. */
#define INA_LOG_SUBSYS "dsa_gpu"
#include <stdint.h>

#include "attention/dsa_gpu.h"
#include "core/cuda_check.h"

namespace ina_dsa_topk {

constexpr int kThreads = 1024;
constexpr int kDigitBits = 12;
constexpr int kBins = 1 << kDigitBits;
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kCandidates = 8192;
constexpr int kMaxSelect = INA_DSA_GPU_MAX_TOPK;

struct Args {
  const float *scores;
  int32_t *indices;
  const ina_dsa_gpu_ws_header_t *header;
  const ina_dsa_gpu_token_row_t *rows;
  int32_t score_stride, topk, pbits;
  int32_t vec4; /* rows are 16-byte aligned: scores and score_stride allow float4 loads */
};

struct Shared {
  uint32_t hist[kBins];
  unsigned long long sel[kMaxSelect];
  unsigned long long cand[kCandidates];
  uint32_t warp_sums[kThreads / 32];
  unsigned long long prefix; /* the top `bits` bits of the kth key */
  int32_t bits;              /* how many are known */
  int32_t need;              /* keys still to take among the "in" ones */
  int32_t in_count;          /* keys matching the prefix */
  int32_t done;              /* every "in" key is taken */
  int32_t sel_count, cand_count;
};

__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (f != f) return 0u;  /* NaN: below everything */
  if (f == 0.0f) u = 0u;  /* -0 ranks as +0 */
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned long long make_key(float score, int32_t t, int pbits) {
  const unsigned long long pmask = (1ull << pbits) - 1;
  return ((unsigned long long)order_key(score) << pbits) | (pmask - (unsigned long long)t);
}

/* The top `bits` bits of a key of `total` bits (bits >= 1). */
__device__ __forceinline__ unsigned long long top_bits(unsigned long long x, int total, int bits) {
  return x >> (total - bits);
}

/* Exclusive prefix sum over the block in thread order; returns this thread's part. */
__device__ uint32_t block_exclusive_scan(uint32_t v, Shared &sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) sh.warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    uint32_t w = sh.warp_sums[lane], wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const uint32_t y = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += y;
    }
    sh.warp_sums[lane] = wi - w; /* exclusive */
  }
  __syncthreads();
  const uint32_t r = sh.warp_sums[warp] + inc - v;
  __syncthreads(); /* warp_sums is reused by the next scan */
  return r;
}

/* After a histogram of the next digit: finds the bin holding the need-th largest "in"
 * key and extends the prefix by it. Thread i owns bins kBins-1-4i down to kBins-4-4i, so
 * the scan in thread order counts the keys of higher bins first. */
__device__ void choose_bin(Shared &sh, int digit_bits) {
  uint32_t counts[kBinsPerThread], sum = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; j++) {
    counts[j] = sh.hist[kBins - 1 - kBinsPerThread * threadIdx.x - j];
    sum += counts[j];
  }
  const int need = sh.need;
  uint32_t above = block_exclusive_scan(sum, sh);
#pragma unroll
  for (int j = 0; j < kBinsPerThread; j++) {
    const int bin = kBins - 1 - kBinsPerThread * (int)threadIdx.x - j;
    if (above < (uint32_t)need && (uint32_t)need <= above + counts[j]) {
      sh.prefix = (sh.prefix << digit_bits) | (unsigned long long)(bin & ((1 << digit_bits) - 1));
      sh.bits += digit_bits;
      sh.need = need - (int)above;
      sh.in_count = (int)counts[j];
      sh.done = sh.need == (int)counts[j];
    }
    above += counts[j];
  }
  __syncthreads();
}

/* Visits every key of the row (from global memory) or of the candidates. The row is read
 * 16 bytes a load where it is 16-byte aligned (vec4: the scores and score_stride allow
 * it): one CTA reads its whole row, so what bounds a pass is the bytes it keeps in
 * flight, not the instructions. */
template <typename F>
__device__ __forceinline__ void for_each_key(const Args &a, const float *row, int32_t visible, bool from_cand,
                                             const Shared &sh, F f) {
  if (from_cand) {
    for (int i = threadIdx.x; i < sh.cand_count; i += kThreads) f(sh.cand[i]);
    return;
  }
  constexpr int kUnroll = 4;
  int32_t scalar_from = 0;
  if (a.vec4) {
    const float4 *row4 = reinterpret_cast<const float4 *>(row);
    const int32_t n4 = visible / 4;
    for (int32_t base = threadIdx.x; base < n4; base += kUnroll * kThreads) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; u++) {
        const int32_t i = base + u * kThreads;
        v[u] = i < n4 ? __ldg(row4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; u++) {
        const int32_t i = base + u * kThreads;
        if (i < n4) {
          f(make_key(v[u].x, 4 * i, a.pbits));
          f(make_key(v[u].y, 4 * i + 1, a.pbits));
          f(make_key(v[u].z, 4 * i + 2, a.pbits));
          f(make_key(v[u].w, 4 * i + 3, a.pbits));
        }
      }
    }
    scalar_from = 4 * n4;
  }
  for (int32_t base = scalar_from + threadIdx.x; base < visible; base += kUnroll * kThreads) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int32_t t = base + u * kThreads;
      v[u] = t < visible ? __ldg(row + t) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
      const int32_t t = base + u * kThreads;
      if (t < visible) f(make_key(v[u], t, a.pbits));
    }
  }
}

/* One compare-exchange of a bitonic network on the pair (lower, upper) of elements: the
 * pair's larger key goes to the lower element when the block sorts descending. */
__device__ __forceinline__ unsigned long long exchange(unsigned long long mine, unsigned long long other, bool lower,
                                                       bool descending) {
  return (lower == descending) ? max(mine, other) : min(mine, other);
}

/* Bitonic sort of sh.sel[0, n) descending, n a power of two <= 2 kThreads (keys are
 * distinct but for the 0 padding). Thread i keeps elements 2i and 2i + 1 in registers:
 * strides up to 32 pair elements within a warp (shuffles, no barrier), so only the
 * strides of 64 and more go through shared memory, one barrier each: 20 barriers for 2048
 * keys instead of 66. */
__device__ void sort_descending(Shared &sh, int n) {
  const int i = threadIdx.x, j0 = 2 * i;
  const bool mine = j0 < n; /* n >= 2 is even, so j0 + 1 < n too */
  unsigned long long x0 = mine ? sh.sel[j0] : 0, x1 = mine && n > 1 ? sh.sel[j0 + 1] : 0;
  for (int size = 2; size <= n; size <<= 1) {
    const bool descending = (j0 & size) == 0; /* the same for j0 + 1 (size >= 2) */
    if (size > 64) {
      if (mine) {
        sh.sel[j0] = x0;
        sh.sel[j0 + 1] = x1;
      }
      __syncthreads();
      for (int stride = size >> 1; stride >= 64; stride >>= 1) {
        for (int k = i; k < n / 2; k += kThreads) {
          const int lo = (k & (stride - 1)) | ((k & ~(stride - 1)) << 1), hi = lo + stride;
          const unsigned long long x = sh.sel[lo], y = sh.sel[hi];
          const bool desc = (lo & size) == 0;
          if (desc ? x < y : x > y) {
            sh.sel[lo] = y;
            sh.sel[hi] = x;
          }
        }
        __syncthreads();
      }
      if (mine) {
        x0 = sh.sel[j0];
        x1 = sh.sel[j0 + 1];
      }
    }
    for (int stride = min(size >> 1, 32); stride >= 2; stride >>= 1) {
      const int lane_xor = stride >> 1; /* element j ^ stride lives in thread i ^ (stride / 2) */
      const unsigned long long y0 = __shfl_xor_sync(0xffffffffu, x0, lane_xor);
      const unsigned long long y1 = __shfl_xor_sync(0xffffffffu, x1, lane_xor);
      const bool lower = (j0 & stride) == 0;
      x0 = exchange(x0, y0, lower, descending);
      x1 = exchange(x1, y1, lower, descending);
    }
    {
      const unsigned long long hi = exchange(x0, x1, true, descending), lo = exchange(x0, x1, false, descending);
      x0 = hi;
      x1 = lo;
    }
  }
  if (mine) {
    sh.sel[j0] = x0;
    sh.sel[j0 + 1] = x1;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) dsa_topk_kernel(const Args a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Shared &sh = *reinterpret_cast<Shared *>(smem_raw);
  const int32_t s = blockIdx.x;
  if (s >= a.header->total_tokens) return;
  const int32_t visible = a.rows[s].visible;
  const int32_t kk = min(a.topk, visible);
  const float *row = a.scores + (int64_t)s * a.score_stride;
  const int total = 32 + a.pbits;
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.bits = 0;
    sh.need = kk;
    sh.in_count = visible;
    sh.done = kk == visible; /* also visible == 0 */
    sh.sel_count = 0;
    sh.cand_count = 0;
  }
  __syncthreads();
  bool from_cand = false;
  while (!sh.done) {
    const int bits = sh.bits;
    const unsigned long long prefix = sh.prefix;
    if (!from_cand && sh.in_count <= kCandidates) {
      /* Keys above the prefix are selected for good; "in" keys become the candidates. */
      for_each_key(a, row, visible, false, sh, [&](unsigned long long x) {
        const unsigned long long top = bits ? top_bits(x, total, bits) : 0;
        if (top > prefix)
          sh.sel[atomicAdd(&sh.sel_count, 1)] = x;
        else if (top == prefix)
          sh.cand[atomicAdd(&sh.cand_count, 1)] = x;
      });
      from_cand = true;
      __syncthreads();
      continue;
    }
    const int digit = min(kDigitBits, total - bits);
    const unsigned long long digit_mask = (1ull << digit) - 1;
    for (int j = threadIdx.x; j < kBins; j += kThreads) sh.hist[j] = 0;
    __syncthreads();
    for_each_key(a, row, visible, from_cand, sh, [&](unsigned long long x) {
      if (bits == 0 || top_bits(x, total, bits) == prefix)
        atomicAdd(&sh.hist[(uint32_t)(top_bits(x, total, bits + digit) & digit_mask)], 1u);
    });
    __syncthreads();
    choose_bin(sh, digit);
  }
  /* Every key whose top bits reach the prefix: exactly kk of them. */
  {
    const int bits = sh.bits;
    const unsigned long long prefix = sh.prefix;
    for_each_key(a, row, visible, from_cand, sh, [&](unsigned long long x) {
      if (bits == 0 || top_bits(x, total, bits) >= prefix) sh.sel[atomicAdd(&sh.sel_count, 1)] = x;
    });
  }
  __syncthreads();
  int n = 1;
  while (n < kk) n <<= 1;
  for (int i = kk + threadIdx.x; i < n; i += kThreads) sh.sel[i] = 0; /* below every real key */
  __syncthreads();
  sort_descending(sh, n);
  const unsigned long long pmask = (1ull << a.pbits) - 1;
  int32_t *out = a.indices + (int64_t)s * a.topk;
  for (int i = threadIdx.x; i < a.topk; i += kThreads)
    out[i] = i < kk ? (int32_t)(pmask - (sh.sel[i] & pmask)) : -1;
}

}  // namespace ina_dsa_topk

using namespace ina_dsa_topk;

extern "C" ina_status_t ina_dsa_gpu_topk_run(const ina_dsa_gpu_plan_info_t *info, const void *device_ws,
                                             const ina_dsa_gpu_topk_run_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  Args a = {};
  int pbits = 1;
  const size_t smem = sizeof(Shared);
  INA_REQUIRE(info != NULL && info->magic == INA_DSA_GPU_MAGIC, INA_ERR_INVALID_ARGUMENT,
              "dsa gpu topk: info is %s", info ? "not planned (a failed plan zeroes it)" : "NULL");
  INA_REQUIRE(device_ws != NULL, INA_ERR_INVALID_ARGUMENT, "dsa gpu topk: device_ws is NULL");
  INA_REQUIRE_VERSIONED(p, offsetof(ina_dsa_gpu_topk_run_params_t, indices) + sizeof(int32_t *),
                        "dsa gpu topk run params", "INA_DSA_GPU_TOPK_RUN_PARAMS_INIT");
  INA_REQUIRE(p->scores && p->indices, INA_ERR_INVALID_ARGUMENT, "dsa gpu topk: %s is NULL",
              !p->scores ? "scores" : "indices");
  /* 2^pbits - 1 >= score_stride: every position's low part pmask - t is >= 1. */
  while (((int64_t)1 << pbits) - 1 < (int64_t)info->score_stride) pbits++;
  a.scores = p->scores;
  a.indices = p->indices;
  a.header = (const ina_dsa_gpu_ws_header_t *)device_ws;
  a.rows = (const ina_dsa_gpu_token_row_t *)((const char *)device_ws + sizeof(ina_dsa_gpu_ws_header_t));
  a.score_stride = info->score_stride;
  a.topk = info->topk;
  a.pbits = pbits;
  a.vec4 = (uintptr_t)p->scores % 16 == 0 && info->score_stride % 4 == 0;
  INA_CUDA_CHECK(cudaFuncSetAttribute(dsa_topk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  dsa_topk_kernel<<<(unsigned)info->max_tokens, kThreads, smem, (cudaStream_t)stream>>>(a);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
