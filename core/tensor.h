/* Tensor descriptor: a typed, strided view of up to INA_MAX_DIMS dimensions on one
 * device. The struct is plain data so views can be made on the stack; the data pointer
 * is freed by ina_tensor_release only when `owns_data` is set.
 *
 * Strides count elements, not bytes. A descriptor with ndim == 0 and data == NULL is
 * "empty" (e.g. an optional weight that is absent).
 *
 * Thread safety: a tensor may be read from several threads; writing is the caller's
 * business. */
#ifndef INA_CORE_TENSOR_H
#define INA_CORE_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define INA_MAX_DIMS 5

typedef enum ina_device_type { INA_DEVICE_CPU = 0, INA_DEVICE_CUDA = 1 } ina_device_type_t;

typedef struct ina_device {
  ina_device_type_t type;
  int index; /* CUDA ordinal; 0 for the CPU */
} ina_device_t;

#define INA_CPU ((ina_device_t){INA_DEVICE_CPU, 0})

typedef struct ina_tensor {
  ina_dtype_t dtype;
  int ndim;
  int64_t shape[INA_MAX_DIMS];
  int64_t stride[INA_MAX_DIMS];
  ina_device_t device;
  void *data;
  int owns_data; /* 1: ina_tensor_release frees data */
} ina_tensor_t;

/* A contiguous (row-major) descriptor over caller-owned memory. */
ina_tensor_t ina_tensor_wrap(void *data, ina_dtype_t dtype, int ndim, const int64_t *shape,
                             ina_device_t device);
/* Allocate a contiguous tensor (64-byte aligned host memory, or cudaMalloc when the
 * device is CUDA and the build has CUDA). Contents are uninitialized. On failure *t is
 * left empty. */
ina_status_t ina_tensor_alloc(ina_tensor_t *t, ina_dtype_t dtype, int ndim, const int64_t *shape,
                              ina_device_t device);
/* Free owned data and reset *t to empty. NULL and empty tensors are no-ops. */
void ina_tensor_release(ina_tensor_t *t);

/* Bytes of a contiguous array of `shape` (0 when a dim is 0) into *nbytes. Returns 0,
 * recording no error, when a dim is negative or the product of the nonzero dims
 * overflows int64 (strides computed from those dims would), else 1. */
int ina_shape_nbytes(ina_dtype_t dtype, int ndim, const int64_t *shape, size_t *nbytes);

int64_t ina_tensor_numel(const ina_tensor_t *t);
size_t ina_tensor_nbytes(const ina_tensor_t *t);
int ina_tensor_is_contiguous(const ina_tensor_t *t);
int ina_tensor_is_empty(const ina_tensor_t *t);
/* "bf16[128, 512]" into buf; returns buf. */
const char *ina_tensor_describe(const ina_tensor_t *t, char *buf, size_t bufsize);

#ifdef __cplusplus
}
#endif
#endif
