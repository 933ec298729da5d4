#define INA_LOG_SUBSYS "dtype"
#include "core/dtype.h"

#include <math.h>
#include <string.h>

#include "core/check.h"

/* ---- bit helpers ------------------------------------------------------------------ */

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

#define F32_ABS_MASK 0x7FFFFFFFu
#define F32_INF_BITS 0x7F800000u
#define F32_QUIET_NAN_BITS 0x7FC00000u

/* ---- narrow formats (f16, fp8) ------------------------------------------------------ */

/* Rounds a finite, non-negative f32 (given as bits) to a narrower binary format with
 * `man_bits` mantissa bits and exponent bias `bias`, to nearest with ties to even, and
 * returns the magnitude code (exponent field << man_bits | mantissa). The exponent
 * field is not bounded: a code above the format's largest finite code means the value
 * rounded past it, and the caller decides what overflow becomes. */
static uint32_t round_to_narrow(uint32_t abs_bits, int man_bits, int bias) {
  uint32_t exp_field = abs_bits >> 23;
  /* f32 subnormals (< 2^-126) lie far below half the smallest subnormal of every
   * narrow format here (f16: 2^-24), so they round to zero. */
  if (exp_field == 0) return 0;
  uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u; /* 24 bits, implicit one */
  int target_exp = (int)exp_field - 127 + bias; /* biased, in the narrow format */
  int shift = 23 - man_bits;
  if (target_exp < 1) shift += 1 - target_exp; /* a subnormal result keeps fewer bits */
  /* With shift >= 25 the value is below half the smallest subnormal. */
  if (shift > 24) return 0;
  uint32_t kept = significand >> shift;
  uint32_t dropped = significand & ((1u << shift) - 1u);
  uint32_t half = 1u << (shift - 1);
  if (dropped > half || (dropped == half && (kept & 1u))) kept++;
  /* A subnormal code is just the kept bits; a carry into bit man_bits turns it into the
   * smallest normal, which is exactly the right code. */
  if (target_exp < 1) return kept;
  /* `kept` still holds the implicit one (1 << man_bits), which adds one to the exponent
   * field; a rounding carry to 2 << man_bits bumps the exponent once more, as it must. */
  return ((uint32_t)(target_exp - 1) << man_bits) + kept;
}

/* Magnitude of a finite narrow-format value (code without sign) as f32. */
static inline float narrow_magnitude_to_f32(uint32_t code, int man_bits, int bias) {
  uint32_t exp_field = code >> man_bits;
  uint32_t mantissa = code & ((1u << man_bits) - 1u);
  if (exp_field == 0) {
    /* Subnormal: mantissa * 2^(1 - bias - man_bits), exact in f32. */
    float unit = bits_f32((uint32_t)(127 + 1 - bias - man_bits) << 23);
    return (float)mantissa * unit;
  }
  return bits_f32(((exp_field - (uint32_t)bias + 127u) << 23) | (mantissa << (23 - man_bits)));
}

static inline float with_sign(float magnitude, int negative) {
  return bits_f32(f32_bits(magnitude) | (negative ? 0x80000000u : 0u));
}

/* ---- bf16 -------------------------------------------------------------------------- */

float ina_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t ina_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  /* NaN: keep sign and the top payload bits, force the quiet bit so that truncating the
   * payload cannot turn it into infinity. */
  if ((u & F32_ABS_MASK) > F32_INF_BITS) return (uint16_t)((u >> 16) | 0x0040u);
  /* Round to nearest even on the 16 dropped bits. A carry out of the mantissa moves to
   * the next binade, and past the largest finite value it lands exactly on infinity. */
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ---- f16 --------------------------------------------------------------------------- */

#define F16_MAN_BITS 10
#define F16_BIAS 15
#define F16_MAX_FINITE 0x7BFFu
#define F16_INF 0x7C00u

float ina_f16_to_f32(uint16_t h) {
  int negative = (h & 0x8000u) != 0;
  uint32_t code = h & 0x7FFFu;
  if (code >= F16_INF) {
    uint32_t mantissa = code & 0x3FFu;
    if (mantissa == 0) return with_sign(bits_f32(F32_INF_BITS), negative);
    return bits_f32((negative ? 0x80000000u : 0u) | F32_QUIET_NAN_BITS | (mantissa << 13));
  }
  return with_sign(narrow_magnitude_to_f32(code, F16_MAN_BITS, F16_BIAS), negative);
}

uint16_t ina_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & F32_ABS_MASK;
  if (a > F32_INF_BITS) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu)); /* quiet NaN */
  if (a == F32_INF_BITS) return (uint16_t)(sign | F16_INF);
  uint32_t code = round_to_narrow(a, F16_MAN_BITS, F16_BIAS);
  if (code > F16_MAX_FINITE) code = F16_INF;
  return (uint16_t)(sign | code);
}

/* ---- fp8 e4m3fn: bias 7, 3 mantissa bits, no infinity, NaN = S.1111.111 ------------ */

#define E4M3_MAN_BITS 3
#define E4M3_BIAS 7
#define E4M3_MAX_FINITE 0x7Eu
#define E4M3_NAN 0x7Fu

float ina_fp8_e4m3_to_f32(uint8_t v) {
  int negative = (v & 0x80u) != 0;
  uint32_t code = v & 0x7Fu;
  if (code == E4M3_NAN) return bits_f32((negative ? 0x80000000u : 0u) | F32_QUIET_NAN_BITS);
  return with_sign(narrow_magnitude_to_f32(code, E4M3_MAN_BITS, E4M3_BIAS), negative);
}

uint8_t ina_f32_to_fp8_e4m3(float f, int saturate) {
  uint32_t u = f32_bits(f);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & F32_ABS_MASK;
  if (a > F32_INF_BITS) return (uint8_t)(sign | E4M3_NAN);
  /* No infinity in the format: overflow (infinity included) is NaN unless saturating. */
  uint32_t overflow = saturate ? E4M3_MAX_FINITE : E4M3_NAN;
  if (a == F32_INF_BITS) return (uint8_t)(sign | overflow);
  uint32_t code = round_to_narrow(a, E4M3_MAN_BITS, E4M3_BIAS);
  if (code > E4M3_MAX_FINITE) code = overflow;
  return (uint8_t)(sign | code);
}

/* ---- fp8 e5m2: bias 15, 2 mantissa bits, IEEE-style infinities and NaNs ------------ */

#define E5M2_MAN_BITS 2
#define E5M2_BIAS 15
#define E5M2_MAX_FINITE 0x7Bu
#define E5M2_INF 0x7Cu
#define E5M2_QUIET_NAN 0x7Eu

float ina_fp8_e5m2_to_f32(uint8_t v) {
  int negative = (v & 0x80u) != 0;
  uint32_t code = v & 0x7Fu;
  if (code >= E5M2_INF) {
    uint32_t mantissa = code & 0x3u;
    if (mantissa == 0) return with_sign(bits_f32(F32_INF_BITS), negative);
    return bits_f32((negative ? 0x80000000u : 0u) | F32_QUIET_NAN_BITS | (mantissa << 21));
  }
  return with_sign(narrow_magnitude_to_f32(code, E5M2_MAN_BITS, E5M2_BIAS), negative);
}

uint8_t ina_f32_to_fp8_e5m2(float f, int saturate) {
  uint32_t u = f32_bits(f);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & F32_ABS_MASK;
  if (a > F32_INF_BITS) return (uint8_t)(sign | E5M2_QUIET_NAN);
  uint32_t overflow = saturate ? E5M2_MAX_FINITE : E5M2_INF;
  if (a == F32_INF_BITS) return (uint8_t)(sign | overflow);
  uint32_t code = round_to_narrow(a, E5M2_MAN_BITS, E5M2_BIAS);
  if (code > E5M2_MAX_FINITE) code = overflow;
  return (uint8_t)(sign | code);
}

/* ---- dtype table ---------------------------------------------------------------------- */

typedef struct {
  size_t size;
  const char *name;
  const char *safetensors_name;
  int is_float;
} dtype_info_t;

static const dtype_info_t dtype_infos[INA_DTYPE_COUNT] = {
    [INA_DTYPE_F32] = {4, "f32", "F32", 1},
    [INA_DTYPE_F16] = {2, "f16", "F16", 1},
    [INA_DTYPE_BF16] = {2, "bf16", "BF16", 1},
    [INA_DTYPE_FP8_E4M3] = {1, "fp8_e4m3", "F8_E4M3", 1},
    [INA_DTYPE_FP8_E5M2] = {1, "fp8_e5m2", "F8_E5M2", 1},
    [INA_DTYPE_I32] = {4, "i32", "I32", 0},
    [INA_DTYPE_I64] = {8, "i64", "I64", 0},
};

static int dtype_valid(ina_dtype_t dtype) { return (unsigned)dtype < (unsigned)INA_DTYPE_COUNT; }

size_t ina_dtype_size(ina_dtype_t dtype) {
  return dtype_valid(dtype) ? dtype_infos[dtype].size : 0;
}

const char *ina_dtype_name(ina_dtype_t dtype) {
  return dtype_valid(dtype) ? dtype_infos[dtype].name : "invalid";
}

const char *ina_dtype_safetensors_name(ina_dtype_t dtype) {
  return dtype_valid(dtype) ? dtype_infos[dtype].safetensors_name : "INVALID";
}

int ina_dtype_is_float(ina_dtype_t dtype) {
  return dtype_valid(dtype) && dtype_infos[dtype].is_float;
}

ina_status_t ina_dtype_from_safetensors(const char *name, ina_dtype_t *out) {
  ina_status_t st = INA_OK;
  if (out) *out = INA_DTYPE_COUNT; /* never leave the caller with an uninitialized dtype */
  INA_REQUIRE(name != NULL && out != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_dtype_from_safetensors: name and out must not be NULL");
  for (int d = 0; d < INA_DTYPE_COUNT; d++) {
    if (strcmp(name, dtype_infos[d].safetensors_name) == 0) {
      *out = (ina_dtype_t)d;
      return INA_OK;
    }
  }
  INA_REQUIRE(0, INA_ERR_UNSUPPORTED,
              "unsupported safetensors dtype \"%s\" (supported: F32, F16, BF16, F8_E4M3, F8_E5M2, "
              "I32, I64)",
              name);
fail:
  return st;
}

/* ---- bulk conversions ----------------------------------------------------------------- */

void ina_to_f32(const void *src, ina_dtype_t src_dtype, float *dst, size_t n) {
  if (n == 0) return;
  switch (src_dtype) {
  case INA_DTYPE_F32: memmove(dst, src, n * sizeof(float)); return;
  case INA_DTYPE_F16: {
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = ina_f16_to_f32(s[i]);
    return;
  }
  case INA_DTYPE_BF16: {
    const uint16_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = ina_bf16_to_f32(s[i]);
    return;
  }
  case INA_DTYPE_FP8_E4M3: {
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = ina_fp8_e4m3_to_f32(s[i]);
    return;
  }
  case INA_DTYPE_FP8_E5M2: {
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = ina_fp8_e5m2_to_f32(s[i]);
    return;
  }
  case INA_DTYPE_I32: {
    const int32_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
    return;
  }
  case INA_DTYPE_I64: {
    const int64_t *s = src;
    for (size_t i = 0; i < n; i++) dst[i] = (float)s[i];
    return;
  }
  case INA_DTYPE_COUNT: break;
  }
  /* No status to return: make the misuse loud instead of leaving dst stale. */
  ina_error(INA_LOG_SUBSYS, "ina_to_f32: invalid source dtype %d", (int)src_dtype);
  for (size_t i = 0; i < n; i++) dst[i] = NAN;
}

ina_status_t ina_from_f32(const float *src, void *dst, ina_dtype_t dst_dtype, size_t n) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(ina_dtype_is_float(dst_dtype), INA_ERR_INVALID_ARGUMENT,
              "ina_from_f32: destination dtype %s (%d) is not a float type",
              ina_dtype_name(dst_dtype), (int)dst_dtype);
  INA_REQUIRE(n == 0 || (src != NULL && dst != NULL), INA_ERR_INVALID_ARGUMENT,
              "ina_from_f32: NULL buffer for %zu elements", n);
  switch (dst_dtype) {
  case INA_DTYPE_F32:
    if (n) memmove(dst, src, n * sizeof(float));
    break;
  case INA_DTYPE_F16: {
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = ina_f32_to_f16(src[i]);
    break;
  }
  case INA_DTYPE_BF16: {
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = ina_f32_to_bf16(src[i]);
    break;
  }
  case INA_DTYPE_FP8_E4M3: {
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = ina_f32_to_fp8_e4m3(src[i], 1);
    break;
  }
  case INA_DTYPE_FP8_E5M2: {
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) d[i] = ina_f32_to_fp8_e5m2(src[i], 1);
    break;
  }
  default: break; /* integer types were rejected above */
  }
fail:
  return st;
}

/* ---- block-scaled fp8 ----------------------------------------------------------------- */

/* Checks the arguments shared by quantize and dequantize (buf0..2: the three buffers). */
static ina_status_t check_block_args(const char *fn, const void *buf0, const void *buf1,
                                     const void *buf2, int64_t rows, int64_t cols, int block_rows,
                                     int block_cols) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(rows >= 0 && cols >= 0, INA_ERR_INVALID_ARGUMENT, "%s: negative shape [%lld, %lld]",
              fn, (long long)rows, (long long)cols);
  INA_REQUIRE(block_rows > 0 && block_cols > 0, INA_ERR_INVALID_ARGUMENT,
              "%s: block %d x %d must be positive", fn, block_rows, block_cols);
  INA_REQUIRE(cols == 0 || rows <= (int64_t)(SIZE_MAX / sizeof(float)) / cols,
              INA_ERR_INVALID_ARGUMENT, "%s: shape [%lld, %lld] overflows the address space", fn,
              (long long)rows, (long long)cols);
  INA_REQUIRE(rows == 0 || cols == 0 || (buf0 != NULL && buf1 != NULL && buf2 != NULL),
              INA_ERR_INVALID_ARGUMENT, "%s: NULL buffer for a [%lld, %lld] matrix", fn,
              (long long)rows, (long long)cols);
fail:
  return st;
}

ina_status_t ina_fp8_quantize_blocks(const float *x, int64_t rows, int64_t cols, int block_rows,
                                     int block_cols, uint8_t *q, float *scale_inv) {
  ina_status_t st = INA_OK;
  INA_CHECK(check_block_args("ina_fp8_quantize_blocks", x, q, scale_inv, rows, cols, block_rows,
                             block_cols));
  int64_t block_col_count = (cols + block_cols - 1) / block_cols;
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows) {
    int64_t r1 = r0 + block_rows < rows ? r0 + block_rows : rows;
    for (int64_t c0 = 0; c0 < cols; c0 += block_cols) {
      int64_t c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
      /* amax over the valid part of the block only: ragged edges are not padded. */
      float amax = 0.0f;
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(x[r * cols + c]));
      float scale = amax / INA_FP8_E4M3_MAX;
      /* An all-zero block gets scale 1 (any scale would do; 1 keeps dequant exact). A
       * tiny nonzero amax whose scale underflows gets the smallest positive scale so the
       * division below stays finite. */
      if (amax == 0.0f)
        scale = 1.0f;
      else if (scale == 0.0f)
        scale = bits_f32(1u);
      scale_inv[(r0 / block_rows) * block_col_count + c0 / block_cols] = scale;
      /* Divide (not multiply by a reciprocal) to match the reference quantizer
       * bit for bit: q = x / (amax / 448). */
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
          q[r * cols + c] = ina_f32_to_fp8_e4m3(x[r * cols + c] / scale, 1);
    }
  }
fail:
  return st;
}

ina_status_t ina_fp8_dequantize_blocks(const uint8_t *q, const float *scale_inv, int64_t rows,
                                       int64_t cols, int block_rows, int block_cols, float *out) {
  ina_status_t st = INA_OK;
  INA_CHECK(check_block_args("ina_fp8_dequantize_blocks", q, scale_inv, out, rows, cols, block_rows,
                             block_cols));
  int64_t block_col_count = (cols + block_cols - 1) / block_cols;
  for (int64_t r = 0; r < rows; r++) {
    const float *row_scales = scale_inv + (r / block_rows) * block_col_count;
    for (int64_t c = 0; c < cols; c++)
      out[r * cols + c] = ina_fp8_e4m3_to_f32(q[r * cols + c]) * row_scales[c / block_cols];
  }
fail:
  return st;
}
