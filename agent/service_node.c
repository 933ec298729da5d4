/* ina.v1.Node: GetNodeInfo (static facts), GetHealth (state), GetLoad (scheduler
 * queues, KV pages, throughput) of a single-rank agent. */
#define INA_LOG_SUBSYS "agent"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "core/cuda.h"
#include "ina/v1/node.pb-c.h"
#include "comm/heartbeat.h"
#include "agent/agent_internal.h"
#include "build_info.h"
#include "agent/rpc/rpc_pb.h"

#ifndef INA_VERSION_STRING
#define INA_VERSION_STRING ""
#endif
#ifndef INA_BUILD_TYPE
#define INA_BUILD_TYPE ""
#endif

#define GET_NODE_INFO_METHOD "/ina.v1.Node/GetNodeInfo"
#define GET_HEALTH_METHOD "/ina.v1.Node/GetHealth"
#define GET_LOAD_METHOD "/ina.v1.Node/GetLoad"

static ina_rpc_code_t pack_reply(const ProtobufCMessage *msg, ina_rpc_reply_t *reply) {
  if (ina_rpc_pack(msg, &reply->bytes, &reply->size) != INA_OK)
    return ina_rpc_error(reply->message, INA_RPC_INTERNAL, "cannot pack the response");
  return INA_RPC_OK;
}

/* Empty requests still have to be well-formed protobuf. */
#define REQUIRE_DECODES(type, prefix, request, reply)                                        \
  do {                                                                                       \
    type *decoded_ = prefix##__unpack(NULL, (request)->size, (request)->bytes);              \
    if (!decoded_)                                                                           \
      return ina_rpc_error((reply)->message, INA_RPC_INVALID_ARGUMENT,                       \
                           "request: %zu bytes are not an " #type, (request)->size);         \
    prefix##__free_unpacked(decoded_, NULL);                                                 \
  } while (0)

/* MemTotal of /proc/meminfo in bytes; 0 when unreadable. */
static uint64_t host_memory_bytes(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  unsigned long long kib = 0;
  char line[256];
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) break;
  fclose(f);
  return (uint64_t)kib * 1024u;
}

static ina_rpc_code_t get_node_info(void *ctx, const ina_rpc_request_t *request,
                                    ina_rpc_reply_t *reply) {
  ina_agent_t *agent = ctx;
  REQUIRE_DECODES(Ina__V1__GetNodeInfoRequest, ina__v1__get_node_info_request, request, reply);
  const ina_model_config_t *cfg = ina_model_config(agent->model);

  char hostname[256] = "";
  if (gethostname(hostname, sizeof hostname - 1) != 0) hostname[0] = '\0';
  char gpu_name[256] = "";
  Ina__V1__GpuInfo gpu = INA__V1__GPU_INFO__INIT, *gpus[1] = {&gpu};
  if (agent->device >= 0) {
    ina_cuda_device_name(agent->device, gpu_name, sizeof gpu_name);
    gpu.gpu_index = (uint32_t)agent->device;
    gpu.name = gpu_name;
  }
  /* The ranks of this node (the proto's contract: each node speaks for its own). */
  const size_t all_ranks = (size_t)agent->num_ranks;
  Ina__V1__RankInfo *rank_infos = calloc(all_ranks, sizeof *rank_infos);
  Ina__V1__RankInfo **ranks = calloc(all_ranks, sizeof *ranks);
  if (!rank_infos || !ranks) {
    free(rank_infos);
    free(ranks);
    return ina_rpc_error(reply->message, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
  }
  size_t n_ranks = 0;
  for (size_t k = 0; k < all_ranks; k++) {
    const ina_agent_rank_t *a = &agent->ranks[k];
    if (a->node_id != agent->node_id) continue;
    const size_t i = n_ranks++;
    Ina__V1__RankInfo *r = &rank_infos[i];
    ina__v1__rank_info__init(r);
    r->global_rank = (uint32_t)a->global_rank;
    r->local_rank = (uint32_t)a->local_rank;
    r->gpu_index = a->gpu_index >= 0 ? (uint32_t)a->gpu_index : 0;
    r->pid = (uint32_t)a->pid;
    r->tp_rank = (uint32_t)a->tp_rank;
    r->dp_rank = (uint32_t)a->dp_rank;
    r->ep_rank = (uint32_t)a->ep_rank;
    ranks[i] = r;
  }

  Ina__V1__ModelInfo model = INA__V1__MODEL_INFO__INIT;
  uint32_t n_moe_layers = 0;
  for (int32_t l = 0; l < cfg->num_layers; l++) n_moe_layers += (uint32_t)ina_cfg_layer_is_moe(cfg, l);
  model.name = agent->model_name;
  model.architecture = cfg->arch == INA_ARCH_DEEPSEEK_V2 ? "DeepseekV2ForCausalLM"
                       : ina_cfg_has_indexer(cfg)       ? "DeepseekV32ForCausalLM"
                                                        : "DeepseekV3ForCausalLM";
  model.index_topk = ina_cfg_has_indexer(cfg) ? (uint32_t)cfg->index_topk : 0;
  model.vocab_size = (uint32_t)cfg->vocab_size;
  model.n_layers = (uint32_t)cfg->num_layers;
  model.n_moe_layers = n_moe_layers;
  model.n_routed_experts = (uint32_t)cfg->n_routed_experts;
  model.n_experts_per_token = (uint32_t)cfg->num_experts_per_tok;
  model.max_context_tokens = (uint32_t)agent->max_context;
  model.weight_dtype = (char *)agent->weight_dtype;
  model.eos_token_id = cfg->eos_token_id >= 0 ? (uint32_t)cfg->eos_token_id : 0;

  Ina__V1__BuildInfo build = INA__V1__BUILD_INFO__INIT;
  build.version = INA_VERSION_STRING;
  build.git_commit = INA_GIT_COMMIT;
  build.cuda_version = INA_CUDA_VERSION;
  char *archs[] = {"sm_90a"}; /* cmake/cuda.cmake: sm_90a code plus compute_90 PTX */
  build.n_cuda_archs = INA_CUDA_VERSION[0] ? 1 : 0;
  build.cuda_archs = archs;
  build.build_type = INA_BUILD_TYPE;

  Ina__V1__NodeInfo info = INA__V1__NODE_INFO__INIT;
  info.hostname = hostname;
  info.n_gpus = agent->device >= 0 ? 1 : 0; /* "cpu": no GPU entry */
  info.gpus = gpus;
  info.n_ranks = n_ranks;
  info.ranks = ranks;
  info.world_size = (uint32_t)agent->num_ranks;
  info.model = &model;
  info.build = &build;
  info.host_memory_bytes = host_memory_bytes();
  info.attention_data_parallel = agent->attention_dp != 0;
  ina_engine_ep_traffic_t traffic;
  info.ep_exchange = (char *)"";
  if (agent->ep > 1 && ina_engine_ep_traffic(agent->engine, &traffic) == INA_OK) {
    info.ep_exchange = (char *)ina_engine_ep_exchange_name(traffic.exchange);
    info.ep_micro_batches = (uint32_t)(traffic.micro_batches > 0 ? traffic.micro_batches : 1);
  }
  const ina_rpc_code_t code = pack_reply(&info.base, reply);
  free(rank_infos);
  free(ranks);
  return code;
}

static Ina__V1__NodeState node_state(agent_state_t s) {
  switch (s) {
  case AGENT_STARTING: return INA__V1__NODE_STATE__NODE_STATE_STARTING;
  case AGENT_SERVING: return INA__V1__NODE_STATE__NODE_STATE_SERVING;
  case AGENT_DRAINING:
  case AGENT_STOPPED: return INA__V1__NODE_STATE__NODE_STATE_DRAINING;
  case AGENT_FAILED: return INA__V1__NODE_STATE__NODE_STATE_FAILED;
  }
  return INA__V1__NODE_STATE__NODE_STATE_UNSPECIFIED;
}

static ina_rpc_code_t get_health(void *ctx, const ina_rpc_request_t *request,
                                 ina_rpc_reply_t *reply) {
  ina_agent_t *agent = ctx;
  REQUIRE_DECODES(Ina__V1__GetHealthRequest, ina__v1__get_health_request, request, reply);
  char message[INA_RPC_MESSAGE_MAX] = "";
  pthread_mutex_lock(&agent->lock);
  Ina__V1__NodeState state = node_state(agent->state);
  if (agent->state == AGENT_FAILED) snprintf(message, sizeof message, "%s", agent->warmup_error);
  else if (agent->state == AGENT_STARTING) snprintf(message, sizeof message, "warming up");
  else if (agent->state != AGENT_SERVING) snprintf(message, sizeof message, "stopping");
  const int32_t silent_rank = agent->silent_rank;
  const Ina__V1__NodeState rank_state = state;
  /* A silent rank fails the node while it stays silent (liveness, agent_liveness.c). */
  if (agent->state == AGENT_SERVING && agent_silent_locked(agent, message, sizeof message))
    state = INA__V1__NODE_STATE__NODE_STATE_FAILED;
  pthread_mutex_unlock(&agent->lock);

  /* Every rank steps with this one, so each shares the node's state, but for a rank
   * found silent; the ages come from the job's heartbeat (0 for a one-rank job). */
  enum { MAX_LISTED = 64 };
  Ina__V1__RankHealth rank_health[MAX_LISTED], *ranks[MAX_LISTED];
  size_t n = 0;
  for (int32_t k = 0; k < agent->num_ranks && n < MAX_LISTED; k++) {
    if (agent->ranks[k].node_id != agent->node_id) continue; /* this node's ranks */
    const int32_t global = agent->ranks[k].global_rank;
    ina__v1__rank_health__init(&rank_health[n]);
    rank_health[n].global_rank = (uint32_t)global;
    rank_health[n].state = global == silent_rank ? INA__V1__NODE_STATE__NODE_STATE_FAILED : rank_state;
    const int64_t age = ina_heartbeat_age_ms(agent->heartbeat, global);
    rank_health[n].last_heartbeat_age_ms = age > 0 ? (uint64_t)age : 0;
    ranks[n] = &rank_health[n];
    n++;
  }
  Ina__V1__NodeHealth health = INA__V1__NODE_HEALTH__INIT;
  health.state = state;
  health.message = message;
  health.uptime_seconds = (uint64_t)(agent_now_seconds() - agent->start_seconds);
  health.n_ranks = n;
  health.ranks = ranks;
  return pack_reply(&health.base, reply);
}

/* The engine's per-expert counters since the last reset into load->expert_load (one
 * entry per MoE layer), then the reply. An engine without counters answers
 * UNIMPLEMENTED, naming why. */
static ina_rpc_code_t reply_with_expert_load(ina_agent_t *agent, int reset, Ina__V1__NodeLoad *load,
                                             ina_rpc_reply_t *reply) {
  const int32_t experts = ina_engine_config(agent->engine)->n_routed_experts;
  int32_t layers = 0;
  uint64_t *counts = NULL;
  Ina__V1__ExpertLoad *entries = NULL, **list = NULL;
  ina_rpc_code_t code = INA_RPC_OK;
  if (!agent->expert_base) {
    ina_engine_expert_load(agent->engine, 0, NULL, 0, &layers); /* for its message */
    snprintf(reply->message, sizeof reply->message, "include_expert_load: %s", ina_last_error());
    return INA_RPC_UNIMPLEMENTED;
  }
  /* A dense-only model (no routed experts) has no counters and answers no layers. */
  const size_t n = agent->expert_counters, per_layer = experts > 0 ? (size_t)experts : 1;
  counts = malloc((n ? n : 1) * sizeof *counts);
  entries = calloc(n / per_layer + 1, sizeof *entries);
  list = calloc(n / per_layer + 1, sizeof *list);
  if (!counts || !entries || !list) {
    snprintf(reply->message, sizeof reply->message, "GetLoad: out of memory");
    code = INA_RPC_INTERNAL;
    goto done;
  }
  /* Read and move the baseline under the agent lock, so that resetting calls see
   * disjoint windows with the matching lengths. */
  pthread_mutex_lock(&agent->lock);
  const double now = agent_now_seconds();
  const ina_status_t st = ina_engine_expert_load(agent->engine, 0, counts, (int64_t)n, &layers);
  load->expert_load_seconds = now - agent->expert_load_since;
  if (st == INA_OK) {
    for (size_t i = 0; i < n; i++) {
      const uint64_t total = counts[i];
      counts[i] -= agent->expert_base[i];
      if (reset) agent->expert_base[i] = total;
    }
    if (reset) agent->expert_load_since = now;
  }
  pthread_mutex_unlock(&agent->lock);
  if (st != INA_OK) {
    snprintf(reply->message, sizeof reply->message, "GetLoad: %s", ina_last_error());
    code = INA_RPC_INTERNAL;
    goto done;
  }
  for (int32_t m = 0; m < layers; m++) {
    ina__v1__expert_load__init(&entries[m]);
    entries[m].moe_layer = (uint32_t)m;
    entries[m].n_tokens = (size_t)experts;
    entries[m].tokens = counts + (size_t)m * (size_t)experts;
    list[m] = &entries[m];
  }
  load->n_expert_load = (size_t)layers;
  load->expert_load = list;
  code = pack_reply(&load->base, reply);
done:
  free(counts);
  free(entries);
  free(list);
  return code;
}

static ina_rpc_code_t get_load(void *ctx, const ina_rpc_request_t *request,
                               ina_rpc_reply_t *reply) {
  ina_agent_t *agent = ctx;
  Ina__V1__GetLoadRequest *req =
      ina__v1__get_load_request__unpack(NULL, request->size, request->bytes);
  if (!req)
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "request: %zu bytes are not an Ina__V1__GetLoadRequest", request->size);
  const int include_expert_load = req->include_expert_load, reset = req->reset_expert_load;
  ina__v1__get_load_request__free_unpacked(req, NULL);
  ina_scheduler_stats_t s;
  ina_scheduler_stats(agent->scheduler, &s);

  /* Throughput over the window since the previous GetLoad (or since start-up). */
  double now = agent_now_seconds();
  pthread_mutex_lock(&agent->lock);
  double window = now - agent->load_window_start;
  int64_t prefill = s.prefill_tokens - agent->load_prefill_tokens;
  int64_t generated = s.generated_tokens - agent->load_generated_tokens;
  agent->load_window_start = now;
  agent->load_prefill_tokens = s.prefill_tokens;
  agent->load_generated_tokens = s.generated_tokens;
  pthread_mutex_unlock(&agent->lock);

  Ina__V1__NodeLoad load = INA__V1__NODE_LOAD__INIT;
  load.queued_requests = (uint32_t)s.waiting;
  load.running_requests = (uint32_t)s.running;
  load.kv_pages_used = (uint64_t)s.kv_pages_used;
  load.kv_pages_free = (uint64_t)s.kv_pages_free;
  load.kv_page_size = (uint32_t)agent->page_size;
  load.kv_pages_cached = (uint64_t)s.prefix_cache_pages;
  load.kv_pages_transfer = (uint64_t)s.kv_pages_lent;
  load.window_seconds = window;
  load.prefill_tokens_per_second = window > 0 ? (double)prefill / window : 0;
  load.decode_tokens_per_second = window > 0 ? (double)generated / window : 0;
  if (!include_expert_load) return pack_reply(&load.base, reply);
  return reply_with_expert_load(agent, reset, &load, reply);
}

ina_status_t agent_register_node_service(ina_agent_t *agent) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_rpc_server_add_unary(agent->server, GET_NODE_INFO_METHOD, get_node_info, agent, NULL));
  INA_CHECK(ina_rpc_server_add_unary(agent->server, GET_HEALTH_METHOD, get_health, agent, NULL));
  INA_CHECK(ina_rpc_server_add_unary(agent->server, GET_LOAD_METHOD, get_load, agent, NULL));
fail:
  return st;
}
