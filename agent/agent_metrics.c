/* The agent's Prometheus metrics: the registry, the /metrics endpoint and the sampler
 * that copies the scheduler's gauges into it.
 *
 * Where each figure comes from:
 *   - per-request counters and the time-to-first-token histogram: the scheduler's final
 *     event of each Generate stream (agent_metrics_request_finished);
 *   - inter-token latency: the gap between consecutive token events of one stream,
 *     measured on the driver thread (agent_metrics_token_gap);
 *   - refused Generate calls: the service's refusal path (agent_metrics_refused);
 *   - queue length, running requests, KV pages and steps: ina_scheduler_stats, sampled
 *     every SAMPLE_MS by a thread of this file;
 *   - tokens routed per expert: the engine's counters (ina_engine_expert_load), sampled
 *     likewise (engines without counters have no such series);
 *   - the expert-parallel exchange's bytes (ina_engine_ep_traffic), sampled likewise;
 *   - each rank's heartbeat age: the job's heartbeat (comm/heartbeat.h), sampled likewise
 *     (a one-rank agent has no such series).
 * Why a sampler rather than a refresh at scrape time or on each step: the metrics
 * endpoint renders the registry with no hook to run first, and the scheduler has no
 * per-step hook; calling ina_scheduler_stats from token events would add the
 * scheduler's lock to the token path. A sample every SAMPLE_MS takes that lock off the
 * token path, and its staleness is far below any scrape interval.
 *
 * Every update is one of the registry's atomics: nothing here locks on the token path. */
#define INA_LOG_SUBSYS "agent"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "comm/heartbeat.h"
#include "agent/agent_internal.h"
#include "agent/handoff/handoff.h"
#include "agent/metrics/metrics_buckets.h"
#include "agent/metrics/metrics_http.h"

#define SAMPLE_MS 200

/* The finish reasons of the requests counter, in ina_finish_reason_t order from LENGTH. */
static const ina_finish_reason_t FINISHES[] = {INA_FINISH_LENGTH, INA_FINISH_STOP, INA_FINISH_EOS,
                                               INA_FINISH_CANCELLED, INA_FINISH_ERROR};
#define NUM_FINISHES (sizeof FINISHES / sizeof FINISHES[0])
#define NUM_RPC_CODES 17 /* OK .. UNAUTHENTICATED; OK is never a refusal */

struct agent_metrics {
  ina_scheduler_t *scheduler; /* borrowed, outlives the sampling */
  ina_engine_t *engine;       /* likewise */
  const ina_heartbeat_t *heartbeat; /* likewise; NULL for one rank */
  ina_metrics_t *reg;
  ina_metrics_http_t *http;

  ina_counter_t *requests[NUM_FINISHES];
  ina_counter_t *refused[NUM_RPC_CODES];
  ina_counter_t *prompt_tokens;
  ina_counter_t *generated_tokens;
  ina_counter_t *prefix_hit_tokens;
  ina_histogram_t *ttft;
  ina_histogram_t *inter_token;
  ina_gauge_t *queue_length;
  ina_gauge_t *running;
  ina_gauge_t *kv_pages_used;
  ina_gauge_t *kv_pages_free;
  ina_gauge_t *kv_pages_cached;
  ina_gauge_t *kv_pages_transfer;
  /* Prefill/decode hand-off (handoff/handoff.h), NULL for role both. */
  struct agent_handoff *handoff;
  ina_counter_t *kv_transfers[4]; /* prefill ok, prefill failed, decode ok, decode failed */
  ina_counter_t *kv_transfer_bytes;
  ina_gauge_t *kv_quarantined;
  ina_counter_t *steps;
  ina_counter_t **expert_tokens; /* [moe layers x experts] */
  uint64_t *expert_sample;       /* the engine's counters, read each sample */
  size_t num_expert_series;
  ina_gauge_f64_t **heartbeat_age; /* [heartbeat size] */
  ina_counter_t *ep_bytes[2];      /* dispatch, combine */
  ina_counter_t *ep_layers;
  ina_counter_t *ep_wait_us;

  pthread_t sampler;
  int sampler_started;
  pthread_mutex_t sampler_lock;
  pthread_cond_t sampler_wake; /* CLOCK_MONOTONIC */
  int sampler_stop;
};

/* ---- address ------------------------------------------------------------------------ */

/* ---- registration ------------------------------------------------------------------- */

/* One counter per (MoE layer, expert) when the engine counts them. */
static ina_status_t register_expert_tokens(agent_metrics_t *m) {
  ina_status_t st = INA_OK;
  int32_t layers = 0;
  if (ina_engine_expert_load(m->engine, 0, NULL, 0, &layers) != INA_OK) return INA_OK;
  const int32_t experts = ina_engine_config(m->engine)->n_routed_experts;
  m->num_expert_series = (size_t)layers * (size_t)experts;
  m->expert_tokens = calloc(m->num_expert_series + 1, sizeof *m->expert_tokens);
  m->expert_sample = calloc(m->num_expert_series + 1, sizeof *m->expert_sample);
  INA_CHECK_ALLOC(m->expert_tokens);
  INA_CHECK_ALLOC(m->expert_sample);
  for (int32_t l = 0; l < layers; l++)
    for (int32_t x = 0; x < experts; x++) {
      char layer[16], expert[16];
      snprintf(layer, sizeof layer, "%d", l);
      snprintf(expert, sizeof expert, "%d", x);
      const ina_metric_label_t labels[2] = {{"moe_layer", layer}, {"expert", expert}};
      INA_CHECK(ina_metrics_register_counter(
          m->reg, "ina_expert_routed_tokens_total",
          "Tokens the router sent to each routed expert, per MoE layer.", labels, 2,
          &m->expert_tokens[(size_t)l * (size_t)experts + (size_t)x]));
    }
fail:
  return st;
}

static ina_status_t register_all(agent_metrics_t *m) {
  ina_status_t st = INA_OK;
  ina_metrics_t *r = m->reg;
  for (size_t i = 0; i < NUM_FINISHES; i++) {
    ina_metric_label_t label = {"reason", ina_finish_reason_string(FINISHES[i])};
    INA_CHECK(ina_metrics_register_counter(r, "ina_requests_total",
                                           "Generate requests finished, by finish reason.", &label,
                                           1, &m->requests[i]));
  }
  for (int c = 1; c < NUM_RPC_CODES; c++) {
    ina_metric_label_t label = {"code", ina_rpc_code_name((ina_rpc_code_t)c)};
    INA_CHECK(ina_metrics_register_counter(r, "ina_requests_refused_total",
                                           "Generate calls refused before reaching the scheduler, "
                                           "by gRPC status code.",
                                           &label, 1, &m->refused[c]));
  }
  INA_CHECK(ina_metrics_register_counter(r, "ina_prompt_tokens_total",
                                         "Prompt tokens of finished Generate requests.", NULL, 0,
                                         &m->prompt_tokens));
  INA_CHECK(ina_metrics_register_counter(r, "ina_generated_tokens_total",
                                         "Tokens generated by finished Generate requests.", NULL, 0,
                                         &m->generated_tokens));
  INA_CHECK(ina_metrics_register_counter(r, "ina_prefix_cache_hit_tokens_total",
                                         "Prompt tokens of finished Generate requests taken from "
                                         "the prefix cache instead of computed.",
                                         NULL, 0, &m->prefix_hit_tokens));
  const double *bounds = NULL;
  size_t n_bounds = 0;
  INA_CHECK(ina_metrics_buckets_preset(INA_METRICS_BUCKETS_TTFT_SECONDS, &bounds, &n_bounds));
  INA_CHECK(ina_metrics_register_histogram(r, "ina_time_to_first_token_seconds",
                                           "Seconds from submit to the first generated token.",
                                           NULL, 0, bounds, n_bounds, &m->ttft));
  INA_CHECK(ina_metrics_buckets_preset(INA_METRICS_BUCKETS_INTER_TOKEN_SECONDS, &bounds, &n_bounds));
  INA_CHECK(ina_metrics_register_histogram(r, "ina_inter_token_latency_seconds",
                                           "Seconds between consecutive tokens of one request.",
                                           NULL, 0, bounds, n_bounds, &m->inter_token));
  INA_CHECK(ina_metrics_register_gauge(r, "ina_queue_length",
                                       "Requests accepted and waiting to run (preempted ones "
                                       "included).",
                                       NULL, 0, &m->queue_length));
  INA_CHECK(ina_metrics_register_gauge(r, "ina_running_requests",
                                       "Requests admitted: prefilling or decoding.", NULL, 0,
                                       &m->running));
  INA_CHECK(ina_metrics_register_gauge(r, "ina_kv_pages_used",
                                       "KV cache pages in use, prefix cache included.", NULL, 0,
                                       &m->kv_pages_used));
  INA_CHECK(ina_metrics_register_gauge(r, "ina_kv_pages_free", "KV cache pages free.", NULL, 0,
                                       &m->kv_pages_free));
  INA_CHECK(ina_metrics_register_gauge(r, "ina_kv_pages_cached",
                                       "KV cache pages the prefix cache holds (of ina_kv_pages_used).", NULL, 0,
                                       &m->kv_pages_cached));
  INA_CHECK(ina_metrics_register_gauge(r, "ina_kv_pages_transfer",
                                       "KV page references lent to prefill/decode transfers and not yet given "
                                       "back (a page lent twice counts twice).",
                                       NULL, 0, &m->kv_pages_transfer));
  {
    const char *sides[4][2] = {{"prefill", "ok"}, {"prefill", "failed"}, {"decode", "ok"}, {"decode", "failed"}};
    for (int k = 0; k < 4; k++) {
      const ina_metric_label_t labels[2] = {{"side", sides[k][0]}, {"outcome", sides[k][1]}};
      INA_CHECK(ina_metrics_register_counter(r, "ina_kv_transfers_total",
                                             "Prefill/decode KV transfers that ended: served here as a prefill agent, "
                                             "or received here as a decode agent.",
                                             labels, 2, &m->kv_transfers[k]));
    }
    INA_CHECK(ina_metrics_register_counter(r, "ina_kv_transfer_bytes_total",
                                           "Bytes of KV entries this prefill agent put into decode agents' pages.",
                                           NULL, 0, &m->kv_transfer_bytes));
    INA_CHECK(ina_metrics_register_gauge(r, "ina_kv_pages_quarantined",
                                         "Pages of transfers that broke, held until their prefill agent confirms "
                                         "it writes no more.",
                                         NULL, 0, &m->kv_quarantined));
  }
  INA_CHECK(ina_metrics_register_counter(r, "ina_scheduler_steps_total",
                                         "Forward steps the scheduler ran.", NULL, 0, &m->steps));
  INA_CHECK(register_expert_tokens(m));
  {
    const char *phases[2] = {"dispatch", "combine"};
    for (int k = 0; k < 2; k++) {
      const ina_metric_label_t label = {"phase", phases[k]};
      INA_CHECK(ina_metrics_register_counter(r, "ina_ep_exchange_bytes_total",
                                             "Bytes this rank's MoE layers sent to other ranks: rows on their way "
                                             "to the experts (dispatch) and outputs on their way back (combine).",
                                             &label, 1, &m->ep_bytes[k]));
    }
    INA_CHECK(ina_metrics_register_counter(r, "ina_ep_exchange_layers_total",
                                           "MoE layer exchanges between expert-parallel ranks (bytes per layer: "
                                           "ina_ep_exchange_bytes_total over this).",
                                           NULL, 0, &m->ep_layers));
    INA_CHECK(ina_metrics_register_counter(r, "ina_ep_exchange_wait_microseconds_total",
                                           "Time this rank's MoE layers spent blocked finishing their exchanges: the "
                                           "exchange time that compute did not hide (two-batch overlap hides part).",
                                           NULL, 0, &m->ep_wait_us));
  }
  const int ranks = ina_heartbeat_size(m->heartbeat);
  if (ranks > 1) {
    m->heartbeat_age = calloc((size_t)ranks, sizeof *m->heartbeat_age);
    INA_CHECK_ALLOC(m->heartbeat_age);
    for (int k = 0; k < ranks; k++) {
      char rank[16];
      snprintf(rank, sizeof rank, "%d", k);
      const ina_metric_label_t label = {"rank", rank};
      INA_CHECK(ina_metrics_register_gauge_f64(r, "ina_rank_heartbeat_age_seconds",
                                               "Seconds since the rank last answered the job's "
                                               "heartbeat, as this rank sees it.",
                                               &label, 1, &m->heartbeat_age[k]));
    }
  }
fail:
  return st;
}

/* ---- sampler ------------------------------------------------------------------------ */

static void sample(agent_metrics_t *m) {
  ina_scheduler_stats_t s;
  ina_scheduler_stats(m->scheduler, &s);
  ina_gauge_set(m->queue_length, s.waiting);
  ina_gauge_set(m->running, s.running);
  ina_gauge_set(m->kv_pages_used, s.kv_pages_used);
  ina_gauge_set(m->kv_pages_free, s.kv_pages_free);
  ina_gauge_set(m->kv_pages_cached, s.prefix_cache_pages);
  ina_gauge_set(m->kv_pages_transfer, s.kv_pages_lent);
  struct agent_handoff *h;
  pthread_mutex_lock(&m->sampler_lock);
  h = m->handoff;
  pthread_mutex_unlock(&m->sampler_lock);
  if (h) {
    agent_handoff_stats_t hs;
    agent_handoff_stats(h, &hs);
    const int64_t want[5] = {hs.prefills_served, hs.prefills_failed, hs.imports_done, hs.imports_failed,
                             hs.bytes_written};
    ina_counter_t *have[5] = {m->kv_transfers[0], m->kv_transfers[1], m->kv_transfers[2], m->kv_transfers[3],
                              m->kv_transfer_bytes};
    for (int k = 0; k < 5; k++) {
      const int64_t d = want[k] - ina_counter_value(have[k]);
      if (d > 0) ina_counter_add(have[k], d);
    }
    ina_gauge_set(m->kv_quarantined, hs.quarantined_pages);
  }
  /* The sampler is the counter's only writer, so the difference never races. */
  int64_t delta = s.steps - ina_counter_value(m->steps);
  if (delta > 0) ina_counter_add(m->steps, delta);
  int32_t layers = 0;
  if (m->num_expert_series &&
      ina_engine_expert_load(m->engine, 0, m->expert_sample, (int64_t)m->num_expert_series,
                             &layers) == INA_OK)
    for (size_t i = 0; i < m->num_expert_series; i++) {
      const int64_t d = (int64_t)m->expert_sample[i] - ina_counter_value(m->expert_tokens[i]);
      if (d > 0) ina_counter_add(m->expert_tokens[i], d);
    }
  ina_engine_ep_traffic_t tr;
  if (ina_engine_ep_traffic(m->engine, &tr) == INA_OK) {
    const int64_t want[4] = {tr.dispatch_bytes, tr.combine_bytes, tr.layers, tr.wait_ns / 1000};
    ina_counter_t *have[4] = {m->ep_bytes[0], m->ep_bytes[1], m->ep_layers, m->ep_wait_us};
    for (int k = 0; k < 4; k++) {
      const int64_t d = want[k] - ina_counter_value(have[k]);
      if (d > 0) ina_counter_add(have[k], d);
    }
  }
  if (m->heartbeat_age)
    for (int k = 0; k < ina_heartbeat_size(m->heartbeat); k++)
      ina_gauge_f64_set(m->heartbeat_age[k], 1e-3 * (double)ina_heartbeat_age_ms(m->heartbeat, k));
}

static void *sampler_main(void *arg) {
  agent_metrics_t *m = arg;
  pthread_mutex_lock(&m->sampler_lock);
  while (!m->sampler_stop) {
    pthread_mutex_unlock(&m->sampler_lock);
    sample(m);
    pthread_mutex_lock(&m->sampler_lock);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += SAMPLE_MS * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    while (!m->sampler_stop && pthread_cond_timedwait(&m->sampler_wake, &m->sampler_lock, &ts) == 0) {
    }
  }
  pthread_mutex_unlock(&m->sampler_lock);
  return NULL;
}

/* ---- life cycle --------------------------------------------------------------------- */

ina_status_t agent_metrics_start(ina_scheduler_t *scheduler, ina_engine_t *engine,
                                 const ina_heartbeat_t *heartbeat, const char *listen,
                                 agent_metrics_t **out) {
  ina_status_t st = INA_OK;
  agent_metrics_t *m = NULL;
  char host[256];
  int port = 0;
  *out = NULL;
  INA_CHECK(agent_parse_listen("metrics listen address", listen, host, sizeof host, &port));
  m = calloc(1, sizeof *m);
  INA_CHECK_ALLOC(m);
  m->scheduler = scheduler;
  m->engine = engine;
  m->heartbeat = heartbeat;
  pthread_mutex_init(&m->sampler_lock, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&m->sampler_wake, &ca);
  pthread_condattr_destroy(&ca);
  INA_CHECK(ina_metrics_create(&m->reg));
  INA_CHECK(register_all(m));
  sample(m); /* the first scrape sees real gauges */
  int rc = pthread_create(&m->sampler, NULL, sampler_main, m);
  INA_REQUIRE(rc == 0, INA_ERR_INTERNAL, "metrics: cannot start the sampler thread: %s",
              strerror(rc));
  m->sampler_started = 1;
  ina_metrics_http_options_t ho = INA_METRICS_HTTP_OPTIONS_INIT;
  ho.address = host;
  ho.port = port;
  INA_CHECK(ina_metrics_http_start(m->reg, &ho, &m->http));
  *out = m;
  return INA_OK;
fail:
  agent_metrics_stop(m);
  return st;
}

void agent_metrics_watch_handoff(agent_metrics_t *m, struct agent_handoff *h) {
  if (!m) return;
  pthread_mutex_lock(&m->sampler_lock);
  m->handoff = h;
  pthread_mutex_unlock(&m->sampler_lock);
}

void agent_metrics_stop_sampling(agent_metrics_t *m) {
  if (!m) return;
  ina_metrics_http_stop(m->http);
  m->http = NULL;
  if (m->sampler_started) {
    pthread_mutex_lock(&m->sampler_lock);
    m->sampler_stop = 1;
    pthread_cond_signal(&m->sampler_wake);
    pthread_mutex_unlock(&m->sampler_lock);
    pthread_join(m->sampler, NULL);
    m->sampler_started = 0;
  }
}

void agent_metrics_stop(agent_metrics_t *m) {
  if (!m) return;
  agent_metrics_stop_sampling(m);
  pthread_cond_destroy(&m->sampler_wake);
  pthread_mutex_destroy(&m->sampler_lock);
  ina_metrics_destroy(m->reg);
  free(m->expert_tokens);
  free(m->expert_sample);
  free(m->heartbeat_age);
  free(m);
}

int agent_metrics_port(const agent_metrics_t *m) {
  return m && m->http ? ina_metrics_http_port(m->http) : 0;
}

/* ---- updates ------------------------------------------------------------------------ */

void agent_metrics_request_finished(agent_metrics_t *m, const ina_request_event_t *event) {
  if (!m || event->finish == INA_FINISH_NONE) return;
  for (size_t i = 0; i < NUM_FINISHES; i++)
    if (FINISHES[i] == event->finish) ina_counter_inc(m->requests[i]);
  const ina_request_metrics_t *rm = event->metrics;
  if (!rm) return;
  ina_counter_add(m->prompt_tokens, rm->prompt_tokens);
  ina_counter_add(m->generated_tokens, rm->generated_tokens);
  ina_counter_add(m->prefix_hit_tokens, rm->cached_tokens);
  if (rm->first_token_seconds >= 0) ina_histogram_observe(m->ttft, rm->first_token_seconds);
}

void agent_metrics_token_gap(agent_metrics_t *m, double seconds) {
  if (m) ina_histogram_observe(m->inter_token, seconds);
}

void agent_metrics_refused(agent_metrics_t *m, ina_rpc_code_t code) {
  if (m && code > INA_RPC_OK && (int)code < NUM_RPC_CODES) ina_counter_inc(m->refused[code]);
}
