#define INA_LOG_SUBSYS "model"
#include "model/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct gen_state {
  ina_engine_t *engine;
  ina_generate_request_t *reqs;
  int32_t count, vocab, eos;
  ina_kv_seq_t *seqs;
  ina_kv_seq_t **seq_ptrs;
  ina_sampler_t **samplers;
  int32_t *qo, *tokens, *active; /* active: requests still generating */
  int32_t *chosen;                /* [count]: a greedy decode step's tokens */
  int32_t nactive;
  float *logits;
} gen_state_t;

/* Take a request's next token from its logits row, or the engine's greedy choice when
 * row is NULL; *finished when it is done. */
static ina_status_t take_token(gen_state_t *g, int32_t r, const float *row, int32_t greedy, int *finished) {
  ina_status_t st = INA_OK;
  ina_generate_request_t *q = &g->reqs[r];
  int32_t token = greedy;
  if (row)
    INA_CHECK(ina_sampler_sample(g->samplers[r], row, &token));
  else
    INA_REQUIRE(token >= 0, INA_ERR_INVALID_ARGUMENT, "sampler: all %d logits are NaN", (int)g->vocab);
  q->output[q->num_generated++] = token;
  *finished = q->num_generated >= q->max_new_tokens || (!q->ignore_eos && token == g->eos);
fail:
  return st;
}

static ina_status_t prefill(gen_state_t *g, int any_logits, ina_generate_stats_t *stats) {
  ina_status_t st = INA_OK;
  const int64_t V = g->vocab;
  int32_t n = 0;
  g->qo[0] = 0;
  for (int32_t r = 0; r < g->count; r++) {
    memcpy(g->tokens + g->qo[r], g->reqs[r].prompt, (size_t)g->reqs[r].prompt_len * sizeof(int32_t));
    g->qo[r + 1] = g->qo[r] + g->reqs[r].prompt_len;
    g->seq_ptrs[r] = &g->seqs[r];
  }
  const double t0 = now_seconds();
  ina_batch_t b = {g->count, g->seq_ptrs, g->qo, g->tokens, any_logits};
  INA_CHECK(ina_engine_forward(g->engine, &b, g->logits));
  stats->prefill_seconds += now_seconds() - t0;
  stats->prefill_tokens += g->qo[g->count];
  for (int32_t r = 0; r < g->count; r++) {
    ina_generate_request_t *q = &g->reqs[r];
    const float *last = g->logits + (any_logits ? (int64_t)(g->qo[r + 1] - 1) : r) * V;
    if (q->logits && any_logits)
      memcpy(q->logits, g->logits + (int64_t)g->qo[r] * V, (size_t)q->prompt_len * V * sizeof(float));
    int finished = q->max_new_tokens == 0;
    if (!finished) INA_CHECK(take_token(g, r, last, -1, &finished));
    if (!finished) g->active[n++] = r;
  }
  g->nactive = n;
fail:
  return st;
}

static ina_status_t decode(gen_state_t *g, ina_generate_stats_t *stats) {
  ina_status_t st = INA_OK;
  const int64_t V = g->vocab;
  int32_t n = g->nactive;
  ina_kv_seq_t **ptrs = malloc((size_t)(g->count > 0 ? g->count : 1) * sizeof *ptrs);
  INA_CHECK_ALLOC(ptrs);
  while (n > 0) {
    g->qo[0] = 0;
    for (int32_t k = 0; k < n; k++) {
      const ina_generate_request_t *q = &g->reqs[g->active[k]];
      ptrs[k] = &g->seqs[g->active[k]];
      g->tokens[k] = q->output[q->num_generated - 1];
      g->qo[k + 1] = k + 1;
    }
    /* Greedy requests that keep no logits need only each row's argmax: the engine then
     * returns the tokens (a GPU copies 4 bytes a row instead of the row's logits). */
    int greedy = 1;
    for (int32_t k = 0; k < n; k++) {
      const ina_generate_request_t *q = &g->reqs[g->active[k]];
      greedy &= q->sampling.temperature == 0.0f && !q->logits;
    }
    const double t0 = now_seconds();
    ina_batch_t b = {n, ptrs, g->qo, g->tokens, 0};
    if (greedy)
      INA_CHECK(ina_engine_forward_greedy(g->engine, &b, g->chosen));
    else
      INA_CHECK(ina_engine_forward(g->engine, &b, g->logits));
    stats->decode_seconds += now_seconds() - t0;
    stats->decode_tokens += n;
    stats->decode_steps++;
    int32_t still = 0;
    for (int32_t k = 0; k < n; k++) {
      const int32_t r = g->active[k];
      ina_generate_request_t *q = &g->reqs[r];
      const float *row = greedy ? NULL : g->logits + (int64_t)k * V;
      if (q->logits)
        memcpy(q->logits + (int64_t)(q->prompt_len + q->num_generated - 1) * V, row, (size_t)V * sizeof(float));
      int finished;
      INA_CHECK(take_token(g, r, row, greedy ? g->chosen[k] : -1, &finished));
      if (!finished) g->active[still++] = r;
    }
    n = still;
  }
fail:
  free(ptrs);
  return st;
}

ina_status_t ina_generate(ina_engine_t *engine, ina_generate_request_t *reqs, int32_t count,
                          ina_generate_stats_t *stats) {
  ina_status_t st = INA_OK;
  gen_state_t g;
  ina_generate_stats_t local;
  memset(&g, 0, sizeof g);
  if (!stats) stats = &local;
  memset(stats, 0, sizeof *stats);
  INA_REQUIRE(engine && reqs && count > 0, INA_ERR_INVALID_ARGUMENT, "generate: no requests");
  const ina_model_config_t *c = ina_engine_config(engine);
  g.engine = engine;
  g.reqs = reqs;
  g.count = count;
  g.vocab = c->vocab_size;
  g.eos = c->eos_token_id;
  int64_t total = 0;
  int any_logits = 0;
  for (int32_t r = 0; r < count; r++) {
    INA_REQUIRE(reqs[r].prompt_len >= 1 && reqs[r].prompt, INA_ERR_INVALID_ARGUMENT,
                "generate: request %d has an empty prompt", r);
    INA_REQUIRE(reqs[r].max_new_tokens >= 0 && (reqs[r].max_new_tokens == 0 || reqs[r].output),
                INA_ERR_INVALID_ARGUMENT, "generate: request %d has no output buffer", r);
    reqs[r].num_generated = 0;
    total += reqs[r].prompt_len;
    any_logits |= reqs[r].logits != NULL;
  }
  g.seqs = calloc((size_t)count, sizeof *g.seqs);
  g.seq_ptrs = calloc((size_t)count, sizeof *g.seq_ptrs);
  g.samplers = calloc((size_t)count, sizeof *g.samplers);
  g.qo = malloc((size_t)(count + 1) * sizeof *g.qo);
  g.tokens = malloc((size_t)(total > count ? total : count) * sizeof *g.tokens);
  g.active = malloc((size_t)count * sizeof *g.active);
  g.chosen = malloc((size_t)count * sizeof *g.chosen);
  g.logits = ina_engine_logits_alloc(engine, any_logits ? total : count);
  INA_CHECK_ALLOC(g.seqs);
  INA_CHECK_ALLOC(g.seq_ptrs);
  INA_CHECK_ALLOC(g.samplers);
  INA_CHECK_ALLOC(g.qo);
  INA_CHECK_ALLOC(g.tokens);
  INA_CHECK_ALLOC(g.active);
  INA_CHECK_ALLOC(g.chosen);
  INA_CHECK_ALLOC(g.logits);
  for (int32_t r = 0; r < count; r++) INA_CHECK(ina_sampler_create(g.vocab, &reqs[r].sampling, &g.samplers[r]));
  INA_CHECK(prefill(&g, any_logits, stats));
  INA_CHECK(decode(&g, stats));
fail:
  if (g.seqs)
    for (int32_t r = 0; r < count; r++) ina_kv_seq_release(ina_engine_page_pool(engine), &g.seqs[r]);
  if (g.samplers)
    for (int32_t r = 0; r < count; r++) ina_sampler_destroy(g.samplers[r]);
  free(g.seqs);
  free(g.seq_ptrs);
  free(g.samplers);
  free(g.qo);
  free(g.tokens);
  free(g.active);
  free(g.chosen);
  ina_engine_logits_free(engine, g.logits);
  return st;
}
