/* ina.v1.ExpertPlacement conversions and the placement command (agent/placement_proto.h). */
#define INA_LOG_SUBSYS "agent"
#include "agent/placement_proto.h"

#include <stdlib.h>
#include <string.h>

#include "agent/rpc/rpc_pb.h"
#include "core/check.h"

#define COMMAND_MAGIC 0x494E4150 /* "INAP" */
enum { COMMAND_HEAD_WORDS = 6 };

/* ---- from a request ------------------------------------------------------------------ */

static ina_rpc_code_t check_layout(const Ina__V1__ExpertPlacement *msg, const placement_shape_t *shape,
                                   char *message) {
  if (!msg->layout)
    return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT, "placement.layout: missing");
  const Ina__V1__Layout *l = msg->layout;
  if (l->tp != (uint32_t)shape->tp || l->dp != (uint32_t)shape->dp || l->ep != (uint32_t)shape->ep)
    return ina_rpc_error(message, INA_RPC_FAILED_PRECONDITION,
                         "placement.layout: tp %u, dp %u, ep %u differs from the job's tp %d, dp "
                         "%d, ep %d; a new layout needs a restart of the job",
                         l->tp, l->dp, l->ep, shape->tp, shape->dp, shape->ep);
  /* A dense-only model's placement has one empty slot per rank (moe_ep/expert_placement.h). */
  const int32_t most = shape->num_experts > 0 ? shape->num_experts : 1;
  if (msg->slots_per_rank < 1 || msg->slots_per_rank > (uint32_t)most)
    return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                         "placement.slots_per_rank: %u is outside [1, %d] (a rank holds each of "
                         "the %d experts at most once)",
                         msg->slots_per_rank, most, shape->num_experts);
  if (msg->n_layers != (size_t)shape->num_moe_layers)
    return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                         "placement.layers: %zu entries, the model has %d MoE layers", msg->n_layers,
                         shape->num_moe_layers);
  return INA_RPC_OK;
}

/* One layer's slots into p; seen_slot marks (rank, slot) pairs already given. */
static ina_rpc_code_t take_layer(const Ina__V1__LayerPlacement *lp, size_t li,
                                 ina_expert_placement_t *p, char *message) {
  const int32_t m = (int32_t)lp->moe_layer;
  const size_t capacity = (size_t)p->ep * (size_t)p->slots_per_rank;
  if (lp->n_slots > capacity)
    return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                         "placement.layers[%zu].slots: %zu entries, more than ep %d x "
                         "slots_per_rank %d",
                         li, lp->n_slots, p->ep, p->slots_per_rank);
  for (size_t j = 0; j < lp->n_slots; j++) {
    const Ina__V1__ExpertSlot *s = lp->slots[j];
    if (!s)
      return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT, "placement.layers[%zu].slots[%zu]: missing",
                           li, j);
    if (s->ep_rank >= (uint32_t)p->ep)
      return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                           "placement.layers[%zu].slots[%zu].ep_rank: %u is outside [0, %d)", li, j,
                           s->ep_rank, p->ep);
    if (s->slot >= (uint32_t)p->slots_per_rank)
      return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                           "placement.layers[%zu].slots[%zu].slot: %u is outside [0, %d)", li, j,
                           s->slot, p->slots_per_rank);
    if (s->logical_expert >= (uint32_t)p->num_experts)
      return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                           "placement.layers[%zu].slots[%zu].logical_expert: %u is outside [0, %d)",
                           li, j, s->logical_expert, p->num_experts);
    int32_t *at = &p->slot_expert[ina_expert_placement_index(p, m, (int32_t)s->ep_rank, (int32_t)s->slot)];
    if (*at >= 0)
      return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                           "placement.layers[%zu].slots[%zu]: rank %u slot %u is given twice", li,
                           j, s->ep_rank, s->slot);
    for (int32_t k = 0; k < p->slots_per_rank; k++)
      if (ina_expert_placement_slot(p, m, (int32_t)s->ep_rank, k) == (int32_t)s->logical_expert)
        return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                             "placement.layers[%zu].slots[%zu].logical_expert: rank %u already holds "
                             "expert %u (in slot %d)",
                             li, j, s->ep_rank, s->logical_expert, k);
    *at = (int32_t)s->logical_expert;
  }
  for (int32_t x = 0; x < p->num_experts; x++) {
    int placed = 0;
    for (size_t i = 0; i < capacity && !placed; i++)
      placed = p->slot_expert[(size_t)m * capacity + i] == x;
    if (!placed)
      return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                           "placement.layers[%zu]: logical expert %d has no slot", li, x);
  }
  return INA_RPC_OK;
}

ina_rpc_code_t placement_from_proto(const Ina__V1__ExpertPlacement *msg, const placement_shape_t *shape,
                                    ina_expert_placement_t *out, char *message) {
  ina_rpc_code_t code = INA_RPC_OK;
  uint8_t *layer_seen = NULL;
  memset(out, 0, sizeof *out);
  if (!msg) return ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT, "placement: missing");
  code = check_layout(msg, shape, message);
  if (code != INA_RPC_OK) return code;
  if (ina_expert_placement_init(shape->ep, (int32_t)msg->slots_per_rank, shape->num_moe_layers,
                                shape->num_experts, out) != INA_OK ||
      !(layer_seen = calloc((size_t)shape->num_moe_layers + 1, 1))) {
    code = ina_rpc_error(message, INA_RPC_RESOURCE_EXHAUSTED, "placement: out of memory");
    goto done;
  }
  for (size_t li = 0; li < msg->n_layers && code == INA_RPC_OK; li++) {
    const Ina__V1__LayerPlacement *lp = msg->layers[li];
    if (!lp) {
      code = ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT, "placement.layers[%zu]: missing", li);
    } else if (lp->moe_layer >= (uint32_t)shape->num_moe_layers) {
      code = ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                           "placement.layers[%zu].moe_layer: %u is outside [0, %d)", li,
                           lp->moe_layer, shape->num_moe_layers);
    } else if (layer_seen[lp->moe_layer]) {
      code = ina_rpc_error(message, INA_RPC_INVALID_ARGUMENT,
                           "placement.layers[%zu].moe_layer: layer %u appears twice", li, lp->moe_layer);
    } else {
      layer_seen[lp->moe_layer] = 1;
      code = take_layer(lp, li, out, message);
    }
  }
done:
  free(layer_seen);
  if (code != INA_RPC_OK) ina_expert_placement_free(out);
  return code;
}

/* ---- to a response ------------------------------------------------------------------- */

ina_status_t placement_pack_response(const ina_expert_placement_t *p, const placement_shape_t *shape,
                                     uint64_t generation, uint8_t **bytes, size_t *size) {
  ina_status_t st = INA_OK;
  const size_t L = (size_t)p->num_moe_layers, per_layer = (size_t)p->ep * (size_t)p->slots_per_rank;
  Ina__V1__LayerPlacement *layers = calloc(L + 1, sizeof *layers);
  Ina__V1__LayerPlacement **layer_ptrs = calloc(L + 1, sizeof *layer_ptrs);
  Ina__V1__ExpertSlot *slots = calloc(L * per_layer + 1, sizeof *slots);
  Ina__V1__ExpertSlot **slot_ptrs = calloc(L * per_layer + 1, sizeof *slot_ptrs);
  INA_CHECK_ALLOC(layers);
  INA_CHECK_ALLOC(layer_ptrs);
  INA_CHECK_ALLOC(slots);
  INA_CHECK_ALLOC(slot_ptrs);
  size_t n = 0;
  for (size_t l = 0; l < L; l++) {
    Ina__V1__LayerPlacement lp = INA__V1__LAYER_PLACEMENT__INIT;
    lp.moe_layer = (uint32_t)l;
    lp.slots = slot_ptrs + n;
    for (size_t i = 0; i < per_layer; i++) {
      const int32_t x = p->slot_expert[l * per_layer + i];
      if (x < 0) continue;
      Ina__V1__ExpertSlot s = INA__V1__EXPERT_SLOT__INIT;
      s.ep_rank = (uint32_t)(i / (size_t)p->slots_per_rank);
      s.slot = (uint32_t)(i % (size_t)p->slots_per_rank);
      s.logical_expert = (uint32_t)x;
      slots[n] = s;
      slot_ptrs[n] = &slots[n];
      n++;
      lp.n_slots++;
    }
    layers[l] = lp;
    layer_ptrs[l] = &layers[l];
  }
  Ina__V1__Layout layout = INA__V1__LAYOUT__INIT;
  layout.tp = (uint32_t)shape->tp;
  layout.dp = (uint32_t)shape->dp;
  layout.ep = (uint32_t)shape->ep;
  Ina__V1__ExpertPlacement placement = INA__V1__EXPERT_PLACEMENT__INIT;
  placement.layout = &layout;
  placement.slots_per_rank = (uint32_t)p->slots_per_rank;
  placement.n_layers = L;
  placement.layers = layer_ptrs;
  placement.generation = generation;
  Ina__V1__GetPlacementResponse resp = INA__V1__GET_PLACEMENT_RESPONSE__INIT;
  resp.placement = &placement;
  INA_CHECK(ina_rpc_pack(&resp.base, bytes, size));
fail:
  free(layers);
  free(layer_ptrs);
  free(slots);
  free(slot_ptrs);
  return st;
}

/* ---- the command --------------------------------------------------------------------- */

ina_status_t placement_command_encode(const ina_expert_placement_t *p, int dry_run, uint8_t **bytes,
                                      size_t *size) {
  ina_status_t st = INA_OK;
  const size_t slots = (size_t)p->ep * (size_t)p->slots_per_rank * (size_t)p->num_moe_layers;
  int64_t *w = malloc((COMMAND_HEAD_WORDS + slots) * sizeof *w);
  INA_CHECK_ALLOC(w);
  const int64_t head[COMMAND_HEAD_WORDS] = {COMMAND_MAGIC, dry_run != 0, p->ep, p->slots_per_rank,
                                            p->num_moe_layers, p->num_experts};
  memcpy(w, head, sizeof head);
  for (size_t i = 0; i < slots; i++) w[COMMAND_HEAD_WORDS + i] = p->slot_expert[i];
  *bytes = (uint8_t *)w;
  *size = (COMMAND_HEAD_WORDS + slots) * sizeof *w;
fail:
  return st;
}

ina_status_t placement_command_decode(const void *bytes, size_t size, ina_expert_placement_t *out,
                                      int *dry_run) {
  ina_status_t st = INA_OK;
  int64_t head[COMMAND_HEAD_WORDS];
  memset(out, 0, sizeof *out);
  INA_REQUIRE(bytes != NULL && size >= sizeof head && size % sizeof(int64_t) == 0, INA_ERR_FORMAT,
              "placement command: %zu bytes", size);
  memcpy(head, bytes, sizeof head);
  INA_REQUIRE(head[0] == COMMAND_MAGIC && (head[1] == 0 || head[1] == 1) && head[2] >= 1 &&
                  head[2] <= INT32_MAX && head[3] >= 1 && head[3] <= INT32_MAX && head[4] >= 0 &&
                  head[4] <= INT32_MAX && head[5] >= (head[4] > 0) && head[5] <= INT32_MAX,
              INA_ERR_FORMAT, "placement command: bad header"); /* no MoE layers: no experts either */
  INA_CHECK(ina_expert_placement_init((int32_t)head[2], (int32_t)head[3], (int32_t)head[4],
                                      (int32_t)head[5], out));
  const size_t slots = (size_t)out->ep * (size_t)out->slots_per_rank * (size_t)out->num_moe_layers;
  INA_REQUIRE(size == (COMMAND_HEAD_WORDS + slots) * sizeof(int64_t), INA_ERR_FORMAT,
              "placement command: %zu bytes for %zu slots", size, slots);
  for (size_t i = 0; i < slots; i++) {
    int64_t x;
    memcpy(&x, (const uint8_t *)bytes + (COMMAND_HEAD_WORDS + i) * sizeof x, sizeof x);
    INA_REQUIRE(x >= -1 && x < head[5], INA_ERR_FORMAT, "placement command: slot %zu holds %lld", i,
                (long long)x);
    out->slot_expert[i] = (int32_t)x;
  }
  *dry_run = (int)head[1];
fail:
  if (st != INA_OK) ina_expert_placement_free(out);
  return st;
}
