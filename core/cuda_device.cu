/* core/cuda.h over the CUDA runtime.
 *
 * Without a usable device (no driver, no GPU) the count is 0 and every call that needs a
 * device returns INA_ERR_UNSUPPORTED, as the build without CUDA does, so callers see one
 * behaviour for "no GPU here" whatever the build. */
#define INA_LOG_SUBSYS "cuda"
#include "core/cuda.h"

#include <stdio.h>

#include "core/cuda_check.h"

/* "No driver" (none loaded, an older one than the runtime needs, or the toolkit's stub
 * library in its place) or "no GPU": the ordinary answers of a machine without a GPU. */
static int means_no_device(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
         err == cudaErrorStubLibrary;
}

/* cudaGetDeviceCount: the count (0 on any error) into *n, and its result. */
static cudaError_t count_devices(int *n) {
  *n = 0;
  const cudaError_t err = cudaGetDeviceCount(n);
  /* Not an error for the caller, and not one for the next INA_CUDA_CHECK_LAUNCH to find
   * either. */
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    *n = 0;
  }
  if (*n < 0) *n = 0;
  return err;
}

extern "C" int ina_cuda_device_count(void) {
  static int logged = 0;
  int n = 0;
  const cudaError_t err = count_devices(&n);
  if (err != cudaSuccess && !means_no_device(err) &&
      !__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
    INA_LOG_W(INA_LOG_SUBSYS, "cudaGetDeviceCount failed: %s (%s); no CUDA device will be used",
              cudaGetErrorName(err), cudaGetErrorString(err));
  return n;
}

extern "C" const char *ina_cuda_no_device_reason(char *buf, size_t bufsize) {
  int n = 0;
  if (!buf || bufsize == 0) return NULL;
  const cudaError_t err = count_devices(&n);
  if (n > 0) return NULL;
  const char *what = err == cudaErrorNoDevice             ? "no CUDA device"
                     : err == cudaErrorInsufficientDriver ? "no CUDA driver, or one older than the runtime"
                     : err == cudaErrorStubLibrary        ? "no CUDA driver, only the toolkit's stub library"
                                                          : "cudaGetDeviceCount failed";
  if (err == cudaSuccess)
    snprintf(buf, bufsize, "no CUDA device: cudaGetDeviceCount found none");
  else
    snprintf(buf, bufsize, "%s: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
  return buf;
}

extern "C" const char *ina_cuda_device_name(int device, char *buf, size_t bufsize) {
  cudaDeviceProp prop;
  if (!buf || bufsize == 0) return "none";
  if (device < 0 || device >= ina_cuda_device_count() ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(buf, bufsize, "none");
    return buf;
  }
  snprintf(buf, bufsize, "%s (sm_%d%d, %d SMs, %.1f GiB)", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

/* INA_ERR_UNSUPPORTED, with `what` named in the message, when no device is usable. */
static ina_status_t require_device(const char *what) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(ina_cuda_device_count() > 0, INA_ERR_UNSUPPORTED,
              "%s: no CUDA device is present (no GPU or no driver loaded)", what);
fail:
  return st;
}

extern "C" ina_status_t ina_cuda_malloc(int device, size_t bytes, void **out) {
  ina_status_t st = INA_OK;
  int count = 0, previous = -1;
  void *ptr = NULL;
  cudaError_t err = cudaSuccess;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_cuda_malloc: out is NULL");
  *out = NULL;
  INA_CHECK(require_device("ina_cuda_malloc"));
  count = ina_cuda_device_count();
  INA_REQUIRE(device >= 0 && device < count, INA_ERR_INVALID_ARGUMENT,
              "ina_cuda_malloc: device %d out of range (%d devices)", device, count);
  if (bytes == 0) return INA_OK; /* *out stays NULL; ina_cuda_free(NULL) is a no-op */

  /* Allocate on `device` without changing the calling thread's current device. */
  INA_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != device) INA_CUDA_CHECK(cudaSetDevice(device));
  err = cudaMalloc(&ptr, bytes);
  if (previous != device) INA_CUDA_CHECK(cudaSetDevice(previous));
  if (err == cudaErrorMemoryAllocation) (void)cudaGetLastError();
  INA_REQUIRE(err != cudaErrorMemoryAllocation, INA_ERR_OUT_OF_MEMORY,
              "cudaMalloc of %zu bytes on device %d failed: %s (%s:%d)", bytes, device,
              cudaGetErrorString(err), __FILE__, __LINE__);
  INA_CUDA_CHECK(err);
  *out = ptr;
  ptr = NULL;
fail:
  if (ptr) cudaFree(ptr); /* restoring the current device failed after the allocation */
  return st;
}

extern "C" ina_status_t ina_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  ina_status_t st = INA_OK;
  int previous = -1;
  size_t f = 0, t = 0;
  cudaError_t err = cudaSuccess;
  INA_CHECK(require_device("ina_cuda_mem_info"));
  INA_REQUIRE(device >= 0 && device < ina_cuda_device_count(), INA_ERR_INVALID_ARGUMENT,
              "ina_cuda_mem_info: device %d out of range (%d devices)", device, ina_cuda_device_count());
  INA_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != device) INA_CUDA_CHECK(cudaSetDevice(device));
  err = cudaMemGetInfo(&f, &t);
  if (previous != device) INA_CUDA_CHECK(cudaSetDevice(previous));
  INA_CUDA_CHECK(err);
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
fail:
  return st;
}

extern "C" void ina_cuda_free(void *ptr) {
  cudaError_t err;
  if (!ptr) return;
  err = cudaFree(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    INA_LOG_W(INA_LOG_SUBSYS, "cudaFree(%p) failed: %s (%s:%d)", ptr, cudaGetErrorString(err),
              __FILE__, __LINE__);
  }
}

/* Synchronous copy on the legacy default stream; both directions share the checks. */
static ina_status_t copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                         const char *what) {
  ina_status_t st = INA_OK;
  INA_CHECK(require_device(what));
  if (bytes == 0) return INA_OK;
  INA_REQUIRE(dst != NULL && src != NULL, INA_ERR_INVALID_ARGUMENT,
              "%s: NULL %s pointer for a copy of %zu bytes", what, dst ? "source" : "destination",
              bytes);
  INA_CUDA_CHECK(cudaMemcpy(dst, src, bytes, kind));
  /* From pageable memory cudaMemcpy may return once the bytes are staged, before the DMA
   * has written the device: kernels on a non-blocking stream could still read the old
   * bytes. Waiting on the legacy stream, which ran the copy, ends it. */
  if (kind == cudaMemcpyHostToDevice) INA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
fail:
  return st;
}

extern "C" ina_status_t ina_cuda_memcpy_h2d(void *dst, const void *src, size_t bytes) {
  return copy(dst, src, bytes, cudaMemcpyHostToDevice, "ina_cuda_memcpy_h2d");
}

extern "C" ina_status_t ina_cuda_memcpy_d2h(void *dst, const void *src, size_t bytes) {
  return copy(dst, src, bytes, cudaMemcpyDeviceToHost, "ina_cuda_memcpy_d2h");
}

extern "C" ina_status_t ina_cuda_set_device(int device) {
  ina_status_t st = INA_OK;
  INA_CHECK(require_device("ina_cuda_set_device"));
  INA_CUDA_CHECK(cudaSetDevice(device));
fail:
  return st;
}

extern "C" ina_status_t ina_cuda_synchronize(void) {
  ina_status_t st = INA_OK;
  INA_CHECK(require_device("ina_cuda_synchronize"));
  INA_CUDA_CHECK(cudaDeviceSynchronize());
fail:
  return st;
}
