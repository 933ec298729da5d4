/* The oracle's mutation table on the GPU: each deliberate bug of model/engine_test_hooks.h
 * that the CUDA engine can apply (ina_engine_set_mutation) must make it fail the very
 * comparison test_engine_gpu holds it to (tests/model/oracle.h: the CPU engine in GPU
 * numerics, bounded by its noisy twins) on at least one golden fixture, while the
 * unmutated CUDA engine passes on every one. Mutations the CUDA engine does not apply are
 * listed as such. Teacher forced on HF's tokens, batched, page size 16, decode steps from
 * CUDA graphs. Labelled gpu: skipped (77) without a device; a fixture the CUDA engine
 * refuses is left out, with its reason. */
#include <math.h>
#include <string.h>

#include "core/log.h"
#include "model/engine_test_hooks.h"
#include "model/model.h"
#include "oracle.h"
#include "../golden/golden_fixture.h"
#include "tests/gpu_test_util.h"

_Static_assert(ORACLE_MAX_STEPS >= GOLDEN_MAX_NEW && ORACLE_MAX_SEQS >= GOLDEN_MAX_PROMPTS,
               "the oracle's runs hold a golden fixture");

static ina_engine_options_t options(int32_t device) {
  ina_engine_options_t o = INA_ENGINE_OPTIONS_INIT;
  o.page_size = 16;
  o.max_tokens = 4096;
  o.num_threads = 2;
  o.device = device;
  if (device < 0) o.numerics = INA_ENGINE_NUMERICS_GPU;
  return o;
}

static double ratio(double err, double bound) { return bound > 0 ? err / bound : (err > 0 ? INFINITY : 0); }

int main(int argc, char **argv) {
  const int skip = test_require_gpus("test_engine_gpu_mutations", 1);
  if (skip) return skip;
  const char *root = argc > 1 ? argv[1] : "tests/golden/fixtures";
  char *names[GOLDEN_MAX_FIXTURES];
  const int count = golden_fixture_names(root, names);
  int rejected[INA_MUTATION_COUNT] = {0}, applied[INA_MUTATION_COUNT] = {0}, supported[INA_MUTATION_COUNT] = {0};
  char cell[INA_MUTATION_COUNT][GOLDEN_MAX_FIXTURES][16];
  int ran = 0;
  CHECKF(count >= 9, "only %d fixtures in %s", count, root);
  memset(cell, 0, sizeof cell);
  for (int i = 0; i < count; i++) {
    char dir[512];
    fixture_t f;
    ina_model_t *m = NULL;
    ina_engine_t *oracle = NULL, *gpu = NULL;
    oracle_run_t base, got, clean; /* clean: the unmutated CUDA engine's run */
    oracle_bound_t bound = {0, 0};
    oracle_rows_t rows;
    memset(&base, 0, sizeof base);
    memset(&got, 0, sizeof got);
    memset(&clean, 0, sizeof clean);
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    CHECKF(load_fixture(dir, &f) == 0, "%s: cannot read the fixture", dir);
    CHECK_OK(ina_model_open(dir, NULL, &m));
    if (!m || f.count == 0) goto next;
    const int32_t steps = f.max_new - 1;
    const int32_t(*forced)[ORACLE_MAX_STEPS] = (const int32_t(*)[ORACLE_MAX_STEPS])f.generated;
    const ina_engine_options_t oo = options(-1), go = options(0);
    if (ina_engine_create(m, &go, &gpu) != INA_OK) {
      printf("%s: left out (%s)\n", names[i], ina_last_error());
      for (int32_t mu = 1; mu < INA_MUTATION_COUNT; mu++) snprintf(cell[mu][i], sizeof cell[mu][i], "-");
      goto next;
    }
    CHECK_OK(ina_engine_create(m, &oo, &oracle));
    if (!oracle) goto next;
    CHECK(oracle_forced_run(oracle, f.prompts, f.lens, f.count, forced, steps, 1, &base) == 0);
    CHECK(oracle_twin_bound(m, &oo, f.prompts, f.lens, f.count, forced, steps, 1, &base, &bound) == 0);
    printf("%s\n", names[i]);
    ran++;
    if (oracle_forced_run(gpu, f.prompts, f.lens, f.count, forced, steps, 1, &clean) == 0) {
      oracle_compare(&clean, &base, &rows);
      oracle_print("CUDA engine, no mutation", &rows, &bound);
      CHECKF(oracle_accepts(&rows, &bound), "%s: the unmutated CUDA engine fails the oracle", names[i]);
    }
    for (int32_t mu = 1; mu < INA_MUTATION_COUNT; mu++) {
      const ina_status_t st = ina_engine_set_mutation(gpu, mu);
      if (st == INA_ERR_UNSUPPORTED) {
        snprintf(cell[mu][i], sizeof cell[mu][i], "n/a");
        continue;
      }
      CHECK_OK(st);
      supported[mu] = 1;
      if (oracle_forced_run(gpu, f.prompts, f.lens, f.count, forced, steps, 1, &got) == 0) {
        oracle_compare(&got, &base, &rows);
        const double r = fmax(ratio(rows.max_prefill, bound.prefill), ratio(rows.max_decode, bound.decode));
        const int rej = !oracle_accepts(&rows, &bound);
        oracle_rows_t moved; /* did the mutation change anything here (v3_dense has no MoE, ...)? */
        oracle_compare(&got, &clean, &moved);
        const int changed = moved.max_prefill > 0 || moved.max_decode > 0 || moved.nonfinite > 0;
        applied[mu] += changed;
        rejected[mu] += rej;
        if (!changed) snprintf(cell[mu][i], sizeof cell[mu][i], ".");
        else snprintf(cell[mu][i], sizeof cell[mu][i], "%s%.3g", rej ? "R " : "", r);
      }
      oracle_run_free(&got);
    }
    CHECK_OK(ina_engine_set_mutation(gpu, INA_MUTATION_NONE));
  next:
    oracle_run_free(&base);
    oracle_run_free(&clean);
    ina_engine_destroy(gpu);
    ina_engine_destroy(oracle);
    ina_model_destroy(m);
    free_fixture(&f);
  }
  CHECKF(ran >= 9, "only %d fixtures ran on the CUDA engine", ran);
  printf("\nmutation table on the CUDA engine: worst max-row-error / bound per fixture (R: rejected; .: no change; n/a: "
         "not applied by the CUDA engine; -: fixture left out)\n");
  printf("%-46s", "mutation");
  for (int i = 0; i < count; i++) printf(" %-13.13s", names[i]);
  printf("\n");
  for (int32_t mu = 1; mu < INA_MUTATION_COUNT; mu++) {
    printf("%-46s", ina_engine_mutation_name(mu));
    for (int i = 0; i < count; i++) printf(" %-13s", cell[mu][i]);
    if (supported[mu]) printf("  rejected on %d of %d\n", rejected[mu], applied[mu]);
    else printf("  not applied by the CUDA engine\n");
    if (supported[mu])
      CHECKF(rejected[mu] > 0, "mutation '%s' passes the oracle on every fixture", ina_engine_mutation_name(mu));
  }
  for (int i = 0; i < count; i++) free(names[i]);
  return test_finish("test_engine_gpu_mutations");
}
