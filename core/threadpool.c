#define INA_LOG_SUBSYS "threadpool"
#include "core/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"

/* How it works. Worker threads live as long as the pool. ina_parallel_for writes the job
 * (fn, ctx, chunking) into the pool and publishes it through one atomic `state` word:
 *
 *   bits 63..32  generation: bumped for every job, so a worker can tell a new job
 *   bit  31      closed: the caller has finished its share; no worker may join any more
 *   bits 30..16  helpers wanted: how many workers may join (chunks - 1, at most size - 1)
 *   bits 15..0   active: workers that joined and have not left yet
 *
 * A worker joins with a compare-and-swap that checks generation, closed and the helper
 * limit all at once, so a late worker can never join a newer job by mistake, and the
 * caller never waits for a worker that is still asleep: after running chunks itself it
 * closes the job and waits only for the workers that actually joined. Chunks are claimed
 * from an atomic counter, which balances uneven work.
 *
 * Between jobs workers spin for a short while (decode steps issue hundreds of small
 * loops back to back, and a futex wake costs more than most of them), then sleep on a
 * condition variable. Spinning is skipped when the pool has more threads than CPUs. */

#define MAX_THREADS 1024 /* helpers wanted and active must fit their bit fields */
#define CHUNKS_PER_THREAD 4
#define SPIN_NS 50000 /* 50 us */

#define STATE_CLOSED (1ull << 31)
#define STATE_ACTIVE_MASK 0xFFFFull
#define STATE_WANTED_SHIFT 16
#define STATE_WANTED_MASK 0x7FFFull

static inline uint32_t state_generation(uint64_t s) { return (uint32_t)(s >> 32); }
static inline uint64_t state_active(uint64_t s) { return s & STATE_ACTIVE_MASK; }
static inline uint64_t state_wanted(uint64_t s) {
  return (s >> STATE_WANTED_SHIFT) & STATE_WANTED_MASK;
}

typedef struct worker {
  struct ina_threadpool *pool;
  int index; /* 1..size-1; the caller is worker 0 */
  pthread_t thread;
} worker_t;

struct ina_threadpool {
  int size;
  int spin; /* spin before sleeping (off when threads outnumber CPUs) */
  worker_t *workers;
  int started; /* worker threads running */

  pthread_mutex_t lock;
  pthread_cond_t wake; /* workers sleep here between jobs */
  pthread_cond_t done; /* the caller sleeps here until joined workers have left */
  int sleepers; /* workers blocked on `wake`; guarded by lock */
  atomic_int stop;

  _Atomic uint64_t state;
  uint32_t generation; /* the caller's copy of the last published generation */

  /* The current job: written by the caller before publishing `state`, read by workers
   * only after they joined, and not rewritten until every joined worker has left. */
  ina_parallel_fn fn;
  void *ctx;
  int64_t nchunks;
  int64_t chunk_base; /* chunk i has chunk_base items, plus one when i < chunk_extra */
  int64_t chunk_extra;
  _Atomic int64_t next_chunk;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Runs chunks until none is left. */
static void run_chunks(struct ina_threadpool *pool, int worker) {
  for (;;) {
    int64_t i = atomic_fetch_add_explicit(&pool->next_chunk, 1, memory_order_relaxed);
    if (i >= pool->nchunks) return;
    int64_t begin = i * pool->chunk_base + (i < pool->chunk_extra ? i : pool->chunk_extra);
    int64_t end = begin + pool->chunk_base + (i < pool->chunk_extra ? 1 : 0);
    pool->fn(pool->ctx, begin, end, worker);
  }
}

/* Waits until a generation other than `seen` is published or the pool stops; returns
 * the state observed. */
static uint64_t wait_for_job(struct ina_threadpool *pool, uint32_t seen) {
  uint64_t s = atomic_load_explicit(&pool->state, memory_order_acquire);
  if (pool->spin) {
    int64_t deadline = now_ns() + SPIN_NS;
    for (int i = 1; state_generation(s) == seen; i++) {
      if (atomic_load_explicit(&pool->stop, memory_order_relaxed)) break;
      if (i % 64 == 0 && now_ns() > deadline) break;
      cpu_relax();
      s = atomic_load_explicit(&pool->state, memory_order_acquire);
    }
  }
  if (state_generation(s) != seen) return s;
  pthread_mutex_lock(&pool->lock);
  for (;;) {
    s = atomic_load_explicit(&pool->state, memory_order_acquire);
    if (state_generation(s) != seen || atomic_load(&pool->stop)) break;
    pool->sleepers++;
    pthread_cond_wait(&pool->wake, &pool->lock);
    pool->sleepers--;
  }
  pthread_mutex_unlock(&pool->lock);
  return s;
}

/* Joins the job published as `s` if it is still open and short of helpers. */
static int try_join(struct ina_threadpool *pool, uint64_t s) {
  uint32_t generation = state_generation(s);
  for (;;) {
    if (state_generation(s) != generation || (s & STATE_CLOSED) ||
        state_active(s) >= state_wanted(s))
      return 0;
    if (atomic_compare_exchange_weak_explicit(&pool->state, &s, s + 1, memory_order_acq_rel,
                                              memory_order_acquire))
      return 1;
  }
}

static void leave_job(struct ina_threadpool *pool) {
  uint64_t now = atomic_fetch_sub_explicit(&pool->state, 1, memory_order_acq_rel) - 1;
  if ((now & STATE_CLOSED) && state_active(now) == 0) {
    /* The caller may be asleep waiting for the last worker out. */
    pthread_mutex_lock(&pool->lock);
    pthread_cond_signal(&pool->done);
    pthread_mutex_unlock(&pool->lock);
  }
}

static void *worker_main(void *arg) {
  worker_t *self = arg;
  struct ina_threadpool *pool = self->pool;
  uint32_t seen = 0; /* the pool starts at generation 0 with no job */
  for (;;) {
    uint64_t s = wait_for_job(pool, seen);
    if (atomic_load(&pool->stop)) return NULL;
    seen = state_generation(s);
    if (try_join(pool, s)) {
      run_chunks(pool, self->index);
      leave_job(pool);
    }
  }
}

/* Thread count from INA_NUM_THREADS, else the number of online CPUs. */
static ina_status_t default_thread_count(int *out) {
  ina_status_t st = INA_OK;
  const char *env = getenv("INA_NUM_THREADS");
  if (env && *env) {
    char *end = NULL;
    errno = 0;
    long v = strtol(env, &end, 10);
    INA_REQUIRE(errno == 0 && end != env && *end == '\0' && v >= 1 && v <= MAX_THREADS,
                INA_ERR_INVALID_ARGUMENT, "INA_NUM_THREADS=\"%s\" is not a thread count in 1..%d",
                env, MAX_THREADS);
    *out = (int)v;
    return INA_OK;
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  *out = cpus < 1 ? 1 : cpus > MAX_THREADS ? MAX_THREADS : (int)cpus;
fail:
  return st;
}

static void stop_and_join(struct ina_threadpool *pool) {
  pthread_mutex_lock(&pool->lock);
  atomic_store(&pool->stop, 1);
  pthread_cond_broadcast(&pool->wake);
  pthread_mutex_unlock(&pool->lock);
  for (int i = 0; i < pool->started; i++) pthread_join(pool->workers[i].thread, NULL);
  pool->started = 0;
}

ina_status_t ina_threadpool_create(int nthreads, ina_threadpool_t **out) {
  ina_status_t st = INA_OK;
  struct ina_threadpool *pool = NULL;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_threadpool_create: NULL out");
  *out = NULL;
  if (nthreads <= 0) INA_CHECK(default_thread_count(&nthreads));
  INA_REQUIRE(nthreads <= MAX_THREADS, INA_ERR_INVALID_ARGUMENT,
              "thread pool of %d threads exceeds the limit of %d", nthreads, MAX_THREADS);
  pool = calloc(1, sizeof *pool);
  INA_CHECK_ALLOC(pool);
  pool->size = nthreads;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  pool->spin = cpus >= nthreads;
  pthread_mutex_init(&pool->lock, NULL);
  pthread_cond_init(&pool->wake, NULL);
  pthread_cond_init(&pool->done, NULL);
  atomic_init(&pool->stop, 0);
  atomic_init(&pool->state, 0);
  atomic_init(&pool->next_chunk, 0);
  if (nthreads > 1) {
    pool->workers = calloc((size_t)nthreads - 1, sizeof *pool->workers);
    INA_CHECK_ALLOC(pool->workers);
  }
  for (int i = 0; i < nthreads - 1; i++) {
    worker_t *w = &pool->workers[i];
    w->pool = pool;
    w->index = i + 1;
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    INA_REQUIRE(rc == 0, INA_ERR_INTERNAL, "pthread_create failed for worker %d of %d: %s", i + 1,
                nthreads, strerror(rc));
    pool->started++;
  }
  *out = pool;
  return INA_OK;
fail:
  ina_threadpool_destroy(pool);
  return st;
}

void ina_threadpool_destroy(ina_threadpool_t *pool) {
  if (!pool) return;
  stop_and_join(pool);
  pthread_cond_destroy(&pool->done);
  pthread_cond_destroy(&pool->wake);
  pthread_mutex_destroy(&pool->lock);
  free(pool->workers);
  free(pool);
}

int ina_threadpool_size(const ina_threadpool_t *pool) { return pool ? pool->size : 1; }

/* Publishes the job now described in the pool, waking sleeping workers as needed. */
static void publish_job(struct ina_threadpool *pool, uint64_t helpers) {
  /* Generation 0 means "no job yet" to a fresh worker; skip it when the counter wraps. */
  if (++pool->generation == 0) pool->generation = 1;
  uint64_t s = ((uint64_t)pool->generation << 32) | (helpers << STATE_WANTED_SHIFT);
  pthread_mutex_lock(&pool->lock);
  atomic_store_explicit(&pool->state, s, memory_order_release);
  if ((uint64_t)pool->sleepers <= helpers) {
    if (pool->sleepers > 0) pthread_cond_broadcast(&pool->wake);
  } else {
    for (uint64_t i = 0; i < helpers; i++) pthread_cond_signal(&pool->wake);
  }
  pthread_mutex_unlock(&pool->lock);
}

static inline uint64_t active_workers(struct ina_threadpool *pool) {
  return state_active(atomic_load_explicit(&pool->state, memory_order_acquire));
}

/* Closes the job to latecomers and waits for the workers that joined it. */
static void close_job(struct ina_threadpool *pool) {
  uint64_t s = atomic_fetch_or_explicit(&pool->state, STATE_CLOSED, memory_order_acq_rel);
  if (state_active(s) == 0) return;
  if (pool->spin) {
    int64_t deadline = now_ns() + SPIN_NS;
    for (int i = 1; active_workers(pool) != 0; i++) {
      if (i % 64 == 0 && now_ns() > deadline) break;
      cpu_relax();
    }
  }
  pthread_mutex_lock(&pool->lock);
  while (active_workers(pool) != 0) pthread_cond_wait(&pool->done, &pool->lock);
  pthread_mutex_unlock(&pool->lock);
}

void ina_parallel_for(ina_threadpool_t *pool, int64_t n, int64_t grain, ina_parallel_fn fn,
                      void *ctx) {
  if (n <= 0 || fn == NULL) return;
  if (grain < 1) grain = 1;
  int size = ina_threadpool_size(pool);
  /* Every chunk gets at least `grain` items: at most n / grain chunks, balanced. */
  int64_t nchunks = n / grain;
  if (nchunks > (int64_t)size * CHUNKS_PER_THREAD) nchunks = (int64_t)size * CHUNKS_PER_THREAD;
  if (nchunks <= 1 || size == 1) {
    fn(ctx, 0, n, 0);
    return;
  }
  pool->fn = fn;
  pool->ctx = ctx;
  pool->nchunks = nchunks;
  pool->chunk_base = n / nchunks;
  pool->chunk_extra = n % nchunks;
  atomic_store_explicit(&pool->next_chunk, 0, memory_order_relaxed);
  int64_t helpers = nchunks - 1 < size - 1 ? nchunks - 1 : size - 1;
  publish_job(pool, (uint64_t)helpers);
  run_chunks(pool, 0);
  close_job(pool);
}
