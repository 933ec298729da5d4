/* The KV hand-off of prefill/decode disaggregation (ina_kv_pages_t in scheduler.h):
 * pages lent to whoever moves their entries, given back from any thread, and the import
 * results that let a decode-side request go on from a first token sampled elsewhere.
 *
 * Lending takes a pool reference per page on the driver thread; a callee gives them
 * back through a list under mu, which the driver empties at its next take-in, so only
 * the driver ever touches the pool. */
#define INA_LOG_SUBSYS "scheduler"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

void sched_kv_lend(ina_scheduler_t *s, sched_request_t *r, ina_kv_pages_fn fn, int64_t num_tokens,
                   int64_t first_token, int32_t num_layers) {
  const int32_t n = (int32_t)((num_tokens + s->page_size - 1) / s->page_size);
  for (int32_t i = 0; i < n; i++) ina_page_pool_ref(s->pool, r->seq.pages[i]);
  s->kv_lent += n;
  if (fn == r->kv_import) {
    pthread_mutex_lock(&s->mu);
    r->import_lent = 1; /* from here ina_scheduler_import_done accepts its result */
    pthread_mutex_unlock(&s->mu);
  }
  const ina_kv_pages_t kv = {r->id, r->seq.pages, n, s->page_size, num_tokens, first_token, num_layers};
  fn(&kv, r->kv_user_data);
}

ina_status_t ina_scheduler_release_pages(ina_scheduler_t *s, const int32_t *pages, int32_t count) {
  ina_status_t st = INA_OK;
  int locked = 0;
  INA_REQUIRE(s != NULL && count >= 0 && (count == 0 || pages != NULL), INA_ERR_INVALID_ARGUMENT,
              "release pages: scheduler or pages is NULL, or count %d < 0", count);
  pthread_mutex_lock(&s->mu);
  locked = 1;
  if (s->num_released + count > s->released_capacity) {
    int32_t cap = s->released_capacity > 0 ? s->released_capacity : 64;
    while (cap < s->num_released + count) cap *= 2;
    int32_t *grown = realloc(s->released_pages, (size_t)cap * sizeof *grown);
    INA_CHECK_ALLOC(grown);
    s->released_pages = grown;
    s->released_capacity = cap;
  }
  memcpy(s->released_pages + s->num_released, pages, (size_t)count * sizeof *pages);
  s->num_released += count;
  pthread_cond_signal(&s->wake);
fail:
  if (locked) pthread_mutex_unlock(&s->mu);
  return st;
}

static sched_request_t *find_live_locked(ina_scheduler_t *s, const char *id) {
  for (sched_request_t *r = s->live_head; r; r = r->live_next)
    if (strcmp(r->id, id) == 0) return r;
  return NULL;
}

ina_status_t ina_scheduler_import_done(ina_scheduler_t *s, const char *request_id,
                                       const ina_kv_import_result_t *res) {
  ina_status_t st = INA_OK;
  int locked = 0;
  INA_REQUIRE(s != NULL && request_id != NULL && res != NULL, INA_ERR_INVALID_ARGUMENT,
              "import done: scheduler, request id or result is NULL");
  INA_REQUIRE(res->status != INA_OK || (res->token >= 0 && res->token < s->vocab), INA_ERR_INVALID_ARGUMENT,
              "import done: request '%s': token %d is outside the vocabulary [0, %d)", request_id, res->token,
              s->vocab);
  INA_REQUIRE(res->num_top >= 0 && res->num_top <= INA_REQUEST_MAX_LOGPROBS &&
                  (res->num_top == 0 || (res->top_ids && res->top_logprobs)),
              INA_ERR_INVALID_ARGUMENT, "import done: request '%s': num_top %d is out of range 0..%d", request_id,
              res->num_top, INA_REQUEST_MAX_LOGPROBS);
  pthread_mutex_lock(&s->mu);
  locked = 1;
  sched_request_t *r = find_live_locked(s, request_id);
  /* Its pages were lent to kv_import, and it has no result yet. */
  INA_REQUIRE(r != NULL && r->import_lent && !r->import_ready && !r->cancel_requested, INA_ERR_NOT_FOUND,
              "import done: no request '%s' waits for its KV entries", request_id);
  r->import_ready = 1;
  r->import_status = res->status;
  snprintf(r->import_error, sizeof r->import_error, "%s", res->error ? res->error : "");
  r->import_token = res->token;
  r->import_logprob = res->logprob;
  r->import_num_top = res->num_top;
  if (res->num_top > 0) {
    memcpy(r->import_top_ids, res->top_ids, (size_t)res->num_top * sizeof *res->top_ids);
    memcpy(r->import_top_logprobs, res->top_logprobs, (size_t)res->num_top * sizeof *res->top_logprobs);
  }
  s->pending_imports++;
  pthread_cond_signal(&s->wake);
fail:
  if (locked) pthread_mutex_unlock(&s->mu);
  return st;
}

/* r's entries arrived: its prompt counts as computed (and enters the prefix cache, as a
 * prompt computed here would), and its first token is delivered as if sampled here. */
static void import_succeeded(ina_scheduler_t *s, sched_request_t *r, double now) {
  r->num_computed = r->prompt_len;
  if (s->cache && r->prompt_len >= 2)
    ina_prefix_cache_insert(s->cache, r->tokens, r->prompt_len / s->page_size, r->seq.pages);
  ina_sampler_skip(r->sampler, 1);
  const ina_finish_reason_t reason = sched_request_add_token(r, r->import_token, now);
  s->counters.generated_tokens++;
  sched_emit_token(s, r, r->import_token, NULL, s->vocab);
  if (r->logprobs >= 0) {
    sched_event_t *e = &s->events[s->num_events - 1];
    e->logprob = r->import_logprob;
    e->num_top = r->import_num_top < r->logprobs ? r->import_num_top : r->logprobs;
    memcpy(e->top_ids, r->import_top_ids, (size_t)e->num_top * sizeof *e->top_ids);
    memcpy(e->top_logprobs, r->import_top_logprobs, (size_t)e->num_top * sizeof *e->top_logprobs);
  }
  if (reason != INA_FINISH_NONE) sched_finish(s, r, reason, INA_OK, NULL);
}

void sched_kv_take_in_locked(ina_scheduler_t *s, double now) {
  for (int32_t i = 0; i < s->num_released; i++) ina_page_pool_unref(s->pool, s->released_pages[i]);
  s->kv_lent -= s->num_released;
  s->num_released = 0;
  if (s->pending_imports == 0) return;
  s->pending_imports = 0; /* every result that arrived is applied below */
  int32_t kept = 0;
  for (int32_t i = 0; i < s->num_running; i++) {
    sched_request_t *r = s->running[i];
    if (r->importing && r->import_ready) {
      r->importing = 0;
      s->num_importing--;
      if (r->import_status == INA_OK)
        import_succeeded(s, r, now);
      else
        sched_finish(s, r, INA_FINISH_ERROR, r->import_status,
                     r->import_error[0] ? r->import_error : "the KV transfer failed");
    }
    if (r->finish == INA_FINISH_NONE) s->running[kept++] = r;
  }
  s->num_running = kept;
}

void sched_kv_free(ina_scheduler_t *s) {
  for (int32_t i = 0; i < s->num_released; i++) ina_page_pool_unref(s->pool, s->released_pages[i]);
  s->kv_lent -= s->num_released;
  s->num_released = 0;
  if (s->kv_lent > 0)
    INA_LOG_W(INA_LOG_SUBSYS, "destroy: %d KV page references lent to a transfer were not given back", s->kv_lent);
  free(s->released_pages);
  s->released_pages = NULL;
}
