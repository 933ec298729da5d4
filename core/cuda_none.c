/* core/cuda.h and the GPU launchers for a build without CUDA (INA_CUDA=OFF or no nvcc):
 * no devices, and every call that would need one returns INA_ERR_UNSUPPORTED, the same
 * answer the CUDA build gives on a machine without a GPU. */
#define INA_LOG_SUBSYS "cuda"
#include <stdio.h>

#include "core/check.h"
#include "core/cuda.h"
#include "core/fp8_quant.h"

/* Records why `what` cannot run in this build. */
static ina_status_t unsupported(const char *what) {
  ina_error(INA_LOG_SUBSYS, "%s: this build has no CUDA support (configure with -DINA_CUDA=ON)",
            what);
  return INA_ERR_UNSUPPORTED;
}

int ina_cuda_device_count(void) { return 0; }

const char *ina_cuda_no_device_reason(char *buf, size_t bufsize) {
  if (!buf || bufsize == 0) return NULL;
  snprintf(buf, bufsize, "this build has no CUDA (configured with INA_CUDA=OFF, or nvcc was not found)");
  return buf;
}

const char *ina_cuda_device_name(int device, char *buf, size_t bufsize) {
  if (!buf || bufsize == 0) return "none";
  snprintf(buf, bufsize, "none");
  return buf;
}

ina_status_t ina_cuda_malloc(int device, size_t bytes, void **out) {
  if (out) *out = NULL;
  return unsupported("ina_cuda_malloc");
}

/* Nothing can have been allocated, so there is nothing to free. */
void ina_cuda_free(void *ptr) { (void)ptr; }

ina_status_t ina_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
  return unsupported("ina_cuda_memcpy_h2d");
}

ina_status_t ina_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
  return unsupported("ina_cuda_memcpy_d2h");
}

ina_status_t ina_cuda_synchronize(void) { return unsupported("ina_cuda_synchronize"); }

ina_status_t ina_cuda_set_device(int device) {
  (void)device;
  return unsupported("ina_cuda_set_device");
}

ina_status_t ina_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  (void)device;
  if (free_bytes) *free_bytes = 0;
  if (total_bytes) *total_bytes = 0;
  return unsupported("ina_cuda_mem_info");
}

ina_status_t ina_cuda_fp8_quantize_blocks(const uint16_t *x_bf16, int64_t rows, int64_t cols,
                                          int block_rows, int block_cols, uint8_t *q,
                                          float *scale_inv, void *stream) {
  return unsupported("ina_cuda_fp8_quantize_blocks");
}
