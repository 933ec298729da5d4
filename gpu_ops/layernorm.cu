/* LayerNorm with bias (gpu_ops/gpu_ops.h, section 3): DeepSeek-V3.2's indexer key norm.
 *
 * One CTA per row, up to 512 threads, thread i owning columns i, i + blockDim, ... The
 * row is read three times (mean, variance, output) rather than kept in registers: the
 * norm runs on the indexer's 128-wide keys, where the second and third reads hit L1,
 * and the plain loop stays obviously right for any width and stride. Both sums run in
 * a fixed order (each thread's columns in order, then block_sum's warp tree and warps),
 * so results repeat bit for bit; every step is an explicitly rounded intrinsic, so the
 * compiler cannot contract the output's multiply and add into an FMA and move the
 * result away from the error bound the header states.
 *
 * In place (y = x): a thread writes only the columns it reads in the third pass, and
 * the barriers inside the second block_sum order every thread's first two passes
 * before any write, so no thread reads a value another has already replaced. */
#define INA_LOG_SUBSYS "gpu_ops"
#include "gpu_ops/gpu_ops.h"

#include <limits.h>
#include <math.h>

#include "core/cuda_check.h"
#include "gpu_ops/gpu_ops_device.cuh"

namespace {

using namespace ina_gpu;

constexpr int kMaxThreads = 512;
constexpr int64_t kMaxCols = 32768;

/* Bytes of the version-1 params: everything up to and including y_stride. */
constexpr size_t kParamsV1Size = offsetof(ina_gpu_layernorm_params_t, y_stride) + sizeof(int64_t);

struct LnArgs {
  int64_t cols;
  const uint16_t *x;
  int64_t x_stride;
  const float *weight;
  const float *bias;
  float eps;
  uint16_t *y;
  int64_t y_stride;
};

__global__ void __launch_bounds__(kMaxThreads) layernorm_kernel(const LnArgs a) {
  __shared__ float scratch[kWarp];
  const int64_t row = blockIdx.x;
  /* Plain loads of x (not __ldg): in place, y writes the same memory in this kernel. */
  const uint16_t *x = a.x + row * a.x_stride;
  uint16_t *y = a.y + row * a.y_stride;
  const float n = (float)a.cols; /* exact: cols <= 32768 */

  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) sum = __fadd_rn(sum, bf16_to_f32(x[c]));
  const float mean = __fdiv_rn(block_sum(sum, scratch), n);

  float sum_squares = 0.0f;
  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
    const float d = __fsub_rn(bf16_to_f32(x[c]), mean);
    sum_squares = __fmaf_rn(d, d, sum_squares);
  }
  const float var = __fdiv_rn(block_sum(sum_squares, scratch), n);
  const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(var, a.eps)));

  for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
    const float t = __fmul_rn(__fsub_rn(bf16_to_f32(x[c]), mean), inv);
    y[c] = f32_to_bf16(__fadd_rn(__fmul_rn(t, __ldg(a.weight + c)), __ldg(a.bias + c)));
  }
}

bool rows_overlap(const void *a, int64_t a_stride, const void *b, int64_t b_stride, int64_t rows,
                  int64_t cols, size_t elem) {
  const char *a0 = static_cast<const char *>(a), *b0 = static_cast<const char *>(b);
  const char *a1 = a0 + ((rows - 1) * a_stride + cols) * (int64_t)elem;
  const char *b1 = b0 + ((rows - 1) * b_stride + cols) * (int64_t)elem;
  return a0 < b1 && b0 < a1;
}

ina_status_t check_params(const ina_gpu_layernorm_params_t *p) {
  ina_status_t st = INA_OK;
  INA_REQUIRE_VERSIONED(p, kParamsV1Size, "ina_gpu_layernorm: params",
                        "INA_GPU_LAYERNORM_PARAMS_INIT");
  INA_REQUIRE(p->rows >= 0 && p->rows <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_layernorm: rows %lld must be in [0, %d]", (long long)p->rows, INT_MAX);
  INA_REQUIRE(p->cols >= 1, INA_ERR_INVALID_ARGUMENT, "ina_gpu_layernorm: cols %lld must be >= 1",
              (long long)p->cols);
  INA_REQUIRE(p->cols <= kMaxCols, INA_ERR_UNSUPPORTED,
              "ina_gpu_layernorm: cols %lld is over the supported %lld", (long long)p->cols,
              (long long)kMaxCols);
  INA_REQUIRE(isfinite(p->eps) && p->eps >= 0.0f, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_layernorm: eps %g must be finite and >= 0", (double)p->eps);
  INA_REQUIRE(p->x_stride >= 0 && p->y_stride >= 0, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_layernorm: negative stride (x %lld, y %lld)", (long long)p->x_stride,
              (long long)p->y_stride);
  INA_REQUIRE(p->x != NULL && p->weight != NULL && p->bias != NULL && p->y != NULL,
              INA_ERR_INVALID_ARGUMENT, "ina_gpu_layernorm: %s is NULL",
              !p->x ? "x" : !p->weight ? "weight" : !p->bias ? "bias" : "y");
  INA_REQUIRE(ina_gpu_aligned(p->x, 2) && ina_gpu_aligned(p->y, 2) && ina_gpu_aligned(p->weight, 4) &&
                  ina_gpu_aligned(p->bias, 4),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_layernorm: pointers must be aligned to their element size");
fail:
  return st;
}

}  // namespace

extern "C" ina_status_t ina_gpu_layernorm(const ina_gpu_layernorm_params_t *p, void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  LnArgs a = {};
  int threads = 0;
  INA_CHECK(check_params(p));
  a.cols = p->cols;
  a.x = p->x;
  a.x_stride = p->x_stride ? p->x_stride : p->cols;
  a.weight = p->weight;
  a.bias = p->bias;
  a.eps = p->eps;
  a.y = p->y;
  a.y_stride = p->y_stride ? p->y_stride : p->cols;
  INA_REQUIRE(a.x_stride >= a.cols && a.y_stride >= a.cols, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_layernorm: a row stride (x %lld, y %lld) is below cols %lld",
              (long long)a.x_stride, (long long)a.y_stride, (long long)a.cols);
  if (p->rows == 0) return INA_OK;
  INA_REQUIRE(a.y == a.x || !rows_overlap(a.y, a.y_stride, a.x, a.x_stride, p->rows, a.cols, 2),
              INA_ERR_INVALID_ARGUMENT, "ina_gpu_layernorm: y overlaps x without being x itself");
  INA_REQUIRE(a.y != a.x || a.y_stride == a.x_stride, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_layernorm: in-place y = x needs equal strides (x %lld, y %lld)",
              (long long)a.x_stride, (long long)a.y_stride);
  /* A warp per 32 columns up to 512 threads: one column per thread for rows up to 512
   * wide (the error bound's depth counts on at most ceil(cols / 512) per thread). */
  threads = a.cols >= kMaxThreads ? kMaxThreads : (int)((a.cols + kWarp - 1) / kWarp * kWarp);
  layernorm_kernel<<<(unsigned)p->rows, threads, 0, s>>>(a);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
