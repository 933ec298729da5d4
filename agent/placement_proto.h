/* ina.v1.ExpertPlacement <-> ina_expert_placement_t, and the placement command that
 * travels to every rank's scheduler. Private to agent/.
 *
 * The conversion from a request checks everything the message can get wrong and names
 * the field path of the first offence ("placement.layers[3].slots[17].logical_expert:
 * ..."), so the orchestrator can see what to fix. What depends on the ranks' memory is
 * left to the engine.
 *
 * Ownership: *out placements are the caller's to free. Thread safety: pure functions. */
#ifndef INA_AGENT_PLACEMENT_PROTO_H
#define INA_AGENT_PLACEMENT_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "agent/rpc/rpc_status.h"
#include "ina/v1/placement.pb-c.h"
#include "moe_ep/expert_placement.h"

/* What the job is: its layout and the model's MoE shape. */
typedef struct placement_shape {
  int32_t tp, dp, ep;
  int32_t num_moe_layers, num_experts;
} placement_shape_t;

/* msg (from ApplyPlacement) into *out. On a bad message: INA_RPC_INVALID_ARGUMENT (or
 * FAILED_PRECONDITION for a layout other than the job's, which needs a restart) with the
 * field path and the offence in message[INA_RPC_MESSAGE_MAX]; *out is then empty. */
ina_rpc_code_t placement_from_proto(const Ina__V1__ExpertPlacement *msg, const placement_shape_t *shape,
                                    ina_expert_placement_t *out, char *message);

/* p as a GetPlacementResponse, packed into a malloc'ed buffer (*bytes, *size); empty slots
 * are left out. */
ina_status_t placement_pack_response(const ina_expert_placement_t *p, const placement_shape_t *shape,
                                     uint64_t generation, uint8_t **bytes, size_t *size);

/* The scheduler control command that applies p (dry_run: only checks it) on every rank,
 * as int64 words in a malloc'ed buffer. */
ina_status_t placement_command_encode(const ina_expert_placement_t *p, int dry_run, uint8_t **bytes,
                                      size_t *size);
/* Back from the bytes (checked: INA_ERR_FORMAT when they are not a command). */
ina_status_t placement_command_decode(const void *bytes, size_t size, ina_expert_placement_t *out,
                                      int *dry_run);

#endif
