/* The CUDA engine in a build without CUDA: creating one reports INA_ERR_UNSUPPORTED, so
 * ina_engine_create with options->device >= 0 fails cleanly and callers fall back to the
 * CPU (device -1). The other entry points are never reached without an engine. */
#define INA_LOG_SUBSYS "model"
#include "core/check.h"
#include "model/engine_backend.h"

ina_status_t ina_engine_gpu_create(const ina_model_t *model, const ina_engine_options_t *options, int32_t device,
                                   ina_engine_gpu_t **out) {
  ina_status_t st = INA_OK;
  *out = NULL;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "gpu engine: device %d requested, but this build has no CUDA", device);
fail:
  return st;
}

void ina_engine_gpu_destroy(ina_engine_gpu_t *engine) { (void)engine; }
ina_page_pool_t *ina_engine_gpu_page_pool(ina_engine_gpu_t *engine) { (void)engine; return NULL; }
ina_status_t ina_engine_gpu_kv_storage(ina_engine_gpu_t *engine, void **base, size_t *bytes, int32_t *device) {
  (void)engine, (void)base, (void)bytes, (void)device;
  return INA_ERR_UNSUPPORTED;
}
const ina_model_config_t *ina_engine_gpu_config(const ina_engine_gpu_t *engine) { (void)engine; return NULL; }

ina_status_t ina_engine_gpu_forward(ina_engine_gpu_t *engine, const ina_batch_t *batch, float *logits) {
  ina_status_t st = INA_OK;
  (void)engine;
  (void)batch;
  (void)logits;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "gpu engine: this build has no CUDA");
fail:
  return st;
}

ina_status_t ina_engine_gpu_get_placement(ina_engine_gpu_t *engine, ina_expert_placement_t *out) {
  ina_status_t st = INA_OK;
  (void)engine;
  (void)out;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "gpu engine: this build has no CUDA");
fail:
  return st;
}

ina_status_t ina_engine_gpu_set_mutation(ina_engine_gpu_t *engine, int32_t mutation) {
  ina_status_t st = INA_OK;
  (void)engine, (void)mutation;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "gpu engine: this build has no CUDA");
fail:
  return st;
}

ina_status_t ina_engine_gpu_expert_load(ina_engine_gpu_t *engine, int reset, uint64_t *counts, int64_t capacity,
                                        int32_t *num_moe_layers) {
  ina_status_t st = INA_OK;
  (void)engine, (void)reset, (void)counts, (void)capacity, (void)num_moe_layers;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "gpu engine: this build has no CUDA");
fail:
  return st;
}

ina_status_t ina_engine_gpu_apply_placement(ina_engine_gpu_t *engine, const ina_expert_placement_t *p, int dry_run,
                                            int64_t *bytes_moved) {
  ina_status_t st = INA_OK;
  (void)engine, (void)p, (void)dry_run, (void)bytes_moved;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "gpu engine: this build has no CUDA");
fail:
  return st;
}

ina_status_t ina_engine_gpu_step_split(ina_engine_gpu_t *engine, int reset, ina_engine_step_split_t *out) {
  ina_status_t st = INA_OK;
  (void)engine, (void)reset, (void)out;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "gpu engine: this build has no CUDA");
fail:
  return st;
}

void *ina_engine_gpu_host_alloc(size_t bytes) {
  (void)bytes;
  return NULL;
}

void ina_engine_gpu_host_free(void *p) { (void)p; }

ina_status_t ina_engine_gpu_forward_greedy(ina_engine_gpu_t *engine, const ina_batch_t *batch, int32_t *tokens) {
  ina_status_t st = INA_OK;
  (void)engine, (void)batch, (void)tokens;
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED, "gpu engine: this build has no CUDA");
fail:
  return st;
}
