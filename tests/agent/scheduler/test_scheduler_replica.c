/* Replicated schedulers under mpirun (2 or 3 ranks): every rank runs a scheduler over its
 * own expert-parallel engine (the tiny model, experts split), rank 0 leads through its run
 * loop and the others follow (ina_scheduler_follow). Checks:
 *   - the leader's requests (chunked prefill, a KV pool small enough to preempt, prefix
 *     reuse, sampled and greedy, stop ids, one cancelled before it runs and one cancelled
 *     from its own callback mid-stream) produce the tokens each produces alone through
 *     ina_generate on one rank holding every expert;
 *   - an idle leader's heartbeats keep followers whose communicator times out after
 *     3 s waiting through 6 s of idleness;
 *   - at the end every replica counted the same steps, tokens, preemptions and finished
 *     requests, and returned every page;
 *   - followers refuse submit, cancel and run_start; followers return INA_OK when the
 *     leader is destroyed. */
#include <unistd.h>

#include "../../test_util.h"
#include "comm/bootstrap.h"
#include "core/log.h"
#include "kvcache/page_pool.h"
#include "sched_test_util.h"

#define NCASES 10
#define MAX_PROMPT 40
#define MAX_NEW 24
#define PAGE_SIZE 4
#define POOL_PAGES 18 /* 72 tokens: several requests at once must preempt */

typedef struct req_case {
  int32_t prompt[MAX_PROMPT];
  int32_t prompt_len, max_new;
  int32_t stop_ids[1];
  int32_t num_stop_ids;
  ina_sampling_params_t sampling;
  int cancel_before, cancel_after; /* cancel before submitting it runs / after N tokens */
  int32_t ref[MAX_NEW];
  int32_t ref_len;
  float *ref_logits;
  sched_collector_t col;
} req_case_t;

static int g_rank, g_size;
static ina_scheduler_t *g_sched;

/* Records the event; cancels its own request after `cancel_after` tokens. */
static void collect_and_cancel(const ina_request_event_t *ev, void *user) {
  req_case_t *c = user;
  sched_collect(ev, &c->col);
  if (c->cancel_after > 0 && ev->finish == INA_FINISH_NONE && ev->num_generated == c->cancel_after)
    ina_scheduler_cancel(g_sched, ev->request_id);
}

static void make_cases(req_case_t *cases, int32_t vocab, uint64_t seed) {
  test_rng_t rng = {seed};
  int32_t shared[16];
  for (int i = 0; i < 16; i++) shared[i] = (int32_t)test_rng_int(&rng, 2, vocab - 1);
  for (int i = 0; i < NCASES; i++) {
    req_case_t *c = &cases[i];
    char id[32];
    memset(c, 0, sizeof *c);
    snprintf(id, sizeof id, "req-%d", i);
    sched_collector_init(&c->col, id);
    c->prompt_len = (int32_t)test_rng_int(&rng, 1, MAX_PROMPT);
    for (int32_t t = 0; t < c->prompt_len; t++)
      c->prompt[t] = i % 3 == 0 && t < 16 ? shared[t] : (int32_t)test_rng_int(&rng, 2, vocab - 1);
    c->max_new = (int32_t)test_rng_int(&rng, 4, MAX_NEW);
    if (i >= 5) { /* 8 pages each: 5, 8 and 9 run to the end (6 and 7 are cancelled) and
                   * need 24 of the 18 pages together, so some are preempted whatever the
                   * seed */
      c->prompt_len = 12;
      c->max_new = 20;
    }
    c->sampling = (ina_sampling_params_t)INA_SAMPLING_PARAMS_INIT;
    if (i % 2) {
      c->sampling.temperature = 0.9f;
      c->sampling.top_k = 40;
      c->sampling.seed = 100 + (uint64_t)i;
    }
    if (i == 4) {
      c->stop_ids[0] = 7;
      c->num_stop_ids = 1;
    }
    c->cancel_before = i == 6;
    c->cancel_after = i == 7 ? 3 : 0;
  }
}

static ina_status_t submit_case(req_case_t *c) {
  ina_request_t r = sched_test_request(&c->col, c->prompt, c->prompt_len, c->max_new);
  r.sampling = c->sampling;
  r.ignore_eos = 1;
  r.stop_ids = c->stop_ids;
  r.num_stop_ids = c->num_stop_ids;
  r.callback = collect_and_cancel;
  r.user_data = c;
  return ina_scheduler_submit(g_sched, &r);
}

static int finished(req_case_t *cases, int n) {
  int done = 0;
  for (int i = 0; i < n; i++) {
    pthread_mutex_lock(&cases[i].col.mu);
    done += cases[i].col.finals > 0;
    pthread_mutex_unlock(&cases[i].col.mu);
  }
  return done;
}

static void wait_finished(req_case_t *cases, int n) {
  for (int ms = 0; ms < 60000 && finished(cases, n) < n; ms += 5) usleep(5000);
  CHECKF(finished(cases, n) == n, "only %d of %d requests finished", finished(cases, n), n);
}

/* Each case alone on one rank holding every expert (before anyone starts following). */
static void compute_references(const ina_model_t *whole, req_case_t *cases, int32_t vocab) {
  ina_engine_t *ref = sched_test_engine(whole, PAGE_SIZE, 1024);
  for (int i = 0; i < NCASES; i++) {
    req_case_t *c = &cases[i];
    c->ref_logits = malloc((size_t)(c->prompt_len + c->max_new - 1) * (size_t)vocab * sizeof(float));
    c->ref_len = sched_test_reference(ref, c->prompt, c->prompt_len, c->max_new, &c->sampling, 1,
                                      c->ref, c->ref_logits);
  }
  ina_engine_destroy(ref);
}

static void lead(req_case_t *cases, int32_t vocab) {
  CHECK_OK(ina_scheduler_run_start(g_sched));
  /* First half, then idleness well past the followers' timeout, then the rest. */
  for (int i = 0; i < NCASES / 2; i++) {
    if (cases[i].cancel_before) continue;
    CHECK_OK(submit_case(&cases[i]));
  }
  wait_finished(cases, NCASES / 2);
  usleep(6000000);
  ina_scheduler_run_stop(g_sched); /* submissions queue while stopped... */
  for (int i = NCASES / 2; i < NCASES; i++) {
    CHECK_OK(submit_case(&cases[i]));
    if (cases[i].cancel_before) CHECK_OK(ina_scheduler_cancel(g_sched, cases[i].col.id));
  }
  CHECK_OK(ina_scheduler_run_start(g_sched)); /* ...and are taken in together */
  wait_finished(cases + NCASES / 2, NCASES - NCASES / 2);
  for (int i = 0; i < NCASES; i++) {
    req_case_t *c = &cases[i];
    if (i < NCASES / 2 && c->cancel_before) continue;
    sched_collector_t *col = &c->col;
    CHECKF(col->finals == 1, "request '%s': %d final events", col->id, col->finals);
    if (c->cancel_before) {
      CHECKF(col->finish == INA_FINISH_CANCELLED && col->num_tokens == 0,
             "request '%s' cancelled before it ran: finish %s, %d tokens", col->id,
             ina_finish_reason_string(col->finish), col->num_tokens);
      continue;
    }
    ina_finish_reason_t reason;
    const int32_t n = sched_test_expected(c->ref, c->ref_len, c->max_new, c->stop_ids,
                                          c->num_stop_ids, -1, &reason);
    int flip = 0;
    const int greedy = c->sampling.temperature == 0.0f;
    const int agrees = sched_test_greedy_agrees_upto(col, c->ref, n, greedy ? c->ref_logits : NULL,
                                                     c->prompt_len, vocab, c->cancel_after > 0,
                                                     &flip);
    CHECKF(agrees, "request '%s' (prompt %d, max_new %d, preempted %d times)", col->id,
           c->prompt_len, c->max_new, col->metrics.preemptions);
    if (c->cancel_after)
      CHECKF(col->finish == INA_FINISH_CANCELLED, "request '%s' cancelled mid-stream: %s",
             col->id, ina_finish_reason_string(col->finish));
    else if (!flip)
      CHECKF(col->finish == reason, "request '%s': finish %s, want %s", col->id,
             ina_finish_reason_string(col->finish), ina_finish_reason_string(reason));
  }
  ina_scheduler_run_stop(g_sched);
}

static void follow(void) {
  const int32_t prompt[1] = {3};
  sched_collector_t col;
  sched_collector_init(&col, "not-here");
  ina_request_t r = sched_test_request(&col, prompt, 1, 2);
  ina_log_set_quiet_errors(1);
  CHECK(ina_scheduler_submit(g_sched, &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_scheduler_cancel(g_sched, "req-0") == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_scheduler_run_start(g_sched) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_scheduler_flush_prefix_cache(g_sched) == INA_ERR_UNSUPPORTED);
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_scheduler_follow(g_sched));
  sched_collector_destroy(&col);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  g_rank = ina_bootstrap_world_rank(boot);
  g_size = ina_bootstrap_world_size(boot);
  ina_comm_t *replicas = NULL, *ep = NULL, *world = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &replicas));
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &ep));
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &world));
  uint64_t seed = 0;
  if (g_rank == 0) seed = test_seed("test_scheduler_replica");
  if (world) CHECK_OK(ina_comm_broadcast(world, &seed, 1, INA_DTYPE_I64, 0, NULL));
  /* Followers give up on a silent leader after 3 s; heartbeats every 0.2 s. */
  if (replicas) ina_comm_set_timeout(replicas, 3.0);

  ina_model_t *whole = sched_test_model(7);
  const ina_model_config_t *cfg = ina_model_config(whole);
  const int32_t vocab = cfg->vocab_size;
  ina_model_t *part = NULL;
  /* With --dp the engines split the sequences (attention DP): the pool has a stripe per
   * rank, each as large as the whole pool without. */
  const int dp = argc > 1 && strcmp(argv[1], "--dp") == 0;
  ina_engine_t *engine =
      sched_test_ep_engine(7, g_rank, g_size, ep, PAGE_SIZE, dp ? POOL_PAGES * g_size : POOL_PAGES, dp ? 2 : 0, &part);
  ina_scheduler_config_t sc = INA_SCHEDULER_CONFIG_INIT;
  sc.max_batch_tokens = 24;
  sc.max_running = 4;
  sc.max_context = MAX_PROMPT + MAX_NEW;
  sc.replica_comm = replicas;
  sc.heartbeat_seconds = 0.2;
  if (engine) CHECK_OK(ina_scheduler_create(engine, &sc, &g_sched));

  static req_case_t cases[NCASES];
  make_cases(cases, vocab, seed);
  if (g_rank == 0) compute_references(whole, cases, vocab);
  if (world) CHECK_OK(ina_comm_barrier(world, NULL));
  if (g_sched) {
    if (g_rank == 0)
      lead(cases, vocab);
    else
      follow();
  }
  /* Every replica counted the same work (the leader's stats are final: it is stopped). */
  ina_scheduler_stats_t st;
  memset(&st, 0, sizeof st);
  if (g_sched) ina_scheduler_stats(g_sched, &st);
  int64_t mine[6] = {st.steps, st.prefill_tokens, st.decode_tokens, st.generated_tokens,
                     st.preemptions, st.finished};
  /* The leader's destroy releases the followers; their stats were taken before that. */
  if (g_rank == 0) {
    ina_scheduler_destroy(g_sched);
    g_sched = NULL;
  }
  int64_t all[6 * 8];
  if (world && g_size <= 8) {
    CHECK_OK(ina_comm_all_gather(world, mine, all, 6, INA_DTYPE_I64, NULL));
    for (int r = 1; r < g_size; r++)
      CHECKF(memcmp(all, all + 6 * r, sizeof mine) == 0,
             "rank %d counted steps %lld prefill %lld decode %lld generated %lld preempted %lld "
             "finished %lld; rank 0 %lld %lld %lld %lld %lld %lld",
             r, (long long)all[6 * r], (long long)all[6 * r + 1], (long long)all[6 * r + 2],
             (long long)all[6 * r + 3], (long long)all[6 * r + 4], (long long)all[6 * r + 5],
             (long long)all[0], (long long)all[1], (long long)all[2], (long long)all[3],
             (long long)all[4], (long long)all[5]);
    if (g_rank == 0)
      printf("test_scheduler_replica: %d ranks%s, %lld steps, %lld preemptions, %lld generated\n", g_size,
             dp ? " (attention DP: a pool stripe per rank)" : "", (long long)all[0], (long long)all[4],
             (long long)all[3]);
    /* The pool was small enough to preempt (per stripe with --dp, where the requests
     * spread over the stripes may not need to). */
    CHECK(dp || all[4] > 0);
  }
  ina_scheduler_destroy(g_sched);
  if (engine) {
    ina_page_pool_t *pool = ina_engine_page_pool(engine);
    CHECK(ina_page_pool_free_pages(pool) == ina_page_pool_num_pages(pool));
  }
  for (int i = 0; i < NCASES; i++) {
    free(cases[i].ref_logits);
    sched_collector_destroy(&cases[i].col);
  }
  ina_engine_destroy(engine);
  ina_model_destroy(part);
  ina_model_destroy(whole);
  ina_comm_destroy(world);
  ina_comm_destroy(ep);
  ina_comm_destroy(replicas);
  char name[64];
  snprintf(name, sizeof name, "test_scheduler_replica rank %d", g_rank);
  const int rc = test_finish(name);
  ina_bootstrap_finalize(boot);
  return rc;
}
