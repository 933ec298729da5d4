/* Workspace arena: one allocation carved into aligned scratch buffers and reset as a
 * whole, so hot loops never call malloc. The caller owns the arena struct; the arena
 * owns its buffer (freed by ina_arena_release).
 *
 * Thread safety: none; use one arena per thread. */
#ifndef INA_CORE_ARENA_H
#define INA_CORE_ARENA_H

#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_arena {
  char *base;
  size_t size;
  size_t used;
} ina_arena_t;

ina_status_t ina_arena_init(ina_arena_t *arena, size_t bytes);
/* Aligned (power-of-two `align`, 0 means 64) block of `bytes`, or NULL when full. */
void *ina_arena_alloc(ina_arena_t *arena, size_t bytes, size_t align);
/* Mark/reset: free everything allocated since the mark. */
size_t ina_arena_mark(const ina_arena_t *arena);
void ina_arena_reset(ina_arena_t *arena, size_t mark);
void ina_arena_release(ina_arena_t *arena);

#ifdef __cplusplus
}
#endif
#endif
