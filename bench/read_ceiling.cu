/* The device's memory ceilings (bench/bench_util.h), measured rather than taken from a
 * datasheet:
 *   read:  a read-only reduction (xor of every 16-byte word) over a 1 GiB slice; the
 *          slices of a 4 GiB buffer rotate between runs, so no run starts with its data
 *          in L2 (50 MiB on an H200). A persistent grid of grid-stride threads keeps
 *          kUnroll independent 16-byte loads in flight each; several unroll depths are
 *          timed and the fastest is the ceiling.
 *   copy:  cudaMemcpyAsync device-to-device between rotating slices, counting bytes read
 *          plus bytes written. */
#define INA_LOG_SUBSYS "bench"
#include <stdio.h>

#include "bench/bench_util.h"
#include "core/cuda_check.h"

namespace {

constexpr int kReadThreads = 512;
constexpr int kSlices = 4;
constexpr size_t kMaxBufferBytes = (size_t)4 << 30;
constexpr size_t kMinBufferBytes = (size_t)1 << 30; /* slices of 256 MiB: still 5x L2 */
constexpr int kWarmupRuns = 10;
constexpr int kTimedRuns = 50;

/* Reads n 16-byte words; the result only escapes through an improbable store, so the
 * loads cannot be dropped and nothing is written in practice. */
template <int kUnroll>
__global__ void __launch_bounds__(kReadThreads)
    read_reduce_kernel(const uint4 *__restrict__ src, int64_t n, uint32_t *sink) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t acc = 0;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; u++) v[u] = __ldg(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldg(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

typedef void (*read_kernel_t)(const uint4 *, int64_t, uint32_t *);

struct ReadVariant {
  const char *name;
  read_kernel_t kernel;
};

const ReadVariant kReadVariants[] = {
    {"xor-reduce unroll 2", read_reduce_kernel<2>},
    {"xor-reduce unroll 4", read_reduce_kernel<4>},
    {"xor-reduce unroll 8", read_reduce_kernel<8>},
};

struct RunCtx {
  uint8_t *buffer;
  size_t slice_bytes;
  read_kernel_t kernel;
  int grid;
  uint32_t *sink;
};

ina_status_t enqueue_read(void *ctx, int64_t iteration, void *stream) {
  ina_status_t st = INA_OK;
  const RunCtx *c = static_cast<const RunCtx *>(ctx);
  const uint4 *src = reinterpret_cast<const uint4 *>(c->buffer + (size_t)(iteration % kSlices) *
                                                                     c->slice_bytes);
  c->kernel<<<c->grid, kReadThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      src, (int64_t)(c->slice_bytes / sizeof(uint4)), c->sink);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}

/* Slice k goes to slice k + 2: source and destination never overlap. */
ina_status_t enqueue_copy(void *ctx, int64_t iteration, void *stream) {
  ina_status_t st = INA_OK;
  const RunCtx *c = static_cast<const RunCtx *>(ctx);
  const size_t from = (size_t)(iteration % kSlices), to = (from + 2) % kSlices;
  INA_CUDA_CHECK(cudaMemcpyAsync(c->buffer + to * c->slice_bytes, c->buffer + from * c->slice_bytes,
                                 c->slice_bytes, cudaMemcpyDeviceToDevice,
                                 static_cast<cudaStream_t>(stream)));
fail:
  return st;
}

double terabytes_per_s(double bytes, double ms) { return bytes / (ms * 1e-3) / 1e12; }

}  // namespace

extern "C" ina_status_t ina_bench_measure_ceilings(ina_bench_ceilings_t *out) {
  ina_status_t st = INA_OK;
  const ina_bench_timing_t timing = {kWarmupRuns, kTimedRuns, 1};
  RunCtx ctx = {NULL, 0, NULL, 0, NULL};
  size_t free_bytes = 0, total_bytes = 0, buffer_bytes = kMaxBufferBytes;
  int device = 0, sms = 0, blocks_per_sm = 0;
  double ms = 0.0, tbs = 0.0;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_bench_measure_ceilings: out is NULL");
  *out = ina_bench_ceilings_t{};

  INA_CUDA_CHECK(cudaGetDevice(&device));
  INA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  INA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  while (buffer_bytes > free_bytes / 2 && buffer_bytes > kMinBufferBytes) buffer_bytes /= 2;
  INA_REQUIRE(buffer_bytes <= free_bytes / 2, INA_ERR_OUT_OF_MEMORY,
              "ina_bench_measure_ceilings: %zu bytes free on device %d, need %zu", free_bytes,
              device, 2 * buffer_bytes);
  INA_CUDA_CHECK(cudaMalloc(&ctx.buffer, buffer_bytes));
  INA_CUDA_CHECK(cudaMalloc(&ctx.sink, sizeof *ctx.sink));
  ctx.slice_bytes = buffer_bytes / kSlices;
  /* Never time on zeros. */
  INA_CHECK(ina_bench_fill_random_bf16(reinterpret_cast<uint16_t *>(ctx.buffer),
                                       buffer_bytes / 2, 0x5EEDull, 1.0f));

  out->read_bytes = (int64_t)ctx.slice_bytes;
  out->copy_bytes = (int64_t)ctx.slice_bytes;
  out->buffer_bytes = (int64_t)buffer_bytes;
  out->runs = kTimedRuns;
  for (const ReadVariant &v : kReadVariants) {
    INA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, v.kernel,
                                                                 kReadThreads, 0));
    ctx.kernel = v.kernel;
    ctx.grid = sms * (blocks_per_sm > 0 ? blocks_per_sm : 1);
    INA_CHECK(ina_bench_time_ms(enqueue_read, &ctx, &timing, &ms));
    tbs = terabytes_per_s((double)ctx.slice_bytes, ms);
    INA_LOG_I(INA_LOG_SUBSYS, "read ceiling, %s, grid %d x %d: %.3f TB/s (median %.4f ms)",
              v.name, ctx.grid, kReadThreads, tbs, ms);
    if (tbs > out->read_tbs) {
      out->read_tbs = tbs;
      snprintf(out->read_variant, sizeof out->read_variant, "%s, grid %dx%d", v.name, ctx.grid,
               kReadThreads);
    }
  }
  INA_CHECK(ina_bench_time_ms(enqueue_copy, &ctx, &timing, &ms));
  out->copy_tbs = terabytes_per_s(2.0 * (double)ctx.slice_bytes, ms);
fail:
  if (ctx.buffer) cudaFree(ctx.buffer);
  if (ctx.sink) cudaFree(ctx.sink);
  return st;
}

extern "C" double ina_bench_read_ceiling_tbs(void) {
  static double measured = 0.0;
  ina_bench_ceilings_t c;
  if (measured == 0.0 && ina_bench_measure_ceilings(&c) == INA_OK) measured = c.read_tbs;
  return measured;
}
