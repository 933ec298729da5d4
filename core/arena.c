#define INA_LOG_SUBSYS "arena"
#include "core/arena.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* The buffer itself is aligned to this, so most requests need no padding. */
#define ARENA_BASE_ALIGN 64

ina_status_t ina_arena_init(ina_arena_t *arena, size_t bytes) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(arena != NULL, INA_ERR_INVALID_ARGUMENT, "ina_arena_init: NULL arena");
  memset(arena, 0, sizeof *arena);
  if (bytes == 0) return INA_OK; /* a valid arena that can hold nothing but zero-byte blocks */
  INA_REQUIRE(bytes <= SIZE_MAX - ARENA_BASE_ALIGN, INA_ERR_INVALID_ARGUMENT,
              "arena of %zu bytes is too large", bytes);
  /* aligned_alloc wants a multiple of the alignment. */
  size_t alloc_bytes = (bytes + ARENA_BASE_ALIGN - 1) / ARENA_BASE_ALIGN * ARENA_BASE_ALIGN;
  arena->base = aligned_alloc(ARENA_BASE_ALIGN, alloc_bytes);
  INA_REQUIRE(arena->base != NULL, INA_ERR_OUT_OF_MEMORY,
              "out of memory allocating an arena of %zu bytes", bytes);
  arena->size = bytes;
fail:
  return st;
}

void *ina_arena_alloc(ina_arena_t *arena, size_t bytes, size_t align) {
  if (!arena || !arena->base) return NULL; /* an empty arena has no address to give out */
  if (align == 0) align = 64;
  if ((align & (align - 1)) != 0) return NULL; /* not a power of two */
  /* Align the address, not the offset, so alignments above the base's also hold. */
  uintptr_t start = (uintptr_t)arena->base + arena->used;
  size_t padding = (size_t)(-start & (uintptr_t)(align - 1));
  size_t free_bytes = arena->size - arena->used;
  if (padding > free_bytes || bytes > free_bytes - padding) return NULL;
  char *p = arena->base + arena->used + padding;
  arena->used += padding + bytes;
  return p;
}

size_t ina_arena_mark(const ina_arena_t *arena) { return arena ? arena->used : 0; }

void ina_arena_reset(ina_arena_t *arena, size_t mark) {
  /* A mark beyond the current fill cannot come from ina_arena_mark on this state; keep
   * the arena as it is rather than expose memory that was never handed out. */
  if (arena && mark <= arena->used) arena->used = mark;
}

void ina_arena_release(ina_arena_t *arena) {
  if (!arena) return;
  free(arena->base);
  memset(arena, 0, sizeof *arena);
}
