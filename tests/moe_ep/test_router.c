/* ina_router_ref against (1) a brute-force router written here differently (scores in
 * double where the order allows it, every ranking done by sorting all candidates with
 * qsort), over random shapes; (2) hand-worked cases for ties, group scoring and the
 * dropped-group fill value; (3) golden cases computed by transformers' own router
 * modules (router_cases.bin, written by gen_router_cases.py); (4) config validation. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "moe_ep/router.h"
#include "tests/test_util.h"

/* ---- brute force ---------------------------------------------------------------- */

typedef struct scored {
  double score;
  int32_t index;
} scored_t;

/* Descending score, then ascending index: the tie rule router.h documents. */
static int by_score_then_index(const void *pa, const void *pb) {
  const scored_t *a = pa, *b = pb;
  if (a->score != b->score) return a->score > b->score ? -1 : 1;
  return (a->index > b->index) - (a->index < b->index);
}

/* Ranks v[0..n) (scores in double) and returns the sorted array; caller frees. */
static scored_t *rank_all(const double *v, int32_t n) {
  scored_t *s = malloc((size_t)n * sizeof(*s));
  for (int32_t i = 0; i < n; i++) s[i] = (scored_t){v[i], i};
  qsort(s, (size_t)n, sizeof(*s), by_score_then_index);
  return s;
}

/* One token. The V3 scores are the fp32 values transformers defines (sigmoid, then
 * + bias in fp32), so selection sees the exact same numbers; the softmax is taken in
 * double, which keeps its order because the test feeds the softmax methods logits
 * whose distinct values are far apart (multiples of 1/64). Weights in double. */
static void brute_route(const ina_router_config_t *c, const float *logits, const float *bias,
                        int32_t *ids, double *weights) {
  const int32_t n = c->num_experts;
  const int noaux = c->method == INA_ROUTER_SIGMOID_NOAUX_TC;
  double *score = malloc((size_t)n * sizeof(double)); /* weight source */
  double *choice = malloc((size_t)n * sizeof(double)); /* selection key */
  if (noaux) {
    for (int32_t e = 0; e < n; e++) {
      float s = 1.0f / (1.0f + expf(-logits[e]));
      score[e] = s;
      choice[e] = (float)(s + bias[e]);
    }
  } else {
    double max = -INFINITY, sum = 0;
    for (int32_t e = 0; e < n; e++) max = fmax(max, logits[e]);
    for (int32_t e = 0; e < n; e++) sum += exp((double)logits[e] - max);
    for (int32_t e = 0; e < n; e++) score[e] = choice[e] = exp((double)logits[e] - max) / sum;
  }

  if (c->method != INA_ROUTER_SOFTMAX_GREEDY) {
    const int32_t gsize = n / c->n_group;
    double *group_score = malloc((size_t)c->n_group * sizeof(double));
    for (int32_t g = 0; g < c->n_group; g++) {
      scored_t *members = rank_all(choice + (size_t)g * gsize, gsize);
      group_score[g] = noaux ? (double)((float)members[0].score + (float)members[1].score)
                             : members[0].score;
      free(members);
    }
    scored_t *groups = rank_all(group_score, c->n_group);
    double fill = noaux && !c->noaux_mask_zero ? -INFINITY : 0.0;
    for (int32_t r = c->topk_group; r < c->n_group; r++) {
      for (int32_t e = 0; e < gsize; e++) choice[groups[r].index * gsize + e] = fill;
    }
    free(groups);
    free(group_score);
  }

  scored_t *experts = rank_all(choice, n);
  double sum = 0;
  for (int32_t j = 0; j < c->top_k; j++) {
    ids[j] = experts[j].index;
    weights[j] = noaux ? score[ids[j]] : choice[ids[j]];
    sum += weights[j];
  }
  for (int32_t j = 0; j < c->top_k; j++) {
    if (noaux && c->norm_topk_prob) weights[j] /= sum + 1e-20;
    weights[j] *= c->routed_scaling_factor;
  }
  free(experts);
  free(choice);
  free(score);
}

/* ---- random shapes ---------------------------------------------------------------- */

static void random_config(test_rng_t *r, ina_router_config_t *c) {
  static const int32_t expert_counts[] = {8, 12, 16, 24, 32, 48, 64, 72, 96, 128, 160, 256};
  *c = (ina_router_config_t)INA_ROUTER_CONFIG_INIT;
  c->method = (ina_router_method_t)test_rng_int(r, 0, 2);
  int32_t n;
  int32_t n_group;
  const int32_t min_group = c->method == INA_ROUTER_SIGMOID_NOAUX_TC ? 2 : 1;
  do { /* a group count in 1..8 that divides n, groups large enough */
    n = expert_counts[test_rng_int(r, 0, (int64_t)(sizeof(expert_counts) / sizeof(*expert_counts)) - 1)];
    if (test_rng_int(r, 0, 3) == 0) n = (int32_t)test_rng_int(r, 2, 256);
    n_group = (int32_t)test_rng_int(r, 1, 8);
  } while (n % n_group != 0 || n / n_group < min_group);
  c->num_experts = n;
  c->n_group = n_group;
  c->topk_group = (int32_t)test_rng_int(r, 1, n_group);
  int32_t available = c->method == INA_ROUTER_SOFTMAX_GREEDY ? n : c->topk_group * (n / n_group);
  c->top_k = (int32_t)test_rng_int(r, 1, available < 8 ? available : 8);
  c->norm_topk_prob = (int)test_rng_int(r, 0, 1);
  c->routed_scaling_factor = (float)test_rng_int(r, 1, 64) / 8.0f;
  c->noaux_mask_zero = test_rng_int(r, 0, 3) == 0;
  if (c->method == INA_ROUTER_SOFTMAX_GREEDY) { /* ignored: anything goes */
    c->n_group = (int32_t)test_rng_int(r, -1, 3);
    c->topk_group = (int32_t)test_rng_int(r, -1, 3);
  }
}

/* Logits and bias for one config. Softmax methods get multiples of 1/64 (see
 * brute_route); some configs get a handful of values only, to force many exact ties. */
static void random_inputs(test_rng_t *r, const ina_router_config_t *c, int64_t tokens,
                          float *logits, float *bias) {
  const int64_t n = c->num_experts;
  const int few_values = test_rng_int(r, 0, 4) == 0;
  const float std = (float)test_rng_int(r, 1, 4);
  for (int64_t i = 0; i < tokens * n; i++) {
    if (few_values) {
      logits[i] = (float)test_rng_int(r, -2, 2);
    } else if (c->method == INA_ROUTER_SIGMOID_NOAUX_TC) {
      logits[i] = std * test_rng_normal(r);
    } else {
      logits[i] = (float)test_rng_int(r, -64 * 6, 64 * 6) / 64.0f;
    }
  }
  const float bias_mean = (float)test_rng_int(r, -2, 1) * 0.5f;
  for (int64_t e = 0; e < n; e++) {
    bias[e] = few_values ? (float)test_rng_int(r, 0, 2) * 0.25f
                         : bias_mean + 0.3f * test_rng_normal(r);
  }
}

static void test_against_brute_force(uint64_t seed) {
  test_rng_t r = {seed};
  int mismatched_configs = 0;
  for (int iter = 0; iter < 600; iter++) {
    ina_router_config_t c;
    random_config(&r, &c);
    const int64_t tokens = test_rng_int(&r, 1, 9);
    const int64_t n = c.num_experts, k = c.top_k;
    float *logits = malloc((size_t)(tokens * n) * sizeof(float));
    float *bias = malloc((size_t)n * sizeof(float));
    int32_t *ids = malloc((size_t)(tokens * k) * sizeof(int32_t));
    float *weights = malloc((size_t)(tokens * k) * sizeof(float));
    int32_t want_ids[8];
    double want_w[8];
    random_inputs(&r, &c, tokens, logits, bias);
    test_poison_f32(weights, (size_t)(tokens * k));
    for (int64_t i = 0; i < tokens * k; i++) ids[i] = -1;
    const float *b = c.method == INA_ROUTER_SIGMOID_NOAUX_TC ? bias : NULL;
    CHECK_OK(ina_router_ref(&c, logits, b, tokens, ids, weights));
    int bad = 0;
    for (int64_t t = 0; t < tokens; t++) {
      brute_route(&c, logits + t * n, bias, want_ids, want_w);
      for (int64_t j = 0; j < k; j++) {
        const int32_t got_id = ids[t * k + j];
        const double got_w = weights[t * k + j];
        if (got_id != want_ids[j] || !(fabs(got_w - want_w[j]) <= 1e-6 * fabs(want_w[j]))) {
          if (bad++ == 0) {
            fprintf(stderr,
                    "brute force: method %d experts %d top_k %d groups %d/%d norm %d mask0 %d: "
                    "token %lld slot %lld: id %d weight %.9g, expected id %d weight %.9g\n",
                    (int)c.method, (int)c.num_experts, (int)c.top_k, (int)c.topk_group,
                    (int)c.n_group, c.norm_topk_prob, c.noaux_mask_zero, (long long)t,
                    (long long)j, (int)got_id, got_w, (int)want_ids[j], want_w[j]);
          }
        }
      }
    }
    CHECK(bad == 0);
    mismatched_configs += bad != 0;
    free(logits);
    free(bias);
    free(ids);
    free(weights);
  }
  printf("brute force: 600 random configs, %d mismatched\n", mismatched_configs);
}

/* ---- hand-worked cases ------------------------------------------------------------ */

static void test_fixed_cases(void) {
  int32_t ids[4];
  float w[4];

  /* Softmax greedy with a tie: experts 1 and 2 share the best logit, lower index first. */
  ina_router_config_t g = INA_ROUTER_CONFIG_INIT;
  g.method = INA_ROUTER_SOFTMAX_GREEDY;
  g.num_experts = 4;
  g.top_k = 2;
  g.norm_topk_prob = 1; /* ignored by the V2 methods */
  g.routed_scaling_factor = 2.0f;
  const float tie_logits[4] = {0.0f, 1.0f, 1.0f, -1.0f};
  CHECK_OK(ina_router_ref(&g, tie_logits, NULL, 1, ids, w));
  const double p1 = exp(1.0) / (1.0 + 2.0 * exp(1.0) + exp(-1.0));
  CHECK(ids[0] == 1 && ids[1] == 2);
  CHECKF(fabs(w[0] - 2.0 * p1) < 1e-6 && w[0] == w[1], "w %g %g, want %g (unnormalized)",
         (double)w[0], (double)w[1], 2.0 * p1);

  /* V3: 4 groups of 2, keep 2. Choice scores 0.5 + bias: group sums 1.0, 1.1, 1.2, 1.0
   * keep groups 2 and 1; best experts 5 (0.7) then 2 (0.6); weights 0.5 / 1.0 * 2.5. */
  ina_router_config_t v3 = INA_ROUTER_CONFIG_INIT;
  v3.num_experts = 8;
  v3.top_k = 2;
  v3.n_group = 4;
  v3.topk_group = 2;
  v3.norm_topk_prob = 1;
  v3.routed_scaling_factor = 2.5f;
  const float zeros[8] = {0};
  const float bias8[8] = {0.0f, 0.0f, 0.1f, 0.0f, 0.0f, 0.2f, 0.0f, 0.0f};
  CHECK_OK(ina_router_ref(&v3, zeros, bias8, 1, ids, w));
  CHECK(ids[0] == 5 && ids[1] == 2);
  CHECKF(fabsf(w[0] - 1.25f) < 1e-6f && fabsf(w[1] - 1.25f) < 1e-6f, "w %g %g", (double)w[0],
         (double)w[1]);

  /* Group score is the top-2 sum, not the max: choices {0.9, 0.0 | 0.6, 0.6} keep
   * group 1 (1.2 > 0.9) and pick expert 2 (tied with 3). */
  ina_router_config_t v3b = INA_ROUTER_CONFIG_INIT;
  v3b.num_experts = 4;
  v3b.top_k = 1;
  v3b.n_group = 2;
  v3b.topk_group = 1;
  v3b.norm_topk_prob = 1;
  const float bias_sum[4] = {0.4f, -0.5f, 0.1f, 0.1f};
  CHECK_OK(ina_router_ref(&v3b, zeros, bias_sum, 1, ids, w));
  CHECK(ids[0] == 2);
  CHECK(w[0] == 1.0f); /* 0.5 / (0.5 + 1e-20) */

  /* The same choices under V2's group max keep group 0 instead: softmax scores ordered
   * like the logits {0.9, 0, 0.6, 0.6}. */
  ina_router_config_t v2g = v3b;
  v2g.method = INA_ROUTER_SOFTMAX_GROUP_GREEDY;
  const float v2_logits[4] = {0.9f, 0.0f, 0.6f, 0.6f};
  CHECK_OK(ina_router_ref(&v2g, v2_logits, NULL, 1, ids, w));
  CHECK(ids[0] == 0);

  /* Dropped-group fill: every choice score negative. -inf keeps the choice inside the
   * kept group 0 (expert 0, tied with 1); a 0.0 fill lets dropped expert 2 win. */
  const float bias_neg[4] = {-1.0f, -1.0f, -2.0f, -2.0f};
  CHECK_OK(ina_router_ref(&v3b, zeros, bias_neg, 1, ids, w));
  CHECK(ids[0] == 0);
  ina_router_config_t v3z = v3b;
  v3z.noaux_mask_zero = 1;
  CHECK_OK(ina_router_ref(&v3z, zeros, bias_neg, 1, ids, w));
  CHECK(ids[0] == 2);
  CHECK(w[0] == 1.0f);

  /* Without normalization the weight is the raw sigmoid times the scale. */
  v3b.norm_topk_prob = 0;
  v3b.routed_scaling_factor = 3.0f;
  CHECK_OK(ina_router_ref(&v3b, zeros, bias_sum, 1, ids, w));
  CHECK(ids[0] == 2 && w[0] == 1.5f);

  /* NaN logits still give distinct ids in range. */
  ina_router_config_t v2 = INA_ROUTER_CONFIG_INIT;
  v2.method = INA_ROUTER_SOFTMAX_GREEDY;
  v2.num_experts = 4;
  v2.top_k = 4;
  const float nan_logits[4] = {NAN, 1.0f, NAN, 0.0f};
  CHECK_OK(ina_router_ref(&v2, nan_logits, NULL, 1, ids, w));
  int seen = 0;
  for (int j = 0; j < 4; j++) {
    CHECK(ids[j] >= 0 && ids[j] < 4);
    if (ids[j] >= 0 && ids[j] < 4) seen |= 1 << ids[j];
  }
  CHECK(seen == 0xF);
  const float nan_bias[8] = {0, 0, 0, NAN, 0, 0, 0, 0};
  CHECK(ina_router_ref(&v3, zeros, nan_bias, 1, ids, w) == INA_ERR_INVALID_ARGUMENT);
}

/* ---- validation -------------------------------------------------------------------- */

/* The config must be rejected with a message that contains `what`. */
static void expect_invalid(const ina_router_config_t *c, const char *what) {
  ina_clear_error();
  ina_status_t st = ina_router_config_validate(c);
  CHECKF(st == INA_ERR_INVALID_ARGUMENT, "expected a rejection mentioning '%s', got %d", what,
         (int)st);
  CHECKF(strstr(ina_last_error(), what) != NULL, "message '%s' does not mention '%s'",
         ina_last_error(), what);
}

static void test_validation(void) {
  ina_log_set_quiet_errors(1);
  ina_router_config_t ok = INA_ROUTER_CONFIG_INIT;
  ok.num_experts = 256;
  ok.top_k = 8;
  ok.n_group = 8;
  ok.topk_group = 4;
  CHECK_OK(ina_router_config_validate(&ok));
  CHECK(ina_router_config_validate(NULL) == INA_ERR_INVALID_ARGUMENT);

  ina_router_config_t c;
#define BAD(field, value, what) \
  do {                          \
    c = ok;                     \
    c.field = value;            \
    expect_invalid(&c, what);   \
  } while (0)
  BAD(struct_size, 8, "struct_size");
  BAD(version, 0, "version");
  BAD(method, (ina_router_method_t)7, "method 7");
  BAD(num_experts, 0, "num_experts");
  BAD(top_k, 0, "top_k 0");
  BAD(top_k, 257, "top_k 257");
  BAD(routed_scaling_factor, 0.0f, "routed_scaling_factor");
  BAD(routed_scaling_factor, NAN, "routed_scaling_factor");
  BAD(n_group, 0, "n_group 0");
  BAD(n_group, 3, "n_group 3 does not divide num_experts 256");
  BAD(topk_group, 0, "topk_group 0");
  BAD(topk_group, 9, "topk_group 9");
  c = ok;
  c.n_group = 128; /* groups of 2, keep 3: 6 experts for top_k 8 */
  c.topk_group = 3;
  expect_invalid(&c, "top_k 8 exceeds the 6 experts");
  c = ok;
  c.topk_group = 1;
  c.top_k = 33;
  expect_invalid(&c, "top_k 33 exceeds the 32 experts");
  c = ok;
  c.n_group = 256;
  c.topk_group = 8;
  expect_invalid(&c, "at least 2");
  c.method = INA_ROUTER_SOFTMAX_GROUP_GREEDY; /* a group of one is fine for the max */
  CHECK_OK(ina_router_config_validate(&c));
  c = ok;
  c.method = INA_ROUTER_SOFTMAX_GREEDY; /* greedy ignores the group fields */
  c.n_group = 0;
  c.topk_group = 0;
  CHECK_OK(ina_router_config_validate(&c));
#undef BAD

  float logits[256] = {0}, bias[256] = {0}, w[8];
  int32_t ids[8];
  ina_clear_error();
  CHECK(ina_router_ref(&ok, logits, NULL, 1, ids, w) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "correction_bias") != NULL);
  c = ok;
  c.method = INA_ROUTER_SOFTMAX_GROUP_GREEDY;
  CHECK(ina_router_ref(&c, logits, bias, 1, ids, w) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_router_ref(&ok, logits, bias, -1, ids, w) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_router_ref(&ok, NULL, bias, 1, ids, w) == INA_ERR_INVALID_ARGUMENT);
  CHECK_OK(ina_router_ref(&ok, NULL, bias, 0, NULL, NULL));
  ina_log_set_quiet_errors(0);
}

/* ---- golden cases from transformers --------------------------------------------- */

static int read_exact(FILE *f, void *dst, size_t bytes) {
  return fread(dst, 1, bytes, f) == bytes;
}

static void test_golden(const char *path) {
  FILE *f = fopen(path, "rb");
  CHECKF(f != NULL, "cannot open %s", path);
  if (!f) return;
  char magic[8];
  uint32_t count = 0;
  CHECK(read_exact(f, magic, 8) && memcmp(magic, "INARTR01", 8) == 0);
  CHECK(read_exact(f, &count, 4) && count > 0 && count < 1000);
  double worst_rel = 0;
  uint32_t done = 0;
  for (; done < count; done++) {
    int32_t h[8];
    float scale;
    if (!read_exact(f, h, sizeof h) || !read_exact(f, &scale, 4)) break;
    ina_router_config_t c = INA_ROUTER_CONFIG_INIT;
    c.method = (ina_router_method_t)h[0];
    c.num_experts = h[1];
    c.top_k = h[2];
    c.n_group = h[3];
    c.topk_group = h[4];
    c.norm_topk_prob = h[5];
    c.routed_scaling_factor = scale;
    const int64_t tokens = h[6], n = h[1], k = h[2];
    const int has_bias = h[7];
    const int sane = tokens > 0 && tokens <= 4096 && n > 0 && n <= 4096 && k > 0 && k <= n;
    CHECKF(sane, "%s: case %u has a bad header", path, (unsigned)done);
    if (!sane) break;
    float *logits = malloc((size_t)(tokens * n) * sizeof(float));
    float *bias = has_bias ? malloc((size_t)n * sizeof(float)) : NULL;
    int32_t *want_ids = malloc((size_t)(tokens * k) * sizeof(int32_t));
    float *want_w = malloc((size_t)(tokens * k) * sizeof(float));
    int32_t *ids = malloc((size_t)(tokens * k) * sizeof(int32_t));
    float *w = malloc((size_t)(tokens * k) * sizeof(float));
    int ok = read_exact(f, logits, (size_t)(tokens * n) * 4) &&
             (!has_bias || read_exact(f, bias, (size_t)n * 4)) &&
             read_exact(f, want_ids, (size_t)(tokens * k) * 4) &&
             read_exact(f, want_w, (size_t)(tokens * k) * 4);
    CHECKF(ok, "%s: case %u is truncated", path, (unsigned)done);
    if (ok) {
      test_poison_f32(w, (size_t)(tokens * k));
      CHECK_OK(ina_router_ref(&c, logits, bias, tokens, ids, w));
      int bad = 0;
      for (int64_t t = 0; t < tokens; t++) {
        for (int64_t j = 0; j < k; j++) { /* ids as sets; weights follow their id */
          int64_t m = 0;
          while (m < k && want_ids[t * k + m] != ids[t * k + j]) m++;
          double rel = m < k ? fabs((double)w[t * k + j] - want_w[t * k + m]) /
                                   fabs((double)want_w[t * k + m])
                             : INFINITY;
          if (!(rel <= 1e-6)) {
            if (bad++ == 0) {
              fprintf(stderr,
                      "golden case %u (method %d, %d experts, top_k %d): token %lld: "
                      "expert %d weight %.9g %s (rel err %.3g)\n",
                      (unsigned)done, (int)c.method, (int)n, (int)k, (long long)t,
                      (int)ids[t * k + j], (double)w[t * k + j],
                      m < k ? "differs from transformers" : "not chosen by transformers", rel);
            }
          } else if (rel > worst_rel) {
            worst_rel = rel;
          }
        }
      }
      CHECKF(bad == 0, "golden case %u: %d mismatches", (unsigned)done, bad);
    }
    free(logits);
    free(bias);
    free(want_ids);
    free(want_w);
    free(ids);
    free(w);
    if (!ok) break;
  }
  CHECKF(done == count, "%s: read %u of %u cases", path, (unsigned)done, (unsigned)count);
  fclose(f);
  printf("golden: %u cases from transformers, worst weight rel err %.3g\n", (unsigned)done,
         worst_rel);
}

int main(int argc, char **argv) {
  uint64_t seed = test_seed("test_router");
  test_validation();
  test_fixed_cases();
  test_against_brute_force(seed);
  CHECKF(argc > 1, "usage: test_router ROUTER_CASES_BIN");
  if (argc > 1) test_golden(argv[1]);
  return test_finish("test_router");
}
