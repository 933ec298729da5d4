/* The public engine functions: pick the backend at create (options->device: -1 the CPU,
 * >= 0 a CUDA device) and forward every call to it. Also the batch checks and the
 * all-or-nothing page appends both backends share, so they accept and refuse the same
 * batches with the same errors. */
#define INA_LOG_SUBSYS "model"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/engine_backend.h"
#include "model/engine_test_hooks.h"
#include "model/model.h"
#include "model/sampler.h"

struct ina_engine {
  ina_engine_cpu_t *cpu; /* exactly one of cpu and gpu is set */
  ina_engine_gpu_t *gpu;
};

/* options->device when the caller's struct has it (version 2), else the CPU. */
static int32_t requested_device(const ina_engine_options_t *o) {
  return o->struct_size >= offsetof(ina_engine_options_t, device) + sizeof(int32_t) ? o->device : -1;
}

ina_status_t ina_engine_create(const ina_model_t *model, const ina_engine_options_t *options,
                               ina_engine_t **out) {
  ina_status_t st = INA_OK;
  ina_engine_t *e = NULL;
  const ina_engine_options_t defaults = INA_ENGINE_OPTIONS_INIT;
  INA_REQUIRE(out && model, INA_ERR_INVALID_ARGUMENT, "engine: NULL argument");
  *out = NULL;
  if (!options) options = &defaults;
  INA_REQUIRE_VERSIONED(options, ENGINE_OPTIONS_V1_SIZE, "engine options", "INA_ENGINE_OPTIONS_INIT");
  const int32_t device = requested_device(options);
  INA_REQUIRE(device >= -1, INA_ERR_INVALID_ARGUMENT,
              "engine: device %d is invalid (-1 for the CPU, >= 0 for a CUDA device)", device);
  {
    const int k = ina_engine_options_index_keys(options);
    INA_REQUIRE(k == INA_ENGINE_INDEX_KEYS_BF16 || k == INA_ENGINE_INDEX_KEYS_FP8, INA_ERR_INVALID_ARGUMENT,
                "engine: index_keys %d is not 0 (bf16) or 1 (fp8)", k);
  }
  {
    const int numerics = ina_engine_options_numerics(options);
    INA_REQUIRE(numerics == INA_ENGINE_NUMERICS_F32 || (numerics == INA_ENGINE_NUMERICS_GPU && device < 0),
                INA_ERR_INVALID_ARGUMENT,
                "engine: numerics %d is not one of 0 (fp32) and 1 (the GPU's rounding, CPU backend only)%s",
                numerics, device >= 0 ? " for a CUDA device" : "");
  }
  {
    const int x = ina_engine_options_ep_exchange(options);
    INA_REQUIRE(x >= INA_ENGINE_EP_EXCHANGE_AUTO && x <= INA_ENGINE_EP_EXCHANGE_DISPATCH, INA_ERR_INVALID_ARGUMENT,
                "engine: ep_exchange %d is not 0 (auto), 1 (allgather) or 2 (dispatch)", x);
    INA_REQUIRE(x != INA_ENGINE_EP_EXCHANGE_DISPATCH || device < 0, INA_ERR_UNSUPPORTED,
                "engine: the dispatch exchange runs on the CPU backend only (its NVLink backend for "
                "CUDA devices is not built yet): use allgather on a GPU");
  }
  e = calloc(1, sizeof *e);
  INA_CHECK_ALLOC(e);
  if (device < 0)
    INA_CHECK(ina_engine_cpu_create(model, options, &e->cpu));
  else
    INA_CHECK(ina_engine_gpu_create(model, options, device, &e->gpu));
  *out = e;
  return INA_OK;
fail:
  ina_engine_destroy(e);
  return st;
}

void ina_engine_destroy(ina_engine_t *e) {
  if (!e) return;
  ina_engine_cpu_destroy(e->cpu);
  ina_engine_gpu_destroy(e->gpu);
  free(e);
}

ina_page_pool_t *ina_engine_page_pool(ina_engine_t *e) {
  return e->cpu ? ina_engine_cpu_page_pool(e->cpu) : ina_engine_gpu_page_pool(e->gpu);
}

const ina_model_config_t *ina_engine_config(const ina_engine_t *e) {
  return e->cpu ? ina_engine_cpu_config(e->cpu) : ina_engine_gpu_config(e->gpu);
}

ina_status_t ina_engine_expert_load(ina_engine_t *e, int reset, uint64_t *counts,
                                    int64_t capacity, int32_t *num_moe_layers) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL && num_moe_layers != NULL, INA_ERR_INVALID_ARGUMENT,
              "expert load: NULL argument");
  return e->cpu ? ina_engine_cpu_expert_load(e->cpu, reset, counts, capacity, num_moe_layers)
                : ina_engine_gpu_expert_load(e->gpu, reset, counts, capacity, num_moe_layers);
fail:
  return st;
}

ina_status_t ina_engine_get_placement(ina_engine_t *e, ina_expert_placement_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL && out != NULL, INA_ERR_INVALID_ARGUMENT, "placement: NULL argument");
  return e->cpu ? ina_engine_cpu_get_placement(e->cpu, out) : ina_engine_gpu_get_placement(e->gpu, out);
fail:
  return st;
}

ina_status_t ina_engine_apply_placement(ina_engine_t *e, const ina_expert_placement_t *p,
                                        int dry_run, int64_t *bytes_moved) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL && p != NULL && bytes_moved != NULL, INA_ERR_INVALID_ARGUMENT,
              "placement: NULL argument");
  *bytes_moved = 0;
  return e->cpu ? ina_engine_cpu_apply_placement(e->cpu, p, dry_run, bytes_moved)
                : ina_engine_gpu_apply_placement(e->gpu, p, dry_run, bytes_moved);
fail:
  return st;
}

const char *ina_engine_ep_exchange_name(int32_t x) {
  return x == INA_ENGINE_EP_EXCHANGE_AUTO        ? "auto"
         : x == INA_ENGINE_EP_EXCHANGE_ALLGATHER ? "allgather"
         : x == INA_ENGINE_EP_EXCHANGE_DISPATCH  ? "dispatch"
                                                 : "unknown";
}

int32_t ina_engine_index_keys_parse(const char *name) {
  if (!name) return -1;
  return strcmp(name, "bf16") == 0 ? INA_ENGINE_INDEX_KEYS_BF16 : strcmp(name, "fp8") == 0 ? INA_ENGINE_INDEX_KEYS_FP8 : -1;
}

int32_t ina_engine_ep_exchange_parse(const char *name) {
  if (!name) return -1;
  return strcmp(name, "allgather") == 0  ? INA_ENGINE_EP_EXCHANGE_ALLGATHER
         : strcmp(name, "dispatch") == 0 ? INA_ENGINE_EP_EXCHANGE_DISPATCH
                                         : -1;
}

ina_status_t ina_engine_kv_storage(ina_engine_t *e, void **base, size_t *bytes, int *on_device, int32_t *device) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e && base && bytes && on_device && device, INA_ERR_INVALID_ARGUMENT, "kv storage: NULL argument");
  *base = NULL;
  *bytes = 0;
  *on_device = e->gpu != NULL;
  *device = -1;
  if (e->gpu) return ina_engine_gpu_kv_storage(e->gpu, base, bytes, device);
  {
    ina_page_pool_t *pool = ina_engine_cpu_page_pool(e->cpu);
    ina_tensor_t t = ina_page_pool_layer(pool, 0);
    INA_REQUIRE(t.data != NULL, INA_ERR_UNSUPPORTED, "kv storage: the pool stores no entries");
    *base = t.data;
    *bytes = (size_t)ina_page_pool_num_layers(pool) * (size_t)ina_page_pool_num_pages(pool) *
             (size_t)ina_page_pool_page_size(pool) * (size_t)ina_page_pool_entry_elems(pool) *
             ina_dtype_size(ina_page_pool_dtype(pool));
  }
fail:
  return st;
}

void ina_engine_set_layer_hook(ina_engine_t *e, ina_engine_layer_fn fn, void *user_data) {
  if (e && e->cpu) ina_engine_cpu_set_layer_hook(e->cpu, fn, user_data); /* the CUDA backend has none */
}

ina_status_t ina_engine_ep_traffic(const ina_engine_t *e, ina_engine_ep_traffic_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL && out != NULL, INA_ERR_INVALID_ARGUMENT, "ep traffic: NULL argument");
  memset(out, 0, sizeof *out);
  out->exchange = INA_ENGINE_EP_EXCHANGE_ALLGATHER;
  if (e->cpu) ina_engine_cpu_ep_traffic(e->cpu, out); /* the CUDA backend does not count it yet */
fail:
  return st;
}

ina_status_t ina_engine_step_split(ina_engine_t *e, int reset, ina_engine_step_split_t *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL && out != NULL, INA_ERR_INVALID_ARGUMENT, "step split: NULL argument");
  INA_REQUIRE(e->gpu != NULL, INA_ERR_UNSUPPORTED, "step split: the CPU backend does not time its steps");
  return ina_engine_gpu_step_split(e->gpu, reset, out);
fail:
  return st;
}

float *ina_engine_logits_alloc(ina_engine_t *e, int64_t rows) {
  const size_t bytes = (size_t)(rows > 0 ? rows : 1) * (size_t)ina_engine_config(e)->vocab_size * sizeof(float);
  return e->gpu ? ina_engine_gpu_host_alloc(bytes) : malloc(bytes);
}

void ina_engine_logits_free(ina_engine_t *e, float *logits) {
  if (!e || !logits) return;
  if (e->gpu)
    ina_engine_gpu_host_free(logits);
  else
    free(logits);
}

ina_status_t ina_engine_forward(ina_engine_t *e, const ina_batch_t *b, float *logits) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL, INA_ERR_INVALID_ARGUMENT, "forward: engine is NULL");
  return e->cpu ? ina_engine_cpu_forward(e->cpu, b, logits) : ina_engine_gpu_forward(e->gpu, b, logits);
fail:
  return st;
}

ina_status_t ina_engine_forward_greedy(ina_engine_t *e, const ina_batch_t *b, int32_t *tokens) {
  ina_status_t st = INA_OK;
  float *logits = NULL;
  INA_REQUIRE(e != NULL && b != NULL && tokens != NULL, INA_ERR_INVALID_ARGUMENT, "forward: NULL argument");
  if (e->gpu) return ina_engine_gpu_forward_greedy(e->gpu, b, tokens);
  /* The CPU computes the logits anyway: the argmax of each row here. */
  INA_CHECK(ina_engine_validate_batch(ina_engine_config(e), b));
  const int64_t rows = b->all_logits ? b->qo_indptr[b->batch] : b->batch;
  const int32_t V = ina_engine_config(e)->vocab_size;
  logits = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)V * sizeof *logits);
  INA_CHECK_ALLOC(logits);
  INA_CHECK(ina_engine_cpu_forward(e->cpu, b, logits));
  for (int64_t r = 0; r < rows; r++) {
    const float *row = logits + r * V;
    tokens[r] = ina_argmax_f32(row, V);
    if (isnan(row[tokens[r]])) tokens[r] = -1; /* every logit NaN */
  }
fail:
  free(logits);
  return st;
}

/* ---- shared by the backends ------------------------------------------------------- */

ina_status_t ina_engine_validate_batch(const ina_model_config_t *cfg, const ina_batch_t *b) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(b && b->batch >= 0 && b->qo_indptr && (b->batch == 0 || b->seqs), INA_ERR_INVALID_ARGUMENT,
              "forward: invalid batch");
  INA_REQUIRE(b->qo_indptr[0] == 0, INA_ERR_INVALID_ARGUMENT, "forward: qo_indptr[0] must be 0");
  for (int32_t i = 0; i < b->batch; i++) {
    INA_REQUIRE(b->qo_indptr[i + 1] >= b->qo_indptr[i], INA_ERR_INVALID_ARGUMENT,
                "forward: qo_indptr decreases at sequence %d", i);
    INA_REQUIRE(b->seqs[i] != NULL, INA_ERR_INVALID_ARGUMENT, "forward: sequence %d is NULL", i);
    if (!b->all_logits)
      INA_REQUIRE(b->qo_indptr[i + 1] > b->qo_indptr[i], INA_ERR_INVALID_ARGUMENT,
                  "forward: sequence %d has no new token to take logits from", i);
  }
  for (int32_t t = 0; t < b->qo_indptr[b->batch]; t++)
    INA_REQUIRE(b->tokens[t] >= 0 && b->tokens[t] < cfg->vocab_size, INA_ERR_INVALID_ARGUMENT,
                "forward: token id %d at position %d is outside the vocabulary [0, %d)", b->tokens[t],
                t, cfg->vocab_size);
fail:
  return st;
}

ina_status_t ina_engine_append_all(ina_page_pool_t *kv, const ina_batch_t *b) {
  ina_status_t st = INA_OK;
  int32_t i = 0;
  for (; i < b->batch; i++)
    INA_CHECK(ina_kv_seq_append(kv, b->seqs[i], b->qo_indptr[i + 1] - b->qo_indptr[i]));
  return INA_OK;
fail:
  while (--i >= 0) ina_kv_seq_truncate(kv, b->seqs[i], b->qo_indptr[i + 1] - b->qo_indptr[i]);
  return st;
}

void ina_engine_truncate_all(ina_page_pool_t *kv, const ina_batch_t *b) {
  for (int32_t i = 0; i < b->batch; i++) ina_kv_seq_truncate(kv, b->seqs[i], b->qo_indptr[i + 1] - b->qo_indptr[i]);
}

/* ---- test hooks (model/engine_test_hooks.h) -------------------------------------------- */

const char *ina_engine_mutation_name(int32_t mutation) {
  static const char *const names[INA_MUTATION_COUNT] = {
      "none",
      "decode softmax scale x0.95",
      "decode without mscale^2",
      "routed-expert outputs x0.95",
      "experts 0 and 1 swapped (first MoE layer)",
      "q_a / kv_a eps 1e-6 -> 1e-5",
      "rope_theta ignored",
      "decode skips the newest key",
      "FP8 scale grid transposed (layer 0 kv_a_proj)",
      "shared experts dropped",
      "V3.2 top-k keeps index_topk - 1",
      "V3.2 index key without rope",
  };
  return mutation >= 0 && mutation < INA_MUTATION_COUNT ? names[mutation] : "?";
}

ina_status_t ina_engine_set_mutation(ina_engine_t *e, int32_t mutation) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL, INA_ERR_INVALID_ARGUMENT, "engine: NULL engine");
  return e->cpu ? ina_engine_cpu_set_mutation(e->cpu, mutation) : ina_engine_gpu_set_mutation(e->gpu, mutation);
fail:
  return st;
}

ina_status_t ina_engine_routes(ina_engine_t *e, ina_engine_route_t *out, int64_t capacity, int64_t *count) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL && count != NULL, INA_ERR_INVALID_ARGUMENT, "engine: NULL argument");
  INA_REQUIRE(e->cpu != NULL, INA_ERR_UNSUPPORTED, "engine: routes are a CPU engine's test hook");
  return ina_engine_cpu_routes(e->cpu, out, capacity, count);
fail:
  return st;
}

ina_status_t ina_engine_set_rounding_noise(ina_engine_t *e, const ina_engine_noise_t *noise) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(e != NULL && noise != NULL, INA_ERR_INVALID_ARGUMENT, "engine: NULL argument");
  INA_REQUIRE(e->cpu != NULL, INA_ERR_UNSUPPORTED, "engine: rounding noise is a CPU engine's test hook");
  return ina_engine_cpu_set_rounding_noise(e->cpu, noise);
fail:
  return st;
}
