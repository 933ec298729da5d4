/* Control commands on one rank (ina_scheduler_control), on the CPU engine with the tiny
 * model:
 *   - with the run loop, commands run on the driver thread (the one delivering token
 *     events, never the caller) with the scheduler's engine; an idle scheduler runs one
 *     at once (< 2 s); their status and detail come back (cut to the caller's buffer);
 *     a failing command leaves the scheduler serving; a control function or a request
 *     callback issuing a command is refused instead of waiting for itself;
 *   - commands issued without pause while requests run (chunked prefill, queuing, greedy
 *     and sampled) leave every token as in the same run without commands, and as alone
 *     through ina_generate;
 *   - without a run loop, commands from several threads wait for the next step, then run
 *     at its start in the order they were issued, before the step takes in requests (a
 *     request submitted by a command is computed in that same step);
 *   - run_stop and destroy hand waiting commands INA_ERR_UNSUPPORTED unrun; once destroy
 *     has begun commands are refused;
 *   - refusals: NULL scheduler, no control function (also a version-2 config whose bytes
 *     past its size would name one), NULL bytes, size 0, size over the limit.
 *
 * The test reads the scheduler's internal queue length (scheduler_internal.h), under its
 * lock, only to know that a command another thread issued is queued, without sleeping
 * and hoping. Worker threads never use CHECK (its counters are not thread-safe): they
 * leave their results in their own slots, read by main after pthread_join. */
#include <pthread.h>
#include <time.h>

#include "../../test_util.h"
#include "agent/scheduler/scheduler_internal.h"
#include "control_test_util.h"
#include "core/log.h"
#include "kvcache/page_pool.h"
#include "sched_test_util.h"

enum {
  OP_OK = 'o',          /* record, succeed */
  OP_FAIL = 'f',        /* record, fail with a message */
  OP_FAIL_SILENT = 'q', /* record, fail without recording a reason */
  OP_REENTER = 'r',     /* record, try a nested ina_scheduler_control */
  OP_BLOCK = 'b',       /* record, then wait until the test opens the gate */
  OP_SUBMIT = 's',      /* record, submit the log's prepared request */
};

#define MAX_RECORDS 8192

/* What the control function saw of one command. */
typedef struct record {
  uint64_t digest;
  size_t size;
  pthread_t thread;
  int64_t steps;        /* the scheduler's forward steps when the command ran */
  int engine_matches;   /* the engine passed is the scheduler's */
  ina_status_t nested;  /* OP_REENTER: what the nested call returned */
} record_t;

/* The control function's user data. Records are written on the driver under mu. */
typedef struct control_log {
  pthread_mutex_t mu;
  pthread_cond_t cond;
  ina_engine_t *engine;
  ina_scheduler_t *s;
  record_t rec[MAX_RECORDS];
  int n;
  int block_entered, gate_open;  /* OP_BLOCK */
  ina_request_t submit;          /* OP_SUBMIT */
  ina_status_t submit_status;
} control_log_t;

static ina_status_t test_control(ina_engine_t *engine, const void *bytes, size_t size, void *user) {
  control_log_t *L = user;
  const uint8_t op = ((const uint8_t *)bytes)[0];
  ina_scheduler_stats_t st;
  ina_scheduler_stats(L->s, &st);
  record_t r = {control_digest(bytes, size), size, pthread_self(), st.steps, engine == L->engine, INA_OK};
  if (op == OP_REENTER) r.nested = ina_scheduler_control(L->s, bytes, size, NULL, 0);
  if (op == OP_SUBMIT) L->submit_status = ina_scheduler_submit(L->s, &L->submit);
  pthread_mutex_lock(&L->mu);
  if (L->n < MAX_RECORDS) L->rec[L->n] = r;
  L->n++;
  if (op == OP_BLOCK) {
    L->block_entered = 1;
    pthread_cond_broadcast(&L->cond);
    while (!L->gate_open) pthread_cond_wait(&L->cond, &L->mu);
  }
  pthread_mutex_unlock(&L->mu);
  if (op == OP_FAIL) {
    ina_error("test", "control command of %zu bytes (digest %016llx) asked to fail", size,
              (unsigned long long)r.digest);
    return INA_ERR_FORMAT;
  }
  if (op == OP_FAIL_SILENT) return INA_ERR_IO;
  return INA_OK;
}

static control_log_t *log_new(ina_engine_t *e) {
  control_log_t *L = calloc(1, sizeof *L);
  if (!L) exit(1);
  pthread_mutex_init(&L->mu, NULL);
  pthread_cond_init(&L->cond, NULL);
  L->engine = e;
  return L;
}

static void log_free(control_log_t *L) {
  pthread_cond_destroy(&L->cond);
  pthread_mutex_destroy(&L->mu);
  free(L);
}

static int log_count(control_log_t *L) {
  pthread_mutex_lock(&L->mu);
  const int n = L->n;
  pthread_mutex_unlock(&L->mu);
  return n;
}

static ina_scheduler_t *make_scheduler(ina_engine_t *e, control_log_t *L, int32_t max_batch_tokens) {
  ina_scheduler_config_t c = INA_SCHEDULER_CONFIG_INIT;
  c.max_batch_tokens = max_batch_tokens;
  c.max_running = 4;
  c.control = test_control;
  c.control_user_data = L;
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, &c, &s));
  if (!s) exit(1);
  L->s = s;
  return s;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* Until `n` commands wait in the scheduler's queue (30 s at most). */
static void wait_queued(ina_scheduler_t *s, int32_t n) {
  for (int ms = 0; ms < 30000; ms++) {
    pthread_mutex_lock(&s->mu);
    const int32_t q = s->num_controls;
    pthread_mutex_unlock(&s->mu);
    if (q == n) return;
    sleep_us(1000);
  }
  fprintf(stderr, "test_scheduler_control: %d commands never got queued\n", n);
  exit(1);
}

/* ---- a request whose events record the delivering thread ---------------------------- */

typedef struct tracked {
  sched_collector_t col;
  int32_t prompt[32];
  int32_t prompt_len, max_new;
  ina_sampling_params_t sampling;
  pthread_t thread;       /* that delivered the first event */
  int have_thread, other_threads;
  ina_scheduler_t *s;
  int control_at_first_token, control_at_final; /* issue a command from the callback */
  ina_status_t control_status;
  int32_t ref[32];
  int32_t ref_len;
} tracked_t;

static void tracked_callback(const ina_request_event_t *ev, void *user) {
  tracked_t *t = user;
  const uint8_t op = OP_OK;
  if ((t->control_at_first_token && ev->finish == INA_FINISH_NONE && ev->num_generated == 1) ||
      (t->control_at_final && ev->finish != INA_FINISH_NONE))
    t->control_status = ina_scheduler_control(t->s, &op, 1, NULL, 0);
  pthread_mutex_lock(&t->col.mu);
  if (!t->have_thread) {
    t->thread = pthread_self();
    t->have_thread = 1;
  } else if (!pthread_equal(t->thread, pthread_self())) {
    t->other_threads++;
  }
  pthread_mutex_unlock(&t->col.mu);
  sched_collect(ev, &t->col);
}

static void tracked_init(tracked_t *t, const char *id, test_rng_t *rng, int32_t vocab, int32_t prompt_len,
                         int32_t max_new) {
  memset(t, 0, sizeof *t);
  sched_collector_init(&t->col, id);
  t->prompt_len = prompt_len;
  t->max_new = max_new;
  t->sampling = (ina_sampling_params_t)INA_SAMPLING_PARAMS_INIT;
  for (int32_t i = 0; i < prompt_len; i++) t->prompt[i] = (int32_t)test_rng_int(rng, 2, vocab - 1);
}

static ina_request_t tracked_request(tracked_t *t, ina_scheduler_t *s) {
  ina_request_t r = sched_test_request(&t->col, t->prompt, t->prompt_len, t->max_new);
  r.sampling = t->sampling;
  r.ignore_eos = 1;
  r.callback = tracked_callback;
  r.user_data = t;
  t->s = s;
  return r;
}

static void tracked_reference(tracked_t *t, ina_engine_t *ref) {
  t->ref_len = sched_test_reference(ref, t->prompt, t->prompt_len, t->max_new, &t->sampling, 1, t->ref, NULL);
}

static int tracked_finals(tracked_t *t) {
  pthread_mutex_lock(&t->col.mu);
  const int f = t->col.finals;
  pthread_mutex_unlock(&t->col.mu);
  return f;
}

static void wait_final(tracked_t *t) {
  for (int ms = 0; ms < 120000 && tracked_finals(t) == 0; ms++) sleep_us(1000);
  if (tracked_finals(t) == 0) {
    fprintf(stderr, "test_scheduler_control: request '%s' never finished\n", t->col.id);
    exit(1);
  }
}

static int tokens_equal(const sched_collector_t *c, const int32_t *want, int32_t n) {
  return c->num_tokens == n && memcmp(c->tokens, want, (size_t)n * sizeof *want) == 0;
}

/* ---- a command issued from another thread ------------------------------------------- */

typedef struct issuer {
  ina_scheduler_t *s;
  uint8_t bytes[256];
  size_t size;
  ina_status_t status;
  char detail[256];
  pthread_t thread;
  int done; /* under issuer_mu */
} issuer_t;

static pthread_mutex_t issuer_mu = PTHREAD_MUTEX_INITIALIZER;

static void *issue(void *arg) {
  issuer_t *is = arg;
  is->status = ina_scheduler_control(is->s, is->bytes, is->size, is->detail, sizeof is->detail);
  pthread_mutex_lock(&issuer_mu);
  is->done = 1;
  pthread_mutex_unlock(&issuer_mu);
  return NULL;
}

/* Seconds until the issuer's command returned; exits when that takes over 30 s (a
 * command nobody runs would otherwise hang the test). */
static double wait_issued(issuer_t *is, double t0) {
  for (;;) {
    pthread_mutex_lock(&issuer_mu);
    const int done = is->done;
    pthread_mutex_unlock(&issuer_mu);
    const double t = test_now_s() - t0;
    if (done) return t;
    if (t > 30.0) {
      fprintf(stderr, "test_scheduler_control: a command issued to an idle scheduler did not return in 30 s\n");
      exit(1);
    }
    sleep_us(100);
  }
}

static void issuer_start(issuer_t *is, ina_scheduler_t *s, test_rng_t *rng, uint8_t op) {
  memset(is, 0, sizeof *is);
  memset(is->detail, 'x', sizeof is->detail - 1); /* a success must clear it */
  is->s = s;
  is->size = (size_t)test_rng_int(rng, 1, sizeof is->bytes);
  control_payload(rng, op, is->bytes, is->size);
  if (pthread_create(&is->thread, NULL, issue, is) != 0) exit(1);
}

/* ---- 1: the run loop's driver thread, outcomes, serving after a failure -------------- */

static void test_run_loop(const ina_model_t *m, ina_engine_t *ref, test_rng_t *rng, int32_t vocab) {
  ina_engine_t *e = sched_test_engine(m, 4, 64);
  control_log_t *L = log_new(e);
  ina_scheduler_t *s = make_scheduler(e, L, 16);
  const pthread_t me = pthread_self();
  CHECK_OK(ina_scheduler_run_start(s));

  /* Idle: the loop wakes for the command. */
  static issuer_t idle;
  const double t0 = test_now_s();
  issuer_start(&idle, s, rng, OP_OK);
  const double idle_seconds = wait_issued(&idle, t0);
  pthread_join(idle.thread, NULL);
  CHECKF(idle_seconds < 2.0, "an idle scheduler took %.3f s to run a command", idle_seconds);
  CHECK_OK(idle.status);
  CHECK(idle.detail[0] == '\0');
  CHECK(L->n == 1 && L->rec[0].digest == control_digest(idle.bytes, idle.size) && L->rec[0].size == idle.size);
  CHECK(L->rec[0].engine_matches && !pthread_equal(L->rec[0].thread, me));
  uint8_t small[64];
  const size_t small_size = (size_t)test_rng_int(rng, 1, sizeof small);
  char detail[256];

  /* A command of 1 MiB and 3 bytes (copied, and the copy is what runs). */
  const size_t big_size = ((size_t)1 << 20) + 3;
  uint8_t *big = malloc(big_size);
  control_payload(rng, OP_OK, big, big_size);
  const uint64_t big_digest = control_digest(big, big_size);
  CHECK_OK(ina_scheduler_control(s, big, big_size, NULL, 0));
  CHECK(L->n == 2 && L->rec[1].digest == big_digest && L->rec[1].size == big_size);
  free(big);

  /* While a request runs: commands on the thread that delivers its tokens; a command
   * from its callback is refused. */
  static tracked_t a, b;
  tracked_init(&a, "a", rng, vocab, (int32_t)test_rng_int(rng, 2, 24), 24);
  tracked_reference(&a, ref);
  a.control_at_first_token = 1;
  ina_request_t ra = tracked_request(&a, s);
  ina_log_set_quiet_errors(1); /* the refusal in the callback */
  CHECK_OK(ina_scheduler_submit(s, &ra));
  int issued = 0;
  while (tracked_finals(&a) == 0 || issued < 3) {
    control_payload(rng, OP_OK, small, small_size);
    CHECK_OK(ina_scheduler_control(s, small, small_size, NULL, 0));
    issued++;
  }
  wait_final(&a);
  ina_log_set_quiet_errors(0);
  CHECK(L->n == 2 + issued);
  CHECK(a.have_thread && a.other_threads == 0 && !pthread_equal(a.thread, me));
  for (int i = 0; i < L->n && i < MAX_RECORDS; i++)
    CHECKF(pthread_equal(L->rec[i].thread, a.thread) && L->rec[i].engine_matches,
           "command %d ran on another thread than the token events, or with another engine", i);
  CHECKF(a.control_status == INA_ERR_INVALID_ARGUMENT, "a command from a request callback returned %d",
         a.control_status);
  CHECK(a.col.finals == 1 && a.col.finish == INA_FINISH_LENGTH && tokens_equal(&a.col, a.ref, a.ref_len));

  /* Outcomes: status and message, cut to the caller's buffer; a nested command. */
  ina_log_set_quiet_errors(1);
  const int before = L->n;
  control_payload(rng, OP_FAIL, small, small_size);
  CHECK(ina_scheduler_control(s, small, small_size, detail, sizeof detail) == INA_ERR_FORMAT);
  CHECKF(strstr(detail, "asked to fail") != NULL, "detail: '%s'", detail);
  char full[256], cut[12];
  snprintf(full, sizeof full, "%s", detail);
  memset(cut, 'x', sizeof cut);
  CHECK(ina_scheduler_control(s, small, small_size, cut, sizeof cut) == INA_ERR_FORMAT);
  CHECK(strlen(cut) == sizeof cut - 1 && strncmp(cut, full, sizeof cut - 1) == 0);
  CHECK(ina_scheduler_control(s, small, small_size, NULL, 0) == INA_ERR_FORMAT);
  control_payload(rng, OP_FAIL_SILENT, small, small_size);
  CHECK(ina_scheduler_control(s, small, small_size, detail, sizeof detail) == INA_ERR_IO);
  CHECKF(strstr(detail, ina_status_string(INA_ERR_IO)) != NULL, "detail of a silent failure: '%s'", detail);
  control_payload(rng, OP_REENTER, small, small_size);
  CHECK_OK(ina_scheduler_control(s, small, small_size, detail, sizeof detail));
  ina_log_set_quiet_errors(0);
  CHECK(L->n == before + 5); /* the nested one did not run */
  CHECK(L->rec[before + 4].nested == INA_ERR_INVALID_ARGUMENT);

  /* Still serving: the same prompt again gives the same tokens. */
  tracked_init(&b, "b", rng, vocab, a.prompt_len, a.max_new);
  memcpy(b.prompt, a.prompt, sizeof a.prompt);
  ina_request_t rb = tracked_request(&b, s);
  CHECK_OK(ina_scheduler_submit(s, &rb));
  wait_final(&b);
  CHECK(b.col.finals == 1 && tokens_equal(&b.col, a.col.tokens, a.col.num_tokens));
  printf("run loop: idle command in %.4f s, %d commands beside a request\n", idle_seconds, issued);

  ina_scheduler_run_stop(s);
  ina_scheduler_destroy(s);
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  CHECK(ina_page_pool_free_pages(pool) == ina_page_pool_num_pages(pool));
  sched_collector_destroy(&a.col);
  sched_collector_destroy(&b.col);
  log_free(L);
  ina_engine_destroy(e);
}

/* ---- 2: commands beside running requests change no token ---------------------------- */

enum { NREQ = 8 };

typedef struct commander {
  ina_scheduler_t *s;
  uint64_t seed;
  pthread_mutex_t mu;
  int stop;
  int issued, failed_as_asked, wrong; /* wrong: a status other than the one asked for */
} commander_t;

static void *command_loop(void *arg) {
  commander_t *c = arg;
  test_rng_t rng = {c->seed};
  uint8_t bytes[4096];
  for (;;) {
    pthread_mutex_lock(&c->mu);
    const int stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    if (stop) break;
    const int fail = test_rng_int(&rng, 0, 7) == 0;
    const size_t size = (size_t)test_rng_int(&rng, 1, sizeof bytes);
    control_payload(&rng, fail ? OP_FAIL : OP_OK, bytes, size);
    const ina_status_t st = ina_scheduler_control(c->s, bytes, size, NULL, 0);
    c->issued++;
    c->failed_as_asked += fail && st == INA_ERR_FORMAT;
    c->wrong += st != (fail ? INA_ERR_FORMAT : INA_OK);
  }
  return NULL;
}

/* Run the requests on a fresh engine; with_commands: a thread issues commands until they
 * are all finished. Returns the steps taken; *mid_flight counts commands that ran
 * between the first step and the last. */
static int64_t run_requests(const ina_model_t *m, tracked_t *reqs, int with_commands, uint64_t seed,
                            int *issued, int *mid_flight) {
  ina_engine_t *e = sched_test_engine(m, 4, 160);
  control_log_t *L = log_new(e);
  ina_scheduler_t *s = make_scheduler(e, L, 12);
  /* All queued before the loop starts: both runs plan the same batches. */
  for (int i = 0; i < NREQ; i++) {
    ina_request_t r = tracked_request(&reqs[i], s);
    CHECK_OK(ina_scheduler_submit(s, &r));
  }
  CHECK_OK(ina_scheduler_run_start(s));
  commander_t c;
  memset(&c, 0, sizeof c);
  c.s = s;
  c.seed = seed;
  pthread_mutex_init(&c.mu, NULL);
  pthread_t thread;
  if (with_commands && pthread_create(&thread, NULL, command_loop, &c) != 0) exit(1);
  for (int i = 0; i < NREQ; i++) wait_final(&reqs[i]);
  if (with_commands) {
    pthread_mutex_lock(&c.mu);
    c.stop = 1;
    pthread_mutex_unlock(&c.mu);
    pthread_join(thread, NULL);
  }
  ina_scheduler_run_stop(s);
  ina_scheduler_stats_t st;
  ina_scheduler_stats(s, &st);
  *issued = c.issued;
  *mid_flight = 0;
  for (int i = 0; i < L->n && i < MAX_RECORDS; i++) *mid_flight += L->rec[i].steps > 0 && L->rec[i].steps < st.steps;
  CHECK(c.wrong == 0 && L->n == c.issued);
  ina_scheduler_destroy(s);
  pthread_mutex_destroy(&c.mu);
  log_free(L);
  ina_engine_destroy(e);
  return st.steps;
}

static void test_interleaved(const ina_model_t *m, ina_engine_t *ref, test_rng_t *rng, int32_t vocab) {
  static tracked_t plain[NREQ], commanded[NREQ];
  for (int i = 0; i < NREQ; i++) {
    char id[16];
    snprintf(id, sizeof id, "req-%d", i);
    tracked_init(&plain[i], id, rng, vocab, (int32_t)test_rng_int(rng, 2, 32), (int32_t)test_rng_int(rng, 8, 32));
    if (i % 2) {
      plain[i].sampling.temperature = 0.8f;
      plain[i].sampling.top_k = 20;
      plain[i].sampling.seed = test_rng_next(rng);
    }
    tracked_reference(&plain[i], ref);
    commanded[i] = plain[i];
    sched_collector_init(&commanded[i].col, id);
  }
  int issued = 0, mid = 0, unused = 0;
  const int64_t steps_plain = run_requests(m, plain, 0, 0, &unused, &unused);
  ina_log_set_quiet_errors(1); /* the commands asked to fail */
  const int64_t steps_commanded = run_requests(m, commanded, 1, test_rng_next(rng), &issued, &mid);
  ina_log_set_quiet_errors(0);
  for (int i = 0; i < NREQ; i++) {
    CHECKF(tokens_equal(&plain[i].col, plain[i].ref, plain[i].ref_len), "request %d alone and in the plain run differ",
           i);
    CHECKF(tokens_equal(&commanded[i].col, plain[i].col.tokens, plain[i].col.num_tokens),
           "request %d: the run with commands gave other tokens", i);
    CHECK(commanded[i].col.finals == 1 && commanded[i].col.finish == INA_FINISH_LENGTH);
    sched_collector_destroy(&plain[i].col);
    sched_collector_destroy(&commanded[i].col);
  }
  CHECKF(steps_plain == steps_commanded, "%lld steps without commands, %lld with", (long long)steps_plain,
         (long long)steps_commanded);
  CHECKF(mid > 0, "no command ran while the requests were in flight (%d issued)", issued);
  printf("interleaved: %lld steps, %d commands, %d of them between the first step and the last\n",
         (long long)steps_commanded, issued, mid);
}

/* ---- 3: without a run loop, commands wait for the next step and run first, in order -- */

static void test_manual_steps(const ina_model_t *m, ina_engine_t *ref, test_rng_t *rng, int32_t vocab) {
  ina_engine_t *e = sched_test_engine(m, 4, 64);
  control_log_t *L = log_new(e);
  ina_scheduler_t *s = make_scheduler(e, L, 32);
  static tracked_t x, y;
  tracked_init(&x, "x", rng, vocab, (int32_t)test_rng_int(rng, 2, 12), 4); /* submitted by a command */
  tracked_init(&y, "y", rng, vocab, (int32_t)test_rng_int(rng, 2, 12), 4); /* submitted before */
  tracked_reference(&x, ref);
  tracked_reference(&y, ref);
  L->submit = tracked_request(&x, s);
  ina_request_t ry = tracked_request(&y, s);
  CHECK_OK(ina_scheduler_submit(s, &ry));

  enum { N = 4 };
  static issuer_t is[N];
  for (int i = 0; i < N; i++) {
    issuer_start(&is[i], s, rng, i == 2 ? OP_SUBMIT : OP_OK);
    wait_queued(s, i + 1);
  }
  CHECK(log_count(L) == 0); /* nobody drives: nothing ran */
  int32_t scheduled = 0;
  CHECK_OK(ina_scheduler_step(s, &scheduled));
  for (int i = 0; i < N; i++) pthread_join(is[i].thread, NULL);
  CHECK(L->n == N);
  for (int i = 0; i < N; i++) {
    CHECK_OK(is[i].status);
    CHECK(is[i].detail[0] == '\0');
    CHECKF(L->rec[i].digest == control_digest(is[i].bytes, is[i].size), "command %d ran out of order", i);
    CHECK(L->rec[i].steps == 0 && pthread_equal(L->rec[i].thread, pthread_self()) && L->rec[i].engine_matches);
  }
  /* The request a command submitted was taken in by the same step. */
  CHECK_OK(L->submit_status);
  CHECK(scheduled == 2 && x.col.num_tokens == 1 && y.col.num_tokens == 1);
  sched_test_drain(s, 100);
  CHECK(tokens_equal(&x.col, x.ref, x.ref_len) && tokens_equal(&y.col, y.ref, y.ref_len));
  ina_scheduler_destroy(s);
  sched_collector_destroy(&x.col);
  sched_collector_destroy(&y.col);
  log_free(L);
  ina_engine_destroy(e);
}

/* ---- 4: run_stop and destroy hand waiting commands back unrun ------------------------ */

typedef struct stopper {
  ina_scheduler_t *s;
  pthread_t thread;
} stopper_t;

static void *stop_run_loop(void *arg) {
  ina_scheduler_run_stop(((stopper_t *)arg)->s);
  return NULL;
}

static void test_cancellation(const ina_model_t *m, test_rng_t *rng, int32_t vocab) {
  ina_engine_t *e = sched_test_engine(m, 4, 64);
  control_log_t *L = log_new(e);
  ina_scheduler_t *s = make_scheduler(e, L, 16);
  CHECK_OK(ina_scheduler_run_start(s));

  /* A runs (blocked inside the function), B waits behind it; then run_stop. */
  static issuer_t a, b, c, d;
  issuer_start(&a, s, rng, OP_BLOCK);
  pthread_mutex_lock(&L->mu);
  while (!L->block_entered) pthread_cond_wait(&L->cond, &L->mu);
  pthread_mutex_unlock(&L->mu);
  issuer_start(&b, s, rng, OP_OK);
  wait_queued(s, 1);
  stopper_t stopper = {s, 0};
  if (pthread_create(&stopper.thread, NULL, stop_run_loop, &stopper) != 0) exit(1);
  for (int stopping = 0; !stopping; sleep_us(1000)) {
    pthread_mutex_lock(&s->mu);
    stopping = s->run_stop;
    pthread_mutex_unlock(&s->mu);
  }
  pthread_mutex_lock(&L->mu);
  L->gate_open = 1;
  pthread_cond_broadcast(&L->cond);
  pthread_mutex_unlock(&L->mu);
  pthread_join(stopper.thread, NULL);
  pthread_join(a.thread, NULL);
  pthread_join(b.thread, NULL);
  CHECK_OK(a.status);
  CHECKF(b.status == INA_ERR_UNSUPPORTED && strstr(b.detail, "run loop stopped") != NULL,
         "a command waiting at run_stop: status %d, detail '%s'", b.status, b.detail);
  CHECK(L->n == 1);

  /* Stopped: the next command waits for a step by hand. */
  issuer_start(&c, s, rng, OP_OK);
  wait_queued(s, 1);
  CHECK_OK(ina_scheduler_step(s, NULL));
  pthread_join(c.thread, NULL);
  CHECK_OK(c.status);
  CHECK(L->n == 2 && L->rec[1].digest == control_digest(c.bytes, c.size));

  /* destroy: the waiting command is handed back; the final event of a request cancelled
   * by destroy cannot issue one. */
  static tracked_t z;
  tracked_init(&z, "z", rng, vocab, 4, 4);
  z.control_at_final = 1;
  ina_request_t rz = tracked_request(&z, s);
  CHECK_OK(ina_scheduler_submit(s, &rz));
  issuer_start(&d, s, rng, OP_OK);
  wait_queued(s, 1);
  ina_log_set_quiet_errors(1);
  ina_scheduler_destroy(s);
  ina_log_set_quiet_errors(0);
  pthread_join(d.thread, NULL);
  CHECKF(d.status == INA_ERR_UNSUPPORTED && strstr(d.detail, "destroyed") != NULL,
         "a command waiting at destroy: status %d, detail '%s'", d.status, d.detail);
  CHECK(L->n == 2);
  CHECK(z.col.finals == 1 && z.col.finish == INA_FINISH_CANCELLED);
  CHECK(z.control_status == INA_ERR_INVALID_ARGUMENT);
  sched_collector_destroy(&z.col);
  log_free(L);
  ina_engine_destroy(e);
}

/* ---- 5: refusals --------------------------------------------------------------------- */

static void test_refusals(const ina_model_t *m, test_rng_t *rng) {
  ina_engine_t *e = sched_test_engine(m, 4, 64);
  control_log_t *L = log_new(e);
  uint8_t bytes[16];
  char detail[256];
  control_payload(rng, OP_OK, bytes, sizeof bytes);
  ina_log_set_quiet_errors(1);
  CHECK(ina_scheduler_control(NULL, bytes, sizeof bytes, NULL, 0) == INA_ERR_INVALID_ARGUMENT);

  /* No control function: the default config, and a version-2 config whose caller could
   * not know the new fields (whatever lies past its size is not read). */
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, NULL, &s));
  CHECK(ina_scheduler_control(s, bytes, sizeof bytes, detail, sizeof detail) == INA_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(detail, "config.control") != NULL, "detail: '%s'", detail);
  ina_scheduler_destroy(s);
  ina_scheduler_config_t v2 = INA_SCHEDULER_CONFIG_INIT;
  v2.version = 2;
  v2.struct_size = offsetof(ina_scheduler_config_t, control);
  v2.control = test_control;
  v2.control_user_data = L;
  s = NULL;
  CHECK_OK(ina_scheduler_create(e, &v2, &s));
  CHECK(ina_scheduler_control(s, bytes, sizeof bytes, NULL, 0) == INA_ERR_INVALID_ARGUMENT);
  ina_scheduler_destroy(s);

  /* Bad commands, on a scheduler that has a function and a run loop. */
  s = make_scheduler(e, L, 16);
  CHECK_OK(ina_scheduler_run_start(s));
  CHECK(ina_scheduler_control(s, NULL, 8, detail, sizeof detail) == INA_ERR_INVALID_ARGUMENT);
  CHECK(detail[0] != '\0');
  CHECK(ina_scheduler_control(s, bytes, 0, NULL, 0) == INA_ERR_INVALID_ARGUMENT);
  /* Refused before a byte is read: the buffer need not be that long. */
  CHECK(ina_scheduler_control(s, bytes, INA_SCHEDULER_CONTROL_MAX_BYTES + 1, detail, sizeof detail) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECKF(strstr(detail, "exceeds") != NULL, "detail: '%s'", detail);
  ina_log_set_quiet_errors(0);
  CHECK(L->n == 0);
  CHECK_OK(ina_scheduler_control(s, bytes, sizeof bytes, NULL, 0));
  CHECK(L->n == 1);
  ina_scheduler_destroy(s);
  log_free(L);
  ina_engine_destroy(e);
}

int main(void) {
  test_rng_t rng = {test_seed("test_scheduler_control")};
  ina_model_t *m = sched_test_model(test_rng_next(&rng));
  const int32_t vocab = ina_model_config(m)->vocab_size;
  ina_engine_t *ref = sched_test_engine(m, 4, 256);
  test_run_loop(m, ref, &rng, vocab);
  test_interleaved(m, ref, &rng, vocab);
  test_manual_steps(m, ref, &rng, vocab);
  test_cancellation(m, &rng, vocab);
  test_refusals(m, &rng);
  ina_engine_destroy(ref);
  ina_model_destroy(m);
  return test_finish("test_scheduler_control");
}
