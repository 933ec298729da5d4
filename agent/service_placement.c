/* ina.v1.Placement: GetPlacement answers the layout the job started with (tp x dp ranks;
 * with expert parallelism the dp groups split the routed experts evenly, each holding
 * its experts in order in slots 0 .. E/ep - 1; generation 1); ApplyPlacement, an admin
 * call, is refused with FAILED_PRECONDITION: placements cannot change yet. */
#define INA_LOG_SUBSYS "agent"

#include <stdlib.h>

#include "core/check.h"
#include "ina/v1/placement.pb-c.h"
#include "agent/agent_internal.h"
#include "agent/rpc/rpc_pb.h"

#define GET_PLACEMENT_METHOD "/ina.v1.Placement/GetPlacement"
#define APPLY_PLACEMENT_METHOD "/ina.v1.Placement/ApplyPlacement"

static ina_rpc_code_t get_placement(void *ctx, const ina_rpc_request_t *request,
                                    ina_rpc_reply_t *reply) {
  ina_agent_t *agent = ctx;
  Ina__V1__GetPlacementRequest *req =
      ina__v1__get_placement_request__unpack(NULL, request->size, request->bytes);
  if (!req)
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "request: %zu bytes are not an ina.v1.GetPlacementRequest", request->size);
  ina__v1__get_placement_request__free_unpacked(req, NULL);

  const ina_model_config_t *cfg = ina_model_config(agent->model);
  size_t n_layers = 0, n_experts = (size_t)cfg->n_routed_experts;
  for (int32_t l = 0; l < cfg->num_layers; l++) n_layers += (size_t)ina_cfg_layer_is_moe(cfg, l);
  /* EP rank g holds experts [g * per_rank, (g + 1) * per_rank) in slots 0 .. per_rank - 1. */
  const size_t ep = (size_t)agent->ep, per_rank = n_experts / ep;
  /* One allocation each for the layers, the slots and the pointer arrays. */
  Ina__V1__LayerPlacement *layers = calloc(n_layers + 1, sizeof *layers);
  Ina__V1__LayerPlacement **layer_ptrs = calloc(n_layers + 1, sizeof *layer_ptrs);
  Ina__V1__ExpertSlot *slots = calloc(n_experts + 1, sizeof *slots);
  Ina__V1__ExpertSlot **slot_ptrs = calloc(n_experts + 1, sizeof *slot_ptrs);
  ina_rpc_code_t code = INA_RPC_OK;
  if (!layers || !layer_ptrs || !slots || !slot_ptrs) {
    code = ina_rpc_error(reply->message, INA_RPC_RESOURCE_EXHAUSTED, "out of memory");
    goto done;
  }
  /* Every layer holds the same map, so they share the slot array. */
  for (size_t e = 0; e < n_experts; e++) {
    Ina__V1__ExpertSlot s = INA__V1__EXPERT_SLOT__INIT;
    s.ep_rank = (uint32_t)(e / per_rank);
    s.slot = (uint32_t)(e % per_rank);
    s.logical_expert = (uint32_t)e;
    slots[e] = s;
    slot_ptrs[e] = &slots[e];
  }
  for (size_t l = 0; l < n_layers; l++) {
    Ina__V1__LayerPlacement lp = INA__V1__LAYER_PLACEMENT__INIT;
    lp.moe_layer = (uint32_t)l;
    lp.n_slots = n_experts;
    lp.slots = slot_ptrs;
    layers[l] = lp;
    layer_ptrs[l] = &layers[l];
  }
  Ina__V1__Layout layout = INA__V1__LAYOUT__INIT;
  layout.tp = (uint32_t)agent->tp;
  layout.dp = (uint32_t)agent->dp;
  layout.ep = (uint32_t)agent->ep;
  Ina__V1__ExpertPlacement placement = INA__V1__EXPERT_PLACEMENT__INIT;
  placement.layout = &layout;
  placement.slots_per_rank = (uint32_t)per_rank;
  placement.n_layers = n_layers;
  placement.layers = layer_ptrs;
  placement.generation = 1; /* the placement loaded at start-up; never changes here */
  Ina__V1__GetPlacementResponse resp = INA__V1__GET_PLACEMENT_RESPONSE__INIT;
  resp.placement = &placement;
  if (ina_rpc_pack(&resp.base, &reply->bytes, &reply->size) != INA_OK)
    code = ina_rpc_error(reply->message, INA_RPC_INTERNAL, "cannot pack the response");
done:
  free(layers);
  free(layer_ptrs);
  free(slots);
  free(slot_ptrs);
  return code;
}

static ina_rpc_code_t apply_placement(void *ctx, const ina_rpc_request_t *request,
                                      ina_rpc_reply_t *reply) {
  Ina__V1__ApplyPlacementRequest *req =
      ina__v1__apply_placement_request__unpack(NULL, request->size, request->bytes);
  if (!req)
    return ina_rpc_error(reply->message, INA_RPC_INVALID_ARGUMENT,
                         "request: %zu bytes are not an ina.v1.ApplyPlacementRequest", request->size);
  ina__v1__apply_placement_request__free_unpacked(req, NULL);
  return ina_rpc_error(reply->message, INA_RPC_FAILED_PRECONDITION,
                       "the placement cannot change in this version (it stays at generation 1)");
}

ina_status_t agent_register_placement_service(ina_agent_t *agent, const char *admin_token) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_rpc_server_add_unary(agent->server, GET_PLACEMENT_METHOD, get_placement, agent, NULL));
  INA_CHECK(ina_rpc_server_add_unary(agent->server, APPLY_PLACEMENT_METHOD, apply_placement, agent,
                                     admin_token));
fail:
  return st;
}
