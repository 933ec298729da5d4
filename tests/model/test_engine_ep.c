/* Expert parallelism of the CPU engine under mpirun (2, 3 or 4 ranks): every rank opens
 * each golden fixture twice, whole and with its share of the routed experts (contiguous
 * ranges in rank order, uneven when the ranks do not divide the experts), and runs the
 * fixture's prompts as one batch of greedy generation on both engines. The expert-parallel
 * logits must equal the single-rank ones bit for bit, the tokens must equal Hugging
 * Face's, and every rank must agree. A fixture without MoE layers runs the same way (its
 * ranks have no experts to share: every rank computes everything). Also: ranges that do
 * not tile the experts fail engine creation on every rank with the rank named, and a
 * sharded model without a communicator is refused. The test fails unless at least
 * --min-fixtures fixtures (--min-fp8 of them FP8, --min-moe with MoE layers) had every
 * prompt compared at both page sizes. */
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/log.h"
#include "model/generate.h"
#include "model/model.h"
#include "tests/test_util.h"
#include "tests/golden/golden_fixture.h"
#include "tests/model/parallel_test_util.h"

static int g_rank, g_size;
static parallel_tally_t g_tally;

/* Experts [*begin, *end) of `rank`: near-equal contiguous parts in rank order. */
static void share_of(int32_t experts, int rank, int size, int32_t *begin, int32_t *end) {
  *begin = (int32_t)((int64_t)experts * rank / size);
  *end = (int32_t)((int64_t)experts * (rank + 1) / size);
}

static void check_fixture(const char *dir, const char *name, ina_comm_t *comm) {
  fixture_t f;
  CHECKF(load_fixture(dir, &f) == 0, "%s: cannot read the fixture", dir);
  ina_model_t *whole = NULL, *part = NULL;
  CHECK_OK(ina_model_open(dir, NULL, &whole));
  if (!whole || f.count == 0) {
    parallel_tally_skip(&g_tally, name, "cannot be read");
    ina_model_destroy(whole);
    free_fixture(&f);
    return;
  }
  const int32_t experts = ina_model_config(whole)->n_routed_experts;
  const int32_t vocab = ina_model_config(whole)->vocab_size;
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  share_of(experts, g_rank, g_size, &mo.shard.expert_begin, &mo.shard.expert_end);
  CHECK_OK(ina_model_open(dir, &mo, &part));
  if (part) CHECK(ina_model_weight_bytes(part) <= ina_model_weight_bytes(whole));
  /* Page size 1 and 16: decode over one or many pages. */
  int compared = 0;
  for (int32_t page_size = 1; page_size <= 16 && part; page_size += 15) {
    fixture_run_t ref, ep;
    fixture_generate(&f, whole, NULL, NULL, page_size, &ref);
    fixture_generate(&f, part, NULL, comm, page_size, &ep);
    int same = 1;
    for (int32_t p = 0; p < f.count; p++) {
      const size_t n = (size_t)(f.lens[p] + f.max_new - 1) * vocab;
      if (!ref.r[p].logits || !ep.r[p].logits) {
        same = 0;
        continue;
      }
      compared++;
      const int logits_same = memcmp(ref.r[p].logits, ep.r[p].logits, n * sizeof(float)) == 0;
      CHECKF(logits_same, "%s prompt %d (rank %d of %d, experts [%d, %d), page %d): "
             "expert-parallel logits differ from one rank's",
             dir, p, g_rank, g_size, mo.shard.expert_begin, mo.shard.expert_end, page_size);
      const int tokens_hf =
          memcmp(ep.r[p].output, f.generated[p], (size_t)f.max_new * sizeof(int32_t)) == 0;
      CHECKF(tokens_hf, "%s prompt %d (rank %d, page %d): greedy tokens differ from HF", dir, p,
             g_rank, page_size);
      same &= logits_same && tokens_hf;
    }
    CHECKF(parallel_all_ranks(comm, same), "%s (page %d): some rank's results differ", dir, page_size);
    fixture_run_free(&ref);
    fixture_run_free(&ep);
  }
  /* Counted when every rank compared every prompt at both page sizes. */
  g_tally.comparisons += compared;
  if (parallel_all_ranks(comm, compared == 2 * f.count)) parallel_tally_ran(&g_tally, ina_model_config(whole));
  else parallel_tally_skip(&g_tally, name, "a run gave no logits");
  ina_model_destroy(part);
  ina_model_destroy(whole);
  free_fixture(&f);
}

/* Ranges that do not tile the experts: every rank's create fails, naming the rank. */
static void check_bad_ranges(const char *dir, ina_comm_t *comm) {
  ina_model_t *whole = NULL, *part = NULL;
  CHECK_OK(ina_model_open(dir, NULL, &whole));
  if (!whole) return;
  const int32_t experts = ina_model_config(whole)->n_routed_experts;
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  /* The last rank leaves out the last expert. */
  share_of(experts, g_rank, g_size, &mo.shard.expert_begin, &mo.shard.expert_end);
  if (g_rank == g_size - 1) mo.shard.expert_end--;
  CHECK_OK(ina_model_open(dir, &mo, &part));
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  eo.ep_comm = comm;
  eo.num_threads = 1;
  ina_engine_t *e = NULL;
  ina_log_set_quiet_errors(1);
  ina_status_t st = part ? ina_engine_create(part, &eo, &e) : INA_ERR_INTERNAL;
  ina_log_set_quiet_errors(0);
  CHECKF(st == INA_ERR_INVALID_ARGUMENT && e == NULL &&
             strstr(ina_last_error(), "every expert needs a rank") != NULL,
         "a gap in the expert ranges: create returned %d (%s)", (int)st, ina_last_error());
  /* Without a communicator a partial model is refused outright (no collective). */
  eo.ep_comm = NULL;
  ina_log_set_quiet_errors(1);
  st = part ? ina_engine_create(part, &eo, &e) : INA_ERR_INTERNAL;
  ina_log_set_quiet_errors(0);
  if (g_size > 1)
    CHECKF(st == INA_ERR_UNSUPPORTED && e == NULL, "a partial model without ep_comm: %d (%s)",
           (int)st, ina_last_error());
  ina_engine_destroy(e);
  ina_model_destroy(part);
  /* Overlapping ranges: every rank claims everything. */
  ina_engine_t *e2 = NULL;
  eo.ep_comm = comm;
  ina_log_set_quiet_errors(1);
  st = ina_engine_create(whole, &eo, &e2);
  ina_log_set_quiet_errors(0);
  if (g_size > 1)
    CHECKF(st == INA_ERR_INVALID_ARGUMENT && e2 == NULL && strstr(ina_last_error(), "rank 1") != NULL,
           "overlapping expert ranges: create returned %d (%s)", (int)st, ina_last_error());
  ina_engine_destroy(e2);
  ina_model_destroy(whole);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  g_rank = ina_bootstrap_world_rank(boot);
  g_size = ina_bootstrap_world_size(boot);
  const char *root = "tests/golden/fixtures";
  parallel_minimum_t min = PARALLEL_MINIMUM_INIT;
  for (int i = 1; i < argc; i++)
    if (!parallel_minimum_arg(argc, argv, &i, &min)) root = argv[i];
  ina_comm_t *comm = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &comm));
  char *names[GOLDEN_MAX_FIXTURES];
  const int count = comm ? golden_fixture_names(root, names) : 0;
  CHECKF(count >= 6, "only %d fixtures in %s", count, root);
  int bad_ranges_checked = 0;
  for (int i = 0; i < count; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    if (g_rank == 0) printf("test_engine_ep: %s on %d ranks\n", names[i], g_size);
    check_fixture(dir, names[i], comm);
    /* The refusals need an expert for every rank, in a MoE layer. */
    ina_model_config_t c;
    if (!bad_ranges_checked && ina_model_spec_config(dir, &c) == INA_OK && parallel_config_has_moe(&c) &&
        c.n_routed_experts >= g_size) {
      check_bad_ranges(dir, comm);
      bad_ranges_checked = 1;
    }
    free(names[i]);
  }
  CHECKF(bad_ranges_checked, "no fixture has a MoE layer with an expert for each of the %d ranks", g_size);
  parallel_tally_check(&g_tally, &min, "test_engine_ep", g_rank);
  ina_comm_destroy(comm);
  char name[64];
  snprintf(name, sizeof name, "test_engine_ep rank %d", g_rank);
  const int rc = test_finish(name);
  ina_bootstrap_finalize(boot);
  return rc;
}
