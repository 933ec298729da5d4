/* Expert parallelism of the CPU engine: which rank holds which routed experts, and the
 * exchange that gives every rank every expert's outputs. Internal to model/.
 *
 * Tokens are replicated over the group (every rank runs the same batch), so every rank
 * knows the whole routing. The routed (token, slot) pairs of a MoE layer are ordered by
 * expert, then token, then slot; each rank computes the rows of its own experts, which
 * form one contiguous block of that order, and one all-to-all hands every block to every
 * rank. The combine then runs in the single-rank order, so results are bit-identical to
 * one rank holding all experts.
 *
 * Ownership: the group borrows the communicator and owns its range table. Thread safety:
 * as the communicator (one thread at a time). */
#ifndef INA_MODEL_EXPERT_PARALLEL_H
#define INA_MODEL_EXPERT_PARALLEL_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"

typedef struct ina_ep_group {
  ina_comm_t *comm; /* NULL: one rank holds every expert */
  int32_t rank, nranks;
  int32_t *first_expert; /* [nranks + 1]: rank r holds [first_expert[r], first_expert[r + 1]) */
} ina_ep_group_t;

/* Collective over comm (every rank calls it): gathers each rank's expert range
 * [expert_begin, expert_end) and checks that the ranges, in rank order, tile
 * [0, num_experts). With comm NULL the range must be all experts. A rank whose range
 * breaks the tiling fails on every rank with INA_ERR_INVALID_ARGUMENT naming it. */
ina_status_t ina_ep_group_init(ina_comm_t *comm, int32_t expert_begin, int32_t expert_end,
                               int32_t num_experts, ina_ep_group_t *out);
void ina_ep_group_free(ina_ep_group_t *g);

/* Collective. y: [pairs, hidden] f32, the pairs of a layer in expert order, pair_first
 * [num_experts + 1] the first pair of each expert. On entry each rank has filled the rows
 * of its own experts; on return every rank has every row. No-op for one rank. */
ina_status_t ina_ep_share_outputs(const ina_ep_group_t *g, const int64_t *pair_first,
                                  int64_t hidden, float *y);

#endif
