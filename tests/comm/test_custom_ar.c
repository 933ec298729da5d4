/* The custom all-reduce (comm/custom_ar.h) on GPUs, under mpirun with one GPU per rank:
 *   - every mode (bf16, f32, fp8) and algorithm (LL, one-shot, two-shot, auto, NCCL) on sizes
 *     from 1 element to the full buffer and past it (fallback), with the input copied in,
 *     zero-copy from the registered buffer, in place, and misaligned: bit for bit equal to
 *     the CPU model (tests/comm/custom_ar_model.h) on the IPC path, within each mode's
 *     bound of the fp64 sum (FP8: the per-element bound derived in custom_ar_model.h), and
 *     bitwise identical on every rank (rank 0 gathers the others' results and compares);
 *   - the fused epilogue: residual exact, normalized rows within bf16 rounding of the fp64
 *     norm, FP8 output equal to ina_fp8_quantize_blocks of the rows;
 *   - a CUDA graph of several runs replayed with new data, eager runs in between;
 *   - 10,000 back-to-back runs of varying sizes, modes and algorithms, checked in batches;
 *   - checked mode: mismatched counts, modes and shapes fail on every rank, no hang; a
 *     config that differs between ranks fails creation on every rank;
 *   - argument errors.
 * Skipped (77) without CUDA in the build, without a GPU, with fewer GPUs than ranks on the
 * node, or with a single rank; under INA_REQUIRE_GPU=1 these fail instead
 * (tests/test_util.h). */
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/custom_ar.h"
#include "core/cuda.h"
#include "core/dtype.h"
#include "tests/comm/comm_test_data.h"
#include "tests/gpu_test_util.h"
#include "tests/comm/custom_ar_model.h"

#ifdef INA_HAVE_CUDA
#include <cuda_runtime_api.h>

#define CUDA_OK(call)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    CHECKF(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                  \
  } while (0)

#define MAX_RANKS INA_CAR_MAX_RANKS
#define CAPACITY ((size_t)8 << 20)

typedef struct {
  ina_comm_t *comm;
  ina_custom_ar_t *ar;
  int rank, nranks, have_nccl;
  uint64_t seed;
  cudaStream_t stream;
  uint8_t *input_buf;
  size_t input_bytes;
  /* FP8 error over every IPC-path FP8 result checked: worst |err| / the derived bound,
   * worst |err| / (sum of the ranks' block amax), and the L2 error relative to the sum. */
  double fp8_worst_vs_bound, fp8_worst_vs_amax, fp8_err2, fp8_sum2;
  size_t fp8_elements;
} ctx_t;

static ctx_t g;

/* ---- data -------------------------------------------------------------------------------- */

/* Every rank's input of one case, the model's result and the fp64 sum. */
typedef struct {
  int mode;
  size_t count;
  float *xs[MAX_RANKS];   /* exact values */
  void *raw[MAX_RANKS];   /* bf16 bits or f32 */
  void *want;             /* car_model_all_reduce */
  double *sum, *abs_sum;  /* fp64 */
} case_t;

/* Rank r's values are a function of (seed, r, id) only, so every rank rebuilds all of them.
 * spread scales each 128-block by a power of two of its own, with an outlier per block and
 * some all-zero blocks (FP8 scaling). */
static void make_case(case_t *c, int mode, size_t count, uint64_t id, int spread) {
  memset(c, 0, sizeof *c);
  c->mode = mode;
  c->count = count;
  const size_t n = count ? count : 1;
  for (int r = 0; r < g.nranks; r++) {
    c->xs[r] = malloc(n * sizeof(float));
    c->raw[r] = malloc(n * 4);
    comm_test_fill(c->xs[r], count, g.seed, r, id, mode != INA_CAR_MODE_F32);
    for (size_t i = 0; i < count; i++) {
      float v = c->xs[r][i];
      if (spread) {
        const size_t blk = i / INA_CAR_GRANULE;
        v = ldexpf(v, (int)((blk * 2654435761u + (unsigned)r * 40503u) % 41) - 20);
        if (i % 97 == 3) v *= 256.0f;
        if (blk % 11 == 5) v = 0.0f;
      }
      if (mode == INA_CAR_MODE_F32) {
        ((float *)c->raw[r])[i] = v;
      } else {
        ((uint16_t *)c->raw[r])[i] = ina_f32_to_bf16(v);
        v = ina_bf16_to_f32(((uint16_t *)c->raw[r])[i]);
      }
      c->xs[r][i] = v;
    }
  }
  c->want = malloc(n * 4);
  c->sum = malloc(n * sizeof(double));
  c->abs_sum = malloc(n * sizeof(double));
  car_model_all_reduce(mode, g.nranks, (const void *const *)c->raw, count, c->want);
  car_model_exact(g.nranks, (const float *const *)c->xs, count, c->sum, c->abs_sum);
}

static void free_case(case_t *c) {
  for (int r = 0; r < g.nranks; r++) {
    free(c->xs[r]);
    free(c->raw[r]);
  }
  free(c->want);
  free(c->sum);
  free(c->abs_sum);
}

static size_t elem_bytes(int mode) { return mode == INA_CAR_MODE_F32 ? 4 : 2; }

static double out_value(int mode, const void *out, size_t i) {
  return mode == INA_CAR_MODE_F32 ? ((const float *)out)[i]
                                  : ina_bf16_to_f32(((const uint16_t *)out)[i]);
}

/* Rank 0 compares every rank's `bytes` with its own. Collective. */
static void check_identical(const void *mine, size_t bytes, const char *what) {
  uint8_t *all = g.rank == 0 ? malloc(bytes * (size_t)g.nranks + 1) : NULL;
  MPI_Gather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
  if (g.rank == 0) {
    for (int r = 1; r < g.nranks; r++)
      CHECKF(memcmp(all, all + (size_t)r * bytes, bytes) == 0,
             "%s: rank %d's result differs from rank 0's", what, r);
    free(all);
  }
}

/* The result of a plain all-reduce against the model (bitwise, IPC path) and the fp64 sum
 * (each mode's bound; NCCL: relative L2), then across ranks. */
static void check_sum(const case_t *c, ina_custom_ar_algo_t taken, const void *out,
                      const char *what) {
  const size_t n = c->count;
  if (taken != INA_CUSTOM_AR_NCCL) {
    size_t diff = 0, first = n;
    const size_t eb = elem_bytes(c->mode);
    for (size_t i = 0; i < n; i++)
      if (memcmp((const uint8_t *)out + i * eb, (const uint8_t *)c->want + i * eb, eb) != 0) {
        if (first == n) first = i;
        diff++;
      }
    CHECKF(diff == 0, "%s: %zu of %zu elements differ from the model (first %zu: %g vs %g)",
           what, diff, n, first, first < n ? out_value(c->mode, out, first) : 0.0,
           first < n ? out_value(c->mode, c->want, first) : 0.0);
    double *bound = NULL, *amax = NULL;
    if (c->mode == INA_CAR_MODE_FP8) {
      bound = malloc(n * sizeof(double) + 1);
      amax = malloc(n * sizeof(double) + 1);
      car_model_fp8_bound(g.nranks, (const float *const *)c->xs, n, bound);
      car_model_block_amax_sum(g.nranks, (const float *const *)c->xs, n, amax);
    }
    size_t over = 0;
    for (size_t i = 0; i < n; i++) {
      const double err = fabs(out_value(c->mode, out, i) - c->sum[i]);
      const double b = c->mode == INA_CAR_MODE_F32    ? g.nranks * 0x1p-24 * c->abs_sum[i]
                       : c->mode == INA_CAR_MODE_BF16 ? 0x1p-8 * fabs(c->sum[i]) * (1 + 0x1p-20) +
                                                            g.nranks * 0x1p-24 * c->abs_sum[i]
                                                      : bound[i];
      over += !(err <= b);
      if (c->mode == INA_CAR_MODE_FP8) {
        if (b > 0) g.fp8_worst_vs_bound = fmax(g.fp8_worst_vs_bound, err / b);
        if (amax[i] > 0) g.fp8_worst_vs_amax = fmax(g.fp8_worst_vs_amax, err / amax[i]);
        g.fp8_err2 += err * err;
        g.fp8_sum2 += c->sum[i] * c->sum[i];
        g.fp8_elements++;
      }
    }
    CHECKF(over == 0, "%s: %zu elements outside the error bound of the exact sum", what, over);
    free(bound);
    free(amax);
    check_identical(out, n * eb, what);
  } else {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
      const double d = out_value(c->mode, out, i) - c->sum[i];
      num += d * d;
      den += c->sum[i] * c->sum[i];
    }
    const double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    CHECKF(rel <= (c->mode == INA_CAR_MODE_F32 ? 1e-5 : 1e-2), "%s (nccl): rel L2 %g", what, rel);
  }
}

/* ---- plain all-reduce -------------------------------------------------------------------- */

typedef enum {
  PLACE_COPY,
  PLACE_ZERO_COPY,
  PLACE_IN_PLACE,
  PLACE_ZERO_COPY_IN_PLACE,
  PLACE_MISALIGNED
} place_t;
/* Host copies and memsets run on the legacy stream, which does not order g.stream (a
 * non-blocking stream), and a pageable copy may return before its data has landed: wait
 * for the device before enqueuing the runs that read or overwrite them. */
static void settle_uploads(void) { CUDA_OK(cudaDeviceSynchronize()); }

static const char *place_names[] = {"copy", "zero-copy", "in-place", "zero-copy in-place",
                                    "misaligned"};
static const char *mode_names[] = {"bf16", "f32", "fp8"};
static const char *algo_names[] = {"auto", "one-shot", "two-shot", "nccl", "ll"};
#define NALGOS 5

/* FP8 moves by two-shot only. */
static int fp8_refuses(int mode, int algo) {
  return mode == INA_CAR_MODE_FP8 && (algo == INA_CUSTOM_AR_ONE_SHOT || algo == INA_CUSTOM_AR_LL);
}

static void run_case(int mode, ina_custom_ar_algo_t algo, size_t count, place_t place, int spread,
                     uint64_t id) {
  const size_t eb = elem_bytes(mode), bytes = count * eb;
  char what[160];
  case_t c;
  ina_custom_ar_algo_t taken = INA_CUSTOM_AR_AUTO;
  uint8_t *d_a = NULL, *d_b = NULL;
  void *host = malloc(bytes + 16);
  if (bytes > g.input_bytes && (place == PLACE_ZERO_COPY || place == PLACE_ZERO_COPY_IN_PLACE))
    place = PLACE_COPY;
  snprintf(what, sizeof what, "%s %s n=%zu %s%s", mode_names[mode], algo_names[algo], count,
           place_names[place], spread ? " spread" : "");
  make_case(&c, mode, count, id, spread);
  CHECK_OK(ina_custom_ar_choose(g.ar, (ina_custom_ar_mode_t)mode, algo, count, 0, 0, &taken));
  CUDA_OK(cudaMalloc((void **)&d_a, bytes + 16));
  CUDA_OK(cudaMalloc((void **)&d_b, bytes + 16));
  void *in = d_a, *out = d_b;
  switch (place) {
    case PLACE_COPY: break;
    case PLACE_ZERO_COPY: in = g.input_buf; break;
    case PLACE_IN_PLACE: out = in; break;
    case PLACE_ZERO_COPY_IN_PLACE: in = out = g.input_buf; break;
    case PLACE_MISALIGNED: in = d_a + eb; out = d_b + eb; break;
  }
  CUDA_OK(cudaMemset(out, 0xFF, bytes)); /* poison (NaN in every float type) */
  CUDA_OK(cudaMemcpy(in, c.raw[g.rank], bytes, cudaMemcpyHostToDevice));
  settle_uploads();
  ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT;
  a.mode = (ina_custom_ar_mode_t)mode;
  a.algo = algo;
  a.count = count;
  a.in = in;
  a.out = out;
  a.stream = g.stream;
  CHECK_OK(ina_custom_ar_run(g.ar, &a));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  CUDA_OK(cudaMemcpy(host, out, bytes, cudaMemcpyDeviceToHost));
  check_sum(&c, taken, host, what);
  cudaFree(d_a);
  cudaFree(d_b);
  free(host);
  free_case(&c);
}

static void test_modes(void) {
  const size_t full_bf16 = CAPACITY / 2, full_f32 = CAPACITY / 4;
  const size_t sizes[] = {1, 7, 8, 127, 128, 129, 1000, 4096, 65560, 262147, 0 /* full */,
                          1 /* full + 1 */};
  const int nsizes = (int)(sizeof sizes / sizeof sizes[0]);
  uint64_t id = 1;
  for (int mode = 0; mode < 3; mode++)
    for (int algo = 0; algo < NALGOS; algo++) {
      if (fp8_refuses(mode, algo)) continue;
      if (algo == INA_CUSTOM_AR_NCCL && !g.have_nccl) continue;
      for (int k = 0; k < nsizes; k++) {
        const size_t full = mode == INA_CAR_MODE_F32 ? full_f32 : full_bf16;
        size_t count = sizes[k];
        if (k == nsizes - 2) count = full;
        if (k == nsizes - 1) {
          if (!g.have_nccl) continue; /* past the buffers only NCCL can do it */
          count = full + 1;
        }
        const int big = count >= full;
        if (big && algo == INA_CUSTOM_AR_NCCL) continue; /* NCCL's own business */
        const place_t place =
            big ? (k % 2 ? PLACE_COPY : PLACE_ZERO_COPY) : (place_t)((k + algo) % 5);
        run_case(mode, (ina_custom_ar_algo_t)algo, count, place, mode == INA_CAR_MODE_FP8 && k % 2,
                 id++);
      }
    }
  /* Every placement once more on one mid size, for each algorithm. */
  static const ina_custom_ar_algo_t own[] = {INA_CUSTOM_AR_ONE_SHOT, INA_CUSTOM_AR_TWO_SHOT,
                                             INA_CUSTOM_AR_LL};
  for (int k = 0; k < 3; k++)
    for (int place = 0; place < 5; place++)
      run_case(INA_CAR_MODE_BF16, own[k], 3001, place, 0, id++);
  for (int place = 0; place < 5; place++)
    run_case(INA_CAR_MODE_FP8, INA_CUSTOM_AR_TWO_SHOT, 3001, place, 1, id++);
}

/* ---- fused epilogue ---------------------------------------------------------------------- */

typedef struct {
  int64_t rows, cols;
  int residual, weight_f32, fp8;
  int in_place; /* out = in */
} epi_shape_t;

static void run_epilogue_case(int mode, ina_custom_ar_algo_t algo, const epi_shape_t *s,
                              uint64_t id) {
  const int64_t rows = s->rows, cols = s->cols, count = rows * cols;
  const int64_t nbc = (cols + 127) / 128;
  const float eps = 1e-6f;
  char what[200];
  case_t c;
  ina_custom_ar_algo_t taken = INA_CUSTOM_AR_AUTO;
  snprintf(what, sizeof what, "epilogue %s %s %lldx%lld%s%s%s%s", mode_names[mode],
           algo_names[algo], (long long)rows, (long long)cols, s->residual ? " residual" : "",
           s->weight_f32 ? " f32-weight" : " bf16-weight", s->fp8 ? " fp8-out" : "",
           s->in_place ? " in-place" : "");
  make_case(&c, mode, (size_t)count, id, mode == INA_CAR_MODE_FP8);
  CHECK_OK(ina_custom_ar_choose(g.ar, (ina_custom_ar_mode_t)mode, algo, (size_t)count, rows, cols,
                                &taken));
  /* The residual stream is the same on every rank (tensor parallelism replicates it). */
  float *tmp = malloc((size_t)count * sizeof(float)), *w = malloc((size_t)cols * sizeof(float));
  uint16_t *res = malloc((size_t)count * 2), *res_want = malloc((size_t)count * 2);
  comm_test_fill(tmp, (size_t)count, g.seed, 100, id, 1);
  for (int64_t i = 0; i < count; i++) res[i] = res_want[i] = ina_f32_to_bf16(4.0f * tmp[i]);
  comm_test_fill(tmp, (size_t)cols, g.seed, 101, id, 1);
  uint16_t *w16 = malloc((size_t)cols * 2);
  for (int64_t i = 0; i < cols; i++) {
    w16[i] = ina_f32_to_bf16(1.0f + 0.25f * tmp[i]);
    w[i] = ina_bf16_to_f32(w16[i]);
  }
  /* The all-reduced rows the epilogue sees: the model's on the IPC path; under NCCL (bf16
   * whatever the mode) the exact sum rounded to bf16, which NCCL matches to an ulp. */
  uint16_t *x_ref = malloc((size_t)count * 2);
  for (int64_t i = 0; i < count; i++)
    x_ref[i] = taken != INA_CUSTOM_AR_NCCL ? ((const uint16_t *)c.want)[i]
                                           : ina_f32_to_bf16((float)c.sum[i]);
  double *y_ref = malloc((size_t)count * sizeof(double));
  car_model_epilogue(x_ref, rows, cols, s->residual ? res_want : NULL, w, eps, y_ref);

  uint16_t *d_in = NULL, *d_out = NULL, *d_res = NULL;
  void *d_w = NULL;
  uint8_t *d_q = NULL;
  float *d_scale = NULL;
  CUDA_OK(cudaMalloc((void **)&d_in, (size_t)count * 2));
  CUDA_OK(cudaMalloc((void **)&d_out, (size_t)count * 2));
  CUDA_OK(cudaMalloc((void **)&d_res, (size_t)count * 2));
  CUDA_OK(cudaMalloc(&d_w, (size_t)cols * 4));
  CUDA_OK(cudaMalloc((void **)&d_q, (size_t)count));
  CUDA_OK(cudaMalloc((void **)&d_scale, (size_t)(rows * nbc) * 4));
  CUDA_OK(cudaMemcpy(d_in, c.raw[g.rank], (size_t)count * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_res, res, (size_t)count * 2, cudaMemcpyHostToDevice));
  if (s->weight_f32) CUDA_OK(cudaMemcpy(d_w, w, (size_t)cols * 4, cudaMemcpyHostToDevice));
  else CUDA_OK(cudaMemcpy(d_w, w16, (size_t)cols * 2, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_out, 0xFF, (size_t)count * 2));
  CUDA_OK(cudaMemset(d_q, 0xFF, (size_t)count));
  CUDA_OK(cudaMemset(d_scale, 0xFF, (size_t)(rows * nbc) * 4));
  settle_uploads();

  ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT;
  a.mode = (ina_custom_ar_mode_t)mode;
  a.algo = algo;
  a.count = (size_t)count;
  a.in = d_in;
  a.out = s->in_place ? d_in : d_out;
  a.rows = rows;
  a.cols = cols;
  a.residual = s->residual ? d_res : NULL;
  a.norm_weight = d_w;
  a.norm_weight_dtype = s->weight_f32 ? INA_DTYPE_F32 : INA_DTYPE_BF16;
  a.eps = eps;
  a.y_fp8 = s->fp8 ? d_q : NULL;
  a.y_scale_inv = s->fp8 ? d_scale : NULL;
  a.stream = g.stream;
  CHECK_OK(ina_custom_ar_run(g.ar, &a));
  CUDA_OK(cudaStreamSynchronize(g.stream));

  uint16_t *y = malloc((size_t)count * 2), *res_got = malloc((size_t)count * 2);
  uint8_t *q = malloc((size_t)count), *q_want = malloc((size_t)count);
  float *scale = malloc((size_t)(rows * nbc) * 4), *scale_want = malloc((size_t)(rows * nbc) * 4);
  CUDA_OK(cudaMemcpy(y, a.out, (size_t)count * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(res_got, d_res, (size_t)count * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(q, d_q, (size_t)count, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(scale, d_scale, (size_t)(rows * nbc) * 4, cudaMemcpyDeviceToHost));

  /* Residual: exact on the IPC path (the sum is the model's), close under NCCL. */
  size_t res_diff = 0, y_over = 0;
  double res_num = 0, res_den = 0;
  for (int64_t i = 0; i < count; i++) {
    res_diff += res_got[i] != (s->residual ? res_want[i] : res[i]);
    const double d =
        ina_bf16_to_f32(res_got[i]) - ina_bf16_to_f32(s->residual ? res_want[i] : res[i]);
    res_num += d * d;
    res_den += (double)ina_bf16_to_f32(res_want[i]) * ina_bf16_to_f32(res_want[i]);
  }
  /* y: the fp32 norm of the exact residual, rounded to bf16: within 2^-8 relative plus the
   * fp32 sum of squares' few ulps (a fixed tree of at most 42 additions of positives). */
  double y_num = 0, y_den = 0;
  float *yf = malloc((size_t)count * sizeof(float));
  for (int64_t i = 0; i < count; i++) {
    yf[i] = ina_bf16_to_f32(y[i]);
    const double err = fabs(yf[i] - y_ref[i]);
    y_over += !(err <= (0x1p-8 + 1e-5) * fabs(y_ref[i]) + 1e-30);
    y_num += err * err;
    y_den += y_ref[i] * y_ref[i];
  }
  if (taken != INA_CUSTOM_AR_NCCL) {
    CHECKF(res_diff == 0, "%s: %zu residual elements differ from the model", what, res_diff);
    CHECKF(y_over == 0, "%s: %zu normalized elements outside bf16 rounding of the fp64 norm", what,
           y_over);
  } else {
    CHECKF(sqrt(res_num / res_den) <= 1e-2, "%s (nccl): residual rel L2 %g", what,
           sqrt(res_num / res_den));
    CHECKF(sqrt(y_num / y_den) <= 1e-2, "%s (nccl): y rel L2 %g", what, sqrt(y_num / y_den));
  }
  if (s->fp8) {
    CHECK_OK(ina_fp8_quantize_blocks(yf, rows, cols, 1, 128, q_want, scale_want));
    CHECKF(memcmp(q, q_want, (size_t)count) == 0 &&
               memcmp(scale, scale_want, (size_t)(rows * nbc) * 4) == 0,
           "%s: fp8 output differs from ina_fp8_quantize_blocks of the bf16 rows", what);
  }
  if (taken != INA_CUSTOM_AR_NCCL) {
    check_identical(y, (size_t)count * 2, what);
    check_identical(res_got, (size_t)count * 2, what);
    if (s->fp8) check_identical(q, (size_t)count, what);
  }
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_res);
  cudaFree(d_w);
  cudaFree(d_q);
  cudaFree(d_scale);
  free(tmp);
  free(w);
  free(w16);
  free(res);
  free(res_want);
  free(res_got);
  free(x_ref);
  free(y_ref);
  free(y);
  free(yf);
  free(q);
  free(q_want);
  free(scale);
  free(scale_want);
  free_case(&c);
}

static void test_epilogue(void) {
  const epi_shape_t shapes[] = {
      {1, 7168, 1, 0, 1, 0}, {3, 7168, 1, 1, 1, 0}, {64, 7168, 1, 0, 1, 0}, {5, 1024, 0, 0, 1, 0},
      {2, 8, 1, 0, 0, 0}, {7, 136, 1, 1, 1, 0}, {4, 16384, 1, 0, 1, 0}, {300, 1024, 1, 1, 1, 0},
      {9, 4096, 1, 0, 0, 0}, {2, 12288, 0, 1, 1, 0}, {3, 7168, 1, 0, 1, 1}, {20, 1024, 1, 1, 0, 1},
  };
  uint64_t id = 5000;
  for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++)
    for (int mode = 0; mode < 3; mode += 2) {
      if (mode == INA_CAR_MODE_FP8 && shapes[k].cols % 128 != 0) continue;
      for (int algo = 0; algo < NALGOS; algo++) {
        if (fp8_refuses(mode, algo)) continue;
        if (algo == INA_CUSTOM_AR_NCCL && !g.have_nccl) continue;
        run_epilogue_case(mode, (ina_custom_ar_algo_t)algo, &shapes[k], id++);
      }
    }
}

/* ---- CUDA graph -------------------------------------------------------------------------- */

static void test_graph(void) {
  /* A: bf16 one-shot copied in; B: bf16 two-shot zero-copy (the copy into the registered
   * buffer is part of the graph); C: fp8 two-shot; D: fused epilogue; E: bf16 LL of A's
   * input. */
  const size_t na = 5000, nb = 300001, nc = 70000;
  const epi_shape_t ds = {4, 7168, 1, 0, 1, 0};
  uint16_t *d_a = NULL, *d_oa = NULL, *d_oe = NULL, *d_b = NULL, *d_ob = NULL;
  uint16_t *d_c = NULL, *d_oc = NULL;
  uint16_t *d_d = NULL, *d_od = NULL, *d_res = NULL, *d_w = NULL;
  uint8_t *d_q = NULL;
  float *d_s = NULL;
  const size_t nd = (size_t)(ds.rows * ds.cols);
  CUDA_OK(cudaMalloc((void **)&d_a, na * 2));
  CUDA_OK(cudaMalloc((void **)&d_oa, na * 2));
  CUDA_OK(cudaMalloc((void **)&d_oe, na * 2));
  CUDA_OK(cudaMalloc((void **)&d_b, nb * 2));
  CUDA_OK(cudaMalloc((void **)&d_ob, nb * 2));
  CUDA_OK(cudaMalloc((void **)&d_c, nc * 2));
  CUDA_OK(cudaMalloc((void **)&d_oc, nc * 2));
  CUDA_OK(cudaMalloc((void **)&d_d, nd * 2));
  CUDA_OK(cudaMalloc((void **)&d_od, nd * 2));
  CUDA_OK(cudaMalloc((void **)&d_res, nd * 2));
  CUDA_OK(cudaMalloc((void **)&d_w, (size_t)ds.cols * 2));
  CUDA_OK(cudaMalloc((void **)&d_q, nd));
  CUDA_OK(cudaMalloc((void **)&d_s, nd / 128 * 4));

  ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT, b = a, c = a, d = a, e = a;
  a.algo = INA_CUSTOM_AR_ONE_SHOT;
  a.count = na;
  a.in = d_a;
  a.out = d_oa;
  a.stream = g.stream;
  b.algo = INA_CUSTOM_AR_TWO_SHOT;
  b.count = nb;
  b.in = g.input_buf;
  b.out = d_ob;
  b.stream = g.stream;
  c.mode = INA_CUSTOM_AR_FP8;
  c.count = nc;
  c.in = d_c;
  c.out = d_oc;
  c.stream = g.stream;
  d.count = nd;
  d.in = d_d;
  d.out = d_od;
  d.rows = ds.rows;
  d.cols = ds.cols;
  d.residual = d_res;
  d.norm_weight = d_w;
  d.y_fp8 = d_q;
  d.y_scale_inv = d_s;
  d.stream = g.stream;
  e = a;
  e.algo = INA_CUSTOM_AR_LL;
  e.out = d_oe;

  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  CUDA_OK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeThreadLocal));
  CHECK_OK(ina_custom_ar_run(g.ar, &a));
  CUDA_OK(cudaMemcpyAsync(g.input_buf, d_b, nb * 2, cudaMemcpyDeviceToDevice, g.stream));
  CHECK_OK(ina_custom_ar_run(g.ar, &b));
  CHECK_OK(ina_custom_ar_run(g.ar, &c));
  CHECK_OK(ina_custom_ar_run(g.ar, &d));
  CHECK_OK(ina_custom_ar_run(g.ar, &e));
  CUDA_OK(cudaStreamEndCapture(g.stream, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  ina_custom_ar_algo_t ta = INA_CUSTOM_AR_AUTO, tb = ta, tc = ta, te = ta;
  CHECK_OK(ina_custom_ar_choose(g.ar, a.mode, a.algo, na, 0, 0, &ta));
  CHECK_OK(ina_custom_ar_choose(g.ar, b.mode, b.algo, nb, 0, 0, &tb));
  CHECK_OK(ina_custom_ar_choose(g.ar, c.mode, c.algo, nc, 0, 0, &tc));
  CHECK_OK(ina_custom_ar_choose(g.ar, e.mode, e.algo, na, 0, 0, &te));
  uint16_t *host = malloc(nb * 2);
  for (int rep = 0; rep < 4 && exec; rep++) {
    case_t ca, cb, cc, cd;
    const uint64_t id = 9000 + 10 * (uint64_t)rep;
    make_case(&ca, INA_CAR_MODE_BF16, na, id, 0);
    make_case(&cb, INA_CAR_MODE_BF16, nb, id + 1, 0);
    make_case(&cc, INA_CAR_MODE_FP8, nc, id + 2, 1);
    make_case(&cd, INA_CAR_MODE_BF16, nd, id + 3, 0);
    CUDA_OK(cudaMemcpy(d_a, ca.raw[g.rank], na * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_b, cb.raw[g.rank], nb * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_c, cc.raw[g.rank], nc * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_d, cd.raw[g.rank], nd * 2, cudaMemcpyHostToDevice));
    /* Residual zero and unit weights: D's output is then rmsnorm(sum) exactly, and the
     * residual afterwards holds the sum itself. */
    CUDA_OK(cudaMemset(d_res, 0, nd * 2));
    uint16_t one = ina_f32_to_bf16(1.0f), *ones = malloc((size_t)ds.cols * 2);
    for (int64_t i = 0; i < ds.cols; i++) ones[i] = one;
    CUDA_OK(cudaMemcpy(d_w, ones, (size_t)ds.cols * 2, cudaMemcpyHostToDevice));
    free(ones);
    CUDA_OK(cudaMemset(d_oa, 0xFF, na * 2));
    CUDA_OK(cudaMemset(d_oe, 0xFF, na * 2));
    CUDA_OK(cudaMemset(d_ob, 0xFF, nb * 2));
    CUDA_OK(cudaMemset(d_oc, 0xFF, nc * 2));
    settle_uploads();
    if (rep == 2) run_case(INA_CAR_MODE_F32, INA_CUSTOM_AR_AUTO, 1234, PLACE_COPY, 0, id + 4);
    CUDA_OK(cudaGraphLaunch(exec, g.stream));
    CUDA_OK(cudaStreamSynchronize(g.stream));
    CUDA_OK(cudaMemcpy(host, d_oa, na * 2, cudaMemcpyDeviceToHost));
    check_sum(&ca, ta, host, "graph one-shot");
    CUDA_OK(cudaMemcpy(host, d_oe, na * 2, cudaMemcpyDeviceToHost));
    check_sum(&ca, te, host, "graph ll");
    CUDA_OK(cudaMemcpy(host, d_ob, nb * 2, cudaMemcpyDeviceToHost));
    check_sum(&cb, tb, host, "graph two-shot zero-copy");
    CUDA_OK(cudaMemcpy(host, d_oc, nc * 2, cudaMemcpyDeviceToHost));
    check_sum(&cc, tc, host, "graph fp8");
    CUDA_OK(cudaMemcpy(host, d_res, nd * 2, cudaMemcpyDeviceToHost));
    if (ta != INA_CUSTOM_AR_NCCL)
      CHECKF(memcmp(host, cd.want, nd * 2) == 0,
             "graph epilogue: residual (0 + sum) differs from the model sum (replay %d)", rep);
    free_case(&ca);
    free_case(&cb);
    free_case(&cc);
    free_case(&cd);
  }
  free(host);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaFree(d_a);
  cudaFree(d_oa);
  cudaFree(d_oe);
  cudaFree(d_b);
  cudaFree(d_ob);
  cudaFree(d_c);
  cudaFree(d_oc);
  cudaFree(d_d);
  cudaFree(d_od);
  cudaFree(d_res);
  cudaFree(d_w);
  cudaFree(d_q);
  cudaFree(d_s);
}

/* ---- stress ------------------------------------------------------------------------------ */

#define STRESS_RUNS 10000
#define STRESS_SLOTS 16

static void test_stress(void) {
  static const size_t sizes[] = {1, 8, 100, 1000, 4096, 5000, 20000, 65536, 100000, 300000};
  enum { NSIZES = sizeof sizes / sizeof sizes[0], MAXN = 300000 };
  case_t pool[3];
  void *d_pool[3] = {NULL, NULL, NULL}, *d_slot[STRESS_SLOTS];
  void *want_fp8[NSIZES]; /* FP8's last partial block depends on the size */
  int slot_mode[STRESS_SLOTS], slot_algo[STRESS_SLOTS];
  size_t slot_n[STRESS_SLOTS];
  long bad = 0, run_errors = 0, nccl_runs = 0;
  void *host = malloc((size_t)MAXN * 4);
  for (int m = 0; m < 3; m++) {
    make_case(&pool[m], m, MAXN, 20000 + (uint64_t)m, m == INA_CAR_MODE_FP8);
    CUDA_OK(cudaMalloc(&d_pool[m], (size_t)MAXN * 4));
    CUDA_OK(cudaMemcpy(d_pool[m], pool[m].raw[g.rank], (size_t)MAXN * elem_bytes(m),
                       cudaMemcpyHostToDevice));
  }
  settle_uploads();
  for (int k = 0; k < NSIZES; k++) {
    want_fp8[k] = malloc(sizes[k] * 2);
    car_model_all_reduce(INA_CAR_MODE_FP8, g.nranks, (const void *const *)pool[2].raw, sizes[k],
                         want_fp8[k]);
  }
  for (int s = 0; s < STRESS_SLOTS; s++) CUDA_OK(cudaMalloc(&d_slot[s], (size_t)MAXN * 4));

  const double t0 = MPI_Wtime();
  for (int i = 0; i < STRESS_RUNS; i++) {
    const int m = i % 3, slot = i % STRESS_SLOTS;
    const size_t n = sizes[(i * 7 + i / 3) % NSIZES];
    static const ina_custom_ar_algo_t algos[] = {INA_CUSTOM_AR_AUTO, INA_CUSTOM_AR_ONE_SHOT,
                                                 INA_CUSTOM_AR_TWO_SHOT, INA_CUSTOM_AR_LL};
    ina_custom_ar_algo_t algo = algos[(i / 3) % 4];
    if (fp8_refuses(m, algo)) algo = INA_CUSTOM_AR_AUTO;
    if (g.have_nccl && i % 50 == 7) algo = INA_CUSTOM_AR_NCCL;
    ina_custom_ar_algo_t taken = INA_CUSTOM_AR_AUTO;
    ina_custom_ar_choose(g.ar, (ina_custom_ar_mode_t)m, algo, n, 0, 0, &taken);
    ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT;
    a.mode = (ina_custom_ar_mode_t)m;
    a.algo = algo;
    a.count = n;
    a.in = d_pool[m];
    a.out = d_slot[slot];
    a.stream = g.stream;
    if (i % 4 == 1) { /* zero-copy: the producer writes into the registered buffer */
      cudaMemcpyAsync(g.input_buf, d_pool[m], n * elem_bytes(m), cudaMemcpyDeviceToDevice,
                      g.stream);
      a.in = g.input_buf;
    }
    run_errors += ina_custom_ar_run(g.ar, &a) != INA_OK;
    slot_mode[slot] = m;
    slot_algo[slot] = taken;
    slot_n[slot] = n;
    nccl_runs += taken == INA_CUSTOM_AR_NCCL;
    if (slot == STRESS_SLOTS - 1 || i == STRESS_RUNS - 1) {
      if (cudaStreamSynchronize(g.stream) != cudaSuccess) {
        bad++;
        break;
      }
      for (int s = 0; s <= slot; s++) {
        const size_t eb = elem_bytes(slot_mode[s]), ns = slot_n[s];
        cudaMemcpy(host, d_slot[s], ns * eb, cudaMemcpyDeviceToHost);
        const void *want = pool[slot_mode[s]].want;
        if (slot_mode[s] == INA_CAR_MODE_FP8) {
          for (int k = 0; k < NSIZES; k++)
            if (sizes[k] == ns) want = want_fp8[k];
        }
        if (slot_algo[s] != INA_CUSTOM_AR_NCCL) {
          bad += memcmp(host, want, ns * eb) != 0;
        } else { /* NCCL: close to the model */
          double num = 0, den = 0;
          for (size_t j = 0; j < ns; j++) {
            const double d = out_value(slot_mode[s], host, j) - pool[slot_mode[s]].sum[j];
            num += d * d;
            den += pool[slot_mode[s]].sum[j] * pool[slot_mode[s]].sum[j];
          }
          bad += !(sqrt(num / (den > 0 ? den : 1)) <=
                   (slot_mode[s] == INA_CAR_MODE_F32 ? 1e-5 : 1e-2));
        }
      }
    }
  }
  const double seconds = MPI_Wtime() - t0;
  CHECKF(run_errors == 0, "stress: %ld runs returned an error", run_errors);
  CHECKF(bad == 0, "stress: %ld of %d results wrong", bad, STRESS_RUNS);
  if (g.rank == 0)
    printf("test_custom_ar: %d back-to-back runs (%ld via NCCL) checked in %.2f s\n", STRESS_RUNS,
           nccl_runs, seconds);
  for (int s = 0; s < STRESS_SLOTS; s++) cudaFree(d_slot[s]);
  for (int m = 0; m < 3; m++) {
    cudaFree(d_pool[m]);
    free_case(&pool[m]);
  }
  for (int k = 0; k < NSIZES; k++) free(want_fp8[k]);
  free(host);
}

/* ---- checked mode and errors ------------------------------------------------------------- */

static ina_status_t run_quiet(ina_custom_ar_t *ar, const ina_custom_ar_args_t *a) {
  ina_log_set_quiet_errors(1);
  ina_status_t st = ina_custom_ar_run(ar, a);
  ina_log_set_quiet_errors(0);
  return st;
}

static void test_checked_mode(void) {
  ina_custom_ar_config_t cfg = INA_CUSTOM_AR_CONFIG_INIT;
  ina_custom_ar_t *ar = NULL;
  cfg.max_bytes = (size_t)1 << 20;
  cfg.check = 1;
  cfg.timeout_s = 30;
  CHECK_OK(ina_custom_ar_create(g.comm, &cfg, &ar));
  if (!ar) return;
  void *d_in = NULL, *d_out = NULL;
  CUDA_OK(cudaMalloc(&d_in, 65536));
  CUDA_OK(cudaMalloc(&d_out, 65536));
  CUDA_OK(cudaMemset(d_in, 0, 65536));
  ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT;
  a.in = d_in;
  a.out = d_out;
  a.stream = g.stream;
  /* Counts differ. */
  a.count = g.rank == 0 ? 1000 : 1008;
  CHECK(run_quiet(ar, &a) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "checked mode") != NULL);
  /* Modes differ. */
  a.count = 1000;
  a.mode = g.rank == 0 ? INA_CUSTOM_AR_BF16 : INA_CUSTOM_AR_F32;
  CHECK(run_quiet(ar, &a) == INA_ERR_INVALID_ARGUMENT);
  /* Algorithms differ. */
  a.mode = INA_CUSTOM_AR_BF16;
  a.algo = g.rank == 0 ? INA_CUSTOM_AR_ONE_SHOT : INA_CUSTOM_AR_TWO_SHOT;
  CHECK(run_quiet(ar, &a) == INA_ERR_INVALID_ARGUMENT);
  /* Epilogue shapes differ with the same count. */
  uint16_t *d_res = NULL, *d_w = NULL;
  CUDA_OK(cudaMalloc((void **)&d_res, 4096));
  CUDA_OK(cudaMalloc((void **)&d_w, 4096));
  ina_custom_ar_args_t e = a;
  e.algo = INA_CUSTOM_AR_AUTO;
  e.count = 1024;
  e.rows = g.rank == 0 ? 2 : 4;
  e.cols = g.rank == 0 ? 512 : 256;
  e.residual = d_res;
  e.norm_weight = d_w;
  CHECK(run_quiet(ar, &e) == INA_ERR_INVALID_ARGUMENT);
  /* Agreement again: the instance still works. */
  a.algo = INA_CUSTOM_AR_AUTO;
  case_t c;
  make_case(&c, INA_CAR_MODE_BF16, 1000, 31337, 0);
  CUDA_OK(cudaMemcpy(d_in, c.raw[g.rank], 2000, cudaMemcpyHostToDevice));
  settle_uploads();
  CHECK_OK(ina_custom_ar_run(ar, &a));
  CUDA_OK(cudaStreamSynchronize(g.stream));
  uint16_t host[1000];
  CUDA_OK(cudaMemcpy(host, d_out, 2000, cudaMemcpyDeviceToHost));
  ina_custom_ar_algo_t taken = INA_CUSTOM_AR_AUTO;
  CHECK_OK(ina_custom_ar_choose(ar, INA_CUSTOM_AR_BF16, INA_CUSTOM_AR_AUTO, 1000, 0, 0, &taken));
  check_sum(&c, taken, host, "checked mode, matching run");
  free_case(&c);
  cudaFree(d_in);
  cudaFree(d_out);
  cudaFree(d_res);
  cudaFree(d_w);
  ina_custom_ar_destroy(ar);

  /* A config that differs between ranks fails creation everywhere. */
  cfg.check = 0;
  cfg.max_bytes = g.rank == 0 ? (size_t)1 << 20 : (size_t)2 << 20;
  ina_log_set_quiet_errors(1);
  ar = (ina_custom_ar_t *)&cfg; /* must come back NULL */
  CHECK(ina_custom_ar_create(g.comm, &cfg, &ar) == INA_ERR_INVALID_ARGUMENT && ar == NULL);
  ina_log_set_quiet_errors(0);
}

static void test_argument_errors(void) {
  uint8_t *d = NULL;
  CUDA_OK(cudaMalloc((void **)&d, 65536 + 64));
  ina_custom_ar_args_t a = INA_CUSTOM_AR_ARGS_INIT;
  a.count = 1000;
  a.in = d;
  a.out = d + 4096;
  a.stream = g.stream;
  CHECK(run_quiet(NULL, &a) == INA_ERR_INVALID_ARGUMENT);
  CHECK(run_quiet(g.ar, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_custom_ar_args_t old = a;
  old.struct_size = 8;
  CHECK(run_quiet(g.ar, &old) == INA_ERR_INVALID_ARGUMENT);
  ina_custom_ar_args_t bad = a;
  bad.mode = INA_CUSTOM_AR_FP8;
  bad.algo = INA_CUSTOM_AR_ONE_SHOT;
  CHECK(run_quiet(g.ar, &bad) == INA_ERR_UNSUPPORTED);
  if (ina_custom_ar_peer_access(g.ar)) {
    bad = a;
    bad.in = g.input_buf + 2; /* inside the registered buffer but not it */
    CHECK(run_quiet(g.ar, &bad) == INA_ERR_INVALID_ARGUMENT);
  }
  bad = a;
  bad.out = d + 1000; /* overlaps in */
  CHECK(run_quiet(g.ar, &bad) == INA_ERR_INVALID_ARGUMENT);
  bad = a;
  bad.in = d + 1; /* not aligned to bf16 */
  CHECK(run_quiet(g.ar, &bad) == INA_ERR_INVALID_ARGUMENT);
  /* Epilogue: shape, dtype, alignment. */
  ina_custom_ar_args_t e = a;
  e.count = 1024;
  e.rows = 2;
  e.cols = 512;
  e.out = d + 8192;
  e.residual = (uint16_t *)(d + 16384);
  e.norm_weight = d + 32768;
  ina_custom_ar_args_t bad_e = e;
  bad_e.rows = 3;
  CHECK(run_quiet(g.ar, &bad_e) == INA_ERR_INVALID_ARGUMENT);
  bad_e = e;
  bad_e.mode = INA_CUSTOM_AR_F32;
  CHECK(run_quiet(g.ar, &bad_e) == INA_ERR_UNSUPPORTED);
  bad_e = e;
  bad_e.residual = (uint16_t *)(d + 16386);
  CHECK(run_quiet(g.ar, &bad_e) == INA_ERR_INVALID_ARGUMENT);
  bad_e = e;
  bad_e.norm_weight_dtype = INA_DTYPE_FP8_E4M3;
  CHECK(run_quiet(g.ar, &bad_e) == INA_ERR_UNSUPPORTED);
  bad_e = e;
  bad_e.y_fp8 = d + 40000; /* without its scales */
  CHECK(run_quiet(g.ar, &bad_e) == INA_ERR_INVALID_ARGUMENT);
  /* count 0 enqueues nothing. */
  ina_custom_ar_args_t none = a;
  none.count = 0;
  none.in = none.out = NULL;
  CHECK_OK(ina_custom_ar_run(g.ar, &none));
  /* Bad configs fail before any collective; NULL is a no-op for destroy. */
  ina_custom_ar_config_t cfg = INA_CUSTOM_AR_CONFIG_INIT;
  ina_custom_ar_t *ar = NULL;
  cfg.max_bytes = 0;
  ina_log_set_quiet_errors(1);
  CHECK(ina_custom_ar_create(g.comm, &cfg, &ar) == INA_ERR_INVALID_ARGUMENT && ar == NULL);
  CHECK(ina_custom_ar_create(NULL, NULL, &ar) == INA_ERR_INVALID_ARGUMENT && ar == NULL);
  ina_log_set_quiet_errors(0);
  ina_custom_ar_destroy(NULL);
  cudaFree(d);
}

static int run_gpu_tests(ina_bootstrap_t *boot) {
  ina_comm_t *comm = NULL;
  g.have_nccl = ina_comm_have_nccl();
  CHECK_OK(ina_bootstrap_node_comm(boot, g.have_nccl ? INA_COMM_BACKEND_NCCL : INA_COMM_BACKEND_MPI,
                                   &comm));
  if (!comm) return test_finish("test_custom_ar");
  g.comm = comm;
  g.rank = ina_comm_rank(comm);
  g.nranks = ina_comm_size(comm);
  g.seed = comm_test_seed("test_custom_ar");
  CUDA_OK(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking));
  ina_custom_ar_config_t cfg = INA_CUSTOM_AR_CONFIG_INIT;
  cfg.max_bytes = CAPACITY;
  cfg.one_shot_max_bytes = (size_t)64 << 10;
  cfg.timeout_s = 30;
  CHECK_OK(ina_custom_ar_create(comm, &cfg, &g.ar));
  if (g.ar) {
    g.input_buf = ina_custom_ar_input_buffer(g.ar, &g.input_bytes);
    CHECK(ina_custom_ar_nranks(g.ar) == g.nranks);
    if (g.rank == 0)
      printf("test_custom_ar: %d ranks, %s, %zu-byte input buffer\n", g.nranks,
             ina_custom_ar_peer_access(g.ar) ? "IPC path" : "no peer access: NCCL only",
             g.input_bytes);
    if (ina_custom_ar_peer_access(g.ar)) CHECK(g.input_buf != NULL && g.input_bytes >= CAPACITY);
    if (!g.input_buf) { /* NCCL only: the zero-copy cases use ordinary buffers */
      CUDA_OK(cudaMalloc((void **)&g.input_buf, CAPACITY));
      g.input_bytes = 0;
    }
    test_modes();
    test_epilogue();
    test_graph();
    if (g.rank == 0 && g.fp8_elements > 0)
      printf("test_custom_ar: fp8 error over %zu elements: worst |err| / bound %.3f, worst "
             "|err| / (sum of block amax) 2^%.2f, relative L2 vs the fp64 sum %.3g\n",
             g.fp8_elements, g.fp8_worst_vs_bound, log2(g.fp8_worst_vs_amax),
             sqrt(g.fp8_err2 / (g.fp8_sum2 > 0 ? g.fp8_sum2 : 1)));
    test_stress();
    test_checked_mode();
    test_argument_errors();
    if (!ina_custom_ar_peer_access(g.ar)) cudaFree(g.input_buf);
    ina_custom_ar_destroy(g.ar);
  }
  cudaStreamDestroy(g.stream);
  ina_comm_destroy(comm);
  return test_finish("test_custom_ar");
}
#endif /* INA_HAVE_CUDA */

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  char buf[256];
  /* One GPU per rank of the node: test_gpus_missing names the CUDA error when none. */
  const char *why = test_gpus_missing(ina_bootstrap_local_size(boot), buf, sizeof buf);
  if (!why && ina_bootstrap_world_size(boot) < 2) why = "needs at least 2 ranks";
  if (!why && ina_bootstrap_world_size(boot) > INA_CAR_MAX_RANKS) why = "more than 8 ranks";
  if (why) {
    const int rc = ina_bootstrap_world_rank(boot) == 0 ? test_skip_gpu("test_custom_ar", why)
                                                       : test_gpu_skip_status();
    ina_bootstrap_finalize(boot);
    return rc;
  }
  int rc = 1;
#ifdef INA_HAVE_CUDA
  rc = run_gpu_tests(boot);
#endif
  ina_bootstrap_finalize(boot);
  return rc;
}
