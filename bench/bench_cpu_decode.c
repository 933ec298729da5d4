/* CPU decode and prefill throughput of a model on the CPU engine.
 *
 *   bench_cpu_decode [--model tiny] [--batch 1,16] [--prompt 32] [--new 64] [--runs 5]
 *
 * For each batch size: `batch` prompts of `prompt` random tokens are prefilled together,
 * then `new` greedy decode steps run for all of them (eos ignored). Figures:
 *   decode tokens/s  = batch * (new - 1) / decode seconds   (each step adds batch tokens)
 *   prefill tokens/s = batch * prompt / prefill seconds
 * The median over `runs` runs is reported, one line per batch size. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "model/generate.h"
#include "model/model.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const char *model_spec = "tiny", *batches = "1,16";
  int prompt = 32, new_tokens = 64, runs = 5, threads = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0) {
      printf("usage: bench_cpu_decode [--model M] [--batch 1,16] [--prompt N] [--new N] [--runs N] [--threads N]\n");
      return 0;
    }
    if (i + 1 >= argc) break;
    if (strcmp(argv[i], "--model") == 0) model_spec = argv[++i];
    else if (strcmp(argv[i], "--batch") == 0) batches = argv[++i];
    else if (strcmp(argv[i], "--prompt") == 0) prompt = atoi(argv[++i]);
    else if (strcmp(argv[i], "--new") == 0) new_tokens = atoi(argv[++i]);
    else if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[++i]);
    else if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[++i]);
  }
  if (prompt < 1 || new_tokens < 2 || runs < 1) {
    fprintf(stderr, "bench_cpu_decode: --prompt >= 1, --new >= 2, --runs >= 1\n");
    return 2;
  }
  ina_model_t *model = NULL;
  if (ina_model_open(model_spec, NULL, &model) != INA_OK) {
    fprintf(stderr, "bench_cpu_decode: %s\n", ina_last_error());
    return 1;
  }
  const int32_t vocab = ina_model_config(model)->vocab_size;
  printf("# model %s, prompt %d, new %d, runs %d (median)\n", model_spec, prompt, new_tokens, runs);
  printf("# batch  decode_tok_s  prefill_tok_s  step_ms\n");
  for (const char *p = batches; *p;) {
    int batch = atoi(p);
    while (*p && *p != ',') p++;
    if (*p == ',') p++;
    if (batch < 1) continue;
    ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
    eo.max_tokens = (int64_t)batch * (prompt + new_tokens + 16);
    eo.num_threads = threads;
    ina_engine_t *engine = NULL;
    if (ina_engine_create(model, &eo, &engine) != INA_OK) {
      fprintf(stderr, "bench_cpu_decode: %s\n", ina_last_error());
      return 1;
    }
    ina_generate_request_t *reqs = calloc((size_t)batch, sizeof *reqs);
    int32_t *prompts = malloc((size_t)batch * prompt * sizeof(int32_t));
    int32_t *outputs = malloc((size_t)batch * new_tokens * sizeof(int32_t));
    double *decode = malloc((size_t)runs * sizeof(double)), *prefill = malloc((size_t)runs * sizeof(double));
    uint64_t s = 12345;
    for (int i = 0; i < batch * prompt; i++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      prompts[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
    }
    for (int r = 0; r < runs; r++) {
      for (int b = 0; b < batch; b++) {
        ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
        memset(&reqs[b], 0, sizeof reqs[b]);
        reqs[b].prompt = prompts + (size_t)b * prompt;
        reqs[b].prompt_len = prompt;
        reqs[b].max_new_tokens = new_tokens;
        reqs[b].sampling = sp;
        reqs[b].ignore_eos = 1;
        reqs[b].output = outputs + (size_t)b * new_tokens;
      }
      ina_generate_stats_t st;
      if (ina_generate(engine, reqs, batch, &st) != INA_OK) {
        fprintf(stderr, "bench_cpu_decode: %s\n", ina_last_error());
        return 1;
      }
      decode[r] = st.decode_seconds / st.decode_steps;
      prefill[r] = st.prefill_seconds;
    }
    qsort(decode, (size_t)runs, sizeof *decode, cmp_double);
    qsort(prefill, (size_t)runs, sizeof *prefill, cmp_double);
    const double step = decode[runs / 2];
    printf("%7d  %12.1f  %13.1f  %7.3f\n", batch, batch / step, (double)batch * prompt / prefill[runs / 2],
           step * 1e3);
    free(reqs);
    free(prompts);
    free(outputs);
    free(decode);
    free(prefill);
    ina_engine_destroy(engine);
  }
  ina_model_destroy(model);
  return 0;
}
