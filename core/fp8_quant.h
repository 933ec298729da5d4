/* Block-scaled FP8 e4m3 quantization on the GPU (DeepSeek-V3 format; core/dtype.h
 * describes the format and holds the CPU reference, ina_fp8_quantize_blocks).
 *
 * Every build has this function: without CUDA it returns INA_ERR_UNSUPPORTED.
 * Thread safety: as the CUDA runtime; concurrent calls on different streams are fine. */
#ifndef INA_CORE_FP8_QUANT_H
#define INA_CORE_FP8_QUANT_H

#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Quantize a row-major, contiguous [rows, cols] bf16 matrix (bit patterns) to fp8 e4m3
 * with one fp32 scale per block of block_rows x block_cols values. The result is
 * bit-identical to ina_fp8_quantize_blocks applied to the same values widened to f32:
 * scale_inv = amax(block) / 448 (1 for an all-zero block), q = e4m3_satfinite(x / scale_inv)
 * rounded to nearest even. Inputs with NaN or infinity give NaN bytes whose sign may
 * differ from the reference's.
 *
 * x_bf16:    device pointer, rows * cols elements. Not NULL unless rows * cols == 0.
 * q:         device pointer, rows * cols bytes, written.
 * scale_inv: device pointer, ceil(rows / block_rows) * ceil(cols / block_cols) floats,
 *            row-major, written.
 * Blocks:    block_cols must be 128; block_rows 1 (activations) or 128 (weights); other
 *            shapes return INA_ERR_UNSUPPORTED. Ragged edges (rows or cols not multiples
 *            of the block) are handled; 16-byte aligned x, 8-byte aligned q and cols a
 *            multiple of 8 take the fast path.
 * stream:    a cudaStream_t, or NULL for the legacy default stream.
 *
 * Asynchronous: the kernel is enqueued on `stream` and the call returns; a launch error
 * is reported here, a fault during execution at the next synchronization. Allocates
 * nothing and never waits on the host, so it can be captured in a CUDA graph.
 * rows == 0 or cols == 0 enqueues nothing and returns INA_OK. */
ina_status_t ina_cuda_fp8_quantize_blocks(const uint16_t *x_bf16, int64_t rows, int64_t cols,
                                          int block_rows, int block_cols, uint8_t *q,
                                          float *scale_inv, void *stream);

#ifdef __cplusplus
}
#endif
#endif
