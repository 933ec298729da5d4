/* The /metrics endpoint over loopback, with a plain socket client: GET answers 200 with
 * the rendering and the 0.0.4 content type, HEAD the headers only, other paths 404,
 * other methods 405; a bad address or a taken port fails to start; and stopping with
 * clients connected (one idle, one halfway through a request) returns at once. Every
 * socket has a receive timeout and an alarm guards the whole run, so a hang fails the
 * test instead of stalling it. First, the same answers from ina_metrics_http_answer,
 * without a socket. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "agent/metrics/metrics.h"
#include "agent/metrics/metrics_http.h"
#include "core/log.h"
#include "tests/test_util.h"

#define IO_TIMEOUT_S 5
#define WATCHDOG_S 60

static int connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct timeval tv = {IO_TIMEOUT_S, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int send_all(int fd, const char *data, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, data, n, MSG_NOSIGNAL);
    if (k <= 0) return 0;
    data += k;
    n -= (size_t)k;
  }
  return 1;
}

typedef struct {
  int status;           /* 0 when the response did not parse */
  char *headers;        /* the header block, lowercased names not assumed */
  char *body;           /* NUL-terminated */
  size_t body_len;
  long content_length;  /* -1 when absent */
} response_t;

static void response_free(response_t *r) {
  free(r->headers);
  free(r->body);
  memset(r, 0, sizeof *r);
}

/* The value of header `name` (case-insensitive), copied into out; 0 when absent. */
static int header_value(const response_t *r, const char *name, char *out, size_t cap) {
  size_t n = strlen(name);
  for (const char *line = r->headers; line && *line;) {
    const char *end = strstr(line, "\r\n");
    if (!end) break;
    if ((size_t)(end - line) > n && strncasecmp(line, name, n) == 0 && line[n] == ':') {
      const char *v = line + n + 1;
      while (*v == ' ') v++;
      size_t len = (size_t)(end - v) < cap - 1 ? (size_t)(end - v) : cap - 1;
      memcpy(out, v, len);
      out[len] = '\0';
      return 1;
    }
    line = end + 2;
  }
  return 0;
}

/* Sends `request` on a new connection ("Connection: close" makes the server end it)
 * and reads the whole response. */
static response_t http_request(int port, const char *request) {
  response_t r = {0};
  r.content_length = -1;
  int fd = connect_loopback(port);
  if (fd < 0 || !send_all(fd, request, strlen(request))) {
    if (fd >= 0) close(fd);
    return r;
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (len + 1024 > cap) buf = realloc(buf, cap *= 2);
    ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
    if (k <= 0) break; /* EOF, or the timeout: what arrived is checked below */
    len += (size_t)k;
  }
  close(fd);
  buf[len] = '\0';
  char *split = strstr(buf, "\r\n\r\n");
  if (split && sscanf(buf, "HTTP/1.%*d %d", &r.status) == 1) {
    size_t head_len = (size_t)(split - buf) + 2;
    r.headers = malloc(head_len + 1);
    memcpy(r.headers, buf, head_len);
    r.headers[head_len] = '\0';
    r.body_len = len - (head_len + 2);
    r.body = malloc(r.body_len + 1);
    memcpy(r.body, split + 4, r.body_len);
    r.body[r.body_len] = '\0';
    char v[64];
    if (header_value(&r, "Content-Length", v, sizeof v)) r.content_length = strtol(v, NULL, 10);
  }
  free(buf);
  return r;
}

static void test_round_trip(ina_metrics_t *reg, test_rng_t *rng) {
  ina_metrics_http_t *srv = NULL;
  ina_metrics_http_options_t opt = INA_METRICS_HTTP_OPTIONS_INIT; /* 127.0.0.1, port 0 */
  CHECK_OK(ina_metrics_http_start(reg, &opt, &srv));
  if (!srv) return;
  int port = ina_metrics_http_port(srv);
  CHECK(port > 0 && port < 65536);
  printf("test_metrics_http: serving on 127.0.0.1:%d\n", port);

  ina_counter_t *c = NULL;
  ina_metric_label_t l[] = {{"layer", "3"}, {"expert", "17"}};
  CHECK_OK(ina_metrics_register_counter(reg, "ina_expert_tokens_total", "Tokens.", l, 2, &c));
  for (int round = 0; round < 3 && c; round++) {
    ina_counter_add(c, test_rng_int(rng, 1, 1000000));
    char *expected = NULL;
    size_t expected_len = 0;
    CHECK_OK(ina_metrics_render(reg, &expected, &expected_len));
    /* Query strings do not change the answer. */
    response_t r = http_request(port, round == 1 ? "GET /metrics?x=1 HTTP/1.1\r\nHost: t\r\n"
                                                   "Connection: close\r\n\r\n"
                                                 : "GET /metrics HTTP/1.1\r\nHost: t\r\n"
                                                   "Connection: close\r\n\r\n");
    CHECKF(r.status == 200, "status %d", r.status);
    char ctype[128] = "";
    CHECK(header_value(&r, "Content-Type", ctype, sizeof ctype));
    CHECKF(strcmp(ctype, "text/plain; version=0.0.4") == 0, "content type '%s'", ctype);
    CHECK(r.content_length == (long)expected_len);
    CHECK(expected && r.body && r.body_len == expected_len &&
          memcmp(r.body, expected, expected_len) == 0);
    free(expected);
    response_free(&r);
  }

  /* An HTTP/1.0 client gets the same body. */
  response_t r10 = http_request(port, "GET /metrics HTTP/1.0\r\n\r\n");
  CHECK(r10.status == 200 && r10.body && strstr(r10.body, "# TYPE ina_expert_tokens_total counter\n"));
  response_free(&r10);

  response_t head = http_request(port, "HEAD /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  CHECK(head.status == 200 && head.body_len == 0);
  response_free(&head);

  static const char *not_found[] = {
      "GET /other HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
      "GET /metrics/ HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
      "POST /other HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof not_found / sizeof *not_found; i++) {
    response_t r = http_request(port, not_found[i]);
    CHECKF(r.status == 404, "request %zu: status %d", i, r.status);
    response_free(&r);
  }

  static const char *not_allowed[] = {
      "POST /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello",
      "POST /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
      "PUT /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
      "DELETE /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof not_allowed / sizeof *not_allowed; i++) {
    response_t r = http_request(port, not_allowed[i]);
    CHECKF(r.status == 405, "request %zu: status %d", i, r.status);
    char allow[64] = "";
    CHECK(header_value(&r, "Allow", allow, sizeof allow) && strcmp(allow, "GET, HEAD") == 0);
    response_free(&r);
  }

  /* Keep-alive: two requests on one connection, both answered. */
  int fd = connect_loopback(port);
  CHECK(fd >= 0);
  if (fd >= 0) {
    const char *two = "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
                      "GET /other HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";
    CHECK(send_all(fd, two, strlen(two)));
    char buf[65536];
    size_t len = 0;
    ssize_t k;
    while (len < sizeof buf - 1 && (k = recv(fd, buf + len, sizeof buf - 1 - len, 0)) > 0)
      len += (size_t)k;
    buf[len] = '\0';
    char *second = strstr(buf, "HTTP/1.1 404");
    CHECK(strncmp(buf, "HTTP/1.1 200", 12) == 0 && second != NULL);
    close(fd);
  }

  /* Stop with clients connected: one idle, one halfway through its request headers.
   * The server's idle timeout is 10 s; stopping must not wait for it. */
  int idle = connect_loopback(port);
  int partial = connect_loopback(port);
  CHECK(idle >= 0 && partial >= 0);
  if (partial >= 0) CHECK(send_all(partial, "GET /metrics HTTP/1.1\r\nHos", 26));
  struct timespec pause = {0, 100 * 1000 * 1000}; /* let the server accept both */
  nanosleep(&pause, NULL);
  double t0 = test_now_s();
  ina_metrics_http_stop(srv);
  double stop_s = test_now_s() - t0;
  printf("test_metrics_http: stop with 2 clients connected took %.3f s\n", stop_s);
  CHECKF(stop_s < 2.0, "stop took %.3f s", stop_s);
  /* Both clients see their connection closed (EOF or reset), not a timeout. */
  int socks[2] = {idle, partial};
  for (int i = 0; i < 2; i++) {
    if (socks[i] < 0) continue;
    char b[256];
    errno = 0;
    ssize_t k = recv(socks[i], b, sizeof b, 0);
    CHECKF(k == 0 || (k < 0 && errno == ECONNRESET), "client %d: recv %zd errno %d", i, k, errno);
    close(socks[i]);
  }
  /* Nothing listens any more. */
  int late = connect_loopback(port);
  CHECK(late < 0);
  if (late >= 0) close(late);
}

static void test_start_errors(ina_metrics_t *reg) {
  ina_log_set_quiet_errors(1);
  ina_metrics_http_t *srv = (ina_metrics_http_t *)&srv;
  ina_metrics_http_options_t opt = INA_METRICS_HTTP_OPTIONS_INIT;
  opt.address = "localhost"; /* not numeric */
  CHECK(ina_metrics_http_start(reg, &opt, &srv) == INA_ERR_INVALID_ARGUMENT && srv == NULL);
  CHECK(strstr(ina_last_error(), "localhost") != NULL);
  opt.address = NULL;
  opt.port = 70000;
  srv = (ina_metrics_http_t *)&srv;
  CHECK(ina_metrics_http_start(reg, &opt, &srv) == INA_ERR_INVALID_ARGUMENT && srv == NULL);
  CHECK(strstr(ina_last_error(), "70000") != NULL);
  ina_metrics_http_options_t no_init = {0};
  srv = (ina_metrics_http_t *)&srv;
  CHECK(ina_metrics_http_start(reg, &no_init, &srv) == INA_ERR_INVALID_ARGUMENT && srv == NULL);
  srv = (ina_metrics_http_t *)&srv;
  CHECK(ina_metrics_http_start(NULL, NULL, &srv) == INA_ERR_INVALID_ARGUMENT && srv == NULL);

  /* A port already in use. */
  ina_metrics_http_t *first = NULL;
  CHECK_OK(ina_metrics_http_start(reg, NULL, &first));
  if (first) {
    opt.port = ina_metrics_http_port(first);
    srv = (ina_metrics_http_t *)&srv;
    ina_status_t st = ina_metrics_http_start(reg, &opt, &srv);
    CHECKF(st == INA_ERR_IO && srv == NULL, "status %d: %s", (int)st, ina_last_error());
    char port_text[16];
    snprintf(port_text, sizeof port_text, "port %d", opt.port);
    CHECK(strstr(ina_last_error(), port_text) != NULL);
  }
  ina_log_set_quiet_errors(0);
  ina_metrics_http_stop(first);
  ina_metrics_http_stop(NULL);
}

/* IPv6 loopback, when this machine has it. */
static void test_ipv6(ina_metrics_t *reg) {
  int probe = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 sa;
  memset(&sa, 0, sizeof sa);
  sa.sin6_family = AF_INET6;
  sa.sin6_addr = in6addr_loopback;
  int have_v6 = probe >= 0 && bind(probe, (struct sockaddr *)&sa, sizeof sa) == 0;
  if (probe >= 0) close(probe);
  if (!have_v6) {
    printf("test_metrics_http: no IPv6 loopback here, IPv6 case not run\n");
    return;
  }
  ina_metrics_http_options_t opt = INA_METRICS_HTTP_OPTIONS_INIT;
  opt.address = "::1";
  ina_metrics_http_t *srv = NULL;
  CHECK_OK(ina_metrics_http_start(reg, &opt, &srv));
  if (!srv) return;
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  struct timeval tv = {IO_TIMEOUT_S, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sa.sin6_port = htons((uint16_t)ina_metrics_http_port(srv));
  CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
  const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
  CHECK(send_all(fd, req, strlen(req)));
  char buf[64] = "";
  ssize_t k = recv(fd, buf, sizeof buf - 1, 0);
  CHECK(k >= 12 && strncmp(buf, "HTTP/1.1 200", 12) == 0);
  close(fd);
  ina_metrics_http_stop(srv);
}

/* The answers without a socket, as the server's callback gets them: the status, headers
 * and body of each kind of request, and the argument checks. */
static void test_answers(ina_metrics_t *reg) {
  static const struct {
    const char *method, *url;
    unsigned code;
    const char *allow;
  } cases[] = {
      {"GET", "/metrics", 200, NULL},       {"HEAD", "/metrics", 200, NULL},
      {"POST", "/metrics", 405, "GET, HEAD"}, {"get", "/metrics", 405, "GET, HEAD"},
      {"GET", "/", 404, NULL},              {"DELETE", "/metrics/", 404, NULL},
      {"GET", "", 404, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ina_metrics_http_reply_t r;
    CHECK_OK(ina_metrics_http_answer(reg, cases[i].method, cases[i].url, &r));
    CHECKF(r.code == cases[i].code, "%s %s: %u", cases[i].method, cases[i].url, r.code);
    CHECK(r.body && strlen(r.body) == r.body_len && r.body_len > 0);
    CHECK((r.allow == NULL) == (cases[i].allow == NULL));
    if (r.allow && cases[i].allow) CHECK(strcmp(r.allow, cases[i].allow) == 0);
    if (r.code == 200) {
      char *text = NULL;
      CHECK_OK(ina_metrics_render(reg, &text, NULL));
      CHECK(text && strcmp(text, r.body) == 0);
      CHECK(strcmp(r.content_type, "text/plain; version=0.0.4") == 0);
      free(text);
    } else {
      CHECK(strncmp(r.content_type, "text/plain", 10) == 0);
    }
    ina_metrics_http_reply_release(&r);
    CHECK(r.body == NULL);
    ina_metrics_http_reply_release(&r); /* twice is harmless */
  }
  ina_metrics_http_reply_t r;
  ina_log_set_quiet_errors(1); /* the refusals below are meant */
  CHECK(ina_metrics_http_answer(NULL, "GET", "/metrics", &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "ina_metrics_http_answer") != NULL);
  CHECK(r.body == NULL);
  CHECK(ina_metrics_http_answer(reg, NULL, "/metrics", &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_metrics_http_answer(reg, "GET", NULL, &r) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_metrics_http_answer(reg, "GET", "/metrics", NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  ina_metrics_http_reply_release(NULL);
}

int main(void) {
  alarm(WATCHDOG_S); /* a hang ends the process (SIGALRM), failing the test */
  test_rng_t rng = {test_seed("test_metrics_http")};
  ina_metrics_t *reg = NULL;
  CHECK_OK(ina_metrics_create(&reg));
  if (!reg) return test_finish("test_metrics_http");
  ina_gauge_t *g = NULL;
  CHECK_OK(ina_metrics_register_gauge(reg, "ina_queue_depth", "Requests \"waiting\".", NULL, 0, &g));
  if (g) ina_gauge_set(g, test_rng_int(&rng, -100, 100));
  test_answers(reg);
  test_round_trip(reg, &rng);
  test_start_errors(reg);
  test_ipv6(reg);
  ina_metrics_destroy(reg);
  return test_finish("test_metrics_http");
}
