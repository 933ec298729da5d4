/* Page pool: fixed-size pages of KV cache entries with reference counts.
 *
 * A page holds `page_size` tokens (any size >= 1). Storage is one buffer laid out as
 * [num_layers][num_pages][page_size][entry_elems] of `dtype`, so a page id means the
 * same tokens in every layer. For MLA an entry is the normalized compressed kv followed
 * by the rope'd key (e.g. 512 + 64 values).
 *
 * Pages are handed out with refcount 1; sharing a page (prefix reuse) adds references;
 * a page returns to the free list when its count drops to 0. Allocation never fails
 * halfway: INA_ERR_OUT_OF_PAGES leaves the pool as it was.
 *
 * Stripes: a pool may split its pages into `stripes` classes, page p in stripe
 * p % stripes, each with its own free list. A sequence takes all its pages from one
 * stripe (kvcache/kv_seq.h), so ranks that split sequences by stripe (attention data
 * parallelism) each store only their stripe's pages: page p at p / stripes.
 *
 * Ownership: the pool owns its storage. Thread safety: none; the scheduler owns the
 * pool and serializes access. */
#ifndef INA_KVCACHE_PAGE_POOL_H
#define INA_KVCACHE_PAGE_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_page_pool ina_page_pool_t;

typedef struct ina_page_pool_config {
  size_t struct_size; /* sizeof(ina_page_pool_config_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  int32_t page_size;  /* tokens per page, >= 1 */
  int32_t num_pages;  /* >= 1 */
  int32_t num_layers; /* >= 1 */
  int32_t entry_elems; /* values per token per layer, >= 1 */
  ina_dtype_t dtype;   /* storage dtype */
  ina_device_t device; /* where the storage lives (CPU in this version) */
  /* Version 2. 1 (default): the pool holds the entries in host memory. 0: bookkeeping
   * only (page ids, refcounts, free list), for a cache whose entries live elsewhere (the
   * GPU engine's device cache); then ina_page_pool_entry returns NULL,
   * ina_page_pool_layer an empty tensor, and ina_page_pool_copy copies nothing (the
   * owner of the entries copies them). */
  int store_entries;
  /* Version 3. Stripes, 1 .. num_pages (0 or 1: one). */
  int32_t stripes;
} ina_page_pool_config_t;

#define INA_PAGE_POOL_CONFIG_INIT \
  {sizeof(ina_page_pool_config_t), 3, 16, 0, 1, 576, INA_DTYPE_F32, {INA_DEVICE_CPU, 0}, 1, 1}

/* Validates the config (struct_size at least the version-1 size, version >= 1, every
 * count >= 1, storage size within size_t) and allocates the storage, whose contents are
 * uninitialized. INA_ERR_UNSUPPORTED for a CUDA device. On failure *out = NULL. */
ina_status_t ina_page_pool_create(const ina_page_pool_config_t *config, ina_page_pool_t **out);
/* NULL is a no-op. */
void ina_page_pool_destroy(ina_page_pool_t *pool);

int32_t ina_page_pool_page_size(const ina_page_pool_t *pool);
int32_t ina_page_pool_num_pages(const ina_page_pool_t *pool);
int32_t ina_page_pool_free_pages(const ina_page_pool_t *pool);
int32_t ina_page_pool_stripes(const ina_page_pool_t *pool);
/* Free pages of one stripe (0 for a stripe out of range). */
int32_t ina_page_pool_stripe_free(const ina_page_pool_t *pool, int32_t stripe);
/* The stripe with the most free pages (the lowest of equals). */
int32_t ina_page_pool_roomiest_stripe(const ina_page_pool_t *pool);
int32_t ina_page_pool_entry_elems(const ina_page_pool_t *pool);
int32_t ina_page_pool_num_layers(const ina_page_pool_t *pool);
ina_dtype_t ina_page_pool_dtype(const ina_page_pool_t *pool);

/* Take n free pages (refcount 1 each) of stripe `stripe` into pages[0..n). All or
 * nothing: when fewer than n are free there, returns INA_ERR_OUT_OF_PAGES (the message
 * says how many were asked and how many are free) and the pool is unchanged. n = 0
 * succeeds. */
ina_status_t ina_page_pool_alloc_in(ina_page_pool_t *pool, int32_t stripe, int32_t n, int32_t *pages);
/* The same from the roomiest stripe (with one stripe: any free pages). */
ina_status_t ina_page_pool_alloc(ina_page_pool_t *pool, int32_t n, int32_t *pages);
/* Add / drop one reference. Dropping the last returns the page to the free list. A page
 * id out of range or a page that is free (refcount 0) is a caller bug: it is logged as
 * an error and ignored, so the free list is never corrupted. */
void ina_page_pool_ref(ina_page_pool_t *pool, int32_t page);
void ina_page_pool_unref(ina_page_pool_t *pool, int32_t page);
/* 0 for a free page and for an id out of range. */
int32_t ina_page_pool_refcount(const ina_page_pool_t *pool, int32_t page);

/* Pointer to the entry of (layer, page, slot) in CPU storage; NULL (and an error
 * logged) when any index is out of range or the pool stores no entries. */
void *ina_page_pool_entry(ina_page_pool_t *pool, int32_t layer, int32_t page, int32_t slot);
/* The storage of one layer as a [num_pages, page_size, entry_elems] view (not owning);
 * an empty tensor when layer is out of range or the pool stores no entries. */
ina_tensor_t ina_page_pool_layer(ina_page_pool_t *pool, int32_t layer);
/* Copy the first ntokens slots of page src to page dst, in every layer. Invalid ids,
 * src == dst or ntokens outside [0, page_size] are logged and ignored. Nothing to copy
 * when the pool stores no entries. */
void ina_page_pool_copy(ina_page_pool_t *pool, int32_t src, int32_t dst, int32_t ntokens);

/* Self-check of the bookkeeping, for tests and debugging: every free-list entry is in
 * range, of its list's stripe and listed once, and a page is on a free list exactly when
 * its refcount is 0.
 * INA_ERR_INTERNAL (with a message naming the page) when broken. O(num_pages). */
ina_status_t ina_page_pool_check(const ina_page_pool_t *pool);

#ifdef __cplusplus
}
#endif
#endif
