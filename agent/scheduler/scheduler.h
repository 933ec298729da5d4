/* Request scheduler: streaming generation requests served by continuous batching over
 * one engine (model/model.h, CPU or CUDA backend).
 *
 * Clients submit requests (prompt token ids, limits, sampling, stop ids, a callback) from
 * any thread. One driver thread calls ina_scheduler_step (or lets the run loop call it);
 * each step runs one ina_engine_forward over a mixed batch:
 *   - every running request in the decode phase adds its last sampled token;
 *   - requests still prefilling add their next prompt chunk, within a per-step token
 *     budget (chunked prefill: a long prompt is split across steps);
 *   - waiting requests are admitted in FIFO order when the budget, the running limit and
 *     the KV pool allow (pages for the whole prompt must be free); the head of the queue
 *     is never overtaken, so nothing starves;
 * then samples the next token of every request whose known tokens are all computed and
 * delivers it through the request's callback.
 *
 * KV pages: when a running request cannot grow, the prefix cache gives back unused pages
 * first; then the youngest running requests are preempted (recompute: their pages are
 * freed and they go back to the front of the queue with the tokens generated so far
 * appended to their prompt, so their output continues unchanged). A request that is
 * itself the youngest waits for pages instead. The oldest running request can always
 * grow: every accepted request fits in the pool alone (max_context).
 *
 * Prefix reuse: after a request's prompt is computed, its full pages enter an LRU prefix
 * cache keyed by chained hashes of page-aligned token blocks; a later request starting
 * with the same blocks shares those pages (copy on write never triggers: only full pages
 * are shared) and computes only the rest. Cached pages no sequence uses are evicted when
 * the pool runs short.
 *
 * Numerics: a request's tokens are the same as when it runs alone through ina_generate
 * (bitwise on the CPU engine, whose rows do not interact): batching, chunking and prefix
 * reuse do not change what is computed. Prefill chunks are never a single token of a
 * longer prompt, because the engine takes one-token steps through the decode path
 * (absorbed MLA), which rounds differently. Preemption recomputes generated tokens on the
 * prefill path: for greedy decoding the logits agree to rounding (argmax unchanged
 * barring exact near-ties).
 *
 * Ownership: the scheduler borrows the engine (which must outlive it) and owns the
 * engine's page pool while it lives: nothing else may use that engine meanwhile. It
 * copies everything a request points to at submit. A failed create sets *out = NULL;
 * destroy(NULL) is a no-op.
 *
 * Thread safety: submit, cancel and stats may be called from any thread at any time
 * (also from a callback). step, flush_prefix_cache, run_start / run_stop and destroy
 * belong to one driver thread, never to a callback; while the run loop is started, it
 * is the driver (step and flush are refused). Callbacks run on the driver thread with
 * no scheduler lock held. ina_scheduler_control is for any thread but the driver. */
#ifndef INA_AGENT_SCHEDULER_SCHEDULER_H
#define INA_AGENT_SCHEDULER_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "model/model.h"
#include "model/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_scheduler ina_scheduler_t;

/* A control command (ina_scheduler_control): runs on the driver thread between two steps
 * with the engine to itself (no request is in a forward meanwhile). bytes [size] are the
 * command, valid during the call only. A failure should record its reason (INA_REQUIRE
 * and the like): it is handed back to the caller of ina_scheduler_control. */
typedef ina_status_t (*ina_scheduler_control_fn)(ina_engine_t *engine, const void *bytes, size_t size,
                                                 void *user_data);

typedef struct ina_scheduler_config {
  size_t struct_size; /* sizeof(ina_scheduler_config_t), set by the INIT macro */
  uint32_t version;   /* 3 */
  /* Tokens one step may run: decode tokens plus prefill chunks. >= 3 (a prompt is split
   * into chunks of at least two tokens). */
  int32_t max_batch_tokens;
  /* Requests admitted (prefilling or decoding) at once, >= 1. */
  int32_t max_running;
  /* Largest prompt_len + max_new_tokens accepted. 0: the model's
   * max_position_embeddings, capped by the KV pool's tokens. At most the pool's tokens,
   * so that any accepted request fits alone. */
  int64_t max_context;
  /* Pages the prefix cache may hold: < 0 half the pool, 0 no prefix cache. */
  int32_t prefix_cache_pages;
  /* Version 2. Lockstep replicas for multi-rank engines (tensor / expert parallel: every
   * rank runs the same batches): the communicator of the ranks, or NULL for one rank.
   * Rank 0 leads: clients submit and cancel there, and at the start of each step it sends
   * what the step takes in to the other ranks, whose schedulers (created with the same
   * config over their own engines) run in ina_scheduler_follow and so plan the same
   * batches. Followers deliver no events. Borrowed: must outlive the scheduler. */
  ina_comm_t *replica_comm;
  /* Leader: while idle, an empty step at least this often (seconds; <= 0: 1), so that
   * followers waiting longer than their communicator's timeout know the leader is gone
   * and the leader notices a follower that is. */
  double heartbeat_seconds;
  /* Version 3. Control commands (ina_scheduler_control): run on the driver thread of
   * every replica, between steps, each with its own engine and user data. Replicas must
   * all set one (a follower without it logs a warning per command and skips it). Called
   * with no scheduler lock held: it may submit, cancel and read stats, but not step,
   * destroy or issue another control command. */
  ina_scheduler_control_fn control;  /* NULL: ina_scheduler_control is refused */
  void *control_user_data;
} ina_scheduler_config_t;

#define INA_SCHEDULER_CONFIG_INIT \
  {sizeof(ina_scheduler_config_t), 3, 512, 64, 0, -1, NULL, 1.0, NULL, NULL}

typedef enum ina_finish_reason {
  INA_FINISH_NONE = 0,  /* not finished: a token event */
  INA_FINISH_LENGTH,    /* max_new_tokens generated */
  INA_FINISH_STOP,      /* generated one of the request's stop ids (it is delivered) */
  INA_FINISH_EOS,       /* generated the model's eos id (delivered), unless ignore_eos */
  INA_FINISH_CANCELLED, /* ina_scheduler_cancel, or the scheduler was destroyed */
  INA_FINISH_ERROR,     /* the engine or sampler failed: see status and error */
} ina_finish_reason_t;

/* "none", "length", "stop", "eos", "cancelled", "error"; "unknown" otherwise. */
const char *ina_finish_reason_string(ina_finish_reason_t reason);

/* Per-request figures, in the final event. Times are seconds from submit. */
typedef struct ina_request_metrics {
  double queue_seconds;       /* until first admitted into a step (until finish if never) */
  double first_token_seconds; /* until the first generated token; -1 when none */
  double total_seconds;       /* until finished */
  double mean_token_seconds;  /* mean gap between consecutive tokens; 0 with fewer than 2 */
  double max_token_seconds;   /* largest such gap (preemptions show here) */
  int32_t prompt_tokens;
  int32_t generated_tokens;
  int32_t cached_tokens;      /* prompt tokens taken from the prefix cache, not computed */
  int32_t preemptions;
} ina_request_metrics_t;

/* One callback call. Pointers are valid during the call only. */
typedef struct ina_request_event {
  const char *request_id;
  int32_t token;               /* the new token; -1 in the final event */
  int32_t num_generated;       /* tokens generated so far, this one included */
  ina_finish_reason_t finish;  /* INA_FINISH_NONE for a token, the reason in the final event */
  ina_status_t status;         /* final event: INA_OK unless finish is INA_FINISH_ERROR */
  const char *error;           /* final event of an error: the message; else "" */
  const ina_request_metrics_t *metrics; /* final event only; NULL otherwise */
  /* Token events of a request with logprobs >= 0: the token's log probability and the
   * num_top most likely tokens (most likely first, ties by lower id) with theirs; else
   * logprob NAN and num_top 0. */
  float logprob;
  int32_t num_top;
  const int32_t *top_ids;
  const float *top_logprobs;
} ina_request_event_t;

/* Every accepted request gets its token events in order, then exactly one final event
 * (finish != INA_FINISH_NONE), after which the scheduler forgets it. */
typedef void (*ina_request_callback_t)(const ina_request_event_t *event, void *user_data);

/* KV hand-off between a prefill scheduler and a decode scheduler (prefill/decode
 * disaggregation): the pages of one request, lent to whoever moves their entries.
 *
 * Token t of the request lives in pages[t / page_size], slot t % page_size, of the
 * scheduler's pool (kvcache/page_pool.h). The callee of an ina_kv_pages_fn owns one
 * reference on each listed page and must give every one back with
 * ina_scheduler_release_pages, from any thread, once it is done with the entries: until
 * then the pages stay out of the pool, whatever becomes of the request (finished,
 * cancelled, preempted), so nothing else writes there while a transfer reads or writes
 * them. */
typedef struct ina_kv_pages {
  const char *request_id;
  const int32_t *pages;  /* [num_pages], valid during the call only (the references are the callee's) */
  int32_t num_pages;
  int32_t page_size;
  /* Export: the tokens [0, num_tokens) whose entries are computed and final. Import: the
   * prompt's length; its entries are to be written. */
  int64_t num_tokens;
  /* Import: tokens [0, first_token) are already in place (shared from the prefix cache);
   * only [first_token, num_tokens) must be written. Export: 0. */
  int64_t first_token;
  /* Export: the layers [0, num_layers) of those tokens are final. Reports with fewer
   * than all the cache's layers come from inside a step, as each layer is done (where
   * the engine says so: ina_engine_set_layer_hook), and cover the step's new tokens
   * in those layers only; the report after the step has every layer. Import: every
   * layer. */
  int32_t num_layers;
} ina_kv_pages_t;

/* Runs on the driver thread inside a step with no scheduler lock held: it must not block
 * or drive the scheduler (submit, cancel, ina_scheduler_import_done and
 * ina_scheduler_release_pages are allowed). */
typedef void (*ina_kv_pages_fn)(const ina_kv_pages_t *kv, void *user_data);

typedef struct ina_request {
  size_t struct_size; /* sizeof(ina_request_t), set by the INIT macro */
  uint32_t version;   /* 3 */
  const char *id;     /* non-empty, unique among the scheduler's unfinished requests */
  const int32_t *prompt;
  int32_t prompt_len; /* >= 1, ids in [0, vocab) */
  int32_t max_new_tokens; /* >= 1; prompt_len + max_new_tokens <= max_context */
  ina_sampling_params_t sampling;
  const int32_t *stop_ids; /* [num_stop_ids] in [0, vocab); may be NULL when 0 */
  int32_t num_stop_ids;
  int ignore_eos;     /* 1: the model's eos id does not end generation */
  ina_request_callback_t callback; /* may be NULL (nothing is delivered) */
  void *user_data;
  /* Version 2. Log probabilities in each token event: -1 none (default); 0..
   * INA_REQUEST_MAX_LOGPROBS the sampled token's and that many most likely alternatives'
   * (log-softmax of the model's logits, before temperature and top-k / top-p, as vLLM
   * reports them). A step with such a request computes full logits even when greedy. */
  int32_t logprobs;
  /* Version 3, the hand-off (see ina_kv_pages_t); at most one of the two, and neither
   * under replication (INA_ERR_UNSUPPORTED there).
   * kv_export (prefill side): after each step that computed prompt tokens of this
   * request, the pages holding every token computed so far; within the step, as each
   * layer of its new tokens is done, the same pages with the layers done so far. After a preemption the
   * count starts again from the prefix the request keeps; entries once reported are
   * recomputed equal (the engine is deterministic), so a callee sends only what it has
   * not sent yet.
   * kv_import (decode side): the request's prompt is not computed here. At admission
   * (when pages for the whole prompt are free) the scheduler shares what the prefix
   * cache holds of it, takes pages for the rest and hands them to kv_import; the request
   * then waits, in no batch and never preempted, until ina_scheduler_import_done says
   * the entries are written (its first token arrives with them: decoding goes on from
   * there) or failed (it finishes with the error). */
  ina_kv_pages_fn kv_export;
  ina_kv_pages_fn kv_import;
  void *kv_user_data; /* passed to either */
} ina_request_t;

#define INA_REQUEST_INIT                                                                                 \
  {sizeof(ina_request_t), 3, NULL, NULL, 0, 16, INA_SAMPLING_PARAMS_INIT, NULL, 0, 0, NULL, NULL, -1, NULL, \
   NULL, NULL}
#define INA_REQUEST_MAX_LOGPROBS 20

typedef struct ina_scheduler_stats {
  int32_t waiting;            /* accepted, not running (preempted ones included) */
  int32_t running;            /* admitted: prefilling or decoding */
  int32_t kv_pages_total;
  int32_t kv_pages_used;      /* prefix cache included */
  int32_t kv_pages_free;
  int32_t prefix_cache_pages; /* pages the prefix cache holds */
  int64_t prefix_cache_queries;    /* admissions that looked the cache up */
  int64_t prefix_cache_hits;       /* of those, admissions that reused at least one page */
  int64_t prefix_cache_hit_tokens; /* prompt tokens reused instead of computed */
  int64_t steps;              /* forward steps run */
  int64_t prefill_tokens;     /* prompt tokens computed (recomputation included) */
  int64_t decode_tokens;      /* one-token decode inputs computed */
  int64_t generated_tokens;   /* tokens sampled and delivered */
  int64_t preemptions;
  int64_t finished;           /* requests finished, whatever the reason */
  double busy_seconds;        /* wall time spent in steps that ran a forward */
  double generated_tokens_per_second; /* generated_tokens / busy_seconds */
  double tokens_per_second;   /* (prefill + decode tokens) / busy_seconds */
  /* The hand-off (ina_kv_pages_t): page references lent to kv_export / kv_import callees
   * and not yet given back, and requests waiting for their imported entries. */
  int32_t kv_pages_lent;
  int32_t importing;
} ina_scheduler_stats_t;

/* config may be NULL (defaults). The pool must have no pages in use by others. */
ina_status_t ina_scheduler_create(ina_engine_t *engine, const ina_scheduler_config_t *config,
                                  ina_scheduler_t **out);
/* Stops the run loop if started, finishes every unfinished request as cancelled (their
 * final events are delivered on the calling thread), returns all pages to the pool, and
 * hands waiting control commands INA_ERR_UNSUPPORTED unrun (returning once their callers
 * have left ina_scheduler_control). */
void ina_scheduler_destroy(ina_scheduler_t *scheduler);

/* Validate and queue a request. INA_ERR_INVALID_ARGUMENT, with a message naming the
 * request and the field, for an empty prompt, an id out of the vocabulary, a prompt plus
 * max_new_tokens beyond max_context, invalid sampling params or stop ids, an empty or
 * duplicate id; nothing is queued then. Any thread. */
ina_status_t ina_scheduler_submit(ina_scheduler_t *scheduler, const ina_request_t *request);

/* Ask an unfinished request to stop: at the next step it finishes with
 * INA_FINISH_CANCELLED and its pages return to the pool. INA_ERR_NOT_FOUND when no
 * unfinished request has this id. Idempotent. Any thread. */
ina_status_t ina_scheduler_cancel(ina_scheduler_t *scheduler, const char *request_id);

/* One scheduling step (see above), after the control commands waiting when it starts
 * (ina_scheduler_control); callbacks run before it returns. *num_scheduled
 * (may be NULL) receives the number of sequences in the step's batch (0: nothing could
 * run). An engine failure finishes the batch's requests with INA_FINISH_ERROR and is
 * returned. Driver thread only; INA_ERR_INVALID_ARGUMENT while the run loop runs. */
ina_status_t ina_scheduler_step(ina_scheduler_t *scheduler, int32_t *num_scheduled);

/* Start a thread that steps while there are unfinished requests or waiting control
 * commands and sleeps on a condition variable otherwise. INA_ERR_INVALID_ARGUMENT when
 * already started. */
ina_status_t ina_scheduler_run_start(ina_scheduler_t *scheduler);
/* Ask the run loop to stop after its current step and join it; unfinished requests stay
 * queued (step them, or destroy); control commands still waiting do not run (their
 * callers get INA_ERR_UNSUPPORTED). No-op when not started. Not from a callback. */
void ina_scheduler_run_stop(ina_scheduler_t *scheduler);

/* Counters and gauges as of the last step (queue lengths include requests submitted
 * since). Any thread. */
void ina_scheduler_stats(ina_scheduler_t *scheduler, ina_scheduler_stats_t *out);

/* Drop every prefix cache entry (their unused pages return to the pool). Driver thread
 * only: not while the run loop runs (INA_ERR_INVALID_ARGUMENT). */
ina_status_t ina_scheduler_flush_prefix_cache(ina_scheduler_t *scheduler);

/* The outcome of a kv_import request's transfer (ina_scheduler_import_done). */
typedef struct ina_kv_import_result {
  ina_status_t status;  /* INA_OK: entries [first_token, num_tokens) are written */
  const char *error;    /* status != INA_OK: why (copied); NULL for none */
  /* INA_OK: the request's first generated token, sampled where the prompt ran (with the
   * request's sampling params and seed: the decode side's sampler skips that draw), and,
   * for a request with logprobs >= 0, its log probabilities as in ina_request_event_t. */
  int32_t token;
  float logprob;
  int32_t num_top;
  const int32_t *top_ids;
  const float *top_logprobs;
} ina_kv_import_result_t;

/* A kv_import request's entries are in place (or will never be): at the next step it
 * decodes on from its first token, or finishes with the error. Any thread, once per
 * import; INA_ERR_NOT_FOUND when no unfinished request has this id or it is not waiting
 * for an import (a cancelled one, say); INA_ERR_INVALID_ARGUMENT for a token outside the
 * vocabulary. */
ina_status_t ina_scheduler_import_done(ina_scheduler_t *scheduler, const char *request_id,
                                       const ina_kv_import_result_t *result);

/* Give back page references a kv_export / kv_import callee held (ina_kv_pages_t). Any
 * thread; the driver drops them at its next step (the run loop is woken for it) or at
 * destroy. Pages not lent are a caller bug, logged by the pool. */
ina_status_t ina_scheduler_release_pages(ina_scheduler_t *scheduler, const int32_t *pages, int32_t count);

/* The largest control command, in bytes. */
#define INA_SCHEDULER_CONTROL_MAX_BYTES ((size_t)64 << 20)

/* Run a control command: config.control(engine, bytes, size, user_data) on the driver
 * thread, at the start of a step before that step takes in new requests and
 * cancellations, so the step after it already runs with its effect. Requests in flight
 * stay where they are (running, KV pages kept) across it. Blocks until the command has
 * run and returns its status; on failure `detail` [detail_size] (may be NULL) receives
 * the reason (the driver's ina_last_error() when the function failed; the caller's
 * ina_last_error() is set only for refusals). The bytes are copied when the call
 * begins.
 *
 * Commands run one at a time in the order they were issued, also while no request is
 * unfinished (the run loop wakes for them). A step runs those waiting when it starts;
 * one issued meanwhile waits for the next step, so commands back to back do not hold
 * the requests up. Without a run loop, a command waits for the next ina_scheduler_step
 * of whoever drives the scheduler: call this from another thread than the one stepping,
 * or it waits forever.
 *
 * Replicas (config.replica_comm): issue on the leader only. The command's bytes reach
 * every follower first, and each runs its own config.control with its own engine and
 * user data at the same point of the step stream, so collectives inside the function
 * meet. Only the leader's outcome is returned: a follower's failure is logged there and
 * the follower goes on following. The function itself must make the ranks agree on the
 * outcome (e.g. an all-reduce of a success flag, rolling back where any rank failed), or
 * the replicas' engines diverge. It should take about as long on every rank: followers
 * waiting for the leader's next message longer than their communicator's timeout give up.
 *
 * Returns INA_ERR_INVALID_ARGUMENT, running nothing, on a follower, without
 * config.control, for NULL bytes, size 0 or above INA_SCHEDULER_CONTROL_MAX_BYTES, from
 * the driver thread (a request callback or a control function) and once destroy has
 * begun; INA_ERR_UNSUPPORTED, the command not run, when destroy or run_stop finds it
 * still waiting (core/status.h has no "cancelled" code; the detail says which). Otherwise
 * the function's status, or the leader's communicator error if the followers could not be
 * told (the command then does not run). Any thread but the driver. destroy may come
 * while callers wait: it hands them the cancellation and returns once they have left
 * (but a call may not race with destroy's return, as for submit). */
ina_status_t ina_scheduler_control(ina_scheduler_t *scheduler, const void *bytes, size_t size, char *detail,
                                   size_t detail_size);

/* Follower of a replicated scheduler (config.replica_comm, rank > 0): runs the leader's
 * steps and control commands until the leader is destroyed (INA_OK) or a step or the
 * communicator fails (its error, e.g. INA_ERR_MPI when the leader went silent longer
 * than the communicator's timeout). INA_ERR_INVALID_ARGUMENT on the leader or without replication. Submit,
 * cancel and run_start are refused on followers: this call is their driver. */
ina_status_t ina_scheduler_follow(ina_scheduler_t *scheduler);

#ifdef __cplusplus
}
#endif
#endif
