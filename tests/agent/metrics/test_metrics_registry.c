/* The metrics registry on one thread: the exact exposition of a fixed registry, histogram
 * bucket edges against a brute-force count on random values, label and help escaping of
 * random strings, rejected names and mismatched registrations, and the bucket presets. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/metrics/metrics.h"
#include "agent/metrics/metrics_buckets.h"
#include "core/log.h"
#include "tests/test_util.h"

static char *render(ina_metrics_t *reg) {
  char *text = NULL;
  size_t len = 0;
  CHECK_OK(ina_metrics_render(reg, &text, &len));
  CHECK(text != NULL && strlen(text) == len);
  return text;
}

/* ---- a fixed registry and its exact rendering ---- */

static const char golden[] =
    "# HELP ina_requests_total Requests received.\n"
    "# TYPE ina_requests_total counter\n"
    "ina_requests_total 3\n"
    "# HELP ina_expert_tokens_total Tokens routed to each expert.\n"
    "# TYPE ina_expert_tokens_total counter\n"
    "ina_expert_tokens_total{layer=\"3\",expert=\"17\"} 42\n"
    "ina_expert_tokens_total{layer=\"3\",expert=\"18\"} 0\n"
    "ina_expert_tokens_total{layer=\"4\",expert=\"17\"} 9007199254740993\n"
    "# HELP ina_busy_seconds_total Seconds spent busy.\n"
    "# TYPE ina_busy_seconds_total counter\n"
    "ina_busy_seconds_total 0.30000000000000004\n"
    "# HELP ina_queue_depth Requests waiting; C:\\\\queue\\nsecond \"line\".\n"
    "# TYPE ina_queue_depth gauge\n"
    "ina_queue_depth -5\n"
    "# HELP ina_kv_free_ratio Fraction of KV pages free.\n"
    "# TYPE ina_kv_free_ratio gauge\n"
    "ina_kv_free_ratio{pool=\"a\\\"b\\\\c\\nd\"} 0.1\n"
    "ina_kv_free_ratio{pool=\"tiny\"} 1e-06\n"
    "ina_kv_free_ratio{pool=\"inf\"} +Inf\n"
    "# HELP ina_step_seconds Step time.\n"
    "# TYPE ina_step_seconds histogram\n"
    "ina_step_seconds_bucket{phase=\"decode\",le=\"0.25\"} 1\n"
    "ina_step_seconds_bucket{phase=\"decode\",le=\"0.5\"} 2\n"
    "ina_step_seconds_bucket{phase=\"decode\",le=\"1\"} 3\n"
    "ina_step_seconds_bucket{phase=\"decode\",le=\"+Inf\"} 4\n"
    "ina_step_seconds_sum{phase=\"decode\"} 3.625\n"
    "ina_step_seconds_count{phase=\"decode\"} 4\n"
    "ina_step_seconds_bucket{phase=\"prefill\",le=\"0.25\"} 0\n"
    "ina_step_seconds_bucket{phase=\"prefill\",le=\"0.5\"} 0\n"
    "ina_step_seconds_bucket{phase=\"prefill\",le=\"1\"} 0\n"
    "ina_step_seconds_bucket{phase=\"prefill\",le=\"+Inf\"} 0\n"
    "ina_step_seconds_sum{phase=\"prefill\"} 0\n"
    "ina_step_seconds_count{phase=\"prefill\"} 0\n"
    "# HELP ina_wait_seconds Unlabelled histogram with only +Inf.\n"
    "# TYPE ina_wait_seconds histogram\n"
    "ina_wait_seconds_bucket{le=\"+Inf\"} 2\n"
    "ina_wait_seconds_sum -1.5\n"
    "ina_wait_seconds_count 2\n";

static void test_golden(void) {
  ina_metrics_t *reg = NULL;
  CHECK_OK(ina_metrics_create(&reg));
  if (!reg) return;
  char *empty = render(reg);
  CHECK(empty && strcmp(empty, "") == 0);
  free(empty);

  ina_counter_t *requests = NULL, *e17 = NULL, *e18 = NULL, *l4 = NULL;
  CHECK_OK(ina_metrics_register_counter(reg, "ina_requests_total", "Requests received.", NULL,
                                        0, &requests));
  const char *help_tokens = "Tokens routed to each expert.";
  ina_metric_label_t lab17[] = {{"layer", "3"}, {"expert", "17"}};
  ina_metric_label_t lab18[] = {{"layer", "3"}, {"expert", "18"}};
  ina_metric_label_t lab4[] = {{"layer", "4"}, {"expert", "17"}};
  CHECK_OK(ina_metrics_register_counter(reg, "ina_expert_tokens_total", help_tokens, lab17, 2,
                                        &e17));
  ina_counter_f64_t *busy = NULL;
  CHECK_OK(ina_metrics_register_counter_f64(reg, "ina_busy_seconds_total", "Seconds spent busy.",
                                            NULL, 0, &busy));
  /* Registered after another family: still renders inside its own family. */
  CHECK_OK(ina_metrics_register_counter(reg, "ina_expert_tokens_total", help_tokens, lab18, 2,
                                        &e18));
  CHECK_OK(ina_metrics_register_counter(reg, "ina_expert_tokens_total", help_tokens, lab4, 2,
                                        &l4));
  ina_gauge_t *depth = NULL;
  CHECK_OK(ina_metrics_register_gauge(reg, "ina_queue_depth",
                                      "Requests waiting; C:\\queue\nsecond \"line\".", NULL, 0,
                                      &depth));
  ina_gauge_f64_t *ratio = NULL, *tiny = NULL, *inf = NULL;
  const char *help_ratio = "Fraction of KV pages free.";
  ina_metric_label_t lab_weird[] = {{"pool", "a\"b\\c\nd"}};
  ina_metric_label_t lab_tiny[] = {{"pool", "tiny"}};
  ina_metric_label_t lab_inf[] = {{"pool", "inf"}};
  CHECK_OK(ina_metrics_register_gauge_f64(reg, "ina_kv_free_ratio", help_ratio, lab_weird, 1,
                                          &ratio));
  CHECK_OK(ina_metrics_register_gauge_f64(reg, "ina_kv_free_ratio", help_ratio, lab_tiny, 1,
                                          &tiny));
  CHECK_OK(ina_metrics_register_gauge_f64(reg, "ina_kv_free_ratio", help_ratio, lab_inf, 1,
                                          &inf));
  const double bounds[] = {0.25, 0.5, 1.0};
  ina_metric_label_t decode[] = {{"phase", "decode"}};
  ina_metric_label_t prefill[] = {{"phase", "prefill"}};
  ina_histogram_t *h_decode = NULL, *h_prefill = NULL, *wait = NULL;
  CHECK_OK(ina_metrics_register_histogram(reg, "ina_step_seconds", "Step time.", decode, 1,
                                          bounds, 3, &h_decode));
  CHECK_OK(ina_metrics_register_histogram(reg, "ina_step_seconds", "Step time.", prefill, 1,
                                          bounds, 3, &h_prefill));
  CHECK_OK(ina_metrics_register_histogram(reg, "ina_wait_seconds",
                                          "Unlabelled histogram with only +Inf.", NULL, 0, NULL, 0,
                                          &wait));
  if (!requests || !e17 || !e18 || !l4 || !busy || !depth || !ratio || !tiny || !inf ||
      !h_decode || !h_prefill || !wait) {
    ina_metrics_destroy(reg);
    return;
  }

  ina_counter_inc(requests);
  ina_counter_add(requests, 2);
  ina_counter_add(e17, 40);
  ina_counter_inc(e17);
  ina_counter_inc(e17);
  ina_counter_add(l4, 9007199254740993ll); /* 2^53 + 1: int64 stays exact */
  ina_counter_f64_add(busy, 0.1);
  ina_counter_f64_add(busy, 0.2); /* shortest round-trip text of 0.1 + 0.2 */
  ina_log_set_quiet_errors(1);
  ina_counter_add(requests, -7);   /* dropped: counters never decrease */
  ina_counter_f64_add(busy, -1.0); /* dropped */
  ina_counter_f64_add(busy, NAN);  /* dropped */
  ina_log_set_quiet_errors(0);
  ina_gauge_set(depth, 10);
  ina_gauge_add(depth, -15);
  ina_gauge_f64_set(ratio, 0.75);
  ina_gauge_f64_add(ratio, -0.65);
  ina_gauge_f64_set(ratio, 0.1);
  ina_gauge_f64_set(tiny, 1e-6);
  ina_gauge_f64_set(inf, INFINITY);
  ina_histogram_observe(h_decode, 0.25); /* equal to a bound: that bucket */
  ina_histogram_observe(h_decode, 0.375);
  ina_histogram_observe(h_decode, 1.0);
  ina_histogram_observe(h_decode, 2.0); /* above every bound: +Inf */
  ina_histogram_observe(wait, -4.0);
  ina_histogram_observe(wait, 2.5);

  CHECK(ina_counter_value(requests) == 3);
  CHECK(ina_counter_value(e18) == 0);
  CHECK(ina_counter_f64_value(busy) == 0.1 + 0.2);
  CHECK(ina_gauge_value(depth) == -5);
  CHECK(ina_gauge_f64_value(ratio) == 0.1);
  CHECK(ina_histogram_bucket_count(h_decode, 0) == 1);
  CHECK(ina_histogram_bucket_count(h_decode, 2) == 3);
  CHECK(ina_histogram_bucket_count(h_decode, 3) == 4);
  CHECK(ina_histogram_bucket_count(h_decode, 4) == 0);
  CHECK(ina_histogram_sum(h_decode) == 3.625);

  char *text = render(reg);
  CHECK(text && strcmp(text, golden) == 0);
  if (text && strcmp(text, golden) != 0) {
    fprintf(stderr, "---- rendered ----\n%s---- expected ----\n%s----\n", text, golden);
  }
  free(text);
  ina_metrics_destroy(reg);
}

/* ---- histogram bucket edges ---- */

static void test_bucket_edges(test_rng_t *rng) {
  for (int round = 0; round < 20; round++) {
    ina_metrics_t *reg = NULL;
    CHECK_OK(ina_metrics_create(&reg));
    if (!reg) return;
    size_t n_bounds = (size_t)test_rng_int(rng, 1, 12);
    double bounds[12];
    double b = test_rng_normal(rng);
    for (size_t i = 0; i < n_bounds; i++) {
      bounds[i] = b;
      b += 0.01 + test_rng_uniform(rng);
    }
    ina_histogram_t *h = NULL;
    CHECK_OK(ina_metrics_register_histogram(reg, "h", "edges", NULL, 0, bounds, n_bounds, &h));
    if (!h) {
      ina_metrics_destroy(reg);
      return;
    }
    size_t expected[13] = {0}; /* per bucket, not cumulative */
    double sum = 0;
    int n_obs = (int)test_rng_int(rng, 50, 300);
    for (int k = 0; k < n_obs; k++) {
      double v;
      switch (test_rng_int(rng, 0, 4)) {
        case 0: v = bounds[test_rng_int(rng, 0, (int64_t)n_bounds - 1)]; break; /* exact */
        case 1: v = nextafter(bounds[test_rng_int(rng, 0, (int64_t)n_bounds - 1)], INFINITY); break;
        case 2: v = nextafter(bounds[test_rng_int(rng, 0, (int64_t)n_bounds - 1)], -INFINITY); break;
        default: v = bounds[0] - 1.0 + (b - bounds[0] + 2.0) * test_rng_uniform(rng); break;
      }
      size_t bucket = n_bounds;
      for (size_t i = 0; i < n_bounds; i++) {
        if (v <= bounds[i]) {
          bucket = i;
          break;
        }
      }
      expected[bucket]++;
      sum += v;
      ina_histogram_observe(h, v);
    }
    size_t cumulative = 0;
    for (size_t i = 0; i <= n_bounds; i++) {
      cumulative += expected[i];
      CHECKF(ina_histogram_bucket_count(h, i) == cumulative, "round %d bucket %zu: %llu vs %zu",
             round, i, (unsigned long long)ina_histogram_bucket_count(h, i), cumulative);
    }
    CHECK(cumulative == (size_t)n_obs);
    CHECK(fabs(ina_histogram_sum(h) - sum) <= 1e-9 * (1.0 + fabs(sum)));
    ina_metrics_destroy(reg);
  }

  /* Fixed edges: the largest double, -Inf, +Inf and NaN. */
  ina_metrics_t *reg = NULL;
  CHECK_OK(ina_metrics_create(&reg));
  if (!reg) return;
  const double bounds[] = {-1.0, 0.0, 1.0};
  ina_histogram_t *h = NULL;
  CHECK_OK(ina_metrics_register_histogram(reg, "edge", "fixed edges", NULL, 0, bounds, 3, &h));
  if (h) {
    ina_histogram_observe(h, -INFINITY); /* bucket le=-1 */
    ina_histogram_observe(h, -0.0);      /* -0 == 0: bucket le=0 */
    ina_histogram_observe(h, DBL_MAX);   /* +Inf bucket */
    CHECK(ina_histogram_bucket_count(h, 0) == 1);
    CHECK(ina_histogram_bucket_count(h, 1) == 2);
    CHECK(ina_histogram_bucket_count(h, 2) == 2);
    CHECK(ina_histogram_bucket_count(h, 3) == 3);
    ina_histogram_observe(h, INFINITY);
    ina_histogram_observe(h, NAN); /* +Inf bucket; the sum becomes NaN */
    CHECK(ina_histogram_bucket_count(h, 2) == 2);
    CHECK(ina_histogram_bucket_count(h, 3) == 5);
    CHECK(isnan(ina_histogram_sum(h)));
    char *text = render(reg);
    CHECK(text && strstr(text, "edge_bucket{le=\"-1\"} 1\n"));
    CHECK(text && strstr(text, "edge_bucket{le=\"0\"} 2\n"));
    CHECK(text && strstr(text, "edge_bucket{le=\"+Inf\"} 5\n"));
    CHECK(text && strstr(text, "edge_sum NaN\n"));
    CHECK(text && strstr(text, "edge_count 5\n"));
    free(text);
  }
  ina_metrics_destroy(reg);
}

/* ---- escaping ---- */

/* The rule written out independently: \ -> \\, newline -> \n, and " -> \" in values. */
static void escape_ref(const char *s, int quote, char *out) {
  for (; *s; s++) {
    if (*s == '\\') { *out++ = '\\'; *out++ = '\\'; }
    else if (*s == '\n') { *out++ = '\\'; *out++ = 'n'; }
    else if (*s == '"' && quote) { *out++ = '\\'; *out++ = '"'; }
    else *out++ = *s;
  }
  *out = '\0';
}

static void test_escaping(test_rng_t *rng) {
  static const char alphabet[] = "ab\\\"\n \t{}=,#\xc3\xa9";
  for (int round = 0; round < 50; round++) {
    char value[41], help[41];
    size_t n = (size_t)test_rng_int(rng, 0, 40);
    for (size_t i = 0; i < n; i++) value[i] = alphabet[test_rng_int(rng, 0, sizeof alphabet - 2)];
    value[n] = '\0';
    n = (size_t)test_rng_int(rng, 0, 40);
    for (size_t i = 0; i < n; i++) help[i] = alphabet[test_rng_int(rng, 0, sizeof alphabet - 2)];
    help[n] = '\0';

    ina_metrics_t *reg = NULL;
    CHECK_OK(ina_metrics_create(&reg));
    if (!reg) return;
    ina_metric_label_t labels[] = {{"v", value}};
    ina_gauge_t *g = NULL;
    CHECK_OK(ina_metrics_register_gauge(reg, "g", help, labels, 1, &g));
    if (g) ina_gauge_set(g, round);

    char esc_value[100], esc_help[100], expected[400];
    escape_ref(value, 1, esc_value);
    escape_ref(help, 0, esc_help);
    snprintf(expected, sizeof expected, "# HELP g %s\n# TYPE g gauge\ng{v=\"%s\"} %d\n", esc_help,
             esc_value, round);
    char *text = render(reg);
    CHECKF(text && strcmp(text, expected) == 0, "got:\n%s\nexpected:\n%s", text ? text : "",
           expected);
    /* Whatever the value held, each sample stays on one line. */
    size_t lines = 0;
    for (const char *p = text ? text : ""; *p; p++) lines += *p == '\n';
    CHECK(lines == 3);
    free(text);
    ina_metrics_destroy(reg);
  }
}

/* ---- rejected registrations ---- */

static void check_rejected(ina_status_t st, void *out, const char *needle) {
  CHECKF(st == INA_ERR_INVALID_ARGUMENT, "status %d", (int)st);
  CHECK(out == NULL);
  CHECKF(strstr(ina_last_error(), needle) != NULL, "error '%s' does not mention '%s'",
         ina_last_error(), needle);
}
/* `out` is read only after `call` has set it. */
#define EXPECT_REJECTED(call, out, needle)                                               \
  do {                                                                                   \
    ina_status_t rejected_st_ = (call);                                                  \
    check_rejected(rejected_st_, (void *)(out), needle);                                 \
  } while (0)

static void test_invalid(void) {
  ina_metrics_t *reg = NULL;
  CHECK_OK(ina_metrics_create(&reg));
  if (!reg) return;
  ina_log_set_quiet_errors(1);

  static const char *bad_metric_names[] = {"", "1abc", "a-b", "a b", "a.b", "caf\xc3\xa9", "a{b",
                                           "x\n"};
  for (size_t i = 0; i < sizeof bad_metric_names / sizeof *bad_metric_names; i++) {
    ina_counter_t *c = (ina_counter_t *)&reg; /* poisoned: must come back NULL */
    ina_status_t st = ina_metrics_register_counter(reg, bad_metric_names[i], "h", NULL, 0, &c);
    EXPECT_REJECTED(st, c, "invalid metric name");
  }
  static const char *good_metric_names[] = {"a", "_a", ":a", "a:b_c9", "A1"};
  for (size_t i = 0; i < sizeof good_metric_names / sizeof *good_metric_names; i++) {
    ina_counter_t *c = NULL;
    CHECK_OK(ina_metrics_register_counter(reg, good_metric_names[i], "h", NULL, 0, &c));
    CHECK(c != NULL);
  }

  static const char *bad_label_names[] = {"", "1a", "a:b", "__reserved", "a-b", "a b"};
  for (size_t i = 0; i < sizeof bad_label_names / sizeof *bad_label_names; i++) {
    ina_metric_label_t l[] = {{bad_label_names[i], "v"}};
    ina_gauge_t *g = (ina_gauge_t *)&reg;
    EXPECT_REJECTED(ina_metrics_register_gauge(reg, "lbl", "h", l, 1, &g), g, "invalid label name");
  }
  ina_metric_label_t le[] = {{"le", "1"}};
  ina_histogram_t *h = (ina_histogram_t *)&reg;
  const double bounds[] = {1, 2};
  EXPECT_REJECTED(ina_metrics_register_histogram(reg, "hist", "h", le, 1, bounds, 2, &h), h,
                  "'le' is reserved");
  ina_gauge_t *g_le = NULL; /* "le" is an ordinary label name outside histograms */
  CHECK_OK(ina_metrics_register_gauge(reg, "with_le", "h", le, 1, &g_le));
  ina_metric_label_t twice[] = {{"a", "1"}, {"a", "2"}};
  ina_gauge_t *g = (ina_gauge_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_gauge(reg, "twice", "h", twice, 2, &g), g, "given twice");
  ina_metric_label_t null_value[] = {{"a", NULL}};
  g = (ina_gauge_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_gauge(reg, "nullv", "h", null_value, 1, &g), g,
                  "NULL value");

  /* Bucket bounds. */
  const double not_increasing[] = {1, 1};
  const double decreasing[] = {2, 1};
  const double with_nan[] = {1, NAN};
  const double with_inf[] = {1, INFINITY};
  h = (ina_histogram_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_histogram(reg, "hb", "h", NULL, 0, not_increasing, 2, &h),
                  h, "increase strictly");
  h = (ina_histogram_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_histogram(reg, "hb", "h", NULL, 0, decreasing, 2, &h), h,
                  "increase strictly");
  h = (ina_histogram_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_histogram(reg, "hb", "h", NULL, 0, with_nan, 2, &h), h,
                  "finite");
  h = (ina_histogram_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_histogram(reg, "hb", "h", NULL, 0, with_inf, 2, &h), h,
                  "finite");

  /* A family must be registered the same way each time. */
  ina_metric_label_t ab[] = {{"a", "1"}, {"b", "1"}};
  ina_metric_label_t ab2[] = {{"a", "1"}, {"b", "2"}};
  ina_metric_label_t ba[] = {{"b", "1"}, {"a", "3"}};
  ina_counter_t *fam = NULL, *c = NULL;
  CHECK_OK(ina_metrics_register_counter(reg, "fam", "help", ab, 2, &fam));
  CHECK_OK(ina_metrics_register_counter(reg, "fam", "help", ab2, 2, &c));
  c = (ina_counter_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter(reg, "fam", "help", ab, 2, &c), c,
                  "already registered");
  c = (ina_counter_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter(reg, "fam", "help", ba, 2, &c), c, "label 0");
  c = (ina_counter_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter(reg, "fam", "help", ab, 1, &c), c,
                  "with 1");
  c = (ina_counter_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter(reg, "fam", "other help", ab2, 2, &c), c,
                  "help text differs");
  g = (ina_gauge_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_gauge(reg, "fam", "help", ab2, 2, &g), g,
                  "as a counter, now as a gauge");
  ina_counter_f64_t *cf = (ina_counter_f64_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter_f64(reg, "fam", "help", ab2, 2, &cf), cf,
                  "int64 values");
  ina_histogram_t *hist = NULL;
  const double other_bounds[] = {1, 3};
  ina_metric_label_t x1[] = {{"x", "1"}};
  ina_metric_label_t x2[] = {{"x", "2"}};
  CHECK_OK(ina_metrics_register_histogram(reg, "hist", "h", x1, 1, bounds, 2, &hist));
  h = (ina_histogram_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_histogram(reg, "hist", "h", x2, 1, other_bounds, 2, &h), h,
                  "bounds differ");

  /* Histogram series names are reserved in both directions. */
  c = (ina_counter_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter(reg, "hist_count", "h", NULL, 0, &c), c,
                  "taken by the series of histogram 'hist'");
  ina_gauge_t *clash = NULL;
  CHECK_OK(ina_metrics_register_gauge(reg, "lat_sum", "h", NULL, 0, &clash));
  h = (ina_histogram_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_histogram(reg, "lat", "h", NULL, 0, bounds, 2, &h), h,
                  "collide with the existing metric 'lat_sum'");

  /* NULL arguments. */
  c = (ina_counter_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter(reg, NULL, "h", NULL, 0, &c), c, "NULL");
  c = (ina_counter_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter(reg, "nohelp", NULL, NULL, 0, &c), c, "NULL");
  c = (ina_counter_t *)&reg;
  EXPECT_REJECTED(ina_metrics_register_counter(reg, "nolabels", "h", NULL, 2, &c), c,
                  "labels is NULL");
  ina_log_set_quiet_errors(0);

  /* Rejections leave no trace in the rendering. */
  char *text = render(reg);
  CHECK(text && strstr(text, "hb") == NULL && strstr(text, "twice") == NULL &&
        strstr(text, "lbl") == NULL && strstr(text, "# TYPE lat ") == NULL);
  CHECK(text && strstr(text, "fam{a=\"1\",b=\"1\"} 0\nfam{a=\"1\",b=\"2\"} 0\n# HELP") != NULL);
  free(text);
  ina_metrics_destroy(reg);
  ina_metrics_destroy(NULL);
}

/* ---- many series: the index keeps registration linear and finds duplicates ---- */

static void test_many_series(test_rng_t *rng) {
  ina_metrics_t *reg = NULL;
  CHECK_OK(ina_metrics_create(&reg));
  if (!reg) return;
  enum { LAYERS = 61, EXPERTS = 256 };
  static ina_counter_t *tokens[LAYERS][EXPERTS];
  int ok = 1;
  for (int l = 0; l < LAYERS && ok; l++) {
    for (int e = 0; e < EXPERTS && ok; e++) {
      char ls[8], es[8];
      snprintf(ls, sizeof ls, "%d", l);
      snprintf(es, sizeof es, "%d", e);
      ina_metric_label_t labels[] = {{"layer", ls}, {"expert", es}};
      ok = ina_metrics_register_counter(reg, "ina_expert_tokens_total", "Tokens per expert.",
                                        labels, 2, &tokens[l][e]) == INA_OK;
    }
  }
  CHECK(ok);
  if (ok) {
    int l = (int)test_rng_int(rng, 0, LAYERS - 1), e = (int)test_rng_int(rng, 0, EXPERTS - 1);
    char ls[8], es[8], line[128];
    snprintf(ls, sizeof ls, "%d", l);
    snprintf(es, sizeof es, "%d", e);
    ina_metric_label_t labels[] = {{"layer", ls}, {"expert", es}};
    ina_counter_t *dup = NULL;
    ina_log_set_quiet_errors(1);
    CHECK(ina_metrics_register_counter(reg, "ina_expert_tokens_total", "Tokens per expert.",
                                       labels, 2, &dup) == INA_ERR_INVALID_ARGUMENT);
    ina_log_set_quiet_errors(0);
    ina_counter_add(tokens[l][e], 123);
    snprintf(line, sizeof line, "\nina_expert_tokens_total{layer=\"%d\",expert=\"%d\"} 123\n", l, e);
    char *text = render(reg);
    CHECK(text && strstr(text, line) != NULL);
    free(text);
  }
  ina_metrics_destroy(reg);
}

/* ---- presets ---- */

static void test_presets(void) {
  for (int p = 0; p < INA_METRICS_BUCKETS_COUNT; p++) {
    const double *b = NULL;
    size_t n = 0;
    CHECK_OK(ina_metrics_buckets_preset((ina_metrics_buckets_t)p, &b, &n));
    CHECK(b != NULL && n >= 10);
    for (size_t i = 1; b && i < n; i++) CHECK(b[i] > b[i - 1] && isfinite(b[i]));
    CHECK(strcmp(ina_metrics_buckets_name((ina_metrics_buckets_t)p), "?") != 0);
    /* Each preset is accepted by the registry as is. */
    ina_metrics_t *reg = NULL;
    CHECK_OK(ina_metrics_create(&reg));
    ina_histogram_t *h = NULL;
    if (reg) CHECK_OK(ina_metrics_register_histogram(reg, "p", "preset", NULL, 0, b, n, &h));
    ina_metrics_destroy(reg);
  }
  const double *b = NULL;
  size_t n = 0;
  /* Latencies span about 1 ms .. 60 s. */
  CHECK_OK(ina_metrics_buckets_preset(INA_METRICS_BUCKETS_TTFT_SECONDS, &b, &n));
  CHECK(b && b[0] <= 0.001 && b[n - 1] >= 60.0);
  CHECK_OK(ina_metrics_buckets_preset(INA_METRICS_BUCKETS_INTER_TOKEN_SECONDS, &b, &n));
  CHECK(b && b[0] <= 0.001 && b[n - 1] >= 60.0);
  CHECK_OK(ina_metrics_buckets_preset(INA_METRICS_BUCKETS_STEP_SECONDS, &b, &n));
  CHECK(b && b[0] <= 0.001 && b[n - 1] >= 10.0);
  ina_log_set_quiet_errors(1);
  CHECK(ina_metrics_buckets_preset(INA_METRICS_BUCKETS_COUNT, &b, &n) == INA_ERR_INVALID_ARGUMENT);
  CHECK(b == NULL && n == 0);
  ina_log_set_quiet_errors(0);
}

int main(void) {
  test_rng_t rng = {test_seed("test_metrics_registry")};
  test_golden();
  test_bucket_edges(&rng);
  test_escaping(&rng);
  test_invalid();
  test_many_series(&rng);
  test_presets();
  return test_finish("test_metrics_registry");
}
