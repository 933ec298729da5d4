/* The checks of bench_gemm and bench_gemm_grouped (gemm/bench_gemm_check.h). */
#define INA_LOG_SUBSYS "bench"
#include "gemm/bench_gemm_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/check.h"
#include "core/dtype.h"
#include "gemm/gemm.h"

static int64_t kblocks(int64_t k) { return (k + 127) / 128; }

/* ---- dense GEMM ------------------------------------------------------------------------- */

typedef struct ref_job {
  const ina_bench_gemm_ref_t *ref;
  const uint16_t *x16_rows, *w16;
  const uint8_t *w8;
  const float *w_scale;
  ina_status_t *status; /* [2 * nrows] */
} ref_job_t;

/* Item i: reference row i / 2, bf16 (even) or FP8 (odd), as a one-row GEMM. */
static void ref_rows(void *ctx, int64_t begin, int64_t end, int worker) {
  (void)worker;
  const ref_job_t *j = ctx;
  const ina_bench_gemm_ref_t *r = j->ref;
  for (int64_t i = begin; i < end; i++) {
    const int64_t row = i / 2;
    ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
    a.m = 1, a.n = r->n, a.k = r->k;
    double *out;
    if (i % 2 == 0) {
      a.mode = INA_GEMM_BF16;
      a.x = j->x16_rows + row * r->k;
      a.w = j->w16;
      out = r->bf16 + row * r->n;
    } else {
      if (!r->fp8) {
        j->status[i] = INA_OK;
        continue;
      }
      a.mode = INA_GEMM_FP8_BLOCK;
      a.x = r->x8 + row * r->k;
      a.x_scale = r->x_scale + row * kblocks(r->k); /* one row: its scales in order */
      a.w = j->w8;
      a.w_scale = j->w_scale;
      out = r->fp8 + row * r->n;
    }
    a.y = out; /* ina_gemm_ref_row writes only `out`; y must merely be set */
    j->status[i] = ina_gemm_ref_row(&a, 0, out);
  }
}

void ina_bench_gemm_ref_free(ina_bench_gemm_ref_t *ref) {
  if (!ref) return;
  free(ref->rows);
  free(ref->bf16);
  free(ref->fp8);
  free(ref->x8);
  free(ref->x_scale);
  memset(ref, 0, sizeof *ref);
}

ina_status_t ina_bench_gemm_ref_init(ina_bench_gemm_ref_t *ref, int64_t n, int64_t k,
                                     const int64_t *rows, int nrows, const uint16_t *x16_rows,
                                     const uint16_t *w16, const uint8_t *w8, const float *w_scale,
                                     ina_threadpool_t *pool) {
  ina_status_t st = INA_OK;
  float *xf = NULL;
  ina_status_t *status = NULL;
  memset(ref, 0, sizeof *ref);
  INA_REQUIRE(n >= 1 && k >= 1 && nrows >= 1 && rows && x16_rows && w16 && (!w8 || w_scale),
              INA_ERR_INVALID_ARGUMENT, "ina_bench_gemm_ref_init: n %lld, k %lld, %d rows",
              (long long)n, (long long)k, nrows);
  ref->n = n, ref->k = k, ref->nrows = nrows;
  ref->rows = malloc((size_t)nrows * sizeof *ref->rows);
  ref->bf16 = malloc((size_t)(nrows * n) * sizeof *ref->bf16);
  ref->x8 = malloc((size_t)(nrows * k));
  ref->x_scale = malloc((size_t)(nrows * kblocks(k)) * sizeof *ref->x_scale);
  xf = malloc((size_t)(nrows * k) * sizeof *xf);
  status = malloc((size_t)(2 * nrows) * sizeof *status);
  INA_CHECK_ALLOC(ref->rows);
  INA_CHECK_ALLOC(ref->bf16);
  INA_CHECK_ALLOC(ref->x8);
  INA_CHECK_ALLOC(ref->x_scale);
  INA_CHECK_ALLOC(xf);
  INA_CHECK_ALLOC(status);
  if (w8) {
    ref->fp8 = malloc((size_t)(nrows * n) * sizeof *ref->fp8);
    INA_CHECK_ALLOC(ref->fp8);
  }
  memcpy(ref->rows, rows, (size_t)nrows * sizeof *rows);
  /* 1 x 128 blocks never cross rows: quantizing the sampled rows alone gives their bytes
   * and scales in any larger x. */
  ina_bench_bf16_to_f32(x16_rows, xf, nrows * k);
  INA_CHECK(ina_fp8_quantize_blocks(xf, nrows, k, 1, 128, ref->x8, ref->x_scale));
  ref_job_t job = {ref, x16_rows, w16, w8, w_scale, status};
  ina_parallel_for(pool, 2 * (int64_t)nrows, 1, ref_rows, &job);
  for (int i = 0; i < 2 * nrows; i++) INA_CHECK(status[i]);
fail:
  free(xf);
  free(status);
  if (st != INA_OK) ina_bench_gemm_ref_free(ref);
  return st;
}

ina_status_t ina_bench_gemm_w8_diff(int64_t n, int64_t k, const uint16_t *w16, const uint8_t *w8,
                                    const float *w_scale, int64_t *q_diff, int64_t *scale_diff) {
  ina_status_t st = INA_OK;
  const int64_t nb = (n + 127) / 128, kb = kblocks(k), kb4 = (kb + 3) / 4 * 4;
  int64_t first = -1;
  float *rows = malloc((size_t)(nb * kb) * sizeof *rows);
  *q_diff = *scale_diff = 0;
  INA_CHECK_ALLOC(rows);
  /* The packed layout pads each row of scales from kb to kb4 floats. */
  for (int64_t r = 0; r < nb; r++) memcpy(rows + r * kb, w_scale + r * kb4, (size_t)kb * 4);
  INA_CHECK(ina_bench_fp8_blocks_diff(w16, n, k, 128, w8, rows, q_diff, scale_diff, &first));
fail:
  free(rows);
  return st;
}

int ina_bench_gemm_check_w8(const char *what, int64_t n, int64_t k, const uint16_t *w16,
                            const uint8_t *w8, const float *w_scale) {
  int64_t q_diff = 0, s_diff = 0;
  if (ina_bench_gemm_w8_diff(n, k, w16, w8, w_scale, &q_diff, &s_diff) != INA_OK)
    return ina_bench_check_failed(what, "weight quantization reference: %s", ina_last_error());
  if (q_diff || s_diff)
    return ina_bench_check_failed(what,
                                  "%lld of %lld weight bytes and %lld scales differ from "
                                  "ina_fp8_quantize_blocks",
                                  (long long)q_diff, (long long)(n * k), (long long)s_diff);
  return ina_bench_check(what, "weight_fp8_bytes_and_scales_differing", 0, 0);
}

int ina_bench_gemm_check_x8(const char *what, const ina_bench_gemm_ref_t *ref, int64_t m,
                            const uint8_t *x8_rows, const float *x_scale) {
  const int64_t k = ref->k, kb = kblocks(k);
  int64_t q_diff = 0, s_diff = 0, compared = 0;
  for (int i = 0; i < ref->nrows; i++) {
    const int64_t row = ref->rows[i];
    if (row >= m) continue;
    compared++;
    q_diff += memcmp(x8_rows + i * k, ref->x8 + i * k, (size_t)k) != 0;
    for (int64_t b = 0; b < kb; b++)
      s_diff += memcmp(&x_scale[ina_gemm_x_scale_index(m, k, row, b)], &ref->x_scale[i * kb + b],
                       4) != 0;
  }
  if (q_diff || s_diff)
    return ina_bench_check_failed(what,
                                  "activation quantization: %lld of %lld sampled rows' bytes and "
                                  "%lld scales differ from ina_fp8_quantize_blocks",
                                  (long long)q_diff, (long long)compared, (long long)s_diff);
  return ina_bench_check(what, "sampled_x_rows_fp8_differing", 0, 0);
}

int ina_bench_gemm_check_y(const char *what, const ina_bench_gemm_ref_t *ref, int fp8, int64_t m,
                           const uint16_t *y, int64_t y_rows) {
  const int64_t n = ref->n;
  int ok = 1, count = 0;
  float *got = NULL, *all = NULL;
  double *want = NULL, *want_bf16 = NULL;
  if (fp8 && !ref->fp8) return ina_bench_check_failed(what, "no FP8 reference");
  if (y_rows < m) return ina_bench_check_failed(what, "%lld rows read back for m %lld",
                                                (long long)y_rows, (long long)m);
  /* Every output written (the poison is a NaN), nothing past the m rows. */
  const int64_t chunk = 1 << 20;
  all = malloc((size_t)chunk * sizeof *all);
  if (!all) return ina_bench_check_failed(what, "out of memory");
  int64_t nonfinite = 0;
  for (int64_t i = 0; i < m * n; i += chunk) {
    const int64_t len = m * n - i < chunk ? m * n - i : chunk;
    ina_bench_bf16_to_f32(y + i, all, len);
    nonfinite += ina_bench_count_nonfinite(all, len);
  }
  free(all);
  const int64_t past = ina_bench_count_not_bf16(y + m * n, (y_rows - m) * n, INA_BENCH_BF16_POISON);
  if (nonfinite)
    ok = ina_bench_check_failed(what, "%lld of %lld outputs are NaN or infinite (unwritten?)",
                                (long long)nonfinite, (long long)(m * n));
  if (past)
    ok = ina_bench_check_failed(what, "%lld values past the %lld output rows were overwritten",
                                (long long)past, (long long)m);
  for (int i = 0; i < ref->nrows; i++) count += ref->rows[i] < m;
  got = malloc((size_t)(count * n) * sizeof *got);
  want = malloc((size_t)(count * n) * sizeof *want);
  want_bf16 = malloc((size_t)(count * n) * sizeof *want_bf16);
  if (!got || !want || !want_bf16) {
    ok = ina_bench_check_failed(what, "out of memory");
    goto done;
  }
  int c = 0;
  for (int i = 0; i < ref->nrows; i++) {
    if (ref->rows[i] >= m) continue;
    ina_bench_bf16_to_f32(y + ref->rows[i] * n, got + c * n, n);
    memcpy(want + c * n, (fp8 ? ref->fp8 : ref->bf16) + i * n, (size_t)n * sizeof *want);
    memcpy(want_bf16 + c * n, ref->bf16 + i * n, (size_t)n * sizeof *want_bf16);
    c++;
  }
  char measure[96];
  snprintf(measure, sizeof measure, "rel_l2_vs_%s_ref_%d_rows", fp8 ? "dequantized_fp8" : "bf16",
           count);
  ok &= ina_bench_check(what, measure, ina_bench_rel_l2(got, want, count * n), INA_BENCH_GEMM_TOL);
  if (fp8) {
    snprintf(measure, sizeof measure, "rel_l2_vs_bf16_operands_%d_rows", count);
    ok &= ina_bench_check(what, measure, ina_bench_rel_l2(got, want_bf16, count * n),
                          INA_BENCH_GEMM_FP8_VS_BF16_TOL);
  }
done:
  free(got);
  free(want);
  free(want_bf16);
  return ok;
}

/* ---- grouped GEMM ------------------------------------------------------------------------ */

typedef struct grouped_job {
  const ina_gemm_grouped_args_t *host;
  ina_bench_grouped_ref_t *ref;
  int64_t chunk;        /* sampled rows per item */
  ina_status_t *status; /* per item */
} grouped_job_t;

/* The group of routed row r: the last g with offsets[g] <= r < offsets[g + 1]. */
static int32_t group_of(const ina_gemm_grouped_args_t *a, int64_t r) {
  int32_t lo = 0, hi = a->num_groups - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (a->offsets[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/* Item i: sampled rows [i * chunk, (i + 1) * chunk) as a grouped GEMM of their own. */
static ina_status_t grouped_chunk(const grouped_job_t *j, int64_t item) {
  ina_status_t st = INA_OK;
  const ina_gemm_grouped_args_t *h = j->host;
  ina_bench_grouped_ref_t *r = j->ref;
  const int64_t begin = item * j->chunk;
  const int64_t end = begin + j->chunk < r->nrows ? begin + j->chunk : r->nrows;
  const int64_t rows = end - begin, k = h->k, kb = kblocks(k);
  const int64_t ldx = h->ldx ? h->ldx : k;
  const int fp8 = h->mode == INA_GEMM_FP8_BLOCK;
  const size_t esize = fp8 ? 1 : 2;
  int32_t *offsets = calloc((size_t)h->num_groups + 1, sizeof *offsets);
  uint8_t *x = malloc((size_t)(rows * k) * esize);
  float *x_scale = fp8 ? malloc((size_t)(rows * kb) * sizeof *x_scale) : NULL;
  uint16_t *y = malloc((size_t)(rows * r->n) * sizeof *y);
  INA_CHECK_ALLOC(offsets);
  INA_CHECK_ALLOC(x);
  INA_CHECK_ALLOC(y);
  if (fp8) INA_CHECK_ALLOC(x_scale);
  for (int64_t i = 0; i < rows; i++) {
    const int64_t row = r->rows[begin + i];
    offsets[group_of(h, row) + 1]++;
    memcpy(x + i * k * esize, (const uint8_t *)h->x + row * ldx * esize, (size_t)k * esize);
    if (fp8) memcpy(x_scale + i * kb, h->x_scale + row * kb, (size_t)kb * sizeof *x_scale);
  }
  for (int32_t g = 0; g < h->num_groups; g++) offsets[g + 1] += offsets[g];
  ina_gemm_grouped_args_t a = *h;
  a.max_rows = rows;
  a.offsets = offsets;
  a.x = x, a.ldx = 0;
  a.x_scale = x_scale;
  a.y = y, a.ldy = 0;
  a.row_ends = NULL;
  INA_CHECK(ina_gemm_grouped_ref(&a));
  ina_bench_bf16_to_f32(y, r->y + begin * r->n, rows * r->n);
fail:
  free(offsets);
  free(x);
  free(x_scale);
  free(y);
  return st;
}

static void grouped_items(void *ctx, int64_t begin, int64_t end, int worker) {
  (void)worker;
  const grouped_job_t *j = ctx;
  for (int64_t i = begin; i < end; i++) j->status[i] = grouped_chunk(j, i);
}

void ina_bench_grouped_ref_free(ina_bench_grouped_ref_t *ref) {
  if (!ref) return;
  free(ref->rows);
  free(ref->y);
  memset(ref, 0, sizeof *ref);
}

ina_status_t ina_bench_grouped_ref_init(ina_bench_grouped_ref_t *ref,
                                        const ina_gemm_grouped_args_t *host, int max_rows_checked,
                                        uint64_t *state, ina_threadpool_t *pool) {
  ina_status_t st = INA_OK;
  ina_status_t *status = NULL;
  memset(ref, 0, sizeof *ref);
  INA_REQUIRE(host && host->offsets && host->num_groups >= 1 && host->row_ends == NULL &&
                  max_rows_checked >= 2,
              INA_ERR_INVALID_ARGUMENT, "ina_bench_grouped_ref_init: bad arguments");
  ref->n = host->n;
  ref->routed = host->offsets[host->num_groups];
  INA_REQUIRE(ref->routed >= 0 && ref->routed <= host->max_rows, INA_ERR_INVALID_ARGUMENT,
              "ina_bench_grouped_ref_init: %lld routed rows of %lld", (long long)ref->routed,
              (long long)host->max_rows);
  ref->rows = malloc((size_t)max_rows_checked * sizeof *ref->rows);
  INA_CHECK_ALLOC(ref->rows);
  ref->nrows = ina_bench_sample_range(0, ref->routed, max_rows_checked, state, ref->rows);
  if (ref->nrows == 0) goto fail;
  ref->y = malloc((size_t)(ref->nrows * ref->n) * sizeof *ref->y);
  INA_CHECK_ALLOC(ref->y);
  int64_t threads = ina_threadpool_size(pool);
  const int64_t chunk = (ref->nrows + threads - 1) / threads;
  const int64_t items = (ref->nrows + chunk - 1) / chunk;
  status = malloc((size_t)items * sizeof *status);
  INA_CHECK_ALLOC(status);
  grouped_job_t job = {host, ref, chunk, status};
  ina_parallel_for(pool, items, 1, grouped_items, &job);
  for (int64_t i = 0; i < items; i++) INA_CHECK(status[i]);
fail:
  free(status);
  if (st != INA_OK) ina_bench_grouped_ref_free(ref);
  return st;
}

int ina_bench_grouped_check_y(const char *what, const ina_bench_grouped_ref_t *ref,
                              const uint16_t *y, int64_t y_rows) {
  const int64_t n = ref->n, routed = ref->routed;
  int ok = 1;
  if (y_rows < routed)
    return ina_bench_check_failed(what, "%lld rows read back for %lld routed rows",
                                  (long long)y_rows, (long long)routed);
  float *row = malloc((size_t)n * sizeof *row);
  double *want = malloc((size_t)n * sizeof *want);
  if (!row || !want) {
    free(row);
    free(want);
    return ina_bench_check_failed(what, "out of memory");
  }
  int64_t nonfinite = 0;
  for (int64_t r = 0; r < routed; r++) {
    ina_bench_bf16_to_f32(y + r * n, row, n);
    nonfinite += ina_bench_count_nonfinite(row, n);
  }
  const int64_t past =
      ina_bench_count_not_bf16(y + routed * n, (y_rows - routed) * n, INA_BENCH_BF16_POISON);
  if (nonfinite)
    ok = ina_bench_check_failed(what,
                                "%lld of %lld routed outputs are NaN or infinite (unwritten?)",
                                (long long)nonfinite, (long long)(routed * n));
  if (past)
    ok = ina_bench_check_failed(what, "%lld values past the %lld routed rows were overwritten",
                                (long long)past, (long long)routed);
  double worst = 0;
  int64_t worst_row = -1;
  for (int i = 0; i < ref->nrows; i++) {
    ina_bench_bf16_to_f32(y + ref->rows[i] * n, row, n);
    for (int64_t j = 0; j < n; j++) want[j] = ref->y[i * n + j];
    const double err = ina_bench_rel_l2(row, want, n);
    if (!(err <= worst)) worst = err, worst_row = ref->rows[i]; /* NaN-safe */
  }
  char measure[96];
  snprintf(measure, sizeof measure, "worst_row_rel_l2_of_%d_rows(row_%lld)", ref->nrows,
           (long long)worst_row);
  ok &= ina_bench_check(what, measure, worst, INA_BENCH_GROUPED_ROW_TOL);
  free(row);
  free(want);
  return ok;
}
