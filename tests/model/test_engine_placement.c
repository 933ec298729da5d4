/* Expert placement changes of the CPU engine under mpirun: `test_engine_placement FIXTURES
 * [--tp T]` on N ranks (T-way tensor parallelism, N / T-way expert parallelism, as
 * test_engine_tp). For each golden fixture every rank runs the fixture's prompts as one
 * batch of greedy generation twice on its shard: once with the placement it was loaded
 * with, and once switching to a fresh random placement before every step (redundant
 * replicas, empty slots, experts moving between ranks, slots_per_rank growing and
 * shrinking). The logits of every step must be bit-identical between the two runs, the
 * tokens must be Hugging Face's, the engine must report the placement applied, and the
 * bytes moved must equal the experts each rank lacked times an expert's size.
 *
 * With --dp the engines run attention DP over the batch (every rank passes it, each
 * computes its own sequences), so the MoE layers take the dispatch exchange: the
 * placement then changes under dispatch/combine.
 *
 * A fixture without MoE layers has a placement of zero layers, which the moving run
 * applies again before every step: nothing moves and the logits stay the fixed run's.
 *
 * Refusals, on the first fixture with MoE layers: an expert with no slot, an expert twice
 * on one rank, an expert out of range, the wrong ep or layer count, ranks given different
 * placements, and a placement over max_expert_bytes all fail on every rank with the
 * expected code, leave the placement in force, and the engine then runs on
 * bit-identically; dry_run reports the bytes and changes nothing.
 *
 * The test fails unless at least --min-fixtures fixtures (--min-fp8 of them FP8, --min-moe
 * with MoE layers) had both runs compared over every step. */
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/log.h"
#include "model/model.h"
#include "moe_ep/expert_placement.h"
#include "tests/test_util.h"
#include "tests/golden/golden_fixture.h"
#include "tests/model/parallel_test_util.h"

static int g_rank, g_size, g_tp, g_ep, g_dp, g_tbo;
static ina_comm_t *g_world;
static parallel_tally_t g_tally;

/* ---- helpers ------------------------------------------------------------------------- */


static uint64_t shared_seed(void) {
  int64_t seed = g_rank == 0 ? (int64_t)test_seed("test_engine_placement") : 0;
  CHECK_OK(ina_comm_broadcast(g_world, &seed, 1, INA_DTYPE_I64, 0, NULL));
  return (uint64_t)seed;
}

/* Bytes the ranks of one TP slice would receive going from `from` to `to`: the experts each
 * rank lacks, times an expert's bytes in this slice (from the whole model, sliced). */
static int64_t expected_bytes(const ina_expert_placement_t *from, const ina_expert_placement_t *to,
                              int64_t expert_bytes) {
  int64_t n = 0;
  for (int32_t l = 0; l < to->num_moe_layers; l++)
    for (int32_t r = 0; r < to->ep; r++)
      for (int32_t s = 0; s < to->slots_per_rank; s++) {
        const int32_t x = ina_expert_placement_slot(to, l, r, s);
        int held = 0;
        for (int32_t k = 0; k < from->slots_per_rank && x >= 0; k++)
          held |= ina_expert_placement_slot(from, l, r, k) == x;
        n += x >= 0 && !held;
      }
  return n * expert_bytes;
}

static int32_t moe_layer_count(const ina_model_config_t *c) {
  int32_t n = 0;
  for (int32_t l = 0; l < c->num_layers; l++) n += ina_cfg_layer_is_moe(c, l);
  return n;
}

/* Weight bytes of one routed expert of this rank's shard. */
static int64_t one_expert_bytes(const ina_model_t *m) {
  const ina_weights_t *w = ina_model_weights(m);
  const ina_model_config_t *c = ina_model_config(m);
  for (int32_t l = 0; l < c->num_layers; l++) {
    if (!ina_cfg_layer_is_moe(c, l) || w->expert_end <= w->expert_begin) continue;
    const ina_mlp_weights_t *x = &w->layers[l].experts[0];
    const ina_linear_t *lin[3] = {&x->gate, &x->up, &x->down};
    int64_t bytes = 0;
    for (int i = 0; i < 3; i++)
      bytes += (int64_t)(ina_tensor_nbytes(&lin[i]->weight) + ina_tensor_nbytes(&lin[i]->scale_inv) +
                         ina_tensor_nbytes(&lin[i]->bias));
    return bytes;
  }
  return 0;
}

/* ---- greedy generation, step by step ------------------------------------------------- */

typedef struct run {
  ina_engine_t *e;
  const fixture_t *f;
  int32_t vocab;
  ina_kv_seq_t seqs[GOLDEN_MAX_PROMPTS];
  ina_kv_seq_t *ptrs[GOLDEN_MAX_PROMPTS];
  int32_t qo[GOLDEN_MAX_PROMPTS + 1];
  int32_t *tokens, last[GOLDEN_MAX_PROMPTS];
  int32_t generated[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW];
  float *logits; /* every step's rows, one after the other */
  int64_t rows;
} run_t;

static int32_t argmax(const float *row, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (row[i] > row[best]) best = i;
  return best;
}

static void run_init(run_t *r, ina_engine_t *e, const fixture_t *f) {
  memset(r, 0, sizeof *r);
  r->e = e;
  r->f = f;
  r->vocab = ina_engine_config(e)->vocab_size;
  int64_t total = 0;
  for (int32_t p = 0; p < f->count; p++) {
    total += f->lens[p];
    r->ptrs[p] = &r->seqs[p];
  }
  r->tokens = malloc((size_t)total * sizeof *r->tokens);
  r->logits = malloc((size_t)(total + (int64_t)f->count * f->max_new) * r->vocab * sizeof(float));
}

static void run_free(run_t *r) {
  for (int32_t p = 0; p < r->f->count; p++) ina_kv_seq_release(ina_engine_page_pool(r->e), &r->seqs[p]);
  free(r->tokens);
  free(r->logits);
}

/* Step `step` (0: the prompts) of the batch; 0 when it failed. */
static int run_step(run_t *r, int32_t step) {
  const fixture_t *f = r->f;
  r->qo[0] = 0;
  for (int32_t p = 0; p < f->count; p++) {
    const int32_t n = step == 0 ? f->lens[p] : 1;
    if (step == 0) memcpy(r->tokens + r->qo[p], f->prompts[p], (size_t)n * sizeof(int32_t));
    else r->tokens[p] = r->last[p];
    r->qo[p + 1] = r->qo[p] + n;
  }
  float *out = r->logits + r->rows * r->vocab;
  test_poison_f32(out, (size_t)r->qo[f->count] * r->vocab);
  ina_batch_t b = {f->count, r->ptrs, r->qo, r->tokens, 1};
  const ina_status_t st = ina_engine_forward(r->e, &b, out);
  CHECKF(st == INA_OK, "step %d: %s", step, ina_last_error());
  if (st != INA_OK) return 0;
  for (int32_t p = 0; p < f->count; p++) {
    r->last[p] = argmax(out + (int64_t)(r->qo[p + 1] - 1) * r->vocab, r->vocab);
    r->generated[p][step] = r->last[p];
  }
  r->rows += r->qo[f->count];
  return 1;
}

static ina_engine_t *make_engine(const ina_model_t *m, ina_comm_t *tp, ina_comm_t *ep,
                                 int64_t max_expert_bytes) {
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  eo.page_size = 4;
  eo.max_tokens = 4096;
  eo.num_threads = 1;
  eo.tp_comm = tp;
  eo.ep_comm = ep;
  eo.max_expert_bytes = max_expert_bytes;
  eo.attention_dp = g_dp ? 2 : 0;
  eo.micro_batches = g_tbo ? 2 : 1;
  ina_engine_t *e = NULL;
  CHECK_OK(ina_engine_create(m, &eo, &e));
  return e;
}

/* ---- the checks ---------------------------------------------------------------------- */

/* Returns 1 when both runs took every step and were compared. */
static int check_moving(const char *name, const fixture_t *f, const ina_model_t *m, ina_comm_t *tp,
                        ina_comm_t *ep, test_rng_t *rng) {
  const ina_model_config_t *c = ina_model_config(m);
  const int32_t layers = moe_layer_count(c);
  int32_t steps = 0;
  ina_engine_t *fixed = make_engine(m, tp, ep, 0), *moving = make_engine(m, tp, ep, 0);
  if (!fixed || !moving) goto done;
  run_t a, b;
  run_init(&a, fixed, f);
  run_init(&b, moving, f);
  const int64_t expert_bytes = one_expert_bytes(m);
  int64_t moved_total = 0;
  for (int32_t step = 0; step < f->max_new; step++) {
    ina_expert_placement_t before = {0}, next = {0}, now = {0};
    CHECK_OK(ina_engine_get_placement(moving, &before));
    if (layers > 0) parallel_random_placement(rng, g_ep, layers, c->n_routed_experts, &next);
    else CHECK_OK(ina_expert_placement_copy(&before, &next)); /* zero layers: the only placement */
    int64_t moved = -1;
    CHECK_OK(ina_engine_apply_placement(moving, &next, 0, &moved));
    CHECK_OK(ina_engine_get_placement(moving, &now));
    CHECKF(now.slot_expert && ina_expert_placement_equal(&now, &next),
           "%s step %d: the engine does not report the placement applied", name, step);
    /* Every TP slice moves its own slice of the same experts. */
    const int64_t want = expected_bytes(&before, &next, expert_bytes) * g_tp;
    CHECKF(moved == want, "%s step %d: %lld bytes moved, expected %lld", name, step,
           (long long)moved, (long long)want);
    moved_total += moved;
    ina_expert_placement_free(&before);
    ina_expert_placement_free(&next);
    ina_expert_placement_free(&now);
    if (!run_step(&a, step) || !run_step(&b, step)) break;
    steps++;
  }
  CHECKF(moved_total > 0 || g_ep == 1 || layers == 0, "%s: no expert ever moved", name);
  CHECKF(moved_total == 0 || layers > 0, "%s: %lld bytes moved without MoE layers", name, (long long)moved_total);
  int same = a.rows == b.rows &&
             memcmp(a.logits, b.logits, (size_t)a.rows * a.vocab * sizeof(float)) == 0;
  CHECKF(same, "%s: logits with placement changes differ from the fixed placement's", name);
  for (int32_t p = 0; p < f->count; p++) {
    const int hf = memcmp(b.generated[p], f->generated[p], (size_t)f->max_new * sizeof(int32_t)) == 0;
    CHECKF(hf, "%s prompt %d: greedy tokens with placement changes differ from HF", name, p);
    same &= hf;
  }
  CHECKF(parallel_all_ranks(g_world, same), "%s: some rank's results differ", name);
  if (g_rank == 0 && layers == 0)
    printf("  %s: no MoE layers; the placement of 0 layers applied again before each of %d steps\n", name,
           f->max_new);
  else if (g_rank == 0)
    printf("  %s: %lld bytes of experts moved over %d steps\n", name, (long long)moved_total, f->max_new);
  run_free(&a);
  run_free(&b);
done:
  ina_engine_destroy(fixed);
  ina_engine_destroy(moving);
  return steps == f->max_new;
}

/* apply must fail with `code` on every rank and change nothing. */
static void expect_refused(ina_engine_t *e, const ina_expert_placement_t *p, ina_status_t code,
                           const char *what, const char *message_part) {
  ina_expert_placement_t before = {0}, after = {0};
  CHECK_OK(ina_engine_get_placement(e, &before));
  int64_t moved = -1;
  ina_log_set_quiet_errors(1);
  const ina_status_t st = ina_engine_apply_placement(e, p, 0, &moved);
  ina_log_set_quiet_errors(0);
  CHECKF(st == code, "%s: apply returned %d (%s), expected %d", what, (int)st, ina_last_error(),
         (int)code);
  CHECKF(!message_part || strstr(ina_last_error(), message_part) != NULL ||
             strstr(ina_last_error(), "another rank") != NULL,
         "%s: the error '%s' does not say '%s'", what, ina_last_error(), message_part);
  CHECK_OK(ina_engine_get_placement(e, &after));
  CHECKF(before.slot_expert && after.slot_expert && ina_expert_placement_equal(&before, &after),
         "%s: the placement changed", what);
  CHECKF(parallel_all_ranks(g_world, st == code), "%s: not every rank refused", what);
  ina_expert_placement_free(&before);
  ina_expert_placement_free(&after);
}

/* Returns 1 when the checks ran (the model has MoE layers and the engines were made). */
static int check_refusals(const fixture_t *f, const ina_model_t *m, ina_comm_t *tp, ina_comm_t *ep,
                          test_rng_t *rng) {
  const ina_model_config_t *c = ina_model_config(m);
  const int32_t layers = moe_layer_count(c), E = c->n_routed_experts;
  int ran = 0;
  ina_engine_t *e = make_engine(m, tp, ep, 0), *ref = make_engine(m, tp, ep, 0);
  if (!e || !ref || layers == 0) goto done;
  ran = 1;
  ina_expert_placement_t good = {0}, bad = {0};
  parallel_random_placement(rng, g_ep, layers, E, &good);
  int64_t moved = -1;
  /* Dry run: the bytes, and no change. */
  {
    ina_expert_placement_t before = {0}, after = {0};
    CHECK_OK(ina_engine_get_placement(e, &before));
    CHECK_OK(ina_engine_apply_placement(e, &good, 1, &moved));
    CHECK_OK(ina_engine_get_placement(e, &after));
    CHECKF(before.slot_expert && after.slot_expert && ina_expert_placement_equal(&before, &after),
           "a dry run changed the placement");
    if (before.slot_expert)
      CHECKF(moved == expected_bytes(&before, &good, one_expert_bytes(m)) * g_tp,
             "dry run: %lld bytes would move, expected %lld", (long long)moved,
             (long long)(expected_bytes(&before, &good, one_expert_bytes(m)) * g_tp));
    ina_expert_placement_free(&before);
    ina_expert_placement_free(&after);
  }
  /* An expert with no slot (all its slots emptied). */
  CHECK_OK(ina_expert_placement_copy(&good, &bad));
  for (size_t i = 0; i < (size_t)g_ep * bad.slots_per_rank; i++)
    if (bad.slot_expert[ina_expert_placement_index(&bad, layers - 1, 0, 0) + i] == E - 1)
      bad.slot_expert[ina_expert_placement_index(&bad, layers - 1, 0, 0) + i] = -1;
  expect_refused(e, &bad, INA_ERR_INVALID_ARGUMENT, "an expert without a slot", "has no slot");
  ina_expert_placement_free(&bad);
  /* An expert twice on one rank. */
  CHECK_OK(ina_expert_placement_init(g_ep, E + 1, layers, E, &bad));
  for (int32_t l = 0; l < layers; l++)
    for (int32_t x = 0; x <= E; x++) bad.slot_expert[ina_expert_placement_index(&bad, l, 0, x)] = x % E;
  expect_refused(e, &bad, INA_ERR_INVALID_ARGUMENT, "an expert twice on a rank", "already holds");
  ina_expert_placement_free(&bad);
  /* An expert out of range. */
  CHECK_OK(ina_expert_placement_copy(&good, &bad));
  bad.slot_expert[0] = E;
  expect_refused(e, &bad, INA_ERR_INVALID_ARGUMENT, "an expert out of range", "outside");
  ina_expert_placement_free(&bad);
  /* The wrong shapes. */
  CHECK_OK(ina_expert_placement_init_contiguous(g_ep + 1, layers, E, &bad));
  expect_refused(e, &bad, INA_ERR_INVALID_ARGUMENT, "the wrong ep", "ranks share the experts");
  ina_expert_placement_free(&bad);
  CHECK_OK(ina_expert_placement_init_contiguous(g_ep, layers + 1, E, &bad));
  expect_refused(e, &bad, INA_ERR_INVALID_ARGUMENT, "the wrong layer count", "MoE layers");
  ina_expert_placement_free(&bad);
  /* Ranks that were given different placements. */
  if (g_size > 1) {
    CHECK_OK(ina_expert_placement_copy(&good, &bad));
    if (g_rank == g_size - 1) {
      ina_expert_placement_free(&bad);
      CHECK_OK(ina_expert_placement_init_contiguous(g_ep, layers, E, &bad));
    }
    expect_refused(e, &bad, INA_ERR_INVALID_ARGUMENT, "ranks that disagree", "another placement");
    ina_expert_placement_free(&bad);
  }
  /* Over max_expert_bytes: an engine whose limit is what each rank holds now, asked to
   * hold every expert everywhere. */
  {
    const int64_t per_rank = one_expert_bytes(m) * ((E + g_ep - 1) / g_ep) * layers;
    ina_engine_t *capped = make_engine(m, tp, ep, per_rank);
    CHECK_OK(ina_expert_placement_init(g_ep, E, layers, E, &bad));
    for (int32_t l = 0; l < layers; l++)
      for (int32_t r = 0; r < g_ep; r++)
        for (int32_t x = 0; x < E; x++) bad.slot_expert[ina_expert_placement_index(&bad, l, r, x)] = x;
    if (capped && g_ep > 1)
      expect_refused(capped, &bad, INA_ERR_OUT_OF_MEMORY, "over max_expert_bytes", "max_expert_bytes");
    ina_expert_placement_free(&bad);
    ina_engine_destroy(capped);
  }
  /* After all that, the engine runs as one that never saw a placement request. */
  {
    run_t a, b;
    run_init(&a, ref, f);
    run_init(&b, e, f);
    for (int32_t step = 0; step < f->max_new; step++)
      if (!run_step(&a, step) || !run_step(&b, step)) break;
    CHECKF(a.rows == b.rows && memcmp(a.logits, b.logits, (size_t)a.rows * a.vocab * sizeof(float)) == 0,
           "after refused placements the logits differ");
    run_free(&a);
    run_free(&b);
  }
  ina_expert_placement_free(&good);
done:
  ina_engine_destroy(e);
  ina_engine_destroy(ref);
  return ran;
}

static int g_refusals_checked;

static void check_fixture(const char *dir, const char *name, ina_comm_t *tp,
                          ina_comm_t *ep, test_rng_t *rng) {
  fixture_t f;
  CHECKF(load_fixture(dir, &f) == 0, "%s: cannot read the fixture", dir);
  ina_model_config_t c;
  ina_model_t *part = NULL;
  CHECK_OK(ina_model_spec_config(dir, &c));
  if (f.count == 0) {
    parallel_tally_skip(&g_tally, name, "cannot be read");
    goto done;
  }
  if (c.num_heads % g_tp || c.intermediate_size % g_tp || c.moe_intermediate_size % g_tp) {
    char why[96];
    snprintf(why, sizeof why, "heads or intermediates do not split %d ways", g_tp);
    if (g_rank == 0) printf("  %s: skipped (%s)\n", name, why);
    parallel_tally_skip(&g_tally, name, why);
    goto done;
  }
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  const int ep_rank = g_rank / g_tp;
  mo.shard.tp_rank = g_rank % g_tp;
  mo.shard.tp_size = g_tp;
  mo.shard.expert_begin = (int32_t)((int64_t)c.n_routed_experts * ep_rank / g_ep);
  mo.shard.expert_end = (int32_t)((int64_t)c.n_routed_experts * (ep_rank + 1) / g_ep);
  const ina_status_t opened = ina_model_open(dir, &mo, &part);
  if (opened == INA_ERR_UNSUPPORTED) {
    if (g_rank == 0) printf("  %s: skipped (%s)\n", name, ina_last_error());
    parallel_tally_skip(&g_tally, name, "the shard cannot be opened: an FP8 scale block would be cut");
    goto done;
  }
  CHECK_OK(opened);
  if (!part) goto done;
  const int compared = check_moving(name, &f, part, tp, ep, rng);
  g_tally.comparisons += compared ? f.count : 0;
  if (parallel_all_ranks(g_world, compared)) parallel_tally_ran(&g_tally, &c);
  else parallel_tally_skip(&g_tally, name, "a run stopped before its last step");
  if (!g_refusals_checked) g_refusals_checked = check_refusals(&f, part, tp, ep, rng);
done:
  ina_model_destroy(part);
  free_fixture(&f);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  g_rank = ina_bootstrap_world_rank(boot);
  g_size = ina_bootstrap_world_size(boot);
  const char *root = "tests/golden/fixtures";
  parallel_minimum_t min = PARALLEL_MINIMUM_INIT;
  g_tp = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--tp") == 0 && i + 1 < argc) g_tp = atoi(argv[++i]);
    else if (strcmp(argv[i], "--dp") == 0) g_dp = 1;
    else if (strcmp(argv[i], "--two-batch-overlap") == 0) g_dp = g_tbo = 1;
    else if (!parallel_minimum_arg(argc, argv, &i, &min)) root = argv[i];
  }
  CHECKF(g_tp >= 1 && g_size % g_tp == 0, "--tp %d must divide the %d ranks", g_tp, g_size);
  if (g_tp < 1 || g_size % g_tp) g_tp = 1;
  g_ep = g_size / g_tp;
  ina_comm_t *tp = NULL, *ep = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &g_world));
  CHECK_OK(ina_bootstrap_split_tp_dp(boot, g_tp, INA_COMM_BACKEND_MPI, &tp, &ep));
  test_rng_t rng;
  const uint64_t seed = g_world ? shared_seed() : 1;
  rng.s = seed;
  if (g_rank == 0)
    printf("test_engine_placement: %d ranks, tp %d x ep %d%s, seed %llu\n", g_size, g_tp, g_ep,
           g_dp ? (g_tbo ? ", attention DP (dispatch exchange, two-batch overlap)" : ", attention DP (dispatch exchange)") : "",
           (unsigned long long)seed);
  char *names[GOLDEN_MAX_FIXTURES];
  const int count = g_world && tp && ep ? golden_fixture_names(root, names) : 0;
  CHECKF(count >= 6, "only %d fixtures in %s", count, root);
  for (int i = 0; i < count; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    if (g_rank == 0) printf("test_engine_placement: %s\n", names[i]);
    check_fixture(dir, names[i], g_tp > 1 ? tp : NULL, ep, &rng);
    free(names[i]);
  }
  CHECKF(g_refusals_checked, "no fixture could run the refusal checks");
  parallel_tally_check(&g_tally, &min, "test_engine_placement", g_rank);
  ina_comm_destroy(ep);
  ina_comm_destroy(tp);
  ina_comm_destroy(g_world);
  char name[64];
  snprintf(name, sizeof name, "test_engine_placement rank %d", g_rank);
  const int rc = test_finish(name);
  ina_bootstrap_finalize(boot);
  return rc;
}
