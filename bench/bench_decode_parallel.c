/* Decode steps of the CUDA engine (model/model.h) spread over the GPUs of an mpirun job,
 * one rank per GPU: tensor parallelism (--tp), expert parallelism (--ep) and attention
 * data parallelism (--dp), on DeepSeek-V3 shapes with random weights by default.
 *
 * Layout. model/parallel_job.h forms the groups as `ina generate` does: consecutive ranks
 * make tensor-parallel groups of T; with --ep the groups split the routed experts, and
 * the ranks holding the same tensor slice form the expert-parallel communicator (NCCL).
 * --dp (with --ep) runs the engine with attention_dp = 2: every rank passes the same
 * batch and each sequence is computed by the expert-parallel rank of its stripe of the
 * page pool (its first page id mod ranks). The sequences' stripes are picked so that no
 * rank computes more than ceil(batch / ranks) of them (reported as dp_max_sequences).
 *
 * Decode, as bench/bench_decode.c does it on one GPU, for each batch: every rank builds
 * the same `batch` sequences (same seed), grown to context - 1 cached positions through
 * the engine's page pool without running the model (the bytes a step reads do not
 * depend on the cached values), then runs steps of one random token per sequence
 * through ina_engine_forward, truncating every sequence back by one token after each
 * step, so every step attends exactly `context` positions. 3 warm-up steps (the first
 * captures the batch bucket's CUDA graph), then --steps timed ones.
 *   rank step time = wall time of one ina_engine_forward call on that rank (host
 *                    bookkeeping, graph replay with its collectives, the logits
 *                    [batch, vocab] f32 into pinned host memory; the call returns
 *                    synchronized).
 *   step time      = median over the timed steps of the maximum over ranks of the rank
 *                    step times (a step is done when its slowest rank is).
 *   tokens/s       = batch / step time.
 * With --token-steps the steps call ina_engine_forward_greedy: each row's greedy token is
 * chosen on the device and only the tokens reach the host (the layout's name ends in
 * ",tokens").
 * Step split (engine option step_split): the device time of the timed steps by part
 * (ina_engine_step_split_t: attention, moe, ep_comm, tp_comm, other), as per-step means
 * in ms = part sum / steps timed, for rank 0 and as the maximum over ranks of each part;
 * `sum` is the parts' total (rank 0; the maximum over ranks of each rank's total).
 * Reported as unavailable while the engine does not provide it.
 *
 * Greedy check (--greedy P,G): P prompts of seeded random lengths 4..32 and random token
 * ids generate G tokens each (greedy, EOS ignored) as one batch through ina_generate.
 *   greedy_tokens_hash = FNV-1a 64 over the little-endian int32 bytes of every generated
 *                        token, prompt 0 first.
 * Every rank must get rank 0's hash. The same hash from two layouts means the same
 * tokens (tensor parallelism sums partial outputs in another order than one GPU, so it
 * may differ from one GPU's by rounding).
 *
 * Usage: mpirun -np N bench_decode_parallel [--model SPEC] [--dtype bf16|fp8] [--tp T]
 *            [--ep [E]] [--dp] [--batch 1,64,256] [--context 1024] [--steps 20]
 *            [--page-size 64] [--greedy P,G] [--seed S] [--no-cuda-graphs] [--help]
 * Rank 0 prints progress on stderr; figures (`name value unit formula`, the layout in
 * every name), the greedy hash, one JSON line and a summary table on stdout. Exit 77
 * without a CUDA device (every rank), 2 for bad options or a layout the ranks cannot
 * take, 1 when a shape failed (a step error, non-finite logits, a step split error,
 * ranks' hashes differ). A step error on any rank ends the whole job (MPI_Abort, code
 * 1) after the report: its collectives may be out of step with the other ranks'. */
#define INA_LOG_SUBSYS "bench"
#include <cuda_runtime_api.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/bench_util.h"
#include "comm/comm.h"
#include "core/check.h"
#include "core/cuda.h"
#include "core/log.h"
#include "kvcache/kv_seq.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/parallel_job.h"

#define PROGRAM "bench_decode_parallel"
#define DEFAULT_MODEL "random:v3-layers"
#define WARMUP_STEPS 3 /* the first captures the bucket's graph */
#define MAX_LIST 8
#define MAX_BATCH 4096
#define WEIGHT_SEED 0x5EEDull /* every rank opens the same model */
#define GREEDY_MIN_PROMPT 4
#define GREEDY_MAX_PROMPT 32
#define GREEDY_SHOWN 8 /* tokens of prompt 0 printed */
#define NUM_PARTS 5
#define MAX_FIGURES 256

static const char *const k_part_names[NUM_PARTS] = {"attention", "moe", "ep_comm", "tp_comm", "other"};

typedef struct options {
  const char *model;
  ina_dtype_t dtype;
  const char *dtype_name;
  int64_t tp;
  int32_t ep; /* INA_PARALLEL_EP_NONE, INA_PARALLEL_EP_ALL or a degree */
  int dp;
  int64_t batch[MAX_LIST];
  int num_batch;
  int64_t context, page_size;
  int steps;
  int32_t greedy_prompts, greedy_tokens; /* prompts 0: no greedy check */
  uint64_t seed;
  int cuda_graphs;
  int token_steps; /* steps return greedy tokens (ina_engine_forward_greedy), not logits */
} options_t;

/* What a shape's run on one rank sends to the others: int64 values, times in ns. */
enum {
  REC_STATUS,      /* shape_status_t */
  REC_SPLIT,       /* split_state_t */
  REC_PARTS,       /* NUM_PARTS per-step means of the step split */
  REC_STEPS = REC_PARTS + NUM_PARTS /* then one wall time per timed step */
};

/* SHAPE_FAILED: a check failed, the ranks still in step; SHAPE_STEP_ERROR: a step failed
 * on a rank, whose collectives may now be out of step with the others'. */
typedef enum { SHAPE_OK = 0, SHAPE_FAILED = 1, SHAPE_STEP_ERROR = 2 } shape_status_t;
typedef enum { SPLIT_OK = 0, SPLIT_UNAVAILABLE = 1, SPLIT_ERROR = 2 } split_state_t;

typedef struct shape_result {
  int64_t batch;
  shape_status_t status; /* the worst over ranks */
  double step_ms, rank0_ms;
  int32_t dp_max_sequences; /* --dp: the most sequences one rank computes */
  split_state_t split;      /* the worst over ranks */
  double split_rank0[NUM_PARTS + 1], split_max[NUM_PARTS + 1]; /* ms per step; [NUM_PARTS] = sum */
} shape_result_t;

typedef struct greedy_result {
  int ran, ranks_agree;
  uint64_t hash;
  int32_t first[GREEDY_SHOWN];
  int32_t num_first;
} greedy_result_t;

/* The job, the options and the layout's name, shared by the reporting functions. */
typedef struct run {
  const options_t *o;
  ina_parallel_job_t *job;
  int32_t ep_size; /* ranks of the expert-parallel communicator (1 without --ep) */
  char layout[64]; /* "bf16,tp1,ep2,dp" (+ ",eager") */
  char split_reason[256]; /* rank 0's ina_last_error() when the split is unavailable */
  char device_name[128];
} run_t;

typedef struct figure {
  char name[128];
  double value;
  char unit[16];
  char formula[256];
} figure_t;

static double g_start;
static int g_rank;
static figure_t g_figures[MAX_FIGURES];
static int g_num_figures;

/* Rank 0 only: the ranks run in step, so one voice is enough. */
static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...) {
  va_list ap;
  if (g_rank != 0) return;
  fprintf(stderr, "[%s %7.1fs] ", PROGRAM, ina_bench_now_s() - g_start);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

/* Any rank: failures are reported where they happen, named by rank. */
static void rank_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void rank_error(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "%s: rank %d: ", PROGRAM, g_rank);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

/* Prints the figure (bench_util's format) and keeps it for this program's JSON line. */
static void figure(const char *name, double value, const char *unit, const char *formula) {
  ina_bench_result(name, value, unit, formula);
  if (g_num_figures == MAX_FIGURES) return;
  figure_t *f = &g_figures[g_num_figures++];
  snprintf(f->name, sizeof f->name, "%s", name);
  f->value = value;
  snprintf(f->unit, sizeof f->unit, "%s", unit);
  snprintf(f->formula, sizeof f->formula, "%s", formula);
}

/* Index of the first non-finite value of row[0..n), or -1. */
static int64_t first_non_finite(const float *row, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (!isfinite(row[i])) return i;
  return -1;
}

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* ---- options ------------------------------------------------------------------------ */

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpirun -np N %s [--model SPEC] [--dtype bf16|fp8] [--tp T] [--ep [E]] [--dp]\n"
          "           [--batch 1,64,256] [--context 1024] [--steps 20] [--page-size 64] [--greedy P,G]\n"
          "           [--seed S] [--no-cuda-graphs] [--token-steps] [--help]\n"
          "  decode tokens/s of the CUDA engine over the GPUs of an mpirun job (one rank per GPU),\n"
          "  the split of a step's device time, and a greedy-generation hash to compare layouts\n"
          "  --model SPEC      model (default %s: DeepSeek-V3 shapes, 4 layers, random weights)\n"
          "  --dtype D         random weights: bf16 (default) or fp8 (e4m3, 128x128 block scales)\n"
          "  --tp T            tensor parallelism over groups of T consecutive ranks (default 1)\n"
          "  --ep [E]          expert parallelism over the groups (E, when given, must be their number)\n"
          "  --dp              attention data parallelism over the expert-parallel ranks (needs --ep):\n"
          "                    every rank passes the whole batch, each computes its share of sequences\n"
          "  --batch LIST      sequences per step, 1..%d (default 1,64,256)\n"
          "  --context N       positions each step attends, >= 2 (default 1024)\n"
          "  --steps N         timed steps per batch after %d warm-up steps (default 20)\n"
          "  --page-size N     KV cache page size in tokens (default 64)\n"
          "  --greedy P,G      P prompts of random lengths %d..%d generate G tokens each, greedy;\n"
          "                    0 skips (default 8,32)\n"
          "  --seed S          seed of the tokens and prompts, the same on every rank (default 1)\n"
          "  --no-cuda-graphs  run decode steps eagerly (to compare with graph replay)\n"
          "  --token-steps     steps return each row's greedy token (ina_engine_forward_greedy) instead\n"
          "                    of the [batch, vocab] f32 logits, as a server with greedy requests runs\n"
          "  without --tp and --ep the job must have one rank (the one-GPU baseline)\n",
          PROGRAM, DEFAULT_MODEL, MAX_BATCH, WARMUP_STEPS, GREEDY_MIN_PROMPT, GREEDY_MAX_PROMPT);
}

/* A whole decimal number in [lo, hi]; 0 on success. */
static int parse_int(const char *text, int64_t lo, int64_t hi, int64_t *out) {
  char *end = NULL;
  const long long v = strtoll(text, &end, 10);
  if (end == text || *end || v < lo || v > hi) return 1;
  *out = v;
  return 0;
}

/* "P,G" (P, G >= 1) or "0"; 0 on success. */
static int parse_greedy(const char *text, int32_t *prompts, int32_t *tokens) {
  int64_t v[2];
  int n = 0;
  if (strcmp(text, "0") == 0) {
    *prompts = *tokens = 0;
    return 0;
  }
  if (ina_bench_parse_list(text, 1, 1 << 16, v, 2, &n) || n != 2) return 1;
  *prompts = (int32_t)v[0];
  *tokens = (int32_t)v[1];
  return 0;
}

static int parse_dtype(const char *text, options_t *o) {
  if (strcmp(text, "bf16") == 0) o->dtype = INA_DTYPE_BF16;
  else if (strcmp(text, "fp8") == 0) o->dtype = INA_DTYPE_FP8_E4M3;
  else return 1;
  o->dtype_name = strcmp(text, "bf16") == 0 ? "bf16" : "fp8";
  return 0;
}

/* 0: options parsed; else the exit code (0 after --help, 2 for a bad option). */
static int parse_options(int argc, char **argv, options_t *o) {
  enum { O_MODEL = 256, O_DTYPE, O_TP, O_EP, O_DP, O_BATCH, O_CONTEXT, O_STEPS, O_PAGE, O_GREEDY, O_SEED,
         O_NOGRAPHS, O_TOKENS };
  static const struct option opts[] = {
      {"model", required_argument, 0, O_MODEL},     {"dtype", required_argument, 0, O_DTYPE},
      {"tp", required_argument, 0, O_TP},           {"ep", optional_argument, 0, O_EP},
      {"dp", no_argument, 0, O_DP},                 {"batch", required_argument, 0, O_BATCH},
      {"context", required_argument, 0, O_CONTEXT}, {"steps", required_argument, 0, O_STEPS},
      {"page-size", required_argument, 0, O_PAGE},  {"greedy", required_argument, 0, O_GREEDY},
      {"seed", required_argument, 0, O_SEED},       {"no-cuda-graphs", no_argument, 0, O_NOGRAPHS},
      {"token-steps", no_argument, 0, O_TOKENS},    {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  int64_t v = 0;
  int c;
  memset(o, 0, sizeof *o);
  o->model = DEFAULT_MODEL;
  o->dtype = INA_DTYPE_BF16;
  o->dtype_name = "bf16";
  o->tp = 1;
  o->ep = INA_PARALLEL_EP_NONE;
  o->batch[0] = 1, o->batch[1] = 64, o->batch[2] = 256;
  o->num_batch = 3;
  o->context = 1024;
  o->page_size = 64;
  o->steps = 20;
  o->greedy_prompts = 8, o->greedy_tokens = 32;
  o->seed = 1;
  o->cuda_graphs = 1;
  optind = 1;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    const char *a = optarg;
    int bad = 0;
    switch (c) {
    case O_MODEL: o->model = a; break;
    case O_DTYPE: bad = parse_dtype(a, o); break;
    case O_TP: bad = parse_int(a, 1, 1024, &o->tp); break;
    case O_EP:
      if (ina_parallel_job_parse_ep(PROGRAM, a, argc, argv, &optind, &o->ep)) {
        usage(stderr);
        return 2;
      }
      break;
    case O_DP: o->dp = 1; break;
    case O_BATCH: bad = ina_bench_parse_list(a, 1, MAX_BATCH, o->batch, MAX_LIST, &o->num_batch); break;
    case O_CONTEXT: bad = parse_int(a, 2, INT32_MAX, &o->context); break;
    case O_STEPS:
      bad = parse_int(a, 1, 1 << 20, &v);
      o->steps = (int)v;
      break;
    case O_PAGE: bad = parse_int(a, 1, 1 << 16, &o->page_size); break;
    case O_GREEDY: bad = parse_greedy(a, &o->greedy_prompts, &o->greedy_tokens); break;
    case O_SEED:
      bad = parse_int(a, 0, INT64_MAX, &v);
      o->seed = (uint64_t)v;
      break;
    case O_NOGRAPHS: o->cuda_graphs = 0; break;
    case O_TOKENS: o->token_steps = 1; break;
    case 'h': usage(stdout); return -1;
    default: usage(stderr); return 2; /* getopt_long named the option */
    }
    if (bad) {
      const struct option *opt = opts;
      while (opt->val != c) opt++;
      fprintf(stderr, "%s: bad value '%s' for --%s\n", PROGRAM, a, opt->name);
      usage(stderr);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", PROGRAM, argv[optind]);
    usage(stderr);
    return 2;
  }
  if (o->dp && o->ep == INA_PARALLEL_EP_NONE) {
    fprintf(stderr, "%s: --dp splits the sequences over the expert-parallel ranks: it needs --ep\n", PROGRAM);
    usage(stderr);
    return 2;
  }
  return 0;
}

/* ---- collectives between the ranks --------------------------------------------------- */

/* all[r * count + i] = rank r's mine[i], over the job's world communicator (MPI, host
 * buffers). The exchange fails when a rank stopped answering (the communicator's
 * deadline): then the whole job ends here, as MPI_Finalize would wait for that rank. */
static void exchange(const ina_parallel_job_t *job, const int64_t *mine, int64_t *all, size_t count) {
  if (ina_comm_all_gather(job->world, mine, all, count, INA_DTYPE_I64, NULL) == INA_OK) return;
  rank_error("exchange with the other ranks failed (%s): ending the job", ina_last_error());
  ina_parallel_job_abort(job, 1);
}

/* 1 when every rank passed ok != 0; 0 when any did not. Ends the job when one hangs. */
static int every_rank(const ina_parallel_job_t *job, int ok) {
  const int64_t mine = ok != 0;
  int64_t *all = malloc((size_t)job->size * sizeof *all);
  int every = 1;
  if (!all) {
    rank_error("out of memory");
    ina_parallel_job_abort(job, 1);
  }
  exchange(job, &mine, all, 1);
  for (int32_t r = 0; r < job->size; r++) every &= all[r] != 0;
  free(all);
  return every;
}

/* ---- one batch ---------------------------------------------------------------------- */

/* `batch` sequences of context - 1 cached tokens. With attention DP the engine's page
 * pool has a stripe per rank and a sequence is computed by the rank of its stripe
 * (kvcache/page_pool.h), so sequence i is given stripe i % ranks: no rank computes more
 * than ceil(batch / ranks) of them. Without DP the pool has one stripe and the pick is
 * ignored. */
static ina_status_t grow_sequences(ina_page_pool_t *pool, ina_kv_seq_t *seqs, int64_t batch, int64_t context,
                                   int32_t ranks) {
  ina_status_t st = INA_OK;
  for (int64_t i = 0; i < batch; i++) {
    seqs[i].stripe_pick = 1 + (int32_t)(i % ranks);
    INA_CHECK(ina_kv_seq_append(pool, &seqs[i], context - 1));
  }
fail:
  return st;
}

/* --dp: the most sequences one expert-parallel rank computes (the rank of a sequence's
 * stripe: its first page mod ranks). */
static int32_t max_sequences_per_rank(const ina_kv_seq_t *seqs, int64_t batch, int32_t ranks) {
  int32_t *count = calloc((size_t)ranks, sizeof *count), most = 0;
  if (!count) return -1;
  for (int64_t i = 0; i < batch; i++) {
    const int32_t owner = seqs[i].num_pages > 0 ? seqs[i].pages[0] % ranks : 0;
    if (++count[owner] > most) most = count[owner];
  }
  free(count);
  return most;
}

/* Rows 0 and batch - 1 of the step's logits must be finite (with --dp the last comes from
 * another rank); they are poisoned again for the next step. */
static int check_rows(float *logits, int64_t batch, int32_t vocab, int step) {
  const int64_t rows[2] = {0, batch - 1};
  const int count = batch > 1 ? 2 : 1;
  int ok = 1;
  for (int k = 0; k < count && ok; k++) {
    const float *row = logits + rows[k] * vocab;
    const int64_t bad = first_non_finite(row, vocab);
    if (bad < 0) continue;
    rank_error("batch %" PRId64 " step %d: logit %" PRId64 " of row %" PRId64 " is %g", batch, step, bad, rows[k],
               (double)row[bad]);
    ok = 0;
  }
  for (int k = 0; k < count; k++) ina_bench_poison_nan(logits + rows[k] * vocab, vocab);
  return ok;
}

/* ina_engine_step_split without logging its error: INA_ERR_UNSUPPORTED is an expected
 * answer (reported once, as "unavailable"), and other errors are reported by the caller. */
static ina_status_t step_split(ina_engine_t *e, int reset, ina_engine_step_split_t *out) {
  ina_log_set_quiet_errors(1);
  const ina_status_t st = ina_engine_step_split(e, reset, out);
  ina_log_set_quiet_errors(0);
  return st;
}

/* Zeroes the split before the timed steps, so it covers them alone. INA_ERR_UNSUPPORTED
 * (reason kept) means the engine does not time its steps: SPLIT_UNAVAILABLE. */
static split_state_t reset_split(ina_engine_t *e, char *reason, size_t reason_size) {
  ina_engine_step_split_t s;
  const ina_status_t st = step_split(e, 1, &s);
  if (st == INA_OK) return SPLIT_OK;
  if (st == INA_ERR_UNSUPPORTED) {
    snprintf(reason, reason_size, "%s", ina_last_error());
    return SPLIT_UNAVAILABLE;
  }
  rank_error("step split reset: %s", ina_last_error());
  return SPLIT_ERROR;
}

/* Reads this rank's step split of the timed steps into rec[REC_SPLIT], rec[REC_PARTS..];
 * `state` is what reset_split said. */
static void read_split(ina_engine_t *e, split_state_t state, int64_t *rec, char *reason, size_t reason_size) {
  ina_engine_step_split_t s;
  memset(&s, 0, sizeof s);
  rec[REC_SPLIT] = state;
  if (state != SPLIT_OK) return;
  const ina_status_t st = step_split(e, 0, &s);
  if (st == INA_ERR_UNSUPPORTED) {
    snprintf(reason, reason_size, "%s", ina_last_error());
    return;
  }
  if (st != INA_OK || s.steps <= 0) {
    rank_error("step split: %s", st != INA_OK ? ina_last_error() : "no steps timed");
    rec[REC_SPLIT] = SPLIT_ERROR;
    return;
  }
  const double parts[NUM_PARTS] = {s.attention_ms, s.moe_ms, s.ep_comm_ms, s.tp_comm_ms, s.other_ms};
  for (int p = 0; p < NUM_PARTS; p++) rec[REC_PARTS + p] = llround(parts[p] / (double)s.steps * 1e6);
  rec[REC_SPLIT] = SPLIT_OK;
}

/* Grows `batch` sequences, runs the warm-up and timed steps, and fills this rank's record
 * (status, step split, step wall times). logits: pinned [batch, vocab]. The ranks step
 * together: after non-finite logits the steps go on (the others are waiting in the same
 * collectives); after a step error they stop. */
static void decode_shape(ina_engine_t *e, const run_t *run, int64_t batch, uint64_t *rng, float *logits,
                         int64_t *rec, int32_t *dp_max_sequences, char *reason, size_t reason_size) {
  const options_t *o = run->o;
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  const int32_t vocab = ina_engine_config(e)->vocab_size;
  ina_kv_seq_t *seqs = calloc((size_t)batch, sizeof *seqs);
  ina_kv_seq_t **seq_ptrs = calloc((size_t)batch, sizeof *seq_ptrs);
  int32_t *qo_indptr = malloc((size_t)(batch + 1) * sizeof *qo_indptr);
  int32_t *tokens = malloc((size_t)batch * sizeof *tokens), *chosen = malloc((size_t)batch * sizeof *chosen);
  split_state_t split = SPLIT_UNAVAILABLE;
  rec[REC_STATUS] = SHAPE_STEP_ERROR;
  rec[REC_SPLIT] = SPLIT_UNAVAILABLE;
  if (!seqs || !seq_ptrs || !qo_indptr || !tokens || !chosen) {
    rank_error("batch %" PRId64 ": out of memory", batch);
    goto done;
  }
  for (int64_t i = 0; i < batch; i++) {
    seq_ptrs[i] = &seqs[i];
    qo_indptr[i] = (int32_t)i;
  }
  qo_indptr[batch] = (int32_t)batch;
  if (grow_sequences(pool, seqs, batch, o->context, o->dp ? run->ep_size : 1) != INA_OK) {
    /* Page bookkeeping only, alike on every rank: no collective has run. */
    rank_error("batch %" PRId64 ": growing the sequences to %" PRId64 " tokens: %s", batch, o->context - 1,
               ina_last_error());
    rec[REC_STATUS] = SHAPE_FAILED;
    goto done;
  }
  *dp_max_sequences = o->dp ? max_sequences_per_rank(seqs, batch, run->ep_size) : 0;
  const ina_batch_t b = {(int32_t)batch, seq_ptrs, qo_indptr, tokens, 0};
  rec[REC_STATUS] = SHAPE_OK;
  for (int s = 0; s < WARMUP_STEPS + o->steps; s++) {
    const int timed = s - WARMUP_STEPS;
    if (timed == 0) {
      split = reset_split(e, reason, reason_size);
      ina_bench_poison_nan(logits, batch * vocab); /* the timed steps must write every row */
    }
    ina_bench_random_tokens(rng, vocab, tokens, batch);
    for (int64_t i = 0; i < batch; i++) chosen[i] = -2; /* no token: a row the step did not choose for */
    const double t0 = ina_bench_now_s();
    const ina_status_t st = o->token_steps ? ina_engine_forward_greedy(e, &b, chosen) : ina_engine_forward(e, &b, logits);
    const double t1 = ina_bench_now_s();
    if (st != INA_OK) {
      rank_error("batch %" PRId64 " %s step %d: %s", batch, timed < 0 ? "warm-up" : "timed", timed < 0 ? s : timed,
                 ina_last_error());
      rec[REC_STATUS] = SHAPE_STEP_ERROR;
      goto done;
    }
    for (int64_t i = 0; i < batch; i++) ina_kv_seq_truncate(pool, &seqs[i], 1);
    if (timed < 0) continue;
    rec[REC_STEPS + timed] = llround((t1 - t0) * 1e9);
    if (o->token_steps) {
      for (int64_t i = 0; i < batch; i++)
        if (chosen[i] < 0 || chosen[i] >= vocab) {
          rank_error("batch %" PRId64 " step %d: row %" PRId64 " chose token %d", batch, timed, i, chosen[i]);
          rec[REC_STATUS] = SHAPE_FAILED;
          break;
        }
      continue;
    }
    if (timed < o->steps - 1 && !check_rows(logits, batch, vocab, timed)) rec[REC_STATUS] = SHAPE_FAILED;
  }
  /* After the last step every row (the earlier steps' first and last rows were checked). */
  for (int64_t r = 0; !o->token_steps && r < batch; r++) {
    const int64_t bad = first_non_finite(logits + r * vocab, vocab);
    if (bad < 0) continue;
    rank_error("batch %" PRId64 " last step: logit %" PRId64 " of row %" PRId64 " is %g", batch, bad, r,
               (double)logits[r * vocab + bad]);
    rec[REC_STATUS] = SHAPE_FAILED;
    break;
  }
  read_split(e, split, rec, reason, reason_size);
  if (rec[REC_SPLIT] == SPLIT_ERROR) rec[REC_STATUS] = SHAPE_FAILED;
done:
  if (seqs)
    for (int64_t i = 0; i < batch; i++) ina_kv_seq_release(pool, &seqs[i]);
  free(seqs);
  free(seq_ptrs);
  free(qo_indptr);
  free(tokens);
  free(chosen);
}

/* Combines every rank's record (all: [ranks][REC_STEPS + steps]) into r. */
static void combine_records(const int64_t *all, int32_t ranks, int steps, shape_result_t *r) {
  const size_t n = (size_t)REC_STEPS + (size_t)steps;
  double *step_max = malloc((size_t)steps * sizeof *step_max), *rank0 = malloc((size_t)steps * sizeof *rank0);
  r->status = SHAPE_OK;
  r->split = SPLIT_OK;
  for (int32_t k = 0; k < ranks; k++) {
    const int64_t *rec = all + k * n;
    if (rec[REC_STATUS] > (int64_t)r->status) r->status = (shape_status_t)rec[REC_STATUS];
    if (rec[REC_SPLIT] > (int64_t)r->split) r->split = (split_state_t)rec[REC_SPLIT];
  }
  if (r->split == SPLIT_OK) {
    memset(r->split_max, 0, sizeof r->split_max);
    for (int32_t k = 0; k < ranks; k++) {
      const int64_t *rec = all + k * n;
      double sum = 0;
      for (int p = 0; p < NUM_PARTS; p++) {
        const double ms = (double)rec[REC_PARTS + p] * 1e-6;
        if (k == 0) r->split_rank0[p] = ms;
        if (ms > r->split_max[p]) r->split_max[p] = ms;
        sum += ms;
      }
      if (k == 0) r->split_rank0[NUM_PARTS] = sum;
      if (sum > r->split_max[NUM_PARTS]) r->split_max[NUM_PARTS] = sum;
    }
  }
  if (r->status == SHAPE_STEP_ERROR || !step_max || !rank0) {
    r->status = SHAPE_STEP_ERROR;
    free(step_max);
    free(rank0);
    return;
  }
  for (int s = 0; s < steps; s++) {
    step_max[s] = 0;
    for (int32_t k = 0; k < ranks; k++) {
      const double ms = (double)all[k * n + REC_STEPS + (size_t)s] * 1e-6;
      if (ms > step_max[s]) step_max[s] = ms;
    }
    rank0[s] = (double)all[REC_STEPS + (size_t)s] * 1e-6;
  }
  r->step_ms = ina_bench_median(step_max, steps);
  r->rank0_ms = ina_bench_median(rank0, steps);
  free(step_max);
  free(rank0);
}

/* ---- greedy check ------------------------------------------------------------------- */

static uint64_t fnv1a_tokens(uint64_t h, const int32_t *tokens, int32_t n) {
  for (int32_t i = 0; i < n; i++) {
    const uint32_t t = (uint32_t)tokens[i];
    for (int k = 0; k < 4; k++) h = (h ^ ((t >> (8 * k)) & 0xFFu)) * 0x100000001B3ull;
  }
  return h;
}

/* P seeded random prompts, G greedy tokens each, as one batch; their hash into *hash and
 * prompt 0's first tokens into g. Every rank builds the same prompts. */
static ina_status_t greedy_generate(ina_engine_t *e, const options_t *o, uint64_t *hash, greedy_result_t *g) {
  ina_status_t st = INA_OK;
  const int32_t P = o->greedy_prompts, G = o->greedy_tokens, vocab = ina_engine_config(e)->vocab_size;
  const int32_t span = GREEDY_MAX_PROMPT - GREEDY_MIN_PROMPT + 1;
  uint64_t rng = o->seed * 0xD1B54A32D192ED03ull + 0x6EEDull;
  ina_generate_request_t *r = calloc((size_t)P, sizeof *r);
  int32_t *prompts = malloc((size_t)P * GREEDY_MAX_PROMPT * sizeof *prompts);
  int32_t *out = malloc((size_t)P * (size_t)G * sizeof *out);
  INA_CHECK_ALLOC(r);
  INA_CHECK_ALLOC(prompts);
  INA_CHECK_ALLOC(out);
  for (int32_t p = 0; p < P; p++) {
    const ina_sampling_params_t greedy = INA_SAMPLING_PARAMS_INIT; /* temperature 0 */
    r[p].prompt = prompts + (size_t)p * GREEDY_MAX_PROMPT;
    r[p].prompt_len = GREEDY_MIN_PROMPT + (int32_t)(ina_bench_splitmix64(&rng) % (uint64_t)span);
    ina_bench_random_tokens(&rng, vocab, prompts + (size_t)p * GREEDY_MAX_PROMPT, r[p].prompt_len);
    r[p].max_new_tokens = G;
    r[p].sampling = greedy;
    r[p].ignore_eos = 1;
    r[p].output = out + (size_t)p * G;
  }
  INA_CHECK(ina_generate(e, r, P, NULL));
  *hash = 0xCBF29CE484222325ull;
  for (int32_t p = 0; p < P; p++) {
    INA_REQUIRE(r[p].num_generated == G, INA_ERR_INTERNAL, "greedy: prompt %d generated %d of %d tokens", p,
                r[p].num_generated, G);
    *hash = fnv1a_tokens(*hash, r[p].output, G);
  }
  g->num_first = G < GREEDY_SHOWN ? G : GREEDY_SHOWN;
  memcpy(g->first, out, (size_t)g->num_first * sizeof *out);
fail:
  free(r);
  free(prompts);
  free(out);
  return st;
}

/* Runs the greedy check on every rank and compares the hashes. Returns the failures
 * (0 or 1); sets *step_error when a rank's generation failed. */
static int greedy_check(ina_engine_t *e, const run_t *run, greedy_result_t *g, int *step_error) {
  const options_t *o = run->o;
  int64_t mine[2] = {0, 0}, *all = malloc((size_t)run->job->size * 2 * sizeof *all);
  uint64_t hash = 0;
  progress("greedy check: %d prompts of %d..%d random tokens, %d new tokens each", o->greedy_prompts,
           GREEDY_MIN_PROMPT, GREEDY_MAX_PROMPT, o->greedy_tokens);
  if (greedy_generate(e, o, &hash, g) != INA_OK) {
    rank_error("greedy generation: %s", ina_last_error());
    mine[0] = 1;
  }
  mine[1] = (int64_t)hash;
  if (!all) {
    rank_error("out of memory");
    ina_parallel_job_abort(run->job, 1);
  }
  exchange(run->job, mine, all, 2);
  g->hash = hash;
  g->ranks_agree = 1;
  for (int32_t k = 0; k < run->job->size; k++) {
    *step_error |= all[2 * k] != 0;
    g->ranks_agree &= all[2 * k + 1] == (int64_t)hash;
  }
  free(all);
  if (*step_error) return 1;
  g->ran = 1;
  if (g_rank == 0) {
    printf("greedy_tokens_hash %016" PRIx64 " P=%d G=%d\n", g->hash, o->greedy_prompts, o->greedy_tokens);
    printf("greedy_first_tokens[prompt 0]");
    for (int32_t i = 0; i < g->num_first; i++) printf("%s%d", i ? "," : " ", g->first[i]);
    printf("\n");
    if (!g->ranks_agree) fprintf(stderr, "%s: the ranks generated different tokens (hashes differ)\n", PROGRAM);
    fflush(stdout);
  }
  return !g->ranks_agree;
}

/* ---- reporting (rank 0) ------------------------------------------------------------- */

static void report_shape(const run_t *run, const shape_result_t *r) {
  const options_t *o = run->o;
  char name[128], f[256], tag[96];
  snprintf(tag, sizeof tag, "%s,b%" PRId64 ",ctx%" PRId64, run->layout, r->batch, o->context);
  snprintf(name, sizeof name, "decode_tokens_per_s[%s]", tag);
  figure(name, (double)r->batch / (r->step_ms * 1e-3), "tokens/s",
         "batch/ina_bench_median(max over ranks of step wall time)");
  snprintf(name, sizeof name, "decode_step_time[%s]", tag);
  snprintf(f, sizeof f,
           "median over %d steps of the max over %d ranks of one ina_engine_forward's wall time (%s, host "
           "bookkeeping + logits to pinned host, synchronized); %" PRId64 " positions attended",
           o->steps, run->job->size, o->cuda_graphs ? "graph replay" : "eager", o->context);
  figure(name, r->step_ms, "ms", f);
  snprintf(name, sizeof name, "decode_step_time_rank0[%s]", tag);
  figure(name, r->rank0_ms, "ms", "median over the timed steps of rank 0's own step wall time");
  if (o->dp) {
    snprintf(name, sizeof name, "dp_max_sequences[%s]", tag);
    snprintf(f, sizeof f, "most sequences one of the %d expert-parallel ranks computes (first page mod ranks)",
             run->ep_size);
    figure(name, r->dp_max_sequences, "seqs", f);
  }
  if (r->split != SPLIT_OK) return;
  for (int p = 0; p <= NUM_PARTS; p++) {
    const char *part = p < NUM_PARTS ? k_part_names[p] : "sum";
    snprintf(name, sizeof name, "step_split_%s_rank0[%s]", part, tag);
    figure(name, r->split_rank0[p], "ms",
           p < NUM_PARTS ? "rank 0's device time of this part / steps timed (ina_engine_step_split)"
                         : "rank 0's parts added: its device time per step");
    snprintf(name, sizeof name, "step_split_%s_max[%s]", part, tag);
    figure(name, r->split_max[p], "ms",
           p < NUM_PARTS ? "max over ranks of the part's device time / steps timed"
                         : "max over ranks of each rank's parts added");
  }
}

/* One line: the run's settings and layout, the greedy check, and every figure. */
static void print_json(const run_t *run, const greedy_result_t *g, int split_unavailable, int failed) {
  const options_t *o = run->o;
  printf("{\"bench\": \"decode_parallel\", \"device\": ");
  ina_bench_json_string(run->device_name);
  printf(", \"model\": ");
  ina_bench_json_string(o->model);
  printf(", \"dtype\": \"%s\", \"ranks\": %d, \"tp\": %d, \"ep\": %d, \"attention_dp\": %s, \"layout\": ",
         o->dtype_name, run->job->size, run->job->tp_size, run->ep_size, o->dp ? "true" : "false");
  ina_bench_json_string(run->layout);
  printf(", \"context\": %" PRId64 ", \"page_size\": %" PRId64 ", \"steps\": %d, \"warmup_steps\": %d, "
         "\"cuda_graphs\": %s, \"token_steps\": %s, \"seed\": %" PRIu64 ", \"step_split\": ",
         o->context, o->page_size, o->steps, WARMUP_STEPS, o->cuda_graphs ? "true" : "false",
         o->token_steps ? "true" : "false", o->seed);
  if (split_unavailable) {
    printf("{\"available\": false, \"reason\": ");
    ina_bench_json_string(run->split_reason);
    printf("}");
  } else {
    printf("{\"available\": true}");
  }
  printf(", \"greedy\": ");
  if (g->ran) {
    printf("{\"prompts\": %d, \"new_tokens\": %d, \"hash\": \"%016" PRIx64 "\", \"ranks_agree\": %s, "
           "\"first_tokens\": [",
           o->greedy_prompts, o->greedy_tokens, g->hash, g->ranks_agree ? "true" : "false");
    for (int32_t i = 0; i < g->num_first; i++) printf("%s%d", i ? ", " : "", g->first[i]);
    printf("]}");
  } else {
    printf("null");
  }
  printf(", \"failures\": %d, \"results\": [", failed);
  for (int i = 0; i < g_num_figures; i++) {
    const figure_t *f = &g_figures[i];
    printf("%s{\"name\": ", i ? ", " : "");
    ina_bench_json_string(f->name);
    if (isfinite(f->value)) printf(", \"value\": %.6g, \"unit\": ", f->value); /* JSON has no NaN */
    else printf(", \"value\": null, \"unit\": ");
    ina_bench_json_string(f->unit);
    printf(", \"formula\": ");
    ina_bench_json_string(f->formula);
    putchar('}');
  }
  printf("]}\n");
  fflush(stdout);
}

static void print_split_row(const char *who, const double *parts) {
  printf("      split %-5s", who);
  for (int p = 0; p <= NUM_PARTS; p++) printf(" %s %.3f", p < NUM_PARTS ? k_part_names[p] : "sum", parts[p]);
  printf(" ms/step\n");
}

static void print_summary(const run_t *run, const shape_result_t *results, int count, const greedy_result_t *g) {
  const options_t *o = run->o;
  printf("\n== %s summary: %s %s, %d ranks: tp %d, ep %d%s; context %" PRId64 ", page %" PRId64
         ", decode %s ==\n",
         PROGRAM, o->model, o->dtype_name, run->job->size, run->job->tp_size, run->ep_size,
         o->dp ? ", attention dp" : "", o->context, o->page_size, o->cuda_graphs ? "graph-replayed" : "eager");
  printf("%5s %10s %12s %10s %7s\n", "batch", "step_ms", "tokens/s", "rank0_ms", "dp_max");
  for (int i = 0; i < count; i++) {
    const shape_result_t *r = &results[i];
    if (r->status != SHAPE_OK) {
      printf("%5" PRId64 " %s (see above)\n", r->batch, r->status == SHAPE_STEP_ERROR ? "STEP ERROR" : "FAILED");
      continue;
    }
    char dp[16] = "-";
    if (o->dp) snprintf(dp, sizeof dp, "%d", r->dp_max_sequences);
    printf("%5" PRId64 " %10.3f %12.1f %10.3f %7s\n", r->batch, r->step_ms, (double)r->batch / (r->step_ms * 1e-3),
           r->rank0_ms, dp);
    if (r->split == SPLIT_OK) {
      print_split_row("rank0", r->split_rank0);
      print_split_row("max", r->split_max);
    }
  }
  for (int i = 0; i < count; i++)
    if (results[i].split == SPLIT_UNAVAILABLE) {
      printf("step split: unavailable (%s)\n", run->split_reason);
      break;
    }
  if (g->ran)
    printf("greedy: hash %016" PRIx64 " over %d prompts x %d tokens, ranks %s\n", g->hash, o->greedy_prompts,
           o->greedy_tokens, g->ranks_agree ? "agree" : "DIFFER");
  fflush(stdout);
}

/* ---- the job ------------------------------------------------------------------------ */

/* KV capacity: the largest batch at `context` tokens (each step is truncated back) or the
 * greedy prompts with their new tokens, plus two pages per sequence of margin (for the
 * first pages grow_sequences sets aside). */
static int64_t kv_tokens_needed(const options_t *o) {
  int64_t batch = 1;
  for (int b = 0; b < o->num_batch; b++)
    if (o->batch[b] > batch) batch = o->batch[b];
  int64_t need = batch * round_up(o->context, o->page_size) + 2 * batch * o->page_size;
  const int64_t greedy =
      (int64_t)o->greedy_prompts * (round_up(GREEDY_MAX_PROMPT + o->greedy_tokens, o->page_size) + o->page_size);
  return need > greedy ? need : greedy;
}

/* Opens this rank's shard of the model and its engine; 0 on success. */
static int open_engine(const run_t *run, ina_model_t **model, ina_engine_t **engine) {
  const options_t *o = run->o;
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  ina_model_config_t cfg;
  mo.seed = WEIGHT_SEED;
  mo.dtype = o->dtype;
  mo.random_on_device = 1; /* random weights are generated on each rank's GPU */
  eo.device = ina_parallel_job_device(run->job);
  eo.page_size = (int32_t)o->page_size;
  eo.max_tokens = kv_tokens_needed(o);
  eo.cuda_graphs = o->cuda_graphs;
  eo.tp_comm = run->job->tp;
  eo.ep_comm = run->job->ep;
  eo.attention_dp = o->dp ? 2 : 0;
  eo.step_split = 1;
  if (ina_model_spec_config(o->model, &cfg) != INA_OK || ina_parallel_job_shard(run->job, &cfg, 0, &mo.shard) ||
      ina_model_open(o->model, &mo, model) != INA_OK) {
    rank_error("model %s: %s", o->model, ina_last_error());
    return 1;
  }
  progress("%s %s: weights of tensor slice 1/%d, %d of %d routed experts per rank, generated on each GPU; "
           "latent cache for %" PRId64 " tokens",
           o->model, o->dtype_name, mo.shard.tp_size, mo.shard.expert_end - mo.shard.expert_begin,
           cfg.n_routed_experts, eo.max_tokens);
  size_t free_before = 0, free_after = 0, total = 0;
  (void)ina_cuda_mem_info(eo.device, &free_before, &total);
  const double t0 = ina_bench_now_s();
  if (ina_engine_create(*model, &eo, engine) != INA_OK) {
    rank_error("engine for %s %s on device %d: %s", o->model, o->dtype_name, eo.device, ina_last_error());
    return 1;
  }
  (void)ina_cuda_mem_info(eo.device, &free_after, &total);
  progress("engine ready in %.1f s: %.2f GB of device memory taken on rank 0", ina_bench_now_s() - t0,
           (double)(free_before - free_after) / 1e9);
  return 0;
}

/* Every batch, then the greedy check; results appended. Returns the failures; sets
 * *step_error when a rank's step failed (its collectives may be out of step). */
static int run_shapes(ina_engine_t *e, run_t *run, float *logits, shape_result_t *results, int *count,
                      greedy_result_t *g, int *step_error) {
  const options_t *o = run->o;
  const size_t n = (size_t)REC_STEPS + (size_t)o->steps;
  int64_t *rec = calloc(n, sizeof *rec), *all = calloc(n * (size_t)run->job->size, sizeof *all);
  uint64_t rng = o->seed * 0x9E3779B97F4A7C15ull + 1; /* the same on every rank */
  int failed = 0;
  if (!rec || !all) {
    rank_error("out of memory");
    ina_parallel_job_abort(run->job, 1);
  }
  for (int b = 0; b < o->num_batch && !*step_error; b++) {
    shape_result_t *r = &results[(*count)++];
    memset(r, 0, sizeof *r);
    r->batch = o->batch[b];
    progress("batch %" PRId64 ", context %" PRId64 ": growing the sequences, %d warm-up steps (the first captures "
             "the graph), %d timed",
             r->batch, o->context, WARMUP_STEPS, o->steps);
    memset(rec, 0, n * sizeof *rec);
    decode_shape(e, run, r->batch, &rng, logits, rec, &r->dp_max_sequences, run->split_reason,
                 sizeof run->split_reason);
    exchange(run->job, rec, all, n);
    combine_records(all, run->job->size, o->steps, r);
    if (r->status == SHAPE_STEP_ERROR) *step_error = 1;
    if (r->status != SHAPE_OK) {
      failed++;
      continue;
    }
    if (g_rank == 0) {
      report_shape(run, r);
      if (r->split == SPLIT_UNAVAILABLE) printf("step split: unavailable (%s)\n", run->split_reason);
    }
  }
  free(rec);
  free(all);
  if (!*step_error && o->greedy_prompts > 0) failed += greedy_check(e, run, g, step_error);
  return failed;
}

/* The layout's name in every figure: dtype, tp, ep, dp, eager. */
static void name_layout(run_t *run) {
  const options_t *o = run->o;
  snprintf(run->layout, sizeof run->layout, "%s,tp%d,ep%d%s%s%s", o->dtype_name, run->job->tp_size, run->ep_size,
           o->dp ? ",dp" : "", o->cuda_graphs ? "" : ",eager", o->token_steps ? ",tokens" : "");
}

int main(int argc, char **argv) {
  options_t o;
  ina_parallel_job_t job;
  run_t run;
  shape_result_t results[MAX_LIST];
  greedy_result_t greedy;
  ina_model_t *model = NULL;
  ina_engine_t *engine = NULL;
  float *logits = NULL;
  int count = 0, failed = 0, step_error = 0;
  g_start = ina_bench_now_s();
  memset(&job, 0, sizeof job);
  memset(&run, 0, sizeof run);
  memset(&greedy, 0, sizeof greedy);
  const int parsed = parse_options(argc, argv, &o);
  if (parsed) return parsed < 0 ? 0 : parsed;

  /* Collective: MPI, the groups, their NCCL communicators on each rank's GPU. Without a
   * device it fails by design (no NCCL): quietly, as the rank then only says it skipped. */
  const int have_device = ina_cuda_device_count() > 0;
  ina_log_set_quiet_errors(!have_device);
  const ina_status_t started = ina_parallel_job_start((int32_t)o.tp, o.ep, INA_COMM_BACKEND_NCCL, &job);
  ina_log_set_quiet_errors(0);
  g_rank = job.rank;
  if (!have_device) {
    if (g_rank == 0) printf("%s: no CUDA device, skipped\n", PROGRAM);
    ina_parallel_job_end(&job);
    return INA_BENCH_SKIP;
  }
  if (started != INA_OK) {
    if (g_rank == 0) fprintf(stderr, "%s: %s\n", PROGRAM, ina_last_error());
    ina_parallel_job_end(&job);
    return 2;
  }
  const int32_t device = ina_parallel_job_device(&job);
  /* Before any other CUDA call, so no rank makes a context on device 0. */
  if (cudaSetDevice(device) != cudaSuccess) {
    rank_error("cudaSetDevice(%d) failed", device);
    ina_parallel_job_abort(&job, 1);
  }
  run.o = &o;
  run.job = &job;
  run.ep_size = job.ep ? job.groups : 1;
  name_layout(&run);
  ina_cuda_device_name(device, run.device_name, sizeof run.device_name);
  progress("%d ranks, one GPU each (rank 0: %s): tensor parallel %d, expert parallel %d%s; layout %s", job.size,
           run.device_name, job.tp_size, run.ep_size, o.dp ? ", attention data parallel" : "", run.layout);

  /* Pinned, as a server's would be: the logits copy is part of every step. */
  {
    ina_model_config_t cfg;
    int64_t rows = 1;
    for (int b = 0; b < o.num_batch; b++)
      if (o.batch[b] > rows) rows = o.batch[b];
    const int ok = ina_model_spec_config(o.model, &cfg) == INA_OK &&
                   cudaHostAlloc((void **)&logits, (size_t)rows * (size_t)cfg.vocab_size * sizeof(float),
                                 cudaHostAllocPortable) == cudaSuccess;
    if (!ok)
      rank_error("model %s or its pinned logits buffer for %" PRId64 " rows: %s", o.model, rows, ina_last_error());
    if (!every_rank(&job, ok)) {
      if (logits) cudaFreeHost(logits);
      ina_parallel_job_end(&job);
      return 1;
    }
  }

  const int opened = open_engine(&run, &model, &engine) == 0;
  if (!every_rank(&job, opened)) {
    /* A rank whose engine exists went through create's collectives that the others did
     * not finish: its communicators are out of step, so the job ends here. */
    if (g_rank == 0) fprintf(stderr, "%s: a rank could not open the model or create its engine\n", PROGRAM);
    if (opened) ina_parallel_job_abort(&job, 1);
    ina_model_destroy(model);
    cudaFreeHost(logits);
    ina_parallel_job_end(&job);
    return 1;
  }

  failed = run_shapes(engine, &run, logits, results, &count, &greedy, &step_error);
  if (g_rank == 0) {
    int split_unavailable = 0;
    for (int i = 0; i < count; i++) split_unavailable |= results[i].split == SPLIT_UNAVAILABLE;
    print_json(&run, &greedy, split_unavailable, failed);
    print_summary(&run, results, count, &greedy);
  }
  progress("done, %d failure%s", failed, failed == 1 ? "" : "s");
  if (step_error) {
    /* A rank's failed step may have left the communicators out of step: destroying them
     * could wait forever, so the job ends here. */
    progress("a step failed on a rank: ending the job");
    ina_parallel_job_abort(&job, 1);
  }
  ina_engine_destroy(engine);
  ina_model_destroy(model);
  cudaFreeHost(logits);
  ina_parallel_job_end(&job);
  return failed ? 1 : 0;
}
