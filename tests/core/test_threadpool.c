/* Thread pool: every item of [0, n) is visited exactly once, chunks respect the grain,
 * worker ids are in range, the pool really runs chunks concurrently, and it stays
 * correct (and cheap) over many back-to-back small calls. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/threadpool.h"
#include "tests/test_util.h"

typedef struct {
  _Atomic int *visits; /* per item */
  int64_t n, grain;
  int size; /* pool size: worker ids must be below it */
  atomic_long bad_chunks; /* chunks shorter than the grain, or empty, or out of range */
  atomic_long bad_workers;
  atomic_long calls;
  _Atomic int64_t sum; /* sum of item values, to compare with the closed form */
} cover_ctx_t;

static void cover_fn(void *arg, int64_t begin, int64_t end, int worker) {
  cover_ctx_t *c = arg;
  atomic_fetch_add(&c->calls, 1);
  int64_t min_len = c->n < c->grain ? c->n : c->grain;
  if (begin < 0 || end > c->n || end - begin < (min_len > 1 ? min_len : 1))
    atomic_fetch_add(&c->bad_chunks, 1);
  if (worker < 0 || worker >= c->size) atomic_fetch_add(&c->bad_workers, 1);
  int64_t local = 0;
  for (int64_t i = begin; i < end && i < c->n; i++) {
    if (i >= 0) atomic_fetch_add_explicit(&c->visits[i], 1, memory_order_relaxed);
    local += i;
  }
  atomic_fetch_add(&c->sum, local);
}

/* Runs one parallel_for and checks coverage; returns 1 when everything held. */
static int check_cover(ina_threadpool_t *pool, int64_t n, int64_t grain) {
  cover_ctx_t c;
  memset(&c, 0, sizeof c);
  c.visits = calloc((size_t)(n > 0 ? n : 1), sizeof *c.visits);
  c.n = n;
  c.grain = grain < 1 ? 1 : grain;
  c.size = ina_threadpool_size(pool);
  ina_parallel_for(pool, n, grain, cover_fn, &c);
  long missed = 0;
  for (int64_t i = 0; i < n; i++) missed += atomic_load(&c.visits[i]) != 1;
  int64_t want_sum = n > 0 ? n * (n - 1) / 2 : 0;
  int ok = missed == 0 && atomic_load(&c.bad_chunks) == 0 && atomic_load(&c.bad_workers) == 0 &&
           atomic_load(&c.sum) == want_sum && (n > 0 || atomic_load(&c.calls) == 0);
  CHECKF(ok,
         "pool size %d, n %lld, grain %lld: %ld items not visited once, %ld bad chunks, %ld bad "
         "worker ids, "
         "%ld calls",
         c.size, (long long)n, (long long)grain, missed, atomic_load(&c.bad_chunks),
         atomic_load(&c.bad_workers), atomic_load(&c.calls));
  free(c.visits);
  return ok;
}

static void test_coverage(ina_threadpool_t *pool, test_rng_t *rng) {
  const int64_t ns[] = {0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 63, 64, 65, 100, 1000, 4097, 100003};
  const int64_t grains[] = {-5, 0, 1, 2, 3, 7, 64, 1000, 100003, 1000000};
  for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
    for (size_t g = 0; g < sizeof grains / sizeof grains[0]; g++)
      check_cover(pool, ns[i], grains[g]);
  for (int k = 0; k < 40; k++)
    check_cover(pool, test_rng_int(rng, 0, 5000), test_rng_int(rng, 1, 300));
}

/* Many small calls back to back, as a decode step makes them: per-worker partial sums
 * must add up every time. */
typedef struct {
  int64_t *partial; /* one slot per worker, padded to a cache line */
  const int64_t *values;
} sum_ctx_t;

static void sum_fn(void *arg, int64_t begin, int64_t end, int worker) {
  sum_ctx_t *c = arg;
  int64_t s = 0;
  for (int64_t i = begin; i < end; i++) s += c->values[i];
  c->partial[worker * 8] += s;
}

static void test_many_small_calls(ina_threadpool_t *pool, test_rng_t *rng, int calls) {
  int size = ina_threadpool_size(pool);
  int64_t values[512];
  for (int i = 0; i < 512; i++) values[i] = test_rng_int(rng, -1000, 1000);
  int64_t *partial = calloc((size_t)size * 8, sizeof *partial);
  sum_ctx_t c = {partial, values};
  long wrong = 0;
  struct timespec t0, t1;
  timespec_get(&t0, TIME_UTC);
  for (int k = 0; k < calls; k++) {
    int64_t n = 1 + k % 512;
    memset(partial, 0, (size_t)size * 8 * sizeof *partial);
    ina_parallel_for(pool, n, 1 + k % 3, sum_fn, &c);
    int64_t got = 0, want = 0;
    for (int w = 0; w < size; w++) got += partial[w * 8];
    for (int64_t i = 0; i < n; i++) want += values[i];
    wrong += got != want;
  }
  timespec_get(&t1, TIME_UTC);
  double us =
      ((double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3) / calls;
  printf("pool size %d: %d small parallel_for calls, %.2f us per call (incl. checking)\n", size,
         calls, us);
  CHECKF(wrong == 0, "pool size %d: %ld of %d small calls summed wrong", size, wrong, calls);
  free(partial);
}

/* With exactly `size` chunks that each wait until all `size` have started, the loop can
 * only finish if the pool runs them on distinct threads at the same time. */
typedef struct {
  atomic_int started;
  int size;
  atomic_int timed_out;
  atomic_int worker_seen[64];
} rendezvous_ctx_t;

static void rendezvous_fn(void *arg, int64_t begin, int64_t end, int worker) {
  rendezvous_ctx_t *c = arg;
  atomic_fetch_add(&c->started, 1);
  if (worker >= 0 && worker < 64) atomic_fetch_add(&c->worker_seen[worker], 1);
  struct timespec t0, now;
  timespec_get(&t0, TIME_UTC);
  while (atomic_load(&c->started) < c->size) {
    timespec_get(&now, TIME_UTC);
    if (now.tv_sec - t0.tv_sec > 20) {
      atomic_store(&c->timed_out, 1);
      return;
    }
  }
}

static void test_concurrency(ina_threadpool_t *pool) {
  rendezvous_ctx_t c;
  memset(&c, 0, sizeof c);
  c.size = ina_threadpool_size(pool);
  if (c.size > 64) return;
  /* Twice in a row: the second run finds the workers spinning or asleep, not fresh. */
  for (int round = 0; round < 2; round++) {
    atomic_store(&c.started, 0);
    for (int w = 0; w < 64; w++) atomic_store(&c.worker_seen[w], 0);
    ina_parallel_for(pool, c.size, 1, rendezvous_fn, &c);
    CHECKF(!atomic_load(&c.timed_out), "pool size %d did not run %d chunks concurrently", c.size,
           c.size);
    int distinct = 0;
    for (int w = 0; w < c.size; w++) distinct += atomic_load(&c.worker_seen[w]) == 1;
    CHECKF(distinct == c.size, "pool size %d: %d distinct worker ids", c.size, distinct);
  }
}

/* Workers that fall asleep between calls must still be woken. */
static void test_after_idle(ina_threadpool_t *pool) {
  struct timespec pause = {0, 150 * 1000 * 1000}; /* longer than the spin phase */
  nanosleep(&pause, NULL);
  check_cover(pool, 10000, 10);
  nanosleep(&pause, NULL);
  test_concurrency(pool);
}

static void test_create_and_env(void) {
  CHECK(ina_threadpool_size(NULL) == 1);
  ina_threadpool_destroy(NULL);

  const char *saved = getenv("INA_NUM_THREADS");
  char *saved_copy = saved ? strdup(saved) : NULL;
  ina_threadpool_t *pool = NULL;

  setenv("INA_NUM_THREADS", "3", 1);
  CHECK_OK(ina_threadpool_create(0, &pool));
  CHECK(ina_threadpool_size(pool) == 3);
  ina_threadpool_destroy(pool);
  CHECK_OK(ina_threadpool_create(-1, &pool));
  CHECK(ina_threadpool_size(pool) == 3);
  ina_threadpool_destroy(pool);
  /* An explicit count wins over the environment. */
  CHECK_OK(ina_threadpool_create(2, &pool));
  CHECK(ina_threadpool_size(pool) == 2);
  ina_threadpool_destroy(pool);

  ina_log_set_quiet_errors(1);
  const char *bad[] = {"abc", "0", "-2", "3x", "100000"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("INA_NUM_THREADS", bad[i], 1);
    pool = (ina_threadpool_t *)&pool; /* must be reset to NULL on failure */
    CHECK(ina_threadpool_create(0, &pool) == INA_ERR_INVALID_ARGUMENT);
    CHECK(pool == NULL);
    CHECK(strstr(ina_last_error(), bad[i]) != NULL);
  }
  CHECK(ina_threadpool_create(100000, &pool) == INA_ERR_INVALID_ARGUMENT);
  CHECK(pool == NULL);
  CHECK(ina_threadpool_create(2, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);

  unsetenv("INA_NUM_THREADS");
  CHECK_OK(ina_threadpool_create(0, &pool));
  CHECK(ina_threadpool_size(pool) >= 1);
  check_cover(pool, 1000, 1);
  ina_threadpool_destroy(pool);
  if (saved_copy) setenv("INA_NUM_THREADS", saved_copy, 1);
  free(saved_copy);
}

int main(void) {
  uint64_t seed = test_seed("test_threadpool");
  test_rng_t rng = {seed};
  test_create_and_env();

  /* NULL pool: serial, one call over the whole range from worker 0. */
  test_coverage(NULL, &rng);
  test_many_small_calls(NULL, &rng, 2000);

  for (int size = 1; size <= 4; size++) {
    ina_threadpool_t *pool = NULL;
    CHECK_OK(ina_threadpool_create(size, &pool));
    if (!pool) continue;
    CHECK(ina_threadpool_size(pool) == size);
    test_coverage(pool, &rng);
    test_concurrency(pool);
    test_many_small_calls(pool, &rng, 20000);
    test_after_idle(pool);
    ina_threadpool_destroy(pool);
  }
  /* Create and destroy in a loop: no leaked or stuck threads. */
  for (int k = 0; k < 50; k++) {
    ina_threadpool_t *pool = NULL;
    CHECK_OK(ina_threadpool_create(1 + k % 4, &pool));
    if (k % 2) check_cover(pool, 100, 1);
    ina_threadpool_destroy(pool);
  }
  return test_finish("test_threadpool");
}
