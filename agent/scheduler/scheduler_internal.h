/* The scheduler's internals, shared by the files of scheduler/ (not a public header).
 *
 * Who touches what:
 *   - fields under "driver" belong to the thread inside ina_scheduler_step (or destroy):
 *     the queues, the engine, its page pool, the prefix cache, the step buffers;
 *   - fields under "shared" are guarded by `mu`: requests submitted but not yet seen by a
 *     step (incoming), the list of unfinished requests (for cancel by id and the id
 *     uniqueness check), cancel flags, the stats snapshot, the run loop's state and the
 *     queue of control commands.
 * A request moves from incoming (shared) to the driver's queues at the start of a step
 * (under mu); after that only the driver reads or writes its generation state, and
 * other threads only touch its cancel flag and live-list links, under mu. */
#ifndef INA_AGENT_SCHEDULER_SCHEDULER_INTERNAL_H
#define INA_AGENT_SCHEDULER_SCHEDULER_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "kvcache/kv_seq.h"
#include "model/model.h"
#include "model/sampler.h"
#include "agent/scheduler/prefix_cache.h"
#include "agent/scheduler/scheduler.h"

typedef struct sched_request {
  char *id;
  int32_t *tokens;        /* [prompt_len + max_new_tokens]: the prompt, then generated tokens */
  int32_t prompt_len;
  int32_t max_new_tokens;
  int32_t num_tokens;     /* prompt_len + num_generated */
  int32_t num_generated;
  /* Tokens to compute on the prefill path before sampling resumes: the prompt, or after a
   * preemption every token known then. The request is prefilling while
   * num_computed < prefill_len, decoding after. */
  int32_t prefill_len;
  int32_t num_computed;   /* tokens whose KV entries are in seq */
  int32_t *stop_ids;
  int32_t num_stop_ids;
  int32_t eos;            /* -1 when ignored */
  ina_sampling_params_t sampling; /* as submitted (replicas rebuild the request from it) */
  int ignore_eos;
  int32_t logprobs;       /* ina_request_t.logprobs */
  ina_sampler_t *sampler; /* keeps its draw counter across preemptions */
  ina_kv_seq_t seq;
  ina_request_callback_t callback;
  void *user_data;

  /* The hand-off (kv_handoff.c; ina_request_t v3). importing (driver): admitted, pages
   * lent to kv_import, waiting for ina_scheduler_import_done. */
  ina_kv_pages_fn kv_export, kv_import;
  void *kv_user_data;
  int importing;

  /* This step's plan (driver). */
  int32_t step_tokens;    /* new tokens in this step's batch, 0 when not scheduled */
  int32_t step_pages;     /* pool pages they take */

  /* Outcome and metrics (driver). */
  ina_finish_reason_t finish;
  ina_status_t status;
  char error[256];
  double t_submit, t_admit, t_first, t_last; /* t_admit / t_first < 0 until they happen */
  double gap_sum, gap_max;
  int32_t cached_tokens, preemptions;

  /* Shared, under mu. */
  int cancel_requested;
  /* The hand-off: import_lent once kv_import has the pages; then
   * ina_scheduler_import_done's result, until the driver applies it. */
  int import_lent, import_ready;
  ina_status_t import_status;
  char import_error[256];
  int32_t import_token, import_num_top;
  float import_logprob;
  int32_t import_top_ids[INA_REQUEST_MAX_LOGPROBS];
  float import_top_logprobs[INA_REQUEST_MAX_LOGPROBS];
  struct sched_request *live_prev, *live_next;
  struct sched_request *incoming_next;
} sched_request_t;

/* A control command waiting for the driver (control.c). It lives on the stack of the
 * thread blocked in ina_scheduler_control; the driver takes it off the queue, runs it
 * and sets done under mu. */
typedef struct sched_control {
  void *bytes;            /* a copy of the caller's */
  size_t size;
  ina_status_t status;    /* valid once done */
  char error[1024];       /* the reason when status != INA_OK */
  int done;
  struct sched_control *next;
} sched_control_t;

/* A double-ended queue of requests (ring buffer). */
typedef struct sched_queue {
  sched_request_t **items;
  int32_t head, count, capacity;
} sched_queue_t;

/* What a step delivers once its work is done and mu is released. */
typedef struct sched_event {
  sched_request_t *req;
  int32_t token;         /* -1 for the final event */
  int32_t num_generated;
  /* Requests with logprobs >= 0 (see ina_request_event_t). */
  float logprob;
  int32_t num_top;
  int32_t top_ids[INA_REQUEST_MAX_LOGPROBS];
  float top_logprobs[INA_REQUEST_MAX_LOGPROBS];
} sched_event_t;

struct ina_scheduler {
  /* Fixed at create. */
  ina_engine_t *engine;
  ina_page_pool_t *pool;
  int32_t page_size, vocab, eos;
  int32_t max_batch_tokens, max_running;
  int64_t max_context;
  ina_scheduler_control_fn control; /* NULL when control commands are refused */
  void *control_user_data;

  /* Driver. */
  sched_queue_t waiting;         /* FIFO; preempted requests go back to the front */
  sched_request_t **running;     /* [max_running], oldest admission first */
  int32_t num_running;
  ina_prefix_cache_t *cache;     /* NULL when disabled */
  /* the step's batch */
  sched_request_t **batch_reqs;  /* [max_running] */
  ina_kv_seq_t **batch_seqs;     /* [max_running] */
  int32_t *qo_indptr;            /* [max_running + 1] */
  int32_t *batch_tokens;         /* [max_batch_tokens] */
  float *logits;                 /* [max_running, vocab] */
  int32_t *greedy_tokens;        /* [max_running]: the step's tokens when every request is greedy */
  int batch_greedy;              /* this step took greedy tokens from the engine, not logits */
  int32_t batch_size;
  int32_t budget;                /* tokens left in this step */
  int32_t stripes;               /* the pool's (kvcache/page_pool.h): 1 but under attention DP */
  int32_t *reserved_pages;       /* [stripes]: pool pages this step's batch will take */
  sched_event_t *events;
  int32_t num_events, events_capacity;
  sched_request_t **finished;    /* requests whose final event is queued */
  int32_t num_finished, finished_capacity;
  int32_t *match_pages;          /* [pool pages]: prefix cache lookups */
  /* counters, copied into the snapshot at the end of each step */
  ina_scheduler_stats_t counters;
  /* Replication (replica.c): the leader records what each step took in, in order. */
  int replica_role;               /* SCHED_REPLICA_NONE, _LEADER or _FOLLOWER */
  ina_comm_t *replica_comm;
  double heartbeat_seconds;
  sched_request_t **step_new;     /* requests moved from incoming this step */
  int32_t num_step_new, step_new_capacity;
  sched_request_t **step_cancelled; /* requests finished by a cancel this step */
  int32_t num_step_cancelled, step_cancelled_capacity;
  /* Where messages are received and sent (replica.c): on the heap, not the stack, because
   * an operation that timed out may still complete into them when a late peer arrives. */
  int64_t *rx_len;
  int64_t *rx_words;
  size_t rx_capacity;

  int32_t kv_lent;               /* page references lent to the hand-off, not yet dropped */
  int32_t num_importing;         /* running requests with importing set */

  /* Shared, under mu. */
  pthread_mutex_t mu;
  int32_t *released_pages;       /* ina_scheduler_release_pages: references to drop */
  int32_t num_released, released_capacity;
  int32_t pending_imports;       /* import results set since the driver last looked (at least) */
  pthread_cond_t wake;           /* the run loop sleeps here while there is no work */
  sched_request_t *incoming_head, *incoming_tail;
  int32_t num_incoming;
  sched_request_t *live_head;    /* every unfinished request */
  int32_t num_live;
  int32_t pending_cancels;       /* cancel flags set since the last step looked */
  int stepping;                  /* a thread holds the driver role (step, flush) */
  int closing;                   /* destroy has begun: submit is refused */
  ina_scheduler_stats_t snapshot;
  pthread_t run_thread;
  int run_started, run_stop;
  pthread_t step_thread;         /* the thread inside sched_step, while in_step */
  int in_step;
  sched_control_t *control_head, *control_tail; /* waiting, oldest first */
  int32_t num_controls;
  int32_t control_callers;       /* threads inside ina_scheduler_control */
  pthread_cond_t control_done;   /* a command finished; a caller left */
};

/* ---- replica.c ---------------------------------------------------------------------- */

enum { SCHED_REPLICA_NONE = 0, SCHED_REPLICA_LEADER, SCHED_REPLICA_FOLLOWER };

/* Leader: the step's intake (step_new, step_cancelled) to every follower; an empty intake
 * is a heartbeat, followed by a barrier so that a dead follower is noticed. */
ina_status_t sched_replica_send_step(ina_scheduler_t *s);
/* Leader: a control command's bytes to every follower (before the leader runs it). */
ina_status_t sched_replica_send_control(ina_scheduler_t *s, const void *bytes, size_t size);
/* Leader: tells the followers to stop following (at destroy). */
void sched_replica_send_stop(ina_scheduler_t *s);
/* Room for a step's records (driver, before take-in). */
ina_status_t sched_replica_reserve(ina_scheduler_t *s, int32_t requests);
/* The replication buffers: made at create, freed at destroy (kept when the communicator
 * broke, see replica.c). */
ina_status_t sched_replica_init(ina_scheduler_t *s);
void sched_replica_free(ina_scheduler_t *s);

/* ---- scheduler.c -------------------------------------------------------------------- */

/* Submit and cancel without the follower check (replica.c applies the leader's). */
ina_status_t sched_enqueue(ina_scheduler_t *s, const ina_request_t *request);
ina_status_t sched_cancel(ina_scheduler_t *s, const char *request_id);

/* ---- request.c ---------------------------------------------------------------------- */

/* Validate a submitted request against the scheduler's limits and copy it. On failure
 * *out = NULL and the error names the request and the field. */
ina_status_t sched_request_create(const ina_scheduler_t *s, const ina_request_t *req, double now,
                                  sched_request_t **out);
/* Releases the sequence's pages too. NULL is a no-op. */
void sched_request_free(ina_page_pool_t *pool, sched_request_t *r);
/* The request's metrics as of `now` (its finish time). */
void sched_request_metrics(const sched_request_t *r, double now, ina_request_metrics_t *out);
/* Record a sampled token: store it, update the token-gap metrics and return the finish
 * reason it causes (INA_FINISH_NONE to go on). */
ina_finish_reason_t sched_request_add_token(sched_request_t *r, int32_t token, double now);

/* ---- queue.c ------------------------------------------------------------------------ */

ina_status_t sched_queue_reserve(sched_queue_t *q, int32_t capacity);
void sched_queue_release(sched_queue_t *q);
/* Pushes never grow the queue: reserve first. */
void sched_queue_push_back(sched_queue_t *q, sched_request_t *r);
void sched_queue_push_front(sched_queue_t *q, sched_request_t *r);
sched_request_t *sched_queue_at(const sched_queue_t *q, int32_t i);
sched_request_t *sched_queue_pop_front(sched_queue_t *q);
/* Remove the entry at position i, keeping the order of the others. */
void sched_queue_remove_at(sched_queue_t *q, int32_t i);

/* ---- events.c ----------------------------------------------------------------------- */

/* Make room for `extra` more events and finished requests in this step. */
ina_status_t sched_events_reserve(ina_scheduler_t *s, int32_t extra);
/* logits: the request's row when it asked for logprobs, else NULL. */
void sched_emit_token(ina_scheduler_t *s, sched_request_t *r, int32_t token, const float *logits, int32_t vocab);
/* Finish a request: its pages go back to the pool now, its final event is queued. The
 * caller removes it from the queue or running list that held it. */
void sched_finish(ina_scheduler_t *s, sched_request_t *r, ina_finish_reason_t reason, ina_status_t status,
                  const char *error);
/* Unlink this step's finished requests from the live list (caller holds mu). */
void sched_unlink_finished_locked(ina_scheduler_t *s);
/* Call r's callback with a token event (token >= 0) or its final event (token < 0). */
void sched_deliver(sched_request_t *r, const sched_event_t *e, double now);
/* Deliver the queued events in order (no lock held), then free the finished requests. */
void sched_deliver_events(ina_scheduler_t *s);

/* ---- kv_handoff.c ------------------------------------------------------------------- */

/* Lend r's pages holding tokens [0, num_tokens) to a hand-off callee: a reference on each
 * (driver). */
void sched_kv_lend(ina_scheduler_t *s, sched_request_t *r, ina_kv_pages_fn fn, int64_t num_tokens,
                   int64_t first_token, int32_t num_layers);
/* Driver, at take-in (caller holds mu): drop the references given back, then apply the
 * import results that arrived (a token event and perhaps a final event each; events for
 * pending_imports more requests must be reserved). */
void sched_kv_take_in_locked(ina_scheduler_t *s, double now);
/* Destroy: drop the references given back and free the list. */
void sched_kv_free(ina_scheduler_t *s);

/* ---- step.c ------------------------------------------------------------------------- */

/* The step itself, for ina_scheduler_step and the run loop; the caller is the driver
 * (stepping set, or the run loop thread). */
ina_status_t sched_step(ina_scheduler_t *s, int32_t *num_scheduled);

/* ---- control.c ---------------------------------------------------------------------- */

/* Driver, at the start of a step: run the commands waiting then one by one, oldest
 * first (a replica leader sends each to the followers first); later ones wait for the
 * next step, and a stopping run loop runs none. Returns INA_OK unless the
 * followers could not be told: the step must then run nothing. */
ina_status_t sched_control_run_waiting(ina_scheduler_t *s);
/* Follower: run a command the leader sent (its failure is logged, not returned). */
void sched_control_run_follower(ina_scheduler_t *s, const void *bytes, size_t size);
/* Finish every waiting command unrun, with INA_ERR_UNSUPPORTED and `why` as its reason,
 * and wake their callers (caller holds mu). */
void sched_control_cancel_waiting_locked(ina_scheduler_t *s, const char *why);
/* destroy: block until no thread is inside ina_scheduler_control (caller holds mu, and
 * closing is set so none can enter). */
void sched_control_wait_callers_locked(ina_scheduler_t *s);

/* ---- scheduler.c -------------------------------------------------------------------- */

double sched_now(void);
/* Fill the snapshot's gauges from the driver's state (caller holds mu). */
void sched_publish_locked(ina_scheduler_t *s);

#endif
