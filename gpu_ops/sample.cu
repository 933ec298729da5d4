/* Temperature / top-k / top-p sampling (gpu_ops/gpu_ops.h; semantics of model/sampler.h).
 *
 * One CTA per row, every step a pass over the row (which stays in L2 between passes):
 *   1. arg-max key and validity (NaN, +inf); greedy rows stop here.
 *   2. top-k: the k-th largest logit, counting duplicates, by a radix select over the
 *      logits' ordered keys (4 passes of 8 bits, shared-memory histograms of counts);
 *      tokens below it go, ties with it stay.
 *   3. top-p: the weights w = exp((x - max) / T) of the tokens left, in (0, 1], rank by
 *      their float bits (w descending, then the lower id). A radix select over those
 *      bits with histograms of counts and masses finds the last kept token: the lowest
 *      weight whose first token still has mass above it with (total - above) / total
 *      > 1 - top_p (the CPU's test, first token always kept), then among the tokens of
 *      exactly that weight the count that stay, and if only some do, the id below which
 *      they stay (one more pass). Masses are 64-bit fixed point (w * 2^40 rounded), so
 *      the histogram atomics add integers and the result is independent of their order.
 *   4. the draw, an exponential race: token i gets E_i = -log(1 - v_i), v_i uniform from
 *      the counter-based stream of (seed, step, i), and the largest w_i / E_i wins.
 *      Since E_i / w_i ~ Exp(w_i), token i wins with probability w_i / sum(w), the
 *      distribution the CPU's inverse-CDF draw samples, in one pass and without any
 *      prefix sum. Probs mode writes w_i / sum(w) instead. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "gpu_ops/gpu_ops.h"

#include <limits.h>

#include "core/cuda_check.h"
#include "gpu_ops/sampling_device.cuh"

namespace {

using namespace ina_gpu;

constexpr int kThreads = kSamplingThreads;
constexpr int kBins = 256; /* 8-bit radix digits */
constexpr int kBinsPerLane = kBins / kWarp;
constexpr float kFixedScale = 0x1p40f;
constexpr double kFixedUnit = 0x1p-40;
constexpr int64_t kMaxVocab = (int64_t)1 << 24; /* vocab * 2^40 fits 64 bits */
constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

struct SampleArgs {
  const void *logits;
  int64_t vocab, stride;
  ina_gpu_sampling_row_t *params;
  bool advance;
  int32_t *tokens;
  float *probs;
  uint32_t *error_flags;
};

struct Shared {
  uint32_t count[kBins];
  uint64_t mass[kBins];
  uint64_t red[kWarp];
  int32_t scan[kWarp];
  /* Broadcast from one thread to the CTA. */
  uint32_t prefix, remaining, equal_count;
  uint64_t above, total;
  int32_t keep_equal;
  int64_t id_limit;
};

/* The filters of a row once their thresholds are known. */
struct Filter {
  float max, temperature;
  uint32_t kth_key; /* top-k: keep ordered_key(x) >= kth_key; 0 = off */
  uint32_t wstar;   /* top-p: keep weight bits > wstar, or == wstar with id <= id_limit */
  int64_t id_limit;
};

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ __forceinline__ uint64_t to_fixed(float w) {
  return __float2ull_rn(__fmul_rn(w, kFixedScale));
}

/* Token i's weight after top-k (and top-p, when f.wstar says so); 0 when filtered. */
__device__ __forceinline__ float kept_weight(float x, int64_t i, const Filter &f) {
  if (x == -INFINITY || ordered_key(x) < f.kth_key) return 0.0f;
  /* (x - max) / T <= 0: no overflow however small T is; the maximum weighs exactly 1. */
  const float w = expf(__fdiv_rn(__fsub_rn(x, f.max), f.temperature));
  const uint32_t bits = __float_as_uint(w);
  if (bits < f.wstar || (bits == f.wstar && i > f.id_limit)) return 0.0f;
  return w;
}

/* Whether the token with `above` mass ranked ahead of it survives top-p (the CPU's
 * test on float((total - above) / total); the first token always does). */
__device__ __forceinline__ bool top_p_keeps(uint64_t above, uint64_t total, float cut) {
  return above == 0 || __double2float_rn((double)(total - above) / (double)total) > cut;
}

template <typename U>
__device__ __forceinline__ U warp_exclusive_scan(U v, U *total) {
  const int lane = threadIdx.x % kWarp;
  U inclusive = v;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    const U o = __shfl_up_sync(0xFFFFFFFFu, inclusive, offset);
    if (lane >= offset) inclusive += o;
  }
  *total = __shfl_sync(0xFFFFFFFFu, inclusive, kWarp - 1);
  return inclusive - v;
}

/* Bin of the radix digit that lane `lane` visits j-th: the 256 bins in descending
 * order, 8 consecutive per lane. */
__device__ __forceinline__ int lane_bin(int lane, int j) {
  return kBins - 1 - lane * kBinsPerLane - j;
}

/* The ordered key of the k-th largest logit counting duplicates (1 <= k <= vocab, no
 * NaN in the row). */
template <typename T>
__device__ uint32_t kth_largest_key(const T *row, int64_t vocab, uint32_t k, Shared &sh) {
  uint32_t prefix = 0, mask = 0, remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) sh.count[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const uint32_t key = ordered_key(logit_at(row, i));
      if ((key & mask) == prefix) atomicAdd(&sh.count[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x < kWarp) {
      const int lane = threadIdx.x;
      uint32_t mine = 0, all = 0;
      for (int j = 0; j < kBinsPerLane; j++) mine += sh.count[lane_bin(lane, j)];
      uint32_t above = warp_exclusive_scan(mine, &all);
      for (int j = 0; j < kBinsPerLane; j++) {
        const uint32_t b = lane_bin(lane, j), n = sh.count[b];
        if (above < remaining && remaining <= above + n) {
          sh.prefix = prefix | (b << shift);
          sh.remaining = remaining - above;
        }
        above += n;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    remaining = sh.remaining;
    mask |= 0xFFu << shift;
  }
  return prefix;
}

/* Top-p: sets f.wstar and f.id_limit to the last kept token's weight and, among equal
 * weights, id; returns the kept mass (fixed point). f has top-p off on entry. */
template <typename T>
__device__ uint64_t top_p_boundary(const T *row, int64_t vocab, float top_p, Filter &f,
                                   Shared &sh) {
  const float cut = __double2float_rn(1.0 - (double)top_p);
  uint32_t prefix = 0, mask = 0;
  uint64_t above = 0, total = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      sh.count[b] = 0;
      sh.mass[b] = 0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float w = kept_weight(logit_at(row, i), i, f);
      const uint32_t bits = __float_as_uint(w);
      if (w > 0.0f && (bits & mask) == prefix) {
        const uint32_t b = (bits >> shift) & 0xFFu;
        atomicAdd(&sh.count[b], 1u);
        atomicAdd(reinterpret_cast<unsigned long long *>(&sh.mass[b]),
                  (unsigned long long)to_fixed(w));
      }
    }
    __syncthreads();
    if (threadIdx.x < kWarp) {
      const int lane = threadIdx.x;
      uint64_t mine = 0, level_total = 0;
      for (int j = 0; j < kBinsPerLane; j++) mine += sh.mass[lane_bin(lane, j)];
      uint64_t a = above + warp_exclusive_scan(mine, &level_total);
      if (shift == 24) total = level_total;
      /* The lowest non-empty bin whose first token is kept: the kept bins form a run
       * from the top (top_p_keeps only turns false as the mass above grows). */
      int cand = -1;
      uint64_t cand_above = 0;
      uint32_t cand_count = 0;
      for (int j = 0; j < kBinsPerLane; j++) {
        const int b = lane_bin(lane, j);
        const uint32_t n = sh.count[b];
        if (n > 0 && top_p_keeps(a, total, cut)) {
          cand = b;
          cand_above = a;
          cand_count = n;
        }
        a += sh.mass[b];
      }
      const uint32_t with = __ballot_sync(0xFFFFFFFFu, cand >= 0);
      if (lane == 31 - __clz(with)) {
        sh.prefix = prefix | ((uint32_t)cand << shift);
        sh.above = cand_above;
        sh.equal_count = cand_count;
        sh.total = total;
      }
    }
    __syncthreads();
    prefix = sh.prefix;
    above = sh.above;
    total = sh.total;
    mask |= 0xFFu << shift;
  }
  /* Tokens of weight exactly wstar rank by id: how many of them stay. */
  const uint32_t equal = sh.equal_count;
  const uint64_t unit = to_fixed(__uint_as_float(prefix));
  if (threadIdx.x == 0) {
    uint32_t lo = 1, hi = equal;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo + 1) / 2;
      if (top_p_keeps(above + (uint64_t)(mid - 1) * unit, total, cut))
        lo = mid;
      else
        hi = mid - 1;
    }
    sh.keep_equal = (int32_t)lo;
    sh.id_limit = INT64_MAX;
  }
  __syncthreads();
  const int32_t keep_equal = sh.keep_equal;
  if ((uint32_t)keep_equal < equal) {
    /* The keep_equal-th smallest id of weight wstar: contiguous per-thread ranges
     * counted, scanned, and the thread holding it looks again. */
    const int64_t span = (vocab + blockDim.x - 1) / blockDim.x;
    const int64_t begin = (int64_t)threadIdx.x * span;
    const int64_t end = begin + span < vocab ? begin + span : vocab;
    int32_t mine = 0, all = 0;
    for (int64_t i = begin; i < end; i++) {
      const float w = kept_weight(logit_at(row, i), i, f);
      mine += w > 0.0f && __float_as_uint(w) == prefix;
    }
    const int32_t before = block_exclusive_scan(mine, sh.scan, &all);
    if (before < keep_equal && keep_equal <= before + mine) {
      int32_t nth = keep_equal - before;
      for (int64_t i = begin; i < end; i++) {
        const float w = kept_weight(logit_at(row, i), i, f);
        if (w > 0.0f && __float_as_uint(w) == prefix && --nth == 0) {
          sh.id_limit = i;
          break;
        }
      }
    }
    __syncthreads();
  }
  f.wstar = prefix;
  f.id_limit = sh.id_limit;
  return above + (uint64_t)keep_equal * unit;
}

/* Sum of the kept weights in fixed point (top-p off). */
template <typename T>
__device__ uint64_t kept_mass(const T *row, int64_t vocab, const Filter &f, Shared &sh) {
  uint64_t mine = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    mine += to_fixed(kept_weight(logit_at(row, i), i, f));
  }
  /* A fixed-order tree: lanes, then warps. */
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset >>= 1)
    mine += __shfl_xor_sync(0xFFFFFFFFu, mine, offset);
  __syncthreads();
  if (threadIdx.x % kWarp == 0) sh.red[threadIdx.x / kWarp] = mine;
  __syncthreads();
  uint64_t sum = 0;
  for (int w = 0; w < (int)(blockDim.x / kWarp); w++) sum += sh.red[w];
  return sum;
}

/* The exponential race of draw (seed, step): the kept token with the largest w / E. */
template <typename T>
__device__ int32_t race(const T *row, int64_t vocab, const Filter &f, uint64_t seed, uint64_t step,
                        Shared &sh) {
  const uint64_t stream = splitmix64(seed + (step + 1) * kGamma);
  uint64_t best = 0u;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float w = kept_weight(logit_at(row, i), i, f);
    if (w > 0.0f) {
      /* E = -log(1 - v), v uniform in (0, 1] with float precision at every scale, so
       * the small E that decide races are resolved finely (v = 1 gives E = inf: the
       * token only wins a race against scores of 0, by its lower id). */
      const uint64_t r = splitmix64(stream + (uint64_t)(i + 1) * kGamma);
      const float v = __fmul_rn(__ull2float_rn(r | 1u), 0x1p-64f);
      const float score = __fdiv_rn(w, -log1pf(-v));
      const uint64_t k = select_key(score, (uint32_t)i);
      best = k > best ? k : best;
    }
  }
  return (int32_t)select_key_index(block_max_u64(best, sh.red));
}

template <typename T, bool kProbs>
__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleArgs a) {
  __shared__ Shared sh;
  const int64_t r = blockIdx.x;
  const T *row = static_cast<const T *>(a.logits) + r * a.stride;
  const ina_gpu_sampling_row_t p = a.params[r];
  float *probs = kProbs ? a.probs + r * a.vocab : nullptr;
  uint32_t error = 0;
  int32_t token = -1;

  if (!(isfinite(p.temperature) && p.temperature >= 0.0f && p.top_k >= 0 && p.top_p > 0.0f &&
        p.top_p <= 1.0f)) {
    error = INA_GPU_OPS_FLAG_SAMPLING_PARAMS;
  } else if (p.temperature == 0.0f) {
    const uint64_t best = row_argmax_key(row, a.vocab, sh.red);
    if (key_is_nan(best)) error = INA_GPU_OPS_FLAG_LOGITS;
    token = (int32_t)select_key_index(best);
    if (kProbs && !error)
      for (int64_t i = threadIdx.x; i < a.vocab; i += blockDim.x)
        probs[i] = i == token ? 1.0f : 0.0f;
  } else {
    /* Arg-max and validity in one pass: NaN and +inf cannot be sampled. */
    uint64_t best = 0u;
    int bad = 0;
    for (int64_t i = threadIdx.x; i < a.vocab; i += blockDim.x) {
      const float x = logit_at(row, i);
      bad |= isnan(x) || x == INFINITY;
      const uint64_t k = select_key(x, (uint32_t)i);
      best = k > best ? k : best;
    }
    bad = __syncthreads_or(bad);
    best = block_max_u64(best, sh.red);
    Filter f = {logit_at(row, select_key_index(best)), p.temperature, 0u, 0u, INT64_MAX};
    if (bad || f.max == -INFINITY) {
      error = INA_GPU_OPS_FLAG_LOGITS;
    } else {
      if (p.top_k > 0 && p.top_k < a.vocab)
        f.kth_key = kth_largest_key(row, a.vocab, (uint32_t)p.top_k, sh);
      uint64_t mass = 0;
      if (p.top_p < 1.0f) mass = top_p_boundary(row, a.vocab, p.top_p, f, sh);
      if (kProbs) {
        if (p.top_p >= 1.0f) mass = kept_mass(row, a.vocab, f, sh);
        const double denominator = (double)mass * kFixedUnit;
        for (int64_t i = threadIdx.x; i < a.vocab; i += blockDim.x)
          probs[i] = __double2float_rn((double)kept_weight(logit_at(row, i), i, f) / denominator);
      } else {
        token = race(row, a.vocab, f, p.seed, p.step, sh);
      }
    }
  }

  if (error) {
    if (kProbs)
      for (int64_t i = threadIdx.x; i < a.vocab; i += blockDim.x) probs[i] = 0.0f;
    token = -1;
  }
  if (threadIdx.x == 0) {
    if (error) raise_flag(a.error_flags, error);
    if (!kProbs) {
      a.tokens[r] = token;
      if (a.advance && !error) a.params[r].step = p.step + 1;
    }
  }
}

ina_status_t check_args(const char *fn, const void *logits, ina_dtype_t dtype, int64_t rows,
                        int64_t vocab, int64_t row_stride, const void *params, const void *out) {
  ina_status_t st = INA_OK;
  const int64_t stride = row_stride ? row_stride : vocab;
  INA_REQUIRE(dtype == INA_DTYPE_F32 || dtype == INA_DTYPE_BF16, INA_ERR_UNSUPPORTED,
              "%s: logits dtype %s is not supported (f32 or bf16)", fn, ina_dtype_name(dtype));
  INA_REQUIRE(rows >= 0 && rows <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "%s: rows %lld must be in [0, %d]", fn, (long long)rows, INT_MAX);
  INA_REQUIRE(vocab >= 1 && vocab <= kMaxVocab, INA_ERR_INVALID_ARGUMENT,
              "%s: vocab %lld must be in [1, %lld]", fn, (long long)vocab, (long long)kMaxVocab);
  INA_REQUIRE(row_stride >= 0 && stride >= vocab, INA_ERR_INVALID_ARGUMENT,
              "%s: row_stride %lld is below vocab %lld", fn, (long long)row_stride,
              (long long)vocab);
  INA_REQUIRE(rows == 0 || (logits && params && out), INA_ERR_INVALID_ARGUMENT,
              "%s: NULL logits, params or output for %lld rows", fn, (long long)rows);
  INA_REQUIRE(ina_gpu_aligned(logits, ina_dtype_size(dtype)) && ina_gpu_aligned(params, 8) &&
                  ina_gpu_aligned(out, 4),
              INA_ERR_INVALID_ARGUMENT, "%s: pointers must be aligned to their element size", fn);
fail:
  return st;
}

template <bool kProbs>
void launch(const SampleArgs &a, ina_dtype_t dtype, int64_t rows, cudaStream_t s) {
  if (dtype == INA_DTYPE_F32)
    sample_kernel<float, kProbs><<<(unsigned)rows, kThreads, 0, s>>>(a);
  else
    sample_kernel<uint16_t, kProbs><<<(unsigned)rows, kThreads, 0, s>>>(a);
}

}  // namespace

extern "C" ina_status_t ina_gpu_sample(const void *logits, ina_dtype_t dtype, int64_t rows,
                                       int64_t vocab, int64_t row_stride,
                                       ina_gpu_sampling_row_t *params, int advance_step,
                                       int32_t *tokens, uint32_t *error_flags, void *stream) {
  ina_status_t st = INA_OK;
  SampleArgs a = {};
  INA_CHECK(check_args("ina_gpu_sample", logits, dtype, rows, vocab, row_stride, params, tokens));
  if (rows == 0) return INA_OK;
  a.logits = logits;
  a.vocab = vocab;
  a.stride = row_stride ? row_stride : vocab;
  a.params = params;
  a.advance = advance_step != 0;
  a.tokens = tokens;
  a.error_flags = error_flags;
  launch<false>(a, dtype, rows, static_cast<cudaStream_t>(stream));
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}

extern "C" ina_status_t ina_gpu_sampling_probs(const void *logits, ina_dtype_t dtype, int64_t rows,
                                               int64_t vocab, int64_t row_stride,
                                               const ina_gpu_sampling_row_t *params, float *probs,
                                               uint32_t *error_flags, void *stream) {
  ina_status_t st = INA_OK;
  SampleArgs a = {};
  INA_CHECK(
      check_args("ina_gpu_sampling_probs", logits, dtype, rows, vocab, row_stride, params, probs));
  if (rows == 0) return INA_OK;
  a.logits = logits;
  a.vocab = vocab;
  a.stride = row_stride ? row_stride : vocab;
  /* The probs kernel never writes the params. */
  a.params = const_cast<ina_gpu_sampling_row_t *>(params);
  a.tokens = NULL;
  a.probs = probs;
  a.error_flags = error_flags;
  launch<true>(a, dtype, rows, static_cast<cudaStream_t>(stream));
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
