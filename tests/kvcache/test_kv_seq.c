/* kv_seq: fixed cases of append, locate, fork at chosen prefixes, copy on write,
 * truncate, running out of pages (with rollback) and page tables, over several page
 * sizes. The randomized model check lives in test_kvcache.c. */

#include "tests/test_util.h"

#include <stdint.h>

#include "core/log.h"
#include "kvcache/kv_seq.h"
#include "kvcache/page_pool.h"
#include "tests/kvcache/kv_test_util.h"

#define MAX_SNAPSHOT_PAGES 64

/* Everything observable about one sequence and the pool, to prove a failed call changed
 * nothing. */
typedef struct {
  ina_kv_seq_t seq;
  int32_t pages[MAX_SNAPSHOT_PAGES];
  int32_t refcount[MAX_SNAPSHOT_PAGES];
  int32_t free_pages;
} snapshot_t;

static snapshot_t take_snapshot(const ina_page_pool_t *pool, const ina_kv_seq_t *seq) {
  snapshot_t s;
  memset(&s, 0, sizeof s);
  s.seq = *seq;
  for (int32_t i = 0; i < seq->num_pages && i < MAX_SNAPSHOT_PAGES; i++) s.pages[i] = seq->pages[i];
  for (int32_t p = 0; p < ina_page_pool_num_pages(pool) && p < MAX_SNAPSHOT_PAGES; p++)
    s.refcount[p] = ina_page_pool_refcount(pool, p);
  s.free_pages = ina_page_pool_free_pages(pool);
  return s;
}

static int same_as_snapshot(const ina_page_pool_t *pool, const ina_kv_seq_t *seq,
                            const snapshot_t *s) {
  snapshot_t now = take_snapshot(pool, seq);
  return memcmp(&now, s, sizeof now) == 0;
}

static int64_t pages_for(int64_t tokens, int32_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

/* Every position of seq holds the pattern of writers[pos] in every layer. */
static int seq_reads(ina_page_pool_t *pool, const ina_kv_seq_t *seq, const int64_t *writers) {
  for (int64_t t = 0; t < seq->num_tokens; t++)
    for (int32_t l = 0; l < ina_page_pool_num_layers(pool); l++)
      if (!kv_test_entry_is(pool, seq, writers[t], t, l)) return 0;
  return 1;
}

static void fill_writers(int64_t *writers, int64_t from, int64_t to, int64_t writer) {
  for (int64_t t = from; t < to; t++) writers[t] = writer;
}

static void test_append_and_locate(int32_t ps) {
  const int32_t num_pages = 12;
  ina_page_pool_t *pool = kv_test_pool(ps, num_pages, 2, 4, INA_DTYPE_F32);
  ina_kv_seq_t seq = INA_KV_SEQ_INIT;
  const int64_t steps[] = {0, 1, ps - 1, 1, 0, 3 * (int64_t)ps + 1, ps};
  int64_t tokens = 0;
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    int64_t n = steps[i];
    CHECK(ina_kv_seq_pages_needed(pool, &seq, n) == pages_for(tokens + n, ps) - seq.num_pages);
    CHECK_OK(ina_kv_seq_append(pool, &seq, n));
    kv_test_write(pool, &seq, 1, tokens, tokens + n);
    tokens += n;
    CHECK(seq.num_tokens == tokens);
    CHECK(seq.num_pages == pages_for(tokens, ps));
    CHECK(seq.capacity >= seq.num_pages);
    CHECK(ina_page_pool_free_pages(pool) == num_pages - seq.num_pages);
  }
  for (int64_t t = 0; t < tokens; t++) {
    int32_t page, slot;
    ina_kv_seq_locate(&seq, ps, t, &page, &slot);
    CHECK(page == seq.pages[t / ps] && slot == t % ps);
    CHECK(kv_test_entry_is(pool, &seq, 1, t, 0) && kv_test_entry_is(pool, &seq, 1, t, 1));
  }
  for (int32_t i = 0; i < seq.num_pages; i++)
    for (int32_t j = 0; j < i; j++) CHECK(seq.pages[i] != seq.pages[j]);

  int32_t page = 0, slot = 0;
  ina_log_set_quiet_errors(1);
  ina_kv_seq_locate(&seq, ps, tokens, &page, &slot);
  CHECK(page == -1 && slot == -1);
  ina_kv_seq_locate(&seq, ps, -1, &page, &slot);
  CHECK(page == -1 && slot == -1);
  snapshot_t before = take_snapshot(pool, &seq);
  CHECK(ina_kv_seq_append(pool, &seq, -1) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_kv_seq_append(pool, &seq, INT64_MAX) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_kv_seq_pages_needed(pool, &seq, -1) == -1);
  ina_log_set_quiet_errors(0);
  CHECK(same_as_snapshot(pool, &seq, &before));

  ina_kv_seq_release(pool, &seq);
  CHECK(seq.pages == NULL && seq.num_pages == 0 && seq.capacity == 0 && seq.num_tokens == 0);
  CHECK(ina_page_pool_free_pages(pool) == num_pages);
  ina_kv_seq_release(pool, &seq); /* already empty */
  ina_kv_seq_release(pool, NULL);
  CHECK(ina_page_pool_free_pages(pool) == num_pages);
  CHECK_OK(ina_page_pool_check(pool));
  ina_page_pool_destroy(pool);
}

/* A child forked at the parent's full length shares a partial last page; its first
 * append must copy that page and leave the parent's slots alone. */
static void test_copy_on_write(int32_t ps) {
  if (ps < 2) return; /* with one token per page no page is ever partially filled */
  ina_page_pool_t *pool = kv_test_pool(ps, 8, 3, 5, INA_DTYPE_BF16);
  ina_kv_seq_t parent = INA_KV_SEQ_INIT, child = INA_KV_SEQ_INIT;
  int64_t parent_w[256], child_w[256];
  const int64_t len = ps + 1;
  CHECK_OK(ina_kv_seq_append(pool, &parent, len));
  kv_test_write(pool, &parent, 1, 0, len);
  fill_writers(parent_w, 0, len, 1);

  /* The slot the child's next token would hit if it wrote in place. */
  const size_t nbytes = kv_test_entry_bytes(pool);
  int32_t shared_last = parent.pages[1];
  for (int32_t l = 0; l < 3; l++)
    kv_test_pattern(ina_page_pool_entry(pool, l, shared_last, 1), nbytes, 99, len, l);

  CHECK_OK(ina_kv_seq_fork(pool, &parent, len, &child));
  fill_writers(child_w, 0, len, 1);
  CHECK(child.num_tokens == len && child.num_pages == 2);
  CHECK(child.pages[0] == parent.pages[0] && child.pages[1] == parent.pages[1]);
  CHECK(ina_page_pool_refcount(pool, shared_last) == 2);
  CHECK(ina_kv_seq_pages_needed(pool, &child, 1) == 1); /* the copy, no new page */
  CHECK(ina_kv_seq_pages_needed(pool, &child, 0) == 0);

  CHECK_OK(ina_kv_seq_append(pool, &child, 0)); /* writes nothing, copies nothing */
  CHECK(child.pages[1] == shared_last && ina_page_pool_free_pages(pool) == 6);

  CHECK_OK(ina_kv_seq_append(pool, &child, 1));
  kv_test_write(pool, &child, 2, len, len + 1);
  child_w[len] = 2;
  CHECK(child.pages[0] == parent.pages[0]);
  CHECK(child.pages[1] != shared_last && parent.pages[1] == shared_last);
  CHECK(ina_page_pool_refcount(pool, shared_last) == 1);
  CHECK(ina_page_pool_refcount(pool, child.pages[1]) == 1);
  CHECK(ina_page_pool_refcount(pool, parent.pages[0]) == 2);
  CHECK(ina_page_pool_free_pages(pool) == 5);
  CHECK(seq_reads(pool, &parent, parent_w));
  CHECK(seq_reads(pool, &child, child_w));
  int sentinel_ok = 1;
  for (int32_t l = 0; l < 3; l++) {
    unsigned char expect[64];
    kv_test_pattern(expect, nbytes, 99, len, l);
    sentinel_ok &= memcmp(ina_page_pool_entry(pool, l, shared_last, 1), expect, nbytes) == 0;
  }
  CHECK(sentinel_ok);

  /* The parent's last page is its own again: appends write in place. */
  CHECK(ina_kv_seq_pages_needed(pool, &parent, 1) == 0);
  CHECK_OK(ina_kv_seq_append(pool, &parent, 1));
  CHECK(parent.pages[1] == shared_last);
  kv_test_write(pool, &parent, 1, len, len + 1);
  parent_w[len] = 1;
  CHECK(seq_reads(pool, &parent, parent_w));
  CHECK(seq_reads(pool, &child, child_w));

  ina_kv_seq_release(pool, &parent);
  CHECK(seq_reads(pool, &child, child_w));
  CHECK(ina_page_pool_refcount(pool, child.pages[0]) == 1);
  ina_kv_seq_release(pool, &child);
  CHECK(ina_page_pool_free_pages(pool) == 8);
  CHECK_OK(ina_page_pool_check(pool));
  ina_page_pool_destroy(pool);
}

static void test_fork_prefixes(int32_t ps) {
  const int32_t num_pages = 16;
  ina_page_pool_t *pool = kv_test_pool(ps, num_pages, 2, 3, INA_DTYPE_I32);
  ina_kv_seq_t parent = INA_KV_SEQ_INIT;
  const int64_t len = 3 * (int64_t)ps + ps / 2;
  int64_t parent_w[512], child_w[512];
  CHECK_OK(ina_kv_seq_append(pool, &parent, len));
  kv_test_write(pool, &parent, 1, 0, len);
  fill_writers(parent_w, 0, len, 1);

  const int64_t prefixes[] = {0, 1, ps - 1, ps, ps + ps / 2, 2 * (int64_t)ps, len - 1, len};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
    int64_t prefix = prefixes[i];
    if (prefix < 0 || prefix > len) continue;
    ina_kv_seq_t child = INA_KV_SEQ_INIT;
    CHECK_OK(ina_kv_seq_fork(pool, &parent, prefix, &child));
    int32_t shared = (int32_t)pages_for(prefix, ps);
    CHECK(child.num_tokens == prefix && child.num_pages == shared);
    CHECK(ina_page_pool_free_pages(pool) == num_pages - parent.num_pages);
    for (int32_t p = 0; p < parent.num_pages; p++) {
      CHECK(p >= shared || child.pages[p] == parent.pages[p]);
      CHECK(ina_page_pool_refcount(pool, parent.pages[p]) == (p < shared ? 2 : 1));
    }
    /* One token more always takes exactly one page: a fresh page after a full one, or
     * the copy of the shared partial one. */
    CHECK(ina_kv_seq_pages_needed(pool, &child, 1) == 1);
    CHECK_OK(ina_kv_seq_append(pool, &child, 1));
    kv_test_write(pool, &child, 2, prefix, prefix + 1);
    fill_writers(child_w, 0, prefix, 1);
    child_w[prefix] = 2;
    CHECK(seq_reads(pool, &child, child_w));
    CHECK(seq_reads(pool, &parent, parent_w));
    if (prefix % ps != 0) {
      CHECK(child.pages[shared - 1] != parent.pages[shared - 1]);
      CHECK(ina_page_pool_refcount(pool, parent.pages[shared - 1]) == 1);
    }
    CHECK(ina_page_pool_free_pages(pool) == num_pages - parent.num_pages - 1);
    ina_kv_seq_release(pool, &child);
    for (int32_t p = 0; p < parent.num_pages; p++)
      CHECK(ina_page_pool_refcount(pool, parent.pages[p]) == 1);
  }

  /* Misuse: nothing changes. */
  ina_kv_seq_t dst = INA_KV_SEQ_INIT;
  CHECK_OK(ina_kv_seq_append(pool, &dst, 1));
  snapshot_t parent_before = take_snapshot(pool, &parent);
  snapshot_t dst_before = take_snapshot(pool, &dst);
  ina_log_set_quiet_errors(1);
  CHECK(ina_kv_seq_fork(pool, &parent, 1, &dst) == INA_ERR_INVALID_ARGUMENT); /* not empty */
  ina_kv_seq_t empty = INA_KV_SEQ_INIT;
  CHECK(ina_kv_seq_fork(pool, &parent, len + 1, &empty) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "prefix") != NULL);
  CHECK(ina_kv_seq_fork(pool, &parent, -1, &empty) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_kv_seq_fork(pool, &parent, 0, &parent) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK(same_as_snapshot(pool, &parent, &parent_before));
  CHECK(same_as_snapshot(pool, &dst, &dst_before));
  CHECK(empty.pages == NULL && empty.num_tokens == 0);

  /* A sequence truncated to empty keeps its array and can receive a fork. */
  ina_kv_seq_truncate(pool, &dst, 1);
  CHECK(dst.num_pages == 0 && dst.num_tokens == 0 && dst.capacity > 0);
  CHECK_OK(ina_kv_seq_fork(pool, &parent, len, &dst));
  CHECK(seq_reads(pool, &dst, parent_w));
  ina_kv_seq_release(pool, &dst);
  ina_kv_seq_release(pool, &parent);
  CHECK(ina_page_pool_free_pages(pool) == num_pages);
  CHECK_OK(ina_page_pool_check(pool));
  ina_page_pool_destroy(pool);
}

/* Truncating back into a shared page and appending again must copy it first. */
static void test_truncate(int32_t ps) {
  const int32_t num_pages = 10;
  ina_page_pool_t *pool = kv_test_pool(ps, num_pages, 1, 2, INA_DTYPE_FP8_E4M3);
  ina_kv_seq_t parent = INA_KV_SEQ_INIT, child = INA_KV_SEQ_INIT;
  int64_t parent_w[256], child_w[256];
  const int64_t len = 2 * (int64_t)ps;
  CHECK_OK(ina_kv_seq_append(pool, &parent, len));
  kv_test_write(pool, &parent, 1, 0, len);
  fill_writers(parent_w, 0, len, 1);
  fill_writers(child_w, 0, len, 1);
  CHECK_OK(ina_kv_seq_fork(pool, &parent, len, &child));

  int64_t cut = ps > 1 ? ps - 1 : 1; /* leaves ps + 1 tokens, or 1 for ps = 1 */
  ina_kv_seq_truncate(pool, &parent, cut);
  CHECK(parent.num_tokens == len - cut && parent.num_pages == pages_for(len - cut, ps));
  int32_t last = parent.pages[parent.num_pages - 1];
  int partial = (len - cut) % ps != 0;
  CHECK(ina_kv_seq_pages_needed(pool, &parent, 1) == 1);
  CHECK_OK(ina_kv_seq_append(pool, &parent, 1));
  kv_test_write(pool, &parent, 3, len - cut, len - cut + 1);
  parent_w[len - cut] = 3;
  if (partial) CHECK(parent.pages[parent.num_pages - 1] != last);
  CHECK(seq_reads(pool, &parent, parent_w));
  CHECK(seq_reads(pool, &child, child_w)); /* still reads writer 1 at len - cut */

  snapshot_t before = take_snapshot(pool, &parent);
  ina_kv_seq_truncate(pool, &parent, 0);
  CHECK(same_as_snapshot(pool, &parent, &before));
  ina_log_set_quiet_errors(1);
  ina_kv_seq_truncate(pool, &parent, parent.num_tokens + 1);
  CHECK(strstr(ina_last_error(), "truncate") != NULL);
  ina_kv_seq_truncate(pool, &parent, -1);
  ina_log_set_quiet_errors(0);
  CHECK(same_as_snapshot(pool, &parent, &before));

  ina_kv_seq_truncate(pool, &child, child.num_tokens);
  CHECK(child.num_tokens == 0 && child.num_pages == 0);
  CHECK(ina_page_pool_free_pages(pool) == num_pages - parent.num_pages);
  for (int32_t p = 0; p < parent.num_pages; p++)
    CHECK(ina_page_pool_refcount(pool, parent.pages[p]) == 1);
  ina_kv_seq_release(pool, &child);
  ina_kv_seq_release(pool, &parent);
  CHECK(ina_page_pool_free_pages(pool) == num_pages);
  CHECK_OK(ina_page_pool_check(pool));
  ina_page_pool_destroy(pool);
}

/* A failed append, because of new pages or of a copy on write, changes nothing; freeing
 * pages makes the same request succeed. */
/* Sequences of a striped pool keep every page in one stripe: the one picked, or the
 * roomiest; through appends, a copy on write of a shared first page, and forks. A full
 * stripe refuses an append while others have pages. */
static void test_stripes(void) {
  ina_page_pool_config_t c = INA_PAGE_POOL_CONFIG_INIT;
  c.page_size = 4;
  c.num_pages = 12; /* stripes of pages {0,3,6,9}, {1,4,7,10}, {2,5,8,11} */
  c.entry_elems = 2;
  c.stripes = 3;
  c.store_entries = 0;
  ina_page_pool_t *pool = NULL;
  CHECK_OK(ina_page_pool_create(&c, &pool));
  if (!pool) return;
  ina_kv_seq_t a = INA_KV_SEQ_INIT, b = INA_KV_SEQ_INIT, d = INA_KV_SEQ_INIT;
  a.stripe_pick = 1 + 2;
  CHECK(ina_kv_seq_stripe(pool, &a) == 2);
  CHECK_OK(ina_kv_seq_append(pool, &a, 6)); /* 2 pages of stripe 2 */
  CHECK(a.num_pages == 2 && a.pages[0] % 3 == 2 && a.pages[1] % 3 == 2);
  CHECK(ina_page_pool_stripe_free(pool, 2) == 2);
  /* No pick: the roomiest stripe (0, the lowest of the two with 4 free). */
  CHECK_OK(ina_kv_seq_append(pool, &b, 2));
  CHECK(b.pages[0] % 3 == 0);
  /* A fork of a's first 6 tokens shares a partial last page: its copy on write comes
   * from a's stripe. */
  CHECK_OK(ina_kv_seq_fork(pool, &a, 6, &d));
  CHECK_OK(ina_kv_seq_append(pool, &d, 1));
  CHECK(d.num_pages == 2 && d.pages[1] != a.pages[1] && d.pages[1] % 3 == 2 && ina_kv_seq_stripe(pool, &d) == 2);
  CHECK(ina_page_pool_stripe_free(pool, 2) == 1);
  ina_log_set_quiet_errors(1);
  CHECK(ina_kv_seq_append(pool, &a, 7) == INA_ERR_OUT_OF_PAGES); /* 2 new pages, 1 left in stripe 2 */
  CHECKF(strstr(ina_last_error(), "in the sequence's stripe") != NULL, "message: %s", ina_last_error());
  ina_log_set_quiet_errors(0);
  CHECK(a.num_tokens == 6 && ina_page_pool_free_pages(pool) == 12 - 4); /* a 2, b 1, d 1 of its own */
  CHECK_OK(ina_page_pool_check(pool));
  ina_kv_seq_release(pool, &a);
  ina_kv_seq_release(pool, &b);
  ina_kv_seq_release(pool, &d);
  CHECK(ina_page_pool_free_pages(pool) == 12 && a.stripe_pick == 0);
  ina_page_pool_destroy(pool);
}

static void test_out_of_pages(void) {
  const int32_t ps = 4, num_pages = 4;
  ina_page_pool_t *pool = kv_test_pool(ps, num_pages, 2, 2, INA_DTYPE_F32);
  ina_kv_seq_t a = INA_KV_SEQ_INIT, b = INA_KV_SEQ_INIT, c = INA_KV_SEQ_INIT;
  int64_t a_w[16];
  CHECK_OK(ina_kv_seq_append(pool, &a, 16));
  kv_test_write(pool, &a, 1, 0, 16);
  fill_writers(a_w, 0, 16, 1);
  CHECK(ina_page_pool_free_pages(pool) == 0);

  ina_log_set_quiet_errors(1);
  snapshot_t a0 = take_snapshot(pool, &a);
  CHECK(ina_kv_seq_pages_needed(pool, &a, 1) == 1);
  CHECK(ina_kv_seq_append(pool, &a, 1) == INA_ERR_OUT_OF_PAGES);
  CHECKF(strstr(ina_last_error(), "only 0 of 4 free") != NULL, "message: %s", ina_last_error());
  CHECK(same_as_snapshot(pool, &a, &a0));

  ina_kv_seq_truncate(pool, &a, 2); /* 14 tokens, still 4 pages, last one partial */
  CHECK(a.num_pages == 4 && ina_page_pool_free_pages(pool) == 0);
  CHECK_OK(ina_kv_seq_fork(pool, &a, 14, &b)); /* sharing needs no page */
  snapshot_t a1 = take_snapshot(pool, &a), b1 = take_snapshot(pool, &b);
  CHECK(ina_kv_seq_pages_needed(pool, &b, 1) == 1);
  CHECK(ina_kv_seq_append(pool, &b, 1) == INA_ERR_OUT_OF_PAGES);
  CHECKF(strstr(ina_last_error(), "copy on write") != NULL, "message: %s", ina_last_error());
  CHECK(ina_kv_seq_append(pool, &a, 1) == INA_ERR_OUT_OF_PAGES);
  CHECK(same_as_snapshot(pool, &a, &a1) && same_as_snapshot(pool, &b, &b1));
  CHECK_OK(ina_kv_seq_append(pool, &b, 0));
  CHECK(same_as_snapshot(pool, &b, &b1));

  CHECK_OK(ina_kv_seq_fork(pool, &a, 8, &c)); /* ends on a page boundary */
  snapshot_t c1 = take_snapshot(pool, &c);
  CHECK(ina_kv_seq_append(pool, &c, 1) == INA_ERR_OUT_OF_PAGES);
  CHECK(same_as_snapshot(pool, &c, &c1));
  ina_log_set_quiet_errors(0);
  ina_kv_seq_release(pool, &c);

  ina_kv_seq_truncate(pool, &a, 4); /* a: 10 tokens; its 4th page now belongs to b alone */
  CHECK(ina_page_pool_free_pages(pool) == 0);
  ina_kv_seq_release(pool, &b);
  CHECK(ina_page_pool_free_pages(pool) == 1);
  CHECK(ina_kv_seq_pages_needed(pool, &a, 1) == 0); /* last page no longer shared */
  int32_t last = a.pages[2];
  CHECK_OK(ina_kv_seq_append(pool, &a, 1));
  CHECK(a.pages[2] == last);
  CHECK_OK(ina_kv_seq_append(pool, &a, 5)); /* 16 tokens: takes the freed page */
  kv_test_write(pool, &a, 1, 10, 16);
  CHECK(ina_page_pool_free_pages(pool) == 0);
  CHECK(seq_reads(pool, &a, a_w));

  /* All or nothing across several pages. */
  ina_kv_seq_truncate(pool, &a, 11); /* 5 tokens, 2 pages */
  ina_kv_seq_t d = INA_KV_SEQ_INIT;
  ina_log_set_quiet_errors(1);
  CHECK(ina_kv_seq_append(pool, &d, 9) == INA_ERR_OUT_OF_PAGES); /* 3 pages, 2 free */
  ina_log_set_quiet_errors(0);
  CHECK(d.pages == NULL && d.capacity == 0 && d.num_pages == 0 && d.num_tokens == 0);
  CHECK(ina_page_pool_free_pages(pool) == 2);
  CHECK_OK(ina_kv_seq_append(pool, &d, 8));
  CHECK(ina_page_pool_free_pages(pool) == 0);
  ina_kv_seq_release(pool, &d);
  ina_kv_seq_release(pool, &a);
  CHECK(ina_page_pool_free_pages(pool) == num_pages);
  CHECK_OK(ina_page_pool_check(pool));
  ina_page_pool_destroy(pool);
}

static void test_page_table(void) {
  const int32_t ps = 3;
  ina_page_pool_t *pool = kv_test_pool(ps, 40, 1, 1, INA_DTYPE_F32);
  ina_kv_seq_t s[5] = {INA_KV_SEQ_INIT, INA_KV_SEQ_INIT, INA_KV_SEQ_INIT, INA_KV_SEQ_INIT,
                       INA_KV_SEQ_INIT};
  CHECK_OK(ina_kv_seq_append(pool, &s[1], 1));
  CHECK_OK(ina_kv_seq_append(pool, &s[2], 3));
  CHECK_OK(ina_kv_seq_append(pool, &s[3], 7));
  CHECK_OK(ina_kv_seq_fork(pool, &s[3], 5, &s[4]));

  ina_page_table_t table = INA_PAGE_TABLE_INIT;
  const ina_kv_seq_t *batch[] = {&s[1], &s[0], &s[3], &s[4], &s[2], &s[3]};
  CHECK_OK(ina_page_table_build(&table, batch, 6, ps));
  CHECK(kv_test_table_matches(&table, batch, 6, ps));
  /* Spelled out once: pages per sequence 1, 0, 3, 2, 1, 3; last page lengths. */
  const int32_t indptr[] = {0, 1, 1, 4, 6, 7, 10};
  const int32_t last_len[] = {1, 0, 1, 2, 3, 1};
  CHECK(memcmp(table.indptr, indptr, sizeof indptr) == 0);
  CHECK(memcmp(table.last_page_len, last_len, sizeof last_len) == 0);
  CHECK(table.indices[4] == s[3].pages[0] && table.indices[5] == s[3].pages[1]);

  /* Smaller batches reuse the arrays. */
  int32_t *indptr_array = table.indptr, *indices_array = table.indices;
  const ina_kv_seq_t *one[] = {&s[2]};
  CHECK_OK(ina_page_table_build(&table, one, 1, ps));
  CHECK(kv_test_table_matches(&table, one, 1, ps));
  CHECK(table.indptr == indptr_array && table.indices == indices_array);
  CHECK_OK(ina_page_table_build(&table, NULL, 0, ps));
  CHECK(table.batch == 0 && table.indptr[0] == 0);

  /* Larger ones grow them. */
  const ina_kv_seq_t *many[30];
  for (int i = 0; i < 30; i++) many[i] = &s[(i * 7) % 5];
  CHECK_OK(ina_page_table_build(&table, many, 30, ps));
  CHECK(kv_test_table_matches(&table, many, 30, ps));

  /* Invalid input leaves the previous table intact. */
  const ina_kv_seq_t *with_null[] = {&s[1], NULL};
  ina_log_set_quiet_errors(1);
  CHECK(ina_page_table_build(&table, batch, -1, ps) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_page_table_build(&table, NULL, 2, ps) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_page_table_build(&table, with_null, 2, ps) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_page_table_build(&table, batch, 6, 0) == INA_ERR_INVALID_ARGUMENT);
  /* The wrong page size makes s[3] (7 tokens in 3 pages) inconsistent. */
  CHECK(ina_page_table_build(&table, batch, 6, 2) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_page_table_build(NULL, batch, 6, ps) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK(kv_test_table_matches(&table, many, 30, ps));

  ina_page_table_release(&table);
  CHECK(table.indptr == NULL && table.indices == NULL && table.last_page_len == NULL);
  CHECK(table.batch_capacity == 0 && table.indices_capacity == 0);
  ina_page_table_release(&table);
  ina_page_table_release(NULL);
  for (int i = 0; i < 5; i++) ina_kv_seq_release(pool, &s[i]);
  CHECK(ina_page_pool_free_pages(pool) == 40);
  ina_page_pool_destroy(pool);
}

int main(void) {
  const int32_t page_sizes[] = {1, 2, 3, 5, 16, 64};
  for (size_t i = 0; i < sizeof page_sizes / sizeof page_sizes[0]; i++) {
    test_append_and_locate(page_sizes[i]);
    test_copy_on_write(page_sizes[i]);
    test_fork_prefixes(page_sizes[i]);
    test_truncate(page_sizes[i]);
  }
  test_stripes();
  test_out_of_pages();
  test_page_table();
  return test_finish("test_kv_seq");
}
