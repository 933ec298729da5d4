/* The routed-expert weights one rank holds, slot by slot (moe_ep/expert_placement.h), and
 * the move that refills the slots for a new placement. Used by model/'s CPU engine.
 *
 * A slot's weights either view the model's own tensors (the experts the rank was loaded
 * with) or live in a buffer the slot owns (experts received from another rank). A move
 * builds a complete new set next to the old one: experts the rank already holds are
 * carried over (same tensors, no copy), the others are sent by the lowest rank that
 * holds them, so that the old set stays usable until the caller commits.
 *
 * Wire format of one expert (int64 words): for each of gate, up, down: block_rows,
 * block_cols, then for each of weight, scale_inv, bias: dtype, ndim, shape[0], shape[1],
 * bytes, and the data padded to whole words.
 *
 * Ownership: a set owns its arrays and its owned buffers, except those it shares with
 * another set (see ina_expert_slots_release). Thread safety: one thread at a time. */
#ifndef INA_MOE_EP_EXPERT_SLOTS_H
#define INA_MOE_EP_EXPERT_SLOTS_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "moe_ep/expert_placement.h"
#include "model/weights.h"

typedef struct ina_expert_slots {
  int32_t num_moe_layers, slots_per_rank;
  ina_mlp_weights_t *w; /* [num_moe_layers * slots_per_rank]; empty tensors for empty slots */
  void **owned;         /* the same shape: the buffer behind w[i], or NULL for a view */
} ina_expert_slots_t;

/* The slots of `rank` in placement p over the experts the model holds (w->expert_begin
 * ..): views, no copy. moe_layers[m] is the model layer of the m-th MoE layer. Each slot's
 * expert must be one w holds, else INA_ERR_INVALID_ARGUMENT. */
ina_status_t ina_expert_slots_from_model(const ina_weights_t *w, const int32_t *moe_layers,
                                         const ina_expert_placement_t *p, int32_t rank,
                                         ina_expert_slots_t *out);

static inline const ina_mlp_weights_t *ina_expert_slots_at(const ina_expert_slots_t *s,
                                                           int32_t layer, int32_t slot) {
  return &s->w[(int64_t)layer * s->slots_per_rank + slot];
}

/* Collective over comm (NULL: this rank alone): bytes[m], the weight bytes of one routed
 * expert of MoE layer m, from whichever rank holds one. */
ina_status_t ina_expert_slots_expert_bytes(const ina_expert_slots_t *s, ina_comm_t *comm,
                                           int64_t *bytes);

/* Bytes `rank` would receive to go from placement `from` to `to` (experts it does not
 * hold yet), with bytes[] as above. */
int64_t ina_expert_slots_incoming_bytes(const ina_expert_placement_t *from,
                                        const ina_expert_placement_t *to, int32_t rank,
                                        const int64_t *bytes);

/* Collective over comm (NULL: one rank): the slots of `rank` for placement `to` into *out,
 * given this rank's slots `have` for placement `from` (both valid, same sizes apart from
 * slots_per_rank). Every rank runs the same exchanges whatever fails locally, so a local
 * failure (memory, a malformed peer message) is returned only after the last exchange and
 * *out is then empty; the caller agrees with the other ranks on the outcome. Adds the
 * bytes received to *bytes_received. */
ina_status_t ina_expert_slots_move(ina_comm_t *comm, int32_t rank, const ina_expert_placement_t *from,
                                   const ina_expert_slots_t *have, const ina_expert_placement_t *to,
                                   ina_expert_slots_t *out, int64_t *bytes_received);

/* Free the arrays of s and its owned buffers, except those `keep` (may be NULL) uses too:
 * after a move, release the old set keeping the new one to commit, or the new set keeping
 * the old one to roll back. */
void ina_expert_slots_release(ina_expert_slots_t *s, const ina_expert_slots_t *keep);

#endif
