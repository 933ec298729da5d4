/* Sequences of KV pages (append with copy on write, fork, truncate) and the batch page
 * tables built from them.
 *
 * Every fallible operation first checks everything that can fail (free pages, array
 * growth) and only then changes the sequence and the pool, so a failure leaves both as
 * they were. */
#define INA_LOG_SUBSYS "kvcache"

#include "kvcache/kv_seq.h"

#include <stdint.h>
#include <stdlib.h>

#include "core/check.h"

/* Pages that hold `tokens` tokens: ceil(tokens / page_size), without overflow. */
static int64_t pages_for_tokens(int64_t tokens, int32_t page_size) {
  return tokens / page_size + (tokens % page_size != 0);
}

/* A sequence whose fields agree with each other (they are public, so a caller could have
 * broken them). */
static int seq_is_consistent(const ina_kv_seq_t *seq, int32_t page_size) {
  return seq->num_tokens >= 0 && seq->num_pages >= 0 && seq->num_pages <= seq->capacity &&
         (seq->num_pages == 0 || seq->pages != NULL) &&
         seq->num_pages == pages_for_tokens(seq->num_tokens, page_size);
}

/* Grow the pages array to hold at least `need` ids, doubling to keep appends amortized
 * O(1). On failure the array is untouched. */
static ina_status_t reserve_pages(ina_kv_seq_t *seq, int32_t need) {
  ina_status_t st = INA_OK;
  if (need <= seq->capacity) return INA_OK;
  int64_t capacity = (int64_t)seq->capacity * 2;
  if (capacity < need) capacity = need;
  if (capacity < 4) capacity = 4;
  if (capacity > INT32_MAX) capacity = INT32_MAX;
  int32_t *grown = realloc(seq->pages, (size_t)capacity * sizeof *grown);
  INA_REQUIRE(grown != NULL, INA_ERR_OUT_OF_MEMORY,
              "kv_seq: out of memory growing the page array to %lld entries", (long long)capacity);
  seq->pages = grown;
  seq->capacity = (int32_t)capacity;
fail:
  return st;
}

/* The last page of seq must be copied before an append writes into it: it is partially
 * filled (so the append's first token lands in it) and other sequences reference it. */
static int last_page_needs_copy(const ina_page_pool_t *pool, const ina_kv_seq_t *seq) {
  int32_t page_size = ina_page_pool_page_size(pool);
  return seq->num_tokens % page_size != 0 &&
         ina_page_pool_refcount(pool, seq->pages[seq->num_pages - 1]) > 1;
}

int32_t ina_kv_seq_stripe(const ina_page_pool_t *pool, const ina_kv_seq_t *seq) {
  const int32_t stripes = ina_page_pool_stripes(pool);
  if (stripes == 1) return 0;
  if (seq->num_pages > 0) return seq->pages[0] % stripes;
  if (seq->stripe_pick > 0 && seq->stripe_pick <= stripes) return seq->stripe_pick - 1;
  return ina_page_pool_roomiest_stripe(pool);
}

int64_t ina_kv_seq_pages_needed(const ina_page_pool_t *pool, const ina_kv_seq_t *seq, int64_t n) {
  if (!pool || !seq || n < 0 || !seq_is_consistent(seq, ina_page_pool_page_size(pool)) ||
      n > INT64_MAX - seq->num_tokens)
    return -1;
  if (n == 0) return 0;
  int32_t page_size = ina_page_pool_page_size(pool);
  int64_t new_pages = pages_for_tokens(seq->num_tokens + n, page_size) - seq->num_pages;
  return new_pages + last_page_needs_copy(pool, seq);
}

ina_status_t ina_kv_seq_append(ina_page_pool_t *pool, ina_kv_seq_t *seq, int64_t n) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(pool != NULL && seq != NULL, INA_ERR_INVALID_ARGUMENT,
              "kv_seq append: pool or sequence is NULL");
  int32_t page_size = ina_page_pool_page_size(pool);
  INA_REQUIRE(seq_is_consistent(seq, page_size), INA_ERR_INVALID_ARGUMENT,
              "kv_seq append: sequence is inconsistent (%lld tokens in %d pages of %d, "
              "capacity %d)",
              (long long)seq->num_tokens, (int)seq->num_pages, (int)page_size, (int)seq->capacity);
  INA_REQUIRE(n >= 0 && n <= INT64_MAX - seq->num_tokens, INA_ERR_INVALID_ARGUMENT,
              "kv_seq append: token count %lld is invalid for a sequence of %lld tokens",
              (long long)n, (long long)seq->num_tokens);
  if (n == 0) return INA_OK;

  int64_t new_pages = pages_for_tokens(seq->num_tokens + n, page_size) - seq->num_pages;
  int copy_last = last_page_needs_copy(pool, seq);
  const int32_t stripe = ina_kv_seq_stripe(pool, seq);
  int32_t num_free = ina_page_pool_stripe_free(pool, stripe);
  INA_REQUIRE(new_pages + copy_last <= num_free, INA_ERR_OUT_OF_PAGES,
              "kv_seq append: %lld tokens need %lld pages (%lld new%s), only %d of %d free%s",
              (long long)n, (long long)(new_pages + copy_last), (long long)new_pages,
              copy_last ? " + 1 copy on write" : "", (int)num_free, (int)ina_page_pool_num_pages(pool),
              ina_page_pool_stripes(pool) > 1 ? " in the sequence's stripe" : "");
  /* From here the page count fits in int32: it is at most the pool's size. */
  int32_t old_pages = seq->num_pages;
  int32_t total_pages = old_pages + (int32_t)new_pages;
  INA_CHECK(reserve_pages(seq, total_pages));

  int32_t fresh_last = -1;
  if (copy_last) INA_CHECK(ina_page_pool_alloc_in(pool, stripe, 1, &fresh_last));
  ina_status_t alloc_st = ina_page_pool_alloc_in(pool, stripe, (int32_t)new_pages, seq->pages + old_pages);
  if (alloc_st != INA_OK) {
    /* Cannot happen after the free-page check above; undo the copy page anyway. */
    if (copy_last) ina_page_pool_unref(pool, fresh_last);
    INA_CHECK(alloc_st);
  }
  if (copy_last) {
    int32_t shared = seq->pages[old_pages - 1];
    ina_page_pool_copy(pool, shared, fresh_last, (int32_t)(seq->num_tokens % page_size));
    ina_page_pool_unref(pool, shared);
    seq->pages[old_pages - 1] = fresh_last;
  }
  seq->num_pages = total_pages;
  seq->num_tokens += n;
fail:
  return st;
}

void ina_kv_seq_truncate(ina_page_pool_t *pool, ina_kv_seq_t *seq, int64_t n) {
  int32_t page_size = ina_page_pool_page_size(pool);
  if (n < 0 || n > seq->num_tokens || !seq_is_consistent(seq, page_size)) {
    ina_error(INA_LOG_SUBSYS,
              "kv_seq truncate: cannot drop %lld tokens from a sequence of %lld tokens in %d "
              "pages; ignored",
              (long long)n, (long long)seq->num_tokens, (int)seq->num_pages);
    return;
  }
  int64_t tokens = seq->num_tokens - n;
  int32_t keep = (int32_t)pages_for_tokens(tokens, page_size);
  while (seq->num_pages > keep) ina_page_pool_unref(pool, seq->pages[--seq->num_pages]);
  seq->num_tokens = tokens;
}

ina_status_t ina_kv_seq_fork(ina_page_pool_t *pool, const ina_kv_seq_t *src, int64_t prefix,
                             ina_kv_seq_t *dst) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(pool != NULL && src != NULL && dst != NULL, INA_ERR_INVALID_ARGUMENT,
              "kv_seq fork: pool, source or destination is NULL");
  INA_REQUIRE(src != dst, INA_ERR_INVALID_ARGUMENT,
              "kv_seq fork: source and destination are "
              "the same sequence");
  int32_t page_size = ina_page_pool_page_size(pool);
  INA_REQUIRE(seq_is_consistent(src, page_size), INA_ERR_INVALID_ARGUMENT,
              "kv_seq fork: source sequence is inconsistent (%lld tokens in %d pages of %d)",
              (long long)src->num_tokens, (int)src->num_pages, (int)page_size);
  INA_REQUIRE(dst->num_tokens == 0 && dst->num_pages == 0, INA_ERR_INVALID_ARGUMENT,
              "kv_seq fork: destination is not empty (%lld tokens in %d pages)",
              (long long)dst->num_tokens, (int)dst->num_pages);
  INA_REQUIRE(prefix >= 0 && prefix <= src->num_tokens, INA_ERR_INVALID_ARGUMENT,
              "kv_seq fork: prefix %lld outside [0, %lld]", (long long)prefix,
              (long long)src->num_tokens);

  int32_t shared = (int32_t)pages_for_tokens(prefix, page_size);
  INA_CHECK(reserve_pages(dst, shared));
  for (int32_t i = 0; i < shared; i++) {
    dst->pages[i] = src->pages[i];
    ina_page_pool_ref(pool, src->pages[i]);
  }
  dst->num_pages = shared;
  dst->num_tokens = prefix;
fail:
  return st;
}

void ina_kv_seq_release(ina_page_pool_t *pool, ina_kv_seq_t *seq) {
  if (!seq) return;
  /* Reverse order, so the pool's free stack hands the pages out again in sequence order. */
  while (seq->num_pages > 0) ina_page_pool_unref(pool, seq->pages[--seq->num_pages]);
  free(seq->pages);
  *seq = (ina_kv_seq_t)INA_KV_SEQ_INIT;
}

void ina_kv_seq_locate(const ina_kv_seq_t *seq, int32_t page_size, int64_t t, int32_t *page,
                       int32_t *slot) {
  if (t < 0 || t >= seq->num_tokens || page_size < 1 || t / page_size >= seq->num_pages) {
    ina_error(INA_LOG_SUBSYS,
              "kv_seq locate: token %lld outside a sequence of %lld tokens (page_size %d)",
              (long long)t, (long long)seq->num_tokens, (int)page_size);
    *page = -1;
    *slot = -1;
    return;
  }
  *page = seq->pages[t / page_size];
  *slot = (int32_t)(t % page_size);
}

/* Grow an int32 array to `need` entries (at least doubling); *capacity is updated only on
 * success, so a failure leaves the array and its contents valid. */
static ina_status_t grow_array(int32_t **array, int32_t *capacity, int64_t need, const char *what) {
  ina_status_t st = INA_OK;
  if (need <= *capacity) return INA_OK;
  int64_t grown_capacity = (int64_t)*capacity * 2;
  if (grown_capacity < need) grown_capacity = need;
  if (grown_capacity > INT32_MAX) grown_capacity = INT32_MAX;
  int32_t *grown = realloc(*array, (size_t)grown_capacity * sizeof *grown);
  INA_REQUIRE(grown != NULL, INA_ERR_OUT_OF_MEMORY,
              "page table: out of memory growing %s to %lld entries", what,
              (long long)grown_capacity);
  *array = grown;
  *capacity = (int32_t)grown_capacity;
fail:
  return st;
}

ina_status_t ina_page_table_build(ina_page_table_t *table, const ina_kv_seq_t *const *seqs,
                                  int32_t batch, int32_t page_size) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(table != NULL, INA_ERR_INVALID_ARGUMENT, "page table build: table is NULL");
  INA_REQUIRE(batch >= 0 && batch < INT32_MAX, INA_ERR_INVALID_ARGUMENT,
              "page table build: batch %d is invalid", (int)batch);
  INA_REQUIRE(batch == 0 || seqs != NULL, INA_ERR_INVALID_ARGUMENT,
              "page table build: sequence array is NULL for a batch of %d", (int)batch);
  INA_REQUIRE(page_size >= 1, INA_ERR_INVALID_ARGUMENT,
              "page table build: page_size %d must be >= 1", (int)page_size);
  int64_t total_pages = 0;
  for (int32_t i = 0; i < batch; i++) {
    INA_REQUIRE(seqs[i] != NULL, INA_ERR_INVALID_ARGUMENT,
                "page table build: sequence %d of %d is NULL", (int)i, (int)batch);
    INA_REQUIRE(seq_is_consistent(seqs[i], page_size), INA_ERR_INVALID_ARGUMENT,
                "page table build: sequence %d is inconsistent (%lld tokens in %d pages of %d)",
                (int)i, (long long)seqs[i]->num_tokens, (int)seqs[i]->num_pages, (int)page_size);
    total_pages += seqs[i]->num_pages;
    INA_REQUIRE(total_pages <= INT32_MAX, INA_ERR_INVALID_ARGUMENT,
                "page table build: more than %d pages in a batch of %d", (int)INT32_MAX,
                (int)batch);
  }

  /* indptr has one entry more than the batch; batch_capacity counts sequences. */
  int32_t indptr_capacity = table->batch_capacity > 0 ? table->batch_capacity + 1 : 0;
  int32_t last_len_capacity = table->batch_capacity;
  INA_CHECK(grow_array(&table->indptr, &indptr_capacity, (int64_t)batch + 1, "indptr"));
  INA_CHECK(grow_array(&table->last_page_len, &last_len_capacity, batch, "last_page_len"));
  table->batch_capacity =
      indptr_capacity - 1 < last_len_capacity ? indptr_capacity - 1 : last_len_capacity;
  INA_CHECK(grow_array(&table->indices, &table->indices_capacity, total_pages, "indices"));

  table->batch = batch;
  table->page_size = page_size;
  table->indptr[0] = 0;
  for (int32_t i = 0; i < batch; i++) {
    const ina_kv_seq_t *seq = seqs[i];
    int32_t start = table->indptr[i];
    for (int32_t p = 0; p < seq->num_pages; p++) table->indices[start + p] = seq->pages[p];
    table->indptr[i + 1] = start + seq->num_pages;
    table->last_page_len[i] =
        seq->num_pages == 0
            ? 0
            : (int32_t)(seq->num_tokens - (int64_t)(seq->num_pages - 1) * page_size);
  }
fail:
  return st;
}

void ina_page_table_release(ina_page_table_t *table) {
  if (!table) return;
  free(table->indptr);
  free(table->indices);
  free(table->last_page_len);
  *table = (ina_page_table_t)INA_PAGE_TABLE_INIT;
}
