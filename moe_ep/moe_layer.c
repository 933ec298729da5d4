/* One routed-MoE layer over the dispatch/combine exchange, in three stages (moe_layer.h). */
#define INA_LOG_SUBSYS "moe_ep"
#include "moe_ep/moe_layer.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

void ina_moe_flight_init(ina_moe_flight_t *f, ina_ep_exchange_t *ex, const ina_ep_group_t *group,
                         const ina_moe_ops_t *ops, int32_t top_k) {
  memset(f, 0, sizeof *f);
  f->ex = ex;
  f->group = group;
  f->ops = ops;
  f->top_k = top_k;
}

void ina_moe_flight_free(ina_moe_flight_t *f) {
  free(f->ids);
  free(f->weights);
  f->ids = NULL;
  f->weights = NULL;
}

ina_status_t ina_moe_flight_begin(ina_moe_flight_t *f, int32_t layer, int32_t moe, const float *x, int64_t tokens) {
  ina_status_t st = INA_OK;
  const ina_ep_group_t *g = f->group;
  const int32_t E = g->placement.num_experts, K = f->top_k;
  ina_moe_flight_free(f);
  f->layer = layer;
  f->moe = moe;
  f->tokens = tokens;
  f->ids = malloc(((size_t)tokens * (size_t)K + 1) * sizeof *f->ids);
  f->weights = malloc(((size_t)tokens * (size_t)K + 1) * sizeof *f->weights);
  INA_CHECK_ALLOC(f->ids);
  INA_CHECK_ALLOC(f->weights);
  INA_CHECK(f->ops->route(f->ops->ctx, layer, moe, x, tokens, f->ids, f->weights));
  {
    /* The layer's replica tables (expert_parallel.h): per layer E + 1 starts, and
     * ranks x slots entries. */
    const size_t per_layer = (size_t)g->placement.ep * (size_t)g->placement.slots_per_rank;
    const ina_ep_replicas_t rep = {E, g->replica_first + (size_t)moe * ((size_t)E + 1),
                                   g->replica_rank + (size_t)moe * per_layer, g->replica_slot + (size_t)moe * per_layer};
    INA_CHECK(ina_ep_dispatch_start(f->ex, &rep, x, f->ids, tokens));
  }
fail:
  return st;
}

ina_status_t ina_moe_flight_experts(ina_moe_flight_t *f) {
  ina_status_t st = INA_OK;
  INA_CHECK(ina_ep_dispatch_finish(f->ex));
  {
    ina_ep_received_t got;
    ina_ep_received(f->ex, &got);
    float *outs = ina_ep_outputs(f->ex);
    for (int32_t slot = 0; slot < got.slots; slot++) {
      if (got.count[slot] == 0) continue;
      const int64_t begin = got.layout == INA_EP_LAYOUT_MASKED ? slot * got.capacity : got.first[slot];
      const int64_t at = begin * got.hidden;
      INA_CHECK(f->ops->expert(f->ops->ctx, f->layer, f->moe, slot, got.rows + at, got.count[slot], outs + at));
    }
  }
  INA_CHECK(ina_ep_combine_start(f->ex));
fail:
  return st;
}

ina_status_t ina_moe_flight_end(ina_moe_flight_t *f, float *out, ina_ep_stats_t *stats) {
  return ina_ep_combine_finish(f->ex, f->weights, out, stats);
}
