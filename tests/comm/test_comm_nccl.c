/* The NCCL backend on GPUs, under mpirun with one GPU per rank (registered for 2 ranks,
 * written for any count >= 2): every operation of comm/comm.h on device buffers against
 * fp64 or exact references, once on the default stream and once on a created
 * non-blocking stream; 0-count calls; and checked mode (INA_COMM_CHECK=1), whose
 * mismatches must fail on every rank, promptly, without hanging. Skipped (77) without a
 * GPU, with fewer GPUs than ranks on a node, or without NCCL in the build; under
 * INA_REQUIRE_GPU=1 these fail instead (tests/test_util.h).
 *
 * Reductions are compared element by element with the fp64 sum `want` and the sum of
 * magnitudes `mag` over the ranks' inputs:
 * - f32 on 2 ranks: exact. The result is one rounded addition a + b whatever the order,
 *   and (float)want is that correctly rounded sum (double has more than 2 * 24 + 2 bits,
 *   so rounding first to double and then to float changes nothing).
 * - f32 on more ranks, and bf16 (NCCL rounds to bf16 after each addition): each of the
 *   size - 1 additions errs by at most half an ulp of a partial sum <= mag, so
 *   |got - want| <= size * mag * 2^-23 (f32) or 2^-7 (bf16) holds with margin; for bf16
 *   that is a few ulps of the largest term.
 * Data movement (all-gather, all-to-all, send/recv) must be byte-exact. Every failure
 * names the operation, count, dtype, stream and first bad index with got and want. */
#include <math.h>
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/cuda.h"
#include "core/log.h"
#include "tests/comm/comm_test_data.h"
#include "tests/gpu_test_util.h"

#ifdef INA_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

static int g_rank, g_size, g_dev;
static uint64_t g_seed, g_draw; /* g_draw numbers the inputs; every rank advances it alike */
static void *g_stream;          /* this pass's stream: NULL (default) or a created one */
static const char *g_pass = "default stream";

/* A failed call: names the operation, count, dtype and stream, and the library's reason. */
#define CHECK_OP(call, op, n, dtype)                                                     \
  CHECKF((call) == INA_OK, "%s n=%zu %s (%s, rank %d): %s", op, (size_t)(n),             \
         ina_dtype_name(dtype), g_pass, g_rank, ina_last_error())

static void *dev_alloc(size_t bytes) {
  void *d = NULL;
  CHECK_OK(ina_cuda_malloc(g_dev, bytes ? bytes : 1, &d));
  return d;
}

/* Waits for the copy to land: a copy from pageable memory may return before its DMA
 * finishes, and a non-blocking stream is not ordered after the legacy default stream. */
static void upload(void *d, const void *host, size_t bytes) {
  CHECK_OK(ina_cuda_memcpy_h2d(d, host, bytes));
  CHECK_OK(ina_cuda_synchronize());
}

/* 0xFF bytes: NaN in f32 and bf16, so an element left unwritten never passes. */
static void poison(void *d, size_t bytes) {
  void *h = malloc(bytes + 1);
  memset(h, 0xff, bytes);
  upload(d, h, bytes);
  free(h);
}

/* Completes the pass's stream through the communicator, then copies d back. */
static void *download(ina_comm_t *c, const void *d, size_t bytes) {
  void *h = malloc(bytes + 1);
  memset(h, 0xee, bytes);
  CHECKF(ina_comm_sync(c, g_stream) == INA_OK, "sync (%s, rank %d): %s", g_pass, g_rank,
         ina_last_error());
  CHECK_OK(ina_cuda_memcpy_d2h(h, d, bytes));
  return h;
}

/* Input number `draw` of rank r as n elements of dtype: normal values (exact in bf16 for
 * bf16) for the float sums, random bytes for the other dtypes. */
static void *rank_input(int r, uint64_t draw, size_t n, ina_dtype_t dtype) {
  size_t eb = ina_dtype_size(dtype);
  unsigned char *out = malloc(n * eb + 1);
  if (dtype == INA_DTYPE_F32 || dtype == INA_DTYPE_BF16) {
    float *v = malloc(n * sizeof(float) + 1);
    comm_test_fill(v, n, g_seed, r, draw, dtype == INA_DTYPE_BF16);
    CHECK_OK(ina_from_f32(v, out, dtype, n));
    free(v);
  } else {
    test_rng_t rng = comm_test_rng(g_seed, r, draw);
    for (size_t i = 0; i < n * eb; i++) out[i] = (unsigned char)test_rng_next(&rng);
  }
  return out;
}

/* want[i] / mag[i] = sum over ranks of x[offset + i] / |x[offset + i]|, x = rank_input. */
static void sum_ref(uint64_t draw, size_t total, size_t offset, size_t n, ina_dtype_t dtype,
                    double *want, double *mag) {
  float *v = malloc(total * sizeof(float) + 1);
  for (size_t i = 0; i < n; i++) want[i] = mag[i] = 0;
  for (int r = 0; r < g_size; r++) {
    comm_test_fill(v, total, g_seed, r, draw, dtype == INA_DTYPE_BF16);
    for (size_t i = 0; i < n; i++) {
      want[i] += v[offset + i];
      mag[i] += fabs(v[offset + i]);
    }
  }
  free(v);
}

/* An element as "value (0xbits)" for float dtypes, "0xbits" otherwise (little endian). */
static const char *elem_str(char *buf, size_t cap, const void *p, ina_dtype_t dtype) {
  size_t eb = ina_dtype_size(dtype);
  unsigned long long bits = 0;
  memcpy(&bits, p, eb);
  if (ina_dtype_is_float(dtype)) {
    float v;
    ina_to_f32(p, dtype, &v, 1);
    snprintf(buf, cap, "%.9g (0x%0*llx)", v, (int)(2 * eb), bits);
  } else {
    snprintf(buf, cap, "0x%0*llx", (int)(2 * eb), bits);
  }
  return buf;
}

static void expect_bytes(const char *op, size_t n, ina_dtype_t dtype, const void *got,
                         const void *want, size_t count) {
  size_t eb = ina_dtype_size(dtype), bad = 0, first = 0;
  const char *g = got, *w = want;
  for (size_t i = 0; i < count; i++)
    if (memcmp(g + i * eb, w + i * eb, eb) != 0 && bad++ == 0) first = i;
  char gs[64], ws[64];
  CHECKF(bad == 0, "%s n=%zu %s (%s, rank %d): %zu of %zu elements differ, first at index %zu: "
         "got %s want %s", op, n, ina_dtype_name(dtype), g_pass, g_rank, bad, count, first,
         elem_str(gs, sizeof gs, g + first * eb, dtype),
         elem_str(ws, sizeof ws, w + first * eb, dtype));
}

/* The bounds of the header comment; NaN never passes. */
static void expect_sum(const char *op, size_t n, ina_dtype_t dtype, const void *got,
                       const double *want, const double *mag, size_t count) {
  float *g = malloc(count * sizeof(float) + 1);
  ina_to_f32(got, dtype, g, count);
  const int exact = dtype == INA_DTYPE_F32 && g_size == 2;
  const double ulp = dtype == INA_DTYPE_F32 ? 0x1p-23 : 0x1p-7;
  size_t bad = 0, first = 0;
  double fw = 0, ftol = 0;
  for (size_t i = 0; i < count; i++) {
    double w = exact ? (double)(float)want[i] : want[i];
    double tol = exact ? 0 : g_size * ulp * mag[i];
    if (!(fabs((double)g[i] - w) <= tol) && bad++ == 0) {
      first = i;
      fw = w;
      ftol = tol;
    }
  }
  CHECKF(bad == 0, "%s n=%zu %s (%s, rank %d): %zu of %zu elements off, first at index %zu: "
         "got %.9g want %.9g (tolerance %.3g)", op, n, ina_dtype_name(dtype), g_pass, g_rank, bad,
         count, first, g[first], fw, ftol);
  free(g);
}

/* All-reduce, or reduce-scatter (`scatter`), of n output elements. rounds == 0: out of
 * place into a poisoned buffer. rounds >= 1 (all-reduce): in place, `rounds` calls
 * enqueued back to back and synced once, so each later call sees the earlier result
 * through stream order alone; the result is then size^(rounds - 1) * sum. */
static void check_sum(ina_comm_t *c, int scatter, size_t n, ina_dtype_t dtype, int rounds) {
  const char *op = scatter       ? "reduce_scatter"
                   : rounds == 0 ? "all_reduce"
                   : rounds == 1 ? "all_reduce (in place)"
                                 : "all_reduce (in place, chained)";
  uint64_t draw = ++g_draw;
  size_t eb = ina_dtype_size(dtype), total = scatter ? n * (size_t)g_size : n;
  double *want = malloc(n * sizeof(double)), *mag = malloc(n * sizeof(double));
  sum_ref(draw, total, scatter ? (size_t)g_rank * n : 0, n, dtype, want, mag);
  for (int k = 1; k < rounds; k++)
    for (size_t i = 0; i < n; i++) want[i] *= g_size, mag[i] *= g_size;
  void *in = rank_input(g_rank, draw, total, dtype);
  void *ds = dev_alloc(total * eb), *dr = rounds ? ds : dev_alloc(n * eb);
  upload(ds, in, total * eb);
  if (!rounds) poison(dr, n * eb);
  for (int k = 0; k < (rounds ? rounds : 1); k++)
    CHECK_OP(scatter ? ina_comm_reduce_scatter(c, ds, dr, n, dtype, g_stream)
                     : ina_comm_all_reduce(c, ds, dr, n, dtype, g_stream), op, n, dtype);
  void *got = download(c, dr, n * eb);
  expect_sum(op, n, dtype, got, want, mag, n);
  if (!rounds) ina_cuda_free(dr);
  ina_cuda_free(ds);
  free(got);
  free(in);
  free(mag);
  free(want);
}

static void check_all_gather(ina_comm_t *c, size_t n, ina_dtype_t dtype) {
  uint64_t draw = ++g_draw;
  size_t bytes = n * ina_dtype_size(dtype), total = bytes * (size_t)g_size;
  char *want = malloc(total + 1);
  for (int r = 0; r < g_size; r++) {
    void *x = rank_input(r, draw, n, dtype);
    memcpy(want + (size_t)r * bytes, x, bytes);
    free(x);
  }
  void *ds = dev_alloc(bytes), *dr = dev_alloc(total);
  upload(ds, want + (size_t)g_rank * bytes, bytes);
  poison(dr, total);
  CHECK_OP(ina_comm_all_gather(c, ds, dr, n, dtype, g_stream), "all_gather", n, dtype);
  void *got = download(c, dr, total);
  expect_bytes("all_gather", n, dtype, got, want, n * (size_t)g_size);
  ina_cuda_free(ds);
  ina_cuda_free(dr);
  free(got);
  free(want);
}

/* Every rank as root: the root's input lands on every rank, in place. */
static void check_broadcast(ina_comm_t *c, size_t n, ina_dtype_t dtype) {
  const size_t bytes = n * ina_dtype_size(dtype);
  for (int root = 0; root < g_size; root++) {
    const uint64_t draw = ++g_draw;
    void *want = rank_input(root, draw, n, dtype);
    void *d = dev_alloc(bytes);
    if (g_rank == root) upload(d, want, bytes);
    else poison(d, bytes);
    CHECK_OP(ina_comm_broadcast(c, d, n, dtype, root, g_stream), "broadcast", n, dtype);
    void *got = download(c, d, bytes);
    expect_bytes("broadcast", n, dtype, got, want, n);
    ina_cuda_free(d);
    free(got);
    free(want);
  }
}

/* Element i sent from rank s to rank d in all-to-all number `draw`: random bytes that
 * every rank can regenerate. */
static void a2a_elem(uint64_t draw, int s, int d, size_t i, void *dst, size_t eb) {
  test_rng_t r = comm_test_rng(g_seed, s * 4096 + d, draw * 0x100000001ull + i);
  uint64_t v = test_rng_next(&r);
  memcpy(dst, &v, eb);
}

/* Counts agreed by every rank, uneven, with zero pairs: rank 0 sends nothing to rank 1,
 * the last rank nothing to itself, and about one pair in six is empty. */
static void check_all_to_all_v(ina_comm_t *c, size_t max, int reversed, ina_dtype_t dtype) {
  uint64_t draw = ++g_draw;
  size_t S = (size_t)g_size, eb = ina_dtype_size(dtype), stot = 0, rtot = 0;
  size_t *counts = malloc(S * S * sizeof(size_t)), *a = malloc(4 * S * sizeof(size_t));
  size_t *sc = a, *rc = a + S, *sd = a + 2 * S, *rd = a + 3 * S;
  test_rng_t rng = comm_test_rng(g_seed, -1, draw);
  for (size_t k = 0; k < S * S; k++)
    counts[k] = test_rng_int(&rng, 0, 5) == 0 ? 0 : (size_t)test_rng_int(&rng, 1, (int64_t)max);
  counts[1] = 0;
  counts[S * S - 1] = 0;
  for (size_t p = 0; p < S; p++) {
    sc[p] = counts[(size_t)g_rank * S + p];
    rc[p] = counts[p * S + (size_t)g_rank];
    stot += sc[p];
    rtot += rc[p];
  }
  /* The reversed layout stores peers last to first, exercising the displacements. */
  for (size_t k = 0, so = 0, ro = 0; k < S; k++) {
    size_t p = reversed ? S - 1 - k : k;
    sd[p] = so;
    rd[p] = ro;
    so += sc[p];
    ro += rc[p];
  }
  char *hs = malloc(stot * eb + 1), *want = malloc(rtot * eb + 1);
  for (size_t p = 0; p < S; p++) {
    for (size_t i = 0; i < sc[p]; i++) a2a_elem(draw, g_rank, (int)p, i, hs + (sd[p] + i) * eb, eb);
    for (size_t i = 0; i < rc[p]; i++)
      a2a_elem(draw, (int)p, g_rank, i, want + (rd[p] + i) * eb, eb);
  }
  void *ds = dev_alloc(stot * eb), *dr = dev_alloc(rtot * eb);
  upload(ds, hs, stot * eb);
  poison(dr, rtot * eb);
  const char *op = reversed ? "all_to_all_v (reversed displacements)" : "all_to_all_v (packed)";
  CHECK_OP(ina_comm_all_to_all_v(c, ds, sc, reversed ? sd : NULL, dr, rc, reversed ? rd : NULL,
                                 dtype, g_stream), op, rtot, dtype);
  void *got = download(c, dr, rtot * eb);
  expect_bytes(op, rtot, dtype, got, want, rtot);
  ina_cuda_free(ds);
  ina_cuda_free(dr);
  free(got);
  free(want);
  free(hs);
  free(a);
  free(counts);
}

/* Plain send to rank + 1 and recv from rank - 1. NCCL's send waits on the stream for the
 * peer's receive, so even ranks send first and odd ranks receive first: at least one
 * pair matches at every step, for odd sizes too. */
static void ring_send_and_recv(ina_comm_t *c, const void *ds, void *dr, size_t n,
                               ina_dtype_t dtype) {
  int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  for (int step = 0; step < 2; step++) {
    if ((step == 0) == (g_rank % 2 == 0))
      CHECK_OP(ina_comm_send(c, ds, n, dtype, next, g_stream), "send ring", n, dtype);
    else
      CHECK_OP(ina_comm_recv(c, dr, n, dtype, prev, g_stream), "recv ring", n, dtype);
  }
}

/* rank -> rank + 1: send_recv in one call, then plain send and recv. */
static void check_ring(ina_comm_t *c, size_t n, ina_dtype_t dtype) {
  uint64_t draw = ++g_draw;
  int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  size_t bytes = n * ina_dtype_size(dtype);
  void *mine = rank_input(g_rank, draw, n, dtype), *want = rank_input(prev, draw, n, dtype);
  void *ds = dev_alloc(bytes), *dr = dev_alloc(bytes);
  upload(ds, mine, bytes);
  poison(dr, bytes);
  CHECK_OP(ina_comm_send_recv(c, ds, n, next, dr, n, prev, dtype, g_stream), "send_recv ring", n,
           dtype);
  void *got = download(c, dr, bytes);
  expect_bytes("send_recv ring", n, dtype, got, want, n);
  free(got);
  poison(dr, bytes);
  ring_send_and_recv(c, ds, dr, n, dtype);
  got = download(c, dr, bytes);
  expect_bytes("send + recv ring", n, dtype, got, want, n);
  ina_cuda_free(ds);
  ina_cuda_free(dr);
  free(got);
  free(want);
  free(mine);
}

/* Every operation with count 0 returns INA_OK and leaves both buffers as they were. */
static void check_zero_counts(ina_comm_t *c) {
  enum { B = 64 };
  const ina_dtype_t f32 = INA_DTYPE_F32, bf16 = INA_DTYPE_BF16;
  unsigned char sentinel[B];
  memset(sentinel, 0x5a, B);
  size_t *zeros = calloc((size_t)g_size, sizeof(size_t));
  int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  void *ds = dev_alloc(B), *dr = dev_alloc(B);
  upload(ds, sentinel, B);
  upload(dr, sentinel, B);
  CHECK_OP(ina_comm_all_reduce(c, ds, dr, 0, f32, g_stream), "all_reduce", 0, f32);
  CHECK_OP(ina_comm_all_reduce(c, ds, ds, 0, bf16, g_stream), "all_reduce (in place)", 0, bf16);
  CHECK_OP(ina_comm_all_reduce(c, NULL, NULL, 0, f32, g_stream), "all_reduce (NULL)", 0, f32);
  CHECK_OP(ina_comm_all_gather(c, ds, dr, 0, bf16, g_stream), "all_gather", 0, bf16);
  CHECK_OP(ina_comm_reduce_scatter(c, ds, dr, 0, f32, g_stream), "reduce_scatter", 0, f32);
  CHECK_OP(ina_comm_all_to_all_v(c, ds, zeros, NULL, dr, zeros, NULL, f32, g_stream),
           "all_to_all_v (all counts 0)", 0, f32);
  CHECK_OP(ina_comm_send_recv(c, ds, 0, next, dr, 0, prev, f32, g_stream), "send_recv", 0, f32);
  ring_send_and_recv(c, ds, dr, 0, f32);
  void *gs = download(c, ds, B), *gr = download(c, dr, B);
  expect_bytes("0-count operations, send buffer", 0, INA_DTYPE_I32, gs, sentinel, B / 4);
  expect_bytes("0-count operations, recv buffer", 0, INA_DTYPE_I32, gr, sentinel, B / 4);
  ina_cuda_free(ds);
  ina_cuda_free(dr);
  free(gs);
  free(gr);
  free(zeros);
}

static void run_suite(ina_comm_t *c) {
  const ina_dtype_t sums[] = {INA_DTYPE_F32, INA_DTYPE_BF16};
  const ina_dtype_t moved[] = {INA_DTYPE_F32, INA_DTYPE_BF16, INA_DTYPE_FP8_E4M3, INA_DTYPE_I32};
  const size_t reduce_sizes[] = {1, 2, 7, 1001, 65537, (size_t)1 << 22};
  const size_t gather_sizes[] = {1, 13, 4099, (size_t)1 << 18};
  for (size_t t = 0; t < 2; t++) {
    for (size_t k = 0; k < sizeof reduce_sizes / sizeof reduce_sizes[0]; k++) {
      check_sum(c, 0, reduce_sizes[k], sums[t], 0);
      check_sum(c, 0, reduce_sizes[k], sums[t], 1);
    }
    for (size_t k = 0; k < sizeof gather_sizes / sizeof gather_sizes[0]; k++)
      check_sum(c, 1, gather_sizes[k], sums[t], 0);
  }
  check_sum(c, 0, 100003, INA_DTYPE_F32, 2);
  for (size_t t = 0; t < sizeof moved / sizeof moved[0]; t++) {
    for (size_t k = 0; k < sizeof gather_sizes / sizeof gather_sizes[0]; k++)
      check_all_gather(c, gather_sizes[k], moved[t]);
    check_all_to_all_v(c, 5, 0, moved[t]);
    check_all_to_all_v(c, 3000, 1, moved[t]);
    check_all_to_all_v(c, 200000, t & 1, moved[t]);
    check_ring(c, 1, moved[t]);
    check_ring(c, 777, moved[t]);
    check_ring(c, (size_t)1 << 20, moved[t]);
    check_broadcast(c, 1, moved[t]);
    check_broadcast(c, 70001, moved[t]);
  }
  check_zero_counts(c);
  CHECKF(ina_comm_barrier(c, g_stream) == INA_OK, "barrier (%s): %s", g_pass, ina_last_error());
  CHECKF(ina_comm_sync(c, g_stream) == INA_OK, "sync (%s): %s", g_pass, ina_last_error());
}

/* One call with a `mismatch` between ranks that must fail on this rank with
 * INA_ERR_INVALID_ARGUMENT and a message naming op, `what` and checked mode. If it wrongly
 * went through, it is synced (the short timeout bounds the wait) so the ranks stay in
 * step instead of hanging. */
static void expect_refused(ina_comm_t *cc, ina_status_t st, const char *mismatch, const char *op,
                           const char *what) {
  const char *e = ina_last_error();
  const int named = strstr(e, op) && strstr(e, what) && strstr(e, "checked mode");
  if (st == INA_OK) (void)ina_comm_sync(cc, g_stream);
  CHECKF(st == INA_ERR_INVALID_ARGUMENT && named,
         "checked mode, %s on rank %d: status %d (want %d), message \"%s\" should name "
         "'%s', '%s' and 'checked mode'", mismatch, g_rank, (int)st, (int)INA_ERR_INVALID_ARGUMENT,
         ina_last_error(), op, what);
}

/* INA_COMM_CHECK is read when a communicator is created (comm.c), so set it around the
 * creation only. */
static void check_checked_mode(ina_bootstrap_t *boot) {
  enum { N = 1001 };
  const double timeout_s = 10;
  setenv("INA_COMM_CHECK", "1", 1);
  ina_comm_t *cc = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_NCCL, &cc));
  unsetenv("INA_COMM_CHECK");
  if (!cc) return;
  ina_comm_set_timeout(cc, timeout_s);
  /* Large enough for the largest count any rank passes, so nothing can overrun. */
  void *ds = dev_alloc((N + 1) * 4 * (size_t)g_size), *dr = dev_alloc((N + 1) * 4 * (size_t)g_size);
  poison(ds, (N + 1) * 4 * (size_t)g_size); /* contents are irrelevant: nothing may move */
  size_t *sc = malloc(2 * (size_t)g_size * sizeof(size_t)), *rc = sc + g_size;
  for (int p = 0; p < g_size; p++) sc[p] = rc[p] = 1;
  if (g_rank == 0) rc[g_size - 1] = 2; /* more than the last rank sends */

  ina_log_set_quiet_errors(1);
  double t0 = MPI_Wtime();
  ina_clear_error();
  ina_status_t st =
      ina_comm_all_reduce(cc, ds, dr, g_rank == 0 ? N : N + 1, INA_DTYPE_F32, g_stream);
  expect_refused(cc, st, "all_reduce f32 count N vs N + 1", "all_reduce", "count");
  ina_clear_error();
  st = ina_comm_all_reduce(cc, ds, dr, N, g_rank == 0 ? INA_DTYPE_F32 : INA_DTYPE_BF16, g_stream);
  expect_refused(cc, st, "all_reduce dtype f32 vs bf16", "all_reduce", "dtype");
  ina_clear_error();
  st = ina_comm_all_to_all_v(cc, ds, sc, NULL, dr, rc, NULL, INA_DTYPE_F32, g_stream);
  expect_refused(cc, st, "all_to_all_v receive count 2 vs 1 sent", "all_to_all_v", "rank");
  double elapsed = MPI_Wtime() - t0;
  ina_log_set_quiet_errors(0);
  CHECKF(elapsed < timeout_s, "checked mode: the three refused calls took %.1f s (limit %.0f s)",
         elapsed, timeout_s);

  /* A refused call moved no data, so comm.h's "broken" (a timeout or failed operation
   * left it unusable) does not apply: the communicator must still work. */
  CHECKF(!ina_comm_is_broken(cc), "checked mode: communicator reported broken after refused calls");
  g_pass = "checked mode";
  check_sum(cc, 0, 4099, INA_DTYPE_F32, 0);
  check_sum(cc, 0, 4099, INA_DTYPE_BF16, 1);
  check_sum(cc, 1, 999, INA_DTYPE_BF16, 0);
  check_all_to_all_v(cc, 300, 1, INA_DTYPE_BF16);
  CHECKF(ina_comm_barrier(cc, g_stream) == INA_OK, "checked mode barrier: %s", ina_last_error());
  ina_cuda_free(ds);
  ina_cuda_free(dr);
  free(sc);
  ina_comm_destroy(cc);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  g_dev = ina_bootstrap_device(boot);
  /* NCCL needs a GPU of its own for every rank of a node; test_gpus_missing names the
   * CUDA error when there is none. */
  char buf[256];
  const char *why = test_gpus_missing(ina_bootstrap_local_size(boot), buf, sizeof buf);
  if (!why && !ina_comm_have_nccl()) why = "no NCCL in this build";
  if (!why && ina_bootstrap_world_size(boot) < 2) why = "fewer than 2 ranks";
  if (why) {
    const int rc = ina_bootstrap_world_rank(boot) == 0 ? test_skip_gpu("test_comm_nccl", why)
                                                       : test_gpu_skip_status();
    ina_bootstrap_finalize(boot);
    return rc;
  }
  ina_comm_t *c = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_NCCL, &c));
  if (c) {
    g_rank = ina_comm_rank(c);
    g_size = ina_comm_size(c);
    g_seed = comm_test_seed("test_comm_nccl");
    char name[128];
    printf("test_comm_nccl: rank %d/%d on device %d: %s\n", g_rank, g_size, g_dev,
           ina_cuda_device_name(g_dev, name, sizeof name));
    CHECK(ina_comm_backend(c) == INA_COMM_BACKEND_NCCL);
    ina_comm_set_timeout(c, 30); /* a stuck operation fails with a message before ctest's 60 s */
    run_suite(c);
#ifdef INA_HAVE_CUDA
    cudaStream_t stream = NULL;
    cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    CHECKF(e == cudaSuccess, "cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
    g_stream = stream;
    g_pass = "created non-blocking stream";
    if (stream) run_suite(c);
#endif
    check_checked_mode(boot); /* on the created stream */
    g_stream = NULL;
    CHECKF(ina_comm_barrier(c, NULL) == INA_OK, "final barrier: %s", ina_last_error());
    CHECK(!ina_comm_is_broken(c));
#ifdef INA_HAVE_CUDA
    if (stream) cudaStreamDestroy(stream);
#endif
  }
  /* Failures anywhere fail the job: the verdict is summed over ranks. */
  int failed = test_checks_failed_, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  ina_comm_destroy(c);
  char label[64];
  snprintf(label, sizeof label, "test_comm_nccl rank %d/%d", g_rank, g_size);
  int rc = test_finish(label);
  ina_bootstrap_finalize(boot);
  return rc || any ? 1 : 0;
}
