/* MoE router, CPU reference. One token at a time: scores, group selection, masking,
 * top-k, weights, each step written the way transformers computes it (see router.h). */
#define INA_LOG_SUBSYS "moe_ep"

#include "moe_ep/router.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* Bytes of the version-1 config: everything up to and including noaux_mask_zero. */
#define ROUTER_CONFIG_V1_SIZE \
  (offsetof(ina_router_config_t, noaux_mask_zero) + sizeof(int))

/* torch adds 1e-20 (a Python float, rounded to fp32) to the sum before normalizing. */
#define NORM_EPSILON 1e-20f

/* Lanes of torch's vectorized fp32 sum (AVX2 width). */
#define SUM_LANES 8

static int is_group_method(ina_router_method_t m) {
  return m == INA_ROUTER_SOFTMAX_GROUP_GREEDY || m == INA_ROUTER_SIGMOID_NOAUX_TC;
}

static const char *method_name(ina_router_method_t m) {
  switch (m) {
    case INA_ROUTER_SOFTMAX_GREEDY: return "softmax greedy";
    case INA_ROUTER_SOFTMAX_GROUP_GREEDY: return "softmax group-limited greedy";
    case INA_ROUTER_SIGMOID_NOAUX_TC: return "sigmoid noaux_tc";
    default: return "unknown";
  }
}

ina_status_t ina_router_config_validate(const ina_router_config_t *c) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(c, ROUTER_CONFIG_V1_SIZE, "router: config", "INA_ROUTER_CONFIG_INIT");
  INA_REQUIRE((int)c->method >= 0 && c->method < INA_ROUTER_METHOD_COUNT,
              INA_ERR_INVALID_ARGUMENT, "router: method %d is not a known routing method",
              (int)c->method);
  INA_REQUIRE(c->num_experts >= 1, INA_ERR_INVALID_ARGUMENT,
              "router: num_experts %d must be >= 1", (int)c->num_experts);
  INA_REQUIRE(c->top_k >= 1 && c->top_k <= c->num_experts, INA_ERR_INVALID_ARGUMENT,
              "router: top_k %d must be in [1, num_experts = %d]", (int)c->top_k,
              (int)c->num_experts);
  INA_REQUIRE(isfinite(c->routed_scaling_factor) && c->routed_scaling_factor > 0.0f,
              INA_ERR_INVALID_ARGUMENT, "router: routed_scaling_factor %g must be finite and > 0",
              (double)c->routed_scaling_factor);
  if (is_group_method(c->method)) {
    INA_REQUIRE(c->n_group >= 1, INA_ERR_INVALID_ARGUMENT,
                "router (%s): n_group %d must be >= 1", method_name(c->method), (int)c->n_group);
    INA_REQUIRE(c->num_experts % c->n_group == 0, INA_ERR_INVALID_ARGUMENT,
                "router (%s): n_group %d does not divide num_experts %d",
                method_name(c->method), (int)c->n_group, (int)c->num_experts);
    INA_REQUIRE(c->topk_group >= 1 && c->topk_group <= c->n_group, INA_ERR_INVALID_ARGUMENT,
                "router (%s): topk_group %d must be in [1, n_group = %d]",
                method_name(c->method), (int)c->topk_group, (int)c->n_group);
    int32_t group_size = c->num_experts / c->n_group;
    INA_REQUIRE(c->top_k <= c->topk_group * group_size, INA_ERR_INVALID_ARGUMENT,
                "router (%s): top_k %d exceeds the %d experts of the kept groups "
                "(topk_group %d x %d experts per group)",
                method_name(c->method), (int)c->top_k, (int)(c->topk_group * group_size),
                (int)c->topk_group, (int)group_size);
    if (c->method == INA_ROUTER_SIGMOID_NOAUX_TC) {
      INA_REQUIRE(group_size >= 2, INA_ERR_INVALID_ARGUMENT,
                  "router (%s): %d expert(s) per group (num_experts %d / n_group %d); the "
                  "group score sums the top 2, so a group needs at least 2",
                  method_name(c->method), (int)group_size, (int)c->num_experts,
                  (int)c->n_group);
    }
  }
fail:
  return st;
}

/* The k largest of v[0..n) into idx[0..k), descending; equal values keep the lower
 * index first (indices are visited in increasing order and only a strictly greater
 * value moves ahead). A NaN is never greater than anything, so it only fills slots
 * nothing else claims; the ids stay distinct and in range. */
static void top_k_desc(const float *v, int32_t n, int32_t k, int32_t *idx) {
  int32_t filled = 0;
  for (int32_t i = 0; i < n; i++) {
    if (filled == k && !(v[i] > v[idx[k - 1]])) continue;
    int32_t pos = filled < k ? filled : k - 1;
    while (pos > 0 && v[i] > v[idx[pos - 1]]) {
      idx[pos] = idx[pos - 1];
      pos--;
    }
    idx[pos] = i;
    if (filled < k) filled++;
  }
}

/* fp32 sum over SUM_LANES interleaved accumulators combined pairwise, the shape of
 * torch's vectorized reduction (and its smaller rounding error). */
static float lane_sum(const float *x, int32_t n) {
  float lane[SUM_LANES] = {0};
  for (int32_t i = 0; i < n; i++) lane[i % SUM_LANES] += x[i];
  for (int width = SUM_LANES / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; j++) lane[j] += lane[j + width];
  }
  return lane[0];
}

static void softmax_f32(const float *x, int32_t n, float *out) {
  float max = x[0];
  for (int32_t i = 1; i < n; i++) max = x[i] > max ? x[i] : max;
  for (int32_t i = 0; i < n; i++) out[i] = expf(x[i] - max);
  float inv_sum = 1.0f / lane_sum(out, n);
  for (int32_t i = 0; i < n; i++) out[i] *= inv_sum;
}

/* Keeps the topk_group best groups of group_score[n_group]: the choice scores of the
 * experts in every other group are replaced by fill. */
static void mask_dropped_groups(const ina_router_config_t *c, const float *group_score,
                                int32_t *group_rank, unsigned char *group_kept,
                                float *choice, float fill) {
  const int32_t group_size = c->num_experts / c->n_group;
  top_k_desc(group_score, c->n_group, c->topk_group, group_rank);
  for (int32_t g = 0; g < c->n_group; g++) group_kept[g] = 0;
  for (int32_t j = 0; j < c->topk_group; j++) group_kept[group_rank[j]] = 1;
  for (int32_t g = 0; g < c->n_group; g++) {
    if (group_kept[g]) continue;
    for (int32_t e = 0; e < group_size; e++) choice[g * group_size + e] = fill;
  }
}

/* Per-call scratch, sized by the config. */
typedef struct router_scratch {
  float *scores;       /* [num_experts] sigmoid or softmax */
  float *choice;       /* [num_experts] NOAUX_TC: scores + bias, masked; selects */
  float *group_score;  /* [n_group] */
  int32_t *group_rank; /* [n_group] */
  unsigned char *group_kept; /* [n_group] */
} router_scratch_t;

static void router_scratch_free(router_scratch_t *w) {
  free(w->scores);
  free(w->choice);
  free(w->group_score);
  free(w->group_rank);
  free(w->group_kept);
  memset(w, 0, sizeof *w);
}

/* Scratch for cfg's sizes; choice only when asked (NOAUX_TC selects on it). */
static ina_status_t router_scratch_alloc(const ina_router_config_t *cfg, int with_choice, router_scratch_t *w) {
  ina_status_t st = INA_OK;
  const size_t n = (size_t)cfg->num_experts;
  const size_t groups = is_group_method(cfg->method) ? (size_t)cfg->n_group : 1;
  memset(w, 0, sizeof *w);
  w->scores = malloc(n * sizeof(float));
  w->choice = with_choice ? malloc(n * sizeof(float)) : NULL;
  w->group_score = malloc(groups * sizeof(float));
  w->group_rank = malloc(groups * sizeof(int32_t));
  w->group_kept = malloc(groups);
  INA_CHECK_ALLOC(w->scores);
  if (with_choice) INA_CHECK_ALLOC(w->choice);
  INA_CHECK_ALLOC(w->group_score);
  INA_CHECK_ALLOC(w->group_rank);
  INA_CHECK_ALLOC(w->group_kept);
fail:
  if (st != INA_OK) router_scratch_free(w);
  return st;
}

static void route_noaux_tc(const ina_router_config_t *c, const float *logits,
                           const float *bias, router_scratch_t *w, int32_t *ids,
                           float *weights) {
  const int32_t n = c->num_experts, group_size = n / c->n_group;
  for (int32_t e = 0; e < n; e++) {
    w->scores[e] = 1.0f / (1.0f + expf(-logits[e]));
    w->choice[e] = w->scores[e] + bias[e];
  }
  for (int32_t g = 0; g < c->n_group; g++) {
    int32_t top2[2];
    const float *grp = w->choice + (size_t)g * group_size;
    top_k_desc(grp, group_size, 2, top2);
    w->group_score[g] = grp[top2[0]] + grp[top2[1]];
  }
  mask_dropped_groups(c, w->group_score, w->group_rank, w->group_kept, w->choice,
                      c->noaux_mask_zero ? 0.0f : -INFINITY);
  top_k_desc(w->choice, n, c->top_k, ids);
  for (int32_t j = 0; j < c->top_k; j++) weights[j] = w->scores[ids[j]];
  if (c->norm_topk_prob) {
    float sum = 0.0f;
    for (int32_t j = 0; j < c->top_k; j++) sum += weights[j];
    float denominator = sum + NORM_EPSILON;
    for (int32_t j = 0; j < c->top_k; j++) weights[j] /= denominator;
  }
  for (int32_t j = 0; j < c->top_k; j++) weights[j] *= c->routed_scaling_factor;
}

static void route_softmax(const ina_router_config_t *c, const float *logits,
                          router_scratch_t *w, int32_t *ids, float *weights) {
  const int32_t n = c->num_experts;
  softmax_f32(logits, n, w->scores);
  if (c->method == INA_ROUTER_SOFTMAX_GROUP_GREEDY) {
    const int32_t group_size = n / c->n_group;
    for (int32_t g = 0; g < c->n_group; g++) {
      const float *grp = w->scores + (size_t)g * group_size;
      int32_t best = 0;
      top_k_desc(grp, group_size, 1, &best);
      w->group_score[g] = grp[best];
    }
    mask_dropped_groups(c, w->group_score, w->group_rank, w->group_kept, w->scores, 0.0f);
  }
  top_k_desc(w->scores, n, c->top_k, ids);
  for (int32_t j = 0; j < c->top_k; j++) {
    weights[j] = w->scores[ids[j]] * c->routed_scaling_factor;
  }
}

ina_status_t ina_router_ref(const ina_router_config_t *cfg, const float *logits,
                            const float *correction_bias, int64_t tokens, int32_t *ids,
                            float *weights) {
  ina_status_t st = INA_OK;
  router_scratch_t w = {0};
  INA_CHECK(ina_router_config_validate(cfg));
  const int noaux = cfg->method == INA_ROUTER_SIGMOID_NOAUX_TC;
  INA_REQUIRE(tokens >= 0, INA_ERR_INVALID_ARGUMENT, "router: tokens %lld must be >= 0",
              (long long)tokens);
  if (tokens == 0) return INA_OK;
  INA_REQUIRE(logits != NULL && ids != NULL && weights != NULL, INA_ERR_INVALID_ARGUMENT,
              "router: logits, ids and weights must not be NULL (%lld tokens)",
              (long long)tokens);
  INA_REQUIRE(!noaux || correction_bias != NULL, INA_ERR_INVALID_ARGUMENT,
              "router (%s): correction_bias (e_score_correction_bias) is required",
              method_name(cfg->method));
  INA_REQUIRE(noaux || correction_bias == NULL, INA_ERR_INVALID_ARGUMENT,
              "router (%s): correction_bias must be NULL; only sigmoid noaux_tc uses it",
              method_name(cfg->method));
  if (noaux) {
    for (int32_t e = 0; e < cfg->num_experts; e++) {
      INA_REQUIRE(isfinite(correction_bias[e]), INA_ERR_INVALID_ARGUMENT,
                  "router: correction_bias[%d] = %g is not finite", (int)e,
                  (double)correction_bias[e]);
    }
  }

  const size_t n = (size_t)cfg->num_experts;
  /* the softmax methods select on (and mask) the scores themselves */
  INA_CHECK(router_scratch_alloc(cfg, noaux, &w));

  const size_t k = (size_t)cfg->top_k;
  for (int64_t t = 0; t < tokens; t++) {
    const float *row = logits + (size_t)t * n;
    if (noaux) {
      route_noaux_tc(cfg, row, correction_bias, &w, ids + (size_t)t * k, weights + (size_t)t * k);
    } else {
      route_softmax(cfg, row, &w, ids + (size_t)t * k, weights + (size_t)t * k);
    }
  }
fail:
  router_scratch_free(&w);
  return st;
}

/* v[idx[k - 1]] - v[idx[k]] over the k + 1 best of v[n]; +inf when nothing was left out
 * (or only -inf, the masked groups of NOAUX_TC). */
static float kept_gap(const float *v, int32_t n, int32_t k, int32_t *idx) {
  if (k >= n) return INFINITY;
  top_k_desc(v, n, k + 1, idx);
  const float gap = v[idx[k - 1]] - v[idx[k]];
  return gap == gap ? gap : INFINITY;
}

ina_status_t ina_router_ref_margins(const ina_router_config_t *cfg, const float *logits,
                                    const float *correction_bias, int64_t tokens, float *margin) {
  ina_status_t st = INA_OK;
  router_scratch_t w = {0};
  int32_t *idx = NULL;
  INA_CHECK(ina_router_config_validate(cfg));
  INA_REQUIRE(tokens >= 0 && (tokens == 0 || (logits && margin)), INA_ERR_INVALID_ARGUMENT,
              "router margins: %lld tokens with NULL logits or margin", (long long)tokens);
  const int noaux = cfg->method == INA_ROUTER_SIGMOID_NOAUX_TC;
  INA_REQUIRE(!noaux || correction_bias != NULL, INA_ERR_INVALID_ARGUMENT,
              "router margins (%s): correction_bias is required", method_name(cfg->method));
  const int32_t n = cfg->num_experts, groups = is_group_method(cfg->method) ? cfg->n_group : 1;
  const int32_t group_size = n / groups;
  INA_CHECK(router_scratch_alloc(cfg, 1, &w));
  idx = malloc(((size_t)n + 1) * sizeof *idx);
  INA_CHECK_ALLOC(idx);
  for (int64_t t = 0; t < tokens; t++) {
    const float *row = logits + (size_t)t * (size_t)n;
    float m = INFINITY;
    /* The score each choice is made by, as route_noaux_tc / route_softmax form it. */
    if (noaux) {
      for (int32_t e = 0; e < n; e++) w.choice[e] = 1.0f / (1.0f + expf(-row[e])) + correction_bias[e];
    } else {
      softmax_f32(row, n, w.choice);
    }
    if (is_group_method(cfg->method)) {
      for (int32_t g = 0; g < groups; g++) {
        const float *grp = w.choice + (size_t)g * group_size;
        int32_t top2[2] = {0, 0};
        top_k_desc(grp, group_size, noaux ? 2 : 1, top2);
        w.group_score[g] = noaux ? grp[top2[0]] + grp[top2[1]] : grp[top2[0]];
      }
      const float g_gap = kept_gap(w.group_score, groups, cfg->topk_group, idx);
      if (g_gap < m) m = g_gap;
      mask_dropped_groups(cfg, w.group_score, w.group_rank, w.group_kept, w.choice,
                          noaux && !cfg->noaux_mask_zero ? -INFINITY : 0.0f);
    }
    const float e_gap = kept_gap(w.choice, n, cfg->top_k, idx);
    margin[t] = e_gap < m ? e_gap : m;
  }
fail:
  router_scratch_free(&w);
  free(idx);
  return st;
}
