/* Expert parallelism of the CPU engine: which rank computes which routed (token, expert)
 * pairs, and the exchange that gives every rank every pair's output.
 *
 * Tokens are replicated over the group (every rank runs the same batch), so every rank
 * knows the whole routing. The routed pairs of a MoE layer are ordered by expert, then
 * token, then top-k slot. The group's placement (moe_ep/expert_placement.h) says which
 * slots hold each logical expert; an expert with R replicas has its pairs cut into R
 * contiguous runs of near-equal length, the j-th run going to its j-th replica in (rank,
 * slot) order. Every rank derives the same pieces from the routing, computes its own,
 * and one all-gather of the computed rows hands every piece to every rank. The combine
 * then runs in the single-rank order, and a row's value does not depend on which rank
 * computed it, so results are bit-identical to one rank holding every expert.
 *
 * Ownership: the group borrows the communicator and owns its placement and tables.
 * Thread safety: as the communicator (one thread at a time). */
#ifndef INA_MOE_EP_EXPERT_PARALLEL_H
#define INA_MOE_EP_EXPERT_PARALLEL_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "moe_ep/expert_placement.h"

typedef struct ina_ep_group {
  ina_comm_t *comm; /* NULL: one rank */
  int32_t rank, nranks;
  ina_expert_placement_t placement;
  /* Replicas of each logical expert, per MoE layer, in (rank, slot) order: those of expert
   * x of layer l are entries [replica_first[l * (E + 1) + x], ... + x + 1]) of
   * replica_rank / replica_slot. */
  int32_t *replica_first;
  int32_t *replica_rank, *replica_slot;
} ina_ep_group_t;

/* One run of pairs computed by one slot. */
typedef struct ina_ep_piece {
  int32_t rank, slot, expert;
  int64_t pair_begin, pair_end;
} ina_ep_piece_t;

/* Collective over comm (every rank calls it): gathers each rank's expert range
 * [expert_begin, expert_end) and checks that the ranges, in rank order, tile
 * [0, num_experts); the group starts with the placement where rank r holds its range in
 * slots 0, 1, ... With comm NULL the range must be all experts. A rank whose range breaks
 * the tiling fails on every rank with INA_ERR_INVALID_ARGUMENT naming it. A model without
 * MoE layers (num_moe_layers 0; num_experts may then be 0, every range empty) gives a
 * group with nothing to place or exchange. */
ina_status_t ina_ep_group_init(ina_comm_t *comm, int32_t expert_begin, int32_t expert_end,
                               int32_t num_experts, int32_t num_moe_layers, ina_ep_group_t *out);
void ina_ep_group_free(ina_ep_group_t *g);

/* The group's tables for placement p (valid, p->ep == the group's ranks) into *out, which
 * owns a copy of p; comm, rank and nranks are taken from g. Local, no communication:
 * ina_ep_group_swap then installs them without failing. */
ina_status_t ina_ep_group_prepare(const ina_ep_group_t *g, const ina_expert_placement_t *p,
                                  ina_ep_group_t *out);
/* Exchange the placements and tables of a and b. */
void ina_ep_group_swap(ina_ep_group_t *a, ina_ep_group_t *b);

/* The pieces of MoE layer `layer` in the order every rank uses: experts in order, each
 * expert's replicas in (rank, slot) order; empty runs are left out. pair_first
 * [num_experts + 1] is the first pair of each expert. Calls visit(piece, arg) for each;
 * a non-OK return stops the walk and is returned. */
ina_status_t ina_ep_walk_pieces(const ina_ep_group_t *g, int32_t layer, const int64_t *pair_first,
                                ina_status_t (*visit)(const ina_ep_piece_t *piece, void *arg),
                                void *arg);

/* Collective. y: [pairs, hidden] f32, the pairs of MoE layer `layer` in expert order. On
 * entry each rank has filled the rows of its own pieces; on return every rank has every
 * row. No-op for one rank. */
ina_status_t ina_ep_share_outputs(const ina_ep_group_t *g, int32_t layer, const int64_t *pair_first,
                                  int64_t hidden, float *y);

#endif
