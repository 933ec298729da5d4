/* Host cost of the MLA scheduler (ina_mla_plan): median wall time of one plan for decode
 * and speculative (MTP, two query tokens) steps at batch 256 and 1, with 16 heads and
 * DeepSeek-V3's 128. The target is <= 20 us at batch 256. The sparse plan of
 * DeepSeek-V3.2 (ina_mla_sparse_plan, top-k 2048: every query token a unit of its own)
 * is timed the same way on decode, MTP and a prefill chunk.
 *
 * Two figures per shape, each the median over RUNS calls:
 *   host        the plan alone: the schedule is written to the host workspace only
 *               (device_ws = NULL) for a 132-SM grid (one H200). Runs without a GPU.
 *   with_copy   (with a device) the plan into pinned memory plus the enqueueing of the
 *               asynchronous copy of the schedule into a device workspace, on a stream
 *               of its own: what a serving step pays on the host. A step plans once and
 *               its copy is the only one in flight, so every timed call starts with the
 *               stream idle: the stream is synchronized before each call, outside the
 *               timed region. The copy itself runs after the call returns and is not
 *               timed. Like a step's plan, each call writes into a workspace that the
 *               previous copy read by DMA, which on the H200 host leaves it out of the
 *               CPU's caches: the plan itself then takes longer than in `host`.
 *               (Back-to-back plans without the wait fill the copy queue, and the host
 *               call ends up waiting for the DMA of earlier copies; they also plan into
 *               a host workspace that a pending copy still reads.) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "core/cuda.h"
#include "core/log.h"
#include "mla/mla.h"

#if INA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define NUM_SMS 132
#define RUNS 2001

typedef struct shape {
  const char *name;
  int32_t batch, max_batch, q_len, heads;
  int32_t kv_min, kv_max;
  int32_t topk; /* > 0: the sparse plan with this top-k */
} shape_t;

/* One step's plan, dense or sparse. */
typedef struct planner {
  ina_mla_plan_params_t dense;
  ina_mla_sparse_plan_params_t sparse;
  int is_sparse;
} planner_t;

static ina_status_t plan_once(const planner_t *p, void *host_ws, void *device_ws, void *stream,
                              ina_mla_plan_info_t *info) {
  return p->is_sparse ? ina_mla_sparse_plan(&p->sparse, host_ws, device_ws, stream, info)
                      : ina_mla_plan(&p->dense, host_ws, device_ws, stream, info);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int compare_doubles(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Waits, outside the timed region, until the stream has run everything enqueued on it:
 * the copies of earlier samples. NULL (host-only figures): nothing to wait for. */
static int wait_idle(void *stream) {
#if INA_HAVE_CUDA
  if (stream) return cudaStreamSynchronize((cudaStream_t)stream) == cudaSuccess;
#endif
  return 1;
}

/* Median microseconds of RUNS plans (after a few for warm-up), each starting with
 * `stream` idle. */
static int time_plan(const planner_t *p, void *host_ws, void *device_ws, void *stream, double *median_us) {
  static double samples[RUNS];
  ina_mla_plan_info_t info;
  for (int i = 0; i < 10; i++)
    if (!wait_idle(stream) || plan_once(p, host_ws, device_ws, stream, &info) != INA_OK) return 0;
  for (int i = 0; i < RUNS; i++) {
    if (!wait_idle(stream)) return 0;
    const double t0 = now_us();
    const ina_status_t st = plan_once(p, host_ws, device_ws, stream, &info);
    samples[i] = now_us() - t0;
    if (st != INA_OK) return 0;
  }
  if (!wait_idle(stream)) return 0;
  qsort(samples, RUNS, sizeof *samples, compare_doubles);
  *median_us = samples[RUNS / 2];
  return 1;
}

int main(void) {
  static const shape_t shapes[] = {
      {"decode_b256_h16", 256, 256, 1, 16, 1024, 32768, 0},
      {"decode_b1_h16", 1, 256, 1, 16, 8192, 8192, 0},
      {"mtp2_b256_h16", 256, 256, 2, 16, 1024, 32768, 0},
      {"decode_b256_h128", 256, 256, 1, 128, 1024, 32768, 0},
      {"decode_b1_h128", 1, 256, 1, 128, 8192, 8192, 0},
      {"mtp2_b256_h128", 256, 256, 2, 128, 1024, 32768, 0},
      {"sparse_decode_b256_h16_k2048", 256, 256, 1, 16, 1024, 32768, 2048},
      {"sparse_mtp2_b128_h128_k2048", 128, 128, 2, 128, 1024, 32768, 2048},
      {"sparse_prefill_4096_h128_k2048", 1, 1, 4096, 128, 8192, 8192, 2048},
  };
  static int32_t qo[257], kv[256];
  const int have_device = ina_cuda_device_count() > 0;
  int failed = 0;
  uint64_t seed = 12345;
  printf("bench_mla_plan: %d-SM grid%s\n", NUM_SMS, have_device ? "" : " (no device: host-only figures)");

  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    const shape_t *sh = &shapes[s];
    qo[0] = 0;
    for (int32_t b = 0; b < sh->batch; b++) {
      seed = seed * 6364136223846793005ull + 1442695040888963407ull;
      qo[b + 1] = qo[b] + sh->q_len;
      kv[b] = sh->kv_min + (int32_t)((seed >> 33) % (uint64_t)(sh->kv_max - sh->kv_min + 1));
    }
    planner_t p = {INA_MLA_PLAN_PARAMS_INIT, INA_MLA_SPARSE_PLAN_PARAMS_INIT, sh->topk > 0};
    p.dense.batch = sh->batch;
    p.dense.max_batch = sh->max_batch;
    p.dense.max_q_len = sh->q_len;
    p.dense.qo_indptr = qo;
    p.dense.kv_len = kv;
    p.dense.num_heads = sh->heads;
    p.dense.num_sms = NUM_SMS;
    p.sparse.batch = sh->batch;
    p.sparse.max_tokens = sh->max_batch * sh->q_len;
    p.sparse.qo_indptr = qo;
    p.sparse.kv_len = kv;
    p.sparse.topk = sh->topk > 0 ? sh->topk : 1;
    p.sparse.num_heads = sh->heads;
    p.sparse.num_sms = NUM_SMS;
    size_t host_bytes = 0, device_bytes = 0;
    void *host_ws = NULL;
    double us = 0;
    char name[96], formula[256];
    const ina_status_t sized = p.is_sparse ? ina_mla_sparse_workspace_size(&p.sparse, &host_bytes, &device_bytes)
                                           : ina_mla_workspace_size(&p.dense, &host_bytes, &device_bytes);
    if (sized != INA_OK || !(host_ws = malloc(host_bytes)) ||
        !time_plan(&p, host_ws, NULL, NULL, &us)) {
      fprintf(stderr, "bench_mla_plan: %s: %s\n", sh->name, ina_last_error());
      free(host_ws);
      failed = 1;
      continue;
    }
    snprintf(name, sizeof name, "mla_plan_%s_host", sh->name);
    snprintf(formula, sizeof formula,
             "median wall time of %s over %d runs, host workspace only (%zu bytes), "
             "kv_len uniform in [%d, %d], q_len %d, %d SMs",
             p.is_sparse ? "ina_mla_sparse_plan (each query token its top-k)" : "ina_mla_plan", RUNS, host_bytes,
             sh->kv_min, sh->kv_max, sh->q_len, NUM_SMS);
    ina_bench_result(name, us, "us", formula);
    free(host_ws);
    host_ws = NULL;
#if INA_HAVE_CUDA
    if (have_device) {
      void *device_ws = NULL;
      cudaStream_t stream = NULL;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess ||
          cudaHostAlloc(&host_ws, host_bytes, cudaHostAllocDefault) != cudaSuccess ||
          cudaMalloc(&device_ws, device_bytes) != cudaSuccess || !time_plan(&p, host_ws, device_ws, stream, &us)) {
        fprintf(stderr, "bench_mla_plan: %s with copy: failed (%s; CUDA: %s)\n", sh->name, ina_last_error(),
                cudaGetErrorString(cudaGetLastError()));
        failed = 1;
      } else {
        snprintf(name, sizeof name, "mla_plan_%s_with_copy", sh->name);
        snprintf(formula, sizeof formula,
                 "median wall time of ina_mla_plan incl. enqueueing its cudaMemcpyAsync of the schedule "
                 "(<= %zu bytes, pinned) over %d runs, each starting on an idle stream (synchronized "
                 "outside the timed region); the copy itself is not timed",
                 host_bytes, RUNS);
        ina_bench_result(name, us, "us", formula);
      }
      if (stream) {
        cudaStreamSynchronize(stream);
        cudaStreamDestroy(stream);
      }
      if (host_ws) cudaFreeHost(host_ws);
      if (device_ws) cudaFree(device_ws);
      host_ws = NULL;
    }
#endif
  }
  ina_bench_print_json("mla_plan");
  return failed;
}
