/* Multi-rank test of comm/ (MPI backend), run under mpirun with 2, 3 and 4 ranks: every
 * operation against an fp64 reference from deterministic per-rank data, the node layout
 * (INA_RANKS_PER_NODE), the TP/DP split, and argument errors that must fail without
 * hanging (checked mode included). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/cuda.h"
#include "core/log.h"
#include "tests/comm/comm_test_data.h"

static int g_rank, g_size;

/* The data sent by a rank as the dtype's bytes, and its f32 values. */
static void *make_input(ina_dtype_t dtype, const float *vals, size_t n) {
  void *buf = malloc((n ? n : 1) * ina_dtype_size(dtype));
  if (dtype == INA_DTYPE_F32) memcpy(buf, vals, n * sizeof(float));
  else ina_from_f32(vals, buf, dtype, n);
  return buf;
}

/* The worst element of a sum over the ranks, as a multiple of its bound. Summing R values
 * in any order with rounding u at every step is off by at most (R - 1) u sum|x|, and
 * storing the result by one more u |sum|: so |out - ref| <= R u sum|x| per element (u =
 * 2^-24 for f32, 2^-8 for bf16), whatever the cancellation. A bound relative to |sum|
 * alone fails on a sum that cancels (seen: 1.7e-5 on one f32 element of 4 ranks). */
static double sum_err(const void *out, ina_dtype_t dtype, const double *ref, const double *abs_sum, size_t n) {
  const double u = dtype == INA_DTYPE_F32 ? 0x1p-24 : 0x1p-8;
  float *o = malloc((n ? n : 1) * sizeof(float));
  double worst = 0;
  ina_to_f32(out, dtype, o, n);
  for (size_t i = 0; i < n; i++) {
    const double bound = g_size * u * abs_sum[i], e = fabs((double)o[i] - ref[i]);
    const double r = e == 0 ? 0 : bound > 0 ? e / bound : INFINITY;
    if (!(r <= worst)) worst = r; /* NaN stays */
  }
  free(o);
  return worst;
}

static void test_all_reduce(ina_comm_t *c, uint64_t seed, size_t n, ina_dtype_t dtype,
                            int in_place) {
  int bf = dtype == INA_DTYPE_BF16;
  float *vals = malloc((n ? n : 1) * sizeof(float));
  double *ref = calloc(n ? n : 1, sizeof(double)), *abs_sum = calloc(n ? n : 1, sizeof(double));
  for (int r = 0; r < g_size; r++) {
    comm_test_fill(vals, n, seed, r, 1 + n, bf);
    for (size_t i = 0; i < n; i++) ref[i] += vals[i], abs_sum[i] += fabs(vals[i]);
  }
  comm_test_fill(vals, n, seed, g_rank, 1 + n, bf);
  void *send = make_input(dtype, vals, n);
  void *recv = in_place ? send : malloc((n ? n : 1) * ina_dtype_size(dtype));
  if (!in_place) memset(recv, 0xff, n * ina_dtype_size(dtype)); /* NaN in f32 and bf16 */
  CHECK_OK(ina_comm_all_reduce(c, send, recv, n, dtype, NULL));
  double e = sum_err(recv, dtype, ref, abs_sum, n);
  CHECKF(e <= 1, "all_reduce n=%zu %s in_place=%d: an element %g times its bound off", n, ina_dtype_name(dtype),
         in_place, e);
  if (!in_place) free(recv);
  free(send);
  free(vals);
  free(ref);
  free(abs_sum);
}

static void test_all_gather(ina_comm_t *c, uint64_t seed, size_t n, ina_dtype_t dtype) {
  int bf = dtype == INA_DTYPE_BF16;
  size_t eb = ina_dtype_size(dtype);
  float *vals = malloc((n ? n : 1) * sizeof(float));
  comm_test_fill(vals, n, seed, g_rank, 100 + n, bf);
  void *send = make_input(dtype, vals, n);
  char *recv = malloc((n ? n : 1) * eb * (size_t)g_size);
  memset(recv, 0xff, n * eb * (size_t)g_size);
  CHECK_OK(ina_comm_all_gather(c, send, recv, n, dtype, NULL));
  for (int r = 0; r < g_size; r++) {
    comm_test_fill(vals, n, seed, r, 100 + n, bf);
    void *expect = make_input(dtype, vals, n);
    CHECKF(n == 0 || memcmp(recv + (size_t)r * n * eb, expect, n * eb) == 0,
           "all_gather n=%zu %s: block of rank %d differs", n, ina_dtype_name(dtype), r);
    free(expect);
  }
  free(recv);
  free(send);
  free(vals);
}

static void test_reduce_scatter(ina_comm_t *c, uint64_t seed, size_t n, ina_dtype_t dtype) {
  int bf = dtype == INA_DTYPE_BF16;
  size_t total = n * (size_t)g_size;
  float *vals = malloc((total ? total : 1) * sizeof(float));
  double *ref = calloc(n ? n : 1, sizeof(double)), *abs_sum = calloc(n ? n : 1, sizeof(double));
  for (int r = 0; r < g_size; r++) {
    comm_test_fill(vals, total, seed, r, 200 + n, bf);
    for (size_t i = 0; i < n; i++)
      ref[i] += vals[(size_t)g_rank * n + i], abs_sum[i] += fabs(vals[(size_t)g_rank * n + i]);
  }
  comm_test_fill(vals, total, seed, g_rank, 200 + n, bf);
  void *send = make_input(dtype, vals, total);
  void *recv = malloc((n ? n : 1) * ina_dtype_size(dtype));
  memset(recv, 0xff, n * ina_dtype_size(dtype));
  CHECK_OK(ina_comm_reduce_scatter(c, send, recv, n, dtype, NULL));
  double e = sum_err(recv, dtype, ref, abs_sum, n);
  CHECKF(e <= 1, "reduce_scatter n=%zu %s: an element %g times its bound off", n, ina_dtype_name(dtype), e);
  free(recv);
  free(send);
  free(vals);
  free(ref);
  free(abs_sum);
}

/* counts[s * size + d]: elements rank s sends to rank d, the same on every rank. */
static size_t *agreed_counts(uint64_t seed, uint64_t stream, size_t max) {
  size_t *counts = malloc((size_t)g_size * (size_t)g_size * sizeof(size_t));
  test_rng_t r = comm_test_rng(seed, -1, stream);
  for (int i = 0; i < g_size * g_size; i++) {
    int64_t k = test_rng_int(&r, 0, 5);
    counts[i] = k == 0 ? 0 : (size_t)test_rng_int(&r, 1, (int64_t)max); /* some empty pairs */
  }
  return counts;
}

/* Value of element i sent from rank s to rank d: identifies all three. */
static int32_t a2a_value(int s, int d, size_t i) { return (int32_t)(s * 1000003 + d * 7919 + (int)i); }

static void test_all_to_all_v(ina_comm_t *c, uint64_t seed, uint64_t stream, size_t max,
                              int reversed_layout) {
  size_t *counts = agreed_counts(seed, stream, max);
  size_t *sc = malloc(4 * (size_t)g_size * sizeof(size_t));
  size_t *rc = sc + g_size, *sd = sc + 2 * g_size, *rd = sc + 3 * g_size;
  size_t stot = 0, rtot = 0;
  for (int p = 0; p < g_size; p++) {
    sc[p] = counts[g_rank * g_size + p];
    rc[p] = counts[p * g_size + g_rank];
    stot += sc[p];
    rtot += rc[p];
  }
  /* The reversed layout stores peers last-to-first, exercising displacements. */
  size_t so = 0, ro = 0;
  for (int k = 0; k < g_size; k++) {
    int p = reversed_layout ? g_size - 1 - k : k;
    sd[p] = so;
    rd[p] = ro;
    so += sc[p];
    ro += rc[p];
  }
  int32_t *send = malloc((stot ? stot : 1) * sizeof(int32_t));
  int32_t *recv = malloc((rtot ? rtot : 1) * sizeof(int32_t));
  for (int p = 0; p < g_size; p++)
    for (size_t i = 0; i < sc[p]; i++) send[sd[p] + i] = a2a_value(g_rank, p, i);
  for (size_t i = 0; i < rtot; i++) recv[i] = -1;
  CHECK_OK(ina_comm_all_to_all_v(c, send, sc, reversed_layout ? sd : NULL, recv, rc,
                                 reversed_layout ? rd : NULL, INA_DTYPE_I32, NULL));
  size_t bad = 0;
  for (int p = 0; p < g_size; p++)
    for (size_t i = 0; i < rc[p]; i++) bad += recv[rd[p] + i] != a2a_value(p, g_rank, i);
  CHECKF(bad == 0, "all_to_all_v stream %llu reversed=%d: %zu wrong elements",
         (unsigned long long)stream, reversed_layout, bad);
  free(send);
  free(recv);
  free(sc);
  free(counts);
}

static void test_point_to_point(ina_comm_t *c, uint64_t seed) {
  enum { N = 777 };
  float out[N], in[N], expect[N];
  int next = (g_rank + 1) % g_size, prev = (g_rank + g_size - 1) % g_size;
  comm_test_fill(out, N, seed, g_rank, 300, 0);
  comm_test_fill(expect, N, seed, prev, 300, 0);
  test_poison_f32(in, N);
  CHECK_OK(ina_comm_send_recv(c, out, N, next, in, N, prev, INA_DTYPE_F32, NULL));
  CHECK(memcmp(in, expect, sizeof in) == 0);
  /* Plain send and receive: rank 0 sends to the last rank. */
  test_poison_f32(in, N);
  if (g_rank == 0) CHECK_OK(ina_comm_send(c, out, N, INA_DTYPE_F32, g_size - 1, NULL));
  if (g_rank == g_size - 1) {
    comm_test_fill(expect, N, seed, 0, 300, 0);
    CHECK_OK(ina_comm_recv(c, in, N, INA_DTYPE_F32, 0, NULL));
    CHECK(memcmp(in, expect, sizeof in) == 0);
  }
  CHECK_OK(ina_comm_barrier(c, NULL));
}

/* Every rank as root in turn, several sizes and dtypes; the data is the root's. */
static void test_broadcast(ina_comm_t *c, uint64_t seed) {
  const size_t sizes[] = {1, 33, 70001};
  for (int root = 0; root < g_size; root++)
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
      const size_t n = sizes[k];
      float *buf = malloc(n * sizeof *buf), *want = malloc(n * sizeof *want);
      comm_test_fill(want, n, seed, root, 500 + k, 0);
      if (g_rank == root) memcpy(buf, want, n * sizeof *buf);
      else test_poison_f32(buf, n);
      CHECK_OK(ina_comm_broadcast(c, buf, n, INA_DTYPE_F32, root, NULL));
      CHECKF(memcmp(buf, want, n * sizeof *buf) == 0, "broadcast of %zu f32 from rank %d", n,
             root);
      /* Bytes of another width: the same buffer as i32, half of it as i64. */
      CHECK_OK(ina_comm_broadcast(c, buf, n / 2, INA_DTYPE_I64, root, NULL));
      CHECK(memcmp(buf, want, n * sizeof *buf) == 0);
      free(buf);
      free(want);
    }
  CHECK_OK(ina_comm_broadcast(c, NULL, 0, INA_DTYPE_F32, 0, NULL)); /* nothing to move */
  float x = 0;
  CHECK(ina_comm_broadcast(c, &x, 1, INA_DTYPE_F32, g_size, NULL) == INA_ERR_INVALID_ARGUMENT);
}

static int32_t sum_over(ina_comm_t *c, int32_t v) {
  float f = (float)v, s = -1;
  CHECK_OK(ina_comm_all_reduce(c, &f, &s, 1, INA_DTYPE_F32, NULL));
  return (int32_t)s;
}

static void test_layout(ina_bootstrap_t *boot) {
  const char *env = getenv("INA_RANKS_PER_NODE");
  int wr = ina_bootstrap_world_rank(boot);
  CHECK(wr == g_rank && ina_bootstrap_world_size(boot) == g_size);
  int devices = ina_cuda_device_count(), dev = ina_bootstrap_device(boot);
  CHECKF(devices > 0 ? dev == ina_bootstrap_local_rank(boot) % devices : dev == -1,
         "rank %d selected device %d of %d", wr, dev, devices);
  if (wr == 0)
    printf("test_comm: %d ranks, %d node(s), MPI_THREAD_MULTIPLE %s\n", g_size,
           ina_bootstrap_node_count(boot), ina_bootstrap_thread_multiple(boot) ? "yes" : "no");
  if (env) {
    int n = atoi(env);
    CHECKF(ina_bootstrap_node_id(boot) == wr / n && ina_bootstrap_local_rank(boot) == wr % n &&
               ina_bootstrap_local_size(boot) == n && ina_bootstrap_node_count(boot) == g_size / n,
           "rank %d with INA_RANKS_PER_NODE=%d: node %d local %d/%d nodes %d", wr, n,
           ina_bootstrap_node_id(boot), ina_bootstrap_local_rank(boot),
           ina_bootstrap_local_size(boot), ina_bootstrap_node_count(boot));
  } else { /* one host: one node */
    CHECK(ina_bootstrap_node_id(boot) == 0 && ina_bootstrap_node_count(boot) == 1);
    CHECK(ina_bootstrap_local_rank(boot) == wr && ina_bootstrap_local_size(boot) == g_size);
  }
  ina_comm_t *node = NULL;
  CHECK_OK(ina_bootstrap_node_comm(boot, INA_COMM_BACKEND_MPI, &node));
  if (node) {
    int first = ina_bootstrap_node_id(boot) * ina_bootstrap_local_size(boot), ls = ina_bootstrap_local_size(boot);
    CHECK(ina_comm_size(node) == ls && ina_comm_rank(node) == ina_bootstrap_local_rank(boot));
    CHECK(sum_over(node, wr) == ls * first + ls * (ls - 1) / 2);
  }
  ina_comm_destroy(node);

  if (g_size % 2 == 0) { /* TP pairs of consecutive ranks; DP across the pairs */
    ina_comm_t *tp = NULL, *dp = NULL;
    CHECK_OK(ina_bootstrap_split_tp_dp(boot, 2, INA_COMM_BACKEND_MPI, &tp, &dp));
    if (tp && dp) {
      CHECK(ina_comm_size(tp) == 2 && ina_comm_rank(tp) == wr % 2);
      CHECK(sum_over(tp, wr) == 2 * (wr / 2 * 2) + 1);
      CHECK(ina_comm_size(dp) == g_size / 2 && ina_comm_rank(dp) == wr / 2);
      int k = g_size / 2;
      CHECK(sum_over(dp, wr) == k * (wr % 2) + 2 * k * (k - 1) / 2);
    }
    ina_comm_destroy(tp);
    ina_comm_destroy(dp);
    ina_comm_t *none = (ina_comm_t *)1;
    CHECK_OK(ina_bootstrap_split(boot, g_rank == 0 ? -1 : 3, g_rank, INA_COMM_BACKEND_MPI, &none));
    CHECK(g_rank == 0 ? none == NULL : (none != NULL && ina_comm_size(none) == g_size - 1));
    ina_comm_destroy(none);
  }
  ina_comm_t *bad = (ina_comm_t *)1;
  ina_log_set_quiet_errors(1);
  CHECK(ina_bootstrap_split_tp_dp(boot, g_size + 1, INA_COMM_BACKEND_MPI, &bad, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  CHECK(bad == NULL);
  CHECK(strstr(ina_last_error(), "tp_size") != NULL);
}

static int last_error_has(const char *a, const char *b) {
  const char *e = ina_last_error();
  return strstr(e, a) != NULL && (b == NULL || strstr(e, b) != NULL);
}

/* Local argument errors: each rank fails on its own, nothing is sent, nothing hangs. */
static void test_argument_errors(ina_comm_t *c) {
  float x[4] = {1, 2, 3, 4}, y[4];
  size_t counts[8] = {0};
  CHECK(ina_comm_all_reduce(NULL, x, y, 4, INA_DTYPE_F32, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_comm_all_reduce(c, x, y, 4, INA_DTYPE_I32, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(last_error_has("all_reduce", "i32"));
  CHECK(ina_comm_all_reduce(c, x, y, 4, (ina_dtype_t)99, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_comm_all_reduce(c, NULL, y, 4, INA_DTYPE_F32, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(last_error_has("all_reduce on rank", "NULL buffer"));
  CHECK(ina_comm_reduce_scatter(c, x, y, 1, INA_DTYPE_FP8_E4M3, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_comm_all_gather(c, x, NULL, 1, INA_DTYPE_F32, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_comm_all_reduce(c, x, y, (size_t)1 << 40, INA_DTYPE_F32, NULL) == INA_ERR_UNSUPPORTED);
  CHECK(ina_comm_send(c, x, 4, INA_DTYPE_F32, g_size, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(last_error_has("send", "peer"));
  CHECK(ina_comm_recv(c, y, 4, INA_DTYPE_F32, -1, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_comm_all_to_all_v(c, x, NULL, NULL, y, counts, NULL, INA_DTYPE_F32, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_comm_barrier(NULL, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_comm_destroy(NULL);
  CHECK(!ina_comm_is_broken(c));
  CHECK(ina_comm_backend(c) == INA_COMM_BACKEND_MPI);
}

/* Collective errors that every rank hits alike. */
static void test_bootstrap_errors(ina_bootstrap_t *boot) {
  ina_comm_t *out = (ina_comm_t *)1;
  CHECK(ina_bootstrap_world_comm(NULL, INA_COMM_BACKEND_MPI, &out) == INA_ERR_INVALID_ARGUMENT);
  out = (ina_comm_t *)1;
  CHECK(ina_bootstrap_world_comm(boot, (ina_comm_backend_t)7, &out) == INA_ERR_INVALID_ARGUMENT);
  CHECK(out == NULL);
  if (!ina_comm_have_nccl()) {
    out = (ina_comm_t *)1;
    CHECK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_NCCL, &out) == INA_ERR_UNSUPPORTED);
    CHECK(out == NULL);
  }
}

/* Mismatches across ranks: checked mode makes every rank fail instead of misbehaving. */
static void test_checked_mode(ina_bootstrap_t *boot, uint64_t seed) {
  setenv("INA_COMM_CHECK", "1", 1);
  ina_comm_t *c = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &c));
  unsetenv("INA_COMM_CHECK");
  if (!c) return;
  float x[8] = {0}, y[8 * 4];
  size_t n = g_rank == g_size - 1 ? 5 : 4;
  CHECK(ina_comm_all_reduce(c, x, y, n, INA_DTYPE_F32, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(last_error_has("all_reduce", "checked mode"));
  uint16_t xb[8] = {0};
  CHECK(ina_comm_all_gather(c, g_rank == 0 ? (void *)xb : (void *)x, y, 4,
                            g_rank == 0 ? INA_DTYPE_BF16 : INA_DTYPE_F32, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(last_error_has("dtype", "checked mode"));
  CHECK_OK(ina_comm_barrier(c, NULL));
  CHECK(ina_comm_all_reduce(c, x, y, 4, INA_DTYPE_F32, NULL) == INA_OK);
  /* all-to-all whose receive counts disagree with the senders on one rank */
  size_t sc[4], rc[4];
  for (int p = 0; p < g_size; p++) sc[p] = rc[p] = 1;
  if (g_rank == 0) rc[g_size - 1] = 2;
  CHECK(ina_comm_all_to_all_v(c, x, sc, NULL, y, rc, NULL, INA_DTYPE_F32, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(last_error_has("all_to_all_v", "checked mode"));
  CHECK(!ina_comm_is_broken(c));
  test_all_to_all_v(c, seed, 77, 9, 1); /* a correct call still works in checked mode */
  ina_comm_destroy(c);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) {
    fprintf(stderr, "bootstrap failed: %s\n", ina_last_error());
    return 1;
  }
  ina_comm_t *c = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &c));
  g_rank = ina_comm_rank(c);
  g_size = ina_comm_size(c);
  uint64_t seed = comm_test_seed("test_comm");
  CHECK(g_size <= 4); /* the fixed arrays of the error tests */

  const size_t sizes[] = {0, 1, 7, 1001, (size_t)1 << 20};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    test_all_reduce(c, seed, sizes[k], INA_DTYPE_F32, 0);
    test_all_reduce(c, seed, sizes[k], INA_DTYPE_BF16, 0);
  }
  test_all_reduce(c, seed, 4097, INA_DTYPE_F32, 1);
  test_all_reduce(c, seed, 4097, INA_DTYPE_BF16, 1);
  const size_t gather_sizes[] = {0, 1, 13, 65536};
  for (size_t k = 0; k < sizeof gather_sizes / sizeof gather_sizes[0]; k++) {
    test_all_gather(c, seed, gather_sizes[k], INA_DTYPE_F32);
    test_all_gather(c, seed, gather_sizes[k], INA_DTYPE_BF16);
    test_reduce_scatter(c, seed, gather_sizes[k], INA_DTYPE_F32);
    test_reduce_scatter(c, seed, gather_sizes[k], INA_DTYPE_BF16);
  }
  for (uint64_t s = 0; s < 6; s++) test_all_to_all_v(c, seed, 400 + s, s < 3 ? 5 : 3000, (int)(s & 1));
  test_point_to_point(c, seed);
  ina_log_set_quiet_errors(1);
  test_broadcast(c, seed);
  ina_log_set_quiet_errors(0);
  test_layout(boot);

  ina_log_set_quiet_errors(1);
  test_argument_errors(c);
  test_bootstrap_errors(boot);
  test_checked_mode(boot, seed);
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_comm_barrier(c, NULL));

  /* Failures anywhere fail the job: the verdict is summed over ranks. */
  int failed = test_checks_failed_, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  char name[64];
  snprintf(name, sizeof name, "test_comm rank %d/%d", g_rank, g_size);
  int rc = test_finish(name);
  ina_comm_destroy(c);
  ina_bootstrap_finalize(boot);
  return rc || any ? 1 : 0;
}
