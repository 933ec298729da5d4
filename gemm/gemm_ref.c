/* CPU reference of gemm/gemm.h: plain loops in double.
 *
 * FP8 values are exact in double, and so is every product of two of them and every sum
 * of 128 such products (at most 8 + 7 significant bits), so each 128-wide K block is
 * summed exactly and then scaled: the result is the dot product of the dequantized
 * inputs with one rounding per K block, far below any bound the tests use. */
#define INA_LOG_SUBSYS "gemm"
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "gemm/gemm_internal.h"
#include "gemm/gemm_scale_layout.h"

/* bf16 bits -> value, inline: the reference's inner loop runs it once per product. */
static inline double bf16_value(uint16_t h) {
  const uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static double out_value(const void *base, ina_dtype_t dtype, int64_t index) {
  if (dtype == INA_DTYPE_F32) return ((const float *)base)[index];
  return ina_bf16_to_f32(((const uint16_t *)base)[index]);
}

static void row_bf16(const ina_gemm_args_t *a, int64_t row, double *xrow, double *out) {
  const uint16_t *x = (const uint16_t *)a->x + row * a->ldx;
  for (int64_t kk = 0; kk < a->k; kk++) xrow[kk] = bf16_value(x[kk]);
  for (int64_t n = 0; n < a->n; n++) {
    const uint16_t *w = (const uint16_t *)a->w + n * a->k;
    double s = 0.0;
    for (int64_t kk = 0; kk < a->k; kk++) s += xrow[kk] * bf16_value(w[kk]);
    out[n] = s;
  }
}

static void row_fp8(const ina_gemm_args_t *a, int64_t row, double *xrow, double *out) {
  const uint8_t *x = (const uint8_t *)a->x + row * a->ldx;
  const int64_t kblocks = ina_gemm_kblocks(a->k), kblocks4 = (kblocks + 3) / 4 * 4;
  const int64_t split = ina_gemm_cublaslt_rows(a->m);
  double e4m3[256];
  for (int v = 0; v < 256; v++) e4m3[v] = ina_fp8_e4m3_to_f32((uint8_t)v);
  for (int64_t kk = 0; kk < a->k; kk++) xrow[kk] = e4m3[x[kk]];
  for (int64_t n = 0; n < a->n; n++) {
    const uint8_t *w = (const uint8_t *)a->w + n * a->k;
    const float *w_scale = a->w_scale + (n / INA_GEMM_BLOCK) * kblocks4;
    double s = 0.0;
    for (int64_t kb = 0; kb < kblocks; kb++) {
      const int64_t end = (kb + 1) * INA_GEMM_BLOCK < a->k ? (kb + 1) * INA_GEMM_BLOCK : a->k;
      double block = 0.0;
      for (int64_t kk = kb * INA_GEMM_BLOCK; kk < end; kk++) block += xrow[kk] * e4m3[w[kk]];
      const double x_scale = a->x_scale[ina_gemm_scale_offset(a->m, split, kblocks, row, kb)];
      s += block * x_scale * (double)w_scale[kb];
    }
    out[n] = s;
  }
}

ina_status_t ina_gemm_ref_row(const ina_gemm_args_t *args, int64_t row, double *out) {
  ina_status_t st = INA_OK;
  ina_gemm_args_t a;
  double *xrow = NULL;
  INA_CHECK(ina_gemm_check_args(args, "ina_gemm_ref_row", INA_GEMM_CHECK_POINTERS, &a));
  INA_REQUIRE(row >= 0 && row < a.m && out != NULL, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_ref_row: row %lld outside [0, %lld) or NULL out", (long long)row,
              (long long)a.m);
  xrow = malloc((size_t)a.k * sizeof *xrow);
  INA_CHECK_ALLOC(xrow);
  if (a.mode == INA_GEMM_FP8_BLOCK)
    row_fp8(&a, row, xrow, out);
  else
    row_bf16(&a, row, xrow, out);
  if (a.residual)
    for (int64_t n = 0; n < a.n; n++)
      out[n] += (double)a.beta * out_value(a.residual, a.out_dtype, row * a.ldr + n);
fail:
  free(xrow);
  return st;
}

ina_status_t ina_gemm_ref(const ina_gemm_args_t *args) {
  ina_status_t st = INA_OK;
  ina_gemm_args_t a;
  double *row = NULL;
  INA_CHECK(ina_gemm_check_args(args, "ina_gemm_ref", INA_GEMM_CHECK_POINTERS, &a));
  row = malloc((size_t)a.n * sizeof *row);
  INA_CHECK_ALLOC(row);
  for (int64_t m = 0; m < a.m; m++) {
    /* The residual may be y itself: each row reads its residual before writing. */
    INA_CHECK(ina_gemm_ref_row(&a, m, row));
    for (int64_t n = 0; n < a.n; n++) {
      if (a.out_dtype == INA_DTYPE_F32)
        ((float *)a.y)[m * a.ldy + n] = (float)row[n];
      else
        ((uint16_t *)a.y)[m * a.ldy + n] = ina_f32_to_bf16((float)row[n]);
    }
  }
fail:
  free(row);
  return st;
}
