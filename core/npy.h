/* NumPy .npy files (format version 1.0, little-endian, C order) for dumping and
 * comparing arrays: logits from `ina generate --dump-logits`, golden fixtures.
 * Thread safety: none needed (no shared state). */
#ifndef INA_CORE_NPY_H
#define INA_CORE_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Write a float32 ('<f4') or int32/int64 array. */
ina_status_t ina_npy_write(const char *path, ina_dtype_t dtype, int ndim, const int64_t *shape,
                           const void *data);
/* Read a '<f4', '<i4' or '<i8' array into a newly allocated CPU tensor (owned; release
 * with ina_tensor_release). Malformed headers give INA_ERR_FORMAT naming the file. */
ina_status_t ina_npy_read(const char *path, ina_tensor_t *out);
/* The same over a whole file already in memory (size bytes at `bytes`, copied into the
 * tensor); `name` labels messages (NULL: "(memory)"). */
ina_status_t ina_npy_read_memory(const void *bytes, size_t size, const char *name,
                                 ina_tensor_t *out);

#ifdef __cplusplus
}
#endif
#endif
