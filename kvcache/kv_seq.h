/* The KV pages of one sequence, and batch page tables in FlashInfer's block-sparse
 * layout.
 *
 * A sequence's token t lives in page pages[t / page_size], slot t % page_size.
 *
 * Prefix sharing: ina_kv_seq_fork makes dst reuse src's pages covering its first
 * `prefix` tokens by reference. A shared page is never written: when an append would
 * write into a last page that other sequences still reference, that page is first copied
 * to a fresh page (copy on write).
 *
 * Ownership: a sequence holds one reference on each of its pages; ina_kv_seq_release
 * drops them and frees the array. Thread safety: none (see page_pool.h). */
#ifndef INA_KVCACHE_KV_SEQ_H
#define INA_KVCACHE_KV_SEQ_H

#include <stdint.h>

#include "core/status.h"
#include "kvcache/page_pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_kv_seq {
  int32_t *pages;
  int32_t num_pages;
  int32_t capacity; /* of the pages array */
  int64_t num_tokens;
  /* Striped pools (kvcache/page_pool.h): a sequence's pages all come from the stripe of
   * its first page. Before it has one: 1 + the stripe to take it from, or 0 (what
   * INA_KV_SEQ_INIT and zeroing give) for the pool's roomiest stripe at that time. */
  int32_t stripe_pick;
} ina_kv_seq_t;

#define INA_KV_SEQ_INIT {NULL, 0, 0, 0, 0}

/* The stripe seq's pages come from: its first page's, else its pick, else the pool's
 * roomiest (0 with one stripe). */
int32_t ina_kv_seq_stripe(const ina_page_pool_t *pool, const ina_kv_seq_t *seq);

/* Grow the sequence by n tokens: allocate the pages they need (from its stripe) and copy
 * a shared partial last page on write. The caller then writes the entries of positions
 * [old num_tokens, old num_tokens + n). n = 0 does nothing. On INA_ERR_OUT_OF_PAGES (or
 * out of memory) the sequence and the pool are unchanged. */
ina_status_t ina_kv_seq_append(ina_page_pool_t *pool, ina_kv_seq_t *seq, int64_t n);
/* Pages an append of n tokens would take from the pool: the new pages plus one when the
 * shared partial last page must be copied. Lets a scheduler admit work without
 * provoking INA_ERR_OUT_OF_PAGES (which is logged as an error). -1 for invalid
 * arguments. */
int64_t ina_kv_seq_pages_needed(const ina_page_pool_t *pool, const ina_kv_seq_t *seq,
                                int64_t n);
/* Drop the last n tokens (pages that become empty are released). n outside
 * [0, num_tokens] is a caller bug: logged as an error and ignored. */
void ina_kv_seq_truncate(ina_page_pool_t *pool, ina_kv_seq_t *seq, int64_t n);
/* dst (empty: no tokens and no pages; its array may be reused) shares src's pages that
 * hold its first `prefix` tokens (prefix <= src->num_tokens), taking a reference on each;
 * dst->num_tokens = prefix. Takes no page from the pool, so it never runs out of pages;
 * on failure (invalid arguments, out of memory) dst and the pool are unchanged. */
ina_status_t ina_kv_seq_fork(ina_page_pool_t *pool, const ina_kv_seq_t *src, int64_t prefix,
                             ina_kv_seq_t *dst);
/* Release all pages and reset to empty. NULL is a no-op. */
void ina_kv_seq_release(ina_page_pool_t *pool, ina_kv_seq_t *seq);
/* Page and slot of token t (t < num_tokens). Out of range: an error is logged and both
 * outputs are set to -1. */
void ina_kv_seq_locate(const ina_kv_seq_t *seq, int32_t page_size, int64_t t, int32_t *page,
                       int32_t *slot);

/* A batch's page table: sequence i's pages are indices[indptr[i] .. indptr[i+1]) and its
 * last page holds last_page_len[i] tokens (1..page_size; 0 only for an empty sequence). */
typedef struct ina_page_table {
  int32_t batch;
  int32_t page_size;
  int32_t *indptr;        /* [batch + 1] */
  int32_t *indices;       /* [indptr[batch]] */
  int32_t *last_page_len; /* [batch] */
  int32_t batch_capacity;
  int32_t indices_capacity;
} ina_page_table_t;

#define INA_PAGE_TABLE_INIT {0, 0, NULL, NULL, NULL, 0, 0}

/* (Re)build the table for seqs[0..batch); reuses the table's arrays when large enough
 * and grows them (doubling) otherwise. On failure the previous contents stay valid. */
ina_status_t ina_page_table_build(ina_page_table_t *table, const ina_kv_seq_t *const *seqs,
                                  int32_t batch, int32_t page_size);
void ina_page_table_release(ina_page_table_t *table);

#ifdef __cplusplus
}
#endif
#endif
