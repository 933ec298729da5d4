/* The GPU entry points of the mla GPU library in a build without CUDA: each reports
 * INA_ERR_UNSUPPORTED, as core/cuda_none.c does for the device layer. */
#define INA_LOG_SUBSYS "mla"
#include "core/check.h"
#include "mla/mla_absorb.h"
#include "mla/mla_append.h"

static ina_status_t unsupported(const char *what) {
  ina_error(INA_LOG_SUBSYS, "%s: this build has no CUDA support (configure with -DINA_CUDA=ON)",
            what);
  return INA_ERR_UNSUPPORTED;
}

ina_status_t ina_mla_append(const ina_mla_append_params_t *p, void *stream) {
  return unsupported("ina_mla_append");
}

ina_status_t ina_mla_absorb_create(const ina_mla_absorb_dims_t *dims, ina_mla_absorb_t **out) {
  if (out) *out = NULL;
  return unsupported("ina_mla_absorb_create");
}

/* Nothing can have been created. */
void ina_mla_absorb_destroy(ina_mla_absorb_t *a) { (void)a; }

ina_status_t ina_mla_absorb_q(const ina_mla_absorb_t *a, const uint16_t *kv_b_weight,
                              int32_t num_tokens, const uint16_t *q_nope, int64_t q_token_stride,
                              int64_t q_head_stride, uint16_t *q_abs, int64_t q_abs_token_stride,
                              int64_t q_abs_head_stride, void *stream) {
  return unsupported("ina_mla_absorb_q");
}

ina_status_t ina_mla_absorb_v(const ina_mla_absorb_t *a, const uint16_t *kv_b_weight,
                              int32_t num_tokens, const uint16_t *o_latent,
                              int64_t o_token_stride, int64_t o_head_stride, uint16_t *out,
                              int64_t out_token_stride, int64_t out_head_stride, void *stream) {
  return unsupported("ina_mla_absorb_v");
}

ina_status_t ina_mla_absorb_dequantize_weight(const uint8_t *w_fp8, const float *scale_inv,
                                              int64_t rows, int64_t cols, uint16_t *w_bf16,
                                              void *stream) {
  return unsupported("ina_mla_absorb_dequantize_weight");
}
