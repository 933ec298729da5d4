/* Fuzz target: ina.v1.ApplyPlacementRequest (with its ExpertPlacement, Layout,
 * LayerPlacement and ExpertSlot), the bytes an orchestrator sends to
 * Placement.ApplyPlacement; the agent unpacks them (agent/service_placement.c), and
 * ina_validate_apply_placement_request is the check a multi-rank agent runs before
 * acting on one.
 *
 * For every input that unpacks (see fuzz_message.h for the checks of the decoded message
 * itself), under three sets of limits (DeepSeek-V3 on 16 ranks; a small job of 4 ranks,
 * 2 MoE layers, 4 experts; and limits that fit the request's own layout, layer count and
 * generation, so that mutations reach the per-layer slot checks), it traps unless:
 *  - the verdict follows fuzz_verdict.h;
 *  - the verdict agrees with the rules placement.proto documents, read here apart from
 *    proto/validate.c: a request is accepted exactly when it breaks none of them; a
 *    rejection has the code of the first broken rule in the order validate.h gives
 *    (INVALID_ARGUMENT for malformed, then RESOURCE_EXHAUSTED for slots_per_rank over the
 *    memory bound, then FAILED_PRECONDITION for a stale expected_generation) and its
 *    message starts with that rule's field path;
 *  - the canonical re-encoding of the request gets the same verdict (when it has one:
 *    see fuzz_redecode).
 * Inputs that do not unpack are refused with INVALID_ARGUMENT; they must only not crash.
 * Everything is freed (LeakSanitizer checks). */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/validate.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_message.h"
#include "tests/fuzz/fuzz_verdict.h"

static const ina_placement_limits_t kLimits[] = {
    /* DeepSeek-V3 (58 MoE layers of 256 experts) on two 8-GPU nodes, 20 slots a rank. */
    {16, 58, 256, 20, 1},
    /* A small job: every rule can be met or broken by a mutation or two. */
    {4, 2, 4, 2, 3},
};

/* Limits that the request's own header meets, when they are small enough to check. */
static bool limits_of_request(const Ina__V1__ApplyPlacementRequest *r, ina_placement_limits_t *out) {
  const Ina__V1__ExpertPlacement *p = r->placement;
  if (!p || !p->layout) return false;
  const uint64_t world = (uint64_t)p->layout->tp * p->layout->dp;
  const uint64_t slots = (uint64_t)p->slots_per_rank * p->layout->ep;
  if (world == 0 || world > 4096 || p->n_layers == 0 || p->n_layers > 256 || slots == 0) return false;
  out->world_size = (uint32_t)world;
  out->n_moe_layers = (uint32_t)p->n_layers;
  /* One slot to spare for a replica, when there are two or more. */
  out->n_routed_experts = (uint32_t)(slots > 1024 ? 1024 : slots > 1 ? slots - 1 : 1);
  out->max_slots_per_rank = p->slots_per_rank;
  out->current_generation = r->expected_generation;
  return true;
}

/* Each MoE layer exactly once, each with every (ep_rank, slot) pair exactly once, ranks,
 * slots and experts in range, and every logical expert placed. */
static bool layers_follow_rules(const Ina__V1__ExpertPlacement *p, const ina_placement_limits_t *lim) {
  const uint32_t ep = p->layout->ep, spr = p->slots_per_rank;
  const size_t total = (size_t)ep * spr;
  bool *layer_seen = calloc(lim->n_moe_layers, 1);
  bool *expert_placed = calloc(lim->n_routed_experts, 1);
  bool *pair_taken = NULL; /* allocated once a layer has `total` slots: bounded by the input */
  FUZZ_REQUIRE(layer_seen && expert_placed, "no memory for the reference check");
  bool ok = true;
  for (size_t li = 0; ok && li < p->n_layers; li++) {
    const Ina__V1__LayerPlacement *layer = p->layers[li];
    if (layer->moe_layer >= lim->n_moe_layers || layer_seen[layer->moe_layer] ||
        layer->n_slots != total) {
      ok = false;
      break;
    }
    layer_seen[layer->moe_layer] = true;
    if (!pair_taken) pair_taken = malloc(total);
    FUZZ_REQUIRE(pair_taken != NULL, "no memory for %zu slots", total);
    memset(pair_taken, 0, total);
    memset(expert_placed, 0, lim->n_routed_experts);
    for (size_t si = 0; ok && si < layer->n_slots; si++) {
      const Ina__V1__ExpertSlot *s = layer->slots[si];
      if (s->ep_rank >= ep || s->slot >= spr || s->logical_expert >= lim->n_routed_experts) {
        ok = false;
        break;
      }
      bool *taken = &pair_taken[(size_t)s->ep_rank * spr + s->slot];
      ok = !*taken;
      *taken = true;
      expert_placed[s->logical_expert] = true;
    }
    for (uint32_t e = 0; ok && e < lim->n_routed_experts; e++) ok = expert_placed[e];
  }
  free(layer_seen);
  free(expert_placed);
  free(pair_taken);
  return ok;
}

typedef struct rule {
  const char *field; /* NULL: no rule broken */
  ina_proto_code_t code;
} rule_t;

static rule_t first_broken_rule(const Ina__V1__ApplyPlacementRequest *r,
                                const ina_placement_limits_t *lim) {
  const ina_proto_code_t invalid = INA_PROTO_CODE_INVALID_ARGUMENT;
  const Ina__V1__ExpertPlacement *p = r->placement;
  if (!p) return (rule_t){"placement", invalid};
  const Ina__V1__Layout *l = p->layout;
  if (!l || l->tp == 0 || l->dp == 0 || l->ep == 0 ||
      (uint64_t)l->tp * l->dp != lim->world_size || lim->world_size % l->ep != 0)
    return (rule_t){"placement.layout", invalid};
  if (p->slots_per_rank == 0 || (uint64_t)p->slots_per_rank * l->ep < lim->n_routed_experts)
    return (rule_t){"placement.slots_per_rank", invalid};
  if (p->n_layers != lim->n_moe_layers || !layers_follow_rules(p, lim))
    return (rule_t){"placement.layers", invalid};
  if (p->slots_per_rank > lim->max_slots_per_rank)
    return (rule_t){"placement.slots_per_rank", INA_PROTO_CODE_RESOURCE_EXHAUSTED};
  if (r->expected_generation != lim->current_generation)
    return (rule_t){"expected_generation", INA_PROTO_CODE_FAILED_PRECONDITION};
  return (rule_t){NULL, INA_PROTO_CODE_OK};
}

static ina_status_t validate(const void *req, const void *limits, char *msg, size_t msg_size,
                             ina_proto_code_t *code) {
  return ina_validate_apply_placement_request(req, limits, msg, msg_size, code);
}

static void judge(const Ina__V1__ApplyPlacementRequest *r,
                  const Ina__V1__ApplyPlacementRequest *again, const ina_placement_limits_t *lim) {
  fuzz_verdict_t v, v_again;
  fuzz_verdict_take(validate, r, lim, &v);
  if (again) {
    fuzz_verdict_take(validate, again, lim, &v_again);
    fuzz_verdict_same(&v, &v_again);
  }

  const rule_t broken = first_broken_rule(r, lim);
  FUZZ_REQUIRE(v.code == broken.code, "code %d (\"%s\"), but the rules say %d (%s)", (int)v.code,
               v.msg, (int)broken.code, broken.field ? broken.field : "none broken");
  if (broken.field) {
    const char *const fields[] = {broken.field, NULL};
    FUZZ_REQUIRE(fuzz_names_field(v.msg, fields), "first broken rule is %s, message \"%s\"",
                 broken.field, v.msg);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ProtobufCMessage *m = fuzz_decode(&ina__v1__apply_placement_request__descriptor, data, size);
  if (!m) return 0;
  const Ina__V1__ApplyPlacementRequest *r = (const Ina__V1__ApplyPlacementRequest *)m;
  ProtobufCMessage *again_m = fuzz_redecode(m);
  const Ina__V1__ApplyPlacementRequest *again = (const Ina__V1__ApplyPlacementRequest *)again_m;
  for (size_t i = 0; i < sizeof kLimits / sizeof kLimits[0]; i++) judge(r, again, &kLimits[i]);
  ina_placement_limits_t own;
  if (limits_of_request(r, &own)) judge(r, again, &own);
  protobuf_c_message_free_unpacked(again_m, NULL);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
