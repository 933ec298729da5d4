/* Randomized model check of the paged KV cache.
 *
 * Thousands of random operations (create, append, fork, truncate, release, page-table
 * builds) run on a small pool for several page sizes. The model is what each sequence
 * should hold: its token count and, for every position, which sequence wrote it. After
 * every step the test checks
 *   - the pool's bookkeeping: every page's refcount equals the number of sequences
 *     holding it (so the sums agree), free + distinct used pages == num_pages, and the
 *     free list holds exactly the unreferenced pages (ina_page_pool_check);
 *   - the data: every sequence reads, at every position and layer, the pattern its
 *     writer stored. A missing or wrong copy on write shows up here as a sequence
 *     reading a sibling's tokens;
 *   - appends: success exactly when the model says enough pages are free, and on
 *     failure the sequence and the pool are bit-for-bit as before. */

#include "tests/test_util.h"

#include <stdarg.h>
#include <stdint.h>

#include "core/log.h"
#include "kvcache/kv_seq.h"
#include "kvcache/page_pool.h"
#include "tests/kvcache/kv_test_util.h"

#define MAX_SEQS 10
#define STEPS_PER_CONFIG 5000
#define MAX_REPORTED_FAILURES 10

typedef struct {
  int64_t uid; /* writer id of the tokens this sequence appends */
  ina_kv_seq_t seq;
  int64_t *writers; /* [num_tokens]: who wrote each position (the model) */
  int64_t writers_capacity;
} live_seq_t;

typedef struct {
  test_rng_t *rng;
  ina_page_pool_t *pool;
  int32_t page_size, num_pages;
  live_seq_t seqs[MAX_SEQS];
  int num_seqs;
  int64_t next_uid;
  int step;
  ina_page_table_t table;
  int32_t *held;     /* [num_pages]: how many live sequences hold each page */
  int32_t *refcount; /* [num_pages]: snapshot of the pool's refcounts */
  int32_t *pages_before;
  int failures;
  long appends, out_of_pages, copies_on_write, forks, truncates, releases, tables;
} world_t;

static void fail(world_t *w, const char *fmt, ...) {
  if (w->failures++ >= MAX_REPORTED_FAILURES) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "page_size %d, step %d: ", (int)w->page_size, w->step);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int64_t pages_for(int64_t tokens, int32_t page_size) {
  return (tokens + page_size - 1) / page_size;
}

static void reserve_writers(live_seq_t *s, int64_t need) {
  if (need <= s->writers_capacity) return;
  int64_t capacity = s->writers_capacity * 2 > need ? s->writers_capacity * 2 : need;
  s->writers = realloc(s->writers, (size_t)capacity * sizeof *s->writers);
  if (!s->writers) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  s->writers_capacity = capacity;
}

/* held[p] = number of live sequences whose page list contains p; returns the number of
 * pages nobody holds. */
static int32_t count_held(world_t *w) {
  memset(w->held, 0, (size_t)w->num_pages * sizeof *w->held);
  for (int i = 0; i < w->num_seqs; i++) {
    const ina_kv_seq_t *seq = &w->seqs[i].seq;
    for (int32_t p = 0; p < seq->num_pages; p++)
      if (seq->pages[p] >= 0 && seq->pages[p] < w->num_pages) w->held[seq->pages[p]]++;
  }
  int32_t unheld = 0;
  for (int32_t p = 0; p < w->num_pages; p++) unheld += w->held[p] == 0;
  return unheld;
}

static void snapshot_refcounts(world_t *w) {
  for (int32_t p = 0; p < w->num_pages; p++) w->refcount[p] = ina_page_pool_refcount(w->pool, p);
}

static int refcounts_unchanged(world_t *w) {
  for (int32_t p = 0; p < w->num_pages; p++)
    if (ina_page_pool_refcount(w->pool, p) != w->refcount[p]) return 0;
  return 1;
}

static void check_world(world_t *w) {
  int32_t unheld = count_held(w);
  int64_t held_sum = 0, refcount_sum = 0;
  for (int i = 0; i < w->num_seqs; i++) {
    const live_seq_t *s = &w->seqs[i];
    held_sum += s->seq.num_pages;
    if (s->seq.num_pages != pages_for(s->seq.num_tokens, w->page_size) ||
        s->seq.capacity < s->seq.num_pages)
      fail(w, "seq %lld: %lld tokens in %d pages (capacity %d)", (long long)s->uid,
           (long long)s->seq.num_tokens, (int)s->seq.num_pages, (int)s->seq.capacity);
    for (int32_t p = 0; p < s->seq.num_pages; p++) {
      int32_t page = s->seq.pages[p];
      if (page < 0 || page >= w->num_pages) {
        fail(w, "seq %lld: page %d out of range", (long long)s->uid, (int)page);
        return;
      }
      for (int32_t q = 0; q < p; q++)
        if (s->seq.pages[q] == page)
          fail(w, "seq %lld holds page %d twice", (long long)s->uid, (int)page);
    }
  }
  for (int32_t p = 0; p < w->num_pages; p++) {
    int32_t rc = ina_page_pool_refcount(w->pool, p);
    refcount_sum += rc;
    if (rc != w->held[p])
      fail(w, "page %d: refcount %d, held by %d", (int)p, (int)rc, (int)w->held[p]);
  }
  if (held_sum != refcount_sum)
    fail(w, "pages held %lld != sum of refcounts %lld", (long long)held_sum,
         (long long)refcount_sum);
  if (ina_page_pool_free_pages(w->pool) != unheld)
    fail(w, "free pages %d, distinct used %d, num_pages %d", (int)ina_page_pool_free_pages(w->pool),
         (int)(w->num_pages - unheld), (int)w->num_pages);
  ina_log_set_quiet_errors(1);
  if (ina_page_pool_check(w->pool) != INA_OK) fail(w, "pool check: %s", ina_last_error());
  ina_log_set_quiet_errors(0);

  int32_t num_layers = ina_page_pool_num_layers(w->pool);
  for (int i = 0; i < w->num_seqs; i++) {
    const live_seq_t *s = &w->seqs[i];
    for (int64_t t = 0; t < s->seq.num_tokens; t++)
      for (int32_t l = 0; l < num_layers; l++)
        if (!kv_test_entry_is(w->pool, &s->seq, s->writers[t], t, l)) {
          fail(w, "seq %lld, position %lld, layer %d: data of writer %lld lost", (long long)s->uid,
               (long long)t, (int)l, (long long)s->writers[t]);
          t = s->seq.num_tokens;
          break;
        }
  }
}

static live_seq_t *add_seq(world_t *w) {
  live_seq_t *s = &w->seqs[w->num_seqs++];
  memset(s, 0, sizeof *s);
  s->seq = (ina_kv_seq_t)INA_KV_SEQ_INIT;
  s->uid = w->next_uid++;
  return s;
}

static int64_t random_append_count(world_t *w) {
  double r = test_rng_uniform(w->rng);
  int64_t ps = w->page_size;
  if (r < 0.1) return 0;
  if (r < 0.55) return test_rng_int(w->rng, 1, ps);
  if (r < 0.85) return test_rng_int(w->rng, 1, 3 * ps);
  return test_rng_int(w->rng, 1, (int64_t)(w->num_pages / 2) * ps); /* spans many pages */
}

static void op_append(world_t *w, live_seq_t *s) {
  ina_kv_seq_t *seq = &s->seq;
  const int64_t n = random_append_count(w);
  const int32_t model_free = count_held(w);
  const int64_t old_tokens = seq->num_tokens;
  const int32_t old_pages = seq->num_pages;
  const int expect_copy =
      n > 0 && old_tokens % w->page_size != 0 && w->held[seq->pages[old_pages - 1]] > 1;
  const int64_t needed =
      n == 0 ? 0 : pages_for(old_tokens + n, w->page_size) - old_pages + expect_copy;
  int64_t reported = ina_kv_seq_pages_needed(w->pool, seq, n);
  if (reported != needed)
    fail(w, "pages_needed(%lld) = %lld, model says %lld", (long long)n, (long long)reported,
         (long long)needed);

  const ina_kv_seq_t seq_before = *seq;
  if (old_pages > 0) memcpy(w->pages_before, seq->pages, (size_t)old_pages * sizeof *seq->pages);
  snapshot_refcounts(w);
  const int32_t free_before = ina_page_pool_free_pages(w->pool);

  ina_log_set_quiet_errors(1);
  ina_status_t st = ina_kv_seq_append(w->pool, seq, n);
  ina_log_set_quiet_errors(0);

  if (needed > model_free) {
    w->out_of_pages++;
    if (st != INA_ERR_OUT_OF_PAGES)
      fail(w, "append %lld needing %lld pages with %d free: status %d", (long long)n,
           (long long)needed, (int)model_free, (int)st);
    if (memcmp(seq, &seq_before, sizeof *seq) != 0 ||
        (old_pages > 0 &&
         memcmp(seq->pages, w->pages_before, (size_t)old_pages * sizeof *seq->pages) != 0) ||
        !refcounts_unchanged(w) || ina_page_pool_free_pages(w->pool) != free_before)
      fail(w, "failed append of %lld changed the sequence or the pool", (long long)n);
    return;
  }
  if (st != INA_OK) {
    fail(w, "append %lld needing %lld pages with %d free: status %d (%s)", (long long)n,
         (long long)needed, (int)model_free, (int)st, ina_last_error());
    return;
  }
  w->appends++;
  if (seq->num_tokens != old_tokens + n ||
      seq->num_pages != pages_for(old_tokens + n, w->page_size)) {
    fail(w, "append %lld: %lld tokens in %d pages", (long long)n, (long long)seq->num_tokens,
         (int)seq->num_pages);
    return;
  }
  for (int32_t p = 0; p + 1 < old_pages; p++)
    if (seq->pages[p] != w->pages_before[p]) fail(w, "append moved full page %d", (int)p);
  if (old_pages > 0) {
    int32_t before = w->pages_before[old_pages - 1], after = seq->pages[old_pages - 1];
    if (expect_copy) {
      w->copies_on_write++;
      if (after == before || w->refcount[after] != 0 ||
          ina_page_pool_refcount(w->pool, before) != w->refcount[before] - 1)
        fail(w, "shared last page %d not copied on write (now %d)", (int)before, (int)after);
    } else if (after != before) {
      fail(w, "unshared last page %d replaced by %d", (int)before, (int)after);
    }
  }
  for (int32_t p = old_pages; p < seq->num_pages; p++)
    if (w->refcount[seq->pages[p]] != 0) fail(w, "new page %d was not free", (int)seq->pages[p]);

  kv_test_write(w->pool, seq, s->uid, old_tokens, old_tokens + n);
  reserve_writers(s, old_tokens + n);
  for (int64_t t = old_tokens; t < old_tokens + n; t++) s->writers[t] = s->uid;
}

static int64_t random_prefix(world_t *w, int64_t tokens) {
  double r = test_rng_uniform(w->rng);
  if (r < 0.1) return 0;
  if (r < 0.35) return tokens;
  if (r < 0.55) return test_rng_int(w->rng, 0, tokens / w->page_size) * w->page_size;
  return test_rng_int(w->rng, 0, tokens);
}

static void op_fork(world_t *w) {
  live_seq_t *src = &w->seqs[test_rng_int(w->rng, 0, w->num_seqs - 1)];
  int64_t prefix = random_prefix(w, src->seq.num_tokens);
  /* Sometimes reuse an emptied sequence (its page array stays allocated). */
  live_seq_t *dst = NULL;
  for (int i = 0; i < w->num_seqs && test_rng_uniform(w->rng) < 0.5; i++)
    if (&w->seqs[i] != src && w->seqs[i].seq.num_tokens == 0) dst = &w->seqs[i];
  if (!dst) {
    if (w->num_seqs == MAX_SEQS) return;
    dst = add_seq(w); /* the array is fixed, so src stays valid */
  }
  snapshot_refcounts(w);
  ina_status_t st = ina_kv_seq_fork(w->pool, &src->seq, prefix, &dst->seq);
  if (st != INA_OK) {
    fail(w, "fork at %lld of %lld: status %d (%s)", (long long)prefix,
         (long long)src->seq.num_tokens, (int)st, ina_last_error());
    return;
  }
  w->forks++;
  int32_t shared = (int32_t)pages_for(prefix, w->page_size);
  if (dst->seq.num_tokens != prefix || dst->seq.num_pages != shared)
    fail(w, "fork at %lld: %lld tokens in %d pages", (long long)prefix,
         (long long)dst->seq.num_tokens, (int)dst->seq.num_pages);
  for (int32_t p = 0; p < shared && p < dst->seq.num_pages; p++) {
    int32_t page = src->seq.pages[p];
    if (dst->seq.pages[p] != page || ina_page_pool_refcount(w->pool, page) != w->refcount[page] + 1)
      fail(w, "fork at %lld: page %d not shared", (long long)prefix, (int)p);
  }
  reserve_writers(dst, prefix);
  if (prefix > 0) memcpy(dst->writers, src->writers, (size_t)prefix * sizeof *dst->writers);
}

static void op_truncate(world_t *w, live_seq_t *s) {
  int64_t tokens = s->seq.num_tokens;
  double r = test_rng_uniform(w->rng);
  int64_t n = r < 0.1   ? 0
              : r < 0.2 ? tokens
              : r < 0.5 ? test_rng_int(w->rng, 0, tokens % w->page_size)
                        : test_rng_int(w->rng, 0, tokens);
  ina_kv_seq_truncate(w->pool, &s->seq, n);
  w->truncates++;
  if (s->seq.num_tokens != tokens - n)
    fail(w, "truncate %lld of %lld left %lld", (long long)n, (long long)tokens,
         (long long)s->seq.num_tokens);
}

static void op_release(world_t *w, int index) {
  live_seq_t *s = &w->seqs[index];
  ina_kv_seq_release(w->pool, &s->seq);
  w->releases++;
  if (s->seq.pages || s->seq.num_pages || s->seq.num_tokens || s->seq.capacity)
    fail(w, "release left a non-empty sequence");
  free(s->writers);
  w->seqs[index] = w->seqs[--w->num_seqs];
}

static void op_page_table(world_t *w) {
  const ina_kv_seq_t *batch[2 * MAX_SEQS];
  int32_t size = (int32_t)test_rng_int(w->rng, 0, 2 * w->num_seqs);
  for (int32_t i = 0; i < size; i++)
    batch[i] = &w->seqs[test_rng_int(w->rng, 0, w->num_seqs - 1)].seq;
  ina_status_t st = ina_page_table_build(&w->table, batch, size, w->page_size);
  w->tables++;
  if (st != INA_OK || !kv_test_table_matches(&w->table, batch, size, w->page_size))
    fail(w, "page table of %d sequences wrong (status %d)", (int)size, (int)st);
}

static void step(world_t *w) {
  double r = test_rng_uniform(w->rng);
  if (w->num_seqs == 0 || (r < 0.10 && w->num_seqs < MAX_SEQS)) {
    add_seq(w);
    return;
  }
  int pick = (int)test_rng_int(w->rng, 0, w->num_seqs - 1);
  if (r < 0.50)
    op_append(w, &w->seqs[pick]);
  else if (r < 0.65)
    op_fork(w);
  else if (r < 0.80)
    op_truncate(w, &w->seqs[pick]);
  else if (r < 0.92)
    op_release(w, pick);
  else
    op_page_table(w);
}

static void run_config(test_rng_t *rng, int32_t page_size, int32_t num_pages) {
  static const ina_dtype_t dtypes[] = {INA_DTYPE_F32, INA_DTYPE_BF16, INA_DTYPE_FP8_E4M3,
                                       INA_DTYPE_I64};
  world_t w;
  memset(&w, 0, sizeof w);
  w.rng = rng;
  w.page_size = page_size;
  w.num_pages = num_pages;
  int32_t num_layers = (int32_t)test_rng_int(rng, 1, 3);
  int32_t entry_elems = (int32_t)test_rng_int(rng, 1, 5);
  ina_dtype_t dtype = dtypes[test_rng_int(rng, 0, 3)];
  w.pool = kv_test_pool(page_size, num_pages, num_layers, entry_elems, dtype);
  w.table = (ina_page_table_t)INA_PAGE_TABLE_INIT;
  w.held = calloc((size_t)num_pages, sizeof *w.held);
  w.refcount = calloc((size_t)num_pages, sizeof *w.refcount);
  w.pages_before = calloc((size_t)num_pages, sizeof *w.pages_before);

  for (w.step = 0; w.step < STEPS_PER_CONFIG && w.failures == 0; w.step++) {
    step(&w);
    check_world(&w);
  }
  while (w.num_seqs > 0) op_release(&w, w.num_seqs - 1);
  CHECK(ina_page_pool_free_pages(w.pool) == num_pages);

  printf(
      "page_size %2d, %2d pages, %d layers x %d %s: %ld appends, %ld out of pages, %ld "
      "copies on write, %ld forks, %ld truncates, %ld releases, %ld page tables\n",
      (int)page_size, (int)num_pages, (int)num_layers, (int)entry_elems, ina_dtype_name(dtype),
      w.appends, w.out_of_pages, w.copies_on_write, w.forks, w.truncates, w.releases, w.tables);
  CHECKF(w.failures == 0, "page_size %d: %d failures", (int)page_size, w.failures);
  /* The run must have reached the interesting cases, or it proves little. */
  CHECK(w.appends > 100 && w.forks > 50 && w.out_of_pages > 10);
  CHECK(page_size == 1 || w.copies_on_write > 10);

  ina_page_table_release(&w.table);
  free(w.held);
  free(w.refcount);
  free(w.pages_before);
  ina_page_pool_destroy(w.pool);
}

int main(void) {
  test_rng_t rng = {test_seed("test_kvcache")};
  const struct {
    int32_t page_size, num_pages;
  } configs[] = {{1, 64}, {2, 48}, {3, 40}, {5, 20}, {7, 32}, {16, 24}, {32, 9}, {64, 12}};
  for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++)
    run_config(&rng, configs[i].page_size, configs[i].num_pages);
  return test_finish("test_kvcache");
}
