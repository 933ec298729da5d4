/* Fuzz target: the request handling of the /metrics endpoint (agent/metrics/
 * metrics_http.h): ina_metrics_http_answer, which the libmicrohttpd callback hands
 * every request's method and path, and whose reply it sends as it is. An input is a
 * request line's start, "METHOD PATH": the method up to the first space, the path after
 * it (the whole input is the method when there is no space); each ends at a NUL, as the
 * strings libmicrohttpd passes do. The registry holds a series of each kind, labels that
 * need escaping among them, and a counter of the inputs.
 *
 * For every input it traps unless the answer is INA_OK and:
 *  - path "/metrics" with GET or HEAD: 200, "text/plain; version=0.0.4", no Allow, and
 *    the body is the registry's rendering at that moment (with this input counted);
 *  - path "/metrics" with any other method: 405 with "Allow: GET, HEAD";
 *  - any other path: 404;
 *  - a body is NUL-terminated, body_len long, ends in a newline; a 404 or 405 is plain
 *    text; releasing twice is harmless.
 * Everything is freed (LeakSanitizer checks). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/metrics/metrics.h"
#include "agent/metrics/metrics_http.h"
#include "core/log.h"
#include "tests/fuzz/fuzz_check.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ina_metrics_t *reg;
static ina_counter_t *inputs;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  ina_log_set_quiet_errors(1);
  FUZZ_REQUIRE(ina_metrics_create(&reg) == INA_OK, "ina_metrics_create: %s", ina_last_error());
  const ina_metric_label_t labels[] = {{"layer", "3"}, {"note", "a \"quoted\"\\ value\nover lines"}};
  static const double bounds[] = {0.001, 0.01, 0.1, 1};
  ina_gauge_f64_t *g = NULL;
  ina_histogram_t *h = NULL;
  FUZZ_REQUIRE(ina_metrics_register_counter(reg, "fuzz_inputs_total", "Inputs run.", NULL, 0,
                                            &inputs) == INA_OK &&
                   ina_metrics_register_gauge_f64(reg, "fuzz_ratio", "A gauge\nwith \\ in help.",
                                                  labels, 2, &g) == INA_OK &&
                   ina_metrics_register_histogram(reg, "fuzz_latency_seconds", "Latency.", labels,
                                                  1, bounds, 4, &h) == INA_OK,
               "registering the series: %s", ina_last_error());
  ina_gauge_f64_set(g, 0.25);
  ina_histogram_observe(h, 0.05);
  ina_histogram_observe(h, 7);
  return 0;
}

static char *copy_string(const uint8_t *p, size_t n) {
  char *s = malloc(n + 1);
  FUZZ_REQUIRE(s != NULL, "no memory for %zu bytes", n);
  memcpy(s, p, n);
  s[n] = '\0';
  return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *space = memchr(data, ' ', size);
  const size_t method_len = space ? (size_t)(space - data) : size;
  char *method = copy_string(data, method_len);
  char *url = space ? copy_string(space + 1, size - method_len - 1) : copy_string(data, 0);
  ina_counter_inc(inputs);

  ina_metrics_http_reply_t reply;
  const ina_status_t st = ina_metrics_http_answer(reg, method, url, &reply);
  FUZZ_REQUIRE(st == INA_OK, "no answer to %.40s %.40s: %s", method, url, ina_last_error());
  FUZZ_REQUIRE(reply.body != NULL && strlen(reply.body) == reply.body_len && reply.body_len > 0 &&
                   reply.body[reply.body_len - 1] == '\n',
               "a body of %zu bytes that is not one NUL-terminated text ending in a newline",
               reply.body_len);
  FUZZ_REQUIRE(reply.content_type != NULL, "no content type");

  const int is_metrics = strcmp(url, "/metrics") == 0;
  const int readable = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
  if (is_metrics && readable) {
    FUZZ_REQUIRE(reply.code == 200, "%s /metrics answered %u", method, reply.code);
    FUZZ_REQUIRE(strcmp(reply.content_type, "text/plain; version=0.0.4") == 0 && !reply.allow,
                 "200 with content type %s", reply.content_type);
    char *text = NULL;
    size_t len = 0;
    FUZZ_REQUIRE(ina_metrics_render(reg, &text, &len) == INA_OK, "render: %s", ina_last_error());
    FUZZ_REQUIRE(len == reply.body_len && memcmp(text, reply.body, len) == 0,
                 "the body is not the registry's rendering");
    free(text);
  } else if (is_metrics) {
    FUZZ_REQUIRE(reply.code == 405, "method %.40s on /metrics answered %u", method, reply.code);
    FUZZ_REQUIRE(reply.allow && strcmp(reply.allow, "GET, HEAD") == 0, "405 without Allow");
  } else {
    FUZZ_REQUIRE(reply.code == 404, "path %.40s answered %u", url, reply.code);
    FUZZ_REQUIRE(!reply.allow, "404 with Allow");
  }
  if (reply.code != 200)
    FUZZ_REQUIRE(strncmp(reply.content_type, "text/plain", 10) == 0, "%u with content type %s",
                 reply.code, reply.content_type);

  ina_metrics_http_reply_release(&reply);
  FUZZ_REQUIRE(reply.body == NULL, "release left the body");
  ina_metrics_http_reply_release(&reply);
  free(method);
  free(url);
  return 0;
}
