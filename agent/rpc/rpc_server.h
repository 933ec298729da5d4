/* A gRPC server on the gRPC C core, serving methods registered by full path
 * ("/ina.v1.Node/GetNodeInfo"). Messages travel as bytes: handlers decode requests and
 * encode responses themselves (protobuf-c; rpc/rpc_pb.h packs).
 *
 * Life cycle: ina_rpc_server_create (binds the listen address), ina_rpc_server_add_unary
 * / ina_rpc_server_add_stream for every method, ina_rpc_server_start, ...,
 * ina_rpc_server_destroy. A call to a path that was not registered ends with
 * UNIMPLEMENTED; a method registered with a bearer token refuses calls whose metadata
 * lacks "authorization: Bearer <token>" with UNAUTHENTICATED before reading the request.
 * A request larger than max_message_bytes ends with RESOURCE_EXHAUSTED (from gRPC).
 *
 * Threads: a fixed pool of completion-queue threads (num_threads) drives every call and
 * runs the handlers, so a handler that blocks holds up one of them; long work belongs on
 * the caller's own threads (a stream handler can hand its writer to one).
 *
 * Unary calls: the handler returns a status code and fills an ina_rpc_reply_t.
 *
 * Server-streaming calls: the handler receives an ina_rpc_writer_t and becomes its owner.
 * The owner may write messages and must call ina_rpc_writer_finish exactly once, from
 * the handler or later from any thread; writes are queued and sent one at a time in
 * order. When the call ends before the owner finished (client cancelled, deadline,
 * connection lost, server shutdown), writes fail, ina_rpc_writer_cancelled turns 1 and
 * the on_cancel callback (if set) runs once on a server thread; the owner still calls
 * finish, which then only releases the writer.
 *
 * Shutdown: ina_rpc_server_destroy stops accepting calls, cancels the calls in flight
 * (their on_cancel callbacks run), waits until every stream owner has called finish,
 * then frees everything and releases gRPC (grpc_init / grpc_shutdown are paired per
 * server).
 *
 * Ownership: create/destroy pair; a failed create sets *out = NULL; destroy(NULL) is a
 * no-op. Strings passed in are copied.
 * Thread safety: create, add_*, start and destroy from one thread, never from a handler
 * or callback (destroy waits for them); port and active_calls from any thread; writer
 * functions from any thread (one owner at a time). */
#ifndef INA_AGENT_RPC_RPC_SERVER_H
#define INA_AGENT_RPC_RPC_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "agent/rpc/rpc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_rpc_server ina_rpc_server_t;
typedef struct ina_rpc_writer ina_rpc_writer_t;

typedef struct ina_rpc_server_options {
  size_t struct_size;
  uint32_t version;
  /* "host:port" to listen on; NULL: "127.0.0.1:0" (loopback, a free port chosen by the
   * kernel; ina_rpc_server_port tells which). A port already taken, even by another
   * gRPC server, is an error (SO_REUSEPORT is off). */
  const char *listen_address;
  /* TLS: PEM files of the server certificate chain and its private key. Both NULL: an
   * insecure (plaintext) listener; one without the other is INVALID_ARGUMENT. */
  const char *tls_cert_file;
  const char *tls_key_file;
  /* Largest message received or sent, in bytes; <= 0: 4 MiB (gRPC's receive default). */
  int32_t max_message_bytes;
  /* Completion-queue threads; <= 0: 2. */
  int32_t num_threads;
} ina_rpc_server_options_t;

#define INA_RPC_SERVER_OPTIONS_INIT {sizeof(ina_rpc_server_options_t), 1, NULL, NULL, NULL, 0, 0}

/* What a handler sees of a call. All pointers are valid during the handler only. */
typedef struct ina_rpc_request {
  const char *method;   /* full path, "/ina.v1.Node/GetHealth" */
  const char *peer;     /* client address as gRPC reports it, e.g. "ipv4:127.0.0.1:50312" */
  const uint8_t *bytes; /* the request message; NULL when size is 0 */
  size_t size;
} ina_rpc_request_t;

/* A unary handler's answer. The server passes it zeroed. */
typedef struct ina_rpc_reply {
  /* The response message when the handler returns INA_RPC_OK: malloc'd by the handler
   * (e.g. ina_rpc_pack), freed by the server whatever the code. NULL with size 0 sends
   * an empty message. */
  uint8_t *bytes;
  size_t size;
  /* Status details sent with a non-OK code (ina_rpc_error formats it). */
  char message[INA_RPC_MESSAGE_MAX];
} ina_rpc_reply_t;

/* Runs on a server thread. A request that does not decode should get
 * INA_RPC_INVALID_ARGUMENT. */
typedef ina_rpc_code_t (*ina_rpc_unary_fn)(void *ctx, const ina_rpc_request_t *request,
                                           ina_rpc_reply_t *reply);

/* Runs on a server thread; the handler becomes the owner of `writer` (see above). */
typedef void (*ina_rpc_stream_fn)(void *ctx, const ina_rpc_request_t *request,
                                  ina_rpc_writer_t *writer);

/* Called once, on a server thread, when a stream ends before its owner finished, and
 * never while the stream handler is still running. It must not block; it may call
 * ina_rpc_writer_finish. */
typedef void (*ina_rpc_cancel_fn)(void *ctx, ina_rpc_writer_t *writer);

ina_status_t ina_rpc_server_create(const ina_rpc_server_options_t *options,
                                   ina_rpc_server_t **out);

/* Register a method before start. `path` is "/package.Service/Method"; registering a
 * path twice is INVALID_ARGUMENT. bearer_token NULL or "": no check. ctx is passed to
 * the handler and must outlive the server. */
ina_status_t ina_rpc_server_add_unary(ina_rpc_server_t *server, const char *path,
                                      ina_rpc_unary_fn fn, void *ctx, const char *bearer_token);
ina_status_t ina_rpc_server_add_stream(ina_rpc_server_t *server, const char *path,
                                       ina_rpc_stream_fn fn, void *ctx, const char *bearer_token);

/* Starts serving: the completion-queue threads and the listener. Once only. */
ina_status_t ina_rpc_server_start(ina_rpc_server_t *server);

/* The port the listener is bound to (the kernel's choice for port 0). */
int ina_rpc_server_port(const ina_rpc_server_t *server);

/* Calls accepted and not yet released (a stream counts until its owner finished and
 * gRPC is done with it). For tests and metrics. */
int64_t ina_rpc_server_active_calls(ina_rpc_server_t *server);

void ina_rpc_server_destroy(ina_rpc_server_t *server);

/* Queues one message (copied). INA_ERR_IO, logging nothing, when the call has already
 * ended (see ina_rpc_writer_cancelled); INA_ERR_INVALID_ARGUMENT after finish was
 * requested. bytes may be NULL when size is 0. */
ina_status_t ina_rpc_writer_write(ina_rpc_writer_t *writer, const void *bytes, size_t size);

/* Ends the stream with `code` and `message` (NULL: none) after the queued messages, and
 * gives the writer back: the owner must not use it afterwards. Exactly once per stream. */
void ina_rpc_writer_finish(ina_rpc_writer_t *writer, ina_rpc_code_t code, const char *message);

/* 1 once the call has ended without the stream's status being sent (cancelled by the
 * client, deadline, lost connection, server shutdown); 0 while it may still succeed. */
int ina_rpc_writer_cancelled(ina_rpc_writer_t *writer);

/* Messages queued and not yet handed to gRPC (the one in flight excluded): a producer
 * that outpaces the network can wait on it. */
size_t ina_rpc_writer_pending(ina_rpc_writer_t *writer);

/* Sets the cancellation callback; only from within the stream handler (before it
 * returns), so that no cancellation can be missed. fn NULL clears it. */
void ina_rpc_writer_on_cancel(ina_rpc_writer_t *writer, ina_rpc_cancel_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
