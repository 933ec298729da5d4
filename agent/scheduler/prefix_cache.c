/* The prefix cache of prefix_cache.h: a fixed array of blocks, a chained hash index
 * over them, and LRU ticks. */
#define INA_LOG_SUBSYS "scheduler"
#include "agent/scheduler/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/check.h"

#define NO_BLOCK (-1)
#define ROOT_HASH 0x6A09E667F3BCC908ull

typedef struct block {
  uint64_t hash;      /* chained: parent's hash mixed with this block's tokens */
  uint64_t last_used; /* tick of the last lookup or insert that touched it */
  int32_t parent;     /* block before it in its prompt, NO_BLOCK for a first block */
  int32_t page;       /* NO_BLOCK when the slot is free */
  int32_t children;   /* cached blocks whose parent this is */
  int32_t next;       /* next block of the same hash bucket, or of the free list */
} block_t;

struct ina_prefix_cache {
  ina_page_pool_t *pool;
  int32_t page_size;
  int32_t capacity; /* blocks */
  int32_t count;
  block_t *blocks;  /* [capacity] */
  int32_t *tokens;  /* [capacity, page_size]: the tokens of each block */
  int32_t *buckets; /* [num_buckets]: first block of each hash bucket */
  uint64_t bucket_mask;
  int32_t free_head; /* free block slots, linked through `next` */
  uint64_t tick;
  uint8_t *in_use;   /* [capacity] scratch of ina_prefix_cache_reclaimable */
};

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t block_hash(uint64_t parent_hash, const int32_t *tokens, int32_t n) {
  uint64_t h = parent_hash;
  for (int32_t i = 0; i < n; i++) h = mix64(h + 0x9E3779B97F4A7C15ull + (uint32_t)tokens[i]);
  return h;
}

ina_status_t ina_prefix_cache_create(ina_page_pool_t *pool, int32_t max_pages, ina_prefix_cache_t **out) {
  ina_status_t st = INA_OK;
  ina_prefix_cache_t *c = NULL;
  INA_REQUIRE(out != NULL && pool != NULL, INA_ERR_INVALID_ARGUMENT, "prefix cache: pool or out is NULL");
  *out = NULL;
  INA_REQUIRE(max_pages >= 1, INA_ERR_INVALID_ARGUMENT, "prefix cache: max_pages %d must be >= 1", max_pages);
  c = calloc(1, sizeof *c);
  INA_CHECK_ALLOC(c);
  c->pool = pool;
  c->page_size = ina_page_pool_page_size(pool);
  c->capacity = max_pages;
  uint64_t buckets = 1;
  while (buckets < (uint64_t)max_pages * 2) buckets <<= 1;
  c->bucket_mask = buckets - 1;
  c->blocks = malloc((size_t)max_pages * sizeof *c->blocks);
  c->tokens = malloc((size_t)max_pages * (size_t)c->page_size * sizeof *c->tokens);
  c->buckets = malloc((size_t)buckets * sizeof *c->buckets);
  c->in_use = malloc((size_t)max_pages);
  INA_CHECK_ALLOC(c->blocks);
  INA_CHECK_ALLOC(c->tokens);
  INA_CHECK_ALLOC(c->buckets);
  INA_CHECK_ALLOC(c->in_use);
  for (uint64_t b = 0; b < buckets; b++) c->buckets[b] = NO_BLOCK;
  for (int32_t i = 0; i < max_pages; i++) {
    c->blocks[i].page = NO_BLOCK;
    c->blocks[i].next = i + 1 < max_pages ? i + 1 : NO_BLOCK;
  }
  c->free_head = 0;
  *out = c;
  return INA_OK;
fail:
  ina_prefix_cache_destroy(c);
  return st;
}

void ina_prefix_cache_destroy(ina_prefix_cache_t *c) {
  if (!c) return;
  if (c->count > 0) ina_prefix_cache_clear(c); /* count > 0: fully built */
  free(c->blocks);
  free(c->tokens);
  free(c->buckets);
  free(c->in_use);
  free(c);
}

static const int32_t *block_tokens(const ina_prefix_cache_t *c, int32_t b) {
  return c->tokens + (size_t)b * (size_t)c->page_size;
}

static int32_t find_block(const ina_prefix_cache_t *c, uint64_t hash, int32_t parent, const int32_t *tokens) {
  for (int32_t b = c->buckets[hash & c->bucket_mask]; b != NO_BLOCK; b = c->blocks[b].next)
    if (c->blocks[b].hash == hash && c->blocks[b].parent == parent &&
        memcmp(block_tokens(c, b), tokens, (size_t)c->page_size * sizeof *tokens) == 0)
      return b;
  return NO_BLOCK;
}

/* Touch a chain from its last block up to its first: ancestors end up more recent. */
static void touch_chain(ina_prefix_cache_t *c, int32_t last) {
  for (int32_t b = last; b != NO_BLOCK; b = c->blocks[b].parent) c->blocks[b].last_used = ++c->tick;
}

static void remove_block(ina_prefix_cache_t *c, int32_t b) {
  block_t *blk = &c->blocks[b];
  int32_t *link = &c->buckets[blk->hash & c->bucket_mask];
  while (*link != b) link = &c->blocks[*link].next;
  *link = blk->next;
  if (blk->parent != NO_BLOCK) c->blocks[blk->parent].children--;
  ina_page_pool_unref(c->pool, blk->page);
  blk->page = NO_BLOCK;
  blk->next = c->free_head;
  c->free_head = b;
  c->count--;
}

/* The least recently used leaf, other than `keep`; with only_unused, only a leaf whose
 * page no sequence references. NO_BLOCK when there is none. */
static int32_t lru_leaf(const ina_prefix_cache_t *c, int32_t keep, int only_unused) {
  int32_t best = NO_BLOCK;
  for (int32_t b = 0; b < c->capacity; b++) {
    const block_t *blk = &c->blocks[b];
    if (blk->page == NO_BLOCK || blk->children > 0 || b == keep) continue;
    if (only_unused && ina_page_pool_refcount(c->pool, blk->page) > 1) continue;
    if (best == NO_BLOCK || blk->last_used < c->blocks[best].last_used) best = b;
  }
  return best;
}

int32_t ina_prefix_cache_match(ina_prefix_cache_t *c, const int32_t *tokens, int32_t max_pages, int32_t *pages) {
  uint64_t hash = ROOT_HASH;
  int32_t parent = NO_BLOCK, n = 0;
  for (; n < max_pages; n++) {
    const int32_t *blk_tokens = tokens + (size_t)n * (size_t)c->page_size;
    hash = block_hash(hash, blk_tokens, c->page_size);
    const int32_t b = find_block(c, hash, parent, blk_tokens);
    if (b == NO_BLOCK) break;
    pages[n] = c->blocks[b].page;
    parent = b;
  }
  touch_chain(c, parent);
  return n;
}

void ina_prefix_cache_insert(ina_prefix_cache_t *c, const int32_t *tokens, int32_t num_pages, const int32_t *pages) {
  uint64_t hash = ROOT_HASH;
  int32_t parent = NO_BLOCK;
  for (int32_t i = 0; i < num_pages; i++) {
    const int32_t *blk_tokens = tokens + (size_t)i * (size_t)c->page_size;
    hash = block_hash(hash, blk_tokens, c->page_size);
    int32_t b = find_block(c, hash, parent, blk_tokens);
    if (b == NO_BLOCK) {
      if (c->free_head == NO_BLOCK) {
        /* Full: drop the least recently used leaf, but never the block this one extends. */
        const int32_t victim = lru_leaf(c, parent, 0);
        if (victim == NO_BLOCK) break;
        remove_block(c, victim);
      }
      b = c->free_head;
      block_t *blk = &c->blocks[b];
      c->free_head = blk->next;
      blk->hash = hash;
      blk->parent = parent;
      blk->page = pages[i];
      blk->children = 0;
      blk->last_used = 0;
      blk->next = c->buckets[hash & c->bucket_mask];
      c->buckets[hash & c->bucket_mask] = b;
      memcpy(c->tokens + (size_t)b * (size_t)c->page_size, blk_tokens, (size_t)c->page_size * sizeof *blk_tokens);
      ina_page_pool_ref(c->pool, pages[i]);
      if (parent != NO_BLOCK) c->blocks[parent].children++;
      c->count++;
    }
    parent = b;
  }
  touch_chain(c, parent);
}

int32_t ina_prefix_cache_reclaimable(ina_prefix_cache_t *c) {
  memset(c->in_use, 0, (size_t)c->capacity);
  /* A block is kept in the cache while any block below it is in use: mark each used
   * block and its ancestors (stopping at one already marked, so this is O(blocks)). */
  for (int32_t b = 0; b < c->capacity; b++) {
    if (c->blocks[b].page == NO_BLOCK || ina_page_pool_refcount(c->pool, c->blocks[b].page) <= 1) continue;
    for (int32_t a = b; a != NO_BLOCK && !c->in_use[a]; a = c->blocks[a].parent) c->in_use[a] = 1;
  }
  int32_t n = 0;
  for (int32_t b = 0; b < c->capacity; b++) n += c->blocks[b].page != NO_BLOCK && !c->in_use[b];
  return n;
}

int32_t ina_prefix_cache_evict(ina_prefix_cache_t *c, int32_t pages) {
  int32_t freed = 0;
  while (freed < pages) {
    const int32_t b = lru_leaf(c, NO_BLOCK, 1);
    if (b == NO_BLOCK) break;
    remove_block(c, b);
    freed++;
  }
  return freed;
}

void ina_prefix_cache_clear(ina_prefix_cache_t *c) {
  for (int32_t b = 0; b < c->capacity; b++) {
    if (c->blocks[b].page != NO_BLOCK) ina_page_pool_unref(c->pool, c->blocks[b].page);
    c->blocks[b].page = NO_BLOCK;
    c->blocks[b].next = b + 1 < c->capacity ? b + 1 : NO_BLOCK;
  }
  for (uint64_t k = 0; k <= c->bucket_mask; k++) c->buckets[k] = NO_BLOCK;
  c->free_head = 0;
  c->count = 0;
}

int32_t ina_prefix_cache_num_pages(const ina_prefix_cache_t *c) { return c ? c->count : 0; }
