/* Decode steps of the whole GPU forward pass (model/model.h's CUDA engine) on a built-in
 * model with random weights (--model: DeepSeek-V2-Lite's shapes by default, DeepSeek-V3's
 * in 4 layers, or those with DeepSeek-V3.2's lightning indexer), against their memory
 * roofline, plus the prefill throughput of one long prompt.
 *
 * Decode. For each dtype (bf16, FP8 e4m3 with 128x128 block scales), context and batch:
 * `batch` sequences are grown to context - 1 cached positions through the engine's page
 * pool without running the model (the whole cache is filled with random bf16 in [-1, 1)
 * once after the check: the bytes a dense step reads do not depend on the values, but
 * V3.2's top-k should not choose among ties), then steps of one random token per
 * sequence run through ina_engine_forward. After every step the sequences are truncated
 * back by one token, so every step attends exactly `context` positions (its own
 * included) on the same pages.
 * The first warm-up step of a batch bucket captures its CUDA graph; the later ones
 * replay it (--no-cuda-graphs: every step eager).
 *   step time  = median over the timed steps of the wall time of one ina_engine_forward
 *                call: the host's bookkeeping (page appends, page table, attention plan,
 *                staging copy), the graph replay, and the logits [batch, vocab] f32
 *                copied to pinned host memory; the call returns synchronized.
 *   tokens/s   = batch / step time.
 *   roofline   = bytes / read ceiling, the ceiling measured in the same run
 *                (ina_bench_read_ceiling_tbs) and the bytes those of
 *                bench/decode_roofline.h: weights as the engine stores them (batch rows
 *                of the embedding, the whole LM head, every other non-routed weight once,
 *                per MoE layer the expected distinct experts of uniform routing
 *                E * (1 - (1 - k/E)^batch) times one expert), the cache, and
 *                activations (8 passes over the bf16 [batch, hidden] rows per layer +
 *                the f32 logits). The cache of a dense model (V2, V3): the latent of
 *                every attended position, batch * context * (512 + 64) * 2 * layers.
 *                DeepSeek-V3.2 (an indexer): per sequence and layer, the bf16 index key
 *                of every visible position (context * index_head_dim * 2; the engine
 *                keeps it beside the latent in each cache entry) plus the
 *                min(context, index_topk) latent entries sparse MLA reads
 *                ((512 + 64) * 2 each); plus the indexer's f32 score rows, written and
 *                read once: batch * context * 4 * 2 * layers.
 *   ratio      = step time / roofline; for random:v2-lite target <= 1.3 at batch 1, 8
 *                and 64 (batch 256: tokens/s reported, no target); other models: the
 *                ratio reported, no target. Missed targets are reported, not errors.
 * A batch that is not a power of two runs its graph bucket's rows (the next power of
 * two); the roofline counts the batch's own tokens.
 *
 * Prefill. One prompt of `--prompt` random tokens (4096) on a fresh sequence, one
 * forward, eager (only decode steps replay graphs); one warm-up, then the median of 3.
 *   prefill tokens/s = prompt / median forward time.
 *
 * Check. Before timing a dtype, its engine runs the largest batch of short random
 * sequences (a prefill, then a decode step from the batch's graph), and the first of them
 * are compared row by row with the GPU engine's oracle on the host's copy of the same
 * random weights (bench_decode_check.c). A dtype whose check fails prints no figure.
 * The host copy costs the weights' size in host memory and a minute or two (more for
 * the V3 shapes: ~39 GB in FP8, ~74 GB in bf16); --no-check skips it, and so does a host
 * without that much memory available; the figures are then marked unchecked.
 * random:v2-lite's random router puts its top scores within the noise of 64 experts, so
 * every row may sit at a near-tie; the check is then undecided (finite logits only) and
 * the figures are marked so.
 *
 * Memory. The page pool holds the largest batch x context (and the prompt); before the
 * engine is made, the weights plus that cache are compared with the device's free memory
 * (V3.2 at batch 64 x 131072: (512 + 64 + 128) * 2 bytes * 4 layers per token, ~47 GB,
 * beside ~39 GB of FP8 weights), and a dtype that cannot fit is refused, naming both.
 *
 * Usage: bench_decode [--model SPEC] [--quick] [--dtype bf16,fp8] [--batch 1,8,64,256]
 *                     [--context 1024,4096] [--steps N] [--prompt N] [--seed N]
 *                     [--no-cuda-graphs] [--no-check] [--help]
 * SPEC: random:v2-lite (default), random:v3-layers, random:v3.2-layers (k_model_specs).
 * Progress goes to stderr; figures (`name value unit formula`), the JSON line and a
 * summary table to stdout. Exit 77 without a device, 2 for bad options, 1 when a shape
 * failed. */
#define INA_LOG_SUBSYS "bench"
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/bench_decode_check.h"
#include "bench/bench_util.h"
#include "bench/decode_roofline.h"
#include "core/check.h"
#include "core/log.h"
#include "kvcache/kv_seq.h"
#include "model/model.h"

#define DEFAULT_MODEL "random:v2-lite"
#define TARGET_MODEL DEFAULT_MODEL /* the model the ratio target is set for */
#define PAGE_SIZE 64
#define WARMUP_STEPS 3  /* the first captures the bucket's graph */
#define DEFAULT_STEPS 20
#define QUICK_STEPS 10
#define PREFILL_RUNS 3
#define DEFAULT_PROMPT 4096
#define RATIO_TARGET 1.3
#define TARGET_MAX_BATCH 64 /* larger batches: tokens/s reported, no target */
#define MAX_LIST 8
#define MAX_BATCH 4096
/* Positions per sequence the parser takes; device memory is the real bound, checked
 * against the cache before the engine is made (the V3 shapes' YaRN covers 163840). */
#define MAX_CONTEXT (1 << 20)
#define WEIGHT_SEED 0x5EEDull
#define CACHE_SEED 0xCAC4Eull
#define CHECK_HOST_SLACK 1.3 /* host memory the check may take per weight byte */

/* The models the bench takes: built-in configurations (model/config.c) with random
 * weights generated on the device. */
static const char *const k_model_specs[] = {"random:v2-lite", "random:v3-layers", "random:v3.2-layers", NULL};

static const ina_dtype_t k_dtypes[2] = {INA_DTYPE_BF16, INA_DTYPE_FP8_E4M3};
static const char *const k_dtype_names[2] = {"bf16", "fp8"};

typedef struct options {
  const char *model; /* one of k_model_specs */
  int dtype[2]; /* selected: bf16, fp8 */
  int64_t batch[MAX_LIST], context[MAX_LIST];
  int num_batch, num_context;
  int steps;
  int64_t prompt; /* 0: no prefill */
  int cuda_graphs;
  int check; /* compare with the oracle before timing (--no-check: 0) */
  uint64_t seed;
  int fp8_index_keys; /* V3.2: --index-keys fp8 */
} options_t;

typedef struct shape_result {
  int dtype; /* index into k_dtypes */
  int64_t context, batch;
  int ran;
  double step_ms, roofline_ms;
  ina_decode_roofline_t bytes;
} shape_result_t;

typedef struct prefill_result {
  int ran;
  double ms;
} prefill_result_t;

static double g_start;

static void progress(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void progress(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "[bench_decode %7.1fs] ", ina_bench_now_s() - g_start);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  fflush(stderr);
}

/* ---- options ------------------------------------------------------------------------ */

static void usage(FILE *f, const char *program) {
  ina_model_config_t v32;
  const int topk = ina_model_config_builtin("v3.2-layers", &v32) == INA_OK ? v32.index_topk : 0;
  fprintf(f,
          "usage: %s [--model SPEC] [--quick] [--dtype bf16,fp8] [--batch 1,8,64,256]\n"
          "          [--context 1024,4096] [--steps N] [--prompt N] [--seed N] [--no-cuda-graphs]\n"
          "          [--index-keys bf16|fp8] [--no-check] [--help]\n"
          "  decode steps of a model with random weights (generated on device 0) against\n"
          "  their memory roofline, and the prefill throughput of one prompt\n"
          "  --model SPEC      the model (default %s), one of:\n"
          "                      random:v2-lite       DeepSeek-V2-Lite's shapes, 27 layers; the ratio\n"
          "                                           target <= %.1f applies to it at batch <= %d\n"
          "                      random:v3-layers     DeepSeek-V3's shapes in 4 layers, 256 experts\n"
          "                                           (dense MLA; ratio reported, no target)\n"
          "                      random:v3.2-layers   the same with DeepSeek-V3.2's lightning indexer\n"
          "                                           (64 heads x 128, top-%d; sparse MLA; no target)\n"
          "  --quick           context 1024, batch 1 and 64, %d steps (unless given)\n"
          "  --dtype           weights: bf16, fp8 or both (default both)\n"
          "  --batch           sequences per step, 1..%d (default 1,8,64,256)\n"
          "  --context         positions each step attends, 1..%d (default 1024,4096); the\n"
          "                    cache holds the largest batch x context on the device\n"
          "  --steps N         timed steps per shape after %d warm-up steps (default %d)\n"
          "  --prompt N        prefill prompt length, 0 for none (default %d)\n"
          "  --no-cuda-graphs  run decode steps eagerly (to compare with graph replay)\n"
          "  --index-keys K    V3.2's index keys in the cache: bf16 (default) or fp8 (e4m3 with a\n"
          "                    scale per token and an FP8 index query, as DeepSeek's release)\n"
          "  --no-check        skip the check against the CPU oracle before timing (it needs\n"
          "                    the weights' size in host memory); figures are marked unchecked\n",
          program, DEFAULT_MODEL, RATIO_TARGET, TARGET_MAX_BATCH, topk, QUICK_STEPS, MAX_BATCH, MAX_CONTEXT,
          WARMUP_STEPS, DEFAULT_STEPS, DEFAULT_PROMPT);
}

/* SPEC, or a built-in name without "random:", -> its k_model_specs entry; NULL if none. */
static const char *find_model(const char *text) {
  for (int i = 0; k_model_specs[i]; i++)
    if (strcmp(text, k_model_specs[i]) == 0 || strcmp(text, k_model_specs[i] + strlen("random:")) == 0)
      return k_model_specs[i];
  return NULL;
}

/* The built-in configuration name of a k_model_specs entry. */
static const char *builtin_name(const char *spec) { return spec + strlen("random:"); }

/* The ratio target applies to the model it was set for, at batch <= TARGET_MAX_BATCH. */
static int has_target(const options_t *o, int64_t batch) {
  return strcmp(o->model, TARGET_MODEL) == 0 && batch <= TARGET_MAX_BATCH;
}

/* "bf16", "fp8" or "bf16,fp8" -> selected[2]; 0 on success. */
static int parse_dtypes(const char *text, int *selected) {
  selected[0] = selected[1] = 0;
  for (const char *p = text; *p;) {
    const size_t len = strcspn(p, ",");
    int known = 0;
    for (int d = 0; d < 2; d++)
      if (len == strlen(k_dtype_names[d]) && strncmp(p, k_dtype_names[d], len) == 0) selected[d] = known = 1;
    if (!known) return 1;
    p += len;
    if (*p == ',') p++;
  }
  return !selected[0] && !selected[1];
}

static int parse_options(int argc, char **argv, options_t *o) {
  int quick = 0, have_batch = 0, have_context = 0, have_steps = 0;
  memset(o, 0, sizeof *o);
  o->model = DEFAULT_MODEL;
  o->dtype[0] = o->dtype[1] = 1;
  o->steps = DEFAULT_STEPS;
  o->prompt = DEFAULT_PROMPT;
  o->cuda_graphs = 1;
  o->check = 1;
  o->seed = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int bad = 0;
    if (strcmp(a, "--help") == 0) {
      usage(stdout, argv[0]);
      exit(0);
    } else if (strcmp(a, "--quick") == 0) {
      quick = 1;
    } else if (strcmp(a, "--no-cuda-graphs") == 0) {
      o->cuda_graphs = 0;
    } else if (strcmp(a, "--no-check") == 0) {
      o->check = 0;
    } else if (strcmp(a, "--model") == 0 && v) {
      i++;
      o->model = find_model(v);
      if (!o->model) {
        fprintf(stderr, "%s: unknown model '%s'\n", argv[0], v);
        o->model = DEFAULT_MODEL;
        bad = 1;
      }
    } else if (strcmp(a, "--dtype") == 0 && v) {
      i++;
      bad = parse_dtypes(v, o->dtype);
    } else if (strcmp(a, "--batch") == 0 && v) {
      i++;
      bad = ina_bench_parse_list(v, 1, MAX_BATCH, o->batch, MAX_LIST, &o->num_batch);
      have_batch = 1;
    } else if (strcmp(a, "--context") == 0 && v) {
      i++;
      bad = ina_bench_parse_list(v, 1, MAX_CONTEXT, o->context, MAX_LIST, &o->num_context);
      have_context = 1;
    } else if (strcmp(a, "--steps") == 0 && v) {
      i++;
      o->steps = atoi(v);
      bad = o->steps < 1;
      have_steps = 1;
    } else if (strcmp(a, "--prompt") == 0 && v) {
      i++;
      o->prompt = strtoll(v, NULL, 10);
      bad = o->prompt < 0 || o->prompt > INT32_MAX;
    } else if (strcmp(a, "--index-keys") == 0 && v) {
      i++;
      const int32_t keys = ina_engine_index_keys_parse(v);
      o->fp8_index_keys = keys == INA_ENGINE_INDEX_KEYS_FP8;
      bad = keys < 0;
    } else if (strcmp(a, "--seed") == 0 && v) {
      i++;
      o->seed = strtoull(v, NULL, 0);
    } else {
      bad = 1;
    }
    if (bad) {
      fprintf(stderr, "%s: bad option or value at '%s'\n", argv[0], a);
      usage(stderr, argv[0]);
      return 1;
    }
  }
  if (!have_batch) {
    const int64_t all[] = {1, 8, 64, 256}, few[] = {1, 64};
    o->num_batch = quick ? 2 : 4;
    memcpy(o->batch, quick ? few : all, (size_t)o->num_batch * sizeof(int64_t));
  }
  if (!have_context) {
    o->context[0] = 1024;
    o->context[1] = 4096;
    o->num_context = quick ? 1 : 2;
  }
  if (quick && !have_steps) o->steps = QUICK_STEPS;
  return 0;
}

/* ---- timing ------------------------------------------------------------------------- */

static int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

/* Median wall time of decode steps of `batch` sequences that each attend `context`
 * positions. logits: pinned [batch, vocab]. */
static ina_status_t time_decode(ina_engine_t *e, int64_t batch, int64_t context, int steps, uint64_t *rng,
                                float *logits, double *median_ms) {
  ina_status_t st = INA_OK;
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  const int32_t vocab = ina_engine_config(e)->vocab_size;
  ina_kv_seq_t *seqs = calloc((size_t)batch, sizeof *seqs);
  ina_kv_seq_t **seq_ptrs = calloc((size_t)batch, sizeof *seq_ptrs);
  int32_t *qo_indptr = malloc((size_t)(batch + 1) * sizeof *qo_indptr);
  int32_t *tokens = malloc((size_t)batch * sizeof *tokens);
  double *ms = malloc((size_t)steps * sizeof *ms);
  INA_CHECK_ALLOC(seqs);
  INA_CHECK_ALLOC(seq_ptrs);
  INA_CHECK_ALLOC(qo_indptr);
  INA_CHECK_ALLOC(tokens);
  INA_CHECK_ALLOC(ms);
  for (int64_t i = 0; i < batch; i++) {
    seq_ptrs[i] = &seqs[i];
    qo_indptr[i] = (int32_t)i;
    INA_CHECK(ina_kv_seq_append(pool, &seqs[i], context - 1));
  }
  qo_indptr[batch] = (int32_t)batch;
  const ina_batch_t b = {(int32_t)batch, seq_ptrs, qo_indptr, tokens, 0};
  for (int s = 0; s < WARMUP_STEPS + steps; s++) {
    if (s == WARMUP_STEPS) ina_bench_poison_nan(logits, batch * vocab); /* the timed steps must write them */
    ina_bench_random_tokens(rng, vocab, tokens, batch);
    const double t0 = ina_bench_now_s();
    INA_CHECK(ina_engine_forward(e, &b, logits));
    const double t1 = ina_bench_now_s();
    for (int64_t i = 0; i < batch; i++) ina_kv_seq_truncate(pool, &seqs[i], 1);
    if (s >= WARMUP_STEPS) ms[s - WARMUP_STEPS] = 1e3 * (t1 - t0);
  }
  for (int64_t i = 0; i < batch * vocab; i++)
    INA_REQUIRE(isfinite(logits[i]), INA_ERR_INTERNAL, "decode batch %" PRId64 " context %" PRId64
                ": logit %" PRId64 " of the timed steps is %g", batch, context, i, (double)logits[i]);
  *median_ms = ina_bench_median(ms, steps);
fail:
  if (seqs)
    for (int64_t i = 0; i < batch; i++) ina_kv_seq_release(pool, &seqs[i]);
  free(seqs);
  free(seq_ptrs);
  free(qo_indptr);
  free(tokens);
  free(ms);
  return st;
}

/* Median time of one forward of a `prompt`-token prompt on a fresh sequence. */
static ina_status_t time_prefill(ina_engine_t *e, int64_t prompt, uint64_t *rng, float *logits, double *median_ms) {
  ina_status_t st = INA_OK;
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  const int32_t vocab = ina_engine_config(e)->vocab_size;
  ina_kv_seq_t seq = INA_KV_SEQ_INIT;
  ina_kv_seq_t *seq_ptr = &seq;
  const int32_t qo_indptr[2] = {0, (int32_t)prompt};
  int32_t *tokens = malloc((size_t)prompt * sizeof *tokens);
  double ms[PREFILL_RUNS];
  INA_CHECK_ALLOC(tokens);
  const ina_batch_t b = {1, &seq_ptr, qo_indptr, tokens, 0};
  for (int r = -1; r < PREFILL_RUNS; r++) { /* r = -1: warm-up (buffers grow) */
    if (r == 0) ina_bench_poison_nan(logits, vocab);
    ina_bench_random_tokens(rng, vocab, tokens, prompt);
    const double t0 = ina_bench_now_s();
    INA_CHECK(ina_engine_forward(e, &b, logits));
    const double t1 = ina_bench_now_s();
    ina_kv_seq_release(pool, &seq);
    if (r >= 0) ms[r] = 1e3 * (t1 - t0);
  }
  for (int32_t i = 0; i < vocab; i++)
    INA_REQUIRE(isfinite(logits[i]), INA_ERR_INTERNAL, "prefill of %" PRId64 " tokens: logit %d is %g", prompt, i,
                (double)logits[i]);
  *median_ms = ina_bench_median(ms, PREFILL_RUNS);
fail:
  ina_kv_seq_release(pool, &seq);
  free(tokens);
  return st;
}

/* ---- reporting ---------------------------------------------------------------------- */

static void shape_prefix(const shape_result_t *r, int cuda_graphs, char *buf, size_t size) {
  snprintf(buf, size, "decode_%s_ctx%" PRId64 "_b%" PRId64 "%s", k_dtype_names[r->dtype], r->context, r->batch,
           cuda_graphs ? "" : "_eager");
}

static void result(const char *prefix, const char *what, double value, const char *unit, const char *formula) {
  char name[96];
  snprintf(name, sizeof name, "%s_%s", prefix, what);
  ina_bench_result(name, value, unit, formula);
}

static void report_shape(const shape_result_t *r, const options_t *o, double ceiling_tbs) {
  char p[64], f[256];
  const ina_decode_roofline_t *y = &r->bytes;
  shape_prefix(r, o->cuda_graphs, p, sizeof p);
  snprintf(f, sizeof f,
           "median of %d ina_engine_forward wall times (%s, host bookkeeping + logits to pinned host, "
           "synchronized); %" PRId64 " positions attended",
           o->steps, o->cuda_graphs ? "graph replay" : "eager", r->context);
  result(p, "step_time", r->step_ms * 1e3, "us", f);
  result(p, "tokens_per_s", (double)r->batch / (r->step_ms * 1e-3), "tok/s", "batch / step time");
  result(p, "bytes_embedding", (double)y->embedding_bytes / 1e6, "MB", "batch rows x hidden x 2 (bf16)");
  result(p, "bytes_lm_head", (double)y->lm_head_bytes / 1e6, "MB", "vocab x hidden x 2 (bf16), whole");
  result(p, "bytes_other_weights", (double)y->other_weight_bytes / 1e6, "MB",
         "attention, dense MLP, shared experts, routers, norms, once (stored dtypes)");
  snprintf(f, sizeof f,
           "%d MoE layers x %.2f experts hit (E(1-(1-k/E)^batch), uniform routing) x %.2f MB per expert",
           y->moe_layers, y->experts_hit, (double)y->expert_bytes / 1e6);
  result(p, "bytes_routed_experts", y->routed_bytes / 1e6, "MB", f);
  if (y->score_bytes > 0) {
    /* V3.2: the indexer reads every index key, sparse MLA the kept latent entries. */
    result(p, "bytes_kv", (double)y->kv_bytes / 1e6, "MB", "index keys + kept latent entries (below)");
    result(p, "bytes_index_keys", (double)y->index_key_bytes / 1e6, "MB",
           "batch x context x index_head_dim x 2 (bf16) x layers");
    result(p, "bytes_latent", (double)y->latent_bytes / 1e6, "MB",
           "batch x min(context, index_topk) x (kv_lora_rank + rope) x 2 x layers");
    result(p, "bytes_scores", (double)y->score_bytes / 1e6, "MB",
           "batch x context x 4 (f32 index scores) x 2 (written, read by the top-k) x layers");
  } else {
    result(p, "bytes_kv", (double)y->kv_bytes / 1e6, "MB", "batch x context x (kv_lora_rank + rope) x 2 x layers");
  }
  snprintf(f, sizeof f, "batch x hidden x 2 x %d passes x layers + batch x vocab x 4 (f32 logits)",
           INA_DECODE_ACT_PASSES_PER_LAYER);
  result(p, "bytes_activations", (double)y->activation_bytes / 1e6, "MB", f);
  result(p, "bytes_total", y->total_bytes / 1e6, "MB",
         y->score_bytes > 0 ? "weights + kv + scores + activations" : "weights + kv + activations");
  result(p, "roofline_time", r->roofline_ms * 1e3, "us", "total bytes / read ceiling (same run)");
  result(p, "achieved", y->total_bytes / (r->step_ms * 1e-3) / 1e12, "TB/s", "total bytes / step time");
  if (has_target(o, r->batch))
    snprintf(f, sizeof f, "step time / roofline time; ceiling %.3f TB/s; target <= %.1f", ceiling_tbs, RATIO_TARGET);
  else if (strcmp(o->model, TARGET_MODEL) == 0)
    snprintf(f, sizeof f, "step time / roofline time; ceiling %.3f TB/s; no target (tokens/s reported)", ceiling_tbs);
  else
    snprintf(f, sizeof f, "step time / roofline time; ceiling %.3f TB/s; no target (%s)", ceiling_tbs, o->model);
  result(p, "roofline_ratio", r->step_ms / r->roofline_ms, "x", f);
}

static void print_summary(const shape_result_t *results, int count, const prefill_result_t *prefill,
                          const options_t *o, double ceiling_tbs) {
  if (o->fp8_index_keys) printf("\nV3.2 index keys: fp8 (e4m3 + f32 scale per token)");
  printf("\n== bench_decode summary: %s, page %d, decode %s, read ceiling %.3f TB/s (same run) ==\n", o->model,
         PAGE_SIZE, o->cuda_graphs ? "graph-replayed" : "eager", ceiling_tbs);
  printf("%-5s %6s %5s %10s %10s %9s %8s %8s %7s %9s %10s %6s %6s %-8s %s\n", "dtype", "ctx", "batch", "step_us",
         "tok/s", "weight_MB", "kv_MB", "score_MB", "act_MB", "total_MB", "roofl_us", "TB/s", "ratio", "goal", "met");
  for (int i = 0; i < count; i++) {
    const shape_result_t *r = &results[i];
    if (!r->ran) {
      printf("%-5s %6" PRId64 " %5" PRId64 " ERROR (see above)\n", k_dtype_names[r->dtype], r->context, r->batch);
      continue;
    }
    const double ratio = r->step_ms / r->roofline_ms;
    const int target = has_target(o, r->batch);
    char goal[16];
    snprintf(goal, sizeof goal, "<=%.1f", RATIO_TARGET);
    printf("%-5s %6" PRId64 " %5" PRId64 " %10.1f %10.1f %9.1f %8.1f %8.1f %7.1f %9.1f %10.1f %6.3f %6.3f %-8s %s\n",
           k_dtype_names[r->dtype], r->context, r->batch, r->step_ms * 1e3, (double)r->batch / (r->step_ms * 1e-3),
           r->bytes.weight_bytes / 1e6, (double)r->bytes.kv_bytes / 1e6, (double)r->bytes.score_bytes / 1e6,
           (double)r->bytes.activation_bytes / 1e6,
           r->bytes.total_bytes / 1e6, r->roofline_ms * 1e3, r->bytes.total_bytes / (r->step_ms * 1e-3) / 1e12,
           ratio, target ? goal : "report", target ? (ratio <= RATIO_TARGET ? "yes" : "NO") : "-");
  }
  for (int d = 0; d < 2; d++) {
    if (!o->dtype[d] || o->prompt == 0) continue;
    if (prefill[d].ran)
      printf("prefill %s: %" PRId64 " tokens in %.1f ms = %.0f tok/s (eager, median of %d)\n", k_dtype_names[d],
             o->prompt, prefill[d].ms, (double)o->prompt / (prefill[d].ms * 1e-3), PREFILL_RUNS);
    else
      printf("prefill %s: ERROR (see above)\n", k_dtype_names[d]);
  }
  fflush(stdout);
}

/* ---- one dtype ---------------------------------------------------------------------- */

/* KV capacity for the largest selected shape (sequences never pass `context` tokens:
 * each step is truncated back) and for the prefill prompt. */
static int64_t kv_tokens_needed(const options_t *o) {
  int64_t need = o->prompt > 0 ? round_up(o->prompt, PAGE_SIZE) : PAGE_SIZE;
  for (int b = 0; b < o->num_batch; b++)
    for (int c = 0; c < o->num_context; c++) {
      const int64_t t = o->batch[b] * round_up(o->context[c], PAGE_SIZE);
      if (t > need) need = t;
    }
  return need;
}

/* Host memory the kernel says can be had without swapping; -1 when unknown. */
static double host_available_bytes(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[256];
  long long kb = -1;
  if (f) {
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
  }
  if (kb >= 0) return (double)kb * 1024.0;
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? (double)pages * (double)page : -1.0;
}

/* Bytes of the engine's KV cache for max_tokens: every layer's pages of entries of the
 * latent, the rope key and V3.2's index key (model/engine_gpu.c), bf16. */
static double cache_bytes(const ina_model_config_t *cfg, int64_t max_tokens) {
  const int64_t entry =
      cfg->kv_lora_rank + cfg->qk_rope_head_dim + (ina_cfg_has_indexer(cfg) ? cfg->index_head_dim : 0);
  return (double)round_up(max_tokens, PAGE_SIZE) * (double)entry * 2.0 * cfg->num_layers;
}

/* Fills the engine's whole KV cache with random bf16 in [-1, 1): the timed sequences'
 * cached positions then hold distinct values (V3.2's indexer scores them, and its top-k
 * should not run on ties of zeros). */
static ina_status_t fill_cache(ina_engine_t *e, uint64_t seed) {
  ina_status_t st = INA_OK;
  void *base = NULL;
  size_t bytes = 0;
  int on_device = 0;
  int32_t device = 0;
  INA_CHECK(ina_engine_kv_storage(e, &base, &bytes, &on_device, &device));
  INA_REQUIRE(on_device && device == 0, INA_ERR_INTERNAL, "the engine's KV cache is not on device 0");
  INA_CHECK(ina_bench_fill_random_bf16((uint16_t *)base, bytes / sizeof(uint16_t), seed, 1.0f));
fail:
  return st;
}

/* Runs every selected shape of dtype d on one model and engine; results appended at
 * *count. Returns the number of failures. */
static int run_dtype(int d, const options_t *o, double ceiling_tbs, float *logits, shape_result_t *results,
                     int *count, prefill_result_t *prefill) {
  ina_model_t *model = NULL;
  ina_engine_t *engine = NULL;
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  uint64_t rng = o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)d;
  size_t free_before = 0, free_after = 0, total = 0;
  const char *dn = k_dtype_names[d];
  int failed = 0;
  mo.seed = WEIGHT_SEED;
  mo.dtype = k_dtypes[d];
  mo.random_on_device = 1;
  eo.device = 0;
  eo.page_size = PAGE_SIZE;
  eo.max_tokens = kv_tokens_needed(o);
  eo.cuda_graphs = o->cuda_graphs;
  eo.index_keys = o->fp8_index_keys ? INA_ENGINE_INDEX_KEYS_FP8 : INA_ENGINE_INDEX_KEYS_BF16;
  if (ina_model_open(o->model, &mo, &model) != INA_OK) {
    fprintf(stderr, "bench_decode: %s %s: %s\n", o->model, dn, ina_last_error());
    return 1;
  }
  const ina_model_config_t *cfg = ina_model_config(model);
  ina_decode_roofline_t whole;
  if (ina_decode_roofline(cfg, k_dtypes[d], 1, 1, &whole) != INA_OK) {
    fprintf(stderr, "bench_decode: roofline of %s: %s\n", o->model, ina_last_error());
    ina_model_destroy(model);
    return 1;
  }
  const double weights = (double)whole.model_bytes, cache = cache_bytes(cfg, eo.max_tokens);
  (void)cudaMemGetInfo(&free_before, &total);
  /* Weights and cache are what the engine must hold at least (its step buffers and
   * workspaces come on top): refuse at once what cannot fit rather than after the
   * weights were generated. */
  if (free_before > 0 && weights + cache > (double)free_before) {
    fprintf(stderr,
            "bench_decode: %s %s: %.2f GB of weights + %.2f GB of KV cache (%" PRId64
            " tokens: the largest batch x context) exceed the %.2f GB free on device 0; lower --batch or "
            "--context, or use --dtype fp8\n",
            o->model, dn, weights / 1e9, cache / 1e9, eo.max_tokens, (double)free_before / 1e9);
    ina_model_destroy(model);
    return 1;
  }
  progress("%s %s: generating %.2f GB of random weights on device 0, KV cache for %" PRId64 " tokens (%.2f GB; "
           "%.2f GB free)",
           o->model, dn, weights / 1e9, eo.max_tokens, cache / 1e9, (double)free_before / 1e9);
  if (ina_engine_create(model, &eo, &engine) != INA_OK) {
    fprintf(stderr, "bench_decode: engine for %s %s: %s\n", o->model, dn, ina_last_error());
    ina_model_destroy(model);
    return 1;
  }
  (void)cudaMemGetInfo(&free_after, &total);
  int check = o->check;
  if (check) {
    /* The oracle's host copy of the weights, about their size, must fit beside the rest. */
    const double host = host_available_bytes();
    if (host >= 0.0 && weights * CHECK_HOST_SLACK > host) {
      fprintf(stderr,
              "bench_decode: %s %s: the check needs about %.1f GB of host memory for the oracle's weights, %.1f GB "
              "available; skipped (figures marked unchecked)\n",
              o->model, dn, weights * CHECK_HOST_SLACK / 1e9, host / 1e9);
      check = 0;
    }
  }
  if (check) {
    int64_t largest = 1;
    for (int b = 0; b < o->num_batch; b++)
      if (o->batch[b] > largest) largest = o->batch[b];
    progress("%s %s: checking a batch of %" PRId64 " against the CPU oracle (%.2f GB of weights on the host)",
             o->model, dn, largest, weights / 1e9);
    int undecided = 0;
    if (!bench_decode_check(engine, o->model, &mo, PAGE_SIZE, largest, &rng, dn, &undecided)) {
      fprintf(stderr, "bench_decode: %s %s: the check failed; no figures for this dtype\n", o->model, dn);
      ina_engine_destroy(engine);
      ina_model_destroy(model);
      return 1;
    }
    if (undecided)
      ina_bench_result(d == 0 ? "undecided_bf16" : "undecided_fp8", 1, "flag",
                       "every row the check compared sat at a routing near-tie: only their finiteness was checked");
  } else {
    ina_bench_result(d == 0 ? "unchecked_bf16" : "unchecked_fp8", 1, "flag",
                     o->check ? "the host lacked the memory for the check: these figures were not compared with the "
                                "oracle"
                              : "--no-check: these figures were not compared with the oracle");
  }
  if (fill_cache(engine, CACHE_SEED + (uint64_t)d) != INA_OK) {
    fprintf(stderr, "bench_decode: %s %s: filling the KV cache: %s\n", o->model, dn, ina_last_error());
    ina_engine_destroy(engine);
    ina_model_destroy(model);
    return 1;
  }
  progress("%s %s: engine ready: %.2f GB of device memory taken (weights %.2f GB accounted + KV cache %.2f GB, "
           "filled random)",
           o->model, dn, (double)(free_before - free_after) / 1e9, weights / 1e9, cache / 1e9);
  for (int c = 0; c < o->num_context; c++)
    for (int b = 0; b < o->num_batch; b++) {
      shape_result_t *r = &results[(*count)++];
      memset(r, 0, sizeof *r);
      r->dtype = d;
      r->context = o->context[c];
      r->batch = o->batch[b];
      progress("%s %s context %" PRId64 " batch %" PRId64 ": %d warm-up + %d timed steps", o->model, dn, r->context,
               r->batch, WARMUP_STEPS, o->steps);
      if (ina_decode_roofline(cfg, k_dtypes[d], r->batch, r->context, &r->bytes) != INA_OK ||
          time_decode(engine, r->batch, r->context, o->steps, &rng, logits, &r->step_ms) != INA_OK) {
        fprintf(stderr, "bench_decode: %s %s context %" PRId64 " batch %" PRId64 ": %s\n", o->model, dn, r->context,
                r->batch, ina_last_error());
        (void)cudaGetLastError();
        failed++;
        continue;
      }
      if (o->fp8_index_keys && r->bytes.index_key_bytes > 0) {
        /* FP8 index keys: head_dim e4m3 bytes and a 4-byte scale per token, not 2 x head_dim. */
        const int64_t fp8 = r->bytes.index_key_bytes / (2 * cfg->index_head_dim) * (cfg->index_head_dim + 4);
        r->bytes.kv_bytes -= r->bytes.index_key_bytes - fp8;
        r->bytes.total_bytes -= (double)(r->bytes.index_key_bytes - fp8);
        r->bytes.index_key_bytes = fp8;
      }
      r->roofline_ms = r->bytes.total_bytes / (ceiling_tbs * 1e12) * 1e3;
      r->ran = 1;
      report_shape(r, o, ceiling_tbs);
    }
  if (o->prompt > 0) {
    progress("%s %s prefill: %" PRId64 " tokens, 1 warm-up + %d timed forwards", o->model, dn, o->prompt,
             PREFILL_RUNS);
    if (time_prefill(engine, o->prompt, &rng, logits, &prefill->ms) != INA_OK) {
      fprintf(stderr, "bench_decode: %s %s prefill of %" PRId64 " tokens: %s\n", o->model, dn, o->prompt,
              ina_last_error());
      (void)cudaGetLastError();
      failed++;
    } else {
      char name[64], f[160];
      prefill->ran = 1;
      snprintf(name, sizeof name, "prefill_%s_p%" PRId64 "_time", k_dtype_names[d], o->prompt);
      snprintf(f, sizeof f, "median of %d eager forwards of one %" PRId64 "-token prompt on a fresh sequence",
               PREFILL_RUNS, o->prompt);
      ina_bench_result(name, prefill->ms, "ms", f);
      snprintf(name, sizeof name, "prefill_%s_p%" PRId64 "_tokens_per_s", k_dtype_names[d], o->prompt);
      ina_bench_result(name, (double)o->prompt / (prefill->ms * 1e-3), "tok/s", "prompt tokens / forward time");
    }
  }
  ina_engine_destroy(engine);
  ina_model_destroy(model);
  return failed;
}

int main(int argc, char **argv) {
  options_t o;
  shape_result_t results[2 * MAX_LIST * MAX_LIST];
  prefill_result_t prefill[2];
  float *logits = NULL;
  int count = 0, failed = 0;
  g_start = ina_bench_now_s();
  memset(prefill, 0, sizeof prefill);
  if (parse_options(argc, argv, &o)) return 2;
  if (ina_bench_no_device("bench_decode")) return INA_BENCH_SKIP;

  progress("%s: measuring the read ceiling", o.model);
  const double ceiling = ina_bench_read_ceiling_tbs();
  if (ceiling <= 0.0) {
    fprintf(stderr, "bench_decode: read ceiling: %s\n", ina_last_error());
    return 1;
  }
  ina_bench_result("read_ceiling", ceiling, "TB/s",
                   "read-only reduction over rotating 1 GiB slices (bench_read_ceiling), same run");
  {
    /* The JSON line has no field for the model: this figure's formula names it. */
    char f[128];
    snprintf(f, sizeof f, "%s: the model of every figure here (random weights, seed 0x%llx)", o.model,
             (unsigned long long)WEIGHT_SEED);
    ina_bench_result("model", 1, "flag", f);
  }

  /* Pinned, as a server's would be: the logits copy is part of every step. */
  {
    ina_model_config_t cfg;
    int64_t rows = o.prompt > 0 ? 1 : 0;
    for (int b = 0; b < o.num_batch; b++)
      if (o.batch[b] > rows) rows = o.batch[b];
    if (ina_model_config_builtin(builtin_name(o.model), &cfg) != INA_OK ||
        cudaHostAlloc((void **)&logits, (size_t)rows * (size_t)cfg.vocab_size * sizeof(float),
                      cudaHostAllocDefault) != cudaSuccess) {
      fprintf(stderr, "bench_decode: pinned logits buffer for %" PRId64 " rows failed\n", rows);
      return 1;
    }
  }
  for (int d = 0; d < 2; d++)
    if (o.dtype[d]) failed += run_dtype(d, &o, ceiling, logits, results, &count, &prefill[d]);
  cudaFreeHost(logits);
  ina_bench_print_json("decode");
  print_summary(results, count, prefill, &o, ceiling);
  progress("done, %d failure%s", failed, failed == 1 ? "" : "s");
  return failed ? 1 : 0;
}
