/* The activation-scale layout of gemm/gemm.h as one formula, shared by the host helpers
 * (gemm_layout.c), the CPU reference and the CUDA kernels, so that the CPU test checks
 * the very arithmetic the kernels run. Internal header: plain C, also compiled as CUDA
 * (host and device).
 *
 * An [rows, L] scale matrix (L K blocks) is stored as two M-major blocks: rows below
 * `split` at kb * split + m, the others after them at split * L + kb * (rows - split) +
 * (m - split). gemm.h's layout is split = rows & ~3 (cuBLASLt takes the first split rows
 * and reads their scales as one M-major [L, split] matrix); a sub-problem made of the
 * last rows alone is the same formula with split = 0.
 *
 * Thread safety: pure functions. */
#ifndef INA_GEMM_GEMM_SCALE_LAYOUT_H
#define INA_GEMM_GEMM_SCALE_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define INA_GEMM_LAYOUT_FN static inline __host__ __device__
#else
#define INA_GEMM_LAYOUT_FN static inline
#endif

/* Rows of an M-row GEMM that cuBLASLt's block-scaled FP8 mode can take (a multiple of 4). */
INA_GEMM_LAYOUT_FN int64_t ina_gemm_cublaslt_rows(int64_t m) { return m & ~(int64_t)3; }

/* K blocks of 128 covering k values. */
INA_GEMM_LAYOUT_FN int64_t ina_gemm_kblocks(int64_t k) { return (k + 127) / 128; }

/* Offset of the scale of (m, kb) in the two-block layout described above. */
INA_GEMM_LAYOUT_FN int64_t ina_gemm_scale_offset(int64_t rows, int64_t split, int64_t kblocks,
                                                 int64_t m, int64_t kb) {
  return m < split ? kb * split + m : split * kblocks + kb * (rows - split) + (m - split);
}

#endif
