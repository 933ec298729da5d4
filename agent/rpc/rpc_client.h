/* A small blocking gRPC client on the gRPC C core, for tests and the `ina` command line:
 * one channel to a target, unary calls and server-streaming calls with a callback per
 * message. Messages travel as bytes (rpc/rpc_pb.h packs protobuf-c messages).
 *
 * A call returns INA_OK when it ended with status OK; otherwise the error of
 * ina_rpc_code_to_status (the failure is recorded as the last error, with the method,
 * code name and status message) and *status, when given, holds the exact gRPC code and
 * message. Local failures (bad arguments, no memory) return their own error with
 * status->code INA_RPC_INTERNAL. Every call has a deadline unless asked otherwise.
 *
 * Ownership: create/destroy pair; a failed create sets *out = NULL; destroy(NULL) is a
 * no-op; strings in the options are copied. A unary response (*response) is malloc'd
 * and freed by the caller. grpc_init / grpc_shutdown are paired per client.
 * Thread safety: calls may run concurrently from any number of threads on one client
 * (each call has its own completion queue); create and destroy from one thread, with no
 * call running. */
#ifndef INA_AGENT_RPC_RPC_CLIENT_H
#define INA_AGENT_RPC_RPC_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "agent/rpc/rpc_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_rpc_client ina_rpc_client_t;

typedef struct ina_rpc_client_options {
  size_t struct_size;
  uint32_t version;
  /* "host:port" (any gRPC target name), required. */
  const char *target;
  /* 1: TLS, checking the server's certificate against tls_root_cert_file (a PEM file)
   * or, when that is NULL, gRPC's default roots. 0: plaintext. */
  int32_t tls;
  const char *tls_root_cert_file;
  /* Name the server certificate must carry when it differs from the target's host
   * (gRPC's ssl_target_name_override); NULL: the target's host. */
  const char *tls_target_name;
  /* Sent as "authorization: Bearer <token>" with every call; NULL or "": not sent. */
  const char *bearer_token;
  /* Deadline of a call that passes deadline_ms 0 (INIT: 10 s); <= 0 here: none. */
  int64_t default_deadline_ms;
  /* Largest message received or sent, in bytes; <= 0: 4 MiB. */
  int32_t max_message_bytes;
} ina_rpc_client_options_t;

#define INA_RPC_CLIENT_OPTIONS_INIT \
  {sizeof(ina_rpc_client_options_t), 1, NULL, 0, NULL, NULL, NULL, 10000, 0}

/* Creating a client does not connect; the first call does. */
ina_status_t ina_rpc_client_create(const ina_rpc_client_options_t *options,
                                   ina_rpc_client_t **out);
void ina_rpc_client_destroy(ina_rpc_client_t *client);

/* deadline_ms of a call: > 0 that many milliseconds from now; 0 the client's default;
 * < 0 none. `method` is the full path, "/ina.v1.Node/GetHealth"; request may be NULL
 * when request_size is 0; status may be NULL. On success *response (never NULL, even
 * for an empty message) and *response_size hold the reply; otherwise NULL and 0. */
ina_status_t ina_rpc_client_unary(ina_rpc_client_t *client, const char *method,
                                  const void *request, size_t request_size, int64_t deadline_ms,
                                  uint8_t **response, size_t *response_size,
                                  ina_rpc_status_t *status);

/* Called for each streamed message, on the calling thread; `bytes` is valid during the
 * call only (NULL when size is 0). Returning nonzero cancels the call, which then ends
 * with CANCELLED. */
typedef int (*ina_rpc_message_fn)(void *ctx, const uint8_t *bytes, size_t size);

/* Runs a server-streaming call to its end: returns after the server's status, a
 * cancellation by on_message, or the deadline. */
ina_status_t ina_rpc_client_stream(ina_rpc_client_t *client, const char *method,
                                   const void *request, size_t request_size, int64_t deadline_ms,
                                   ina_rpc_message_fn on_message, void *ctx,
                                   ina_rpc_status_t *status);

#ifdef __cplusplus
}
#endif
#endif
