/* Request validators: see validate.h. Every rule is one `return reject(...)` whose
 * message starts with the field path, so that a client can find its mistake. */
#define INA_LOG_SUBSYS "proto"

#include "proto/validate.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* Where a validator reports its verdict. */
typedef struct verdict {
  char *msg;
  size_t msg_size;
  ina_proto_code_t *code;
} verdict_t;

static ina_status_t accept(const verdict_t *v) {
  if (v->msg_size > 0) v->msg[0] = '\0';
  if (v->code) *v->code = INA_PROTO_CODE_OK;
  return INA_OK;
}

static ina_status_t reject(const verdict_t *v, ina_proto_code_t code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ina_status_t reject(const verdict_t *v, ina_proto_code_t code, const char *fmt, ...) {
  if (v->msg_size > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, v->msg_size, fmt, ap);
    va_end(ap);
  }
  if (v->code) *v->code = code;
  return code == INA_PROTO_CODE_INTERNAL ? INA_ERR_OUT_OF_MEMORY : INA_ERR_INVALID_ARGUMENT;
}

/* ---- GenerateRequest ---------------------------------------------------------------- */

/* An id field (request_id, transfer_id): 1..INA_PROTO_MAX_REQUEST_ID_LEN bytes of printable
 * ASCII without the space; the message names `field`. */
static ina_status_t check_id(const verdict_t *v, const char *field, const char *id) {
  size_t len = 0;
  if (id == NULL || id[0] == '\0') return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "%s: empty", field);
  for (; id[len] != '\0'; len++) {
    unsigned char c = (unsigned char)id[len];
    if (len >= INA_PROTO_MAX_REQUEST_ID_LEN)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "%s: longer than %d bytes", field,
                    INA_PROTO_MAX_REQUEST_ID_LEN);
    if (c < 0x21 || c > 0x7e)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                    "%s[%zu]: byte 0x%02x is not printable ASCII (0x21..0x7e)", field, len, c);
  }
  return INA_OK;
}

/* A float field must be finite and in [lo, hi] (or [lo, hi) when hi_open). */
static ina_status_t check_float_range(const verdict_t *v, const char *path, float x, float lo,
                                      float hi, bool hi_open) {
  if (!isfinite(x)) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "%s: %g is not finite", path, (double)x);
  if (x < lo || (hi_open ? x >= hi : x > hi))
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "%s: %g is outside [%g, %g%c", path,
                  (double)x, (double)lo, (double)hi, hi_open ? ')' : ']');
  return INA_OK;
}

static ina_status_t check_sampling(const verdict_t *v, const Ina__V1__SamplingParams *s,
                                   uint32_t vocab_size) {
  ina_status_t st;
  if (s == NULL) return INA_OK; /* absent: greedy */
  if ((st = check_float_range(v, "sampling.temperature", s->temperature, 0.0f,
                              INA_PROTO_MAX_TEMPERATURE, false)) != INA_OK)
    return st;
  if ((st = check_float_range(v, "sampling.top_p", s->top_p, 0.0f, 1.0f, false)) != INA_OK) return st;
  if (s->top_k > vocab_size)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "sampling.top_k: %u > vocab_size %u",
                  s->top_k, vocab_size);
  if ((st = check_float_range(v, "sampling.min_p", s->min_p, 0.0f, 1.0f, true)) != INA_OK) return st;
  return check_float_range(v, "sampling.repetition_penalty", s->repetition_penalty, 0.0f,
                           INA_PROTO_MAX_REPETITION_PENALTY, false);
}

ina_status_t ina_validate_generate_request(const Ina__V1__GenerateRequest *req,
                                           const ina_generate_limits_t *limits, char *msg,
                                           size_t msg_size, ina_proto_code_t *code) {
  const verdict_t vd = {msg, msg_size, code}, *v = &vd;
  ina_status_t st;
  if (req == NULL) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "request: NULL");
  if (limits == NULL || limits->vocab_size == 0 || limits->max_context_tokens == 0)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "limits: NULL or zero");
  if ((st = check_id(v, "request_id", req->request_id)) != INA_OK) return st;

  if (req->n_prompt_token_ids == 0)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "prompt_token_ids: empty");
  for (size_t i = 0; i < req->n_prompt_token_ids; i++)
    if (req->prompt_token_ids[i] >= limits->vocab_size)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "prompt_token_ids[%zu]: %u >= vocab_size %u",
                    i, req->prompt_token_ids[i], limits->vocab_size);

  if (req->max_tokens == 0) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "max_tokens: 0 (must be >= 1)");
  /* size_t + uint32 cannot wrap for any prompt that fit in memory. */
  if ((uint64_t)req->n_prompt_token_ids + req->max_tokens > limits->max_context_tokens)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                  "max_tokens: %u + %zu prompt tokens > max_context_tokens %u", req->max_tokens,
                  req->n_prompt_token_ids, limits->max_context_tokens);

  if ((st = check_sampling(v, req->sampling, limits->vocab_size)) != INA_OK) return st;

  if (req->n_stop_token_ids > INA_PROTO_MAX_STOP_IDS)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "stop_token_ids: %zu ids > %d allowed",
                  req->n_stop_token_ids, INA_PROTO_MAX_STOP_IDS);
  for (size_t i = 0; i < req->n_stop_token_ids; i++) {
    uint32_t id = req->stop_token_ids[i];
    if (id >= limits->vocab_size)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "stop_token_ids[%zu]: %u >= vocab_size %u", i,
                    id, limits->vocab_size);
    for (size_t j = 0; j < i; j++) /* at most 64 ids: quadratic is fine */
      if (req->stop_token_ids[j] == id)
        return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                      "stop_token_ids[%zu]: %u duplicates stop_token_ids[%zu]", i, id, j);
  }

  if (req->stream_interval > INA_PROTO_MAX_STREAM_INTERVAL)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "stream_interval: %u > %d", req->stream_interval,
                  INA_PROTO_MAX_STREAM_INTERVAL);
  for (size_t i = 0; req->prefill_agent && req->prefill_agent[i]; i++) {
    const unsigned char c = (unsigned char)req->prefill_agent[i];
    if (i >= 255) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "prefill_agent: longer than 255 bytes");
    if (c < 0x21 || c > 0x7e)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                    "prefill_agent[%zu]: byte 0x%02x is not printable ASCII (expected host:port)", i, c);
  }
  return accept(v);
}

/* ---- ApplyPlacementRequest ---------------------------------------------------------- */

static ina_status_t check_layout(const verdict_t *v, const Ina__V1__Layout *l, uint32_t world_size) {
  if (l == NULL) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.layout: missing");
  if (l->tp == 0) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.layout.tp: 0 (must be >= 1)");
  if (l->dp == 0) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.layout.dp: 0 (must be >= 1)");
  if (l->ep == 0) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.layout.ep: 0 (must be >= 1)");
  if ((uint64_t)l->tp * l->dp != world_size)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.layout: tp %u * dp %u != world_size %u",
                  l->tp, l->dp, world_size);
  if (l->ep > world_size || world_size % l->ep != 0)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.layout.ep: %u does not divide world_size %u",
                  l->ep, world_size);
  return INA_OK;
}

/* Scratch for one layer: which (ep_rank, slot) pairs are taken, and by which index, and
 * which logical experts have a slot. Sized once, reset per layer. */
typedef struct layer_scratch {
  int64_t *slot_owner;   /* [ep * slots_per_rank]: index in slots[] or -1 */
  bool *expert_placed;   /* [n_routed_experts] */
} layer_scratch_t;

static ina_status_t check_layer(const verdict_t *v, size_t li, const Ina__V1__LayerPlacement *layer,
                                uint32_t ep, uint32_t slots_per_rank, uint32_t n_experts,
                                layer_scratch_t *scratch) {
  const size_t total = (size_t)ep * slots_per_rank;
  if (layer->n_slots != total)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                  "placement.layers[%zu].slots: %zu entries != ep %u * slots_per_rank %u", li,
                  layer->n_slots, ep, slots_per_rank);
  for (size_t i = 0; i < total; i++) scratch->slot_owner[i] = -1;
  for (uint32_t e = 0; e < n_experts; e++) scratch->expert_placed[e] = false;

  for (size_t si = 0; si < layer->n_slots; si++) {
    const Ina__V1__ExpertSlot *s = layer->slots[si];
    if (s->ep_rank >= ep)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                    "placement.layers[%zu].slots[%zu].ep_rank: %u >= ep %u", li, si, s->ep_rank, ep);
    if (s->slot >= slots_per_rank)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                    "placement.layers[%zu].slots[%zu].slot: %u >= slots_per_rank %u", li, si, s->slot,
                    slots_per_rank);
    if (s->logical_expert >= n_experts)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                    "placement.layers[%zu].slots[%zu].logical_expert: %u >= n_routed_experts %u", li,
                    si, s->logical_expert, n_experts);
    int64_t *owner = &scratch->slot_owner[(size_t)s->ep_rank * slots_per_rank + s->slot];
    if (*owner >= 0)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                    "placement.layers[%zu].slots[%zu]: ep_rank %u slot %u is also given by "
                    "placement.layers[%zu].slots[%lld]",
                    li, si, s->ep_rank, s->slot, li, (long long)*owner);
    *owner = (int64_t)si;
    scratch->expert_placed[s->logical_expert] = true;
  }
  /* n_slots == total and no pair repeats, so every (ep_rank, slot) is present. */
  for (uint32_t e = 0; e < n_experts; e++)
    if (!scratch->expert_placed[e])
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                    "placement.layers[%zu].slots: logical expert %u has no slot", li, e);
  return INA_OK;
}

static ina_status_t check_layers(const verdict_t *v, const Ina__V1__ExpertPlacement *p,
                                 const ina_placement_limits_t *limits) {
  const uint32_t ep = p->layout->ep, spr = p->slots_per_rank;
  layer_scratch_t scratch = {NULL, NULL};
  int64_t *layer_seen = NULL; /* [n_moe_layers]: index in layers[] or -1 */
  ina_status_t st = INA_OK;

  if (p->n_layers != limits->n_moe_layers)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.layers: %zu entries != n_moe_layers %u",
                  p->n_layers, limits->n_moe_layers);
  layer_seen = malloc(sizeof *layer_seen * limits->n_moe_layers);
  scratch.expert_placed = malloc(sizeof *scratch.expert_placed * limits->n_routed_experts);
  if (!layer_seen || !scratch.expert_placed) {
    st = reject(v, INA_PROTO_CODE_INTERNAL, "validator: out of memory");
    goto done;
  }
  for (uint32_t i = 0; i < limits->n_moe_layers; i++) layer_seen[i] = -1;

  for (size_t li = 0; li < p->n_layers; li++) {
    const Ina__V1__LayerPlacement *layer = p->layers[li];
    if (layer->moe_layer >= limits->n_moe_layers) {
      st = reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.layers[%zu].moe_layer: %u >= n_moe_layers %u",
                  li, layer->moe_layer, limits->n_moe_layers);
      goto done;
    }
    if (layer_seen[layer->moe_layer] >= 0) {
      st = reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                  "placement.layers[%zu].moe_layer: %u is also given by placement.layers[%lld]", li,
                  layer->moe_layer, (long long)layer_seen[layer->moe_layer]);
      goto done;
    }
    layer_seen[layer->moe_layer] = (int64_t)li;
    /* Allocated only once a layer's slot count matched, so its size is bounded by the
     * message itself rather than by a client-chosen slots_per_rank. */
    if (scratch.slot_owner == NULL && layer->n_slots == (size_t)ep * spr) {
      scratch.slot_owner = malloc(sizeof *scratch.slot_owner * layer->n_slots);
      if (!scratch.slot_owner) {
        st = reject(v, INA_PROTO_CODE_INTERNAL, "validator: out of memory");
        goto done;
      }
    }
    if ((st = check_layer(v, li, layer, ep, spr, limits->n_routed_experts, &scratch)) != INA_OK) goto done;
  }
done:
  free(layer_seen);
  free(scratch.slot_owner);
  free(scratch.expert_placed);
  return st;
}

ina_status_t ina_validate_apply_placement_request(const Ina__V1__ApplyPlacementRequest *req,
                                                  const ina_placement_limits_t *limits,
                                                  char *msg, size_t msg_size,
                                                  ina_proto_code_t *code) {
  const verdict_t vd = {msg, msg_size, code}, *v = &vd;
  ina_status_t st;
  if (req == NULL) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "request: NULL");
  if (limits == NULL || limits->world_size == 0 || limits->n_moe_layers == 0 ||
      limits->n_routed_experts == 0)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "limits: NULL or zero");
  const Ina__V1__ExpertPlacement *p = req->placement;
  if (p == NULL) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement: missing");
  if ((st = check_layout(v, p->layout, limits->world_size)) != INA_OK) return st;
  if (p->slots_per_rank == 0)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "placement.slots_per_rank: 0 (must be >= 1)");
  if ((uint64_t)p->slots_per_rank * p->layout->ep < limits->n_routed_experts)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                  "placement.slots_per_rank: %u * ep %u < n_routed_experts %u", p->slots_per_rank,
                  p->layout->ep, limits->n_routed_experts);
  if ((st = check_layers(v, p, limits)) != INA_OK) return st;
  if (p->slots_per_rank > limits->max_slots_per_rank)
    return reject(v, INA_PROTO_CODE_RESOURCE_EXHAUSTED,
                  "placement.slots_per_rank: %u > %u slots that fit in GPU memory", p->slots_per_rank,
                  limits->max_slots_per_rank);
  if (req->expected_generation != limits->current_generation)
    return reject(v, INA_PROTO_CODE_FAILED_PRECONDITION,
                  "expected_generation: %llu != generation in force %llu",
                  (unsigned long long)req->expected_generation,
                  (unsigned long long)limits->current_generation);
  return accept(v);
}

/* ---- PrefillRequest ----------------------------------------------------------------- */

ina_status_t ina_validate_prefill_request(const Ina__V1__PrefillRequest *req, const ina_prefill_limits_t *limits,
                                          char *msg, size_t msg_size, ina_proto_code_t *code) {
  const verdict_t vd = {msg, msg_size, code}, *v = &vd;
  ina_status_t st;
  if (req == NULL) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "request: NULL");
  if (limits == NULL || limits->vocab_size == 0 || limits->max_context_tokens == 0)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "limits: NULL or zero");
  /* The rules of a request id; the message names this field ("transfer_id: ...", as every
   * rejection starts with the field's path). */
  if ((st = check_id(v, "transfer_id", req->transfer_id)) != INA_OK) return st;
  if (req->n_prompt_token_ids == 0) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "prompt_token_ids: empty");
  if ((uint64_t)req->n_prompt_token_ids + 1 > limits->max_context_tokens)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "prompt_token_ids: %zu tokens + 1 > max_context_tokens %u",
                  req->n_prompt_token_ids, limits->max_context_tokens);
  for (size_t i = 0; i < req->n_prompt_token_ids; i++)
    if (req->prompt_token_ids[i] >= limits->vocab_size)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "prompt_token_ids[%zu]: %u >= vocab_size %u", i,
                    req->prompt_token_ids[i], limits->vocab_size);
  if ((st = check_sampling(v, req->sampling, limits->vocab_size)) != INA_OK) return st;
  if (req->logprobs_plus_one > INA_PROTO_MAX_LOGPROBS + 1)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "logprobs_plus_one: %u > %d", req->logprobs_plus_one,
                  INA_PROTO_MAX_LOGPROBS + 1);
  const Ina__V1__KvEndpoint *d = req->decode;
  if (d == NULL || d->layout == NULL) return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "decode.layout: missing");
  const Ina__V1__KvLayout *l = d->layout;
  if (l->page_size == 0 || l->num_pages == 0 || l->num_layers == 0 || l->entry_bytes == 0)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                  "decode.layout: page_size %u, num_pages %u, num_layers %u, entry_bytes %llu (each must be >= 1)",
                  l->page_size, l->num_pages, l->num_layers, (unsigned long long)l->entry_bytes);
  if (l->page_size > INA_PROTO_MAX_KV_PAGE_SIZE || l->num_pages > INA_PROTO_MAX_KV_PAGES ||
      l->num_layers > INA_PROTO_MAX_KV_LAYERS || l->entry_bytes > INA_PROTO_MAX_KV_ENTRY_BYTES)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                  "decode.layout: page_size %u, num_pages %u, num_layers %u, entry_bytes %llu (at most %u, %u, %u, %u)",
                  l->page_size, l->num_pages, l->num_layers, (unsigned long long)l->entry_bytes,
                  INA_PROTO_MAX_KV_PAGE_SIZE, INA_PROTO_MAX_KV_PAGES, INA_PROTO_MAX_KV_LAYERS,
                  INA_PROTO_MAX_KV_ENTRY_BYTES);
  /* Every byte offset of the decode agent's storage, which the prefill agent computes in
   * int64_t (kvcache/kv_copy.h), is below its size: the size must fit. layers * pages *
   * page_size <= 2^12 * 2^30 * 2^20 cannot wrap in uint64_t. */
  const uint64_t slots = (uint64_t)l->num_layers * l->num_pages * l->page_size;
  if (slots > (uint64_t)INT64_MAX / l->entry_bytes)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                  "decode.layout: %u layers x %u pages x %u tokens x %llu bytes do not fit in int64_t",
                  l->num_layers, l->num_pages, l->page_size, (unsigned long long)l->entry_bytes);
  if (d->ucx_blob.len == 0 || d->ucx_blob.len > INA_PROTO_MAX_BLOB_BYTES)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "decode.ucx_blob: %zu bytes (expected 1..%u)", d->ucx_blob.len,
                  INA_PROTO_MAX_BLOB_BYTES);
  const uint64_t pages = ((uint64_t)req->n_prompt_token_ids + l->page_size - 1) / l->page_size;
  if (req->n_decode_pages != pages)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT,
                  "decode_pages: %zu pages for a %zu-token prompt in pages of %u (expected %llu)", req->n_decode_pages,
                  req->n_prompt_token_ids, l->page_size, (unsigned long long)pages);
  for (size_t i = 0; i < req->n_decode_pages; i++)
    if (req->decode_pages[i] >= l->num_pages)
      return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "decode_pages[%zu]: %u >= decode.layout.num_pages %u", i,
                    req->decode_pages[i], l->num_pages);
  if (req->first_token >= req->n_prompt_token_ids)
    return reject(v, INA_PROTO_CODE_INVALID_ARGUMENT, "first_token: %u >= the prompt's %zu tokens", req->first_token,
                  req->n_prompt_token_ids);
  return accept(v);
}
