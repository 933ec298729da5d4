/* A traffic and time model of one MoE layer's expert-parallel exchange, per rank: what
 * the dispatch/combine exchange (dispatch.h) sends, against the all-gather exchange
 * (every rank gathers every token, the outputs are reduce-scattered back), and the time
 * each takes from per-byte and per-message costs.
 *
 * Routing: `samples` tokens with independent N(0, 1) router logits through the real
 * router (moe_ep/router.h, the model's method and groups), experts placed contiguously
 * (rank r holds experts [E r / ep, E (r + 1) / ep)), each token's home rank drawn
 * uniformly. That gives, per token, the ranks it must reach and its entries on remote
 * ranks; a batch of tokens_per_rank tokens per rank gives the messages (peers reached).
 * Random logits spread tokens evenly: real routing is skewed, so the model's figures are
 * for a balanced placement (ina place --balance makes one).
 *
 * Per rank and layer, with T = tokens per rank, H = hidden, b = payload bytes per value:
 *   dispatch  remote (token, rank) pairs x (H b_dispatch (+ scales) + 4 top_k) bytes;
 *   combine   remote (token, expert) entries x H b_combine bytes (one row per entry,
 *             summed at home in the one-rank order, see dispatch.h), or with
 *             combine_summed one row per remote (token, rank), each rank summing its
 *             experts' outputs first (fewer bytes, another order of the sum);
 *   messages  peers reached, once for each of the two exchanges;
 *   all-gather  the exchange that gathers every token and all-reduces the outputs:
 *             (ep - 1) T H b_dispatch for the all-gather, then 2 (ep - 1) T H b_combine
 *             for a ring all-reduce of the batch's outputs, in 3 (ep - 1) messages;
 *   time      messages x message_us + bytes / bytes_per_us, each exchange; the expert
 *             compute (3 H x I multiply-adds per entry received) at expert_flops_per_us
 *             when that is set.
 * The costs are parameters: defaults (INA_EP_COSTS_INIT) are the two-H200 NVLink figures
 * of bench/RESULTS.md (NCCL all-reduce busbw 300 GB/s at 256 MiB, 6.3 us at 8 KiB).
 *
 * Thread safety: pure functions. */
#ifndef INA_MOE_EP_EP_TRAFFIC_H
#define INA_MOE_EP_EP_TRAFFIC_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "moe_ep/router.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_ep_costs {
  double bytes_per_us;        /* one rank's link, one direction */
  double message_us;          /* fixed cost of a message */
  double expert_flops_per_us; /* <= 0: no compute term */
} ina_ep_costs_t;

#define INA_EP_COSTS_INIT {300e3, 6.3, 0.0}

typedef struct ina_ep_traffic_input {
  ina_router_config_t router;
  int64_t hidden;           /* H */
  int64_t moe_intermediate; /* I, for the compute term */
  int32_t moe_layers;
  int32_t ep;               /* ranks, 1..4096, dividing nothing in particular */
  int64_t tokens_per_rank;  /* T: under attention DP, the step's batch / ep */
  double dispatch_bytes_per_value; /* 2 bf16, 1 fp8 (scales added per 128), 4 f32 */
  double combine_bytes_per_value;  /* 2 bf16, 4 f32 */
  int combine_summed;              /* 1: one output row per (token, rank), see above */
  int32_t samples;          /* routed tokens drawn, >= 1 (4096 is plenty) */
  uint64_t seed;
} ina_ep_traffic_input_t;

typedef struct ina_ep_traffic {
  double ranks_per_token;        /* mean ranks a token reaches, its home included */
  double remote_ranks_per_token; /* of those, not its home */
  int32_t max_ranks_per_token;   /* the most any sampled token reached */
  double remote_entries_per_token; /* chosen experts on other ranks than the home */
  double peers_per_rank;         /* mean other ranks a rank's batch reaches */
  /* per rank and layer */
  double dispatch_bytes, combine_bytes, dispatch_messages;
  double allgather_bytes, allgather_messages;
  double dispatch_us, combine_us, allgather_us, compute_us;
  /* per step (every MoE layer): exchange plus compute */
  double step_dispatch_us, step_allgather_us;
} ina_ep_traffic_t;

/* INA_ERR_INVALID_ARGUMENT naming the field for a bad input or cost. */
ina_status_t ina_ep_traffic_estimate(const ina_ep_traffic_input_t *in, const ina_ep_costs_t *costs,
                                     ina_ep_traffic_t *out);

#ifdef __cplusplus
}
#endif

#endif
