/* The /metrics endpoint on libmicrohttpd. */
#define INA_LOG_SUBSYS "metrics_http"
#include "agent/metrics/metrics_http.h"

#include <microhttpd.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "agent/http/listen_address.h"
#include "core/check.h"

#define DEFAULT_ADDRESS "127.0.0.1"
#define DEFAULT_CONNECTION_TIMEOUT_S 10
/* Prometheus scrapes with one connection; this only bounds what a misbehaving client
 * can hold open. */
#define CONNECTION_LIMIT 64

struct ina_metrics_http {
  ina_metrics_t *reg; /* borrowed */
  struct MHD_Daemon *daemon;
  int port;
  /* libmicrohttpd's latest message before serving began, quoted when start fails. */
  char mhd_message[256];
  /* Set once start has succeeded: from then on libmicrohttpd's messages are warnings;
   * before, they only feed start's error message. */
  atomic_int serving;
};

/* libmicrohttpd's diagnostics go to ina's log, without their trailing newline. */
static void log_from_mhd(void *cls, const char *fmt, va_list ap) {
  ina_metrics_http_t *srv = cls;
  char line[sizeof srv->mhd_message];
  vsnprintf(line, sizeof line, fmt, ap);
  size_t n = strlen(line);
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
  if (atomic_load(&srv->serving)) {
    INA_LOG_W(INA_LOG_SUBSYS, "libmicrohttpd: %s", line);
  } else {
    memcpy(srv->mhd_message, line, n + 1);
    INA_LOG_D(INA_LOG_SUBSYS, "libmicrohttpd: %s", line);
  }
}

#define TEXT_CONTENT_TYPE "text/plain; charset=utf-8"
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4"

/* A static text as an owned body. */
static ina_status_t reply_text(ina_metrics_http_reply_t *out, unsigned int code, const char *text,
                               const char *allow) {
  ina_status_t st = INA_OK;
  out->body = strdup(text);
  INA_CHECK_ALLOC(out->body);
  out->body_len = strlen(text);
  out->code = code;
  out->content_type = TEXT_CONTENT_TYPE;
  out->allow = allow;
fail:
  return st;
}

ina_status_t ina_metrics_http_answer(ina_metrics_t *reg, const char *method, const char *url,
                                     ina_metrics_http_reply_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_metrics_http_answer: out is NULL");
  memset(out, 0, sizeof *out);
  INA_REQUIRE(reg != NULL && method != NULL && url != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_metrics_http_answer: registry, method and url must not be NULL");
  if (strcmp(url, "/metrics") != 0) return reply_text(out, MHD_HTTP_NOT_FOUND, "not found\n", NULL);
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return reply_text(out, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n", "GET, HEAD");
  char *text = NULL;
  size_t len = 0;
  if (ina_metrics_render(reg, &text, &len) != INA_OK)
    return reply_text(out, MHD_HTTP_INTERNAL_SERVER_ERROR, "rendering the metrics failed\n",
                      NULL);
  out->code = MHD_HTTP_OK;
  out->content_type = METRICS_CONTENT_TYPE;
  out->body = text;
  out->body_len = len;
fail:
  return st;
}

void ina_metrics_http_reply_release(ina_metrics_http_reply_t *reply) {
  if (!reply) return;
  free(reply->body);
  memset(reply, 0, sizeof *reply);
}

/* Queues the reply; the response takes its body over and frees it once sent (HEAD gets
 * the same headers, Content-Length included, and libmicrohttpd leaves the body out). */
static enum MHD_Result send_reply(struct MHD_Connection *conn, ina_metrics_http_reply_t *reply) {
  struct MHD_Response *resp =
      MHD_create_response_from_buffer_with_free_callback(reply->body_len, reply->body, free);
  if (!resp) {
    ina_metrics_http_reply_release(reply);
    return MHD_NO;
  }
  reply->body = NULL;
  enum MHD_Result ok =
      MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, reply->content_type);
  if (ok == MHD_YES && reply->allow)
    ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, reply->allow);
  if (ok == MHD_YES) ok = MHD_queue_response(conn, reply->code, resp);
  MHD_destroy_response(resp);
  return ok;
}

/* Called when a request's headers have arrived, again for each piece of a body, and a
 * last time once the request is complete. The answer is queued on that last call: a
 * response queued earlier makes libmicrohttpd close the connection (it cannot tell
 * where the next request starts), which would defeat the keep-alive a scraper relies
 * on. A body, which no valid request here has, is read and discarded. */
static enum MHD_Result handle_request(void *cls, struct MHD_Connection *conn, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_data_size,
                                      void **con_cls) {
  static int request_seen; /* its address marks a request whose headers were seen */
  ina_metrics_http_t *srv = cls;
  if (*con_cls == NULL) {
    *con_cls = &request_seen;
    return MHD_YES;
  }
  if (*upload_data_size != 0) {
    *upload_data_size = 0;
    return MHD_YES;
  }
  ina_metrics_http_reply_t reply;
  if (ina_metrics_http_answer(srv->reg, method, url, &reply) != INA_OK) return MHD_NO;
  return send_reply(conn, &reply);
}

ina_status_t ina_metrics_http_start(ina_metrics_t *reg, const ina_metrics_http_options_t *options,
                                    ina_metrics_http_t **out) {
  ina_status_t st = INA_OK;
  ina_metrics_http_t *srv = NULL;
  const ina_metrics_http_options_t defaults = INA_METRICS_HTTP_OPTIONS_INIT;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_metrics_http_start: out is NULL");
  *out = NULL;
  INA_REQUIRE(reg != NULL, INA_ERR_INVALID_ARGUMENT, "ina_metrics_http_start: registry is NULL");
  if (!options) options = &defaults;
  INA_REQUIRE_VERSIONED(options, offsetof(ina_metrics_http_options_t, connection_timeout_s) +
                                     sizeof(int),
                        "ina_metrics_http_options_t", "INA_METRICS_HTTP_OPTIONS_INIT");
  const char *address = options->address ? options->address : DEFAULT_ADDRESS;
  unsigned timeout_s = options->connection_timeout_s > 0 ? (unsigned)options->connection_timeout_s
                                                          : DEFAULT_CONNECTION_TIMEOUT_S;

  struct sockaddr_storage sa;
  int ipv6 = 0;
  INA_CHECK(ina_listen_sockaddr("metrics http", address, options->port, &sa, &ipv6));
  unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC |
                       MHD_USE_ERROR_LOG | (ipv6 ? MHD_USE_IPv6 : 0);

  srv = calloc(1, sizeof *srv);
  INA_CHECK_ALLOC(srv);
  srv->reg = reg;
  srv->daemon = MHD_start_daemon(
      flags, (uint16_t)options->port, NULL, NULL, handle_request, srv,
      /* The logger goes first so that it also receives what the other options say. */
      MHD_OPTION_EXTERNAL_LOGGER, log_from_mhd, srv,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
      MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned int)CONNECTION_LIMIT,
      MHD_OPTION_END);
  INA_REQUIRE(srv->daemon != NULL, INA_ERR_IO, "metrics http: cannot listen on %s port %d: %s",
              address, options->port,
              srv->mhd_message[0] ? srv->mhd_message : "libmicrohttpd gave no reason");
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->daemon, MHD_DAEMON_INFO_BIND_PORT);
  INA_REQUIRE(info != NULL && info->port != 0, INA_ERR_INTERNAL,
              "metrics http: listening on %s but libmicrohttpd does not report the port",
              address);
  srv->port = info->port;
  atomic_store(&srv->serving, 1);
  INA_LOG_I(INA_LOG_SUBSYS, "serving /metrics on %s port %d", address, srv->port);
  *out = srv;
  return INA_OK;
fail:
  ina_metrics_http_stop(srv);
  return st;
}

int ina_metrics_http_port(const ina_metrics_http_t *srv) { return srv->port; }

void ina_metrics_http_stop(ina_metrics_http_t *srv) {
  if (!srv) return;
  if (srv->daemon) MHD_stop_daemon(srv->daemon);
  free(srv);
}
