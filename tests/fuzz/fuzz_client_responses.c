/* Fuzz target: the responses the `ina` command line decodes from a server it was pointed
 * at (tools/cmd_client.c): ina.v1.NodeInfo (ina info), ina.v1.NodeHealth and
 * grpc.health.v1.HealthCheckResponse (ina health), ina.v1.GenerateResponse (each message
 * of the ina generate --server stream); and those a decode agent decodes from the prefill
 * agent it was pointed at (agent/handoff/decode_side.c): ina.v1.KvEndpoint
 * (handoff_check_target, GetKvEndpoint) and ina.v1.PrefillResponse (run_import). A server
 * is as untrusted as a client.
 *
 * Each input is decoded as each of the six. For every decoding it traps unless decoding
 * either fails (the client reports the call failed) or gives a sound message
 * (fuzz_message.h: every string the client prints is non-NULL and NUL-terminated, no
 * repeated GpuInfo / RankInfo / RankHealth entry is NULL, open enums keep unknown
 * values, the canonical re-encoding is stable). A KvEndpoint and a PrefillResponse are
 * then read the way the decode agent reads them: the layout, when present, converted to
 * an ina_kv_layout_t and compared with the agent's own, role and model_fingerprint
 * compared as strings; a response with as many top_logprobs as top_ids, at most 20,
 * copied into the agent's 20-entry arrays (AddressSanitizer checks each access), and
 * one that breaks that rule refused. Messages are freed (LeakSanitizer checks). */
#include <stdint.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "ina/v1/inference.pb-c.h"
#include "ina/v1/kv_transfer.pb-c.h"
#include "ina/v1/node.pb-c.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_message.h"

static const ProtobufCMessageDescriptor *const kClientResponses[] = {
    &ina__v1__node_info__descriptor,
    &ina__v1__node_health__descriptor,
    &grpc__health__v1__health_check_response__descriptor,
    &ina__v1__generate_response__descriptor,
};

/* The decode agent's side (kvcache/kv_copy.h's ina_kv_layout_t, scheduler.h's
 * INA_REQUEST_MAX_LOGPROBS), restated so that this target need not link them. */
typedef struct {
  int32_t page_size, num_pages, num_layers;
  int64_t entry_bytes;
} decode_layout_t;
#define DECODE_MAX_LOGPROBS 20

/* A DeepSeek-V3-like decode agent: 16-token pages, 61 layers, 656-byte MLA entries. */
static const decode_layout_t kOwnLayout = {16, 4096, 61, 656};
static const char kOwnFingerprint[] = "deepseek-ai/DeepSeek-V3 fp8 kv:bf16";

/* handoff_check_target: 1 when the endpoint would be paired with. */
static int check_endpoint(const Ina__V1__KvEndpoint *ep) {
  if (!ep->layout) return 0; /* "its endpoint does not decode" */
  const decode_layout_t theirs = {(int32_t)ep->layout->page_size, (int32_t)ep->layout->num_pages,
                                  (int32_t)ep->layout->num_layers, (int64_t)ep->layout->entry_bytes};
  if (strcmp(ep->role ? ep->role : "", "decode") == 0) return 0;
  if (theirs.page_size < 1 || theirs.num_pages < 1 || theirs.num_layers < 1 || theirs.entry_bytes < 1) return 0;
  if (theirs.num_layers != kOwnLayout.num_layers || theirs.entry_bytes != kOwnLayout.entry_bytes) return 0;
  return strcmp(ep->layout->model_fingerprint ? ep->layout->model_fingerprint : "", kOwnFingerprint) == 0;
}

/* run_import: 1 when the response is taken, its first token handed to the scheduler. */
static int take_response(const Ina__V1__PrefillResponse *pr) {
  if (pr->n_top_ids != pr->n_top_logprobs || pr->n_top_ids > DECODE_MAX_LOGPROBS) return 0;
  int32_t top_ids[DECODE_MAX_LOGPROBS];
  float top_logprobs[DECODE_MAX_LOGPROBS]; /* what ina_scheduler_import_done copies */
  for (size_t i = 0; i < pr->n_top_ids; i++) top_ids[i] = (int32_t)pr->top_ids[i];
  const int32_t num_top = (int32_t)pr->n_top_ids;
  FUZZ_REQUIRE(num_top >= 0 && num_top <= DECODE_MAX_LOGPROBS, "num_top %d", num_top);
  if (num_top > 0) memcpy(top_logprobs, pr->top_logprobs, (size_t)num_top * sizeof *top_logprobs);
  volatile int32_t sink = (int32_t)pr->token; /* the scheduler checks it against its vocabulary */
  for (int32_t i = 0; i < num_top; i++) sink ^= top_ids[i] ^ (int32_t)(top_logprobs[i] != top_logprobs[i]);
  (void)sink;
  (void)pr->logprob;
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  for (size_t i = 0; i < sizeof kClientResponses / sizeof kClientResponses[0]; i++)
    protobuf_c_message_free_unpacked(fuzz_decode(kClientResponses[i], data, size), NULL);

  ProtobufCMessage *m = fuzz_decode(&ina__v1__kv_endpoint__descriptor, data, size);
  if (m) {
    const int paired = check_endpoint((const Ina__V1__KvEndpoint *)m);
    ProtobufCMessage *again = fuzz_redecode(m);
    if (again)
      FUZZ_REQUIRE(check_endpoint((const Ina__V1__KvEndpoint *)again) == paired,
                   "re-decoded KvEndpoint judged differently");
    protobuf_c_message_free_unpacked(again, NULL);
    protobuf_c_message_free_unpacked(m, NULL);
  }

  m = fuzz_decode(&ina__v1__prefill_response__descriptor, data, size);
  if (m) {
    const Ina__V1__PrefillResponse *pr = (const Ina__V1__PrefillResponse *)m;
    const int taken = take_response(pr);
    FUZZ_REQUIRE(taken == (pr->n_top_ids == pr->n_top_logprobs && pr->n_top_ids <= DECODE_MAX_LOGPROBS),
                 "PrefillResponse with %zu top ids and %zu top logprobs %s", pr->n_top_ids, pr->n_top_logprobs,
                 taken ? "taken" : "refused");
    ProtobufCMessage *again = fuzz_redecode(m);
    if (again)
      FUZZ_REQUIRE(take_response((const Ina__V1__PrefillResponse *)again) == taken,
                   "re-decoded PrefillResponse judged differently");
    protobuf_c_message_free_unpacked(again, NULL);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  return 0;
}
