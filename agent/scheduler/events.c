/* Delivery of tokens and final events. A step queues them while it works and delivers
 * them at its end with no lock held, so a callback may call submit, cancel or stats.
 * Finished requests are unlinked from the live list (under mu) before their final event
 * is delivered: from then on cancel reports them unknown and their id may be reused. */
#define INA_LOG_SUBSYS "scheduler"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

/* An array of *capacity elements grown to hold need > *capacity: the grown array, or
 * NULL when out of memory (the old one is then unchanged). */
static void *grow(void *array, int32_t *capacity, int32_t need, size_t elem) {
  const int32_t grown_capacity = *capacity * 2 > need ? *capacity * 2 : need;
  void *grown = realloc(array, (size_t)grown_capacity * elem);
  if (grown) *capacity = grown_capacity;
  return grown;
}

ina_status_t sched_events_reserve(ina_scheduler_t *s, int32_t extra) {
  ina_status_t st = INA_OK;
  /* At most a token and a final event per request. */
  const int32_t events_needed = s->num_events + 2 * extra, finished_needed = s->num_finished + extra;
  if (events_needed > s->events_capacity) {
    sched_event_t *events = grow(s->events, &s->events_capacity, events_needed, sizeof *events);
    INA_CHECK_ALLOC(events);
    s->events = events;
  }
  if (finished_needed > s->finished_capacity) {
    sched_request_t **finished = grow(s->finished, &s->finished_capacity, finished_needed, sizeof *finished);
    INA_CHECK_ALLOC(finished);
    s->finished = finished;
  }
fail:
  return st;
}

/* Log-softmax of the row at token and at its top-k ids (most likely first, ties by the
 * lower id), in double. */
static void fill_logprobs(sched_event_t *e, const float *logits, int32_t vocab, int32_t token, int32_t k) {
  double max = -INFINITY;
  for (int32_t v = 0; v < vocab; v++)
    if (logits[v] > max) max = logits[v];
  double sum = 0;
  for (int32_t v = 0; v < vocab; v++)
    if (logits[v] > -INFINITY) sum += exp((double)logits[v] - max);
  const double log_z = max + log(sum);
  e->logprob = (float)((double)logits[token] - log_z);
  if (k > vocab) k = vocab;
  e->num_top = 0;
  for (int32_t v = 0; v < vocab; v++) {
    const float x = logits[v];
    if (isnan(x)) continue;
    int32_t at = e->num_top;
    while (at > 0 && logits[e->top_ids[at - 1]] < x) at--;
    if (at >= k) continue;
    const int32_t last = e->num_top < k ? e->num_top : k - 1;
    for (int32_t j = last; j > at; j--) e->top_ids[j] = e->top_ids[j - 1];
    e->top_ids[at] = v;
    if (e->num_top < k) e->num_top++;
  }
  for (int32_t j = 0; j < e->num_top; j++) e->top_logprobs[j] = (float)((double)logits[e->top_ids[j]] - log_z);
}

void sched_emit_token(ina_scheduler_t *s, sched_request_t *r, int32_t token, const float *logits, int32_t vocab) {
  sched_event_t *e = &s->events[s->num_events++];
  e->req = r;
  e->token = token;
  e->num_generated = r->num_generated;
  e->logprob = NAN;
  e->num_top = 0;
  if (logits && r->logprobs >= 0) fill_logprobs(e, logits, vocab, token, r->logprobs);
}

void sched_finish(ina_scheduler_t *s, sched_request_t *r, ina_finish_reason_t reason, ina_status_t status,
                  const char *error) {
  if (r->importing) { /* its pages stay with the transfer that holds them (kv_handoff.c) */
    r->importing = 0;
    s->num_importing--;
  }
  r->finish = reason;
  r->status = status;
  snprintf(r->error, sizeof r->error, "%s", error ? error : "");
  ina_kv_seq_release(s->pool, &r->seq);
  r->num_computed = 0;
  s->events[s->num_events++] = (sched_event_t){.req = r, .token = -1, .num_generated = r->num_generated};
  s->finished[s->num_finished++] = r;
  s->counters.finished++;
}

void sched_unlink_finished_locked(ina_scheduler_t *s) {
  for (int32_t i = 0; i < s->num_finished; i++) {
    sched_request_t *r = s->finished[i];
    if (r->live_prev)
      r->live_prev->live_next = r->live_next;
    else
      s->live_head = r->live_next;
    if (r->live_next) r->live_next->live_prev = r->live_prev;
    r->live_prev = r->live_next = NULL;
    if (r->cancel_requested) s->pending_cancels--;
    s->num_live--;
  }
}

void sched_deliver(sched_request_t *r, const sched_event_t *e, double now) {
  if (!r->callback) return;
  ina_request_event_t ev;
  ina_request_metrics_t m;
  memset(&ev, 0, sizeof ev);
  ev.request_id = r->id;
  ev.token = e->token;
  ev.num_generated = e->num_generated;
  ev.error = "";
  ev.logprob = e->token >= 0 && r->logprobs >= 0 ? e->logprob : NAN;
  ev.num_top = e->token >= 0 && r->logprobs >= 0 ? e->num_top : 0;
  ev.top_ids = e->top_ids;
  ev.top_logprobs = e->top_logprobs;
  if (e->token < 0) {
    sched_request_metrics(r, now, &m);
    ev.finish = r->finish;
    ev.status = r->status;
    ev.error = r->error;
    ev.metrics = &m;
  }
  r->callback(&ev, r->user_data);
}

void sched_deliver_events(ina_scheduler_t *s) {
  const double now = sched_now();
  for (int32_t i = 0; i < s->num_events; i++)
    sched_deliver(s->events[i].req, &s->events[i], now);
  s->num_events = 0;
  for (int32_t i = 0; i < s->num_finished; i++) sched_request_free(s->pool, s->finished[i]);
  s->num_finished = 0;
}
