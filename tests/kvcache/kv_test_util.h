/* Helpers shared by the kvcache tests: pool construction and a per-token byte pattern
 * that identifies who wrote an entry, so that a test can tell whether a page shared by
 * several sequences was overwritten. Include after tests/test_util.h. */
#ifndef INA_TESTS_KV_TEST_UTIL_H
#define INA_TESTS_KV_TEST_UTIL_H

#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "kvcache/kv_seq.h"
#include "kvcache/page_pool.h"

static inline ina_page_pool_t *kv_test_pool(int32_t page_size, int32_t num_pages,
                                            int32_t num_layers, int32_t entry_elems,
                                            ina_dtype_t dtype) {
  ina_page_pool_config_t config = INA_PAGE_POOL_CONFIG_INIT;
  config.page_size = page_size;
  config.num_pages = num_pages;
  config.num_layers = num_layers;
  config.entry_elems = entry_elems;
  config.dtype = dtype;
  ina_page_pool_t *pool = NULL;
  ina_status_t st = ina_page_pool_create(&config, &pool);
  if (st != INA_OK) {
    fprintf(stderr, "kv_test_pool: create failed: %s\n", ina_last_error());
    exit(1);
  }
  return pool;
}

static inline size_t kv_test_entry_bytes(const ina_page_pool_t *pool) {
  return (size_t)ina_page_pool_entry_elems(pool) * ina_dtype_size(ina_page_pool_dtype(pool));
}

static inline uint64_t kv_test_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* The bytes of the entry that `writer` stores for token `pos` of layer `layer`. Distinct
 * (writer, pos, layer) give unrelated bytes. */
static inline void kv_test_pattern(unsigned char *out, size_t nbytes, int64_t writer, int64_t pos,
                                   int32_t layer) {
  uint64_t key = kv_test_mix((uint64_t)writer * 0x9E3779B97F4A7C15ull) ^
                 kv_test_mix((uint64_t)pos + 0x632BE59BD9B4E019ull) ^
                 kv_test_mix((uint64_t)layer * 0xD6E8FEB86659FD93ull + 1);
  for (size_t i = 0; i < nbytes; i += 8) {
    uint64_t word = kv_test_mix(key + i);
    size_t n = nbytes - i < 8 ? nbytes - i : 8;
    memcpy(out + i, &word, n);
  }
}

/* Write writer's pattern into every layer of positions [from, to) of seq. */
static inline void kv_test_write(ina_page_pool_t *pool, const ina_kv_seq_t *seq, int64_t writer,
                                 int64_t from, int64_t to) {
  int32_t page_size = ina_page_pool_page_size(pool);
  size_t nbytes = kv_test_entry_bytes(pool);
  for (int64_t t = from; t < to; t++) {
    int32_t page, slot;
    ina_kv_seq_locate(seq, page_size, t, &page, &slot);
    for (int32_t layer = 0; layer < ina_page_pool_num_layers(pool); layer++)
      kv_test_pattern(ina_page_pool_entry(pool, layer, page, slot), nbytes, writer, t, layer);
  }
}

/* Does the entry of (layer, token t) of seq hold writer's pattern? */
static inline int kv_test_entry_is(ina_page_pool_t *pool, const ina_kv_seq_t *seq, int64_t writer,
                                   int64_t t, int32_t layer) {
  unsigned char expect[256];
  size_t nbytes = kv_test_entry_bytes(pool);
  if (nbytes > sizeof expect) return 0;
  int32_t page, slot;
  ina_kv_seq_locate(seq, ina_page_pool_page_size(pool), t, &page, &slot);
  kv_test_pattern(expect, nbytes, writer, t, layer);
  return memcmp(ina_page_pool_entry(pool, layer, page, slot), expect, nbytes) == 0;
}

/* Does the table describe seqs[0..batch) in FlashInfer's layout? */
static inline int kv_test_table_matches(const ina_page_table_t *table,
                                        const ina_kv_seq_t *const *seqs, int32_t batch,
                                        int32_t page_size) {
  if (table->batch != batch || table->page_size != page_size || table->indptr[0] != 0) return 0;
  if (table->batch_capacity < batch) return 0;
  for (int32_t i = 0; i < batch; i++) {
    const ina_kv_seq_t *seq = seqs[i];
    if (table->indptr[i + 1] - table->indptr[i] != seq->num_pages) return 0;
    for (int32_t p = 0; p < seq->num_pages; p++)
      if (table->indices[table->indptr[i] + p] != seq->pages[p]) return 0;
    /* Tokens in the last page, computed another way: the slot of the last token + 1. */
    int32_t expect_len =
        seq->num_tokens == 0 ? 0 : (int32_t)((seq->num_tokens - 1) % page_size) + 1;
    if (table->last_page_len[i] != expect_len) return 0;
  }
  return table->indices_capacity >= table->indptr[batch];
}

#endif
