/* Workspace arena: alignment, capacity, mark/reset, release, bad arguments. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "core/arena.h"
#include "core/log.h"
#include "tests/test_util.h"

typedef struct {
  unsigned char *p;
  size_t bytes;
  unsigned char fill;
} block_t;

/* Random allocations until the arena is full: each block aligned, inside the buffer,
 * disjoint from the others (every block keeps its fill pattern). */
static void test_fill_until_full(test_rng_t *rng) {
  ina_arena_t a;
  size_t cap = (size_t)test_rng_int(rng, 1, 1 << 16);
  CHECK_OK(ina_arena_init(&a, cap));
  CHECK(a.size == cap && a.used == 0 && a.base != NULL);
  CHECK(((uintptr_t)a.base & 63) == 0);
  block_t blocks[4096];
  int nblocks = 0;
  int misaligned = 0, outside = 0;
  for (;;) {
    size_t bytes = (size_t)test_rng_int(rng, 0, 3000);
    size_t align = (size_t)1 << test_rng_int(rng, 0, 12);
    if (test_rng_int(rng, 0, 4) == 0) align = 0; /* default: 64 */
    size_t used_before = a.used;
    unsigned char *p = ina_arena_alloc(&a, bytes, align);
    if (!p) {
      /* Full: the request really did not fit, and nothing changed. */
      size_t eff_align = align ? align : 64;
      size_t pad = (size_t)(-((uintptr_t)a.base + used_before) & (eff_align - 1));
      CHECKF(used_before + pad + bytes > a.size,
             "alloc of %zu (align %zu) refused with %zu of %zu used", bytes, eff_align, used_before,
             a.size);
      CHECK(a.used == used_before);
      break;
    }
    misaligned += ((uintptr_t)p & ((align ? align : 64) - 1)) != 0;
    outside += p < (unsigned char *)a.base || p + bytes > (unsigned char *)a.base + a.size;
    if (nblocks < 4096) {
      blocks[nblocks] = (block_t){p, bytes, (unsigned char)(nblocks * 37 + 1)};
      memset(p, blocks[nblocks].fill, bytes);
      nblocks++;
    }
  }
  CHECK(misaligned == 0 && outside == 0);
  int clobbered = 0;
  for (int i = 0; i < nblocks; i++)
    for (size_t k = 0; k < blocks[i].bytes; k++) clobbered += blocks[i].p[k] != blocks[i].fill;
  CHECKF(clobbered == 0, "%d bytes of earlier blocks overwritten by later ones", clobbered);
  ina_arena_release(&a);
  CHECK(a.base == NULL && a.size == 0 && a.used == 0);
}

static void test_mark_reset(void) {
  ina_arena_t a;
  CHECK_OK(ina_arena_init(&a, 4096));
  void *first = ina_arena_alloc(&a, 100, 0);
  CHECK(first == a.base);
  size_t mark = ina_arena_mark(&a);
  void *scratch1 = ina_arena_alloc(&a, 1000, 64);
  void *scratch2 = ina_arena_alloc(&a, 1000, 256);
  CHECK(scratch1 != NULL && scratch2 != NULL && ((uintptr_t)scratch2 & 255) == 0);
  ina_arena_reset(&a, mark);
  CHECK(a.used == mark);
  /* The same requests after a reset give the same addresses: no hidden growth. */
  CHECK(ina_arena_alloc(&a, 1000, 64) == scratch1);
  CHECK(ina_arena_alloc(&a, 1000, 256) == scratch2);
  /* A mark past the fill is ignored. */
  size_t used = a.used;
  ina_arena_reset(&a, a.size + 1);
  CHECK(a.used == used);
  ina_arena_reset(&a, 0);
  CHECK(a.used == 0 && ina_arena_alloc(&a, 4096, 1) == a.base);
  CHECK(ina_arena_alloc(&a, 1, 1) == NULL); /* exactly full */
  CHECK(ina_arena_alloc(&a, 0, 1) != NULL); /* a zero-byte block still fits */
  ina_arena_release(&a);
  ina_arena_release(&a); /* twice is fine */
  ina_arena_release(NULL);
  CHECK(ina_arena_mark(NULL) == 0);
  ina_arena_reset(NULL, 0);
}

static void test_bad_requests(void) {
  ina_arena_t a;
  CHECK_OK(ina_arena_init(&a, 1024));
  CHECK(ina_arena_alloc(&a, 8, 3) == NULL); /* not a power of two */
  CHECK(ina_arena_alloc(&a, 8, 96) == NULL);
  CHECK(ina_arena_alloc(&a, SIZE_MAX, 1) == NULL);
  CHECK(ina_arena_alloc(&a, SIZE_MAX - 10, 64) == NULL);
  CHECK(ina_arena_alloc(&a, 1025, 1) == NULL);
  CHECK(a.used == 0);
  CHECK(ina_arena_alloc(NULL, 8, 8) == NULL);
  /* An alignment larger than the buffer's own still holds. */
  void *p = ina_arena_alloc(&a, 1, 512);
  CHECK(p == NULL || ((uintptr_t)p & 511) == 0);
  ina_arena_release(&a);

  /* A zero-size arena is valid and holds nothing. */
  CHECK_OK(ina_arena_init(&a, 0));
  CHECK(ina_arena_alloc(&a, 1, 0) == NULL);
  ina_arena_release(&a);

  ina_log_set_quiet_errors(1);
  CHECK(ina_arena_init(NULL, 16) == INA_ERR_INVALID_ARGUMENT);
  memset(&a, 0x77, sizeof a);
  CHECK(ina_arena_init(&a, SIZE_MAX) != INA_OK);
  CHECK(a.base == NULL && a.size == 0 && a.used == 0);
  ina_log_set_quiet_errors(0);
}

int main(void) {
  uint64_t seed = test_seed("test_arena");
  test_rng_t rng = {seed};
  for (int k = 0; k < 20; k++) test_fill_until_full(&rng);
  test_mark_reset();
  test_bad_requests();
  return test_finish("test_arena");
}
