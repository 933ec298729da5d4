/* A small metrics registry for the agent: counters, gauges and histograms, rendered in
 * the Prometheus text exposition format 0.0.4 (served by agent/metrics/metrics_http.h).
 *
 * Model: a metric family has a name, a help text, a type (counter, gauge, histogram),
 * for counters and gauges a value type (int64 or double), for histograms fixed bucket
 * bounds. A family holds one or more series, each with its own constant labels
 * (`layer="3",expert="17"`). Registering a series under an existing name adds it to that
 * family: the type, value type, help text, bucket bounds and label names (in order) must
 * all match the family's, and the label values must differ from every other series of
 * the family. Families render in registration order, series in registration order
 * within their family.
 *
 * Names are checked at registration: metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label
 * names [a-zA-Z_][a-zA-Z0-9_]* and must not start with "__"; histograms reserve the
 * label "le" and the names <name>_bucket, <name>_sum, <name>_count. Label values and help
 * texts may hold any bytes except NUL; rendering escapes them.
 *
 * Updates are lock-free: every value is a C11 atomic (relaxed order; a double is an
 * atomic 64-bit pattern updated with a compare-exchange loop), so any thread may update
 * any series at any time without a lock. Registration and rendering take the registry's
 * mutex. A rendering that races with updates sees each value at some recent point; the
 * histogram's _count is the sum of its buckets as rendered, so it always equals the
 * +Inf bucket, while _sum may be a few observations ahead or behind.
 *
 * Ownership: create/destroy pair; a failed constructor sets *out = NULL; destroy(NULL) is
 * a no-op. Series handles belong to the registry and stay valid until it is destroyed
 * (there is no unregistration). Strings and arrays passed in are copied.
 * Thread safety: every function is thread-safe, except destroy, which must not race with
 * any other use of the registry or its handles. Handles must not be NULL. */
#ifndef INA_AGENT_METRICS_METRICS_H
#define INA_AGENT_METRICS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_metrics ina_metrics_t;
typedef struct ina_counter ina_counter_t;         /* monotonic, int64 */
typedef struct ina_counter_f64 ina_counter_f64_t; /* monotonic, double */
typedef struct ina_gauge ina_gauge_t;             /* goes up and down, int64 */
typedef struct ina_gauge_f64 ina_gauge_f64_t;     /* goes up and down, double */
typedef struct ina_histogram ina_histogram_t;     /* observations in fixed buckets */

/* One constant label of a series. Both strings are copied at registration. */
typedef struct ina_metric_label {
  const char *name;
  const char *value;
} ina_metric_label_t;

ina_status_t ina_metrics_create(ina_metrics_t **out);
void ina_metrics_destroy(ina_metrics_t *reg);

/* Registration. `name` and `help` must not be NULL (help may be ""). `labels` may be
 * NULL when n_labels is 0. On success *out is the new series; on failure (invalid name,
 * mismatch with the existing family, duplicate label values: INA_ERR_INVALID_ARGUMENT,
 * with the reason in ina_last_error) *out is NULL. */
ina_status_t ina_metrics_register_counter(ina_metrics_t *reg, const char *name,
                                          const char *help, const ina_metric_label_t *labels,
                                          size_t n_labels, ina_counter_t **out);
ina_status_t ina_metrics_register_counter_f64(ina_metrics_t *reg, const char *name,
                                              const char *help,
                                              const ina_metric_label_t *labels,
                                              size_t n_labels, ina_counter_f64_t **out);
ina_status_t ina_metrics_register_gauge(ina_metrics_t *reg, const char *name, const char *help,
                                        const ina_metric_label_t *labels, size_t n_labels,
                                        ina_gauge_t **out);
ina_status_t ina_metrics_register_gauge_f64(ina_metrics_t *reg, const char *name,
                                            const char *help, const ina_metric_label_t *labels,
                                            size_t n_labels, ina_gauge_f64_t **out);
/* `bounds` are the upper bounds of the buckets, finite and strictly increasing; the +Inf
 * bucket is implicit. n_bounds may be 0 (only +Inf); bounds may then be NULL.
 * agent/metrics/metrics_buckets.h has the agent's presets. */
ina_status_t ina_metrics_register_histogram(ina_metrics_t *reg, const char *name,
                                            const char *help, const ina_metric_label_t *labels,
                                            size_t n_labels, const double *bounds,
                                            size_t n_bounds, ina_histogram_t **out);

/* Updates, from any thread. A counter never decreases: a negative or NaN increment is
 * dropped (and logged as a warning). */
void ina_counter_inc(ina_counter_t *c);
void ina_counter_add(ina_counter_t *c, int64_t n);
void ina_counter_f64_add(ina_counter_f64_t *c, double v);
void ina_gauge_set(ina_gauge_t *g, int64_t v);
void ina_gauge_add(ina_gauge_t *g, int64_t delta); /* delta may be negative */
void ina_gauge_f64_set(ina_gauge_f64_t *g, double v);
void ina_gauge_f64_add(ina_gauge_f64_t *g, double delta);
/* Counts v in the first bucket whose bound is >= v (a value equal to a bound goes in
 * that bucket), else in +Inf, and adds v to the sum. NaN goes in +Inf and makes the
 * sum NaN, as in Prometheus' own clients. */
void ina_histogram_observe(ina_histogram_t *h, double v);

/* Current values, from any thread. */
int64_t ina_counter_value(const ina_counter_t *c);
double ina_counter_f64_value(const ina_counter_f64_t *c);
int64_t ina_gauge_value(const ina_gauge_t *g);
double ina_gauge_f64_value(const ina_gauge_f64_t *g);
/* Observations <= bounds[i] (cumulative, as rendered); i == n_bounds is the +Inf bucket,
 * i.e. the total count; a larger i returns 0. */
uint64_t ina_histogram_bucket_count(const ina_histogram_t *h, size_t i);
double ina_histogram_sum(const ina_histogram_t *h);

/* Renders every series in the text exposition format 0.0.4 (serve it with
 * "Content-Type: text/plain; version=0.0.4"). *out_text is a NUL-terminated malloc'd
 * string the caller frees with free(); *out_len is its length without the NUL
 * (out_len may be NULL). On failure *out_text is NULL. Doubles are printed with the
 * fewest digits that read back exactly ("0.1", "1e-06", "+Inf", "NaN"); this assumes the
 * C locale's decimal point, which ina never changes. */
ina_status_t ina_metrics_render(ina_metrics_t *reg, char **out_text, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
