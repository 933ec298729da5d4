/* CUDA-event timing for the benchmarks (bench/bench_util.h). */
#define INA_LOG_SUBSYS "bench"
#include <stdlib.h>

#include "bench/bench_util.h"
#include "core/cuda_check.h"

static int compare_doubles(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

extern "C" ina_status_t ina_bench_time_ms(ina_bench_enqueue_fn enqueue, void *ctx,
                                          const ina_bench_timing_t *timing, double *median_ms) {
  ina_status_t st = INA_OK;
  cudaStream_t stream = NULL;
  cudaEvent_t start = NULL, stop = NULL;
  double *samples = NULL;
  int64_t iteration = 0;
  int batch = 0, launch = 0, total = 0;
  float ms = 0.0f;
  INA_REQUIRE(enqueue && timing && median_ms, INA_ERR_INVALID_ARGUMENT,
              "ina_bench_time_ms: NULL argument");
  INA_REQUIRE(timing->warmup_batches >= 0 && timing->batches > 0 &&
                  timing->launches_per_batch > 0,
              INA_ERR_INVALID_ARGUMENT,
              "ina_bench_time_ms: bad timing (warm-up %d, batches %d, launches per batch %d)",
              timing->warmup_batches, timing->batches, timing->launches_per_batch);
  *median_ms = 0.0;
  samples = (double *)malloc(sizeof *samples * (size_t)timing->batches);
  INA_CHECK_ALLOC(samples);
  INA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  INA_CUDA_CHECK(cudaEventCreate(&start));
  INA_CUDA_CHECK(cudaEventCreate(&stop));

  total = timing->warmup_batches + timing->batches;
  for (batch = 0; batch < total; batch++) {
    INA_CUDA_CHECK(cudaEventRecord(start, stream));
    for (launch = 0; launch < timing->launches_per_batch; launch++)
      INA_CHECK(enqueue(ctx, iteration++, stream));
    INA_CUDA_CHECK(cudaEventRecord(stop, stream));
    INA_CUDA_CHECK(cudaEventSynchronize(stop));
    INA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (batch >= timing->warmup_batches)
      samples[batch - timing->warmup_batches] = (double)ms / timing->launches_per_batch;
  }
  qsort(samples, (size_t)timing->batches, sizeof *samples, compare_doubles);
  *median_ms = timing->batches % 2
                   ? samples[timing->batches / 2]
                   : 0.5 * (samples[timing->batches / 2 - 1] + samples[timing->batches / 2]);
fail:
  if (start) cudaEventDestroy(start);
  if (stop) cudaEventDestroy(stop);
  if (stream) cudaStreamDestroy(stream);
  free(samples);
  return st;
}

namespace {

__global__ void empty_kernel() {}

ina_status_t launch_graph(void *exec, int64_t iteration, void *stream) {
  (void)iteration;
  ina_status_t st = INA_OK;
  INA_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec),
                                 static_cast<cudaStream_t>(stream)));
fail:
  return st;
}

}  // namespace

extern "C" ina_status_t ina_bench_time_graph_ms(ina_bench_enqueue_fn enqueue, void *ctx,
                                                int calls, const ina_bench_timing_t *timing,
                                                void *stream, double *median_ms) {
  ina_status_t st = INA_OK;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  bool capturing = false;
  INA_REQUIRE(enqueue && timing && median_ms && calls > 0 && timing->launches_per_batch == 1,
              INA_ERR_INVALID_ARGUMENT, "ina_bench_time_graph_ms: bad arguments (%d calls)",
              calls);
  *median_ms = 0.0;
  INA_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  capturing = true;
  for (int i = 0; i < calls; i++) INA_CHECK(enqueue(ctx, i, stream));
  capturing = false;
  INA_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  INA_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  INA_CHECK(ina_bench_time_ms(launch_graph, exec, timing, median_ms));
  *median_ms /= calls;
fail:
  if (capturing) {
    cudaGraph_t broken = NULL;
    if (cudaStreamEndCapture(s, &broken) == cudaSuccess && broken) cudaGraphDestroy(broken);
    (void)cudaGetLastError();
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  return st;
}

extern "C" ina_status_t ina_bench_launch_empty(int blocks, int threads, void *stream) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(blocks > 0 && threads > 0, INA_ERR_INVALID_ARGUMENT,
              "ina_bench_launch_empty: grid %d x %d", blocks, threads);
  empty_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>();
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
