/* Kernels of the seeded random weights on the device (model/engine_gpu_random.h).
 *
 * Bit-exactness with the host (model/weights.c, then engine_gpu_weights.c's upload):
 *   - the generator is integer arithmetic (identical everywhere) followed by four
 *     double operations, each written as its own round-to-nearest intrinsic so nvcc
 *     cannot contract a multiply and an add into an FMA (the host builds strict C11,
 *     which contracts nothing, and x86-64 without -march has no FMA);
 *   - bf16 narrowing is __float2bfloat16_rn: nearest even, as ina_f32_to_bf16 for the
 *     finite values generated here;
 *   - FP8 blocks follow ina_fp8_quantize_blocks: amax of the block's valid values (max is
 *     order-independent), scale_inv by core/fp8_quant_rule.h, and a correctly rounded
 *     division x / scale_inv per value. The rule's reciprocal shortcut is proven for
 *     bf16 inputs only; these values are full f32, so they take its division path.
 *     The quotient is narrowed by cvt.rn.satfinite to e4m3 (nearest even, clamped to
 *     +-448), the reference's saturating conversion.
 *
 * Windows (slices of a whole tensor): the generator's counter is key + (i + 1) * golden
 * in wrapping 64-bit arithmetic, so the element `first + i` of a tensor is element i of
 * the same tensor with key + first * golden. The launchers move a window's origin
 * (row0 * full_cols + col0) into the key that way, and the kernels index from the
 * window's first element, rows full_cols apart. A whole tensor (origin 0, full_cols ==
 * cols) runs the contiguous fill kernel it always ran, and the FP8 kernel with its row
 * length as the index stride, as before. */
#define INA_LOG_SUBSYS "model"
#include "model/engine_gpu_random.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <limits.h>

#include "core/cuda_check.h"
#include "core/fp8_quant_rule.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxFillBlocks = 65536; /* grid-stride beyond this */
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

/* Element i of the tensor of `d` as float (the formula of engine_gpu_random.h). */
__device__ __forceinline__ float random_value(const ina_random_dist_t &d, uint64_t i) {
  const uint64_t r = ina_random_mix64(d.key + (i + 1) * kGolden);
  const double u = __dsub_rn(__dmul_rn(__ull2double_rn(r >> 40), 1.0 / 8388608.0), 1.0);
  const float uf = __double2float_rn(u);
  return __double2float_rn(__dadd_rn(d.offset, __dmul_rn(d.scale, (double)uf)));
}

__device__ __forceinline__ uint16_t to_bf16(float v) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__device__ __forceinline__ float from_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

template <ina_random_store_t kStore>
__device__ __forceinline__ void store_value(void *__restrict__ out, int64_t i, float v) {
  if (kStore == INA_RANDOM_BF16) static_cast<uint16_t *>(out)[i] = to_bf16(v);
  else if (kStore == INA_RANDOM_F32) static_cast<float *>(out)[i] = v;
  else static_cast<float *>(out)[i] = from_bf16(to_bf16(v));
}

/* n consecutive elements from the (key-shifted) origin: whole tensors and row slices. */
template <ina_random_store_t kStore>
__global__ void __launch_bounds__(kThreads)
    fill_kernel(ina_random_dist_t d, int64_t n, void *__restrict__ out) {
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * kThreads)
    store_value<kStore>(out, i, random_value(d, (uint64_t)i));
}

/* A column window [rows, cols] whose rows lie `ld` (the whole tensor's row length)
 * apart in the index space: CTA rows stride over the window's rows (blockIdx.y), and
 * threads over its columns, so no thread divides to find its row. */
template <ina_random_store_t kStore>
__global__ void __launch_bounds__(kThreads)
    fill_window_kernel(ina_random_dist_t d, int64_t rows, int64_t cols, int64_t ld,
                       void *__restrict__ out) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = (int64_t)blockIdx.x * kThreads + threadIdx.x; c < cols;
         c += (int64_t)gridDim.x * kThreads)
      store_value<kStore>(out, r * cols + c, random_value(d, (uint64_t)(r * ld + c)));
}

__global__ void __launch_bounds__(kThreads)
    fill_hi_lo_kernel(ina_random_dist_t d, int64_t n, uint16_t *__restrict__ hi,
                      uint16_t *__restrict__ lo) {
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * kThreads) {
    const float v = random_value(d, (uint64_t)i);
    const uint16_t h = to_bf16(v);
    hi[i] = h;
    lo[i] = to_bf16(__fsub_rn(v, from_bf16(h)));
  }
}

/* ---- FP8, 128x128 blocks ---------------------------------------------------------------
 * One CTA per block. A warp covers a 128-wide row segment (4 columns per lane, one
 * 32-bit store), the 8 warps take rows w, w + 8, ..., so each thread holds its 64 values
 * in registers between the amax and the quantization: nothing of the block is stored in
 * f32 anywhere. */
constexpr int kBlock = 128;
constexpr int kColsPerThread = 4;
constexpr int kThreadsPerRow = kBlock / kColsPerThread;  /* 32: a warp */
constexpr int kRowsPerPass = kThreads / kThreadsPerRow;  /* 8 */
constexpr int kPasses = kBlock / kRowsPerPass;           /* 16 */

__device__ __forceinline__ uint8_t to_e4m3(float x, float scale_inv) {
  const float quotient = ina_fp8_rule_quotient(x, scale_inv, 0.0f, 0);
  return (uint8_t)__nv_cvt_float_to_fp8(quotient, __NV_SATFINITE, __NV_E4M3);
}

/* The window [rows, cols], its rows `ld` apart in the index space (ld == cols for a
 * whole tensor). */
__global__ void __launch_bounds__(kThreads)
    fp8_blocks_kernel(ina_random_dist_t d, int64_t rows, int64_t cols, int64_t ld, int64_t nbc,
                      uint8_t *__restrict__ q, float *__restrict__ scale_inv,
                      int64_t scale_row_stride) {
  __shared__ float warp_amax[kThreads / 32];
  const int64_t block_row = blockIdx.x / nbc;
  const int64_t block_col = blockIdx.x - block_row * nbc;
  const int64_t c0 = block_col * kBlock + (threadIdx.x % kThreadsPerRow) * kColsPerThread;
  const int64_t r0 = block_row * kBlock + threadIdx.x / kThreadsPerRow;
  float v[kPasses][kColsPerThread];
  float amax = 0.0f;
#pragma unroll
  for (int p = 0; p < kPasses; p++) {
    const int64_t r = r0 + (int64_t)p * kRowsPerPass;
#pragma unroll
    for (int j = 0; j < kColsPerThread; j++) {
      const int64_t c = c0 + j;
      /* Outside the matrix: 0, which leaves the amax of the valid values unchanged. */
      v[p][j] = r < rows && c < cols ? random_value(d, (uint64_t)(r * ld + c)) : 0.0f;
      amax = fmaxf(amax, fabsf(v[p][j]));
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kThreads / 32; w++) amax = fmaxf(amax, warp_amax[w]);
  const float scale = ina_fp8_rule_scale_inv(amax);
  if (threadIdx.x == 0) scale_inv[block_row * scale_row_stride + block_col] = scale;
  /* cols % 4 == 0 keeps every row start, and so every lane's 4 bytes, 4-byte aligned. */
  const bool word_stores = cols % kColsPerThread == 0;
#pragma unroll
  for (int p = 0; p < kPasses; p++) {
    const int64_t r = r0 + (int64_t)p * kRowsPerPass;
    if (r >= rows || c0 >= cols) continue;
    uint8_t *row = q + r * cols;
    if (word_stores) {
      uint32_t word = 0;
#pragma unroll
      for (int j = 0; j < kColsPerThread; j++) word |= (uint32_t)to_e4m3(v[p][j], scale) << (8 * j);
      *reinterpret_cast<uint32_t *>(row + c0) = word;
    } else {
#pragma unroll
      for (int j = 0; j < kColsPerThread; j++)
        if (c0 + j < cols) row[c0 + j] = to_e4m3(v[p][j], scale);
    }
  }
}

constexpr int64_t kMaxGridRows = 65535; /* gridDim.y limit */

unsigned fill_blocks(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return (unsigned)(blocks < kMaxFillBlocks ? blocks : kMaxFillBlocks);
}

/* Whether win lies inside its whole tensor, whose index space fits int64 with room. */
bool window_valid(const ina_random_window_t &w) {
  return w.full_rows >= 0 && w.full_cols >= 0 &&
         (w.full_cols == 0 || w.full_rows <= INT64_MAX / 2 / w.full_cols) && w.row0 >= 0 && w.rows >= 0 &&
         w.row0 <= w.full_rows - w.rows && w.col0 >= 0 && w.cols >= 0 && w.col0 <= w.full_cols - w.cols;
}

/* d moved to the window's first element (see the top of this file). */
ina_random_dist_t at_window_origin(const ina_random_dist_t &d, const ina_random_window_t &w) {
  ina_random_dist_t moved = d;
  moved.key += ((uint64_t)w.row0 * (uint64_t)w.full_cols + (uint64_t)w.col0) * kGolden;
  return moved;
}

/* Whether [begin, begin + len) of a dimension of `full` is made of whole blocks (the
 * last one may end at the tensor's edge). */
bool whole_blocks(int64_t begin, int64_t len, int64_t full) {
  return begin % kBlock == 0 && ((begin + len) % kBlock == 0 || begin + len == full);
}

template <ina_random_store_t kStore>
void launch_fill(const ina_random_dist_t &d, const ina_random_window_t &w, void *out, cudaStream_t stream) {
  if (w.cols == w.full_cols) {
    fill_kernel<kStore><<<fill_blocks(w.rows * w.cols), kThreads, 0, stream>>>(d, w.rows * w.cols, out);
  } else {
    const dim3 grid(fill_blocks(w.cols), (unsigned)(w.rows < kMaxGridRows ? w.rows : kMaxGridRows));
    fill_window_kernel<kStore><<<grid, kThreads, 0, stream>>>(d, w.rows, w.cols, w.full_cols, out);
  }
}

}  // namespace

extern "C" ina_status_t ina_gpu_random_fill(const ina_random_dist_t *dist, const ina_random_window_t *win,
                                            ina_random_store_t store, void *out,
                                            cudaStream_t stream) {
  ina_status_t st = INA_OK;
  ina_random_dist_t d;
  INA_REQUIRE(window_valid(*win), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_random_fill: window rows [%lld, +%lld) x columns [%lld, +%lld) of [%lld, %lld]",
              (long long)win->row0, (long long)win->rows, (long long)win->col0, (long long)win->cols,
              (long long)win->full_rows, (long long)win->full_cols);
  if (win->rows == 0 || win->cols == 0) return INA_OK;
  INA_REQUIRE(out != NULL, INA_ERR_INVALID_ARGUMENT, "ina_gpu_random_fill: %lld x %lld values into NULL",
              (long long)win->rows, (long long)win->cols);
  d = at_window_origin(*dist, *win);
  switch (store) {
  case INA_RANDOM_BF16: launch_fill<INA_RANDOM_BF16>(d, *win, out, stream); break;
  case INA_RANDOM_F32: launch_fill<INA_RANDOM_F32>(d, *win, out, stream); break;
  case INA_RANDOM_F32_VIA_BF16: launch_fill<INA_RANDOM_F32_VIA_BF16>(d, *win, out, stream); break;
  default:
    INA_REQUIRE(0, INA_ERR_INVALID_ARGUMENT, "ina_gpu_random_fill: unknown store %d", (int)store);
  }
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}

extern "C" ina_status_t ina_gpu_random_fill_hi_lo(const ina_random_dist_t *dist, int64_t n,
                                                  uint16_t *hi, uint16_t *lo,
                                                  cudaStream_t stream) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(n >= 0 && (n == 0 || (hi != NULL && lo != NULL)), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_random_fill_hi_lo: %lld values into %p, %p", (long long)n, (void *)hi,
              (void *)lo);
  if (n == 0) return INA_OK;
  fill_hi_lo_kernel<<<fill_blocks(n), kThreads, 0, stream>>>(*dist, n, hi, lo);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}

extern "C" ina_status_t ina_gpu_random_fp8_blocks(const ina_random_dist_t *dist, const ina_random_window_t *win,
                                                  uint8_t *q, float *scale_inv, int64_t scale_row_stride,
                                                  cudaStream_t stream) {
  ina_status_t st = INA_OK;
  const int64_t rows = win->rows, cols = win->cols;
  int64_t nbc = 0, grid = 0;
  ina_random_dist_t d;
  INA_REQUIRE(window_valid(*win), INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_random_fp8_blocks: window rows [%lld, +%lld) x columns [%lld, +%lld) of [%lld, %lld]",
              (long long)win->row0, (long long)rows, (long long)win->col0, (long long)cols,
              (long long)win->full_rows, (long long)win->full_cols);
  if (rows == 0 || cols == 0) return INA_OK;
  INA_REQUIRE(whole_blocks(win->row0, rows, win->full_rows) && whole_blocks(win->col0, cols, win->full_cols),
              INA_ERR_UNSUPPORTED,
              "ina_gpu_random_fp8_blocks: window rows [%lld, %lld) x columns [%lld, %lld) of [%lld, %lld] is "
              "not made of whole %dx%d blocks",
              (long long)win->row0, (long long)(win->row0 + rows), (long long)win->col0,
              (long long)(win->col0 + cols), (long long)win->full_rows, (long long)win->full_cols, kBlock, kBlock);
  nbc = (cols + kBlock - 1) / kBlock;
  INA_REQUIRE(q != NULL && scale_inv != NULL && scale_row_stride >= nbc, INA_ERR_INVALID_ARGUMENT,
              "ina_gpu_random_fp8_blocks: [%lld, %lld] into q %p, scales %p with row stride %lld",
              (long long)rows, (long long)cols, (void *)q, (void *)scale_inv,
              (long long)scale_row_stride);
  grid = ((rows + kBlock - 1) / kBlock) * nbc;
  INA_REQUIRE(grid <= INT_MAX, INA_ERR_UNSUPPORTED,
              "ina_gpu_random_fp8_blocks: [%lld, %lld] needs %lld CTAs, over the grid limit",
              (long long)rows, (long long)cols, (long long)grid);
  d = at_window_origin(*dist, *win);
  fp8_blocks_kernel<<<(unsigned)grid, kThreads, 0, stream>>>(d, rows, cols, win->full_cols, nbc, q, scale_inv,
                                                             scale_row_stride);
  INA_CUDA_CHECK_LAUNCH();
fail:
  return st;
}
