/* Prefill/decode disaggregation in the agent (proto/ina/v1/kv_transfer.proto): the
 * agent's role, the ina.v1.KvTransfer service a prefill agent serves, and the decode
 * side that sends each prompt to a prefill agent and receives its KV entries into pages
 * the scheduler reserved (agent/scheduler/scheduler.h, the KV hand-off).
 *
 * The pieces:
 *   - kv_link.c: one thread owns the UCX engine (comm/ucx_engine.h; UCX runs single-
 *     threaded). It registers the engine's KV storage, packs this agent's endpoint blob,
 *     connects to decode agents' blobs and posts and completes the puts of prefills.
 *   - prefill_side.c: GetKvEndpoint, Prefill and AbortTransfer.
 *   - decode_side.c: wraps a Generate request so that its prompt runs on a prefill agent;
 *     caller threads make the Prefill calls; pages of a transfer that ended badly stay
 *     out of the pool until the prefill agent confirms it writes no more (or is gone).
 *
 * Private to agent/. Thread safety: as each function says. */
#ifndef INA_AGENT_HANDOFF_HANDOFF_H
#define INA_AGENT_HANDOFF_HANDOFF_H

#include <stdint.h>

#include "agent/rpc/rpc_server.h"
#include "agent/rpc/rpc_status.h"
#include "agent/scheduler/scheduler.h"

typedef struct ina_agent ina_agent_t;

typedef enum agent_role {
  AGENT_ROLE_BOTH = 0, /* serves Generate by itself, and Prefill for decode agents */
  AGENT_ROLE_PREFILL,  /* serves Prefill only */
  AGENT_ROLE_DECODE,   /* serves Generate, its prompts run on a prefill agent */
} agent_role_t;

/* "both", "prefill", "decode"; "unknown" otherwise. */
const char *agent_role_name(int32_t role);
/* 0 and *role for a known name, -1 otherwise. */
int agent_role_parse(const char *name, int32_t *role);

typedef struct agent_handoff agent_handoff_t;

typedef struct agent_handoff_options {
  int32_t role;
  /* Decode: the default prefill agent, "host:port"; required. */
  const char *prefill_agent;
  /* Decode: how long a transfer may take, from the Prefill call to its answer; <= 0:
   * 30000. */
  int64_t timeout_ms;
  /* Decode: Prefill calls in flight at once (threads); <= 0: 32. */
  int32_t caller_threads;
  /* What must match on both sides beyond the cache's shape (the model's identity). */
  const char *model_fingerprint;
} agent_handoff_options_t;

/* Sets the hand-off up for agent (its engine and scheduler exist, its server is not
 * started). Refuses with a clear error what this version cannot run: a decode agent of
 * several ranks (imported entries would reach rank 0's cache only), attention data
 * parallelism. A CUDA engine's cache is registered as device memory (staged through a
 * host mirror by a UCX without CUDA support). A decode agent asks its default prefill agent for its endpoint first and
 * refuses a mismatch (model, layer count, entry size). *out is NULL on failure. */
ina_status_t agent_handoff_start(ina_agent_t *agent, const agent_handoff_options_t *options,
                                 agent_handoff_t **out);
/* Registers ina.v1.KvTransfer on the agent's server (before it starts). */
ina_status_t agent_handoff_register_service(agent_handoff_t *h, ina_rpc_server_t *server);
/* After the server is gone (no handler runs) and before the scheduler goes: ends the
 * transfers and threads, gives every page back. NULL is a no-op. */
void agent_handoff_stop(agent_handoff_t *h);

int32_t agent_handoff_role(const agent_handoff_t *h);

/* Decode side: rewrites r (a copy the caller submits next) so that its prompt runs on
 * `prefill_agent` ("host:port"; NULL or "": the default) and its entries arrive through
 * the scheduler's kv_import; its events still reach r's callback. INA_RPC_OK, or a
 * refusal with msg [INA_RPC_MESSAGE_MAX]. After INA_RPC_OK the caller must call
 * agent_handoff_submitted with the submit's outcome. Any thread. */
ina_rpc_code_t agent_handoff_wrap(agent_handoff_t *h, ina_request_t *r, const char *prefill_agent, char *msg);
/* submitted 0: the scheduler refused r; what wrap made is freed. */
void agent_handoff_submitted(ina_request_t *r, int submitted);

/* Counters for tests, metrics and logs. */
typedef struct agent_handoff_stats {
  int64_t prefills_served;   /* prefill side: transfers completed */
  int64_t prefills_failed;   /* prefill side: transfers that ended with an error or abort */
  int64_t bytes_written;     /* prefill side: bytes put into decode agents' pages */
  int64_t puts;
  int64_t imports_done;      /* decode side: prompts whose entries arrived */
  int64_t imports_failed;
  int32_t quarantined_pages; /* decode side: pages held until a prefill agent confirms */
} agent_handoff_stats_t;
void agent_handoff_stats(agent_handoff_t *h, agent_handoff_stats_t *out);

#endif
