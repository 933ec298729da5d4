/* gpu_ops/gpu_ops.h for a build without CUDA (INA_CUDA=OFF or no nvcc): every launcher
 * returns INA_ERR_UNSUPPORTED, the answer the CUDA build gives where no GPU can run it. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "gpu_ops/gpu_ops.h"

#include "core/check.h"

/* Records why `what` cannot run in this build. */
static ina_status_t unsupported(const char *what) {
  ina_error(INA_LOG_SUBSYS, "%s: this build has no CUDA support (configure with -DINA_CUDA=ON)",
            what);
  return INA_ERR_UNSUPPORTED;
}

ina_status_t ina_gpu_embedding(const int32_t *ids, int64_t tokens, const void *weight,
                               ina_dtype_t weight_dtype, int64_t vocab, int64_t hidden,
                               uint16_t *out, uint32_t *error_flags, void *stream) {
  return unsupported("ina_gpu_embedding");
}

ina_status_t ina_gpu_rmsnorm(const ina_gpu_rmsnorm_params_t *p, void *stream) {
  return unsupported("ina_gpu_rmsnorm");
}

ina_status_t ina_gpu_layernorm(const ina_gpu_layernorm_params_t *p, void *stream) {
  return unsupported("ina_gpu_layernorm");
}

ina_status_t ina_gpu_rope(const ina_gpu_rope_params_t *p, void *stream) {
  return unsupported("ina_gpu_rope");
}

ina_status_t ina_gpu_silu_mul(int64_t rows, int64_t inter, const uint16_t *gate, const uint16_t *up,
                              int64_t in_stride, uint16_t *out, uint8_t *out_fp8,
                              float *out_scale_inv, void *stream) {
  return unsupported("ina_gpu_silu_mul");
}

ina_status_t ina_gpu_argmax(const void *logits, ina_dtype_t dtype, int64_t rows, int64_t vocab,
                            int64_t row_stride, int32_t *out, void *stream) {
  return unsupported("ina_gpu_argmax");
}

ina_status_t ina_gpu_sample(const void *logits, ina_dtype_t dtype, int64_t rows, int64_t vocab,
                            int64_t row_stride, ina_gpu_sampling_row_t *params, int advance_step,
                            int32_t *tokens, uint32_t *error_flags, void *stream) {
  return unsupported("ina_gpu_sample");
}

ina_status_t ina_gpu_sampling_probs(const void *logits, ina_dtype_t dtype, int64_t rows,
                                    int64_t vocab, int64_t row_stride,
                                    const ina_gpu_sampling_row_t *params, float *probs,
                                    uint32_t *error_flags, void *stream) {
  return unsupported("ina_gpu_sampling_probs");
}
