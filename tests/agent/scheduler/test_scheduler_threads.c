/* The scheduler under concurrency: the run loop steps while several threads submit,
 * cancel (their own requests, finished ones, unknown ids) and read stats, and a callback
 * submits a follow-up request from the driver thread. Everything must finish without a
 * deadlock, each request with exactly one final event and no event after it, the
 * uncancelled ones with their reference tokens; the loop must go idle (no stepping
 * without work); and every page must come back.
 *
 * Why the test itself is race-free (what a thread sanitizer would check):
 *   - the check counters of test_util.h are not thread-safe, so only the main thread
 *     uses CHECK; worker threads record statuses in their own slots of `thread_result_t`,
 *     which main reads after pthread_join (join orders the writes before the reads);
 *   - a collector is written by the driver thread (callbacks) under its own mutex, and
 *     main reads it under that mutex while waiting, then freely after run_stop (which
 *     joins the run loop thread);
 *   - the follow-up chain's fields are written only by the driver thread and read by
 *     main after run_stop, for the same reason;
 *   - sched_test_current_step is only read here (by callbacks);
 *   - the scheduler's own shared state is behind its mutex: submit, cancel and stats
 *     lock it, the step takes requests in and publishes stats under it, and callbacks
 *     run with it released (so the follow-up submit cannot self-deadlock). */
#include <time.h>

#include "../../test_util.h"
#include "core/log.h"
#include "kvcache/page_pool.h"
#include "sched_test_util.h"

enum { THREADS = 3, PER_THREAD = 8, CHAIN = 3 };

typedef struct planned {
  int32_t prompt[24];
  int32_t prompt_len, max_new;
  int ignore_eos;
  int32_t ref[16];
  int32_t ref_len;
  float *ref_logits;
  sched_collector_t col;
} planned_t;

typedef struct thread_result {
  ina_status_t submit_status[PER_THREAD];
  ina_status_t cancel_status[PER_THREAD]; /* INA_OK: the cancel found it unfinished */
  int cancel_attempted[PER_THREAD];
  ina_status_t unknown_cancel_status;
  int64_t stats_calls;
} thread_result_t;

typedef struct worker {
  ina_scheduler_t *s;
  planned_t *reqs; /* [PER_THREAD] */
  thread_result_t result;
  uint64_t seed;
} worker_t;

static int32_t g_vocab, g_eos;

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

static void *submitter(void *arg) {
  worker_t *w = arg;
  test_rng_t rng = {w->seed};
  for (int k = 0; k < PER_THREAD; k++) {
    planned_t *p = &w->reqs[k];
    ina_request_t r = sched_test_request(&p->col, p->prompt, p->prompt_len, p->max_new);
    r.ignore_eos = p->ignore_eos;
    w->result.submit_status[k] = ina_scheduler_submit(w->s, &r);
    sleep_us((long)test_rng_int(&rng, 0, 1500));
    if (k > 0 && test_rng_int(&rng, 0, 2) == 0) {
      const int victim = (int)test_rng_int(&rng, 0, k);
      if (!w->result.cancel_attempted[victim]) {
        w->result.cancel_attempted[victim] = 1;
        w->result.cancel_status[victim] = ina_scheduler_cancel(w->s, w->reqs[victim].col.id);
      }
    }
    ina_scheduler_stats_t st;
    ina_scheduler_stats(w->s, &st);
    w->result.stats_calls++;
  }
  w->result.unknown_cancel_status = ina_scheduler_cancel(w->s, "nobody-has-this-id");
  return NULL;
}

/* A chain of requests, each submitted from the callback of the previous one's final
 * event (on the driver thread). */
typedef struct chain {
  ina_scheduler_t *s;
  int32_t prompt[6];
  sched_collector_t cols[CHAIN];
  ina_status_t submit_status[CHAIN];
} chain_t;

typedef struct chain_link {
  chain_t *chain;
  int index;
} chain_link_t;

static chain_link_t g_links[CHAIN];

static ina_status_t submit_link(chain_t *c, int i);

static void chain_callback(const ina_request_event_t *ev, void *user) {
  chain_link_t *link = user;
  sched_collect(ev, &link->chain->cols[link->index]);
  if (ev->finish != INA_FINISH_NONE && link->index + 1 < CHAIN)
    link->chain->submit_status[link->index + 1] = submit_link(link->chain, link->index + 1);
}

static ina_status_t submit_link(chain_t *c, int i) {
  ina_request_t r = sched_test_request(&c->cols[i], c->prompt, 6, 3);
  r.ignore_eos = 1;
  g_links[i] = (chain_link_t){c, i};
  r.callback = chain_callback;
  r.user_data = &g_links[i];
  return ina_scheduler_submit(c->s, &r);
}

static int finals_of(sched_collector_t *c) {
  pthread_mutex_lock(&c->mu);
  const int f = c->finals;
  pthread_mutex_unlock(&c->mu);
  return f;
}

static void test_concurrent(const ina_model_t *m, test_rng_t *rng) {
  static planned_t plans[THREADS][PER_THREAD];
  int32_t shared[16];
  for (int i = 0; i < 16; i++) shared[i] = (int32_t)test_rng_int(rng, 2, g_vocab - 1);
  ina_engine_t *ref = sched_test_engine(m, 4, 256);
  for (int t = 0; t < THREADS; t++)
    for (int k = 0; k < PER_THREAD; k++) {
      planned_t *p = &plans[t][k];
      char id[32];
      snprintf(id, sizeof id, "thread%d-req%d", t, k);
      sched_collector_init(&p->col, id);
      p->prompt_len = (int32_t)test_rng_int(rng, 1, 24);
      p->max_new = (int32_t)test_rng_int(rng, 1, 12);
      p->ignore_eos = (int)test_rng_int(rng, 0, 1);
      for (int32_t i = 0; i < p->prompt_len; i++)
        p->prompt[i] = i < 16 && test_rng_int(rng, 0, 1) ? shared[i] : (int32_t)test_rng_int(rng, 2, g_vocab - 1);
      const ina_sampling_params_t greedy = INA_SAMPLING_PARAMS_INIT;
      p->ref_logits = malloc((size_t)(p->prompt_len + p->max_new - 1) * (size_t)g_vocab * sizeof(float));
      p->ref_len = sched_test_reference(ref, p->prompt, p->prompt_len, p->max_new, &greedy, p->ignore_eos, p->ref,
                                        p->ref_logits);
    }
  ina_engine_destroy(ref);

  /* A small pool and budget, so that queuing, chunking and preemption happen too. */
  ina_engine_t *e = sched_test_engine(m, 4, 16);
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_batch_tokens = 12;
  config.max_running = 4;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) exit(1);
  CHECK_OK(ina_scheduler_run_start(s));

  static chain_t chain;
  memset(&chain, 0, sizeof chain);
  chain.s = s;
  for (int i = 0; i < 6; i++) chain.prompt[i] = (int32_t)test_rng_int(rng, 2, g_vocab - 1);
  for (int i = 0; i < CHAIN; i++) {
    char id[32];
    snprintf(id, sizeof id, "chain-%d", i);
    sched_collector_init(&chain.cols[i], id);
  }
  CHECK_OK(submit_link(&chain, 0));

  worker_t workers[THREADS];
  pthread_t threads[THREADS];
  for (int t = 0; t < THREADS; t++) {
    memset(&workers[t], 0, sizeof workers[t]);
    workers[t].s = s;
    workers[t].reqs = plans[t];
    workers[t].seed = test_rng_next(rng);
    CHECK(pthread_create(&threads[t], NULL, submitter, &workers[t]) == 0);
  }
  for (int t = 0; t < THREADS; t++) pthread_join(threads[t], NULL);

  /* Wait for every final event; a deadlock shows as a timeout here. */
  const time_t deadline = time(NULL) + 120;
  for (;;) {
    int pending = 0;
    for (int t = 0; t < THREADS; t++)
      for (int k = 0; k < PER_THREAD; k++) pending += finals_of(&plans[t][k].col) == 0;
    for (int i = 0; i < CHAIN; i++) pending += finals_of(&chain.cols[i]) == 0;
    if (pending == 0) break;
    if (time(NULL) > deadline) {
      fprintf(stderr, "test_scheduler_threads: %d requests still unfinished after 120 s: deadlock?\n", pending);
      exit(1);
    }
    sleep_us(2000);
  }
  /* Idle: with no work the loop sleeps on its condition variable and steps no more. */
  ina_scheduler_stats_t a, b;
  ina_scheduler_stats(s, &a);
  sleep_us(30000);
  ina_scheduler_stats(s, &b);
  CHECK(a.steps == b.steps && b.waiting == 0 && b.running == 0);
  ina_scheduler_run_stop(s);
  ina_scheduler_run_stop(s); /* a second stop is a no-op */

  int cancelled = 0, flips = 0;
  for (int t = 0; t < THREADS; t++) {
    const thread_result_t *res = &workers[t].result;
    CHECK(res->unknown_cancel_status == INA_ERR_NOT_FOUND);
    CHECK(res->stats_calls == PER_THREAD);
    for (int k = 0; k < PER_THREAD; k++) {
      planned_t *p = &plans[t][k];
      sched_collector_t *c = &p->col;
      CHECK(res->submit_status[k] == INA_OK);
      CHECKF(c->finals == 1, "%s: %d final events", c->id, c->finals);
      CHECK(c->events_after_final == 0 && c->count_mismatch == 0 && c->id_mismatch == 0);
      ina_finish_reason_t reason;
      const int32_t n_expected =
          sched_test_expected(p->ref, p->ref_len, p->max_new, NULL, 0, p->ignore_eos ? -1 : g_eos, &reason);
      const int was_cancelled = res->cancel_attempted[k] && res->cancel_status[k] == INA_OK;
      int flip = 0;
      CHECK(sched_test_greedy_agrees_upto(c, p->ref, n_expected, p->ref_logits, p->prompt_len, g_vocab,
                                          was_cancelled, &flip));
      flips += flip;
      if (was_cancelled) {
        /* Found unfinished: cancelled at the next step, unless that step finished it. */
        cancelled += c->finish == INA_FINISH_CANCELLED;
        CHECK(c->finish == INA_FINISH_CANCELLED || c->finish == reason || flip);
      } else {
        CHECK(c->finish == reason || flip);
        /* A cancel that found nothing came after the final event. */
        if (res->cancel_attempted[k]) CHECK(res->cancel_status[k] == INA_ERR_NOT_FOUND);
      }
    }
  }
  for (int i = 0; i < CHAIN; i++) {
    CHECK(chain.cols[i].finals == 1 && chain.cols[i].finish == INA_FINISH_LENGTH && chain.cols[i].num_tokens == 3);
    if (i > 0) CHECK(chain.submit_status[i] == INA_OK);
    if (i > 0) CHECK(memcmp(chain.cols[i].tokens, chain.cols[0].tokens, 3 * sizeof(int32_t)) == 0);
  }
  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  printf("concurrent: %lld steps, %lld preemptions, %lld cache hits, %d cancelled, %d near-tie flips\n",
         (long long)st.steps, (long long)st.preemptions, (long long)st.prefix_cache_hits, cancelled, flips);
  CHECK(st.finished == THREADS * PER_THREAD + CHAIN);
  CHECK_OK(ina_scheduler_flush_prefix_cache(s));
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  CHECK(ina_page_pool_free_pages(pool) == ina_page_pool_num_pages(pool));
  CHECK_OK(ina_page_pool_check(pool));

  /* Start and stop with no work; then destroy while the loop runs with work queued. */
  CHECK_OK(ina_scheduler_run_start(s));
  ina_scheduler_run_stop(s);
  sched_collector_t late[4];
  for (int i = 0; i < 4; i++) {
    char id[16];
    snprintf(id, sizeof id, "late-%d", i);
    sched_collector_init(&late[i], id);
    ina_request_t r = sched_test_request(&late[i], plans[0][0].prompt, plans[0][0].prompt_len, 12);
    CHECK_OK(ina_scheduler_submit(s, &r));
  }
  CHECK_OK(ina_scheduler_run_start(s));
  sleep_us(1000);
  ina_scheduler_destroy(s);
  for (int i = 0; i < 4; i++) {
    CHECK(late[i].finals == 1 && late[i].events_after_final == 0);
    sched_collector_destroy(&late[i]);
  }
  CHECK(ina_page_pool_free_pages(pool) == ina_page_pool_num_pages(pool));
  ina_engine_destroy(e);
  for (int t = 0; t < THREADS; t++)
    for (int k = 0; k < PER_THREAD; k++) {
      free(plans[t][k].ref_logits);
      sched_collector_destroy(&plans[t][k].col);
    }
  for (int i = 0; i < CHAIN; i++) sched_collector_destroy(&chain.cols[i]);
}

int main(void) {
  test_rng_t rng = {test_seed("test_scheduler_threads")};
  ina_model_t *m = sched_test_model(test_rng_next(&rng));
  g_vocab = ina_model_config(m)->vocab_size;
  g_eos = ina_model_config(m)->eos_token_id;
  test_concurrent(m, &rng);
  ina_model_destroy(m);
  return test_finish("test_scheduler_threads");
}
