/* Greedy arg-max of logit rows (gpu_ops/gpu_ops.h): one CTA per row, each thread a
 * strided share of the row, then a CTA-wide max of (value, lower index) keys, which is
 * ina_argmax_f32's first-maximum rule exactly (sampling_device.cuh). */
#define INA_LOG_SUBSYS "gpu_ops"
#include "gpu_ops/gpu_ops.h"

#include <limits.h>

#include "core/cuda_check.h"
#include "gpu_ops/sampling_device.cuh"

namespace {

using namespace ina_gpu;

template <typename T>
__global__ void __launch_bounds__(kSamplingThreads)
    argmax_kernel(const T *__restrict__ logits, int64_t vocab, int64_t stride,
                  int32_t *__restrict__ out) {
  __shared__ uint64_t scratch[kWarp];
  const uint64_t best = row_argmax_key(logits + (int64_t)blockIdx.x * stride, vocab, scratch);
  if (threadIdx.x == 0) out[blockIdx.x] = (int32_t)select_key_index(best);
}

}  // namespace

extern "C" ina_status_t ina_gpu_argmax(const void *logits, ina_dtype_t dtype, int64_t rows,
                                       int64_t vocab, int64_t row_stride, int32_t *out,
                                       void *stream) {
  ina_status_t st = INA_OK;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t stride = row_stride ? row_stride : vocab;
  INA_REQUIRE(dtype == INA_DTYPE_F32 || dtype == INA_DTYPE_BF16, INA_ERR_UNSUPPORTED,
              "ina_gpu_argmax: logits dtype %s is not supported (f32 or bf16)",
              ina_dtype_name(dtype));
  INA_REQUIRE(rows >= 0 && rows <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_argmax: rows %lld must be in [0, %d]", (long long)rows, INT_MAX);
  INA_REQUIRE(vocab >= 1 && vocab <= INT_MAX, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_argmax: vocab %lld must be in [1, %d]", (long long)vocab, INT_MAX);
  INA_REQUIRE(row_stride >= 0 && stride >= vocab, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_argmax: row_stride %lld is below vocab %lld", (long long)row_stride,
              (long long)vocab);
  if (rows == 0) return INA_OK;
  INA_REQUIRE(logits && out, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_argmax: NULL logits or out for %lld rows", (long long)rows);
  INA_REQUIRE(ina_gpu_aligned(logits, ina_dtype_size(dtype)) && ina_gpu_aligned(out, 4),
              INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_argmax: pointers must be aligned to their element size");
  if (dtype == INA_DTYPE_F32)
    argmax_kernel<float><<<(unsigned)rows, kSamplingThreads, 0, s>>>(
        static_cast<const float *>(logits), vocab, stride, out);
  else
    argmax_kernel<uint16_t><<<(unsigned)rows, kSamplingThreads, 0, s>>>(
        static_cast<const uint16_t *>(logits), vocab, stride, out);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
