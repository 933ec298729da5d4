/* Copy plans between paged caches (kv_copy.h). */
#define INA_LOG_SUBSYS "kvcache"
#include "kvcache/kv_copy.h"

#include <stdio.h>

#include "core/check.h"

static int layout_valid(const ina_kv_layout_t *l) {
  return l && l->page_size >= 1 && l->num_pages >= 1 && l->num_layers >= 1 && l->entry_bytes >= 1;
}

int ina_kv_layouts_compatible(const ina_kv_layout_t *src, const ina_kv_layout_t *dst, char *why, int size) {
  char none[1];
  if (!why || size <= 0) why = none, size = 1;
  why[0] = '\0';
  if (!layout_valid(src) || !layout_valid(dst)) {
    snprintf(why, (size_t)size, "a KV layout is missing or has a count below 1");
    return 0;
  }
  if (src->num_layers != dst->num_layers) {
    snprintf(why, (size_t)size, "the caches have %d and %d layers", src->num_layers, dst->num_layers);
    return 0;
  }
  if (src->entry_bytes != dst->entry_bytes) {
    snprintf(why, (size_t)size, "a token's entry is %lld bytes in one cache and %lld in the other",
             (long long)src->entry_bytes, (long long)dst->entry_bytes);
    return 0;
  }
  return 1;
}

int64_t ina_kv_copy_max(const ina_kv_layout_t *src, const ina_kv_layout_t *dst, int64_t from, int64_t to,
                        int32_t layer_begin, int32_t layer_end) {
  if (!layout_valid(src) || !layout_valid(dst) || from < 0 || to <= from || layer_end <= layer_begin) return 0;
  /* A piece ends where either side's page ends: at most one piece per page boundary of
   * either side inside the range, plus one. */
  const int64_t pieces = (to - 1) / src->page_size - from / src->page_size + (to - 1) / dst->page_size -
                         from / dst->page_size + 1;
  return pieces * (int64_t)(layer_end - layer_begin);
}

static uint64_t offset_of(const ina_kv_layout_t *l, const int32_t *pages, int32_t layer, int64_t t) {
  const int64_t page = pages[t / l->page_size];
  return (uint64_t)((((int64_t)layer * l->num_pages + page) * l->page_size + t % l->page_size) * l->entry_bytes);
}

ina_status_t ina_kv_copy_plan(const ina_kv_layout_t *src, const int32_t *src_pages, const ina_kv_layout_t *dst,
                              const int32_t *dst_pages, int64_t from, int64_t to, int32_t layer_begin,
                              int32_t layer_end, ina_kv_copy_t *out, int64_t capacity, int64_t *count) {
  ina_status_t st = INA_OK;
  char why[160];
  int64_t n = 0;
  if (count) *count = 0;
  INA_REQUIRE(count != NULL, INA_ERR_INVALID_ARGUMENT, "kv copy plan: count is NULL");
  INA_REQUIRE(ina_kv_layouts_compatible(src, dst, why, (int)sizeof why), INA_ERR_INVALID_ARGUMENT,
              "kv copy plan: %s", why);
  INA_REQUIRE(src_pages && dst_pages, INA_ERR_INVALID_ARGUMENT, "kv copy plan: a page list is NULL");
  INA_REQUIRE(from >= 0 && from <= to, INA_ERR_INVALID_ARGUMENT, "kv copy plan: token range [%lld, %lld) is invalid",
              (long long)from, (long long)to);
  INA_REQUIRE(layer_begin >= 0 && layer_begin <= layer_end && layer_end <= src->num_layers,
              INA_ERR_INVALID_ARGUMENT, "kv copy plan: layers [%d, %d) are outside [0, %d)", layer_begin, layer_end,
              src->num_layers);
  if (from == to || layer_begin == layer_end) return INA_OK;
  /* Every page the range touches, on both sides, is inside its cache. */
  for (int64_t i = from / src->page_size; i <= (to - 1) / src->page_size; i++)
    INA_REQUIRE(src_pages[i] >= 0 && src_pages[i] < src->num_pages, INA_ERR_INVALID_ARGUMENT,
                "kv copy plan: source page %lld is %d, outside [0, %d)", (long long)i, src_pages[i], src->num_pages);
  for (int64_t i = from / dst->page_size; i <= (to - 1) / dst->page_size; i++)
    INA_REQUIRE(dst_pages[i] >= 0 && dst_pages[i] < dst->num_pages, INA_ERR_INVALID_ARGUMENT,
                "kv copy plan: destination page %lld is %d, outside [0, %d)", (long long)i, dst_pages[i],
                dst->num_pages);
  const int64_t max = ina_kv_copy_max(src, dst, from, to, layer_begin, layer_end);
  INA_REQUIRE(out != NULL && capacity >= max, INA_ERR_INVALID_ARGUMENT,
              "kv copy plan: room for %lld copies, %lld may be needed", (long long)capacity, (long long)max);
  for (int32_t layer = layer_begin; layer < layer_end; layer++) {
    const int64_t layer_first = n;
    for (int64_t t = from; t < to;) {
      const int64_t src_left = src->page_size - t % src->page_size, dst_left = dst->page_size - t % dst->page_size;
      int64_t len = src_left < dst_left ? src_left : dst_left;
      if (len > to - t) len = to - t;
      const ina_kv_copy_t c = {offset_of(src, src_pages, layer, t), offset_of(dst, dst_pages, layer, t),
                               (uint64_t)(len * src->entry_bytes)};
      ina_kv_copy_t *last = n > layer_first ? &out[n - 1] : NULL;
      if (last && last->src_offset + last->bytes == c.src_offset && last->dst_offset + last->bytes == c.dst_offset)
        last->bytes += c.bytes; /* continues the previous piece on both sides */
      else
        out[n++] = c;
      t += len;
    }
  }
  *count = n;
fail:
  return st;
}
