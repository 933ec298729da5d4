/* The UCX engine's CUDA-memory path between MPI ranks on one host. Each rank keeps two
 * KV page pools in device memory (4 KiB pages, and 576-byte rows: 512 + 64 latent
 * values of one byte), registers them as INA_UCX_MEM_CUDA, and moves the scattered
 * pages of a page table the way a KV-page mover does: puts into the next rank of a
 * ring, gets from the previous one. Without UCX CUDA support (staged mode) the owner of
 * a pool syncs device → mirror before peers read it and mirror → device after peers
 * wrote it. Every byte of every pool is copied down and checked after each move.
 * Without a usable GPU on some rank, every rank reports skipped (exit 77), or fails under
 * INA_REQUIRE_GPU=1 (tests/test_util.h). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm/ucx_engine.h"
#include "core/cuda.h"
#include "core/log.h"
#include "tests/gpu_test_util.h"

#define NPOOLS 2
#define ROUNDS 4
#define WAIT_S 20.0
#define MAX_REPORTED_PAGES 8 /* per check, so a wholesale failure stays readable */
#define KEY_PAGES 8192       /* pages per pool stay below this (see page_key) */

#if defined(__SANITIZE_ADDRESS__)
#define BUILT_WITH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUILT_WITH_ASAN 1
#endif
#endif
#ifndef BUILT_WITH_ASAN
#define BUILT_WITH_ASAN 0
#endif

typedef struct pool {
  const char *name;
  size_t page_bytes;
  int pages;
  uint8_t *dev;  /* the pages, in device memory */
  uint8_t *host; /* host copy: filled then copied up, or copied down then checked */
  ina_ucx_region_t *region;
  uint64_t next_base, prev_base; /* this pool on the next / previous rank, as peers address it */
  /* The current page table: `pairs` moves of page src[i] (sending rank) to dst[i]
   * (receiving rank); from[p] is the source page that lands in page p, or -1. */
  int pairs;
  int *src, *dst, *from;
} pool_t;

typedef struct ctx {
  int rank, size, next, prev, local_rank, device;
  uint64_t seed;
  int staged; /* UCX lacks CUDA support: pools are reached through host mirrors */
  ina_ucx_engine_t *engine;
  ina_ucx_peer_t *to_next, *to_prev;
  pool_t pools[NPOOLS];
  ina_ucx_xfer_t *xfers; /* room for every pair of every pool */
} ctx_t;

/* --- data every rank can reproduce ------------------------------------------------- */

static uint64_t page_key(uint64_t tag, int page) { return tag * KEY_PAGES + (uint64_t)page; }

/* Byte i of `rank`'s page with `key`. */
static uint8_t pattern(uint64_t seed, int rank, uint64_t key, size_t i) {
  test_rng_t r = {seed ^ ((uint64_t)rank << 56) ^ (key << 16) ^ (i / 8)};
  return (uint8_t)(test_rng_next(&r) >> (8 * (i % 8)));
}

/* A distinct tag for each (round, operation, pool), so data left over from an earlier
 * move never passes for the expected data. */
static uint64_t move_tag(int round, ina_ucx_op_t op, int pool) {
  return 1 + ((uint64_t)round * 2 + (uint64_t)op) * NPOOLS + (uint64_t)pool;
}

/* The page table of `round`, the same on every rank. Destinations are distinct and no
 * source is a destination, so a rank never reads a page (nor its mirror copy) while a
 * peer writes it; sources may repeat (shared prefixes). Round 0 moves the first page to
 * the last (both ends of the region), round 1 half the pool, later rounds a random
 * number of pages. */
static void make_page_table(pool_t *pool, uint64_t seed, int round) {
  int pages = pool->pages;
  for (int p = 0; p < pages; p++) pool->from[p] = -1;
  if (round == 0) {
    pool->pairs = 1;
    pool->src[0] = 0;
    pool->dst[0] = pages - 1;
    pool->from[pages - 1] = 0;
    return;
  }
  test_rng_t r = {seed ^ ((uint64_t)round << 32) ^ pool->page_bytes};
  pool->pairs = round == 1 ? pages / 2 : (int)test_rng_int(&r, 2, pages / 4);
  int *is_dst = calloc((size_t)pages, sizeof *is_dst);
  for (int i = 0; i < pool->pairs; i++) {
    int p;
    do p = (int)test_rng_int(&r, 0, pages - 1);
    while (is_dst[p]);
    is_dst[p] = 1;
    pool->dst[i] = p;
  }
  for (int i = 0; i < pool->pairs; i++) {
    int p;
    do p = (int)test_rng_int(&r, 0, pages - 1);
    while (is_dst[p]);
    pool->src[i] = p;
    pool->from[pool->dst[i]] = p;
  }
  free(is_dst);
}

/* --- device pools: fill, copy down, check -------------------------------------------- */

static void fill_pool(ctx_t *c, pool_t *pool, uint64_t tag) {
  for (int p = 0; p < pool->pages; p++) {
    uint8_t *page = pool->host + (size_t)p * pool->page_bytes;
    for (size_t i = 0; i < pool->page_bytes; i++)
      page[i] = pattern(c->seed, c->rank, page_key(tag, p), i);
  }
  CHECK_OK(ina_cuda_memcpy_h2d(pool->dev, pool->host, (size_t)pool->pages * pool->page_bytes));
}

static int page_holds(const ctx_t *c, const uint8_t *page, size_t bytes, int rank, uint64_t key) {
  for (size_t i = 0; i < bytes; i++)
    if (page[i] != pattern(c->seed, rank, key, i)) return 0;
  return 1;
}

/* Copies the pool down and checks every byte: page p holds the previous rank's page
 * from[p] when `moved` (a page of the table), else this rank's own page p. */
static void check_pool(ctx_t *c, pool_t *pool, uint64_t tag, int moved, const char *what,
                       int round) {
  size_t bytes = (size_t)pool->pages * pool->page_bytes;
  memset(pool->host, 0xA5, bytes); /* a failed copy must not leave the fill behind */
  CHECK_OK(ina_cuda_memcpy_d2h(pool->host, pool->dev, bytes));
  int bad_pages = 0;
  for (int p = 0; p < pool->pages; p++) {
    int incoming = moved && pool->from[p] >= 0;
    int owner = incoming ? c->prev : c->rank, owner_page = incoming ? pool->from[p] : p;
    uint64_t key = page_key(tag, owner_page);
    const uint8_t *page = pool->host + (size_t)p * pool->page_bytes;
    size_t first = pool->page_bytes, differing = 0;
    for (size_t i = 0; i < pool->page_bytes; i++) {
      if (page[i] == pattern(c->seed, owner, key, i)) continue;
      if (first == pool->page_bytes) first = i;
      differing++;
    }
    if (differing == 0) continue;
    if (++bad_pages > MAX_REPORTED_PAGES) continue;
    const char *hint = "";
    if (incoming && page_holds(c, page, pool->page_bytes, c->rank, page_key(tag, p)))
      hint = " (the page still holds this rank's own data: the move or its mirror sync never "
             "reached the device)";
    fprintf(stderr,
            "rank %d: round %d %s: pool %s page %d (byte offset %zu in the pool), expected "
            "rank %d's page %d: %zu of %zu bytes differ, first at byte %zu: 0x%02x, expected "
            "0x%02x%s\n",
            c->rank, round, what, pool->name, p, (size_t)p * pool->page_bytes, owner, owner_page,
            differing, pool->page_bytes, first, page[first],
            pattern(c->seed, owner, key, first), hint);
  }
  CHECKF(bad_pages == 0, "rank %d: round %d %s: pool %s: %d of %d pages differ (%d listed above)",
         c->rank, round, what, pool->name, bad_pages, pool->pages,
         bad_pages < MAX_REPORTED_PAGES ? bad_pages : MAX_REPORTED_PAGES);
}

/* --- ordering and batches --------------------------------------------------------------- */

/* A barrier that keeps this rank's UCX worker progressing, so peers whose transfers
 * need the target's help finish while we wait. */
static void barrier(ctx_t *c) {
  MPI_Request req;
  int flag = 0;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  while (!flag) {
    ina_ucx_engine_progress(c->engine);
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
  }
}

static int agree(int ok_here) {
  int ok_everywhere = 0;
  MPI_Allreduce(&ok_here, &ok_everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok_everywhere;
}

static void run_batch(ina_ucx_peer_t *peer, ina_ucx_op_t op, const ina_ucx_xfer_t *x, size_t n) {
  ina_ucx_batch_t *batch = NULL;
  CHECK_OK(ina_ucx_post(peer, op, x, n, &batch));
  if (batch) CHECK_OK(ina_ucx_batch_wait(batch, WAIT_S));
  ina_ucx_batch_destroy(batch);
}

/* --- the moves ------------------------------------------------------------------------ */

/* Puts: this rank's source pages go into the next rank's destination pages, one batch
 * for both pools. Local device pointers are staged by the engine; the receiver syncs
 * its destination pages mirror → device once the batch has completed. */
static void move_by_put(ctx_t *c, int round) {
  for (int k = 0; k < NPOOLS; k++) fill_pool(c, &c->pools[k], move_tag(round, INA_UCX_PUT, k));
  barrier(c); /* the next rank's pools are filled before our pages land in them */
  size_t n = 0;
  for (int k = 0; k < NPOOLS; k++) {
    pool_t *pool = &c->pools[k];
    for (int i = 0; i < pool->pairs; i++)
      c->xfers[n++] = (ina_ucx_xfer_t){pool->dev + (size_t)pool->src[i] * pool->page_bytes,
                                       pool->next_base + (uint64_t)pool->dst[i] * pool->page_bytes,
                                       pool->page_bytes};
  }
  run_batch(c->to_next, INA_UCX_PUT, c->xfers, n);
  barrier(c); /* the previous rank's put batch completed, so its pages are at our end */
  if (c->staged) {
    /* They sit in the mirror: the device must still hold only our own data. */
    for (int k = 0; k < NPOOLS; k++)
      check_pool(c, &c->pools[k], move_tag(round, INA_UCX_PUT, k), 0, "put, before stage_in",
                 round);
  }
  for (int k = 0; k < NPOOLS; k++) {
    pool_t *pool = &c->pools[k];
    for (int i = 0; i < pool->pairs; i++)
      CHECK_OK(ina_ucx_region_stage_in(pool->region, (size_t)pool->dst[i] * pool->page_bytes,
                                       pool->page_bytes));
  }
  for (int k = 0; k < NPOOLS; k++)
    check_pool(c, &c->pools[k], move_tag(round, INA_UCX_PUT, k), 1, "put", round);
}

/* Gets: this rank's destination pages are read from the previous rank's source pages.
 * Every rank first syncs the source pages the next rank will read device → mirror;
 * the engine copies what a get brings into a local device pointer down to the device
 * before the batch completes. */
static void move_by_get(ctx_t *c, int round) {
  for (int k = 0; k < NPOOLS; k++) {
    pool_t *pool = &c->pools[k];
    fill_pool(c, pool, move_tag(round, INA_UCX_GET, k));
    for (int i = 0; i < pool->pairs; i++)
      CHECK_OK(ina_ucx_region_stage_out(pool->region, (size_t)pool->src[i] * pool->page_bytes,
                                        pool->page_bytes));
  }
  barrier(c); /* the previous rank's source pages are ready to be read */
  size_t n = 0;
  for (int k = 0; k < NPOOLS; k++) {
    pool_t *pool = &c->pools[k];
    for (int i = 0; i < pool->pairs; i++)
      c->xfers[n++] = (ina_ucx_xfer_t){pool->dev + (size_t)pool->dst[i] * pool->page_bytes,
                                       pool->prev_base + (uint64_t)pool->src[i] * pool->page_bytes,
                                       pool->page_bytes};
  }
  run_batch(c->to_prev, INA_UCX_GET, c->xfers, n);
  barrier(c); /* the next rank has read our pages before anyone refills a pool */
  for (int k = 0; k < NPOOLS; k++)
    check_pool(c, &c->pools[k], move_tag(round, INA_UCX_GET, k), 1, "get", round);
}

/* --- set-up ----------------------------------------------------------------------------- */

/* A CUDA region that is empty or has no base must be refused with
 * INA_ERR_INVALID_ARGUMENT, *out reset to NULL and a message naming the call. */
static void expect_refused(ctx_t *c, void *base, size_t bytes, const char *what) {
  ina_ucx_region_t *r = (ina_ucx_region_t *)(uintptr_t)1; /* must be reset */
  ina_status_t st = ina_ucx_region_register(c->engine, base, bytes, INA_UCX_MEM_CUDA, &r);
  CHECKF(st == INA_ERR_INVALID_ARGUMENT, "rank %d: CUDA region %s: status %d (%s)", c->rank, what,
         (int)st, st == INA_OK ? "accepted" : ina_last_error());
  CHECKF(r == NULL, "rank %d: CUDA region %s: *out not reset to NULL", c->rank, what);
  CHECKF(st == INA_OK || strstr(ina_last_error(), "ucx region register") != NULL,
         "rank %d: CUDA region %s: message does not name the call: %s", c->rank, what,
         ina_last_error());
  if (c->rank == 0 && st != INA_OK)
    printf("test_ucx_cuda: CUDA region %s refused: %s\n", what, ina_last_error());
  if (st == INA_OK) ina_ucx_region_deregister(r);
}

/* Needs no GPU: registration refuses these before touching the memory, so a host
 * address stands in for the non-NULL base. */
static void test_refused_regions(ctx_t *c) {
  char host_byte = 0;
  expect_refused(c, NULL, 4096, "with a NULL base");
  expect_refused(c, &host_byte, 0, "of 0 bytes");
  expect_refused(c, NULL, 0, "with a NULL base and 0 bytes");
}

static int node_local_rank(void) {
  MPI_Comm node;
  int rank = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &rank);
  MPI_Comm_free(&node);
  return rank;
}

/* Allocates, registers and checks the mode of one pool; 1 on success. */
static int setup_pool(ctx_t *c, pool_t *pool) {
  size_t bytes = (size_t)pool->pages * pool->page_bytes;
  pool->host = malloc(bytes);
  pool->src = calloc((size_t)pool->pages, sizeof(int));
  pool->dst = calloc((size_t)pool->pages, sizeof(int));
  pool->from = calloc((size_t)pool->pages, sizeof(int));
  CHECK(pool->host && pool->src && pool->dst && pool->from);
  void *dev = NULL;
  CHECK_OK(ina_cuda_malloc(c->device, bytes, &dev));
  pool->dev = dev;
  if (!pool->dev || !pool->host) return 0;
  CHECK_OK(ina_ucx_region_register(c->engine, pool->dev, bytes, INA_UCX_MEM_CUDA, &pool->region));
  if (!pool->region) return 0;
  uint64_t remote = ina_ucx_region_remote_base(pool->region);
  CHECKF(ina_ucx_region_is_staged(pool->region) == c->staged,
         "rank %d: pool %s: staged %d, but the engine says CUDA memory is %s", c->rank,
         pool->name, ina_ucx_region_is_staged(pool->region), c->staged ? "staged" : "direct");
  CHECKF(c->staged ? remote != (uint64_t)(uintptr_t)pool->dev
                   : remote == (uint64_t)(uintptr_t)pool->dev,
         "rank %d: pool %s: remote base 0x%llx, device base %p (%s mode)", c->rank, pool->name,
         (unsigned long long)remote, (void *)pool->dev, c->staged ? "staged" : "direct");
  return 1;
}

static void exchange_and_connect(ctx_t *c) {
  ina_ucx_region_t *regions[NPOOLS];
  for (int k = 0; k < NPOOLS; k++) regions[k] = c->pools[k].region;
  void *blob = NULL;
  size_t size = 0;
  CHECK_OK(ina_ucx_engine_pack_blob(c->engine, regions, NPOOLS, &blob, &size));
  int my_size = (int)size, *sizes = calloc((size_t)c->size, sizeof(int));
  MPI_Allgather(&my_size, 1, MPI_INT, sizes, 1, MPI_INT, MPI_COMM_WORLD);
  int max = 1;
  for (int r = 0; r < c->size; r++) max = sizes[r] > max ? sizes[r] : max;
  /* Fixed-size slots keep this a plain MPI_Allgather. */
  uint8_t *slot = calloc((size_t)max, 1), *all = calloc((size_t)max * (size_t)c->size, 1);
  if (blob) memcpy(slot, blob, size);
  MPI_Allgather(slot, max, MPI_BYTE, all, max, MPI_BYTE, MPI_COMM_WORLD);
  CHECK_OK(ina_ucx_peer_connect(c->engine, all + (size_t)c->next * max, (size_t)sizes[c->next],
                                &c->to_next));
  CHECK_OK(ina_ucx_peer_connect(c->engine, all + (size_t)c->prev * max, (size_t)sizes[c->prev],
                                &c->to_prev));
  if (c->to_next && c->to_prev) {
    CHECK(ina_ucx_peer_region_count(c->to_next) == NPOOLS);
    CHECK(ina_ucx_peer_region_count(c->to_prev) == NPOOLS);
    for (int k = 0; k < NPOOLS; k++) {
      pool_t *pool = &c->pools[k];
      uint64_t next_len = 0, prev_len = 0, bytes = (uint64_t)pool->pages * pool->page_bytes;
      CHECK_OK(ina_ucx_peer_region(c->to_next, (uint32_t)k, &pool->next_base, &next_len));
      CHECK_OK(ina_ucx_peer_region(c->to_prev, (uint32_t)k, &pool->prev_base, &prev_len));
      CHECKF(next_len == bytes && prev_len == bytes,
             "rank %d: pool %s: peers advertise %llu and %llu bytes, expected %llu", c->rank,
             pool->name, (unsigned long long)next_len, (unsigned long long)prev_len,
             (unsigned long long)bytes);
    }
  }
  free(slot);
  free(all);
  free(sizes);
  free(blob);
}

/* Everything that needs a GPU on every rank. */
static void run_on_gpus(ctx_t *c, int devices) {
  char name[160];
  c->device = c->local_rank % devices;
  printf("test_ucx_cuda: rank %d (local rank %d) uses GPU %d of %d: %s\n", c->rank,
         c->local_rank, c->device, devices, ina_cuda_device_name(c->device, name, sizeof name));
  c->staged = !ina_ucx_engine_has_cuda(c->engine);
  int ok = 1;
  for (int k = 0; k < NPOOLS; k++) ok = setup_pool(c, &c->pools[k]) && ok;
  size_t max_pairs = 0;
  for (int k = 0; k < NPOOLS; k++) max_pairs += (size_t)c->pools[k].pages;
  c->xfers = calloc(max_pairs, sizeof *c->xfers);
  CHECK(c->xfers != NULL);
  if (!agree(ok && c->xfers)) return;
  expect_refused(c, c->pools[0].dev, 0, "of 0 bytes at a device allocation");
  exchange_and_connect(c);
  if (!agree(c->to_next && c->to_prev)) return;
  if (c->rank == 0)
    printf("test_ucx_cuda: %d ranks, UCX CUDA memory %s\n", c->size,
           c->staged ? "staged (this UCX has no CUDA support: host mirrors, synced by the owner)"
                     : "direct (UCX reaches device memory itself)");
  for (int round = 0; round < ROUNDS; round++) {
    for (int k = 0; k < NPOOLS; k++) make_page_table(&c->pools[k], c->seed + 77, round);
    move_by_put(c, round);
    move_by_get(c, round);
    if (c->rank == 0)
      printf("test_ucx_cuda: round %d: %d pages of %s and %d of %s put and got\n", round,
             c->pools[0].pairs, c->pools[0].name, c->pools[1].pairs, c->pools[1].name);
  }
  CHECK_OK(ina_ucx_peer_flush(c->to_next, WAIT_S));
}

static void teardown(ctx_t *c) {
  /* Everyone is done with everyone's memory before anything is torn down. */
  barrier(c);
  ina_ucx_peer_disconnect(c->to_next);
  ina_ucx_peer_disconnect(c->to_prev);
  barrier(c);
  for (int k = 0; k < NPOOLS; k++) {
    pool_t *pool = &c->pools[k];
    ina_ucx_region_deregister(pool->region);
    ina_cuda_free(pool->dev);
    free(pool->host);
    free(pool->src);
    free(pool->dst);
    free(pool->from);
  }
  ina_ucx_engine_destroy(c->engine);
  free(c->xfers);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  ctx_t c = {
      .pools = {{.name = "4096-byte pages", .page_bytes = 4096, .pages = 256},
                {.name = "576-byte latent rows", .page_bytes = 576, .pages = 333}},
  };
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.size);
  c.next = (c.rank + 1) % c.size;
  c.prev = (c.rank + c.size - 1) % c.size;
  c.local_rank = node_local_rank();
  if (c.rank == 0) c.seed = test_seed("test_ucx_cuda");
  MPI_Bcast(&c.seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  ina_log_set_quiet_errors(1);

  CHECK_OK(ina_ucx_engine_create(&c.engine));
  int devices = ina_cuda_device_count();
  int runnable = agree(c.engine != NULL && devices > 0);
  if (c.engine) test_refused_regions(&c);
  int skipped = TEST_SKIP; /* the exit status when not runnable (test_skip_gpu's) */
  if (runnable) {
    run_on_gpus(&c, devices);
  } else if (devices == 0) {
    char reason[256], why[512];
    const char *none = ina_cuda_no_device_reason(reason, sizeof reason);
    snprintf(why, sizeof why, "rank %d sees no usable CUDA device: %s%s", c.rank,
             none ? none : "ina_cuda_device_count() is 0",
             BUILT_WITH_ASAN ? "; this build has AddressSanitizer: if there is a GPU, its driver "
                               "may need ASAN_OPTIONS=protect_shadow_gap=0 to start"
                             : "");
    skipped = test_skip_gpu("test_ucx_cuda", why);
  } else if (c.engine) {
    char why[128];
    snprintf(why, sizeof why, "rank %d has %d CUDA devices, but another rank has none", c.rank,
             devices);
    skipped = test_skip_gpu("test_ucx_cuda", why);
  }
  teardown(&c);

  int failed = test_checks_failed_, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  char name[64];
  snprintf(name, sizeof name, "test_ucx_cuda rank %d", c.rank);
  int rc = test_finish(name);
  MPI_Finalize();
  if (any_failed) return 1;
  return runnable ? rc : skipped;
}
