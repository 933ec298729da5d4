/* UCX puts and gets between MPI ranks on one host: every rank connects to the next and
 * previous rank of a ring (they coincide for two ranks), exchanges endpoint blobs with
 * MPI_Allgather, and moves random data of 1 byte .. 4 MB and scattered 4 KB pages of a
 * page pool. With --timeout-case, rank 1 stops progressing for a while and rank 0's
 * wait must time out instead of hanging. */
#include <mpi.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/ucx_engine.h"
#include "core/log.h"
#include "tests/test_util.h"

#define PAGE_BYTES 4096
#define POOL_PAGES 256
#define PAIRS 40
#define BIG_BYTES (4u << 20)
#define WAIT_S 20.0

typedef struct ctx {
  int rank, size, next, prev;
  uint64_t seed;
  ina_ucx_engine_t *engine;
  uint8_t *pool, *big;
  ina_ucx_region_t *pool_region, *big_region;
  ina_ucx_peer_t *to_next, *to_prev;
  uint64_t next_pool, next_big, prev_pool, prev_big; /* remote bases */
} ctx_t;

/* Byte i of the data that `rank` produces for `tag`: reproducible on every rank. */
static uint8_t pattern(uint64_t seed, int rank, uint64_t tag, size_t i) {
  test_rng_t r = {seed ^ ((uint64_t)rank << 48) ^ (tag << 24) ^ (i / 8)};
  return (uint8_t)(test_rng_next(&r) >> (8 * (i % 8)));
}
static void fill(uint8_t *p, size_t n, uint64_t seed, int rank, uint64_t tag) {
  for (size_t i = 0; i < n; i++) p[i] = pattern(seed, rank, tag, i);
}
static size_t first_mismatch(const uint8_t *p, size_t n, uint64_t seed, int rank, uint64_t tag) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern(seed, rank, tag, i)) return i;
  return n;
}

/* A barrier that keeps this rank's UCX worker progressing, so peers whose transfers
 * need the target's help (TCP's emulated RMA) finish while we wait. */
static void barrier(ctx_t *c) {
  MPI_Request req;
  int flag = 0;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  while (!flag) {
    ina_ucx_engine_progress(c->engine);
    MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
  }
}

static void run_batch(ctx_t *c, ina_ucx_peer_t *peer, ina_ucx_op_t op, const ina_ucx_xfer_t *x,
                      size_t n) {
  ina_ucx_batch_t *batch = NULL;
  CHECK_OK(ina_ucx_post(peer, op, x, n, &batch));
  if (batch) CHECK_OK(ina_ucx_batch_wait(batch, WAIT_S));
  ina_ucx_batch_destroy(batch);
}

static const size_t fixed_sizes[] = {1, 2, 3, 7, 8, 63, 4095, 4096, 4097, 65536, 1u << 20, BIG_BYTES};

/* Puts then gets of contiguous ranges; sizes and offsets follow from the shared seed. */
static void test_sizes(ctx_t *c, uint8_t *scratch) {
  size_t nfixed = sizeof fixed_sizes / sizeof fixed_sizes[0];
  for (size_t iter = 0; iter < nfixed + 6; iter++) {
    test_rng_t shape = {c->seed + 1000 + iter};
    size_t len = iter < nfixed ? fixed_sizes[iter] : (size_t)test_rng_int(&shape, 1, BIG_BYTES);
    size_t off = (size_t)test_rng_int(&shape, 0, (int64_t)(BIG_BYTES - len));
    uint64_t tag = 2 * iter;
    /* Put: my data lands in next's big buffer; prev's data lands in mine. */
    memset(c->big, 0xEE, BIG_BYTES);
    fill(scratch, len, c->seed, c->rank, tag);
    barrier(c);
    ina_ucx_xfer_t put = {scratch, c->next_big + off, len};
    run_batch(c, c->to_next, INA_UCX_PUT, &put, 1);
    barrier(c);
    size_t bad = first_mismatch(c->big + off, len, c->seed, c->prev, tag);
    CHECKF(bad == len, "rank %d: put of %zu bytes at offset %zu from rank %d: byte %zu differs",
           c->rank, len, off, c->prev, bad);
    CHECK(off == 0 || c->big[off - 1] == 0xEE);
    CHECK(off + len == BIG_BYTES || c->big[off + len] == 0xEE);
    /* Get: read the same range of next's big buffer after next filled it. */
    fill(c->big + off, len, c->seed, c->rank, tag + 1);
    memset(scratch, 0xEE, len + 1);
    barrier(c);
    ina_ucx_xfer_t get = {scratch, c->next_big + off, len};
    run_batch(c, c->to_next, INA_UCX_GET, &get, 1);
    bad = first_mismatch(scratch, len, c->seed, c->next, tag + 1);
    CHECKF(bad == len, "rank %d: get of %zu bytes at offset %zu from rank %d: byte %zu differs",
           c->rank, len, off, c->next, bad);
    CHECK(scratch[len] == 0xEE);
    barrier(c);
  }
}

/* A page table: PAIRS (src page, dst page) pairs, the same on every rank, with distinct
 * destinations and sources never among the destinations, so a rank's source pages are
 * not being written while it reads them. */
static void make_page_table(uint64_t seed, int *src, int *dst) {
  test_rng_t r = {seed};
  int used[POOL_PAGES] = {0};
  for (int i = 0; i < PAIRS; i++) {
    int p;
    do p = (int)test_rng_int(&r, 0, POOL_PAGES - 1);
    while (used[p]);
    used[p] = 1;
    dst[i] = p;
  }
  for (int i = 0; i < PAIRS; i++) {
    int p;
    do p = (int)test_rng_int(&r, 0, POOL_PAGES - 1);
    while (used[p]);
    src[i] = p;
  }
}

static void fill_pool(ctx_t *c, uint64_t tag) {
  for (int p = 0; p < POOL_PAGES; p++)
    fill(c->pool + (size_t)p * PAGE_BYTES, PAGE_BYTES, c->seed, c->rank, tag * POOL_PAGES + p);
}

/* Checks every page of my pool: moved pages hold `from`'s source page, others are mine. */
static void check_pool(ctx_t *c, uint64_t tag, int from, const int *src, const int *dst,
                       const char *what) {
  for (int p = 0; p < POOL_PAGES; p++) {
    int owner = c->rank, page = p;
    for (int i = 0; i < PAIRS; i++)
      if (dst[i] == p) owner = from, page = src[i];
    size_t bad = first_mismatch(c->pool + (size_t)p * PAGE_BYTES, PAGE_BYTES, c->seed, owner,
                                tag * POOL_PAGES + page);
    CHECKF(bad == PAGE_BYTES, "rank %d: %s: page %d (expected rank %d page %d) byte %zu differs",
           c->rank, what, p, owner, page, bad);
  }
}

static void test_page_table(ctx_t *c) {
  int src[PAIRS], dst[PAIRS];
  ina_ucx_xfer_t x[PAIRS];
  for (uint64_t round = 0; round < 3; round++) {
    make_page_table(c->seed + 77 + round, src, dst);
    uint64_t tag = 10 + 2 * round;
    /* Puts: my source pages go to next's destination pages. */
    fill_pool(c, tag);
    barrier(c);
    for (int i = 0; i < PAIRS; i++)
      x[i] = (ina_ucx_xfer_t){c->pool + (size_t)src[i] * PAGE_BYTES,
                              c->next_pool + (uint64_t)dst[i] * PAGE_BYTES, PAGE_BYTES};
    run_batch(c, c->to_next, INA_UCX_PUT, x, PAIRS);
    barrier(c);
    check_pool(c, tag, c->prev, src, dst, "page-table put");
    /* Gets: prev's source pages come into my destination pages. */
    fill_pool(c, tag + 1);
    barrier(c);
    for (int i = 0; i < PAIRS; i++)
      x[i] = (ina_ucx_xfer_t){c->pool + (size_t)dst[i] * PAGE_BYTES,
                              c->prev_pool + (uint64_t)src[i] * PAGE_BYTES, PAGE_BYTES};
    run_batch(c, c->to_prev, INA_UCX_GET, x, PAIRS);
    barrier(c);
    check_pool(c, tag + 1, c->prev, src, dst, "page-table get");
  }
}

/* Rank 1 stops progressing; rank 0's get must time out promptly, then complete once
 * rank 1 resumes. Not calling UCX is not deaf enough: over TCP, UCX's own thread in rank
 * 1 may serve the get. So rank 1 stops whole (SIGSTOP: every thread), and a child it
 * forked (no MPI, no UCX: it sleeps, signals and exits) wakes it with SIGCONT. */
static void test_timeout(ctx_t *c, uint8_t *scratch) {
  const double timeout_s = 0.5;
  barrier(c);
  if (c->rank == 1) {
    const pid_t self = getpid(), waker = fork();
    CHECK(waker >= 0);
    if (waker == 0) {
      sleep(3);
      kill(self, SIGCONT);
      _exit(0);
    }
    if (waker > 0) {
      raise(SIGSTOP); /* deaf: no thread of this process runs until the waker's SIGCONT */
      waitpid(waker, NULL, 0);
    } else {
      sleep(3);
    }
  } else if (c->rank == 0) {
    ina_ucx_xfer_t get = {scratch, c->next_big, 1u << 16};
    ina_ucx_batch_t *batch = NULL;
    CHECK_OK(ina_ucx_post(c->to_next, INA_UCX_GET, &get, 1, &batch));
    double t0 = MPI_Wtime();
    ina_status_t st = batch ? ina_ucx_batch_wait(batch, timeout_s) : INA_ERR_INTERNAL;
    double waited = MPI_Wtime() - t0;
    printf("test_ucx_transfer: wait on a deaf peer returned %d after %.3f s\n", (int)st, waited);
    CHECKF(st == INA_ERR_IO, "wait on a deaf peer: status %d after %.3f s", (int)st, waited);
    CHECK(strstr(ina_last_error(), "timed out") != NULL);
    CHECKF(waited >= timeout_s && waited < timeout_s + 1.0, "waited %.3f s", waited);
    /* Rank 1 answers again after its sleep: the same batch now completes. */
    if (batch) CHECK_OK(ina_ucx_batch_wait(batch, WAIT_S));
    ina_ucx_batch_destroy(batch);
  }
  barrier(c);
}

static void exchange_and_connect(ctx_t *c) {
  ina_ucx_region_t *regions[2] = {c->pool_region, c->big_region};
  void *blob = NULL;
  size_t size = 0;
  CHECK_OK(ina_ucx_engine_pack_blob(c->engine, regions, 2, &blob, &size));
  int my_size = (int)size, *sizes = calloc((size_t)c->size, sizeof(int));
  MPI_Allgather(&my_size, 1, MPI_INT, sizes, 1, MPI_INT, MPI_COMM_WORLD);
  int max = 0;
  for (int r = 0; r < c->size; r++) max = sizes[r] > max ? sizes[r] : max;
  /* Fixed-size slots keep this a plain MPI_Allgather. */
  uint8_t *slot = calloc((size_t)max, 1), *all = calloc((size_t)max * (size_t)c->size, 1);
  memcpy(slot, blob, size);
  MPI_Allgather(slot, max, MPI_BYTE, all, max, MPI_BYTE, MPI_COMM_WORLD);
  CHECK_OK(ina_ucx_peer_connect(c->engine, all + (size_t)c->next * max, (size_t)sizes[c->next],
                                &c->to_next));
  CHECK_OK(ina_ucx_peer_connect(c->engine, all + (size_t)c->prev * max, (size_t)sizes[c->prev],
                                &c->to_prev));
  uint64_t len;
  if (c->to_next && c->to_prev) {
    CHECK(ina_ucx_peer_region_count(c->to_next) == 2);
    CHECK_OK(ina_ucx_peer_region(c->to_next, 0, &c->next_pool, &len));
    CHECK(len == (uint64_t)POOL_PAGES * PAGE_BYTES);
    CHECK_OK(ina_ucx_peer_region(c->to_next, 1, &c->next_big, &len));
    CHECK(len == BIG_BYTES);
    CHECK_OK(ina_ucx_peer_region(c->to_prev, 0, &c->prev_pool, &len));
    CHECK_OK(ina_ucx_peer_region(c->to_prev, 1, &c->prev_big, &len));
  }
  free(slot);
  free(all);
  free(sizes);
  free(blob);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int timeout_case = argc > 1 && strcmp(argv[1], "--timeout-case") == 0;
  ctx_t c = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.size);
  c.next = (c.rank + 1) % c.size;
  c.prev = (c.rank + c.size - 1) % c.size;
  if (c.rank == 0) c.seed = test_seed("test_ucx_transfer");
  MPI_Bcast(&c.seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  ina_log_set_quiet_errors(1);

  int ok_local = 1, ok_all = 0;
  CHECK_OK(ina_ucx_engine_create(&c.engine));
  c.pool = malloc((size_t)POOL_PAGES * PAGE_BYTES);
  c.big = malloc(BIG_BYTES);
  uint8_t *scratch = malloc(BIG_BYTES + 1);
  if (c.engine) {
    CHECK_OK(ina_ucx_region_register(c.engine, c.pool, (size_t)POOL_PAGES * PAGE_BYTES,
                                     INA_UCX_MEM_HOST, &c.pool_region));
    CHECK_OK(ina_ucx_region_register(c.engine, c.big, BIG_BYTES, INA_UCX_MEM_HOST, &c.big_region));
  }
  ok_local = c.engine && c.pool_region && c.big_region;
  MPI_Allreduce(&ok_local, &ok_all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (ok_all) exchange_and_connect(&c);
  ok_local = c.to_next && c.to_prev;
  MPI_Allreduce(&ok_local, &ok_all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (ok_all) {
    if (c.rank == 0 && c.engine)
      printf("test_ucx_transfer: %d ranks, UCX CUDA memory %s\n", c.size,
             ina_ucx_engine_has_cuda(c.engine) ? "supported" : "not supported");
    if (timeout_case) {
      test_timeout(&c, scratch);
    } else {
      test_sizes(&c, scratch);
      test_page_table(&c);
    }
    CHECK_OK(ina_ucx_peer_flush(c.to_next, WAIT_S));
  }
  /* Everyone is done with everyone's memory before anything is torn down. */
  barrier(&c);
  ina_ucx_peer_disconnect(c.to_next);
  ina_ucx_peer_disconnect(c.to_prev);
  barrier(&c);
  ina_ucx_region_deregister(c.pool_region);
  ina_ucx_region_deregister(c.big_region);
  ina_ucx_engine_destroy(c.engine);
  free(c.pool);
  free(c.big);
  free(scratch);

  int failed = test_checks_failed_, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  char name[64];
  snprintf(name, sizeof name, "test_ucx_transfer rank %d", c.rank);
  int rc = test_finish(name);
  MPI_Finalize();
  return any_failed ? 1 : rc;
}
