/* RMSNorm with the optional residual add and FP8 output (gpu_ops/gpu_ops.h).
 *
 * One CTA per row. Thread i owns the 8-value lanes i, i + blockDim, ... (kIters of them,
 * a compile-time count so they stay in registers): it loads x (and the residual), forms
 * the bf16 sum, writes the residual back, and keeps the values for the second half, so
 * the row is read once. The sum of squares is reduced in a fixed order (each thread's
 * lanes in order, then the warp tree, then the warps), so results repeat bit for bit.
 *
 * FP8: lanes 16j .. 16j + 15 of one iteration are 16 consecutive threads and cover the
 * 128 columns of one block, so a block's amax is a half-warp reduction (blockDim is a
 * multiple of 32, so a half-warp never straddles two iterations). */
#define INA_LOG_SUBSYS "gpu_ops"
#include "gpu_ops/gpu_ops.h"

#include <limits.h>
#include <math.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

using namespace ina_gpu;

/* 512 threads leave 128 registers a thread, room for 8 lanes of values without spills. */
constexpr int kMaxThreads = 512;
constexpr int kMaxIters = 8;
constexpr int64_t kMaxCols = (int64_t)kMaxThreads * kMaxIters * kLaneValues; /* 32768 */

/* Bytes of the version-1 params: everything up to and including y_scale_inv. */
constexpr size_t kParamsV1Size = offsetof(ina_gpu_rmsnorm_params_t, y_scale_inv) + sizeof(float *);

struct RmsArgs {
  int64_t cols;
  const uint16_t *x;
  int64_t x_stride;
  uint16_t *residual;
  int64_t residual_stride;
  const void *weight;
  bool weight_f32;
  float eps;
  uint16_t *y;
  int64_t y_stride;
  uint8_t *y_fp8;
  float *y_scale_inv;
};

template <bool kVector, int kIters>
__global__ void __launch_bounds__(kMaxThreads) rmsnorm_kernel(const RmsArgs a) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  const uint16_t *x = a.x + row * a.x_stride;
  uint16_t *res = a.residual ? a.residual + row * a.residual_stride : nullptr;
  Bf16x8 v[kIters];
  float sum_squares = 0.0f;
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int64_t c = ((int64_t)it * blockDim.x + threadIdx.x) * kLaneValues;
    v[it] = load_bf16x8<kVector>(x, c, a.cols);
    if (res) {
      const Bf16x8 r = load_bf16x8<kVector>(res, c, a.cols);
#pragma unroll
      for (int i = 0; i < 4; i++)
        v[it].w[i] = pack_bf16(__fadd_rn(bf16_lo(r.w[i]), bf16_lo(v[it].w[i])),
                               __fadd_rn(bf16_hi(r.w[i]), bf16_hi(v[it].w[i])));
      store_bf16x8<kVector>(res, c, a.cols, v[it]);
    }
#pragma unroll
    for (int i = 0; i < kLaneValues; i++) {
      const float e = bf16x8_get(v[it], i);
      sum_squares = __fmaf_rn(e, e, sum_squares);
    }
  }
  sum_squares = block_sum(sum_squares, scratch);
  const float mean = __fdiv_rn(sum_squares, (float)a.cols);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.eps)));

  uint16_t *y = a.y ? a.y + row * a.y_stride : nullptr;
  uint8_t *q = a.y_fp8 ? a.y_fp8 + row * a.cols : nullptr;
  float *scale = a.y_fp8 ? a.y_scale_inv + row * ((a.cols + kFp8Block - 1) / kFp8Block) : nullptr;
#pragma unroll
  for (int it = 0; it < kIters; it++) {
    const int64_t c = ((int64_t)it * blockDim.x + threadIdx.x) * kLaneValues;
    float w[kLaneValues];
    load_weight8<kVector>(a.weight, a.weight_f32, c, a.cols, w);
    Bf16x8 out;
#pragma unroll
    for (int i = 0; i < 4; i++)
      out.w[i] = pack_bf16(__fmul_rn(w[2 * i], __fmul_rn(bf16_lo(v[it].w[i]), inv)),
                           __fmul_rn(w[2 * i + 1], __fmul_rn(bf16_hi(v[it].w[i]), inv)));
    if (y) store_bf16x8<kVector>(y, c, a.cols, out);
    if (q) store_fp8x8<kVector>(out, q, scale, c, a.cols);
  }
}

template <bool kVector>
void launch(const RmsArgs &a, int64_t rows, int iters, int threads, cudaStream_t s) {
  const unsigned grid = (unsigned)rows;
  switch (iters) {
    case 1: rmsnorm_kernel<kVector, 1><<<grid, threads, 0, s>>>(a); break;
    case 2: rmsnorm_kernel<kVector, 2><<<grid, threads, 0, s>>>(a); break;
    case 4: rmsnorm_kernel<kVector, 4><<<grid, threads, 0, s>>>(a); break;
    default: rmsnorm_kernel<kVector, kMaxIters><<<grid, threads, 0, s>>>(a); break;
  }
}

bool rows_overlap(const void *a, int64_t a_stride, const void *b, int64_t b_stride, int64_t rows,
                  int64_t cols, size_t elem) {
  const char *a0 = static_cast<const char *>(a), *b0 = static_cast<const char *>(b);
  const char *a1 = a0 + ((rows - 1) * a_stride + cols) * (int64_t)elem;
  const char *b1 = b0 + ((rows - 1) * b_stride + cols) * (int64_t)elem;
  return a0 < b1 && b0 < a1;
}

ina_status_t check_params(const ina_gpu_rmsnorm_params_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(p, kParamsV1Size, "ina_gpu_rmsnorm: params", "INA_GPU_RMSNORM_PARAMS_INIT");
  INA_REQUIRE(p->rows >= 0 && p->rows <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: rows %lld must be in [0, %d]", (long long)p->rows, INT_MAX);
  INA_REQUIRE(p->cols >= 1, INA_ERR_INVALID_ARGUMENT, "ina_gpu_rmsnorm: cols %lld must be >= 1",
              (long long)p->cols);
  INA_REQUIRE(p->cols <= kMaxCols, INA_ERR_UNSUPPORTED,
              "ina_gpu_rmsnorm: cols %lld is over the supported %lld", (long long)p->cols,
              (long long)kMaxCols);
  INA_REQUIRE(p->weight_dtype == INA_DTYPE_BF16 || p->weight_dtype == INA_DTYPE_F32,
              INA_ERR_UNSUPPORTED,
              "ina_gpu_rmsnorm: weight dtype %s is not supported (bf16 or f32)",
              ina_dtype_name(p->weight_dtype));
  INA_REQUIRE(isfinite(p->eps) && p->eps >= 0.0f, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: eps %g must be finite and >= 0", (double)p->eps);
  INA_REQUIRE(p->x_stride >= 0 && p->residual_stride >= 0 && p->y_stride >= 0,
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: negative stride (x %lld, residual %lld, y %lld)",
              (long long)p->x_stride, (long long)p->residual_stride, (long long)p->y_stride);
  INA_REQUIRE(p->y != NULL || p->y_fp8 != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: no output (y and y_fp8 are both NULL)");
  INA_REQUIRE((p->y_fp8 == NULL) == (p->y_scale_inv == NULL), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: y_fp8 and y_scale_inv must be given together");
  INA_REQUIRE(p->x != NULL && p->weight != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: x and weight must not be NULL");
  INA_REQUIRE(ina_gpu_aligned(p->x, 2) && ina_gpu_aligned(p->residual, 2) &&
                  ina_gpu_aligned(p->y, 2) && ina_gpu_aligned(p->y_scale_inv, 4) &&
                  ina_gpu_aligned(p->weight, ina_dtype_size(p->weight_dtype)),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: pointers must be aligned to their element size");
fail:
  return st;
}

}  // namespace

extern "C" ina_status_t ina_gpu_rmsnorm(const ina_gpu_rmsnorm_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  RmsArgs a = {};
  int64_t lanes = 0, per_thread = 0;
  int iters = 0, threads = 0;
  bool vector = false;
  INA_CHECK(check_params(p));
  a.cols = p->cols;
  a.x = p->x;
  a.x_stride = p->x_stride ? p->x_stride : p->cols;
  a.residual = p->residual;
  a.residual_stride = p->residual_stride ? p->residual_stride : p->cols;
  a.weight = p->weight;
  a.weight_f32 = p->weight_dtype == INA_DTYPE_F32;
  a.eps = p->eps;
  a.y = p->y;
  a.y_stride = p->y_stride ? p->y_stride : p->cols;
  a.y_fp8 = p->y_fp8;
  a.y_scale_inv = p->y_scale_inv;
  INA_REQUIRE(a.x_stride >= a.cols && (!a.residual || a.residual_stride >= a.cols) &&
                  (!a.y || a.y_stride >= a.cols),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: a row stride (x %lld, residual %lld, y %lld) is below cols %lld",
              (long long)a.x_stride, (long long)a.residual_stride, (long long)a.y_stride,
              (long long)a.cols);
  if (p->rows == 0) return INA_OK;
  INA_REQUIRE(!a.residual || (!rows_overlap(a.residual, a.residual_stride, a.x, a.x_stride, p->rows,
                                            a.cols, 2) &&
                              (!a.y || !rows_overlap(a.residual, a.residual_stride, a.y, a.y_stride,
                                                     p->rows, a.cols, 2))),
              INA_ERR_INVALID_ARGUMENT, "ina_gpu_rmsnorm: residual overlaps x or y");
  INA_REQUIRE(
      !a.y || a.y == a.x || !rows_overlap(a.y, a.y_stride, a.x, a.x_stride, p->rows, a.cols, 2),
      INA_ERR_INVALID_ARGUMENT, "ina_gpu_rmsnorm: y overlaps x without being x itself");
  INA_REQUIRE(a.y != a.x || a.y_stride == a.x_stride, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_rmsnorm: in-place y = x needs equal strides (x %lld, y %lld)",
              (long long)a.x_stride, (long long)a.y_stride);

  /* The vector path needs every row start 16-byte aligned (8 for the FP8 rows). */
  vector =
      a.cols % kLaneValues == 0 && a.x_stride % kLaneValues == 0 && ina_gpu_aligned(a.x, 16) &&
      ina_gpu_aligned(a.weight, 16) &&
      (!a.residual || (a.residual_stride % kLaneValues == 0 && ina_gpu_aligned(a.residual, 16))) &&
      (!a.y || (a.y_stride % kLaneValues == 0 && ina_gpu_aligned(a.y, 16))) &&
      (!a.y_fp8 || ina_gpu_aligned(a.y_fp8, 8));
  /* The fewest iterations that keep a CTA at <= 256 threads, then more threads. */
  lanes = (a.cols + kLaneValues - 1) / kLaneValues;
  iters = lanes <= 256 ? 1 : lanes <= 512 ? 2 : lanes <= 1024 ? 4 : kMaxIters;
  per_thread = (lanes + iters - 1) / iters;
  threads = (int)((per_thread + kWarp - 1) / kWarp * kWarp);
  if (vector)
    launch<true>(a, p->rows, iters, threads, s);
  else
    launch<false>(a, p->rows, iters, threads, s);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
