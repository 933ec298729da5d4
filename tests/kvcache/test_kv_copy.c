/* kvcache/kv_copy.h: copy plans between paged caches, applied with memcpy over fresh
 * random layouts (page sizes 1 to 64 on either side, shuffled page lists, ragged token
 * ranges, layer ranges). The destination is poisoned first: every byte of the planned
 * range must equal the source's token in its layer, and every other byte must still be
 * poison. Also: equal layouts over consecutive pages merge into one copy per layer, the
 * plan never exceeds ina_kv_copy_max, and bad input is refused with its reason. */
#include "core/log.h"
#include "tests/test_util.h"

#include "kvcache/kv_copy.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 11);
}
static int32_t rand_in(int32_t lo, int32_t hi) { return lo + (int32_t)(next_u32() % (uint32_t)(hi - lo + 1)); }

static const int32_t page_sizes[] = {1, 2, 3, 16, 64};

static size_t cache_bytes(const ina_kv_layout_t *l) {
  return (size_t)l->num_layers * (size_t)l->num_pages * (size_t)l->page_size * (size_t)l->entry_bytes;
}

/* A random page list of n distinct pages out of the cache's. */
static int32_t *random_pages(const ina_kv_layout_t *l, int consecutive) {
  int32_t *all = malloc((size_t)l->num_pages * sizeof *all);
  for (int32_t i = 0; i < l->num_pages; i++) all[i] = i;
  if (!consecutive)
    for (int32_t i = l->num_pages - 1; i > 0; i--) {
      const int32_t j = rand_in(0, i), t = all[i];
      all[i] = all[j];
      all[j] = t;
    }
  return all;
}

static uint8_t *token_byte(uint8_t *base, const ina_kv_layout_t *l, const int32_t *pages, int32_t layer, int64_t t) {
  return base + (((int64_t)layer * l->num_pages + pages[t / l->page_size]) * l->page_size + t % l->page_size) *
                    l->entry_bytes;
}

static void one_case(int trial, int consecutive) {
  ina_kv_layout_t src = {page_sizes[rand_in(0, 4)], 0, rand_in(1, 4), rand_in(1, 3) * 4};
  ina_kv_layout_t dst = src;
  dst.page_size = consecutive ? src.page_size : page_sizes[rand_in(0, 4)];
  const int64_t tokens = rand_in(1, 300);
  src.num_pages = (int32_t)((tokens + src.page_size - 1) / src.page_size) + rand_in(0, 5);
  dst.num_pages = (int32_t)((tokens + dst.page_size - 1) / dst.page_size) + rand_in(0, 5);
  int32_t *sp = random_pages(&src, consecutive), *dp = random_pages(&dst, consecutive);
  const int64_t from = consecutive ? 0 : rand_in(0, (int32_t)tokens - 1), to = consecutive ? tokens : rand_in((int32_t)from, (int32_t)tokens);
  const int32_t lb = consecutive ? 0 : rand_in(0, src.num_layers - 1);
  const int32_t le = consecutive ? src.num_layers : rand_in(lb, src.num_layers);
  uint8_t *s = malloc(cache_bytes(&src)), *d = malloc(cache_bytes(&dst));
  for (size_t i = 0; i < cache_bytes(&src); i++) s[i] = (uint8_t)next_u32();
  memset(d, 0xA5, cache_bytes(&dst));
  const int64_t cap = ina_kv_copy_max(&src, &dst, from, to, lb, le);
  ina_kv_copy_t *plan = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *plan);
  int64_t n = -1;
  CHECK_OK(ina_kv_copy_plan(&src, sp, &dst, dp, from, to, lb, le, plan, cap, &n));
  CHECKF(n >= 0 && n <= cap, "trial %d: %lld copies, max %lld", trial, (long long)n, (long long)cap);
  for (int64_t i = 0; i < n; i++) {
    CHECK(plan[i].src_offset + plan[i].bytes <= cache_bytes(&src));
    CHECK(plan[i].dst_offset + plan[i].bytes <= cache_bytes(&dst));
    if (plan[i].src_offset + plan[i].bytes <= cache_bytes(&src) && plan[i].dst_offset + plan[i].bytes <= cache_bytes(&dst))
      memcpy(d + plan[i].dst_offset, s + plan[i].src_offset, plan[i].bytes);
  }
  /* Expected: the planned tokens copied; everything else poison. */
  uint8_t *want = malloc(cache_bytes(&dst));
  memset(want, 0xA5, cache_bytes(&dst));
  for (int32_t layer = lb; layer < le; layer++)
    for (int64_t t = from; t < to; t++)
      memcpy(token_byte(want, &dst, dp, layer, t), token_byte(s, &src, sp, layer, t), (size_t)src.entry_bytes);
  int64_t bad = -1;
  for (size_t i = 0; i < cache_bytes(&dst) && bad < 0; i++)
    if (d[i] != want[i]) bad = (int64_t)i;
  CHECKF(bad < 0, "trial %d: page sizes %d -> %d, tokens [%lld, %lld), layers [%d, %d): byte %lld differs", trial,
         src.page_size, dst.page_size, (long long)from, (long long)to, lb, le, (long long)bad);
  if (consecutive) CHECKF(n == src.num_layers, "trial %d: %lld copies for %d layers of consecutive pages", trial,
                          (long long)n, src.num_layers);
  free(want);
  free(plan);
  free(s);
  free(d);
  free(sp);
  free(dp);
}

static void refusals(void) {
  const ina_kv_layout_t a = {16, 4, 2, 8}, b = {16, 4, 3, 8}, c = {16, 4, 2, 12};
  const int32_t pages[4] = {0, 1, 2, 3}, bad_pages[4] = {0, 4, 2, 3};
  ina_kv_copy_t out[64];
  int64_t n = 7;
  char why[160];
  CHECK(!ina_kv_layouts_compatible(&a, &b, why, sizeof why) && strstr(why, "layers"));
  CHECK(!ina_kv_layouts_compatible(&a, &c, why, sizeof why) && strstr(why, "bytes"));
  CHECK(ina_kv_layouts_compatible(&a, &a, why, sizeof why) && why[0] == '\0');
  CHECK(ina_kv_copy_plan(&a, pages, &b, pages, 0, 10, 0, 2, out, 64, &n) == INA_ERR_INVALID_ARGUMENT && n == 0);
  CHECK(ina_kv_copy_plan(&a, pages, &a, bad_pages, 0, 40, 0, 2, out, 64, &n) == INA_ERR_INVALID_ARGUMENT &&
        strstr(ina_last_error(), "destination page 1"));
  CHECK(ina_kv_copy_plan(&a, pages, &a, bad_pages, 0, 16, 0, 2, out, 64, &n) == INA_OK && n == 2);
  CHECK(ina_kv_copy_plan(&a, pages, &a, pages, 5, 4, 0, 2, out, 64, &n) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_kv_copy_plan(&a, pages, &a, pages, 0, 10, 1, 3, out, 64, &n) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_kv_copy_plan(&a, pages, &a, pages, 0, 64, 0, 2, out, 1, &n) == INA_ERR_INVALID_ARGUMENT &&
        strstr(ina_last_error(), "room"));
  CHECK(ina_kv_copy_plan(&a, pages, &a, pages, 3, 3, 0, 2, out, 0, &n) == INA_OK && n == 0);
}

int main(void) {
  rng_state ^= (uint64_t)time(NULL);
  printf("test_kv_copy: seed %llu\n", (unsigned long long)rng_state);
  for (int trial = 0; trial < 2000; trial++) one_case(trial, 0);
  for (int trial = 0; trial < 200; trial++) one_case(trial, 1);
  refusals();
  return test_finish("test_kv_copy");
}
