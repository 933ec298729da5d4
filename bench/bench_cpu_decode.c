/* CPU decode and prefill throughput of a model on the CPU engine.
 *
 *   bench_cpu_decode [--model tiny] [--batch 1,16] [--prompt 32] [--new 64] [--runs 5]
 *                    [--threads N]
 *
 * For each batch size: `batch` prompts of `prompt` random tokens are prefilled together,
 * then `new` greedy decode steps run for all of them (eos ignored). Figures:
 *   decode tokens/s  = batch / median decode step time   (each step adds batch tokens)
 *   prefill tokens/s = batch * prompt / median prefill time
 * The median over `runs` runs is reported, one line per batch size.
 *
 * Check, before timing each batch size: one untimed run of the same batch that also
 * returns the logits of every position (prompt positions and each decode step; the buffer
 * is poisoned with NaN first). Every sequence is then run again alone on a second engine
 * (page size 1 instead of 16) as one prefill of its prompt followed by the tokens the batch
 * generated: the same positions, so each row of logits has a reference from another path
 * (batched vs alone, absorbed decode over the latent cache vs the prefill's expanded causal
 * attention, another page layout).
 * Error model: both are fp32 on the same weights and differ only in the order of fp32
 * sums (absorption re-associates the attention products, batching and paging change
 * nothing else), each step's rounding ~2^-24 relative, so a sequence's logits agree to a
 * relative L2 of ~1e-6; the bound is 1e-5, the fp32-path bound of the engine's unit tests
 * (test_engine: absorbed vs expanded decode, a sequence in a batch vs alone). A logit left
 * unwritten stays NaN and fails. A failed check prints the batch size, the sequence and
 * the error, no figure for that batch size, and makes the program exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_util.h"
#include "core/log.h"
#include "model/generate.h"
#include "model/model.h"

#define MAX_BATCHES 16
#define LOGITS_TOL 1e-5

static char g_table[MAX_BATCHES][96];
static int g_table_rows;

static void usage(FILE *f) {
  fprintf(f, "usage: bench_cpu_decode [--model M] [--batch 1,16] [--prompt N] [--new N] [--runs N] "
             "[--threads N]\n");
}

static ina_engine_t *make_engine(const ina_model_t *model, int64_t max_tokens, int threads,
                                 int32_t page_size, int expanded_decode) {
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  ina_engine_t *engine = NULL;
  eo.max_tokens = max_tokens;
  eo.num_threads = threads;
  eo.page_size = page_size;
  eo.expanded_decode = expanded_decode;
  if (ina_engine_create(model, &eo, &engine) != INA_OK) {
    fprintf(stderr, "bench_cpu_decode: %s\n", ina_last_error());
    return NULL;
  }
  return engine;
}

static void fill_requests(ina_generate_request_t *reqs, int batch, const int32_t *prompts,
                          int32_t prompt, int32_t new_tokens, int32_t *outputs, float *logits,
                          int64_t vocab) {
  const int64_t rows = prompt + new_tokens - 1;
  for (int b = 0; b < batch; b++) {
    ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT; /* greedy */
    memset(&reqs[b], 0, sizeof reqs[b]);
    reqs[b].prompt = prompts + (size_t)b * prompt;
    reqs[b].prompt_len = prompt;
    reqs[b].max_new_tokens = new_tokens;
    reqs[b].sampling = sp;
    reqs[b].ignore_eos = 1;
    reqs[b].output = outputs + (size_t)b * new_tokens;
    reqs[b].logits = logits ? logits + (size_t)(b * rows * vocab) : NULL;
  }
}

/* The check run of one batch size (see the top of this file). Returns 1 when it passed. */
static int check_batch(const ina_model_t *model, ina_engine_t *engine, int batch,
                       const int32_t *prompts, int32_t prompt, int32_t new_tokens, int threads) {
  const int64_t vocab = ina_model_config(model)->vocab_size, rows = prompt + new_tokens - 1;
  const int64_t per_seq = rows * vocab;
  char what[64];
  int ok = 0;
  snprintf(what, sizeof what, "cpu_decode_b%d", batch);
  ina_generate_request_t *reqs = calloc((size_t)batch, sizeof *reqs);
  int32_t *outputs = malloc((size_t)batch * new_tokens * sizeof *outputs);
  int32_t *sequence = malloc((size_t)rows * sizeof *sequence);
  float *logits = malloc((size_t)(batch * per_seq) * sizeof *logits);
  float *ref = malloc((size_t)per_seq * sizeof *ref);
  ina_engine_t *alone = make_engine(model, rows + 16, threads, 1, 0);
  if (!reqs || !outputs || !sequence || !logits || !ref || !alone) {
    ok = ina_bench_check_failed(what, "setup failed (memory or the reference engine)");
    goto done;
  }
  ina_bench_poison_nan(logits, batch * per_seq);
  fill_requests(reqs, batch, prompts, prompt, new_tokens, outputs, logits, vocab);
  if (ina_generate(engine, reqs, batch, NULL) != INA_OK) {
    ok = ina_bench_check_failed(what, "the batch failed: %s", ina_last_error());
    goto done;
  }
  double worst = 0;
  int worst_seq = -1;
  for (int b = 0; b < batch; b++) {
    const int64_t nonfinite = ina_bench_count_nonfinite(logits + b * per_seq, per_seq);
    if (nonfinite) {
      ok = ina_bench_check_failed(what, "sequence %d: %lld of %lld logits are NaN or infinite", b,
                                  (long long)nonfinite, (long long)per_seq);
      goto done;
    }
    /* The same positions in one prefill: the prompt, then the tokens the batch generated
     * (the last one is not fed back). */
    memcpy(sequence, prompts + (size_t)b * prompt, (size_t)prompt * sizeof *sequence);
    memcpy(sequence + prompt, outputs + (size_t)b * new_tokens,
           (size_t)(new_tokens - 1) * sizeof *sequence);
    int32_t next = 0;
    ina_generate_request_t r;
    fill_requests(&r, 1, sequence, (int32_t)rows, 1, &next, ref, vocab);
    ina_bench_poison_nan(ref, per_seq);
    if (ina_generate(alone, &r, 1, NULL) != INA_OK) {
      ok = ina_bench_check_failed(what, "reference of sequence %d: %s", b, ina_last_error());
      goto done;
    }
    const double err = ina_bench_rel_l2_f32(logits + b * per_seq, ref, per_seq);
    if (!(err <= worst)) worst = err, worst_seq = b; /* NaN-safe */
  }
  char measure[128];
  snprintf(measure, sizeof measure,
           "worst_sequence_rel_l2_vs_alone_expanded_prefill(seq_%d,%lld_positions)", worst_seq,
           (long long)rows);
  ok = ina_bench_check(what, measure, worst, LOGITS_TOL);
done:
  ina_engine_destroy(alone);
  free(reqs);
  free(outputs);
  free(sequence);
  free(logits);
  free(ref);
  return ok;
}

int main(int argc, char **argv) {
  const char *model_spec = "tiny", *batches = "1,16";
  int prompt = 32, new_tokens = 64, runs = 5, threads = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      usage(stderr);
      return 2;
    }
    if (strcmp(argv[i], "--model") == 0) model_spec = argv[++i];
    else if (strcmp(argv[i], "--batch") == 0) batches = argv[++i];
    else if (strcmp(argv[i], "--prompt") == 0) prompt = atoi(argv[++i]);
    else if (strcmp(argv[i], "--new") == 0) new_tokens = atoi(argv[++i]);
    else if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[++i]);
    else if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[++i]);
    else {
      usage(stderr);
      return 2;
    }
  }
  int64_t batch_list[MAX_BATCHES];
  int num_batches = 0;
  if (prompt < 1 || new_tokens < 2 || runs < 1 ||
      ina_bench_parse_list(batches, 1, 4096, batch_list, MAX_BATCHES, &num_batches)) {
    fprintf(stderr, "bench_cpu_decode: --prompt >= 1, --new >= 2, --runs >= 1, --batch a list of "
                    "at most %d sizes in [1, 4096]\n",
            MAX_BATCHES);
    return 2;
  }
  ina_model_t *model = NULL;
  if (ina_model_open(model_spec, NULL, &model) != INA_OK) {
    fprintf(stderr, "bench_cpu_decode: %s\n", ina_last_error());
    return 1;
  }
  const int32_t vocab = ina_model_config(model)->vocab_size;
  printf("# model %s, prompt %d, new %d, runs %d (median)\n", model_spec, prompt, new_tokens, runs);
  for (int k = 0; k < num_batches; k++) {
    const int batch = (int)batch_list[k];
    ina_engine_t *engine = make_engine(model, (int64_t)batch * (prompt + new_tokens + 16), threads,
                                       16, 0);
    if (!engine) return 1;
    ina_generate_request_t *reqs = calloc((size_t)batch, sizeof *reqs);
    int32_t *prompts = malloc((size_t)batch * prompt * sizeof(int32_t));
    int32_t *outputs = malloc((size_t)batch * new_tokens * sizeof(int32_t));
    double *decode = malloc((size_t)runs * sizeof(double)), *prefill = malloc((size_t)runs * sizeof(double));
    if (!reqs || !prompts || !outputs || !decode || !prefill) {
      fprintf(stderr, "bench_cpu_decode: out of memory\n");
      return 1;
    }
    uint64_t s = 12345;
    ina_bench_random_tokens(&s, vocab, prompts, (int64_t)batch * prompt);
    if (check_batch(model, engine, batch, prompts, prompt, new_tokens, threads)) {
      for (int r = 0; r < runs; r++) {
        fill_requests(reqs, batch, prompts, prompt, new_tokens, outputs, NULL, vocab);
        ina_generate_stats_t st;
        if (ina_generate(engine, reqs, batch, &st) != INA_OK) {
          fprintf(stderr, "bench_cpu_decode: %s\n", ina_last_error());
          return 1;
        }
        decode[r] = st.decode_seconds / st.decode_steps;
        prefill[r] = st.prefill_seconds;
      }
      const double step = ina_bench_median(decode, runs);
      snprintf(g_table[g_table_rows++], sizeof g_table[0], "%7d  %12.1f  %13.1f  %7.3f", batch,
               batch / step, (double)batch * prompt / ina_bench_median(prefill, runs), step * 1e3);
    } else {
      snprintf(g_table[g_table_rows++], sizeof g_table[0], "%7d  %12s  %13s  %7s", batch, "failed",
               "failed", "-");
    }
    free(reqs);
    free(prompts);
    free(outputs);
    free(decode);
    free(prefill);
    ina_engine_destroy(engine);
  }
  ina_model_destroy(model);
  printf("# batch  decode_tok_s  prefill_tok_s  step_ms\n");
  for (int r = 0; r < g_table_rows; r++) printf("%s\n", g_table[r]);
  const int failed = ina_bench_checks_failed();
  printf("checks: %d of %d passed%s\n", ina_bench_checks_run() - failed, ina_bench_checks_run(),
         failed ? "; the failed batch sizes have no figures" : "");
  return failed ? 1 : 0;
}
