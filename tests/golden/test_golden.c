/* The CPU engine against Hugging Face transformers: every fixture under
 * tests/golden/fixtures (made by make_fixtures.py, format in README.md there) is loaded
 * with ina's loader and run three ways: each prompt alone with page size 1, each alone
 * with page size 16, and all prompts as one ragged batch. Logits must match HF's to a
 * relative L2 error of 1e-4 and greedy tokens must be identical.
 *
 * The bound is the fp32 bound for every fixture, bf16 and fp8 ones included:
 * the CPU engine computes in fp32 on the stored weights, exactly the computation HF ran
 * in float32 on the same (dequantized) weights.
 *
 * Every directory under the root is a fixture and must load and run; fewer than
 * MIN_FIXTURES of them (the fixtures of README.md's table) fail the test, so that a
 * missing or unreadable fixture cannot leave it passing on the rest. */
#include <string.h>

#include "core/json.h"
#include "core/log.h"
#include "core/npy.h"
#include "model/generate.h"
#include "model/model.h"
#include "../test_util.h"
#include "golden_fixture.h"

#define BOUND 1e-4
#define MIN_FIXTURES 17

/* Run the prompts [first, first + n) as one batch and compare each with HF. */
static void run_and_compare(const fixture_t *f, const ina_model_t *m, int32_t page_size, int32_t first,
                            int32_t n, const char *how) {
  const int32_t vocab = ina_model_config(m)->vocab_size;
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  eo.page_size = page_size;
  eo.max_tokens = 4096;
  eo.num_threads = 2;
  ina_engine_t *e = NULL;
  CHECK_OK(ina_engine_create(m, &eo, &e));
  if (!e) return;
  ina_generate_request_t r[GOLDEN_MAX_PROMPTS];
  memset(r, 0, sizeof r);
  for (int32_t k = 0; k < n; k++) {
    const int32_t p = first + k;
    ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
    r[k].prompt = f->prompts[p];
    r[k].prompt_len = f->lens[p];
    r[k].max_new_tokens = f->max_new;
    r[k].sampling = sp;
    r[k].ignore_eos = 1;
    r[k].output = malloc((size_t)f->max_new * sizeof(int32_t));
    r[k].logits = malloc((size_t)(f->lens[p] + f->max_new) * vocab * sizeof(float));
    test_poison_f32(r[k].logits, (size_t)(f->lens[p] + f->max_new) * vocab);
  }
  CHECK_OK(ina_generate(e, r, n, NULL));
  for (int32_t k = 0; k < n; k++) {
    const int32_t p = first + k;
    const int64_t rows = f->lens[p] + f->max_new - 1;
    const ina_tensor_t *want = &f->logits[p];
    CHECK(want->ndim == 2 && want->shape[0] == rows && want->shape[1] == vocab);
    if (want->ndim == 2 && want->shape[0] == rows && want->shape[1] == vocab) {
      double err = test_rel_l2(r[k].logits, want->data, (size_t)(rows * vocab));
      CHECKF(err <= BOUND, "%s prompt %d (%s, page %d): rel l2 %.3g > %g", f->dir, p, how, page_size, err, BOUND);
      if (page_size == 1 && n == 1) printf("  prompt %d: rel l2 %.2e\n", p, err);
    }
    CHECKF(memcmp(r[k].output, f->generated[p], (size_t)f->max_new * sizeof(int32_t)) == 0,
           "%s prompt %d (%s, page %d): greedy tokens differ from HF", f->dir, p, how, page_size);
    free(r[k].output);
    free(r[k].logits);
  }
  ina_engine_destroy(e);
}

int main(int argc, char **argv) {
  const char *root = argc > 1 ? argv[1] : "tests/golden/fixtures";
  char *names[GOLDEN_MAX_FIXTURES];
  const int count = golden_fixture_names(root, names);
  int compared = 0;
  CHECKF(count >= MIN_FIXTURES, "only %d fixtures in %s, %d expected", count, root, MIN_FIXTURES);
  for (int i = 0; i < count; i++) {
    char dir[512];
    fixture_t f;
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    printf("%s\n", names[i]);
    CHECKF(load_fixture(dir, &f) == 0, "%s: cannot read the fixture", dir);
    ina_model_t *m = NULL;
    CHECK_OK(ina_model_open(dir, NULL, &m));
    if (m && f.count > 0) {
      compared++;
      for (int32_t p = 0; p < f.count; p++) {
        run_and_compare(&f, m, 1, p, 1, "alone");
        run_and_compare(&f, m, 16, p, 1, "alone");
      }
      run_and_compare(&f, m, 16, 0, f.count, "batched");
      run_and_compare(&f, m, 1, 0, f.count, "batched");
    }
    ina_model_destroy(m);
    free_fixture(&f);
    free(names[i]);
  }
  printf("test_golden: %d of %d fixtures compared\n", compared, count);
  CHECKF(compared == count && compared >= MIN_FIXTURES, "%d of %d fixtures compared, at least %d required",
         compared, count, MIN_FIXTURES);
  return test_finish("test_golden");
}
