/* Log probabilities through the scheduler (ina_request_t.logprobs): random requests,
 * greedy and sampled, with 0..20 alternatives asked or none, batched together on the CPU
 * engine with the tiny model. Each token event's figures are checked against this test's
 * own log-softmax of the reference run's logits row for that position (the request alone
 * through ina_generate): the scheduler's rows are bitwise the reference's (its stated
 * numerics on the CPU engine, no preemption here), and both sides compute in double and
 * round once to float, differing only in summation order, so a logprob may differ by one
 * float rounding (2^-24 relative) plus vocab * 2^-52 of the log-sum: bound 2^-22 *
 * max(1, |ref|). The alternatives must be exactly the top ids of the row (higher logit
 * first, ties by the lower id), the sampled token's logprob its own row entry, and
 * requests without logprobs get NAN and none. The tokens equal the reference's: asking
 * for logprobs moves a greedy step off the argmax-only path and must change nothing. */
#include <math.h>

#include "../../test_util.h"
#include "core/log.h"
#include "sched_test_util.h"

#define MAX_PROMPT 40
#define MAX_NEW 12
#define N 8

typedef struct lp_case {
  int32_t prompt[MAX_PROMPT];
  int32_t prompt_len, max_new, logprobs;
  ina_sampling_params_t sampling;
  int32_t ref[MAX_NEW];
  float *ref_logits; /* [prompt_len + max_new - 1, vocab] */
  /* What the events carried. */
  int32_t tokens[MAX_NEW], num_tokens, finals, bad;
  float lp[MAX_NEW];
  int32_t num_top[MAX_NEW];
  int32_t top_ids[MAX_NEW][INA_REQUEST_MAX_LOGPROBS];
  float top_lp[MAX_NEW][INA_REQUEST_MAX_LOGPROBS];
  char id[16];
} lp_case_t;

static int32_t g_vocab;

static void on_event(const ina_request_event_t *ev, void *user) {
  lp_case_t *c = user;
  if (ev->finish != INA_FINISH_NONE) {
    c->finals++;
    return;
  }
  const int32_t i = c->num_tokens++;
  if (i >= MAX_NEW || ev->num_top < 0 || ev->num_top > INA_REQUEST_MAX_LOGPROBS) {
    c->bad++;
    return;
  }
  c->tokens[i] = ev->token;
  c->lp[i] = ev->logprob;
  c->num_top[i] = ev->num_top;
  for (int32_t j = 0; j < ev->num_top; j++) {
    c->top_ids[i][j] = ev->top_ids[j];
    c->top_lp[i][j] = ev->top_logprobs[j];
  }
}

/* log Z of a row, summed from the top index down (the scheduler sums upwards). */
static double log_z(const float *row) {
  double max = -INFINITY, sum = 0;
  for (int32_t v = 0; v < g_vocab; v++) max = row[v] > max ? row[v] : max;
  for (int32_t v = g_vocab - 1; v >= 0; v--) sum += exp((double)row[v] - max);
  return max + log(sum);
}

static int lp_close(float got, double want) { return fabs((double)got - want) <= ldexp(1.0, -22) * fmax(1.0, fabs(want)); }

/* The k best ids of a row by a plain selection: higher logit, then lower id. */
static void top_ids(const float *row, int32_t k, int32_t *out) {
  for (int32_t j = 0; j < k; j++) {
    int32_t best = -1;
    for (int32_t v = 0; v < g_vocab; v++) {
      int taken = 0;
      for (int32_t q = 0; q < j; q++) taken |= out[q] == v;
      if (!taken && (best < 0 || row[v] > row[best])) best = v;
    }
    out[j] = best;
  }
}

static void check_case(const lp_case_t *c) {
  CHECKF(c->finals == 1 && c->bad == 0 && c->num_tokens == c->max_new, "%s: %d finals, %d bad events, %d tokens",
         c->id, c->finals, c->bad, c->num_tokens);
  for (int32_t i = 0; i < c->num_tokens && i < c->max_new; i++) {
    CHECKF(c->tokens[i] == c->ref[i], "%s: token %d is %d, the reference's %d", c->id, i, c->tokens[i], c->ref[i]);
    const float *row = c->ref_logits + (int64_t)(c->prompt_len - 1 + i) * g_vocab;
    if (c->logprobs < 0) {
      CHECKF(isnan(c->lp[i]) && c->num_top[i] == 0, "%s: token %d without logprobs has logprob %g and %d alternatives",
             c->id, i, (double)c->lp[i], c->num_top[i]);
      continue;
    }
    const double z = log_z(row);
    CHECKF(lp_close(c->lp[i], (double)row[c->tokens[i]] - z), "%s: token %d logprob %.9g, want %.9g", c->id, i,
           (double)c->lp[i], (double)row[c->tokens[i]] - z);
    CHECKF(c->num_top[i] == c->logprobs, "%s: token %d has %d alternatives, asked %d", c->id, i, c->num_top[i],
           c->logprobs);
    int32_t want[INA_REQUEST_MAX_LOGPROBS];
    top_ids(row, c->logprobs, want);
    for (int32_t j = 0; j < c->num_top[i] && j < c->logprobs; j++) {
      CHECKF(c->top_ids[i][j] == want[j], "%s: token %d alternative %d is %d, want %d", c->id, i, j, c->top_ids[i][j],
             want[j]);
      CHECKF(lp_close(c->top_lp[i][j], (double)row[want[j]] - z), "%s: token %d alternative %d logprob %.9g", c->id, i, j,
             (double)c->top_lp[i][j]);
    }
  }
}

int main(void) {
  test_rng_t rng = {test_seed("test_scheduler_logprobs")};
  ina_model_t *m = sched_test_model(test_rng_next(&rng));
  g_vocab = ina_model_config(m)->vocab_size;
  static lp_case_t cases[N];
  ina_engine_t *ref = sched_test_engine(m, 4, 1025);
  for (int32_t i = 0; i < N; i++) {
    lp_case_t *c = &cases[i];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "lp-%d", (int)i);
    c->prompt_len = (int32_t)test_rng_int(&rng, 1, MAX_PROMPT);
    c->max_new = (int32_t)test_rng_int(&rng, 1, MAX_NEW);
    for (int32_t t = 0; t < c->prompt_len; t++) c->prompt[t] = (int32_t)test_rng_int(&rng, 2, g_vocab - 1);
    /* Half greedy; a quarter without logprobs, the rest 0..20 alternatives. */
    c->sampling = (ina_sampling_params_t)INA_SAMPLING_PARAMS_INIT;
    if (i % 2) {
      c->sampling.temperature = 0.8f;
      c->sampling.top_k = 40;
      c->sampling.seed = test_rng_next(&rng);
    }
    c->logprobs = i % 4 == 3 ? -1 : (int32_t)test_rng_int(&rng, 0, INA_REQUEST_MAX_LOGPROBS);
    c->ref_logits = malloc((size_t)(c->prompt_len + c->max_new - 1) * (size_t)g_vocab * sizeof(float));
    CHECK(sched_test_reference(ref, c->prompt, c->prompt_len, c->max_new, &c->sampling, 1, c->ref, c->ref_logits) ==
          c->max_new);
  }
  ina_engine_destroy(ref);
  ina_engine_t *e = sched_test_engine(m, 4, 1025);
  ina_scheduler_t *s = NULL;
  CHECK_OK(ina_scheduler_create(e, NULL, &s));
  for (int32_t i = 0; s && i < N; i++) {
    lp_case_t *c = &cases[i];
    ina_request_t r = INA_REQUEST_INIT;
    r.id = c->id;
    r.prompt = c->prompt;
    r.prompt_len = c->prompt_len;
    r.max_new_tokens = c->max_new;
    r.sampling = c->sampling;
    r.ignore_eos = 1;
    r.logprobs = c->logprobs;
    r.callback = on_event;
    r.user_data = c;
    CHECK_OK(ina_scheduler_submit(s, &r));
  }
  if (s) {
    sched_test_drain(s, 10000);
    ina_scheduler_stats_t st;
    ina_scheduler_stats(s, &st);
    CHECK(st.preemptions == 0);
    for (int32_t i = 0; i < N; i++) check_case(&cases[i]);
    /* Out of range is refused. */
    ina_log_set_quiet_errors(1);
    ina_request_t r = INA_REQUEST_INIT;
    const int32_t p[1] = {5};
    r.id = "bad";
    r.prompt = p;
    r.prompt_len = 1;
    r.logprobs = INA_REQUEST_MAX_LOGPROBS + 1;
    CHECK(ina_scheduler_submit(s, &r) == INA_ERR_INVALID_ARGUMENT && strstr(ina_last_error(), "logprobs"));
    r.logprobs = -2;
    CHECK(ina_scheduler_submit(s, &r) == INA_ERR_INVALID_ARGUMENT);
    ina_log_set_quiet_errors(0);
  }
  ina_scheduler_destroy(s);
  ina_engine_destroy(e);
  for (int32_t i = 0; i < N; i++) free(cases[i].ref_logits);
  ina_model_destroy(m);
  return test_finish("test_scheduler_logprobs");
}
