/* Page pool: one host buffer of KV entries, a refcount per page and a stack of free
 * page ids per stripe. A stack makes alloc and free O(1) and hands back recently freed
 * pages first (warm in cache). */
#define INA_LOG_SUBSYS "kvcache"

#include "kvcache/page_pool.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* Storage alignment: a cache line, and enough for any vector load of one entry. */
#define POOL_ALIGNMENT 64

/* Bytes of the version-1 config: everything up to and including `device`. A caller
 * built against a newer header passes a larger struct_size; we read only these fields. */
#define POOL_CONFIG_V1_SIZE (offsetof(ina_page_pool_config_t, device) + sizeof(ina_device_t))

struct ina_page_pool {
  int32_t page_size;
  int32_t num_pages;
  int32_t num_layers;
  int32_t entry_elems;
  ina_dtype_t dtype;
  size_t entry_bytes;     /* entry_elems * dtype size */
  size_t page_bytes;      /* page_size * entry_bytes: one page of one layer */
  size_t layer_bytes;     /* num_pages * page_bytes */
  unsigned char *storage; /* [num_layers][num_pages][page_size][entry_elems]; NULL when
                             the pool stores no entries */
  int32_t *refcount;      /* [num_pages]; 0 means free */
  int32_t stripes;
  int32_t *free_stack;    /* [num_pages]: stripe s's free ids at [base[s], base[s] + free[s]) */
  int32_t *stripe_base, *stripe_free; /* [stripes] */
  int32_t num_free;       /* over every stripe */
};

/* a * b into *out; 0 when the product does not fit in size_t. */
static int mul_size(size_t a, size_t b, size_t *out) {
  if (a != 0 && b > SIZE_MAX / a) return 0;
  *out = a * b;
  return 1;
}

static ina_status_t validate_config(const ina_page_pool_config_t *c) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(c, POOL_CONFIG_V1_SIZE, "page pool: config", "INA_PAGE_POOL_CONFIG_INIT");
  INA_REQUIRE(c->page_size >= 1, INA_ERR_INVALID_ARGUMENT, "page pool: page_size %d must be >= 1",
              (int)c->page_size);
  INA_REQUIRE(c->num_pages >= 1, INA_ERR_INVALID_ARGUMENT, "page pool: num_pages %d must be >= 1",
              (int)c->num_pages);
  INA_REQUIRE(c->num_layers >= 1, INA_ERR_INVALID_ARGUMENT, "page pool: num_layers %d must be >= 1",
              (int)c->num_layers);
  INA_REQUIRE(c->entry_elems >= 1, INA_ERR_INVALID_ARGUMENT,
              "page pool: entry_elems %d must be >= 1", (int)c->entry_elems);
  INA_REQUIRE((int)c->dtype >= 0 && c->dtype < INA_DTYPE_COUNT, INA_ERR_INVALID_ARGUMENT,
              "page pool: dtype %d is not a valid ina_dtype_t", (int)c->dtype);
  INA_REQUIRE(c->struct_size < offsetof(ina_page_pool_config_t, stripes) + sizeof(int32_t) ||
                  (c->stripes >= 0 && c->stripes <= c->num_pages),
              INA_ERR_INVALID_ARGUMENT, "page pool: stripes %d outside 0..num_pages (%d)", (int)c->stripes,
              (int)c->num_pages);
  INA_REQUIRE(c->device.type == INA_DEVICE_CPU, INA_ERR_UNSUPPORTED,
              "page pool: device type %d (index %d) is not supported: this version keeps the "
              "KV cache in host memory only (use INA_CPU)",
              (int)c->device.type, c->device.index);
fail:
  return st;
}

ina_status_t ina_page_pool_create(const ina_page_pool_config_t *config, ina_page_pool_t **out) {
  ina_status_t st = INA_OK;
  ina_page_pool_t *pool = NULL;
  size_t total_bytes = 0;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "page pool: out is NULL");
  *out = NULL;
  INA_CHECK(validate_config(config));

  pool = calloc(1, sizeof *pool);
  INA_CHECK_ALLOC(pool);
  pool->page_size = config->page_size;
  pool->num_pages = config->num_pages;
  pool->num_layers = config->num_layers;
  pool->entry_elems = config->entry_elems;
  pool->dtype = config->dtype;
  /* store_entries is a version-2 field: read it only when the caller's struct has it. */
  const int store_entries =
      config->struct_size >= offsetof(ina_page_pool_config_t, store_entries) + sizeof(int)
          ? config->store_entries
          : 1;

  int sizes_fit =
      mul_size((size_t)config->entry_elems, ina_dtype_size(config->dtype), &pool->entry_bytes) &&
      mul_size(pool->entry_bytes, (size_t)config->page_size, &pool->page_bytes) &&
      mul_size(pool->page_bytes, (size_t)config->num_pages, &pool->layer_bytes) &&
      mul_size(pool->layer_bytes, (size_t)config->num_layers, &total_bytes) &&
      total_bytes <= SIZE_MAX - (POOL_ALIGNMENT - 1);
  INA_REQUIRE(sizes_fit, INA_ERR_INVALID_ARGUMENT,
              "page pool: storage of %d layers x %d pages x %d tokens x %d values of %s "
              "overflows size_t",
              (int)config->num_layers, (int)config->num_pages, (int)config->page_size,
              (int)config->entry_elems, ina_dtype_name(config->dtype));
  /* aligned_alloc wants a size that is a multiple of the alignment. */
  total_bytes = (total_bytes + POOL_ALIGNMENT - 1) / POOL_ALIGNMENT * POOL_ALIGNMENT;
  if (store_entries) pool->storage = aligned_alloc(POOL_ALIGNMENT, total_bytes);
  INA_REQUIRE(!store_entries || pool->storage != NULL, INA_ERR_OUT_OF_MEMORY,
              "page pool: cannot allocate %zu bytes of KV storage (%d layers x %d pages x %d "
              "tokens x %zu bytes)",
              total_bytes, (int)config->num_layers, (int)config->num_pages, (int)config->page_size,
              pool->entry_bytes);
  pool->refcount = calloc((size_t)config->num_pages, sizeof *pool->refcount);
  INA_CHECK_ALLOC(pool->refcount);
  pool->stripes = config->struct_size >= offsetof(ina_page_pool_config_t, stripes) + sizeof(int32_t) &&
                          config->stripes > 1
                      ? config->stripes
                      : 1;
  pool->free_stack = malloc((size_t)config->num_pages * sizeof *pool->free_stack);
  pool->stripe_base = malloc((size_t)pool->stripes * sizeof *pool->stripe_base);
  pool->stripe_free = malloc((size_t)pool->stripes * sizeof *pool->stripe_free);
  INA_CHECK_ALLOC(pool->free_stack);
  INA_CHECK_ALLOC(pool->stripe_base);
  INA_CHECK_ALLOC(pool->stripe_free);
  /* Each stripe's lowest page on top, so a fresh pool hands out a stripe's pages in
   * order (0, 1, 2, ... with one stripe). */
  for (int32_t s = 0, at = 0; s < pool->stripes; s++) {
    const int32_t count = (config->num_pages - s + pool->stripes - 1) / pool->stripes;
    pool->stripe_base[s] = at;
    pool->stripe_free[s] = count;
    for (int32_t i = 0; i < count; i++) pool->free_stack[at + i] = s + (count - 1 - i) * pool->stripes;
    at += count;
  }
  pool->num_free = config->num_pages;

  *out = pool;
  return INA_OK;
fail:
  ina_page_pool_destroy(pool);
  return st;
}

void ina_page_pool_destroy(ina_page_pool_t *pool) {
  if (!pool) return;
  free(pool->storage);
  free(pool->refcount);
  free(pool->free_stack);
  free(pool->stripe_base);
  free(pool->stripe_free);
  free(pool);
}

int32_t ina_page_pool_page_size(const ina_page_pool_t *pool) { return pool->page_size; }
int32_t ina_page_pool_num_pages(const ina_page_pool_t *pool) { return pool->num_pages; }
int32_t ina_page_pool_free_pages(const ina_page_pool_t *pool) { return pool->num_free; }
int32_t ina_page_pool_stripes(const ina_page_pool_t *pool) { return pool->stripes; }

int32_t ina_page_pool_stripe_free(const ina_page_pool_t *pool, int32_t stripe) {
  return stripe >= 0 && stripe < pool->stripes ? pool->stripe_free[stripe] : 0;
}

int32_t ina_page_pool_roomiest_stripe(const ina_page_pool_t *pool) {
  int32_t best = 0;
  for (int32_t s = 1; s < pool->stripes; s++)
    if (pool->stripe_free[s] > pool->stripe_free[best]) best = s;
  return best;
}
int32_t ina_page_pool_entry_elems(const ina_page_pool_t *pool) { return pool->entry_elems; }
int32_t ina_page_pool_num_layers(const ina_page_pool_t *pool) { return pool->num_layers; }
ina_dtype_t ina_page_pool_dtype(const ina_page_pool_t *pool) { return pool->dtype; }

static int page_in_range(const ina_page_pool_t *pool, int32_t page) {
  return page >= 0 && page < pool->num_pages;
}

ina_status_t ina_page_pool_alloc_in(ina_page_pool_t *pool, int32_t stripe, int32_t n, int32_t *pages) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(pool != NULL, INA_ERR_INVALID_ARGUMENT, "page pool alloc: pool is NULL");
  INA_REQUIRE(n >= 0, INA_ERR_INVALID_ARGUMENT, "page pool alloc: page count %d is negative",
              (int)n);
  INA_REQUIRE(n == 0 || pages != NULL, INA_ERR_INVALID_ARGUMENT,
              "page pool alloc: output array is NULL for %d pages", (int)n);
  INA_REQUIRE(stripe >= 0 && stripe < pool->stripes, INA_ERR_INVALID_ARGUMENT,
              "page pool alloc: stripe %d outside 0..%d", (int)stripe, (int)pool->stripes - 1);
  /* Checked before taking anything, so a failure leaves the pool untouched. */
  if (pool->stripes == 1)
    INA_REQUIRE(n <= pool->num_free, INA_ERR_OUT_OF_PAGES,
                "page pool: cannot allocate %d pages: only %d of %d free", (int)n,
                (int)pool->num_free, (int)pool->num_pages);
  else
    INA_REQUIRE(n <= pool->stripe_free[stripe], INA_ERR_OUT_OF_PAGES,
                "page pool: cannot allocate %d pages in stripe %d: only %d of its pages free (%d of %d "
                "in all)",
                (int)n, (int)stripe, (int)pool->stripe_free[stripe], (int)pool->num_free,
                (int)pool->num_pages);
  int32_t *stack = pool->free_stack + pool->stripe_base[stripe];
  for (int32_t i = 0; i < n; i++) {
    int32_t page = stack[--pool->stripe_free[stripe]];
    pool->refcount[page] = 1;
    pages[i] = page;
  }
  pool->num_free -= n;
fail:
  return st;
}

ina_status_t ina_page_pool_alloc(ina_page_pool_t *pool, int32_t n, int32_t *pages) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(pool != NULL, INA_ERR_INVALID_ARGUMENT, "page pool alloc: pool is NULL");
  return ina_page_pool_alloc_in(pool, ina_page_pool_roomiest_stripe(pool), n, pages);
fail:
  return st;
}

void ina_page_pool_ref(ina_page_pool_t *pool, int32_t page) {
  if (!page_in_range(pool, page) || pool->refcount[page] == 0) {
    /* Referencing a free page would hand it out twice; refuse instead. */
    ina_error(INA_LOG_SUBSYS, "page pool ref: page %d is %s (pool of %d pages); ignored", (int)page,
              page_in_range(pool, page) ? "free" : "out of range", (int)pool->num_pages);
    return;
  }
  if (pool->refcount[page] == INT32_MAX) {
    ina_error(INA_LOG_SUBSYS, "page pool ref: refcount of page %d would overflow; ignored",
              (int)page);
    return;
  }
  pool->refcount[page]++;
}

void ina_page_pool_unref(ina_page_pool_t *pool, int32_t page) {
  if (!page_in_range(pool, page) || pool->refcount[page] == 0) {
    /* Pushing a free page again would put it on the free list twice. */
    ina_error(INA_LOG_SUBSYS, "page pool unref: page %d is %s (pool of %d pages); ignored",
              (int)page, page_in_range(pool, page) ? "already free" : "out of range",
              (int)pool->num_pages);
    return;
  }
  if (--pool->refcount[page] == 0) {
    const int32_t s = page % pool->stripes;
    pool->free_stack[pool->stripe_base[s] + pool->stripe_free[s]++] = page;
    pool->num_free++;
  }
}

int32_t ina_page_pool_refcount(const ina_page_pool_t *pool, int32_t page) {
  return page_in_range(pool, page) ? pool->refcount[page] : 0;
}

void *ina_page_pool_entry(ina_page_pool_t *pool, int32_t layer, int32_t page, int32_t slot) {
  if (!pool->storage) {
    ina_error(INA_LOG_SUBSYS, "page pool entry: this pool stores no entries (store_entries 0)");
    return NULL;
  }
  if (layer < 0 || layer >= pool->num_layers || !page_in_range(pool, page) || slot < 0 ||
      slot >= pool->page_size) {
    ina_error(INA_LOG_SUBSYS,
              "page pool entry: (layer %d, page %d, slot %d) out of range (%d layers, %d "
              "pages, page_size %d)",
              (int)layer, (int)page, (int)slot, (int)pool->num_layers, (int)pool->num_pages,
              (int)pool->page_size);
    return NULL;
  }
  return pool->storage + (size_t)layer * pool->layer_bytes + (size_t)page * pool->page_bytes +
         (size_t)slot * pool->entry_bytes;
}

ina_tensor_t ina_page_pool_layer(ina_page_pool_t *pool, int32_t layer) {
  if (layer < 0 || layer >= pool->num_layers || !pool->storage) {
    if (pool->storage)
      ina_error(INA_LOG_SUBSYS, "page pool layer: layer %d out of range (%d layers)", (int)layer,
                (int)pool->num_layers);
    ina_tensor_t empty;
    memset(&empty, 0, sizeof empty);
    return empty;
  }
  const int64_t shape[3] = {pool->num_pages, pool->page_size, pool->entry_elems};
  return ina_tensor_wrap(pool->storage + (size_t)layer * pool->layer_bytes, pool->dtype, 3, shape,
                         INA_CPU);
}

void ina_page_pool_copy(ina_page_pool_t *pool, int32_t src, int32_t dst, int32_t ntokens) {
  if (!page_in_range(pool, src) || !page_in_range(pool, dst) || src == dst || ntokens < 0 ||
      ntokens > pool->page_size) {
    ina_error(INA_LOG_SUBSYS,
              "page pool copy: page %d -> page %d of %d tokens is invalid (%d pages, "
              "page_size %d); ignored",
              (int)src, (int)dst, (int)ntokens, (int)pool->num_pages, (int)pool->page_size);
    return;
  }
  if (!pool->storage) return; /* the entries live with the pool's owner */
  size_t bytes = (size_t)ntokens * pool->entry_bytes;
  for (int32_t layer = 0; layer < pool->num_layers; layer++) {
    unsigned char *base = pool->storage + (size_t)layer * pool->layer_bytes;
    memcpy(base + (size_t)dst * pool->page_bytes, base + (size_t)src * pool->page_bytes, bytes);
  }
}

ina_status_t ina_page_pool_check(const ina_page_pool_t *pool) {
  ina_status_t st = INA_OK;
  unsigned char *on_free_list = NULL;
  INA_REQUIRE(pool != NULL, INA_ERR_INVALID_ARGUMENT, "page pool check: pool is NULL");
  INA_REQUIRE(pool->num_free >= 0 && pool->num_free <= pool->num_pages, INA_ERR_INTERNAL,
              "page pool check: %d free pages in a pool of %d", (int)pool->num_free,
              (int)pool->num_pages);
  on_free_list = calloc((size_t)pool->num_pages, 1);
  INA_CHECK_ALLOC(on_free_list);
  int32_t listed = 0;
  for (int32_t s = 0; s < pool->stripes; s++) {
    for (int32_t i = 0; i < pool->stripe_free[s]; i++) {
      int32_t page = pool->free_stack[pool->stripe_base[s] + i];
      INA_REQUIRE(page_in_range(pool, page), INA_ERR_INTERNAL,
                  "page pool check: free list entry %d of stripe %d holds page %d, out of range (%d pages)",
                  (int)i, (int)s, (int)page, (int)pool->num_pages);
      INA_REQUIRE(page % pool->stripes == s, INA_ERR_INTERNAL,
                  "page pool check: page %d is on the free list of stripe %d", (int)page, (int)s);
      INA_REQUIRE(!on_free_list[page], INA_ERR_INTERNAL,
                  "page pool check: page %d is on the free list twice", (int)page);
      on_free_list[page] = 1;
    }
    listed += pool->stripe_free[s];
  }
  INA_REQUIRE(listed == pool->num_free, INA_ERR_INTERNAL, "page pool check: %d pages listed free, %d counted",
              (int)listed, (int)pool->num_free);
  for (int32_t page = 0; page < pool->num_pages; page++) {
    INA_REQUIRE(pool->refcount[page] >= 0, INA_ERR_INTERNAL,
                "page pool check: page %d has negative refcount %d", (int)page,
                (int)pool->refcount[page]);
    INA_REQUIRE((pool->refcount[page] == 0) == on_free_list[page], INA_ERR_INTERNAL,
                "page pool check: page %d has refcount %d but is %s the free list", (int)page,
                (int)pool->refcount[page], on_free_list[page] ? "on" : "not on");
  }
fail:
  free(on_free_list);
  return st;
}
