/* Shared by the model tests: run prompts through an engine and collect logits. */
#ifndef INA_TESTS_MODEL_TEST_UTIL_H
#define INA_TESTS_MODEL_TEST_UTIL_H

#include <stdlib.h>

#include "model/generate.h"
#include "model/model.h"

/* Greedy generation of `max_new` tokens (ignoring eos) for one prompt; returns malloc'ed
 * logits [len + max_new - 1, vocab] and writes the tokens to out (may be NULL). */
static inline float *run_greedy(ina_engine_t *e, const int32_t *prompt, int32_t len, int32_t max_new,
                                int32_t *out) {
  const ina_model_config_t *c = ina_engine_config(e);
  ina_generate_request_t r;
  memset(&r, 0, sizeof r);
  ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
  int32_t *tokens = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof *tokens);
  float *logits = malloc((size_t)(len + max_new) * (size_t)c->vocab_size * sizeof(float));
  r.prompt = prompt;
  r.prompt_len = len;
  r.max_new_tokens = max_new;
  r.sampling = sp;
  r.ignore_eos = 1;
  r.output = tokens;
  r.logits = logits;
  if (ina_generate(e, &r, 1, NULL) != INA_OK) {
    free(logits);
    logits = NULL;
  } else if (out) {
    memcpy(out, tokens, (size_t)max_new * sizeof *out);
  }
  free(tokens);
  return logits;
}

static inline ina_engine_t *make_engine(const ina_model_t *m, int32_t page_size, int64_t max_tokens,
                                        int expanded_decode) {
  ina_engine_options_t o = INA_ENGINE_OPTIONS_INIT;
  ina_engine_t *e = NULL;
  o.page_size = page_size;
  o.max_tokens = max_tokens;
  o.num_threads = 2;
  o.expanded_decode = expanded_decode;
  return ina_engine_create(m, &o, &e) == INA_OK ? e : NULL;
}

#endif
