#define INA_LOG_SUBSYS "tensor"
#include "core/tensor.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/cuda.h"

/* Host tensors are 64-byte aligned: one cache line, and enough for any SIMD load. */
#define HOST_ALIGN 64

int ina_shape_nbytes(ina_dtype_t dtype, int ndim, const int64_t *shape, size_t *nbytes) {
  /* The product of the nonzero dims must fit too: strides and numel of a view are
   * computed from them even when another dim is zero. */
  uint64_t span = ina_dtype_size(dtype);
  int empty = 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 0) {
      empty = 1;
      continue;
    }
    if (shape[i] < 0 || __builtin_mul_overflow(span, (uint64_t)shape[i], &span) ||
        span > (uint64_t)INT64_MAX)
      return 0;
  }
  *nbytes = empty ? 0 : (size_t)span;
  return 1;
}

/* Checks dtype, rank and dims and computes the byte size of a contiguous tensor. */
static ina_status_t contiguous_nbytes(ina_dtype_t dtype, int ndim, const int64_t *shape,
                                      size_t *out_bytes) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(ina_dtype_size(dtype) != 0, INA_ERR_INVALID_ARGUMENT, "invalid dtype %d", (int)dtype);
  INA_REQUIRE(ndim >= 0 && ndim <= INA_MAX_DIMS, INA_ERR_INVALID_ARGUMENT,
              "tensor rank %d outside 0..%d", ndim, INA_MAX_DIMS);
  INA_REQUIRE(ndim == 0 || shape != NULL, INA_ERR_INVALID_ARGUMENT,
              "NULL shape for a rank-%d tensor", ndim);
  for (int i = 0; i < ndim; i++)
    INA_REQUIRE(shape[i] >= 0, INA_ERR_INVALID_ARGUMENT, "dim %d of a rank-%d tensor is %lld", i,
                ndim, (long long)shape[i]);
  INA_REQUIRE(ina_shape_nbytes(dtype, ndim, shape, out_bytes), INA_ERR_INVALID_ARGUMENT,
              "%s tensor of rank %d is too large: the product of its dims overflows",
              ina_dtype_name(dtype), ndim);
fail:
  return st;
}

static void set_contiguous_strides(ina_tensor_t *t) {
  int64_t stride = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    t->stride[i] = stride;
    /* As PyTorch does, a zero dim counts as 1 so every stride stays meaningful. */
    stride *= t->shape[i] > 0 ? t->shape[i] : 1;
  }
}

ina_tensor_t ina_tensor_wrap(void *data, ina_dtype_t dtype, int ndim, const int64_t *shape,
                             ina_device_t device) {
  ina_tensor_t t;
  memset(&t, 0, sizeof t);
  size_t bytes;
  if (contiguous_nbytes(dtype, ndim, shape, &bytes) != INA_OK) return t; /* empty; error logged */
  t.dtype = dtype;
  t.ndim = ndim;
  for (int i = 0; i < ndim; i++) t.shape[i] = shape[i];
  set_contiguous_strides(&t);
  t.device = device;
  t.data = data;
  t.owns_data = 0;
  return t;
}

ina_status_t ina_tensor_alloc(ina_tensor_t *t, ina_dtype_t dtype, int ndim, const int64_t *shape,
                              ina_device_t device) {
  ina_status_t st = INA_OK;
  void *data = NULL;
  INA_REQUIRE(t != NULL, INA_ERR_INVALID_ARGUMENT, "ina_tensor_alloc: NULL tensor");
  memset(t, 0, sizeof *t);
  size_t bytes = 0;
  INA_CHECK(contiguous_nbytes(dtype, ndim, shape, &bytes));
  /* Round up to whole cache lines (aligned_alloc wants a multiple of the alignment) and
   * allocate at least one, so that even a zero-size tensor has a valid data pointer. */
  INA_REQUIRE(bytes <= SIZE_MAX - HOST_ALIGN, INA_ERR_INVALID_ARGUMENT,
              "tensor of %zu bytes is too large", bytes);
  size_t alloc_bytes = bytes == 0 ? HOST_ALIGN : (bytes + HOST_ALIGN - 1) / HOST_ALIGN * HOST_ALIGN;
  switch (device.type) {
  case INA_DEVICE_CPU:
    data = aligned_alloc(HOST_ALIGN, alloc_bytes);
    INA_REQUIRE(data != NULL, INA_ERR_OUT_OF_MEMORY, "out of host memory allocating %zu bytes",
                alloc_bytes);
    break;
  case INA_DEVICE_CUDA:
    INA_REQUIRE(device.index >= 0, INA_ERR_INVALID_ARGUMENT, "invalid CUDA device index %d",
                device.index);
    INA_CHECK(ina_cuda_malloc(device.index, alloc_bytes, &data));
    break;
  default: INA_REQUIRE(0, INA_ERR_INVALID_ARGUMENT, "invalid device type %d", (int)device.type);
  }
  t->dtype = dtype;
  t->ndim = ndim;
  for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
  set_contiguous_strides(t);
  t->device = device;
  t->data = data;
  t->owns_data = 1;
  return INA_OK;
fail:
  return st;
}

void ina_tensor_release(ina_tensor_t *t) {
  if (!t) return;
  if (t->owns_data && t->data) {
    if (t->device.type == INA_DEVICE_CUDA)
      ina_cuda_free(t->data);
    else
      free(t->data);
  }
  memset(t, 0, sizeof *t);
}

int ina_tensor_is_empty(const ina_tensor_t *t) {
  return t == NULL || (t->ndim == 0 && t->data == NULL);
}

int64_t ina_tensor_numel(const ina_tensor_t *t) {
  if (ina_tensor_is_empty(t)) return 0;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

size_t ina_tensor_nbytes(const ina_tensor_t *t) {
  if (ina_tensor_is_empty(t)) return 0;
  return (size_t)ina_tensor_numel(t) * ina_dtype_size(t->dtype);
}

int ina_tensor_is_contiguous(const ina_tensor_t *t) {
  if (ina_tensor_is_empty(t)) return 1;
  if (ina_tensor_numel(t) == 0) return 1;
  int64_t expected = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    /* The stride of a size-1 dim never moves the pointer, so it does not matter. */
    if (t->shape[i] != 1 && t->stride[i] != expected) return 0;
    expected *= t->shape[i];
  }
  return 1;
}

/* Appends printf-style text at *pos, never past bufsize; *pos saturates at bufsize. */
static void appendf(char *buf, size_t bufsize, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void appendf(char *buf, size_t bufsize, size_t *pos, const char *fmt, ...) {
  if (*pos >= bufsize) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *pos, bufsize - *pos, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= bufsize - *pos)
    *pos = bufsize;
  else
    *pos += (size_t)n;
}

const char *ina_tensor_describe(const ina_tensor_t *t, char *buf, size_t bufsize) {
  if (!buf || bufsize == 0) return buf;
  buf[0] = '\0';
  size_t pos = 0;
  if (ina_tensor_is_empty(t)) {
    appendf(buf, bufsize, &pos, "empty");
    return buf;
  }
  appendf(buf, bufsize, &pos, "%s[", ina_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim; i++)
    appendf(buf, bufsize, &pos, i ? ", %lld" : "%lld", (long long)t->shape[i]);
  appendf(buf, bufsize, &pos, "]");
  /* Views that are not plain row-major say so: their strides are part of the story. */
  if (!ina_tensor_is_contiguous(t)) {
    for (int i = 0; i < t->ndim; i++)
      appendf(buf, bufsize, &pos, i ? ", %lld" : " stride [%lld", (long long)t->stride[i]);
    appendf(buf, bufsize, &pos, "]");
  }
  if (t->device.type == INA_DEVICE_CUDA)
    appendf(buf, bufsize, &pos, " on cuda:%d", t->device.index);
  return buf;
}
