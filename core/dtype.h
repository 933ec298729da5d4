/* Element types and conversions.
 *
 * bf16 and f16 are stored as uint16_t bit patterns, fp8 as uint8_t. Every conversion
 * from f32 rounds to nearest, ties to even. NaN stays NaN (sign kept). Conversions to
 * fp8 come in two flavours: `saturate = 1` clamps finite overflow and infinities to the
 * largest finite value of the format (what quantization wants), `saturate = 0` follows
 * the formats' own rules (e4m3fn has no infinity: overflow becomes NaN; e5m2 overflows
 * to infinity), as ml_dtypes and PyTorch do.
 *
 * FP8 e4m3 here is the "fn" variant used by DeepSeek-V3 and torch.float8_e4m3fn: max
 * 448, no infinities, NaN = S.1111.111.
 *
 * Block-scaled FP8 (DeepSeek-V3 checkpoint format): a [rows, cols] matrix is cut into
 * blocks of block_rows x block_cols; each block has one fp32 `scale_inv` such that
 * value = fp8 * scale_inv. Scales are stored row-major with shape
 * [ceil(rows / block_rows), ceil(cols / block_cols)]. Activations use 1 x 128 blocks,
 * weights 128 x 128.
 *
 * Thread safety: all functions are pure and thread-safe. */
#ifndef INA_CORE_DTYPE_H
#define INA_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_dtype {
  INA_DTYPE_F32 = 0,
  INA_DTYPE_F16,
  INA_DTYPE_BF16,
  INA_DTYPE_FP8_E4M3,
  INA_DTYPE_FP8_E5M2,
  INA_DTYPE_I32,
  INA_DTYPE_I64,
  INA_DTYPE_COUNT
} ina_dtype_t;

#define INA_FP8_E4M3_MAX 448.0f
#define INA_FP8_E5M2_MAX 57344.0f

/* Bytes per element. */
size_t ina_dtype_size(ina_dtype_t dtype);
/* Short lower-case name: "f32", "bf16", "fp8_e4m3", ... */
const char *ina_dtype_name(ina_dtype_t dtype);
/* safetensors dtype names: "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "I32", "I64".
 * Returns INA_ERR_UNSUPPORTED for any other name (e.g. "BOOL", "F8_E8M0"). */
ina_status_t ina_dtype_from_safetensors(const char *name, ina_dtype_t *out);
const char *ina_dtype_safetensors_name(ina_dtype_t dtype);
int ina_dtype_is_float(ina_dtype_t dtype);

float ina_bf16_to_f32(uint16_t h);
uint16_t ina_f32_to_bf16(float f);
float ina_f16_to_f32(uint16_t h);
uint16_t ina_f32_to_f16(float f);
float ina_fp8_e4m3_to_f32(uint8_t v);
uint8_t ina_f32_to_fp8_e4m3(float f, int saturate);
float ina_fp8_e5m2_to_f32(uint8_t v);
uint8_t ina_f32_to_fp8_e5m2(float f, int saturate);

/* Convert n elements of any float dtype (f32, f16, bf16, fp8) or int dtype to f32. */
void ina_to_f32(const void *src, ina_dtype_t src_dtype, float *dst, size_t n);
/* Convert n f32 values to a float dtype (fp8 saturating). Returns INA_ERR_INVALID_ARGUMENT
 * for integer destinations. */
ina_status_t ina_from_f32(const float *src, void *dst, ina_dtype_t dst_dtype, size_t n);

/* Quantize a row-major [rows, cols] f32 matrix to fp8 e4m3 with one fp32 scale per
 * block: scale_inv = amax(block) / 448 (1 for an all-zero block), q = sat(x / scale_inv).
 * q has rows*cols bytes; scale_inv has ceil(rows/br)*ceil(cols/bc) floats. */
ina_status_t ina_fp8_quantize_blocks(const float *x, int64_t rows, int64_t cols, int block_rows,
                                     int block_cols, uint8_t *q, float *scale_inv);
/* Inverse: out = fp8(q) * scale_inv of its block. */
ina_status_t ina_fp8_dequantize_blocks(const uint8_t *q, const float *scale_inv, int64_t rows,
                                       int64_t cols, int block_rows, int block_cols, float *out);

#ifdef __cplusplus
}
#endif
#endif
