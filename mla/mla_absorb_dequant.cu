/* Load-time dequantization of a block-scaled FP8 weight to bf16 (mla/mla_absorb.h), so
 * the absorption GEMMs run on bf16 operands. One grid-stride pass, one value per thread
 * and step; it runs once per layer at load, so plain indexing is enough. */
#define INA_LOG_SUBSYS "mla"
#include "mla/mla_absorb.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <limits.h>

#include "core/cuda_check.h"

namespace {

constexpr int kThreads = 256;
constexpr int kBlock = 128;

__global__ void __launch_bounds__(kThreads)
    dequantize_kernel(const uint8_t *__restrict__ q, const float *__restrict__ scale_inv,
                      int64_t rows, int64_t cols, uint16_t *__restrict__ out) {
  const int64_t n = rows * cols;
  const int64_t block_cols = (cols + kBlock - 1) / kBlock;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * kThreads) {
    const int64_t r = i / cols, c = i - r * cols;
    __nv_fp8_e4m3 v;
    v.__x = q[i];
    const float value =
        __fmul_rn(static_cast<float>(v), scale_inv[(r / kBlock) * block_cols + c / kBlock]);
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(value));
  }
}

}  // namespace

extern "C" ina_status_t ina_mla_absorb_dequantize_weight(const uint8_t *w_fp8,
                                                         const float *scale_inv, int64_t rows,
                                                         int64_t cols, uint16_t *w_bf16,
                                                         void *stream) {
  ina_status_t st = INA_OK;
  int64_t blocks = 0;
  INA_REQUIRE(rows >= 0 && cols >= 0 && (cols == 0 || rows <= INT64_MAX / cols),
              INA_ERR_INVALID_ARGUMENT, "ina_mla_absorb_dequantize_weight: bad shape [%lld, %lld]",
              (long long)rows, (long long)cols);
  if (rows == 0 || cols == 0) return INA_OK;
  INA_REQUIRE(w_fp8 && scale_inv && w_bf16, INA_ERR_INVALID_ARGUMENT,
              "ina_mla_absorb_dequantize_weight: NULL buffer for a [%lld, %lld] weight",
              (long long)rows, (long long)cols);
  blocks = (rows * cols + kThreads - 1) / kThreads;
  if (blocks > 65536) blocks = 65536; /* grid-stride beyond this */
  dequantize_kernel<<<(unsigned)blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      w_fp8, scale_inv, rows, cols, w_bf16);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
