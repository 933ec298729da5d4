/* Stopping an in-process agent with Generate streams in flight:
 *   - long streams outliving a short grace period end with FINISH_REASON_CANCELLED
 *     soon after it, short ones finish normally, health turns NOT_SERVING while
 *     draining, and ina_agent_wait returns within the grace period plus a bound;
 *   - with a long grace period, everything in flight finishes normally.
 * Run under ASan, the process exit also checks that nothing leaked. */
#include "tests/test_util.h"
#include "tests/agent/daemon/agent_test_util.h"

typedef struct stream_thread {
  ina_rpc_client_t *client;
  char id[32];
  int32_t prompt[16];
  int32_t len;
  uint32_t max_tokens;
  at_stream_t stream;
  pthread_t thread;
} stream_thread_t;

static void *run_stream(void *arg) {
  stream_thread_t *t = arg;
  at_request_t r = {t->id, t->prompt, t->len, t->max_tokens, 1, 0};
  at_generate(t->client, &r, &t->stream);
  return NULL;
}

static void start_streams(stream_thread_t *t, int n, ina_rpc_client_t *c, test_rng_t *rng,
                          const char *prefix, uint32_t max_tokens) {
  for (int i = 0; i < n; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].client = c;
    snprintf(t[i].id, sizeof t[i].id, "%s-%d", prefix, i);
    t[i].len = (int32_t)test_rng_int(rng, 1, 16);
    for (int32_t k = 0; k < t[i].len; k++) t[i].prompt[k] = (int32_t)test_rng_int(rng, 0, 1023);
    t[i].max_tokens = max_tokens;
    CHECK(pthread_create(&t[i].thread, NULL, run_stream, &t[i]) == 0);
  }
}

static int all_started(stream_thread_t *t, int n, int timeout_ms) {
  double end = test_now_s() + timeout_ms / 1000.0;
  for (int i = 0; i < n; i++)
    while (atomic_load(&t[i].stream.num_tokens) < 1) {
      if (test_now_s() > end) return 0;
      at_sleep_ms(1);
    }
  return 1;
}

typedef struct prober {
  ina_rpc_client_t *client;
  atomic_int stop;
  int saw_not_serving;     /* health NOT_SERVING seen while the server still answered */
  int generate_refused_ok; /* a Generate during the drain got UNAVAILABLE */
} prober_t;

/* After the stop request: polls health until it is NOT_SERVING, then tries a Generate. */
static void *probe(void *arg) {
  prober_t *p = arg;
  while (!atomic_load(&p->stop)) {
    int h = at_health(p->client);
    if (h == 2) {
      p->saw_not_serving = 1;
      break;
    }
    if (h < 0) break; /* server already gone */
    at_sleep_ms(1);
  }
  static at_stream_t s;
  int32_t prompt[2] = {1, 2};
  at_request_t r = {"during-drain", prompt, 2, 4, 1, 0};
  at_generate(p->client, &r, &s);
  p->generate_refused_ok = s.st != INA_OK && s.status.code == INA_RPC_UNAVAILABLE && s.messages == 0;
  return NULL;
}

static void test_short_grace(uint64_t model_seed, test_rng_t *rng) {
  enum { LONG = 4, SHORT = 2 };
  const int64_t grace_ms = 300;
  static stream_thread_t long_streams[LONG], short_streams[SHORT];
  ina_agent_options_t o = at_options(model_seed, 16384);
  o.drain_grace_ms = grace_ms;
  ina_agent_t *agent = NULL;
  CHECK_OK(ina_agent_create(&o, &agent));
  if (!agent) return;
  CHECK_OK(ina_agent_wait_serving(agent, 60000));
  ina_rpc_client_t *c = at_client(ina_agent_port(agent), NULL);

  /* Long streams cannot finish 3000 tokens each within the grace period on the CPU. */
  start_streams(long_streams, LONG, c, rng, "long", 3000);
  CHECK(all_started(long_streams, LONG, 30000));
  start_streams(short_streams, SHORT, c, rng, "short", 3);

  prober_t p = {c, 0, 0, 0};
  pthread_t prober_thread;
  double t0 = test_now_s();
  ina_agent_request_stop(agent);
  CHECK(pthread_create(&prober_thread, NULL, probe, &p) == 0);
  CHECK_OK(ina_agent_wait(agent));
  double took = test_now_s() - t0;
  atomic_store(&p.stop, 1);
  pthread_join(prober_thread, NULL);
  for (int i = 0; i < LONG; i++) pthread_join(long_streams[i].thread, NULL);
  for (int i = 0; i < SHORT; i++) pthread_join(short_streams[i].thread, NULL);

  /* The bound covers the cancelled requests' last step and the server shutdown. */
  CHECKF(took >= grace_ms / 1000.0 && took < grace_ms / 1000.0 + 10.0, "drain took %.3f s", took);
  printf("drain with %d long streams and grace %lld ms took %.3f s\n", LONG, (long long)grace_ms, took);
  CHECK(p.saw_not_serving);
  CHECK(p.generate_refused_ok);
  for (int i = 0; i < LONG; i++) {
    at_stream_t *s = &long_streams[i].stream;
    CHECKF(s->st == INA_OK, "long %d: %s %s", i, ina_rpc_code_name(s->status.code), s->status.message);
    CHECK(s->finals == 1 && s->finish == INA__V1__FINISH_REASON__FINISH_REASON_CANCELLED && s->bad == 0);
    CHECK(atomic_load(&s->num_tokens) >= 1 && atomic_load(&s->num_tokens) < 3000);
  }
  for (int i = 0; i < SHORT; i++) {
    at_stream_t *s = &short_streams[i].stream;
    /* Submitted before the stop request... unless the stop won the race: then refused. */
    if (s->st == INA_OK) {
      CHECK(s->finals == 1 && s->finish == INA__V1__FINISH_REASON__FINISH_REASON_LENGTH);
      CHECK(atomic_load(&s->num_tokens) == 3);
    } else {
      CHECK(s->status.code == INA_RPC_UNAVAILABLE && s->messages == 0);
    }
  }
  /* After the drain the server is gone: calls fail fast. */
  CHECK(at_health(c) < 0);
  ina_rpc_client_destroy(c);
  ina_agent_destroy(agent);
}

static void test_long_grace(uint64_t model_seed, test_rng_t *rng) {
  enum { N = 3 };
  static stream_thread_t streams[N];
  ina_agent_options_t o = at_options(model_seed, 4096);
  o.drain_grace_ms = 60000;
  ina_agent_t *agent = NULL;
  CHECK_OK(ina_agent_create(&o, &agent));
  if (!agent) return;
  CHECK_OK(ina_agent_wait_serving(agent, 60000));
  ina_rpc_client_t *c = at_client(ina_agent_port(agent), NULL);
  uint32_t max_tokens = (uint32_t)test_rng_int(rng, 20, 60);
  start_streams(streams, N, c, rng, "finish", max_tokens);
  CHECK(all_started(streams, N, 30000));
  double t0 = test_now_s();
  ina_agent_request_stop(agent);
  ina_agent_request_stop(agent); /* repeated requests are harmless */
  CHECK_OK(ina_agent_wait(agent));
  double took = test_now_s() - t0;
  for (int i = 0; i < N; i++) pthread_join(streams[i].thread, NULL);
  CHECKF(took < 30.0, "drain took %.3f s", took);
  for (int i = 0; i < N; i++) {
    at_stream_t *s = &streams[i].stream;
    CHECKF(s->st == INA_OK, "stream %d: %s", i, s->status.message);
    CHECK(s->finals == 1 && s->finish == INA__V1__FINISH_REASON__FINISH_REASON_LENGTH);
    CHECK(atomic_load(&s->num_tokens) == (int)max_tokens);
  }
  ina_rpc_client_destroy(c);
  ina_agent_destroy(agent);
}

/* Destroying an agent without ina_agent_wait, streams in flight: they are cancelled. */
static void test_destroy_without_wait(uint64_t model_seed, test_rng_t *rng) {
  static stream_thread_t streams[2];
  ina_agent_options_t o = at_options(model_seed, 16384);
  ina_agent_t *agent = NULL;
  CHECK_OK(ina_agent_create(&o, &agent));
  if (!agent) return;
  CHECK_OK(ina_agent_wait_serving(agent, 60000));
  ina_rpc_client_t *c = at_client(ina_agent_port(agent), NULL);
  start_streams(streams, 2, c, rng, "destroyed", 3000);
  CHECK(all_started(streams, 2, 30000));
  ina_agent_destroy(agent);
  for (int i = 0; i < 2; i++) {
    pthread_join(streams[i].thread, NULL);
    CHECK(streams[i].stream.st == INA_OK &&
          streams[i].stream.finish == INA__V1__FINISH_REASON__FINISH_REASON_CANCELLED);
  }
  ina_rpc_client_destroy(c);
}

int main(void) {
  test_rng_t rng = {test_seed("test_agent_drain")};
  ina_log_set_quiet_errors(1);
  uint64_t model_seed = test_rng_next(&rng);
  test_short_grace(model_seed, &rng);
  test_long_grace(model_seed, &rng);
  test_destroy_without_wait(model_seed, &rng);
  return test_finish("test_agent_drain");
}
