/* The registry under concurrency: threads update shared counters, gauges and histograms
 * with random amounts while another thread renders and others register new series; the
 * totals must come out exact, and every rendering must be self-consistent (a histogram's
 * _count equals its +Inf bucket). */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/metrics/metrics.h"
#include "core/log.h"
#include "tests/test_util.h"

#define THREADS 8
#define ITERS 20000
#define EXPERTS 16

static ina_metrics_t *g_reg;
static ina_counter_t *g_requests;
static ina_counter_t *g_expert[EXPERTS];
static ina_counter_f64_t *g_seconds;
static ina_gauge_t *g_inflight;
static ina_gauge_f64_t *g_level;
static ina_histogram_t *g_hist;
static const double g_bounds[] = {1, 2, 4, 8, 16};
static atomic_int g_stop_render;

typedef struct {
  uint64_t seed;
  int index;
  /* What this thread did, for the expected totals. */
  int64_t requests;
  int64_t expert[EXPERTS];
  int64_t seconds_quarters; /* counter_f64 increments are multiples of 0.25: exact sums */
  uint64_t buckets[6];
  int64_t hist_sum_quarters;
  int registered;
} worker_t;

static void *worker(void *arg) {
  worker_t *w = arg;
  test_rng_t rng = {w->seed};
  for (int i = 0; i < ITERS; i++) {
    int64_t n = test_rng_int(&rng, 0, 5);
    ina_counter_add(g_requests, n);
    w->requests += n;
    int e = (int)test_rng_int(&rng, 0, EXPERTS - 1);
    ina_counter_inc(g_expert[e]);
    w->expert[e]++;
    int64_t q = test_rng_int(&rng, 0, 8);
    ina_counter_f64_add(g_seconds, 0.25 * (double)q);
    w->seconds_quarters += q;
    ina_gauge_add(g_inflight, 1); /* balanced: ends at zero */
    ina_gauge_f64_add(g_level, 0.5);
    ina_gauge_f64_add(g_level, -0.5);
    int64_t hq = test_rng_int(&rng, 0, 80); /* 0 .. 20 in quarters: hits every bucket */
    double v = 0.25 * (double)hq;
    ina_histogram_observe(g_hist, v);
    w->hist_sum_quarters += hq;
    size_t b = 5;
    for (size_t k = 0; k < 5; k++) {
      if (v <= g_bounds[k]) {
        b = k;
        break;
      }
    }
    w->buckets[b]++;
    ina_gauge_add(g_inflight, -1);
    /* Now and then, register a series of a new per-thread family member. */
    if (i % 2000 == 0) {
      char id[32];
      snprintf(id, sizeof id, "%d-%d", w->index, i);
      ina_metric_label_t l[] = {{"worker", id}};
      ina_gauge_t *g = NULL;
      if (ina_metrics_register_gauge(g_reg, "ina_late_gauge", "Registered while busy.", l, 1, &g) ==
          INA_OK) {
        ina_gauge_set(g, i);
        w->registered++;
      }
    }
  }
  return NULL;
}

static uint64_t parse_after(const char *text, const char *prefix) {
  const char *p = strstr(text, prefix);
  return p ? strtoull(p + strlen(prefix), NULL, 10) : UINT64_MAX;
}

static void *renderer(void *arg) {
  int *renders = arg;
  while (!atomic_load(&g_stop_render)) {
    char *text = NULL;
    if (ina_metrics_render(g_reg, &text, NULL) != INA_OK) {
      CHECK(0);
      break;
    }
    uint64_t inf = parse_after(text, "\nina_lat_seconds_bucket{le=\"+Inf\"} ");
    uint64_t count = parse_after(text, "\nina_lat_seconds_count ");
    uint64_t le1 = parse_after(text, "\nina_lat_seconds_bucket{le=\"1\"} ");
    uint64_t le16 = parse_after(text, "\nina_lat_seconds_bucket{le=\"16\"} ");
    CHECKF(inf == count && le1 <= le16 && le16 <= inf, "inf %" PRIu64 " count %" PRIu64, inf,
           count);
    free(text);
    (*renders)++;
  }
  return NULL;
}

int main(void) {
  uint64_t seed = test_seed("test_metrics_threads");
  CHECK_OK(ina_metrics_create(&g_reg));
  if (!g_reg) return test_finish("test_metrics_threads");
  CHECK_OK(ina_metrics_register_counter(g_reg, "ina_requests_total", "Requests.", NULL, 0,
                                        &g_requests));
  for (int e = 0; e < EXPERTS; e++) {
    char es[8];
    snprintf(es, sizeof es, "%d", e);
    ina_metric_label_t l[] = {{"layer", "0"}, {"expert", es}};
    CHECK_OK(ina_metrics_register_counter(g_reg, "ina_expert_tokens_total", "Tokens.", l, 2,
                                          &g_expert[e]));
  }
  CHECK_OK(ina_metrics_register_counter_f64(g_reg, "ina_busy_seconds_total", "Busy.", NULL, 0,
                                            &g_seconds));
  CHECK_OK(ina_metrics_register_gauge(g_reg, "ina_inflight", "In flight.", NULL, 0, &g_inflight));
  CHECK_OK(ina_metrics_register_gauge_f64(g_reg, "ina_level", "Level.", NULL, 0, &g_level));
  CHECK_OK(ina_metrics_register_histogram(g_reg, "ina_lat_seconds", "Latency.", NULL, 0, g_bounds,
                                          5, &g_hist));
  if (!g_requests || !g_seconds || !g_inflight || !g_level || !g_hist) {
    ina_metrics_destroy(g_reg);
    return test_finish("test_metrics_threads");
  }
  ina_gauge_f64_set(g_level, 3.0);

  static worker_t workers[THREADS];
  pthread_t threads[THREADS], render_thread;
  int renders = 0;
  pthread_create(&render_thread, NULL, renderer, &renders);
  test_rng_t seeder = {seed};
  for (int t = 0; t < THREADS; t++) {
    workers[t].seed = test_rng_next(&seeder);
    workers[t].index = t;
    pthread_create(&threads[t], NULL, worker, &workers[t]);
  }
  for (int t = 0; t < THREADS; t++) pthread_join(threads[t], NULL);
  atomic_store(&g_stop_render, 1);
  pthread_join(render_thread, NULL);
  printf("test_metrics_threads: %d renderings during the updates\n", renders);
  CHECK(renders > 0);

  int64_t requests = 0, seconds_q = 0, hist_q = 0, expert[EXPERTS] = {0};
  uint64_t buckets[6] = {0};
  int registered = 0;
  for (int t = 0; t < THREADS; t++) {
    requests += workers[t].requests;
    seconds_q += workers[t].seconds_quarters;
    hist_q += workers[t].hist_sum_quarters;
    registered += workers[t].registered;
    for (int e = 0; e < EXPERTS; e++) expert[e] += workers[t].expert[e];
    for (int b = 0; b < 6; b++) buckets[b] += workers[t].buckets[b];
  }
  CHECK(ina_counter_value(g_requests) == requests);
  for (int e = 0; e < EXPERTS; e++) CHECK(ina_counter_value(g_expert[e]) == expert[e]);
  CHECK(ina_counter_f64_value(g_seconds) == 0.25 * (double)seconds_q);
  CHECK(ina_gauge_value(g_inflight) == 0);
  CHECK(ina_gauge_f64_value(g_level) == 3.0);
  CHECK(ina_histogram_sum(g_hist) == 0.25 * (double)hist_q);
  uint64_t cumulative = 0;
  for (size_t b = 0; b < 6; b++) {
    cumulative += buckets[b];
    CHECK(ina_histogram_bucket_count(g_hist, b) == cumulative);
  }
  CHECK(cumulative == (uint64_t)THREADS * ITERS);
  CHECK(registered == THREADS * (ITERS / 2000));

  /* The final rendering agrees with the values read directly. */
  char *text = NULL;
  CHECK_OK(ina_metrics_render(g_reg, &text, NULL));
  if (text) {
    CHECK(parse_after(text, "\nina_requests_total ") == (uint64_t)requests);
    CHECK(parse_after(text, "\nina_lat_seconds_count ") == (uint64_t)THREADS * ITERS);
    CHECK(parse_after(text, "\nina_expert_tokens_total{layer=\"0\",expert=\"5\"} ") ==
          (uint64_t)expert[5]);
    size_t late = 0;
    for (const char *p = text; (p = strstr(p, "\nina_late_gauge{")) != NULL; p++) late++;
    CHECK(late == (size_t)registered);
    free(text);
  }
  ina_metrics_destroy(g_reg);
  return test_finish("test_metrics_threads");
}
