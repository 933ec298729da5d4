/* One routed-MoE layer over the dispatch/combine exchange (dispatch.h), in the three
 * stages that two micro-batches interleave (two-batch overlap):
 *
 *   begin    route this rank's rows (the engine's router), and start sending each row
 *            to the ranks that hold its experts (the group's replica tables);
 *   experts  finish the dispatch, run each local slot's expert on the rows it received
 *            (the engine's expert), and start sending the outputs home;
 *   end      finish the combine: out = the routing-weighted sum of each row's expert
 *            outputs in the one-rank order, so the sum is bit-identical to one rank's.
 *
 * An engine runs them back to back for one batch, or interleaves two flights (one
 * exchange each) so that one's exchange travels while the other computes. The engine
 * supplies what differs between engines, the router and the experts (ina_moe_ops_t);
 * the stages own the calls to the exchange, the layer's replica tables and its traffic.
 * The shared experts and the residual stay the engine's.
 *
 * Failures: each stage returns the exchange's status; a stage that failed on one rank
 * fails the matching finish on every rank (dispatch.h). After a failure the engine
 * drains its exchanges (ina_ep_exchange_drain) and frees the flight.
 *
 * Ownership: a flight borrows its exchange, group and ops; it owns its routing
 * (ids, weights), freed by ina_moe_flight_free. Thread safety: as the exchange. */
#ifndef INA_MOE_EP_MOE_LAYER_H
#define INA_MOE_EP_MOE_LAYER_H

#include <stdint.h>

#include "core/status.h"
#include "moe_ep/dispatch.h"
#include "moe_ep/expert_parallel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_moe_ops {
  /* ids, weights [T, top_k]: the experts and weights of rows x [T, hidden] at MoE layer
   * `moe` (model layer `layer`). */
  ina_status_t (*route)(void *ctx, int32_t layer, int32_t moe, const float *x, int64_t T, int32_t *ids,
                        float *weights);
  /* out [n, hidden] = the expert in `slot` of MoE layer `moe` on rows [n, hidden]. */
  ina_status_t (*expert)(void *ctx, int32_t layer, int32_t moe, int32_t slot, const float *rows, int64_t n,
                         float *out);
  void *ctx;
} ina_moe_ops_t;

typedef struct ina_moe_flight {
  ina_ep_exchange_t *ex;     /* borrowed: one per flight in the air at once */
  const ina_ep_group_t *group;
  const ina_moe_ops_t *ops;
  int32_t top_k;
  /* the layer in flight, set by begin */
  int32_t layer, moe;
  int64_t tokens;
  int32_t *ids;              /* [tokens, top_k] */
  float *weights;            /* [tokens, top_k]; the engine may scale them before end */
} ina_moe_flight_t;

/* A flight over exchange ex for the group's MoE layers, top_k experts per token. */
void ina_moe_flight_init(ina_moe_flight_t *f, ina_ep_exchange_t *ex, const ina_ep_group_t *group,
                         const ina_moe_ops_t *ops, int32_t top_k);
void ina_moe_flight_free(ina_moe_flight_t *f);

/* The stages, collective over the group's ranks (each rank its own rows; tokens may be
 * 0). x is read by begin only. */
ina_status_t ina_moe_flight_begin(ina_moe_flight_t *f, int32_t layer, int32_t moe, const float *x, int64_t tokens);
ina_status_t ina_moe_flight_experts(ina_moe_flight_t *f);
/* out [tokens, hidden]; *stats (may be NULL) the layer's traffic and blocked time. */
ina_status_t ina_moe_flight_end(ina_moe_flight_t *f, float *out, ina_ep_stats_t *stats);

#ifdef __cplusplus
}
#endif

#endif
