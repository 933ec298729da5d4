/* Sampler tests: params validation; argmax; greedy; the filtered distribution
 * (ina_sampler_probs) against a literal double-precision transcription of transformers'
 * warpers over random logits and params, vocabularies up to DeepSeek's 129280; seeded
 * determinism; chi-square agreement of draw frequencies with the expected distribution
 * (fixed sampler seed, bound far beyond any chance failure, and a check that the same
 * bound rejects a wrong distribution); edge cases (ties, -inf, tiny temperature, top_k 1,
 * tiny top_p). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "model/sampler.h"
#include "tests/test_util.h"

#define DEEPSEEK_VOCAB 129280

static ina_sampling_params_t make_params(float temperature, int32_t top_k, float top_p,
                                         uint64_t seed) {
  ina_sampling_params_t p = INA_SAMPLING_PARAMS_INIT;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.seed = seed;
  return p;
}

/* ---- reference: transformers' warpers, transcribed in double -------------------- */

typedef struct ranked {
  double v;
  int32_t id;
} ranked_t;

static int by_value_desc(const void *pa, const void *pb) {
  const ranked_t *a = pa, *b = pb;
  return (a->v < b->v) - (a->v > b->v);
}

/* Ascending probability; among equals the higher id first, so the lower id ends up
 * later, i.e. ranks as more probable (the tie rule sampler.h documents). */
static int by_prob_asc_id_desc(const void *pa, const void *pb) {
  const ranked_t *a = pa, *b = pb;
  if (a->v != b->v) return a->v < b->v ? -1 : 1;
  return (a->id < b->id) - (a->id > b->id);
}

static void softmax_masked(const double *z, const unsigned char *removed, int32_t n,
                           double *out) {
  double max = -INFINITY, sum = 0;
  for (int32_t i = 0; i < n; i++) {
    if (!removed[i] && z[i] > max) max = z[i];
  }
  for (int32_t i = 0; i < n; i++) {
    out[i] = removed[i] || z[i] == -INFINITY ? 0.0 : exp(z[i] - max);
    sum += out[i];
  }
  for (int32_t i = 0; i < n; i++) out[i] /= sum;
}

/* probs[n]: the distribution after TemperatureLogitsWarper, TopKLogitsWarper and
 * TopPLogitsWarper. *ambiguous is set when a top-p cumulative sum lies so close to its
 * threshold that fp32 rounding could decide the cut either way. */
static void reference_probs(const float *x, int32_t n, const ina_sampling_params_t *p,
                            double *probs, int *ambiguous) {
  *ambiguous = 0;
  if (p->temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++) {
      if (x[i] > x[best]) best = i;
    }
    for (int32_t i = 0; i < n; i++) probs[i] = i == best;
    return;
  }
  double *z = calloc((size_t)n, sizeof(double));
  unsigned char *removed = calloc((size_t)n, 1);
  ranked_t *r = calloc((size_t)n, sizeof(ranked_t));
  for (int32_t i = 0; i < n; i++) z[i] = (double)x[i] / p->temperature;
  if (p->top_k > 0 && p->top_k < n) { /* scores < topk(scores, k).values[-1] go */
    for (int32_t i = 0; i < n; i++) r[i] = (ranked_t){z[i], i};
    qsort(r, (size_t)n, sizeof(*r), by_value_desc);
    const double kth = r[p->top_k - 1].v;
    for (int32_t i = 0; i < n; i++) removed[i] = z[i] < kth;
  }
  if (p->top_p < 1.0f) { /* sort ascending, cumsum, remove where cumsum <= 1 - top_p */
    softmax_masked(z, removed, n, probs);
    for (int32_t i = 0; i < n; i++) r[i] = (ranked_t){probs[i], i};
    qsort(r, (size_t)n, sizeof(*r), by_prob_asc_id_desc);
    const double threshold = (float)(1.0 - (double)p->top_p);
    double cum = 0;
    for (int32_t j = 0; j < n - 1; j++) { /* the most probable token always stays */
      cum += r[j].v;
      if (r[j].v > 0 && fabs(cum - threshold) < 1e-6) *ambiguous = 1;
      if (cum <= threshold) removed[r[j].id] = 1;
    }
  }
  softmax_masked(z, removed, n, probs);
  free(z);
  free(removed);
  free(r);
}

/* Compares ina_sampler_probs with the reference; returns the number of mismatches. */
static int compare_probs(const float *got, const double *want, int32_t n, int ambiguous,
                         const char *what) {
  int bad = 0;
  for (int32_t i = 0; i < n; i++) {
    int ok;
    if (want[i] == 0.0 || got[i] == 0.0f) {
      /* kept-set membership; an fp32 weight may underflow where the double one does not,
       * and a near-threshold top-p cut may go either way */
      ok = (want[i] == 0.0) == (got[i] == 0.0f) || want[i] < 1e-30 || ambiguous;
    } else {
      ok = fabs(got[i] - want[i]) <= 1e-5 * want[i] + 1e-7 || ambiguous;
    }
    if (!ok && bad++ == 0) {
      fprintf(stderr, "%s: token %d: prob %.9g, reference %.9g\n", what, (int)i, (double)got[i],
              want[i]);
    }
  }
  return bad;
}

/* ---- validation, argmax, greedy -------------------------------------------------- */

static void test_validation(void) {
  ina_log_set_quiet_errors(1);
  ina_sampler_t *s = (ina_sampler_t *)&s; /* not NULL: create must clear it */
  ina_sampling_params_t ok = make_params(0.7f, 40, 0.9f, 1);
  CHECK_OK(ina_sampling_params_validate(&ok));
  struct {
    ina_sampling_params_t p;
    const char *what;
  } bad[] = {
      {make_params(-0.1f, 0, 1.0f, 0), "temperature"},
      {make_params(NAN, 0, 1.0f, 0), "temperature"},
      {make_params(INFINITY, 0, 1.0f, 0), "temperature"},
      {make_params(1.0f, -1, 1.0f, 0), "top_k -1"},
      {make_params(1.0f, 0, 0.0f, 0), "top_p 0"},
      {make_params(1.0f, 0, -0.5f, 0), "top_p"},
      {make_params(1.0f, 0, 1.01f, 0), "top_p"},
      {make_params(1.0f, 0, NAN, 0), "top_p"},
      {ok, "struct_size"},
      {ok, "version"},
  };
  bad[8].p.struct_size = 8;
  bad[9].p.version = 0;
  for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
    ina_clear_error();
    CHECK(ina_sampling_params_validate(&bad[i].p) == INA_ERR_INVALID_ARGUMENT);
    CHECKF(strstr(ina_last_error(), bad[i].what) != NULL, "'%s' does not mention '%s'",
           ina_last_error(), bad[i].what);
    s = (ina_sampler_t *)&s;
    CHECK(ina_sampler_create(10, &bad[i].p, &s) == INA_ERR_INVALID_ARGUMENT && s == NULL);
  }
  CHECK(ina_sampling_params_validate(NULL) == INA_ERR_INVALID_ARGUMENT);
  s = (ina_sampler_t *)&s;
  CHECK(ina_sampler_create(0, &ok, &s) == INA_ERR_INVALID_ARGUMENT && s == NULL);
  CHECK(strstr(ina_last_error(), "vocab 0") != NULL);
  CHECK(ina_sampler_create(10, NULL, &s) == INA_ERR_INVALID_ARGUMENT && s == NULL);
  ina_sampler_destroy(NULL);

  /* Reset keeps the old params on failure. */
  CHECK_OK(ina_sampler_create(3, &ok, &s));
  const float logits[3] = {1.0f, 3.0f, 2.0f};
  int32_t tok = 99;
  ina_sampling_params_t greedy = make_params(0.0f, 0, 1.0f, 0);
  CHECK_OK(ina_sampler_reset(s, &greedy));
  CHECK(ina_sampler_reset(s, &bad[0].p) == INA_ERR_INVALID_ARGUMENT);
  CHECK_OK(ina_sampler_sample(s, logits, &tok));
  CHECK(tok == 1);
  CHECK(ina_sampler_sample(s, NULL, &tok) == INA_ERR_INVALID_ARGUMENT && tok == -1);
  CHECK(ina_sampler_sample(s, logits, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_sampler_probs(s, logits, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_sampler_destroy(s);
  ina_log_set_quiet_errors(0);
}

static void test_argmax(test_rng_t *r) {
  const float a[] = {1.0f, 3.0f, 3.0f, 2.0f};
  CHECK(ina_argmax_f32(a, 4) == 1); /* first of the tied maxima */
  const float b[] = {NAN, -1.0f, NAN, 5.0f, NAN};
  CHECK(ina_argmax_f32(b, 5) == 3);
  const float c[] = {NAN, NAN};
  CHECK(ina_argmax_f32(c, 2) == 0);
  const float d[] = {-INFINITY, -INFINITY, -INFINITY};
  CHECK(ina_argmax_f32(d, 3) == 0);
  const float e[] = {-INFINITY, 2.0f, INFINITY, INFINITY};
  CHECK(ina_argmax_f32(e, 4) == 2);
  CHECK(ina_argmax_f32(a, 0) == -1 && ina_argmax_f32(NULL, 3) == -1);
  for (int iter = 0; iter < 200; iter++) {
    int32_t n = (int32_t)test_rng_int(r, 1, 300);
    float *x = malloc((size_t)n * sizeof(float));
    for (int32_t i = 0; i < n; i++) {
      x[i] = test_rng_int(r, 0, 9) == 0 ? NAN : (float)test_rng_int(r, -20, 20);
    }
    int32_t want = -1;
    for (int32_t i = 0; i < n; i++) {
      if (!isnan(x[i]) && (want < 0 || x[i] > x[want])) want = i;
    }
    CHECK(ina_argmax_f32(x, n) == (want < 0 ? 0 : want));
    free(x);
  }
}

static void test_greedy(test_rng_t *r) {
  ina_sampler_t *s = NULL;
  const int32_t n = 1000;
  float *x = malloc(n * sizeof(float));
  float *probs = malloc(n * sizeof(float));
  /* top_k and top_p are ignored without sampling */
  ina_sampling_params_t p = make_params(0.0f, 5, 0.3f, test_rng_next(r));
  CHECK_OK(ina_sampler_create(n, &p, &s));
  for (int iter = 0; iter < 50; iter++) {
    for (int32_t i = 0; i < n; i++) x[i] = 4.0f * test_rng_normal(r);
    if (iter % 5 == 0) x[test_rng_int(r, 0, n - 1)] = NAN; /* skipped */
    int32_t tok = -1;
    CHECK_OK(ina_sampler_sample(s, x, &tok));
    CHECK(tok == ina_argmax_f32(x, n));
    CHECK_OK(ina_sampler_probs(s, x, probs));
    CHECK(tok >= 0 && probs[tok] == 1.0f);
  }
  for (int32_t i = 0; i < n; i++) x[i] = NAN;
  ina_log_set_quiet_errors(1);
  int32_t tok = 0;
  CHECK(ina_sampler_sample(s, x, &tok) == INA_ERR_INVALID_ARGUMENT && tok == -1);
  ina_log_set_quiet_errors(0);
  ina_sampler_destroy(s);
  free(x);
  free(probs);
}

/* ---- the filtered distribution against the reference ---------------------------- */

static void random_params(test_rng_t *r, ina_sampling_params_t *p, int32_t vocab) {
  static const float temperatures[] = {0.0f, 1e-6f, 0.3f, 0.7f, 1.0f, 1.5f, 3.0f};
  static const float top_ps[] = {1e-6f, 0.1f, 0.5f, 0.8f, 0.9f, 0.95f, 0.999f, 1.0f, 1.0f};
  *p = make_params(temperatures[test_rng_int(r, 0, 6)], 0, top_ps[test_rng_int(r, 0, 8)],
                   test_rng_next(r));
  switch (test_rng_int(r, 0, 3)) {
    case 0: p->top_k = 0; break;
    case 1: p->top_k = (int32_t)test_rng_int(r, 1, 8); break;
    case 2: p->top_k = (int32_t)test_rng_int(r, 1, vocab); break;
    default: p->top_k = vocab + (int32_t)test_rng_int(r, 0, 3); break;
  }
}

/* Normal logits, or a few distinct values (ties everywhere), with some -inf. */
static void random_logits(test_rng_t *r, float *x, int32_t n) {
  const int few_values = test_rng_int(r, 0, 3) == 0;
  const float scale = (float)test_rng_int(r, 1, 6);
  for (int32_t i = 0; i < n; i++) {
    x[i] = few_values ? (float)test_rng_int(r, -3, 3) : scale * test_rng_normal(r);
    if (test_rng_int(r, 0, 15) == 0) x[i] = -INFINITY;
  }
  x[test_rng_int(r, 0, n - 1)] = 1.0f; /* at least one finite */
}

static void test_probs_vs_reference(test_rng_t *r) {
  static const int32_t vocabs[] = {1, 2, 3, 7, 50, 257, 4000};
  int mismatched = 0, ambiguous_cases = 0, cases = 0;
  for (int iter = 0; iter < 700; iter++) {
    const int32_t n = vocabs[test_rng_int(r, 0, 6)];
    ina_sampling_params_t p;
    random_params(r, &p, n);
    float *x = malloc((size_t)n * sizeof(float));
    float *got = malloc((size_t)n * sizeof(float));
    double *want = malloc((size_t)n * sizeof(double));
    random_logits(r, x, n);
    test_poison_f32(got, (size_t)n);
    ina_sampler_t *s = NULL;
    CHECK_OK(ina_sampler_create(n, &p, &s));
    CHECK_OK(ina_sampler_probs(s, x, got));
    int ambiguous;
    reference_probs(x, n, &p, want, &ambiguous);
    char what[160];
    snprintf(what, sizeof what, "vocab %d temperature %g top_k %d top_p %g", (int)n,
             (double)p.temperature, (int)p.top_k, (double)p.top_p);
    int bad = compare_probs(got, want, n, ambiguous, what);
    CHECKF(bad == 0, "%s: %d tokens differ", what, bad);
    /* A draw always lands on a token of nonzero probability. */
    for (int d = 0; d < 5; d++) {
      int32_t tok = -1;
      CHECK_OK(ina_sampler_sample(s, x, &tok));
      CHECKF(tok >= 0 && tok < n && got[tok] > 0.0f, "%s: drew token %d", what, (int)tok);
    }
    mismatched += bad != 0;
    ambiguous_cases += ambiguous;
    cases++;
    ina_sampler_destroy(s);
    free(x);
    free(got);
    free(want);
  }
  printf("probs vs reference: %d cases, %d mismatched, %d with a near-threshold top-p cut\n",
         cases, mismatched, ambiguous_cases);
}

/* DeepSeek's vocabulary, including a long flat tail that top-p must mostly keep (the
 * sampler's head search then gathers all 129k tokens). */
static void test_large_vocab(test_rng_t *r) {
  const int32_t n = DEEPSEEK_VOCAB;
  float *x = malloc((size_t)n * sizeof(float));
  float *got = malloc((size_t)n * sizeof(float));
  double *want = malloc((size_t)n * sizeof(double));
  const ina_sampling_params_t params[] = {
      make_params(0.8f, 0, 0.9f, 11), make_params(1.0f, 50, 0.95f, 12),
      make_params(0.6f, 0, 1.0f, 13), make_params(1.0f, 0, 0.9f, 14)};
  for (int c = 0; c < 4; c++) {
    if (c < 3) {
      for (int32_t i = 0; i < n; i++) x[i] = 3.0f * test_rng_normal(r);
    } else { /* one token at 10, a flat tail holding ~85% of the mass */
      for (int32_t i = 0; i < n; i++) x[i] = 0.0f;
      x[test_rng_int(r, 0, n - 1)] = 10.0f;
    }
    ina_sampler_t *s = NULL;
    CHECK_OK(ina_sampler_create(n, &params[c], &s));
    test_poison_f32(got, (size_t)n);
    CHECK_OK(ina_sampler_probs(s, x, got));
    int ambiguous;
    reference_probs(x, n, &params[c], want, &ambiguous);
    char what[64];
    snprintf(what, sizeof what, "vocab %d case %d", (int)n, c);
    CHECK(compare_probs(got, want, n, ambiguous, what) == 0);
    int32_t kept = 0;
    for (int32_t i = 0; i < n; i++) kept += got[i] > 0.0f;
    printf("vocab %d case %d: %d tokens kept\n", (int)n, c, (int)kept);
    ina_sampler_destroy(s);
  }
  free(x);
  free(got);
  free(want);
}

/* ---- determinism ---------------------------------------------------------------- */

static void test_determinism(test_rng_t *r) {
  const int32_t n = 500, steps = 300;
  float *x = malloc((size_t)steps * n * sizeof(float));
  for (int64_t i = 0; i < (int64_t)steps * n; i++) x[i] = 2.0f * test_rng_normal(r);
  const uint64_t seed = test_rng_next(r);
  ina_sampling_params_t p = make_params(1.0f, 100, 0.95f, seed);
  ina_sampler_t *a = NULL, *b = NULL;
  CHECK_OK(ina_sampler_create(n, &p, &a));
  CHECK_OK(ina_sampler_create(n, &p, &b));
  int32_t *first = malloc((size_t)steps * sizeof(int32_t));
  int same_as_other_seed = 0;
  for (int32_t t = 0; t < steps; t++) {
    int32_t ta = -1, tb = -2;
    CHECK_OK(ina_sampler_sample(a, x + (size_t)t * n, &ta));
    CHECK_OK(ina_sampler_sample(b, x + (size_t)t * n, &tb));
    CHECK(ta == tb);
    first[t] = ta;
  }
  /* Reset replays the stream; another seed gives another one. */
  CHECK_OK(ina_sampler_reset(a, &p));
  ina_sampling_params_t other = p;
  other.seed = seed ^ 0x5DEECE66Dull;
  CHECK_OK(ina_sampler_reset(b, &other));
  int replay_ok = 1;
  for (int32_t t = 0; t < steps; t++) {
    int32_t ta = -1, tb = -1;
    CHECK_OK(ina_sampler_sample(a, x + (size_t)t * n, &ta));
    CHECK_OK(ina_sampler_sample(b, x + (size_t)t * n, &tb));
    replay_ok &= ta == first[t];
    same_as_other_seed += tb == first[t];
  }
  CHECK(replay_ok);
  CHECKF(same_as_other_seed < steps / 2, "seeds %llu and %llu agree on %d of %d draws",
         (unsigned long long)seed, (unsigned long long)other.seed, same_as_other_seed,
         (int)steps);
  /* Draw n depends only on (seed, n): after 10 calls on different logits, and a failed
   * call that must not count, both samplers agree on the 11th token for every step of a
   * fresh request. */
  float *nan_row = malloc((size_t)n * sizeof(float));
  for (int32_t i = 0; i < n; i++) nan_row[i] = NAN;
  int agree = 1;
  for (int32_t trial = 0; trial < 20; trial++) {
    p.seed = test_rng_next(r);
    CHECK_OK(ina_sampler_reset(a, &p));
    CHECK_OK(ina_sampler_reset(b, &p));
    for (int32_t t = 0; t < 10; t++) {
      int32_t ta, tb;
      CHECK_OK(ina_sampler_sample(a, x + (size_t)t * n, &ta));
      CHECK_OK(ina_sampler_sample(b, x + (size_t)(t + 100) * n, &tb));
    }
    int32_t ta = -1, tb = -2;
    ina_log_set_quiet_errors(1);
    CHECK(ina_sampler_sample(b, nan_row, &tb) == INA_ERR_INVALID_ARGUMENT);
    ina_log_set_quiet_errors(0);
    CHECK_OK(ina_sampler_sample(a, x + (size_t)200 * n, &ta));
    CHECK_OK(ina_sampler_sample(b, x + (size_t)200 * n, &tb));
    agree &= ta == tb;
  }
  CHECK(agree);
  free(nan_row);
  free(first);
  free(x);
  ina_sampler_destroy(a);
  ina_sampler_destroy(b);
}

/* ---- statistics ------------------------------------------------------------------- */

/* Pearson's chi-square of counts against probs over `draws` draws; bins expecting
 * fewer than 5 draws are pooled. +inf when a token of probability 0 was drawn. */
static double chi_square(const int64_t *counts, const double *probs, int32_t n, int64_t draws,
                         int *df) {
  double stat = 0, pooled_expected = 0, pooled_count = 0;
  int bins = 0;
  for (int32_t i = 0; i < n; i++) {
    const double expected = probs[i] * (double)draws;
    if (probs[i] == 0.0) {
      if (counts[i] > 0) return INFINITY;
      continue;
    }
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_count += (double)counts[i];
      continue;
    }
    stat += ((double)counts[i] - expected) * ((double)counts[i] - expected) / expected;
    bins++;
  }
  if (pooled_expected > 0) {
    stat += (pooled_count - pooled_expected) * (pooled_count - pooled_expected) /
            (pooled_expected > 1.0 ? pooled_expected : 1.0);
    bins++;
  }
  *df = bins > 1 ? bins - 1 : 1;
  return stat;
}

/* Far beyond chance: chi-square(df) exceeds df + 8 sqrt(2 df) + 25 with probability
 * below 1e-12 for every df here, so the test does not flake; a wrong distribution
 * overshoots it by orders of magnitude at 10^5 draws. */
static double chi_square_bound(int df) { return df + 8.0 * sqrt(2.0 * df) + 25.0; }

static void draw_counts(const ina_sampling_params_t *p, const float *x, int32_t n,
                        int64_t draws, int64_t *counts) {
  ina_sampler_t *s = NULL;
  memset(counts, 0, (size_t)n * sizeof(int64_t));
  CHECK_OK(ina_sampler_create(n, p, &s));
  if (!s) return;
  for (int64_t d = 0; d < draws; d++) {
    int32_t tok = -1;
    CHECK_OK(ina_sampler_sample(s, x, &tok));
    if (tok >= 0 && tok < n) counts[tok]++;
  }
  ina_sampler_destroy(s);
}

static void test_frequencies(test_rng_t *r) {
  enum { N = 40, DRAWS = 100000 };
  const ina_sampling_params_t cases[] = {
      make_params(1.0f, 0, 1.0f, 0), make_params(0.7f, 0, 0.9f, 0),
      make_params(1.5f, 10, 1.0f, 0), make_params(1.0f, 5, 0.8f, 0),
      make_params(0.5f, 0, 0.5f, 0), make_params(2.0f, 20, 0.95f, 0)};
  float x[N];
  double want[N], wrong[N];
  int64_t counts[N];
  for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
    ina_sampling_params_t p = cases[c];
    p.seed = 0x5EED0000u + c; /* fixed: the statistical verdict is reproducible */
    int ambiguous;
    do { /* fresh logits, but never ones whose top-p cut is a rounding call */
      for (int i = 0; i < N; i++) x[i] = 1.5f * test_rng_normal(r);
      reference_probs(x, N, &p, want, &ambiguous);
    } while (ambiguous);
    draw_counts(&p, x, N, DRAWS, counts);
    int df;
    const double stat = chi_square(counts, want, N, DRAWS, &df);
    CHECKF(stat <= chi_square_bound(df), "case %zu: chi-square %.1f with %d df (bound %.1f)", c,
           stat, df, chi_square_bound(df));

    /* Power: the same counts against the distribution of another temperature. */
    ina_sampling_params_t q = p;
    q.temperature *= 1.3f;
    reference_probs(x, N, &q, wrong, &ambiguous);
    double tv = 0;
    for (int i = 0; i < N; i++) tv += 0.5 * fabs(want[i] - wrong[i]);
    if (tv > 0.03) {
      int df_wrong;
      const double stat_wrong = chi_square(counts, wrong, N, DRAWS, &df_wrong);
      CHECKF(stat_wrong > chi_square_bound(df_wrong),
             "case %zu: a wrong distribution (TV %.3f) passes: chi-square %.1f", c, tv,
             stat_wrong);
    }
    printf("frequencies case %zu (T %g top_k %d top_p %g): chi-square %.1f, %d df\n", c,
           (double)p.temperature, (int)p.top_k, (double)p.top_p, stat, df);
  }
}

/* ---- edge cases ------------------------------------------------------------------- */

/* probs of x under p, into out[n]. */
static void probs_of(const ina_sampling_params_t *p, const float *x, int32_t n, float *out) {
  ina_sampler_t *s = NULL;
  test_poison_f32(out, (size_t)n);
  CHECK_OK(ina_sampler_create(n, p, &s));
  if (s) CHECK_OK(ina_sampler_probs(s, x, out));
  ina_sampler_destroy(s);
}

/* Tokens drawn in `draws` draws, as a bit set (n <= 32). */
static uint32_t drawn_set(const ina_sampling_params_t *p, const float *x, int32_t n,
                          int draws) {
  int64_t counts[32];
  draw_counts(p, x, n, draws, counts);
  uint32_t set = 0;
  for (int32_t i = 0; i < n; i++) set |= counts[i] ? 1u << i : 0;
  return set;
}

static void test_edge_cases(void) {
  float pr[8];
  const float lone = 0.25f;
  const ina_sampling_params_t plain = make_params(1.0f, 0, 1.0f, 1);
  CHECK(drawn_set(&plain, &lone, 1, 50) == 1u);

  /* top_k = 1: greedy when the maximum is unique; every tied maximum survives otherwise
   * (TopKLogitsWarper only removes scores below the k-th). */
  const float peak[4] = {0.5f, 2.0f, 1.9f, -1.0f};
  ina_sampling_params_t k1 = make_params(1.0f, 1, 1.0f, 2);
  CHECK(drawn_set(&k1, peak, 4, 300) == 1u << 1);
  probs_of(&k1, peak, 4, pr);
  CHECK(pr[0] == 0.0f && pr[1] == 1.0f && pr[2] == 0.0f && pr[3] == 0.0f);
  const float tied_peak[4] = {1.0f, 3.0f, 0.0f, 3.0f};
  probs_of(&k1, tied_peak, 4, pr);
  CHECK(pr[1] == 0.5f && pr[3] == 0.5f && pr[0] == 0.0f && pr[2] == 0.0f);
  CHECK(drawn_set(&k1, tied_peak, 4, 400) == ((1u << 1) | (1u << 3)));
  /* top_k = 2 with a three-way tie for second place keeps four tokens. */
  const float tie_second[5] = {5.0f, 1.0f, 1.0f, 1.0f, 0.0f};
  ina_sampling_params_t k2 = make_params(1.0f, 2, 1.0f, 3);
  probs_of(&k2, tie_second, 5, pr);
  CHECK(pr[0] > 0.9f && pr[1] > 0.0f && pr[1] == pr[2] && pr[2] == pr[3] && pr[4] == 0.0f);

  /* top_p tiny: greedy; with tied maxima the lower id alone. */
  const float rising[4] = {0.0f, 1.0f, 2.0f, 2.5f};
  ina_sampling_params_t tiny_p = make_params(1.0f, 0, 1e-7f, 4);
  CHECK(drawn_set(&tiny_p, rising, 4, 300) == 1u << 3);
  const float tied_top[4] = {0.0f, 2.0f, 2.0f, 1.0f};
  probs_of(&tiny_p, tied_top, 4, pr);
  CHECK(pr[1] == 1.0f && pr[0] == 0.0f && pr[2] == 0.0f && pr[3] == 0.0f);
  /* Probabilities ~ {1/2, 1/4, 1/4}: top_p 0.4 keeps one token, 0.6 two (the lower id
   * of the tied pair), 0.8 all three. */
  const float halves[3] = {0.0f, -0.69314718f, -0.69314718f};
  ina_sampling_params_t p4 = make_params(1.0f, 0, 0.4f, 5);
  probs_of(&p4, halves, 3, pr);
  CHECK(pr[0] == 1.0f && pr[1] == 0.0f && pr[2] == 0.0f);
  p4.top_p = 0.6f;
  probs_of(&p4, halves, 3, pr);
  CHECK(fabsf(pr[0] - 2.0f / 3.0f) < 1e-6f && fabsf(pr[1] - 1.0f / 3.0f) < 1e-6f && pr[2] == 0.0f);
  p4.top_p = 0.8f;
  probs_of(&p4, halves, 3, pr);
  CHECK(fabsf(pr[0] - 0.5f) < 1e-6f && fabsf(pr[2] - 0.25f) < 1e-6f);

  /* Four equal tokens: the cumulative sums hit 1 - top_p exactly, and a token whose
   * sum equals it goes (cumsum <= 1 - top_p), so top_p = j/4 keeps exactly j tokens,
   * the lowest ids. */
  const float flat[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  for (int j = 1; j <= 4; j++) {
    ina_sampling_params_t quarter = make_params(1.0f, 0, 0.25f * (float)j, 11);
    probs_of(&quarter, flat, 4, pr);
    for (int i = 0; i < 4; i++) {
      CHECKF(pr[i] == (i < j ? 1.0f / (float)j : 0.0f), "top_p %g: token %d prob %g",
             0.25 * j, i, (double)pr[i]);
    }
  }

  /* -inf logits are never drawn. */
  const float forbidden[5] = {-INFINITY, 0.0f, -INFINITY, 0.5f, -INFINITY};
  ina_sampling_params_t t1 = make_params(1.0f, 0, 1.0f, 6);
  CHECK(drawn_set(&t1, forbidden, 5, 400) == ((1u << 1) | (1u << 3)));
  const float only_three[5] = {-INFINITY, -INFINITY, -INFINITY, -7.0f, -INFINITY};
  CHECK(drawn_set(&t1, only_three, 5, 100) == 1u << 3);
  ina_sampling_params_t k3 = make_params(1.0f, 3, 1.0f, 7); /* 3rd largest is -inf */
  CHECK(drawn_set(&k3, only_three, 5, 100) == 1u << 3);

  /* Unusable logits are errors, with the offending index. */
  ina_sampler_t *s = NULL;
  CHECK_OK(ina_sampler_create(5, &t1, &s));
  int32_t tok = 0;
  const float all_forbidden[5] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
  const float with_nan[5] = {0.0f, 1.0f, NAN, 0.0f, 0.0f};
  const float with_inf[5] = {0.0f, INFINITY, 0.0f, 0.0f, 0.0f};
  ina_log_set_quiet_errors(1);
  CHECK(ina_sampler_sample(s, all_forbidden, &tok) == INA_ERR_INVALID_ARGUMENT && tok == -1);
  CHECK(strstr(ina_last_error(), "-inf") != NULL);
  CHECK(ina_sampler_sample(s, with_nan, &tok) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "logit 2") != NULL);
  CHECK(ina_sampler_probs(s, with_inf, pr) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "logit 1") != NULL);
  ina_log_set_quiet_errors(0);
  ina_sampler_destroy(s);

  /* Tiny temperature: greedy without overflow; ties split evenly. Huge: uniform. */
  const float close[4] = {1.0f, 3.0f, 2.9999f, -5.0f};
  ina_sampling_params_t cold = make_params(1e-30f, 0, 1.0f, 8);
  probs_of(&cold, close, 4, pr);
  CHECK(pr[1] == 1.0f && pr[0] == 0.0f && pr[2] == 0.0f && pr[3] == 0.0f);
  CHECK(drawn_set(&cold, close, 4, 200) == 1u << 1);
  const float tied3[3] = {1.0f, 3.0f, 3.0f};
  probs_of(&cold, tied3, 3, pr);
  CHECK(pr[0] == 0.0f && pr[1] == 0.5f && pr[2] == 0.5f);
  ina_sampling_params_t hot = make_params(1e30f, 0, 1.0f, 9);
  probs_of(&hot, forbidden, 5, pr);
  CHECK(pr[0] == 0.0f && pr[2] == 0.0f && pr[4] == 0.0f && pr[1] == 0.5f && pr[3] == 0.5f);

  /* top_k >= vocab is the same as off. */
  float off[4], big[4], exact[4];
  probs_of(&t1, peak, 4, off);
  ina_sampling_params_t kbig = make_params(1.0f, 9, 1.0f, 10);
  probs_of(&kbig, peak, 4, big);
  kbig.top_k = 4;
  probs_of(&kbig, peak, 4, exact);
  CHECK(memcmp(off, big, sizeof off) == 0 && memcmp(off, exact, sizeof off) == 0);
}

int main(void) {
  const uint64_t seed = test_seed("test_sampler");
  test_rng_t r = {seed};
  test_validation();
  test_argmax(&r);
  test_greedy(&r);
  test_edge_cases();
  test_probs_vs_reference(&r);
  test_large_vocab(&r);
  test_determinism(&r);
  test_frequencies(&r);
  return test_finish("test_sampler");
}
