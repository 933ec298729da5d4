/* Fuzz target: ina.v1.PrefillRequest, the bytes a decode agent (or anyone who reaches the
 * port) sends to KvTransfer.Prefill. The handler (agent/handoff/prefill_side.c, prefill
 * and make_transfer) unpacks them with protobuf-c, runs ina_validate_prefill_request and
 * only then reads the fields.
 *
 * For every input that unpacks (see fuzz_message.h for the checks of the decoded message
 * itself), under the limits of DeepSeek-V3 and of a tiny model whose every boundary is a
 * few bytes away, it traps unless:
 *  - the verdict follows fuzz_verdict.h, and a rejection has code INVALID_ARGUMENT;
 *  - the verdict agrees with the rules kv_transfer.proto and validate.h document, read
 *    here apart from proto/validate.c: a request is accepted exactly when it breaks none
 *    of them, and a rejection names the field of the first broken rule (in the order
 *    validate.h lists);
 *  - an accepted request fits what the handler copies it into: the transfer id its
 *    129-byte buffer, the prompt length, page ids, first_token, top_k and the decode
 *    layout's page_size, num_pages and num_layers int32_t, entry_bytes int64_t, and every
 *    byte offset of the decode agent's storage that kvcache/kv_copy.h computes (in
 *    int64_t) for the tokens [first_token, prompt length) it writes is in range;
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

static const ina_prefill_limits_t kLimits[] = {
    {129280, 163840}, /* DeepSeek-V3: vocab_size, max_position_embeddings */
    {16, 8},          /* a tiny model */
};

/* The handler's transfer id buffer holds this many bytes before the NUL
 * (HANDOFF_ID_MAX, agent/handoff/handoff_internal.h). */
#define HANDLER_ID_MAX 128

static bool in_range(float x, float lo, float hi, bool hi_open) {
  return isfinite(x) && x >= lo && (hi_open ? x < hi : x <= hi);
}

/* The field path of the first rule of kv_transfer.proto / validate.h that r breaks, or
 * NULL. */
static const char *first_broken_rule(const Ina__V1__PrefillRequest *r, const ina_prefill_limits_t *lim) {
  /* transfer_id: 1..128 printable ASCII characters (as GenerateRequest.request_id). */
  size_t id_len = strlen(r->transfer_id);
  if (id_len < 1 || id_len > INA_PROTO_MAX_REQUEST_ID_LEN) return "transfer_id";
  for (size_t i = 0; i < id_len; i++) {
    unsigned char c = (unsigned char)r->transfer_id[i];
    if (c < 0x21 || c > 0x7e) return "transfer_id";
  }
  /* The whole prompt, non-empty, each id in [0, vocab_size); it and its first token fit. */
  if (r->n_prompt_token_ids == 0 || r->n_prompt_token_ids + (uint64_t)1 > lim->max_context_tokens)
    return "prompt_token_ids";
  for (size_t i = 0; i < r->n_prompt_token_ids; i++)
    if (r->prompt_token_ids[i] >= lim->vocab_size) return "prompt_token_ids";
  const Ina__V1__SamplingParams *s = r->sampling;
  if (s) {
    if (!in_range(s->temperature, 0.0f, INA_PROTO_MAX_TEMPERATURE, false)) return "sampling.temperature";
    if (!in_range(s->top_p, 0.0f, 1.0f, false)) return "sampling.top_p";
    if (s->top_k > lim->vocab_size) return "sampling.top_k";
    if (!in_range(s->min_p, 0.0f, 1.0f, true)) return "sampling.min_p";
    if (!in_range(s->repetition_penalty, 0.0f, INA_PROTO_MAX_REPETITION_PENALTY, false))
      return "sampling.repetition_penalty";
  }
  /* 0 none, else 1 + 0..20 alternatives. */
  if (r->logprobs_plus_one > 1 + INA_PROTO_MAX_LOGPROBS) return "logprobs_plus_one";
  /* The decode endpoint: a layout with every count in 1..its bound and storage that an
   * int64_t can address, and a blob. */
  if (!r->decode || !r->decode->layout) return "decode.layout";
  const Ina__V1__KvLayout *l = r->decode->layout;
  if (l->page_size < 1 || l->page_size > INA_PROTO_MAX_KV_PAGE_SIZE) return "decode.layout";
  if (l->num_pages < 1 || l->num_pages > INA_PROTO_MAX_KV_PAGES) return "decode.layout";
  if (l->num_layers < 1 || l->num_layers > INA_PROTO_MAX_KV_LAYERS) return "decode.layout";
  if (l->entry_bytes < 1 || l->entry_bytes > INA_PROTO_MAX_KV_ENTRY_BYTES) return "decode.layout";
  const unsigned __int128 storage =
      (unsigned __int128)l->num_layers * l->num_pages * l->page_size * l->entry_bytes;
  if (storage > (unsigned __int128)INT64_MAX) return "decode.layout";
  if (r->decode->ucx_blob.len < 1 || r->decode->ucx_blob.len > INA_PROTO_MAX_BLOB_BYTES) return "decode.ucx_blob";
  /* ceil(prompt / page_size) pages, each a page of the decode agent's cache. */
  size_t want_pages = r->n_prompt_token_ids / l->page_size + (r->n_prompt_token_ids % l->page_size != 0);
  if (r->n_decode_pages != want_pages) return "decode_pages";
  for (size_t i = 0; i < r->n_decode_pages; i++)
    if (r->decode_pages[i] >= l->num_pages) return "decode_pages";
  if (r->first_token >= r->n_prompt_token_ids) return "first_token";
  return NULL;
}

/* What make_transfer, submit_prefill and the link thread then take for granted. */
static void check_handler_fit(const Ina__V1__PrefillRequest *r) {
  const Ina__V1__KvLayout *l = r->decode->layout;
  FUZZ_REQUIRE(strlen(r->transfer_id) <= HANDLER_ID_MAX, "transfer_id of %zu bytes accepted",
               strlen(r->transfer_id));
  FUZZ_REQUIRE(r->n_prompt_token_ids <= INT32_MAX && r->first_token <= INT32_MAX &&
                   (!r->sampling || r->sampling->top_k <= INT32_MAX),
               "accepted prompt length %zu, first_token %u or top_k overflow int32_t", r->n_prompt_token_ids,
               r->first_token);
  for (size_t i = 0; i < r->n_decode_pages; i++)
    FUZZ_REQUIRE(r->decode_pages[i] <= INT32_MAX, "decode_pages[%zu] %u overflows int32_t", i, r->decode_pages[i]);
  FUZZ_REQUIRE(l->page_size <= INT32_MAX && l->num_pages <= INT32_MAX && l->num_layers <= INT32_MAX &&
                   l->entry_bytes <= INT64_MAX,
               "accepted layout %u/%u/%u/%llu overflows ina_kv_layout_t", l->page_size, l->num_pages,
               l->num_layers, (unsigned long long)l->entry_bytes);
  FUZZ_REQUIRE((int32_t)r->logprobs_plus_one - 1 >= -1 && (int32_t)r->logprobs_plus_one - 1 <= 20,
               "logprobs %d out of the scheduler's -1..20", (int32_t)r->logprobs_plus_one - 1);
  /* The link thread writes tokens [first_token, prompt length): token t to decode page
   * decode_pages[t / page_size], at ((layer * num_pages + page) * page_size + t %
   * page_size) * entry_bytes; the last byte of the last layer's last token is the
   * furthest. */
  const uint64_t last = r->n_prompt_token_ids - 1;
  const uint64_t page_index = last / l->page_size;
  FUZZ_REQUIRE(r->first_token <= last && page_index < r->n_decode_pages,
               "token %llu's page %llu is outside the %zu decode pages", (unsigned long long)last,
               (unsigned long long)page_index, r->n_decode_pages);
  uint32_t max_page = 0;
  for (size_t i = 0; i < r->n_decode_pages; i++)
    if (r->decode_pages[i] > max_page) max_page = r->decode_pages[i];
  const unsigned __int128 end =
      (((unsigned __int128)(l->num_layers - 1) * l->num_pages + max_page) * l->page_size + (l->page_size - 1) + 1) *
      l->entry_bytes;
  FUZZ_REQUIRE(end <= (unsigned __int128)INT64_MAX, "a write ends past int64_t: layout %u/%u/%u/%llu, page %u",
               l->page_size, l->num_pages, l->num_layers, (unsigned long long)l->entry_bytes, max_page);
}

static ina_status_t validate(const void *req, const void *limits, char *msg, size_t msg_size,
                             ina_proto_code_t *code) {
  return ina_validate_prefill_request(req, limits, msg, msg_size, code);
}

static void judge(const Ina__V1__PrefillRequest *r, const Ina__V1__PrefillRequest *again,
                  const ina_prefill_limits_t *lim) {
  fuzz_verdict_t v, v_again;
  fuzz_verdict_take(validate, r, lim, &v);
  if (again) {
    fuzz_verdict_take(validate, again, lim, &v_again);
    fuzz_verdict_same(&v, &v_again);
  }

  const char *broken = first_broken_rule(r, lim);
  if (v.status == INA_OK) {
    FUZZ_REQUIRE(broken == NULL, "accepted, but %s breaks its rule", broken);
    check_handler_fit(r);
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
  ProtobufCMessage *m = fuzz_decode(&ina__v1__prefill_request__descriptor, data, size);
  if (!m) return 0;
  ProtobufCMessage *again = fuzz_redecode(m);
  for (size_t i = 0; i < sizeof kLimits / sizeof kLimits[0]; i++)
    judge((const Ina__V1__PrefillRequest *)m, (const Ina__V1__PrefillRequest *)again, &kLimits[i]);
  protobuf_c_message_free_unpacked(again, NULL);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
