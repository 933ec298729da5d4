/* Page pool: config validation, all-or-nothing allocation, reference counting (including
 * misuse that must not corrupt the free list), storage layout and page copies. */

#include "tests/test_util.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "core/log.h"
#include "kvcache/page_pool.h"
#include "tests/kvcache/kv_test_util.h"

static ina_page_pool_config_t valid_config(void) {
  ina_page_pool_config_t c = INA_PAGE_POOL_CONFIG_INIT;
  c.page_size = 4;
  c.num_pages = 8;
  c.num_layers = 2;
  c.entry_elems = 3;
  return c;
}

/* Create must fail with `expect`, set *out = NULL and leave a message containing
 * `needle`. */
static void expect_create_fails(const ina_page_pool_config_t *c, ina_status_t expect,
                                const char *needle, const char *what) {
  ina_page_pool_t *pool = (ina_page_pool_t *)(uintptr_t)0x1; /* must be overwritten */
  ina_clear_error();
  ina_log_set_quiet_errors(1);
  ina_status_t st = ina_page_pool_create(c, &pool);
  ina_log_set_quiet_errors(0);
  CHECKF(st == expect, "%s: status %d, expected %d", what, (int)st, (int)expect);
  CHECKF(pool == NULL, "%s: *out not reset to NULL", what);
  CHECKF(strstr(ina_last_error(), needle) != NULL, "%s: message '%s' lacks '%s'", what,
         ina_last_error(), needle);
  if (st == INA_OK) ina_page_pool_destroy(pool);
}

static void test_config_validation(void) {
  ina_page_pool_config_t c;
  expect_create_fails(NULL, INA_ERR_INVALID_ARGUMENT, "NULL", "NULL config");

  c = valid_config();
  c.struct_size = 0;
  expect_create_fails(&c, INA_ERR_INVALID_ARGUMENT, "struct_size 0", "struct_size 0");
  c = valid_config();
  c.struct_size = offsetof(ina_page_pool_config_t, device); /* stops before `device` */
  expect_create_fails(&c, INA_ERR_INVALID_ARGUMENT, "struct_size", "truncated struct");
  c = valid_config();
  c.version = 0;
  expect_create_fails(&c, INA_ERR_INVALID_ARGUMENT, "version 0", "version 0");

  const struct {
    int field;
    int32_t value;
    const char *needle;
  } bad_counts[] = {
      {0, 0, "page_size 0"},         {0, -3, "page_size -3"}, {1, 0, "num_pages 0"},
      {1, -1, "num_pages -1"},       {2, 0, "num_layers 0"},  {3, 0, "entry_elems 0"},
      {3, INT32_MIN, "entry_elems"},
  };
  for (size_t i = 0; i < sizeof bad_counts / sizeof bad_counts[0]; i++) {
    c = valid_config();
    int32_t *fields[] = {&c.page_size, &c.num_pages, &c.num_layers, &c.entry_elems};
    *fields[bad_counts[i].field] = bad_counts[i].value;
    expect_create_fails(&c, INA_ERR_INVALID_ARGUMENT, bad_counts[i].needle, bad_counts[i].needle);
  }

  c = valid_config();
  c.dtype = INA_DTYPE_COUNT;
  expect_create_fails(&c, INA_ERR_INVALID_ARGUMENT, "dtype", "bad dtype");
  c = valid_config();
  c.device = (ina_device_t){INA_DEVICE_CUDA, 1};
  expect_create_fails(&c, INA_ERR_UNSUPPORTED, "device type 1 (index 1)", "CUDA device");

  /* 2^31 layers x 2^31 pages x 2^31 tokens x 2^31 values: overflows any size_t. */
  c = valid_config();
  c.num_layers = c.num_pages = c.page_size = c.entry_elems = INT32_MAX;
  c.dtype = INA_DTYPE_I64;
  expect_create_fails(&c, INA_ERR_INVALID_ARGUMENT, "overflows", "size overflow");

  /* A caller built against a newer header: larger struct, newer version. Accepted; only
   * the version-1 fields are read. */
  struct {
    ina_page_pool_config_t v1;
    uint64_t appended_field;
  } newer = {valid_config(), 0xDEADBEEFull};
  newer.v1.struct_size = sizeof newer;
  newer.v1.version = 2;
  ina_page_pool_t *pool = NULL;
  CHECK_OK(ina_page_pool_create(&newer.v1, &pool));
  CHECK(pool != NULL);
  ina_page_pool_destroy(pool);

  /* The initializer's defaults plus a page count make a valid pool. */
  c = (ina_page_pool_config_t)INA_PAGE_POOL_CONFIG_INIT;
  c.num_pages = 3;
  pool = NULL;
  CHECK_OK(ina_page_pool_create(&c, &pool));
  if (pool) {
    CHECK(ina_page_pool_page_size(pool) == 16);
    CHECK(ina_page_pool_num_pages(pool) == 3);
    CHECK(ina_page_pool_free_pages(pool) == 3);
    CHECK(ina_page_pool_entry_elems(pool) == 576);
    CHECK(ina_page_pool_num_layers(pool) == 1);
    CHECK(ina_page_pool_dtype(pool) == INA_DTYPE_F32);
  }
  ina_page_pool_destroy(pool);
  ina_page_pool_destroy(NULL);
}

static void test_alloc_all_or_nothing(void) {
  const int32_t num_pages = 8;
  ina_page_pool_t *pool = kv_test_pool(4, num_pages, 2, 3, INA_DTYPE_F32);
  int32_t pages[16];
  int seen[8] = {0};

  CHECK_OK(ina_page_pool_alloc(pool, 0, NULL));
  CHECK(ina_page_pool_free_pages(pool) == num_pages);
  CHECK_OK(ina_page_pool_alloc(pool, 5, pages));
  CHECK(ina_page_pool_free_pages(pool) == 3);
  for (int i = 0; i < 5; i++) {
    CHECK(pages[i] >= 0 && pages[i] < num_pages);
    if (pages[i] >= 0 && pages[i] < num_pages) seen[pages[i]]++;
    CHECK(ina_page_pool_refcount(pool, pages[i]) == 1);
  }
  for (int p = 0; p < num_pages; p++) CHECK(seen[p] <= 1);

  /* Asking for more than is free: error naming both numbers, nothing taken, output
   * untouched. */
  int32_t more[8];
  for (int i = 0; i < 8; i++) more[i] = -7;
  ina_log_set_quiet_errors(1);
  ina_status_t st = ina_page_pool_alloc(pool, 4, more);
  ina_log_set_quiet_errors(0);
  CHECK(st == INA_ERR_OUT_OF_PAGES);
  CHECKF(strstr(ina_last_error(), "4 pages") && strstr(ina_last_error(), "3 of 8 free"),
         "message: %s", ina_last_error());
  for (int i = 0; i < 8; i++) CHECK(more[i] == -7);
  CHECK(ina_page_pool_free_pages(pool) == 3);
  for (int p = 0; p < num_pages; p++) CHECK(ina_page_pool_refcount(pool, p) == (seen[p] ? 1 : 0));
  CHECK_OK(ina_page_pool_check(pool));

  ina_log_set_quiet_errors(1);
  CHECK(ina_page_pool_alloc(pool, -1, more) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_page_pool_alloc(pool, 1, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK(ina_page_pool_free_pages(pool) == 3);

  /* Exactly what is free succeeds and empties the pool. */
  CHECK_OK(ina_page_pool_alloc(pool, 3, more));
  CHECK(ina_page_pool_free_pages(pool) == 0);
  for (int i = 0; i < 3; i++) {
    CHECK(more[i] >= 0 && more[i] < num_pages);
    if (more[i] >= 0 && more[i] < num_pages) seen[more[i]]++;
  }
  for (int p = 0; p < num_pages; p++) CHECK(seen[p] == 1);
  ina_log_set_quiet_errors(1);
  CHECK(ina_page_pool_alloc(pool, 1, more) == INA_ERR_OUT_OF_PAGES);
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_page_pool_alloc(pool, 0, more));
  CHECK_OK(ina_page_pool_check(pool));
  ina_page_pool_destroy(pool);
}

static void test_refcounts_and_misuse(void) {
  ina_page_pool_t *pool = kv_test_pool(2, 4, 1, 1, INA_DTYPE_I32);
  int32_t a, b;
  CHECK_OK(ina_page_pool_alloc(pool, 1, &a));
  CHECK_OK(ina_page_pool_alloc(pool, 1, &b));
  CHECK(a != b);
  ina_page_pool_ref(pool, a);
  ina_page_pool_ref(pool, a);
  CHECK(ina_page_pool_refcount(pool, a) == 3);
  ina_page_pool_unref(pool, a);
  ina_page_pool_unref(pool, a);
  CHECK(ina_page_pool_refcount(pool, a) == 1);
  CHECK(ina_page_pool_free_pages(pool) == 2);
  ina_page_pool_unref(pool, a);
  CHECK(ina_page_pool_refcount(pool, a) == 0);
  CHECK(ina_page_pool_free_pages(pool) == 3);

  /* Bugs in the caller: logged and ignored, the free list stays intact. */
  ina_log_set_quiet_errors(1);
  ina_clear_error();
  ina_page_pool_unref(pool, a); /* already free */
  CHECKF(strstr(ina_last_error(), "already free") != NULL, "message: %s", ina_last_error());
  ina_page_pool_unref(pool, -1);
  CHECK(strstr(ina_last_error(), "page -1") != NULL);
  ina_page_pool_unref(pool, 4);
  CHECK(strstr(ina_last_error(), "out of range") != NULL);
  ina_page_pool_ref(pool, a); /* referencing a free page */
  ina_page_pool_ref(pool, 99);
  ina_log_set_quiet_errors(0);
  CHECK(ina_page_pool_free_pages(pool) == 3);
  CHECK(ina_page_pool_refcount(pool, a) == 0);
  CHECK(ina_page_pool_refcount(pool, b) == 1);
  CHECK(ina_page_pool_refcount(pool, -1) == 0);
  CHECK(ina_page_pool_refcount(pool, 4) == 0);
  CHECK_OK(ina_page_pool_check(pool));

  /* All four pages can still be handed out, each once. */
  int32_t rest[3];
  CHECK_OK(ina_page_pool_alloc(pool, 3, rest));
  int seen[4] = {0};
  seen[b]++;
  for (int i = 0; i < 3; i++)
    if (rest[i] >= 0 && rest[i] < 4) seen[rest[i]]++;
  for (int p = 0; p < 4; p++) CHECK(seen[p] == 1);
  ina_page_pool_destroy(pool);
}

/* Random alloc / ref / unref against a model of the refcounts. */
static void test_random_churn(test_rng_t *rng) {
  const int32_t num_pages = (int32_t)test_rng_int(rng, 1, 40);
  ina_page_pool_t *pool =
      kv_test_pool((int32_t)test_rng_int(rng, 1, 9), num_pages, 1, 2, INA_DTYPE_BF16);
  int32_t *model = calloc((size_t)num_pages, sizeof *model);
  int32_t *got = malloc((size_t)num_pages * sizeof *got);
  int mismatches = 0;
  for (int step = 0; step < 3000; step++) {
    int32_t model_free = 0;
    for (int32_t p = 0; p < num_pages; p++) model_free += model[p] == 0;
    int op = (int)test_rng_int(rng, 0, 2);
    if (op == 0) {
      int32_t n = (int32_t)test_rng_int(rng, 0, num_pages / 2 + 1);
      ina_log_set_quiet_errors(1);
      ina_status_t st = ina_page_pool_alloc(pool, n, got);
      ina_log_set_quiet_errors(0);
      if (n > model_free) {
        mismatches += st != INA_ERR_OUT_OF_PAGES;
      } else {
        mismatches += st != INA_OK;
        for (int32_t i = 0; i < n && st == INA_OK; i++) {
          int fresh = got[i] >= 0 && got[i] < num_pages && model[got[i]] == 0;
          mismatches += !fresh;
          if (fresh) model[got[i]] = 1;
        }
      }
    } else {
      int32_t p = (int32_t)test_rng_int(rng, 0, num_pages - 1);
      if (model[p] == 0) continue;
      if (op == 1) {
        ina_page_pool_ref(pool, p);
        model[p]++;
      } else {
        ina_page_pool_unref(pool, p);
        model[p]--;
      }
    }
    model_free = 0;
    for (int32_t p = 0; p < num_pages; p++) {
      model_free += model[p] == 0;
      mismatches += ina_page_pool_refcount(pool, p) != model[p];
    }
    mismatches += ina_page_pool_free_pages(pool) != model_free;
    mismatches += ina_page_pool_check(pool) != INA_OK;
  }
  CHECKF(mismatches == 0, "%d mismatches against the refcount model (%d pages)", mismatches,
         (int)num_pages);
  free(model);
  free(got);
  ina_page_pool_destroy(pool);
}

/* A striped pool against a model of refcounts: allocations from one stripe succeed
 * exactly when that stripe has the pages (whatever the others hold), hand out only its
 * pages, and each stripe's free count follows; the roomiest stripe is the one with the
 * most free pages. */
static void test_striped_churn(test_rng_t *rng) {
  const int32_t num_pages = (int32_t)test_rng_int(rng, 3, 40);
  const int32_t stripes = (int32_t)test_rng_int(rng, 2, num_pages < 5 ? num_pages : 5);
  ina_page_pool_config_t c = INA_PAGE_POOL_CONFIG_INIT;
  c.page_size = 4;
  c.num_pages = num_pages;
  c.entry_elems = 2;
  c.stripes = stripes;
  c.store_entries = 0;
  ina_page_pool_t *pool = NULL;
  CHECK_OK(ina_page_pool_create(&c, &pool));
  int32_t *model = calloc((size_t)num_pages, sizeof *model), *got = malloc((size_t)num_pages * sizeof *got);
  int mismatches = 0;
  for (int step = 0; pool && step < 3000; step++) {
    int32_t model_free[5] = {0};
    for (int32_t p = 0; p < num_pages; p++) model_free[p % stripes] += model[p] == 0;
    if (test_rng_int(rng, 0, 1) == 0) {
      const int32_t s = (int32_t)test_rng_int(rng, 0, stripes - 1), n = (int32_t)test_rng_int(rng, 0, 4);
      ina_log_set_quiet_errors(1);
      const ina_status_t st = ina_page_pool_alloc_in(pool, s, n, got);
      ina_log_set_quiet_errors(0);
      mismatches += st != (n > model_free[s] ? INA_ERR_OUT_OF_PAGES : INA_OK);
      for (int32_t i = 0; i < n && st == INA_OK; i++) {
        const int fresh = got[i] >= 0 && got[i] < num_pages && model[got[i]] == 0 && got[i] % stripes == s;
        mismatches += !fresh;
        if (fresh) model[got[i]] = 1;
      }
    } else {
      const int32_t p = (int32_t)test_rng_int(rng, 0, num_pages - 1);
      if (model[p] > 0) {
        ina_page_pool_unref(pool, p);
        model[p]--;
      }
    }
    int32_t now_free[5] = {0}, best = 0;
    for (int32_t p = 0; p < num_pages; p++) now_free[p % stripes] += model[p] == 0;
    for (int32_t s = 0; s < stripes; s++) {
      mismatches += ina_page_pool_stripe_free(pool, s) != now_free[s];
      if (now_free[s] > now_free[best]) best = s;
    }
    mismatches += ina_page_pool_roomiest_stripe(pool) != best;
    mismatches += ina_page_pool_check(pool) != INA_OK;
  }
  CHECKF(mismatches == 0, "%d mismatches against the striped model (%d pages, %d stripes)", mismatches,
         (int)num_pages, (int)stripes);
  ina_log_set_quiet_errors(1);
  CHECK(!pool || ina_page_pool_alloc_in(pool, stripes, 1, got) == INA_ERR_INVALID_ARGUMENT);
  c.stripes = num_pages + 1;
  ina_page_pool_t *bad = NULL;
  CHECK(ina_page_pool_create(&c, &bad) == INA_ERR_INVALID_ARGUMENT && bad == NULL);
  ina_log_set_quiet_errors(0);
  free(model);
  free(got);
  ina_page_pool_destroy(pool);
}

static void test_layout_and_copy(test_rng_t *rng) {
  const int32_t page_size = 3, num_pages = 5, num_layers = 3, elems = 7;
  ina_page_pool_t *pool = kv_test_pool(page_size, num_pages, num_layers, elems, INA_DTYPE_BF16);
  const size_t entry_bytes = (size_t)elems * 2;
  unsigned char *base = ina_page_pool_entry(pool, 0, 0, 0);
  CHECK(base != NULL && (uintptr_t)base % 64 == 0);
  int layout_ok = 1;
  for (int32_t l = 0; l < num_layers; l++)
    for (int32_t p = 0; p < num_pages; p++)
      for (int32_t s = 0; s < page_size; s++) {
        size_t expect = (((size_t)l * num_pages + p) * page_size + s) * entry_bytes;
        layout_ok &= (unsigned char *)ina_page_pool_entry(pool, l, p, s) == base + expect;
      }
  CHECK(layout_ok);

  for (int32_t l = 0; l < num_layers; l++) {
    ina_tensor_t t = ina_page_pool_layer(pool, l);
    CHECK(t.ndim == 3 && t.shape[0] == num_pages && t.shape[1] == page_size && t.shape[2] == elems);
    CHECK(t.dtype == INA_DTYPE_BF16 && t.device.type == INA_DEVICE_CPU && !t.owns_data);
    CHECK(t.stride[0] == (int64_t)page_size * elems && t.stride[1] == elems && t.stride[2] == 1);
    CHECK(t.data == ina_page_pool_entry(pool, l, 0, 0));
  }

  ina_log_set_quiet_errors(1);
  CHECK(ina_page_pool_entry(pool, num_layers, 0, 0) == NULL);
  CHECK(ina_page_pool_entry(pool, 0, num_pages, 0) == NULL);
  CHECK(ina_page_pool_entry(pool, 0, 0, page_size) == NULL);
  CHECK(ina_page_pool_entry(pool, 0, -1, 0) == NULL);
  ina_tensor_t bad_layer = ina_page_pool_layer(pool, num_layers);
  CHECK(bad_layer.data == NULL && bad_layer.ndim == 0);
  ina_log_set_quiet_errors(0);

  /* Fill everything with random bytes, copy 2 slots of page 1 to page 3, compare. */
  size_t total = (size_t)num_layers * num_pages * page_size * entry_bytes;
  unsigned char *before = malloc(total);
  for (size_t i = 0; i < total; i++) base[i] = (unsigned char)test_rng_next(rng);
  memcpy(before, base, total);
  ina_page_pool_copy(pool, 1, 3, 2);
  int copy_ok = 1;
  for (int32_t l = 0; l < num_layers; l++)
    for (int32_t p = 0; p < num_pages; p++)
      for (int32_t s = 0; s < page_size; s++) {
        int32_t from_page = (p == 3 && s < 2) ? 1 : p;
        size_t off = (((size_t)l * num_pages + p) * page_size + s) * entry_bytes;
        size_t src = (((size_t)l * num_pages + from_page) * page_size + s) * entry_bytes;
        copy_ok &= memcmp(base + off, before + src, entry_bytes) == 0;
      }
  CHECK(copy_ok);

  /* Invalid copies are refused without touching storage. */
  memcpy(before, base, total);
  ina_log_set_quiet_errors(1);
  ina_page_pool_copy(pool, 2, 2, 1);
  ina_page_pool_copy(pool, 0, num_pages, 1);
  ina_page_pool_copy(pool, -1, 0, 1);
  ina_page_pool_copy(pool, 0, 1, page_size + 1);
  ina_page_pool_copy(pool, 0, 1, -1);
  ina_log_set_quiet_errors(0);
  CHECK(memcmp(before, base, total) == 0);
  ina_page_pool_copy(pool, 0, 1, 0); /* nothing to copy, valid */
  CHECK(memcmp(before, base, total) == 0);
  free(before);
  ina_page_pool_destroy(pool);
}

/* store_entries = 0: page bookkeeping only (a device engine keeps the entries itself).
 * Allocation and refcounts work as usual; entry access is refused, copies do nothing. */
static void test_bookkeeping_only(void) {
  ina_page_pool_config_t c = INA_PAGE_POOL_CONFIG_INIT;
  ina_page_pool_t *pool = NULL;
  c.page_size = 4;
  c.num_pages = 3;
  c.num_layers = 2;
  c.entry_elems = 576;
  c.store_entries = 0;
  CHECK_OK(ina_page_pool_create(&c, &pool));
  if (!pool) return;
  int32_t pages[3];
  CHECK_OK(ina_page_pool_alloc(pool, 3, pages));
  CHECK(ina_page_pool_free_pages(pool) == 0);
  ina_log_set_quiet_errors(1);
  CHECK(ina_page_pool_alloc(pool, 1, pages) == INA_ERR_OUT_OF_PAGES);
  CHECK(ina_page_pool_entry(pool, 0, pages[0], 0) == NULL);
  ina_log_set_quiet_errors(0);
  ina_tensor_t layer = ina_page_pool_layer(pool, 0);
  CHECK(ina_tensor_is_empty(&layer));
  ina_page_pool_copy(pool, pages[0], pages[1], 4); /* a no-op, not a crash */
  ina_page_pool_ref(pool, pages[2]);
  CHECK(ina_page_pool_refcount(pool, pages[2]) == 2);
  for (int i = 0; i < 3; i++) ina_page_pool_unref(pool, pages[i]);
  ina_page_pool_unref(pool, pages[2]);
  CHECK(ina_page_pool_free_pages(pool) == 3);
  CHECK_OK(ina_page_pool_check(pool));
  ina_page_pool_destroy(pool);
}

int main(void) {
  test_rng_t rng = {test_seed("test_page_pool")};
  test_bookkeeping_only();
  test_config_validation();
  test_alloc_all_or_nothing();
  test_refcounts_and_misuse();
  for (int i = 0; i < 6; i++) test_random_churn(&rng);
  for (int i = 0; i < 6; i++) test_striped_churn(&rng);
  test_layout_and_copy(&rng);
  return test_finish("test_page_pool");
}
