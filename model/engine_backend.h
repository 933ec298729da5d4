/* The engine backends behind model/model.h's ina_engine_* functions (model/engine.c
 * dispatches on ina_engine_options_t.device): the CPU engine (engine_cpu.c) and the CUDA
 * engine (engine_gpu.c, or engine_gpu_none.c in a build without CUDA). Each takes the
 * caller's options as given (struct_size-checked by engine.c) and has the semantics the
 * public functions document. Internal to model/. */
#ifndef INA_MODEL_ENGINE_BACKEND_H
#define INA_MODEL_ENGINE_BACKEND_H

#include <stddef.h>

#include "model/engine_test_hooks.h"
#include "model/model.h"

/* Bytes of the version-1 engine options: everything up to and including
 * expanded_decode. Fields after it are read only when struct_size covers them. */
#define ENGINE_OPTIONS_V1_SIZE (offsetof(ina_engine_options_t, expanded_decode) + sizeof(int))

/* options->cuda_graphs when the caller's struct has it (version 3), else on. */
static inline int ina_engine_options_cuda_graphs(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, cuda_graphs) + sizeof(int32_t) ? o->cuda_graphs != 0 : 1;
}

/* options->ep_comm when the caller's struct has it (version 4), else NULL. */
static inline ina_comm_t *ina_engine_options_ep_comm(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, ep_comm) + sizeof(ina_comm_t *)
             ? o->ep_comm
             : NULL;
}

/* options->tp_comm when the caller's struct has it (version 4), else NULL. */
static inline ina_comm_t *ina_engine_options_tp_comm(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, tp_comm) + sizeof(ina_comm_t *)
             ? o->tp_comm
             : NULL;
}

/* options->max_expert_bytes when the caller's struct has it (version 5), else 0. */
static inline int64_t ina_engine_options_max_expert_bytes(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, max_expert_bytes) + sizeof(int64_t)
             ? o->max_expert_bytes
             : 0;
}

/* options->attention_dp when the caller's struct has it (version 6), else 0 (off). */
static inline int ina_engine_options_attention_dp(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, attention_dp) + sizeof(int32_t) ? o->attention_dp : 0;
}

/* options->step_split when the caller's struct has it (version 7), else 0 (off). */
static inline int ina_engine_options_step_split(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, step_split) + sizeof(int32_t) ? o->step_split : 0;
}

/* options->numerics when the caller's struct has it (version 8), else fp32. */
static inline int ina_engine_options_numerics(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, numerics) + sizeof(int32_t) ? o->numerics
                                                                                         : INA_ENGINE_NUMERICS_F32;
}

/* options->ep_exchange and the dispatch settings when the caller's struct has them
 * (version 9), else AUTO. */
static inline int ina_engine_options_ep_exchange(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, ep_max_tokens) + sizeof(int64_t) ? o->ep_exchange
                                                                                           : INA_ENGINE_EP_EXCHANGE_AUTO;
}

/* options->micro_batches when the caller's struct has it (version 10), else 1. */
static inline int ina_engine_options_micro_batches(const ina_engine_options_t *o) {
  const int m = o->struct_size >= offsetof(ina_engine_options_t, micro_batches) + sizeof(int32_t) ? o->micro_batches : 1;
  return m == 0 ? 1 : m;
}

/* options->index_keys when the caller's struct has it (version 11), else bf16. */
static inline int ina_engine_options_index_keys(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, index_keys) + sizeof(int32_t) ? o->index_keys
                                                                                          : INA_ENGINE_INDEX_KEYS_BF16;
}

typedef struct ina_engine_cpu ina_engine_cpu_t;

ina_status_t ina_engine_cpu_create(const ina_model_t *model, const ina_engine_options_t *options,
                                   ina_engine_cpu_t **out);
void ina_engine_cpu_destroy(ina_engine_cpu_t *engine);
ina_page_pool_t *ina_engine_cpu_page_pool(ina_engine_cpu_t *engine);
const ina_model_config_t *ina_engine_cpu_config(const ina_engine_cpu_t *engine);
ina_status_t ina_engine_cpu_forward(ina_engine_cpu_t *engine, const ina_batch_t *batch, float *logits);
ina_status_t ina_engine_cpu_get_placement(ina_engine_cpu_t *engine, ina_expert_placement_t *out);
ina_status_t ina_engine_cpu_apply_placement(ina_engine_cpu_t *engine, const ina_expert_placement_t *p,
                                            int dry_run, int64_t *bytes_moved);
ina_status_t ina_engine_cpu_expert_load(ina_engine_cpu_t *engine, int reset, uint64_t *counts,
                                        int64_t capacity, int32_t *num_moe_layers);
void ina_engine_cpu_ep_traffic(const ina_engine_cpu_t *engine, ina_engine_ep_traffic_t *out);
void ina_engine_cpu_set_layer_hook(ina_engine_cpu_t *engine, ina_engine_layer_fn fn, void *user_data);
/* model/engine_test_hooks.h */
ina_status_t ina_engine_cpu_set_mutation(ina_engine_cpu_t *engine, int32_t mutation);
ina_status_t ina_engine_cpu_set_rounding_noise(ina_engine_cpu_t *engine, const ina_engine_noise_t *noise);
ina_status_t ina_engine_cpu_routes(ina_engine_cpu_t *engine, ina_engine_route_t *out, int64_t capacity,
                                   int64_t *count);

typedef struct ina_engine_gpu ina_engine_gpu_t;

/* device: the CUDA ordinal (>= 0). */
ina_status_t ina_engine_gpu_create(const ina_model_t *model, const ina_engine_options_t *options,
                                   int32_t device, ina_engine_gpu_t **out);
void ina_engine_gpu_destroy(ina_engine_gpu_t *engine);
ina_page_pool_t *ina_engine_gpu_page_pool(ina_engine_gpu_t *engine);
/* ina_engine_kv_storage of the CUDA backend. */
ina_status_t ina_engine_gpu_kv_storage(ina_engine_gpu_t *engine, void **base, size_t *bytes, int32_t *device);
const ina_model_config_t *ina_engine_gpu_config(const ina_engine_gpu_t *engine);
ina_status_t ina_engine_gpu_forward(ina_engine_gpu_t *engine, const ina_batch_t *batch, float *logits);
ina_status_t ina_engine_gpu_forward_greedy(ina_engine_gpu_t *engine, const ina_batch_t *batch, int32_t *tokens);
ina_status_t ina_engine_gpu_expert_load(ina_engine_gpu_t *engine, int reset, uint64_t *counts,
                                        int64_t capacity, int32_t *num_moe_layers);
ina_status_t ina_engine_gpu_get_placement(ina_engine_gpu_t *engine, ina_expert_placement_t *out);
ina_status_t ina_engine_gpu_apply_placement(ina_engine_gpu_t *engine, const ina_expert_placement_t *p,
                                            int dry_run, int64_t *bytes_moved);
ina_status_t ina_engine_gpu_step_split(ina_engine_gpu_t *engine, int reset, ina_engine_step_split_t *out);
/* The CUDA backend's part of ina_engine_set_mutation: the mutations it can apply. */
ina_status_t ina_engine_gpu_set_mutation(ina_engine_gpu_t *engine, int32_t mutation);
/* Page-locked host memory (NULL when out of it), and its release. */
void *ina_engine_gpu_host_alloc(size_t bytes);
void ina_engine_gpu_host_free(void *p);

/* Shared by both backends, so a batch is accepted or refused alike (engine.c). */
ina_status_t ina_engine_validate_batch(const ina_model_config_t *cfg, const ina_batch_t *b);
/* Grow every sequence by its new tokens, all or nothing. */
ina_status_t ina_engine_append_all(ina_page_pool_t *kv, const ina_batch_t *b);
/* Undo ina_engine_append_all. */
void ina_engine_truncate_all(ina_page_pool_t *kv, const ina_batch_t *b);

#endif
