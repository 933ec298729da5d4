/* The checks bench_custom_ar runs before it times: host code over host copies of every
 * rank's input and of this rank's results, built in every configuration so that
 * tests/bench/test_bench_checks.c runs it on the CPU. The reference of an all-reduce is
 * the sum over the ranks, formed as the CPU model of tests/comm/custom_ar_model.h forms
 * it (the model test_custom_ar checks the kernels against). Results are reported through
 * ina_bench_check (bench/bench_util.h).
 *
 * ---- Error model --------------------------------------------------------------------
 *   Custom all-reduce (IPC path, BF16 and FP8 modes). The kernels' per-element arithmetic
 *     is comm/custom_ar_math.h (fp32 sum in rank order, one bf16 rounding; FP8: 1 x 128
 *     quantization of each rank's block, fp32 sum of the dequantized values in rank order,
 *     re-quantization of the sum), and the model applies the same operations in the same
 *     order, so a correct result equals the model bit for bit: bound 0 differing
 *     elements. (How far the model itself is from the exact sum is test_custom_ar's
 *     business: BF16 within 2^-8 of it relatively, FP8 within ~2.15 * 2^-4 of the ranks'
 *     block amax, derived in custom_ar_model.h.)
 *   NCCL bf16 all-reduce. Its order and intermediate roundings are NCCL's: each of at
 *     most n - 1 bf16 roundings of partial sums and the final one moves a value by at most
 *     2^-8 of it, with random sign, so the relative L2 error against the exact fp64 sum
 *     is ~sqrt(n) 2^-8 / sqrt(3) = 6.4e-3 at n = 8 ranks. Bound 1e-2 (test_custom_ar's
 *     NCCL bound).
 *   Epilogue (residual add + RMSNorm + FP8 rows) on the all-reduced rows x:
 *     residual = bf16(residual + x): exact when x is the model's sum (0 differing values);
 *     y = bf16(w * v * inv) with fp32 operations and an fp32 sum of squares in a fixed
 *     order: each value within (2^-8 + 1e-5) |y_ref| of the fp64 norm y_ref of the exact
 *     residual (the bf16 rounding plus the sum of squares' few fp32 ulps; test_custom_ar's
 *     per-element bound): 0 values outside;
 *     FP8 rows: ina_fp8_quantize_blocks of the bf16 y bit for bit (0 differing).
 *     After an NCCL sum (x then is NCCL's, not the model's): residual and y within
 *     relative L2 1e-2 of the model on x = bf16(exact sum), as in test_custom_ar.
 *
 * Thread safety: pure but for reporting (not thread-safe). */
#ifndef INA_BENCH_BENCH_CUSTOM_AR_CHECK_H
#define INA_BENCH_BENCH_CUSTOM_AR_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define INA_BENCH_AR_MAX_RANKS 8
#define INA_BENCH_AR_NCCL_TOL 1e-2

/* The model's sums of every rank's input (the first `count` elements of each). */
typedef struct ina_bench_ar_ref {
  int nranks;
  size_t count;
  const uint16_t *inputs[INA_BENCH_AR_MAX_RANKS]; /* the caller's: bf16 [count] per rank */
  uint16_t *bf16;                                 /* [count] the BF16 mode's sum */
  uint16_t *fp8;                                  /* [count] the FP8 mode's sum */
} ina_bench_ar_ref_t;

/* count a multiple of 128 (the FP8 blocks); the inputs must outlive ref. The model of a
 * prefix of count elements is the prefix of the model, for any multiple of 128. */
ina_status_t ina_bench_ar_ref_init(ina_bench_ar_ref_t *ref, int nranks,
                                   const uint16_t *const *inputs, size_t count,
                                   ina_threadpool_t *pool);
void ina_bench_ar_ref_free(ina_bench_ar_ref_t *ref);

/* A plain all-reduce's result out [count] (count <= ref->count; a multiple of 128 for
 * FP8): bit for bit against the model of `fp8`'s mode, or, when nccl is set, within the
 * NCCL bound of the exact sum. Returns 1 when it passed. */
int ina_bench_ar_check_sum(const char *what, const ina_bench_ar_ref_t *ref, int fp8, int nccl,
                           const uint16_t *out, size_t count);

/* One run of the epilogue over [rows, cols] (rows * cols <= ref->count). */
typedef struct ina_bench_ar_epilogue {
  int64_t rows, cols;
  int fp8;                         /* the all-reduce ran in FP8 mode */
  int nccl;                        /* the sum came from NCCL */
  const uint16_t *residual_before; /* bf16 [rows, cols], as the run found it */
  const uint16_t *residual_after;  /* bf16 [rows, cols], as the run left it */
  const uint16_t *weight;          /* bf16 [cols] */
  float eps;
  const uint16_t *y;               /* bf16 [rows, cols] */
  const uint8_t *y_fp8;            /* e4m3 [rows, cols], or NULL */
  const float *y_scale;            /* [rows, ceil(cols / 128)] with y_fp8 */
} ina_bench_ar_epilogue_t;

/* The epilogue's outputs against the model (see the error model). Returns 1 when every
 * check passed. */
int ina_bench_ar_check_epilogue(const char *what, const ina_bench_ar_ref_t *ref,
                                const ina_bench_ar_epilogue_t *e);

#ifdef __cplusplus
}
#endif
#endif
