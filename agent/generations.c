/* What the agent's services share beyond agent.c: the registry of generations in flight,
 * used by the services that start them (gRPC Generate, the HTTP API): admission under the
 * agent lock, against the state, a silent rank, a duplicate request id and a full queue,
 * then the scheduler's submit; the removal at a generation's final event; and the
 * listeners' HOST:PORT addresses. */
#define INA_LOG_SUBSYS "agent"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "agent/agent_internal.h"
#include "agent/handoff/handoff.h"

agent_generation_t *agent_find_generation_locked(ina_agent_t *agent, const char *request_id) {
  for (agent_generation_t *g = agent->generations; g; g = g->next)
    if (strcmp(g->request_id, request_id) == 0) return g;
  return NULL;
}

void agent_registry_remove(ina_agent_t *agent, agent_generation_t *g) {
  pthread_mutex_lock(&agent->lock);
  if (g->prev) g->prev->next = g->next;
  else agent->generations = g->next;
  if (g->next) g->next->prev = g->prev;
  g->prev = g->next = NULL;
  agent->num_generations--;
  pthread_cond_broadcast(&agent->changed);
  pthread_mutex_unlock(&agent->lock);
}

/* Lock held: 1 when max_queued_requests wait for admission, with the refusal in msg.
 * (The scheduler's lock inside the agent's is safe, see agent_submit_generation.) */
static int queue_full_locked(ina_agent_t *agent, char *msg) {
  if (agent->max_queued_requests <= 0) return 0;
  ina_scheduler_stats_t stats;
  ina_scheduler_stats(agent->scheduler, &stats);
  if (stats.waiting < agent->max_queued_requests) return 0;
  ina_rpc_error(msg, INA_RPC_RESOURCE_EXHAUSTED,
                "the queue is full: %d requests wait for admission (the agent's limit, "
                "--max-queued-requests %d); retry later",
                (int)stats.waiting, (int)agent->max_queued_requests);
  return 1;
}

/* Submits r, on a decode agent with its prompt sent to a prefill agent. */
static ina_rpc_code_t submit_to_scheduler(ina_agent_t *agent, const agent_generation_t *g, const ina_request_t *r,
                                          char *msg) {
  ina_request_t q = *r;
  ina_rpc_code_t code = agent_handoff_wrap(agent->handoff, &q, g->prefill_agent, msg);
  if (code != INA_RPC_OK) return code;
  const int submitted = ina_scheduler_submit(agent->scheduler, &q) == INA_OK;
  if (!submitted) code = ina_rpc_error(msg, INA_RPC_INVALID_ARGUMENT, "%s", ina_last_error());
  agent_handoff_submitted(&q, submitted);
  return code;
}

ina_rpc_code_t agent_submit_generation(ina_agent_t *agent, agent_generation_t *g, const ina_request_t *r,
                                       char *msg) {
  ina_rpc_code_t code = INA_RPC_OK;
  pthread_mutex_lock(&agent->lock);
  char silent[INA_RPC_MESSAGE_MAX];
  if (agent->state != AGENT_SERVING) {
    code = ina_rpc_error(msg, INA_RPC_UNAVAILABLE, "the agent is %s",
                         agent->state == AGENT_STARTING ? "warming up" : "not serving");
  } else if (agent_silent_locked(agent, silent, sizeof silent)) {
    code = ina_rpc_error(msg, INA_RPC_UNAVAILABLE, "not serving: %s", silent);
  } else if (agent_find_generation_locked(agent, g->request_id)) {
    code = ina_rpc_error(msg, INA_RPC_ALREADY_EXISTS, "request_id: '%s' is already in flight (queued or running)",
                         g->request_id);
  } else if (queue_full_locked(agent, msg)) {
    code = INA_RPC_RESOURCE_EXHAUSTED;
  } else if (agent_handoff_role(agent->handoff) == AGENT_ROLE_PREFILL) {
    code = ina_rpc_error(msg, INA_RPC_UNAVAILABLE,
                         "this agent runs with --role prefill: it serves ina.v1.KvTransfer/Prefill for decode agents; "
                         "send Generate to a decode agent");
  } else if ((code = submit_to_scheduler(agent, g, r, msg)) != INA_RPC_OK) {
  } else {
    /* Its callback cannot finish it before this: it needs the lock to leave the list. */
    g->next = agent->generations;
    if (g->next) g->next->prev = g;
    agent->generations = g;
    agent->num_generations++;
  }
  pthread_mutex_unlock(&agent->lock);
  return code;
}

ina_status_t agent_parse_listen(const char *what, const char *text, char *host, size_t host_size, int *port) {
  ina_status_t st = INA_OK;
  const char *colon = strrchr(text, ':');
  INA_REQUIRE(colon && colon != text, INA_ERR_INVALID_ARGUMENT,
              "%s '%s': expected HOST:PORT", what, text);
  const char *h = text;
  size_t hlen = (size_t)(colon - text);
  if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
    h++;
    hlen -= 2;
  }
  INA_REQUIRE(hlen > 0 && hlen < host_size, INA_ERR_INVALID_ARGUMENT,
              "%s '%s': bad host", what, text);
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  char *end = NULL;
  errno = 0;
  long p = strtol(colon + 1, &end, 10);
  INA_REQUIRE(colon[1] && !*end && errno == 0 && p >= 0 && p <= 65535, INA_ERR_INVALID_ARGUMENT,
              "%s '%s': port '%s' is not in 0..65535", what, text, colon + 1);
  *port = (int)p;
fail:
  return st;
}
