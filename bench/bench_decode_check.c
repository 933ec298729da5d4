/* bench_decode's check before it times: the benchmark's own engine (its model, page size,
 * graphs and largest batch) against the GPU engine's oracle (tests/model/oracle.h: the CPU
 * engine rounding where the GPU does, bounds from noisy twins of it).
 *
 * `batch` sequences (at most ORACLE_MAX_SEQS, 256) of random prompts of
 * 1..CHECK_MAX_PROMPT tokens run as one prefill
 * (every position's logits), then one decode step of a random token each, on the GPU
 * (a graph replay of the batch's bucket). The oracle runs the first CHECK_SEQS of them
 * alike, from the same random weights generated on the host (bit for bit the device's:
 * test_gpu_random_weights); each of their rows, prefill and decode apart, must lie within
 * the bounds of CHECK_TWINS twins (fewer than the tests' 32: a twin of a 16B-parameter
 * model takes seconds on the host). */
#define INA_LOG_SUBSYS "bench"
#include "bench/bench_decode_check.h"

#include "tests/model/oracle.h"

#define CHECK_SEQS 4
#define CHECK_MAX_PROMPT 8
#define CHECK_TWINS 4

static uint64_t next_random(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int bench_decode_check(ina_engine_t *gpu, const char *spec, const ina_model_options_t *weights, int32_t page_size,
                       int64_t batch, uint64_t *rng, const char *what, int *undecided) {
  const int32_t vocab = ina_engine_config(gpu)->vocab_size;
  if (batch > ORACLE_MAX_SEQS) batch = ORACLE_MAX_SEQS;
  const int32_t n = batch < CHECK_SEQS ? (int32_t)batch : CHECK_SEQS;
  int32_t *lens = malloc((size_t)batch * sizeof *lens);
  int32_t **prompts = calloc((size_t)batch, sizeof *prompts);
  int32_t (*next)[ORACLE_MAX_STEPS] = calloc((size_t)batch, sizeof *next);
  ina_model_options_t mo = *weights;
  ina_model_t *host = NULL;
  ina_engine_t *oracle = NULL;
  oracle_run_t got, want;
  oracle_twins_t *twins = calloc(1, sizeof *twins);
  int ok = 0;
  *undecided = 0;
  memset(&got, 0, sizeof got);
  memset(&want, 0, sizeof want);
  if (!lens || !prompts || !next || !twins) goto done;
  for (int64_t k = 0; k < batch; k++) {
    lens[k] = 1 + (int32_t)(next_random(rng) % CHECK_MAX_PROMPT);
    prompts[k] = malloc((size_t)lens[k] * sizeof **prompts);
    if (!prompts[k]) goto done;
    for (int32_t t = 0; t < lens[k]; t++) prompts[k][t] = (int32_t)(next_random(rng) % (uint64_t)vocab);
    next[k][0] = (int32_t)(next_random(rng) % (uint64_t)vocab);
  }
  /* The whole batch on the GPU; the oracle's sequences are its first n. */
  if (oracle_forced_run(gpu, prompts, lens, (int32_t)batch, (const int32_t(*)[ORACLE_MAX_STEPS])next, 1, 1, &got) !=
      0) {
    fprintf(stderr, "check %s: the GPU run failed: %s\n", what, ina_last_error());
    goto done;
  }
  for (int32_t k = n; k < got.n; k++) {
    free(got.logits[k]);
    free(got.route[k]);
    free(got.tied[k]);
    got.logits[k] = NULL, got.route[k] = NULL, got.tied[k] = NULL;
  }
  got.n = n;
  mo.random_on_device = 0;
  fprintf(stderr, "check %s: the oracle builds %s's random weights on the host\n", what, spec);
  if (ina_model_open(spec, &mo, &host) != INA_OK) {
    fprintf(stderr, "check %s: host weights: %s\n", what, ina_last_error());
    goto done;
  }
  {
    ina_engine_options_t o = INA_ENGINE_OPTIONS_INIT;
    oracle_bound_t bound;
    oracle_rows_t rows;
    o.page_size = page_size;
    o.max_tokens = (int64_t)n * page_size * ((CHECK_MAX_PROMPT + 1 + page_size - 1) / page_size); /* a page each */
    o.numerics = INA_ENGINE_NUMERICS_GPU;
    CHECK_OK(ina_engine_create(host, &o, &oracle));
    if (!oracle ||
        oracle_forced_run(oracle, prompts, lens, n, (const int32_t(*)[ORACLE_MAX_STEPS])next, 1, 1, &want) != 0 ||
        oracle_twins_make_n(host, &o, prompts, lens, n, (const int32_t(*)[ORACLE_MAX_STEPS])next, 1, 1, 0, CHECK_TWINS,
                            &want, twins) != 0) {
      fprintf(stderr, "check %s: the oracle's runs failed: %s\n", what, ina_last_error());
      goto done;
    }
    oracle_twins_bound(twins, &want, &bound);
    oracle_compare(&got, &want, &rows);
    ok = oracle_accepts(&rows, &bound);
    /* A random router over many experts puts its top scores within the noise: then every
     * row sits at a near-tie, and only finiteness is checked (said, and returned). */
    *undecided = ok && rows.prefill + rows.decode == 0;
    fprintf(stderr,
            "check %s %s: sequences 0-%d of a batch of %lld: prefill %lld rows max %.2e (bound %.2e), decode %lld "
            "rows max %.2e (bound %.2e), %lld after a routing near-tie, %lld non-finite\n",
            what, !ok ? "FAILED" : *undecided ? "UNDECIDED (every row near a routing tie; finite)" : "ok", n - 1,
            (long long)batch, (long long)rows.prefill, rows.max_prefill, bound.prefill, (long long)rows.decode,
            rows.max_decode, bound.decode, (long long)rows.tied, (long long)rows.nonfinite);
  }
done:
  for (int64_t k = 0; prompts && k < batch; k++) free(prompts[k]);
  free(prompts);
  free(lens);
  free(next);
  oracle_run_free(&got);
  oracle_run_free(&want);
  if (twins) oracle_twins_free(twins);
  free(twins);
  ina_engine_destroy(oracle);
  ina_model_destroy(host);
  return ok && test_checks_failed_ == 0;
}
