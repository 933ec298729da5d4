/* Lock-free updates and reads of series values. Relaxed atomics suffice: each value is
 * independent, and nobody orders other memory by it. */
#define INA_LOG_SUBSYS "metrics"
#include "agent/metrics/metrics_internal.h"

#include <math.h>

#include "core/log.h"

/* C11 has no atomic add on doubles: add through the bit pattern with a CAS loop. */
static void f64_add(_Atomic uint64_t *bits, double delta) {
  uint64_t old = atomic_load_explicit(bits, memory_order_relaxed);
  uint64_t new_bits;
  do {
    new_bits = ina_metrics_f64_bits(ina_metrics_bits_f64(old) + delta);
  } while (!atomic_compare_exchange_weak_explicit(bits, &old, new_bits, memory_order_relaxed,
                                                  memory_order_relaxed));
}

static double f64_load(const _Atomic uint64_t *bits) {
  return ina_metrics_bits_f64(atomic_load_explicit((_Atomic uint64_t *)bits,
                                                   memory_order_relaxed));
}

/* A dropped increment is a caller's bug; log it once per series rather than flood the
 * log from a hot path. */
static int first_drop(ina_metric_series_t *s) {
  return !atomic_flag_test_and_set_explicit(&s->warned, memory_order_relaxed);
}

void ina_counter_inc(ina_counter_t *c) {
  atomic_fetch_add_explicit(&c->s.i64, 1, memory_order_relaxed);
}

void ina_counter_add(ina_counter_t *c, int64_t n) {
  if (n < 0) {
    if (first_drop(&c->s)) {
      INA_LOG_W(INA_LOG_SUBSYS, "counter '%s': dropped a negative increment %lld (logged once)",
                c->s.family->name, (long long)n);
    }
    return;
  }
  atomic_fetch_add_explicit(&c->s.i64, n, memory_order_relaxed);
}

void ina_counter_f64_add(ina_counter_f64_t *c, double v) {
  if (!(v >= 0)) { /* negative or NaN */
    if (first_drop(&c->s)) {
      INA_LOG_W(INA_LOG_SUBSYS, "counter '%s': dropped an increment of %g (logged once)",
                c->s.family->name, v);
    }
    return;
  }
  f64_add(&c->s.f64, v);
}

void ina_gauge_set(ina_gauge_t *g, int64_t v) {
  atomic_store_explicit(&g->s.i64, v, memory_order_relaxed);
}

void ina_gauge_add(ina_gauge_t *g, int64_t delta) {
  atomic_fetch_add_explicit(&g->s.i64, delta, memory_order_relaxed);
}

void ina_gauge_f64_set(ina_gauge_f64_t *g, double v) {
  atomic_store_explicit(&g->s.f64, ina_metrics_f64_bits(v), memory_order_relaxed);
}

void ina_gauge_f64_add(ina_gauge_f64_t *g, double delta) { f64_add(&g->s.f64, delta); }

void ina_histogram_observe(ina_histogram_t *h, double v) {
  const ina_metric_family_t *f = h->s.family;
  /* Binary search for the first bound >= v (index n_bounds is +Inf). NaN is no bound's
   * match; it goes straight to +Inf. */
  size_t lo = isnan(v) ? f->n_bounds : 0, hi = f->n_bounds;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (f->bounds[mid] >= v) hi = mid;
    else lo = mid + 1;
  }
  atomic_fetch_add_explicit(&h->s.buckets[lo], 1, memory_order_relaxed);
  f64_add(&h->s.f64, v);
}

int64_t ina_counter_value(const ina_counter_t *c) {
  return atomic_load_explicit((_Atomic int64_t *)&c->s.i64, memory_order_relaxed);
}

double ina_counter_f64_value(const ina_counter_f64_t *c) { return f64_load(&c->s.f64); }

int64_t ina_gauge_value(const ina_gauge_t *g) {
  return atomic_load_explicit((_Atomic int64_t *)&g->s.i64, memory_order_relaxed);
}

double ina_gauge_f64_value(const ina_gauge_f64_t *g) { return f64_load(&g->s.f64); }

uint64_t ina_histogram_bucket_count(const ina_histogram_t *h, size_t i) {
  size_t n = h->s.family->n_bounds;
  if (i > n) return 0;
  uint64_t total = 0;
  for (size_t b = 0; b <= i; b++) {
    total += atomic_load_explicit(&h->s.buckets[b], memory_order_relaxed);
  }
  return total;
}

double ina_histogram_sum(const ina_histogram_t *h) { return f64_load(&h->s.f64); }
