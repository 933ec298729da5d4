/* An expert placement: which logical routed expert each physical expert slot holds, per
 * MoE layer, over the ranks of an expert-parallel group.
 *
 * Each of the `ep` ranks has `slots_per_rank` slots per MoE layer; a slot holds one
 * logical expert in [0, num_experts) or is empty (-1). A logical expert may sit in
 * several slots (redundant replicas of a hot expert); the engine then spreads its tokens
 * over the replicas. A placement is valid when, in every layer, every logical expert has
 * at least one slot and no rank holds the same expert twice (a second copy on the same
 * rank would only cost memory).
 *
 * The placement an engine starts with is the contiguous one: rank r holds experts
 * [E * r / ep, E * (r + 1) / ep) in its first slots, in order (ina_parallel_job_shard).
 *
 * A model without MoE layers (no routed experts, or first_k_dense_replace >= its layers)
 * has a placement of zero MoE layers: nothing to place, every placement of its shape is
 * valid, and num_experts may then be 0. MoE layers without experts do not exist.
 *
 * Ownership: init/free pairs own slot_expert; free(NULL-filled) is a no-op. Thread
 * safety: plain data. */
#ifndef INA_MOE_EP_EXPERT_PLACEMENT_H
#define INA_MOE_EP_EXPERT_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_expert_placement {
  int32_t ep;             /* ranks that share the experts */
  int32_t slots_per_rank; /* slots per rank and MoE layer */
  int32_t num_moe_layers;
  int32_t num_experts;    /* logical routed experts per layer */
  /* [num_moe_layers][ep][slots_per_rank]: the logical expert of each slot, -1 empty
   * (see ina_expert_placement_slot). */
  int32_t *slot_expert;
} ina_expert_placement_t;

/* Every slot empty. ep and slots_per_rank must be >= 1, num_moe_layers >= 0, num_experts
 * >= 1 (>= 0 when num_moe_layers is 0), with at most 2^31 slots in all; else
 * INA_ERR_INVALID_ARGUMENT. */
ina_status_t ina_expert_placement_init(int32_t ep, int32_t slots_per_rank, int32_t num_moe_layers,
                                       int32_t num_experts, ina_expert_placement_t *out);
/* The contiguous placement (see above): slots_per_rank = ceil(num_experts / ep), 1 when
 * there are no experts. */
ina_status_t ina_expert_placement_init_contiguous(int32_t ep, int32_t num_moe_layers,
                                                  int32_t num_experts, ina_expert_placement_t *out);
ina_status_t ina_expert_placement_copy(const ina_expert_placement_t *src, ina_expert_placement_t *out);
void ina_expert_placement_free(ina_expert_placement_t *p);

/* Index into slot_expert of (MoE layer, rank, slot). */
static inline size_t ina_expert_placement_index(const ina_expert_placement_t *p, int32_t layer,
                                                int32_t rank, int32_t slot) {
  return ((size_t)layer * (size_t)p->ep + (size_t)rank) * (size_t)p->slots_per_rank + (size_t)slot;
}

static inline int32_t ina_expert_placement_slot(const ina_expert_placement_t *p, int32_t layer,
                                                int32_t rank, int32_t slot) {
  return p->slot_expert[ina_expert_placement_index(p, layer, rank, slot)];
}

/* The slot of `rank` that holds expert x in MoE layer `layer`, or -1. */
int32_t ina_expert_placement_find_slot(const ina_expert_placement_t *p, int32_t layer, int32_t rank, int32_t x);
/* The rank that sends expert x of `layer` to a rank that lacks it in a placement change
 * away from p: the lowest that holds it in p, or -1. */
int32_t ina_expert_placement_source(const ina_expert_placement_t *p, int32_t layer, int32_t x);

/* INA_ERR_INVALID_ARGUMENT unless p is valid (see above); the message names the first
 * offence: "MoE layer 3: logical expert 17 has no slot", "MoE layer 0, rank 1, slot 2:
 * expert 40 is outside [0, 32)", "... holds expert 5 twice". */
ina_status_t ina_expert_placement_validate(const ina_expert_placement_t *p);

/* 1 when a and b have the same sizes and slots. */
int ina_expert_placement_equal(const ina_expert_placement_t *a, const ina_expert_placement_t *b);

/* A 64-bit digest of sizes and slots (to check that ranks agree on a placement). */
uint64_t ina_expert_placement_digest(const ina_expert_placement_t *p);

#ifdef __cplusplus
}
#endif
#endif
