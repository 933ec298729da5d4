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
 * with key = mix64(seed ^ fnv1a(tensor name)) and (scale, offset) from the tensor's role,
 * every double operation rounded on its own (no FMA contraction), as the host computes
 * them. The kernels then store v as the device copy of the host tensor would hold it.
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

/* What the device keeps of a non-FP8 tensor of n values. */
typedef enum ina_random_store {
  INA_RANDOM_BF16,         /* uint16_t bf16(v), nearest even */
  INA_RANDOM_F32,          /* float v: an f32 host tensor uploaded as f32 */
  INA_RANDOM_F32_VIA_BF16, /* float(bf16(v)): a bf16 host tensor widened at upload */
} ina_random_store_t;

ina_status_t ina_gpu_random_fill(const ina_random_dist_t *dist, int64_t n, ina_random_store_t store,
                                 void *out, cudaStream_t stream);

/* An f32 tensor split into two bf16 tensors: hi = bf16(v), lo = bf16(v - float(hi)) (the
 * router of engine_gpu.h). */
ina_status_t ina_gpu_random_fill_hi_lo(const ina_random_dist_t *dist, int64_t n, uint16_t *hi,
                                       uint16_t *lo, cudaStream_t stream);

/* A [rows, cols] weight quantized to fp8 e4m3 with 128x128 block scales exactly as
 * ina_fp8_quantize_blocks does it with the f32 values v: q (rows * cols bytes, row-major)
 * and the scale of block (br, bc) at scale_inv[br * scale_row_stride + bc]
 * (scale_row_stride >= ceil(cols / 128); entries past ceil(cols / 128) are not written). */
ina_status_t ina_gpu_random_fp8_blocks(const ina_random_dist_t *dist, int64_t rows, int64_t cols,
                                       uint8_t *q, float *scale_inv, int64_t scale_row_stride,
                                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
