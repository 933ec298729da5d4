/* Next-token sampler (semantics in sampler.h). Per call: check the logits, apply
 * top-k by threshold, weigh the survivors with exp((x - max) / T), cut the top-p tail,
 * draw. Cost is O(vocab log k) plus a sort of the top-p head only: the head is found by
 * gathering tokens above a falling weight threshold until the tokens left out are
 * certain to be cut, so a 129k vocabulary is never sorted whole. */
#define INA_LOG_SUBSYS "sampler"

#include "model/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* Bytes of the version-1 params: everything up to and including seed. */
#define PARAMS_V1_SIZE (offsetof(ina_sampling_params_t, seed) + sizeof(uint64_t))

#define SPLITMIX_GAMMA 0x9E3779B97F4A7C15ull

/* A token that survived the filters, with its unnormalized probability in (0, 1]
 * (the most probable token has weight exactly 1). */
typedef struct candidate {
  float weight;
  int32_t id;
} candidate_t;

struct ina_sampler {
  int32_t vocab;
  ina_sampling_params_t params;
  uint64_t draws;     /* ina_sampler_sample calls since create / reset */
  candidate_t *cand;  /* [vocab] */
  float *heap;        /* [vocab] min-heap of the top_k largest logits */
};

ina_status_t ina_sampling_params_validate(const ina_sampling_params_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(p, PARAMS_V1_SIZE, "sampler: params", "INA_SAMPLING_PARAMS_INIT");
  INA_REQUIRE(isfinite(p->temperature) && p->temperature >= 0.0f, INA_ERR_INVALID_ARGUMENT,
              "sampler: temperature %g must be finite and >= 0 (0 = greedy)",
              (double)p->temperature);
  INA_REQUIRE(p->top_k >= 0, INA_ERR_INVALID_ARGUMENT,
              "sampler: top_k %d must be >= 0 (0 = off)", (int)p->top_k);
  INA_REQUIRE(p->top_p > 0.0f && p->top_p <= 1.0f, INA_ERR_INVALID_ARGUMENT,
              "sampler: top_p %g must be in (0, 1] (1 = off)", (double)p->top_p);
fail:
  return st;
}

ina_status_t ina_sampler_create(int32_t vocab, const ina_sampling_params_t *p,
                                ina_sampler_t **out) {
  ina_status_t st = INA_OK;
  ina_sampler_t *s = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "sampler: out is NULL");
  *out = NULL;
  INA_REQUIRE(vocab >= 1, INA_ERR_INVALID_ARGUMENT, "sampler: vocab %d must be >= 1",
              (int)vocab);
  INA_CHECK(ina_sampling_params_validate(p));
  s = calloc(1, sizeof(*s));
  INA_CHECK_ALLOC(s);
  s->vocab = vocab;
  s->cand = malloc((size_t)vocab * sizeof(candidate_t));
  INA_CHECK_ALLOC(s->cand);
  s->heap = malloc((size_t)vocab * sizeof(float));
  INA_CHECK_ALLOC(s->heap);
  INA_CHECK(ina_sampler_reset(s, p));
  *out = s;
  return INA_OK;
fail:
  ina_sampler_destroy(s);
  return st;
}

ina_status_t ina_sampler_reset(ina_sampler_t *s, const ina_sampling_params_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s != NULL, INA_ERR_INVALID_ARGUMENT, "sampler: sampler is NULL");
  INA_CHECK(ina_sampling_params_validate(p));
  /* Copy only the version-1 fields: a caller built against a newer header may pass a
   * larger struct. */
  memcpy(&s->params, p, PARAMS_V1_SIZE);
  s->params.struct_size = sizeof(s->params);
  s->draws = 0;
fail:
  return st;
}

void ina_sampler_destroy(ina_sampler_t *s) {
  if (!s) return;
  free(s->cand);
  free(s->heap);
  free(s);
}

int32_t ina_argmax_f32(const float *x, int32_t n) {
  if (x == NULL || n <= 0) return -1;
  int32_t best = -1;
  for (int32_t i = 0; i < n; i++) {
    if (isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

/* ---- filters ------------------------------------------------------------------------ */

static void heap_sift_down(float *h, int32_t n, int32_t i) {
  for (;;) {
    int32_t smallest = i, l = 2 * i + 1, r = l + 1;
    if (l < n && h[l] < h[smallest]) smallest = l;
    if (r < n && h[r] < h[smallest]) smallest = r;
    if (smallest == i) return;
    float t = h[i];
    h[i] = h[smallest];
    h[smallest] = t;
    i = smallest;
  }
}

/* The k-th largest of x[0..n) counting duplicates (torch.topk(x, k).values[-1]);
 * 1 <= k <= n, no NaN in x. */
static float kth_largest(const float *x, int32_t n, int32_t k, float *heap) {
  memcpy(heap, x, (size_t)k * sizeof(float));
  for (int32_t i = k / 2 - 1; i >= 0; i--) heap_sift_down(heap, k, i);
  for (int32_t i = k; i < n; i++) {
    if (x[i] > heap[0]) {
      heap[0] = x[i];
      heap_sift_down(heap, k, 0);
    }
  }
  return heap[0];
}

/* Descending weight; equal weights rank the lower token id first. */
static int by_weight_desc(const void *pa, const void *pb) {
  const candidate_t *a = pa, *b = pb;
  if (a->weight != b->weight) return a->weight > b->weight ? -1 : 1;
  return (a->id > b->id) - (a->id < b->id);
}

/* Top-p over c[0..n) (weights summing to total): reorders c so that the kept tokens
 * come first, most probable first, and returns how many are kept (>= 1).
 *
 * TopPLogitsWarper removes a token when the probability mass of itself and every less
 * probable token is <= 1 - top_p, i.e. (total - above) / total <= 1 - top_p where
 * `above` is the mass ranked above it. That mass only shrinks down the ranking, so the
 * kept tokens are a head of it. The head is gathered (unsorted) by a falling weight
 * threshold: once the heaviest token left out is itself cut, so is everything below
 * it, and only the gathered head needs sorting. */
static int32_t top_p_head(candidate_t *c, int32_t n, double total, float top_p) {
  /* torch compares fp32 cumulative sums with (1 - top_p) rounded to fp32. */
  const float cut_at_or_below = (float)(1.0 - (double)top_p);
  int32_t gathered = 0;
  double gathered_mass = 0;
  float threshold = 1.0f / 16.0f;
  for (;;) {
    for (int32_t i = gathered; i < n; i++) {
      if (c[i].weight >= threshold) {
        candidate_t t = c[i];
        c[i] = c[gathered];
        c[gathered++] = t;
        gathered_mass += t.weight;
      }
    }
    if (gathered == n) break;
    /* Every token left out weighs less than all gathered ones, so the heaviest of them
     * has exactly gathered_mass above it. */
    if ((float)((total - gathered_mass) / total) <= cut_at_or_below) break;
    threshold /= 64.0f; /* reaches 0 eventually, which gathers everything */
  }
  qsort(c, (size_t)gathered, sizeof(*c), by_weight_desc);
  double above = 0;
  int32_t kept = 0;
  for (; kept < gathered; kept++) {
    if (kept > 0 && (float)((total - above) / total) <= cut_at_or_below) break;
    above += c[kept].weight;
  }
  return kept;
}

/* Applies temperature, top-k and top-p to logits: s->cand[0..*kept) are the tokens
 * that may be drawn, *mass the sum of their weights. Not for greedy. */
static ina_status_t filter_logits(ina_sampler_t *s, const float *x, int32_t *kept,
                                  double *mass) {
  ina_status_t st = INA_OK;
  const ina_sampling_params_t *p = &s->params;
  const int32_t n = s->vocab;
  float max = -INFINITY;
  for (int32_t i = 0; i < n; i++) {
    INA_REQUIRE(!isnan(x[i]) && x[i] != INFINITY, INA_ERR_INVALID_ARGUMENT,
                "sampler: logit %d of %d is %g; logits must be finite or -inf", (int)i,
                (int)n, (double)x[i]);
    if (x[i] > max) max = x[i];
  }
  INA_REQUIRE(max > -INFINITY, INA_ERR_INVALID_ARGUMENT,
              "sampler: all %d logits are -inf; no token can be drawn", (int)n);

  float keep_from = -INFINITY; /* top-k: tokens below the k-th largest logit go */
  if (p->top_k > 0 && p->top_k < n) keep_from = kth_largest(x, n, p->top_k, s->heap);

  int32_t count = 0;
  double total = 0;
  for (int32_t i = 0; i < n; i++) {
    if (x[i] == -INFINITY || x[i] < keep_from) continue;
    /* (x - max) / T <= 0, so no overflow however small T is; the maximum weighs 1. */
    float w = expf((x[i] - max) / p->temperature);
    if (w > 0.0f) { /* an underflowed weight can never be drawn */
      s->cand[count++] = (candidate_t){w, i};
      total += w;
    }
  }
  *kept = count;
  if (p->top_p < 1.0f) {
    *kept = top_p_head(s->cand, count, total, p->top_p);
    total = 0;
    for (int32_t j = 0; j < *kept; j++) total += s->cand[j].weight;
  }
  *mass = total;
fail:
  return st;
}

/* Uniform in [0, 1) for draw number n of the stream `seed` (splitmix64). */
static double uniform_at(uint64_t seed, uint64_t n) {
  uint64_t z = seed + (n + 1) * SPLITMIX_GAMMA;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (double)(z >> 11) * 0x1.0p-53;
}

static ina_status_t check_call(const ina_sampler_t *s, const float *logits, const void *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s != NULL && logits != NULL && out != NULL, INA_ERR_INVALID_ARGUMENT,
              "sampler: sampler, logits and output must not be NULL");
fail:
  return st;
}

/* Greedy choice; fails only when there is no number to choose. */
static ina_status_t greedy(const ina_sampler_t *s, const float *logits, int32_t *token) {
  ina_status_t st = INA_OK;
  *token = ina_argmax_f32(logits, s->vocab);
  INA_REQUIRE(!isnan(logits[*token]), INA_ERR_INVALID_ARGUMENT,
              "sampler: all %d logits are NaN", (int)s->vocab);
fail:
  return st;
}

ina_status_t ina_sampler_sample(ina_sampler_t *s, const float *logits, int32_t *token) {
  ina_status_t st = INA_OK;
  int32_t chosen = -1;
  if (token) *token = -1;
  INA_CHECK(check_call(s, logits, token));
  if (s->params.temperature == 0.0f) {
    INA_CHECK(greedy(s, logits, &chosen));
  } else {
    int32_t kept;
    double mass;
    INA_CHECK(filter_logits(s, logits, &kept, &mass));
    const double target = uniform_at(s->params.seed, s->draws) * mass;
    double acc = 0;
    chosen = s->cand[kept - 1].id; /* if rounding leaves target past the last sum */
    for (int32_t j = 0; j < kept; j++) {
      acc += s->cand[j].weight;
      if (target < acc) {
        chosen = s->cand[j].id;
        break;
      }
    }
  }
  s->draws++;
  *token = chosen;
fail:
  return st;
}

ina_status_t ina_sampler_probs(ina_sampler_t *s, const float *logits, float *probs) {
  ina_status_t st = INA_OK;
  INA_CHECK(check_call(s, logits, probs));
  memset(probs, 0, (size_t)s->vocab * sizeof(float));
  if (s->params.temperature == 0.0f) {
    int32_t token;
    INA_CHECK(greedy(s, logits, &token));
    probs[token] = 1.0f;
    return INA_OK;
  }
  int32_t kept;
  double mass;
  INA_CHECK(filter_logits(s, logits, &kept, &mass));
  for (int32_t j = 0; j < kept; j++) probs[s->cand[j].id] = (float)(s->cand[j].weight / mass);
fail:
  return st;
}

void ina_sampler_skip(ina_sampler_t *s, uint64_t n) {
  if (s) s->draws += n;
}
