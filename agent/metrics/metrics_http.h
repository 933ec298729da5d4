/* The HTTP endpoint Prometheus scrapes: GET /metrics answers 200 with the registry's
 * rendering (agent/metrics/metrics.h) and "Content-Type: text/plain; version=0.0.4".
 * HEAD /metrics answers the same headers without the body (HTTP requires HEAD wherever
 * GET is served); any other method on /metrics is 405 with "Allow: GET, HEAD"; any other
 * path is 404, whatever the method. Query strings are ignored.
 *
 * Built on libmicrohttpd with its own internal polling thread
 * (MHD_USE_INTERNAL_POLLING_THREAD): requests are served on that thread, one at a time,
 * each rendering the registry afresh. Idle connections are closed after
 * connection_timeout_s.
 *
 * Ownership: start/stop pair; the registry is borrowed and must outlive the server. A
 * failed start sets *out = NULL; stop(NULL) is a no-op. stop closes the listener and
 * every open connection (including clients in the middle of a request), joins the
 * thread and frees the server; it does not wait for clients.
 * Thread safety: start and stop from one thread (not from a request); port from any
 * thread. */
#ifndef INA_AGENT_METRICS_METRICS_HTTP_H
#define INA_AGENT_METRICS_METRICS_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "agent/metrics/metrics.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_metrics_http ina_metrics_http_t;

typedef struct ina_metrics_http_options {
  size_t struct_size; /* sizeof(ina_metrics_http_options_t), set by the INIT macro */
  uint32_t version;
  /* Numeric IPv4 or IPv6 address to listen on; NULL: "127.0.0.1" (loopback only). Use
   * "0.0.0.0" or "::" to be reachable from other hosts. */
  const char *address;
  /* TCP port, 0..65535; 0: a free port chosen by the kernel (ina_metrics_http_port
   * tells which). */
  int port;
  /* Seconds after which an idle connection is closed; <= 0: 10. */
  int connection_timeout_s;
} ina_metrics_http_options_t;

#define INA_METRICS_HTTP_OPTIONS_INIT {sizeof(ina_metrics_http_options_t), 1, NULL, 0, 0}

/* Binds the listener and starts serving `reg`. options may be NULL (all defaults). A bad
 * address or port is INA_ERR_INVALID_ARGUMENT; a failure to listen (port taken) is
 * INA_ERR_IO, with libmicrohttpd's reason in the message. */
ina_status_t ina_metrics_http_start(ina_metrics_t *reg, const ina_metrics_http_options_t *options,
                                    ina_metrics_http_t **out);

/* The port the listener is bound to (the kernel's choice for port 0). */
int ina_metrics_http_port(const ina_metrics_http_t *srv);

/* Stops serving and frees the server (see above). */
void ina_metrics_http_stop(ina_metrics_http_t *srv);

/* One request's answer, as the server sends it. */
typedef struct ina_metrics_http_reply {
  unsigned int code;        /* 200, 404, 405; 500 when rendering the registry failed */
  const char *content_type; /* static: "text/plain; version=0.0.4" for 200, else plain text */
  const char *allow;        /* static "GET, HEAD" with 405, else NULL */
  char *body;               /* NUL-terminated, malloc'ed, owned by the reply */
  size_t body_len;          /* strlen(body) */
} ina_metrics_http_reply_t;

/* What the server answers to `method` on `url` (the request path as libmicrohttpd hands
 * it over: percent-decoded, the query string cut off), rendering `reg` for a 200. Every
 * request the server takes goes through here, so tests and fuzzers can check the answers
 * without a socket. INA_OK with *out filled (release it); INA_ERR_INVALID_ARGUMENT for a
 * NULL argument, INA_ERR_OUT_OF_MEMORY when no body could be allocated (then *out is
 * zeroed, and the server closes the connection). Thread safety: as ina_metrics_render. */
ina_status_t ina_metrics_http_answer(ina_metrics_t *reg, const char *method, const char *url,
                                     ina_metrics_http_reply_t *out);
/* Frees the body; NULL or an already released reply is a no-op. */
void ina_metrics_http_reply_release(ina_metrics_http_reply_t *reply);

#ifdef __cplusplus
}
#endif
#endif
