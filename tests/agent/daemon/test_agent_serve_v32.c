/* An in-process ina-agent serving DeepSeek-V3.2 (the built-in v3.2-tiny: the lightning
 * indexer picks each query's top 8 cached tokens, and MLA attends to those only) on the
 * CPU, driven over gRPC. GetNodeInfo names the architecture and the top-k; streams alone,
 * concurrent, and again with the prompt's pages reused from the prefix cache all equal
 * ina_generate's tokens on the same model, run alone; the repeated prompts must reuse
 * cached pages, whose entries hold the index keys. Prompts and outputs are longer than the
 * top-k, so each query chooses, and the pool is small enough that the streams compete for
 * pages and the prefix cache evicts. */
#include <pthread.h>
#include <unistd.h>

#include "tests/test_util.h"
#include "tests/agent/daemon/agent_test_util.h"

#define MODEL "v3.2-tiny"
#define KV_TOKENS 256 /* 16 pages: four streams of up to 5 pages each overflow it */
#define TOPK 8 /* v3.2-tiny's index_topk */

static void test_info(ina_rpc_client_t *c) {
  Ina__V1__GetNodeInfoRequest req = INA__V1__GET_NODE_INFO_REQUEST__INIT;
  uint8_t *resp = NULL;
  size_t n = 0;
  CHECK(at_unary(c, "/ina.v1.Node/GetNodeInfo", &req.base, &resp, &n, NULL) == INA_RPC_OK);
  Ina__V1__NodeInfo *info = ina__v1__node_info__unpack(NULL, n, resp);
  CHECK(info != NULL && info->model != NULL);
  if (info && info->model) {
    const Ina__V1__ModelInfo *m = info->model;
    CHECKF(strcmp(m->name, MODEL) == 0, "model name %s", m->name);
    CHECKF(strcmp(m->architecture, "DeepseekV32ForCausalLM") == 0, "architecture %s", m->architecture);
    CHECKF(m->index_topk == TOPK, "index_topk %u, want %d", m->index_topk, TOPK);
    CHECK(m->n_layers == 4 && m->n_moe_layers == 3 && m->n_routed_experts == 8);
    CHECKF(strcmp(m->weight_dtype, "f32") == 0, "weight dtype %s", m->weight_dtype);
  }
  if (info) ina__v1__node_info__free_unpacked(info, NULL);
  free(resp);
}

typedef struct stream_job {
  ina_rpc_client_t *client;
  int32_t prompt[64], expect[64];
  int32_t len, max_new, n_expect;
  char id[32];
  at_stream_t stream;
} stream_job_t;

static void *run_job(void *arg) {
  stream_job_t *t = arg;
  const at_request_t r = {t->id, t->prompt, t->len, (uint32_t)t->max_new, 1, 0};
  at_generate(t->client, &r, &t->stream);
  return NULL;
}

/* A prompt of [min_len, max_len] ids, its token budget and ina_generate's answer. */
static void make_job(stream_job_t *t, ina_rpc_client_t *c, at_reference_t *ref, test_rng_t *rng, int32_t min_len,
                     int32_t max_len, const char *id) {
  t->client = c;
  t->len = (int32_t)test_rng_int(rng, min_len, max_len);
  for (int32_t i = 0; i < t->len; i++) t->prompt[i] = (int32_t)test_rng_int(rng, 0, 1023);
  t->max_new = (int32_t)test_rng_int(rng, 12, 32);
  t->n_expect = at_reference_run(ref, t->prompt, t->len, t->max_new, 1, t->expect);
  CHECK(t->n_expect == t->max_new);
  snprintf(t->id, sizeof t->id, "%s", id);
}

static void check_job(const stream_job_t *t, const char *what) {
  CHECKF(t->stream.st == INA_OK, "%s %s: %s", what, t->id, t->stream.status.message);
  CHECKF(at_same_tokens(&t->stream, t->expect, t->n_expect), "%s %s: the stream differs from ina_generate", what,
         t->id);
  CHECK(t->stream.finals == 1 && t->stream.bad == 0);
}

int main(void) {
  test_rng_t rng = {test_seed("test_agent_serve_v32")};
  ina_log_set_quiet_errors(1);
  const uint64_t seed = test_rng_next(&rng);
  ina_agent_options_t o = at_options(seed, KV_TOKENS);
  o.model = MODEL;
  o.warmup_tokens = 16;
  o.scheduler.prefix_cache_pages = -1; /* half the pool: the repeated prompts reuse pages */
  ina_agent_t *agent = NULL;
  CHECK_OK(ina_agent_create(&o, &agent));
  if (!agent) return test_finish("test_agent_serve_v32");
  ina_rpc_client_t *c = at_client(ina_agent_port(agent), NULL);
  at_reference_t ref;
  at_reference_open_model(&ref, MODEL, seed);
  for (int i = 0; i < 200 && at_health(c) != 1; i++) at_sleep_ms(50); /* the warm-up */
  CHECK(at_health(c) == 1);
  test_info(c);

  /* One at a time: a one-token prompt, then prompts around and past the top-k. */
  enum { ALONE = 4, CONCURRENT = 4 };
  static stream_job_t alone[ALONE], together[CONCURRENT], again[CONCURRENT];
  for (int i = 0; i < ALONE; i++) {
    char id[32];
    snprintf(id, sizeof id, "alone-%d", i);
    make_job(&alone[i], c, &ref, &rng, i == 0 ? 1 : TOPK - 2, i == 0 ? 1 : 48, id);
    run_job(&alone[i]);
    check_job(&alone[i], "alone");
  }
  /* Concurrent streams (batched decode, prefills of several lengths in one step), then the
   * same prompts again: their full pages come from the prefix cache. */
  pthread_t th[CONCURRENT];
  for (int i = 0; i < CONCURRENT; i++) {
    char id[32];
    snprintf(id, sizeof id, "together-%d", i);
    make_job(&together[i], c, &ref, &rng, 17, 48, id);
    again[i] = together[i];
    snprintf(again[i].id, sizeof again[i].id, "again-%d", i);
  }
  for (int i = 0; i < CONCURRENT; i++) CHECK(pthread_create(&th[i], NULL, run_job, &together[i]) == 0);
  for (int i = 0; i < CONCURRENT; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < CONCURRENT; i++) check_job(&together[i], "concurrent");
  for (int i = 0; i < CONCURRENT; i++) CHECK(pthread_create(&th[i], NULL, run_job, &again[i]) == 0);
  for (int i = 0; i < CONCURRENT; i++) pthread_join(th[i], NULL);
  uint32_t cached = 0;
  for (int i = 0; i < CONCURRENT; i++) {
    check_job(&again[i], "repeated");
    cached += again[i].stream.cached_prompt_tokens;
    printf("repeated prompt %d: %d tokens, %u from the prefix cache\n", i, again[i].len,
           again[i].stream.cached_prompt_tokens);
  }
  CHECKF(cached > 0, "no repeated prompt reused a cached page");

  ina_agent_request_stop(agent);
  CHECK_OK(ina_agent_wait(agent));
  ina_rpc_client_destroy(c);
  ina_agent_destroy(agent);
  at_reference_close(&ref);
  return test_finish("test_agent_serve_v32");
}
