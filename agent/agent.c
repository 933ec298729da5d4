/* The agent's life cycle: create (model, engine, scheduler, gRPC server, warm-up),
 * stop requests, drain and shutdown, destroy. The services live in service_*.c. */
#define INA_LOG_SUBSYS "agent"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "core/cuda.h"
#include "agent/agent_internal.h"
#include "agent/handoff/handoff.h"

/* The warm-up's request id holds a space, which the Generate validator refuses, so no
 * client request can collide with it. */
#define WARMUP_REQUEST_ID "warm up"
/* After cancelling the generations left at the end of the grace period, how long to
 * wait for their final events (they come at the scheduler's next step). */
#define CANCEL_SETTLE_MS 30000
/* After the last generation ended, how long to let calls still open send what they
 * queued (final responses and statuses) before the server cancels them. Only streams
 * that never end by themselves (health Watch) wait this long. */
#define FLUSH_MS 1000

double agent_now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Absolute CLOCK_REALTIME time `ms` from now, for pthread_cond_timedwait. */
static struct timespec deadline_after_ms(int64_t ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += (time_t)(ms / 1000);
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* ---- warm-up ------------------------------------------------------------------------ */

static void warmup_done(const ina_request_event_t *event, void *user_data) {
  ina_agent_t *agent = user_data;
  if (event->finish == INA_FINISH_NONE) return;
  /* Health is updated under the agent lock, like drain() does, so that a stop racing
   * with the end of the warm-up cannot leave health SERVING. */
  pthread_mutex_lock(&agent->lock);
  int starting = agent->state == AGENT_STARTING;
  if (event->finish == INA_FINISH_ERROR || event->finish == INA_FINISH_CANCELLED) {
    agent->warmup_status = event->status != INA_OK ? event->status : INA_ERR_IO;
    snprintf(agent->warmup_error, sizeof agent->warmup_error, "warm-up generation %s: %s",
             ina_finish_reason_string(event->finish), event->error ? event->error : "");
    if (starting) {
      agent->state = AGENT_FAILED;
      INA_LOG_E(INA_LOG_SUBSYS, "%s", agent->warmup_error);
    }
  } else if (starting) {
    agent->state = AGENT_SERVING;
    if (agent->silent_rank < 0) ina_health_set_all(agent->health, INA_HEALTH_SERVING); /* else: liveness */
    INA_LOG_I(INA_LOG_SUBSYS, "warm-up done: serving on port %d", ina_agent_port(agent));
  }
  pthread_cond_broadcast(&agent->changed);
  pthread_mutex_unlock(&agent->lock);
}

static ina_status_t submit_warmup(ina_agent_t *agent, int32_t warmup_tokens) {
  const ina_model_config_t *cfg = ina_model_config(agent->model);
  int32_t prompt[3];
  int32_t prompt_len = 3;
  for (int32_t i = 0; i < prompt_len; i++) prompt[i] = (i + 1) % cfg->vocab_size;
  if (prompt_len + warmup_tokens > agent->max_context) {
    prompt_len = 2;
    warmup_tokens = (int32_t)(agent->max_context - prompt_len);
  }
  ina_request_t req = INA_REQUEST_INIT;
  req.id = WARMUP_REQUEST_ID;
  req.prompt = prompt;
  req.prompt_len = prompt_len;
  req.max_new_tokens = warmup_tokens;
  req.ignore_eos = 1;
  req.callback = warmup_done;
  req.user_data = agent;
  return ina_scheduler_submit(agent->scheduler, &req);
}

/* ---- create ------------------------------------------------------------------------- */

static const char *weight_dtype_name(const ina_model_config_t *cfg, const ina_agent_options_t *o,
                                     int checkpoint) {
  if (checkpoint) return cfg->fp8_block_scaled ? "fp8_e4m3" : "bf16";
  switch (o->model_dtype) {
  case INA_DTYPE_F32: return "f32";
  case INA_DTYPE_FP8_E4M3: return "fp8_e4m3";
  default: return "bf16";
  }
}

/* The job's ranks and layout from the options (NULL or none given: this process alone). */
static ina_status_t copy_layout(ina_agent_t *agent, const ina_agent_options_t *o) {
  ina_status_t st = INA_OK;
  const int given = o && o->ranks && o->num_ranks > 0;
  agent->num_ranks = given ? o->num_ranks : 1;
  agent->tp = given ? o->tp : 1;
  agent->dp = given ? o->dp : 1;
  agent->ep = given ? o->ep : 1;
  INA_REQUIRE(agent->tp >= 1 && agent->dp >= 1 && agent->ep >= 1 &&
                  agent->tp * agent->dp == agent->num_ranks &&
                  (agent->ep == 1 || agent->ep == agent->dp),
              INA_ERR_INVALID_ARGUMENT,
              "ina_agent_create: layout tp %d x dp %d (ep %d) does not fit %d ranks", agent->tp,
              agent->dp, agent->ep, agent->num_ranks);
  agent->ranks = calloc((size_t)agent->num_ranks, sizeof *agent->ranks);
  INA_CHECK_ALLOC(agent->ranks);
  if (given) {
    memcpy(agent->ranks, o->ranks, (size_t)agent->num_ranks * sizeof *agent->ranks);
  } else {
    ina_agent_rank_t *r = &agent->ranks[0];
    r->gpu_index = agent->device;
    r->pid = (int32_t)getpid();
    r->expert_begin = 0;
    r->expert_end = ina_model_config(agent->model)->n_routed_experts;
  }
fail:
  return st;
}

/* A node server's services: Node and health, SERVING once the model is loaded (it takes
 * no requests, so it has no warm-up of its own). */
static ina_status_t start_node_server(ina_agent_t *agent, const ina_agent_options_t *o) {
  ina_status_t st = INA_OK;
  ina_rpc_server_options_t so = INA_RPC_SERVER_OPTIONS_INIT;
  so.listen_address = o->listen_address;
  so.tls_cert_file = o->tls_cert_file;
  so.tls_key_file = o->tls_key_file;
  so.num_threads = o->rpc_threads > 0 ? o->rpc_threads : 4;
  INA_CHECK(ina_rpc_server_create(&so, &agent->server));
  INA_CHECK(ina_health_create(agent->server, &agent->health));
  INA_CHECK(agent_register_node_service(agent));
  INA_CHECK(ina_rpc_server_start(agent->server));
  pthread_mutex_lock(&agent->lock);
  agent->state = AGENT_SERVING;
  pthread_mutex_unlock(&agent->lock);
  INA_CHECK(ina_health_set_status(agent->health, "", INA_HEALTH_SERVING));
  INA_CHECK(ina_health_set_status(agent->health, INA_AGENT_NODE_SERVICE, INA_HEALTH_SERVING));
fail:
  return st;
}

/* What two agents exchanging KV entries must agree on beyond the cache's shape: the
 * model (its directory's last component for a checkpoint, else its name and seed), its
 * main shapes and its weights' dtype. */
static void model_fingerprint(const ina_agent_t *agent, const ina_agent_options_t *o, char *out, size_t size) {
  const ina_model_config_t *c = ina_model_config(agent->model);
  const char *name = agent->model_name, *slash;
  size_t len = strlen(name);
  while (len > 1 && name[len - 1] == '/') len--;
  for (slash = name + len; slash > name && slash[-1] != '/'; slash--) {
  }
  char seed[32] = "";
  if (!ina_model_from_checkpoint(agent->model)) snprintf(seed, sizeof seed, " seed %llu", (unsigned long long)o->model_seed);
  snprintf(out, size, "%.*s%s: %d layers, hidden %d, kv %d+%d, vocab %d, %s weights", (int)(name + len - slash), slash,
           seed, c->num_layers, c->hidden_size, c->kv_lora_rank, c->qk_rope_head_dim, c->vocab_size,
           agent->weight_dtype);
}

/* Prefill/decode disaggregation (handoff/handoff.h): roles other than both. */
static ina_status_t start_handoff(ina_agent_t *agent, const ina_agent_options_t *o) {
  ina_status_t st = INA_OK;
  if (o->struct_size < offsetof(ina_agent_options_t, kv_transfer_timeout_ms) + sizeof(int64_t)) return INA_OK;
  int32_t role = AGENT_ROLE_BOTH;
  INA_REQUIRE(!o->role || agent_role_parse(o->role, &role) == 0, INA_ERR_INVALID_ARGUMENT,
              "--role '%s': expected both, prefill or decode", o->role);
  INA_REQUIRE(role == AGENT_ROLE_DECODE || !o->prefill_agent || !o->prefill_agent[0], INA_ERR_INVALID_ARGUMENT,
              "--prefill-agent is for --role decode (this agent's role is %s)", agent_role_name(role));
  if (role == AGENT_ROLE_BOTH) return INA_OK;
  char fingerprint[256];
  model_fingerprint(agent, o, fingerprint, sizeof fingerprint);
  const agent_handoff_options_t ho = {role, o->prefill_agent, o->kv_transfer_timeout_ms, 0, fingerprint};
  INA_CHECK(agent_handoff_start(agent, &ho, &agent->handoff));
fail:
  return st;
}

static ina_status_t start_server(ina_agent_t *agent, const ina_agent_options_t *o) {
  ina_status_t st = INA_OK;
  ina_rpc_server_options_t so = INA_RPC_SERVER_OPTIONS_INIT;
  so.listen_address = o->listen_address;
  so.tls_cert_file = o->tls_cert_file;
  so.tls_key_file = o->tls_key_file;
  so.num_threads = o->rpc_threads > 0 ? o->rpc_threads : 4;
  INA_CHECK(ina_rpc_server_create(&so, &agent->server));
  INA_CHECK(ina_health_create(agent->server, &agent->health));
  INA_CHECK(ina_health_set_status(agent->health, "", INA_HEALTH_NOT_SERVING));
  INA_CHECK(ina_health_set_status(agent->health, INA_AGENT_NODE_SERVICE, INA_HEALTH_NOT_SERVING));
  INA_CHECK(ina_health_set_status(agent->health, INA_AGENT_INFERENCE_SERVICE, INA_HEALTH_NOT_SERVING));
  INA_CHECK(ina_health_set_status(agent->health, INA_AGENT_PLACEMENT_SERVICE, INA_HEALTH_NOT_SERVING));
  INA_CHECK(agent_register_node_service(agent));
  INA_CHECK(agent_register_inference_service(agent));
  const int open_admin =
      o->struct_size >= offsetof(ina_agent_options_t, allow_unauthenticated_admin) + sizeof(int32_t) &&
      o->allow_unauthenticated_admin;
  INA_CHECK(agent_register_placement_service(agent, o->admin_token, open_admin));
  if (agent->handoff) INA_CHECK(agent_handoff_register_service(agent->handoff, agent->server));
  INA_CHECK(ina_rpc_server_start(agent->server));
fail:
  return st;
}

ina_status_t ina_agent_create(const ina_agent_options_t *options, ina_agent_t **out) {
  ina_status_t st = INA_OK;
  ina_agent_t *agent = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_agent_create: out is NULL");
  *out = NULL;
  INA_REQUIRE_VERSIONED(options, offsetof(ina_agent_options_t, scheduler) + sizeof options->scheduler,
                        "ina_agent_options_t", "INA_AGENT_OPTIONS_INIT");
  INA_REQUIRE(options->model && options->model[0], INA_ERR_INVALID_ARGUMENT,
              "ina_agent_create: options.model is empty (expected tiny, random:NAME or a "
              "checkpoint directory)");
  INA_REQUIRE(options->device >= INA_AGENT_DEVICE_AUTO, INA_ERR_INVALID_ARGUMENT,
              "ina_agent_create: options.device %d (expected -2 auto, -1 cpu or a CUDA ordinal)",
              (int)options->device);

  agent = calloc(1, sizeof *agent);
  INA_CHECK_ALLOC(agent);
  agent->stop_fd = -1;
  pthread_mutex_init(&agent->lock, NULL);
  pthread_mutex_init(&agent->apply_mu, NULL);
  pthread_cond_init(&agent->changed, NULL); /* CLOCK_REALTIME, as deadline_after_ms */
  agent->state = AGENT_STARTING;
  agent->start_seconds = agent->load_window_start = agent->expert_load_since =
      agent_now_seconds();
  agent->drain_grace_ms = options->drain_grace_ms >= 0 ? options->drain_grace_ms : 30000;
  agent->silent_rank = -1;
  if (options->struct_size >= offsetof(ina_agent_options_t, heartbeat_timeout_s) + sizeof(double)) {
    INA_REQUIRE(options->max_queued_requests >= 0, INA_ERR_INVALID_ARGUMENT,
                "ina_agent_create: options.max_queued_requests %d is negative (0: no limit)",
                (int)options->max_queued_requests);
    agent->max_queued_requests = options->max_queued_requests;
    agent->heartbeat = options->heartbeat;
    agent->heartbeat_timeout_s = options->heartbeat_timeout_s > 0 ? options->heartbeat_timeout_s : 3.0;
  } else {
    agent->max_queued_requests = 1024;
    agent->heartbeat_timeout_s = 3.0;
  }
  agent->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  INA_REQUIRE(agent->stop_fd >= 0, INA_ERR_IO, "ina_agent_create: eventfd: %s", strerror(errno));
  agent->model_name = strdup(options->model);
  INA_CHECK_ALLOC(agent->model_name);

  agent->device = options->device == INA_AGENT_DEVICE_AUTO
                      ? (ina_cuda_device_count() > 0 ? 0 : -1)
                      : options->device;
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  mo.seed = options->model_seed;
  mo.dtype = options->model_dtype;
  mo.random_on_device = agent->device >= 0; /* random weights are generated on the GPU */
  const int multi_rank =
      options->struct_size >= offsetof(ina_agent_options_t, ep) + sizeof(int32_t);
  if (multi_rank) mo.shard = options->shard;
  INA_CHECK(ina_model_open(options->model, &mo, &agent->model));
  INA_CHECK(copy_layout(agent, multi_rank ? options : NULL));
  const ina_model_config_t *cfg = ina_model_config(agent->model);
  agent->weight_dtype = weight_dtype_name(cfg, options, ina_model_from_checkpoint(agent->model));

  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  eo.page_size = options->page_size > 0 ? options->page_size : 16;
  eo.max_tokens = options->max_tokens > 0 ? options->max_tokens : 65536;
  eo.num_threads = options->num_threads;
  eo.device = agent->device;
  if (options->struct_size >= offsetof(ina_agent_options_t, index_keys) + sizeof(int32_t))
    eo.index_keys = options->index_keys;
  if (multi_rank) {
    eo.tp_comm = options->tp_comm;
    eo.ep_comm = options->ep_comm;
    if (options->struct_size >= offsetof(ina_agent_options_t, attention_dp) + sizeof(int32_t) &&
        options->attention_dp) {
      eo.attention_dp = 2; /* the replicated scheduler's batch, split by sequence */
      if (options->struct_size >= offsetof(ina_agent_options_t, ep_exchange) + sizeof(int32_t))
        eo.ep_exchange = options->ep_exchange;
      if (options->struct_size >= offsetof(ina_agent_options_t, micro_batches) + sizeof(int32_t))
        eo.micro_batches = options->micro_batches;
      agent->attention_dp = 1;
    }
  }
  INA_CHECK(ina_engine_create(agent->model, &eo, &agent->engine));
  ina_page_pool_t *pool = ina_engine_page_pool(agent->engine);
  agent->page_size = ina_page_pool_page_size(pool);
  agent->node_server = options->struct_size >= offsetof(ina_agent_options_t, node_server) + sizeof(int32_t) &&
                       options->node_server;
  INA_REQUIRE(agent->node_server ? options->scheduler.replica_comm != NULL &&
                                       ina_comm_rank(options->scheduler.replica_comm) > 0
                                 : options->scheduler.replica_comm == NULL ||
                                       ina_comm_rank(options->scheduler.replica_comm) == 0,
              INA_ERR_INVALID_ARGUMENT,
              "ina_agent_create: the serving agent leads the replicas (rank 0 of replica_comm) and a "
              "node server follows them (rank > 0); this is rank %d, node_server %d",
              options->scheduler.replica_comm ? ina_comm_rank(options->scheduler.replica_comm) : 0,
              agent->node_server);
  if (options->scheduler.replica_comm) {
    const int32_t me = ina_comm_rank(options->scheduler.replica_comm);
    for (int32_t i = 0; i < agent->num_ranks; i++)
      if (agent->ranks[i].global_rank == me) agent->node_id = agent->ranks[i].node_id;
  }
  INA_CHECK(ina_engine_get_placement(agent->engine, &agent->placement));
  agent->placement_generation = 1;
  {
    ina_scheduler_config_t sc = options->scheduler;
    sc.control = ina_agent_placement_control;
    sc.control_user_data = agent;
    INA_CHECK(ina_scheduler_create(agent->engine, &sc, &agent->scheduler));
  }
  /* The scheduler's own rule for max_context 0: the model's positions, capped by the pool
   * (by one stripe of it under attention DP: a request's pages come from one). */
  int64_t pool_tokens =
      (int64_t)(ina_page_pool_num_pages(pool) / ina_page_pool_stripes(pool)) * agent->page_size;
  agent->max_context = options->scheduler.max_context > 0 ? options->scheduler.max_context
                                                          : cfg->max_position_embeddings;
  if (agent->max_context > pool_tokens) agent->max_context = pool_tokens;
  INA_REQUIRE(agent->max_context >= 3, INA_ERR_INVALID_ARGUMENT,
              "ina_agent_create: KV capacity of %lld tokens is too small to serve anything",
              (long long)agent->max_context);
  {
    int32_t moe_layers = 0;
    if (ina_engine_expert_load(agent->engine, 0, NULL, 0, &moe_layers) == INA_OK) {
      agent->expert_counters = (size_t)moe_layers * (size_t)cfg->n_routed_experts;
      agent->expert_base = calloc(agent->expert_counters + 1, sizeof *agent->expert_base);
      INA_CHECK_ALLOC(agent->expert_base);
    }
  }
  if (agent->node_server) {
    INA_CHECK(start_node_server(agent, options));
    INA_CHECK(agent_liveness_start(agent));
    INA_LOG_I(INA_LOG_SUBSYS, "node %d server of model %s, listening on port %d", agent->node_id,
              agent->model_name, ina_agent_port(agent));
    *out = agent;
    return INA_OK;
  }
  INA_CHECK(ina_scheduler_run_start(agent->scheduler));
  INA_CHECK(start_handoff(agent, options));
  /* Before the server starts, so that every Generate handler sees agent->metrics. */
  const char *metrics_listen =
      options->struct_size >= offsetof(ina_agent_options_t, metrics_listen) + sizeof(const char *)
          ? options->metrics_listen
          : NULL;
  if (metrics_listen && metrics_listen[0])
    INA_CHECK(agent_metrics_start(agent->scheduler, agent->engine, agent->heartbeat, metrics_listen,
                                  &agent->metrics));
  agent_metrics_watch_handoff(agent->metrics, agent->handoff);

  INA_CHECK(start_server(agent, options));
  if (options->struct_size >= offsetof(ina_agent_options_t, chat_format) + sizeof(const char *) &&
      options->http_listen && options->http_listen[0]) {
    const int has_tokenizer = options->struct_size >= offsetof(ina_agent_options_t, tokenizer) + sizeof(const char *);
    const agent_http_options_t ho = {options->http_listen, options->api_key, options->served_model_name,
                                     options->chat_format, options->tls_cert_file, options->tls_key_file,
                                     has_tokenizer ? options->tokenizer : NULL};
    INA_CHECK(agent_http_start(agent, &ho, &agent->http));
  }
  INA_CHECK(agent_liveness_start(agent));
  INA_CHECK(submit_warmup(agent, options->warmup_tokens > 0 ? options->warmup_tokens : 4));
  INA_LOG_I(INA_LOG_SUBSYS, "model %s on %s, listening on port %d, warming up", agent->model_name,
            agent->device < 0 ? "cpu" : "cuda", ina_agent_port(agent));
  *out = agent;
  return INA_OK;
fail:
  ina_agent_destroy(agent);
  return st;
}

int ina_agent_port(const ina_agent_t *agent) {
  return agent && agent->server ? ina_rpc_server_port(agent->server) : 0;
}

int ina_agent_http_port(const ina_agent_t *agent) { return agent ? agent_http_port(agent->http) : 0; }

int ina_agent_metrics_port(const ina_agent_t *agent) {
  return agent ? agent_metrics_port(agent->metrics) : 0;
}

/* ---- waiting and stopping ----------------------------------------------------------- */

ina_status_t ina_agent_wait_serving(ina_agent_t *agent, int64_t timeout_ms) {
  if (!agent) return INA_ERR_INVALID_ARGUMENT;
  double end = timeout_ms < 0 ? -1 : agent_now_seconds() + (double)timeout_ms / 1000.0;
  ina_status_t st = INA_ERR_IO;
  pthread_mutex_lock(&agent->lock);
  for (;;) {
    if (agent->state == AGENT_SERVING) {
      st = INA_OK;
      break;
    }
    if (agent->state == AGENT_FAILED) {
      st = agent->warmup_status;
      ina_error(INA_LOG_SUBSYS, "%s", agent->warmup_error);
      break;
    }
    /* A stop request only sets a flag (signal handlers cannot signal a condition
     * variable), so wake up now and then to look at it. */
    if (atomic_load(&agent->stop_requested) || agent->state != AGENT_STARTING) break;
    if (end >= 0 && agent_now_seconds() > end) break;
    struct timespec ts = deadline_after_ms(50);
    pthread_cond_timedwait(&agent->changed, &agent->lock, &ts);
  }
  pthread_mutex_unlock(&agent->lock);
  return st;
}

void ina_agent_request_stop(ina_agent_t *agent) {
  if (!agent) return;
  atomic_store(&agent->stop_requested, 1);
  uint64_t one = 1;
  ssize_t n = write(agent->stop_fd, &one, sizeof one); /* async-signal-safe */
  (void)n; /* EAGAIN: the counter is already nonzero, which is all that matters */
}

static void wait_for_stop_request(ina_agent_t *agent) {
  struct pollfd p = {agent->stop_fd, POLLIN, 0};
  while (!atomic_load(&agent->stop_requested)) {
    if (poll(&p, 1, -1) < 0 && errno != EINTR) break;
  }
}

/* Waits until no generation is in flight or the deadline (ms from now) passes; returns
 * the number left. Lock held. */
static int32_t wait_generations_locked(ina_agent_t *agent, int64_t ms) {
  struct timespec ts = deadline_after_ms(ms);
  while (agent->num_generations > 0) {
    if (pthread_cond_timedwait(&agent->changed, &agent->lock, &ts) == ETIMEDOUT) break;
  }
  return agent->num_generations;
}

/* Cancels every generation still in flight (they end with FINISH_REASON_CANCELLED) and
 * waits for their final events. */
static void cancel_generations(ina_agent_t *agent) {
  pthread_mutex_lock(&agent->lock);
  int32_t n = agent->num_generations, i = 0;
  char **ids = n > 0 ? calloc((size_t)n, sizeof *ids) : NULL;
  for (agent_generation_t *g = agent->generations; g && ids && i < n; g = g->next)
    ids[i++] = strdup(g->request_id);
  pthread_mutex_unlock(&agent->lock);
  /* The scheduler is called without the agent lock: its callbacks take that lock. */
  for (int32_t k = 0; k < i; k++) {
    if (ids[k]) ina_scheduler_cancel(agent->scheduler, ids[k]);
    free(ids[k]);
  }
  free(ids);
  pthread_mutex_lock(&agent->lock);
  int32_t left = wait_generations_locked(agent, CANCEL_SETTLE_MS);
  pthread_mutex_unlock(&agent->lock);
  if (left > 0) INA_LOG_W(INA_LOG_SUBSYS, "%d generations did not end after cancel", (int)left);
}

/* Stop accepting, let generations finish within grace_ms, cancel the rest, shut the
 * server down. Safe to call twice (the second call finds the server gone). */
static void drain(ina_agent_t *agent, int64_t grace_ms) {
  if (!agent->server) return;
  pthread_mutex_lock(&agent->lock);
  agent->state = AGENT_DRAINING;
  if (agent->health) ina_health_set_all(agent->health, INA_HEALTH_NOT_SERVING);
  pthread_cond_broadcast(&agent->changed);
  pthread_mutex_unlock(&agent->lock);

  double t0 = agent_now_seconds();
  pthread_mutex_lock(&agent->lock);
  int32_t in_flight = agent->num_generations;
  int32_t left = wait_generations_locked(agent, grace_ms);
  pthread_mutex_unlock(&agent->lock);
  if (left > 0) {
    INA_LOG_I(INA_LOG_SUBSYS, "drain: %d of %d generations still running after %.1f s: cancelling",
              (int)left, (int)in_flight, agent_now_seconds() - t0);
    cancel_generations(agent);
  }
  /* Every generation is over: the HTTP streams have their last events; closing the
   * connections ends what is left. */
  agent_http_stop(agent->http);
  agent->http = NULL;
  /* Finished streams may still be sending their final response and status. */
  double flush_end = agent_now_seconds() + FLUSH_MS / 1000.0;
  while (ina_rpc_server_active_calls(agent->server) > 0 && agent_now_seconds() < flush_end) {
    struct timespec pause = {0, 2000000L};
    nanosleep(&pause, NULL);
  }
  /* Cancels what is left (health Watch streams), waits for every stream owner. */
  ina_rpc_server_destroy(agent->server);
  agent->server = NULL;
  pthread_mutex_lock(&agent->lock);
  agent->state = AGENT_STOPPED;
  pthread_cond_broadcast(&agent->changed);
  pthread_mutex_unlock(&agent->lock);
  INA_LOG_I(INA_LOG_SUBSYS, "drained in %.3f s", agent_now_seconds() - t0);
}

ina_status_t ina_agent_follow(ina_agent_t *agent) {
  if (!agent || !agent->node_server) return INA_ERR_INVALID_ARGUMENT;
  const ina_status_t st = ina_scheduler_follow(agent->scheduler);
  pthread_mutex_lock(&agent->lock);
  agent->state = AGENT_STOPPED;
  pthread_mutex_unlock(&agent->lock);
  ina_health_set_all(agent->health, INA_HEALTH_NOT_SERVING);
  return st;
}

ina_status_t ina_agent_wait(ina_agent_t *agent) {
  if (!agent) return INA_ERR_INVALID_ARGUMENT;
  wait_for_stop_request(agent);
  drain(agent, agent->drain_grace_ms);
  return INA_OK;
}

void ina_agent_destroy(ina_agent_t *agent) {
  if (!agent) return;
  agent_liveness_stop(agent); /* it sets health */
  if (agent->server) {
    if (agent->scheduler) {
      drain(agent, 0);
    } else { /* failed create before the scheduler existed: nothing in flight */
      ina_rpc_server_destroy(agent->server);
      agent->server = NULL;
    }
  }
  agent_http_stop(agent->http); /* drain stopped it, unless create failed before serving */
  agent->http = NULL;
  ina_health_destroy(agent->health);
  /* The sampler reads the scheduler and the hand-off; the counters stay, for final
   * events its destroy may still deliver. */
  agent_metrics_stop_sampling(agent->metrics);
  /* No handler runs any more; the transfers end while the scheduler still steps. */
  agent_handoff_stop(agent->handoff);
  agent->handoff = NULL;
  ina_scheduler_destroy(agent->scheduler); /* stops the run loop */
  agent_metrics_stop(agent->metrics);
  ina_engine_destroy(agent->engine);
  ina_model_destroy(agent->model);
  if (agent->stop_fd >= 0) close(agent->stop_fd);
  pthread_cond_destroy(&agent->changed);
  pthread_mutex_destroy(&agent->lock);
  pthread_mutex_destroy(&agent->apply_mu);
  ina_expert_placement_free(&agent->placement);
  free(agent->model_name);
  free(agent->ranks);
  free(agent->expert_base);
  free(agent);
}
