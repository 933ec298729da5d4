/* Control commands on replicated schedulers under mpirun (2 or 3 ranks): every rank runs
 * a scheduler over its own expert-parallel engine (the tiny model, experts split); rank 0
 * leads through its run loop and issues commands from its main thread while requests
 * run, the others follow (ina_scheduler_follow). Checks:
 *   - every rank's control function sees the same commands (digest and size), in the
 *     same order, at the same point of the step stream (forward steps and tokens
 *     generated so far); an all-gather inside the function, over a communicator of its
 *     own, meets on every rank and finds them agreeing;
 *   - a command failing on every rank returns its status and message on the leader; one
 *     failing on the followers only returns INA_OK there, and the followers go on
 *     following;
 *   - an idle leader runs a command at once (< 2 s), the followers with it;
 *   - the requests (greedy and sampled, chunked prefill, commands between their steps)
 *     produce the tokens each produces alone on one rank holding every expert;
 *   - followers refuse ina_scheduler_control. */
#include <unistd.h>

#include "../../test_util.h"
#include "comm/bootstrap.h"
#include "control_test_util.h"
#include "core/log.h"
#include "sched_test_util.h"

#define NCASES 6
#define MAX_PROMPT 40
#define MAX_NEW 24
#define PAGE_SIZE 4
#define POOL_PAGES 100 /* every request at once: no preemption, tokens compare exactly */
#define NCOMMANDS 10   /* issued while the requests run */
#define MAX_RECORDS 64
#define MAX_RANKS 8

enum { OP_OK = 'o', OP_FAIL_ALL = 'f', OP_FAIL_FOLLOWERS = 'g' };
enum { R_DIGEST, R_SIZE, R_STEPS, R_GENERATED, R_AGREED, R_WORDS };

/* What one rank's control function saw; written on its driver thread, read by main once
 * the driver is done (after run_stop on the leader, after follow returns elsewhere). */
typedef struct rank_log {
  ina_scheduler_t *s;
  ina_comm_t *comm; /* for the collective inside the function */
  int rank, size;
  int64_t rec[MAX_RECORDS][R_WORDS];
  int n;
} rank_log_t;

static ina_status_t replica_control(ina_engine_t *engine, const void *bytes, size_t size, void *user) {
  (void)engine;
  rank_log_t *L = user;
  const uint8_t op = ((const uint8_t *)bytes)[0];
  ina_scheduler_stats_t st;
  ina_scheduler_stats(L->s, &st);
  const int64_t digest = (int64_t)control_digest(bytes, size);
  /* Every rank must be here for the same command at the same step, or this does not
   * meet (a timeout) or does not agree. */
  int64_t mine[2] = {digest, st.steps}, all[2 * MAX_RANKS];
  const ina_status_t gathered = ina_comm_all_gather(L->comm, mine, all, 2, INA_DTYPE_I64, NULL);
  int agreed = gathered == INA_OK;
  for (int r = 0; agreed && r < L->size; r++) agreed = all[2 * r] == mine[0] && all[2 * r + 1] == mine[1];
  if (L->n < MAX_RECORDS) {
    int64_t *rec = L->rec[L->n];
    rec[R_DIGEST] = digest;
    rec[R_SIZE] = (int64_t)size;
    rec[R_STEPS] = st.steps;
    rec[R_GENERATED] = st.generated_tokens;
    rec[R_AGREED] = agreed;
  }
  L->n++;
  if (gathered != INA_OK) return gathered;
  if (op == OP_FAIL_ALL || (op == OP_FAIL_FOLLOWERS && L->rank > 0)) {
    ina_error("test", "control command %016llx asked to fail on rank %d", (unsigned long long)digest, L->rank);
    return INA_ERR_FORMAT;
  }
  return INA_OK;
}

typedef struct req_case {
  int32_t prompt[MAX_PROMPT];
  int32_t prompt_len, max_new;
  ina_sampling_params_t sampling;
  int32_t ref[MAX_NEW];
  int32_t ref_len;
  sched_collector_t col;
} req_case_t;

static void make_cases(req_case_t *cases, int32_t vocab, uint64_t seed) {
  test_rng_t rng = {seed};
  for (int i = 0; i < NCASES; i++) {
    req_case_t *c = &cases[i];
    char id[32];
    memset(c, 0, sizeof *c);
    snprintf(id, sizeof id, "req-%d", i);
    sched_collector_init(&c->col, id);
    c->prompt_len = (int32_t)test_rng_int(&rng, 1, MAX_PROMPT);
    for (int32_t t = 0; t < c->prompt_len; t++) c->prompt[t] = (int32_t)test_rng_int(&rng, 2, vocab - 1);
    /* Case 0 paces the commands: it runs the longest. */
    c->max_new = i == 0 ? MAX_NEW : (int32_t)test_rng_int(&rng, 4, MAX_NEW);
    c->sampling = (ina_sampling_params_t)INA_SAMPLING_PARAMS_INIT;
    if (i % 2) {
      c->sampling.temperature = 0.9f;
      c->sampling.top_k = 40;
      c->sampling.seed = 100 + (uint64_t)i;
    }
  }
}

static void compute_references(const ina_model_t *whole, req_case_t *cases) {
  ina_engine_t *ref = sched_test_engine(whole, PAGE_SIZE, 1024);
  for (int i = 0; i < NCASES; i++) {
    req_case_t *c = &cases[i];
    c->ref_len = sched_test_reference(ref, c->prompt, c->prompt_len, c->max_new, &c->sampling, 1, c->ref, NULL);
  }
  ina_engine_destroy(ref);
}

static int32_t tokens_of(sched_collector_t *c, int *final) {
  pthread_mutex_lock(&c->mu);
  const int32_t n = c->num_tokens;
  *final = c->finals > 0;
  pthread_mutex_unlock(&c->mu);
  return n;
}

static int all_finished(req_case_t *cases) {
  int done = 0, final = 0;
  for (int i = 0; i < NCASES; i++) {
    tokens_of(&cases[i].col, &final);
    done += final;
  }
  return done == NCASES;
}

/* One command from the leader's main thread; checks its outcome. */
static void issue(ina_scheduler_t *s, test_rng_t *rng, uint8_t op, size_t size) {
  uint8_t *bytes = malloc(size);
  char detail[256];
  control_payload(rng, op, bytes, size);
  const ina_status_t st = ina_scheduler_control(s, bytes, size, detail, sizeof detail);
  if (op == OP_FAIL_ALL)
    CHECKF(st == INA_ERR_FORMAT && strstr(detail, "asked to fail on rank 0") != NULL,
           "a command failing everywhere: status %d, detail '%s'", st, detail);
  else
    CHECKF(st == INA_OK && detail[0] == '\0', "command '%c' of %zu bytes: status %d, detail '%s'", op, size, st,
           detail);
  free(bytes);
}

static void lead(ina_scheduler_t *s, req_case_t *cases, uint64_t seed, double *idle_seconds) {
  test_rng_t rng = {seed ^ 0x5eed};
  CHECK_OK(ina_scheduler_run_start(s));
  double t0 = test_now_s();
  issue(s, &rng, OP_OK, (size_t)test_rng_int(&rng, 1, 64));
  idle_seconds[0] = test_now_s() - t0;
  for (int i = 0; i < NCASES; i++) {
    ina_request_t r = sched_test_request(&cases[i].col, cases[i].prompt, cases[i].prompt_len, cases[i].max_new);
    r.sampling = cases[i].sampling;
    r.ignore_eos = 1;
    CHECK_OK(ina_scheduler_submit(s, &r));
  }
  /* Command j once the pacer has j + 1 tokens: they land between the requests' steps. */
  for (int j = 0; j < NCOMMANDS; j++) {
    int final = 0;
    while (tokens_of(&cases[0].col, &final) < j + 1 && !final) usleep(200);
    const uint8_t op = j == 3 ? OP_FAIL_ALL : j == 5 ? OP_FAIL_FOLLOWERS : OP_OK;
    const size_t size = j == 6 ? ((size_t)1 << 20) + 5 : (size_t)test_rng_int(&rng, 1, 5000);
    issue(s, &rng, op, size);
  }
  for (int ms = 0; ms < 120000 && !all_finished(cases); ms++) usleep(1000);
  CHECK(all_finished(cases));
  usleep(500000); /* idle past a few heartbeats */
  t0 = test_now_s();
  issue(s, &rng, OP_OK, (size_t)test_rng_int(&rng, 1, 64));
  idle_seconds[1] = test_now_s() - t0;
  ina_scheduler_run_stop(s);
  for (int i = 0; i < NCASES; i++) {
    req_case_t *c = &cases[i];
    int flip = 0;
    CHECKF(sched_test_greedy_agrees(&c->col, c->ref, c->ref_len, NULL, c->prompt_len, 0, &flip),
           "request '%s' differs from its single-rank run", c->col.id);
    CHECK(c->col.finals == 1 && c->col.finish == INA_FINISH_LENGTH);
  }
}

static void follow(ina_scheduler_t *s) {
  const uint8_t op = OP_OK;
  CHECK(ina_scheduler_control(s, &op, 1, NULL, 0) == INA_ERR_INVALID_ARGUMENT);
  CHECK_OK(ina_scheduler_follow(s));
}

/* Every rank's records against rank 0's. */
static void compare_records(ina_comm_t *world, const rank_log_t *L, int rank, int size) {
  static int64_t mine[1 + MAX_RECORDS * R_WORDS], all[MAX_RANKS][1 + MAX_RECORDS * R_WORDS];
  const int total = NCOMMANDS + 2;
  mine[0] = L->n;
  memcpy(mine + 1, L->rec, sizeof L->rec);
  CHECK_OK(ina_comm_all_gather(world, mine, all, 1 + MAX_RECORDS * R_WORDS, INA_DTYPE_I64, NULL));
  if (rank != 0) return;
  int mid_flight = 0;
  for (int r = 0; r < size; r++) {
    CHECKF(all[r][0] == total, "rank %d ran %lld commands, want %d", r, (long long)all[r][0], total);
    for (int j = 0; j < total && j < MAX_RECORDS; j++) {
      const int64_t *got = all[r] + 1 + j * R_WORDS, *want = all[0] + 1 + j * R_WORDS;
      CHECKF(memcmp(got, want, R_WORDS * sizeof *got) == 0,
             "command %d: rank %d saw digest %016llx, %lld bytes at step %lld after %lld tokens; rank 0 "
             "%016llx, %lld bytes at step %lld after %lld tokens",
             j, r, (unsigned long long)got[R_DIGEST], (long long)got[R_SIZE], (long long)got[R_STEPS],
             (long long)got[R_GENERATED], (unsigned long long)want[R_DIGEST], (long long)want[R_SIZE],
             (long long)want[R_STEPS], (long long)want[R_GENERATED]);
      CHECKF(got[R_AGREED] == 1, "command %d: the collective inside it did not agree on rank %d", j, r);
    }
  }
  const int64_t *last = all[0] + 1 + (total - 1) * R_WORDS;
  for (int j = 1; j <= NCOMMANDS; j++) {
    const int64_t *rec = all[0] + 1 + j * R_WORDS;
    mid_flight += rec[R_GENERATED] > 0 && rec[R_GENERATED] < last[R_GENERATED];
  }
  CHECKF(mid_flight > 0, "no command ran while the requests were generating");
  printf("test_scheduler_control_replica: %d ranks, %d commands, %d of them between tokens, %lld steps\n", size,
         total, mid_flight, (long long)last[R_STEPS]);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  const int rank = ina_bootstrap_world_rank(boot), size = ina_bootstrap_world_size(boot);
  if (size > MAX_RANKS) {
    fprintf(stderr, "test_scheduler_control_replica: at most %d ranks\n", MAX_RANKS);
    return 1;
  }
  ina_comm_t *replicas = NULL, *ep = NULL, *world = NULL, *ctl = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &replicas));
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &ep));
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &world));
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &ctl));
  if (!replicas || !ep || !world || !ctl) return 1;
  uint64_t seed = 0;
  if (rank == 0) seed = test_seed("test_scheduler_control_replica");
  CHECK_OK(ina_comm_broadcast(world, &seed, 1, INA_DTYPE_I64, 0, NULL));
  /* A wedged replica shows as an error, not a hang. */
  ina_comm_set_timeout(replicas, 30.0);
  ina_comm_set_timeout(ctl, 30.0);

  ina_model_t *whole = sched_test_model(7);
  const ina_model_config_t *cfg = ina_model_config(whole);
  const int32_t vocab = cfg->vocab_size;
  ina_model_t *part = NULL;
  ina_engine_t *engine = sched_test_ep_engine(7, rank, size, ep, PAGE_SIZE, POOL_PAGES, 0, &part);
  static rank_log_t log;
  log.comm = ctl;
  log.rank = rank;
  log.size = size;
  ina_scheduler_config_t sc = INA_SCHEDULER_CONFIG_INIT;
  sc.max_batch_tokens = 24;
  sc.max_running = 4;
  sc.max_context = MAX_PROMPT + MAX_NEW;
  sc.replica_comm = replicas;
  sc.heartbeat_seconds = 0.2;
  sc.control = replica_control;
  sc.control_user_data = &log;
  ina_scheduler_t *s = NULL;
  if (engine) CHECK_OK(ina_scheduler_create(engine, &sc, &s));
  if (!s) return 1;
  log.s = s;

  static req_case_t cases[NCASES];
  make_cases(cases, vocab, seed);
  if (rank == 0) compute_references(whole, cases);
  CHECK_OK(ina_comm_barrier(world, NULL));
  double idle_seconds[2] = {0, 0};
  ina_log_set_quiet_errors(1); /* the commands asked to fail */
  if (rank == 0)
    lead(s, cases, seed, idle_seconds);
  else
    follow(s);
  ina_log_set_quiet_errors(0);
  if (rank == 0) {
    CHECKF(idle_seconds[0] < 2.0 && idle_seconds[1] < 2.0, "an idle leader took %.3f s and %.3f s for a command",
           idle_seconds[0], idle_seconds[1]);
    ina_scheduler_destroy(s); /* releases the followers */
    s = NULL;
  }
  compare_records(world, &log, rank, size);
  ina_scheduler_destroy(s);
  for (int i = 0; i < NCASES; i++) sched_collector_destroy(&cases[i].col);
  ina_engine_destroy(engine);
  ina_model_destroy(part);
  ina_model_destroy(whole);
  ina_comm_destroy(ctl);
  ina_comm_destroy(world);
  ina_comm_destroy(ep);
  ina_comm_destroy(replicas);
  char name[64];
  snprintf(name, sizeof name, "test_scheduler_control_replica rank %d", rank);
  const int rc = test_finish(name);
  ina_bootstrap_finalize(boot);
  return rc;
}
