/* One scheduling step: run waiting control commands (control.c), take in new requests
 * and cancellations, plan a continuous batch
 * (decodes, prefill chunks, admissions) within the token budget and the KV pool, run
 * one engine forward, sample, and queue the events to deliver.
 *
 * Planning happens on the driver thread without the lock: it alone touches the queues,
 * the pool and the prefix cache. Pages are never taken during planning: the plan
 * counts them (reserved_pages) and the engine's forward appends them, all or nothing.
 * A striped pool (attention data parallelism: a stripe per rank) is counted per stripe:
 * a request takes all its pages from its stripe, chosen at admission (the one with the
 * most pages available), and makes room by preempting requests of its own stripe. */
#define INA_LOG_SUBSYS "scheduler"
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "agent/scheduler/scheduler_internal.h"

static int is_prefilling(const sched_request_t *r) { return r->num_computed < r->prefill_len; }

static int32_t available_pages(const ina_scheduler_t *s, int32_t stripe) {
  return ina_page_pool_stripe_free(s->pool, stripe) - s->reserved_pages[stripe];
}

/* The stripe r's pages come from (0 with one stripe). */
static int32_t stripe_of(const ina_scheduler_t *s, const sched_request_t *r) {
  return ina_kv_seq_stripe(s->pool, &r->seq);
}

/* The stripe with the most pages available (the lowest of equals). */
static int32_t roomiest_stripe(const ina_scheduler_t *s) {
  int32_t best = 0;
  for (int32_t k = 1; k < s->stripes; k++)
    if (available_pages(s, k) > available_pages(s, best)) best = k;
  return best;
}

/* Tokens of a request to run this step, given what it still needs and the budget left;
 * 0 when it must wait. A decode token or a whole remaining prompt goes in one piece.
 * A longer prompt is split, but never into a single-token piece: the engine runs a
 * one-token step through the decode path, which rounds differently from prefill, and
 * chunking must not change the result. */
static int32_t chunk_tokens(int32_t needed, int32_t budget) {
  if (needed <= budget) return needed;
  int32_t n = budget;
  if (needed - n == 1) n--; /* leave two tokens, not one */
  return n >= 2 ? n : 0;
}

static void schedule(ina_scheduler_t *s, sched_request_t *r, int32_t tokens, int32_t pages) {
  r->step_tokens = tokens;
  r->step_pages = pages;
  s->budget -= tokens;
  s->reserved_pages[stripe_of(s, r)] += pages;
  s->batch_reqs[s->batch_size++] = r;
}

static void unschedule(ina_scheduler_t *s, sched_request_t *r) {
  int32_t k = 0;
  while (s->batch_reqs[k] != r) k++;
  memmove(s->batch_reqs + k, s->batch_reqs + k + 1, (size_t)(s->batch_size - k - 1) * sizeof *s->batch_reqs);
  s->batch_size--;
  s->budget += r->step_tokens;
  s->reserved_pages[stripe_of(s, r)] -= r->step_pages;
  r->step_tokens = r->step_pages = 0;
}

/* Preemption by recompute of running request i: its pages go back now and it returns to
 * the front of the queue. Everything it knows (prompt and generated tokens) becomes its
 * prompt; its sampler keeps its draw counter, so sampling resumes where it stopped. */
static void preempt(ina_scheduler_t *s, int32_t i) {
  sched_request_t *r = s->running[i];
  memmove(s->running + i, s->running + i + 1, (size_t)(s->num_running - i - 1) * sizeof *s->running);
  s->num_running--;
  if (r->step_tokens > 0) unschedule(s, r);
  ina_kv_seq_release(s->pool, &r->seq);
  r->num_computed = 0;
  r->prefill_len = r->num_tokens;
  r->preemptions++;
  s->counters.preemptions++;
  sched_queue_push_front(&s->waiting, r);
  INA_LOG_D(INA_LOG_SUBSYS, "request '%s' preempted after %d tokens (%d generated)", r->id, r->num_tokens,
            r->num_generated);
}

/* Make `pages` pages of its stripe available to running request r: evict unused prefix
 * cache pages, then preempt the youngest running requests of that stripe. 0 when r is
 * itself the youngest and still short: it then waits, keeping its pages. */
static int make_room(ina_scheduler_t *s, const sched_request_t *r, int32_t pages) {
  const int32_t stripe = stripe_of(s, r);
  for (;;) {
    const int32_t shortfall = pages - available_pages(s, stripe);
    if (shortfall <= 0) return 1;
    if (s->cache && ina_prefix_cache_evict(s->cache, shortfall) > 0) continue;
    /* Never one waiting for an import: a transfer writes into its pages. */
    int32_t youngest = s->num_running - 1;
    while (s->running[youngest] != r && (stripe_of(s, s->running[youngest]) != stripe || s->running[youngest]->importing))
      youngest--; /* r itself stops the search */
    if (s->running[youngest] == r) return 0;
    preempt(s, youngest);
  }
}

/* Running requests, oldest first: decodes (one token each) in a first pass, then the
 * prompt chunks of those still prefilling, so a long prompt never holds back the
 * decodes. Returns 1 when a request had to wait for pages. */
static int plan_running(ina_scheduler_t *s) {
  int blocked = 0;
  for (int pass = 0; pass < 2; pass++) {
    for (int32_t i = 0; i < s->num_running; i++) {
      sched_request_t *r = s->running[i];
      if (r->importing || r->step_tokens > 0 || is_prefilling(r) != (pass == 1)) continue;
      const int32_t n = chunk_tokens(r->num_tokens - r->num_computed, s->budget);
      if (n == 0) continue;
      const int32_t pages = (int32_t)ina_kv_seq_pages_needed(s->pool, &r->seq, n);
      if (!make_room(s, r, pages)) {
        blocked = 1;
        continue;
      }
      schedule(s, r, n, pages);
    }
  }
  return blocked;
}

static int32_t pages_for_tokens(int64_t tokens, int32_t page_size) {
  return (int32_t)((tokens + page_size - 1) / page_size);
}

/* Share the prefix cache's longest match for r's prompt into r's (empty) sequence.
 * Returns the number of pages shared. */
static int32_t share_cached_prefix(ina_scheduler_t *s, sched_request_t *r) {
  if (!s->cache || r->prefill_len < 2) return 0;
  /* Leave at least two prompt tokens to compute: the last one gives the logits, and a
   * single one would take the decode path (see chunk_tokens). */
  const int32_t max_pages = (r->prefill_len - 2) / s->page_size;
  const int32_t n = ina_prefix_cache_match(s->cache, r->tokens, max_pages, s->match_pages);
  if (n == 0) return 0;
  /* A view of the cached pages as a sequence (it owns no references); the fork takes
   * one reference per page for r. */
  const ina_kv_seq_t cached = {s->match_pages, n, n, (int64_t)n * s->page_size, 0};
  if (ina_kv_seq_fork(s->pool, &cached, cached.num_tokens, &r->seq) != INA_OK) return 0;
  return n;
}

/* Admit a kv_import request (scheduler.h): share what the prefix cache holds of its
 * prompt, take pages for the rest and lend them to kv_import. Nothing of it runs here
 * until the import is done. 0 when the pages are not free (it waits). */
static int admit_import(ina_scheduler_t *s, sched_request_t *r) {
  int32_t shared = 0;
  if (s->cache) { /* at least one token comes over: a transfer is never empty */
    const int32_t max_pages = (r->prompt_len - 1) / s->page_size;
    shared = ina_prefix_cache_match(s->cache, r->tokens, max_pages, s->match_pages);
    const ina_kv_seq_t cached = {s->match_pages, shared, shared, (int64_t)shared * s->page_size, 0};
    if (shared > 0 && ina_kv_seq_fork(s->pool, &cached, cached.num_tokens, &r->seq) != INA_OK) shared = 0;
  }
  if (shared == 0) r->seq.stripe_pick = 1 + roomiest_stripe(s);
  const int32_t stripe = stripe_of(s, r);
  const int32_t need = pages_for_tokens(r->prompt_len, s->page_size) - shared;
  if (need > available_pages(s, stripe) && s->cache) {
    const int32_t shortfall = need - available_pages(s, stripe);
    if (ina_prefix_cache_reclaimable(s->cache) >= shortfall) ina_prefix_cache_evict(s->cache, shortfall);
  }
  if (need > available_pages(s, stripe) ||
      ina_kv_seq_append(s->pool, &r->seq, r->prompt_len - (int64_t)shared * s->page_size) != INA_OK) {
    ina_kv_seq_release(s->pool, &r->seq);
    return 0;
  }
  r->num_computed = shared * s->page_size;
  r->importing = 1;
  s->num_importing++;
  sched_kv_lend(s, r, r->kv_import, r->prompt_len, r->num_computed, ina_page_pool_num_layers(s->pool));
  return 1;
}

/* Admit waiting requests in FIFO order while the budget, the running limit and the pool
 * allow. A request is admitted only when pages for its whole remaining prompt are free
 * (or can be freed from the prefix cache); otherwise it and everything behind it wait. */
static void plan_admissions(ina_scheduler_t *s, double now) {
  while (s->waiting.count > 0 && s->num_running < s->max_running && s->budget > 0) {
    sched_request_t *r = sched_queue_at(&s->waiting, 0);
    if (r->kv_import) {
      if (!admit_import(s, r)) return;
      sched_queue_pop_front(&s->waiting);
      s->running[s->num_running++] = r;
      if (r->t_admit < 0) r->t_admit = now;
      if (s->cache) {
        s->counters.prefix_cache_queries++;
        s->counters.prefix_cache_hits += r->num_computed > 0;
        s->counters.prefix_cache_hit_tokens += r->num_computed;
      }
      r->cached_tokens += r->num_computed;
      continue;
    }
    const int32_t shared = share_cached_prefix(s, r);
    r->num_computed = shared * s->page_size;
    /* A shared prefix fixes the stripe; else the one with the most room. */
    if (shared == 0) r->seq.stripe_pick = 1 + roomiest_stripe(s);
    const int32_t stripe = stripe_of(s, r);
    const int32_t n = chunk_tokens(r->prefill_len - r->num_computed, s->budget);
    const int32_t need = pages_for_tokens(r->prefill_len, s->page_size) - shared;
    if (n > 0 && need > available_pages(s, stripe) && s->cache) {
      const int32_t shortfall = need - available_pages(s, stripe);
      if (ina_prefix_cache_reclaimable(s->cache) >= shortfall) ina_prefix_cache_evict(s->cache, shortfall);
    }
    if (n == 0 || need > available_pages(s, stripe)) {
      ina_kv_seq_release(s->pool, &r->seq);
      r->num_computed = 0;
      return;
    }
    sched_queue_pop_front(&s->waiting);
    s->running[s->num_running++] = r;
    if (r->t_admit < 0) r->t_admit = now;
    if (s->cache) {
      s->counters.prefix_cache_queries++;
      s->counters.prefix_cache_hits += shared > 0;
      s->counters.prefix_cache_hit_tokens += r->num_computed;
    }
    r->cached_tokens += r->num_computed;
    schedule(s, r, n, (int32_t)ina_kv_seq_pages_needed(s->pool, &r->seq, n));
  }
}

/* Requests whose cancel flag is set finish now, wherever they are (caller holds mu:
 * the flags are shared). */
static void apply_cancellations_locked(ina_scheduler_t *s) {
  for (int32_t i = 0; i < s->waiting.count;) {
    sched_request_t *r = sched_queue_at(&s->waiting, i);
    if (!r->cancel_requested) {
      i++;
      continue;
    }
    sched_queue_remove_at(&s->waiting, i);
    if (s->replica_role == SCHED_REPLICA_LEADER) s->step_cancelled[s->num_step_cancelled++] = r;
    sched_finish(s, r, INA_FINISH_CANCELLED, INA_OK, NULL);
  }
  int32_t kept = 0;
  for (int32_t i = 0; i < s->num_running; i++) {
    sched_request_t *r = s->running[i];
    if (r->cancel_requested) {
      if (s->replica_role == SCHED_REPLICA_LEADER) s->step_cancelled[s->num_step_cancelled++] = r;
      sched_finish(s, r, INA_FINISH_CANCELLED, INA_OK, NULL);
    } else {
      s->running[kept++] = r;
    }
  }
  s->num_running = kept;
}

/* Every unfinished request ends with status st: waiting and running alike (their events
 * were reserved by take_in_locked). */
static void fail_live(ina_scheduler_t *s, ina_status_t st, const char *reason) {
  while (s->waiting.count > 0) sched_finish(s, sched_queue_pop_front(&s->waiting), INA_FINISH_ERROR, st, reason);
  for (int32_t i = 0; i < s->num_running; i++) sched_finish(s, s->running[i], INA_FINISH_ERROR, st, reason);
  s->num_running = 0;
}

/* Move submitted requests into the waiting queue and apply cancellations. */
static ina_status_t take_in_locked(ina_scheduler_t *s) {
  ina_status_t st = INA_OK;
  const int32_t total = s->waiting.count + s->num_running + s->num_incoming;
  INA_CHECK(sched_queue_reserve(&s->waiting, total));
  /* Import results add a token and perhaps a final event before the step's own. */
  INA_CHECK(sched_events_reserve(s, total + s->pending_imports));
  INA_CHECK(sched_replica_reserve(s, total));
  for (sched_request_t *r = s->incoming_head, *next; r; r = next) {
    next = r->incoming_next;
    r->incoming_next = NULL;
    sched_queue_push_back(&s->waiting, r);
    if (s->replica_role == SCHED_REPLICA_LEADER) s->step_new[s->num_step_new++] = r;
  }
  s->incoming_head = s->incoming_tail = NULL;
  s->num_incoming = 0;
  if (s->pending_cancels > 0) apply_cancellations_locked(s);
  sched_kv_take_in_locked(s, sched_now());
  sched_publish_locked(s); /* stats count the arrivals as waiting while this step runs */
fail:
  return st;
}

/* Sample where a request's known tokens are all computed; insert finished prompts into
 * the prefix cache; finish what is done. */
static void after_forward(ina_scheduler_t *s, double now) {
  for (int32_t k = 0; k < s->batch_size; k++) {
    sched_request_t *r = s->batch_reqs[k];
    const int was_prefilling = is_prefilling(r);
    r->num_computed += r->step_tokens;
    if (was_prefilling)
      s->counters.prefill_tokens += r->step_tokens;
    else
      s->counters.decode_tokens += r->step_tokens;
    r->step_tokens = r->step_pages = 0;
    /* A prompt just computed on the prefill path: its full pages are reusable. (A
     * one-token prompt took the decode path, whose entries round differently.) */
    if (was_prefilling && !is_prefilling(r) && s->cache && r->prefill_len >= 2)
      ina_prefix_cache_insert(s->cache, r->tokens, r->prefill_len / s->page_size, r->seq.pages);
    /* Prompt entries computed: a prefill side lends them to its transfer. */
    if (was_prefilling && r->kv_export)
      sched_kv_lend(s, r, r->kv_export, r->num_computed < r->prompt_len ? r->num_computed : r->prompt_len, 0,
                    ina_page_pool_num_layers(s->pool));
    if (r->num_computed < r->num_tokens) continue; /* a prompt chunk: nothing to sample yet */
    int32_t token = -1;
    ina_status_t st = INA_OK;
    if (!s->batch_greedy)
      st = ina_sampler_sample(r->sampler, s->logits + (int64_t)k * s->vocab, &token);
    else if ((token = s->greedy_tokens[k]) < 0) { /* the engine's mark of a row of NaN logits */
      ina_error(INA_LOG_SUBSYS, "sampler: all %d logits are NaN", (int)s->vocab);
      st = INA_ERR_INVALID_ARGUMENT;
    }
    if (st != INA_OK) {
      sched_finish(s, r, INA_FINISH_ERROR, st, ina_last_error());
      continue;
    }
    const ina_finish_reason_t reason = sched_request_add_token(r, token, now);
    s->counters.generated_tokens++;
    sched_emit_token(s, r, token, s->batch_greedy ? NULL : s->logits + (int64_t)k * s->vocab, s->vocab);
    if (reason != INA_FINISH_NONE) sched_finish(s, r, reason, INA_OK, NULL);
  }
}

static void drop_finished_running(ina_scheduler_t *s) {
  int32_t kept = 0;
  for (int32_t i = 0; i < s->num_running; i++)
    if (s->running[i]->finish == INA_FINISH_NONE) s->running[kept++] = s->running[i];
  s->num_running = kept;
}

/* The engine's layer hook while a step computes prompt tokens of kv_export requests:
 * each layer but the last (after_forward reports all of them) goes out as it is done. */
static void on_layer_done(int32_t layer, void *user) {
  ina_scheduler_t *s = user;
  if (layer + 1 >= ina_page_pool_num_layers(s->pool)) return;
  for (int32_t k = 0; k < s->batch_size; k++) {
    sched_request_t *r = s->batch_reqs[k];
    if (!r->kv_export || !is_prefilling(r)) continue;
    const int32_t upto = r->num_computed + r->step_tokens;
    sched_kv_lend(s, r, r->kv_export, upto < r->prompt_len ? upto : r->prompt_len, 0, layer + 1);
  }
}

static ina_status_t run_batch(ina_scheduler_t *s) {
  ina_status_t st = INA_OK;
  s->qo_indptr[0] = 0;
  for (int32_t k = 0; k < s->batch_size; k++) {
    sched_request_t *r = s->batch_reqs[k];
    s->batch_seqs[k] = &r->seq;
    memcpy(s->batch_tokens + s->qo_indptr[k], r->tokens + r->num_computed, (size_t)r->step_tokens * sizeof(int32_t));
    s->qo_indptr[k + 1] = s->qo_indptr[k] + r->step_tokens;
  }
  const ina_batch_t batch = {s->batch_size, s->batch_seqs, s->qo_indptr, s->batch_tokens, 0};
  /* Greedy requests need only each row's argmax (the sampler's greedy choice): when every
   * request of the step is greedy, the engine returns the tokens instead of the logits
   * (a GPU then copies 4 bytes a row instead of the vocabulary's f32 logits). */
  s->batch_greedy = 1;
  for (int32_t k = 0; k < s->batch_size; k++)
    s->batch_greedy &= s->batch_reqs[k]->sampling.temperature == 0.0f && s->batch_reqs[k]->logprobs < 0;
  int exporting = 0;
  for (int32_t k = 0; k < s->batch_size; k++) exporting |= s->batch_reqs[k]->kv_export && is_prefilling(s->batch_reqs[k]);
  if (exporting) ina_engine_set_layer_hook(s->engine, on_layer_done, s);
  if (s->batch_greedy)
    st = ina_engine_forward_greedy(s->engine, &batch, s->greedy_tokens);
  else
    st = ina_engine_forward(s->engine, &batch, s->logits);
  if (exporting) ina_engine_set_layer_hook(s->engine, NULL, NULL);
  return st;
}

ina_status_t sched_step(ina_scheduler_t *s, int32_t *num_scheduled) {
  /* Who is inside the step: a control command issued from here would wait for itself. */
  pthread_mutex_lock(&s->mu);
  s->step_thread = pthread_self();
  s->in_step = 1;
  pthread_mutex_unlock(&s->mu);
  /* Commands first, so this step already runs with their effect. */
  ina_status_t st = sched_control_run_waiting(s);
  if (st == INA_OK) {
    pthread_mutex_lock(&s->mu);
    st = take_in_locked(s);
    pthread_mutex_unlock(&s->mu);
  }
  /* Replicas take in the same before planning (replica.c); if they cannot be told, the
   * step runs nothing: its engines would wait for them in vain. A replica link that broke
   * (a follower stopped answering) takes every request with it: none of them can run
   * again, and leaving them live would have the run loop retry the broken link forever. */
  if (st == INA_OK) {
    st = sched_replica_send_step(s);
    if (st != INA_OK && ina_comm_is_broken(s->replica_comm)) {
      char reason[256];
      snprintf(reason, sizeof reason, "the replicas no longer follow: %s", ina_last_error());
      fail_live(s, st, reason);
    }
  }

  const double t0 = sched_now();
  s->batch_size = 0;
  s->budget = s->max_batch_tokens;
  memset(s->reserved_pages, 0, (size_t)s->stripes * sizeof *s->reserved_pages);
  if (st == INA_OK) {
    const int blocked = plan_running(s);
    /* Admit nobody while a running request waits for pages: newcomers would take them. */
    if (!blocked) plan_admissions(s, t0);
  }
  if (st == INA_OK && s->batch_size > 0) {
    st = run_batch(s);
    if (st == INA_OK) {
      after_forward(s, sched_now());
    } else {
      /* The engine left every sequence as it was; the batch's requests fail. */
      char reason[256];
      snprintf(reason, sizeof reason, "%s", ina_last_error());
      for (int32_t k = 0; k < s->batch_size; k++) sched_finish(s, s->batch_reqs[k], INA_FINISH_ERROR, st, reason);
    }
    drop_finished_running(s);
    s->counters.steps++;
    s->counters.busy_seconds += sched_now() - t0;
  }
  if (num_scheduled) *num_scheduled = s->batch_size;

  pthread_mutex_lock(&s->mu);
  sched_unlink_finished_locked(s);
  sched_publish_locked(s);
  pthread_mutex_unlock(&s->mu);
  sched_deliver_events(s);
  pthread_mutex_lock(&s->mu);
  s->in_step = 0;
  pthread_mutex_unlock(&s->mu);
  return st;
}
