/* The HTTP server of the OpenAI-compatible API, on libmicrohttpd (http_server.h). */
#define INA_LOG_SUBSYS "http"
#include "agent/http/http_server.h"

#include <microhttpd.h>
#include <poll.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "agent/http/listen_address.h"
#include "agent/rpc/pem_file.h"
#include "core/check.h"
#include "core/log.h"

#define DEFAULT_ADDRESS "127.0.0.1"
#define DEFAULT_MAX_BODY ((size_t)8 << 20)
#define DEFAULT_CONNECTION_LIMIT 512
#define DEFAULT_TIMEOUT_S 300
/* Bytes libmicrohttpd asks a stream for at a time. */
#define STREAM_BLOCK 4096

struct ina_http_server {
  struct MHD_Daemon *daemon;
  ina_http_handler_fn handler;
  void *handler_ctx;
  size_t max_body;
  int port;
  char *cert_pem, *key_pem;
  atomic_int stopping;
  atomic_int serving; /* libmicrohttpd's messages: warnings once serving, else start's reason */
  char mhd_message[256];
};

struct ina_http_request {
  ina_http_server_t *srv;
  struct MHD_Connection *conn;
  char method[16];
  char *path;
  char *body;
  size_t body_len, body_cap;
  int too_large;
  int answered; /* the handler ran (or a refusal was queued) */
  const ina_http_stream_ops_t *stream;
  void *stream_ctx;
  int stream_ended; /* read said INA_HTTP_STREAM_END */
};

/* ---- the request ---------------------------------------------------------------------- */

const char *ina_http_request_method(const ina_http_request_t *req) { return req->method; }
const char *ina_http_request_path(const ina_http_request_t *req) { return req->path; }

const char *ina_http_request_body(const ina_http_request_t *req, size_t *len) {
  if (len) *len = req->body_len;
  return req->body ? req->body : "";
}

const char *ina_http_request_header(const ina_http_request_t *req, const char *name) {
  return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

int ina_http_request_client_gone(const ina_http_request_t *req) {
  if (atomic_load(&req->srv->stopping)) return 1;
  const union MHD_ConnectionInfo *info = MHD_get_connection_info(req->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!info) return 1;
  /* A closed peer reads as POLLRDHUP (or POLLHUP); bytes of a pipelined next request
   * read as plain POLLIN and mean the client is still there. */
  struct pollfd p = {info->connect_fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return 0;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

static void request_free(ina_http_request_t *req) {
  if (!req) return;
  free(req->path);
  free(req->body);
  free(req);
}

/* ---- answers --------------------------------------------------------------------------- */

static enum MHD_Result queue_reply(struct MHD_Connection *conn, ina_http_reply_t *reply) {
  struct MHD_Response *resp = MHD_create_response_from_buffer_with_free_callback(
      reply->body_len, reply->body ? reply->body : (char *)"", reply->body ? free : NULL);
  if (!resp) {
    free(reply->body);
    return MHD_NO;
  }
  reply->body = NULL;
  enum MHD_Result ok = MHD_YES;
  if (reply->content_type) ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, reply->content_type);
  if (ok == MHD_YES && reply->header_name && reply->header_value)
    ok = MHD_add_response_header(resp, reply->header_name, reply->header_value);
  if (ok == MHD_YES) ok = MHD_queue_response(conn, (unsigned)reply->status, resp);
  MHD_destroy_response(resp);
  return ok;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  ina_http_request_t *req = cls;
  for (;;) {
    const ssize_t n = req->stream->read(req->stream_ctx, buf, max);
    if (n == INA_HTTP_STREAM_END) {
      req->stream_ended = 1;
      return MHD_CONTENT_READER_END_OF_STREAM;
    }
    /* Is anybody still listening? Asked with data too: a client that shut its side down
     * may leave the kernel's buffers taking bytes for a long time before a send fails. */
    if (ina_http_request_client_gone(req)) return MHD_CONTENT_READER_END_WITH_ERROR;
    if (n > 0) return n;
  }
}

static enum MHD_Result queue_stream(ina_http_request_t *req, ina_http_reply_t *reply) {
  req->stream = reply->stream;
  req->stream_ctx = reply->stream_ctx;
  struct MHD_Response *resp =
      MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_reader, req, NULL);
  if (!resp) return MHD_NO; /* done still runs at the request's end */
  enum MHD_Result ok = MHD_YES;
  if (reply->content_type) ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, reply->content_type);
  if (ok == MHD_YES) ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  if (ok == MHD_YES && reply->header_name && reply->header_value)
    ok = MHD_add_response_header(resp, reply->header_name, reply->header_value);
  if (ok == MHD_YES) ok = MHD_queue_response(req->conn, (unsigned)reply->status, resp);
  MHD_destroy_response(resp);
  return ok;
}

/* Called when the headers have arrived (*con_cls NULL), for every piece of the body, and
 * once more when the request is complete, where the answer is queued (a response queued
 * before the body is read would make libmicrohttpd close the connection). */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
  (void)version;
  ina_http_server_t *srv = cls;
  ina_http_request_t *req = *con_cls;
  if (!req) {
    req = calloc(1, sizeof *req);
    if (!req) return MHD_NO;
    req->srv = srv;
    req->conn = conn;
    snprintf(req->method, sizeof req->method, "%s", method);
    req->path = strdup(url);
    if (!req->path) {
      free(req);
      return MHD_NO;
    }
    *con_cls = req;
    return MHD_YES;
  }
  if (*upload_data_size != 0) {
    const size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (req->too_large || req->body_len + n > srv->max_body) {
      req->too_large = 1; /* read on and drop, to answer 413 at the end */
      return MHD_YES;
    }
    if (req->body_len + n + 1 > req->body_cap) {
      size_t cap = req->body_cap ? req->body_cap : 1024;
      while (cap < req->body_len + n + 1) cap *= 2;
      char *grown = realloc(req->body, cap);
      if (!grown) return MHD_NO;
      req->body = grown;
      req->body_cap = cap;
    }
    memcpy(req->body + req->body_len, upload_data, n);
    req->body_len += n;
    req->body[req->body_len] = '\0';
    return MHD_YES;
  }
  if (req->answered) return MHD_YES;
  req->answered = 1;
  ina_http_reply_t reply;
  memset(&reply, 0, sizeof reply);
  if (req->too_large) {
    char *text = malloc(160);
    if (text)
      snprintf(text, 160,
               "{\"error\": {\"message\": \"the request body is larger than the server's limit of %zu bytes\", "
               "\"type\": \"invalid_request_error\", \"param\": null, \"code\": \"413\"}}",
               srv->max_body);
    reply.status = MHD_HTTP_CONTENT_TOO_LARGE;
    reply.content_type = "application/json";
    reply.body = text;
    reply.body_len = text ? strlen(text) : 0;
    return queue_reply(conn, &reply);
  }
  srv->handler(srv->handler_ctx, req, &reply);
  if (reply.status == 0) {
    free(reply.body);
    memset(&reply, 0, sizeof reply);
    reply.status = MHD_HTTP_INTERNAL_SERVER_ERROR;
  }
  if (reply.stream) return queue_stream(req, &reply);
  return queue_reply(conn, &reply);
}

/* The request is over: sent, failed, or its client gone. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)conn;
  ina_http_request_t *req = *con_cls;
  if (!req) return;
  if (req->stream) req->stream->done(req->stream_ctx, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && req->stream_ended);
  request_free(req);
  *con_cls = NULL;
}

/* libmicrohttpd's diagnostics go to ina's log, without their trailing newline. */
static void log_from_mhd(void *cls, const char *fmt, va_list ap) {
  ina_http_server_t *srv = cls;
  char line[sizeof srv->mhd_message];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
  /* A stream ended because its client went away is routine, not a warning. */
  const int routine = strstr(line, "application error generating response") != NULL;
  if (atomic_load(&srv->serving) && !routine) {
    INA_LOG_W(INA_LOG_SUBSYS, "libmicrohttpd: %s", line);
  } else {
    memcpy(srv->mhd_message, line, n + 1);
    INA_LOG_D(INA_LOG_SUBSYS, "libmicrohttpd: %s", line);
  }
}

ina_status_t ina_http_server_start(const ina_http_server_options_t *options, ina_http_handler_fn handler,
                                   void *handler_ctx, ina_http_server_t **out) {
  ina_status_t st = INA_OK;
  ina_http_server_t *srv = NULL;
  const ina_http_server_options_t defaults = INA_HTTP_SERVER_OPTIONS_INIT;
  INA_REQUIRE(out != NULL && handler != NULL, INA_ERR_INVALID_ARGUMENT, "http server: NULL argument");
  *out = NULL;
  if (!options) options = &defaults;
  INA_REQUIRE_VERSIONED(options, sizeof(ina_http_server_options_t), "ina_http_server_options_t",
                        "INA_HTTP_SERVER_OPTIONS_INIT");
  const char *address = options->address ? options->address : DEFAULT_ADDRESS;
  INA_REQUIRE(!options->tls_cert_file == !options->tls_key_file, INA_ERR_INVALID_ARGUMENT,
              "http server: TLS needs both a certificate and a key file");

  struct sockaddr_storage sa;
  int ipv6 = 0;
  INA_CHECK(ina_listen_sockaddr("http server", address, options->port, &sa, &ipv6));
  unsigned int flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC |
                       MHD_USE_ERROR_LOG | (ipv6 ? MHD_USE_IPv6 : 0);
  srv = calloc(1, sizeof *srv);
  INA_CHECK_ALLOC(srv);
  srv->handler = handler;
  srv->handler_ctx = handler_ctx;
  srv->max_body = options->max_body_bytes ? options->max_body_bytes : DEFAULT_MAX_BODY;
  if (options->tls_cert_file) {
    INA_CHECK(rpc_read_pem_file("HTTP certificate", options->tls_cert_file, &srv->cert_pem));
    INA_CHECK(rpc_read_pem_file("HTTP private key", options->tls_key_file, &srv->key_pem));
    INA_CHECK(rpc_check_key_pair("http server", srv->cert_pem, options->tls_cert_file, srv->key_pem,
                                 options->tls_key_file));
    flags |= MHD_USE_TLS;
  }
  const unsigned limit = (unsigned)(options->connection_limit > 0 ? options->connection_limit : DEFAULT_CONNECTION_LIMIT);
  const unsigned timeout = (unsigned)(options->connection_timeout_s > 0 ? options->connection_timeout_s : DEFAULT_TIMEOUT_S);
  if (srv->cert_pem) {
    srv->daemon = MHD_start_daemon(flags, (uint16_t)options->port, NULL, NULL, on_request, srv,
                                   MHD_OPTION_EXTERNAL_LOGGER, log_from_mhd, srv,
                                   MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                   MHD_OPTION_CONNECTION_LIMIT, limit,
                                   MHD_OPTION_CONNECTION_TIMEOUT, timeout,
                                   MHD_OPTION_HTTPS_MEM_CERT, srv->cert_pem,
                                   MHD_OPTION_HTTPS_MEM_KEY, srv->key_pem, MHD_OPTION_END);
  } else {
    srv->daemon = MHD_start_daemon(flags, (uint16_t)options->port, NULL, NULL, on_request, srv,
                                   MHD_OPTION_EXTERNAL_LOGGER, log_from_mhd, srv,
                                   MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                                   MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                   MHD_OPTION_CONNECTION_LIMIT, limit,
                                   MHD_OPTION_CONNECTION_TIMEOUT, timeout, MHD_OPTION_END);
  }
  INA_REQUIRE(srv->daemon != NULL, INA_ERR_IO, "http server: cannot listen on %s port %d: %s", address,
              options->port, srv->mhd_message[0] ? srv->mhd_message : "libmicrohttpd gave no reason");
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
  INA_REQUIRE(info != NULL && info->port != 0, INA_ERR_INTERNAL,
              "http server: listening on %s but libmicrohttpd does not report the port", address);
  srv->port = info->port;
  atomic_store(&srv->serving, 1);
  INA_LOG_I(INA_LOG_SUBSYS, "serving HTTP%s on %s port %d", srv->cert_pem ? "S" : "", address, srv->port);
  *out = srv;
  return INA_OK;
fail:
  ina_http_server_stop(srv);
  return st;
}

int ina_http_server_port(const ina_http_server_t *srv) { return srv ? srv->port : 0; }

void ina_http_server_stop(ina_http_server_t *srv) {
  if (!srv) return;
  /* Handlers waiting for answers see their clients gone and return; then the daemon
   * closes every connection and joins their threads. */
  atomic_store(&srv->stopping, 1);
  if (srv->daemon) MHD_stop_daemon(srv->daemon);
  free(srv->cert_pem);
  free(srv->key_pem);
  free(srv);
}
