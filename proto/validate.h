/* Validation of the control-plane requests ina-agent receives (ina.v1 GenerateRequest,
 * ApplyPlacementRequest and PrefillRequest), before any of their content is acted on.
 *
 * Each validator checks one unpacked message against limits the caller supplies (model
 * sizes, world size, generation in force) and on the first violation returns
 * INA_ERR_INVALID_ARGUMENT, writes a message naming the field path and the offending
 * value into `msg` (e.g. "placement.layers[3].slots[17].logical_expert: 300 >=
 * n_routed_experts 256") and sets *code to the gRPC status code the server should
 * answer with. On success they return INA_OK, set *code to INA_PROTO_CODE_OK and write
 * "" into msg.
 *
 * Nothing is logged: a bad request is the client's error, reported back to it.
 *
 * Ownership: the validators read the message and never keep or free it; its repeated
 * message entries must not be NULL (true of every message protobuf-c unpacks). `msg` (may be
 * NULL when msg_size is 0) is caller-owned and always NUL-terminated when msg_size > 0;
 * longer messages are truncated. `code` may be NULL.
 * Thread safety: the validators are reentrant; they allocate only transient scratch
 * memory (INA_ERR_OUT_OF_MEMORY with code INTERNAL if that fails). */
#ifndef INA_PROTO_VALIDATE_H
#define INA_PROTO_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "ina/v1/inference.pb-c.h"
#include "ina/v1/kv_transfer.pb-c.h"
#include "ina/v1/placement.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The gRPC status codes a validator can ask for (values as in grpc/status.h). */
typedef enum ina_proto_code {
  INA_PROTO_CODE_OK = 0,
  INA_PROTO_CODE_INVALID_ARGUMENT = 3,    /* a field is malformed or out of range */
  INA_PROTO_CODE_RESOURCE_EXHAUSTED = 8,  /* well-formed but does not fit (memory) */
  INA_PROTO_CODE_FAILED_PRECONDITION = 9, /* well-formed but stale (generation) */
  INA_PROTO_CODE_INTERNAL = 13            /* the validator itself failed (no memory) */
} ina_proto_code_t;

/* Longest GenerateRequest.request_id, and most stop ids / stream interval accepted. */
#define INA_PROTO_MAX_REQUEST_ID_LEN 128
#define INA_PROTO_MAX_STOP_IDS 64
#define INA_PROTO_MAX_STREAM_INTERVAL 1024
/* Upper bounds of SamplingParams.temperature and .repetition_penalty. */
#define INA_PROTO_MAX_TEMPERATURE 100.0f
#define INA_PROTO_MAX_REPETITION_PENALTY 10.0f

/* What the served model accepts. */
typedef struct ina_generate_limits {
  uint32_t vocab_size;         /* token ids must be < this; >= 1 */
  uint32_t max_context_tokens; /* prompt length + max_tokens must be <= this; >= 1 */
} ina_generate_limits_t;

/* Checks request_id, prompt_token_ids, max_tokens, sampling, stop_token_ids,
 * stream_interval and prefill_agent against the rules documented in inference.proto. `req` and `limits`
 * must not be NULL (INVALID_ARGUMENT otherwise). */
ina_status_t ina_validate_generate_request(const Ina__V1__GenerateRequest *req,
                                           const ina_generate_limits_t *limits, char *msg,
                                           size_t msg_size, ina_proto_code_t *code);

/* The job and model a placement must fit. */
typedef struct ina_placement_limits {
  uint32_t world_size;         /* ranks in the job, >= 1 */
  uint32_t n_moe_layers;       /* MoE layers of the model, >= 1 */
  uint32_t n_routed_experts;   /* logical experts per MoE layer, >= 1 */
  uint32_t max_slots_per_rank; /* expert slots per rank and layer that fit in memory */
  uint64_t current_generation; /* generation of the placement in force */
} ina_placement_limits_t;

/* Checks, in this order: layout degrees (>= 1, tp * dp == world_size, ep divides
 * world_size), slots_per_rank (>= 1, enough slots for every expert), one entry per MoE
 * layer, in each layer every (ep_rank, slot) exactly once with ranks, slots and logical
 * experts in range and every logical expert placed (INVALID_ARGUMENT); then
 * slots_per_rank <= max_slots_per_rank (RESOURCE_EXHAUSTED); then expected_generation
 * == current_generation (FAILED_PRECONDITION). placement.generation is ignored. */
ina_status_t ina_validate_apply_placement_request(const Ina__V1__ApplyPlacementRequest *req,
                                                  const ina_placement_limits_t *limits,
                                                  char *msg, size_t msg_size,
                                                  ina_proto_code_t *code);

/* What a prefill agent accepts (ina.v1.KvTransfer/Prefill). */
typedef struct ina_prefill_limits {
  uint32_t vocab_size;         /* token ids must be < this; >= 1 */
  uint32_t max_context_tokens; /* the prompt plus its first token must fit; >= 1 */
} ina_prefill_limits_t;
#define INA_PROTO_MAX_LOGPROBS 20
#define INA_PROTO_MAX_BLOB_BYTES (1u << 20)
/* Upper bounds of the decode agent's KvLayout counts. */
#define INA_PROTO_MAX_KV_PAGE_SIZE (1u << 20)
#define INA_PROTO_MAX_KV_PAGES (1u << 30)
#define INA_PROTO_MAX_KV_LAYERS 4096u
#define INA_PROTO_MAX_KV_ENTRY_BYTES (1u << 24)

/* Checks, in this order: transfer_id (the rules of request_id), prompt_token_ids
 * (non-empty, length + 1 <= max_context_tokens, each id < vocab_size), sampling (as in
 * Generate), logprobs_plus_one (<= INA_PROTO_MAX_LOGPROBS + 1), that decode carries a
 * layout whose counts are each >= 1 and at most INA_PROTO_MAX_KV_* and whose storage,
 * num_layers * num_pages * page_size * entry_bytes bytes, fits in int64_t (so does every
 * offset into it), a non-empty ucx_blob of at most INA_PROTO_MAX_BLOB_BYTES, that
 * decode_pages has one page per decode page of the prompt, each below
 * decode.layout.num_pages, and first_token < the prompt's length (INVALID_ARGUMENT; the
 * message starts with the field's path: transfer_id, prompt_token_ids, sampling.<field>,
 * logprobs_plus_one, decode.layout, decode.ucx_blob, decode_pages, first_token). An
 * accepted request's counts fit the int32_t fields of ina_kv_layout_t and the scheduler.
 * Whether the layout pairs with the agent's is the caller's check. */
ina_status_t ina_validate_prefill_request(const Ina__V1__PrefillRequest *req, const ina_prefill_limits_t *limits,
                                          char *msg, size_t msg_size, ina_proto_code_t *code);

#ifdef __cplusplus
}
#endif
#endif
