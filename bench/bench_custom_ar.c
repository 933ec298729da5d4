/* The custom all-reduce (comm/custom_ar.h) against NCCL on the GPUs of one node, under
 * mpirun with one rank per GPU (e.g. `mpirun -np 2 build/bench/bench_custom_ar`).
 *
 * 0. The floor: an empty kernel of the all-reduce's grid, timed the same way (graph of 200).
 * 1. Plain all-reduce of 8 KiB .. 256 MiB (bytes of bf16 input per rank): custom LL (up to
 *    1 MiB), one-shot, two-shot, FP8 two-shot (bf16 in and out, e4m3 on the wire) and NCCL
 *    bf16. Each
 *    is captured as a CUDA graph of L back-to-back all-reduces (L from 2 to 200, so a
 *    replay moves about 256 MiB) and the graph is replayed: the figure is the median over
 *    15 replays of (replay time / L), the slowest rank's median. Figures:
 *      latency  microseconds per all-reduce
 *      busbw    2 (n-1)/n x bytes / time (nccl-tests' bus bandwidth; the FP8 mode counts
 *               its bf16 bytes, so it can exceed the link)
 *      vs_nccl  NCCL's time / this time at the same size
 *    The custom runs read their input from the registered input buffer (zero-copy); NCCL
 *    reads an ordinary buffer. The same buffers are reused, so inputs below the L2 size
 *    can stay cached on both sides (as a producer's output would be).
 * 2. Fused epilogue, [tokens, 7168] bf16: all-reduce + residual add + RMSNorm + FP8
 *    quantization of the normalized rows in one kernel (AUTO algorithm, bf16 and FP8
 *    transport) against the same all-reduce followed by ina_gpu_rmsnorm, and against NCCL
 *    followed by ina_gpu_rmsnorm; timed the same way (graphs of L steps).
 *
 * --nccl-eager times NCCL as `L` eager launches per timed batch instead of a graph replay
 * (for a machine where capturing NCCL misbehaves); the custom runs are always replayed.
 *
 * Checks, before timing: every rank's input (random bf16, never zero) is gathered on every
 * rank, and the sum over the ranks is formed by the CPU model the unit tests use
 * (tests/comm/custom_ar_model.h) for the whole buffer. Every timed operation, at every
 * size and token count, first runs once into outputs poisoned with NaN (the epilogue on a
 * fresh random residual) and every rank compares its whole result with it (error model and
 * bounds: bench/bench_custom_ar_check.h): the custom all-reduce bit for bit, NCCL within
 * relative L2 1e-2 of the exact sum; the epilogue's residual bit for bit, its normalized
 * rows within (2^-8 + 1e-5) |y| of the fp64 norm per element, its FP8 rows bit for bit
 * the quantization of those rows (after an NCCL sum: residual and rows within relative L2
 * 1e-2). The ranks agree on the outcome; a failed check prints the case, the rank and the
 * error, no figure for the case (nor ratios that need it), and makes every rank exit 1.
 *
 * Exit 0 on success, 1 when a check failed, 77 without a device or with a single rank. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_custom_ar_check.h"
#include "bench/bench_util.h"
#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "comm/custom_ar.h"
#include "core/cuda.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "gpu_ops/gpu_ops.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#define HIDDEN 7168
#define MAX_BYTES ((size_t)256 << 20)
#define TARGET_BYTES_PER_REPLAY ((double)(256 << 20))
#define MIN_REPS 2
#define MAX_REPS 200
#define GATHER_CHUNK ((size_t)64 << 20)

static int g_rank, g_nranks;
static int g_nccl_eager;
static ina_bootstrap_t *g_boot;
/* The checks: the model of every rank's input, a stream, host buffers for read-back, and
 * the cases checked / failed (agreed by every rank). */
static ina_bench_ar_ref_t g_ref;
static cudaStream_t g_check_stream;
static uint16_t *g_host_out;
static int g_cases_checked, g_cases_failed;

/* Benchmarks may end the job: a failure on one rank would leave the others waiting. */
static void die(const char *what) {
  fprintf(stderr, "bench_custom_ar rank %d: %s: %s\n", g_rank, what, ina_last_error());
  ina_bootstrap_abort(g_boot, 1);
}

static void cuda_or_die(cudaError_t e, const char *what) {
  if (e != cudaSuccess) {
    fprintf(stderr, "bench_custom_ar rank %d: %s: %s\n", g_rank, what, cudaGetErrorString(e));
    ina_bootstrap_abort(g_boot, 1);
  }
}

/* ---- operations to time: each enqueues one step on a stream ------------------------------ */

typedef ina_status_t (*op_fn)(void *ctx, void *stream);

typedef struct {
  ina_custom_ar_t *ar;
  ina_custom_ar_args_t args;
} car_op_t;

static ina_status_t car_op(void *ctx, void *stream) {
  car_op_t *c = ctx;
  ina_custom_ar_args_t a = c->args;
  a.stream = stream;
  return ina_custom_ar_run(c->ar, &a);
}

typedef struct {
  ina_comm_t *comm;
  const void *in;
  void *out;
  size_t count;
} nccl_op_t;

static ina_status_t nccl_op(void *ctx, void *stream) {
  nccl_op_t *c = ctx;
  return ina_comm_all_reduce(c->comm, c->in, c->out, c->count, INA_DTYPE_BF16, stream);
}

/* An all-reduce (custom or NCCL) and then the separate norm kernel. */
typedef struct {
  op_fn reduce;
  void *reduce_ctx;
  ina_gpu_rmsnorm_params_t norm;
} unfused_op_t;

static ina_status_t unfused_op(void *ctx, void *stream) {
  unfused_op_t *c = ctx;
  ina_status_t st = c->reduce(c->reduce_ctx, stream);
  return st != INA_OK ? st : ina_gpu_rmsnorm(&c->norm, stream);
}

typedef struct {
  op_fn op;
  void *ctx;
} op_call_t;

static ina_status_t enqueue_op(void *ctx, int64_t iteration, void *stream) {
  (void)iteration;
  op_call_t *e = ctx;
  return e->op(e->ctx, stream);
}

/* As time_op, without a graph: `reps` eager launches per timed batch. Collective. */
static double time_op_eager(op_fn op, void *ctx, int reps) {
  op_call_t e = {op, ctx};
  ina_bench_timing_t timing = {3, 15, reps};
  double ms = 0, slowest = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  if (ina_bench_time_ms(enqueue_op, &e, &timing, &ms) != INA_OK) die("timing (eager)");
  MPI_Allreduce(&ms, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

/* Milliseconds per step: `reps` steps captured in one graph, replayed; the slowest rank's
 * median. Collective. */
static double time_op(op_fn op, void *ctx, int reps) {
  cudaStream_t cap = NULL;
  op_call_t step = {op, ctx};
  ina_bench_timing_t timing = {3, 15, 1};
  double ms = 0, slowest = 0;
  cuda_or_die(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking), "stream");
  if (op(ctx, cap) != INA_OK) die("warm-up run"); /* first use outside the graph */
  cuda_or_die(cudaStreamSynchronize(cap), "warm-up sync");
  MPI_Barrier(MPI_COMM_WORLD);
  if (ina_bench_time_graph_ms(enqueue_op, &step, reps, &timing, cap, &ms) != INA_OK)
    die("timing");
  MPI_Allreduce(&ms, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  cudaStreamDestroy(cap);
  return slowest;
}

static int reps_for(double bytes) {
  const double r = TARGET_BYTES_PER_REPLAY / bytes;
  return r < MIN_REPS ? MIN_REPS : r > MAX_REPS ? MAX_REPS : (int)r;
}

static void size_label(size_t bytes, char *buf, size_t n) {
  if (bytes >= ((size_t)1 << 20)) snprintf(buf, n, "%zuMiB", bytes >> 20);
  else snprintf(buf, n, "%zuKiB", bytes >> 10);
}

/* Prints (rank 0) the latency, bus bandwidth and, when known, the ratio to NCCL. */
static void report(const char *variant, const char *label, size_t bytes, double ms, int reps,
                   double nccl_ms, int eager) {
  if (g_rank != 0) return;
  char name[96], formula[256];
  const double busbw = 2.0 * (g_nranks - 1) / g_nranks * (double)bytes / (ms * 1e-3) / 1e9;
  snprintf(name, sizeof name, "%s_%s_latency", variant, label);
  snprintf(formula, sizeof formula,
           "median over 15 %s of %d all-reduces of %zu bytes (time / %d), slowest of %d ranks",
           eager ? "batches of eager launches" : "replays of a graph", reps, bytes, reps, g_nranks);
  ina_bench_result(name, ms * 1e3, "us", formula);
  snprintf(name, sizeof name, "%s_%s_busbw", variant, label);
  snprintf(formula, sizeof formula, "2*(n-1)/n * %zu bytes / latency, n = %d", bytes, g_nranks);
  ina_bench_result(name, busbw, "GB/s", formula);
  if (nccl_ms > 0) {
    snprintf(name, sizeof name, "%s_%s_vs_nccl", variant, label);
    ina_bench_result(name, nccl_ms / ms, "x", "NCCL latency / this latency, same size");
  }
}

/* ---- checks ------------------------------------------------------------------------------ */

/* Every rank's check of one case -> whether every rank passed. Collective. */
static int agree(int ok) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  g_cases_checked++;
  if (!all) {
    g_cases_failed++;
    if (g_rank == 0 && ok)
      fprintf(stderr, "check failed on another rank (see its message): no figure for this case\n");
  }
  return all;
}

static void case_name(char *buf, size_t n, const char *variant, const char *label) {
  if (g_nranks > 1 && g_rank != 0) snprintf(buf, n, "%s_%s(rank_%d)", variant, label, g_rank);
  else snprintf(buf, n, "%s_%s", variant, label);
}

/* Every rank's input (d_in, max_bytes) on every rank, in the all-reduce's rank order (the
 * order of its sum), and the model of their sum. Collective. */
static void make_reference(const ina_comm_t *comm, const uint16_t *d_in, size_t count,
                           uint16_t **all) {
  const size_t bytes = count * 2;
  int order[INA_BENCH_AR_MAX_RANKS], mine = ina_comm_rank(comm);
  MPI_Allgather(&mine, 1, MPI_INT, order, 1, MPI_INT, MPI_COMM_WORLD);
  for (int r = 0; r < g_nranks; r++) {
    if (order[r] < 0 || order[r] >= g_nranks) die("the communicator's rank order");
    all[order[r]] = malloc(bytes);
    if (!all[order[r]]) die("host memory for the inputs");
  }
  cuda_or_die(cudaMemcpy(all[mine], d_in, bytes, cudaMemcpyDeviceToHost), "copy input");
  for (int r = 0; r < g_nranks; r++) /* world rank r holds the input of position order[r] */
    for (size_t off = 0; off < bytes; off += GATHER_CHUNK) {
      const size_t len = bytes - off < GATHER_CHUNK ? bytes - off : GATHER_CHUNK;
      MPI_Bcast((uint8_t *)all[order[r]] + off, (int)len, MPI_BYTE, r, MPI_COMM_WORLD);
    }
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const int local = ina_bootstrap_local_size(g_boot);
  int threads = (int)(cpus / (local > 0 ? local : 1));
  ina_threadpool_t *pool = NULL;
  if (ina_threadpool_create(threads > 0 ? threads : 1, &pool) != INA_OK) die("thread pool");
  const double t0 = ina_bench_now_s();
  if (ina_bench_ar_ref_init(&g_ref, g_nranks, (const uint16_t *const *)all, count, pool) != INA_OK)
    die("the CPU model of the sums");
  ina_threadpool_destroy(pool);
  if (g_rank == 0)
    printf("reference: the CPU model of %zu elements x %d ranks, bf16 and fp8, %.1f s on %d "
           "threads per rank\n",
           count, g_nranks, ina_bench_now_s() - t0, threads > 0 ? threads : 1);
  g_host_out = malloc(bytes);
  if (!g_host_out) die("host memory for the outputs");
  cuda_or_die(cudaStreamCreateWithFlags(&g_check_stream, cudaStreamNonBlocking), "stream");
}

/* One run of a plain all-reduce into a poisoned out, against the model (or the exact sum
 * for NCCL). Collective; returns whether every rank passed. */
static int check_sum(const char *variant, const char *label, op_fn op, void *ctx, uint16_t *d_out,
                     size_t count, int fp8, int nccl) {
  char what[128];
  case_name(what, sizeof what, variant, label);
  cuda_or_die(cudaMemsetAsync(d_out, 0xFF, count * 2, g_check_stream), "poison");
  if (op(ctx, g_check_stream) != INA_OK) die("check run");
  cuda_or_die(cudaStreamSynchronize(g_check_stream), "check run");
  cuda_or_die(cudaMemcpy(g_host_out, d_out, count * 2, cudaMemcpyDeviceToHost), "read back");
  return agree(ina_bench_ar_check_sum(what, &g_ref, fp8, nccl, g_host_out, count));
}

/* ---- 0. floor ---------------------------------------------------------------------------- */

typedef struct {
  int blocks;
} empty_op_t;

static ina_status_t empty_op(void *ctx, void *stream) {
  return ina_bench_launch_empty(((empty_op_t *)ctx)->blocks, 512, stream);
}

static void bench_floor(void) {
  empty_op_t e = {0};
  cuda_or_die(cudaDeviceGetAttribute(&e.blocks, cudaDevAttrMultiProcessorCount,
                                     ina_bootstrap_device(g_boot)),
              "SM count");
  const double ms = time_op(empty_op, &e, MAX_REPS);
  if (g_rank == 0) {
    char formula[160];
    snprintf(formula, sizeof formula,
             "empty kernel of %d x 512 threads: median over 15 replays of a graph of %d, / %d",
             e.blocks, MAX_REPS, MAX_REPS);
    ina_bench_result("floor_empty_kernel_latency", ms * 1e3, "us", formula);
  }
}

/* ---- 1. plain all-reduce ----------------------------------------------------------------- */

static void bench_sizes(ina_custom_ar_t *ar, ina_comm_t *nccl, uint16_t *d_in, uint16_t *d_out) {
  size_t cap = 0;
  uint16_t *reg = ina_custom_ar_input_buffer(ar, &cap);
  for (size_t bytes = (size_t)8 << 10; bytes <= MAX_BYTES; bytes *= 2) {
    const size_t count = bytes / 2;
    const int reps = reps_for((double)bytes);
    char label[32];
    size_label(bytes, label, sizeof label);
    double nccl_ms = 0;
    if (nccl) {
      nccl_op_t n = {nccl, d_in, d_out, count};
      if (check_sum("nccl_bf16", label, nccl_op, &n, d_out, count, 0, 1)) {
        nccl_ms = g_nccl_eager ? time_op_eager(nccl_op, &n, reps) : time_op(nccl_op, &n, reps);
        report("nccl_bf16", label, bytes, nccl_ms, reps, 0, g_nccl_eager);
      }
    }
    if (!reg) continue;
    static const struct {
      const char *name;
      ina_custom_ar_mode_t mode;
      ina_custom_ar_algo_t algo;
    } variants[] = {
        {"custom_bf16_ll", INA_CUSTOM_AR_BF16, INA_CUSTOM_AR_LL},
        {"custom_bf16_oneshot", INA_CUSTOM_AR_BF16, INA_CUSTOM_AR_ONE_SHOT},
        {"custom_bf16_twoshot", INA_CUSTOM_AR_BF16, INA_CUSTOM_AR_TWO_SHOT},
        {"custom_fp8_twoshot", INA_CUSTOM_AR_FP8, INA_CUSTOM_AR_TWO_SHOT},
    };
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
      car_op_t c = {ar, INA_CUSTOM_AR_ARGS_INIT};
      c.args.mode = variants[v].mode;
      c.args.algo = variants[v].algo;
      c.args.count = count;
      c.args.in = reg;
      c.args.out = d_out;
      ina_custom_ar_algo_t taken = INA_CUSTOM_AR_AUTO;
      if (ina_custom_ar_choose(ar, c.args.mode, c.args.algo, count, 0, 0, &taken) != INA_OK ||
          taken != variants[v].algo)
        continue; /* does not fit: it would be NCCL again */
      if (!check_sum(variants[v].name, label, car_op, &c, d_out, count,
                     variants[v].mode == INA_CUSTOM_AR_FP8, 0))
        continue;
      report(variants[v].name, label, bytes, time_op(car_op, &c, reps), reps, nccl_ms, 0);
    }
  }
}

/* ---- 2. fused epilogue ------------------------------------------------------------------- */

typedef struct {
  uint16_t *in, *out, *residual, *weight, *tmp;
  uint8_t *y_fp8;
  float *y_scale;
  /* host: the weight, and the read-back residual (before, after), y and fp8 rows */
  uint16_t *h_weight, *h_res_before, *h_res_after, *h_y;
  uint8_t *h_fp8;
  float *h_scale;
} epi_buffers_t;

/* One step of an epilogue variant on a fresh random residual (the same on every rank, as
 * tensor parallelism replicates it) into poisoned outputs, against the model. Collective;
 * returns whether every rank passed. */
static int check_epilogue(const char *variant, int64_t rows, op_fn op, void *ctx,
                          const epi_buffers_t *b, int fp8, int nccl, float eps) {
  const size_t count = (size_t)rows * HIDDEN, scales = count / 128;
  char what[128], label[32];
  snprintf(label, sizeof label, "%lldtok", (long long)rows);
  case_name(what, sizeof what, variant, label);
  if (ina_bench_fill_random_bf16(b->residual, count, 0xBEEull + (uint64_t)rows, 1.0f) != INA_OK)
    die("fill");
  cuda_or_die(cudaMemcpy(b->h_res_before, b->residual, count * 2, cudaMemcpyDeviceToHost), "copy");
  cuda_or_die(cudaMemset(b->out, 0xFF, count * 2), "poison");
  cuda_or_die(cudaMemset(b->tmp, 0xFF, count * 2), "poison");
  cuda_or_die(cudaMemset(b->y_fp8, 0xFF, count), "poison");
  cuda_or_die(cudaMemset(b->y_scale, 0xFF, scales * 4), "poison");
  cuda_or_die(cudaDeviceSynchronize(), "poison");
  if (op(ctx, g_check_stream) != INA_OK) die("check run");
  cuda_or_die(cudaStreamSynchronize(g_check_stream), "check run");
  cuda_or_die(cudaMemcpy(b->h_res_after, b->residual, count * 2, cudaMemcpyDeviceToHost), "copy");
  cuda_or_die(cudaMemcpy(b->h_y, b->out, count * 2, cudaMemcpyDeviceToHost), "copy");
  cuda_or_die(cudaMemcpy(b->h_fp8, b->y_fp8, count, cudaMemcpyDeviceToHost), "copy");
  cuda_or_die(cudaMemcpy(b->h_scale, b->y_scale, scales * 4, cudaMemcpyDeviceToHost), "copy");
  const ina_bench_ar_epilogue_t e = {.rows = rows,
                                     .cols = HIDDEN,
                                     .fp8 = fp8,
                                     .nccl = nccl,
                                     .residual_before = b->h_res_before,
                                     .residual_after = b->h_res_after,
                                     .weight = b->h_weight,
                                     .eps = eps,
                                     .y = b->h_y,
                                     .y_fp8 = b->h_fp8,
                                     .y_scale = b->h_scale};
  return agree(ina_bench_ar_check_epilogue(what, &g_ref, &e));
}

static void bench_epilogue(ina_custom_ar_t *ar, ina_comm_t *nccl, const epi_buffers_t *b) {
  static const int64_t tokens[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};
  size_t cap = 0;
  uint16_t *reg = ina_custom_ar_input_buffer(ar, &cap);
  if (!reg) return; /* no IPC path: the fused kernel would only follow NCCL */
  for (size_t k = 0; k < sizeof tokens / sizeof tokens[0]; k++) {
    const int64_t rows = tokens[k];
    const size_t count = (size_t)rows * HIDDEN, bytes = count * 2;
    const int reps = reps_for((double)bytes);
    char name[96], formula[256];
    ina_gpu_rmsnorm_params_t norm = INA_GPU_RMSNORM_PARAMS_INIT;
    norm.rows = rows;
    norm.cols = HIDDEN;
    norm.x = b->tmp;
    norm.residual = b->residual;
    norm.weight = b->weight;
    norm.y = b->out;
    norm.y_fp8 = b->y_fp8;
    norm.y_scale_inv = b->y_scale;

    car_op_t fused = {ar, INA_CUSTOM_AR_ARGS_INIT};
    fused.args.count = count;
    fused.args.in = reg;
    fused.args.out = b->out;
    fused.args.rows = rows;
    fused.args.cols = HIDDEN;
    fused.args.residual = b->residual;
    fused.args.norm_weight = b->weight;
    fused.args.y_fp8 = b->y_fp8;
    fused.args.y_scale_inv = b->y_scale;
    car_op_t plain = fused;
    plain.args.out = b->tmp;
    plain.args.rows = plain.args.cols = 0;
    plain.args.residual = NULL;
    plain.args.norm_weight = NULL;
    plain.args.y_fp8 = NULL;
    plain.args.y_scale_inv = NULL;
    unfused_op_t unfused = {car_op, &plain, norm};

    ina_custom_ar_algo_t taken = INA_CUSTOM_AR_AUTO, taken_fp8 = INA_CUSTOM_AR_AUTO;
    ina_custom_ar_algo_t taken_plain = INA_CUSTOM_AR_AUTO;
    (void)ina_custom_ar_choose(ar, INA_CUSTOM_AR_BF16, INA_CUSTOM_AR_AUTO, count, rows, HIDDEN,
                               &taken);
    (void)ina_custom_ar_choose(ar, INA_CUSTOM_AR_FP8, INA_CUSTOM_AR_AUTO, count, rows, HIDDEN,
                               &taken_fp8);
    (void)ina_custom_ar_choose(ar, INA_CUSTOM_AR_BF16, INA_CUSTOM_AR_AUTO, count, 0, 0,
                               &taken_plain);
    const float eps = fused.args.eps;
    /* 0: not measured (its check failed, or no NCCL). */
    double fused_ms = 0, unfused_ms = 0, fused_fp8_ms = 0, nccl_ms = 0;
    if (check_epilogue("fused_bf16", rows, car_op, &fused, b, 0, taken == INA_CUSTOM_AR_NCCL, eps))
      fused_ms = time_op(car_op, &fused, reps);
    if (check_epilogue("unfused_custom", rows, unfused_op, &unfused, b, 0,
                       taken_plain == INA_CUSTOM_AR_NCCL, norm.eps))
      unfused_ms = time_op(unfused_op, &unfused, reps);
    car_op_t fused_fp8 = fused;
    fused_fp8.args.mode = INA_CUSTOM_AR_FP8;
    if (check_epilogue("fused_fp8", rows, car_op, &fused_fp8, b, 1,
                       taken_fp8 == INA_CUSTOM_AR_NCCL, eps))
      fused_fp8_ms = time_op(car_op, &fused_fp8, reps);
    nccl_op_t n = {nccl, b->in, b->tmp, count};
    unfused_op_t nccl_unfused = {nccl_op, &n, norm};
    if (nccl && check_epilogue("unfused_nccl", rows, unfused_op, &nccl_unfused, b, 0, 1, norm.eps))
      nccl_ms = g_nccl_eager ? time_op_eager(unfused_op, &nccl_unfused, reps)
                             : time_op(unfused_op, &nccl_unfused, reps);

    if (g_rank != 0) continue;
    static const char *algo_names[] = {"auto", "one-shot", "two-shot", "nccl", "ll"};
    snprintf(formula, sizeof formula,
             "[%lld, %d] bf16: all-reduce (%s) + residual add + RMSNorm + fp8 1x128 output in one "
             "kernel; median of graph replays of %d steps, slowest rank",
             (long long)rows, HIDDEN, algo_names[taken], reps);
    snprintf(name, sizeof name, "fused_bf16_%lldtok_latency", (long long)rows);
    if (fused_ms > 0) ina_bench_result(name, fused_ms * 1e3, "us", formula);
    snprintf(name, sizeof name, "fused_fp8_%lldtok_latency", (long long)rows);
    if (fused_fp8_ms > 0)
      ina_bench_result(name, fused_fp8_ms * 1e3, "us",
                       "as fused_bf16 with the FP8 transport (two-shot)");
    snprintf(name, sizeof name, "unfused_custom_%lldtok_latency", (long long)rows);
    if (unfused_ms > 0)
      ina_bench_result(name, unfused_ms * 1e3, "us",
                       "the same custom all-reduce, then ina_gpu_rmsnorm (residual, y, fp8)");
    snprintf(name, sizeof name, "fused_bf16_%lldtok_speedup", (long long)rows);
    if (fused_ms > 0 && unfused_ms > 0)
      ina_bench_result(name, unfused_ms / fused_ms, "x",
                       "unfused_custom latency / fused_bf16 latency");
    if (nccl_ms > 0) {
      snprintf(name, sizeof name, "unfused_nccl_%lldtok_latency", (long long)rows);
      ina_bench_result(name, nccl_ms * 1e3, "us", "NCCL bf16 all-reduce, then ina_gpu_rmsnorm");
      snprintf(name, sizeof name, "fused_bf16_%lldtok_vs_nccl", (long long)rows);
      if (fused_ms > 0)
        ina_bench_result(name, nccl_ms / fused_ms, "x",
                         "unfused_nccl latency / fused_bf16 latency");
    }
  }
}

int main(int argc, char **argv) {
  if (ina_bootstrap_init(&argc, &argv, &g_boot) != INA_OK) return 1;
  for (int i = 1; i < argc; i++) g_nccl_eager |= strcmp(argv[i], "--nccl-eager") == 0;
  g_rank = ina_bootstrap_world_rank(g_boot);
  g_nranks = ina_bootstrap_world_size(g_boot);
  const int dev = ina_bootstrap_device(g_boot);
  if (dev < 0 || g_nranks < 2 || ina_bootstrap_local_size(g_boot) > ina_cuda_device_count()) {
    if (g_rank == 0)
      printf("bench_custom_ar: skipped (%s)\n",
             dev < 0 ? "no CUDA device" : g_nranks < 2 ? "needs mpirun with >= 2 ranks"
                                                       : "fewer GPUs than ranks on this node");
    ina_bootstrap_finalize(g_boot);
    return INA_BENCH_SKIP;
  }
  if (g_rank == 0) {
    char name[128];
    printf("device %s, %d ranks, NCCL timed %s\n", ina_cuda_device_name(dev, name, sizeof name),
           g_nranks, g_nccl_eager ? "eagerly (--nccl-eager)" : "as graph replays");
  }
  ina_comm_t *comm = NULL;
  const int have_nccl = ina_comm_have_nccl();
  if (ina_bootstrap_node_comm(g_boot, have_nccl ? INA_COMM_BACKEND_NCCL : INA_COMM_BACKEND_MPI,
                              &comm) != INA_OK)
    die("node communicator");
  ina_custom_ar_config_t cfg = INA_CUSTOM_AR_CONFIG_INIT;
  cfg.max_bytes = MAX_BYTES;
  ina_custom_ar_t *ar = NULL;
  if (ina_custom_ar_create(comm, &cfg, &ar) != INA_OK) die("ina_custom_ar_create");
  if (g_rank == 0 && !ina_custom_ar_peer_access(ar))
    printf("bench_custom_ar: no peer access between the GPUs: only NCCL figures\n");

  uint16_t *d_in = NULL, *d_out = NULL;
  size_t cap = 0;
  uint16_t *reg = ina_custom_ar_input_buffer(ar, &cap);
  cuda_or_die(cudaMalloc((void **)&d_in, MAX_BYTES), "cudaMalloc");
  cuda_or_die(cudaMalloc((void **)&d_out, MAX_BYTES), "cudaMalloc");
  if (ina_bench_fill_random_bf16(d_in, MAX_BYTES / 2, 0xA11ull + (uint64_t)g_rank, 1.0f) != INA_OK)
    die("fill");
  if (reg) cuda_or_die(cudaMemcpy(reg, d_in, MAX_BYTES, cudaMemcpyDeviceToDevice), "copy");
  ina_comm_t *nccl = have_nccl ? comm : NULL;
  if (g_rank != 0) ina_bench_check_set_quiet(1); /* rank 0 prints the passes, all the failures */
  uint16_t *inputs[INA_BENCH_AR_MAX_RANKS] = {NULL};
  if (g_nranks > INA_BENCH_AR_MAX_RANKS || ina_comm_size(comm) != g_nranks)
    die("the checks need every rank on one node, at most 8");
  make_reference(comm, d_in, MAX_BYTES / 2, inputs);

  bench_floor();
  bench_sizes(ar, nccl, d_in, d_out);

  epi_buffers_t b = {0};
  const size_t max_rows = 4096, elems = max_rows * HIDDEN;
  b.in = d_in;
  b.out = d_out;
  cuda_or_die(cudaMalloc((void **)&b.residual, elems * 2), "cudaMalloc");
  cuda_or_die(cudaMalloc((void **)&b.tmp, elems * 2), "cudaMalloc");
  cuda_or_die(cudaMalloc((void **)&b.weight, HIDDEN * 2), "cudaMalloc");
  cuda_or_die(cudaMalloc((void **)&b.y_fp8, elems), "cudaMalloc");
  cuda_or_die(cudaMalloc((void **)&b.y_scale, elems / 128 * 4), "cudaMalloc");
  if (ina_bench_fill_random_bf16(b.residual, elems, 0xBEEull, 1.0f) != INA_OK ||
      ina_bench_fill_random_bf16(b.weight, HIDDEN, 0x5EEDull, 1.0f) != INA_OK)
    die("fill");
  b.h_weight = malloc(HIDDEN * 2);
  b.h_res_before = malloc(elems * 2);
  b.h_res_after = malloc(elems * 2);
  b.h_y = malloc(elems * 2);
  b.h_fp8 = malloc(elems);
  b.h_scale = malloc(elems / 128 * 4);
  if (!b.h_weight || !b.h_res_before || !b.h_res_after || !b.h_y || !b.h_fp8 || !b.h_scale)
    die("host memory for the checks");
  cuda_or_die(cudaMemcpy(b.h_weight, b.weight, HIDDEN * 2, cudaMemcpyDeviceToHost), "copy");
  bench_epilogue(ar, nccl, &b);

  if (g_rank == 0) ina_bench_print_json("custom_ar");
  if (g_rank == 0)
    printf("checks: %d of %d cases passed on every rank%s\n", g_cases_checked - g_cases_failed,
           g_cases_checked, g_cases_failed ? "; the failed cases have no figures" : "");
  const int rc = g_cases_failed ? 1 : 0;
  free(b.h_weight), free(b.h_res_before), free(b.h_res_after), free(b.h_y), free(b.h_fp8),
      free(b.h_scale);
  ina_bench_ar_ref_free(&g_ref);
  for (int r = 0; r < g_nranks; r++) free(inputs[r]);
  free(g_host_out);
  cudaStreamDestroy(g_check_stream);
  cudaFree(b.residual);
  cudaFree(b.tmp);
  cudaFree(b.weight);
  cudaFree(b.y_fp8);
  cudaFree(b.y_scale);
  cudaFree(d_in);
  cudaFree(d_out);
  ina_custom_ar_destroy(ar);
  ina_comm_destroy(comm);
  ina_bootstrap_finalize(g_boot);
  return rc;
}
