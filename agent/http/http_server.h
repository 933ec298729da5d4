/* A small HTTP/1.1 server for the agent's OpenAI-compatible API, on libmicrohttpd: one
 * handler for every request, whole bodies handed over (up to max_body_bytes), answers
 * either whole or streamed (server-sent events), TLS from PEM files, and a way to tell
 * that a client went away while its answer is being computed.
 *
 * Threads: one thread per connection (MHD_USE_THREAD_PER_CONNECTION), so a handler may
 * block until its answer is ready (a non-streamed completion), and a stream's read
 * function may block for a while on its producer. The handler and a stream's functions
 * run on the connection's thread.
 *
 * Request: method, path (percent-decoded, without the query string), headers, body.
 * A body over max_body_bytes is not read past the limit: the request is answered 413
 * without calling the handler.
 *
 * Streams: reply->stream's read is called for the next bytes until it says the stream
 * ended; between calls the server checks whether the client is still there, and when it
 * is not, the response ends (read is not called again). Then, whatever happened, done is
 * called exactly once, on the connection's thread, with completed = 1 when every byte
 * was sent, 0 when the client went away or the server stopped. Only after done may the
 * stream's context be freed.
 *
 * Ownership: start/stop pair; a failed start sets *out = NULL; stop(NULL) is a no-op.
 * A reply's body is malloc'ed by the handler and freed by the server. stop closes the
 * listener and every connection and joins their threads: streams see their clients go
 * away (done with completed = 0), and a handler blocked in a wait must notice
 * (ina_http_request_client_gone turns 1) and return. Thread safety: start and stop from
 * one thread; the request functions from the connection's thread during the handler or
 * a stream's calls. */
#ifndef INA_AGENT_HTTP_HTTP_SERVER_H
#define INA_AGENT_HTTP_HTTP_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_http_server ina_http_server_t;
typedef struct ina_http_request ina_http_request_t;

const char *ina_http_request_method(const ina_http_request_t *req);
const char *ina_http_request_path(const ina_http_request_t *req);
/* The body (NUL-terminated for convenience; len excludes the NUL). */
const char *ina_http_request_body(const ina_http_request_t *req, size_t *len);
/* A request header's value (case-insensitive name), NULL when absent. */
const char *ina_http_request_header(const ina_http_request_t *req, const char *name);
/* 1 when the client closed its side or the connection failed, or the server is
 * stopping: nobody will read an answer. Cheap (a poll of the socket); call it while
 * waiting. */
int ina_http_request_client_gone(const ina_http_request_t *req);

/* What read returns besides a byte count. */
#define INA_HTTP_STREAM_NOTHING_YET 0 /* nothing for now: call again (after a short wait inside) */
#define INA_HTTP_STREAM_END (-1)      /* every byte was delivered */

typedef struct ina_http_stream_ops {
  /* Copies up to max bytes of the answer into buf and returns how many (> 0), or one of
   * the values above. Should wait for its producer at most ~100 ms before returning
   * INA_HTTP_STREAM_NOTHING_YET, so that a client going away is noticed. */
  ssize_t (*read)(void *ctx, char *buf, size_t max);
  /* Once, when the response is over (see above). */
  void (*done)(void *ctx, int completed);
} ina_http_stream_ops_t;

typedef struct ina_http_reply {
  int status;               /* HTTP status */
  const char *content_type; /* static string */
  char *body;               /* malloc'ed, taken over by the server; NULL with a stream */
  size_t body_len;
  const char *header_name, *header_value; /* one extra header (static strings), or NULL */
  const ina_http_stream_ops_t *stream;    /* non-NULL: a streamed answer (body ignored) */
  void *stream_ctx;
} ina_http_reply_t;

/* Fills *reply (zeroed by the server beforehand). A handler that leaves status 0 gets a
 * 500. */
typedef void (*ina_http_handler_fn)(void *ctx, const ina_http_request_t *req, ina_http_reply_t *reply);

typedef struct ina_http_server_options {
  size_t struct_size; /* sizeof(ina_http_server_options_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  const char *address; /* numeric IPv4 or IPv6; NULL: "127.0.0.1" */
  int port;            /* 0..65535; 0: a free port (ina_http_server_port) */
  const char *tls_cert_file, *tls_key_file; /* PEM files; both NULL: plain HTTP */
  size_t max_body_bytes;  /* 0: 8 MiB */
  int connection_limit;   /* 0: 512 */
  int connection_timeout_s; /* idle connections are closed after this; 0: 300 */
} ina_http_server_options_t;

#define INA_HTTP_SERVER_OPTIONS_INIT {sizeof(ina_http_server_options_t), 1, NULL, 0, NULL, NULL, 0, 0, 0}

/* INA_ERR_INVALID_ARGUMENT for a bad address or port, INA_ERR_IO when it cannot listen or
 * read the TLS files (libmicrohttpd's reason in the message). */
ina_status_t ina_http_server_start(const ina_http_server_options_t *options, ina_http_handler_fn handler,
                                   void *handler_ctx, ina_http_server_t **out);
int ina_http_server_port(const ina_http_server_t *srv);
void ina_http_server_stop(ina_http_server_t *srv);

#ifdef __cplusplus
}
#endif
#endif
