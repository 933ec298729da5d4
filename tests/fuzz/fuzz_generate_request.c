/* Fuzz target: ina.v1.GenerateRequest, the bytes any client sends to
 * Inference.Generate. The handler (agent/service_inference.c) unpacks them with
 * protobuf-c, runs ina_validate_generate_request and only then reads the fields.
 *
 * For every input that unpacks (see fuzz_message.h for the checks of the decoded message
 * itself), under the limits of DeepSeek-V3 and of a tiny model whose every boundary is a
 * few bytes away, it traps unless:
 *  - the verdict follows fuzz_verdict.h, and a rejection has code INVALID_ARGUMENT;
 *  - the verdict agrees with the rules inference.proto documents, read here apart from
 *    proto/validate.c: a request is accepted exactly when it breaks none of them, and a
 *    rejection names the field of the first broken rule (in the order validate.h lists);
 *  - an accepted request fits the int32_t fields the handler copies it into;
 *  - the canonical re-encoding of the request gets the same verdict (when it has one:
 *    see fuzz_redecode).
 * Inputs that do not unpack are refused by the handler with INVALID_ARGUMENT; they must
 * only not crash. Everything is freed (LeakSanitizer checks). */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "proto/validate.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_message.h"
#include "tests/fuzz/fuzz_verdict.h"

static const ina_generate_limits_t kLimits[] = {
    {129280, 163840}, /* DeepSeek-V3: vocab_size, max_position_embeddings */
    {16, 8},          /* a tiny model */
};

static bool in_range(float x, float lo, float hi, bool hi_open) {
  return isfinite(x) && x >= lo && (hi_open ? x < hi : x <= hi);
}

/* The field path of the first rule of inference.proto that r breaks, or NULL. */
static const char *first_broken_rule(const Ina__V1__GenerateRequest *r,
                                     const ina_generate_limits_t *lim) {
  size_t id_len = strlen(r->request_id);
  if (id_len < 1 || id_len > INA_PROTO_MAX_REQUEST_ID_LEN) return "request_id";
  for (size_t i = 0; i < id_len; i++) {
    unsigned char c = (unsigned char)r->request_id[i];
    if (c < 0x21 || c > 0x7e) return "request_id";
  }
  if (r->n_prompt_token_ids == 0) return "prompt_token_ids";
  for (size_t i = 0; i < r->n_prompt_token_ids; i++)
    if (r->prompt_token_ids[i] >= lim->vocab_size) return "prompt_token_ids";
  if (r->max_tokens < 1 || r->n_prompt_token_ids + (uint64_t)r->max_tokens > lim->max_context_tokens)
    return "max_tokens";
  const Ina__V1__SamplingParams *s = r->sampling;
  if (s) {
    if (!in_range(s->temperature, 0.0f, INA_PROTO_MAX_TEMPERATURE, false)) return "sampling.temperature";
    if (!in_range(s->top_p, 0.0f, 1.0f, false)) return "sampling.top_p";
    if (s->top_k > lim->vocab_size) return "sampling.top_k";
    if (!in_range(s->min_p, 0.0f, 1.0f, true)) return "sampling.min_p";
    if (!in_range(s->repetition_penalty, 0.0f, INA_PROTO_MAX_REPETITION_PENALTY, false))
      return "sampling.repetition_penalty";
  }
  if (r->n_stop_token_ids > INA_PROTO_MAX_STOP_IDS) return "stop_token_ids";
  for (size_t i = 0; i < r->n_stop_token_ids; i++) {
    if (r->stop_token_ids[i] >= lim->vocab_size) return "stop_token_ids";
    for (size_t j = 0; j < i; j++)
      if (r->stop_token_ids[j] == r->stop_token_ids[i]) return "stop_token_ids";
  }
  if (r->stream_interval > INA_PROTO_MAX_STREAM_INTERVAL) return "stream_interval";
  const size_t agent_len = r->prefill_agent ? strlen(r->prefill_agent) : 0;
  if (agent_len > 255) return "prefill_agent";
  for (size_t i = 0; i < agent_len; i++) {
    unsigned char c = (unsigned char)r->prefill_agent[i];
    if (c < 0x21 || c > 0x7e) return "prefill_agent";
  }
  return NULL;
}

static ina_status_t validate(const void *req, const void *limits, char *msg, size_t msg_size,
                             ina_proto_code_t *code) {
  return ina_validate_generate_request(req, limits, msg, msg_size, code);
}

static void judge(const Ina__V1__GenerateRequest *r, const Ina__V1__GenerateRequest *again,
                  const ina_generate_limits_t *lim) {
  fuzz_verdict_t v, v_again;
  fuzz_verdict_take(validate, r, lim, &v);
  if (again) {
    fuzz_verdict_take(validate, again, lim, &v_again);
    fuzz_verdict_same(&v, &v_again);
  }

  const char *broken = first_broken_rule(r, lim);
  if (v.status == INA_OK) {
    FUZZ_REQUIRE(broken == NULL, "accepted, but %s breaks its rule", broken);
    /* submit() in agent/service_inference.c casts these to int32_t. */
    FUZZ_REQUIRE(r->n_prompt_token_ids <= INT32_MAX && r->max_tokens <= INT32_MAX &&
                     (!r->sampling || r->sampling->top_k <= INT32_MAX),
                 "accepted values overflow int32_t");
    return;
  }
  FUZZ_REQUIRE(v.code == INA_PROTO_CODE_INVALID_ARGUMENT, "code %d for \"%s\"", (int)v.code, v.msg);
  FUZZ_REQUIRE(broken != NULL, "rejected (\"%s\"), but every rule holds", v.msg);
  const char *const fields[] = {broken, NULL};
  FUZZ_REQUIRE(fuzz_names_field(v.msg, fields), "first broken rule is %s, message \"%s\"", broken,
               v.msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ProtobufCMessage *m = fuzz_decode(&ina__v1__generate_request__descriptor, data, size);
  if (!m) return 0;
  ProtobufCMessage *again = fuzz_redecode(m);
  for (size_t i = 0; i < sizeof kLimits / sizeof kLimits[0]; i++)
    judge((const Ina__V1__GenerateRequest *)m, (const Ina__V1__GenerateRequest *)again, &kLimits[i]);
  protobuf_c_message_free_unpacked(again, NULL);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
