/* moe_ep/moe_gpu.h for a build without CUDA (INA_CUDA=OFF or no nvcc): every launcher
 * returns INA_ERR_UNSUPPORTED, the answer the CUDA build gives where no GPU can run it. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "moe_ep/moe_gpu.h"

#include "core/check.h"

/* Records why `what` cannot run in this build. */
static ina_status_t unsupported(const char *what) {
  ina_error(INA_LOG_SUBSYS, "%s: this build has no CUDA support (configure with -DINA_CUDA=ON)",
            what);
  return INA_ERR_UNSUPPORTED;
}

ina_status_t ina_gpu_router(const ina_router_config_t *cfg, const float *logits,
                            const float *correction_bias, int64_t tokens, int32_t *ids,
                            float *weights, void *stream) {
  return unsupported("ina_gpu_router");
}

ina_status_t ina_gpu_moe_permute(const ina_gpu_moe_permute_params_t *p, void *stream) {
  return unsupported("ina_gpu_moe_permute");
}

ina_status_t ina_gpu_moe_combine(int64_t tokens, int32_t top_k, int64_t hidden,
                                 const uint16_t *expert_out, int64_t expert_rows,
                                 const int32_t *slot_of, const float *weights,
                                 const uint16_t *shared_out, uint16_t *out, void *stream) {
  return unsupported("ina_gpu_moe_combine");
}

ina_status_t ina_gpu_moe_count(const int32_t *ids, int64_t tokens, int32_t top_k, const int32_t *row_mask,
                               int32_t num_experts, uint64_t *counts, void *stream) {
  (void)ids, (void)tokens, (void)top_k, (void)row_mask, (void)num_experts, (void)counts, (void)stream;
  return unsupported("ina_gpu_moe_count");
}

ina_status_t ina_gpu_moe_drop_rows(int32_t *ids, int64_t tokens, int32_t top_k, const int32_t *row_mask,
                                   void *stream) {
  (void)ids, (void)tokens, (void)top_k, (void)row_mask, (void)stream;
  return unsupported("ina_gpu_moe_drop_rows");
}

ina_status_t ina_gpu_moe_slot_rows(const int32_t *offsets, int32_t num_experts, const int32_t *slot_info,
                                   int32_t slots, int32_t *begins, int32_t *ends, void *stream) {
  (void)offsets, (void)num_experts, (void)slot_info, (void)slots, (void)begins, (void)ends, (void)stream;
  return unsupported("ina_gpu_moe_slot_rows");
}
