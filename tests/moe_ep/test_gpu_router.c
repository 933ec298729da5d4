/* ina_gpu_router against ina_router_ref (moe_ep/router.h) for the three routing methods
 * on DeepSeek V3 / V2 / V2-Lite configurations, odd shapes and random configs.
 *
 * Logits are built so that no two choice scores (and no two group scores) are near a
 * tie: a token's choice scores are a random permutation of a grid with jitter, at least
 * 0.6 grid steps apart, and a token is redrawn until its group scores are 1e-5 apart.
 * Then the ids must equal the reference's in order, and the weights agree within 1e-6
 * relative (the device's expf differs from libm's by a few ulp). Exact ties (all-equal
 * logits) must resolve identically (the lower index first); NaN logits must still give
 * valid, distinct ids. Outputs are poisoned before each run.
 * Skipped (exit 77) without a CUDA device. */
#include "tests/gpu_ops/gpu_ops_test.h"

#include "moe_ep/moe_gpu.h"
#include "moe_ep/router.h"

#define GAP_GROUP 1e-5

typedef struct {
  ina_router_config_t cfg;
  int64_t tokens;
  double bias_center; /* noaux: correction bias in bias_center +- 0.1 */
  int special;        /* 0 random with gaps, 1 all-equal logits, 2 some NaN */
} case_t;

static void permutation(int32_t *p, int32_t n, test_rng_t *rng) {
  for (int32_t i = 0; i < n; i++) p[i] = i;
  for (int32_t i = n - 1; i > 0; i--) {
    const int32_t j = (int32_t)test_rng_int(rng, 0, i);
    const int32_t t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
}

/* Group scores of a token's target values (choice scores for noaux, logits for the
 * softmax methods: softmax keeps their order) are pairwise GAP_GROUP apart. */
static int groups_separated(const ina_router_config_t *c, const double *v) {
  if (c->method == INA_ROUTER_SOFTMAX_GREEDY) return 1;
  const int32_t gs = c->num_experts / c->n_group;
  double score[64];
  for (int32_t g = 0; g < c->n_group; g++) {
    double first = -INFINITY, second = -INFINITY;
    for (int32_t e = 0; e < gs; e++) {
      const double x = v[g * gs + e];
      if (x > first) {
        second = first;
        first = x;
      } else if (x > second) {
        second = x;
      }
    }
    score[g] = c->method == INA_ROUTER_SIGMOID_NOAUX_TC ? first + second : first;
  }
  for (int32_t a = 0; a < c->n_group; a++)
    for (int32_t b = a + 1; b < c->n_group; b++)
      if (fabs(score[a] - score[b]) < GAP_GROUP) return 0;
  return 1;
}

/* One token's logits with well separated choice and group scores. */
static void make_token(const case_t *k, const float *bias, float *logits, test_rng_t *rng) {
  const ina_router_config_t *c = &k->cfg;
  const int32_t E = c->num_experts;
  int32_t perm[256];
  double target[256];
  const int noaux = c->method == INA_ROUTER_SIGMOID_NOAUX_TC;
  /* noaux: choice = sigmoid(logit) + bias must stay reachable for every bias of the
   * case, sigmoid in [0.02, 0.98]; the grid is aligned to 0 so that the 0.0 fill of
   * masked experts never nears a kept score. Softmax methods: a grid of logits. */
  const double lo_c = k->bias_center + 0.1 + 0.02, hi_c = k->bias_center - 0.1 + 0.98;
  const double step = noaux ? (hi_c - lo_c) / (E + 1) : 0.05;
  const double lo = noaux ? ceil(lo_c / step) * step : -0.025 * E;
  do {
    permutation(perm, E, rng);
    for (int32_t e = 0; e < E; e++)
      target[e] = lo + ((double)perm[e] + 0.5 + 0.4 * (test_rng_uniform(rng) - 0.5)) * step;
  } while (!groups_separated(c, target));
  for (int32_t e = 0; e < E; e++) {
    if (noaux) {
      const double s = target[e] - bias[e];
      logits[e] = (float)log(s / (1.0 - s));
    } else {
      logits[e] = (float)target[e];
    }
  }
}

static void run_case(const case_t *k, test_rng_t *rng) {
  const ina_router_config_t *c = &k->cfg;
  const int32_t E = c->num_experts, K = c->top_k;
  const int64_t T = k->tokens;
  const int noaux = c->method == INA_ROUTER_SIGMOID_NOAUX_TC;
  char what[200];
  snprintf(what, sizeof what, "router method %d E %d k %d groups %d/%d norm %d scale %g%s T %lld%s",
           (int)c->method, E, K, c->n_group, c->topk_group, c->norm_topk_prob,
           (double)c->routed_scaling_factor, c->noaux_mask_zero ? " mask0" : "", (long long)T,
           k->special == 1   ? " all-equal"
           : k->special == 2 ? " NaN"
                             : "");
  float *logits = malloc((size_t)(T * E) * 4), *bias = malloc((size_t)E * 4);
  int32_t *ids = malloc((size_t)(T * K) * 4), *ids_ref = malloc((size_t)(T * K) * 4);
  float *w = malloc((size_t)(T * K) * 4), *w_ref = malloc((size_t)(T * K) * 4);
  CHECK(logits && bias && ids && ids_ref && w && w_ref);
  if (!(logits && bias && ids && ids_ref && w && w_ref)) goto done;
  for (int32_t e = 0; e < E; e++)
    bias[e] =
        k->special == 1 ? 0.0f : (float)(k->bias_center + 0.2 * (test_rng_uniform(rng) - 0.5));
  for (int64_t t = 0; t < T; t++) {
    if (k->special == 1) {
      for (int32_t e = 0; e < E; e++) logits[t * E + e] = 0.0f;
    } else {
      make_token(k, bias, logits + t * E, rng);
      if (k->special == 2)
        for (int32_t e = 0; e < E; e++)
          if (test_rng_int(rng, 0, 3) == 0) logits[t * E + e] = NAN;
    }
  }
  if (k->special != 2) CHECK_OK(ina_router_ref(c, logits, noaux ? bias : NULL, T, ids_ref, w_ref));

  dev_buf_t dl = dev_buf_from(logits, (size_t)(T * E) * 4, 0);
  dev_buf_t db = dev_buf_from(bias, (size_t)E * 4, 0);
  dev_buf_t di = dev_buf_make((size_t)(T * K) * 4, 0xFF);
  dev_buf_t dw = dev_buf_make((size_t)(T * K) * 4, 0xFF);
  if (!dl.p || !db.p || !di.p || !dw.p) goto free_dev;
  CHECK_OK(ina_gpu_router(c, dl.p, noaux ? db.p : NULL, T, di.p, dw.p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  dev_buf_read(&di, ids, what);
  dev_buf_read(&dw, w, what);

  int64_t bad_ids = 0, bad_w = 0;
  for (int64_t t = 0; t < T; t++) {
    if (k->special == 2) { /* valid and distinct is all that is specified */
      for (int32_t j = 0; j < K; j++) {
        const int32_t id = ids[t * K + j];
        int ok = id >= 0 && id < E;
        for (int32_t i = 0; i < j; i++) ok &= ids[t * K + i] != id;
        bad_ids += !ok;
      }
      continue;
    }
    for (int32_t j = 0; j < K; j++) {
      const int64_t at = t * K + j;
      if (ids[at] != ids_ref[at] && bad_ids++ < 5)
        fprintf(stderr, "%s: token %lld slot %d: id %d, reference %d\n", what, (long long)t, j,
                ids[at], ids_ref[at]);
      const double d = fabs((double)w[at] - (double)w_ref[at]);
      if (!(d <= 1e-6 * fabs((double)w_ref[at]) + 1e-30) && bad_w++ < 5)
        fprintf(stderr, "%s: token %lld slot %d: weight %.9g, reference %.9g\n", what, (long long)t,
                j, w[at], w_ref[at]);
    }
  }
  CHECKF(bad_ids == 0, "%s: %lld ids differ (or are invalid)", what, (long long)bad_ids);
  if (k->special != 2) {
    CHECKF(bad_w == 0, "%s: %lld weights outside 1e-6 relative", what, (long long)bad_w);
    const double err = test_rel_l2(w, w_ref, (size_t)(T * K));
    CHECKF(err <= 1e-6, "%s: weights relative L2 error %.3g", what, err);
  }
free_dev:
  dev_buf_free(&dl);
  dev_buf_free(&db);
  dev_buf_free(&di);
  dev_buf_free(&dw);
done:
  free(logits);
  free(bias);
  free(ids);
  free(ids_ref);
  free(w);
  free(w_ref);
}

static ina_router_config_t config(ina_router_method_t m, int32_t E, int32_t k, int32_t groups,
                                  int32_t keep, int norm, float scale, int mask_zero) {
  ina_router_config_t c = INA_ROUTER_CONFIG_INIT;
  c.method = m;
  c.num_experts = E;
  c.top_k = k;
  c.n_group = groups;
  c.topk_group = keep;
  c.norm_topk_prob = norm;
  c.routed_scaling_factor = scale;
  c.noaux_mask_zero = mask_zero;
  return c;
}

/* A random valid config within the kernel's limits. */
static ina_router_config_t random_config(test_rng_t *rng) {
  const ina_router_method_t m = (ina_router_method_t)test_rng_int(rng, 0, 2);
  int32_t groups = 1, E;
  if (m == INA_ROUTER_SOFTMAX_GREEDY) {
    E = (int32_t)test_rng_int(rng, 1, 256);
  } else {
    groups = (int32_t)test_rng_int(rng, 1, 32);
    const int32_t min_size = m == INA_ROUTER_SIGMOID_NOAUX_TC ? 2 : 1;
    E = groups *
        (int32_t)test_rng_int(rng, min_size, 256 / groups < min_size ? min_size : 256 / groups);
    if (E > 256) {
      groups = 1;
      E = (int32_t)test_rng_int(rng, min_size, 256);
    }
  }
  const int32_t keep = (int32_t)test_rng_int(rng, 1, groups);
  const int32_t available = m == INA_ROUTER_SOFTMAX_GREEDY ? E : keep * (E / groups);
  const int32_t k = (int32_t)test_rng_int(rng, 1, available < 32 ? available : 32);
  return config(m, E, k, groups, keep, (int)test_rng_int(rng, 0, 1),
                (float)(0.5 + 3.0 * test_rng_uniform(rng)), (int)test_rng_int(rng, 0, 1));
}

static void test_arguments(void) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(0, 1 << 16, &d));
  if (!d) return;
  float *l = d, *b = (float *)d + 4096, *w = (float *)d + 8192;
  int32_t *ids = (int32_t *)d + 12288;
  ina_router_config_t c = config(INA_ROUTER_SIGMOID_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f, 0);
  ina_log_set_quiet_errors(1);
  CHECK(ina_gpu_router(&c, l, NULL, 4, ids, w, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_router_config_t big = config(INA_ROUTER_SOFTMAX_GREEDY, 512, 8, 1, 1, 0, 1.0f, 0);
  CHECK(ina_gpu_router(&big, l, NULL, 4, ids, w, NULL) == INA_ERR_UNSUPPORTED);
  ina_router_config_t bad = c;
  bad.top_k = 0;
  CHECK(ina_gpu_router(&bad, l, b, 4, ids, w, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_router_config_t v2 = config(INA_ROUTER_SOFTMAX_GREEDY, 64, 6, 1, 1, 0, 1.0f, 0);
  CHECK(ina_gpu_router(&v2, l, b, 4, ids, w, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gpu_router(&c, NULL, b, 4, ids, w, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_gpu_router(&c, NULL, b, 0, NULL, NULL, NULL));
  ina_cuda_free(d);
}

int main(int argc, char **argv) {
  test_rng_t rng;
  const int skip = gpu_test_start("test_gpu_router", argc, argv, &rng);
  if (skip) return skip;
  test_arguments();
  const int64_t T = gpu_test_quick ? 97 : 1500;
  const case_t fixed[] = {
      /* DeepSeek-V3: 256 experts, 8 groups keep 4, top 8, normalized, x2.5 */
      {config(INA_ROUTER_SIGMOID_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f, 0), T, 0.0, 0},
      {config(INA_ROUTER_SIGMOID_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f, 1), T, -0.6, 0},
      {config(INA_ROUTER_SIGMOID_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f, 0), 5, 0.0, 1},
      {config(INA_ROUTER_SIGMOID_NOAUX_TC, 256, 8, 8, 4, 1, 2.5f, 0), 64, 0.0, 2},
      {config(INA_ROUTER_SIGMOID_NOAUX_TC, 64, 6, 4, 2, 0, 1.0f, 0), T, 0.1, 0},
      {config(INA_ROUTER_SIGMOID_NOAUX_TC, 2, 1, 1, 1, 1, 1.0f, 0), 33, 0.0, 0},
      {config(INA_ROUTER_SIGMOID_NOAUX_TC, 256, 32, 8, 8, 1, 1.5f, 0), 200, 0.0, 0},
      {config(INA_ROUTER_SIGMOID_NOAUX_TC, 96, 8, 32, 4, 1, 1.0f, 1), 300, -0.5, 0},
      /* DeepSeek-V2: 160 experts, 8 groups keep 3, top 6, x16 */
      {config(INA_ROUTER_SOFTMAX_GROUP_GREEDY, 160, 6, 8, 3, 0, 16.0f, 0), T, 0.0, 0},
      {config(INA_ROUTER_SOFTMAX_GROUP_GREEDY, 160, 6, 8, 3, 0, 16.0f, 0), 5, 0.0, 1},
      {config(INA_ROUTER_SOFTMAX_GROUP_GREEDY, 20, 4, 5, 2, 0, 1.0f, 0), 300, 0.0, 0},
      /* DeepSeek-V2-Lite: 64 experts, top 6, greedy */
      {config(INA_ROUTER_SOFTMAX_GREEDY, 64, 6, 1, 1, 0, 1.0f, 0), T, 0.0, 0},
      {config(INA_ROUTER_SOFTMAX_GREEDY, 64, 6, 1, 1, 0, 1.0f, 0), 5, 0.0, 1},
      {config(INA_ROUTER_SOFTMAX_GREEDY, 7, 3, 1, 1, 1, 0.5f, 0), 300, 0.0, 0},
      {config(INA_ROUTER_SOFTMAX_GREEDY, 1, 1, 1, 1, 0, 1.0f, 0), 9, 0.0, 0},
      {config(INA_ROUTER_SOFTMAX_GREEDY, 256, 8, 1, 1, 0, 1.0f, 0), 64, 0.0, 2},
  };
  for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) run_case(&fixed[i], &rng);
  const int random_cases = gpu_test_quick ? 6 : 40;
  for (int i = 0; i < random_cases; i++) {
    case_t c = {random_config(&rng), test_rng_int(&rng, 1, gpu_test_quick ? 50 : 400),
                test_rng_int(&rng, 0, 1) ? 0.0 : -0.6, 0};
    run_case(&c, &rng);
  }
  return test_finish("test_gpu_router");
}
