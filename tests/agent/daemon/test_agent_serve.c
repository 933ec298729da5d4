/* An in-process ina-agent (tiny model, CPU, 127.0.0.1:0) driven over gRPC: health after
 * warm-up, GetNodeInfo, Generate against ina_generate (alone and 4 concurrent streams),
 * bad requests, Cancel, client disconnect, GetLoad, Placement, and the /metrics scrape. */
#include <arpa/inet.h>
#include <ctype.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/test_util.h"
#include "tests/agent/daemon/agent_test_util.h"

#define KV_TOKENS 4000 /* 250 pages of 16: below the tiny model's 4096 positions */
#define ADMIN_TOKEN "s3cret-admin"
/* Tokens of the streams that get cancelled: several seconds of work on the CPU (about
 * 8 s unoptimized by ASan, far more with it). */
#define LONG_TOKENS 3900
#define WARMUP_TOKENS 512

static uint64_t g_model_seed;

/* ina.v1.Node/GetHealth state, or -1 when the call failed. */
static int node_state(ina_rpc_client_t *c) {
  Ina__V1__GetHealthRequest req = INA__V1__GET_HEALTH_REQUEST__INIT;
  uint8_t *resp = NULL;
  size_t n = 0;
  if (at_unary(c, "/ina.v1.Node/GetHealth", &req.base, &resp, &n, NULL) != INA_RPC_OK) return -1;
  Ina__V1__NodeHealth *h = ina__v1__node_health__unpack(NULL, n, resp);
  int state = h ? (int)h->state : -1;
  if (h) ina__v1__node_health__free_unpacked(h, NULL);
  free(resp);
  return state;
}

static void test_health_and_info(ina_agent_t *agent, ina_rpc_client_t *c) {
  /* The warm-up generates WARMUP_TOKENS tokens (a second or more on the CPU): the first
   * calls come long before it ends. */
  CHECK(at_health(c) == 2);
  CHECK(node_state(c) == INA__V1__NODE_STATE__NODE_STATE_STARTING);
  {
    static at_stream_t s;
    int32_t prompt[2] = {1, 2};
    at_request_t r = {"too-early", prompt, 2, 2, 1, 0};
    at_generate(c, &r, &s);
    CHECKF(s.status.code == INA_RPC_UNAVAILABLE && s.messages == 0, "Generate during warm-up: %s",
           ina_rpc_code_name(s.status.code));
  }

  Ina__V1__GetHealthRequest hreq = INA__V1__GET_HEALTH_REQUEST__INIT;
  uint8_t *resp = NULL;
  size_t n = 0;
  double t0 = test_now_s();
  CHECK_OK(ina_agent_wait_serving(agent, 60000));
  printf("warm-up of %d tokens ended %.3f s after the first calls\n", WARMUP_TOKENS, test_now_s() - t0);
  CHECK(at_health(c) == 1);
  CHECK(at_unary(c, "/ina.v1.Node/GetHealth", &hreq.base, &resp, &n, NULL) == INA_RPC_OK);
  Ina__V1__NodeHealth *h = ina__v1__node_health__unpack(NULL, n, resp);
  CHECK(h && h->state == INA__V1__NODE_STATE__NODE_STATE_SERVING && h->n_ranks == 1 &&
        h->ranks[0]->state == INA__V1__NODE_STATE__NODE_STATE_SERVING);
  if (h) ina__v1__node_health__free_unpacked(h, NULL);
  free(resp);

  Ina__V1__GetNodeInfoRequest ireq = INA__V1__GET_NODE_INFO_REQUEST__INIT;
  CHECK(at_unary(c, "/ina.v1.Node/GetNodeInfo", &ireq.base, &resp, &n, NULL) == INA_RPC_OK);
  Ina__V1__NodeInfo *info = ina__v1__node_info__unpack(NULL, n, resp);
  CHECK(info != NULL);
  if (info) {
    CHECK(info->world_size == 1);
    CHECK(info->n_ranks == 1 && info->ranks[0]->global_rank == 0 &&
          info->ranks[0]->pid == (uint32_t)getpid());
    CHECK(info->n_gpus == 0); /* the CPU engine */
    CHECK(info->hostname[0] != '\0');
    CHECK(info->host_memory_bytes > 0);
    CHECK(info->model && strcmp(info->model->name, "tiny") == 0);
    CHECK(info->model && strcmp(info->model->architecture, "DeepseekV3ForCausalLM") == 0);
    CHECK(info->model && info->model->vocab_size == 1024 && info->model->n_layers == 4 &&
          info->model->n_moe_layers == 3 && info->model->n_routed_experts == 8 &&
          info->model->n_experts_per_token == 2);
    CHECKF(info->model && info->model->max_context_tokens == KV_TOKENS, "max_context_tokens %u",
           info->model ? info->model->max_context_tokens : 0);
    CHECK(info->model && strcmp(info->model->weight_dtype, "f32") == 0);
    CHECK(info->build && strcmp(info->build->version, "0.1.0") == 0);
    ina__v1__node_info__free_unpacked(info, NULL);
  }
  free(resp);
}

/* Random prompt of length [1, max_len] with ids in [0, 1024). */
static int32_t random_prompt(test_rng_t *rng, int32_t *prompt, int32_t max_len) {
  int32_t n = (int32_t)test_rng_int(rng, 1, max_len);
  for (int32_t i = 0; i < n; i++) prompt[i] = (int32_t)test_rng_int(rng, 0, 1023);
  return n;
}

static void test_generate_matches_reference(ina_rpc_client_t *c, at_reference_t *ref, test_rng_t *rng) {
  static at_stream_t s;
  int32_t prompt[64], expect[64];
  for (int trial = 0; trial < 6; trial++) {
    /* Edge cases first: a one-token prompt and a prompt filling whole pages. */
    int32_t len = trial == 0 ? 1 : trial == 1 ? 32 : random_prompt(rng, prompt, 48);
    if (trial < 2)
      for (int32_t i = 0; i < len; i++) prompt[i] = (int32_t)test_rng_int(rng, 0, 1023);
    int32_t max_new = trial == 0 ? 1 : (int32_t)test_rng_int(rng, 2, 24);
    int ignore_eos = trial != 5; /* the last one may stop at eos, like ina_generate */
    char id[32];
    snprintf(id, sizeof id, "match-%d", trial);
    at_request_t r = {id, prompt, len, (uint32_t)max_new, ignore_eos, trial == 3 ? 4u : 0u};
    int32_t n = at_reference_run(ref, prompt, len, max_new, ignore_eos, expect);
    at_generate(c, &r, &s);
    CHECKF(s.st == INA_OK, "trial %d: %s %s", trial, ina_rpc_code_name(s.status.code), s.status.message);
    CHECKF(n >= 1 && at_same_tokens(&s, expect, n), "trial %d: %d tokens vs %d expected", trial,
           atomic_load(&s.num_tokens), n);
    CHECK(s.finals == 1 && s.after_final == 0 && s.bad == 0);
    CHECK(s.prompt_tokens == (uint32_t)len && s.completion_tokens == (uint32_t)n);
    CHECK(s.has_timings && s.total_us > 0 && s.first_token_us <= s.total_us);
    if (n == max_new && ignore_eos) CHECK(s.finish == INA__V1__FINISH_REASON__FINISH_REASON_LENGTH);
    if (n < max_new)
      CHECK(s.finish == INA__V1__FINISH_REASON__FINISH_REASON_STOP && s.stop_token_id == (uint32_t)expect[n - 1]);
    /* stream_interval 4: ceil(n / 4) token messages plus the final one at most. */
    if (trial == 3) CHECKF(s.messages <= (n + 3) / 4 + 1, "%d messages for %d tokens", s.messages, n);
  }
}

typedef struct concurrent {
  ina_rpc_client_t *client;
  int32_t prompt[64];
  int32_t len, max_new;
  int32_t expect[64];
  int32_t n_expect;
  char id[32];
  at_stream_t stream;
} concurrent_t;

static void *run_concurrent(void *arg) {
  concurrent_t *t = arg;
  at_request_t r = {t->id, t->prompt, t->len, (uint32_t)t->max_new, 1, 0};
  at_generate(t->client, &r, &t->stream);
  return NULL;
}

static void test_concurrent_streams(ina_rpc_client_t *c, at_reference_t *ref, test_rng_t *rng) {
  enum { N = 4 };
  static concurrent_t t[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    t[i].client = c;
    t[i].len = random_prompt(rng, t[i].prompt, 40);
    t[i].max_new = (int32_t)test_rng_int(rng, 8, 32);
    t[i].n_expect = at_reference_run(ref, t[i].prompt, t[i].len, t[i].max_new, 1, t[i].expect);
    snprintf(t[i].id, sizeof t[i].id, "concurrent-%d", i);
  }
  for (int i = 0; i < N; i++) CHECK(pthread_create(&th[i], NULL, run_concurrent, &t[i]) == 0);
  for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < N; i++) {
    CHECKF(t[i].stream.st == INA_OK, "stream %d: %s", i, t[i].stream.status.message);
    CHECKF(at_same_tokens(&t[i].stream, t[i].expect, t[i].n_expect), "stream %d differs from ina_generate", i);
    CHECK(t[i].stream.finals == 1 && t[i].stream.bad == 0);
  }
}

/* A refused request ends before any response with `code` and a message containing `field`. */
static void expect_refused(ina_rpc_client_t *c, const uint8_t *bytes, size_t size, ina_rpc_code_t code,
                           const char *field) {
  static at_stream_t s;
  memset(&s, 0, sizeof s);
  snprintf(s.request_id, sizeof s.request_id, "bad");
  ina_status_t st = ina_rpc_client_stream(c, AT_GENERATE, bytes, size, 0, at_stream_message, &s, &s.status);
  CHECK(st != INA_OK);
  CHECKF(s.status.code == code, "expected %s, got %s: %s", ina_rpc_code_name(code),
         ina_rpc_code_name(s.status.code), s.status.message);
  CHECKF(strstr(s.status.message, field) != NULL, "message '%s' does not name '%s'", s.status.message, field);
  CHECK(s.messages == 0);
}

static void expect_request_refused(ina_rpc_client_t *c, const at_request_t *r, ina_rpc_code_t code,
                                   const char *field) {
  uint8_t *bytes = NULL;
  size_t size = 0;
  at_pack_request(r, &bytes, &size);
  expect_refused(c, bytes, size, code, field);
  free(bytes);
}

static void test_bad_requests(ina_rpc_client_t *c, at_reference_t *ref, test_rng_t *rng) {
  int32_t prompt[8] = {5, 6, 7, 8, 9, 10, 11, 12};
  int32_t bad_index = (int32_t)test_rng_int(rng, 0, 7);
  char field[64];
  at_request_t empty = {"bad", prompt, 0, 4, 0, 0};
  expect_request_refused(c, &empty, INA_RPC_INVALID_ARGUMENT, "prompt_token_ids");

  prompt[bad_index] = (int32_t)test_rng_int(rng, 1024, 1 << 20);
  at_request_t oov = {"bad", prompt, 8, 4, 0, 0};
  snprintf(field, sizeof field, "prompt_token_ids[%d]", bad_index);
  expect_request_refused(c, &oov, INA_RPC_INVALID_ARGUMENT, field);
  prompt[bad_index] = 13;

  at_request_t zero = {"bad", prompt, 8, 0, 0, 0};
  expect_request_refused(c, &zero, INA_RPC_INVALID_ARGUMENT, "max_tokens");
  at_request_t no_id = {"", prompt, 8, 4, 0, 0};
  expect_request_refused(c, &no_id, INA_RPC_INVALID_ARGUMENT, "request_id");
  /* Beyond the model's 4096 positions: the validator; beyond the KV pool's 4000 tokens
   * (--max-tokens) but within the positions: never fits, so INVALID_ARGUMENT too (the
   * proto keeps RESOURCE_EXHAUSTED for a full queue), naming what it needs and the
   * capacity. */
  at_request_t too_long = {"bad", prompt, 8, 5000, 0, 0};
  expect_request_refused(c, &too_long, INA_RPC_INVALID_ARGUMENT, "max_tokens");
  at_request_t too_big = {"bad", prompt, 8, KV_TOKENS, 0, 0};
  snprintf(field, sizeof field, "= %d tokens", 8 + KV_TOKENS);
  expect_request_refused(c, &too_big, INA_RPC_INVALID_ARGUMENT, field);
  snprintf(field, sizeof field, "KV capacity of %d tokens", KV_TOKENS);
  expect_request_refused(c, &too_big, INA_RPC_INVALID_ARGUMENT, field);

  /* Garbage: random bytes that are not a GenerateRequest (a lone 0xff byte never decodes;
   * random tails make it vary). */
  uint8_t garbage[24];
  garbage[0] = 0xff;
  for (size_t i = 1; i < sizeof garbage; i++) garbage[i] = (uint8_t)test_rng_next(rng);
  expect_refused(c, garbage, sizeof garbage, INA_RPC_INVALID_ARGUMENT, "request");

  /* Sampling parameters the agent does not implement. */
  Ina__V1__SamplingParams sp = INA__V1__SAMPLING_PARAMS__INIT;
  uint32_t ids[2] = {1, 2};
  sp.min_p = 0.5f;
  Ina__V1__GenerateRequest req = INA__V1__GENERATE_REQUEST__INIT;
  req.request_id = "bad";
  req.prompt_token_ids = ids;
  req.n_prompt_token_ids = 2;
  req.max_tokens = 2;
  req.sampling = &sp;
  uint8_t *bytes = NULL;
  size_t size = 0;
  CHECK_OK(ina_rpc_pack(&req.base, &bytes, &size));
  expect_refused(c, bytes, size, INA_RPC_INVALID_ARGUMENT, "sampling.min_p");
  free(bytes);

  /* Still serving, and still right. */
  CHECK(at_health(c) == 1);
  static at_stream_t s;
  int32_t expect[8];
  int32_t n = at_reference_run(ref, prompt, 8, 6, 1, expect);
  at_request_t good = {"good-after-bad", prompt, 8, 6, 1, 0};
  at_generate(c, &good, &s);
  CHECK(s.st == INA_OK && at_same_tokens(&s, expect, n));
}

/* ---- /metrics ----------------------------------------------------------------------- */

/* GET /metrics over a plain socket (HTTP/1.0: the server closes when done). The body,
 * malloc'd, or NULL when the answer is not a 200. */
static char *scrape(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return NULL;
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  char *buf = NULL;
  size_t len = 0, cap = 0;
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
    const char *req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, strlen(req)) == (ssize_t)strlen(req)) {
      for (;;) {
        if (len + 4097 > cap) {
          cap = cap ? 2 * cap : 65536;
          buf = realloc(buf, cap);
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n <= 0) break;
        len += (size_t)n;
      }
    }
  }
  close(fd);
  if (!buf) return NULL;
  buf[len] = '\0';
  char *body = strstr(buf, "\r\n\r\n");
  if (strncmp(buf, "HTTP/1.", 7) != 0 || strncmp(buf + 8, " 200", 4) != 0 || !body) {
    fprintf(stderr, "scrape: unexpected answer: %.200s\n", buf);
    free(buf);
    return NULL;
  }
  memmove(buf, body + 4, strlen(body + 4) + 1);
  return buf;
}

/* One sample line `name{labels} value` (labels optional, values quoted with escapes). */
static int sample_line_parses(const char *line) {
  const char *p = line;
  if (!(isalpha((unsigned char)*p) || *p == '_' || *p == ':')) return 0;
  while (isalnum((unsigned char)*p) || *p == '_' || *p == ':') p++;
  if (*p == '{') {
    p++;
    while (*p != '}') {
      if (!(isalpha((unsigned char)*p) || *p == '_')) return 0;
      while (isalnum((unsigned char)*p) || *p == '_') p++;
      if (*p++ != '=' || *p++ != '"') return 0;
      while (*p && *p != '"') p += *p == '\\' && p[1] ? 2 : 1;
      if (*p++ != '"') return 0;
      if (*p == ',') p++;
      else if (*p != '}') return 0;
    }
    p++;
  }
  if (*p++ != ' ') return 0;
  if (strcmp(p, "+Inf") == 0 || strcmp(p, "-Inf") == 0 || strcmp(p, "NaN") == 0) return 1;
  char *end = NULL;
  strtod(p, &end);
  return end != p && *end == '\0';
}

/* Every line is a comment (# HELP / # TYPE) or a sample; the number of samples, -1 when
 * some line does not parse. */
static int count_samples(const char *text) {
  int samples = 0;
  const char *p = text;
  while (*p) {
    const char *nl = strchr(p, '\n');
    if (!nl) return -1; /* the format ends every line with \n */
    char line[1024];
    size_t n = (size_t)(nl - p);
    if (n >= sizeof line) return -1;
    memcpy(line, p, n);
    line[n] = '\0';
    if (line[0] == '#') {
      if (strncmp(line, "# HELP ", 7) != 0 && strncmp(line, "# TYPE ", 7) != 0) return -1;
    } else if (sample_line_parses(line)) {
      samples++;
    } else {
      fprintf(stderr, "unparsable metrics line: '%s'\n", line);
      return -1;
    }
    p = nl + 1;
  }
  return samples;
}

/* The value of the series written exactly `series` (`name` or `name{labels}`); NaN when
 * absent. */
static double metric(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  return NAN;
}

#define M_LENGTH "ina_requests_total{reason=\"length\"}"
#define M_REFUSED "ina_requests_refused_total{code=\"INVALID_ARGUMENT\"}"
#define M_GENERATED "ina_generated_tokens_total"
#define M_PROMPT "ina_prompt_tokens_total"
#define M_TTFT "ina_time_to_first_token_seconds_count"
#define M_ITL "ina_inter_token_latency_seconds_count"
#define M_STEPS "ina_scheduler_steps_total"

static void test_metrics_scrape(int port, ina_rpc_client_t *c, test_rng_t *rng) {
  CHECK(port > 0);
  char *before = scrape(port);
  CHECK(before != NULL);
  if (!before) return;
  CHECKF(count_samples(before) > 20, "%d samples", count_samples(before));
  const char *families[] = {"ina_requests_total", "ina_requests_refused_total", M_GENERATED, M_PROMPT,
                            "ina_prefix_cache_hit_tokens_total", "ina_time_to_first_token_seconds",
                            "ina_inter_token_latency_seconds", "ina_queue_length", "ina_running_requests",
                            "ina_kv_pages_used", "ina_kv_pages_free", M_STEPS};
  for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
    char help[128];
    snprintf(help, sizeof help, "# HELP %s ", families[i]);
    CHECKF(strstr(before, help) != NULL, "no HELP for %s", families[i]);
  }
  CHECK(metric(before, "ina_kv_pages_used") + metric(before, "ina_kv_pages_free") == KV_TOKENS / 16);

  /* One generation of known size, one refusal. */
  int32_t prompt[40];
  int32_t len = (int32_t)test_rng_int(rng, 2, 40);
  for (int32_t i = 0; i < len; i++) prompt[i] = (int32_t)test_rng_int(rng, 0, 1023);
  uint32_t max_new = (uint32_t)test_rng_int(rng, 2, 20);
  static at_stream_t s;
  at_request_t r = {"metrics-gen", prompt, len, max_new, 1, 0};
  at_generate(c, &r, &s);
  CHECK(s.st == INA_OK && s.completion_tokens == max_new);
  at_request_t bad = {"metrics-bad", prompt, len, 0, 1, 0};
  expect_request_refused(c, &bad, INA_RPC_INVALID_ARGUMENT, "max_tokens");

  /* Counters from events are up to date once the stream ended; steps come with the
   * agent's sampler, within a fraction of a second. */
  char *after = NULL;
  for (int tries = 0; tries < 50; tries++) {
    free(after);
    after = scrape(port);
    if (!after || metric(after, M_STEPS) > metric(before, M_STEPS)) break;
    at_sleep_ms(100);
  }
  CHECK(after != NULL);
  if (after) {
    CHECK(count_samples(after) == count_samples(before));
    CHECK(metric(after, M_LENGTH) == metric(before, M_LENGTH) + 1);
    CHECK(metric(after, M_REFUSED) == metric(before, M_REFUSED) + 1);
    CHECKF(metric(after, M_GENERATED) == metric(before, M_GENERATED) + max_new, "%g -> %g, +%u",
           metric(before, M_GENERATED), metric(after, M_GENERATED), max_new);
    CHECK(metric(after, M_PROMPT) == metric(before, M_PROMPT) + len);
    CHECK(metric(after, M_TTFT) == metric(before, M_TTFT) + 1);
    CHECK(metric(after, M_ITL) == metric(before, M_ITL) + max_new - 1);
    CHECK(metric(after, M_ITL) == metric(after, "ina_inter_token_latency_seconds_bucket{le=\"+Inf\"}"));
    CHECK(metric(after, M_STEPS) > metric(before, M_STEPS));
    CHECK(metric(after, "ina_time_to_first_token_seconds_sum") > 0);
  }
  free(before);
  free(after);
}

typedef struct long_stream {
  ina_rpc_client_t *client;
  const char *id;
  int cancel_after;
  at_stream_t stream;
} long_stream_t;

static void *run_long(void *arg) {
  long_stream_t *t = arg;
  static const int32_t prompt[20] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4};
  at_request_t r = {t->id, prompt, 20, LONG_TOKENS, 1, 0};
  t->stream.cancel_after = t->cancel_after;
  at_generate(t->client, &r, &t->stream);
  return NULL;
}

static int wait_tokens(at_stream_t *s, int n, int timeout_ms) {
  double end = test_now_s() + timeout_ms / 1000.0;
  while (atomic_load(&s->num_tokens) < n) {
    if (test_now_s() > end) return 0;
    at_sleep_ms(1);
  }
  return 1;
}

static void test_cancel_and_disconnect(ina_rpc_client_t *c, uint64_t baseline_pages) {
  static long_stream_t t;
  pthread_t th;
  int cancelled = -1;
  CHECK(at_cancel(c, "never-submitted", &cancelled) == INA_RPC_OK && cancelled == 0); /* idempotent */

  /* Cancel by id mid-stream. */
  memset(&t, 0, sizeof t);
  t.client = c;
  t.id = "to-cancel";
  CHECK(pthread_create(&th, NULL, run_long, &t) == 0);
  CHECK(wait_tokens(&t.stream, 3, 30000));
  {
    /* A second stream with the same id while the first runs. */
    int32_t p[2] = {1, 2};
    at_request_t dup = {"to-cancel", p, 2, 2, 0, 0};
    expect_request_refused(c, &dup, INA_RPC_ALREADY_EXISTS, "request_id");
  }
  Ina__V1__NodeLoad l;
  CHECK(at_load(c, &l) == 0 && l.kv_pages_used > baseline_pages && l.running_requests == 1);
  CHECK(at_cancel(c, "to-cancel", &cancelled) == INA_RPC_OK && cancelled == 1);
  pthread_join(th, NULL);
  CHECKF(t.stream.st == INA_OK, "%s", t.stream.status.message);
  CHECK(t.stream.finals == 1 && t.stream.finish == INA__V1__FINISH_REASON__FINISH_REASON_CANCELLED);
  CHECK(atomic_load(&t.stream.num_tokens) < LONG_TOKENS);
  CHECK(at_wait_pages(c, baseline_pages, 10000));
  CHECK(at_cancel(c, "to-cancel", &cancelled) == INA_RPC_OK && cancelled == 0); /* finished: gone */

  /* The client goes away mid-stream. */
  memset(&t, 0, sizeof t);
  t.client = c;
  t.id = "to-disconnect";
  t.cancel_after = 4;
  CHECK(pthread_create(&th, NULL, run_long, &t) == 0);
  pthread_join(th, NULL);
  CHECK(t.stream.status.code == INA_RPC_CANCELLED);
  CHECK(t.stream.finals == 0);
  /* Far sooner than the request could finish by itself: it was cancelled. */
  CHECKF(at_wait_pages(c, baseline_pages, 1500), "KV pages not returned after a client disconnect");
  CHECK(at_cancel(c, "to-disconnect", &cancelled) == INA_RPC_OK && cancelled == 0);
}

static void test_load_and_placement(ina_rpc_client_t *c, ina_rpc_client_t *admin) {
  Ina__V1__NodeLoad l;
  CHECK(at_load(c, &l) == 0);
  CHECK(l.kv_page_size == 16 && l.kv_pages_used + l.kv_pages_free == KV_TOKENS / 16);
  CHECK(l.window_seconds > 0 && l.decode_tokens_per_second >= 0);

  Ina__V1__GetPlacementRequest greq = INA__V1__GET_PLACEMENT_REQUEST__INIT;
  uint8_t *resp = NULL;
  size_t n = 0;
  CHECK(at_unary(c, "/ina.v1.Placement/GetPlacement", &greq.base, &resp, &n, NULL) == INA_RPC_OK);
  Ina__V1__GetPlacementResponse *p = ina__v1__get_placement_response__unpack(NULL, n, resp);
  CHECK(p && p->placement && p->placement->layout && p->placement->layout->tp == 1 &&
        p->placement->layout->dp == 1 && p->placement->layout->ep == 1);
  if (p && p->placement) {
    CHECK(p->placement->generation == 1 && p->placement->slots_per_rank == 8 && p->placement->n_layers == 3);
    for (size_t i = 0; i < p->placement->n_layers; i++) {
      CHECK(p->placement->layers[i]->moe_layer == i && p->placement->layers[i]->n_slots == 8);
      for (size_t k = 0; k < p->placement->layers[i]->n_slots; k++)
        CHECK(p->placement->layers[i]->slots[k]->logical_expert == k);
    }
  }
  if (p) ina__v1__get_placement_response__free_unpacked(p, NULL);
  free(resp);

  Ina__V1__ApplyPlacementRequest areq = INA__V1__APPLY_PLACEMENT_REQUEST__INIT;
  ina_rpc_status_t status;
  areq.expected_generation = 1;
  CHECK(at_unary(c, "/ina.v1.Placement/ApplyPlacement", &areq.base, &resp, &n, &status) ==
        INA_RPC_UNAUTHENTICATED);
  /* No placement in the request; then a stale generation. (Real changes: test_agent_place
   * and the Python end-to-end test.) */
  CHECK(at_unary(admin, "/ina.v1.Placement/ApplyPlacement", &areq.base, &resp, &n, &status) ==
        INA_RPC_INVALID_ARGUMENT);
  CHECK(strstr(status.message, "placement: missing") != NULL);
  areq.expected_generation = 7;
  CHECK(at_unary(admin, "/ina.v1.Placement/ApplyPlacement", &areq.base, &resp, &n, &status) ==
        INA_RPC_FAILED_PRECONDITION);
  CHECK(strstr(status.message, "generation 1 is in force") != NULL);
}

/* An agent without an admin token: ApplyPlacement is PERMISSION_DENIED (saying how to give
 * a token) for a client with or without one, unless allow_unauthenticated_admin opens it
 * (an empty request then reaches the handler's checks). */
static void test_admin_without_token(int open) {
  ina_agent_options_t o = at_options(g_model_seed, 1024);
  o.allow_unauthenticated_admin = open;
  ina_agent_t *agent = NULL;
  CHECK_OK(ina_agent_create(&o, &agent));
  if (!agent) return;
  CHECK_OK(ina_agent_wait_serving(agent, 60000));
  ina_rpc_client_t *c = at_client(ina_agent_port(agent), NULL);
  ina_rpc_client_t *some = at_client(ina_agent_port(agent), ADMIN_TOKEN);
  Ina__V1__ApplyPlacementRequest areq = INA__V1__APPLY_PLACEMENT_REQUEST__INIT;
  ina_rpc_status_t status;
  uint8_t *resp = NULL;
  size_t n = 0;
  areq.expected_generation = 1;
  for (int k = 0; k < 2; k++) {
    const ina_rpc_code_t code =
        at_unary(k ? some : c, "/ina.v1.Placement/ApplyPlacement", &areq.base, &resp, &n, &status);
    if (open) {
      CHECKF(code == INA_RPC_INVALID_ARGUMENT && strstr(status.message, "placement: missing"),
             "open admin calls, token %d: %s", k, status.message);
    } else {
      CHECKF(code == INA_RPC_PERMISSION_DENIED &&
                 strstr(status.message, "started without an admin token") &&
                 strstr(status.message, "--admin-token-file"),
             "no admin token, token %d: code %d: %s", k, (int)code, status.message);
    }
    free(resp);
    resp = NULL;
  }
  ina_agent_request_stop(agent);
  CHECK_OK(ina_agent_wait(agent));
  ina_rpc_client_destroy(c);
  ina_rpc_client_destroy(some);
  ina_agent_destroy(agent);
}

int main(void) {
  test_rng_t rng = {test_seed("test_agent_serve")};
  ina_log_set_quiet_errors(1);
  g_model_seed = test_rng_next(&rng);
  ina_agent_options_t o = at_options(g_model_seed, KV_TOKENS);
  o.admin_token = ADMIN_TOKEN;
  o.warmup_tokens = WARMUP_TOKENS;
  o.metrics_listen = "127.0.0.1:0";
  ina_agent_t *agent = NULL;
  CHECK_OK(ina_agent_create(&o, &agent));
  if (!agent) return test_finish("test_agent_serve");
  CHECK(ina_agent_port(agent) > 0);
  ina_rpc_client_t *c = at_client(ina_agent_port(agent), NULL);
  ina_rpc_client_t *admin = at_client(ina_agent_port(agent), ADMIN_TOKEN);
  at_reference_t ref;
  at_reference_open(&ref, g_model_seed);

  test_health_and_info(agent, c);
  Ina__V1__NodeLoad l;
  CHECK(at_load(c, &l) == 0);
  uint64_t baseline = l.kv_pages_used;
  CHECK(baseline == 0); /* no prefix cache: the warm-up left nothing behind */
  test_generate_matches_reference(c, &ref, &rng);
  test_concurrent_streams(c, &ref, &rng);
  test_bad_requests(c, &ref, &rng);
  test_metrics_scrape(ina_agent_metrics_port(agent), c, &rng);
  test_cancel_and_disconnect(c, baseline);
  test_load_and_placement(c, admin);
  CHECK(at_wait_pages(c, baseline, 10000));

  ina_agent_request_stop(agent);
  CHECK_OK(ina_agent_wait(agent));
  ina_rpc_client_destroy(c);
  ina_rpc_client_destroy(admin);
  ina_agent_destroy(agent);
  at_reference_close(&ref);
  test_admin_without_token(0);
  test_admin_without_token(1);
  return test_finish("test_agent_serve");
}
