/* Check macros for CUDA runtime calls (core/check.h's companions): for .cu files, and for
 * the C tests and benchmarks that call the runtime themselves (CUDA builds only).
 *
 * Same contract as core/check.h: the function declares `ina_status_t st = INA_OK;` and
 * ends with a `fail:` label that releases what it holds and returns `st`. On failure a
 * macro sets st = INA_ERR_CUDA, records a message naming the expression, the CUDA error
 * and file:line with ina_error, and jumps to fail. The runtime's last-error slot is
 * cleared as the error is taken, so a later INA_CUDA_CHECK_LAUNCH does not report it
 * again (sticky errors stay with the context and come back from the next call).
 *
 * In C++ a goto may not jump over an initialized declaration: declare the variables that
 * `fail:` cleans up, and any other locals, before the first check.
 *
 * Thread safety: as the CUDA runtime; the recorded message is per thread. */
#ifndef INA_CORE_CUDA_CHECK_H
#define INA_CORE_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "core/check.h"

/* `call` returns cudaError_t: anything but cudaSuccess fails with INA_ERR_CUDA. */
#define INA_CUDA_CHECK(call)                                                             \
  do {                                                                                   \
    cudaError_t ina_cuda_e_ = (call);                                                    \
    if (ina_cuda_e_ != cudaSuccess) {                                                    \
      (void)cudaGetLastError();                                                          \
      st = INA_ERR_CUDA;                                                                 \
      ina_error(INA_LOG_SUBSYS, "%s failed: %s (%s) at %s:%d", #call,                    \
                cudaGetErrorString(ina_cuda_e_), cudaGetErrorName(ina_cuda_e_), __FILE__, \
                __LINE__);                                                               \
      goto fail;                                                                         \
    }                                                                                    \
  } while (0)

/* Right after a kernel launch: a bad configuration (grid, block, shared memory) or an
 * earlier asynchronous fault shows up in cudaGetLastError. */
#define INA_CUDA_CHECK_LAUNCH()                                                          \
  do {                                                                                   \
    cudaError_t ina_cuda_e_ = cudaGetLastError();                                        \
    if (ina_cuda_e_ != cudaSuccess) {                                                    \
      st = INA_ERR_CUDA;                                                                 \
      ina_error(INA_LOG_SUBSYS, "kernel launch failed: %s (%s) at %s:%d",                \
                cudaGetErrorString(ina_cuda_e_), cudaGetErrorName(ina_cuda_e_), __FILE__, \
                __LINE__);                                                               \
      goto fail;                                                                         \
    }                                                                                    \
  } while (0)

#endif
