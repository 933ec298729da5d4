/* Histogram bucket bounds the agent uses, as named presets, for
 * ina_metrics_register_histogram. All are in seconds.
 *
 * - TTFT (time to first token): queueing + prefill, from a cached-prefix hit of a few
 *   milliseconds to a long prompt behind a full batch; 1 ms .. 60 s.
 * - Inter-token latency: one decode step seen by one request, usually 10..100 ms for
 *   DeepSeek-class models, with a tail when prefill chunks or preemption interleave;
 *   finer steps below 100 ms, 1 ms .. 60 s.
 * - Step time: one scheduler step (a decode batch or a prefill chunk) on one rank;
 *   0.5 ms .. 30 s.
 *
 * Ownership: the arrays are static and constant; never free them.
 * Thread safety: thread-safe. */
#ifndef INA_AGENT_METRICS_METRICS_BUCKETS_H
#define INA_AGENT_METRICS_METRICS_BUCKETS_H

#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_metrics_buckets {
  INA_METRICS_BUCKETS_TTFT_SECONDS = 0,
  INA_METRICS_BUCKETS_INTER_TOKEN_SECONDS,
  INA_METRICS_BUCKETS_STEP_SECONDS,
  INA_METRICS_BUCKETS_COUNT
} ina_metrics_buckets_t;

/* The bounds of a preset: *bounds points at *n_bounds finite, strictly increasing
 * values (the +Inf bucket is implicit). An unknown preset is INA_ERR_INVALID_ARGUMENT
 * with *bounds = NULL and *n_bounds = 0. */
ina_status_t ina_metrics_buckets_preset(ina_metrics_buckets_t preset, const double **bounds,
                                        size_t *n_bounds);

/* "ttft_seconds", "inter_token_seconds", "step_seconds"; "?" when unknown. */
const char *ina_metrics_buckets_name(ina_metrics_buckets_t preset);

#ifdef __cplusplus
}
#endif
#endif
