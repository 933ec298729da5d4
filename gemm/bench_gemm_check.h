/* The checks bench_gemm and bench_gemm_grouped run before they time: host code over host
 * copies of what the GPU read and wrote, built in every configuration so that
 * tests/bench/test_bench_checks.c runs it on the CPU. Results are reported through
 * ina_bench_check (bench/bench_util.h).
 *
 * ---- Error model (bf16 outputs, fp32 accumulation) -----------------------------------
 * The references are exact on the operands the GPU read: bf16 x and W, or e4m3 x and W
 * times their scales (gemm_ref.c, gemm_grouped_ref.c: each 128-wide block sum of e4m3
 * products is exact in double). What a correct GPU GEMM adds to them:
 *   rounding  bf16 output: |bf16(v) - v| <= 2^-8 |v| (8 significant bits, nearest even),
 *             so at most 2^-8 of relative L2 error.
 *   sums      bf16: fp32 sums of K products; with rounding errors of random sign their
 *             relative error is ~2^-24 sqrt(K) (3e-6 at K = 16384). FP8: tensor-core
 *             partial sums of at most 128 products (Hopper's FP8 tensor cores keep about
 *             14 significant bits in them: an error up to 2^-13 of the block's sum of
 *             |products|), then scaled and added in fp32. For random-sign products a
 *             block's sum of |products| is ~sqrt(128) times its sum's rms, so the
 *             relative error is at most ~2^-13 sqrt(128) = 2^-9.5 (1.4e-3), whatever the
 *             number of blocks.
 *   So ||y - ref|| / ||ref|| <= 2^-8 + 2^-9.5 = 5.3e-3 against the unrounded reference,
 *   and per row <= 2^-7 + 2^-9.5 = 9.2e-3 against a reference rounded to bf16 itself
 *   (both sides rounded). The bounds below are 1e-2, as tests/gemm/test_gemm_gpu.c (bf16)
 *   and tests/gemm/test_gemm_grouped_gpu.c (per row) use: a missing 128-block of K = 2048
 *   (~25 %), a wrong weight row or group (~140 % on the outputs it feeds), or a 5 % scale
 *   error (5e-2) is far outside them.
 *   Quantization (FP8 GEMM against the bf16 operands it was quantized from): an e4m3
 *   rounding moves a normal value by at most 2^-4 of itself and, for values spread over
 *   a binade, by ~2^-4.5 / sqrt(3) rms; x and W are both rounded, so a dot product of
 *   random-sign terms is off by ~sqrt(2) 2^-4.5 / sqrt(3) = 2^-4 / sqrt(3) = 0.036 in
 *   relative L2 (a block's subnormals lie below ~amax * 2^-15 and do not count). The bound is
 *   5e-2 (test_gemm_gpu's FP8_VS_BF16_TOL).
 *   Quantization itself (ina_gemm_quantize_x, ina_cuda_fp8_quantize_blocks) follows the
 *   rule of ina_fp8_quantize_blocks exactly: bytes and scales are compared bit for bit.
 *
 * Thread safety: the functions are pure but for reporting (not thread-safe). */
#ifndef INA_GEMM_BENCH_GEMM_CHECK_H
#define INA_GEMM_BENCH_GEMM_CHECK_H

#include <stdint.h>

#include "core/status.h"
#include "core/threadpool.h"
#include "gemm/gemm_grouped.h"

#ifdef __cplusplus
extern "C" {
#endif

#define INA_BENCH_GEMM_TOL 1e-2          /* rel L2 against the unrounded reference */
#define INA_BENCH_GEMM_FP8_VS_BF16_TOL 5e-2 /* rel L2 of FP8 against the bf16 operands */
#define INA_BENCH_GROUPED_ROW_TOL 1e-2   /* worst row's rel L2 against ina_gemm_grouped_ref */
#define INA_BENCH_BF16_POISON 0xFFFFu    /* a bf16 NaN: what cudaMemset(0xFF) writes */

/* ---- dense GEMM (gemm/gemm.h) ------------------------------------------------------- */

/* The reference rows of one N x K weight, for the sampled rows of x. */
typedef struct ina_bench_gemm_ref {
  int64_t n, k;
  int nrows;
  int64_t *rows;   /* [nrows] row indices of x, ascending */
  double *bf16;    /* [nrows, n] x16 . w16^T, unrounded */
  double *fp8;     /* [nrows, n] e4m3 x . e4m3 W^T with the scales; NULL without FP8 */
  uint8_t *x8;     /* [nrows, k] the host quantization of the sampled x rows (1 x 128) */
  float *x_scale;  /* [nrows, ceil(k / 128)] their scales, row-major */
} ina_bench_gemm_ref_t;

/* Computes the references of the sampled rows. x16_rows: bf16 [nrows, k], the sampled rows
 * of x in the order of `rows`; w16: bf16 [n, k]; w8 and w_scale (ina_gemm_pack_w_scales'
 * layout): the FP8 weight, or NULL for no FP8 reference. The rows are quantized on the host
 * (ina_fp8_quantize_blocks, 1 x 128) for the FP8 reference. pool may be NULL (serial).
 * On failure *ref is freed. */
ina_status_t ina_bench_gemm_ref_init(ina_bench_gemm_ref_t *ref, int64_t n, int64_t k,
                                     const int64_t *rows, int nrows, const uint16_t *x16_rows,
                                     const uint16_t *w16, const uint8_t *w8, const float *w_scale,
                                     ina_threadpool_t *pool);
void ina_bench_gemm_ref_free(ina_bench_gemm_ref_t *ref);

/* The FP8 weight (bytes [n, k] and scales packed by ina_gemm_pack_w_scales) against
 * ina_fp8_quantize_blocks of w16 with 128 x 128 blocks: *q_diff bytes and *scale_diff
 * scales differ. */
ina_status_t ina_bench_gemm_w8_diff(int64_t n, int64_t k, const uint16_t *w16, const uint8_t *w8,
                                    const float *w_scale, int64_t *q_diff, int64_t *scale_diff);
/* The same, reported as the check `what`: returns 1 when bit for bit equal. */
int ina_bench_gemm_check_w8(const char *what, int64_t n, int64_t k, const uint16_t *w16,
                            const uint8_t *w8, const float *w_scale);

/* x quantized on the device for a GEMM of m rows: x8_rows [nrows, k] holds the device's
 * bytes of the sampled rows (in ref->rows' order; rows >= m are ignored) and x_scale its
 * m * ceil(k / 128) scales in ina_gemm_x_scale_index's layout. Bit for bit against the
 * host quantization. Returns 1 when equal. */
int ina_bench_gemm_check_x8(const char *what, const ina_bench_gemm_ref_t *ref, int64_t m,
                            const uint8_t *x8_rows, const float *x_scale);

/* y: bf16 [y_rows, n] read back after one GEMM of m rows into a buffer poisoned with
 * INA_BENCH_BF16_POISON (y_rows >= m). Checks: every value of the m rows finite; rows m ..
 * y_rows - 1 still poison; the sampled rows < m within INA_BENCH_GEMM_TOL of the FP8 (fp8
 * set) or bf16 reference, and FP8 also within INA_BENCH_GEMM_FP8_VS_BF16_TOL of the bf16
 * reference. Returns 1 when every check passed. */
int ina_bench_gemm_check_y(const char *what, const ina_bench_gemm_ref_t *ref, int fp8, int64_t m,
                           const uint16_t *y, int64_t y_rows);

/* ---- grouped GEMM (gemm/gemm_grouped.h) ---------------------------------------------- */

/* ina_gemm_grouped_ref's output for sampled rows of one grouped GEMM. */
typedef struct ina_bench_grouped_ref {
  int64_t n, routed; /* routed = offsets[num_groups] */
  int nrows;
  int64_t *rows;     /* [nrows] ascending rows below `routed` */
  float *y;          /* [nrows, n] the reference (bf16-rounded) as f32 */
} ina_bench_grouped_ref_t;

/* host: the grouped GEMM's arguments with host pointers (x, x_scale, y unused, the w and
 * w_scale arrays of host pointers, offsets host; row_ends NULL). Up to max_rows_checked
 * rows are sampled (all routed rows when there are no more; else the first, the last and
 * random ones, from *state), gathered into a grouped GEMM of their own and computed by
 * ina_gemm_grouped_ref, split over the pool's threads (pool may be NULL). */
ina_status_t ina_bench_grouped_ref_init(ina_bench_grouped_ref_t *ref,
                                        const ina_gemm_grouped_args_t *host, int max_rows_checked,
                                        uint64_t *state, ina_threadpool_t *pool);
void ina_bench_grouped_ref_free(ina_bench_grouped_ref_t *ref);

/* y: bf16 [y_rows, n] (row stride n) read back after one run into a buffer poisoned with
 * INA_BENCH_BF16_POISON. Checks: the routed rows finite; rows routed .. y_rows - 1 still
 * poison; every sampled row within INA_BENCH_GROUPED_ROW_TOL (relative L2 of the row).
 * Returns 1 when every check passed. */
int ina_bench_grouped_check_y(const char *what, const ina_bench_grouped_ref_t *ref,
                              const uint16_t *y, int64_t y_rows);

#ifdef __cplusplus
}
#endif
#endif
