/* What the agent's services share: the agent struct, its state machine and the registry
 * of generations in flight. Private to agent/.
 *
 * Locking: `lock` guards state, the registry and the load window; it is never held while
 * calling into the scheduler's driver-side code, and may be taken from scheduler
 * callbacks (which run with no scheduler lock held) and rpc handlers. */
#ifndef INA_AGENT_AGENT_INTERNAL_H
#define INA_AGENT_AGENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "agent/agent.h"
#include "ina/v1/inference.pb-c.h"
#include "agent/rpc/health.h"
#include "agent/rpc/rpc_server.h"
#include "agent/rpc/rpc_status.h"
#include "agent/scheduler/scheduler.h"
#include "model/model.h"

/* Service names as registered with the health service. */
#define INA_AGENT_NODE_SERVICE "ina.v1.Node"
#define INA_AGENT_INFERENCE_SERVICE "ina.v1.Inference"
#define INA_AGENT_PLACEMENT_SERVICE "ina.v1.Placement"

typedef enum agent_state {
  AGENT_STARTING = 0, /* warm-up running */
  AGENT_SERVING,
  AGENT_DRAINING, /* stop requested: no new generations */
  AGENT_STOPPED,  /* server shut down */
  AGENT_FAILED,   /* warm-up failed */
} agent_state_t;

/* One Generate stream between the rpc writer and the scheduler. Owned by the scheduler
 * callback once submitted; listed in the agent's registry until its final event. */
typedef struct agent_generation {
  struct agent_generation *prev, *next;
  ina_agent_t *agent;
  ina_rpc_writer_t *writer;
  char *request_id;
  uint32_t prompt_tokens;
  uint32_t stream_interval; /* tokens per response, >= 1 */
  uint32_t *pending;        /* [stream_interval] tokens not yet sent */
  uint32_t num_pending;
  uint32_t completion_tokens;
  uint32_t last_token; /* the latest generated token (a stop id when one ended it) */
  char *prefill_agent; /* GenerateRequest.prefill_agent (a decode agent's), or NULL */
  double last_token_seconds; /* monotonic time of the latest token event; 0 before one */
} agent_generation_t;

/* The agent's Prometheus metrics and their /metrics endpoint (agent_metrics.c). The
 * update functions take NULL (metrics off) and do nothing then; they use only the
 * registry's atomics, so they may run on the token path. */
typedef struct agent_metrics agent_metrics_t;
/* The OpenAI-compatible HTTP API (service_http.c); NULL when off. */
typedef struct agent_http agent_http_t;
/* Prefill/decode disaggregation (handoff/handoff.h); NULL for role both. */
struct agent_handoff;

struct ina_agent {
  ina_model_t *model;
  ina_engine_t *engine;
  ina_scheduler_t *scheduler;
  ina_rpc_server_t *server;
  ina_health_t *health;
  agent_metrics_t *metrics; /* NULL: metrics off; set before the gRPC server starts */
  agent_http_t *http;       /* NULL: no HTTP API */
  struct agent_handoff *handoff; /* NULL: role both */

  char *model_name;
  const char *weight_dtype; /* static string */
  int32_t device;
  int32_t page_size;
  int64_t max_context; /* longest prompt + max_tokens the scheduler accepts */
  int64_t drain_grace_ms;
  double start_seconds; /* monotonic */

  atomic_int stop_requested;
  int stop_fd; /* eventfd written by ina_agent_request_stop */

  pthread_mutex_t lock;
  pthread_cond_t changed; /* state or registry changed */
  agent_state_t state;
  ina_status_t warmup_status;
  char warmup_error[256];
  agent_generation_t *generations; /* registry, most recent first */
  int32_t num_generations;
  /* GetLoad's throughput window: counters at the previous call. */
  double load_window_start;
  int64_t load_prefill_tokens, load_generated_tokens;
  double expert_load_since; /* start-up, or the last GetLoad that reset the counters */
  /* The engine's expert counters as of that reset (GetLoad reports the difference; the
   * engine's own stay monotonic for /metrics). NULL when the engine has none. */
  uint64_t *expert_base;
  size_t expert_counters;
  /* The job's ranks and layout (one rank: this process, 1 x 1 x 1). */
  ina_agent_rank_t *ranks;
  int32_t num_ranks, tp, dp, ep;
  int attention_dp;          /* the dp groups split the sequences (ina_agent_options_t) */
  int32_t node_id;  /* this rank's node: NodeInfo and NodeHealth list its ranks only */
  int node_server;  /* ina_agent_options_t.node_server */
  /* The expert placement in force and its generation (under lock). ApplyPlacement calls
   * run one at a time under apply_mu (service_placement.c); placement_bytes_moved is
   * written by the control command on the driver thread while the caller waits. */
  ina_expert_placement_t placement;
  uint64_t placement_generation;
  pthread_mutex_t apply_mu;
  int64_t placement_bytes_moved;
  /* Generate answers RESOURCE_EXHAUSTED while this many wait for admission; 0: no limit. */
  int32_t max_queued_requests;
  /* Liveness (agent_liveness.c): the job's heartbeat (NULL for one rank) and, under
   * lock, the rank found silent for longer than heartbeat_timeout_s (-1: none) and its
   * age then. A silent rank makes health NOT_SERVING and Generate UNAVAILABLE. */
  const struct ina_heartbeat *heartbeat;
  double heartbeat_timeout_s;
  int32_t silent_rank;
  int64_t silent_ms;
  pthread_t liveness_thread;
  int liveness_started;
  atomic_int liveness_stop;
};

/* The OpenAI-compatible HTTP API (service_http.c). */
typedef struct agent_http_options {
  const char *listen;        /* "HOST:PORT" */
  const char *api_key;       /* NULL or "": no key needed */
  const char *served_name;   /* the model's name in requests and /v1/models; NULL: --model */
  const char *chat_format;   /* NULL: recognized from the checkpoint's chat template */
  const char *tls_cert_file, *tls_key_file; /* both NULL: plain HTTP */
  const char *tokenizer;     /* a tokenizer directory instead of the model's; NULL: the model's */
} agent_http_options_t;
/* Loads the model's tokenizer (a checkpoint's tokenizer.json, or a built-in model's own;
 * without one the text endpoints answer 400 saying why) and starts serving. A failure
 * sets *out = NULL. */
ina_status_t agent_http_start(ina_agent_t *agent, const agent_http_options_t *options, agent_http_t **out);
int agent_http_port(const agent_http_t *h);
/* Closes every connection (handlers waiting see their clients gone) and frees. Call once
 * the generations are over (drain); NULL is a no-op. */
void agent_http_stop(agent_http_t *h);

/* SamplingParams of a request (NULL: greedy) as the sampler takes them; min_p and
 * repetition_penalty, which this agent refuses unless they are off, are not carried. */
ina_sampling_params_t agent_sampling_from_proto(const Ina__V1__SamplingParams *s);

/* Monotonic clock in seconds. */
double agent_now_seconds(void);

/* Liveness (agent_liveness.c): a thread that reads the heartbeat every tenth of the
 * timeout and moves health to NOT_SERVING when a rank goes silent, back when it answers.
 * No-op without a heartbeat. Stop before freeing the agent's health. */
ina_status_t agent_liveness_start(ina_agent_t *agent);
void agent_liveness_stop(ina_agent_t *agent);
/* Lock held: 1 when a rank is silent, with the message for a refusal or health. */
int agent_silent_locked(const ina_agent_t *agent, char *message, size_t size);

/* Registers each service's methods on agent->server (not started yet). Placement's admin
 * call needs admin_token; without one (NULL or "") it is refused with PERMISSION_DENIED,
 * or, with allow_unauthenticated, open to any client (a warning is logged). */
ina_status_t agent_register_node_service(ina_agent_t *agent);
ina_status_t agent_register_inference_service(ina_agent_t *agent);
ina_status_t agent_register_placement_service(ina_agent_t *agent, const char *admin_token,
                                              int allow_unauthenticated);

/* The registry of generations in flight (generations.c). */
/* Lock held: the generation with this request id, or NULL. */
agent_generation_t *agent_find_generation_locked(ina_agent_t *agent, const char *request_id);
/* Under the agent lock that drain takes to change state, so that a generation is either
 * refused here or seen by the drain, already in the scheduler: refuses while not serving
 * or a rank is silent (UNAVAILABLE), for a request id in flight (ALREADY_EXISTS) or a
 * full queue (RESOURCE_EXHAUSTED); else submits r (INVALID_ARGUMENT with the scheduler's
 * message when it refuses) and lists g. (Taking the scheduler's lock inside the agent
 * lock is safe: the scheduler never holds its lock while calling back.) INA_RPC_OK: r's
 * callback owns g from now on and calls agent_registry_remove at its final event. */
ina_rpc_code_t agent_submit_generation(ina_agent_t *agent, agent_generation_t *g, const ina_request_t *r,
                                       char *msg);
/* Takes the lock: unlists g (wakes drain). */
void agent_registry_remove(ina_agent_t *agent, agent_generation_t *g);
/* "HOST:PORT" (HOST may be "[v6]") into host (brackets removed) and port 0..65535; `what`
 * names the option in messages ("metrics listen address"). */
ina_status_t agent_parse_listen(const char *what, const char *text, char *host, size_t host_size, int *port);

/* Registers the metrics, starts sampling `scheduler`, `engine`'s expert counters and the
 * heartbeat's ages (NULL: none; all three must outlive the sampling) and serves /metrics
 * on `listen` ("HOST:PORT", port 0: the kernel's choice). A failure sets *out = NULL. */
ina_status_t agent_metrics_start(ina_scheduler_t *scheduler, ina_engine_t *engine,
                                 const struct ina_heartbeat *heartbeat, const char *listen,
                                 agent_metrics_t **out);
/* Stops the endpoint and the sampler (after which the scheduler may go); the update
 * functions keep working. Repeatable; NULL is a no-op. */
void agent_metrics_stop_sampling(agent_metrics_t *m);
/* Samples the prefill/decode hand-off's counters too (NULL: none); h must outlive the
 * sampling (stop sampling before stopping the hand-off). */
void agent_metrics_watch_handoff(agent_metrics_t *m, struct agent_handoff *h);
/* Stops as above and frees everything; NULL is a no-op. */
void agent_metrics_stop(agent_metrics_t *m);
/* The port /metrics is served on; 0 when m is NULL. */
int agent_metrics_port(const agent_metrics_t *m);
/* A Generate stream's final event: requests by reason, tokens, time to first token. */
void agent_metrics_request_finished(agent_metrics_t *m, const ina_request_event_t *event);
/* Seconds between two consecutive token events of one stream. */
void agent_metrics_token_gap(agent_metrics_t *m, double seconds);
/* A Generate call refused with `code` (not OK) before reaching the scheduler. */
void agent_metrics_refused(agent_metrics_t *m, ina_rpc_code_t code);

#endif
