/* The expert load balancer of `ina place --balance`: from the tokens routed to each
 * logical expert of each MoE layer, an expert map (placement.proto) that evens out the
 * work of the expert-parallel ranks.
 *
 * What it optimizes: the engine splits a replicated expert's tokens evenly among its
 * replicas, so a replica of expert e with r_e replicas carries load_e / r_e, and a rank's
 * load is the sum over the replicas it holds. The balancer keeps the largest rank load
 * of each layer low, in three steps:
 *   1. replica counts: every expert has one replica; spare slots become extra replicas
 *      one at a time, each for the expert with the highest load per replica (ties: the
 *      lower index) among those with fewer than ep replicas and load > 0. More replicas
 *      are not always better (a replica on every rank adds the same load to each and
 *      removes a piece that could even out the others), so several prefixes of that
 *      sequence are tried (every length up to 64 spare slots, else 65 lengths evenly
 *      spread from none to all) and the one with the lowest largest rank load after
 *      steps 2 and 3 is kept (ties: fewer replicas, fewer weights to move). Slots left
 *      over stay empty.
 *   2. packing: replicas from the heaviest (ties: lower expert index) onto the least
 *      loaded rank (ties: lower rank) that has a free slot and lacks that expert. When
 *      every rank with a free slot already holds the expert, a replica of another expert
 *      moves from a full rank into such a free slot to make room, so packing never fails.
 *   3. refinement: while moving one replica from the heaviest rank to another rank, or
 *      swapping one of its replicas with one of another rank's, lowers the heavier rank
 *      of the pair below the heaviest load by more than a 1e-9 fraction, the best such
 *      exchange is made (up to a work budget that only shapes with very many slots per
 *      rank reach). So the result is a local optimum: no single move or swap between
 *      the heaviest rank and another lowers the heavier of the two by more than that.
 * This is a heuristic: the largest rank load is low, not guaranteed minimal, and can
 * exceed that of another placement (the contiguous start-up one, say) in rare inputs.
 * A layer whose loads are all 0 (no token counted) is balanced as if every expert had
 * the same load. On return each rank holds at most slots_per_rank replicas and never two
 * of one expert, every expert has at least one replica, a rank's replicas fill its first
 * slots in increasing expert order, and the rest of its slots are empty (-1).
 *
 * placement_rebalance plans relative to the map in force: it keeps the layers the plan
 * does not improve and numbers the ranks of the others so that the fewest weights move.
 *
 * Purity: a function of its arguments alone (no I/O, no global state, no randomness;
 * scratch memory is allocated and freed within each call): the same input always gives
 * the same output. Ownership: the caller owns every array;
 * the functions read their inputs and write only the output arrays. No pointer may be
 * NULL except `error` when error_size is 0, and `kept` where said. Thread safety:
 * reentrant. */
#ifndef INA_MOE_EP_PLACEMENT_BALANCE_H
#define INA_MOE_EP_PLACEMENT_BALANCE_H

#include <stddef.h>
#include <stdint.h>

/* Balances `layers` MoE layers of `experts` logical experts over `ep` ranks of
 * `slots_per_rank` slots. load[l * experts + e] is the token count of expert e in layer
 * l. Writes slot_expert[(l * ep + r) * slots_per_rank + s] = the logical expert in slot s
 * of rank r in layer l, or -1 for an empty slot. Returns 0, or -1 with the reason in
 * `error` (at most error_size bytes, NUL-terminated) and slot_expert unspecified: a size
 * below 1, ep * slots_per_rank < experts (some expert would have no slot),
 * slots_per_rank > experts (a rank holds each expert at most once), sizes whose product
 * overflows, or no memory for the scratch arrays. */
int placement_balance(const uint64_t *load, int32_t layers, int32_t experts, int32_t ep,
                      int32_t slots_per_rank, int32_t *slot_expert, char *error, size_t error_size);

/* placement_balance, then per layer against the map in force in_force[(l * ep + r) *
 * in_force_slots + s] (-1: empty), so that an operator's rebalance changes no more than
 * it gains:
 *   - a layer whose plan does not lower the largest rank load of the map in force (by
 *     more than a 1e-9 fraction; loads as balanced, so uniform when all 0) keeps the map
 *     in force, its slots as they are and slots from in_force_slots on empty. That needs
 *     in_force_slots <= slots_per_rank; with fewer slots every layer takes its plan.
 *   - otherwise the plan's ranks are renumbered (which changes no rank's load, only which
 *     rank carries it) so that as many replicas as possible stay on a rank that holds
 *     their expert already: the fewest expert weights to move. The renumbering is an
 *     optimal assignment (Hungarian method), ties to lower ranks.
 * So with in_force_slots <= slots_per_rank no layer's largest rank load gets higher.
 * kept[l] (NULL: not wanted) says whether layer l kept its map. Errors as
 * placement_balance, and also in_force_slots outside [1, experts] or an in-force slot
 * holding an expert outside [-1, experts). The map in force need not be valid otherwise:
 * a layer that leaves an expert without a slot or holds one twice on a rank is always
 * replaced. */
int placement_rebalance(const uint64_t *load, const int32_t *in_force, int32_t in_force_slots,
                        int32_t layers, int32_t experts, int32_t ep, int32_t slots_per_rank,
                        int32_t *slot_expert, unsigned char *kept, char *error, size_t error_size);

/* Steps 2 and 3 alone, for one layer with the replica counts given: replicas[e] in
 * [1, ep], summing to at most ep * slots_per_rank. load[e], slot_expert and the errors
 * are as in placement_balance (one layer); also an error: replica counts out of bounds. */
int placement_pack(const uint64_t *load, const int32_t *replicas, int32_t experts, int32_t ep,
                   int32_t slots_per_rank, int32_t *slot_expert, char *error, size_t error_size);

/* The load of each rank under one layer's expert map slot_expert[r * slots_per_rank + s]
 * (-1: empty), when every expert's load[e] is split evenly among its replicas: writes
 * rank_load[0 .. ep). Returns 0, or -1 when a slot holds an expert outside [0, experts)
 * or an expert with load > 0 has no replica (its tokens would go nowhere). */
int placement_rank_loads(const uint64_t *load, int32_t experts, int32_t ep, int32_t slots_per_rank,
                         const int32_t *slot_expert, double *rank_load);

#endif
