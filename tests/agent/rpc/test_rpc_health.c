/* grpc.health.v1.Health over loopback: Check of known, unknown and malformed names,
 * Watch streams that follow a random sequence of status changes (each stream must see
 * exactly the changes of its service, in order, without repeats), SERVICE_UNKNOWN for a
 * name that becomes known later, set_all, deadlines on Watch, cancelled Watch streams
 * being released, and server shutdown with Watch streams open. */
#include <stdio.h>

#include "core/log.h"
#include "grpc/health/v1/health.pb-c.h"
#include "agent/rpc/health.h"
#include "tests/agent/rpc/rpc_fixture.h"

#define CALL_DEADLINE_MS 10000
#define MAX_EVENTS 256

static char g_target[64];

static ina_rpc_client_t *make_client(void) {
  ina_rpc_client_options_t o = INA_RPC_CLIENT_OPTIONS_INIT;
  o.target = g_target;
  o.default_deadline_ms = CALL_DEADLINE_MS;
  ina_rpc_client_t *c = NULL;
  CHECK_OK(ina_rpc_client_create(&o, &c));
  return c;
}

static void pack_request(const char *service, uint8_t **bytes, size_t *size) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  req.service = (char *)service;
  if (ina_rpc_pack(&req.base, bytes, size) != INA_OK) *bytes = NULL;
}

/* Check(service): the status on success, -1 otherwise (*status says why). */
static int check(ina_rpc_client_t *c, const char *service, ina_rpc_status_t *status) {
  uint8_t *req = NULL, *resp = NULL;
  size_t req_size = 0, resp_size = 0;
  pack_request(service, &req, &req_size);
  int result = -1;
  if (ina_rpc_client_unary(c, INA_HEALTH_CHECK_METHOD, req, req_size, 0, &resp, &resp_size,
                           status) == INA_OK) {
    Grpc__Health__V1__HealthCheckResponse *r =
        grpc__health__v1__health_check_response__unpack(NULL, resp_size, resp);
    if (r) {
      result = (int)r->status;
      grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    }
  }
  free(req);
  free(resp);
  return result;
}

/* A Watch stream run by a thread: records every status until it has `stop_after`. */
typedef struct watch {
  ina_rpc_client_t *client;
  const char *service;
  int stop_after; /* cancel after this many messages; 0: never */
  int64_t deadline_ms;
  int events[MAX_EVENTS];
  atomic_int n_events;
  int bad;
  ina_rpc_status_t status;
  ina_status_t st;
  pthread_t thread;
} watch_t;

static int watch_message(void *ctx, const uint8_t *bytes, size_t size) {
  watch_t *w = ctx;
  Grpc__Health__V1__HealthCheckResponse *r =
      grpc__health__v1__health_check_response__unpack(NULL, size, bytes);
  int n = atomic_load(&w->n_events);
  if (!r || n >= MAX_EVENTS) {
    w->bad++;
  } else {
    w->events[n] = (int)r->status;
    atomic_store(&w->n_events, n + 1);
  }
  if (r) grpc__health__v1__health_check_response__free_unpacked(r, NULL);
  return w->stop_after > 0 && atomic_load(&w->n_events) >= w->stop_after;
}

static void *watch_main(void *p) {
  watch_t *w = p;
  uint8_t *req = NULL;
  size_t req_size = 0;
  pack_request(w->service, &req, &req_size);
  w->st = ina_rpc_client_stream(w->client, INA_HEALTH_WATCH_METHOD, req, req_size, w->deadline_ms,
                                watch_message, w, &w->status);
  free(req);
  return NULL;
}

static void watch_start(watch_t *w, ina_rpc_client_t *c, const char *service, int stop_after,
                        int64_t deadline_ms) {
  memset(w, 0, sizeof *w);
  w->client = c;
  w->service = service;
  w->stop_after = stop_after;
  w->deadline_ms = deadline_ms;
  CHECK(pthread_create(&w->thread, NULL, watch_main, w) == 0);
}

static void test_check(ina_rpc_client_t *c, ina_health_t *h) {
  ina_rpc_status_t status;
  CHECK(check(c, "", &status) == INA_HEALTH_SERVING);
  CHECK(check(c, "ina.v1.Node", &status) == INA_HEALTH_NOT_SERVING);
  CHECK(check(c, "ina.v1.Unknown", &status) == -1);
  CHECKF(status.code == INA_RPC_NOT_FOUND && strstr(status.message, "ina.v1.Unknown"), "%s %s",
         ina_rpc_code_name(status.code), status.message);
  CHECK_OK(ina_health_set_status(h, "ina.v1.Node", INA_HEALTH_SERVING));
  CHECK(check(c, "ina.v1.Node", &status) == INA_HEALTH_SERVING);
  CHECK(ina_health_get_status(h, "ina.v1.Node") == INA_HEALTH_SERVING);
  CHECK(ina_health_get_status(h, "nope") == INA_HEALTH_SERVICE_UNKNOWN);
  /* Only SERVING and NOT_SERVING can be set. */
  CHECK(ina_health_set_status(h, "x", INA_HEALTH_UNKNOWN) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_health_set_status(h, "x", INA_HEALTH_SERVICE_UNKNOWN) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_health_get_status(h, "x") == INA_HEALTH_SERVICE_UNKNOWN);

  /* Malformed requests: Check and Watch both answer INVALID_ARGUMENT. */
  static const uint8_t kBad[] = {0x0A, 0x05, 'a'}; /* string field 1 claims 5 bytes, has 1 */
  uint8_t *resp = NULL;
  size_t resp_size = 0;
  CHECK(ina_rpc_client_unary(c, INA_HEALTH_CHECK_METHOD, kBad, sizeof kBad, 0, &resp, &resp_size,
                             &status) == INA_ERR_INVALID_ARGUMENT);
  CHECK(status.code == INA_RPC_INVALID_ARGUMENT);
  watch_t w;
  memset(&w, 0, sizeof w);
  CHECK(ina_rpc_client_stream(c, INA_HEALTH_WATCH_METHOD, kBad, sizeof kBad, 0, watch_message, &w,
                              &status) == INA_ERR_INVALID_ARGUMENT);
  CHECK(status.code == INA_RPC_INVALID_ARGUMENT && atomic_load(&w.n_events) == 0);
}

/* Random status changes on a few services; one Watch per service must see the initial
 * status and then exactly the changes (consecutive repeats collapsed), in order. */
static void test_watch_sequence(ina_rpc_client_t *c, ina_health_t *h, ina_rpc_server_t *server,
                                test_rng_t *rng) {
  enum { SERVICES = 3, CHANGES = 60 };
  const char *names[SERVICES] = {"", "ina.v1.Inference", "ina.v1.Placement"};
  int current[SERVICES], expected[SERVICES][MAX_EVENTS], n_expected[SERVICES];
  int plan_service[CHANGES], plan_status[CHANGES];
  for (int s = 0; s < SERVICES; s++) {
    current[s] = test_rng_int(rng, 0, 1) ? INA_HEALTH_SERVING : INA_HEALTH_NOT_SERVING;
    CHECK_OK(ina_health_set_status(h, names[s], (ina_health_status_t)current[s]));
    expected[s][0] = current[s];
    n_expected[s] = 1;
  }
  for (int i = 0; i < CHANGES; i++) {
    int s = (int)test_rng_int(rng, 0, SERVICES - 1);
    int v = test_rng_int(rng, 0, 1) ? INA_HEALTH_SERVING : INA_HEALTH_NOT_SERVING;
    plan_service[i] = s;
    plan_status[i] = v;
    if (v != current[s]) expected[s][n_expected[s]++] = v;
    current[s] = v;
  }
  watch_t watches[SERVICES];
  for (int s = 0; s < SERVICES; s++) watch_start(&watches[s], c, names[s], n_expected[s], 0);
  /* The first message is the status at registration: wait for it before changing. */
  for (int s = 0; s < SERVICES; s++) CHECK(fx_wait_atomic(&watches[s].n_events, 1, 5000));
  for (int i = 0; i < CHANGES; i++) {
    CHECK_OK(ina_health_set_status(h, names[plan_service[i]], (ina_health_status_t)plan_status[i]));
  }
  for (int s = 0; s < SERVICES; s++) {
    pthread_join(watches[s].thread, NULL);
    watch_t *w = &watches[s];
    int n = atomic_load(&w->n_events);
    int same = n == n_expected[s] && w->bad == 0;
    for (int k = 0; same && k < n; k++) same = w->events[k] == expected[s][k];
    CHECKF(same, "service '%s': %d events, expected %d", names[s], n, n_expected[s]);
    /* Stopped by the client: CANCELLED. */
    CHECK(w->st == INA_ERR_IO && w->status.code == INA_RPC_CANCELLED);
  }
  CHECK(fx_wait_idle(server, 5000)); /* every cancelled Watch was released */
}

static void test_watch_unknown_then_known(ina_rpc_client_t *c, ina_health_t *h,
                                          ina_rpc_server_t *server) {
  watch_t w;
  watch_start(&w, c, "later.Service", 3, 0);
  CHECK(fx_wait_atomic(&w.n_events, 1, 5000));
  CHECK_OK(ina_health_set_status(h, "other.Service", INA_HEALTH_SERVING)); /* not watched */
  CHECK_OK(ina_health_set_status(h, "later.Service", INA_HEALTH_SERVING));
  CHECK(fx_wait_atomic(&w.n_events, 2, 5000));
  CHECK_OK(ina_health_set_all(h, INA_HEALTH_NOT_SERVING));
  pthread_join(w.thread, NULL);
  CHECK(atomic_load(&w.n_events) == 3 && w.bad == 0);
  CHECK(w.events[0] == INA_HEALTH_SERVICE_UNKNOWN && w.events[1] == INA_HEALTH_SERVING &&
        w.events[2] == INA_HEALTH_NOT_SERVING);
  ina_rpc_status_t status;
  CHECK(check(c, "", &status) == INA_HEALTH_NOT_SERVING);
  CHECK(check(c, "other.Service", &status) == INA_HEALTH_NOT_SERVING);
  CHECK_OK(ina_health_set_all(h, INA_HEALTH_SERVING));
  CHECK(check(c, "ina.v1.Node", &status) == INA_HEALTH_SERVING);

  /* A Watch with a deadline ends with DEADLINE_EXCEEDED after its first message. */
  watch_start(&w, c, "", 0, 100);
  pthread_join(w.thread, NULL);
  CHECK(atomic_load(&w.n_events) == 1 && w.events[0] == INA_HEALTH_SERVING);
  CHECKF(w.status.code == INA_RPC_DEADLINE_EXCEEDED, "%s", ina_rpc_code_name(w.status.code));
  CHECK(fx_wait_idle(server, 5000));
}

int main(void) {
  test_rng_t rng = {test_seed("test_rpc_health")};
  ina_log_set_quiet_errors(1); /* failures are provoked on purpose; checks read them */

  ina_rpc_server_options_t o = INA_RPC_SERVER_OPTIONS_INIT;
  o.num_threads = 2;
  ina_rpc_server_t *server = NULL;
  ina_health_t *health = NULL;
  CHECK_OK(ina_rpc_server_create(&o, &server));
  CHECK_OK(ina_health_create(server, &health));
  if (!server || !health) return test_finish("test_rpc_health");
  CHECK(ina_health_get_status(health, "") == INA_HEALTH_SERVING); /* the default */
  CHECK_OK(ina_health_set_status(health, "ina.v1.Node", INA_HEALTH_NOT_SERVING));
  CHECK_OK(ina_rpc_server_start(server));
  snprintf(g_target, sizeof g_target, "127.0.0.1:%d", ina_rpc_server_port(server));
  ina_rpc_client_t *c = make_client();

  test_check(c, health);
  test_watch_sequence(c, health, server, &rng);
  test_watch_unknown_then_known(c, health, server);

  /* Shutdown with Watch streams open: they end, the server releases them, no hang. */
  watch_t open[2];
  watch_start(&open[0], c, "", 0, 20000);
  watch_start(&open[1], c, "unknown.Service", 0, 20000);
  CHECK(fx_wait_atomic(&open[0].n_events, 1, 5000));
  CHECK(fx_wait_atomic(&open[1].n_events, 1, 5000));
  double t0 = fx_now_s();
  ina_rpc_server_destroy(server);
  for (int i = 0; i < 2; i++) {
    pthread_join(open[i].thread, NULL);
    CHECK(open[i].st != INA_OK && open[i].status.code != INA_RPC_DEADLINE_EXCEEDED);
  }
  CHECK(fx_now_s() - t0 < 5.0);
  ina_health_destroy(health);
  ina_rpc_client_destroy(c);
  return test_finish("test_rpc_health");
}
