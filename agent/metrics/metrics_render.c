/* The Prometheus text exposition format 0.0.4: per family a HELP and a TYPE line, then
 * one line per sample, `name{labels} value`. Histograms expand into cumulative
 * `_bucket{...,le="bound"}` lines ending with le="+Inf", then `_sum` and `_count`. */
#define INA_LOG_SUBSYS "metrics"
#include "agent/metrics/metrics_internal.h"

#include <inttypes.h>
#include <stdlib.h>

#include "core/check.h"

static const char *type_word(ina_metric_kind_t kind) {
  switch (kind) {
    case INA_METRIC_COUNTER: return "counter";
    case INA_METRIC_GAUGE: return "gauge";
    case INA_METRIC_HISTOGRAM: return "histogram";
  }
  return "untyped";
}

/* `name{labels} `, without braces when there are no labels. */
static void append_sample_head(ina_text_t *t, const char *name, const char *suffix,
                               const char *label_text) {
  ina_text_append(t, name);
  ina_text_append(t, suffix);
  if (label_text[0]) {
    ina_text_append(t, "{");
    ina_text_append(t, label_text);
    ina_text_append(t, "}");
  }
  ina_text_append(t, " ");
}

/* `name_bucket{labels,le="bound"} `; bucket n_bounds is le="+Inf". */
static void append_bucket_head(ina_text_t *t, const ina_metric_family_t *f,
                               const char *label_text, size_t bucket) {
  ina_text_append(t, f->name);
  ina_text_append(t, "_bucket{");
  ina_text_append(t, label_text);
  ina_text_append(t, label_text[0] ? ",le=\"" : "le=\"");
  if (bucket < f->n_bounds) ina_text_append_double(t, f->bounds[bucket]);
  else ina_text_append(t, "+Inf");
  ina_text_append(t, "\"} ");
}

static void render_histogram(ina_text_t *t, const ina_metric_family_t *f,
                             const ina_metric_series_t *s) {
  /* The buckets are read once each, so _count equals the +Inf bucket even while other
   * threads observe. */
  uint64_t cumulative = 0;
  for (size_t b = 0; b <= f->n_bounds; b++) {
    cumulative += atomic_load_explicit(&s->buckets[b], memory_order_relaxed);
    append_bucket_head(t, f, s->label_text, b);
    ina_text_appendf(t, "%" PRIu64 "\n", cumulative);
  }
  append_sample_head(t, f->name, "_sum", s->label_text);
  ina_text_append_double(t, ina_metrics_bits_f64(atomic_load_explicit(
                                (_Atomic uint64_t *)&s->f64, memory_order_relaxed)));
  ina_text_append(t, "\n");
  append_sample_head(t, f->name, "_count", s->label_text);
  ina_text_appendf(t, "%" PRIu64 "\n", cumulative);
}

static void render_family(ina_text_t *t, const ina_metric_family_t *f) {
  ina_text_append(t, "# HELP ");
  ina_text_append(t, f->name);
  ina_text_append(t, " ");
  ina_text_append_escaped(t, f->help, 0);
  ina_text_append(t, "\n# TYPE ");
  ina_text_append(t, f->name);
  ina_text_append(t, " ");
  ina_text_append(t, type_word(f->kind));
  ina_text_append(t, "\n");
  for (size_t i = 0; i < f->n_series; i++) {
    const ina_metric_series_t *s = f->series[i];
    if (f->kind == INA_METRIC_HISTOGRAM) {
      render_histogram(t, f, s);
      continue;
    }
    append_sample_head(t, f->name, "", s->label_text);
    if (f->value_type == INA_METRIC_INT64) {
      int64_t v = atomic_load_explicit((_Atomic int64_t *)&s->i64, memory_order_relaxed);
      ina_text_appendf(t, "%" PRId64, v);
    } else {
      ina_text_append_double(t, ina_metrics_bits_f64(atomic_load_explicit(
                                    (_Atomic uint64_t *)&s->f64, memory_order_relaxed)));
    }
    ina_text_append(t, "\n");
  }
}

ina_status_t ina_metrics_render(ina_metrics_t *reg, char **out_text, size_t *out_len) {
  ina_status_t st = INA_OK;
  ina_text_t t = {0};
  INA_REQUIRE(out_text != NULL, INA_ERR_INVALID_ARGUMENT, "ina_metrics_render: out_text is NULL");
  *out_text = NULL;
  if (out_len) *out_len = 0;
  INA_REQUIRE(reg != NULL, INA_ERR_INVALID_ARGUMENT, "ina_metrics_render: registry is NULL");

  ina_text_append(&t, ""); /* an empty registry still renders as "" */
  pthread_mutex_lock(&reg->mu);
  for (size_t i = 0; i < reg->n_families; i++) render_family(&t, reg->families[i]);
  pthread_mutex_unlock(&reg->mu);
  INA_REQUIRE(!t.failed, INA_ERR_OUT_OF_MEMORY,
              "ina_metrics_render: out of memory after %zu bytes of exposition", t.len);
  *out_text = t.buf;
  if (out_len) *out_len = t.len;
  return INA_OK;
fail:
  ina_text_free(&t);
  return st;
}
