/* A fixed pool of pthreads for data-parallel loops on the CPU backend.
 *
 * ina_parallel_for splits [0, n) into contiguous chunks of at least `grain` items and
 * runs fn on them across the pool's threads plus the calling thread, returning when all
 * are done. One parallel_for at a time per pool (callers serialize); fn must not call
 * ina_parallel_for on the same pool. A NULL pool runs fn serially on the caller.
 *
 * Thread safety: create/destroy from one thread; parallel_for from one thread at a time. */
#ifndef INA_CORE_THREADPOOL_H
#define INA_CORE_THREADPOOL_H

#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_threadpool ina_threadpool_t;

/* fn processes items [begin, end); `worker` is in [0, size) and identifies the thread
 * (for per-thread scratch). */
typedef void (*ina_parallel_fn)(void *ctx, int64_t begin, int64_t end, int worker);

/* nthreads <= 0: INA_NUM_THREADS from the environment, else the number of online CPUs. */
ina_status_t ina_threadpool_create(int nthreads, ina_threadpool_t **out);
void ina_threadpool_destroy(ina_threadpool_t *pool);
/* Number of workers, the caller included (1 for NULL). */
int ina_threadpool_size(const ina_threadpool_t *pool);
void ina_parallel_for(ina_threadpool_t *pool, int64_t n, int64_t grain, ina_parallel_fn fn,
                      void *ctx);

#ifdef __cplusplus
}
#endif
#endif
