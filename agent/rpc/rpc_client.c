#define INA_LOG_SUBSYS "rpc"
#include "agent/rpc/rpc_client.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "agent/rpc/pem_file.h"

/* Each call gets its own completion queue and waits on it for the tags of its batches:
 *   unary:  one batch with every op (send metadata, message, close; receive metadata,
 *           message, status)
 *   stream: a send batch, a status batch that completes when the call ends, and one
 *           receive-message batch at a time until the stream ends or is cancelled. */

#define DEFAULT_MAX_MESSAGE_BYTES (4 << 20)

#define CLIENT_OPTIONS_V1_SIZE \
  (offsetof(ina_rpc_client_options_t, max_message_bytes) + sizeof(int32_t))

struct ina_rpc_client {
  grpc_channel *channel;
  char *target;
  char *authorization; /* "Bearer <token>", or NULL */
  int64_t default_deadline_ms;
  int grpc_initialized;
};

enum { TAG_SEND = 1, TAG_STATUS = 2, TAG_MESSAGE = 4 };

/* One call in flight: its queue, and which tags have come back (and succeeded). */
typedef struct client_call {
  grpc_completion_queue *cq;
  grpc_call *call;
  unsigned done, ok;
  grpc_metadata auth;
  grpc_metadata_array initial_md, trailing_md;
  grpc_status_code code;
  grpc_slice details;
} client_call_t;

static void *tag_ptr(unsigned tag) { return (void *)(uintptr_t)tag; }

/* Waits until `tag` has come back; returns its success flag. */
static int wait_tag(client_call_t *cc, unsigned tag) {
  while (!(cc->done & tag)) {
    grpc_event ev = grpc_completion_queue_next(cc->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (ev.type != GRPC_OP_COMPLETE) return 0;
    unsigned t = (unsigned)(uintptr_t)ev.tag;
    cc->done |= t;
    if (ev.success) cc->ok |= t;
  }
  return (cc->ok & tag) != 0;
}

static gpr_timespec deadline_of(const ina_rpc_client_t *c, int64_t deadline_ms) {
  int64_t ms = deadline_ms == 0 ? c->default_deadline_ms : deadline_ms;
  if (ms <= 0) return gpr_inf_future(GPR_CLOCK_REALTIME);
  return gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static ina_status_t call_begin(ina_rpc_client_t *c, const char *method, int64_t deadline_ms,
                               client_call_t *cc) {
  ina_status_t st = INA_OK;
  memset(cc, 0, sizeof *cc);
  cc->auth.key = grpc_empty_slice();
  cc->auth.value = grpc_empty_slice();
  grpc_metadata_array_init(&cc->initial_md);
  grpc_metadata_array_init(&cc->trailing_md);
  cc->details = grpc_empty_slice();
  cc->code = GRPC_STATUS_UNKNOWN;
  cc->cq = grpc_completion_queue_create_for_next(NULL);
  INA_REQUIRE(cc->cq, INA_ERR_INTERNAL, "rpc client %s: cannot create a completion queue", method);
  grpc_slice method_slice = grpc_slice_from_copied_string(method);
  cc->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cc->cq,
                                      method_slice, NULL, deadline_of(c, deadline_ms), NULL);
  grpc_slice_unref(method_slice);
  INA_REQUIRE(cc->call, INA_ERR_INTERNAL, "rpc client %s: cannot create the call", method);
  if (c->authorization) {
    cc->auth.key = grpc_slice_from_copied_string("authorization");
    cc->auth.value = grpc_slice_from_copied_string(c->authorization);
  }
fail:
  return st;
}

static void call_end(client_call_t *cc) {
  if (cc->call) grpc_call_unref(cc->call);
  if (cc->cq) {
    grpc_completion_queue_shutdown(cc->cq);
    while (grpc_completion_queue_next(cc->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cc->cq);
  }
  grpc_metadata_array_destroy(&cc->initial_md);
  grpc_metadata_array_destroy(&cc->trailing_md);
  grpc_slice_unref(cc->details);
  grpc_slice_unref(cc->auth.key);
  grpc_slice_unref(cc->auth.value);
}

/* The ops that open a call: metadata (with the token), the request, half-close. */
static size_t fill_send_ops(const ina_rpc_client_t *c, client_call_t *cc,
                            grpc_byte_buffer *request, grpc_op *ops) {
  size_t n = 0;
  ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[n].data.send_initial_metadata.count = c->authorization ? 1 : 0;
  ops[n].data.send_initial_metadata.metadata = c->authorization ? &cc->auth : NULL;
  n++;
  ops[n].op = GRPC_OP_SEND_MESSAGE;
  ops[n].data.send_message.send_message = request;
  n++;
  ops[n].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  n++;
  ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[n].data.recv_initial_metadata.recv_initial_metadata = &cc->initial_md;
  n++;
  return n;
}

static void fill_status_op(client_call_t *cc, grpc_op *op) {
  op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op->data.recv_status_on_client.trailing_metadata = &cc->trailing_md;
  op->data.recv_status_on_client.status = &cc->code;
  op->data.recv_status_on_client.status_details = &cc->details;
}

static grpc_byte_buffer *request_buffer(const void *request, size_t size) {
  grpc_slice slice = size ? grpc_slice_from_copied_buffer(request, size) : grpc_empty_slice();
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
  grpc_slice_unref(slice);
  return bb;
}

/* Copies a received message into one flat slice (the caller unrefs it). */
static grpc_slice flatten(grpc_byte_buffer *bb) {
  grpc_byte_buffer_reader reader;
  grpc_slice flat = grpc_empty_slice();
  if (bb && grpc_byte_buffer_reader_init(&reader, bb)) {
    flat = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
  }
  return flat;
}

/* Turns the call's final status into the return value and *status. */
static ina_status_t finish_status(const ina_rpc_client_t *c, const char *method,
                                  const client_call_t *cc, ina_rpc_status_t *status) {
  ina_rpc_status_t local;
  if (!status) status = &local;
  status->code = (ina_rpc_code_t)cc->code;
  size_t n = GRPC_SLICE_LENGTH(cc->details);
  if (n >= sizeof status->message) n = sizeof status->message - 1;
  memcpy(status->message, GRPC_SLICE_START_PTR(cc->details), n);
  status->message[n] = '\0';
  if (status->code == INA_RPC_OK) return INA_OK;
  ina_error(INA_LOG_SUBSYS, "rpc client %s %s: %s: %s", c->target, method,
            ina_rpc_code_name(status->code), status->message);
  return ina_rpc_code_to_status(status->code);
}

/* A call that failed on this side before or after gRPC answered. */
static void set_local_failure(ina_rpc_status_t *status, ina_status_t st) {
  if (!status) return;
  status->code = INA_RPC_INTERNAL;
  snprintf(status->message, sizeof status->message, "local failure (%s): %s",
           ina_status_string(st), ina_last_error());
}

ina_status_t ina_rpc_client_create(const ina_rpc_client_options_t *options,
                                   ina_rpc_client_t **out) {
  ina_status_t st = INA_OK;
  ina_rpc_client_t *c = NULL;
  grpc_channel_credentials *creds = NULL;
  char *roots = NULL;
  INA_REQUIRE(out, INA_ERR_INVALID_ARGUMENT, "rpc client: out is NULL");
  *out = NULL;
  INA_REQUIRE_VERSIONED(options, CLIENT_OPTIONS_V1_SIZE, "rpc client options",
                        "INA_RPC_CLIENT_OPTIONS_INIT");
  INA_REQUIRE(options->target && options->target[0], INA_ERR_INVALID_ARGUMENT,
              "rpc client: no target");
  INA_REQUIRE(options->tls || !options->tls_root_cert_file, INA_ERR_INVALID_ARGUMENT,
              "rpc client %s: a TLS root certificate ('%s') without tls = 1", options->target,
              options->tls_root_cert_file);
  c = calloc(1, sizeof *c);
  INA_CHECK_ALLOC(c);
  c->target = strdup(options->target);
  INA_CHECK_ALLOC(c->target);
  c->default_deadline_ms = options->default_deadline_ms;
  if (options->bearer_token && options->bearer_token[0]) {
    size_t n = strlen(options->bearer_token) + sizeof "Bearer ";
    c->authorization = malloc(n);
    INA_CHECK_ALLOC(c->authorization);
    snprintf(c->authorization, n, "Bearer %s", options->bearer_token);
  }
  grpc_init();
  c->grpc_initialized = 1;

  if (options->tls) {
    if (options->tls_root_cert_file) {
      INA_CHECK(rpc_read_pem_file("rpc client: TLS root certificate", options->tls_root_cert_file,
                                  &roots));
    }
    creds = grpc_ssl_credentials_create(roots, NULL, NULL, NULL);
  } else {
    creds = grpc_insecure_credentials_create();
  }
  INA_REQUIRE(creds, INA_ERR_FORMAT, "rpc client %s: cannot create %s credentials",
              options->target, options->tls ? "TLS" : "insecure");
  int max_bytes = options->max_message_bytes > 0 ? options->max_message_bytes
                                                 : DEFAULT_MAX_MESSAGE_BYTES;
  /* A server that went away and came back (a restarted agent) is reached again within
   * a second: gRPC's default reconnect backoff grows to two minutes, during which every
   * call fails at once. */
  grpc_arg args[5] = {
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
       .value.integer = max_bytes},
      {.type = GRPC_ARG_INTEGER,
       .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
       .value.integer = max_bytes},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, .value.integer = 100},
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 1000},
      {.type = GRPC_ARG_STRING, .key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG,
       .value.string = (char *)options->tls_target_name},
  };
  grpc_channel_args channel_args = {options->tls && options->tls_target_name ? 5 : 4, args};
  c->channel = grpc_channel_create(options->target, creds, &channel_args);
  INA_REQUIRE(c->channel, INA_ERR_INTERNAL, "rpc client %s: cannot create the channel",
              options->target);
  grpc_channel_credentials_release(creds);
  free(roots);
  *out = c;
  return INA_OK;
fail:
  if (creds) grpc_channel_credentials_release(creds);
  free(roots);
  ina_rpc_client_destroy(c);
  return st;
}

void ina_rpc_client_destroy(ina_rpc_client_t *client) {
  if (!client) return;
  if (client->channel) grpc_channel_destroy(client->channel);
  if (client->grpc_initialized) grpc_shutdown();
  free(client->target);
  free(client->authorization);
  free(client);
}

ina_status_t ina_rpc_client_unary(ina_rpc_client_t *client, const char *method,
                                  const void *request, size_t request_size, int64_t deadline_ms,
                                  uint8_t **response, size_t *response_size,
                                  ina_rpc_status_t *status) {
  ina_status_t st = INA_OK;
  client_call_t cc;
  int begun = 0, answered = 0;
  grpc_byte_buffer *req = NULL, *resp = NULL;
  grpc_slice flat = grpc_empty_slice();
  if (response) *response = NULL;
  if (response_size) *response_size = 0;
  INA_REQUIRE(client && method && response && response_size && (request || request_size == 0),
              INA_ERR_INVALID_ARGUMENT,
              "rpc client: unary %s: client, method, response and response_size are required",
              method ? method : "(null)");
  begun = 1; /* call_begin leaves cc fit for call_end even when it fails */
  INA_CHECK(call_begin(client, method, deadline_ms, &cc));
  req = request_buffer(request, request_size);
  grpc_op ops[6];
  memset(ops, 0, sizeof ops);
  size_t n = fill_send_ops(client, &cc, req, ops);
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n].data.recv_message.recv_message = &resp;
  n++;
  fill_status_op(&cc, &ops[n++]);
  grpc_call_error err = grpc_call_start_batch(cc.call, ops, n, tag_ptr(TAG_SEND), NULL);
  INA_REQUIRE(err == GRPC_CALL_OK, INA_ERR_INTERNAL, "rpc client %s %s: start_batch: %s",
              client->target, method, grpc_call_error_to_string(err));
  wait_tag(&cc, TAG_SEND); /* a failed batch still fills the status */
  answered = 1;
  st = finish_status(client, method, &cc, status);
  if (st != INA_OK) goto fail;
  flat = flatten(resp);
  size_t size = GRPC_SLICE_LENGTH(flat);
  *response = malloc(size ? size : 1);
  INA_CHECK_ALLOC(*response);
  if (size) memcpy(*response, GRPC_SLICE_START_PTR(flat), size);
  *response_size = size;
fail:
  if (st != INA_OK && !answered) set_local_failure(status, st);
  if (st != INA_OK && response && *response) {
    free(*response);
    *response = NULL;
  }
  grpc_slice_unref(flat);
  if (req) grpc_byte_buffer_destroy(req);
  if (resp) grpc_byte_buffer_destroy(resp);
  if (begun) call_end(&cc);
  return st;
}

ina_status_t ina_rpc_client_stream(ina_rpc_client_t *client, const char *method,
                                   const void *request, size_t request_size, int64_t deadline_ms,
                                   ina_rpc_message_fn on_message, void *ctx,
                                   ina_rpc_status_t *status) {
  ina_status_t st = INA_OK;
  client_call_t cc;
  int begun = 0, answered = 0;
  grpc_byte_buffer *req = NULL, *msg = NULL;
  INA_REQUIRE(client && method && on_message && (request || request_size == 0),
              INA_ERR_INVALID_ARGUMENT,
              "rpc client: stream %s: client, method and on_message are required",
              method ? method : "(null)");
  begun = 1; /* call_begin leaves cc fit for call_end even when it fails */
  INA_CHECK(call_begin(client, method, deadline_ms, &cc));
  req = request_buffer(request, request_size);
  grpc_op ops[4];
  memset(ops, 0, sizeof ops);
  size_t n = fill_send_ops(client, &cc, req, ops);
  grpc_call_error err = grpc_call_start_batch(cc.call, ops, n, tag_ptr(TAG_SEND), NULL);
  INA_REQUIRE(err == GRPC_CALL_OK, INA_ERR_INTERNAL, "rpc client %s %s: start_batch: %s",
              client->target, method, grpc_call_error_to_string(err));
  memset(ops, 0, sizeof ops);
  fill_status_op(&cc, &ops[0]);
  err = grpc_call_start_batch(cc.call, ops, 1, tag_ptr(TAG_STATUS), NULL);
  INA_REQUIRE(err == GRPC_CALL_OK, INA_ERR_INTERNAL, "rpc client %s %s: start_batch: %s",
              client->target, method, grpc_call_error_to_string(err));

  for (;;) {
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_MESSAGE;
    ops[0].data.recv_message.recv_message = &msg;
    cc.done &= ~(unsigned)TAG_MESSAGE;
    cc.ok &= ~(unsigned)TAG_MESSAGE;
    err = grpc_call_start_batch(cc.call, ops, 1, tag_ptr(TAG_MESSAGE), NULL);
    if (err != GRPC_CALL_OK) {
      grpc_call_cancel(cc.call, NULL);
      break;
    }
    if (!wait_tag(&cc, TAG_MESSAGE) || !msg) break; /* end of stream or call failed */
    grpc_slice flat = flatten(msg);
    grpc_byte_buffer_destroy(msg);
    msg = NULL;
    size_t size = GRPC_SLICE_LENGTH(flat);
    int stop = on_message(ctx, size ? GRPC_SLICE_START_PTR(flat) : NULL, size);
    grpc_slice_unref(flat);
    if (stop) {
      grpc_call_cancel(cc.call, NULL);
      break;
    }
  }
  wait_tag(&cc, TAG_SEND);
  wait_tag(&cc, TAG_STATUS);
  answered = 1;
  st = finish_status(client, method, &cc, status);
fail:
  if (st != INA_OK && !answered) set_local_failure(status, st);
  if (req) grpc_byte_buffer_destroy(req);
  if (msg) grpc_byte_buffer_destroy(msg);
  if (begun) {
    /* Batches already started must come back before the queue goes away. */
    if (cc.call) grpc_call_cancel(cc.call, NULL);
    call_end(&cc);
  }
  return st;
}
