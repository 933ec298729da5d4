/* Internals of the metrics registry shared by its source files: the family and series
 * records, the text builder used for label sets and rendering, and name validation.
 * Not a public header. */
#ifndef INA_AGENT_METRICS_METRICS_INTERNAL_H
#define INA_AGENT_METRICS_METRICS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "agent/metrics/metrics.h"

typedef enum ina_metric_kind {
  INA_METRIC_COUNTER,
  INA_METRIC_GAUGE,
  INA_METRIC_HISTOGRAM,
} ina_metric_kind_t;

typedef enum ina_metric_value_type {
  INA_METRIC_INT64,
  INA_METRIC_F64, /* histograms are always F64 (their sum) */
} ina_metric_value_type_t;

typedef struct ina_metric_series ina_metric_series_t;

typedef struct ina_metric_family {
  char *name;
  char *help;
  ina_metric_kind_t kind;
  ina_metric_value_type_t value_type;
  char **label_names; /* n_label_names, shared by every series of the family */
  size_t n_label_names;
  double *bounds; /* histograms: n_bounds finite upper bounds, strictly increasing */
  size_t n_bounds;
  ina_metric_series_t **series; /* registration order */
  size_t n_series, cap_series;
} ina_metric_family_t;

/* One series. Each is its own cache-line-aligned allocation so that threads updating
 * different series (per-expert counters) do not contend on one line. */
struct ina_metric_series {
  ina_metric_family_t *family;
  char *label_text; /* `a="x",b="y"`, escaped, without braces; "" when unlabelled */
  _Atomic int64_t i64;     /* INT64 counters and gauges */
  _Atomic uint64_t f64;    /* F64 counters and gauges, histogram sum: bits of a double */
  _Atomic uint64_t *buckets; /* histograms: n_bounds + 1 counts, not cumulative */
  atomic_flag warned; /* set once a dropped counter increment has been logged */
};

/* The public handle types are views of a series; converting is free. */
struct ina_counter { ina_metric_series_t s; };
struct ina_counter_f64 { ina_metric_series_t s; };
struct ina_gauge { ina_metric_series_t s; };
struct ina_gauge_f64 { ina_metric_series_t s; };
struct ina_histogram { ina_metric_series_t s; };

struct ina_metrics {
  pthread_mutex_t mu; /* guards everything below; never taken by updates */
  ina_metric_family_t **families; /* registration order */
  size_t n_families, cap_families;
  /* Open-addressing hash set of every series, keyed by family name and label text, so
   * that registering thousands of per-expert series stays linear. */
  ina_metric_series_t **index;
  size_t index_cap; /* a power of two, or 0 */
  size_t index_used;
};

/* --- text builder (metrics_text.c) ---
 * A growing NUL-terminated string. An allocation failure is sticky: later appends do
 * nothing and `failed` stays set, so callers check once at the end. */
typedef struct ina_text {
  char *buf;
  size_t len, cap;
  int failed;
} ina_text_t;

void ina_text_append(ina_text_t *t, const char *s);
void ina_text_append_n(ina_text_t *t, const char *s, size_t n);
void ina_text_appendf(ina_text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Shortest decimal that reads back to exactly v; "+Inf", "-Inf", "NaN". */
void ina_text_append_double(ina_text_t *t, double v);
/* Exposition escaping: backslash and newline always, the double quote too when
 * `quote` is set (label values; help texts leave quotes alone). */
void ina_text_append_escaped(ina_text_t *t, const char *s, int quote);
void ina_text_free(ina_text_t *t);

/* --- names (metrics_names.c) --- */
int ina_metrics_metric_name_ok(const char *name);
int ina_metrics_label_name_ok(const char *name);

/* Bits of a double for the atomic fields, and back. */
static inline uint64_t ina_metrics_f64_bits(double v) {
  union { double d; uint64_t u; } x;
  x.d = v;
  return x.u;
}
static inline double ina_metrics_bits_f64(uint64_t u) {
  union { double d; uint64_t u; } x;
  x.u = u;
  return x.d;
}

#endif
