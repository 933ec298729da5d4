/* Tensor parallelism of the CPU engine, alone and with expert parallelism, under mpirun:
 * `test_engine_tp FIXTURES --tp T` on N ranks runs T-way tensor parallelism (consecutive
 * ranks form a TP group) and N / T-way expert parallelism (the ranks holding the same
 * slice form an EP group). Every rank opens each golden fixture whole and as its shard
 * (heads and intermediates sliced, experts split), and runs the fixture's prompts as one
 * batch of greedy generation on both. The sharded run must give Hugging Face's tokens,
 * logits within LOGITS_BOUND (relative L2) of one rank's (partial sums change the fp32
 * summation order), and bit-identical logits on every rank. Fixtures whose head or
 * intermediate counts do not divide by T, or whose FP8 scale blocks a slice would cut,
 * are skipped, with the reason printed; the test fails unless at least --min-fixtures
 * fixtures (--min-fp8 of them FP8, --min-moe with MoE layers) had every prompt compared. */
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

#define LOGITS_BOUND 1e-5

static int g_rank, g_size, g_tp, g_ep;
static parallel_tally_t g_tally;

static uint64_t fnv1a(const void *data, size_t n, uint64_t h) {
  const uint8_t *p = data;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001B3ull;
  return h;
}

/* Why the fixture cannot be split T ways, or NULL. */
static const char *indivisible(const ina_model_config_t *c, int t) {
  if (c->num_heads % t) return "attention heads";
  if (c->intermediate_size % t) return "dense intermediate";
  if (c->moe_intermediate_size % t) return "expert intermediate";
  return NULL;
}

static void check_fixture(const char *dir, const char *name, ina_comm_t *world, ina_comm_t *tp,
                          ina_comm_t *ep) {
  fixture_t f;
  CHECKF(load_fixture(dir, &f) == 0, "%s: cannot read the fixture", dir);
  ina_model_t *whole = NULL, *part = NULL;
  CHECK_OK(ina_model_open(dir, NULL, &whole));
  if (!whole || f.count == 0) goto done;
  const ina_model_config_t *c = ina_model_config(whole);
  const char *why = indivisible(c, g_tp);
  if (why) {
    char reason[96];
    snprintf(reason, sizeof reason, "%s %% %d != 0", why, g_tp);
    if (g_rank == 0) printf("  %s: skipped (%s)\n", name, reason);
    parallel_tally_skip(&g_tally, name, reason);
    goto done;
  }
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  const int ep_rank = g_rank / g_tp;
  mo.shard.tp_rank = g_rank % g_tp;
  mo.shard.tp_size = g_tp;
  mo.shard.expert_begin = (int32_t)((int64_t)c->n_routed_experts * ep_rank / g_ep);
  mo.shard.expert_end = (int32_t)((int64_t)c->n_routed_experts * (ep_rank + 1) / g_ep);
  ina_status_t opened = ina_model_open(dir, &mo, &part);
  if (opened == INA_ERR_UNSUPPORTED) { /* e.g. an FP8 slice boundary inside a scale block */
    if (g_rank == 0) printf("  %s: skipped (%s)\n", name, ina_last_error());
    parallel_tally_skip(&g_tally, name, "the shard cannot be opened: an FP8 scale block would be cut");
    goto done;
  }
  CHECK_OK(opened);
  if (!part) goto done;
  fixture_run_t ref, got;
  fixture_generate(&f, whole, NULL, NULL, 4, &ref);
  fixture_generate(&f, part, tp, ep, 4, &got);
  uint64_t hash = 0xCBF29CE484222325ull;
  double worst = 0;
  int compared = 0;
  for (int32_t p = 0; p < f.count; p++) {
    const size_t n = (size_t)(f.lens[p] + f.max_new - 1) * c->vocab_size;
    if (!ref.r[p].logits || !got.r[p].logits || !got.r[p].output) continue;
    compared++;
    const double err = test_rel_l2(got.r[p].logits, ref.r[p].logits, n);
    if (err > worst) worst = err;
    CHECKF(err <= LOGITS_BOUND, "%s prompt %d (rank %d: tp %d of %d, experts [%d, %d)): logits "
           "rel l2 %.3g from one rank's > %g",
           dir, p, g_rank, mo.shard.tp_rank, g_tp, mo.shard.expert_begin, mo.shard.expert_end,
           err, LOGITS_BOUND);
    CHECKF(memcmp(got.r[p].output, f.generated[p], (size_t)f.max_new * sizeof(int32_t)) == 0,
           "%s prompt %d (rank %d): greedy tokens differ from HF", dir, p, g_rank);
    hash = fnv1a(got.r[p].logits, n * sizeof(float), hash);
  }
  CHECKF(parallel_same_everywhere(world, hash), "%s: the ranks' logits are not bit-identical", dir);
  /* Counted only when every rank compared every prompt, so that every rank counts alike. */
  g_tally.comparisons += compared;
  if (parallel_all_ranks(world, compared == f.count)) parallel_tally_ran(&g_tally, c);
  else parallel_tally_skip(&g_tally, name, "a run gave no logits");
  if (g_rank == 0) printf("  %s: worst logits rel l2 %.2e on rank 0\n", name, worst);
  fixture_run_free(&ref);
  fixture_run_free(&got);
done:
  ina_model_destroy(part);
  ina_model_destroy(whole);
  free_fixture(&f);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  g_rank = ina_bootstrap_world_rank(boot);
  g_size = ina_bootstrap_world_size(boot);
  const char *root = "tests/golden/fixtures";
  parallel_minimum_t min = PARALLEL_MINIMUM_INIT;
  g_tp = g_size;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--tp") == 0 && i + 1 < argc) g_tp = atoi(argv[++i]);
    else if (!parallel_minimum_arg(argc, argv, &i, &min)) root = argv[i];
  }
  CHECKF(g_tp >= 1 && g_size % g_tp == 0, "--tp %d must divide the %d ranks", g_tp, g_size);
  if (g_tp < 1 || g_size % g_tp) g_tp = g_size;
  g_ep = g_size / g_tp;
  ina_comm_t *world = NULL, *tp = NULL, *ep = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &world));
  CHECK_OK(ina_bootstrap_split_tp_dp(boot, g_tp, INA_COMM_BACKEND_MPI, &tp, &ep));
  if (g_rank == 0) printf("test_engine_tp: %d ranks, tp %d x ep %d\n", g_size, g_tp, g_ep);
  char *names[GOLDEN_MAX_FIXTURES];
  const int count = world && tp && ep ? golden_fixture_names(root, names) : 0;
  CHECKF(count >= 6, "only %d fixtures in %s", count, root);
  for (int i = 0; i < count; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    check_fixture(dir, names[i], world, tp, g_ep > 1 ? ep : NULL);
    free(names[i]);
  }
  parallel_tally_check(&g_tally, &min, "test_engine_tp", g_rank);
  ina_comm_destroy(ep);
  ina_comm_destroy(tp);
  ina_comm_destroy(world);
  char name[64];
  snprintf(name, sizeof name, "test_engine_tp rank %d", g_rank);
  const int rc = test_finish(name);
  ina_bootstrap_finalize(boot);
  return rc;
}
