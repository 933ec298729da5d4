/* The device entry points of gemm/gemm.h in a build without CUDA: each reports
 * INA_ERR_UNSUPPORTED, as core/cuda_none.c does for the device layer. The host helpers
 * and the CPU reference (gemm_layout.c, gemm_ref.c) build everywhere. */
#define INA_LOG_SUBSYS "gemm"
#include "core/check.h"
#include "gemm/gemm.h"

static ina_status_t unsupported(const char *what) {
  ina_error(INA_LOG_SUBSYS, "%s: this build has no CUDA support (configure with -DINA_CUDA=ON)",
            what);
  return INA_ERR_UNSUPPORTED;
}

ina_status_t ina_gemm_create(const ina_gemm_config_t *config, ina_gemm_t **out) {
  if (out) *out = NULL;
  return unsupported("ina_gemm_create");
}

/* Nothing can have been created. */
void ina_gemm_destroy(ina_gemm_t *h) { (void)h; }

ina_status_t ina_gemm_prepare(ina_gemm_t *h, ina_gemm_mode_t mode, ina_dtype_t out_dtype, int64_t n,
                              int64_t k) {
  return unsupported("ina_gemm_prepare");
}

ina_status_t ina_gemm_run(const ina_gemm_t *h, const ina_gemm_args_t *args) {
  return unsupported("ina_gemm_run");
}

ina_status_t ina_gemm_query_path(const ina_gemm_t *h, const ina_gemm_args_t *args,
                                 ina_gemm_path_info_t *info) {
  return unsupported("ina_gemm_query_path");
}

ina_status_t ina_gemm_quantize_x(const uint16_t *x, int64_t ldx, int64_t m, int64_t k, uint8_t *q,
                                 int64_t ldq, float *x_scale, void *stream) {
  return unsupported("ina_gemm_quantize_x");
}
