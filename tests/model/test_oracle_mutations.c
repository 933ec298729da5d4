/* The mutation table of the GPU engine's oracle (tests/model/oracle.h): each deliberate bug
 * of model/engine_test_hooks.h, applied to the oracle itself (the CPU engine in GPU
 * numerics, standing in for a CUDA engine with that bug), must be rejected by the very
 * comparison and bounds test_engine_gpu holds the CUDA engine to, on at least one golden
 * fixture. The same runs show the oracle accepting a noisy twin of itself (which it must,
 * or the bounds would reject a correct engine) and its distance from Hugging Face's fp32
 * logits (bf16 numerics against fp32; printed, not bounded here).
 *
 * Each fixture runs batched, page size 16, teacher forced on HF's tokens; a cell of the
 * table is the worse of the two ratios max row error / bound (prefill, decode), "R" when
 * rejected, "." when the mutation changed nothing on that fixture (it does not apply
 * there: no YaRN mscale, no FP8, rope_theta at its default, ...). CPU only. */
#include <string.h>

#include "core/log.h"
#include "model/engine_test_hooks.h"
#include "model/model.h"
#include "oracle.h"
#include "../golden/golden_fixture.h"

_Static_assert(ORACLE_MAX_STEPS >= GOLDEN_MAX_NEW && ORACLE_MAX_SEQS >= GOLDEN_MAX_PROMPTS,
               "the oracle's runs hold a golden fixture");

static ina_engine_options_t oracle_options(void) {
  ina_engine_options_t o = INA_ENGINE_OPTIONS_INIT;
  o.page_size = 16;
  o.max_tokens = 4096;
  o.num_threads = 2;
  o.numerics = INA_ENGINE_NUMERICS_GPU;
  return o;
}

static double ratio(double err, double bound) { return bound > 0 ? err / bound : (err > 0 ? INFINITY : 0); }

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : "tests/golden/fixtures";
  char *names[GOLDEN_MAX_FIXTURES];
  const int count = golden_fixture_names(root, names);
  int rejected[INA_MUTATION_COUNT] = {0}, applied[INA_MUTATION_COUNT] = {0};
  char cell[INA_MUTATION_COUNT][GOLDEN_MAX_FIXTURES][16];
  CHECKF(count >= 9, "only %d fixtures in %s", count, root);
  memset(cell, 0, sizeof cell);
  for (int i = 0; i < count; i++) {
    char dir[512];
    fixture_t f;
    ina_model_t *m = NULL;
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    CHECKF(load_fixture(dir, &f) == 0, "%s: cannot read the fixture", dir);
    CHECK_OK(ina_model_open(dir, NULL, &m));
    if (!m || f.count == 0) goto next;
    {
      const ina_engine_options_t o = oracle_options();
      const int32_t steps = f.max_new - 1;
      ina_engine_t *e = NULL;
      oracle_run_t base, twin_free;
      oracle_bound_t bound = {0, 0};
      oracle_rows_t rows;
      CHECK_OK(ina_engine_create(m, &o, &e));
      if (!e) goto next;
      CHECK(oracle_forced_run(e, f.prompts, f.lens, f.count, (const int32_t(*)[ORACLE_MAX_STEPS])f.generated, steps,
                              1, &base) == 0);
      CHECK(oracle_twin_bound(m, &o, f.prompts, f.lens, f.count, (const int32_t(*)[ORACLE_MAX_STEPS])f.generated,
                              steps, 1, &base, &bound) == 0);
      printf("%s\n", names[i]);
      {
        /* Against HF (fp32): how far bf16 numerics are from it, for the record. */
        oracle_run_t hf = base;
        for (int32_t p = 0; p < f.count; p++) hf.logits[p] = f.logits[p].data;
        oracle_compare(&base, &hf, &rows);
        printf("  %-30s prefill max %.2e, decode max %.2e (bf16 numerics vs fp32; not bounded)\n", "oracle vs HF",
               rows.max_prefill, rows.max_decode);
      }
      /* A noisy twin with another seed: a correct engine, which the bounds must let pass. */
      {
        ina_engine_t *t = NULL;
        CHECK_OK(ina_engine_create(m, &o, &t));
        const ina_engine_noise_t noise = oracle_noise(ina_model_config(m), 0xfeedull + (uint64_t)i);
        CHECK_OK(ina_engine_set_rounding_noise(t, &noise));
        if (t && oracle_forced_run(t, f.prompts, f.lens, f.count, (const int32_t(*)[ORACLE_MAX_STEPS])f.generated,
                                   steps, 1, &twin_free) == 0) {
          oracle_compare(&twin_free, &base, &rows);
          oracle_print("another noisy twin", &rows, &bound);
          CHECKF(oracle_accepts(&rows, &bound), "%s: the oracle rejects a noisy twin of itself", names[i]);
          CHECKF(oracle_enough_rows(&rows), "%s: too few rows clear of near-ties (%lld of %lld)", names[i],
                 (long long)(rows.prefill + rows.decode), (long long)(rows.prefill + rows.decode + rows.tied));
        }
        oracle_run_free(&twin_free);
        ina_engine_destroy(t);
      }
      for (int32_t mu = 1; mu < INA_MUTATION_COUNT; mu++) {
        oracle_run_t got;
        CHECK_OK(ina_engine_set_mutation(e, mu));
        if (oracle_forced_run(e, f.prompts, f.lens, f.count, (const int32_t(*)[ORACLE_MAX_STEPS])f.generated, steps, 1,
                              &got) == 0) {
          oracle_compare(&got, &base, &rows);
          const double r = fmax(ratio(rows.max_prefill, bound.prefill), ratio(rows.max_decode, bound.decode));
          const int changed = rows.max_prefill > 0 || rows.max_decode > 0 || rows.nonfinite > 0;
          const int rej = !oracle_accepts(&rows, &bound);
          applied[mu] += changed;
          rejected[mu] += rej;
          if (!changed)
            snprintf(cell[mu][i], sizeof cell[mu][i], ".");
          else
            snprintf(cell[mu][i], sizeof cell[mu][i], "%s%.3g", rej ? "R " : "", r);
        }
        oracle_run_free(&got);
      }
      CHECK_OK(ina_engine_set_mutation(e, INA_MUTATION_NONE));
      oracle_run_free(&base);
      ina_engine_destroy(e);
    }
  next:
    ina_model_destroy(m);
    free_fixture(&f);
  }
  printf("\nmutation table: worst max-row-error / bound per fixture (R: rejected; .: no change)\n");
  printf("%-46s", "mutation");
  for (int i = 0; i < count; i++) printf(" %-13.13s", names[i]);
  printf("\n");
  for (int32_t mu = 1; mu < INA_MUTATION_COUNT; mu++) {
    printf("%-46s", ina_engine_mutation_name(mu));
    for (int i = 0; i < count; i++) printf(" %-13s", cell[mu][i]);
    printf("  rejected on %d of %d\n", rejected[mu], applied[mu]);
    CHECKF(rejected[mu] > 0, "mutation '%s' passes the oracle on every fixture", ina_engine_mutation_name(mu));
  }
  for (int i = 0; i < count; i++) free(names[i]);
  return test_finish("test_oracle_mutations");
}
