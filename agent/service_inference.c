/* ina.v1.Inference: Generate (a server stream fed by the scheduler's per-request
 * callback) and Cancel.
 *
 * A Generate call is checked (decode, proto/validate.h, what the scheduler supports, the
 * KV capacity), listed in the agent's registry (which catches duplicate request ids and
 * lets drain find it) and submitted. From then on the scheduler callback owns it: it
 * sends tokens every stream_interval tokens, then the final response, removes the
 * generation from the registry and finishes the stream. When the client goes away,
 * on_cancel looks the writer up in the registry and cancels the request in the
 * scheduler, whose final event then releases everything as usual. */
#define INA_LOG_SUBSYS "agent"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "ina/v1/inference.pb-c.h"
#include "proto/validate.h"
#include "agent/agent_internal.h"
#include "agent/rpc/rpc_pb.h"

#define GENERATE_METHOD "/ina.v1.Inference/Generate"
#define CANCEL_METHOD "/ina.v1.Inference/Cancel"

/* ---- responses ---------------------------------------------------------------------- */

static Ina__V1__FinishReason finish_reason(ina_finish_reason_t f) {
  switch (f) {
  case INA_FINISH_NONE: return INA__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED;
  case INA_FINISH_LENGTH: return INA__V1__FINISH_REASON__FINISH_REASON_LENGTH;
  case INA_FINISH_STOP:
  case INA_FINISH_EOS: return INA__V1__FINISH_REASON__FINISH_REASON_STOP;
  case INA_FINISH_CANCELLED: return INA__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
  case INA_FINISH_ERROR: return INA__V1__FINISH_REASON__FINISH_REASON_ERROR;
  }
  return INA__V1__FINISH_REASON__FINISH_REASON_ERROR;
}

static uint64_t to_us(double seconds) { return seconds > 0 ? (uint64_t)(seconds * 1e6 + 0.5) : 0; }

/* Sends the pending tokens, and with `event` the final fields. A failed write means the
 * call has ended; on_cancel takes care of the request, so it is not an error here. */
static void send_response(agent_generation_t *g, const ina_request_event_t *event) {
  Ina__V1__GenerateResponse resp = INA__V1__GENERATE_RESPONSE__INIT;
  Ina__V1__Timings timings = INA__V1__TIMINGS__INIT;
  resp.request_id = g->request_id;
  resp.token_ids = g->pending;
  resp.n_token_ids = g->num_pending;
  resp.prompt_tokens = g->prompt_tokens;
  resp.completion_tokens = g->completion_tokens;
  if (event) {
    resp.finish_reason = finish_reason(event->finish);
    /* The stop or eos token is the last one delivered (it may have been sent already). */
    if (event->finish == INA_FINISH_STOP || event->finish == INA_FINISH_EOS)
      resp.stop_token_id = g->last_token;
    if (event->finish == INA_FINISH_ERROR) resp.error_message = (char *)(event->error ? event->error : "");
    if (event->metrics) {
      timings.queue_us = to_us(event->metrics->queue_seconds);
      timings.first_token_us = to_us(event->metrics->first_token_seconds);
      timings.total_us = to_us(event->metrics->total_seconds);
      timings.cached_prompt_tokens = (uint32_t)event->metrics->cached_tokens;
    }
    resp.timings = &timings;
  }
  uint8_t *bytes = NULL;
  size_t size = 0;
  if (ina_rpc_pack(&resp.base, &bytes, &size) == INA_OK) ina_rpc_writer_write(g->writer, bytes, size);
  free(bytes);
  g->num_pending = 0;
}

static void generation_free(agent_generation_t *g) {
  if (!g) return;
  free(g->pending);
  free(g->request_id);
  free(g->prefill_agent);
  free(g);
}

/* The scheduler's callback, on its driver thread. */
static void on_event(const ina_request_event_t *event, void *user_data) {
  agent_generation_t *g = user_data;
  if (event->finish == INA_FINISH_NONE) {
    /* Inter-token latency is measured here, per stream; its time to first token comes
     * with the final event's figures. */
    double now = agent_now_seconds();
    if (g->last_token_seconds > 0)
      agent_metrics_token_gap(g->agent->metrics, now - g->last_token_seconds);
    g->last_token_seconds = now;
    g->pending[g->num_pending++] = (uint32_t)event->token;
    g->last_token = (uint32_t)event->token;
    g->completion_tokens = (uint32_t)event->num_generated;
    if (g->num_pending == g->stream_interval) send_response(g, NULL);
    return;
  }
  send_response(g, event);
  ina_agent_t *agent = g->agent;
  agent_metrics_request_finished(agent->metrics, event);
  agent_registry_remove(agent, g);
  ina_rpc_writer_finish(g->writer, INA_RPC_OK, NULL);
  generation_free(g);
}

/* on_cancel: the client went away (or the server is shutting down). */
static void on_stream_cancel(void *ctx, ina_rpc_writer_t *writer) {
  ina_agent_t *agent = ctx;
  char *id = NULL;
  pthread_mutex_lock(&agent->lock);
  for (agent_generation_t *g = agent->generations; g; g = g->next)
    if (g->writer == writer) {
      id = strdup(g->request_id);
      break;
    }
  pthread_mutex_unlock(&agent->lock);
  /* Without the agent lock: a scheduler callback may be waiting for it. NOT_FOUND means
   * the request finished meanwhile. */
  if (id) ina_scheduler_cancel(agent->scheduler, id);
  free(id);
}

/* ---- Generate ----------------------------------------------------------------------- */

/* Checks what proto/validate.h does not know: the sampler's supported parameters and the
 * KV capacity. Returns INA_RPC_OK or the code, with the message in msg. */
static ina_rpc_code_t check_servable(const ina_agent_t *agent, const Ina__V1__GenerateRequest *req,
                                     char *msg) {
  const Ina__V1__SamplingParams *s = req->sampling;
  if (s && s->min_p != 0.0f)
    return ina_rpc_error(msg, INA_RPC_INVALID_ARGUMENT,
                         "sampling.min_p: %g is not supported by this agent (only 0)", (double)s->min_p);
  if (s && s->repetition_penalty != 0.0f && s->repetition_penalty != 1.0f)
    return ina_rpc_error(msg, INA_RPC_INVALID_ARGUMENT,
                         "sampling.repetition_penalty: %g is not supported by this agent (only 0 or 1)",
                         (double)s->repetition_penalty);
  uint64_t need = (uint64_t)req->n_prompt_token_ids + req->max_tokens;
  if (need > (uint64_t)agent->max_context)
    /* A request that can never fit, whatever the load: INVALID_ARGUMENT, as the proto
     * says (RESOURCE_EXHAUSTED is for a full queue, which may clear). */
    return ina_rpc_error(msg, INA_RPC_INVALID_ARGUMENT,
                         "prompt_token_ids + max_tokens: %zu + %u = %llu tokens, more than the KV "
                         "capacity of %lld tokens per request",
                         req->n_prompt_token_ids, req->max_tokens, (unsigned long long)need,
                         (long long)agent->max_context);
  return INA_RPC_OK;
}

/* A seed for requests that leave it 0 ("the agent picks one"): distinct per request. */
static uint64_t pick_seed(void) {
  static atomic_ullong counter;
  uint64_t n = (uint64_t)atomic_fetch_add(&counter, 1) + 1;
  return (uint64_t)(agent_now_seconds() * 1e9) ^ (n * 0x9E3779B97F4A7C15ull);
}

ina_sampling_params_t agent_sampling_from_proto(const Ina__V1__SamplingParams *s) {
  ina_sampling_params_t p = INA_SAMPLING_PARAMS_INIT;
  if (s) {
    p.temperature = s->temperature;
    p.top_k = (int32_t)s->top_k;
    p.top_p = s->top_p > 0 ? s->top_p : 1.0f; /* 0: the proto's "disabled" */
    p.seed = s->seed;
  }
  return p;
}

static agent_generation_t *generation_new(ina_agent_t *agent, ina_rpc_writer_t *writer,
                                          const Ina__V1__GenerateRequest *req) {
  agent_generation_t *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->agent = agent;
  g->writer = writer;
  g->prompt_tokens = (uint32_t)req->n_prompt_token_ids;
  g->stream_interval = req->stream_interval > 0 ? req->stream_interval : 1;
  g->request_id = strdup(req->request_id);
  g->pending = malloc(g->stream_interval * sizeof *g->pending);
  if (req->prefill_agent && req->prefill_agent[0]) g->prefill_agent = strdup(req->prefill_agent);
  if (!g->request_id || !g->pending || (req->prefill_agent && req->prefill_agent[0] && !g->prefill_agent)) {
    generation_free(g);
    return NULL;
  }
  return g;
}

/* Submits the checked request (agent_submit_generation lists g in the registry).
 * INA_RPC_OK: the callback owns g from now on. */
static ina_rpc_code_t submit(ina_agent_t *agent, agent_generation_t *g,
                             const Ina__V1__GenerateRequest *req, char *msg) {
  ina_rpc_code_t code = INA_RPC_OK;
  int32_t *prompt = malloc(req->n_prompt_token_ids * sizeof *prompt);
  int32_t *stop_ids = malloc((req->n_stop_token_ids + 1) * sizeof *stop_ids);
  if (!prompt || !stop_ids) {
    code = ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  for (size_t i = 0; i < req->n_prompt_token_ids; i++) prompt[i] = (int32_t)req->prompt_token_ids[i];
  for (size_t i = 0; i < req->n_stop_token_ids; i++) stop_ids[i] = (int32_t)req->stop_token_ids[i];
  ina_request_t r = INA_REQUEST_INIT;
  r.id = g->request_id;
  r.prompt = prompt;
  r.prompt_len = (int32_t)req->n_prompt_token_ids;
  r.max_new_tokens = (int32_t)req->max_tokens;
  r.sampling = agent_sampling_from_proto(req->sampling);
  if (r.sampling.seed == 0) r.sampling.seed = pick_seed();
  r.stop_ids = stop_ids;
  r.num_stop_ids = (int32_t)req->n_stop_token_ids;
  r.ignore_eos = req->ignore_eos;
  r.callback = on_event;
  r.user_data = g;

  code = agent_submit_generation(agent, g, &r, msg);
done:
  free(prompt);
  free(stop_ids);
  return code;
}

static void generate(void *ctx, const ina_rpc_request_t *request, ina_rpc_writer_t *writer) {
  ina_agent_t *agent = ctx;
  char msg[INA_RPC_MESSAGE_MAX] = "";
  ina_rpc_code_t code = INA_RPC_OK;
  agent_generation_t *g = NULL;
  Ina__V1__GenerateRequest *req =
      ina__v1__generate_request__unpack(NULL, request->size, request->bytes);
  if (!req) {
    code = ina_rpc_error(msg, INA_RPC_INVALID_ARGUMENT,
                         "request: %zu bytes are not an ina.v1.GenerateRequest", request->size);
    goto refuse;
  }
  const ina_model_config_t *cfg = ina_model_config(agent->model);
  ina_generate_limits_t limits = {(uint32_t)cfg->vocab_size, (uint32_t)cfg->max_position_embeddings};
  ina_proto_code_t vcode = INA_PROTO_CODE_OK;
  if (ina_validate_generate_request(req, &limits, msg, sizeof msg, &vcode) != INA_OK) {
    code = (ina_rpc_code_t)vcode;
    goto refuse;
  }
  if ((code = check_servable(agent, req, msg)) != INA_RPC_OK) goto refuse;
  g = generation_new(agent, writer, req);
  if (!g) {
    code = ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    goto refuse;
  }

  /* Set while the handler runs (the server's rule), before the scheduler can finish
   * the stream. */
  ina_rpc_writer_on_cancel(writer, on_stream_cancel, agent);
  if ((code = submit(agent, g, req, msg)) != INA_RPC_OK) goto refuse;
  ina__v1__generate_request__free_unpacked(req, NULL);
  return; /* g and the writer belong to on_event now */

refuse:
  agent_metrics_refused(agent->metrics, code);
  generation_free(g);
  if (req) ina__v1__generate_request__free_unpacked(req, NULL);
  ina_rpc_writer_finish(writer, code, msg);
}

/* ---- Cancel ------------------------------------------------------------------------- */

static ina_rpc_code_t cancel(void *ctx, const ina_rpc_request_t *request, ina_rpc_reply_t *reply) {
  ina_agent_t *agent = ctx;
  Ina__V1__CancelRequest *req = ina__v1__cancel_request__unpack(NULL, request->size, request->bytes);
  if (!req)
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "request: %zu bytes are not an ina.v1.CancelRequest", request->size);
  ina_rpc_code_t code = INA_RPC_OK;
  pthread_mutex_lock(&agent->lock);
  int known = agent_find_generation_locked(agent, req->request_id) != NULL;
  pthread_mutex_unlock(&agent->lock);
  /* Only ids of Generate streams: the scheduler's own requests (warm-up) are not
   * clients' to cancel. Cancel is idempotent (inference.proto): an unknown or finished
   * request, also one that finishes between the two looks, answers cancelled = false. */
  Ina__V1__CancelResponse resp = INA__V1__CANCEL_RESPONSE__INIT;
  resp.cancelled = known && ina_scheduler_cancel(agent->scheduler, req->request_id) == INA_OK;
  if (ina_rpc_pack(&resp.base, &reply->bytes, &reply->size) != INA_OK)
    code = ina_rpc_error(reply->message, INA_RPC_INTERNAL, "cannot pack the response");
  ina__v1__cancel_request__free_unpacked(req, NULL);
  return code;
}

ina_status_t agent_register_inference_service(ina_agent_t *agent) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_rpc_server_add_stream(agent->server, GENERATE_METHOD, generate, agent, NULL));
  INA_CHECK(ina_rpc_server_add_unary(agent->server, CANCEL_METHOD, cancel, agent, NULL));
fail:
  return st;
}
