/* The hand-off's internals, shared by the files of agent/handoff/ (not a public header).
 *
 * Locking: `mu` guards the transfer list and everything a transfer shares between the
 * threads (pending page sets, flags, the prefill's outcome), the decode side's job queue,
 * quarantine and client cache, and the counters. Fields marked "link" belong to the link
 * thread alone. Nothing here is held while calling the scheduler's driver-side code; the
 * scheduler's any-thread calls (cancel, submit, import_done, release_pages) are made with
 * mu released, except release_pages, which takes only the scheduler's own lock. */
#ifndef INA_AGENT_HANDOFF_HANDOFF_INTERNAL_H
#define INA_AGENT_HANDOFF_HANDOFF_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "comm/ucx_engine.h"
#include "ina/v1/kv_transfer.pb-c.h"
#include "kvcache/kv_copy.h"
#include "agent/handoff/handoff.h"
#include "agent/rpc/rpc_client.h"

#define HANDOFF_ID_MAX 128

typedef struct agent_handoff agent_handoff_t;
#define HANDOFF_ABORTED_RING 256

/* A set of the prefill request's pages, lent by kv_export (one reference each). */
typedef struct handoff_page_set {
  int32_t *pages;
  int32_t num_pages;
  int64_t num_tokens; /* the request's tokens [0, num_tokens) are computed */
  int32_t num_layers; /* in layers [0, num_layers) (ina_kv_pages_t) */
  struct handoff_page_set *next;
} handoff_page_set_t;

/* Puts in flight and the pages they read. link. */
typedef struct handoff_flight {
  ina_ucx_batch_t *batch;
  handoff_page_set_t *set;
  struct handoff_flight *next;
} handoff_flight_t;

/* Prefill side: one Prefill call. Created by the handler, completed and freed by the
 * link thread once the prefill's final event has come, no page set is pending and no
 * put is in flight. */
typedef struct handoff_transfer {
  struct handoff_transfer *next;
  agent_handoff_t *h;
  char id[HANDOFF_ID_MAX + 1];      /* transfer id, also the scheduler request's */
  ina_rpc_writer_t *writer;
  int64_t prompt_len;
  int64_t first_token;              /* the decode side holds [0, first_token) */
  ina_kv_layout_t dst;              /* the decode agent's cache */
  int32_t *dst_pages;               /* [ceil(prompt_len / dst.page_size)] */
  void *blob;                       /* the decode agent's endpoint blob */
  size_t blob_size;
  double deadline;                  /* monotonic seconds: no put is posted after it */
  int submitted;                    /* the scheduler accepted the prefill request */

  /* Shared, under mu. */
  handoff_page_set_t *pending, *pending_tail;
  int finished;                     /* the prefill request's final event came */
  ina_finish_reason_t finish;
  char finish_error[256];
  int32_t token;                    /* its first token */
  float logprob;
  int32_t num_top;
  int32_t top_ids[INA_REQUEST_MAX_LOGPROBS];
  float top_logprobs[INA_REQUEST_MAX_LOGPROBS];
  int32_t cached_tokens;
  int abort_requested;              /* AbortTransfer, or the caller went away */
  int quiet;                        /* stopping, and no put in flight: nothing more is written */

  /* link */
  struct handoff_peer *peer;        /* kv_link.c's connection to the decode agent */
  int64_t sent;                     /* tokens [first_token, sent) are posted, in every layer */
  int64_t partial_to;               /* and of [sent, partial_to), layers [0, partial_layers) */
  int32_t partial_layers;
  handoff_flight_t *flights;
  ina_rpc_code_t fail_code;         /* != OK: the transfer fails with this */
  char fail_msg[INA_RPC_MESSAGE_MAX];
  int cancel_sent;                  /* the prefill request was cancelled */
  handoff_page_set_t *held;         /* test hook: sets kept back until hold_until */
  double hold_until;
  uint64_t bytes, puts;
} handoff_transfer_t;

/* Decode side: one request whose prompt runs elsewhere. Two owners: the scheduler's
 * callback (until the final event) and the import (from kv_import until the caller
 * thread is done); the last to let go frees it. */
typedef struct handoff_import {
  agent_handoff_t *h;
  char *request_id;
  char transfer_id[HANDOFF_ID_MAX + 1];
  int32_t *prompt;
  int32_t prompt_len;
  ina_sampling_params_t sampling;
  int32_t logprobs;
  char *target;                     /* the prefill agent */
  ina_request_callback_t callback;  /* the wrapped request's */
  void *user_data;
  int32_t *pages;                   /* lent by kv_import */
  int32_t num_pages;
  int64_t first_token;
  int owners;                       /* under mu */
  struct handoff_import *next;      /* the job queue, under mu */
} handoff_import_t;

/* Decode side: pages of a transfer that ended badly, held until the prefill agent says
 * it writes no more (AbortTransfer answered) or is gone (its port refuses). */
typedef struct handoff_quarantine {
  char *target;
  char transfer_id[HANDOFF_ID_MAX + 1];
  int32_t *pages;
  int32_t num_pages;
  double next_try;
  struct handoff_quarantine *next;
} handoff_quarantine_t;

typedef struct handoff_client {
  char *target;
  ina_rpc_client_t *client;
  int checked;                      /* its endpoint was found compatible */
  struct handoff_client *next;
} handoff_client_t;

struct agent_handoff {
  ina_agent_t *agent;
  ina_scheduler_t *scheduler;
  int32_t role;
  ina_kv_layout_t layout;
  char fingerprint[256];
  uint8_t *kv_base;                 /* the engine's KV storage (ina_engine_kv_storage) */
  size_t kv_bytes;
  int kv_on_device;                 /* it is CUDA memory (of `device`): UCX stages it */
  int32_t device;
  int32_t tp_size;
  int64_t timeout_ms;
  char *default_target;
  /* Test hook (INA_TEST_KV_STALL_MS): a prefill agent holds each transfer's puts back
   * this long, to stall transfers past their timeout. 0: off. */
  double test_stall_s;

  /* UCX: made at start, then used by the link thread only. */
  ina_ucx_engine_t *ucx;
  ina_ucx_region_t *region;
  void *blob;                       /* this agent's endpoint blob (read-only after start) */
  size_t blob_size;

  pthread_mutex_t mu;
  pthread_cond_t wake;              /* link: work arrived */
  pthread_cond_t quiet;             /* a transfer went quiet (AbortTransfer waits) */
  pthread_cond_t jobs_cv;           /* decode callers: a job or a quarantine retry */
  int stopping;
  handoff_transfer_t *transfers;
  char aborted[HANDOFF_ABORTED_RING][HANDOFF_ID_MAX + 1]; /* recently aborted ids */
  int32_t aborted_next;
  struct handoff_stage *stages;     /* decode side: mirror -> device copies for the link */
  handoff_import_t *jobs, *jobs_tail;
  int32_t imports_in_flight;        /* decode side: Prefill calls running (the link then
                                     * progresses its worker often: a TCP put needs the
                                     * target's progress to land) */
  handoff_quarantine_t *quarantine;
  handoff_client_t *clients;
  agent_handoff_stats_t stats;

  pthread_t link_thread;
  int link_started;
  pthread_t *callers;
  int32_t num_callers;

  /* link: connected decode agents, by blob. */
  struct handoff_peer *peers;
};

/* ---- kv_link.c ---------------------------------------------------------------------- */

/* Creates the UCX engine, registers the KV storage and packs the blob (on the calling
 * thread, before the link thread exists), then starts the link thread. */
ina_status_t handoff_link_start(agent_handoff_t *h);
/* Joins the link thread (stopping set and every transfer ended first) and frees UCX. */
void handoff_link_stop(agent_handoff_t *h);
/* Decode side, any thread but the link: after a peer's puts into a staged (device)
 * cache landed in its host mirror, copies tokens [from, to) of `pages` in every layer
 * into the device (on the link thread, which owns UCX) and waits for it. No-op for a host
 * cache. */
ina_status_t handoff_link_stage_in(agent_handoff_t *h, const int32_t *pages, int64_t from, int64_t to);

/* ---- prefill_side.c ----------------------------------------------------------------- */

/* The link thread ends a transfer: its answer (code OK: the PrefillResponse from t) goes
 * out and the writer is finished. */
void handoff_transfer_respond(agent_handoff_t *h, handoff_transfer_t *t, ina_rpc_code_t code, const char *msg);
void handoff_transfer_free(handoff_transfer_t *t);
/* Lock held: remember an aborted transfer id (a late Prefill with it is refused). */
void handoff_remember_aborted_locked(agent_handoff_t *h, const char *id);

/* This agent's endpoint as the messages carry it: *ep points at *layout, and both at h's
 * strings (valid while h lives). */
void handoff_endpoint_message(const agent_handoff_t *h, Ina__V1__KvLayout *layout, Ina__V1__KvEndpoint *ep);
/* A layout message's counts (checked by the caller or the validator) as a kv_copy layout. */
ina_kv_layout_t handoff_layout_of(const Ina__V1__KvLayout *layout);

/* ---- decode_side.c ------------------------------------------------------------------ */

ina_status_t handoff_decode_start(agent_handoff_t *h, int32_t callers);
void handoff_decode_stop(agent_handoff_t *h);
/* The client for target (made on first use; shared by the threads). NULL when out of
 * memory. */
ina_rpc_client_t *handoff_client(agent_handoff_t *h, const char *target, handoff_client_t **entry);
/* Asks target for its endpoint and checks it pairs with this agent's cache: INA_RPC_OK,
 * or the reason in msg. */
ina_rpc_code_t handoff_check_target(agent_handoff_t *h, const char *target, int64_t deadline_ms, char *msg);

double handoff_now(void);

#endif
