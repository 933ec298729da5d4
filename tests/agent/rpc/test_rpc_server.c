/* The rpc server and client over loopback: unary and streaming calls with random
 * messages, many concurrent clients, garbage requests, unknown methods, bearer tokens,
 * the message size limit, deadlines, a client that cancels mid-stream, and shutdown
 * with streams open. Every blocking call has a deadline, so a bug fails the test
 * instead of hanging it. */
#include <stdio.h>

#include "core/log.h"
#include "tests/agent/rpc/rpc_fixture.h"

#define CALL_DEADLINE_MS 10000
#define MAX_MESSAGE_BYTES (64 * 1024)

static fixture_t g_fx;
static char g_token[64];
static char g_target[64];

static ina_rpc_client_t *make_client(const char *token) {
  ina_rpc_client_options_t o = INA_RPC_CLIENT_OPTIONS_INIT;
  o.target = g_target;
  o.bearer_token = token;
  o.default_deadline_ms = CALL_DEADLINE_MS;
  ina_rpc_client_t *c = NULL;
  CHECK_OK(ina_rpc_client_create(&o, &c));
  return c;
}

static ina_rpc_server_t *start_server(int threads) {
  ina_rpc_server_options_t o = INA_RPC_SERVER_OPTIONS_INIT;
  o.max_message_bytes = MAX_MESSAGE_BYTES;
  o.num_threads = threads;
  ina_rpc_server_t *s = NULL;
  CHECK_OK(ina_rpc_server_create(&o, &s));
  if (!s) return NULL;
  CHECK_OK(fx_register(s, &g_fx, g_token));
  CHECK_OK(ina_rpc_server_start(s));
  CHECK(ina_rpc_server_port(s) > 0);
  snprintf(g_target, sizeof g_target, "127.0.0.1:%d", ina_rpc_server_port(s));
  return s;
}

/* One echo call with a random message; returns whether the reply was the echo. */
static int echo_once(ina_rpc_client_t *c, test_rng_t *rng) {
  uint8_t *req = NULL, *resp = NULL;
  size_t req_size = 0, resp_size = 0;
  fx_random_health(rng, &req, &req_size, (size_t)test_rng_int(rng, 0, 300));
  ina_rpc_status_t status;
  ina_status_t st = ina_rpc_client_unary(c, ECHO_METHOD, req, req_size, 0, &resp, &resp_size,
                                         &status);
  int ok = st == INA_OK && status.code == INA_RPC_OK && fx_is_echo(req, req_size, resp, resp_size);
  if (!ok) fprintf(stderr, "echo failed: %s: %s\n", ina_rpc_code_name(status.code), status.message);
  free(req);
  free(resp);
  return ok;
}

static int run_count(ina_rpc_client_t *c, const char *method, const char *id, uint32_t n,
                     uint32_t cancel_after, int64_t deadline_ms, stream_sink_t *sink,
                     ina_rpc_status_t *status) {
  uint8_t *req = NULL;
  size_t req_size = 0;
  fx_stream_request_bytes(id, n, &req, &req_size);
  *sink = (stream_sink_t){.request_id = id, .n_expected = n, .cancel_after = cancel_after};
  ina_status_t st = ina_rpc_client_stream(c, method, req, req_size, deadline_ms, fx_sink_message,
                                          sink, status);
  free(req);
  return st;
}

/* single_thread: the server has one completion-queue thread, which runs the Count
 * handler, so no send can complete while it writes: all but the first message must
 * still be queued when it finishes (one write in flight at a time). */
static void test_unary_and_stream(test_rng_t *rng, int single_thread) {
  ina_rpc_client_t *c = make_client(NULL);
  int before = atomic_load(&g_fx.unary_runs);
  for (int i = 0; i < 20; i++) CHECK(echo_once(c, rng));
  CHECK(atomic_load(&g_fx.unary_runs) == before + 20);

  /* An empty request is a valid (default) NodeHealth. */
  uint8_t *resp = NULL;
  size_t resp_size = 0;
  ina_rpc_status_t status;
  CHECK_OK(ina_rpc_client_unary(c, ECHO_METHOD, NULL, 0, 0, &resp, &resp_size, &status));
  CHECK(fx_is_echo(NULL, 0, resp, resp_size));
  free(resp);

  uint32_t sizes[] = {0, 1, 2, 17, (uint32_t)test_rng_int(rng, 50, 400)};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    stream_sink_t sink;
    CHECK_OK(run_count(c, COUNT_METHOD, "count", sizes[k], 0, 0, &sink, &status));
    CHECKF(sink.received == sizes[k] && sink.bad == 0 && sink.saw_last == (sizes[k] > 0),
           "n %u: received %u bad %u last %d", sizes[k], sink.received, sink.bad, sink.saw_last);
    long pending = atomic_load(&g_fx.count_pending);
    if (single_thread) {
      CHECKF(pending == (sizes[k] > 0 ? (long)sizes[k] - 1 : 0), "n %u: %ld pending", sizes[k],
             pending);
    } else {
      CHECK(pending >= 0 && pending < (long)sizes[k] + (sizes[k] == 0));
    }
    CHECK_OK(run_count(c, TICKER_METHOD, "tick", sizes[k] % 40, 0, 0, &sink, &status));
    CHECK(sink.received == sizes[k] % 40 && sink.bad == 0);
  }
  ina_rpc_client_destroy(c);
}

typedef struct worker_arg {
  ina_rpc_client_t *shared; /* NULL: the worker makes its own client */
  uint64_t seed;
  int calls;
  int good;
} worker_arg_t;

static void *worker_main(void *p) {
  worker_arg_t *a = p;
  test_rng_t rng = {a->seed};
  ina_rpc_client_t *c = a->shared ? a->shared : make_client(NULL);
  for (int i = 0; i < a->calls; i++) {
    if (i % 5 == 4) {
      stream_sink_t sink;
      ina_rpc_status_t status;
      char id[32];
      snprintf(id, sizeof id, "w%llu-%d", (unsigned long long)(a->seed % 1000), i);
      uint32_t n = (uint32_t)test_rng_int(&rng, 1, 60);
      ina_status_t st = run_count(c, COUNT_METHOD, id, n, 0, 0, &sink, &status);
      a->good += st == INA_OK && sink.received == n && sink.bad == 0 && sink.saw_last;
    } else {
      a->good += echo_once(c, &rng);
    }
  }
  if (!a->shared) ina_rpc_client_destroy(c);
  return NULL;
}

static void test_concurrent_clients(test_rng_t *rng) {
  enum { THREADS = 8, CALLS = 25 };
  ina_rpc_client_t *shared = make_client(NULL);
  pthread_t threads[THREADS];
  worker_arg_t args[THREADS];
  double t0 = fx_now_s();
  for (int i = 0; i < THREADS; i++) {
    args[i] = (worker_arg_t){i % 2 ? shared : NULL, test_rng_next(rng), CALLS, 0};
    CHECK(pthread_create(&threads[i], NULL, worker_main, &args[i]) == 0);
  }
  int good = 0;
  for (int i = 0; i < THREADS; i++) {
    pthread_join(threads[i], NULL);
    good += args[i].good;
  }
  CHECKF(good == THREADS * CALLS, "%d of %d concurrent calls right", good, THREADS * CALLS);
  printf("concurrent: %d threads x %d calls in %.2f s\n", THREADS, CALLS, fx_now_s() - t0);
  ina_rpc_client_destroy(shared);
}

static void test_garbage(ina_rpc_server_t *server, test_rng_t *rng) {
  ina_rpc_client_t *c = make_client(NULL);
  uint8_t garbage[64];
  int rejected = 0;
  /* Fixed: field 1 (an enum, varint) sent as a length-delimited field running past the
   * end; then random strings, whose fate is whatever a local decode says. */
  static const uint8_t kBad[] = {0x0A, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x01};
  for (int i = 0; i < 40; i++) {
    size_t n;
    if (i == 0) {
      n = sizeof kBad;
      memcpy(garbage, kBad, n);
    } else {
      n = (size_t)test_rng_int(rng, 1, sizeof garbage);
      for (size_t k = 0; k < n; k++) garbage[k] = (uint8_t)test_rng_next(rng);
    }
    Ina__V1__NodeHealth *local = ina__v1__node_health__unpack(NULL, n, garbage);
    uint8_t *resp = NULL;
    size_t resp_size = 0;
    ina_rpc_status_t status;
    ina_status_t st =
        ina_rpc_client_unary(c, ECHO_METHOD, garbage, n, 0, &resp, &resp_size, &status);
    if (local) {
      CHECK(st == INA_OK && fx_is_echo(garbage, n, resp, resp_size));
      ina__v1__node_health__free_unpacked(local, NULL);
    } else {
      CHECKF(st == INA_ERR_INVALID_ARGUMENT && status.code == INA_RPC_INVALID_ARGUMENT &&
                 strstr(status.message, "not an ina.v1.NodeHealth"),
             "garbage %d: %s %s", i, ina_rpc_code_name(status.code), status.message);
      CHECK(resp == NULL && resp_size == 0);
      rejected++;
    }
    free(resp);
  }
  CHECK(rejected >= 1);
  /* Garbage to a stream: INVALID_ARGUMENT, no message. */
  stream_sink_t sink = {.request_id = "x"};
  ina_rpc_status_t status;
  CHECK(ina_rpc_client_stream(c, COUNT_METHOD, kBad, sizeof kBad, 0, fx_sink_message, &sink,
                              &status) == INA_ERR_INVALID_ARGUMENT);
  CHECK(status.code == INA_RPC_INVALID_ARGUMENT && sink.received == 0);
  /* The server keeps serving. */
  CHECK(echo_once(c, rng));
  CHECK(fx_wait_idle(server, 5000));
  ina_rpc_client_destroy(c);
}

static void test_unknown_method(test_rng_t *rng) {
  ina_rpc_client_t *c = make_client(NULL);
  const char *paths[] = {"/ina.test.Echo/Nope", "/no.such.Service/Health", "/ina.test.Echo/health"};
  for (size_t i = 0; i < 3; i++) {
    uint8_t *resp = NULL;
    size_t resp_size = 0;
    ina_rpc_status_t status;
    CHECK(ina_rpc_client_unary(c, paths[i], "x", 1, 0, &resp, &resp_size, &status) ==
          INA_ERR_UNSUPPORTED);
    CHECKF(status.code == INA_RPC_UNIMPLEMENTED && strstr(status.message, paths[i]),
           "%s: %s %s", paths[i], ina_rpc_code_name(status.code), status.message);
    stream_sink_t sink = {.request_id = "x"};
    CHECK(ina_rpc_client_stream(c, paths[i], NULL, 0, 0, fx_sink_message, &sink, &status) ==
          INA_ERR_UNSUPPORTED);
    CHECK(status.code == INA_RPC_UNIMPLEMENTED && sink.received == 0);
  }
  CHECK(echo_once(c, rng));
  ina_rpc_client_destroy(c);
}

static void test_bearer_token(test_rng_t *rng) {
  char wrong[sizeof g_token], longer[sizeof g_token + 1], prefix[sizeof g_token];
  snprintf(wrong, sizeof wrong, "%s", g_token);
  wrong[test_rng_int(rng, 0, (int64_t)strlen(wrong) - 1)] ^= 0x01;
  snprintf(longer, sizeof longer, "%sx", g_token);
  snprintf(prefix, sizeof prefix, "%.*s", (int)strlen(g_token) - 1, g_token);
  const char *refused[] = {NULL, wrong, longer, prefix};
  int runs = atomic_load(&g_fx.secure_runs);
  uint8_t *req = NULL;
  size_t req_size = 0;
  fx_random_health(rng, &req, &req_size, 20);
  for (size_t i = 0; i < 4; i++) {
    ina_rpc_client_t *c = make_client(refused[i]);
    uint8_t *resp = NULL;
    size_t resp_size = 0;
    ina_rpc_status_t status;
    CHECK(ina_rpc_client_unary(c, SECURE_METHOD, req, req_size, 0, &resp, &resp_size, &status) ==
          INA_ERR_IO);
    CHECKF(status.code == INA_RPC_UNAUTHENTICATED, "token %zu: %s", i,
           ina_rpc_code_name(status.code));
    /* Methods without a token still answer this client. */
    CHECK(echo_once(c, rng));
    ina_rpc_client_destroy(c);
  }
  CHECK(atomic_load(&g_fx.secure_runs) == runs); /* the handler never ran */
  ina_rpc_client_t *c = make_client(g_token);
  uint8_t *resp = NULL;
  size_t resp_size = 0;
  CHECK_OK(ina_rpc_client_unary(c, SECURE_METHOD, req, req_size, 0, &resp, &resp_size, NULL));
  CHECK(fx_is_echo(req, req_size, resp, resp_size));
  CHECK(atomic_load(&g_fx.secure_runs) == runs + 1);
  free(resp);
  free(req);
  ina_rpc_client_destroy(c);
}

static void test_message_limit(test_rng_t *rng) {
  ina_rpc_client_t *c = make_client(NULL);
  uint8_t *req = NULL, *resp = NULL;
  size_t req_size = 0, resp_size = 0;
  fx_random_health(rng, &req, &req_size, MAX_MESSAGE_BYTES + 100);
  int runs = atomic_load(&g_fx.unary_runs);
  ina_rpc_status_t status;
  CHECK(ina_rpc_client_unary(c, ECHO_METHOD, req, req_size, 0, &resp, &resp_size, &status) !=
        INA_OK);
  CHECKF(status.code == INA_RPC_RESOURCE_EXHAUSTED, "oversized request: %s %s",
         ina_rpc_code_name(status.code), status.message);
  CHECK(atomic_load(&g_fx.unary_runs) == runs);
  free(req);
  CHECK(echo_once(c, rng));
  ina_rpc_client_destroy(c);
}

static void test_cancel_and_deadline(ina_rpc_server_t *server) {
  ina_rpc_client_t *c = make_client(NULL);
  int cancelled = atomic_load(&g_fx.tickers_cancelled);
  int finished = atomic_load(&g_fx.tickers_finished);
  stream_sink_t sink;
  ina_rpc_status_t status;
  /* The client stops after 5 of 100000 messages. */
  CHECK(run_count(c, TICKER_METHOD, "cancel-me", 100000, 5, 0, &sink, &status) == INA_ERR_IO);
  CHECKF(status.code == INA_RPC_CANCELLED, "%s", ina_rpc_code_name(status.code));
  CHECK(sink.received == 5 && sink.bad == 0);
  CHECK(fx_wait_atomic(&g_fx.tickers_cancelled, cancelled + 1, 5000));
  CHECK(fx_wait_atomic(&g_fx.tickers_finished, finished + 1, 5000));
  CHECK(fx_wait_idle(server, 5000)); /* the writer was released */

  /* A deadline ends a stream that would run for 100 s. */
  double t0 = fx_now_s();
  CHECK(run_count(c, TICKER_METHOD, "deadline", 100000, 0, 150, &sink, &status) == INA_ERR_IO);
  CHECKF(status.code == INA_RPC_DEADLINE_EXCEEDED, "%s", ina_rpc_code_name(status.code));
  CHECK(sink.received >= 1 && sink.received < 100000 && sink.bad == 0);
  CHECK(fx_now_s() - t0 < 5.0);
  CHECK(fx_wait_atomic(&g_fx.tickers_cancelled, cancelled + 2, 5000));
  CHECK(fx_wait_idle(server, 5000));
  ina_rpc_client_destroy(c);
}

typedef struct open_stream {
  ina_rpc_client_t *client;
  stream_sink_t sink;
  ina_rpc_status_t status;
  ina_status_t st;
  atomic_int got_first;
} open_stream_t;

static int open_stream_message(void *ctx, const uint8_t *bytes, size_t size) {
  open_stream_t *o = ctx;
  fx_sink_message(&o->sink, bytes, size);
  atomic_store(&o->got_first, 1);
  return 0;
}

static void *open_stream_main(void *p) {
  open_stream_t *o = p;
  uint8_t *req = NULL;
  size_t req_size = 0;
  fx_stream_request_bytes("forever", 1000000, &req, &req_size);
  o->sink = (stream_sink_t){.request_id = "forever", .n_expected = 1000000};
  o->st = ina_rpc_client_stream(o->client, TICKER_METHOD, req, req_size, 20000,
                                open_stream_message, o, &o->status);
  free(req);
  return NULL;
}

/* Destroying the server with streams open cancels them on both sides, promptly. */
static void test_shutdown_with_open_streams(ina_rpc_server_t *server) {
  enum { STREAMS = 3 };
  open_stream_t streams[STREAMS];
  pthread_t threads[STREAMS];
  int cancelled = atomic_load(&g_fx.tickers_cancelled);
  ina_rpc_client_t *c = make_client(NULL);
  for (int i = 0; i < STREAMS; i++) {
    memset(&streams[i], 0, sizeof streams[i]);
    streams[i].client = c;
    CHECK(pthread_create(&threads[i], NULL, open_stream_main, &streams[i]) == 0);
  }
  for (int i = 0; i < STREAMS; i++) CHECK(fx_wait_atomic(&streams[i].got_first, 1, 5000));
  double t0 = fx_now_s();
  ina_rpc_server_destroy(server);
  double destroy_s = fx_now_s() - t0;
  for (int i = 0; i < STREAMS; i++) pthread_join(threads[i], NULL);
  double joined_s = fx_now_s() - t0;
  printf("shutdown with %d open streams: destroy %.3f s, clients done %.3f s\n", STREAMS,
         destroy_s, joined_s);
  CHECK(destroy_s < 5.0 && joined_s < 5.0);
  for (int i = 0; i < STREAMS; i++) {
    CHECKF(streams[i].st != INA_OK && (streams[i].status.code == INA_RPC_UNAVAILABLE ||
                                       streams[i].status.code == INA_RPC_CANCELLED),
           "stream %d ended with %s: %s", i, ina_rpc_code_name(streams[i].status.code),
           streams[i].status.message);
    CHECK(streams[i].sink.received >= 1 && streams[i].sink.bad == 0);
  }
  CHECK(atomic_load(&g_fx.tickers_cancelled) == cancelled + STREAMS);
  CHECK(fx_wait_zero(&g_fx.tickers_running, 5000));
  /* The server is gone: a new call fails fast (no server: UNAVAILABLE). */
  uint8_t *resp = NULL;
  size_t resp_size = 0;
  ina_rpc_status_t status;
  CHECK(ina_rpc_client_unary(c, ECHO_METHOD, NULL, 0, 2000, &resp, &resp_size, &status) != INA_OK);
  CHECK(status.code == INA_RPC_UNAVAILABLE || status.code == INA_RPC_DEADLINE_EXCEEDED);
  ina_rpc_client_destroy(c);
}

static void test_setup_errors(void) {
  ina_rpc_server_t *s = (ina_rpc_server_t *)1;
  ina_rpc_server_options_t o = INA_RPC_SERVER_OPTIONS_INIT;
  o.tls_cert_file = "/nonexistent/cert.pem";
  CHECK(ina_rpc_server_create(&o, &s) == INA_ERR_INVALID_ARGUMENT && s == NULL);
  o.tls_key_file = "/nonexistent/key.pem";
  CHECK(ina_rpc_server_create(&o, &s) == INA_ERR_IO && s == NULL);
  CHECK(strstr(ina_last_error(), "/nonexistent/cert.pem") != NULL);
  ina_rpc_server_options_t bad_addr = INA_RPC_SERVER_OPTIONS_INIT;
  bad_addr.listen_address = "not an address:port";
  CHECK(ina_rpc_server_create(&bad_addr, &s) == INA_ERR_IO && s == NULL);
  ina_rpc_server_options_t forgot_init = {0};
  CHECK(ina_rpc_server_create(&forgot_init, &s) == INA_ERR_INVALID_ARGUMENT && s == NULL);

  /* Registered but never started: destroy must not wait for anything. */
  ina_rpc_server_options_t ok = INA_RPC_SERVER_OPTIONS_INIT;
  fixture_t fx;
  memset(&fx, 0, sizeof fx);
  CHECK_OK(ina_rpc_server_create(&ok, &s));
  CHECK_OK(fx_register(s, &fx, "t"));
  CHECK(ina_rpc_server_add_unary(s, ECHO_METHOD, fx_echo_handler, &fx, NULL) ==
        INA_ERR_INVALID_ARGUMENT); /* twice */
  CHECK(ina_rpc_server_add_unary(s, "no-slash", fx_echo_handler, &fx, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  /* Its port is taken: a second server cannot listen there. */
  char taken[64];
  snprintf(taken, sizeof taken, "127.0.0.1:%d", ina_rpc_server_port(s));
  ina_rpc_server_t *second = (ina_rpc_server_t *)1;
  ina_rpc_server_options_t same_port = INA_RPC_SERVER_OPTIONS_INIT;
  same_port.listen_address = taken;
  CHECK(ina_rpc_server_create(&same_port, &second) == INA_ERR_IO && second == NULL);
  ina_rpc_server_destroy(s);
  ina_rpc_server_destroy(NULL);

  ina_rpc_client_t *c = (ina_rpc_client_t *)1;
  ina_rpc_client_options_t co = INA_RPC_CLIENT_OPTIONS_INIT;
  CHECK(ina_rpc_client_create(&co, &c) == INA_ERR_INVALID_ARGUMENT && c == NULL); /* no target */
  ina_rpc_client_destroy(NULL);
}

static void test_codes(void) {
  for (int a = 0; a <= INA_RPC_UNAUTHENTICATED; a++) {
    CHECK(strcmp(ina_rpc_code_name((ina_rpc_code_t)a), "INVALID_CODE") != 0);
    for (int b = 0; b < a; b++) {
      CHECK(strcmp(ina_rpc_code_name((ina_rpc_code_t)a),
                   ina_rpc_code_name((ina_rpc_code_t)b)) != 0);
    }
    CHECK((ina_rpc_code_to_status((ina_rpc_code_t)a) == INA_OK) == (a == INA_RPC_OK));
  }
  CHECK(strcmp(ina_rpc_code_name(INA_RPC_UNAUTHENTICATED), "UNAUTHENTICATED") == 0);
  CHECK(strcmp(ina_rpc_code_name((ina_rpc_code_t)17), "INVALID_CODE") == 0);
  CHECK(ina_rpc_code_to_status(INA_RPC_NOT_FOUND) == INA_ERR_NOT_FOUND);
  CHECK(ina_rpc_code_to_status(INA_RPC_UNIMPLEMENTED) == INA_ERR_UNSUPPORTED);
  char msg[INA_RPC_MESSAGE_MAX];
  CHECK(ina_rpc_error(msg, INA_RPC_ABORTED, "x%d", 7) == INA_RPC_ABORTED && strcmp(msg, "x7") == 0);
}

int main(void) {
  test_rng_t rng = {test_seed("test_rpc_server")};
  snprintf(g_token, sizeof g_token, "tok-%016llx", (unsigned long long)test_rng_next(&rng));
  ina_log_set_quiet_errors(1); /* failures are provoked on purpose; checks read them */

  test_codes();
  test_setup_errors();
  ina_rpc_server_t *server = start_server(4);
  if (server) {
    test_unary_and_stream(&rng, 0);
    test_concurrent_clients(&rng);
    test_garbage(server, &rng);
    test_unknown_method(&rng);
    test_bearer_token(&rng);
    test_message_limit(&rng);
    test_cancel_and_deadline(server);
    CHECK(ina_rpc_server_active_calls(server) == 0);
    test_shutdown_with_open_streams(server); /* destroys the server */
  }

  /* One completion-queue thread serves everything too. */
  server = start_server(1);
  if (server) {
    test_unary_and_stream(&rng, 1);
    test_cancel_and_deadline(server);
    ina_rpc_server_destroy(server);
  }
  CHECK(fx_wait_zero(&g_fx.tickers_running, 5000)); /* no ticker thread outlives main */
  CHECK(atomic_load(&g_fx.bad_requests) == 0);
  return test_finish("test_rpc_server");
}
