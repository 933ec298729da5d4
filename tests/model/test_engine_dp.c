/* Attention data parallelism of the CPU engine under mpirun (2, 3, 5 or 8 ranks), each rank
 * with its share of the routed experts, the MoE layers running over every rank's tokens:
 *   1. each rank runs its own share of a golden fixture's prompts (prompt p on rank p mod
 *      N; a rank may have none and then steps with empty batches);
 *   2. every rank passes all the prompts, which the engine splits by sequence.
 * Each prompt's logits, step by step, must equal one rank running all the prompts as one
 * batch, bit for bit, and its greedy tokens must equal Hugging Face's. A fixture without
 * MoE layers runs too (the ranks then never meet before the logits). The test fails
 * unless at least --min-fixtures fixtures (--min-fp8 of them FP8, --min-moe with MoE
 * layers) had every prompt compared in both modes.
 * --exchange dispatch|allgather picks the MoE exchange (default: the engine's, dispatch
 * under attention DP), --layout masked the dispatch's masked receive layout and
 * --two-batch-overlap its two micro-batches per step; the engine's traffic counters
 * must name the exchange and the micro-batches that ran. */
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/log.h"
#include "model/model.h"
#include "moe_ep/dispatch.h"
#include "tests/test_util.h"
#include "tests/golden/golden_fixture.h"
#include "tests/model/parallel_test_util.h"

static int g_rank, g_size;
static int32_t g_exchange = INA_ENGINE_EP_EXCHANGE_AUTO, g_layout = INA_EP_LAYOUT_CONTIGUOUS, g_micro_batches = 1;
static parallel_tally_t g_tally;

static int32_t argmax(const float *row, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (row[i] > row[best]) best = i;
  return best;
}

/* Greedy generation of this rank's prompts, in lockstep with the other ranks (every rank
 * takes max_new steps); logits[p] gets prompt p's rows in ina_generate's layout. */
static void run_share(const fixture_t *f, ina_engine_t *e, float **logits, int32_t out[][GOLDEN_MAX_NEW]) {
  const int32_t vocab = ina_engine_config(e)->vocab_size;
  int32_t mine[GOLDEN_MAX_PROMPTS], n = 0, qo[GOLDEN_MAX_PROMPTS + 1], total = 0;
  ina_kv_seq_t seqs[GOLDEN_MAX_PROMPTS];
  ina_kv_seq_t *ptrs[GOLDEN_MAX_PROMPTS];
  memset(seqs, 0, sizeof seqs);
  for (int32_t p = 0; p < f->count; p++)
    if (p % g_size == g_rank) {
      ptrs[n] = &seqs[n];
      mine[n++] = p;
      total += f->lens[p];
    }
  int32_t *tokens = malloc(((size_t)total + 1) * sizeof *tokens);
  float *rows = malloc(((size_t)total + 1) * (size_t)vocab * sizeof *rows);
  if (!tokens || !rows) {
    CHECK(0);
    goto done;
  }
  for (int32_t step = 0; step < f->max_new; step++) {
    qo[0] = 0;
    for (int32_t i = 0; i < n; i++) {
      const int32_t p = mine[i], len = step == 0 ? f->lens[p] : 1;
      if (step == 0) memcpy(tokens + qo[i], f->prompts[p], (size_t)len * sizeof *tokens);
      else tokens[qo[i]] = out[p][step - 1];
      qo[i + 1] = qo[i] + len;
    }
    ina_batch_t b = {n, ptrs, qo, tokens, 1};
    const ina_status_t st = ina_engine_forward(e, &b, rows);
    CHECKF(st == INA_OK, "step %d on rank %d: %s", step, g_rank, ina_last_error());
    if (st != INA_OK) break;
    for (int32_t i = 0; i < n; i++) {
      const int32_t p = mine[i], count = qo[i + 1] - qo[i];
      const int64_t at = step == 0 ? 0 : f->lens[p] + step - 1;
      memcpy(logits[p] + at * vocab, rows + (int64_t)qo[i] * vocab, (size_t)count * vocab * sizeof *rows);
      out[p][step] = argmax(rows + (int64_t)(qo[i + 1] - 1) * vocab, vocab);
    }
  }
done:
  for (int32_t i = 0; i < n; i++) ina_kv_seq_release(ina_engine_page_pool(e), &seqs[i]);
  free(tokens);
  free(rows);
}

static void check_fixture(const char *dir, const char *name, ina_comm_t *comm) {
  fixture_t f;
  CHECKF(load_fixture(dir, &f) == 0, "%s: cannot read the fixture", dir);
  ina_model_t *whole = NULL, *part = NULL;
  CHECK_OK(ina_model_open(dir, NULL, &whole));
  if (!whole || f.count == 0) {
    parallel_tally_skip(&g_tally, name, "cannot be read");
    goto done;
  }
  const ina_model_config_t *c = ina_model_config(whole);
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  mo.shard.expert_begin = (int32_t)((int64_t)c->n_routed_experts * g_rank / g_size);
  mo.shard.expert_end = (int32_t)((int64_t)c->n_routed_experts * (g_rank + 1) / g_size);
  CHECK_OK(ina_model_open(dir, &mo, &part));
  if (!part) {
    parallel_tally_skip(&g_tally, name, "its shard cannot be opened");
    goto done;
  }
  fixture_run_t ref;
  fixture_generate(&f, whole, NULL, NULL, 4, &ref);
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  eo.page_size = 4;
  eo.max_tokens = 4096;
  eo.num_threads = 1;
  eo.ep_comm = comm;
  eo.attention_dp = 1;
  eo.ep_exchange = g_exchange;
  eo.ep_layout = g_layout;
  eo.ep_max_tokens = 4096; /* the masked layout's rows per rank: every prompt's tokens */
  eo.micro_batches = g_micro_batches;
  ina_engine_t *e = NULL;
  CHECK_OK(ina_engine_create(part, &eo, &e));
  float *logits[GOLDEN_MAX_PROMPTS] = {NULL};
  int32_t out[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW];
  memset(out, 0, sizeof out);
  for (int32_t p = 0; p < f.count; p++) {
    const size_t n = (size_t)(f.lens[p] + f.max_new - 1) * c->vocab_size;
    logits[p] = malloc(n * sizeof(float));
    if (logits[p]) test_poison_f32(logits[p], n);
  }
  if (e) run_share(&f, e, logits, out);
  /* compared: this rank's prompts in mode 1, then every prompt in mode 2. */
  int same = 1, compared = 0;
  for (int32_t p = 0; p < f.count; p++) {
    if (p % g_size != g_rank) continue;
    compared += e && logits[p] && ref.r[p].logits;
    const size_t n = (size_t)(f.lens[p] + f.max_new - 1) * c->vocab_size;
    const int logits_same = logits[p] && ref.r[p].logits && memcmp(logits[p], ref.r[p].logits, n * sizeof(float)) == 0;
    const int tokens_hf = memcmp(out[p], f.generated[p], (size_t)f.max_new * sizeof(int32_t)) == 0;
    CHECKF(logits_same, "%s prompt %d (rank %d of %d): logits differ from one rank running every prompt", name, p,
           g_rank, g_size);
    CHECKF(tokens_hf, "%s prompt %d (rank %d): greedy tokens differ from HF", name, p, g_rank);
    same &= logits_same && tokens_hf;
  }
  CHECKF(parallel_all_ranks(comm, same), "%s: some rank's prompts differ", name);
  if (e && c->n_routed_experts > 0) {
    ina_engine_ep_traffic_t tr;
    CHECK_OK(ina_engine_ep_traffic(e, &tr));
    const int32_t want = g_exchange == INA_ENGINE_EP_EXCHANGE_ALLGATHER ? g_exchange : INA_ENGINE_EP_EXCHANGE_DISPATCH;
    CHECKF(tr.exchange == want && (g_size == 1 || tr.layers > 0), "%s: the engine ran the %s exchange %lld times, not %s",
           name, ina_engine_ep_exchange_name(tr.exchange), (long long)tr.layers, ina_engine_ep_exchange_name(want));
    CHECKF(tr.micro_batches == g_micro_batches, "%s: %d micro-batches per step, not %d", name, (int)tr.micro_batches,
           (int)g_micro_batches);
  }
  /* Mode 2: every rank the whole batch, split by sequence inside the engine. */
  {
    ina_engine_options_t so = eo;
    so.attention_dp = 2;
    ina_engine_t *split = NULL;
    CHECK_OK(ina_engine_create(part, &so, &split));
    ina_generate_request_t r[GOLDEN_MAX_PROMPTS];
    memset(r, 0, sizeof r);
    for (int32_t p = 0; p < f.count && split; p++) {
      const ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
      const size_t n = (size_t)(f.lens[p] + f.max_new - 1) * c->vocab_size;
      r[p] = (ina_generate_request_t){f.prompts[p], f.lens[p], f.max_new, sp, 1, out[p], 0, logits[p]};
      if (logits[p]) test_poison_f32(logits[p], n);
    }
    if (split) CHECK_OK(ina_generate(split, r, f.count, NULL));
    int split_same = split != NULL;
    for (int32_t p = 0; p < f.count && split; p++) {
      const size_t n = (size_t)(f.lens[p] + f.max_new - 1) * c->vocab_size;
      compared += logits[p] && ref.r[p].logits;
      split_same &= logits[p] && ref.r[p].logits && memcmp(logits[p], ref.r[p].logits, n * sizeof(float)) == 0 &&
                    memcmp(out[p], f.generated[p], (size_t)f.max_new * sizeof(int32_t)) == 0;
    }
    CHECKF(split_same, "%s (rank %d): a batch split by sequence differs from one rank's", name, g_rank);
    CHECKF(parallel_all_ranks(comm, split_same), "%s: some rank's split batch differs", name);
    ina_engine_destroy(split);
  }
  /* Rank r has the prompts p with p % N == r in mode 1, and every prompt in mode 2. */
  const int mine = (f.count - g_rank + g_size - 1) / g_size;
  g_tally.comparisons += compared;
  if (parallel_all_ranks(comm, compared == mine + f.count)) parallel_tally_ran(&g_tally, c);
  else parallel_tally_skip(&g_tally, name, "a run gave no logits");
  if (g_rank == 0) printf("  %s: %d prompts over %d ranks, each rank its own batch\n", name, f.count, g_size);
  for (int32_t p = 0; p < f.count; p++) free(logits[p]);
  fixture_run_free(&ref);
  ina_engine_destroy(e);
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
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--exchange") == 0 && i + 1 < argc) {
      i++;
      g_exchange = strcmp(argv[i], "dispatch") == 0 ? INA_ENGINE_EP_EXCHANGE_DISPATCH : INA_ENGINE_EP_EXCHANGE_ALLGATHER;
    } else if (strcmp(argv[i], "--two-batch-overlap") == 0) {
      g_micro_batches = 2;
    } else if (strcmp(argv[i], "--layout") == 0 && i + 1 < argc) {
      g_layout = strcmp(argv[++i], "masked") == 0 ? INA_EP_LAYOUT_MASKED : INA_EP_LAYOUT_CONTIGUOUS;
    } else if (!parallel_minimum_arg(argc, argv, &i, &min)) {
      root = argv[i];
    }
  }
  ina_comm_t *comm = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &comm));
  char *names[GOLDEN_MAX_FIXTURES];
  const int count = comm ? golden_fixture_names(root, names) : 0;
  CHECKF(count >= 6, "only %d fixtures in %s", count, root);
  if (g_rank == 0)
    printf("test_engine_dp: %d ranks, %s exchange%s%s\n", g_size, ina_engine_ep_exchange_name(g_exchange),
           g_layout == INA_EP_LAYOUT_MASKED ? ", masked layout" : "", g_micro_batches == 2 ? ", two-batch overlap" : "");
  for (int i = 0; i < count; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    check_fixture(dir, names[i], comm);
    free(names[i]);
  }
  parallel_tally_check(&g_tally, &min, "test_engine_dp", g_rank);
  ina_comm_destroy(comm);
  char name[64];
  snprintf(name, sizeof name, "test_engine_dp rank %d", g_rank);
  const int rc = test_finish(name);
  ina_bootstrap_finalize(boot);
  return rc;
}
