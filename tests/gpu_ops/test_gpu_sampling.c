/* GPU arg-max and sampling against model/sampler.h.
 *   argmax:  identical to ina_argmax_f32 (f32 and bf16 rows; ties, NaN, -inf, all-NaN,
 *            -0 vs +0), vocabularies up to DeepSeek's 129280.
 *   probs:   ina_gpu_sampling_probs against ina_sampler_probs on fresh random logits and
 *            params (temperature, top-k with ties, top-p, greedy, -inf entries, coarse
 *            logits with many equal values): the same kept tokens, except a token whose
 *            top-p cumulative mass lies within 1e-5 of the cut (rounding may put it on
 *            either side), and the same probabilities within 1e-5 relative.
 *   sample:  with fixed seeds, the draw frequencies over many rows and steps pass a
 *            chi-square test against the CPU distribution (a bound far beyond chance,
 *            which the same draws fail against a 15% different temperature);
 *            draws never leave the kept set; the same (seed, step) draws the same token;
 *            advance_step counts successful draws; greedy rows equal the arg-max; rows
 *            with bad params or logits give -1 and the matching error flag; a captured
 *            CUDA graph replays the draws of consecutive steps.
 * Skipped (exit 77) without a CUDA device. */
#include "tests/gpu_ops/gpu_ops_test.h"

#include "gpu_ops/gpu_ops.h"
#include "model/sampler.h"

#if INA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define DEEPSEEK_VOCAB 129280

/* ---- data ------------------------------------------------------------------------- */

typedef enum { LOGITS_NORMAL, LOGITS_COARSE, LOGITS_NEG_INF } logits_kind_t;

static void make_logits(float *x, int64_t n, logits_kind_t kind, float scale, test_rng_t *rng) {
  for (int64_t i = 0; i < n; i++) {
    float v = test_rng_normal(rng) * scale;
    if (kind == LOGITS_COARSE) v = roundf(v * 2.0f) / 2.0f; /* many exact ties */
    /* -inf entries, but never the first: a row keeps something to draw */
    if (kind == LOGITS_NEG_INF && i > 0 && test_rng_int(rng, 0, 4) == 0) v = -INFINITY;
    x[i] = v;
  }
}

/* Rounds to bf16 in place (so CPU and GPU see the same values) and keeps the bits. */
static void to_bf16(float *x, uint16_t *bits, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    bits[i] = ina_f32_to_bf16(x[i]);
    x[i] = ina_bf16_to_f32(bits[i]);
  }
}

static ina_gpu_sampling_row_t row_params(float temperature, int32_t top_k, float top_p,
                                         uint64_t seed, uint64_t step) {
  ina_gpu_sampling_row_t r = {temperature, top_k, top_p, 0u, seed, step};
  return r;
}

static int cpu_probs(const float *logits, int64_t V, const ina_gpu_sampling_row_t *r, float *out) {
  ina_sampling_params_t p = INA_SAMPLING_PARAMS_INIT;
  p.temperature = r->temperature;
  p.top_k = r->top_k;
  p.top_p = r->top_p;
  p.seed = r->seed;
  ina_sampler_t *s = NULL;
  ina_status_t st = ina_sampler_create((int32_t)V, &p, &s);
  if (st == INA_OK) st = ina_sampler_probs(s, logits, out);
  ina_sampler_destroy(s);
  return st == INA_OK;
}

/* ---- argmax ------------------------------------------------------------------------- */

static void argmax_case(int64_t B, int64_t V, int bf16, int64_t pad, test_rng_t *rng) {
  char what[120];
  snprintf(what, sizeof what, "argmax B %lld V %lld %s pad %lld", (long long)B, (long long)V,
           bf16 ? "bf16" : "f32", (long long)pad);
  const int64_t stride = V + pad;
  float *x = malloc((size_t)(B * stride) * 4);
  uint16_t *bits = malloc((size_t)(B * stride) * 2);
  int32_t *got = malloc((size_t)B * 4);
  CHECK(x && bits && got);
  if (!(x && bits && got)) goto done;
  for (int64_t r = 0; r < B; r++) {
    float *row = x + r * stride;
    const int pattern = (int)(r % 6);
    make_logits(row, stride, pattern == 1 ? LOGITS_COARSE : LOGITS_NORMAL, 3.0f, rng);
    if (pattern == 2) /* NaN sprinkled, including on the maximum's neighbours */
      for (int64_t i = 0; i < V; i++)
        if (test_rng_int(rng, 0, 3) == 0) row[i] = NAN;
    if (pattern == 3) /* all NaN: answer 0 */
      for (int64_t i = 0; i < V; i++) row[i] = NAN;
    if (pattern == 4) { /* -0 before +0 and -inf elsewhere: the first zero wins */
      for (int64_t i = 0; i < V; i++) row[i] = -INFINITY;
      row[V / 3] = -0.0f;
      row[V - 1] = 0.0f;
    }
    if (pattern == 5) { /* duplicated maximum */
      const int64_t a = test_rng_int(rng, 0, V - 1), b = test_rng_int(rng, 0, V - 1);
      row[a] = row[b] = 1000.0f;
    }
  }
  if (bf16) to_bf16(x, bits, B * stride);
  dev_buf_t dx = bf16 ? dev_buf_from(bits, (size_t)(B * stride) * 2, 0)
                      : dev_buf_from(x, (size_t)(B * stride) * 4, 0);
  dev_buf_t dout = dev_buf_make((size_t)B * 4, 0xFF);
  if (!dx.p || !dout.p) goto free_dev;
  CHECK_OK(ina_gpu_argmax(dx.p, bf16 ? INA_DTYPE_BF16 : INA_DTYPE_F32, B, V, stride, dout.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dout, got, what);
  int64_t bad = 0;
  for (int64_t r = 0; r < B; r++) {
    const int32_t want = ina_argmax_f32(x + r * stride, (int32_t)V);
    if (got[r] != want && bad++ < 5)
      fprintf(stderr, "%s: row %lld: %d, reference %d\n", what, (long long)r, got[r], want);
  }
  CHECKF(bad == 0, "%s: %lld rows differ", what, (long long)bad);
free_dev:
  dev_buf_free(&dx);
  dev_buf_free(&dout);
done:
  free(x);
  free(bits);
  free(got);
}

/* ---- probs --------------------------------------------------------------------------- */

typedef struct ranked {
  float w;
  int32_t id;
} ranked_t;

static int by_weight_desc(const void *pa, const void *pb) {
  const ranked_t *a = pa, *b = pb;
  if (a->w != b->w) return a->w > b->w ? -1 : 1;
  return (a->id > b->id) - (a->id < b->id);
}

/* Whether token `tok`, kept by one side and not the other, sits on the top-p boundary:
 * its cumulative mass ratio (CPU weights, double sums) is within 1e-5 of 1 - top_p. */
static int on_top_p_boundary(const float *x, int64_t V, const ina_gpu_sampling_row_t *p,
                             int32_t tok) {
  if (p->top_p >= 1.0f) return 0;
  float max = -INFINITY;
  for (int64_t i = 0; i < V; i++) max = x[i] > max ? x[i] : max;
  float kth = -INFINITY;
  ranked_t *r = malloc((size_t)V * sizeof *r);
  if (!r) return 0;
  if (p->top_k > 0 && p->top_k < V) {
    for (int64_t i = 0; i < V; i++) r[i] = (ranked_t){x[i], (int32_t)i};
    qsort(r, (size_t)V, sizeof *r, by_weight_desc);
    kth = r[p->top_k - 1].w;
  }
  int64_t n = 0;
  double total = 0;
  for (int64_t i = 0; i < V; i++) {
    if (x[i] == -INFINITY || x[i] < kth) continue;
    const float w = expf((x[i] - max) / p->temperature);
    if (w > 0.0f) {
      r[n++] = (ranked_t){w, (int32_t)i};
      total += w;
    }
  }
  qsort(r, (size_t)n, sizeof *r, by_weight_desc);
  double above = 0;
  int near = 0;
  const double cut = (double)(float)(1.0 - (double)p->top_p);
  for (int64_t j = 0; j < n; j++) {
    if (r[j].id == tok) {
      near = fabs((total - above) / total - cut) <= 1e-5;
      break;
    }
    above += r[j].w;
  }
  free(r);
  return near;
}

/* Runs ina_gpu_sampling_probs on B rows of logits with per-row params and compares each
 * row with ina_sampler_probs. Rows marked `invalid` expect zeros and the flag. */
static void probs_case(int64_t B, int64_t V, int bf16, logits_kind_t kind,
                       const ina_gpu_sampling_row_t *params, test_rng_t *rng, const char *label) {
  char what[160];
  snprintf(what, sizeof what, "probs %s B %lld V %lld %s", label, (long long)B, (long long)V,
           bf16 ? "bf16" : "f32");
  float *x = malloc((size_t)(B * V) * 4), *got = malloc((size_t)(B * V) * 4),
        *want = malloc((size_t)V * 4);
  uint16_t *bits = malloc((size_t)(B * V) * 2);
  CHECK(x && got && want && bits);
  if (!(x && got && want && bits)) goto done;
  for (int64_t r = 0; r < B; r++)
    make_logits(x + r * V, V, kind, (float)(0.5 + 4.0 * test_rng_uniform(rng)), rng);
  if (bf16) to_bf16(x, bits, B * V);
  dev_buf_t dx =
      bf16 ? dev_buf_from(bits, (size_t)(B * V) * 2, 0) : dev_buf_from(x, (size_t)(B * V) * 4, 0);
  dev_buf_t dp = dev_buf_from(params, (size_t)B * sizeof *params, 0);
  dev_buf_t dout = dev_buf_make((size_t)(B * V) * 4, 0xFF);
  uint32_t zero = 0, flags = 0;
  dev_buf_t dflags = dev_buf_from(&zero, 4, 0);
  if (!dx.p || !dp.p || !dout.p || !dflags.p) goto free_dev;
  CHECK_OK(ina_gpu_sampling_probs(dx.p, bf16 ? INA_DTYPE_BF16 : INA_DTYPE_F32, B, V, 0, dp.p,
                                  dout.p, dflags.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dout, got, what);
  dev_buf_read(&dflags, &flags, what);
  CHECKF(flags == 0, "%s: error flags 0x%x", what, flags);
  for (int64_t r = 0; r < B; r++) {
    const float *xr = x + r * V, *g = got + r * V;
    CHECK(cpu_probs(xr, V, &params[r], want));
    int64_t boundary = 0, wrong_set = 0, wrong_value = 0, differ = 0;
    for (int64_t i = 0; i < V; i++) differ += (g[i] > 0) != (want[i] > 0);
    for (int64_t i = 0; i < V; i++) {
      if ((g[i] > 0) != (want[i] > 0)) {
        /* Only a few tokens can sit on the boundary; more is a wrong kept set. */
        if (differ <= 8 &&
            (on_top_p_boundary(xr, V, &params[r], (int32_t)i) || fmaxf(g[i], want[i]) < 1e-30f))
          boundary++;
        else if (wrong_set++ < 3)
          fprintf(stderr, "%s: row %lld token %lld: prob %g, reference %g\n", what, (long long)r,
                  (long long)i, g[i], want[i]);
      }
    }
    /* A token moved across the top-p boundary rescales the others by its mass. */
    const double tol = boundary ? 1e-3 : 1e-5;
    for (int64_t i = 0; i < V; i++) {
      if (!(g[i] > 0 && want[i] > 0) && !(g[i] == 0 && want[i] == 0)) continue;
      if (!(fabs((double)g[i] - (double)want[i]) <= tol * want[i] + 1e-12) && wrong_value++ < 3)
        fprintf(stderr, "%s: row %lld token %lld: prob %.9g, reference %.9g\n", what, (long long)r,
                (long long)i, g[i], want[i]);
    }
    CHECKF(wrong_set == 0, "%s: row %lld (T %g k %d p %g): %lld kept-set differences", what,
           (long long)r, (double)params[r].temperature, params[r].top_k, (double)params[r].top_p,
           (long long)wrong_set);
    CHECKF(wrong_value == 0, "%s: row %lld: %lld probabilities differ", what, (long long)r,
           (long long)wrong_value);
    const double err = test_rel_l2(g, want, (size_t)V);
    CHECKF(err <= tol, "%s: row %lld: relative L2 error %.3g", what, (long long)r, err);
    if (boundary)
      printf("%s: row %lld: %lld token(s) on the top-p boundary\n", what, (long long)r,
             (long long)boundary);
  }
free_dev:
  dev_buf_free(&dx);
  dev_buf_free(&dp);
  dev_buf_free(&dout);
  dev_buf_free(&dflags);
done:
  free(x);
  free(got);
  free(want);
  free(bits);
}

static ina_gpu_sampling_row_t random_params(int64_t V, test_rng_t *rng) {
  const int kind = (int)test_rng_int(rng, 0, 9);
  float t = (float)(0.2 + 1.5 * test_rng_uniform(rng));
  int32_t k = 0;
  float p = 1.0f;
  if (kind == 0) t = 0.0f;
  if (kind >= 2 && kind <= 6) k = (int32_t)test_rng_int(rng, 1, V < 100 ? V + 2 : 100);
  if (kind >= 4) p = (float)(0.05 + 0.94 * test_rng_uniform(rng));
  if (kind == 9) p = 1e-9f;
  return row_params(t, k, p, test_rng_next(rng), 0);
}

static void test_probs(test_rng_t *rng) {
  const int64_t vocabs[] = {1, 2, 10, 1000, 32000, DEEPSEEK_VOCAB};
  const logits_kind_t kinds[] = {LOGITS_NORMAL, LOGITS_COARSE, LOGITS_NEG_INF};
  const int nv = gpu_test_quick ? 5 : 6;
  for (int vi = 0; vi < nv; vi++) {
    for (int ki = 0; ki < 3; ki++) {
      const int64_t V = vocabs[vi];
      const int64_t B = V >= 32000 ? (gpu_test_quick ? 3 : 8) : 24;
      ina_gpu_sampling_row_t *p = malloc((size_t)B * sizeof *p);
      CHECK(p != NULL);
      if (!p) return;
      for (int64_t r = 0; r < B; r++) p[r] = random_params(V, rng);
      char label[32];
      snprintf(label, sizeof label, "kind %d", ki);
      probs_case(B, V, (vi + ki) % 2, kinds[ki], p, rng, label);
      free(p);
    }
  }
}

/* ---- draws ---------------------------------------------------------------------------- */

/* Chi-square of counts[V] (n draws) against probs[V]: bins with an expected count >= 5,
 * the rest pooled; draws of tokens with probability 0 go to *outside. *bound is
 * df + 8 sqrt(2 df) + 16, beyond 8 standard deviations of the statistic. */
static double chi_square(const int64_t *counts, const float *probs, int64_t V, int64_t n,
                         double *bound, int64_t *outside, double *df_out) {
  double x2 = 0, pooled_e = 0, pooled_o = 0;
  int64_t bins = 0;
  *outside = 0;
  for (int64_t i = 0; i < V; i++) {
    const double e = (double)probs[i] * (double)n;
    if (probs[i] == 0.0f) {
      *outside += counts[i];
      continue;
    }
    if (e >= 5.0) {
      x2 += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
      bins++;
    } else {
      pooled_e += e;
      pooled_o += (double)counts[i];
    }
  }
  if (pooled_e > 0) {
    x2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / (pooled_e > 1.0 ? pooled_e : 1.0);
    bins++;
  }
  *df_out = bins > 1 ? (double)(bins - 1) : 1.0;
  *bound = *df_out + 8.0 * sqrt(2.0 * *df_out) + 16.0;
  return x2;
}

/* Draws from B rows of the same logits (seeds base + r) for `rounds` steps with
 * advance_step, then checks the frequencies, the step counters and a replay. */
static void distribution_case(int64_t V, float t, int32_t k, float p, int bf16, int64_t B,
                              int rounds, uint64_t fixed_seed, int power_check) {
  char what[128];
  snprintf(what, sizeof what, "draws V %lld T %g k %d p %g %s", (long long)V, (double)t, k,
           (double)p, bf16 ? "bf16" : "f32");
  test_rng_t data = {fixed_seed};
  float *x = malloc((size_t)(B * V) * 4), *probs = malloc((size_t)V * 4);
  uint16_t *bits = malloc((size_t)(B * V) * 2);
  int64_t *counts = calloc((size_t)V, sizeof *counts);
  int32_t *tokens = malloc((size_t)B * 4), *first = malloc((size_t)B * 4);
  ina_gpu_sampling_row_t *params = malloc((size_t)B * sizeof *params);
  CHECK(x && probs && bits && counts && tokens && first && params);
  if (!(x && probs && bits && counts && tokens && first && params)) goto done;
  make_logits(x, V, LOGITS_NORMAL, 1.5f, &data);
  if (bf16) to_bf16(x, bits, V);
  for (int64_t r = 1; r < B; r++) {
    memcpy(x + r * V, x, (size_t)V * 4);
    memcpy(bits + r * V, bits, (size_t)V * 2);
  }
  for (int64_t r = 0; r < B; r++)
    params[r] = row_params(t, k, p, fixed_seed * 7919u + (uint64_t)r, 0);
  CHECK(cpu_probs(x, V, &params[0], probs));

  dev_buf_t dx =
      bf16 ? dev_buf_from(bits, (size_t)(B * V) * 2, 0) : dev_buf_from(x, (size_t)(B * V) * 4, 0);
  dev_buf_t dp = dev_buf_from(params, (size_t)B * sizeof *params, 0);
  dev_buf_t dt = dev_buf_make((size_t)B * 4, 0xFF);
  uint32_t zero = 0, flags = 0;
  dev_buf_t dflags = dev_buf_from(&zero, 4, 0);
  if (!dx.p || !dp.p || !dt.p || !dflags.p) goto free_dev;
  const ina_dtype_t dtype = bf16 ? INA_DTYPE_BF16 : INA_DTYPE_F32;
  for (int round = 0; round < rounds; round++) {
    CHECK_OK(ina_gpu_sample(dx.p, dtype, B, V, 0, dp.p, 1, dt.p, dflags.p, NULL));
    CHECK_OK(ina_cuda_synchronize());
    dev_buf_read(&dt, tokens, what);
    if (round == 0) memcpy(first, tokens, (size_t)B * 4);
    for (int64_t r = 0; r < B; r++) {
      if (tokens[r] < 0 || tokens[r] >= V) {
        CHECKF(0, "%s: row %lld drew %d", what, (long long)r, tokens[r]);
        continue;
      }
      counts[tokens[r]]++;
    }
  }
  ina_gpu_sampling_row_t *after = malloc((size_t)B * sizeof *after);
  CHECK(after != NULL);
  if (after) {
    dev_buf_read(&dp, after, what);
    int64_t wrong = 0;
    for (int64_t r = 0; r < B; r++)
      wrong += after[r].step != (uint64_t)rounds || after[r].seed != params[r].seed;
    CHECKF(wrong == 0, "%s: %lld rows did not count %d steps", what, (long long)wrong, rounds);
    free(after);
  }
  /* Step 0 again: the same tokens. */
  CHECK_OK(ina_cuda_memcpy_h2d(dp.p, params, (size_t)B * sizeof *params));
  CHECK_OK(ina_gpu_sample(dx.p, dtype, B, V, 0, dp.p, 0, dt.p, dflags.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dt, tokens, what);
  CHECKF(memcmp(tokens, first, (size_t)B * 4) == 0, "%s: replaying step 0 drew other tokens", what);
  dev_buf_read(&dflags, &flags, what);
  CHECKF(flags == 0, "%s: error flags 0x%x", what, flags);
  if (t == 0.0f) {
    const int32_t want = ina_argmax_f32(x, (int32_t)V);
    int64_t bad = 0;
    for (int64_t r = 0; r < B; r++) bad += first[r] != want;
    CHECKF(bad == 0, "%s: %lld greedy rows differ from the arg-max %d", what, (long long)bad, want);
  } else {
    double bound, df;
    int64_t outside;
    const double x2 = chi_square(counts, probs, V, B * rounds, &bound, &outside, &df);
    printf("%s: chi-square %.1f over %.0f degrees of freedom (bound %.1f)\n", what, x2, df, bound);
    CHECKF(outside == 0, "%s: %lld draws of tokens the CPU sampler filters out", what,
           (long long)outside);
    CHECKF(x2 <= bound, "%s: chi-square %.1f over the bound %.1f", what, x2, bound);
    if (power_check && !gpu_test_quick) {
      /* The same bound must reject the distribution of a 15% higher temperature (a quick
       * run draws too few tokens to tell them apart). */
      ina_gpu_sampling_row_t warmer = params[0];
      warmer.temperature *= 1.15f;
      CHECK(cpu_probs(x, V, &warmer, probs));
      const double wrong = chi_square(counts, probs, V, B * rounds, &bound, &outside, &df);
      printf("%s: chi-square %.1f against temperature x1.15 (bound %.1f)\n", what, wrong, bound);
      CHECKF(wrong > bound, "%s: chi-square %.1f against a wrong temperature is within %.1f", what,
             wrong, bound);
    }
  }
free_dev:
  dev_buf_free(&dx);
  dev_buf_free(&dp);
  dev_buf_free(&dt);
  dev_buf_free(&dflags);
done:
  free(x);
  free(probs);
  free(bits);
  free(counts);
  free(tokens);
  free(first);
  free(params);
}

static void test_distributions(void) {
  const int64_t B = gpu_test_quick ? 1024 : 4096;
  const int rounds = gpu_test_quick ? 8 : 32;
  distribution_case(40, 1.0f, 0, 1.0f, 0, B, rounds, 11, 1);
  distribution_case(40, 0.7f, 10, 1.0f, 1, B, rounds, 12, 0);
  distribution_case(60, 1.3f, 0, 0.8f, 0, B, rounds, 13, 0);
  distribution_case(60, 0.9f, 30, 0.9f, 1, B, rounds, 14, 0);
  distribution_case(1000, 2.0f, 0, 1.0f, 0, B, rounds, 15, 1);
  distribution_case(1000, 0.0f, 0, 1.0f, 0, 64, 2, 16, 0);
}

/* One batch mixing sampled, greedy and failing rows over a large vocabulary: every
 * drawn token is one the CPU keeps, greedy rows give the arg-max, failures give -1 and
 * their flags, and only the successful rows advance. */
static void test_mixed_batch(test_rng_t *rng) {
  const int64_t B = 12, V = gpu_test_quick ? 32000 : DEEPSEEK_VOCAB;
  const char *what = "mixed batch";
  float *x = malloc((size_t)(B * V) * 4), *probs = malloc((size_t)V * 4);
  int32_t tokens[12];
  ina_gpu_sampling_row_t params[12], after[12];
  CHECK(x && probs);
  if (!(x && probs)) goto done;
  for (int64_t r = 0; r < B; r++) {
    make_logits(x + r * V, V, LOGITS_NORMAL, 3.0f, rng);
    params[r] = random_params(V, rng);
    if (params[r].temperature == 0.0f) params[r].temperature = 0.5f;
  }
  params[1].temperature = 0.0f;                             /* greedy */
  params[2].top_p = 0.0f;                                   /* invalid params */
  params[3].temperature = -1.0f;                            /* invalid params */
  x[4 * V + 17] = NAN;                                      /* NaN logit, sampled */
  x[5 * V + 3] = INFINITY;                                  /* +inf logit, sampled */
  for (int64_t i = 0; i < V; i++) x[6 * V + i] = -INFINITY; /* nothing to draw */
  params[7].temperature = 0.0f;                             /* greedy with NaN: still fine */
  x[7 * V + 5] = NAN;
  dev_buf_t dx = dev_buf_from(x, (size_t)(B * V) * 4, 0);
  dev_buf_t dp = dev_buf_from(params, sizeof params, 0);
  dev_buf_t dt = dev_buf_make(sizeof tokens, 0xFF);
  uint32_t zero = 0, flags = 0;
  dev_buf_t dflags = dev_buf_from(&zero, 4, 0);
  if (!dx.p || !dp.p || !dt.p || !dflags.p) goto free_dev;
  CHECK_OK(ina_gpu_sample(dx.p, INA_DTYPE_F32, B, V, 0, dp.p, 1, dt.p, dflags.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&dt, tokens, what);
  dev_buf_read(&dp, after, what);
  dev_buf_read(&dflags, &flags, what);
  CHECKF(flags == (INA_GPU_OPS_FLAG_LOGITS | INA_GPU_OPS_FLAG_SAMPLING_PARAMS),
         "%s: error flags 0x%x", what, flags);
  for (int64_t r = 0; r < B; r++) {
    const int fails = r >= 2 && r <= 6;
    CHECKF(after[r].step == (fails ? 0u : 1u), "%s: row %lld step %llu", what, (long long)r,
           (unsigned long long)after[r].step);
    if (fails) {
      CHECKF(tokens[r] == -1, "%s: failing row %lld gave %d", what, (long long)r, tokens[r]);
      continue;
    }
    if (params[r].temperature == 0.0f) {
      CHECKF(tokens[r] == ina_argmax_f32(x + r * V, (int32_t)V), "%s: greedy row %lld", what,
             (long long)r);
      continue;
    }
    CHECK(cpu_probs(x + r * V, V, &params[r], probs));
    CHECKF(tokens[r] >= 0 && tokens[r] < V && probs[tokens[r]] > 0.0f,
           "%s: row %lld drew %d, which the CPU filters out", what, (long long)r, tokens[r]);
  }
free_dev:
  dev_buf_free(&dx);
  dev_buf_free(&dp);
  dev_buf_free(&dt);
  dev_buf_free(&dflags);
done:
  free(x);
  free(probs);
}

#if INA_HAVE_CUDA
/* ina_gpu_sample captured once with advance_step, replayed: each replay draws the next
 * step's tokens, the same as direct calls at those steps. */
static void test_graph(test_rng_t *rng) {
  const int64_t B = 16, V = 5000;
  const int replays = 3;
  const char *what = "graph";
  float *x = malloc((size_t)(B * V) * 4);
  int32_t direct[3][16], replayed[3][16];
  ina_gpu_sampling_row_t params[16];
  cudaStream_t stream = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  CHECK(x != NULL);
  if (!x) return;
  make_logits(x, B * V, LOGITS_NORMAL, 2.0f, rng);
  for (int64_t r = 0; r < B; r++)
    params[r] = row_params(0.8f, r % 3 ? 40 : 0, r % 2 ? 0.9f : 1.0f, 100 + (uint64_t)r, 0);
  params[5].temperature = 0.0f;
  dev_buf_t dx = dev_buf_from(x, (size_t)(B * V) * 4, 0);
  dev_buf_t dp = dev_buf_from(params, sizeof params, 0);
  dev_buf_t dt = dev_buf_make((size_t)B * 4, 0xFF);
  if (!dx.p || !dp.p || !dt.p) goto free_dev;
  for (int s = 0; s < replays; s++) {
    CHECK_OK(ina_gpu_sample(dx.p, INA_DTYPE_F32, B, V, 0, dp.p, 1, dt.p, NULL, NULL));
    CHECK_OK(ina_cuda_synchronize());
    dev_buf_read(&dt, direct[s], what);
  }
  CHECK_OK(ina_cuda_memcpy_h2d(dp.p, params, sizeof params));
  CHECK_OK(ina_cuda_synchronize());
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK_OK(ina_gpu_sample(dx.p, INA_DTYPE_F32, B, V, 0, dp.p, 1, dt.p, NULL, stream));
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  CHECK(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  for (int s = 0; s < replays && exec; s++) {
    CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    dev_buf_read(&dt, replayed[s], what);
    CHECKF(memcmp(direct[s], replayed[s], sizeof direct[s]) == 0,
           "%s: replay %d drew other tokens than the direct call at step %d", what, s, s);
  }
  int moved = 0;
  for (int s = 1; s < replays; s++) moved |= memcmp(direct[s], direct[0], sizeof direct[0]) != 0;
  CHECKF(moved, "%s: consecutive steps drew identical tokens in all %lld rows", what, (long long)B);
free_dev:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (stream) cudaStreamDestroy(stream);
  dev_buf_free(&dx);
  dev_buf_free(&dp);
  dev_buf_free(&dt);
  free(x);
}
#endif

static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 4096, &d));
  if (!d) return;
  float *x = d;
  int32_t *out = (int32_t *)((char *)d + 2048);
  ina_gpu_sampling_row_t *p = (ina_gpu_sampling_row_t *)((char *)d + 3072);
  ina_log_set_quiet_errors(1);
  CHECK(ina_gpu_argmax(x, INA_DTYPE_F16, 1, 8, 0, out, NULL) == INA_ERR_UNSUPPORTED);
  CHECK(ina_gpu_argmax(x, INA_DTYPE_F32, 1, 0, 0, out, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_argmax(x, INA_DTYPE_F32, 2, 8, 4, out, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_sample(x, INA_DTYPE_F32, 1, 8, 0, NULL, 0, out, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_sample(x, INA_DTYPE_F32, 1, (int64_t)1 << 25, 0, p, 0, out, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_sampling_probs(x, INA_DTYPE_F32, 1, 8, 0, p, NULL, NULL, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_gpu_sample(NULL, INA_DTYPE_F32, 0, 8, 0, NULL, 0, NULL, NULL, NULL));
  ina_cuda_free(d);
}

int main(int argc, char **argv) {
  test_rng_t rng;
  const int skip = gpu_test_start("test_gpu_sampling", argc, argv, &rng);
  if (skip) return skip;
  test_arguments();
  argmax_case(1, 1, 0, 0, &rng);
  argmax_case(12, 2, 1, 0, &rng);
  argmax_case(12, 31, 0, 5, &rng);
  argmax_case(36, 1000, 1, 0, &rng);
  argmax_case(gpu_test_quick ? 6 : 64, DEEPSEEK_VOCAB, 0, 0, &rng);
  argmax_case(gpu_test_quick ? 6 : 24, DEEPSEEK_VOCAB, 1, 3, &rng);
  for (int i = 0; i < (gpu_test_quick ? 3 : 12); i++)
    argmax_case(test_rng_int(&rng, 1, 40), test_rng_int(&rng, 1, 70000),
                (int)test_rng_int(&rng, 0, 1), test_rng_int(&rng, 0, 3), &rng);
  test_probs(&rng);
  test_distributions();
  test_mixed_batch(&rng);
#if INA_HAVE_CUDA
  test_graph(&rng);
#endif
  return test_finish("test_gpu_sampling");
}
