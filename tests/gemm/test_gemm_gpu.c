/* The GPU GEMMs of gemm/gemm.h against the CPU reference (ina_gemm_ref_row, double).
 *
 *   bf16: random and edge shapes (M 1..300 with odd ones, N and K multiples of 128 and odd
 *     ones), bf16 and fp32 outputs, padded strides: rel L2 <= 1e-2 (bf16 out), 1e-4 (f32).
 *   FP8: x quantized on the GPU by ina_gemm_quantize_x (checked byte for byte against
 *     ina_fp8_quantize_blocks), W quantized on the CPU with 128x128 blocks. Against the
 *     reference computed from the dequantized fp8 inputs the only difference left is the
 *     order of accumulation: rel L2 <= 2e-3 (fp32 out, and bf16 out against the reference
 *     rounded to bf16). Against the product of the original bf16 values: <= 5e-2, the
 *     worst is printed. Every path: AUTO (the small-M kernel up to 8 rows, else cuBLASLt +
 *     kernel tail), CUBLASLT, KERNEL, and M around the multiples of 4 and the kernel's
 *     tiles; ragged 128-blocks in N and K.
 *   Small-M kernel (M <= 8, AUTO's path for both modes): every M of 1..8 on the
 *     DeepSeek-V2-Lite decode shapes and odd shapes, strided x and y, forced plans (one and
 *     odd warp counts, split-K, with and without PDL), the same bounds as above.
 *   Both: fused residual (separate and in place, random beta), outputs poisoned before
 *   each run (every written value must be finite, everything around the output must keep
 *   the poison), NaN inputs giving NaN rows (never a pass), split-K results identical run
 *   to run, a captured CUDA graph replayed on new inputs, argument checks, and the path
 *   each DeepSeek-V3 and V2-Lite shape takes (printed).
 * Skipped (exit 77) without a CUDA device. */

#include "core/cuda.h"
#include "core/dtype.h"
#include "core/log.h"
#include "gemm/gemm.h"
#include "gemm/gemm_internal.h"
#include "tests/gpu_test_util.h"

#ifdef INA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define BF16_POISON 0xFFFFu    /* a NaN */
#define F32_POISON 0xFFFFFFFFu /* a NaN */
#define MAX_CHECKED_ROWS 6     /* reference rows per call on the large shapes */
#define FP8_TOL 2e-3
#define FP8_VS_BF16_TOL 5e-2

static double g_worst_bf16 = 0, g_worst_fp8 = 0, g_worst_fp8_vs_bf16 = 0;

static void note_worst(double *worst, double err) {
  if (!(err <= *worst)) *worst = err; /* NaN-safe */
}

static int64_t kblocks(int64_t k) { return (k + 127) / 128; }

/* ---- a weight on host and device ------------------------------------------------------ */

typedef struct weight {
  int fp8;
  int64_t n, k;
  uint16_t *bf16; /* host [n, k]: the original values (bf16) */
  uint8_t *q;     /* host [n, k] fp8 (fp8 weights) */
  float *scale;   /* host packed scales (fp8 weights) */
  void *d_w, *d_scale;
} weight_t;

static void weight_free(weight_t *w) {
  free(w->bf16);
  free(w->q);
  free(w->scale);
  ina_cuda_free(w->d_w);
  ina_cuda_free(w->d_scale);
  memset(w, 0, sizeof *w);
}

static int weight_make(weight_t *w, int fp8, int64_t n, int64_t k, test_rng_t *rng) {
  const int64_t count = n * k, rb = kblocks(n), kb = kblocks(k);
  float *f = malloc((size_t)count * sizeof *f), *rows = malloc((size_t)(rb * kb) * sizeof *rows);
  int ok = 0;
  memset(w, 0, sizeof *w);
  w->fp8 = fp8, w->n = n, w->k = k;
  w->bf16 = malloc((size_t)count * 2);
  if (!f || !rows || !w->bf16) goto done;
  for (int64_t i = 0; i < count; i++) {
    w->bf16[i] = ina_f32_to_bf16(0.05f * test_rng_normal(rng));
    f[i] = ina_bf16_to_f32(w->bf16[i]);
  }
  if (!fp8) {
    ok = ina_cuda_malloc(0, (size_t)count * 2, &w->d_w) == INA_OK &&
         ina_cuda_memcpy_h2d(w->d_w, w->bf16, (size_t)count * 2) == INA_OK;
    goto done;
  }
  const int64_t scales = ina_gemm_w_scale_count(n, k);
  w->q = malloc((size_t)count);
  w->scale = malloc((size_t)scales * sizeof(float));
  if (!w->q || !w->scale) goto done;
  CHECK_OK(ina_fp8_quantize_blocks(f, n, k, 128, 128, w->q, rows));
  CHECK_OK(ina_gemm_pack_w_scales(rows, n, k, w->scale));
  ok = ina_cuda_malloc(0, (size_t)count, &w->d_w) == INA_OK &&
       ina_cuda_malloc(0, (size_t)scales * sizeof(float), &w->d_scale) == INA_OK &&
       ina_cuda_memcpy_h2d(w->d_w, w->q, (size_t)count) == INA_OK &&
       ina_cuda_memcpy_h2d(w->d_scale, w->scale, (size_t)scales * sizeof(float)) == INA_OK;
done:
  free(f);
  free(rows);
  CHECK(ok);
  if (!ok) weight_free(w);
  return ok;
}

/* ---- one GEMM call on fresh inputs ------------------------------------------------------ */

typedef enum { RES_NONE = 0, RES_SEPARATE, RES_IN_PLACE } residual_mode_t;

typedef struct call {
  int64_t m, ldx, ldy;
  ina_gemm_path_t path;
  const ina_gemm_small_m_plan_t *small_m; /* non-NULL: ina_gemm_run_small_m with this plan */
  ina_dtype_t out_dtype;
  residual_mode_t residual;
  float beta;
  int64_t nan_rows[2]; /* rows of x given one NaN (-1: none) */
} call_t;

/* Host and device buffers of one call. y has one extra row past m, poisoned. */
typedef struct io {
  int64_t x_elems, y_elems;
  uint16_t *x_bf16; /* host [m, ldx] */
  uint8_t *x_q;     /* host [m, ldx], read back from the GPU (fp8) */
  float *x_scale;   /* host, read back (fp8) */
  void *y_host, *res_host, *y_init;
  void *d_x, *d_q, *d_scale, *d_y, *d_res;
} io_t;

static void io_free(io_t *io) {
  free(io->x_bf16), free(io->x_q), free(io->x_scale);
  free(io->y_host), free(io->res_host), free(io->y_init);
  ina_cuda_free(io->d_x), ina_cuda_free(io->d_q), ina_cuda_free(io->d_scale);
  ina_cuda_free(io->d_y), ina_cuda_free(io->d_res);
  memset(io, 0, sizeof *io);
}

static void fill_out(void *p, ina_dtype_t dtype, int64_t count, test_rng_t *rng) {
  for (int64_t i = 0; i < count; i++) {
    const float v = test_rng_normal(rng);
    if (dtype == INA_DTYPE_F32)
      ((float *)p)[i] = v;
    else
      ((uint16_t *)p)[i] = ina_f32_to_bf16(v);
  }
}

static void poison_out(void *p, ina_dtype_t dtype, int64_t count) {
  for (int64_t i = 0; i < count; i++) {
    if (dtype == INA_DTYPE_F32)
      ((uint32_t *)p)[i] = F32_POISON;
    else
      ((uint16_t *)p)[i] = BF16_POISON;
  }
}

static int is_poison(const void *p, ina_dtype_t dtype, int64_t i) {
  return dtype == INA_DTYPE_F32 ? ((const uint32_t *)p)[i] == F32_POISON
                                : ((const uint16_t *)p)[i] == BF16_POISON;
}

static float out_at(const void *p, ina_dtype_t dtype, int64_t i) {
  return dtype == INA_DTYPE_F32 ? ((const float *)p)[i] : ina_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* Host and device buffers of a call, contents undefined (io_fill sets them). */
static int io_alloc(io_t *io, const weight_t *w, const call_t *c) {
  const size_t osize = c->out_dtype == INA_DTYPE_F32 ? 4 : 2;
  memset(io, 0, sizeof *io);
  io->x_elems = c->m * c->ldx;
  io->y_elems = (c->m + 1) * c->ldy;
  io->x_bf16 = malloc((size_t)io->x_elems * 2);
  io->y_host = malloc((size_t)io->y_elems * osize);
  io->y_init = malloc((size_t)io->y_elems * osize);
  io->res_host = malloc((size_t)io->y_elems * osize);
  if (!io->x_bf16 || !io->y_host || !io->y_init || !io->res_host) return 0;
  if (ina_cuda_malloc(0, (size_t)io->x_elems * 2, &io->d_x) != INA_OK ||
      ina_cuda_malloc(0, (size_t)io->y_elems * osize, &io->d_y) != INA_OK ||
      ina_cuda_malloc(0, (size_t)io->y_elems * osize, &io->d_res) != INA_OK)
    return 0;
  if (!w->fp8) return 1;
  const int64_t scales = ina_gemm_x_scale_count(c->m, w->k);
  io->x_q = malloc((size_t)io->x_elems);
  io->x_scale = malloc((size_t)scales * sizeof(float));
  return io->x_q && io->x_scale && ina_cuda_malloc(0, (size_t)io->x_elems, &io->d_q) == INA_OK &&
         ina_cuda_malloc(0, (size_t)scales * sizeof(float), &io->d_scale) == INA_OK;
}

/* Fresh random x (with the requested NaNs) and residual, y poisoned (in place: the
 * residual inside the m x n block), all uploaded. */
static int io_fill(io_t *io, const weight_t *w, const call_t *c, test_rng_t *rng) {
  const size_t osize = c->out_dtype == INA_DTYPE_F32 ? 4 : 2;
  for (int64_t i = 0; i < io->x_elems; i++) io->x_bf16[i] = ina_f32_to_bf16(test_rng_normal(rng));
  for (int i = 0; i < 2; i++)
    if (c->nan_rows[i] >= 0)
      io->x_bf16[c->nan_rows[i] * c->ldx + test_rng_int(rng, 0, w->k - 1)] = 0x7FC0u;
  fill_out(io->res_host, c->out_dtype, io->y_elems, rng);
  poison_out(io->y_init, c->out_dtype, io->y_elems);
  if (c->residual == RES_IN_PLACE)
    for (int64_t r = 0; r < c->m; r++)
      memcpy((char *)io->y_init + (size_t)(r * c->ldy) * osize,
             (char *)io->res_host + (size_t)(r * c->ldy) * osize, (size_t)w->n * osize);
  return ina_cuda_memcpy_h2d(io->d_x, io->x_bf16, (size_t)io->x_elems * 2) == INA_OK &&
         ina_cuda_memcpy_h2d(io->d_y, io->y_init, (size_t)io->y_elems * osize) == INA_OK &&
         ina_cuda_memcpy_h2d(io->d_res, io->res_host, (size_t)io->y_elems * osize) == INA_OK;
}

static int io_make(io_t *io, const weight_t *w, const call_t *c, test_rng_t *rng) {
  return io_alloc(io, w, c) && io_fill(io, w, c, rng);
}

/* Reads back what ina_gemm_quantize_x wrote, for the reference, and checks it. */
static void read_quantized(const weight_t *w, const call_t *c, io_t *io);

/* The args of the call on the device buffers. */
static ina_gemm_args_t device_args(const weight_t *w, const call_t *c, const io_t *io) {
  ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
  a.mode = w->fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
  a.path = c->path;
  a.m = c->m, a.n = w->n, a.k = w->k;
  a.x = w->fp8 ? io->d_q : io->d_x;
  a.ldx = c->ldx;
  a.x_scale = io->d_scale;
  a.w = w->d_w;
  a.w_scale = w->d_scale;
  a.out_dtype = c->out_dtype;
  a.y = io->d_y;
  a.ldy = c->ldy;
  a.residual = c->residual == RES_SEPARATE   ? io->d_res
               : c->residual == RES_IN_PLACE ? io->d_y
                                             : NULL;
  a.ldr = c->ldy;
  a.beta = c->beta;
  return a;
}

/* ina_gemm_quantize_x's bytes and scales against ina_fp8_quantize_blocks. */
static void check_quantized(const weight_t *w, const call_t *c, const io_t *io) {
  const int64_t m = c->m, k = w->k, L = kblocks(k);
  float *xf = malloc((size_t)(m * k) * sizeof *xf), *rows = malloc((size_t)(m * L) * sizeof *rows);
  float *packed = malloc((size_t)(m * L) * sizeof *packed);
  uint8_t *q = malloc((size_t)(m * k));
  CHECK(xf && rows && packed && q);
  if (!xf || !rows || !packed || !q) goto done;
  for (int64_t r = 0; r < m; r++)
    for (int64_t kk = 0; kk < k; kk++)
      xf[r * k + kk] = ina_bf16_to_f32(io->x_bf16[r * c->ldx + kk]);
  CHECK_OK(ina_fp8_quantize_blocks(xf, m, k, 1, 128, q, rows));
  CHECK_OK(ina_gemm_pack_x_scales(rows, m, k, packed));
  int64_t bad_q = 0, bad_s = 0;
  for (int64_t r = 0; r < m; r++)
    for (int64_t kk = 0; kk < k; kk++) {
      const uint8_t got = io->x_q[r * c->ldx + kk], want = q[r * k + kk];
      /* NaN bytes may differ in sign (core/fp8_quant.h). */
      bad_q += got != want && !((got & 0x7F) == 0x7F && (want & 0x7F) == 0x7F);
    }
  for (int64_t i = 0; i < m * L; i++)
    bad_s += memcmp(&packed[i], &io->x_scale[i], sizeof(float)) != 0;
  CHECKF(bad_q == 0 && bad_s == 0, "quantize_x m %lld k %lld: %lld bytes, %lld scales differ",
         (long long)m, (long long)k, (long long)bad_q, (long long)bad_s);
done:
  free(xf), free(rows), free(packed), free(q);
}

/* Rows whose outputs are compared: all for small calls, else first, last and random. */
static int64_t pick_rows(int64_t m, int64_t work_per_row, int64_t *rows, test_rng_t *rng) {
  if (m * work_per_row <= ((int64_t)1 << 25) || m <= MAX_CHECKED_ROWS) {
    for (int64_t r = 0; r < m; r++) rows[r] = r;
    return m;
  }
  rows[0] = 0, rows[1] = m - 1;
  for (int i = 2; i < MAX_CHECKED_ROWS; i++) rows[i] = test_rng_int(rng, 1, m - 2);
  return MAX_CHECKED_ROWS;
}

static int row_is_nan(const call_t *c, int64_t r) {
  return r == c->nan_rows[0] || r == c->nan_rows[1];
}

/* Reads y back and checks it: poison kept around the output, finite inside (NaN rows
 * NaN throughout), and the compared rows against the references. */
static void check_output(const char *what, const weight_t *w, const call_t *c, io_t *io,
                         test_rng_t *rng) {
  const int64_t n = w->n, m = c->m;
  const size_t osize = c->out_dtype == INA_DTYPE_F32 ? 4 : 2;
  int64_t rows[300 > MAX_CHECKED_ROWS ? 300 : MAX_CHECKED_ROWS];
  const int64_t nrows = pick_rows(m, n * w->k, rows, rng);
  float *got = malloc((size_t)(nrows * n) * sizeof *got),
        *ref = malloc((size_t)(nrows * n) * sizeof *ref);
  float *ref_bf16_inputs = malloc((size_t)(nrows * n) * sizeof *ref_bf16_inputs);
  double *row = malloc((size_t)n * sizeof *row);
  CHECK(got && ref && ref_bf16_inputs && row);
  if (!got || !ref || !ref_bf16_inputs || !row) goto done;
  CHECK_OK(ina_cuda_memcpy_d2h(io->y_host, io->d_y, (size_t)io->y_elems * osize));

  int64_t unpoisoned = 0, nonfinite = 0, finite_in_nan_row = 0;
  for (int64_t i = 0; i < io->y_elems; i++) {
    const int64_t r = i / c->ldy, col = i % c->ldy;
    if (r >= m || col >= n) {
      unpoisoned += !is_poison(io->y_host, c->out_dtype, i);
    } else {
      const float v = out_at(io->y_host, c->out_dtype, i);
      if (row_is_nan(c, r))
        finite_in_nan_row += isfinite(v) != 0;
      else
        nonfinite += !isfinite(v);
    }
  }
  CHECKF(unpoisoned == 0, "%s: %lld values outside the output changed", what,
         (long long)unpoisoned);
  CHECKF(nonfinite == 0, "%s: %lld outputs not finite (unwritten?)", what, (long long)nonfinite);
  CHECKF(finite_in_nan_row == 0, "%s: %lld outputs of NaN rows are finite", what,
         (long long)finite_in_nan_row);

  /* References on host copies of exactly what the GPU read. */
  ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
  a.mode = w->fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
  a.m = m, a.n = n, a.k = w->k;
  a.x = w->fp8 ? (const void *)io->x_q : (const void *)io->x_bf16;
  a.ldx = c->ldx;
  a.x_scale = io->x_scale;
  a.w = w->fp8 ? (const void *)w->q : (const void *)w->bf16;
  a.w_scale = w->scale;
  a.out_dtype = c->out_dtype;
  a.y = io->y_host, a.ldy = c->ldy;
  a.residual = c->residual != RES_NONE ? io->res_host : NULL;
  a.ldr = c->ldy;
  a.beta = c->beta;
  ina_gemm_args_t original = a; /* the unquantized bf16 inputs */
  original.mode = INA_GEMM_BF16, original.x = io->x_bf16, original.w = w->bf16;
  for (int64_t i = 0; i < nrows; i++) {
    const int64_t r = rows[i];
    for (int64_t j = 0; j < n; j++)
      got[i * n + j] = out_at(io->y_host, c->out_dtype, r * c->ldy + j);
    CHECK_OK(ina_gemm_ref_row(&a, r, row));
    for (int64_t j = 0; j < n; j++)
      ref[i * n + j] = c->out_dtype == INA_DTYPE_BF16 && w->fp8
                           ? ina_bf16_to_f32(ina_f32_to_bf16((float)row[j]))
                           : (float)row[j];
    if (w->fp8) {
      CHECK_OK(ina_gemm_ref_row(&original, r, row));
      for (int64_t j = 0; j < n; j++) ref_bf16_inputs[i * n + j] = (float)row[j];
    }
  }
  /* Rows with NaN inputs: the error is infinite, so the bound can only fail. */
  const int has_nan = c->nan_rows[0] >= 0 || c->nan_rows[1] >= 0;
  int64_t checked_nan = 0;
  for (int64_t i = 0; i < nrows; i++) checked_nan += row_is_nan(c, rows[i]);
  const double err = test_rel_l2(got, ref, (size_t)(nrows * n));
  if (has_nan) {
    CHECKF(checked_nan == 0 || err == INFINITY, "%s: NaN rows gave error %.3g", what, err);
    goto done;
  }
  if (w->fp8) {
    CHECKF(err <= FP8_TOL, "%s: relative L2 error %.3g against the dequantized reference", what,
           err);
    note_worst(&g_worst_fp8, err);
    const double err_orig = test_rel_l2(got, ref_bf16_inputs, (size_t)(nrows * n));
    CHECKF(err_orig <= FP8_VS_BF16_TOL, "%s: relative L2 error %.3g against the bf16 inputs", what,
           err_orig);
    note_worst(&g_worst_fp8_vs_bf16, err_orig);
  } else {
    const double tol = c->out_dtype == INA_DTYPE_F32 ? 1e-4 : 1e-2;
    CHECKF(err <= tol, "%s: relative L2 error %.3g (bound %.0e)", what, err, tol);
    note_worst(&g_worst_bf16, err);
  }
done:
  free(got), free(ref), free(ref_bf16_inputs), free(row);
}

static void read_quantized(const weight_t *w, const call_t *c, io_t *io) {
  CHECK_OK(ina_cuda_synchronize());
  CHECK_OK(ina_cuda_memcpy_d2h(io->x_q, io->d_q, (size_t)io->x_elems));
  CHECK_OK(ina_cuda_memcpy_d2h(io->x_scale, io->d_scale,
                               (size_t)ina_gemm_x_scale_count(c->m, w->k) * sizeof(float)));
  check_quantized(w, c, io);
}

static const char *path_name(const call_t *c) {
  if (c->small_m) return "small-M forced";
  return c->path == INA_GEMM_PATH_KERNEL     ? "kernel"
         : c->path == INA_GEMM_PATH_CUBLASLT ? "cublaslt"
                                             : "auto";
}

/* Whether ina_gemm_query_path sends the call's shape to the small-M kernel: AUTO, at most
 * 8 rows, rows of whole 16-byte pieces (strides and pointers are not its business), and
 * the measured routing rule. */
static int auto_small_m(const weight_t *w, const call_t *c) {
  const ina_gemm_mode_t mode = w->fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
  return c->path == INA_GEMM_PATH_AUTO && c->m >= 1 && c->m <= INA_GEMM_SMALL_M_MAX_ROWS &&
         (w->k * (w->fp8 ? 1 : 2)) % 16 == 0 && ina_gemm_small_m_wins(mode, c->m, w->n, w->k);
}

/* Quantizes (FP8), runs and checks one call. */
static void run_call(ina_gemm_t *h, const weight_t *w, const call_t *c, test_rng_t *rng) {
  io_t io;
  char what[200];
  snprintf(what, sizeof what, "%s m %lld n %lld k %lld ldx %lld ldy %lld path %s out %s res %d",
           w->fp8 ? "fp8" : "bf16", (long long)c->m, (long long)w->n, (long long)w->k,
           (long long)c->ldx, (long long)c->ldy, path_name(c), ina_dtype_name(c->out_dtype),
           (int)c->residual);
  if (c->small_m) {
    const size_t len = strlen(what);
    snprintf(what + len, sizeof what - len, " (%d warps x %d splits%s)", c->small_m->warps,
             c->small_m->splits, c->small_m->pdl ? ", PDL" : "");
  }
  const int ok = io_make(&io, w, c, rng);
  CHECKF(ok, "%s: allocation failed", what);
  if (!ok) goto done;
  if (w->fp8) {
    CHECK_OK(ina_gemm_quantize_x(io.d_x, c->ldx, c->m, w->k, io.d_q, c->ldx, io.d_scale, NULL));
    read_quantized(w, c, &io);
  }
  const ina_gemm_args_t a = device_args(w, c, &io);
  ina_gemm_path_info_t info;
  if (c->small_m) {
#ifdef INA_HAVE_CUDA
    CHECK_OK(ina_gemm_run_small_m(h, &a, c->small_m));
    CHECK_OK(ina_cuda_synchronize());
    check_output(what, w, c, &io, rng);
#endif
    goto done;
  }
  if (w->fp8 && c->path == INA_GEMM_PATH_CUBLASLT && c->m <= INA_GEMM_SMALL_M_MAX_ROWS) {
    /* AUTO's path (the small-M kernel) says nothing about cuBLASLt here: a refusal is
     * allowed, and must be clean. */
    ina_log_set_quiet_errors(1);
    const ina_status_t st = ina_gemm_run(h, &a);
    ina_log_set_quiet_errors(0);
    CHECKF(st == INA_OK || st == INA_ERR_UNSUPPORTED, "%s: %s", what, ina_status_string(st));
    if (st != INA_OK) {
      printf("note: cuBLASLt has no algorithm for %s\n", what);
      goto done;
    }
    CHECK_OK(ina_cuda_synchronize());
    check_output(what, w, c, &io, rng);
    goto done;
  }
  if (w->fp8 && c->path == INA_GEMM_PATH_CUBLASLT) {
    /* Forcing cuBLASLt on a shape it has no algorithm for must fail cleanly. */
    ina_gemm_args_t automatic = a;
    automatic.path = INA_GEMM_PATH_AUTO;
    CHECK_OK(ina_gemm_query_path(h, &automatic, &info));
    if (info.cublaslt_rows == 0 && (c->m & ~(int64_t)3) > 0) {
      ina_log_set_quiet_errors(1);
      CHECKF(ina_gemm_run(h, &a) == INA_ERR_UNSUPPORTED,
             "%s: no cuBLASLt algorithm, yet no refusal", what);
      ina_log_set_quiet_errors(0);
      printf("note: cuBLASLt has no algorithm for %s\n", what);
      goto done;
    }
  }
  CHECK_OK(ina_gemm_run(h, &a));
  CHECK_OK(ina_cuda_synchronize());
  CHECK_OK(ina_gemm_query_path(h, &a, &info));
  CHECK(info.cublaslt_rows + info.kernel_rows == c->m);
  if (w->fp8 && c->path == INA_GEMM_PATH_KERNEL) CHECK(info.kernel_rows == c->m);
  if (w->fp8) CHECK(info.cublaslt_rows % 4 == 0);
  if (auto_small_m(w, c))
    CHECKF(info.kernel_rows == c->m && strncmp(info.description, "small-M", 7) == 0,
           "%s: path %s", what, info.description);
  else if (!w->fp8)
    CHECKF(info.kernel_rows == 0, "%s: path %s", what, info.description);
  check_output(what, w, c, &io, rng);
done:
  io_free(&io);
}

static call_t default_call(int64_t m, int64_t k, int64_t n) {
  call_t c;
  memset(&c, 0, sizeof c);
  c.m = m, c.ldx = k, c.ldy = n;
  c.path = INA_GEMM_PATH_AUTO;
  c.out_dtype = INA_DTYPE_BF16;
  c.residual = RES_NONE;
  c.beta = 1.0f;
  c.nan_rows[0] = c.nan_rows[1] = -1;
  return c;
}

/* A call with random stride padding, output dtype and residual. */
static call_t random_call(const weight_t *w, int64_t m, test_rng_t *rng) {
  call_t c = default_call(m, w->k, w->n);
  const int64_t unit = w->fp8 ? 16 : 1;
  if (test_rng_int(rng, 0, 2) == 0) c.ldx = w->k + unit * test_rng_int(rng, 1, 4);
  c.out_dtype = test_rng_int(rng, 0, 2) == 0 ? INA_DTYPE_F32 : INA_DTYPE_BF16;
  if (test_rng_int(rng, 0, 2) == 0) c.ldy = w->n + (w->fp8 ? 8 : 1) * test_rng_int(rng, 1, 3);
  c.residual = (residual_mode_t)test_rng_int(rng, 0, 2);
  c.beta = c.residual ? (float)(test_rng_uniform(rng) * 2.0 - 0.5) : 1.0f;
  return c;
}

static void test_bf16(ina_gemm_t *h, test_rng_t *rng) {
  static const int64_t shapes[][2] = {{256, 384}, {7168, 2048}, {2048, 7168}, {200, 72},
                                      {131, 97},  {8, 8},       {1, 300},     {640, 1536}};
  static const int64_t ms[] = {1, 2, 3, 7, 64, 65, 128, 255, 300};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    weight_t w;
    if (!weight_make(&w, 0, shapes[s][0], shapes[s][1], rng)) continue;
    if (s == 0) CHECK_OK(ina_gemm_prepare(h, INA_GEMM_BF16, INA_DTYPE_BF16, w.n, w.k));
    const int small = w.n * w.k <= 1 << 20;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      if (!small && i % 3) continue;
      call_t c = random_call(&w, ms[i], rng);
      run_call(h, &w, &c, rng);
    }
    call_t c = random_call(&w, test_rng_int(rng, 1, 300), rng);
    run_call(h, &w, &c, rng);
    weight_free(&w);
  }
}

static void test_fp8(ina_gemm_t *h, test_rng_t *rng) {
  /* DeepSeek-V3 shapes, small ones, and ragged 128-blocks in N and K. */
  static const int64_t shapes[][2] = {{7168, 2048}, {2048, 7168}, {4096, 512}, {256, 384},
                                      {1040, 2112}, {16, 16},     {48, 80},    {128, 128}};
  static const int64_t ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 64, 100, 131, 256, 300};
  static const ina_gemm_path_t paths[] = {INA_GEMM_PATH_AUTO, INA_GEMM_PATH_CUBLASLT,
                                          INA_GEMM_PATH_KERNEL};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    weight_t w;
    if (!weight_make(&w, 1, shapes[s][0], shapes[s][1], rng)) continue;
    if (s % 2 == 0) {
      CHECK_OK(ina_gemm_prepare(h, INA_GEMM_FP8_BLOCK, INA_DTYPE_BF16, w.n, w.k));
      CHECK_OK(ina_gemm_prepare(h, INA_GEMM_FP8_BLOCK, INA_DTYPE_F32, w.n, w.k));
    }
    const int small = w.n * w.k <= 1 << 20;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
      for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        if (!small && (i + p) % 3) continue;
        call_t c = random_call(&w, ms[i], rng);
        c.path = paths[p];
        run_call(h, &w, &c, rng);
      }
    call_t c = random_call(&w, test_rng_int(rng, 1, 300), rng);
    run_call(h, &w, &c, rng);
    weight_free(&w);
  }
}

/* NaN in x: the rows holding it come out NaN on every path (the small-M kernel under
 * AUTO, cuBLASLt rows and FP8-kernel rows), the others stay finite, and the error bound
 * cannot pass. */
static void test_nan(ina_gemm_t *h, test_rng_t *rng) {
  static const ina_gemm_path_t paths[] = {INA_GEMM_PATH_AUTO, INA_GEMM_PATH_CUBLASLT,
                                          INA_GEMM_PATH_KERNEL};
  for (int fp8 = 0; fp8 < 2; fp8++) {
    weight_t w;
    if (!weight_make(&w, fp8, 256, 384, rng)) continue;
    for (int p = 0; p < 3; p++) {
      call_t c = default_call(7, w.k, w.n);
      c.path = paths[p];
      if (!fp8 && c.path == INA_GEMM_PATH_KERNEL) continue;
      c.nan_rows[0] = 1; /* a cuBLASLt row under CUBLASLT */
      c.nan_rows[1] = 5; /* an FP8-kernel row under CUBLASLT (7 = 4 + 3) */
      run_call(h, &w, &c, rng);
    }
    weight_free(&w);
  }
  /* The comparison itself: one NaN makes the error infinite. */
  const float a[3] = {1, NAN, 3}, b[3] = {1, 2, 3};
  CHECK(test_rel_l2(a, b, 3) == INFINITY && !(test_rel_l2(a, b, 3) <= FP8_VS_BF16_TOL));
}

/* Split-K sums its partials in a fixed order: the same call twice gives the same bits,
 * and the counters reset themselves between launches. */
static void test_split_k_determinism(ina_gemm_t *h, test_rng_t *rng) {
  weight_t w;
  if (!weight_make(&w, 1, 2048, 7168, rng)) return;
  call_t c = default_call(1, w.k, w.n);
  c.path = INA_GEMM_PATH_KERNEL;
  io_t io;
  uint16_t *first = malloc((size_t)w.n * 2), *again = malloc((size_t)w.n * 2);
  if (!io_make(&io, &w, &c, rng) || !first || !again) {
    CHECK(0);
    goto done;
  }
  ina_gemm_args_t a = device_args(&w, &c, &io);
  ina_gemm_path_info_t info;
  CHECK_OK(ina_gemm_query_path(h, &a, &info));
  CHECKF(info.kernel_splits > 1, "m 1 n 2048 k 7168 should split K (got %d)", info.kernel_splits);
  CHECK_OK(ina_gemm_quantize_x(io.d_x, c.ldx, c.m, w.k, io.d_q, c.ldx, io.d_scale, NULL));
  CHECK_OK(ina_gemm_run(h, &a));
  CHECK_OK(ina_cuda_memcpy_d2h(first, io.d_y, (size_t)w.n * 2));
  for (int i = 0; i < 5; i++) CHECK_OK(ina_gemm_run(h, &a));
  CHECK_OK(ina_cuda_memcpy_d2h(again, io.d_y, (size_t)w.n * 2));
  CHECK(memcmp(first, again, (size_t)w.n * 2) == 0);
done:
  free(first), free(again);
  io_free(&io);
  weight_free(&w);
}

/* ---- the small-M kernel ------------------------------------------------------------------ */

/* A call for the small-M kernel: random output dtype and residual, and (at random) strides
 * padded by whole 16-byte pieces, so AUTO keeps the kernel. */
static call_t small_m_call(const weight_t *w, int64_t m, test_rng_t *rng) {
  call_t c = random_call(w, m, rng);
  const int64_t piece = w->fp8 ? 16 : 8;
  c.ldx = w->k + piece * test_rng_int(rng, 0, 2);
  return c;
}

/* Every M of 1..8 through AUTO on the DeepSeek-V2-Lite decode shapes and on odd ones (N of
 * 1, 131 and past 1024 CTAs, a ragged last 128-block in N and K, K of one piece), bf16 and
 * FP8; then forced plans (one warp, odd warps, split-K with 2..5 splits, with and without
 * PDL) on a few, and a split launch twice for identical bits. */
static void test_small_m(ina_gemm_t *h, test_rng_t *rng) {
  static const int64_t v2_lite[][2] = {{3072, 2048}, {576, 2048}, {2048, 2048}, {2816, 2048},
                                       {2048, 1408}};
  static const int64_t odd_bf16[][2] = {{131, 96}, {1, 304}, {200, 72}, {16400, 256}, {48, 8}};
  static const int64_t odd_fp8[][2] = {{48, 80}, {1040, 2112}, {16, 16}, {16400, 256}};
  for (int fp8 = 0; fp8 < 2; fp8++) {
    for (size_t s = 0; s < sizeof v2_lite / sizeof v2_lite[0]; s++) {
      weight_t w;
      if (!weight_make(&w, fp8, v2_lite[s][0], v2_lite[s][1], rng)) continue;
      if (s == 0) CHECK_OK(ina_gemm_prepare(h, fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16,
                                            INA_DTYPE_BF16, w.n, w.k));
      for (int64_t m = 1; m <= INA_GEMM_SMALL_M_MAX_ROWS; m++) {
        call_t c = small_m_call(&w, m, rng);
        run_call(h, &w, &c, rng);
      }
      weight_free(&w);
    }
    const int64_t(*odd)[2] = fp8 ? odd_fp8 : odd_bf16;
    const size_t num_odd = fp8 ? sizeof odd_fp8 / sizeof odd_fp8[0]
                               : sizeof odd_bf16 / sizeof odd_bf16[0];
    for (size_t s = 0; s < num_odd; s++) {
      weight_t w;
      if (!weight_make(&w, fp8, odd[s][0], odd[s][1], rng)) continue;
      for (int i = 0; i < 3; i++) {
        call_t c = small_m_call(&w, test_rng_int(rng, 1, INA_GEMM_SMALL_M_MAX_ROWS), rng);
        run_call(h, &w, &c, rng);
      }
      weight_free(&w);
    }
  }
#ifdef INA_HAVE_CUDA
  static const int32_t plans[][3] = {{1, 1, 0}, {3, 1, 1}, {16, 1, 0}, {4, 2, 1},
                                     {2, 5, 0}, {8, 4, 1}, {16, 3, 1}};
  static const int64_t shapes[][2] = {{576, 2048}, {2048, 1408}, {1040, 2112}, {131, 96}};
  for (int fp8 = 0; fp8 < 2; fp8++)
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
      weight_t w;
      if (fp8 && shapes[s][0] % 16) continue;
      if (!weight_make(&w, fp8, shapes[s][0], shapes[s][1], rng)) continue;
      for (size_t p = 0; p < sizeof plans / sizeof plans[0]; p++) {
        ina_gemm_small_m_plan_t plan;
        CHECK_OK(ina_gemm_small_m_plan_fixed(w.n, w.k * (fp8 ? 1 : 2), plans[p][0], plans[p][1],
                                             plans[p][2], (size_t)8 << 20, 1024, &plan));
        call_t c = small_m_call(&w, test_rng_int(rng, 1, INA_GEMM_SMALL_M_MAX_ROWS), rng);
        c.small_m = &plan;
        run_call(h, &w, &c, rng);
      }
      weight_free(&w);
    }
  /* A split launch twice: the same bits (fixed summation order, counters reset). */
  weight_t w;
  io_t io;
  memset(&io, 0, sizeof io);
  if (!weight_make(&w, 1, 2048, 2048, rng)) return;
  call_t c = default_call(5, w.k, w.n);
  c.out_dtype = INA_DTYPE_F32;
  uint32_t *first = malloc((size_t)(5 * w.n) * 4), *again = malloc((size_t)(5 * w.n) * 4);
  ina_gemm_small_m_plan_t plan;
  CHECK_OK(ina_gemm_small_m_plan_fixed(w.n, w.k, 8, 4, 1, (size_t)8 << 20, 1024, &plan));
  if (first && again && io_make(&io, &w, &c, rng)) {
    const ina_gemm_args_t a = device_args(&w, &c, &io);
    CHECK_OK(ina_gemm_quantize_x(io.d_x, c.ldx, c.m, w.k, io.d_q, c.ldx, io.d_scale, NULL));
    CHECK_OK(ina_gemm_run_small_m(h, &a, &plan));
    CHECK_OK(ina_cuda_memcpy_d2h(first, io.d_y, (size_t)(5 * w.n) * 4));
    for (int i = 0; i < 5; i++) CHECK_OK(ina_gemm_run_small_m(h, &a, &plan));
    CHECK_OK(ina_cuda_memcpy_d2h(again, io.d_y, (size_t)(5 * w.n) * 4));
    CHECK(memcmp(first, again, (size_t)(5 * w.n) * 4) == 0);
    /* A plan that does not fit n or the workspace is refused. */
    ina_gemm_small_m_plan_t bad = plan;
    bad.tiles += 1;
    ina_log_set_quiet_errors(1);
    CHECK(ina_gemm_run_small_m(h, &a, &bad) == INA_ERR_INVALID_ARGUMENT);
    ina_gemm_args_t too_many_rows = a;
    too_many_rows.m = INA_GEMM_SMALL_M_MAX_ROWS + 1;
    CHECK(ina_gemm_run_small_m(h, &too_many_rows, NULL) == INA_ERR_UNSUPPORTED);
    ina_log_set_quiet_errors(0);
  } else {
    CHECK(0);
  }
  free(first), free(again);
  io_free(&io);
  weight_free(&w);
#endif
}

#ifdef INA_HAVE_CUDA
/* Quantization, an FP8 GEMM with a kernel tail and a bf16 GEMM captured once into a CUDA
 * graph, then replayed on new input values written into the captured buffers: the
 * replays must compute with the new values (no host-side state baked in but pointers).
 * Two small-M GEMMs (FP8 6 rows, bf16 3 rows with an in-place residual) follow them in the
 * graph, launched with programmatic dependent launch behind the kernels before them. */
static void test_graph(ina_gemm_t *h, test_rng_t *rng) {
  weight_t w8, w16, ws8, ws16;
  io_t io8, io16, ios8, ios16;
  cudaStream_t stream = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  memset(&io8, 0, sizeof io8), memset(&io16, 0, sizeof io16);
  memset(&ios8, 0, sizeof ios8), memset(&ios16, 0, sizeof ios16);
  memset(&w8, 0, sizeof w8), memset(&w16, 0, sizeof w16);
  memset(&ws8, 0, sizeof ws8), memset(&ws16, 0, sizeof ws16);
  call_t c8 = default_call(37, 2048, 1024), c16 = default_call(37, 768, 512);
  call_t s8 = default_call(6, 1408, 2048), s16 = default_call(3, 2048, 576);
  c8.residual = RES_SEPARATE, c8.beta = 0.5f;
  c16.out_dtype = INA_DTYPE_F32;
  s16.residual = RES_IN_PLACE, s16.beta = 1.0f, s16.out_dtype = INA_DTYPE_F32;
  if (!weight_make(&w8, 1, c8.ldy, c8.ldx, rng) || !weight_make(&w16, 0, c16.ldy, c16.ldx, rng) ||
      !weight_make(&ws8, 1, s8.ldy, s8.ldx, rng) || !weight_make(&ws16, 0, s16.ldy, s16.ldx, rng))
    goto done;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const int ok = stream && io_alloc(&io8, &w8, &c8) && io_alloc(&io16, &w16, &c16) &&
                 io_alloc(&ios8, &ws8, &s8) && io_alloc(&ios16, &ws16, &s16);
  CHECK(ok);
  if (!ok) goto done;
  ina_gemm_args_t g8 = device_args(&w8, &c8, &io8), g16 = device_args(&w16, &c16, &io16);
  ina_gemm_args_t gs8 = device_args(&ws8, &s8, &ios8), gs16 = device_args(&ws16, &s16, &ios16);
  g8.stream = g16.stream = gs8.stream = gs16.stream = stream;
  ina_gemm_path_info_t info;
  CHECK_OK(ina_gemm_query_path(h, &gs8, &info));
  CHECKF(strncmp(info.description, "small-M", 7) == 0, "graph fp8 m 6: %s", info.description);
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK_OK(ina_gemm_quantize_x(io8.d_x, c8.ldx, c8.m, w8.k, io8.d_q, c8.ldx, io8.d_scale, stream));
  CHECK_OK(ina_gemm_run(h, &g8));
  CHECK_OK(ina_gemm_run(h, &g16));
  CHECK_OK(
      ina_gemm_quantize_x(ios8.d_x, s8.ldx, s8.m, ws8.k, ios8.d_q, s8.ldx, ios8.d_scale, stream));
  CHECK_OK(ina_gemm_run(h, &gs8));
  CHECK_OK(ina_gemm_run(h, &gs16));
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  CHECK(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  if (!exec) goto done;
  for (int replay = 0; replay < 2; replay++) {
    CHECK(io_fill(&io8, &w8, &c8, rng) && io_fill(&io16, &w16, &c16, rng) &&
          io_fill(&ios8, &ws8, &s8, rng) && io_fill(&ios16, &ws16, &s16, rng));
    CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    read_quantized(&w8, &c8, &io8);
    check_output("graph replay fp8 m 37 n 1024 k 2048", &w8, &c8, &io8, rng);
    check_output("graph replay bf16 m 37 n 512 k 768", &w16, &c16, &io16, rng);
    read_quantized(&ws8, &s8, &ios8);
    check_output("graph replay small-M fp8 m 6 n 2048 k 1408", &ws8, &s8, &ios8, rng);
    check_output("graph replay small-M bf16 m 3 n 576 k 2048 in place", &ws16, &s16, &ios16,
                 rng);
  }
done:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (stream) cudaStreamDestroy(stream);
  io_free(&io8), io_free(&io16), io_free(&ios8), io_free(&ios16);
  weight_free(&w8), weight_free(&w16), weight_free(&ws8), weight_free(&ws16);
}
#endif

static void test_arguments(void) {
  ina_gemm_config_t config = INA_GEMM_CONFIG_INIT;
  ina_gemm_t *h = NULL, *bad = (ina_gemm_t *)&config;
  void *buf = NULL;
  config.max_shapes = 1;
  CHECK_OK(ina_gemm_create(&config, &h));
  CHECK_OK(ina_cuda_malloc(0, 1 << 20, &buf));
  if (!h || !buf) goto done;
  ina_log_set_quiet_errors(1);
  ina_gemm_config_t broken = config;
  broken.max_m = 0;
  CHECK(ina_gemm_create(&broken, &bad) == INA_ERR_INVALID_ARGUMENT && bad == NULL);
  broken = config, broken.struct_size = 4;
  CHECK(ina_gemm_create(&broken, &bad) == INA_ERR_INVALID_ARGUMENT);
  CHECK_OK(ina_gemm_prepare(h, INA_GEMM_FP8_BLOCK, INA_DTYPE_BF16, 256, 256));
  CHECK_OK(ina_gemm_prepare(h, INA_GEMM_FP8_BLOCK, INA_DTYPE_BF16, 256, 256)); /* idempotent */
  CHECK(ina_gemm_prepare(h, INA_GEMM_BF16, INA_DTYPE_BF16, 256, 256) == INA_ERR_UNSUPPORTED);
  CHECK(ina_gemm_prepare(h, INA_GEMM_FP8_BLOCK, INA_DTYPE_BF16, 100, 256) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
  a.mode = INA_GEMM_FP8_BLOCK, a.m = 4, a.n = 256, a.k = 256;
  a.x = a.w = a.y = buf;
  a.x_scale = a.w_scale = buf;
  CHECK(ina_gemm_run(NULL, &a) == INA_ERR_INVALID_ARGUMENT);
  a.x = (char *)buf + 8;
  CHECK(ina_gemm_run(h, &a) == INA_ERR_INVALID_ARGUMENT);
  a.x = buf, a.mode = INA_GEMM_BF16, a.path = INA_GEMM_PATH_KERNEL;
  CHECK(ina_gemm_run(h, &a) == INA_ERR_UNSUPPORTED);
  CHECK(ina_gemm_quantize_x(buf, 0, 4, 100, buf, 0, buf, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_gemm_quantize_x((const uint16_t *)buf + 1, 0, 4, 128, buf, 0, buf, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  a = (ina_gemm_args_t)INA_GEMM_ARGS_INIT;
  a.mode = INA_GEMM_FP8_BLOCK, a.n = 256, a.k = 256; /* m == 0: nothing dereferenced */
  CHECK_OK(ina_gemm_run(h, &a));
  CHECK_OK(ina_gemm_quantize_x(NULL, 0, 0, 128, NULL, 0, NULL, NULL));
  CHECK_OK(ina_cuda_synchronize());
done:
  ina_cuda_free(buf);
  ina_gemm_destroy(h);
  ina_gemm_destroy(NULL);
}

/* Which path each DeepSeek-V3 shape (FP8) and DeepSeek-V2-Lite decode shape (both modes)
 * takes (printed for the record). */
static void print_paths(ina_gemm_t *h) {
  static const int64_t shapes[][2] = {
      {7168, 2048}, {4096, 7168}, {2048, 7168}, {24576, 1536}, {7168, 16384}};
  static const int64_t ms[] = {1, 2, 3, 4, 5, 8, 9, 37, 64, 128, 256, 1024, 4096};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
      ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
      ina_gemm_path_info_t info;
      a.mode = INA_GEMM_FP8_BLOCK, a.m = ms[i], a.n = shapes[s][0], a.k = shapes[s][1];
      CHECK_OK(ina_gemm_query_path(h, &a, &info));
      printf("path fp8 m %5lld n %5lld k %5lld: %s\n", (long long)a.m, (long long)a.n,
             (long long)a.k, info.description);
    }
  static const int64_t lite[][2] = {{3072, 2048}, {576, 2048},  {2048, 2048},
                                    {2816, 2048}, {2048, 1408}, {102400, 2048}};
  static const int64_t lite_ms[] = {1, 8, 9};
  for (int fp8 = 0; fp8 < 2; fp8++)
    for (size_t s = 0; s < sizeof lite / sizeof lite[0]; s++)
      for (size_t i = 0; i < sizeof lite_ms / sizeof lite_ms[0]; i++) {
        const int64_t m = lite_ms[i];
        ina_gemm_args_t a = INA_GEMM_ARGS_INIT;
        ina_gemm_path_info_t info;
        a.mode = fp8 ? INA_GEMM_FP8_BLOCK : INA_GEMM_BF16;
        a.m = m, a.n = lite[s][0], a.k = lite[s][1];
        CHECK_OK(ina_gemm_query_path(h, &a, &info));
        printf("path %s m %lld n %6lld k %4lld: %s\n", fp8 ? "fp8 " : "bf16", (long long)m,
               (long long)a.n, (long long)a.k, info.description);
        CHECK((strncmp(info.description, "small-M", 7) == 0) ==
              ina_gemm_small_m_wins(a.mode, m, a.n, a.k));
      }
}

int main(void) {
  const int skip = test_require_gpus("test_gemm_gpu", 1);
  if (skip) return skip;
  test_rng_t rng = {test_seed("test_gemm_gpu")};
  char name[128];
  printf("device: %s\n", ina_cuda_device_name(0, name, sizeof name));
  ina_gemm_t *h = NULL;
  CHECK_OK(ina_gemm_create(NULL, &h));
  if (!h) return test_finish("test_gemm_gpu");
  test_arguments();
  print_paths(h);
  test_bf16(h, &rng);
  test_fp8(h, &rng);
  test_nan(h, &rng);
  test_split_k_determinism(h, &rng);
  test_small_m(h, &rng);
#ifdef INA_HAVE_CUDA
  test_graph(h, &rng);
#endif
  ina_gemm_destroy(h);
  printf(
      "test_gemm_gpu: worst relative L2 error: bf16 %.3g; fp8 vs dequantized reference %.3g "
      "(bound %.0e); fp8 vs bf16 inputs %.3g (bound %.0e)\n",
      g_worst_bf16, g_worst_fp8, FP8_TOL, g_worst_fp8_vs_bf16, FP8_VS_BF16_TOL);
  return test_finish("test_gemm_gpu");
}
