/* The registry: creation, destruction and registration of series into families. */
#define INA_LOG_SUBSYS "metrics"
#include "agent/metrics/metrics_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* Series are updated from many threads; giving each its own cache line keeps
 * neighbouring per-expert counters from bouncing one line between cores. */
#define SERIES_ALIGN 64

ina_status_t ina_metrics_create(ina_metrics_t **out) {
  ina_status_t st = INA_OK;
  ina_metrics_t *reg = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_metrics_create: out is NULL");
  *out = NULL;
  reg = calloc(1, sizeof *reg);
  INA_CHECK_ALLOC(reg);
  INA_REQUIRE(pthread_mutex_init(&reg->mu, NULL) == 0, INA_ERR_INTERNAL,
              "ina_metrics_create: pthread_mutex_init failed");
  *out = reg;
  return INA_OK;
fail:
  free(reg);
  return st;
}

static void series_free(ina_metric_series_t *s) {
  if (!s) return;
  free(s->label_text);
  free((void *)s->buckets);
  free(s);
}

static void family_free(ina_metric_family_t *f) {
  if (!f) return;
  for (size_t i = 0; i < f->n_series; i++) series_free(f->series[i]);
  for (size_t i = 0; i < f->n_label_names; i++) free(f->label_names[i]);
  free(f->label_names);
  free(f->series);
  free(f->bounds);
  free(f->name);
  free(f->help);
  free(f);
}

void ina_metrics_destroy(ina_metrics_t *reg) {
  if (!reg) return;
  for (size_t i = 0; i < reg->n_families; i++) family_free(reg->families[i]);
  free(reg->families);
  free(reg->index);
  pthread_mutex_destroy(&reg->mu);
  free(reg);
}

/* ---- the (family name, label text) index ---- */

static uint64_t series_key_hash(const char *name, const char *label_text) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  h = (h ^ (unsigned char)'{') * 1099511628211ull; /* '{' cannot occur in a name */
  for (const char *p = label_text; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

/* The slot holding (name, label_text), or the empty slot where it would go. */
static ina_metric_series_t **index_slot(ina_metric_series_t **index, size_t cap,
                                        const char *name, const char *label_text) {
  size_t i = (size_t)series_key_hash(name, label_text) & (cap - 1);
  for (;; i = (i + 1) & (cap - 1)) {
    ina_metric_series_t *s = index[i];
    if (!s || (strcmp(s->family->name, name) == 0 && strcmp(s->label_text, label_text) == 0))
      return &index[i];
  }
}

/* Makes room for one more entry, keeping the load at most one half. */
static ina_status_t index_reserve(ina_metrics_t *reg) {
  ina_status_t st = INA_OK;
  if ((reg->index_used + 1) * 2 <= reg->index_cap) return INA_OK;
  size_t cap = reg->index_cap ? reg->index_cap * 2 : 64;
  ina_metric_series_t **index = calloc(cap, sizeof *index);
  INA_CHECK_ALLOC(index);
  for (size_t i = 0; i < reg->index_cap; i++) {
    ina_metric_series_t *s = reg->index[i];
    if (s) *index_slot(index, cap, s->family->name, s->label_text) = s;
  }
  free(reg->index);
  reg->index = index;
  reg->index_cap = cap;
fail:
  return st;
}

/* ---- checks on what is being registered ---- */

static const char *kind_name(ina_metric_kind_t kind) {
  switch (kind) {
    case INA_METRIC_COUNTER: return "counter";
    case INA_METRIC_GAUGE: return "gauge";
    case INA_METRIC_HISTOGRAM: return "histogram";
  }
  return "?";
}

static ina_status_t check_labels(const char *name, ina_metric_kind_t kind,
                                 const ina_metric_label_t *labels, size_t n_labels) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(n_labels == 0 || labels != NULL, INA_ERR_INVALID_ARGUMENT,
              "metric '%s': labels is NULL with n_labels %zu", name, n_labels);
  for (size_t i = 0; i < n_labels; i++) {
    const char *ln = labels[i].name;
    INA_REQUIRE(ln != NULL, INA_ERR_INVALID_ARGUMENT, "metric '%s': label %zu has a NULL name",
                name, i);
    INA_REQUIRE(ina_metrics_label_name_ok(ln), INA_ERR_INVALID_ARGUMENT,
                "metric '%s': invalid label name '%s' (must match [a-zA-Z_][a-zA-Z0-9_]* "
                "and not start with \"__\")", name, ln);
    INA_REQUIRE(kind != INA_METRIC_HISTOGRAM || strcmp(ln, "le") != 0,
                INA_ERR_INVALID_ARGUMENT,
                "metric '%s': label name 'le' is reserved for histogram buckets", name);
    INA_REQUIRE(labels[i].value != NULL, INA_ERR_INVALID_ARGUMENT,
                "metric '%s': label '%s' has a NULL value", name, ln);
    for (size_t j = 0; j < i; j++) {
      INA_REQUIRE(strcmp(labels[j].name, ln) != 0, INA_ERR_INVALID_ARGUMENT,
                  "metric '%s': label '%s' given twice", name, ln);
    }
  }
fail:
  return st;
}

static ina_status_t check_bounds(const char *name, const double *bounds, size_t n_bounds) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(n_bounds == 0 || bounds != NULL, INA_ERR_INVALID_ARGUMENT,
              "histogram '%s': bounds is NULL with n_bounds %zu", name, n_bounds);
  for (size_t i = 0; i < n_bounds; i++) {
    INA_REQUIRE(isfinite(bounds[i]), INA_ERR_INVALID_ARGUMENT,
                "histogram '%s': bucket bound %zu is %g; bounds must be finite (the +Inf "
                "bucket is implicit)", name, i, bounds[i]);
    INA_REQUIRE(i == 0 || bounds[i] > bounds[i - 1], INA_ERR_INVALID_ARGUMENT,
                "histogram '%s': bucket bounds must increase strictly, but bound %zu (%g) "
                "follows %g", name, i, bounds[i], bounds[i - 1]);
  }
fail:
  return st;
}

/* `a` is `b` followed by one of a histogram's series suffixes. */
static int is_histogram_series_name(const char *a, const char *b) {
  size_t nb = strlen(b);
  if (strncmp(a, b, nb) != 0) return 0;
  const char *suffix = a + nb;
  return strcmp(suffix, "_bucket") == 0 || strcmp(suffix, "_sum") == 0 ||
         strcmp(suffix, "_count") == 0;
}

/* A new family's rendered names must not collide with those of a histogram. */
static ina_status_t check_name_collisions(const ina_metrics_t *reg, const char *name,
                                          ina_metric_kind_t kind) {
  ina_status_t st = INA_OK;
  for (size_t i = 0; i < reg->n_families; i++) {
    const ina_metric_family_t *f = reg->families[i];
    INA_REQUIRE(!(f->kind == INA_METRIC_HISTOGRAM && is_histogram_series_name(name, f->name)),
                INA_ERR_INVALID_ARGUMENT,
                "metric '%s': the name is taken by the series of histogram '%s'", name,
                f->name);
    INA_REQUIRE(!(kind == INA_METRIC_HISTOGRAM && is_histogram_series_name(f->name, name)),
                INA_ERR_INVALID_ARGUMENT,
                "histogram '%s': its series would collide with the existing metric '%s'",
                name, f->name);
  }
fail:
  return st;
}

/* An existing family accepts a new series only if it is described the same way. */
static ina_status_t check_family_matches(const ina_metric_family_t *f, const char *help,
                                         ina_metric_kind_t kind,
                                         ina_metric_value_type_t value_type,
                                         const ina_metric_label_t *labels, size_t n_labels,
                                         const double *bounds, size_t n_bounds) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(f->kind == kind, INA_ERR_INVALID_ARGUMENT,
              "metric '%s': registered as a %s, now as a %s", f->name, kind_name(f->kind),
              kind_name(kind));
  INA_REQUIRE(f->value_type == value_type, INA_ERR_INVALID_ARGUMENT,
              "metric '%s': registered with %s values, now with %s values", f->name,
              f->value_type == INA_METRIC_INT64 ? "int64" : "double",
              value_type == INA_METRIC_INT64 ? "int64" : "double");
  INA_REQUIRE(strcmp(f->help, help) == 0, INA_ERR_INVALID_ARGUMENT,
              "metric '%s': help text differs from the first registration", f->name);
  INA_REQUIRE(f->n_label_names == n_labels, INA_ERR_INVALID_ARGUMENT,
              "metric '%s': registered with %zu labels, now with %zu", f->name,
              f->n_label_names, n_labels);
  for (size_t i = 0; i < n_labels; i++) {
    INA_REQUIRE(strcmp(f->label_names[i], labels[i].name) == 0, INA_ERR_INVALID_ARGUMENT,
                "metric '%s': label %zu is '%s' here but '%s' in the first registration",
                f->name, i, labels[i].name, f->label_names[i]);
  }
  INA_REQUIRE(f->n_bounds == n_bounds &&
                  (n_bounds == 0 || memcmp(f->bounds, bounds, n_bounds * sizeof *bounds) == 0),
              INA_ERR_INVALID_ARGUMENT,
              "histogram '%s': bucket bounds differ from the first registration", f->name);
fail:
  return st;
}

/* ---- building records ---- */

/* `a="x",b="y"` with the values escaped. */
static ina_status_t format_label_text(const char *name, const ina_metric_label_t *labels,
                                      size_t n_labels, char **out) {
  ina_status_t st = INA_OK;
  ina_text_t t = {0};
  ina_text_append(&t, "");
  for (size_t i = 0; i < n_labels; i++) {
    if (i) ina_text_append(&t, ",");
    ina_text_append(&t, labels[i].name);
    ina_text_append(&t, "=\"");
    ina_text_append_escaped(&t, labels[i].value, 1);
    ina_text_append(&t, "\"");
  }
  INA_REQUIRE(!t.failed, INA_ERR_OUT_OF_MEMORY, "metric '%s': out of memory for its labels",
              name);
  *out = t.buf;
  return INA_OK;
fail:
  ina_text_free(&t);
  return st;
}

static ina_status_t family_new(const char *name, const char *help, ina_metric_kind_t kind,
                               ina_metric_value_type_t value_type,
                               const ina_metric_label_t *labels, size_t n_labels,
                               const double *bounds, size_t n_bounds,
                               ina_metric_family_t **out) {
  ina_status_t st = INA_OK;
  ina_metric_family_t *f = calloc(1, sizeof *f);
  INA_CHECK_ALLOC(f);
  f->kind = kind;
  f->value_type = value_type;
  f->name = strdup(name);
  INA_CHECK_ALLOC(f->name);
  f->help = strdup(help);
  INA_CHECK_ALLOC(f->help);
  if (n_labels) {
    f->label_names = calloc(n_labels, sizeof *f->label_names);
    INA_CHECK_ALLOC(f->label_names);
    f->n_label_names = n_labels;
    for (size_t i = 0; i < n_labels; i++) {
      f->label_names[i] = strdup(labels[i].name);
      INA_CHECK_ALLOC(f->label_names[i]);
    }
  }
  if (n_bounds) {
    f->bounds = malloc(n_bounds * sizeof *f->bounds);
    INA_CHECK_ALLOC(f->bounds);
    memcpy(f->bounds, bounds, n_bounds * sizeof *f->bounds);
    f->n_bounds = n_bounds;
  }
  *out = f;
  return INA_OK;
fail:
  family_free(f);
  return st;
}

static ina_status_t series_new(ina_metric_family_t *f, char *label_text,
                               ina_metric_series_t **out) {
  ina_status_t st = INA_OK;
  size_t size = (sizeof(ina_metric_series_t) + SERIES_ALIGN - 1) / SERIES_ALIGN * SERIES_ALIGN;
  ina_metric_series_t *s = aligned_alloc(SERIES_ALIGN, size);
  INA_CHECK_ALLOC(s);
  memset(s, 0, size);
  s->family = f;
  atomic_init(&s->i64, 0);
  atomic_init(&s->f64, ina_metrics_f64_bits(0.0));
  atomic_flag_clear(&s->warned);
  if (f->kind == INA_METRIC_HISTOGRAM) {
    s->buckets = calloc(f->n_bounds + 1, sizeof *s->buckets);
    INA_CHECK_ALLOC(s->buckets);
    for (size_t i = 0; i <= f->n_bounds; i++) atomic_init(&s->buckets[i], 0);
  }
  s->label_text = label_text; /* taken over only on success */
  *out = s;
  return INA_OK;
fail:
  if (s) free(s);
  return st;
}

static ina_status_t grow_array(void **arr, size_t *cap, size_t n, size_t elem) {
  if (n < *cap) return INA_OK;
  size_t new_cap = *cap ? *cap * 2 : 8;
  void *p = realloc(*arr, new_cap * elem);
  if (!p) return INA_ERR_OUT_OF_MEMORY;
  *arr = p;
  *cap = new_cap;
  return INA_OK;
}

/* ---- registration ---- */

static ina_status_t register_series(ina_metrics_t *reg, ina_metric_kind_t kind,
                                    ina_metric_value_type_t value_type, const char *name,
                                    const char *help, const ina_metric_label_t *labels,
                                    size_t n_labels, const double *bounds, size_t n_bounds,
                                    ina_metric_series_t **out) {
  ina_status_t st = INA_OK;
  char *label_text = NULL;
  ina_metric_family_t *new_family = NULL;
  ina_metric_series_t *s = NULL;
  int locked = 0;

  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "metrics registration: out is NULL");
  *out = NULL;
  INA_REQUIRE(reg != NULL && name != NULL && help != NULL, INA_ERR_INVALID_ARGUMENT,
              "metrics registration: registry, name or help is NULL (name %s)",
              name ? name : "NULL");
  INA_REQUIRE(ina_metrics_metric_name_ok(name), INA_ERR_INVALID_ARGUMENT,
              "metric '%s': invalid metric name (must match [a-zA-Z_:][a-zA-Z0-9_:]*)", name);
  INA_CHECK(check_labels(name, kind, labels, n_labels));
  if (kind == INA_METRIC_HISTOGRAM) INA_CHECK(check_bounds(name, bounds, n_bounds));
  INA_CHECK(format_label_text(name, labels, n_labels, &label_text));

  pthread_mutex_lock(&reg->mu);
  locked = 1;
  ina_metric_family_t *f = NULL;
  for (size_t i = 0; i < reg->n_families && !f; i++) {
    if (strcmp(reg->families[i]->name, name) == 0) f = reg->families[i];
  }
  if (f) {
    INA_CHECK(check_family_matches(f, help, kind, value_type, labels, n_labels, bounds,
                                   n_bounds));
  } else {
    INA_CHECK(check_name_collisions(reg, name, kind));
    INA_CHECK(family_new(name, help, kind, value_type, labels, n_labels, bounds, n_bounds,
                         &new_family));
    f = new_family;
  }

  INA_CHECK(index_reserve(reg));
  ina_metric_series_t **slot = index_slot(reg->index, reg->index_cap, name, label_text);
  INA_REQUIRE(*slot == NULL, INA_ERR_INVALID_ARGUMENT,
              "metric '%s': a series with labels {%s} is already registered", name, label_text);
  INA_CHECK(grow_array((void **)&f->series, &f->cap_series, f->n_series, sizeof *f->series));
  if (new_family) {
    INA_CHECK(grow_array((void **)&reg->families, &reg->cap_families, reg->n_families,
                         sizeof *reg->families));
  }
  INA_CHECK(series_new(f, label_text, &s));
  label_text = NULL; /* owned by the series now */

  /* Nothing can fail past this point. */
  f->series[f->n_series++] = s;
  if (new_family) reg->families[reg->n_families++] = new_family;
  *slot = s;
  reg->index_used++;
  pthread_mutex_unlock(&reg->mu);
  *out = s;
  return INA_OK;
fail:
  if (locked) pthread_mutex_unlock(&reg->mu);
  family_free(new_family);
  free(label_text);
  return st;
}

ina_status_t ina_metrics_register_counter(ina_metrics_t *reg, const char *name,
                                          const char *help, const ina_metric_label_t *labels,
                                          size_t n_labels, ina_counter_t **out) {
  ina_metric_series_t *s = NULL;
  ina_status_t st = register_series(reg, INA_METRIC_COUNTER, INA_METRIC_INT64, name, help,
                                    labels, n_labels, NULL, 0, &s);
  if (out) *out = (ina_counter_t *)s;
  return st;
}

ina_status_t ina_metrics_register_counter_f64(ina_metrics_t *reg, const char *name,
                                              const char *help,
                                              const ina_metric_label_t *labels,
                                              size_t n_labels, ina_counter_f64_t **out) {
  ina_metric_series_t *s = NULL;
  ina_status_t st = register_series(reg, INA_METRIC_COUNTER, INA_METRIC_F64, name, help,
                                    labels, n_labels, NULL, 0, &s);
  if (out) *out = (ina_counter_f64_t *)s;
  return st;
}

ina_status_t ina_metrics_register_gauge(ina_metrics_t *reg, const char *name, const char *help,
                                        const ina_metric_label_t *labels, size_t n_labels,
                                        ina_gauge_t **out) {
  ina_metric_series_t *s = NULL;
  ina_status_t st = register_series(reg, INA_METRIC_GAUGE, INA_METRIC_INT64, name, help,
                                    labels, n_labels, NULL, 0, &s);
  if (out) *out = (ina_gauge_t *)s;
  return st;
}

ina_status_t ina_metrics_register_gauge_f64(ina_metrics_t *reg, const char *name,
                                            const char *help, const ina_metric_label_t *labels,
                                            size_t n_labels, ina_gauge_f64_t **out) {
  ina_metric_series_t *s = NULL;
  ina_status_t st = register_series(reg, INA_METRIC_GAUGE, INA_METRIC_F64, name, help, labels,
                                    n_labels, NULL, 0, &s);
  if (out) *out = (ina_gauge_f64_t *)s;
  return st;
}

ina_status_t ina_metrics_register_histogram(ina_metrics_t *reg, const char *name,
                                            const char *help, const ina_metric_label_t *labels,
                                            size_t n_labels, const double *bounds,
                                            size_t n_bounds, ina_histogram_t **out) {
  ina_metric_series_t *s = NULL;
  ina_status_t st = register_series(reg, INA_METRIC_HISTOGRAM, INA_METRIC_F64, name, help,
                                    labels, n_labels, bounds, n_bounds, &s);
  if (out) *out = (ina_histogram_t *)s;
  return st;
}
