/* MoE router (moe_ep/moe_gpu.h; semantics in moe_ep/router.h), one warp per token.
 *
 * The warp keeps the token's scores and choice scores in shared memory, lane l owning
 * experts l, l + 32, ... for the elementwise steps. Every selection (groups, then
 * experts) is a sequence of warp arg-max rounds over 64-bit keys (value order, then the
 * lower index; NaN below everything, taken entries 0), which yields exactly the
 * reference's top_k_desc order: descending, equal values by increasing index.
 *
 * The reference's arithmetic is kept step for step: sigmoid as 1 / (1 + exp(-x)), the
 * softmax sum over 8 interleaved partial sums combined pairwise, the group score of
 * noaux_tc as the sum of the group's two largest choice scores, the norm over the
 * chosen weights in selection order. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "moe_ep/moe_gpu.h"

#include <limits.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

using namespace ina_gpu;

constexpr int kWarpsPerCta = 4;
constexpr int kThreads = kWarpsPerCta * kWarp;
constexpr int kMaxExperts = 256;
constexpr int kExpertsPerLane = kMaxExperts / kWarp; /* 8 */
constexpr int kMaxTopK = 32;
constexpr int kMaxGroups = 32;
constexpr int kSumLanes = 8; /* torch's vectorized fp32 sum */
constexpr float kNormEpsilon = 1e-20f;

struct RouterArgs {
  int64_t tokens;
  int32_t experts, top_k, n_group, topk_group;
  ina_router_method_t method;
  bool norm_topk_prob, mask_zero;
  float scaling;
  const float *logits, *bias;
  int32_t *ids;
  float *weights;
};

struct WarpScratch {
  float scores[kMaxExperts]; /* sigmoid or softmax; masked in place by group_greedy */
  float choice[kMaxExperts]; /* noaux_tc: scores + bias, masked */
  int32_t chosen[kMaxTopK];
};

/* The fp32 sum of x[0..n) as the reference's lane_sum: 8 interleaved partial sums, each
 * in increasing index order, then combined pairwise (j += j + 4, j += j + 2, 0 += 1). */
__device__ float interleaved_sum(const float *x, int n, int lane) {
  float acc = 0.0f;
  if (lane < kSumLanes)
    for (int i = lane; i < n; i += kSumLanes) acc = __fadd_rn(acc, x[i]);
#pragma unroll
  for (int width = kSumLanes / 2; width >= 1; width /= 2)
    acc = __fadd_rn(acc, __shfl_down_sync(0xFFFFFFFFu, acc, width));
  return __shfl_sync(0xFFFFFFFFu, acc, 0);
}

/* Keeps the topk_group best groups (rounds of arg-max over lane g's group score) and
 * fills the values of the experts of the other groups with `fill`. */
__device__ void mask_groups(const RouterArgs &a, float group_score, float *values, float fill,
                            int lane) {
  const int group_size = a.experts / a.n_group;
  uint64_t key = lane < a.n_group ? select_key(group_score, lane) : 0u;
  uint32_t kept = 0;
  for (int r = 0; r < a.topk_group; r++) {
    const uint64_t best = warp_max_u64(key);
    const uint32_t g = select_key_index(best);
    kept |= 1u << g;
    if (lane == (int)g) key = 0u;
  }
  for (int e = lane; e < a.experts; e += kWarp)
    if (!((kept >> (e / group_size)) & 1u)) values[e] = fill;
  __syncwarp();
}

__global__ void __launch_bounds__(kThreads) router_kernel(const RouterArgs a) {
  __shared__ WarpScratch scratch[kWarpsPerCta];
  const int lane = threadIdx.x % kWarp;
  const int64_t t = (int64_t)blockIdx.x * kWarpsPerCta + threadIdx.x / kWarp;
  if (t >= a.tokens) return; /* whole warps leave together */
  WarpScratch &w = scratch[threadIdx.x / kWarp];
  const float *logits = a.logits + t * a.experts;
  const bool noaux = a.method == INA_ROUTER_SIGMOID_NOAUX_TC;

  if (noaux) {
    for (int e = lane; e < a.experts; e += kWarp) {
      const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-logits[e])));
      w.scores[e] = s;
      w.choice[e] = __fadd_rn(s, a.bias[e]);
    }
  } else {
    /* The row maximum (the reference's for any row without NaN). */
    float m = -INFINITY;
    for (int e = lane; e < a.experts; e += kWarp) m = fmaxf(m, logits[e]);
    m = warp_max(m);
    for (int e = lane; e < a.experts; e += kWarp) w.scores[e] = expf(__fsub_rn(logits[e], m));
    __syncwarp();
    const float inv_sum = __fdiv_rn(1.0f, interleaved_sum(w.scores, a.experts, lane));
    for (int e = lane; e < a.experts; e += kWarp) w.scores[e] = __fmul_rn(w.scores[e], inv_sum);
  }
  __syncwarp();

  float *select = noaux ? w.choice : w.scores;
  if (a.method != INA_ROUTER_SOFTMAX_GREEDY) {
    const int group_size = a.experts / a.n_group;
    float group_score = 0.0f;
    if (lane < a.n_group) {
      const float *g = select + lane * group_size;
      if (noaux) { /* the two largest, counting duplicates */
        float first = -INFINITY, second = -INFINITY;
        for (int e = 0; e < group_size; e++) {
          if (g[e] > first) {
            second = first;
            first = g[e];
          } else if (g[e] > second) {
            second = g[e];
          }
        }
        group_score = __fadd_rn(first, second);
      } else {
        group_score = g[0];
        for (int e = 1; e < group_size; e++) group_score = g[e] > group_score ? g[e] : group_score;
      }
    }
    mask_groups(a, group_score, select, noaux && !a.mask_zero ? -INFINITY : 0.0f, lane);
  }

  /* Top-k over the lane's experts lane + 32 j, kept as keys in registers. */
  uint64_t key[kExpertsPerLane];
#pragma unroll
  for (int j = 0; j < kExpertsPerLane; j++) {
    const int e = lane + j * kWarp;
    key[j] = e < a.experts ? select_key(select[e], e) : 0u;
  }
  for (int r = 0; r < a.top_k; r++) {
    uint64_t best = 0u;
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; j++) best = key[j] > best ? key[j] : best;
    best = warp_max_u64(best);
    const uint32_t e = select_key_index(best);
#pragma unroll
    for (int j = 0; j < kExpertsPerLane; j++)
      if (key[j] == best) key[j] = 0u;
    if (lane == 0) w.chosen[r] = (int32_t)e;
  }
  __syncwarp();

  float denominator = 1.0f;
  if (noaux && a.norm_topk_prob) {
    float sum = 0.0f;
    for (int r = 0; r < a.top_k; r++) sum = __fadd_rn(sum, w.scores[w.chosen[r]]);
    denominator = __fadd_rn(sum, kNormEpsilon);
  }
  for (int r = lane; r < a.top_k; r += kWarp) {
    const int32_t e = w.chosen[r];
    float weight = w.scores[e];
    if (noaux && a.norm_topk_prob) weight = __fdiv_rn(weight, denominator);
    a.ids[t * a.top_k + r] = e;
    a.weights[t * a.top_k + r] = __fmul_rn(weight, a.scaling);
  }
}

}  // namespace

extern "C" ina_status_t ina_gpu_router(const ina_router_config_t *cfg, const float *logits,
                                       const float *correction_bias, int64_t tokens, int32_t *ids,
                                       float *weights, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  RouterArgs a = {};
  bool noaux = false, grouped = false;
  int64_t grid = 0;
  INA_CHECK(ina_router_config_validate(cfg));
  noaux = cfg->method == INA_ROUTER_SIGMOID_NOAUX_TC;
  grouped = cfg->method != INA_ROUTER_SOFTMAX_GREEDY;
  INA_REQUIRE(cfg->num_experts <= kMaxExperts && cfg->top_k <= kMaxTopK &&
                  (!grouped || cfg->n_group <= kMaxGroups),
              INA_ERR_UNSUPPORTED,
              "ina_gpu_router: num_experts %d, top_k %d, n_group %d exceed the supported "
              "%d, %d, %d",
              (int)cfg->num_experts, (int)cfg->top_k, (int)cfg->n_group, kMaxExperts, kMaxTopK,
              kMaxGroups);
  INA_REQUIRE(tokens >= 0 && tokens <= (int64_t)INT_MAX * kWarpsPerCta, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_router: tokens %lld is out of range", (long long)tokens);
  INA_REQUIRE(noaux == (correction_bias != NULL), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_router: correction_bias must be given for sigmoid noaux_tc and only "
              "for it (method %d, bias %s)",
              (int)cfg->method, correction_bias ? "given" : "NULL");
  if (tokens == 0) return INA_OK;
  INA_REQUIRE(logits && ids && weights, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_router: NULL logits, ids or weights for %lld tokens", (long long)tokens);
  INA_REQUIRE(ina_gpu_aligned(logits, 4) && ina_gpu_aligned(correction_bias, 4) &&
                  ina_gpu_aligned(ids, 4) && ina_gpu_aligned(weights, 4),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_router: pointers must be aligned to their element size");

  a.tokens = tokens;
  a.experts = cfg->num_experts;
  a.top_k = cfg->top_k;
  a.n_group = grouped ? cfg->n_group : 1;
  a.topk_group = grouped ? cfg->topk_group : 1;
  a.method = cfg->method;
  a.norm_topk_prob = cfg->norm_topk_prob != 0;
  a.mask_zero = cfg->noaux_mask_zero != 0;
  a.scaling = cfg->routed_scaling_factor;
  a.logits = logits;
  a.bias = correction_bias;
  a.ids = ids;
  a.weights = weights;
  grid = (tokens + kWarpsPerCta - 1) / kWarpsPerCta;
  router_kernel<<<(unsigned)grid, kThreads, 0, s>>>(a);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
