/* The decode side of the hand-off: a Generate request whose prompt runs on a prefill
 * agent.
 *
 * agent_handoff_wrap makes the request a kv_import one (agent/scheduler/scheduler.h).
 * When the scheduler admits it, it lends the request's pages to on_import, which queues
 * the import for a caller thread. The caller checks the prefill agent's endpoint once
 * (GetKvEndpoint: the same model, layer count and entry size), calls Prefill with this
 * agent's UCX endpoint and the pages, and hands the outcome to
 * ina_scheduler_import_done: the first token, or the error (the client's stream ends
 * with it at once).
 *
 * Page safety: a Prefill the prefill agent answered, with any status, has no put in
 * flight (it answers only then), and one it refused never started; their pages go back
 * at once. A call that broke (connection lost, our deadline) may still be writing: its
 * pages stay out of the pool (quarantine) until AbortTransfer is answered, or, when the
 * prefill agent cannot be reached at all, until its own deadline for the transfer plus
 * QUARANTINE_GRACE_S has passed (it posts nothing after its deadline). */
#define INA_LOG_SUBSYS "handoff"
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "ina/v1/kv_transfer.pb-c.h"
#include "agent/agent_internal.h"
#include "agent/handoff/handoff_internal.h"
#include "agent/rpc/rpc_pb.h"

#define PREFILL_METHOD "/ina.v1.KvTransfer/Prefill"
#define ABORT_METHOD "/ina.v1.KvTransfer/AbortTransfer"
#define GET_ENDPOINT_METHOD "/ina.v1.KvTransfer/GetKvEndpoint"
/* The Prefill call's own deadline: the transfer's timeout plus this, so that the prefill
 * agent's DEADLINE_EXCEEDED (sent once its puts are over) normally arrives first. */
#define CALL_GRACE_MS 2000
#define QUARANTINE_GRACE_S 5.0
#define QUARANTINE_RETRY_S 1.0
#define ABORT_DEADLINE_MS 2000

static atomic_uint_fast64_t transfer_counter;

/* ---- jobs and their owners ---------------------------------------------------------- */

static void import_free(handoff_import_t *j) {
  if (!j) return;
  free(j->request_id);
  free(j->prompt);
  free(j->target);
  free(j->pages);
  free(j);
}

/* Lets go of one owner's hold; the last frees. */
static void import_put(handoff_import_t *j) {
  agent_handoff_t *h = j->h;
  pthread_mutex_lock(&h->mu);
  const int last = --j->owners == 0;
  pthread_mutex_unlock(&h->mu);
  if (last) import_free(j);
}

/* The wrapped request's events: passed on; the final one lets go of the job. */
static void on_decode_event(const ina_request_event_t *ev, void *user) {
  handoff_import_t *j = user;
  if (j->callback) j->callback(ev, j->user_data);
  if (ev->finish != INA_FINISH_NONE) import_put(j);
}

/* kv_import, on the driver thread: the pages are the import's now. */
static void on_import(const ina_kv_pages_t *kv, void *user) {
  handoff_import_t *j = user;
  agent_handoff_t *h = j->h;
  int32_t *pages = malloc((size_t)kv->num_pages * sizeof *pages);
  if (pages) memcpy(pages, kv->pages, (size_t)kv->num_pages * sizeof *pages);
  pthread_mutex_lock(&h->mu);
  j->pages = pages;
  j->num_pages = kv->num_pages;
  j->first_token = kv->first_token;
  j->owners++;
  j->next = NULL;
  if (h->jobs_tail)
    h->jobs_tail->next = j;
  else
    h->jobs = j;
  h->jobs_tail = j;
  pthread_cond_signal(&h->jobs_cv);
  pthread_mutex_unlock(&h->mu);
  if (!pages) { /* cannot even remember them: give them back, the caller fails the import */
    (void)ina_scheduler_release_pages(h->scheduler, kv->pages, kv->num_pages);
  }
}

ina_rpc_code_t agent_handoff_wrap(agent_handoff_t *h, ina_request_t *r, const char *target, char *msg) {
  if (!h || h->role != AGENT_ROLE_DECODE) {
    if (target && target[0])
      return ina_rpc_error(msg, INA_RPC_INVALID_ARGUMENT,
                           "prefill_agent: only a decode agent (ina-agent --role decode) sends prompts elsewhere");
    return INA_RPC_OK;
  }
  handoff_import_t *j = calloc(1, sizeof *j);
  if (!j) return ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
  j->h = h;
  j->request_id = strdup(r->id);
  j->prompt = malloc((size_t)r->prompt_len * sizeof *j->prompt);
  j->target = strdup(target && target[0] ? target : h->default_target);
  if (!j->request_id || !j->prompt || !j->target) {
    import_free(j);
    return ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
  }
  memcpy(j->prompt, r->prompt, (size_t)r->prompt_len * sizeof *j->prompt);
  j->prompt_len = r->prompt_len;
  j->sampling = r->sampling;
  j->logprobs = r->logprobs;
  snprintf(j->transfer_id, sizeof j->transfer_id, "%016" PRIx64 "-%" PRIuFAST64, (uint64_t)(uintptr_t)h ^
           (uint64_t)(handoff_now() * 1e9), (uint_fast64_t)atomic_fetch_add(&transfer_counter, 1));
  j->callback = r->callback;
  j->user_data = r->user_data;
  j->owners = 1; /* the request's callback */
  r->callback = on_decode_event;
  r->user_data = j;
  r->kv_import = on_import;
  r->kv_user_data = j;
  return INA_RPC_OK;
}

void agent_handoff_submitted(ina_request_t *r, int submitted) {
  if (!submitted && r->kv_import == on_import) import_free(r->kv_user_data);
}

/* ---- clients ------------------------------------------------------------------------ */

ina_rpc_client_t *handoff_client(agent_handoff_t *h, const char *target, handoff_client_t **entry) {
  pthread_mutex_lock(&h->mu);
  handoff_client_t *c = h->clients;
  while (c && strcmp(c->target, target) != 0) c = c->next;
  if (!c && (c = calloc(1, sizeof *c)) != NULL) {
    ina_rpc_client_options_t o = INA_RPC_CLIENT_OPTIONS_INIT;
    o.target = target;
    o.max_message_bytes = 64 << 20;
    c->target = strdup(target);
    if (!c->target || ina_rpc_client_create(&o, &c->client) != INA_OK) {
      free(c->target);
      free(c);
      c = NULL;
    } else {
      c->next = h->clients;
      h->clients = c;
    }
  }
  pthread_mutex_unlock(&h->mu);
  if (entry) *entry = c;
  return c ? c->client : NULL;
}

ina_rpc_code_t handoff_check_target(agent_handoff_t *h, const char *target, int64_t deadline_ms, char *msg) {
  handoff_client_t *entry = NULL;
  ina_rpc_client_t *client = handoff_client(h, target, &entry);
  if (!client) return ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "cannot make a client for %s", target);
  if (entry->checked) return INA_RPC_OK;
  Ina__V1__GetKvEndpointRequest req = INA__V1__GET_KV_ENDPOINT_REQUEST__INIT;
  uint8_t *bytes = NULL, *resp = NULL;
  size_t size = 0, resp_size = 0;
  ina_rpc_status_t status = {0};
  ina_rpc_code_t code = INA_RPC_OK;
  if (ina_rpc_pack(&req.base, &bytes, &size) != INA_OK)
    return ina_rpc_error(msg, INA_RPC_INTERNAL, "cannot pack GetKvEndpoint");
  if (ina_rpc_client_unary(client, GET_ENDPOINT_METHOD, bytes, size, deadline_ms, &resp, &resp_size, &status) !=
      INA_OK) {
    code = ina_rpc_error(msg, status.code != INA_RPC_OK ? status.code : INA_RPC_UNAVAILABLE,
                         "prefill agent %s: GetKvEndpoint: %s", target, status.message);
    goto done;
  }
  Ina__V1__KvEndpoint *ep = ina__v1__kv_endpoint__unpack(NULL, resp_size, resp);
  if (!ep || !ep->layout) {
    code = ina_rpc_error(msg, INA_RPC_FAILED_PRECONDITION, "prefill agent %s: its endpoint does not decode", target);
  } else {
    const ina_kv_layout_t theirs = handoff_layout_of(ep->layout);
    char why[160];
    if (strcmp(ep->role ? ep->role : "", "decode") == 0)
      code = ina_rpc_error(msg, INA_RPC_FAILED_PRECONDITION, "%s is a decode agent: it serves no prefills", target);
    else if (!ina_kv_layouts_compatible(&theirs, &h->layout, why, (int)sizeof why))
      code = ina_rpc_error(msg, INA_RPC_FAILED_PRECONDITION, "prefill agent %s cannot pair with this agent: %s",
                           target, why);
    else if (strcmp(ep->layout->model_fingerprint ? ep->layout->model_fingerprint : "", h->fingerprint) != 0)
      code = ina_rpc_error(msg, INA_RPC_FAILED_PRECONDITION,
                           "prefill agent %s serves model '%s', this agent '%s'", target,
                           ep->layout->model_fingerprint ? ep->layout->model_fingerprint : "", h->fingerprint);
  }
  if (ep) ina__v1__kv_endpoint__free_unpacked(ep, NULL);
  if (code == INA_RPC_OK) {
    pthread_mutex_lock(&h->mu);
    entry->checked = 1;
    pthread_mutex_unlock(&h->mu);
  }
done:
  free(bytes);
  free(resp);
  return code;
}

/* ---- one import (caller thread) ----------------------------------------------------- */

static void give_back(agent_handoff_t *h, handoff_import_t *j) {
  if (j->pages) (void)ina_scheduler_release_pages(h->scheduler, j->pages, j->num_pages);
  free(j->pages);
  j->pages = NULL;
}

/* Pages of a call that broke, until the prefill agent confirms (see the top). */
static void quarantine(agent_handoff_t *h, handoff_import_t *j, double release_after) {
  handoff_quarantine_t *q = calloc(1, sizeof *q);
  if (!q || !(q->target = strdup(j->target))) {
    free(q);
    INA_LOG_E(INA_LOG_SUBSYS, "out of memory: %d pages of transfer '%s' stay out of the pool", j->num_pages,
              j->transfer_id);
    free(j->pages);
    j->pages = NULL;
    return;
  }
  snprintf(q->transfer_id, sizeof q->transfer_id, "%s", j->transfer_id);
  q->pages = j->pages;
  q->num_pages = j->num_pages;
  q->next_try = release_after; /* reused: first the unreachable-release time, see retry */
  j->pages = NULL;
  pthread_mutex_lock(&h->mu);
  q->next = h->quarantine;
  h->quarantine = q;
  h->stats.quarantined_pages += q->num_pages;
  pthread_mutex_unlock(&h->mu);
}

/* AbortTransfer: 1 when the prefill agent answered (it writes no more), -1 when it
 * cannot be reached (refused connection), 0 otherwise (no answer in time). */
static int ask_abort(agent_handoff_t *h, const char *target, const char *transfer_id) {
  ina_rpc_client_t *client = handoff_client(h, target, NULL);
  if (!client) return 0;
  Ina__V1__AbortTransferRequest req = INA__V1__ABORT_TRANSFER_REQUEST__INIT;
  req.transfer_id = (char *)transfer_id;
  uint8_t *bytes = NULL, *resp = NULL;
  size_t size = 0, resp_size = 0;
  ina_rpc_status_t status = {0};
  int answer = 0;
  if (ina_rpc_pack(&req.base, &bytes, &size) == INA_OK) {
    if (ina_rpc_client_unary(client, ABORT_METHOD, bytes, size, ABORT_DEADLINE_MS, &resp, &resp_size, &status) ==
        INA_OK)
      answer = 1;
    else if (status.code == INA_RPC_UNAVAILABLE)
      answer = -1;
  }
  free(bytes);
  free(resp);
  return answer;
}

static void run_import(agent_handoff_t *h, handoff_import_t *j) {
  char msg[INA_RPC_MESSAGE_MAX] = "";
  ina_rpc_code_t code = INA_RPC_OK;
  uint8_t *bytes = NULL, *resp = NULL;
  size_t size = 0, resp_size = 0;
  ina_rpc_status_t status = {0};
  ina_kv_import_result_t res = {INA_OK, NULL, -1, 0, 0, NULL, NULL};
  Ina__V1__PrefillResponse *pr = NULL;
  int sent = 0;
  const double t0 = handoff_now();
  if (!j->pages) {
    code = ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    goto failed;
  }
  if ((code = handoff_check_target(h, j->target, 5000, msg)) != INA_RPC_OK) goto failed;
  ina_rpc_client_t *client = handoff_client(h, j->target, NULL);
  Ina__V1__PrefillRequest req = INA__V1__PREFILL_REQUEST__INIT;
  Ina__V1__SamplingParams sp = INA__V1__SAMPLING_PARAMS__INIT;
  Ina__V1__KvEndpoint ep;
  Ina__V1__KvLayout layout;
  uint32_t *prompt = malloc((size_t)j->prompt_len * sizeof *prompt);
  uint32_t *pages = malloc((size_t)j->num_pages * sizeof *pages);
  if (!prompt || !pages) {
    free(prompt);
    free(pages);
    code = ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    goto failed;
  }
  for (int32_t i = 0; i < j->prompt_len; i++) prompt[i] = (uint32_t)j->prompt[i];
  for (int32_t i = 0; i < j->num_pages; i++) pages[i] = (uint32_t)j->pages[i];
  sp.temperature = j->sampling.temperature;
  sp.top_k = (uint32_t)j->sampling.top_k;
  sp.top_p = j->sampling.top_p;
  sp.seed = j->sampling.seed;
  handoff_endpoint_message(h, &layout, &ep);
  req.transfer_id = j->transfer_id;
  req.prompt_token_ids = prompt;
  req.n_prompt_token_ids = (size_t)j->prompt_len;
  req.sampling = &sp;
  req.logprobs_plus_one = (uint32_t)(j->logprobs + 1);
  req.decode = &ep;
  req.decode_pages = pages;
  req.n_decode_pages = (size_t)j->num_pages;
  req.first_token = (uint32_t)j->first_token;
  req.timeout_ms = (uint32_t)h->timeout_ms;
  const ina_status_t packed = ina_rpc_pack(&req.base, &bytes, &size);
  free(prompt);
  free(pages);
  if (packed != INA_OK) {
    code = ina_rpc_error(msg, INA_RPC_INTERNAL, "cannot pack the PrefillRequest");
    goto failed;
  }
  sent = 1;
  if (ina_rpc_client_unary(client, PREFILL_METHOD, bytes, size, h->timeout_ms + CALL_GRACE_MS, &resp, &resp_size,
                           &status) != INA_OK) {
    code = ina_rpc_error(msg, status.code != INA_RPC_OK ? status.code : INA_RPC_UNAVAILABLE, "prefill agent %s: %s",
                         j->target, status.message);
    goto failed;
  }
  pr = ina__v1__prefill_response__unpack(NULL, resp_size, resp);
  if (!pr || pr->n_top_ids != pr->n_top_logprobs || pr->n_top_ids > INA_REQUEST_MAX_LOGPROBS) {
    code = ina_rpc_error(msg, INA_RPC_INTERNAL, "prefill agent %s: its PrefillResponse does not decode", j->target);
    sent = 0; /* it answered: nothing is in flight */
    goto failed;
  }
  /* A device cache: the puts landed in its host mirror; copy them in before decoding. */
  if (handoff_link_stage_in(h, j->pages, j->first_token, j->prompt_len) != INA_OK) {
    code = ina_rpc_error(msg, INA_RPC_INTERNAL, "%s", ina_last_error());
    sent = 0; /* the prefill agent answered: nothing is in flight */
    goto failed;
  }
  int32_t top_ids[INA_REQUEST_MAX_LOGPROBS];
  for (size_t i = 0; i < pr->n_top_ids; i++) top_ids[i] = (int32_t)pr->top_ids[i];
  res.token = (int32_t)pr->token;
  res.logprob = pr->logprob;
  res.num_top = (int32_t)pr->n_top_ids;
  res.top_ids = top_ids;
  res.top_logprobs = pr->top_logprobs;
  const ina_status_t done = ina_scheduler_import_done(h->scheduler, j->request_id, &res);
  if (done == INA_ERR_INVALID_ARGUMENT) { /* a token outside the vocabulary: the request fails with why */
    code = ina_rpc_error(msg, INA_RPC_INTERNAL, "prefill agent %s answered a bad first token: %s", j->target,
                         ina_last_error());
    sent = 0; /* it answered: nothing is in flight */
    goto failed;
  }
  if (done != INA_OK)
    INA_LOG_D(INA_LOG_SUBSYS, "import of '%s' arrived after it ended: %s", j->request_id, ina_last_error());
  give_back(h, j);
  pthread_mutex_lock(&h->mu);
  h->stats.imports_done++;
  pthread_mutex_unlock(&h->mu);
  ina__v1__prefill_response__free_unpacked(pr, NULL);
  free(bytes);
  free(resp);
  return;

failed:
  if (pr) ina__v1__prefill_response__free_unpacked(pr, NULL);
  free(bytes);
  free(resp);
  res.status = ina_rpc_code_to_status(code);
  res.error = msg;
  (void)ina_scheduler_import_done(h->scheduler, j->request_id, &res); /* NOT_FOUND once it ended */
  pthread_mutex_lock(&h->mu);
  h->stats.imports_failed++;
  pthread_mutex_unlock(&h->mu);
  /* What the prefill agent itself answered was sent after its puts (or before any). */
  const int answered = status.code == INA_RPC_INVALID_ARGUMENT || status.code == INA_RPC_FAILED_PRECONDITION ||
                       status.code == INA_RPC_ALREADY_EXISTS || status.code == INA_RPC_ABORTED ||
                       status.code == INA_RPC_INTERNAL || status.code == INA_RPC_RESOURCE_EXHAUSTED ||
                       (status.code == INA_RPC_DEADLINE_EXCEEDED && handoff_now() - t0 < 1e-3 * (double)h->timeout_ms +
                                                                                          1e-3 * CALL_GRACE_MS * 0.5);
  if (!sent || answered) {
    give_back(h, j);
  } else {
    const int a = ask_abort(h, j->target, j->transfer_id);
    if (a == 1)
      give_back(h, j);
    else /* unreachable or no answer: wait out its deadline, asking again meanwhile */
      quarantine(h, j, t0 + 1e-3 * (double)(h->timeout_ms + CALL_GRACE_MS) + QUARANTINE_GRACE_S);
  }
  INA_LOG_I(INA_LOG_SUBSYS, "request '%s': %s", j->request_id, msg);
}

/* One pass over the quarantine (caller thread): pages whose prefill agent now answers
 * AbortTransfer, or is unreachable past the release time, go back. */
static void retry_quarantine(agent_handoff_t *h) {
  pthread_mutex_lock(&h->mu);
  handoff_quarantine_t *list = h->quarantine;
  h->quarantine = NULL;
  pthread_mutex_unlock(&h->mu);
  handoff_quarantine_t *keep = NULL;
  while (list) {
    handoff_quarantine_t *q = list;
    list = q->next;
    const int a = ask_abort(h, q->target, q->transfer_id);
    if (a == 1 || (a == -1 && handoff_now() >= q->next_try)) {
      (void)ina_scheduler_release_pages(h->scheduler, q->pages, q->num_pages);
      pthread_mutex_lock(&h->mu);
      h->stats.quarantined_pages -= q->num_pages;
      pthread_mutex_unlock(&h->mu);
      INA_LOG_I(INA_LOG_SUBSYS, "transfer '%s': %d quarantined pages back in the pool", q->transfer_id, q->num_pages);
      free(q->pages);
      free(q->target);
      free(q);
    } else {
      q->next = keep;
      keep = q;
    }
  }
  pthread_mutex_lock(&h->mu);
  while (keep) {
    handoff_quarantine_t *q = keep;
    keep = q->next;
    q->next = h->quarantine;
    h->quarantine = q;
  }
  pthread_mutex_unlock(&h->mu);
}

static void *caller_main(void *arg) {
  agent_handoff_t *h = arg;
  double next_retry = handoff_now() + QUARANTINE_RETRY_S;
  pthread_mutex_lock(&h->mu);
  while (!h->stopping) {
    handoff_import_t *j = h->jobs;
    if (j) {
      h->jobs = j->next;
      if (!h->jobs) h->jobs_tail = NULL;
      h->imports_in_flight++;
      pthread_cond_broadcast(&h->wake); /* the link progresses fast from now */
      pthread_mutex_unlock(&h->mu);
      run_import(h, j);
      import_put(j);
      pthread_mutex_lock(&h->mu);
      h->imports_in_flight--;
      continue;
    }
    if (h->quarantine && handoff_now() >= next_retry) {
      pthread_mutex_unlock(&h->mu);
      retry_quarantine(h); /* several callers may: each takes the whole list, the others find it empty */
      next_retry = handoff_now() + QUARANTINE_RETRY_S;
      pthread_mutex_lock(&h->mu);
      continue;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    (void)pthread_cond_timedwait(&h->jobs_cv, &h->mu, &until);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

ina_status_t handoff_decode_start(agent_handoff_t *h, int32_t callers) {
  ina_status_t st = INA_OK;
  h->callers = calloc((size_t)callers, sizeof *h->callers);
  INA_CHECK_ALLOC(h->callers);
  for (int32_t i = 0; i < callers; i++) {
    const int err = pthread_create(&h->callers[i], NULL, caller_main, h);
    INA_REQUIRE(err == 0, INA_ERR_INTERNAL, "handoff: pthread_create failed (%s)", strerror(err));
    h->num_callers = i + 1;
  }
fail:
  return st;
}

void handoff_decode_stop(agent_handoff_t *h) {
  pthread_mutex_lock(&h->mu);
  h->stopping = 1;
  pthread_cond_broadcast(&h->jobs_cv);
  pthread_mutex_unlock(&h->mu);
  for (int32_t i = 0; i < h->num_callers; i++) pthread_join(h->callers[i], NULL);
  free(h->callers);
  h->callers = NULL;
  h->num_callers = 0;
  /* Imports nobody ran, and the quarantine: the agent is going away. */
  for (;;) {
    pthread_mutex_lock(&h->mu);
    handoff_import_t *j = h->jobs;
    if (j) h->jobs = j->next;
    pthread_mutex_unlock(&h->mu);
    if (!j) break;
    const ina_kv_import_result_t res = {INA_ERR_UNSUPPORTED, "the agent is shutting down", -1, 0, 0, NULL, NULL};
    (void)ina_scheduler_import_done(h->scheduler, j->request_id, &res);
    give_back(h, j);
    import_put(j);
  }
  h->jobs_tail = NULL;
  while (h->quarantine) {
    handoff_quarantine_t *q = h->quarantine;
    h->quarantine = q->next;
    (void)ina_scheduler_release_pages(h->scheduler, q->pages, q->num_pages);
    h->stats.quarantined_pages -= q->num_pages;
    free(q->pages);
    free(q->target);
    free(q);
  }
  while (h->clients) {
    handoff_client_t *c = h->clients;
    h->clients = c->next;
    ina_rpc_client_destroy(c->client);
    free(c->target);
    free(c);
  }
}
