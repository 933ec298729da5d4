/* Helpers shared by the scheduler tests: the tiny model on the CPU engine, a callback
 * that records what a request receives, and reference runs of a request alone through
 * ina_generate. Include after tests/test_util.h. */
#ifndef INA_TESTS_SCHED_TEST_UTIL_H
#define INA_TESTS_SCHED_TEST_UTIL_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "model/generate.h"
#include "model/model.h"
#include "agent/scheduler/scheduler.h"

static inline ina_model_t *sched_test_model(uint64_t seed) {
  ina_model_options_t o = INA_MODEL_OPTIONS_INIT;
  ina_model_t *m = NULL;
  o.seed = seed;
  o.dtype = INA_DTYPE_F32; /* no weight conversion in every step: keeps the tests fast */
  if (ina_model_open("tiny", &o, &m) != INA_OK) {
    fprintf(stderr, "cannot open the tiny model: %s\n", ina_last_error());
    exit(1);
  }
  return m;
}

static inline ina_engine_t *sched_test_engine(const ina_model_t *m, int32_t page_size, int32_t num_pages) {
  ina_engine_options_t o = INA_ENGINE_OPTIONS_INIT;
  ina_engine_t *e = NULL;
  o.page_size = page_size;
  o.max_tokens = (int64_t)page_size * num_pages;
  o.num_threads = 2;
  o.device = -1;
  if (ina_engine_create(m, &o, &e) != INA_OK) {
    fprintf(stderr, "cannot create the CPU engine: %s\n", ina_last_error());
    exit(1);
  }
  return e;
}

/* Rank `rank` of `size`'s expert-parallel shard of the tiny model (as sched_test_model)
 * into *part, and a one-thread CPU engine on it over `ep` (attention_dp: its engine
 * option). Exits on failure. */
static inline ina_engine_t *sched_test_ep_engine(uint64_t seed, int32_t rank, int32_t size, ina_comm_t *ep,
                                                 int32_t page_size, int32_t num_pages, int32_t attention_dp,
                                                 ina_model_t **part) {
  ina_model_config_t cfg;
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  ina_engine_t *e = NULL;
  *part = NULL;
  mo.seed = seed;
  mo.dtype = INA_DTYPE_F32;
  eo.page_size = page_size;
  eo.max_tokens = (int64_t)page_size * num_pages;
  eo.num_threads = 1;
  eo.device = -1;
  eo.ep_comm = ep;
  eo.attention_dp = attention_dp;
  if (ina_model_spec_config("tiny", &cfg) != INA_OK) goto fail;
  mo.shard.expert_begin = (int32_t)((int64_t)cfg.n_routed_experts * rank / size);
  mo.shard.expert_end = (int32_t)((int64_t)cfg.n_routed_experts * (rank + 1) / size);
  if (ina_model_open("tiny", &mo, part) != INA_OK || ina_engine_create(*part, &eo, &e) != INA_OK) goto fail;
  return e;
fail:
  fprintf(stderr, "rank %d: cannot set up its expert-parallel engine: %s\n", rank, ina_last_error());
  exit(1);
}

/* Everything one request received through its callback. The lock makes it safe to read
 * from another thread while the driver delivers. */
typedef struct sched_collector {
  pthread_mutex_t mu;
  int32_t tokens[512];
  int32_t num_tokens;
  int finals;              /* final events received: must end up exactly 1 */
  int events_after_final;  /* anything delivered after the final event: must stay 0 */
  int count_mismatch;      /* num_generated disagreeing with the tokens received */
  int id_mismatch;         /* request_id not the submitted one */
  char id[64];
  ina_finish_reason_t finish;
  ina_status_t status;
  ina_request_metrics_t metrics;
  int64_t first_token_step; /* sched_test_current_step when the first token came, -1 */
  int64_t final_step;
} sched_collector_t;

/* Set by single-threaded tests before each step, to see when events came. */
static int64_t sched_test_current_step = 0;

static inline void sched_collector_init(sched_collector_t *c, const char *id) {
  memset(c, 0, sizeof *c);
  pthread_mutex_init(&c->mu, NULL);
  snprintf(c->id, sizeof c->id, "%s", id);
  c->first_token_step = c->final_step = -1;
}

static inline void sched_collector_destroy(sched_collector_t *c) { pthread_mutex_destroy(&c->mu); }

static inline void sched_collect(const ina_request_event_t *ev, void *user) {
  sched_collector_t *c = user;
  pthread_mutex_lock(&c->mu);
  if (c->finals > 0) c->events_after_final++;
  if (strcmp(ev->request_id, c->id) != 0) c->id_mismatch++;
  if (ev->finish == INA_FINISH_NONE) {
    if (c->num_tokens < (int32_t)(sizeof c->tokens / sizeof c->tokens[0])) c->tokens[c->num_tokens] = ev->token;
    c->num_tokens++;
    if (ev->num_generated != c->num_tokens || ev->token < 0 || ev->metrics != NULL) c->count_mismatch++;
    if (c->first_token_step < 0) c->first_token_step = sched_test_current_step;
  } else {
    c->finals++;
    c->finish = ev->finish;
    c->status = ev->status;
    if (ev->metrics) c->metrics = *ev->metrics;
    if (ev->token != -1 || ev->num_generated != c->num_tokens || ev->metrics == NULL) c->count_mismatch++;
    c->final_step = sched_test_current_step;
  }
  pthread_mutex_unlock(&c->mu);
}

/* A request whose callback fills `c`; the caller sets the prompt and limits. */
static inline ina_request_t sched_test_request(sched_collector_t *c, const int32_t *prompt, int32_t prompt_len,
                                               int32_t max_new) {
  ina_request_t r = INA_REQUEST_INIT;
  r.id = c->id;
  r.prompt = prompt;
  r.prompt_len = prompt_len;
  r.max_new_tokens = max_new;
  r.callback = sched_collect;
  r.user_data = c;
  return r;
}

/* The request alone through ina_generate: tokens to out [max_new], logits of every
 * position to logits [prompt_len + max_new - 1, vocab] (may be NULL). Returns the
 * number generated (it stops early at eos unless ignore_eos). */
static inline int32_t sched_test_reference(ina_engine_t *e, const int32_t *prompt, int32_t prompt_len,
                                           int32_t max_new, const ina_sampling_params_t *sampling, int ignore_eos,
                                           int32_t *out, float *logits) {
  ina_generate_request_t g;
  memset(&g, 0, sizeof g);
  g.prompt = prompt;
  g.prompt_len = prompt_len;
  g.max_new_tokens = max_new;
  g.sampling = *sampling;
  g.ignore_eos = ignore_eos;
  g.output = out;
  g.logits = logits;
  if (ina_generate(e, &g, 1, NULL) != INA_OK) {
    fprintf(stderr, "reference generation failed: %s\n", ina_last_error());
    exit(1);
  }
  return g.num_generated;
}

/* Greedy expectation of a request: the reference tokens cut at the first stop id or eos
 * (included), and the finish reason that cut gives. Returns the expected count. */
static inline int32_t sched_test_expected(const int32_t *ref, int32_t ref_len, int32_t max_new, const int32_t *stop_ids,
                                          int32_t num_stop_ids, int32_t eos, ina_finish_reason_t *reason) {
  for (int32_t j = 0; j < ref_len; j++) {
    for (int32_t k = 0; k < num_stop_ids; k++)
      if (ref[j] == stop_ids[k]) {
        *reason = INA_FINISH_STOP;
        return j + 1;
      }
    if (ref[j] == eos) {
      *reason = INA_FINISH_EOS;
      return j + 1;
    }
  }
  *reason = INA_FINISH_LENGTH;
  return ref_len < max_new ? ref_len : max_new;
}

/* The two best logits of a row are within rounding of each other. */
static inline int sched_test_near_tie(const float *row, int32_t vocab) {
  float best = -INFINITY, second = -INFINITY;
  for (int32_t v = 0; v < vocab; v++) {
    if (row[v] > best) {
      second = best;
      best = row[v];
    } else if (row[v] > second) {
      second = row[v];
    }
  }
  return best - second <= 1e-4f * (fabsf(best) > 1.0f ? fabsf(best) : 1.0f);
}

/* Whether greedy tokens received agree with the reference. Exactly, except after a
 * preemption: the recomputed tokens run on the prefill path, which rounds differently
 * from the decode steps that first computed them, so the argmax may flip where the
 * reference's two best logits are a near tie (ref_logits: [prompt_len + max_new - 1,
 * vocab] of the reference run). From such a flip on the outputs may differ; *tie_flip
 * says it happened. prefix_only: the request may have stopped early (cancelled). */
static inline int sched_test_greedy_agrees_upto(const sched_collector_t *c, const int32_t *expected,
                                                int32_t n_expected, const float *ref_logits, int32_t prompt_len,
                                                int32_t vocab, int prefix_only, int *tie_flip) {
  *tie_flip = 0;
  const int32_t n = c->num_tokens < n_expected ? c->num_tokens : n_expected;
  for (int32_t j = 0; j < n; j++) {
    if (c->tokens[j] == expected[j]) continue;
    if (c->metrics.preemptions > 0 && ref_logits &&
        sched_test_near_tie(ref_logits + (size_t)(prompt_len - 1 + j) * (size_t)vocab, vocab)) {
      *tie_flip = 1;
      return 1;
    }
    fprintf(stderr, "request '%s': token %d is %d, the reference says %d\n", c->id, j, c->tokens[j], expected[j]);
    return 0;
  }
  if (prefix_only ? c->num_tokens > n_expected : c->num_tokens != n_expected) {
    fprintf(stderr, "request '%s': %d tokens, the reference says %d\n", c->id, c->num_tokens, n_expected);
    return 0;
  }
  return 1;
}

/* The same, where the tokens received must be the whole expectation. */
static inline int sched_test_greedy_agrees(const sched_collector_t *c, const int32_t *expected, int32_t n_expected,
                                           const float *ref_logits, int32_t prompt_len, int32_t vocab, int *tie_flip) {
  return sched_test_greedy_agrees_upto(c, expected, n_expected, ref_logits, prompt_len, vocab, 0, tie_flip);
}

/* Step until nothing is unfinished (at most max_steps); returns the steps taken. */
static inline int64_t sched_test_drain(ina_scheduler_t *s, int64_t max_steps) {
  int64_t steps = 0;
  for (;;) {
    ina_scheduler_stats_t st;
    ina_scheduler_stats(s, &st);
    if (st.waiting + st.running == 0 || steps >= max_steps) return steps;
    sched_test_current_step++;
    if (ina_scheduler_step(s, NULL) != INA_OK) fprintf(stderr, "step failed: %s\n", ina_last_error());
    steps++;
  }
}

#endif
