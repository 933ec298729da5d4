/* The scheduler on the CPU engine with the tiny model, driven step by step from this
 * thread: requests through the scheduler produce the tokens they produce alone through
 * ina_generate, whatever the batching, chunked prefill, queuing, preemption and prefix
 * reuse; cancellation returns pages at once; FIFO admission is not overtaken;
 * submissions are validated. (Threads and the run loop: test_scheduler_threads.c.) */
#include "../../test_util.h"
#include "core/log.h"
#include "kvcache/page_pool.h"
#include "sched_test_util.h"

#define MAX_PROMPT 64
#define MAX_NEW 48

typedef struct req_case {
  int32_t prompt[MAX_PROMPT];
  int32_t prompt_len, max_new;
  int32_t stop_ids[2];
  int32_t num_stop_ids;
  int ignore_eos;
  ina_sampling_params_t sampling;
  int64_t arrival; /* step before which it is submitted */
  int32_t ref[MAX_NEW];
  int32_t ref_len;
  float *ref_logits; /* [prompt_len + max_new - 1, vocab] */
  sched_collector_t col;
} req_case_t;

static int32_t g_vocab, g_eos;

static void random_tokens(test_rng_t *rng, int32_t *out, int32_t n) {
  /* Avoid the eos id in prompts only for readability of failures; it is legal. */
  for (int32_t i = 0; i < n; i++) out[i] = (int32_t)test_rng_int(rng, 2, g_vocab - 1);
}

static void case_init(req_case_t *c, const char *id) {
  memset(c, 0, sizeof *c);
  c->sampling = (ina_sampling_params_t)INA_SAMPLING_PARAMS_INIT;
  sched_collector_init(&c->col, id);
}

/* Reference run of every case alone on its own engine (same page size). */
static void compute_references(const ina_model_t *m, req_case_t *cases, int32_t n, int32_t page_size) {
  ina_engine_t *ref = sched_test_engine(m, page_size, 4096 / page_size + 1);
  for (int32_t i = 0; i < n; i++) {
    req_case_t *c = &cases[i];
    c->ref_logits = malloc((size_t)(c->prompt_len + c->max_new - 1) * (size_t)g_vocab * sizeof(float));
    c->ref_len = sched_test_reference(ref, c->prompt, c->prompt_len, c->max_new, &c->sampling, c->ignore_eos,
                                      c->ref, c->ref_logits);
  }
  ina_engine_destroy(ref);
}

static void free_cases(req_case_t *cases, int32_t n) {
  for (int32_t i = 0; i < n; i++) {
    free(cases[i].ref_logits);
    sched_collector_destroy(&cases[i].col);
  }
}

static ina_status_t submit_case(ina_scheduler_t *s, req_case_t *c) {
  ina_request_t r = sched_test_request(&c->col, c->prompt, c->prompt_len, c->max_new);
  r.sampling = c->sampling;
  r.ignore_eos = c->ignore_eos;
  r.stop_ids = c->stop_ids;
  r.num_stop_ids = c->num_stop_ids;
  return ina_scheduler_submit(s, &r);
}

typedef struct run_figures {
  int32_t max_waiting;
  int32_t peak_pages_used;
  int32_t min_cached_pages; /* prefix cache pages, lowest after a step */
  int64_t steps;
} run_figures_t;

/* Submit each case at its arrival step and step until all are finished. */
static run_figures_t run_cases(ina_scheduler_t *s, req_case_t *cases, int32_t n) {
  run_figures_t f = {0, 0, INT32_MAX, 0};
  int32_t submitted = 0;
  int64_t step = 0;
  while (step < 20000) {
    for (int32_t i = 0; i < n; i++)
      if (cases[i].arrival == step) {
        CHECK_OK(submit_case(s, &cases[i]));
        submitted++;
      }
    ina_scheduler_stats_t st;
    ina_scheduler_stats(s, &st);
    if (st.waiting > f.max_waiting) f.max_waiting = st.waiting;
    if (submitted == n && st.waiting + st.running == 0) break;
    sched_test_current_step++;
    CHECK_OK(ina_scheduler_step(s, NULL));
    ina_scheduler_stats(s, &st);
    if (st.kv_pages_used > f.peak_pages_used) f.peak_pages_used = st.kv_pages_used;
    if (st.prefix_cache_pages < f.min_cached_pages) f.min_cached_pages = st.prefix_cache_pages;
    step++;
  }
  CHECKF(step < 20000, "the requests did not finish in 20000 steps");
  f.steps = step;
  return f;
}

/* Each case received exactly one final event, in order, and the tokens its reference
 * run produced. Returns the number of near-tie flips after preemption. */
static int check_cases(req_case_t *cases, int32_t n) {
  int flips = 0;
  for (int32_t i = 0; i < n; i++) {
    req_case_t *c = &cases[i];
    sched_collector_t *col = &c->col;
    CHECKF(col->finals == 1, "request '%s': %d final events", col->id, col->finals);
    CHECK(col->events_after_final == 0 && col->count_mismatch == 0 && col->id_mismatch == 0);
    ina_finish_reason_t reason;
    const int32_t eos = c->ignore_eos ? -1 : g_eos;
    const int32_t n_expected = sched_test_expected(c->ref, c->ref_len, c->max_new, c->stop_ids, c->num_stop_ids, eos,
                                                   &reason);
    int flip = 0;
    const int greedy = c->sampling.temperature == 0.0f;
    const int agrees = sched_test_greedy_agrees(col, c->ref, n_expected, greedy ? c->ref_logits : NULL,
                                                c->prompt_len, g_vocab, &flip);
    CHECKF(agrees, "request '%s' (prompt %d, max_new %d, preempted %d times, sampled %d)", col->id, c->prompt_len,
           c->max_new, col->metrics.preemptions, !greedy);
    flips += flip;
    if (!flip) CHECKF(col->finish == reason, "request '%s': finish %s, expected %s", col->id,
                      ina_finish_reason_string(col->finish), ina_finish_reason_string(reason));
    CHECK(col->status == INA_OK);
    CHECK(col->metrics.prompt_tokens == c->prompt_len && col->metrics.generated_tokens == col->num_tokens);
    CHECK(col->metrics.queue_seconds >= 0 && col->metrics.first_token_seconds >= col->metrics.queue_seconds);
    CHECK(col->metrics.total_seconds >= col->metrics.first_token_seconds && col->metrics.mean_token_seconds >= 0 &&
          col->metrics.max_token_seconds >= col->metrics.mean_token_seconds * (1 - 1e-9));
  }
  return flips;
}

/* After everything finished and the prefix cache is flushed, the pool is whole. */
static void check_pool_whole(ina_scheduler_t *s, ina_engine_t *e) {
  CHECK_OK(ina_scheduler_flush_prefix_cache(s));
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  CHECKF(ina_page_pool_free_pages(pool) == ina_page_pool_num_pages(pool), "%d of %d pages free",
         ina_page_pool_free_pages(pool), ina_page_pool_num_pages(pool));
  CHECK_OK(ina_page_pool_check(pool));
  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  CHECK(st.kv_pages_used == 0 && st.prefix_cache_pages == 0 && st.waiting == 0 && st.running == 0);
}

/* Random requests, arrivals spread over steps, a small token budget (chunked prefill),
 * a small pool (queuing, preemption), shared prompt prefixes (prefix reuse), stop ids. */
static void test_random_equivalence(const ina_model_t *m, test_rng_t *rng, int round) {
  enum { N = 8 };
  const int32_t page_sizes[] = {1, 3, 4, 16};
  const int32_t page_size = page_sizes[test_rng_int(rng, 0, 3)];
  const int32_t pool_tokens = 64;
  req_case_t cases[N];
  int32_t shared_prefix[40];
  random_tokens(rng, shared_prefix, 40);
  for (int32_t i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof id, "random-%d-%d", round, i);
    req_case_t *c = &cases[i];
    case_init(c, id);
    c->prompt_len = (int32_t)test_rng_int(rng, 1, 32);
    c->max_new = (int32_t)test_rng_int(rng, 1, 16);
    random_tokens(rng, c->prompt, c->prompt_len);
    if (test_rng_int(rng, 0, 2) == 0) {
      const int32_t shared = (int32_t)test_rng_int(rng, 1, c->prompt_len);
      memcpy(c->prompt, shared_prefix, (size_t)shared * sizeof(int32_t));
    }
    c->ignore_eos = (int)test_rng_int(rng, 0, 1);
    c->arrival = test_rng_int(rng, 0, 16);
  }
  compute_references(m, cases, N, page_size);
  /* Stop ids taken from the reference output, so that they do stop it. */
  for (int32_t i = 0; i < N; i++)
    if (cases[i].ref_len > 1 && test_rng_int(rng, 0, 3) == 0) {
      cases[i].stop_ids[0] = cases[i].ref[test_rng_int(rng, 0, cases[i].ref_len - 1)];
      cases[i].stop_ids[1] = (int32_t)test_rng_int(rng, 0, g_vocab - 1);
      cases[i].num_stop_ids = 2;
    }

  ina_engine_t *e = sched_test_engine(m, page_size, (pool_tokens + page_size - 1) / page_size);
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_batch_tokens = (int32_t)test_rng_int(rng, 3, 16);
  config.max_running = (int32_t)test_rng_int(rng, 2, 6);
  config.prefix_cache_pages = test_rng_int(rng, 0, 3) == 0 ? 0 : -1;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return;
  const run_figures_t f = run_cases(s, cases, N);
  const int flips = check_cases(cases, N);
  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  printf("random round %d: page %d, budget %d, running %d, cache %d: %lld steps, max waiting %d, "
         "%lld preemptions, %lld cache hits (%lld tokens), %d near-tie flips\n",
         round, page_size, config.max_batch_tokens, config.max_running, config.prefix_cache_pages,
         (long long)f.steps, f.max_waiting, (long long)st.preemptions, (long long)st.prefix_cache_hits,
         (long long)st.prefix_cache_hit_tokens, flips);
  CHECK(st.finished == N && st.steps <= f.steps);
  int64_t generated = 0;
  for (int32_t i = 0; i < N; i++) generated += cases[i].col.num_tokens;
  CHECK(st.generated_tokens == generated);
  CHECK(st.busy_seconds > 0 && st.tokens_per_second > 0 && st.generated_tokens_per_second > 0);
  CHECK(st.kv_pages_total == (pool_tokens + page_size - 1) / page_size);
  check_pool_whole(s, e);
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  free_cases(cases, N);
}

/* Two long generations in a pool too small for both: the younger is preempted, comes
 * back with its generated tokens as prompt, and still produces its reference tokens. */
static void test_forced_preemption(const ina_model_t *m, test_rng_t *rng) {
  enum { N = 2 };
  req_case_t cases[N];
  for (int32_t i = 0; i < N; i++) {
    case_init(&cases[i], i == 0 ? "older" : "younger");
    cases[i].prompt_len = 8;
    cases[i].max_new = 30;
    cases[i].ignore_eos = 1;
    random_tokens(rng, cases[i].prompt, 8);
  }
  compute_references(m, cases, N, 4);
  ina_engine_t *e = sched_test_engine(m, 4, 12); /* 48 tokens; each needs 37 */
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_batch_tokens = 16;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return;
  run_cases(s, cases, N);
  check_cases(cases, N);
  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  CHECKF(st.preemptions >= 1, "%lld preemptions", (long long)st.preemptions);
  CHECK(cases[0].col.metrics.preemptions == 0 && cases[1].col.metrics.preemptions >= 1);
  check_pool_whole(s, e);
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  free_cases(cases, N);
}

/* Sampled requests (temperature, top-k, top-p, seeds) through chunked prefill and
 * batching draw the same tokens as alone: same logits, same per-request draw stream. */
static void test_sampled_equivalence(const ina_model_t *m, test_rng_t *rng) {
  enum { N = 5 };
  req_case_t cases[N];
  for (int32_t i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof id, "sampled-%d", i);
    req_case_t *c = &cases[i];
    case_init(c, id);
    c->prompt_len = (int32_t)test_rng_int(rng, 2, 30);
    c->max_new = (int32_t)test_rng_int(rng, 4, 10);
    random_tokens(rng, c->prompt, c->prompt_len);
    c->sampling.temperature = (float)(0.5 + test_rng_uniform(rng));
    c->sampling.top_k = (int32_t)test_rng_int(rng, 0, 64);
    c->sampling.top_p = (float)(0.7 + 0.3 * test_rng_uniform(rng));
    c->sampling.seed = test_rng_next(rng);
    c->ignore_eos = 1;
    c->arrival = test_rng_int(rng, 0, 6);
  }
  compute_references(m, cases, N, 4);
  ina_engine_t *e = sched_test_engine(m, 4, 256);
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_batch_tokens = 7;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return;
  run_cases(s, cases, N);
  check_cases(cases, N);
  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  CHECK(st.preemptions == 0);
  check_pool_whole(s, e);
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  free_cases(cases, N);
}

/* A request that does not fit yet keeps its place: a later small one that would fit is
 * not admitted before it (no starvation of large requests). */
static void test_fifo_no_overtaking(const ina_model_t *m, test_rng_t *rng) {
  req_case_t cases[3];
  const char *ids[3] = {"holder", "large", "small"};
  const int32_t lens[3] = {16, 52, 4}, news[3] = {20, 4, 4};
  for (int i = 0; i < 3; i++) {
    case_init(&cases[i], ids[i]);
    cases[i].prompt_len = lens[i];
    cases[i].max_new = news[i];
    cases[i].ignore_eos = 1;
    cases[i].arrival = i == 0 ? 0 : 2;
    random_tokens(rng, cases[i].prompt, lens[i]);
  }
  compute_references(m, cases, 3, 4);
  /* 64 tokens: "large" needs 13 of the 16 pages, "holder" holds 5 when it arrives */
  ina_engine_t *e = sched_test_engine(m, 4, 16);
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_batch_tokens = 64;
  config.prefix_cache_pages = 0;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return;
  run_cases(s, cases, 3);
  check_cases(cases, 3);
  /* "large" waits for "holder" to finish; "small" waits behind "large". */
  CHECKF(cases[1].col.first_token_step > cases[0].col.final_step, "large started at step %lld, holder ended at %lld",
         (long long)cases[1].col.first_token_step, (long long)cases[0].col.final_step);
  CHECKF(cases[2].col.first_token_step >= cases[1].col.first_token_step, "small started at %lld before large at %lld",
         (long long)cases[2].col.first_token_step, (long long)cases[1].col.first_token_step);
  CHECK(cases[1].col.metrics.queue_seconds > cases[0].col.metrics.queue_seconds);
  check_pool_whole(s, e);
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  free_cases(cases, 3);
}

/* Cancel requests while they wait, prefill and decode: each finishes "cancelled" at the
 * next step with the tokens it had (a prefix of its reference), and its pages are back
 * in the pool right after that step. */
static void test_cancellation(const ina_model_t *m, test_rng_t *rng) {
  enum { N = 5 };
  req_case_t cases[N];
  const int32_t lens[N] = {6, 10, 30, 12, 9};
  for (int32_t i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof id, "cancel-%d", i);
    case_init(&cases[i], id);
    cases[i].prompt_len = lens[i];
    cases[i].max_new = 8; /* the reference needs no more: they are cancelled earlier */
    cases[i].ignore_eos = 1;
    random_tokens(rng, cases[i].prompt, lens[i]);
  }
  compute_references(m, cases, N, 4);
  for (int32_t i = 0; i < N; i++) cases[i].max_new = 24;
  ina_engine_t *e = sched_test_engine(m, 4, 64);
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  const int32_t baseline = ina_page_pool_free_pages(pool);
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_batch_tokens = 8; /* cancel-2's prompt of 30 takes several steps */
  config.max_running = 3;       /* cancel-3 and cancel-4 wait */
  config.prefix_cache_pages = 0;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return;
  for (int32_t i = 0; i < N; i++) CHECK_OK(submit_case(s, &cases[i]));
  for (int k = 0; k < 4; k++) CHECK_OK(ina_scheduler_step(s, NULL));
  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  CHECK(st.running == 3 && st.waiting == 2);
  CHECK(cases[0].col.num_tokens > 0 && cases[2].col.num_tokens == 0); /* decoding / prefilling */

  CHECK_OK(ina_scheduler_cancel(s, "cancel-0")); /* decoding */
  CHECK_OK(ina_scheduler_cancel(s, "cancel-0")); /* idempotent */
  CHECK_OK(ina_scheduler_cancel(s, "cancel-2")); /* prefilling */
  CHECK_OK(ina_scheduler_cancel(s, "cancel-4")); /* waiting */
  CHECK(ina_scheduler_cancel(s, "no-such-request") == INA_ERR_NOT_FOUND);
  const int32_t before0 = cases[0].col.num_tokens;
  CHECK_OK(ina_scheduler_step(s, NULL));
  const int cancelled[N] = {1, 0, 1, 0, 1};
  for (int32_t i = 0; i < N; i++) {
    sched_collector_t *c = &cases[i].col;
    if (cancelled[i]) {
      CHECK(c->finals == 1 && c->finish == INA_FINISH_CANCELLED && c->status == INA_OK);
      CHECK(memcmp(c->tokens, cases[i].ref, (size_t)c->num_tokens * sizeof(int32_t)) == 0);
    } else {
      CHECK(c->finals == 0);
    }
  }
  CHECK(cases[0].col.num_tokens == before0); /* no token after the cancel took effect */
  CHECK(cases[4].col.num_tokens == 0 && cases[4].col.metrics.first_token_seconds == -1);
  CHECK(ina_scheduler_cancel(s, "cancel-0") == INA_ERR_NOT_FOUND); /* finished now */

  /* Cancel the rest: their pages are back as soon as the step that sees it returns. */
  CHECK_OK(ina_scheduler_cancel(s, "cancel-1"));
  CHECK_OK(ina_scheduler_cancel(s, "cancel-3"));
  CHECK_OK(ina_scheduler_step(s, NULL));
  CHECKF(ina_page_pool_free_pages(pool) == baseline, "%d pages free, baseline %d", ina_page_pool_free_pages(pool),
         baseline);
  ina_scheduler_stats(s, &st);
  CHECK(st.running == 0 && st.waiting == 0 && st.kv_pages_used == 0 && st.finished == N);
  for (int32_t i = 0; i < N; i++) CHECK(cases[i].col.finals == 1 && cases[i].col.finish == INA_FINISH_CANCELLED);

  /* A request cancelled before any step saw it. */
  sched_collector_t early;
  sched_collector_init(&early, "cancel-early");
  ina_request_t r = sched_test_request(&early, cases[0].prompt, cases[0].prompt_len, 4);
  CHECK_OK(ina_scheduler_submit(s, &r));
  CHECK_OK(ina_scheduler_cancel(s, "cancel-early"));
  CHECK_OK(ina_scheduler_step(s, NULL));
  CHECK(early.finals == 1 && early.finish == INA_FINISH_CANCELLED && early.num_tokens == 0);
  CHECK(ina_page_pool_free_pages(pool) == baseline);
  sched_collector_destroy(&early);
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  free_cases(cases, N);
}

/* A shared system prompt: later requests share its cached pages (fewer prompt tokens
 * computed, fewer pages held) and still produce their reference tokens. */
static int32_t prefix_run(const ina_model_t *m, req_case_t *cases, int32_t n, int with_cache,
                          ina_scheduler_stats_t *out) {
  ina_engine_t *e = sched_test_engine(m, 4, 64);
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_batch_tokens = 256;
  config.prefix_cache_pages = with_cache ? -1 : 0;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return 0;
  /* The first request alone, then the others together. */
  run_cases(s, cases, 1);
  ina_scheduler_stats_t first;
  ina_scheduler_stats(s, &first);
  if (with_cache) CHECKF(first.prefix_cache_pages >= 6, "%d pages cached", first.prefix_cache_pages);
  for (int32_t i = 1; i < n; i++) cases[i].arrival = 0;
  const run_figures_t f = run_cases(s, cases + 1, n - 1);
  ina_scheduler_stats(s, out);
  check_pool_whole(s, e);
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  return f.peak_pages_used;
}

static void test_prefix_reuse(const ina_model_t *m, test_rng_t *rng) {
  enum { N = 4, SYSTEM = 24 };
  req_case_t cases[N];
  int32_t system[SYSTEM];
  random_tokens(rng, system, SYSTEM);
  for (int32_t i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof id, "prefix-%d", i);
    case_init(&cases[i], id);
    cases[i].prompt_len = SYSTEM + (int32_t)test_rng_int(rng, 2, 9);
    cases[i].max_new = 6;
    cases[i].ignore_eos = 1;
    memcpy(cases[i].prompt, system, sizeof system);
    random_tokens(rng, cases[i].prompt + SYSTEM, cases[i].prompt_len - SYSTEM);
  }
  compute_references(m, cases, N, 4);
  ina_scheduler_stats_t with, without;
  const int32_t peak_with = prefix_run(m, cases, N, 1, &with);
  check_cases(cases, N);
  int32_t cached = 0;
  for (int32_t i = 1; i < N; i++) cached += cases[i].col.metrics.cached_tokens;
  for (int32_t i = 0; i < N; i++) {
    char id[64];
    snprintf(id, sizeof id, "%s", cases[i].col.id);
    sched_collector_destroy(&cases[i].col);
    sched_collector_init(&cases[i].col, id);
  }
  const int32_t peak_without = prefix_run(m, cases, N, 0, &without);
  check_cases(cases, N);
  printf("prefix reuse: %lld hits, %lld tokens reused; prompt tokens computed %lld vs %lld; peak pages %d vs %d\n",
         (long long)with.prefix_cache_hits, (long long)with.prefix_cache_hit_tokens, (long long)with.prefill_tokens,
         (long long)without.prefill_tokens, peak_with, peak_without);
  CHECK(with.prefix_cache_hits == N - 1 && with.prefix_cache_queries == N);
  CHECK(with.prefix_cache_hit_tokens >= (N - 1) * SYSTEM && with.prefix_cache_hit_tokens == cached);
  CHECK(without.prefix_cache_hits == 0 && without.prefix_cache_hit_tokens == 0);
  CHECK(with.prefill_tokens == without.prefill_tokens - with.prefix_cache_hit_tokens);
  /* The system prompt's 6 pages are held once instead of by each of the N - 1 requests
   * running together; the cache may also hold up to 2 pages of the first prompt's own
   * tail. */
  CHECKF(peak_with + (N - 2) * (SYSTEM / 4) - 2 <= peak_without, "peak pages %d with the cache, %d without", peak_with,
         peak_without);
  free_cases(cases, N);
}

/* Cached pages give way when the pool runs short: a request needing almost the whole
 * pool is admitted although the cache holds many pages, and still computes right. */
static void test_prefix_eviction(const ina_model_t *m, test_rng_t *rng) {
  enum { N = 5 };
  req_case_t cases[N];
  for (int32_t i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof id, "evict-%d", i);
    case_init(&cases[i], id);
    cases[i].prompt_len = i < N - 1 ? 22 : 60;
    cases[i].max_new = i < N - 1 ? 2 : 12;
    cases[i].ignore_eos = 1;
    cases[i].arrival = i < N - 1 ? 0 : 1000000; /* submitted below */
    random_tokens(rng, cases[i].prompt, cases[i].prompt_len);
  }
  compute_references(m, cases, N, 4);
  ina_engine_t *e = sched_test_engine(m, 4, 24);
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.prefix_cache_pages = 24;
  config.max_running = 1;
  config.max_batch_tokens = 16; /* prompts are cached when complete, some steps after admission */
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return;
  run_cases(s, cases, N - 1);
  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  CHECKF(st.prefix_cache_pages >= 15, "%d pages cached", st.prefix_cache_pages);
  const int32_t cached_before = st.prefix_cache_pages;
  cases[N - 1].arrival = 0;
  const run_figures_t f = run_cases(s, cases + N - 1, 1);
  check_cases(cases, N);
  /* 20 cached pages and 15 needed for the prompt in a pool of 24: the cache gave way. */
  CHECKF(f.min_cached_pages <= 24 - 15, "%d pages cached at least, %d before", f.min_cached_pages, cached_before);
  check_pool_whole(s, e);
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  free_cases(cases, N);
}

/* Stop ids end a request at their first occurrence, the stop token included; a stop
 * token that is also the last allowed token reports "stop". */
static void test_stop_ids(const ina_model_t *m, test_rng_t *rng) {
  enum { N = 3 };
  req_case_t cases[N];
  for (int32_t i = 0; i < N; i++) {
    char id[32];
    snprintf(id, sizeof id, "stop-%d", i);
    case_init(&cases[i], id);
    cases[i].prompt_len = 7;
    cases[i].max_new = 10;
    cases[i].ignore_eos = 1;
    random_tokens(rng, cases[i].prompt, 7);
  }
  compute_references(m, cases, N, 4);
  cases[0].stop_ids[0] = cases[0].ref[3];
  cases[0].num_stop_ids = 1;
  cases[1].stop_ids[0] = cases[1].ref[9]; /* the last allowed token */
  cases[1].num_stop_ids = 1;
  cases[2].stop_ids[0] = g_vocab - 1 == cases[2].ref[0] ? g_vocab - 2 : g_vocab - 1;
  cases[2].stop_ids[1] = cases[2].ref[1];
  cases[2].num_stop_ids = 2;
  ina_engine_t *e = sched_test_engine(m, 4, 64);
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, NULL, &s));
  if (!s) return;
  run_cases(s, cases, N);
  check_cases(cases, N);
  for (int32_t i = 0; i < N; i++) CHECK(cases[i].col.finish == INA_FINISH_STOP);
  CHECK(cases[0].col.num_tokens <= 4 && cases[2].col.num_tokens <= 2);
  CHECK(cases[0].col.tokens[cases[0].col.num_tokens - 1] == cases[0].stop_ids[0]);
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  free_cases(cases, N);
}

static void expect_rejected(ina_scheduler_t *s, const ina_request_t *r, const char *what, const char *needle1,
                            const char *needle2) {
  ina_clear_error();
  const ina_status_t st = ina_scheduler_submit(s, r);
  CHECKF(st == INA_ERR_INVALID_ARGUMENT, "%s: status %d", what, (int)st);
  const char *msg = ina_last_error();
  CHECKF(strstr(msg, needle1) != NULL && (!needle2 || strstr(msg, needle2) != NULL), "%s: message '%s'", what, msg);
}

/* Bad submissions are refused with a message naming the request and the field, and
 * nothing is queued; bad configs are refused. */
static void test_validation(const ina_model_t *m, test_rng_t *rng) {
  ina_engine_t *e = sched_test_engine(m, 4, 16); /* 64 tokens */
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_context = 40;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return;
  sched_collector_t c;
  sched_collector_init(&c, "bad-request");
  int32_t prompt[8];
  random_tokens(rng, prompt, 8);
  ina_log_set_quiet_errors(1);

  ina_request_t r = sched_test_request(&c, prompt, 0, 4);
  expect_rejected(s, &r, "empty prompt", "bad-request", "prompt");
  r = sched_test_request(&c, NULL, 3, 4);
  expect_rejected(s, &r, "NULL prompt", "bad-request", "prompt");
  int32_t bad[3] = {5, g_vocab, 7};
  r = sched_test_request(&c, bad, 3, 4);
  expect_rejected(s, &r, "id past the vocabulary", "bad-request", "prompt[1]");
  bad[1] = -1;
  expect_rejected(s, &r, "negative id", "bad-request", "prompt[1]");
  r = sched_test_request(&c, prompt, 8, 33);
  expect_rejected(s, &r, "beyond max_context", "bad-request", "max context");
  r = sched_test_request(&c, prompt, 8, 0);
  expect_rejected(s, &r, "no new tokens", "bad-request", "max_new_tokens");
  r = sched_test_request(&c, prompt, 8, 4);
  r.sampling.temperature = -1.0f;
  expect_rejected(s, &r, "negative temperature", "bad-request", "temperature");
  r = sched_test_request(&c, prompt, 8, 4);
  r.sampling.top_p = 0.0f;
  expect_rejected(s, &r, "top_p 0", "bad-request", "top_p");
  r = sched_test_request(&c, prompt, 8, 4);
  const int32_t stops[2] = {3, g_vocab + 5};
  r.stop_ids = stops;
  r.num_stop_ids = 2;
  expect_rejected(s, &r, "stop id past the vocabulary", "bad-request", "stop_ids[1]");
  r.stop_ids = NULL;
  expect_rejected(s, &r, "stop ids missing", "bad-request", "stop_ids");
  r = sched_test_request(&c, prompt, 8, 4);
  r.id = "";
  expect_rejected(s, &r, "empty id", "id", NULL);
  r = sched_test_request(&c, prompt, 8, 4);
  r.struct_size = 0;
  expect_rejected(s, &r, "uninitialized struct", "INA_REQUEST_INIT", NULL);
  CHECK(ina_scheduler_submit(s, NULL) == INA_ERR_INVALID_ARGUMENT);

  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  CHECK(st.waiting == 0 && st.running == 0);
  /* At the limit is fine; the same id again while it is unfinished is not. */
  r = sched_test_request(&c, prompt, 8, 32);
  CHECK_OK(ina_scheduler_submit(s, &r));
  expect_rejected(s, &r, "duplicate id", "bad-request", "id");
  ina_scheduler_stats(s, &st);
  CHECK(st.waiting == 1);
  sched_test_drain(s, 1000);
  CHECK(c.finals == 1 && c.num_tokens >= 1);
  CHECK_OK(ina_scheduler_submit(s, &r)); /* finished: the id is free again */
  sched_test_drain(s, 1000);
  CHECK(c.finals == 2);

  /* Configs. */
  ina_scheduler_t *bad_s = NULL;
  ina_scheduler_config_t bc = INA_SCHEDULER_CONFIG_INIT;
  bc.max_batch_tokens = 2;
  CHECK(ina_scheduler_create(e, &bc, &bad_s) == INA_ERR_INVALID_ARGUMENT && bad_s == NULL);
  bc = (ina_scheduler_config_t)INA_SCHEDULER_CONFIG_INIT;
  bc.max_running = 0;
  CHECK(ina_scheduler_create(e, &bc, &bad_s) == INA_ERR_INVALID_ARGUMENT && bad_s == NULL);
  bc = (ina_scheduler_config_t)INA_SCHEDULER_CONFIG_INIT;
  bc.max_context = 65; /* the pool holds 64 tokens */
  CHECK(ina_scheduler_create(e, &bc, &bad_s) == INA_ERR_INVALID_ARGUMENT && bad_s == NULL);
  bc = (ina_scheduler_config_t)INA_SCHEDULER_CONFIG_INIT;
  bc.struct_size = 0;
  CHECK(ina_scheduler_create(e, &bc, &bad_s) == INA_ERR_INVALID_ARGUMENT && bad_s == NULL);
  CHECK(ina_scheduler_create(NULL, NULL, &bad_s) == INA_ERR_INVALID_ARGUMENT && bad_s == NULL);

  /* The driver API is refused while the run loop drives. */
  CHECK_OK(ina_scheduler_run_start(s));
  CHECK(ina_scheduler_run_start(s) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_scheduler_step(s, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_scheduler_flush_prefix_cache(s) == INA_ERR_INVALID_ARGUMENT);
  ina_scheduler_run_stop(s);
  CHECK_OK(ina_scheduler_step(s, NULL));
  ina_log_set_quiet_errors(0);
  ina_scheduler_destroy(s);
  ina_scheduler_destroy(NULL);
  sched_collector_destroy(&c);
  ina_engine_destroy(e);
}

/* Destroying a scheduler with unfinished requests finishes each of them once, as
 * cancelled, and gives every page back. */
static void test_destroy_with_work(const ina_model_t *m, test_rng_t *rng) {
  enum { N = 4 };
  sched_collector_t cols[N];
  int32_t prompt[20];
  random_tokens(rng, prompt, 20);
  ina_engine_t *e = sched_test_engine(m, 4, 32);
  ina_scheduler_config_t config = INA_SCHEDULER_CONFIG_INIT;
  config.max_running = 2;
  config.max_batch_tokens = 8;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &config, &s));
  if (!s) return;
  for (int32_t i = 0; i < N; i++) {
    char id[16];
    snprintf(id, sizeof id, "left-%d", i);
    sched_collector_init(&cols[i], id);
    ina_request_t r = sched_test_request(&cols[i], prompt, 20, 10);
    CHECK_OK(ina_scheduler_submit(s, &r));
  }
  for (int k = 0; k < 4; k++) CHECK_OK(ina_scheduler_step(s, NULL));
  ina_scheduler_destroy(s);
  for (int32_t i = 0; i < N; i++) {
    CHECK(cols[i].finals == 1 && cols[i].finish == INA_FINISH_CANCELLED && cols[i].events_after_final == 0);
    sched_collector_destroy(&cols[i]);
  }
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  CHECK(ina_page_pool_free_pages(pool) == ina_page_pool_num_pages(pool));
  ina_engine_destroy(e);
}

int main(void) {
  test_rng_t rng = {test_seed("test_scheduler")};
  ina_model_t *m = sched_test_model(test_rng_next(&rng));
  g_vocab = ina_model_config(m)->vocab_size;
  g_eos = ina_model_config(m)->eos_token_id;
  CHECK(strcmp(ina_finish_reason_string(INA_FINISH_CANCELLED), "cancelled") == 0);
  test_validation(m, &rng);
  test_stop_ids(m, &rng);
  test_cancellation(m, &rng);
  test_destroy_with_work(m, &rng);
  test_fifo_no_overtaking(m, &rng);
  test_forced_preemption(m, &rng);
  test_sampled_equivalence(m, &rng);
  test_prefix_reuse(m, &rng);
  test_prefix_eviction(m, &rng);
  for (int round = 0; round < 2; round++) test_random_equivalence(m, &rng, round);
  ina_model_destroy(m);
  return test_finish("test_scheduler");
}
