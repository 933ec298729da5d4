/* The kernels behind ina_gpu_weights_random (engine_gpu_random.c): seeded random weight
 * values generated where they are stored, in the device form ina_gpu_weights_upload
 * gives the host's ina_weights_random tensors. Internal to model/; C launchers over the
 * CUDA kernels of engine_gpu_random.cu, built only with CUDA.
 *
 * The values: model/weights.c's fill_random, a counter-based generator. Element i of a
 * tensor is
 *     r = mix64(key + (i + 1) * 0x9E3779B97F4A7C15)
 *     u = float((double)(r >> 40) * 2^-23 - 1.0)            uniform in [-1, 1)
 *     v = float(offset + scale * (double)u)
 * with key = mix64(seed ^ fnv1a(tensor name)) and (scale, offset) from the tensor's role
 * (for linears scale = sqrt(3 / in_features) of the whole tensor), every double operation
 * rounded on its own (no FMA contraction), as the host computes them. The kernels then
 * store v as the device copy of the host tensor would hold it.
 *
 * i is always the element's index in the WHOLE tensor: a rank that holds a
 * tensor-parallel slice (model/weights.h) generates a window of it (ina_random_window_t),
 * whose values are the whole tensor's at those positions, as the host's slices are.
 *
 * Launchers are asynchronous on `stream`, allocate nothing and check their launch.
 * Thread safety: as the CUDA runtime. */
#ifndef INA_MODEL_ENGINE_GPU_RANDOM_H
#define INA_MODEL_ENGINE_GPU_RANDOM_H

#include <cuda_runtime.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define INA_RANDOM_FN static inline __host__ __device__
#else
#define INA_RANDOM_FN static inline
#endif

/* The SplitMix64 finalizer of model/weights.c, shared by the host (tensor keys) and
 * the device (element values). */
INA_RANDOM_FN uint64_t ina_random_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* One tensor's distribution: v = offset + scale * u (see above). */
typedef struct ina_random_dist {
  uint64_t key;
  double scale, offset;
} ina_random_dist_t;

/* A window of a whole tensor [full_rows, full_cols] (a vector of n values: [n, 1]): rows
 * [row0, row0 + rows) x columns [col0, col0 + cols). Element (i, j) of the window is the
 * whole tensor's element (row0 + i) * full_cols + (col0 + j); the window is stored dense
 * and row-major, [rows, cols]. */
typedef struct ina_random_window {
  int64_t full_rows, full_cols;
  int64_t row0, col0;
  int64_t rows, cols;
} ina_random_window_t;

/* The whole tensor [rows, cols] as a window. */
INA_RANDOM_FN ina_random_window_t ina_random_window_whole(int64_t rows, int64_t cols) {
  ina_random_window_t w = {rows, cols, 0, 0, rows, cols};
  return w;
}

/* What the device keeps of a non-FP8 tensor. */
typedef enum ina_random_store {
  INA_RANDOM_BF16,         /* uint16_t bf16(v), nearest even */
  INA_RANDOM_F32,          /* float v: an f32 host tensor uploaded as f32 */
  INA_RANDOM_F32_VIA_BF16, /* float(bf16(v)): a bf16 host tensor widened at upload */
} ina_random_store_t;

/* The window `win` of the tensor of `dist` into out (rows * cols values of `store`). A
 * window of whole rows (cols == full_cols: whole tensors, vectors, row slices) is one
 * contiguous run of the whole tensor and costs what the whole tensor's fill costs per
 * value; a column slice takes a 2-D launch. A window outside its tensor:
 * INA_ERR_INVALID_ARGUMENT. */
ina_status_t ina_gpu_random_fill(const ina_random_dist_t *dist, const ina_random_window_t *win,
                                 ina_random_store_t store, void *out, cudaStream_t stream);

/* A whole f32 tensor of n values split into two bf16 tensors: hi = bf16(v), lo = bf16(v -
 * float(hi)) (the router of engine_gpu.h, which is never sliced). */
ina_status_t ina_gpu_random_fill_hi_lo(const ina_random_dist_t *dist, int64_t n, uint16_t *hi,
                                       uint16_t *lo, cudaStream_t stream);

/* The window `win` ([rows, cols]) of a weight, quantized to fp8 e4m3 with 128x128 block
 * scales exactly as ina_fp8_quantize_blocks does it with the window's f32 values v: q
 * (rows * cols bytes, row-major) and the scale of the window's block (br, bc) at
 * scale_inv[br * scale_row_stride + bc] (scale_row_stride >= ceil(cols / 128); entries
 * past ceil(cols / 128) are not written). The window must consist of whole blocks of the
 * whole tensor: row0 and col0 multiples of 128, and its end a multiple of 128 or the
 * tensor's edge in each dimension (so its blocks and scales are the whole tensor's);
 * otherwise INA_ERR_UNSUPPORTED. */
ina_status_t ina_gpu_random_fp8_blocks(const ina_random_dist_t *dist, const ina_random_window_t *win,
                                       uint8_t *q, float *scale_inv, int64_t scale_row_stride,
                                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
