/* ina.v1.KvTransfer on the prefill side: GetKvEndpoint, Prefill, AbortTransfer.
 *
 * Prefill: the call is checked (proto/validate.h, then whether the decode agent's cache
 * pairs with this one), becomes a transfer (handoff_internal.h) and a scheduler request
 * of one new token (kv:<transfer id>) whose kv_export lends each computed chunk's pages
 * to the link thread, which writes them into the decode agent's pages and, once the
 * request's final event has come and every put completed, answers the call. The handler
 * returns at once: the call's writer belongs to the transfer. */
#define INA_LOG_SUBSYS "handoff"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "ina/v1/kv_transfer.pb-c.h"
#include "proto/validate.h"
#include "agent/agent_internal.h"
#include "agent/handoff/handoff_internal.h"
#include "agent/rpc/rpc_pb.h"

#define GET_ENDPOINT_METHOD "/ina.v1.KvTransfer/GetKvEndpoint"
#define PREFILL_METHOD "/ina.v1.KvTransfer/Prefill"
#define ABORT_METHOD "/ina.v1.KvTransfer/AbortTransfer"
#define DEFAULT_TIMEOUT_MS 30000
/* How long AbortTransfer waits for a transfer's puts in flight. */
#define ABORT_QUIET_MS 3000

void handoff_transfer_free(handoff_transfer_t *t) {
  if (!t) return;
  while (t->pending) {
    handoff_page_set_t *s = t->pending;
    t->pending = s->next;
    free(s->pages);
    free(s);
  }
  free(t->dst_pages);
  free(t->blob);
  free(t);
}

void handoff_remember_aborted_locked(agent_handoff_t *h, const char *id) {
  snprintf(h->aborted[h->aborted_next], sizeof h->aborted[0], "%s", id);
  h->aborted_next = (h->aborted_next + 1) % HANDOFF_ABORTED_RING;
}

static int was_aborted_locked(const agent_handoff_t *h, const char *id) {
  for (int i = 0; i < HANDOFF_ABORTED_RING; i++)
    if (h->aborted[i][0] && strcmp(h->aborted[i], id) == 0) return 1;
  return 0;
}

static handoff_transfer_t *find_locked(agent_handoff_t *h, const char *id) {
  for (handoff_transfer_t *t = h->transfers; t; t = t->next)
    if (strcmp(t->id, id) == 0) return t;
  return NULL;
}

/* ---- GetKvEndpoint ------------------------------------------------------------------ */

void handoff_endpoint_message(const agent_handoff_t *h, Ina__V1__KvLayout *layout, Ina__V1__KvEndpoint *ep) {
  *layout = (Ina__V1__KvLayout)INA__V1__KV_LAYOUT__INIT;
  *ep = (Ina__V1__KvEndpoint)INA__V1__KV_ENDPOINT__INIT;
  layout->page_size = (uint32_t)h->layout.page_size;
  layout->num_pages = (uint32_t)h->layout.num_pages;
  layout->num_layers = (uint32_t)h->layout.num_layers;
  layout->entry_bytes = (uint64_t)h->layout.entry_bytes;
  layout->model_fingerprint = (char *)h->fingerprint;
  ep->layout = layout;
  ep->ucx_blob.data = h->blob;
  ep->ucx_blob.len = h->blob_size;
  ep->role = (char *)agent_role_name(h->role);
  ep->tp_size = (uint32_t)h->tp_size;
}

ina_kv_layout_t handoff_layout_of(const Ina__V1__KvLayout *l) {
  return (ina_kv_layout_t){(int32_t)l->page_size, (int32_t)l->num_pages, (int32_t)l->num_layers,
                           (int64_t)l->entry_bytes};
}

static ina_rpc_code_t get_endpoint(void *ctx, const ina_rpc_request_t *request, ina_rpc_reply_t *reply) {
  agent_handoff_t *h = ctx;
  (void)request;
  Ina__V1__KvLayout layout;
  Ina__V1__KvEndpoint ep;
  handoff_endpoint_message(h, &layout, &ep);
  if (ina_rpc_pack(&ep.base, &reply->bytes, &reply->size) != INA_OK)
    return ina_rpc_error(reply->message, INA_RPC_INTERNAL, "cannot pack the endpoint");
  return INA_RPC_OK;
}

/* ---- Prefill ------------------------------------------------------------------------ */

void handoff_transfer_respond(agent_handoff_t *h, handoff_transfer_t *t, ina_rpc_code_t code, const char *msg) {
  (void)h;
  if (code == INA_RPC_OK) {
    Ina__V1__PrefillResponse resp = INA__V1__PREFILL_RESPONSE__INIT;
    uint32_t top_ids[INA_REQUEST_MAX_LOGPROBS];
    resp.token = (uint32_t)t->token;
    resp.logprob = t->logprob;
    for (int32_t i = 0; i < t->num_top; i++) top_ids[i] = (uint32_t)t->top_ids[i];
    resp.top_ids = top_ids;
    resp.n_top_ids = (size_t)t->num_top;
    resp.top_logprobs = t->top_logprobs;
    resp.n_top_logprobs = (size_t)t->num_top;
    resp.cached_tokens = (uint32_t)t->cached_tokens;
    resp.bytes_written = t->bytes;
    resp.puts = t->puts;
    uint8_t *bytes = NULL;
    size_t size = 0;
    if (ina_rpc_pack(&resp.base, &bytes, &size) == INA_OK && ina_rpc_writer_write(t->writer, bytes, size) == INA_OK) {
      free(bytes);
      ina_rpc_writer_finish(t->writer, INA_RPC_OK, NULL);
      return;
    }
    free(bytes);
    code = INA_RPC_INTERNAL;
    msg = "cannot send the response (the decode agent may have gone)";
  }
  ina_rpc_writer_finish(t->writer, code, msg);
}

/* The prefill request's events, on the scheduler's driver thread. */
static void on_prefill_event(const ina_request_event_t *ev, void *user) {
  handoff_transfer_t *t = user;
  agent_handoff_t *h = t->h;
  pthread_mutex_lock(&h->mu);
  if (ev->finish == INA_FINISH_NONE) {
    t->token = ev->token;
    t->logprob = ev->logprob;
    t->num_top = ev->num_top;
    if (ev->num_top > 0) {
      memcpy(t->top_ids, ev->top_ids, (size_t)ev->num_top * sizeof *t->top_ids);
      memcpy(t->top_logprobs, ev->top_logprobs, (size_t)ev->num_top * sizeof *t->top_logprobs);
    }
  } else {
    t->finished = 1;
    t->finish = ev->finish;
    snprintf(t->finish_error, sizeof t->finish_error, "%s", ev->error ? ev->error : "");
    if (ev->metrics) t->cached_tokens = ev->metrics->cached_tokens;
    pthread_cond_broadcast(&h->wake);
  }
  pthread_mutex_unlock(&h->mu);
}

/* kv_export, on the driver thread: the computed prompt's pages go to the link. */
static void on_export(const ina_kv_pages_t *kv, void *user) {
  handoff_transfer_t *t = user;
  agent_handoff_t *h = t->h;
  handoff_page_set_t *set = calloc(1, sizeof *set);
  int32_t *pages = malloc((size_t)kv->num_pages * sizeof *pages);
  if (!set || !pages) { /* give the references back; the transfer ends short, with an error */
    (void)ina_scheduler_release_pages(h->scheduler, kv->pages, kv->num_pages);
    free(set);
    free(pages);
    return;
  }
  memcpy(pages, kv->pages, (size_t)kv->num_pages * sizeof *pages);
  set->pages = pages;
  set->num_pages = kv->num_pages;
  set->num_tokens = kv->num_tokens;
  set->num_layers = kv->num_layers;
  pthread_mutex_lock(&h->mu);
  if (t->pending_tail)
    t->pending_tail->next = set;
  else
    t->pending = set;
  t->pending_tail = set;
  pthread_cond_broadcast(&h->wake);
  pthread_mutex_unlock(&h->mu);
}

/* The decode agent went away or gave up: the transfer stops. */
static void on_prefill_cancel(void *ctx, ina_rpc_writer_t *writer) {
  agent_handoff_t *h = ctx;
  pthread_mutex_lock(&h->mu);
  for (handoff_transfer_t *t = h->transfers; t; t = t->next)
    if (t->writer == writer) t->abort_requested = 1;
  pthread_cond_broadcast(&h->wake);
  pthread_mutex_unlock(&h->mu);
}

/* Checks a call against this agent; builds its transfer. */
static ina_rpc_code_t make_transfer(agent_handoff_t *h, const Ina__V1__PrefillRequest *req, char *msg,
                                    handoff_transfer_t **out) {
  *out = NULL;
  ina_agent_t *agent = h->agent;
  if (h->role == AGENT_ROLE_DECODE)
    return ina_rpc_error(msg, INA_RPC_UNAVAILABLE, "this agent runs with --role decode: it serves no prefills");
  const ina_model_config_t *cfg = ina_model_config(agent->model);
  const ina_prefill_limits_t limits = {(uint32_t)cfg->vocab_size, (uint32_t)agent->max_context};
  ina_proto_code_t vcode = INA_PROTO_CODE_OK;
  if (ina_validate_prefill_request(req, &limits, msg, INA_RPC_MESSAGE_MAX, &vcode) != INA_OK)
    return (ina_rpc_code_t)vcode;
  const Ina__V1__KvLayout *l = req->decode->layout;
  const ina_kv_layout_t dst = handoff_layout_of(l);
  char why[160];
  if (!ina_kv_layouts_compatible(&h->layout, &dst, why, (int)sizeof why))
    return ina_rpc_error(msg, INA_RPC_FAILED_PRECONDITION, "decode.layout: cannot pair with this agent's cache: %s",
                         why);
  if (strcmp(l->model_fingerprint ? l->model_fingerprint : "", h->fingerprint) != 0)
    return ina_rpc_error(msg, INA_RPC_FAILED_PRECONDITION,
                         "decode.layout.model_fingerprint: '%s' is not this agent's model '%s'",
                         l->model_fingerprint ? l->model_fingerprint : "", h->fingerprint);
  handoff_transfer_t *t = calloc(1, sizeof *t);
  if (!t) return ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
  t->h = h;
  snprintf(t->id, sizeof t->id, "%s", req->transfer_id);
  t->prompt_len = (int64_t)req->n_prompt_token_ids;
  t->first_token = req->first_token;
  t->dst = dst;
  t->dst_pages = malloc(req->n_decode_pages * sizeof *t->dst_pages);
  t->blob = malloc(req->decode->ucx_blob.len);
  t->blob_size = req->decode->ucx_blob.len;
  t->token = -1;
  if (!t->dst_pages || !t->blob) {
    handoff_transfer_free(t);
    return ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < req->n_decode_pages; i++) t->dst_pages[i] = (int32_t)req->decode_pages[i];
  memcpy(t->blob, req->decode->ucx_blob.data, t->blob_size);
  t->deadline = handoff_now() + 1e-3 * (double)(req->timeout_ms > 0 ? req->timeout_ms : DEFAULT_TIMEOUT_MS);
  t->hold_until = h->test_stall_s > 0 ? handoff_now() + h->test_stall_s : 0;
  *out = t;
  return INA_RPC_OK;
}

/* The scheduler request of a transfer: the prompt, one new token. */
static ina_rpc_code_t submit_prefill(agent_handoff_t *h, handoff_transfer_t *t, const Ina__V1__PrefillRequest *req,
                                     char *msg) {
  ina_rpc_code_t code = INA_RPC_OK;
  char id[HANDOFF_ID_MAX + 8];
  int32_t *prompt = malloc(req->n_prompt_token_ids * sizeof *prompt);
  if (!prompt) return ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < req->n_prompt_token_ids; i++) prompt[i] = (int32_t)req->prompt_token_ids[i];
  snprintf(id, sizeof id, "kv:%s", t->id);
  ina_request_t r = INA_REQUEST_INIT;
  r.id = id;
  r.prompt = prompt;
  r.prompt_len = (int32_t)req->n_prompt_token_ids;
  r.max_new_tokens = 1;
  r.sampling = agent_sampling_from_proto(req->sampling);
  r.ignore_eos = 1; /* the decode side decides what ends the generation */
  r.logprobs = (int32_t)req->logprobs_plus_one - 1;
  r.callback = on_prefill_event;
  r.user_data = t;
  r.kv_export = on_export;
  r.kv_user_data = t;
  pthread_mutex_lock(&h->agent->lock);
  const int serving = h->agent->state == AGENT_SERVING;
  pthread_mutex_unlock(&h->agent->lock);
  if (!serving)
    code = ina_rpc_error(msg, INA_RPC_UNAVAILABLE, "the agent is not serving (warming up or draining)");
  else if (ina_scheduler_submit(h->scheduler, &r) != INA_OK)
    code = ina_rpc_error(msg, INA_RPC_INVALID_ARGUMENT, "%s", ina_last_error());
  free(prompt);
  return code;
}

static void prefill(void *ctx, const ina_rpc_request_t *request, ina_rpc_writer_t *writer) {
  agent_handoff_t *h = ctx;
  char msg[INA_RPC_MESSAGE_MAX] = "";
  ina_rpc_code_t code = INA_RPC_OK;
  handoff_transfer_t *t = NULL;
  Ina__V1__PrefillRequest *req = ina__v1__prefill_request__unpack(NULL, request->size, request->bytes);
  if (!req) {
    code = ina_rpc_error(msg, INA_RPC_INVALID_ARGUMENT, "request: %zu bytes are not an ina.v1.PrefillRequest",
                         request->size);
    goto refuse;
  }
  if ((code = make_transfer(h, req, msg, &t)) != INA_RPC_OK) goto refuse;
  t->writer = writer;
  pthread_mutex_lock(&h->mu);
  const int taken = find_locked(h, t->id) != NULL || was_aborted_locked(h, t->id);
  const int stopping = h->stopping;
  pthread_mutex_unlock(&h->mu);
  if (taken) {
    code = ina_rpc_error(msg, INA_RPC_ALREADY_EXISTS, "transfer_id: '%s' is in flight or was aborted", t->id);
    goto refuse;
  }
  if (stopping) {
    code = ina_rpc_error(msg, INA_RPC_UNAVAILABLE, "the agent is shutting down");
    goto refuse;
  }
  if ((code = submit_prefill(h, t, req, msg)) != INA_RPC_OK) goto refuse;
  /* From here the link thread ends the call. A duplicate id racing this one was refused
   * by the scheduler (the request ids are the same). */
  t->submitted = 1;
  ina_rpc_writer_on_cancel(writer, on_prefill_cancel, h);
  pthread_mutex_lock(&h->mu);
  t->next = h->transfers;
  h->transfers = t;
  pthread_cond_broadcast(&h->wake);
  pthread_mutex_unlock(&h->mu);
  ina__v1__prefill_request__free_unpacked(req, NULL);
  return;
refuse:
  if (req) ina__v1__prefill_request__free_unpacked(req, NULL);
  handoff_transfer_free(t);
  pthread_mutex_lock(&h->mu);
  h->stats.prefills_failed++;
  pthread_mutex_unlock(&h->mu);
  ina_rpc_writer_finish(writer, code, msg);
}

/* ---- AbortTransfer ------------------------------------------------------------------ */

static ina_rpc_code_t abort_transfer(void *ctx, const ina_rpc_request_t *request, ina_rpc_reply_t *reply) {
  agent_handoff_t *h = ctx;
  Ina__V1__AbortTransferRequest *req = ina__v1__abort_transfer_request__unpack(NULL, request->size, request->bytes);
  if (!req)
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "request: %zu bytes are not an ina.v1.AbortTransferRequest", request->size);
  ina_rpc_code_t code = INA_RPC_OK;
  Ina__V1__AbortTransferResponse resp = INA__V1__ABORT_TRANSFER_RESPONSE__INIT;
  const char *id = req->transfer_id ? req->transfer_id : "";
  if (!id[0] || strlen(id) > HANDOFF_ID_MAX) {
    code = ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT, "transfer_id: empty or longer than %d bytes",
                         HANDOFF_ID_MAX);
    goto done;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += ABORT_QUIET_MS / 1000;
  pthread_mutex_lock(&h->mu);
  handoff_remember_aborted_locked(h, id); /* a Prefill arriving after this is refused */
  handoff_transfer_t *t = find_locked(h, id);
  if (t) {
    resp.aborted = 1;
    t->abort_requested = 1;
    pthread_cond_broadcast(&h->wake);
  }
  /* Until it posts nothing more: quiet, or gone. */
  while ((t = find_locked(h, id)) != NULL && !t->quiet)
    if (pthread_cond_timedwait(&h->quiet, &h->mu, &until) != 0) break;
  const int still_writing = (t = find_locked(h, id)) != NULL && !t->quiet;
  pthread_mutex_unlock(&h->mu);
  if (still_writing)
    code = ina_rpc_error(reply->message, INA_RPC_UNAVAILABLE,
                         "transfer '%s': puts still in flight after %d ms; ask again", id, ABORT_QUIET_MS);
  else if (ina_rpc_pack(&resp.base, &reply->bytes, &reply->size) != INA_OK)
    code = ina_rpc_error(reply->message, INA_RPC_INTERNAL, "cannot pack the response");
done:
  ina__v1__abort_transfer_request__free_unpacked(req, NULL);
  return code;
}

ina_status_t agent_handoff_register_service(agent_handoff_t *h, ina_rpc_server_t *server) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_rpc_server_add_unary(server, GET_ENDPOINT_METHOD, get_endpoint, h, NULL));
  INA_CHECK(ina_rpc_server_add_stream(server, PREFILL_METHOD, prefill, h, NULL));
  INA_CHECK(ina_rpc_server_add_unary(server, ABORT_METHOD, abort_transfer, h, NULL));
fail:
  return st;
}
