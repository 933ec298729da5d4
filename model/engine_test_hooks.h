/* Test-only hooks of the CPU engine, for the GPU oracle's tests (tests/model/oracle.h):
 * deliberate bugs that the oracle's comparison must reject, and the routing margins that
 * tell which rows sit at a near-tie of expert choice. Not for serving: nothing outside
 * tests calls these. Driver thread only, between steps. */
#ifndef INA_MODEL_ENGINE_TEST_HOOKS_H
#define INA_MODEL_ENGINE_TEST_HOOKS_H
#include <stdint.h>

#include "core/status.h"
#include "model/model.h"

/* Each a small real bug of the kind a kernel change could bring. "Decode" is a query token
 * with earlier context of its own sequence in the cache (a one-token step after the
 * prompt). */
typedef enum ina_engine_mutation {
  INA_MUTATION_NONE = 0,
  INA_MUTATION_DECODE_SCALE,        /* decode: softmax scale x 0.95 */
  INA_MUTATION_DECODE_NO_MSCALE,    /* decode: softmax scale 1/sqrt(qk_head_dim), without YaRN's mscale^2 */
  INA_MUTATION_ROUTED_SCALE,        /* routed experts' outputs x 0.95 */
  INA_MUTATION_EXPERT_SWAP,         /* first MoE layer: experts 0 and 1 trade weights */
  INA_MUTATION_LATENT_EPS,          /* q_a / kv_a RMSNorm eps 1e-5 instead of 1e-6 */
  INA_MUTATION_ROPE_THETA,          /* rope_theta ignored (10000) */
  INA_MUTATION_DECODE_SKIP_NEWEST,  /* decode: attention misses the newest key (its own) */
  INA_MUTATION_FP8_SCALE_TRANSPOSED, /* GPU numerics: layer 0 kv_a_proj reads its FP8 scale grid transposed */
  INA_MUTATION_NO_SHARED,           /* shared experts dropped */
  INA_MUTATION_INDEX_TOPK_LESS,     /* V3.2: each query keeps index_topk - 1 positions */
  INA_MUTATION_INDEX_KEY_NO_ROPE,   /* V3.2: the indexer's key is not roped */
  INA_MUTATION_COUNT
} ina_engine_mutation_t;

/* Short name of a mutation ("decode scale x0.95", ...); "?" when out of range. */
const char *ina_engine_mutation_name(int32_t mutation);

/* Applies `mutation` to every later step of a CPU engine (INA_MUTATION_NONE undoes it).
 * INA_ERR_UNSUPPORTED for a CUDA engine, INA_ERR_INVALID_ARGUMENT out of range. */
ina_status_t ina_engine_set_mutation(ina_engine_t *engine, int32_t mutation);

/* The oracle's error model of the CUDA engine (tests/model/oracle.h): the same rounding
 * points, sums in another order. Before each bf16 rounding every value is scaled by
 * 1 + u * relative, u uniform in [-1, 1) from a generator seeded with `seed`; the
 * attention output's by 1 + u * attention, and the outputs tensor parallelism sums over
 * ranks (o_proj, each MLP or MoE block) by 1 + u * reduced. 0 turns a part off. */
typedef struct ina_engine_noise {
  float relative, attention, reduced;
  uint64_t seed;
} ina_engine_noise_t;

/* Sets the noise of a CPU engine in GPU numerics (INA_ERR_UNSUPPORTED otherwise;
 * INA_ERR_INVALID_ARGUMENT for a part outside [0, 1)). */
ina_status_t ina_engine_set_rounding_noise(ina_engine_t *engine, const ina_engine_noise_t *noise);

/* How a token row of the last step was routed. */
typedef struct ina_engine_route {
  /* The smallest gap, over the MoE layers and every choice the router made (groups, then
   * experts), between the score of what was kept and the best of what was not, in the
   * units the choice was made in (ina_router_ref_margins); +inf without MoE layers.
   * DeepSeek-V3.2's top-k selections count as choices too: the gap between the last
   * index score kept and the best dropped, over the scale of their error (engine_cpu.c,
   * record_selection). */
  float margin;
  /* A hash of the sets of experts chosen, layer after layer (and of V3.2's selected
   * positions): equal for two runs that routed the row alike (up to hash collisions). */
  uint64_t experts;
} ina_engine_route_t;

/* The last step's routes, one per token row in step order. CPU engine in
 * INA_ENGINE_NUMERICS_GPU only (INA_ERR_UNSUPPORTED otherwise); *count receives the rows,
 * out gets min(count, capacity) of them (out may be NULL with capacity 0). */
ina_status_t ina_engine_routes(ina_engine_t *engine, ina_engine_route_t *out, int64_t capacity, int64_t *count);

#endif
