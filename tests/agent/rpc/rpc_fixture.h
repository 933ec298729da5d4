/* Test services for the rpc/ tests, on ina.v1 messages:
 *
 *   /ina.test.Echo/Health  unary: NodeHealth -> the same NodeHealth with uptime_seconds
 *                          + 1; a request that does not decode gets INVALID_ARGUMENT
 *   /ina.test.Echo/Count   stream: GenerateRequest{request_id, max_tokens = N} -> N
 *                          GenerateResponses (token_ids = [i], completion_tokens = i + 1,
 *                          the last with finish_reason LENGTH), all written from the
 *                          handler
 *   /ina.test.Echo/Ticker  stream: like Count, but written by a thread of its own, one
 *                          message per millisecond, until N or until the call ends
 *                          early; counts the cancellations it learns of
 *   /ina.test.Secure/Echo  Health echo behind a bearer token
 *
 * Counters are atomics so that tests can wait on them. */
#ifndef INA_TESTS_RPC_FIXTURE_H
#define INA_TESTS_RPC_FIXTURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ina/v1/inference.pb-c.h"
#include "ina/v1/node.pb-c.h"
#include "agent/rpc/rpc_client.h"
#include "agent/rpc/rpc_pb.h"
#include "agent/rpc/rpc_server.h"
#include "tests/test_util.h"

#define ECHO_METHOD "/ina.test.Echo/Health"
#define COUNT_METHOD "/ina.test.Echo/Count"
#define TICKER_METHOD "/ina.test.Echo/Ticker"
#define SECURE_METHOD "/ina.test.Secure/Echo"

typedef struct fixture {
  atomic_int unary_runs;        /* Echo handler calls */
  atomic_int secure_runs;       /* Secure handler calls */
  atomic_int streams_started;   /* Count and Ticker handler calls */
  atomic_int tickers_running;   /* Ticker threads alive */
  atomic_int tickers_cancelled; /* on_cancel calls seen by Ticker streams */
  atomic_int tickers_finished;  /* Ticker streams that called finish */
  atomic_int bad_requests;      /* handler calls whose method or peer looked wrong */
  atomic_long count_pending;    /* Count: writer's pending messages after the last write */
} fixture_t;

static inline double fx_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void fx_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Polls until *value >= target or timeout_ms passes; returns whether it got there. */
static inline int fx_wait_atomic(atomic_int *value, int target, int timeout_ms) {
  double end = fx_now_s() + timeout_ms / 1000.0;
  while (atomic_load(value) < target) {
    if (fx_now_s() > end) return 0;
    fx_sleep_ms(1);
  }
  return 1;
}

/* Polls until *value == 0 or timeout_ms passes. */
static inline int fx_wait_zero(atomic_int *value, int timeout_ms) {
  double end = fx_now_s() + timeout_ms / 1000.0;
  while (atomic_load(value) != 0) {
    if (fx_now_s() > end) return 0;
    fx_sleep_ms(1);
  }
  return 1;
}

/* Polls until the server holds no call (every writer released) or timeout_ms passes. */
static inline int fx_wait_idle(ina_rpc_server_t *server, int timeout_ms) {
  double end = fx_now_s() + timeout_ms / 1000.0;
  while (ina_rpc_server_active_calls(server) > 0) {
    if (fx_now_s() > end) return 0;
    fx_sleep_ms(1);
  }
  return 1;
}

static inline ina_rpc_code_t fx_echo(const ina_rpc_request_t *request, ina_rpc_reply_t *reply) {
  Ina__V1__NodeHealth *in = ina__v1__node_health__unpack(NULL, request->size, request->bytes);
  if (!in) {
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "%s: %zu bytes are not an ina.v1.NodeHealth", request->method,
                         request->size);
  }
  in->uptime_seconds += 1;
  ina_rpc_code_t code = INA_RPC_OK;
  if (ina_rpc_pack(&in->base, &reply->bytes, &reply->size) != INA_OK) {
    code = ina_rpc_error(reply->message, INA_RPC_INTERNAL, "pack failed");
  }
  ina__v1__node_health__free_unpacked(in, NULL);
  return code;
}

/* Handlers see the full method path and a loopback peer ("ipv4:127.0.0.1:port"). */
static inline void fx_check_request(fixture_t *fx, const ina_rpc_request_t *request,
                                    const char *method) {
  if (strcmp(request->method, method) != 0 || strncmp(request->peer, "ipv4:127.0.0.1:", 15) != 0) {
    atomic_fetch_add(&fx->bad_requests, 1);
  }
}

static inline ina_rpc_code_t fx_echo_handler(void *ctx, const ina_rpc_request_t *request,
                                             ina_rpc_reply_t *reply) {
  atomic_fetch_add(&((fixture_t *)ctx)->unary_runs, 1);
  fx_check_request(ctx, request, ECHO_METHOD);
  return fx_echo(request, reply);
}

static inline ina_rpc_code_t fx_secure_handler(void *ctx, const ina_rpc_request_t *request,
                                               ina_rpc_reply_t *reply) {
  atomic_fetch_add(&((fixture_t *)ctx)->secure_runs, 1);
  fx_check_request(ctx, request, SECURE_METHOD);
  return fx_echo(request, reply);
}

/* Packs and writes the i-th of n stream messages. */
static inline ina_status_t fx_write_token(ina_rpc_writer_t *writer, const char *request_id,
                                          uint32_t i, uint32_t n) {
  Ina__V1__GenerateResponse resp = INA__V1__GENERATE_RESPONSE__INIT;
  uint32_t token = i;
  resp.request_id = (char *)request_id;
  resp.n_token_ids = 1;
  resp.token_ids = &token;
  resp.completion_tokens = i + 1;
  if (i + 1 == n) resp.finish_reason = INA__V1__FINISH_REASON__FINISH_REASON_LENGTH;
  uint8_t *bytes = NULL;
  size_t size = 0;
  ina_status_t st = ina_rpc_pack(&resp.base, &bytes, &size);
  if (st == INA_OK) st = ina_rpc_writer_write(writer, bytes, size);
  free(bytes);
  return st;
}

static inline Ina__V1__GenerateRequest *fx_stream_request(const ina_rpc_request_t *request,
                                                          ina_rpc_writer_t *writer) {
  Ina__V1__GenerateRequest *req =
      ina__v1__generate_request__unpack(NULL, request->size, request->bytes);
  if (!req) {
    char msg[INA_RPC_MESSAGE_MAX];
    snprintf(msg, sizeof msg, "%s: %zu bytes are not an ina.v1.GenerateRequest", request->method,
             request->size);
    ina_rpc_writer_finish(writer, INA_RPC_INVALID_ARGUMENT, msg);
  }
  return req;
}

static inline void fx_count_handler(void *ctx, const ina_rpc_request_t *request,
                                    ina_rpc_writer_t *writer) {
  fixture_t *fx = ctx;
  atomic_fetch_add(&fx->streams_started, 1);
  fx_check_request(fx, request, COUNT_METHOD);
  Ina__V1__GenerateRequest *req = fx_stream_request(request, writer);
  if (!req) return;
  ina_rpc_code_t code = INA_RPC_OK;
  for (uint32_t i = 0; i < req->max_tokens; i++) {
    if (fx_write_token(writer, req->request_id, i, req->max_tokens) != INA_OK) {
      code = INA_RPC_CANCELLED;
      break;
    }
  }
  atomic_store(&fx->count_pending, (long)ina_rpc_writer_pending(writer));
  ina_rpc_writer_finish(writer, code, code == INA_RPC_OK ? NULL : "stream ended early");
  ina__v1__generate_request__free_unpacked(req, NULL);
}

typedef struct ticker {
  fixture_t *fx;
  ina_rpc_writer_t *writer;
  Ina__V1__GenerateRequest *req;
} ticker_t;

static inline void fx_ticker_on_cancel(void *ctx, ina_rpc_writer_t *writer) {
  (void)writer;
  atomic_fetch_add(&((fixture_t *)ctx)->tickers_cancelled, 1);
}

static inline void *fx_ticker_main(void *arg) {
  ticker_t *t = arg;
  fixture_t *fx = t->fx;
  uint32_t n = t->req->max_tokens;
  for (uint32_t i = 0; i < n && !ina_rpc_writer_cancelled(t->writer); i++) {
    if (fx_write_token(t->writer, t->req->request_id, i, n) != INA_OK) break;
    fx_sleep_ms(1);
  }
  ina_rpc_writer_finish(t->writer, INA_RPC_OK, NULL);
  ina__v1__generate_request__free_unpacked(t->req, NULL);
  free(t);
  atomic_fetch_add(&fx->tickers_finished, 1);
  atomic_fetch_sub(&fx->tickers_running, 1);
  return NULL;
}

static inline void fx_ticker_handler(void *ctx, const ina_rpc_request_t *request,
                                     ina_rpc_writer_t *writer) {
  fixture_t *fx = ctx;
  atomic_fetch_add(&fx->streams_started, 1);
  Ina__V1__GenerateRequest *req = fx_stream_request(request, writer);
  if (!req) return;
  ticker_t *t = malloc(sizeof *t);
  pthread_t thread;
  ina_rpc_writer_on_cancel(writer, fx_ticker_on_cancel, fx);
  atomic_fetch_add(&fx->tickers_running, 1);
  if (!t) goto no_thread;
  *t = (ticker_t){fx, writer, req};
  if (pthread_create(&thread, NULL, fx_ticker_main, t) != 0) goto no_thread;
  pthread_detach(thread);
  return;
no_thread:
  free(t);
  ina__v1__generate_request__free_unpacked(req, NULL);
  ina_rpc_writer_finish(writer, INA_RPC_RESOURCE_EXHAUSTED, "cannot start the ticker thread");
  atomic_fetch_sub(&fx->tickers_running, 1);
}

/* Registers the test services on a server that has not started. */
static inline ina_status_t fx_register(ina_rpc_server_t *server, fixture_t *fx,
                                       const char *secure_token) {
  ina_status_t st = ina_rpc_server_add_unary(server, ECHO_METHOD, fx_echo_handler, fx, NULL);
  if (st != INA_OK) return st;
  st = ina_rpc_server_add_stream(server, COUNT_METHOD, fx_count_handler, fx, NULL);
  if (st != INA_OK) return st;
  st = ina_rpc_server_add_stream(server, TICKER_METHOD, fx_ticker_handler, fx, NULL);
  if (st != INA_OK) return st;
  return ina_rpc_server_add_unary(server, SECURE_METHOD, fx_secure_handler, fx, secure_token);
}

/* A random NodeHealth (message string, ranks) packed into *bytes (malloc'd). */
static inline void fx_random_health(test_rng_t *rng, uint8_t **bytes, size_t *size,
                                    size_t message_len) {
  Ina__V1__NodeHealth h = INA__V1__NODE_HEALTH__INIT;
  Ina__V1__RankHealth ranks[8], *rank_ptrs[8];
  char *message = malloc(message_len + 1);
  for (size_t i = 0; i < message_len; i++) message[i] = (char)('a' + test_rng_int(rng, 0, 25));
  message[message_len] = '\0';
  h.state = (Ina__V1__NodeState)test_rng_int(rng, 0, 5);
  h.message = message;
  h.uptime_seconds = test_rng_next(rng) >> 2;
  h.n_ranks = (size_t)test_rng_int(rng, 0, 8);
  h.ranks = rank_ptrs;
  for (size_t i = 0; i < h.n_ranks; i++) {
    Ina__V1__RankHealth r = INA__V1__RANK_HEALTH__INIT;
    r.global_rank = (uint32_t)test_rng_int(rng, 0, 1000);
    r.state = (Ina__V1__NodeState)test_rng_int(rng, 0, 5);
    r.last_heartbeat_age_ms = test_rng_next(rng) >> 20;
    ranks[i] = r;
    rank_ptrs[i] = &ranks[i];
  }
  if (ina_rpc_pack(&h.base, bytes, size) != INA_OK) *bytes = NULL;
  free(message);
}

/* Whether `response` is the echo of `request` (uptime + 1, everything else equal). */
static inline int fx_is_echo(const uint8_t *request, size_t request_size, const uint8_t *response,
                             size_t response_size) {
  Ina__V1__NodeHealth *in = ina__v1__node_health__unpack(NULL, request_size, request);
  Ina__V1__NodeHealth *out = ina__v1__node_health__unpack(NULL, response_size, response);
  int same = in && out;
  if (same) {
    in->uptime_seconds += 1;
    uint8_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    same = ina_rpc_pack(&in->base, &a, &na) == INA_OK &&
           ina_rpc_pack(&out->base, &b, &nb) == INA_OK && na == nb && memcmp(a, b, na) == 0;
    free(a);
    free(b);
  }
  if (in) ina__v1__node_health__free_unpacked(in, NULL);
  if (out) ina__v1__node_health__free_unpacked(out, NULL);
  return same;
}

/* A GenerateRequest{request_id, max_tokens = n}, packed. */
static inline void fx_stream_request_bytes(const char *request_id, uint32_t n, uint8_t **bytes,
                                           size_t *size) {
  Ina__V1__GenerateRequest req = INA__V1__GENERATE_REQUEST__INIT;
  req.request_id = (char *)request_id;
  req.max_tokens = n;
  if (ina_rpc_pack(&req.base, bytes, size) != INA_OK) *bytes = NULL;
}

/* Collects a Count / Ticker stream on the client side and checks each message. */
typedef struct stream_sink {
  const char *request_id;
  uint32_t n_expected;   /* messages the server means to send */
  uint32_t received;
  uint32_t bad;          /* messages that did not decode or were out of order */
  uint32_t cancel_after; /* > 0: cancel once this many arrived */
  int saw_last;          /* the message with finish_reason LENGTH arrived */
} stream_sink_t;

static inline int fx_sink_message(void *ctx, const uint8_t *bytes, size_t size) {
  stream_sink_t *s = ctx;
  Ina__V1__GenerateResponse *r = ina__v1__generate_response__unpack(NULL, size, bytes);
  if (!r || r->n_token_ids != 1 || r->token_ids[0] != s->received ||
      r->completion_tokens != s->received + 1 || strcmp(r->request_id, s->request_id) != 0) {
    s->bad++;
  } else if (r->finish_reason == INA__V1__FINISH_REASON__FINISH_REASON_LENGTH) {
    s->saw_last = s->received + 1 == s->n_expected;
    if (!s->saw_last) s->bad++;
  }
  if (r) ina__v1__generate_response__free_unpacked(r, NULL);
  s->received++;
  return s->cancel_after > 0 && s->received >= s->cancel_after;
}

#endif
