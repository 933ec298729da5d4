/* The checks of bench_custom_ar (bench/bench_custom_ar_check.h). */
#define INA_LOG_SUBSYS "bench"
#include "bench/bench_custom_ar_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/check.h"
#include "core/dtype.h"
#include "tests/comm/custom_ar_model.h"

#define MODEL_CHUNK ((size_t)1 << 16) /* elements per parallel item: whole FP8 blocks */

typedef struct model_job {
  const ina_bench_ar_ref_t *ref;
} model_job_t;

/* Items [begin, end): chunk i / 2 of the BF16 (even i) or FP8 (odd i) model. The model is
 * blockwise (128 elements), so a chunk on block boundaries is the model of its slice. */
static void model_chunks(void *ctx, int64_t begin, int64_t end, int worker) {
  (void)worker;
  const model_job_t *j = ctx;
  const ina_bench_ar_ref_t *r = j->ref;
  for (int64_t i = begin; i < end; i++) {
    const size_t off = (size_t)(i / 2) * MODEL_CHUNK;
    const size_t len = r->count - off < MODEL_CHUNK ? r->count - off : MODEL_CHUNK;
    const void *in[INA_BENCH_AR_MAX_RANKS];
    for (int k = 0; k < r->nranks; k++) in[k] = r->inputs[k] + off;
    if (i % 2 == 0) car_model_all_reduce(INA_CAR_MODE_BF16, r->nranks, in, len, r->bf16 + off);
    else car_model_all_reduce(INA_CAR_MODE_FP8, r->nranks, in, len, r->fp8 + off);
  }
}

void ina_bench_ar_ref_free(ina_bench_ar_ref_t *ref) {
  if (!ref) return;
  free(ref->bf16);
  free(ref->fp8);
  memset(ref, 0, sizeof *ref);
}

ina_status_t ina_bench_ar_ref_init(ina_bench_ar_ref_t *ref, int nranks,
                                   const uint16_t *const *inputs, size_t count,
                                   ina_threadpool_t *pool) {
  ina_status_t st = INA_OK;
  memset(ref, 0, sizeof *ref);
  INA_REQUIRE(nranks >= 1 && nranks <= INA_BENCH_AR_MAX_RANKS && count % INA_CAR_GRANULE == 0 &&
                  count > 0 && inputs,
              INA_ERR_INVALID_ARGUMENT, "ina_bench_ar_ref_init: %d ranks, count %zu", nranks,
              count);
  ref->nranks = nranks;
  ref->count = count;
  for (int r = 0; r < nranks; r++) ref->inputs[r] = inputs[r];
  ref->bf16 = malloc(count * sizeof *ref->bf16);
  ref->fp8 = malloc(count * sizeof *ref->fp8);
  INA_CHECK_ALLOC(ref->bf16);
  INA_CHECK_ALLOC(ref->fp8);
  model_job_t job = {ref};
  ina_parallel_for(pool, 2 * (int64_t)((count + MODEL_CHUNK - 1) / MODEL_CHUNK), 1, model_chunks,
                   &job);
fail:
  if (st != INA_OK) ina_bench_ar_ref_free(ref);
  return st;
}

/* The exact sum of element i over the ranks. */
static double exact_sum(const ina_bench_ar_ref_t *ref, size_t i) {
  double s = 0;
  for (int r = 0; r < ref->nranks; r++) s += ina_bf16_to_f32(ref->inputs[r][i]);
  return s;
}

static float bf16_value(uint16_t h) {
  float f;
  ina_bench_bf16_to_f32(&h, &f, 1);
  return f;
}

int ina_bench_ar_check_sum(const char *what, const ina_bench_ar_ref_t *ref, int fp8, int nccl,
                           const uint16_t *out, size_t count) {
  if (count > ref->count || (fp8 && count % INA_CAR_GRANULE != 0))
    return ina_bench_check_failed(what, "count %zu outside the reference (%zu)", count, ref->count);
  if (nccl) {
    double num = 0, den = 0;
    size_t nonfinite = 0;
    for (size_t i = 0; i < count; i++) {
      const double got = bf16_value(out[i]), want = exact_sum(ref, i);
      nonfinite += !isfinite(got);
      num += (got - want) * (got - want);
      den += want * want;
    }
    if (nonfinite)
      return ina_bench_check_failed(what, "%zu of %zu outputs are NaN or infinite (unwritten?)",
                                    nonfinite, count);
    return ina_bench_check(what, "rel_l2_vs_exact_sum_over_ranks",
                           den > 0 ? sqrt(num / den) : sqrt(num), INA_BENCH_AR_NCCL_TOL);
  }
  const uint16_t *want = fp8 ? ref->fp8 : ref->bf16;
  size_t diff = 0, first = count;
  for (size_t i = 0; i < count; i++)
    if (out[i] != want[i]) {
      if (first == count) first = i;
      diff++;
    }
  if (diff)
    return ina_bench_check_failed(what,
                                  "%zu of %zu elements differ from the CPU model of the %s sum "
                                  "(first %zu: %g, model %g, exact sum %g)",
                                  diff, count, fp8 ? "FP8" : "BF16", first,
                                  (double)bf16_value(out[first]), (double)bf16_value(want[first]),
                                  exact_sum(ref, first));
  return ina_bench_check(what, fp8 ? "elements_differing_from_fp8_model"
                                   : "elements_differing_from_bf16_model",
                         0, 0);
}

int ina_bench_ar_check_epilogue(const char *what, const ina_bench_ar_ref_t *ref,
                                const ina_bench_ar_epilogue_t *e) {
  const int64_t rows = e->rows, cols = e->cols, count = rows * cols;
  int ok = 1;
  if (rows < 1 || cols < 1 || (size_t)count > ref->count)
    return ina_bench_check_failed(what, "[%lld, %lld] outside the reference", (long long)rows,
                                  (long long)cols);
  uint16_t *x = malloc((size_t)count * sizeof *x), *res = malloc((size_t)count * sizeof *res);
  float *w = malloc((size_t)cols * sizeof *w), *yf = malloc((size_t)count * sizeof *yf);
  double *y_ref = malloc((size_t)count * sizeof *y_ref);
  if (!x || !res || !w || !yf || !y_ref) {
    ok = ina_bench_check_failed(what, "out of memory");
    goto done;
  }
  /* The rows the epilogue saw: the model's sum, or under NCCL the exact sum in bf16. */
  for (int64_t i = 0; i < count; i++)
    x[i] = e->nccl ? ina_f32_to_bf16((float)exact_sum(ref, (size_t)i))
                   : (e->fp8 ? ref->fp8 : ref->bf16)[i];
  memcpy(res, e->residual_before, (size_t)count * sizeof *res);
  ina_bench_bf16_to_f32(e->weight, w, cols);
  car_model_epilogue(x, rows, cols, res, w, e->eps, y_ref);
  ina_bench_bf16_to_f32(e->y, yf, count);
  int64_t res_diff = 0, y_over = 0, nonfinite = ina_bench_count_nonfinite(yf, count);
  double res_num = 0, res_den = 0, y_num = 0, y_den = 0, worst = 0;
  for (int64_t i = 0; i < count; i++) {
    const double got = bf16_value(e->residual_after[i]), want = bf16_value(res[i]);
    res_diff += e->residual_after[i] != res[i];
    res_num += (got - want) * (got - want);
    res_den += want * want;
    const double err = fabs(yf[i] - y_ref[i]), bound = (0x1p-8 + 1e-5) * fabs(y_ref[i]) + 1e-30;
    y_over += !(err <= bound);
    if (!(err / bound <= worst)) worst = err / bound;
    y_num += err * err;
    y_den += y_ref[i] * y_ref[i];
  }
  if (nonfinite)
    ok = ina_bench_check_failed(what, "%lld of %lld normalized outputs are NaN or infinite",
                                (long long)nonfinite, (long long)count);
  if (e->nccl) {
    ok &= ina_bench_check(what, "residual_rel_l2_vs_model_of_exact_sum",
                          res_den > 0 ? sqrt(res_num / res_den) : sqrt(res_num),
                          INA_BENCH_AR_NCCL_TOL);
    ok &= ina_bench_check(what, "y_rel_l2_vs_fp64_norm_of_exact_sum",
                          y_den > 0 ? sqrt(y_num / y_den) : sqrt(y_num), INA_BENCH_AR_NCCL_TOL);
  } else {
    ok &= ina_bench_check(what, "residual_values_differing_from_model", (double)res_diff, 0);
    if (y_over)
      ok = ina_bench_check_failed(what,
                                  "%lld of %lld normalized values outside (2^-8 + 1e-5) |y_ref| "
                                  "of the fp64 norm (worst %.3g x the bound)",
                                  (long long)y_over, (long long)count, worst);
    else
      ok &= ina_bench_check(what, "y_worst_error_over_per_element_bound", worst, 1.0);
  }
  if (e->y_fp8) {
    int64_t q_diff = 0, s_diff = 0, first = -1;
    if (ina_bench_fp8_blocks_diff(e->y, rows, cols, 1, e->y_fp8, e->y_scale, &q_diff, &s_diff,
                                  &first) != INA_OK)
      ok = ina_bench_check_failed(what, "fp8 reference: %s", ina_last_error());
    else
      ok &= ina_bench_check(what, "fp8_rows_bytes_and_scales_differing_from_quantized_y",
                            (double)(q_diff + s_diff), 0);
  }
done:
  free(x);
  free(res);
  free(w);
  free(yf);
  free(y_ref);
  return ok;
}
