/* The hand-off's life cycle: roles, start (what this version refuses, the KV storage,
 * UCX, the threads, the decode agent's first check of its prefill agent) and stop. */
#define INA_LOG_SUBSYS "handoff"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "kvcache/page_pool.h"
#include "agent/agent_internal.h"
#include "agent/handoff/handoff_internal.h"

/* How long a decode agent waits at start for its prefill agent to answer. */
#define FIRST_CHECK_S 60.0

const char *agent_role_name(int32_t role) {
  switch (role) {
  case AGENT_ROLE_BOTH: return "both";
  case AGENT_ROLE_PREFILL: return "prefill";
  case AGENT_ROLE_DECODE: return "decode";
  }
  return "unknown";
}

int agent_role_parse(const char *name, int32_t *role) {
  for (int32_t r = AGENT_ROLE_BOTH; r <= AGENT_ROLE_DECODE; r++)
    if (name && strcmp(name, agent_role_name(r)) == 0) {
      *role = r;
      return 0;
    }
  return -1;
}

int32_t agent_handoff_role(const agent_handoff_t *h) { return h ? h->role : AGENT_ROLE_BOTH; }

void agent_handoff_stats(agent_handoff_t *h, agent_handoff_stats_t *out) {
  memset(out, 0, sizeof *out);
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  *out = h->stats;
  pthread_mutex_unlock(&h->mu);
}

/* The decode agent's default prefill agent must answer and pair before it serves;
 * a prefill agent still starting gets FIRST_CHECK_S to come up. */
static ina_status_t first_check(agent_handoff_t *h) {
  ina_status_t st = INA_OK;
  char msg[INA_RPC_MESSAGE_MAX] = "";
  const double t0 = handoff_now();
  double next_note = t0 + 5;
  for (;;) {
    const ina_rpc_code_t code = handoff_check_target(h, h->default_target, 2000, msg);
    if (code == INA_RPC_OK) break;
    INA_REQUIRE(code == INA_RPC_UNAVAILABLE || code == INA_RPC_DEADLINE_EXCEEDED, INA_ERR_INVALID_ARGUMENT,
                "--prefill-agent %s: %s", h->default_target, msg);
    INA_REQUIRE(handoff_now() - t0 < FIRST_CHECK_S, INA_ERR_IO,
                "--prefill-agent %s did not answer within %.0f s: %s", h->default_target, FIRST_CHECK_S, msg);
    if (handoff_now() >= next_note) {
      INA_LOG_I(INA_LOG_SUBSYS, "waiting for the prefill agent at %s (%s)", h->default_target, msg);
      next_note += 5;
    }
    const struct timespec pause = {0, 250000000L};
    nanosleep(&pause, NULL);
  }
  INA_LOG_I(INA_LOG_SUBSYS, "prefill agent %s pairs with this agent's cache", h->default_target);
fail:
  return st;
}

ina_status_t agent_handoff_start(ina_agent_t *agent, const agent_handoff_options_t *o, agent_handoff_t **out) {
  ina_status_t st = INA_OK;
  agent_handoff_t *h = NULL;
  *out = NULL;
  INA_REQUIRE(o->role >= AGENT_ROLE_BOTH && o->role <= AGENT_ROLE_DECODE, INA_ERR_INVALID_ARGUMENT,
              "--role: %d is not a role", (int)o->role);
  INA_REQUIRE(o->role != AGENT_ROLE_DECODE || (o->prefill_agent && o->prefill_agent[0]), INA_ERR_INVALID_ARGUMENT,
              "--role decode needs --prefill-agent HOST:PORT (the agent that runs its prompts)");
  INA_REQUIRE(o->role != AGENT_ROLE_DECODE || agent->num_ranks <= 1, INA_ERR_UNSUPPORTED,
              "--role decode runs on one rank in this version: imported entries would reach rank 0's cache only "
              "(this job has %d ranks)", (int)agent->num_ranks);
  INA_REQUIRE(!agent->attention_dp, INA_ERR_UNSUPPORTED,
              "the prefill/decode hand-off does not run with --attention-dp in this version (a sequence's pages "
              "live on its data-parallel rank)");
  ina_page_pool_t *pool = ina_engine_page_pool(agent->engine);
  void *storage = NULL;
  size_t storage_bytes = 0;
  int on_device = 0;
  int32_t device = -1;
  INA_CHECK(ina_engine_kv_storage(agent->engine, &storage, &storage_bytes, &on_device, &device));
  h = calloc(1, sizeof *h);
  INA_CHECK_ALLOC(h);
  h->agent = agent;
  h->scheduler = agent->scheduler;
  h->role = o->role;
  h->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 30000;
  const char *stall = getenv("INA_TEST_KV_STALL_MS");
  if (stall && atof(stall) > 0) {
    h->test_stall_s = 1e-3 * atof(stall);
    INA_LOG_W(INA_LOG_SUBSYS, "INA_TEST_KV_STALL_MS: every transfer's puts are held back %.0f ms (a test hook)",
              1e3 * h->test_stall_s);
  }
  h->tp_size = agent->tp > 0 ? agent->tp : 1;
  snprintf(h->fingerprint, sizeof h->fingerprint, "%s", o->model_fingerprint ? o->model_fingerprint : "");
  h->layout = (ina_kv_layout_t){ina_page_pool_page_size(pool), ina_page_pool_num_pages(pool),
                                ina_page_pool_num_layers(pool),
                                (int64_t)ina_page_pool_entry_elems(pool) *
                                    (int64_t)ina_dtype_size(ina_page_pool_dtype(pool))};
  h->kv_base = storage;
  h->kv_bytes = (size_t)h->layout.num_layers * (size_t)h->layout.num_pages * (size_t)h->layout.page_size *
                (size_t)h->layout.entry_bytes;
  h->kv_on_device = on_device;
  h->device = device;
  INA_REQUIRE(h->kv_bytes == storage_bytes, INA_ERR_INTERNAL,
              "the engine's KV storage is %zu bytes, its pool's layout says %zu", storage_bytes, h->kv_bytes);
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->wake, NULL);
  pthread_cond_init(&h->quiet, NULL);
  pthread_cond_init(&h->jobs_cv, NULL);
  if (o->role == AGENT_ROLE_DECODE) {
    h->default_target = strdup(o->prefill_agent);
    INA_CHECK_ALLOC(h->default_target);
  }
  INA_CHECK(handoff_link_start(h));
  if (o->role == AGENT_ROLE_DECODE) {
    INA_CHECK(handoff_decode_start(h, o->caller_threads > 0 ? o->caller_threads : 32));
    INA_CHECK(first_check(h));
  }
  INA_LOG_I(INA_LOG_SUBSYS, "role %s: KV pages of %d tokens x %d layers x %lld bytes, UCX endpoint of %zu bytes",
            agent_role_name(h->role), h->layout.page_size, h->layout.num_layers, (long long)h->layout.entry_bytes,
            h->blob_size);
  *out = h;
  return INA_OK;
fail:
  agent_handoff_stop(h);
  return st;
}

void agent_handoff_stop(agent_handoff_t *h) {
  if (!h) return;
  handoff_decode_stop(h);
  handoff_link_stop(h);
  pthread_cond_destroy(&h->wake);
  pthread_cond_destroy(&h->quiet);
  pthread_cond_destroy(&h->jobs_cv);
  pthread_mutex_destroy(&h->mu);
  free(h->default_target);
  free(h);
}
