/* The CUDA runtime as seen from C host code. Every build has these functions: without
 * CUDA (INA_CUDA=OFF or no nvcc) they report no devices and INA_ERR_UNSUPPORTED.
 * Thread safety: as the CUDA runtime. */
#ifndef INA_CORE_CUDA_H
#define INA_CORE_CUDA_H

#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when the build has no CUDA, no driver is loaded or no
 * GPU is present (never an error). Any other failure of cudaGetDeviceCount (a driver
 * that does not start, devices that are busy or lost...) also counts as 0 devices, and
 * is logged once, at warn level, with CUDA's error name and string. */
int ina_cuda_device_count(void);
/* Why ina_cuda_device_count() is 0, for messages (a skipped test names it), e.g. "no
 * CUDA device: cudaErrorNoDevice (no CUDA-capable device is detected)" or "this build has
 * no CUDA ...", written into buf (NUL-terminated, truncated to bufsize) and returned;
 * NULL when there are devices (or buf is NULL or bufsize 0). */
const char *ina_cuda_no_device_reason(char *buf, size_t bufsize);
/* "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" or "none". */
const char *ina_cuda_device_name(int device, char *buf, size_t bufsize);
ina_status_t ina_cuda_malloc(int device, size_t bytes, void **out);
/* NULL is a no-op. */
void ina_cuda_free(void *ptr);
/* Synchronous copies: the bytes are at dst when they return (host to device included,
 * for work on any stream that follows). */
ina_status_t ina_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes);
ina_status_t ina_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes);
ina_status_t ina_cuda_synchronize(void);
/* Makes `device` the calling thread's current device (cudaSetDevice). */
ina_status_t ina_cuda_set_device(int device);
/* Free and total memory of `device` (cudaMemGetInfo), leaving the current device as it
 * was. */
ina_status_t ina_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes);

#ifdef __cplusplus
}
#endif
#endif
