/* Copy plans for KV entries between two paged caches: which bytes of one cache's pages
 * go to which bytes of another's, for a token range of one sequence. The prefill/decode
 * hand-off turns a plan into one-sided puts (comm/ucx_engine.h); a test turns it into
 * memcpy.
 *
 * Both caches are laid out as page_pool.h stores them: [num_layers][num_pages]
 * [page_size][entry] with entry_bytes per token and layer, so token t of a sequence
 * with page list `pages` sits at
 *   ((layer * num_pages + pages[t / page_size]) * page_size + t % page_size) * entry_bytes.
 * The two page sizes may differ (re-paging): a plan splits the range where either side
 * changes page, and merges pieces that continue each other on both sides (consecutive
 * page ids are adjacent in memory), so equal layouts with runs of consecutive pages
 * become few large copies.
 *
 * Thread safety: pure functions. */
#ifndef INA_KVCACHE_KV_COPY_H
#define INA_KVCACHE_KV_COPY_H

#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_kv_layout {
  int32_t page_size;   /* tokens per page, >= 1 */
  int32_t num_pages;   /* pages in the cache, >= 1 */
  int32_t num_layers;  /* >= 1 */
  int64_t entry_bytes; /* one token's entry in one layer, >= 1 */
} ina_kv_layout_t;

/* One contiguous copy: bytes at src_offset of the source cache to dst_offset of the
 * destination's (offsets from each cache's first byte). */
typedef struct ina_kv_copy {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t bytes;
} ina_kv_copy_t;

/* Why two layouts cannot exchange entries: "" when they can (same layer count and entry
 * size; page sizes and page counts may differ), else a sentence naming the mismatch,
 * written to why [size]. Returns 1 when compatible. */
int ina_kv_layouts_compatible(const ina_kv_layout_t *src, const ina_kv_layout_t *dst, char *why, int size);

/* The most copies a plan of tokens [from, to) over layers [layer_begin, layer_end) can
 * produce: room for ina_kv_copy_plan's output. 0 for an empty range. */
int64_t ina_kv_copy_max(const ina_kv_layout_t *src, const ina_kv_layout_t *dst, int64_t from, int64_t to,
                        int32_t layer_begin, int32_t layer_end);

/* Plans the copy of tokens [from, to) of a sequence whose pages are src_pages in the
 * source cache and dst_pages in the destination's (each at least ceil(to / page_size)
 * long), layer by layer from layer_begin to layer_end (exclusive), into out [capacity];
 * *count receives the number of copies. INA_ERR_INVALID_ARGUMENT (naming the field) for
 * incompatible layouts, a bad range, a page id outside its cache, or too little
 * capacity; *count is 0 then. */
ina_status_t ina_kv_copy_plan(const ina_kv_layout_t *src, const int32_t *src_pages, const ina_kv_layout_t *dst,
                              const int32_t *dst_pages, int64_t from, int64_t to, int32_t layer_begin,
                              int32_t layer_end, ina_kv_copy_t *out, int64_t capacity, int64_t *count);

#ifdef __cplusplus
}
#endif
#endif
