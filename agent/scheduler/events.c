/* Delivery of tokens and final events. A step queues them while it works and delivers
 * them at its end with no lock held, so a callback may call submit, cancel or stats.
 * Finished requests are unlinked from the live list (under mu) before their final event
 * is delivered: from then on cancel reports them unknown and their id may be reused. */
#define INA_LOG_SUBSYS "scheduler"
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

void sched_emit_token(ina_scheduler_t *s, sched_request_t *r, int32_t token) {
  s->events[s->num_events++] = (sched_event_t){r, token, r->num_generated};
}

void sched_finish(ina_scheduler_t *s, sched_request_t *r, ina_finish_reason_t reason, ina_status_t status,
                  const char *error) {
  r->finish = reason;
  r->status = status;
  snprintf(r->error, sizeof r->error, "%s", error ? error : "");
  ina_kv_seq_release(s->pool, &r->seq);
  r->num_computed = 0;
  s->events[s->num_events++] = (sched_event_t){r, -1, r->num_generated};
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

void sched_deliver(sched_request_t *r, int32_t token, int32_t num_generated, double now) {
  if (!r->callback) return;
  ina_request_event_t ev;
  ina_request_metrics_t m;
  memset(&ev, 0, sizeof ev);
  ev.request_id = r->id;
  ev.token = token;
  ev.num_generated = num_generated;
  ev.error = "";
  if (token < 0) {
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
    sched_deliver(s->events[i].req, s->events[i].token, s->events[i].num_generated, now);
  s->num_events = 0;
  for (int32_t i = 0; i < s->num_finished; i++) sched_request_free(s->pool, s->finished[i]);
  s->num_finished = 0;
}
