/* The agent's histogram bucket presets (see metrics_buckets.h for the reasoning). */
#define INA_LOG_SUBSYS "metrics"
#include "agent/metrics/metrics_buckets.h"

#include "core/check.h"

static const double ttft_seconds[] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75,  1.0,    1.5,   2.0,  3.0,   5.0,  7.5,   10.0, 15.0, 20.0, 30.0, 60.0,
};

static const double inter_token_seconds[] = {
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06,
    0.075, 0.1,    0.15,  0.2,    0.3,  0.5,   0.75, 1.0,   2.5,  5.0,  10.0, 20.0,
    60.0,
};

static const double step_seconds[] = {
    0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04,
    0.05,   0.075, 0.1,   0.15,  0.2,   0.3,   0.5,  1.0,   2.0,  5.0,   10.0, 30.0,
};

#define PRESET(arr) {arr, sizeof(arr) / sizeof((arr)[0])}

static const struct {
  const double *bounds;
  size_t n;
} presets[INA_METRICS_BUCKETS_COUNT] = {
    [INA_METRICS_BUCKETS_TTFT_SECONDS] = PRESET(ttft_seconds),
    [INA_METRICS_BUCKETS_INTER_TOKEN_SECONDS] = PRESET(inter_token_seconds),
    [INA_METRICS_BUCKETS_STEP_SECONDS] = PRESET(step_seconds),
};

ina_status_t ina_metrics_buckets_preset(ina_metrics_buckets_t preset, const double **bounds,
                                        size_t *n_bounds) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(bounds != NULL && n_bounds != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_metrics_buckets_preset: bounds or n_bounds is NULL");
  *bounds = NULL;
  *n_bounds = 0;
  INA_REQUIRE((unsigned)preset < INA_METRICS_BUCKETS_COUNT, INA_ERR_INVALID_ARGUMENT,
              "ina_metrics_buckets_preset: unknown preset %d", (int)preset);
  *bounds = presets[preset].bounds;
  *n_bounds = presets[preset].n;
fail:
  return st;
}

const char *ina_metrics_buckets_name(ina_metrics_buckets_t preset) {
  switch (preset) {
    case INA_METRICS_BUCKETS_TTFT_SECONDS: return "ttft_seconds";
    case INA_METRICS_BUCKETS_INTER_TOKEN_SECONDS: return "inter_token_seconds";
    case INA_METRICS_BUCKETS_STEP_SECONDS: return "step_seconds";
    case INA_METRICS_BUCKETS_COUNT: break;
  }
  return "?";
}
