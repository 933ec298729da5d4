/* Batched generation on an engine: one prefill step over all prompts, then decode steps
 * in which every unfinished request adds one token, until each has its max_new_tokens or
 * samples the end-of-sequence id.
 *
 * Ownership: the caller owns every buffer in the requests. Thread safety: as the engine. */
#ifndef INA_MODEL_GENERATE_H
#define INA_MODEL_GENERATE_H

#include <stdint.h>

#include "core/status.h"
#include "model/model.h"
#include "model/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_generate_request {
  const int32_t *prompt;
  int32_t prompt_len; /* >= 1 */
  int32_t max_new_tokens;
  ina_sampling_params_t sampling;
  int ignore_eos;
  int32_t *output;    /* [max_new_tokens], written */
  int32_t num_generated;
  /* Optional [prompt_len + max_new_tokens - 1, vocab]: the logits of every processed
   * position, prompt first, then each decode step. Rows past
   * prompt_len + num_generated - 1 are left as they were. */
  float *logits;
} ina_generate_request_t;

typedef struct ina_generate_stats {
  double prefill_seconds, decode_seconds;
  int64_t prefill_tokens, decode_tokens;
  int32_t decode_steps;
} ina_generate_stats_t;

ina_status_t ina_generate(ina_engine_t *engine, ina_generate_request_t *requests, int32_t count,
                          ina_generate_stats_t *stats);

#ifdef __cplusplus
}
#endif
#endif
