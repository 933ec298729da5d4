/* Host helpers for the FP8 scale layouts of gemm/gemm.h: sizes, the activation-scale
 * index, and the transforms from the checkpoint's and the quantizer's row-major scales. */
#define INA_LOG_SUBSYS "gemm"
#include <string.h>

#include "core/check.h"
#include "gemm/gemm.h"
#include "gemm/gemm_scale_layout.h"

/* Largest dimension the helpers accept: keeps every product below in int64. */
#define MAX_DIM ((int64_t)1 << 31)

static int64_t round_up4(int64_t x) { return (x + 3) / 4 * 4; }

static int dims_ok(int64_t rows, int64_t k) {
  return rows > 0 && k > 0 && rows <= MAX_DIM && k <= MAX_DIM;
}

int64_t ina_gemm_w_scale_count(int64_t n, int64_t k) {
  if (!dims_ok(n, k)) return 0;
  return ina_gemm_kblocks(n) * round_up4(ina_gemm_kblocks(k));
}

ina_status_t ina_gemm_pack_w_scales(const float *scale_inv, int64_t n, int64_t k, float *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(dims_ok(n, k), INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_pack_w_scales: weight [%lld, %lld] is empty or too large", (long long)n,
              (long long)k);
  INA_REQUIRE(scale_inv && out, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_pack_w_scales: NULL scale_inv or out");
  const int64_t row_blocks = ina_gemm_kblocks(n), kb = ina_gemm_kblocks(k), kb4 = round_up4(kb);
  for (int64_t r = 0; r < row_blocks; r++) {
    memcpy(out + r * kb4, scale_inv + r * kb, (size_t)kb * sizeof *out);
    for (int64_t c = kb; c < kb4; c++) out[r * kb4 + c] = 0.0f;
  }
fail:
  return st;
}

int64_t ina_gemm_x_scale_count(int64_t m, int64_t k) {
  if (!dims_ok(m, k)) return 0;
  return m * ina_gemm_kblocks(k);
}

int64_t ina_gemm_x_scale_index(int64_t m, int64_t k, int64_t row, int64_t kblock) {
  if (!dims_ok(m, k) || row < 0 || row >= m || kblock < 0 || kblock >= ina_gemm_kblocks(k))
    return -1;
  return ina_gemm_scale_offset(m, ina_gemm_cublaslt_rows(m), ina_gemm_kblocks(k), row, kblock);
}

ina_status_t ina_gemm_pack_x_scales(const float *row_major, int64_t m, int64_t k, float *out) {
  ina_status_t st = INA_OK;
  INA_REQUIRE(dims_ok(m, k), INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_pack_x_scales: activations [%lld, %lld] are empty or too large",
              (long long)m, (long long)k);
  INA_REQUIRE(row_major && out, INA_ERR_INVALID_ARGUMENT,
              "ina_gemm_pack_x_scales: NULL row_major or out");
  const int64_t kb = ina_gemm_kblocks(k), split = ina_gemm_cublaslt_rows(m);
  for (int64_t r = 0; r < m; r++)
    for (int64_t b = 0; b < kb; b++)
      out[ina_gemm_scale_offset(m, split, kb, r, b)] = row_major[r * kb + b];
fail:
  return st;
}
