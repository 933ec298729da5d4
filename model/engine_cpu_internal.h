/* The CPU engine's state, shared by the files of the CPU backend (engine_cpu.c: the step;
 * engine_cpu_placement.c: expert placement changes). Internal to model/. */
#ifndef INA_MODEL_ENGINE_CPU_INTERNAL_H
#define INA_MODEL_ENGINE_CPU_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "model/engine_backend.h"
#include "model/model.h"
#include "moe_ep/dispatch.h"
#include "moe_ep/expert_parallel.h"
#include "moe_ep/expert_slots.h"

struct ina_engine_cpu {
  const ina_model_t *model;
  ina_engine_layer_fn layer_hook; /* ina_engine_set_layer_hook; NULL: none */
  void *layer_hook_user;
  const ina_model_config_t *cfg;
  const ina_weights_t *w;
  ina_threadpool_t *pool;
  ina_page_pool_t *kv;
  float *inv_freq;
  float attention_factor;
  float softmax_scale;
  int expanded_decode;
  ina_ep_group_t ep;    /* which slots hold which routed experts, on every rank */
  ina_expert_slots_t slots; /* this rank's slots */
  int64_t max_expert_bytes; /* ina_engine_options_t.max_expert_bytes */
  int attention_dp;         /* ina_engine_options_t.attention_dp (with ep.comm) */
  /* The MoE exchange under attention DP: DISPATCH through `ex` (made for the placement's
   * slots per rank, remade when that changes), else ALLGATHER; and its traffic so far. */
  int32_t ep_exchange;
  ina_ep_config_t ex_config;
  ina_ep_exchange_t *ex[2];  /* one per micro-batch in flight (the second: two-batch overlap) */
  int32_t micro_batches;     /* ina_engine_options_t.micro_batches: 1, or 2 (overlap) */
  ina_engine_ep_traffic_t traffic;      /* published each step, under load_mu */
  ina_engine_ep_traffic_t step_traffic; /* the step's, driver thread only */
  ina_comm_t *tp_comm;  /* tensor parallelism: sums the partial outputs; NULL: one rank */
  int32_t heads;        /* attention heads of this rank (all of them without TP) */
  /* Tokens routed per (MoE layer, expert); read by other threads under load_mu. A step
   * counts into step_load (driver only) and publishes all layers at once when it ends,
   * so a reader never sees some layers of a step without the others. */
  pthread_mutex_t load_mu;
  uint64_t *expert_load;  /* [n_moe_layers, n_routed_experts] */
  uint64_t *step_load;    /* the same, for the step under way */
  int32_t *moe_index;     /* [num_layers]: the layer's MoE index, -1 for dense layers */
  int32_t *moe_layers;    /* [num_moe_layers]: the model layer of each MoE layer */
  int32_t num_moe_layers;
  int gpu_numerics;       /* INA_ENGINE_NUMERICS_GPU: round where the CUDA engine rounds */
  int fp8_index_keys;     /* V3.2: index keys quantized to FP8 as stored (the dequantized values kept) */
  int32_t mutation;       /* ina_engine_mutation_t (model/engine_test_hooks.h), 0 in service */
  ina_engine_route_t *routes; /* gpu_numerics: the last step's, per token row */
  ina_tensor_t *kv_a_norm_bf16; /* gpu_numerics: [num_layers] kv_a_layernorm weights as bf16 */
  int64_t route_rows;
  /* gpu_numerics: the oracle's model of the GPU's other summation order, applied before
   * the bf16 roundings (model/engine_test_hooks.h); all 0 in service. */
  ina_engine_noise_t noise;
  uint64_t noise_state;
};

#endif
