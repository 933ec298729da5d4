/* The scheduler's lifetime and its any-thread entry points: create, destroy, submit,
 * cancel, stats. The step is in step.c, the run loop in run_loop.c, control commands in
 * control.c. */
#define INA_LOG_SUBSYS "scheduler"
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

/* Bytes of the version-1 config: everything up to and including prefix_cache_pages. */
#define CONFIG_V1_SIZE (offsetof(ina_scheduler_config_t, prefix_cache_pages) + sizeof(int32_t))
#define CONFIG_V2_SIZE (offsetof(ina_scheduler_config_t, heartbeat_seconds) + sizeof(double))
#define CONFIG_V3_SIZE (offsetof(ina_scheduler_config_t, control_user_data) + sizeof(void *))

double sched_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

const char *ina_finish_reason_string(ina_finish_reason_t reason) {
  switch (reason) {
    case INA_FINISH_NONE: return "none";
    case INA_FINISH_LENGTH: return "length";
    case INA_FINISH_STOP: return "stop";
    case INA_FINISH_EOS: return "eos";
    case INA_FINISH_CANCELLED: return "cancelled";
    case INA_FINISH_ERROR: return "error";
  }
  return "unknown";
}

void sched_publish_locked(ina_scheduler_t *s) {
  ina_scheduler_stats_t *o = &s->snapshot;
  *o = s->counters;
  o->waiting = s->waiting.count;
  o->running = s->num_running;
  o->kv_pages_total = ina_page_pool_num_pages(s->pool);
  o->kv_pages_free = ina_page_pool_free_pages(s->pool);
  o->kv_pages_used = o->kv_pages_total - o->kv_pages_free;
  o->prefix_cache_pages = ina_prefix_cache_num_pages(s->cache);
  o->kv_pages_lent = s->kv_lent;
  o->importing = s->num_importing;
}

ina_status_t ina_scheduler_create(ina_engine_t *engine, const ina_scheduler_config_t *config, ina_scheduler_t **out) {
  ina_status_t st = INA_OK;
  ina_scheduler_t *s = NULL;
  const ina_scheduler_config_t defaults = INA_SCHEDULER_CONFIG_INIT;
  int mu_ready = 0, wake_ready = 0, control_done_ready = 0;
  INA_REQUIRE(out != NULL && engine != NULL, INA_ERR_INVALID_ARGUMENT, "scheduler: engine or out is NULL");
  *out = NULL;
  if (!config) config = &defaults;
  INA_REQUIRE_VERSIONED(config, CONFIG_V1_SIZE, "scheduler config", "INA_SCHEDULER_CONFIG_INIT");
  INA_REQUIRE(config->max_batch_tokens >= 3, INA_ERR_INVALID_ARGUMENT,
              "scheduler config: max_batch_tokens %d must be >= 3", config->max_batch_tokens);
  INA_REQUIRE(config->max_running >= 1, INA_ERR_INVALID_ARGUMENT, "scheduler config: max_running %d must be >= 1",
              config->max_running);
  ina_page_pool_t *pool = ina_engine_page_pool(engine);
  const ina_model_config_t *mc = ina_engine_config(engine);
  const int32_t page_size = ina_page_pool_page_size(pool), num_pages = ina_page_pool_num_pages(pool);
  /* A request's pages all come from one stripe of the pool: the smallest bounds it. */
  const int32_t stripes = ina_page_pool_stripes(pool), stripe_pages = num_pages / stripes;
  const int64_t pool_tokens = (int64_t)page_size * stripe_pages;
  int64_t max_context = config->max_context;
  if (max_context == 0) {
    max_context = mc->max_position_embeddings > 0 ? mc->max_position_embeddings : pool_tokens;
    if (max_context > pool_tokens) max_context = pool_tokens;
  }
  INA_REQUIRE(max_context >= 2 && max_context <= pool_tokens, INA_ERR_INVALID_ARGUMENT,
              "scheduler config: max_context %lld must be in [2, %lld] (the KV pool's %d pages of %d tokens%s)",
              (long long)max_context, (long long)pool_tokens, stripe_pages, page_size,
              stripes > 1 ? " in one stripe: a request's pages come from one" : "");
  int32_t cache_pages = config->prefix_cache_pages < 0 ? num_pages / 2 : config->prefix_cache_pages;
  INA_REQUIRE(cache_pages <= num_pages, INA_ERR_INVALID_ARGUMENT,
              "scheduler config: prefix_cache_pages %d exceeds the pool's %d pages", cache_pages, num_pages);

  s = calloc(1, sizeof *s);
  INA_CHECK_ALLOC(s);
  s->engine = engine;
  s->pool = pool;
  s->page_size = page_size;
  s->stripes = ina_page_pool_stripes(pool);
  s->vocab = mc->vocab_size;
  s->eos = mc->eos_token_id;
  s->max_batch_tokens = config->max_batch_tokens;
  s->max_running = config->max_running;
  s->max_context = max_context;
  if (config->struct_size >= CONFIG_V2_SIZE && config->replica_comm &&
      ina_comm_size(config->replica_comm) > 1) {
    s->replica_comm = config->replica_comm;
    s->replica_role =
        ina_comm_rank(config->replica_comm) == 0 ? SCHED_REPLICA_LEADER : SCHED_REPLICA_FOLLOWER;
    s->heartbeat_seconds = config->heartbeat_seconds > 0 ? config->heartbeat_seconds : 1.0;
  }
  if (config->struct_size >= CONFIG_V3_SIZE) {
    s->control = config->control;
    s->control_user_data = config->control_user_data;
  }
  INA_CHECK(sched_replica_init(s));
  if (cache_pages > 0) INA_CHECK(ina_prefix_cache_create(pool, cache_pages, &s->cache));
  const size_t R = (size_t)s->max_running;
  s->running = malloc(R * sizeof *s->running);
  s->batch_reqs = malloc(R * sizeof *s->batch_reqs);
  s->batch_seqs = malloc(R * sizeof *s->batch_seqs);
  s->qo_indptr = malloc((R + 1) * sizeof *s->qo_indptr);
  s->batch_tokens = malloc((size_t)s->max_batch_tokens * sizeof *s->batch_tokens);
  s->logits = ina_engine_logits_alloc(engine, (int64_t)R); /* page-locked for a GPU engine */
  s->greedy_tokens = malloc(R * sizeof *s->greedy_tokens);
  s->reserved_pages = calloc((size_t)s->stripes, sizeof *s->reserved_pages);
  s->match_pages = malloc((size_t)num_pages * sizeof *s->match_pages);
  INA_CHECK_ALLOC(s->running);
  INA_CHECK_ALLOC(s->batch_reqs);
  INA_CHECK_ALLOC(s->batch_seqs);
  INA_CHECK_ALLOC(s->qo_indptr);
  INA_CHECK_ALLOC(s->batch_tokens);
  INA_CHECK_ALLOC(s->logits);
  INA_CHECK_ALLOC(s->greedy_tokens);
  INA_CHECK_ALLOC(s->reserved_pages);
  INA_CHECK_ALLOC(s->match_pages);
  INA_REQUIRE(pthread_mutex_init(&s->mu, NULL) == 0, INA_ERR_INTERNAL, "scheduler: pthread_mutex_init failed");
  mu_ready = 1;
  INA_REQUIRE(pthread_cond_init(&s->wake, NULL) == 0, INA_ERR_INTERNAL, "scheduler: pthread_cond_init failed");
  wake_ready = 1;
  INA_REQUIRE(pthread_cond_init(&s->control_done, NULL) == 0, INA_ERR_INTERNAL,
              "scheduler: pthread_cond_init failed");
  control_done_ready = 1;
  sched_publish_locked(s); /* nobody else can see s yet */
  *out = s;
  return INA_OK;
fail:
  if (control_done_ready) pthread_cond_destroy(&s->control_done);
  if (wake_ready) pthread_cond_destroy(&s->wake);
  if (mu_ready) pthread_mutex_destroy(&s->mu);
  if (s) {
    ina_prefix_cache_destroy(s->cache);
    free(s->running);
    free(s->batch_reqs);
    free(s->batch_seqs);
    free(s->qo_indptr);
    free(s->batch_tokens);
    ina_engine_logits_free(s->engine, s->logits);
    free(s->greedy_tokens);
    free(s->reserved_pages);
    free(s->match_pages);
    sched_replica_free(s);
    free(s);
  }
  return st;
}

/* Finish a request that destroy found unfinished: pages back, final event, free. */
static void cancel_at_destroy(ina_scheduler_t *s, sched_request_t *r) {
  r->finish = INA_FINISH_CANCELLED;
  r->status = INA_OK;
  r->error[0] = '\0';
  ina_kv_seq_release(s->pool, &r->seq);
  const sched_event_t final = {.req = r, .token = -1, .num_generated = r->num_generated};
  sched_deliver(r, &final, sched_now());
  sched_request_free(s->pool, r);
}

void ina_scheduler_destroy(ina_scheduler_t *s) {
  if (!s) return;
  /* Commands waiting now will not run; one the run loop is running finishes first. */
  pthread_mutex_lock(&s->mu);
  sched_control_cancel_waiting_locked(s, "the scheduler is being destroyed");
  pthread_mutex_unlock(&s->mu);
  ina_scheduler_run_stop(s);
  sched_replica_send_stop(s); /* followers cancel their copies the same way */
  /* From here submit and control are refused and cancel finds nothing, also from the
   * callbacks run below: the lists are emptied under mu before any callback runs. */
  pthread_mutex_lock(&s->mu);
  s->closing = 1;
  sched_control_cancel_waiting_locked(s, "the scheduler is being destroyed");
  sched_control_wait_callers_locked(s); /* they sleep on mu and control_done */
  sched_request_t *incoming = s->incoming_head;
  s->incoming_head = s->incoming_tail = NULL;
  s->live_head = NULL;
  s->num_live = s->num_incoming = 0;
  pthread_mutex_unlock(&s->mu);
  while (s->num_running > 0) cancel_at_destroy(s, s->running[--s->num_running]);
  while (s->waiting.count > 0) cancel_at_destroy(s, sched_queue_pop_front(&s->waiting));
  while (incoming) {
    sched_request_t *next = incoming->incoming_next;
    cancel_at_destroy(s, incoming);
    incoming = next;
  }
  sched_kv_free(s);
  ina_prefix_cache_destroy(s->cache);
  sched_queue_release(&s->waiting);
  pthread_cond_destroy(&s->control_done);
  pthread_cond_destroy(&s->wake);
  pthread_mutex_destroy(&s->mu);
  free(s->running);
  free(s->batch_reqs);
  free(s->batch_seqs);
  free(s->qo_indptr);
  free(s->batch_tokens);
  ina_engine_logits_free(s->engine, s->logits);
  free(s->greedy_tokens);
  free(s->reserved_pages);
  free(s->match_pages);
  free(s->events);
  free(s->finished);
  sched_replica_free(s);
  free(s);
}

static sched_request_t *find_live_locked(const ina_scheduler_t *s, const char *id) {
  for (sched_request_t *r = s->live_head; r; r = r->live_next)
    if (strcmp(r->id, id) == 0) return r;
  return NULL;
}

ina_status_t ina_scheduler_submit(ina_scheduler_t *s, const ina_request_t *request) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s != NULL, INA_ERR_INVALID_ARGUMENT, "submit: scheduler is NULL");
  INA_REQUIRE(s->replica_role != SCHED_REPLICA_FOLLOWER, INA_ERR_INVALID_ARGUMENT,
              "submit: this scheduler follows rank 0; submit there");
  INA_CHECK(sched_enqueue(s, request));
fail:
  return st;
}

ina_status_t sched_enqueue(ina_scheduler_t *s, const ina_request_t *request) {
  ina_status_t st = INA_OK;
  sched_request_t *r = NULL;
  int locked = 0;
  INA_CHECK(sched_request_create(s, request, sched_now(), &r));
  pthread_mutex_lock(&s->mu);
  locked = 1;
  INA_REQUIRE(!s->closing, INA_ERR_INVALID_ARGUMENT, "request '%s': the scheduler is shutting down", r->id);
  INA_REQUIRE(find_live_locked(s, r->id) == NULL, INA_ERR_INVALID_ARGUMENT,
              "request '%s': id is already used by an unfinished request", r->id);
  if (s->incoming_tail)
    s->incoming_tail->incoming_next = r;
  else
    s->incoming_head = r;
  s->incoming_tail = r;
  s->num_incoming++;
  r->live_next = s->live_head;
  if (s->live_head) s->live_head->live_prev = r;
  s->live_head = r;
  s->num_live++;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->mu);
  return INA_OK;
fail:
  if (locked) pthread_mutex_unlock(&s->mu);
  sched_request_free(NULL, r);
  return st;
}

ina_status_t ina_scheduler_cancel(ina_scheduler_t *s, const char *request_id) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s != NULL && request_id != NULL, INA_ERR_INVALID_ARGUMENT, "cancel: scheduler or request id is NULL");
  INA_REQUIRE(s->replica_role != SCHED_REPLICA_FOLLOWER, INA_ERR_INVALID_ARGUMENT,
              "cancel: this scheduler follows rank 0; cancel there");
  return sched_cancel(s, request_id);
fail:
  return st;
}

ina_status_t sched_cancel(ina_scheduler_t *s, const char *request_id) {
  pthread_mutex_lock(&s->mu);
  sched_request_t *r = find_live_locked(s, request_id);
  if (r && !r->cancel_requested) {
    r->cancel_requested = 1;
    s->pending_cancels++;
    pthread_cond_signal(&s->wake);
  }
  pthread_mutex_unlock(&s->mu);
  /* Not an error worth logging: the request may just have finished. */
  if (!r) {
    INA_LOG_D(INA_LOG_SUBSYS, "cancel: no unfinished request '%s'", request_id);
    return INA_ERR_NOT_FOUND;
  }
  return INA_OK;
}

void ina_scheduler_stats(ina_scheduler_t *s, ina_scheduler_stats_t *out) {
  if (!s || !out) return;
  pthread_mutex_lock(&s->mu);
  *out = s->snapshot;
  out->waiting += s->num_incoming;
  pthread_mutex_unlock(&s->mu);
  if (out->busy_seconds > 0) {
    out->generated_tokens_per_second = (double)out->generated_tokens / out->busy_seconds;
    out->tokens_per_second = (double)(out->prefill_tokens + out->decode_tokens) / out->busy_seconds;
  }
}

/* Claim the driver role for a call of the driver API; INA_ERR_INVALID_ARGUMENT while the
 * run loop drives or another thread steps. */
static ina_status_t claim_driver(ina_scheduler_t *s, const char *what) {
  ina_status_t st = INA_OK;
  pthread_mutex_lock(&s->mu);
  const int run = s->run_started, busy = s->stepping;
  if (!run && !busy) s->stepping = 1;
  pthread_mutex_unlock(&s->mu);
  INA_REQUIRE(!run, INA_ERR_INVALID_ARGUMENT, "scheduler %s: the run loop is driving this scheduler", what);
  INA_REQUIRE(!busy, INA_ERR_INVALID_ARGUMENT, "scheduler %s: another thread is stepping this scheduler", what);
fail:
  return st;
}

static void release_driver(ina_scheduler_t *s) {
  pthread_mutex_lock(&s->mu);
  s->stepping = 0;
  pthread_mutex_unlock(&s->mu);
}

ina_status_t ina_scheduler_step(ina_scheduler_t *s, int32_t *num_scheduled) {
  ina_status_t st = INA_OK;
  if (num_scheduled) *num_scheduled = 0;
  INA_REQUIRE(s != NULL, INA_ERR_INVALID_ARGUMENT, "scheduler step: scheduler is NULL");
  INA_CHECK(claim_driver(s, "step"));
  st = sched_step(s, num_scheduled);
  release_driver(s);
fail:
  return st;
}

ina_status_t ina_scheduler_flush_prefix_cache(ina_scheduler_t *s) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(s != NULL, INA_ERR_INVALID_ARGUMENT, "flush prefix cache: scheduler is NULL");
  INA_REQUIRE(s->replica_role == SCHED_REPLICA_NONE, INA_ERR_UNSUPPORTED,
              "flush prefix cache: not on a replicated scheduler (the replicas would diverge)");
  INA_CHECK(claim_driver(s, "flush prefix cache"));
  if (s->cache) ina_prefix_cache_clear(s->cache);
  pthread_mutex_lock(&s->mu);
  sched_publish_locked(s);
  s->stepping = 0;
  pthread_mutex_unlock(&s->mu);
fail:
  return st;
}
