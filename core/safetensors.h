/* safetensors files and Hugging Face checkpoint directories, read through mmap.
 *
 * Opening a file validates it completely before anything is returned: the 8-byte
 * header length against the file size, the header as JSON (parsed by jansson), every
 * entry's dtype name, shape (non-negative, at most INA_MAX_DIMS dims, no overflow),
 * data_offsets (begin <= end, inside the data section, matching dtype size x numel),
 * and that no two tensors overlap. Errors name the file and the tensor or key.
 *
 * A checkpoint directory holds either `model.safetensors.index.json` (its "weight_map"
 * names the shard of each tensor) or one or more `*.safetensors` files. Shards are
 * opened lazily, when a tensor in them is first asked for, so a rank that loads only
 * its slice maps only the files it needs.
 *
 * Ownership: ina_safetensors_close / ina_checkpoint_close unmap everything; tensor views
 * returned by the lookups point into the mapping (or the caller's bytes) and die with it.
 * Thread safety: lookups on an opened file are thread-safe; ina_checkpoint_get may open a
 * shard and must not be called concurrently on the same checkpoint. */
#ifndef INA_CORE_SAFETENSORS_H
#define INA_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_safetensors ina_safetensors_t;

typedef struct ina_st_entry {
  const char *name;
  ina_dtype_t dtype;
  int ndim;
  int64_t shape[INA_MAX_DIMS];
  const void *data; /* inside the mapping */
  size_t nbytes;
} ina_st_entry_t;

ina_status_t ina_safetensors_open(const char *path, ina_safetensors_t **out);
/* The same validation over a whole file already in memory (size bytes at `bytes`).
 * `name` labels messages and is what ina_safetensors_path returns (NULL: "(memory)").
 * The bytes are borrowed, not copied: the entries point into them, so they must stay
 * unchanged until ina_safetensors_close. */
ina_status_t ina_safetensors_open_memory(const void *bytes, size_t size, const char *name,
                                         ina_safetensors_t **out);
void ina_safetensors_close(ina_safetensors_t *st);
size_t ina_safetensors_count(const ina_safetensors_t *st);
const ina_st_entry_t *ina_safetensors_at(const ina_safetensors_t *st, size_t i);
/* NULL when absent (no error recorded). */
const ina_st_entry_t *ina_safetensors_find(const ina_safetensors_t *st, const char *name);
const char *ina_safetensors_path(const ina_safetensors_t *st);
/* The "__metadata__" object's value for key, or NULL. */
const char *ina_safetensors_metadata(const ina_safetensors_t *st, const char *key);

/* One tensor to write. data holds numel x dtype size bytes, row-major. */
typedef struct ina_st_write_entry {
  const char *name;
  ina_dtype_t dtype;
  int ndim;
  int64_t shape[INA_MAX_DIMS];
  const void *data;
} ina_st_write_entry_t;

/* Write a safetensors file (entries in the given order; header padded to 8 bytes).
 * metadata: NULL or pairs {key0, value0, key1, value1, ..., NULL}. Written to a
 * temporary name and renamed, so a failed write leaves no partial file. */
ina_status_t ina_safetensors_write(const char *path, const ina_st_write_entry_t *entries,
                                   size_t n, const char *const *metadata);

typedef struct ina_checkpoint ina_checkpoint_t;

ina_status_t ina_checkpoint_open(const char *dir, ina_checkpoint_t **out);
void ina_checkpoint_close(ina_checkpoint_t *ckpt);
const char *ina_checkpoint_dir(const ina_checkpoint_t *ckpt);
/* 1 when the checkpoint names a tensor of this name (in the index or in a file). */
int ina_checkpoint_has(ina_checkpoint_t *ckpt, const char *name);
/* A CPU view (not owned) of the named tensor. A missing tensor gives INA_ERR_NOT_FOUND
 * with a message naming it and the directory. */
ina_status_t ina_checkpoint_get(ina_checkpoint_t *ckpt, const char *name, ina_tensor_t *out);
/* Names of all tensors (index order or file order); valid until close. */
size_t ina_checkpoint_count(ina_checkpoint_t *ckpt);
const char *ina_checkpoint_name_at(ina_checkpoint_t *ckpt, size_t i);

#ifdef __cplusplus
}
#endif
#endif
