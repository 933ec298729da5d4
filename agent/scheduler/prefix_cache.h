/* Prefix cache: full KV pages of previously computed prompts, found again by their
 * tokens, so a new request that starts with the same tokens shares those pages instead
 * of recomputing them. Internal to scheduler/.
 *
 * A cached block is one full page. Its key is a chained hash: the hash of the previous
 * block of the same prompt mixed with this block's page_size tokens, so a block is found
 * only together with the whole prefix before it (page-aligned). The tokens are kept and
 * compared too, so a hash collision can never hand out the wrong page. The blocks form a
 * tree (a block's parent is the block before it); only leaves are evicted, so every
 * cached block stays reachable from the first block of its prompt.
 *
 * Recency: every lookup and insert touches the matched chain from its last block up to
 * its first, so a parent is always more recent than each of its children and the least
 * recently used block is always a leaf.
 *
 * Page references: the cache holds one reference on each cached page. A page that a
 * live sequence also references (refcount > 1) is in use: evicting it for pool space
 * would free nothing, so ina_prefix_cache_evict skips it.
 *
 * Cost: lookups and inserts are O(tokens); eviction scans the blocks, O(blocks) per
 * evicted block, which suits a cache of a few thousand pages.
 *
 * Ownership: the cache borrows the pool (which must outlive it) and holds references on
 * the pages it caches; destroy and clear drop them. Thread safety: none; the scheduler's
 * driver thread owns it, together with the pool. */
#ifndef INA_AGENT_SCHEDULER_PREFIX_CACHE_H
#define INA_AGENT_SCHEDULER_PREFIX_CACHE_H

#include <stdint.h>

#include "core/status.h"
#include "kvcache/page_pool.h"

typedef struct ina_prefix_cache ina_prefix_cache_t;

/* max_pages >= 1: the most pages the cache holds at once. On failure *out = NULL. */
ina_status_t ina_prefix_cache_create(ina_page_pool_t *pool, int32_t max_pages,
                                     ina_prefix_cache_t **out);
/* Drops every cached page's reference. NULL is a no-op. */
void ina_prefix_cache_destroy(ina_prefix_cache_t *cache);

/* The longest cached prefix of `tokens` in whole pages, at most max_pages: writes its
 * page ids to pages[0..n) (no reference is taken) and returns n. tokens must hold
 * max_pages * page_size entries. */
int32_t ina_prefix_cache_match(ina_prefix_cache_t *cache, const int32_t *tokens, int32_t max_pages,
                               int32_t *pages);

/* Offer the first num_pages full pages of a computed sequence: pages[i] holds tokens
 * [i * page_size, (i + 1) * page_size). Blocks already cached are kept (and touched);
 * new ones take a reference on their page. When the cache is full it drops its least
 * recently used leaves to make room; when it cannot, the rest of the prompt is not
 * cached. Never fails: caching is an optimization. */
void ina_prefix_cache_insert(ina_prefix_cache_t *cache, const int32_t *tokens, int32_t num_pages,
                             const int32_t *pages);

/* Pages the cache could return to the pool now: cached pages no sequence uses and
 * whose cached descendants no sequence uses either. */
int32_t ina_prefix_cache_reclaimable(ina_prefix_cache_t *cache);

/* Evict least recently used blocks that no sequence uses until `pages` pages went back
 * to the pool or none is left to evict. Returns the number of pages freed. */
int32_t ina_prefix_cache_evict(ina_prefix_cache_t *cache, int32_t pages);

/* Drop every cached block. */
void ina_prefix_cache_clear(ina_prefix_cache_t *cache);

/* Blocks (pages) held now. */
int32_t ina_prefix_cache_num_pages(const ina_prefix_cache_t *cache);

#endif
