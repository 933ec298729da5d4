/* Helpers shared by the agent daemon tests: an in-process agent serving the tiny model on
 * the CPU at 127.0.0.1:0, a client of it, typed calls, a Generate stream collector and
 * reference runs through ina_generate. Include after tests/test_util.h. */
#ifndef INA_TESTS_AGENT_TEST_UTIL_H
#define INA_TESTS_AGENT_TEST_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "grpc/health/v1/health.pb-c.h"
#include "ina/v1/inference.pb-c.h"
#include "ina/v1/node.pb-c.h"
#include "ina/v1/placement.pb-c.h"
#include "model/generate.h"
#include "model/model.h"
#include "agent/agent.h"
#include "agent/rpc/rpc_client.h"
#include "agent/rpc/rpc_pb.h"
#include "tests/test_util.h"

#define AT_GENERATE "/ina.v1.Inference/Generate"
#define AT_CANCEL "/ina.v1.Inference/Cancel"
#define AT_MAX_TOKENS 4096


static inline void at_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Agent options for the tests: tiny f32 weights (no conversion per step: fast), CPU,
 * loopback, no prefix cache (so KV pages in use go back to 0 between requests). */
static inline ina_agent_options_t at_options(uint64_t model_seed, int64_t kv_tokens) {
  ina_agent_options_t o = INA_AGENT_OPTIONS_INIT;
  o.model = "tiny";
  o.model_seed = model_seed;
  o.model_dtype = INA_DTYPE_F32;
  o.device = -1;
  o.page_size = 16;
  o.max_tokens = kv_tokens;
  o.num_threads = 2;
  o.scheduler.prefix_cache_pages = 0;
  return o;
}

static inline ina_rpc_client_t *at_client(int port, const char *token) {
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  ina_rpc_client_options_t o = INA_RPC_CLIENT_OPTIONS_INIT;
  ina_rpc_client_t *c = NULL;
  o.target = target;
  o.bearer_token = token;
  o.default_deadline_ms = 60000;
  if (ina_rpc_client_create(&o, &c) != INA_OK) {
    fprintf(stderr, "cannot create a client: %s\n", ina_last_error());
    exit(1);
  }
  return c;
}

/* Unary call with a packed protobuf-c request; returns the code, *resp malloc'd. */
static inline ina_rpc_code_t at_unary(ina_rpc_client_t *c, const char *method, const ProtobufCMessage *req,
                                      uint8_t **resp, size_t *resp_size, ina_rpc_status_t *status) {
  uint8_t *bytes = NULL;
  size_t size = 0;
  ina_rpc_status_t local;
  if (!status) status = &local;
  if (ina_rpc_pack(req, &bytes, &size) != INA_OK) return INA_RPC_INTERNAL;
  ina_rpc_client_unary(c, method, bytes, size, 0, resp, resp_size, status);
  free(bytes);
  return status->code;
}

/* grpc.health.v1 Check of the whole server: the serving status, or -1 when the call failed. */
static inline int at_health(ina_rpc_client_t *c) {
  Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
  uint8_t *resp = NULL;
  size_t n = 0;
  req.service = "";
  if (at_unary(c, "/grpc.health.v1.Health/Check", &req.base, &resp, &n, NULL) != INA_RPC_OK) return -1;
  Grpc__Health__V1__HealthCheckResponse *h = grpc__health__v1__health_check_response__unpack(NULL, n, resp);
  int s = h ? (int)h->status : -1;
  if (h) grpc__health__v1__health_check_response__free_unpacked(h, NULL);
  free(resp);
  return s;
}

/* GetLoad; returns 0 on success. */
static inline int at_load(ina_rpc_client_t *c, Ina__V1__NodeLoad *out) {
  Ina__V1__GetLoadRequest req = INA__V1__GET_LOAD_REQUEST__INIT;
  uint8_t *resp = NULL;
  size_t n = 0;
  if (at_unary(c, "/ina.v1.Node/GetLoad", &req.base, &resp, &n, NULL) != INA_RPC_OK) return 1;
  Ina__V1__NodeLoad *l = ina__v1__node_load__unpack(NULL, n, resp);
  free(resp);
  if (!l) return 1;
  *out = *l;
  out->base.unknown_fields = NULL;
  out->n_expert_load = 0;
  out->expert_load = NULL;
  ina__v1__node_load__free_unpacked(l, NULL);
  return 0;
}

/* Polls GetLoad until no request is queued or running and kv_pages_used == pages;
 * returns whether it got there within timeout_ms. */
static inline int at_wait_pages(ina_rpc_client_t *c, uint64_t pages, int timeout_ms) {
  double end = test_now_s() + timeout_ms / 1000.0;
  Ina__V1__NodeLoad l;
  while (test_now_s() < end) {
    if (at_load(c, &l) == 0 && l.kv_pages_used == pages && l.running_requests == 0 && l.queued_requests == 0)
      return 1;
    at_sleep_ms(5);
  }
  return 0;
}

/* What one Generate stream delivered. */
typedef struct at_stream {
  char request_id[64];
  uint32_t tokens[AT_MAX_TOKENS];
  atomic_int num_tokens;
  int messages;
  int finals;             /* responses with a finish reason: must end up 1 */
  int after_final;        /* responses after the final one: must stay 0 */
  int bad;                /* undecodable, wrong id, or counts not adding up */
  int cancel_after;       /* > 0: the client cancels once this many tokens arrived */
  Ina__V1__FinishReason finish;
  uint32_t prompt_tokens, completion_tokens, stop_token_id, cached_prompt_tokens;
  int has_timings;
  uint64_t first_token_us, total_us;
  ina_rpc_status_t status;
  ina_status_t st;
} at_stream_t;

static inline int at_stream_message(void *ctx, const uint8_t *bytes, size_t size) {
  at_stream_t *s = ctx;
  Ina__V1__GenerateResponse *r = ina__v1__generate_response__unpack(NULL, size, bytes);
  s->messages++;
  if (!r || strcmp(r->request_id, s->request_id) != 0) {
    s->bad++;
  } else {
    if (s->finals > 0) s->after_final++;
    int n = atomic_load(&s->num_tokens);
    for (size_t i = 0; i < r->n_token_ids && n < AT_MAX_TOKENS; i++) s->tokens[n++] = r->token_ids[i];
    atomic_store(&s->num_tokens, n);
    if (r->completion_tokens != (uint32_t)n) s->bad++;
    if (r->finish_reason != INA__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED) {
      s->finals++;
      s->finish = r->finish_reason;
      s->prompt_tokens = r->prompt_tokens;
      s->completion_tokens = r->completion_tokens;
      s->stop_token_id = r->stop_token_id;
      s->has_timings = r->timings != NULL;
      if (r->timings) {
        s->first_token_us = r->timings->first_token_us;
        s->total_us = r->timings->total_us;
        s->cached_prompt_tokens = r->timings->cached_prompt_tokens;
      }
    }
  }
  if (r) ina__v1__generate_response__free_unpacked(r, NULL);
  return s->cancel_after > 0 && atomic_load(&s->num_tokens) >= s->cancel_after;
}

/* A GenerateRequest over int32 prompt ids (greedy unless temperature > 0). */
typedef struct at_request {
  const char *id;
  const int32_t *prompt;
  int32_t prompt_len;
  uint32_t max_tokens;
  int ignore_eos;
  uint32_t stream_interval;
} at_request_t;

static inline void at_pack_request(const at_request_t *r, uint8_t **bytes, size_t *size) {
  uint32_t *ids = malloc(((size_t)r->prompt_len + 1) * sizeof *ids);
  for (int32_t i = 0; i < r->prompt_len; i++) ids[i] = (uint32_t)r->prompt[i];
  Ina__V1__GenerateRequest req = INA__V1__GENERATE_REQUEST__INIT;
  req.request_id = (char *)r->id;
  req.prompt_token_ids = ids;
  req.n_prompt_token_ids = (size_t)r->prompt_len;
  req.max_tokens = r->max_tokens;
  req.ignore_eos = r->ignore_eos;
  req.stream_interval = r->stream_interval;
  if (ina_rpc_pack(&req.base, bytes, size) != INA_OK) *bytes = NULL;
  free(ids);
}

/* Runs a Generate stream to its end into *s (zeroed here, cancel_after kept). */
static inline void at_generate(ina_rpc_client_t *c, const at_request_t *r, at_stream_t *s) {
  int cancel_after = s->cancel_after;
  memset(s, 0, sizeof *s);
  s->cancel_after = cancel_after;
  snprintf(s->request_id, sizeof s->request_id, "%s", r->id);
  uint8_t *bytes = NULL;
  size_t size = 0;
  at_pack_request(r, &bytes, &size);
  s->st = ina_rpc_client_stream(c, AT_GENERATE, bytes, size, 0, at_stream_message, s, &s->status);
  free(bytes);
}

/* Cancel by id: the gRPC code. */
static inline ina_rpc_code_t at_cancel(ina_rpc_client_t *c, const char *id, int *cancelled) {
  Ina__V1__CancelRequest req = INA__V1__CANCEL_REQUEST__INIT;
  uint8_t *resp = NULL;
  size_t n = 0;
  req.request_id = (char *)id;
  ina_rpc_code_t code = at_unary(c, AT_CANCEL, &req.base, &resp, &n, NULL);
  if (code == INA_RPC_OK && cancelled) {
    Ina__V1__CancelResponse *r = ina__v1__cancel_response__unpack(NULL, n, resp);
    *cancelled = r ? r->cancelled : -1;
    if (r) ina__v1__cancel_response__free_unpacked(r, NULL);
  }
  free(resp);
  return code;
}

/* The reference: the same tiny model run alone through ina_generate, greedy. */
typedef struct at_reference {
  ina_model_t *model;
  ina_engine_t *engine;
} at_reference_t;

/* The reference of a built-in model other than tiny (the agent's options name the same). */
static inline void at_reference_open_model(at_reference_t *ref, const char *model, uint64_t model_seed) {
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  mo.seed = model_seed;
  mo.dtype = INA_DTYPE_F32;
  eo.page_size = 16;
  eo.max_tokens = 8192;
  eo.num_threads = 2;
  eo.device = -1;
  if (ina_model_open(model, &mo, &ref->model) != INA_OK ||
      ina_engine_create(ref->model, &eo, &ref->engine) != INA_OK) {
    fprintf(stderr, "cannot open the reference model %s: %s\n", model, ina_last_error());
    exit(1);
  }
}

static inline void at_reference_open(at_reference_t *ref, uint64_t model_seed) {
  at_reference_open_model(ref, "tiny", model_seed);
}

static inline void at_reference_close(at_reference_t *ref) {
  ina_engine_destroy(ref->engine);
  ina_model_destroy(ref->model);
}

/* Greedy tokens of one prompt; returns how many (<= max_new), -1 on failure. */
static inline int32_t at_reference_run(at_reference_t *ref, const int32_t *prompt, int32_t prompt_len,
                                       int32_t max_new, int ignore_eos, int32_t *out) {
  ina_generate_request_t g;
  memset(&g, 0, sizeof g);
  ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
  g.prompt = prompt;
  g.prompt_len = prompt_len;
  g.max_new_tokens = max_new;
  g.sampling = sp;
  g.ignore_eos = ignore_eos;
  g.output = out;
  ina_generate_stats_t stats;
  memset(&stats, 0, sizeof stats);
  if (ina_generate(ref->engine, &g, 1, &stats) != INA_OK) return -1;
  return g.num_generated;
}

/* Whether the stream delivered exactly tokens[0..n). */
static inline int at_same_tokens(const at_stream_t *s, const int32_t *tokens, int32_t n) {
  if (atomic_load(&s->num_tokens) != n) return 0;
  for (int32_t i = 0; i < n; i++)
    if (s->tokens[i] != (uint32_t)tokens[i]) return 0;
  return 1;
}

#endif
