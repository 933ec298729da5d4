#define INA_LOG_SUBSYS "rpc"
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/check.h"
#include "agent/rpc/server_internal.h"

/* One server-side call, from the slot handed to grpc_server_request_call to its release.
 * Streams show it to their owner as the ina_rpc_writer_t.
 *
 *   NEW_CALL  -> start RECV_CLOSE_ON_SERVER (completes when the call is over) and either
 *                answer at once (UNIMPLEMENTED, UNAUTHENTICATED) or start RECV_MESSAGE
 *   RECV      -> run the handler on this thread; a unary reply is queued with its status;
 *                a stream handler becomes the writer's owner
 *   SEND      -> the batch in flight is done: start the next queued message, or the
 *                status once the owner finished and the queue is empty
 *   CLOSE     -> the call is over; `cancelled` says whether it ended before its status
 *                went out, in which case queued writes are dropped and the owner's
 *                on_cancel runs
 *
 * gRPC allows one send batch in flight per call, so writes wait in a queue and SEND
 * completions pump it. Every grpc_call_start_batch on a call happens under the call's
 * lock (gRPC wants batches on one call serialized).
 *
 * Lifetime: the grpc_call is released as soon as it is closed, no batch is in flight
 * and no handler or callback is running with it ("pins"), even while a stream owner
 * still holds the writer, so that server shutdown never waits on an owner. The struct
 * itself is freed when, in addition, the owner has called finish. */

typedef struct pending_write {
  grpc_byte_buffer *message;
  struct pending_write *next;
} pending_write_t;

struct ina_rpc_writer {
  ina_rpc_server_t *server;
  const rpc_method_t *method; /* NULL for an unregistered path */
  rpc_tag_t tag_new, tag_recv, tag_close, tag_send;

  /* Filled by gRPC: the call, its details and metadata, the request, the close flag. */
  grpc_call *call;
  grpc_call_details details;
  grpc_metadata_array request_metadata;
  grpc_byte_buffer *request;
  int close_cancelled;

  pthread_mutex_t lock; /* guards everything below */
  int accepted;         /* a real call arrived (counted in the server's active calls) */
  int batches_in_flight;
  int pins;             /* handler or on_cancel running outside the lock */
  int closed;           /* the CLOSE event came */
  int cancelled;        /* the call ended (or broke) before its status was sent */
  int owner_holds;      /* a stream owner has not called finish yet */
  int metadata_sent;
  int send_in_flight;
  grpc_byte_buffer *sending; /* message of the send batch in flight */
  pending_write_t *queue_head, *queue_tail;
  size_t queued;
  int finish_requested; /* status to send once the queue is empty */
  int status_started;
  ina_rpc_code_t final_code;
  char *final_message;
  ina_rpc_cancel_fn cancel_fn;
  void *cancel_ctx;
  int cancel_notified;
};

typedef struct ina_rpc_writer call_t;

static void drop_queue_locked(call_t *c) {
  while (c->queue_head) {
    pending_write_t *w = c->queue_head;
    c->queue_head = w->next;
    grpc_byte_buffer_destroy(w->message);
    free(w);
  }
  c->queue_tail = NULL;
  c->queued = 0;
}

static void call_free(call_t *c) {
  drop_queue_locked(c);
  if (c->sending) grpc_byte_buffer_destroy(c->sending);
  if (c->request) grpc_byte_buffer_destroy(c->request);
  grpc_call_details_destroy(&c->details);
  grpc_metadata_array_destroy(&c->request_metadata);
  free(c->final_message);
  pthread_mutex_destroy(&c->lock);
  ina_rpc_server_t *server = c->server;
  int accepted = c->accepted;
  free(c);
  if (accepted) rpc_server_call_released(server);
}

/* Releases the grpc_call once nothing can use it any more, and says whether the struct
 * can be freed too (the caller does so after unlocking). */
static int settle_locked(call_t *c) {
  if (c->batches_in_flight > 0 || c->pins > 0) return 0;
  if (c->call && c->closed) {
    grpc_call_unref(c->call);
    c->call = NULL;
  }
  return c->call == NULL && !c->owner_holds;
}

static void mark_cancelled_locked(call_t *c) {
  c->cancelled = 1;
  drop_queue_locked(c);
}

/* Starts a batch whose completion comes back as `tag`; a refusal by gRPC (a bug on our
 * side, or a call gRPC already tore down) cancels the call. */
static int start_batch_locked(call_t *c, const grpc_op *ops, size_t n, rpc_tag_t *tag) {
  grpc_call_error err = grpc_call_start_batch(c->call, ops, n, tag, NULL);
  if (err != GRPC_CALL_OK) {
    INA_LOG_W(INA_LOG_SUBSYS, "rpc server: %s: grpc_call_start_batch refused: %s",
              c->method ? c->method->path : "(unknown method)", grpc_call_error_to_string(err));
    grpc_call_cancel(c->call, NULL);
    mark_cancelled_locked(c);
    return 0;
  }
  c->batches_in_flight++;
  return 1;
}

/* Sends what is due next: the oldest queued message (with the status as well when it is
 * the last one and the owner has finished), or the status alone. */
static void pump_locked(call_t *c) {
  if (c->send_in_flight || c->cancelled || c->closed || !c->call || c->status_started) return;
  grpc_op ops[3];
  size_t n = 0;
  memset(ops, 0, sizeof ops);
  if (!c->metadata_sent) {
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
  }
  grpc_byte_buffer *message = NULL;
  if (c->queue_head) {
    pending_write_t *w = c->queue_head;
    c->queue_head = w->next;
    if (!c->queue_head) c->queue_tail = NULL;
    c->queued--;
    message = w->message;
    free(w);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = message;
    n++;
  }
  grpc_slice details = grpc_empty_slice();
  int with_status = c->finish_requested && !c->queue_head;
  if (with_status) {
    if (c->final_message) details = grpc_slice_from_copied_string(c->final_message);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)c->final_code;
    ops[n].data.send_status_from_server.status_details = c->final_message ? &details : NULL;
    n++;
  }
  if (!message && !with_status) return; /* nothing due yet */
  int started = start_batch_locked(c, ops, n, &c->tag_send);
  grpc_slice_unref(details);
  if (!started) {
    if (message) grpc_byte_buffer_destroy(message);
    return;
  }
  c->metadata_sent = 1;
  c->send_in_flight = 1;
  c->sending = message;
  if (with_status) c->status_started = 1;
}

/* Ends the call with a status and no message (unknown method, refused token, ...). */
static void reply_status_locked(call_t *c, ina_rpc_code_t code, const char *message) {
  if ((unsigned)code > INA_RPC_UNAUTHENTICATED) { /* not a gRPC code: say so, not garble it */
    INA_LOG_W(INA_LOG_SUBSYS, "rpc server %s: handler returned status code %d; sending UNKNOWN",
              c->method ? c->method->path : "(unknown method)", (int)code);
    code = INA_RPC_UNKNOWN;
  }
  free(c->final_message);
  c->final_message = message && message[0] ? strdup(message) : NULL;
  c->final_code = code;
  c->finish_requested = 1;
  pump_locked(c);
}

/* Takes ownership of `bytes` (malloc'd); NULL with size 0 is an empty message. */
static grpc_byte_buffer *byte_buffer_from_malloc(uint8_t *bytes, size_t size) {
  grpc_slice slice;
  if (size == 0) {
    free(bytes);
    slice = grpc_empty_slice();
  } else {
    slice = grpc_slice_new(bytes, size, free);
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  return bb;
}

static int enqueue_locked(call_t *c, grpc_byte_buffer *message) {
  pending_write_t *w = malloc(sizeof *w);
  if (!w) return 0;
  w->message = message;
  w->next = NULL;
  if (c->queue_tail) {
    c->queue_tail->next = w;
  } else {
    c->queue_head = w;
  }
  c->queue_tail = w;
  c->queued++;
  return 1;
}

/* "authorization: Bearer <token>" with the method's token. The scheme is matched
 * without regard to case (RFC 6750); the token in time independent of where it
 * differs, so that response times do not reveal a prefix. */
static int authorized(const rpc_method_t *m, const grpc_metadata_array *md) {
  if (!m->bearer_token) return 1;
  static const char kScheme[] = "bearer ";
  const size_t scheme_len = sizeof kScheme - 1;
  const size_t token_len = strlen(m->bearer_token);
  for (size_t i = 0; i < md->count; i++) {
    const grpc_slice key = md->metadata[i].key, value = md->metadata[i].value;
    if (GRPC_SLICE_LENGTH(key) != 13 ||
        strncasecmp((const char *)GRPC_SLICE_START_PTR(key), "authorization", 13) != 0) {
      continue;
    }
    const char *v = (const char *)GRPC_SLICE_START_PTR(value);
    size_t n = GRPC_SLICE_LENGTH(value);
    if (n != scheme_len + token_len || strncasecmp(v, kScheme, scheme_len) != 0) continue;
    unsigned char diff = 0;
    for (size_t k = 0; k < token_len; k++) {
      diff |= (unsigned char)(v[scheme_len + k] ^ m->bearer_token[k]);
    }
    if (diff == 0) return 1;
  }
  return 0;
}

ina_status_t rpc_call_request(ina_rpc_server_t *server) {
  ina_status_t st = INA_OK;
  call_t *c = calloc(1, sizeof *c);
  INA_CHECK_ALLOC(c);
  c->server = server;
  c->tag_new = (rpc_tag_t){RPC_TAG_NEW_CALL, c};
  c->tag_recv = (rpc_tag_t){RPC_TAG_RECV, c};
  c->tag_close = (rpc_tag_t){RPC_TAG_CLOSE, c};
  c->tag_send = (rpc_tag_t){RPC_TAG_SEND, c};
  grpc_call_details_init(&c->details);
  grpc_metadata_array_init(&c->request_metadata);
  pthread_mutex_init(&c->lock, NULL);
  /* Under the server lock, so that destroy never sees a request posted after it began
   * shutting the core server down. */
  pthread_mutex_lock(&server->lock);
  grpc_call_error err = GRPC_CALL_ERROR;
  int shutting_down = server->shutting_down;
  if (!shutting_down) {
    err = grpc_server_request_call(server->server, &c->call, &c->details, &c->request_metadata,
                                   server->cq, server->cq, &c->tag_new);
  }
  pthread_mutex_unlock(&server->lock);
  if (shutting_down) {
    call_free(c);
    return INA_OK;
  }
  INA_REQUIRE(err == GRPC_CALL_OK, INA_ERR_INTERNAL, "rpc server: grpc_server_request_call: %s",
              grpc_call_error_to_string(err));
  return INA_OK;
fail:
  if (c) call_free(c);
  return st;
}

static void on_new_call(call_t *c, int ok) {
  if (!ok) { /* the server is shutting down; the slot never got a call */
    call_free(c);
    return;
  }
  c->accepted = 1;
  rpc_server_call_accepted(c->server);
  if (rpc_call_request(c->server) != INA_OK) {
    INA_LOG_W(INA_LOG_SUBSYS, "rpc server: could not replace a call slot; serving with fewer");
  }
  char *path = grpc_slice_to_c_string(c->details.method);
  c->method = rpc_server_find_method(c->server, path);

  pthread_mutex_lock(&c->lock);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  op.data.recv_close_on_server.cancelled = &c->close_cancelled;
  if (!start_batch_locked(c, &op, 1, &c->tag_close)) {
    c->closed = 1; /* no close event will come */
  } else if (!c->method) {
    char msg[INA_RPC_MESSAGE_MAX];
    snprintf(msg, sizeof msg, "unknown method %s", path);
    reply_status_locked(c, INA_RPC_UNIMPLEMENTED, msg);
  } else if (!authorized(c->method, &c->request_metadata)) {
    char msg[INA_RPC_MESSAGE_MAX];
    snprintf(msg, sizeof msg, "%s: missing or wrong bearer token", path);
    reply_status_locked(c, INA_RPC_UNAUTHENTICATED, msg);
  } else {
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->request;
    start_batch_locked(c, &op, 1, &c->tag_recv);
  }
  int done = settle_locked(c);
  pthread_mutex_unlock(&c->lock);
  gpr_free(path);
  if (done) call_free(c);
}

/* on_cancel is due once: a stream whose owner still holds it ended early, and no
 * handler or other callback is running. */
static int take_cancel_notice_locked(call_t *c) {
  if (!c->cancel_fn || c->cancel_notified || !c->cancelled || !c->owner_holds || c->pins > 0) {
    return 0;
  }
  c->cancel_notified = 1;
  c->pins++;
  return 1;
}

/* Ends a critical section of an event: takes the cancel notice if one is due, else
 * settles; unlocks; then runs on_cancel (pinned) or frees c as decided. The decision is
 * made before unlocking: once the lock is dropped another thread may free c. */
static void unlock_and_advance(call_t *c) {
  int notify = take_cancel_notice_locked(c);
  int done = notify ? 0 : settle_locked(c);
  ina_rpc_cancel_fn fn = c->cancel_fn;
  void *ctx = c->cancel_ctx;
  pthread_mutex_unlock(&c->lock);
  if (notify) {
    fn(ctx, c); /* may call finish: the pin keeps c alive */
    pthread_mutex_lock(&c->lock);
    c->pins--;
    done = settle_locked(c);
    pthread_mutex_unlock(&c->lock);
  }
  if (done) call_free(c);
}

static void run_handler(call_t *c) {
  grpc_byte_buffer_reader reader;
  grpc_slice flat = grpc_empty_slice();
  if (grpc_byte_buffer_reader_init(&reader, c->request)) {
    flat = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
  }
  char *peer = grpc_call_get_peer(c->call);
  ina_rpc_request_t req = {
      .method = c->method->path,
      .peer = peer ? peer : "",
      .bytes = GRPC_SLICE_LENGTH(flat) ? GRPC_SLICE_START_PTR(flat) : NULL,
      .size = GRPC_SLICE_LENGTH(flat),
  };
  if (c->method->unary) {
    ina_rpc_reply_t reply;
    memset(&reply, 0, sizeof reply);
    ina_rpc_code_t code = c->method->unary(c->method->ctx, &req, &reply);
    reply.message[sizeof reply.message - 1] = '\0';
    pthread_mutex_lock(&c->lock);
    if (c->cancelled || c->closed) {
      free(reply.bytes);
    } else if (code == INA_RPC_OK) {
      grpc_byte_buffer *bb = byte_buffer_from_malloc(reply.bytes, reply.size);
      if (!enqueue_locked(c, bb)) {
        grpc_byte_buffer_destroy(bb);
        code = INA_RPC_RESOURCE_EXHAUSTED;
        snprintf(reply.message, sizeof reply.message, "%s: out of memory queueing the reply",
                 req.method);
      }
      reply_status_locked(c, code, code == INA_RPC_OK ? NULL : reply.message);
    } else {
      free(reply.bytes);
      reply_status_locked(c, code, reply.message);
    }
    c->pins--;
    unlock_and_advance(c);
  } else {
    c->method->stream(c->method->ctx, &req, c);
    pthread_mutex_lock(&c->lock);
    c->pins--;
    unlock_and_advance(c);
  }
  gpr_free(peer);
  grpc_slice_unref(flat);
}

static void on_recv(call_t *c, int ok) {
  pthread_mutex_lock(&c->lock);
  c->batches_in_flight--;
  if (!ok || c->cancelled || c->closed) {
    int done = settle_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (done) call_free(c);
    return;
  }
  if (!c->request) { /* the client half-closed without sending a message */
    char msg[INA_RPC_MESSAGE_MAX];
    snprintf(msg, sizeof msg, "%s: no request message", c->method->path);
    reply_status_locked(c, INA_RPC_INVALID_ARGUMENT, msg);
    int done = settle_locked(c);
    pthread_mutex_unlock(&c->lock);
    if (done) call_free(c);
    return;
  }
  c->pins++;
  if (c->method->stream) c->owner_holds = 1; /* set before the handler can finish */
  pthread_mutex_unlock(&c->lock);
  run_handler(c); /* c may be freed when it returns */
}

static void on_close(call_t *c, int ok) {
  pthread_mutex_lock(&c->lock);
  c->batches_in_flight--;
  c->closed = 1;
  if (!ok || c->close_cancelled) mark_cancelled_locked(c);
  unlock_and_advance(c);
}

static void on_send(call_t *c, int ok) {
  pthread_mutex_lock(&c->lock);
  c->batches_in_flight--;
  c->send_in_flight = 0;
  if (c->sending) {
    grpc_byte_buffer_destroy(c->sending);
    c->sending = NULL;
  }
  if (ok) {
    pump_locked(c);
  } else {
    mark_cancelled_locked(c);
  }
  unlock_and_advance(c);
}

void rpc_call_on_event(rpc_tag_t *tag, int ok) {
  switch (tag->kind) {
    case RPC_TAG_NEW_CALL: on_new_call(tag->call, ok); break;
    case RPC_TAG_RECV: on_recv(tag->call, ok); break;
    case RPC_TAG_CLOSE: on_close(tag->call, ok); break;
    case RPC_TAG_SEND: on_send(tag->call, ok); break;
    case RPC_TAG_SHUTDOWN: break; /* handled by the server */
  }
}

/* ---- the writer: a stream owner's view of its call ---- */

ina_status_t ina_rpc_writer_write(ina_rpc_writer_t *writer, const void *bytes, size_t size) {
  ina_status_t st = INA_OK;
  call_t *c = writer;
  uint8_t *copy = NULL;
  INA_REQUIRE(c && (bytes || size == 0), INA_ERR_INVALID_ARGUMENT,
              "rpc writer: write: writer is NULL or bytes NULL with size %zu", size);
  if (size > 0) {
    copy = malloc(size);
    INA_CHECK_ALLOC(copy);
    memcpy(copy, bytes, size);
  }
  grpc_byte_buffer *bb = byte_buffer_from_malloc(copy, size);
  enum { QUEUED, AFTER_FINISH, ENDED, NO_MEMORY } outcome;
  pthread_mutex_lock(&c->lock);
  if (!c->owner_holds || c->finish_requested) {
    outcome = AFTER_FINISH;
  } else if (c->cancelled || c->closed) {
    outcome = ENDED;
  } else if (!enqueue_locked(c, bb)) {
    outcome = NO_MEMORY;
  } else {
    outcome = QUEUED;
    bb = NULL;
    pump_locked(c);
  }
  pthread_mutex_unlock(&c->lock);
  if (bb) grpc_byte_buffer_destroy(bb);
  if (outcome == ENDED) return INA_ERR_IO; /* normal at the end of a stream: not logged */
  INA_REQUIRE(outcome != AFTER_FINISH, INA_ERR_INVALID_ARGUMENT,
              "rpc writer %s: write after finish", c->method->path);
  INA_REQUIRE(outcome != NO_MEMORY, INA_ERR_OUT_OF_MEMORY,
              "rpc writer %s: out of memory queueing a message", c->method->path);
  return INA_OK;
fail:
  return st;
}

void ina_rpc_writer_finish(ina_rpc_writer_t *writer, ina_rpc_code_t code, const char *message) {
  call_t *c = writer;
  if (!c) return;
  pthread_mutex_lock(&c->lock);
  if (!c->owner_holds) {
    pthread_mutex_unlock(&c->lock);
    INA_LOG_E(INA_LOG_SUBSYS, "rpc writer %s: finish called twice", c->method->path);
    return;
  }
  c->owner_holds = 0;
  if (!c->cancelled && !c->closed) reply_status_locked(c, code, message);
  int done = settle_locked(c);
  pthread_mutex_unlock(&c->lock);
  if (done) call_free(c);
}

int ina_rpc_writer_cancelled(ina_rpc_writer_t *writer) {
  if (!writer) return 1;
  pthread_mutex_lock(&writer->lock);
  int cancelled = writer->cancelled || (writer->closed && !writer->status_started);
  pthread_mutex_unlock(&writer->lock);
  return cancelled;
}

size_t ina_rpc_writer_pending(ina_rpc_writer_t *writer) {
  if (!writer) return 0;
  pthread_mutex_lock(&writer->lock);
  size_t n = writer->queued;
  pthread_mutex_unlock(&writer->lock);
  return n;
}

void ina_rpc_writer_on_cancel(ina_rpc_writer_t *writer, ina_rpc_cancel_fn fn, void *ctx) {
  if (!writer) return;
  pthread_mutex_lock(&writer->lock);
  writer->cancel_fn = fn;
  writer->cancel_ctx = ctx;
  pthread_mutex_unlock(&writer->lock);
}
