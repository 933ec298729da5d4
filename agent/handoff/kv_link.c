/* The link thread: the one thread that touches UCX (comm/ucx_engine.h runs single-
 * threaded). On a prefill agent it moves each transfer's entries: as the scheduler lends
 * the pages of each computed prompt chunk (kv_export), it plans the copy of the tokens
 * the decode agent lacks (kvcache/kv_copy.h) and posts them as one batch of puts, so
 * the chunk's transfer overlaps the next chunk's compute; a batch's pages go back when
 * it completed at the decode agent. On every agent it progresses the worker, which
 * transports that need the target's help (TCP) rely on.
 *
 * A transfer that fails (a put failed, the deadline passed, an abort) posts nothing more,
 * cancels its prefill request and waits for its puts in flight; then it is "quiet"
 * (AbortTransfer answers then) and, once the request's final event has come, it is
 * answered with its error and freed. */
#define INA_LOG_SUBSYS "handoff"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "core/cuda.h"
#include "agent/handoff/handoff_internal.h"

/* Idle wake-ups: the worker is progressed at least this often. */
#define LINK_IDLE_NS 2000000L
#define LINK_BUSY_NS 100000L

/* A stage-in the link runs for a caller thread (handoff_link_stage_in). */
typedef struct handoff_stage {
  const int32_t *pages;
  int64_t from, to;
  ina_status_t status;
  char error[256];
  int done;
  struct handoff_stage *next;
} handoff_stage_t;

typedef struct handoff_peer {
  void *blob;
  size_t blob_size;
  ina_ucx_peer_t *peer;
  uint64_t remote_base, remote_length;
  int users; /* transfers using it */
  struct handoff_peer *next;
} handoff_peer_t;

double handoff_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- peers (link) ------------------------------------------------------------------- */

static handoff_peer_t *peer_get(agent_handoff_t *h, const void *blob, size_t size, char *why, size_t why_size) {
  for (handoff_peer_t *p = h->peers; p; p = p->next)
    if (p->blob_size == size && memcmp(p->blob, blob, size) == 0 && !ina_ucx_peer_failed(p->peer)) {
      p->users++;
      return p;
    }
  handoff_peer_t *p = calloc(1, sizeof *p);
  if (!p || !(p->blob = malloc(size))) {
    snprintf(why, why_size, "out of memory");
    free(p);
    return NULL;
  }
  memcpy(p->blob, blob, size);
  p->blob_size = size;
  if (ina_ucx_peer_connect(h->ucx, blob, size, &p->peer) != INA_OK ||
      ina_ucx_peer_region(p->peer, 0, &p->remote_base, &p->remote_length) != INA_OK) {
    snprintf(why, why_size, "cannot connect to the decode agent's UCX endpoint: %s", ina_last_error());
    ina_ucx_peer_disconnect(p->peer);
    free(p->blob);
    free(p);
    return NULL;
  }
  p->users = 1;
  p->next = h->peers;
  h->peers = p;
  return p;
}

/* A transfer lets go of its peer; a failed peer nobody uses is closed. */
static void peer_put(agent_handoff_t *h, handoff_peer_t *peer) {
  if (!peer) return;
  peer->users--;
  for (handoff_peer_t **pp = &h->peers; *pp; pp = &(*pp)->next) {
    handoff_peer_t *p = *pp;
    if (p == peer && p->users == 0 && ina_ucx_peer_failed(p->peer)) {
      *pp = p->next;
      ina_ucx_peer_disconnect(p->peer);
      free(p->blob);
      free(p);
      return;
    }
  }
}

/* ---- one transfer (link) ------------------------------------------------------------ */

static void release_set(agent_handoff_t *h, handoff_page_set_t *set) {
  if (!set) return;
  (void)ina_scheduler_release_pages(h->scheduler, set->pages, set->num_pages);
  free(set->pages);
  free(set);
}

static void fail(handoff_transfer_t *t, ina_rpc_code_t code, const char *fmt, const char *detail) {
  if (t->fail_code != INA_RPC_OK) return; /* the first reason stands */
  t->fail_code = code;
  snprintf(t->fail_msg, sizeof t->fail_msg, fmt, detail);
}

/* Posts the puts of what `set` completes that the decode agent lacks: the layers done
 * since the last set of the same tokens (a step reports each layer as it is done, then
 * all of them). */
static void post_set(agent_handoff_t *h, handoff_transfer_t *t, handoff_page_set_t *set) {
  handoff_peer_t *peer = t->peer;
  const int32_t L = h->layout.num_layers;
  const int64_t from = t->sent > t->first_token ? t->sent : t->first_token;
  const int64_t to = set->num_tokens < t->prompt_len ? set->num_tokens : t->prompt_len;
  if (to != t->partial_to) { /* another step's tokens: no layer of them posted yet */
    t->partial_to = to;
    t->partial_layers = 0;
  }
  const int32_t layer_begin = t->partial_layers, layer_end = set->num_layers < L ? set->num_layers : L;
  if (to <= from || layer_end <= layer_begin) {
    release_set(h, set);
    return;
  }
  const int64_t cap = ina_kv_copy_max(&h->layout, &t->dst, from, to, layer_begin, layer_end);
  ina_kv_copy_t *plan = malloc((size_t)cap * sizeof *plan);
  ina_ucx_xfer_t *xfers = malloc((size_t)cap * sizeof *xfers);
  int64_t n = 0;
  ina_ucx_batch_t *batch = NULL;
  handoff_flight_t *flight = calloc(1, sizeof *flight);
  if (!plan || !xfers || !flight) {
    fail(t, INA_RPC_RESOURCE_EXHAUSTED, "%s", "out of memory planning the puts");
    goto out;
  }
  if (ina_kv_copy_plan(&h->layout, set->pages, &t->dst, t->dst_pages, from, to, layer_begin, layer_end, plan, cap,
                       &n) != INA_OK) {
    fail(t, INA_RPC_INTERNAL, "planning the puts: %s", ina_last_error());
    goto out;
  }
  for (int64_t i = 0; i < n; i++) {
    if (plan[i].dst_offset + plan[i].bytes > peer->remote_length) {
      fail(t, INA_RPC_INVALID_ARGUMENT, "%s", "a decode page lies outside the decode agent's registered KV storage");
      goto out;
    }
    xfers[i] = (ina_ucx_xfer_t){h->kv_base + plan[i].src_offset, peer->remote_base + plan[i].dst_offset,
                                (size_t)plan[i].bytes};
  }
  if (ina_ucx_post(peer->peer, INA_UCX_PUT, xfers, (size_t)n, &batch) != INA_OK) {
    fail(t, INA_RPC_INTERNAL, "a put to the decode agent failed: %s", ina_last_error());
    goto out;
  }
  flight->batch = batch;
  flight->set = set;
  flight->next = t->flights;
  t->flights = flight;
  flight = NULL;
  set = NULL;
  t->partial_layers = layer_end;
  if (layer_end == L) { /* these tokens are complete */
    t->sent = to;
    t->partial_to = 0;
    t->partial_layers = 0;
  }
  t->bytes += (uint64_t)(to - from) * (uint64_t)h->layout.entry_bytes * (uint64_t)(layer_end - layer_begin);
  t->puts += (uint64_t)n;
out:
  free(flight);
  free(plan);
  free(xfers);
  release_set(h, set);
}

/* Completes the flights that are done; a failed one fails the transfer. */
static void test_flights(agent_handoff_t *h, handoff_transfer_t *t) {
  for (handoff_flight_t **fp = &t->flights; *fp;) {
    handoff_flight_t *f = *fp;
    int done = 0;
    if (ina_ucx_batch_test(f->batch, &done) != INA_OK) {
      fail(t, INA_RPC_INTERNAL, "a put to the decode agent failed: %s", ina_last_error());
      done = 1;
    }
    if (!done) {
      fp = &f->next;
      continue;
    }
    *fp = f->next;
    ina_ucx_batch_destroy(f->batch);
    release_set(h, f->set);
    free(f);
  }
}

/* The link's work on one transfer; `sets` were pending. */
static void step_transfer(agent_handoff_t *h, handoff_transfer_t *t, handoff_page_set_t *sets, int abort_requested,
                          int finished) {
  if (abort_requested) fail(t, INA_RPC_ABORTED, "%s", "the transfer was aborted by the decode agent");
  if (t->fail_code == INA_RPC_OK && handoff_now() > t->deadline && !(finished && t->sent >= t->prompt_len))
    fail(t, INA_RPC_DEADLINE_EXCEEDED, "%s", "the transfer's timeout passed before the prompt's entries were written");
  if (t->fail_code == INA_RPC_OK && !t->peer && (sets || finished)) {
    char why[INA_RPC_MESSAGE_MAX];
    t->peer = peer_get(h, t->blob, t->blob_size, why, sizeof why);
    if (!t->peer) fail(t, INA_RPC_UNAVAILABLE, "%s", why);
  }
  /* The stall test hook: sets wait in `held` until hold_until (or a failure). */
  if (t->held && (t->fail_code != INA_RPC_OK || handoff_now() >= t->hold_until)) {
    handoff_page_set_t *last = t->held;
    while (last->next) last = last->next;
    last->next = sets;
    sets = t->held;
    t->held = NULL;
  }
  if (sets && t->fail_code == INA_RPC_OK && handoff_now() < t->hold_until) {
    handoff_page_set_t **end = &t->held;
    while (*end) end = &(*end)->next;
    *end = sets;
    sets = NULL;
  }
  while (sets) {
    handoff_page_set_t *next = sets->next;
    sets->next = NULL;
    if (t->fail_code == INA_RPC_OK)
      post_set(h, t, sets);
    else
      release_set(h, sets);
    sets = next;
  }
  test_flights(h, t);
  if (t->peer && ina_ucx_peer_failed((t->peer)->peer))
    fail(t, INA_RPC_INTERNAL, "%s", "the decode agent's UCX endpoint failed (the decode agent went away)");
  if (t->fail_code != INA_RPC_OK && t->submitted && !t->cancel_sent && !finished) {
    t->cancel_sent = 1;
    (void)ina_scheduler_cancel(h->scheduler, t->id);
  }
}

/* Answers and frees a transfer that is over (mu not held). */
static void complete(agent_handoff_t *h, handoff_transfer_t *t) {
  ina_rpc_code_t code = t->fail_code;
  char msg[INA_RPC_MESSAGE_MAX];
  snprintf(msg, sizeof msg, "%s", t->fail_msg);
  if (code == INA_RPC_OK && t->finish != INA_FINISH_LENGTH) {
    code = INA_RPC_INTERNAL;
    snprintf(msg, sizeof msg, "the prefill ended with %s: %s", ina_finish_reason_string(t->finish), t->finish_error);
  } else if (code == INA_RPC_OK && t->sent < t->prompt_len && t->first_token < t->prompt_len) {
    code = INA_RPC_INTERNAL;
    snprintf(msg, sizeof msg, "the prefill wrote %lld of the prompt's %lld tokens", (long long)t->sent,
             (long long)t->prompt_len);
  }
  handoff_transfer_respond(h, t, code, msg);
  peer_put(h, t->peer);
  pthread_mutex_lock(&h->mu);
  if (code == INA_RPC_OK) {
    h->stats.prefills_served++;
    h->stats.bytes_written += (int64_t)t->bytes;
    h->stats.puts += (int64_t)t->puts;
  } else {
    h->stats.prefills_failed++;
  }
  pthread_mutex_unlock(&h->mu);
  if (code != INA_RPC_OK)
    INA_LOG_I(INA_LOG_SUBSYS, "transfer '%s' failed (%s): %s", t->id, ina_rpc_code_name(code), msg);
  handoff_transfer_free(t);
}

/* Runs one stage-in: the identity plan of the tokens over this cache gives their byte
 * ranges in every layer. */
static ina_status_t run_stage(agent_handoff_t *h, const handoff_stage_t *sg) {
  ina_status_t st = INA_OK;
  const int64_t cap = ina_kv_copy_max(&h->layout, &h->layout, sg->from, sg->to, 0, h->layout.num_layers);
  ina_kv_copy_t *plan = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *plan);
  int64_t n = 0;
  INA_CHECK_ALLOC(plan);
  INA_CHECK(ina_kv_copy_plan(&h->layout, sg->pages, &h->layout, sg->pages, sg->from, sg->to, 0, h->layout.num_layers,
                             plan, cap, &n));
  for (int64_t i = 0; i < n; i++) INA_CHECK(ina_ucx_region_stage_in(h->region, plan[i].dst_offset, plan[i].bytes));
fail:
  free(plan);
  return st;
}

static void run_stages_locked(agent_handoff_t *h) {
  while (h->stages) {
    handoff_stage_t *sg = h->stages;
    h->stages = sg->next;
    pthread_mutex_unlock(&h->mu);
    sg->status = run_stage(h, sg);
    if (sg->status != INA_OK) snprintf(sg->error, sizeof sg->error, "%s", ina_last_error());
    pthread_mutex_lock(&h->mu);
    sg->done = 1;
    pthread_cond_broadcast(&h->quiet); /* the waiting caller */
  }
}

ina_status_t handoff_link_stage_in(agent_handoff_t *h, const int32_t *pages, int64_t from, int64_t to) {
  ina_status_t st = INA_OK;
  if (!ina_ucx_region_is_staged(h->region) || to <= from) return INA_OK;
  handoff_stage_t sg = {pages, from, to, INA_OK, "", 0, NULL};
  pthread_mutex_lock(&h->mu);
  sg.next = h->stages;
  h->stages = &sg;
  pthread_cond_broadcast(&h->wake);
  while (!sg.done) pthread_cond_wait(&h->quiet, &h->mu);
  pthread_mutex_unlock(&h->mu);
  INA_REQUIRE(sg.status == INA_OK, sg.status, "copying the received entries into the device: %s", sg.error);
fail:
  return st;
}

static void *link_main(void *arg) {
  agent_handoff_t *h = arg;
  /* UCX stages device memory with CUDA copies: on the engine's device. */
  if (h->kv_on_device && ina_cuda_set_device(h->device) != INA_OK)
    INA_LOG_E(INA_LOG_SUBSYS, "link: %s", ina_last_error());
  pthread_mutex_lock(&h->mu);
  while (!h->stopping || h->transfers || h->stages) {
    int busy = 0;
    run_stages_locked(h);
    for (handoff_transfer_t **tp = &h->transfers; *tp;) {
      handoff_transfer_t *t = *tp;
      handoff_page_set_t *sets = t->pending;
      t->pending = t->pending_tail = NULL;
      const int abort_requested = t->abort_requested || h->stopping, finished = t->finished;
      pthread_mutex_unlock(&h->mu);
      step_transfer(h, t, sets, abort_requested, finished);
      pthread_mutex_lock(&h->mu);
      if (t->fail_code != INA_RPC_OK && !t->flights && !t->quiet) {
        t->quiet = 1;
        pthread_cond_broadcast(&h->quiet);
      }
      /* A transfer that failed before its request was accepted has no final event. */
      if ((t->finished || !t->submitted) && !t->pending && !t->flights && !t->held) {
        *tp = t->next;
        pthread_mutex_unlock(&h->mu);
        complete(h, t);
        pthread_mutex_lock(&h->mu);
        continue;
      }
      busy |= t->flights != NULL || t->pending != NULL || t->held != NULL;
      tp = &t->next;
    }
    busy |= h->imports_in_flight > 0;
    pthread_mutex_unlock(&h->mu);
    while (ina_ucx_engine_progress(h->ucx)) {
    }
    pthread_mutex_lock(&h->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += busy ? LINK_BUSY_NS : LINK_IDLE_NS;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    (void)pthread_cond_timedwait(&h->wake, &h->mu, &until);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
}

ina_status_t handoff_link_start(agent_handoff_t *h) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_ucx_engine_create(&h->ucx));
  /* Device memory without a CUDA-enabled UCX: a host mirror peers access (ucx_engine.h). */
  if (h->kv_on_device) INA_CHECK(ina_cuda_set_device(h->device));
  INA_CHECK(ina_ucx_region_register(h->ucx, h->kv_base, h->kv_bytes,
                                    h->kv_on_device ? INA_UCX_MEM_CUDA : INA_UCX_MEM_HOST, &h->region));
  if (ina_ucx_region_is_staged(h->region))
    INA_LOG_I(INA_LOG_SUBSYS, "the KV cache is in device memory: peers reach it through a %.1f MiB host mirror",
              (double)h->kv_bytes / (1 << 20));
  INA_CHECK(ina_ucx_engine_pack_blob(h->ucx, &h->region, 1, &h->blob, &h->blob_size));
  const int err = pthread_create(&h->link_thread, NULL, link_main, h);
  INA_REQUIRE(err == 0, INA_ERR_INTERNAL, "handoff: pthread_create failed (%s)", strerror(err));
  h->link_started = 1;
fail:
  return st;
}

void handoff_link_stop(agent_handoff_t *h) {
  if (h->link_started) {
    pthread_mutex_lock(&h->mu);
    h->stopping = 1;
    pthread_cond_broadcast(&h->wake);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->link_thread, NULL);
    h->link_started = 0;
  }
  while (h->peers) {
    handoff_peer_t *p = h->peers;
    h->peers = p->next;
    ina_ucx_peer_disconnect(p->peer);
    free(p->blob);
    free(p);
  }
  free(h->blob);
  h->blob = NULL;
  ina_ucx_region_deregister(h->region);
  h->region = NULL;
  ina_ucx_engine_destroy(h->ucx);
  h->ucx = NULL;
}
