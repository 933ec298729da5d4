/* Checkpoint directories (ina_checkpoint_t, core/safetensors.h): one whose index is
 * already in memory, and the shard each tensor is read from.
 *
 * Thread safety: as the rest of the checkpoint functions (core/safetensors.h). */
#ifndef INA_CORE_CHECKPOINT_H
#define INA_CORE_CHECKPOINT_H

#include <stddef.h>

#include "core/safetensors.h"
#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A checkpoint over the shards of `dir` whose index is the `size` bytes at `json` (the
 * text of a model.safetensors.index.json) instead of the file in dir: the same checks as
 * ina_checkpoint_open makes of an index file (a JSON object without duplicate keys whose
 * "weight_map" maps each tensor name to a plain file name inside the directory: not
 * empty, no '/', no ".."), failing with INA_ERR_FORMAT and a message naming the index,
 * and *out NULL. `name` labels the messages (NULL: dir/model.safetensors.index.json).
 * The bytes are parsed, not kept. Shards are opened from dir when a tensor in them is
 * first asked for; dir is not looked at before. */
ina_status_t ina_checkpoint_open_index_memory(const char *dir, const void *json, size_t size,
                                              const char *name, ina_checkpoint_t **out);

/* The file name, inside the checkpoint's directory, of the shard the named tensor is read
 * from (the index's, or the file it was found in), or NULL when the checkpoint has no
 * tensor of that name. Valid until ina_checkpoint_close. */
const char *ina_checkpoint_shard_of(const ina_checkpoint_t *ckpt, const char *name);

#ifdef __cplusplus
}
#endif
#endif
