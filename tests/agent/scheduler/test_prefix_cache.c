/* The scheduler's prefix cache on a bare page pool: page-aligned chained matching, LRU
 * eviction of unused leaves only, page references, capacity, and a random workload in
 * which every page the cache hands out must still hold the tokens it was cached for. */
#include "../../test_util.h"
#include "core/log.h"
#include "kvcache/kv_seq.h"
#include "kvcache/page_pool.h"
#include "agent/scheduler/prefix_cache.h"

#define PS 4

static ina_page_pool_t *make_pool(int32_t num_pages) {
  ina_page_pool_config_t c = INA_PAGE_POOL_CONFIG_INIT;
  c.page_size = PS;
  c.num_pages = num_pages;
  c.num_layers = 1;
  c.entry_elems = 1;
  c.dtype = INA_DTYPE_F32;
  ina_page_pool_t *pool = NULL;
  CHECK_OK(ina_page_pool_create(&c, &pool));
  if (!pool) exit(1);
  return pool;
}

/* A sequence holding `n` tokens whose entries store the token ids. 0 when out of pages. */
static int make_seq(ina_page_pool_t *pool, const int32_t *tokens, int32_t n, ina_kv_seq_t *seq) {
  *seq = (ina_kv_seq_t)INA_KV_SEQ_INIT;
  if (ina_kv_seq_pages_needed(pool, seq, n) > ina_page_pool_free_pages(pool)) return 0;
  CHECK_OK(ina_kv_seq_append(pool, seq, n));
  for (int32_t t = 0; t < n; t++) {
    int32_t page, slot;
    ina_kv_seq_locate(seq, PS, t, &page, &slot);
    *(float *)ina_page_pool_entry(pool, 0, page, slot) = (float)tokens[t];
  }
  return 1;
}

/* The pages hold exactly these tokens. */
static int pages_hold(ina_page_pool_t *pool, const int32_t *pages, int32_t n, const int32_t *tokens) {
  for (int32_t p = 0; p < n; p++) {
    if (ina_page_pool_refcount(pool, pages[p]) < 1) return 0;
    for (int32_t s = 0; s < PS; s++)
      if (*(float *)ina_page_pool_entry(pool, 0, pages[p], s) != (float)tokens[p * PS + s]) return 0;
  }
  return 1;
}

static void test_basics(void) {
  ina_page_pool_t *pool = make_pool(32);
  ina_prefix_cache_t *c = NULL;
  CHECK_OK(ina_prefix_cache_create(pool, 8, &c));
  const int32_t a[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  int32_t got[8];
  ina_kv_seq_t seq;
  CHECK(make_seq(pool, a, 16, &seq));
  CHECK(ina_prefix_cache_match(c, a, 4, got) == 0);
  ina_prefix_cache_insert(c, a, 4, seq.pages);
  CHECK(ina_prefix_cache_num_pages(c) == 4);
  for (int32_t p = 0; p < 4; p++) CHECK(ina_page_pool_refcount(pool, seq.pages[p]) == 2);
  ina_prefix_cache_insert(c, a, 4, seq.pages); /* again: nothing new */
  CHECK(ina_prefix_cache_num_pages(c) == 4 && ina_page_pool_refcount(pool, seq.pages[0]) == 2);

  CHECK(ina_prefix_cache_match(c, a, 4, got) == 4 && memcmp(got, seq.pages, 4 * sizeof(int32_t)) == 0);
  CHECK(ina_prefix_cache_match(c, a, 2, got) == 2);
  int32_t b[16];
  memcpy(b, a, sizeof b);
  b[13] = 99; /* last block differs */
  CHECK(ina_prefix_cache_match(c, b, 4, got) == 3);
  b[0] = 99; /* first block differs: nothing after it counts */
  CHECK(ina_prefix_cache_match(c, b, 4, got) == 0);
  /* The same block at another position is another block. */
  CHECK(ina_prefix_cache_match(c, a + 4, 3, got) == 0);

  /* In use by the sequence: nothing to reclaim. */
  CHECK(ina_prefix_cache_reclaimable(c) == 0 && ina_prefix_cache_evict(c, 4) == 0);
  const int32_t free_before = ina_page_pool_free_pages(pool);
  ina_kv_seq_release(pool, &seq);
  CHECK(ina_page_pool_free_pages(pool) == free_before); /* the cache still holds them */
  CHECK(ina_prefix_cache_reclaimable(c) == 4);
  CHECK(ina_prefix_cache_evict(c, 1) == 1); /* the leaf: the last block */
  CHECK(ina_page_pool_free_pages(pool) == free_before + 1);
  CHECK(ina_prefix_cache_match(c, a, 4, got) == 3);

  /* LRU: a second prompt, then a to touch a: the second prompt goes first. */
  const int32_t d[8] = {50, 51, 52, 53, 54, 55, 56, 57};
  CHECK(make_seq(pool, d, 8, &seq));
  ina_prefix_cache_insert(c, d, 2, seq.pages);
  ina_kv_seq_release(pool, &seq);
  CHECK(ina_prefix_cache_match(c, a, 3, got) == 3);
  CHECK(ina_prefix_cache_evict(c, 2) == 2);
  CHECK(ina_prefix_cache_match(c, d, 2, got) == 0 && ina_prefix_cache_match(c, a, 3, got) == 3);

  /* A used child keeps its unused parent: the parent cannot go first. */
  ina_prefix_cache_match(c, a, 3, got);
  ina_page_pool_ref(pool, got[2]);
  CHECK(ina_prefix_cache_reclaimable(c) == 0 && ina_prefix_cache_evict(c, 3) == 0);
  ina_page_pool_unref(pool, got[2]);
  CHECK(ina_prefix_cache_reclaimable(c) == 3);

  /* Capacity 8: three prompts of 4 blocks keep at most 8 blocks, the latest whole. */
  for (int k = 0; k < 3; k++) {
    int32_t e[16];
    for (int32_t i = 0; i < 16; i++) e[i] = 100 * (k + 1) + i;
    CHECK(make_seq(pool, e, 16, &seq));
    ina_prefix_cache_insert(c, e, 4, seq.pages);
    ina_kv_seq_release(pool, &seq);
    CHECK(ina_prefix_cache_num_pages(c) <= 8);
    CHECK(ina_prefix_cache_match(c, e, 4, got) == 4 && pages_hold(pool, got, 4, e));
  }
  CHECK_OK(ina_page_pool_check(pool));
  ina_prefix_cache_clear(c);
  CHECK(ina_prefix_cache_num_pages(c) == 0 && ina_page_pool_free_pages(pool) == 32);
  ina_prefix_cache_destroy(c);
  ina_prefix_cache_destroy(NULL);
  ina_page_pool_destroy(pool);
}

/* Random prompts over a tiny alphabet (so prefixes are shared often), live sequences
 * coming and going, evictions when the pool is short: every match returns pages that
 * hold the queried tokens, and the bookkeeping stays sound. */
static void test_random(test_rng_t *rng) {
  enum { PAGES = 40, LIVE = 4 };
  ina_page_pool_t *pool = make_pool(PAGES);
  ina_prefix_cache_t *c = NULL;
  const int32_t capacity = (int32_t)test_rng_int(rng, 4, 24);
  CHECK_OK(ina_prefix_cache_create(pool, capacity, &c));
  ina_kv_seq_t live[LIVE];
  for (int i = 0; i < LIVE; i++) live[i] = (ina_kv_seq_t)INA_KV_SEQ_INIT;
  int64_t hits = 0, bad = 0;
  for (int iter = 0; iter < 400; iter++) {
    int32_t tokens[32], got[8];
    const int32_t n = (int32_t)test_rng_int(rng, 1, 32);
    for (int32_t i = 0; i < n; i++) tokens[i] = (int32_t)test_rng_int(rng, 0, 2);
    const int32_t m = ina_prefix_cache_match(c, tokens, n / PS, got);
    hits += m;
    bad += !pages_hold(pool, got, m, tokens);
    if (test_rng_int(rng, 0, 1) == 0) continue; /* a lookup only */
    const int slot = (int)test_rng_int(rng, 0, LIVE - 1);
    ina_kv_seq_release(pool, &live[slot]);
    const int32_t need = (n + PS - 1) / PS;
    if (need > ina_page_pool_free_pages(pool)) {
      const int32_t shortfall = need - ina_page_pool_free_pages(pool);
      const int32_t reclaimable = ina_prefix_cache_reclaimable(c);
      const int32_t freed = ina_prefix_cache_evict(c, shortfall);
      CHECK(freed == (reclaimable < shortfall ? reclaimable : shortfall));
    }
    if (!make_seq(pool, tokens, n, &live[slot])) continue;
    ina_prefix_cache_insert(c, tokens, n / PS, live[slot].pages);
    CHECK(ina_prefix_cache_num_pages(c) <= capacity);
  }
  CHECKF(bad == 0, "%lld matches returned pages holding other tokens", (long long)bad);
  CHECK(hits > 0);
  CHECK_OK(ina_page_pool_check(pool));
  for (int i = 0; i < LIVE; i++) ina_kv_seq_release(pool, &live[i]);
  CHECK(ina_prefix_cache_reclaimable(c) == ina_prefix_cache_num_pages(c));
  ina_prefix_cache_destroy(c);
  CHECK(ina_page_pool_free_pages(pool) == PAGES);
  ina_page_pool_destroy(pool);
}

int main(void) {
  test_rng_t rng = {test_seed("test_prefix_cache")};
  test_basics();
  for (int round = 0; round < 5; round++) test_random(&rng);
  return test_finish("test_prefix_cache");
}
