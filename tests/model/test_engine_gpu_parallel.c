/* Tensor and expert parallelism of the CUDA engine under mpirun, one GPU per rank:
 * `test_engine_gpu_parallel FIXTURES` on 2 ranks (more work too). For each golden fixture
 * every rank runs the fixture's prompts as one batch on its own GPU with the whole model
 * (the one-GPU reference) and with its shard over NCCL: TP over all ranks (when the heads
 * and intermediates divide), EP over all ranks, and attention DP over the EP ranks (on the
 * fixture's prompts, and on one prompt alone, where the other ranks only pad).
 *   - EP must be bit for bit one GPU's: every teacher-forced row, prefill and decode, and
 *     the free-running tokens.
 *   - TP sums partial outputs rounded to bf16, in another order, and DP plans and pads
 *     other shapes, so their rows are held to the oracle of tests/model/oracle.h (the CPU
 *     engine rounding where the GPU does): teacher forced on HF's tokens, prefill then one
 *     decode step per token, every row against the oracle's with bounds from noisy twins
 *     (under TP with the noise of the bf16 partial sums added, ORACLE_TP_NOISE), rows
 *     near a routing tie counted apart.
 *   - Free-running greedy tokens equal one GPU's wherever one GPU's top-2 margin exceeds
 *     twice the layout's distance from it on that row.
 *   - Every rank returns the same tokens and logits.
 * Each layout tallies the fixtures it compared; --min-tp / --min-tp-fp8 set how many TP
 * must reach (a layout that skipped everything fails). EP engines also switch to three
 * random expert placements (replicas, experts moved between GPUs), after each of which
 * their logits and tokens stay one GPU's bit for bit; an invalid placement and one over
 * max_expert_bytes are refused and change nothing. Experts a rank gives away free their
 * device memory (random:v2-lite's experts rotated between the GPUs and back). Labelled
 * gpu: every rank exits 77 without a CUDA device, and with fewer GPUs than ranks. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/cuda.h"
#include "core/log.h"
#include "model/generate.h"
#include "model/model.h"
#include "tests/gpu_test_util.h"
#include "tests/test_util.h"
#include "tests/golden/golden_fixture.h"
#include "tests/model/oracle.h"
#include "tests/model/parallel_test_util.h"

static int g_rank, g_size;
static ina_comm_t *g_world;
static int g_prompts, g_prompts_equal;
static oracle_greedy_count_t g_greedy;
/* Rows compared with the oracle, and rows it had to count apart (near a routing tie), over
 * every run: a single run may sit mostly at ties (one sequence, or TP's larger noise),
 * the whole test may not. */
static int64_t g_clean_rows, g_all_rows;
static parallel_tally_t g_tp, g_ep, g_dp; /* fixtures each layout compared */

/* How an engine splits its work: tensor and expert parallelism, attention DP (mode 2). */
typedef struct layout {
  ina_comm_t *tp, *ep;
  int dp;
} layout_t;

static const layout_t k_one_gpu = {NULL, NULL, 0};

/* The engine options of every engine here, for layout `lay` on `device`. */
static ina_engine_options_t engine_options(layout_t lay, int32_t device) {
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  eo.page_size = 16;
  eo.max_tokens = 4096;
  eo.device = device;
  eo.tp_comm = lay.tp;
  eo.ep_comm = lay.ep;
  eo.attention_dp = lay.dp ? 2 : 0;
  return eo;
}

static ina_engine_t *make_engine(const ina_model_t *m, layout_t lay, int32_t device) {
  const ina_engine_options_t eo = engine_options(lay, device);
  ina_engine_t *e = NULL;
  CHECK_OK(ina_engine_create(m, &eo, &e));
  return e;
}

/* Greedy generation of the fixture's prompts as one batch on e: tokens into out[p]. */
static int generate_on(ina_engine_t *e, const fixture_t *f, int32_t out[][GOLDEN_MAX_NEW]) {
  ina_generate_request_t r[GOLDEN_MAX_PROMPTS];
  memset(r, 0, sizeof r);
  for (int32_t p = 0; p < f->count; p++) {
    const ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
    r[p].prompt = f->prompts[p];
    r[p].prompt_len = f->lens[p];
    r[p].max_new_tokens = f->max_new;
    r[p].sampling = sp;
    r[p].ignore_eos = 1;
    r[p].output = out[p];
  }
  const ina_status_t st = ina_generate(e, r, f->count, NULL);
  CHECK_OK(st);
  return st == INA_OK;
}

static int generate(const fixture_t *f, const ina_model_t *m, layout_t lay, int32_t device,
                    int32_t out[][GOLDEN_MAX_NEW]) {
  ina_engine_t *e = make_engine(m, lay, device);
  const int ok = e && generate_on(e, f, out);
  ina_engine_destroy(e);
  return ok;
}

/* Logits of every position of prompt + tokens, as one prefill of all prompts on e. */
static float *forced_logits_on(ina_engine_t *e, const fixture_t *f, int32_t tokens[][GOLDEN_MAX_NEW], int32_t *rows) {
  ina_kv_seq_t seqs[GOLDEN_MAX_PROMPTS];
  ina_kv_seq_t *ptrs[GOLDEN_MAX_PROMPTS];
  int32_t qo[GOLDEN_MAX_PROMPTS + 1] = {0};
  memset(seqs, 0, sizeof seqs);
  for (int32_t p = 0; p < f->count; p++) {
    qo[p + 1] = qo[p] + f->lens[p] + f->max_new;
    ptrs[p] = &seqs[p];
  }
  const int32_t vocab = ina_engine_config(e)->vocab_size;
  int32_t *ids = malloc((size_t)qo[f->count] * sizeof *ids);
  float *logits = malloc((size_t)qo[f->count] * vocab * sizeof *logits);
  if (!ids || !logits) goto fail;
  for (int32_t p = 0; p < f->count; p++) {
    memcpy(ids + qo[p], f->prompts[p], (size_t)f->lens[p] * sizeof *ids);
    memcpy(ids + qo[p] + f->lens[p], tokens[p], (size_t)f->max_new * sizeof *ids);
  }
  test_poison_f32(logits, (size_t)qo[f->count] * vocab);
  ina_batch_t b = {f->count, ptrs, qo, ids, 1};
  if (ina_engine_forward(e, &b, logits) != INA_OK) {
    CHECKF(0, "forced prefill: %s", ina_last_error());
    goto fail;
  }
  for (int32_t p = 0; p < f->count; p++) ina_kv_seq_release(ina_engine_page_pool(e), &seqs[p]);
  free(ids);
  *rows = qo[f->count];
  return logits;
fail:
  free(ids);
  free(logits);
  return NULL;
}

static float *forced_logits(const fixture_t *f, const ina_model_t *m, layout_t lay, int32_t device,
                            int32_t tokens[][GOLDEN_MAX_NEW], int32_t *rows) {
  ina_engine_t *e = make_engine(m, lay, device);
  float *logits = e ? forced_logits_on(e, f, tokens, rows) : NULL;
  ina_engine_destroy(e);
  return logits;
}

/* Free-running greedy tokens of the fixture's prompts as one batch, with every position's
 * logits (run->logits[p]: [lens[p] + max_new, vocab], malloc'ed). */
typedef struct free_run {
  int32_t tokens[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW];
  float *logits[GOLDEN_MAX_PROMPTS];
} free_run_t;

static void free_run_release(free_run_t *r) {
  for (int32_t p = 0; p < GOLDEN_MAX_PROMPTS; p++) free(r->logits[p]);
  memset(r, 0, sizeof *r);
}

static int free_running(const fixture_t *f, const ina_model_t *m, layout_t lay, int32_t device, free_run_t *out) {
  const int32_t vocab = ina_model_config(m)->vocab_size;
  ina_generate_request_t r[GOLDEN_MAX_PROMPTS];
  ina_engine_t *e = make_engine(m, lay, device);
  memset(r, 0, sizeof r);
  memset(out, 0, sizeof *out);
  for (int32_t p = 0; p < f->count; p++) {
    const ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
    const size_t n = (size_t)(f->lens[p] + f->max_new) * (size_t)vocab;
    out->logits[p] = malloc(n * sizeof(float));
    test_poison_f32(out->logits[p], n);
    r[p] = (ina_generate_request_t){f->prompts[p], f->lens[p], f->max_new, sp, 1, out->tokens[p], 0, out->logits[p]};
  }
  const ina_status_t st = e ? ina_generate(e, r, f->count, NULL) : INA_ERR_INTERNAL;
  CHECK_OK(st);
  ina_engine_destroy(e);
  return st == INA_OK;
}

/* Teacher forced on HF's tokens: the prompts as one prefill, then one decode step per token,
 * every row's logits (tests/model/oracle.h). */
static int forced(const fixture_t *f, const ina_model_t *m, layout_t lay, int32_t device, oracle_run_t *out) {
  ina_engine_t *e = make_engine(m, lay, device);
  const int ok = e && oracle_forced_run(e, f->prompts, f->lens, f->count,
                                        (const int32_t(*)[ORACLE_MAX_STEPS])f->generated, f->max_new - 1, 1, out) == 0;
  ina_engine_destroy(e);
  return ok;
}

static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* One layout against one GPU and the oracle. exact: expert parallelism alone, which must be
 * one GPU's bit for bit (logits and tokens). Otherwise the layout rounds differently (TP
 * sums partial outputs rounded to bf16, in another order; attention DP plans and pads
 * other shapes): every teacher-forced row, prefill and decode apart, is held to the
 * oracle's bounds with twins that add the layout's own noise (tp_noise on the summed
 * outputs under TP), and free-running tokens equal one GPU's wherever one GPU's top-2
 * margin exceeds twice the layout's distance from it on that row. Every rank must return
 * the same. Returns 1 when every comparison ran. */
static int check_layout(const char *name, const char *what, const fixture_t *f, const ina_model_t *whole,
                        const ina_model_t *part, layout_t lay, int32_t device, int exact, float tp_noise) {
  const int32_t vocab = ina_model_config(whole)->vocab_size;
  free_run_t ref, got;
  oracle_run_t a, b, want;
  oracle_twins_t *twins = NULL;
  int ran = 0;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  memset(&want, 0, sizeof want);
  if (!free_running(f, whole, k_one_gpu, device, &ref) || !free_running(f, part, lay, device, &got)) goto done;
  {
    uint64_t h = 1469598103934665603ull;
    int equal = 0;
    for (int32_t p = 0; p < f->count; p++) {
      equal += memcmp(ref.tokens[p], got.tokens[p], (size_t)f->max_new * sizeof(int32_t)) == 0;
      h = hash_bytes(h, got.tokens[p], (size_t)f->max_new * sizeof(int32_t));
    }
    CHECKF(parallel_same_everywhere(g_world, h), "%s %s: the ranks generated different tokens", name, what);
    g_prompts += f->count;
    g_prompts_equal += equal;
    if (exact)
      CHECKF(equal == f->count, "%s %s: tokens differ from one GPU's on %d of %d prompts", name, what,
             f->count - equal, f->count);
    oracle_greedy_count_t count = {0, 0};
    oracle_greedy_against(what, f->count, f->lens, f->max_new, vocab, ref.logits,
                          (const int32_t(*)[ORACLE_MAX_STEPS])ref.tokens, got.logits,
                          (const int32_t(*)[ORACLE_MAX_STEPS])got.tokens, &count);
    g_greedy.compared += count.compared;
    g_greedy.total += count.total;
  }
  if (!forced(f, whole, k_one_gpu, device, &a) || !forced(f, part, lay, device, &b)) goto done;
  {
    uint64_t h = 1469598103934665603ull;
    for (int32_t p = 0; p < f->count; p++)
      h = hash_bytes(h, b.logits[p], (size_t)(f->lens[p] + f->max_new - 1) * vocab * sizeof(float));
    CHECKF(parallel_same_everywhere(g_world, h), "%s %s: the ranks returned different logits", name, what);
  }
  if (exact) {
    int64_t rows = 0, same = 0;
    for (int32_t p = 0; p < f->count; p++)
      for (int32_t r = 0; r < f->lens[p] + f->max_new - 1; r++, rows++)
        same += memcmp(a.logits[p] + (int64_t)r * vocab, b.logits[p] + (int64_t)r * vocab, (size_t)vocab * sizeof(float)) == 0;
    CHECKF(same == rows, "%s %s: %lld of %lld rows of logits differ from one GPU's (bit for bit)", name, what,
           (long long)(rows - same), (long long)rows);
    if (g_rank == 0) printf("  %s %s: %lld rows (prefill and decode) bit for bit one GPU's\n", name, what, (long long)rows);
    ran = same == rows;
    goto done;
  }
  {
    ina_engine_options_t o = INA_ENGINE_OPTIONS_INIT;
    ina_engine_t *oracle = NULL;
    oracle_bound_t bound;
    oracle_rows_t rows;
    char label[96];
    o.page_size = 16;
    o.max_tokens = 4096;
    o.num_threads = 4;
    o.numerics = INA_ENGINE_NUMERICS_GPU;
    twins = calloc(1, sizeof *twins);
    CHECK_OK(ina_engine_create(whole, &o, &oracle));
    const int ok = twins && oracle &&
                   oracle_forced_run(oracle, f->prompts, f->lens, f->count,
                                     (const int32_t(*)[ORACLE_MAX_STEPS])f->generated, f->max_new - 1, 1, &want) == 0 &&
                   oracle_twins_make(whole, &o, f->prompts, f->lens, f->count,
                                     (const int32_t(*)[ORACLE_MAX_STEPS])f->generated, f->max_new - 1, 1, tp_noise,
                                     &want, twins) == 0;
    ina_engine_destroy(oracle);
    if (!ok) goto done;
    oracle_twins_bound(twins, &want, &bound);
    oracle_compare(&b, &want, &rows);
    snprintf(label, sizeof label, "%s %s", name, what);
    if (g_rank == 0) oracle_print(label, &rows, &bound);
    CHECKF(oracle_accepts(&rows, &bound), "%s: rows beyond the oracle's bounds", label);
    g_clean_rows += rows.prefill + rows.decode;
    g_all_rows += rows.prefill + rows.decode + rows.tied + rows.nonfinite;
    ran = rows.prefill + rows.decode > 0;
  }
done:
  free_run_release(&ref);
  free_run_release(&got);
  oracle_run_free(&a);
  oracle_run_free(&b);
  oracle_run_free(&want);
  if (twins) oracle_twins_free(twins);
  free(twins);
  return ran;
}

/* Expert placements on the GPUs: an EP engine switches to a fresh random placement
 * (replicas, empty slots, experts moved between the GPUs) three times; after each, its
 * teacher-forced logits equal one GPU's bit for bit, and after the last its free-running
 * tokens (decode graphs captured anew) equal one GPU's. */
static void check_placements(const char *name, const fixture_t *f, const ina_model_t *whole, const ina_model_t *part,
                             ina_comm_t *ep, int32_t device, test_rng_t *rng) {
  const ina_model_config_t *c = ina_model_config(whole);
  int32_t layers = 0, ref[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW], got[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW];
  for (int32_t l = 0; l < c->num_layers; l++) layers += ina_cfg_layer_is_moe(c, l);
  if (layers == 0 || !generate(f, whole, k_one_gpu, device, ref)) return;
  int32_t rows = 0, rows2 = 0;
  float *want = forced_logits(f, whole, k_one_gpu, device, ref, &rows);
  ina_engine_t *e = make_engine(part, (layout_t){NULL, ep, 0}, device);
  int64_t moved_total = 0;
  for (int round = 0; round < 3 && e && want; round++) {
    ina_expert_placement_t p = {0}, now = {0};
    parallel_random_placement(rng, g_size, layers, c->n_routed_experts, &p);
    int64_t moved = -1;
    CHECK_OK(ina_engine_apply_placement(e, &p, 0, &moved));
    moved_total += moved > 0 ? moved : 0;
    CHECK_OK(ina_engine_get_placement(e, &now));
    CHECKF(now.slot_expert && ina_expert_placement_equal(&now, &p), "%s round %d: placement not in force", name, round);
    float *got_logits = forced_logits_on(e, f, ref, &rows2);
    CHECKF(got_logits && rows2 == rows &&
               memcmp(got_logits, want, (size_t)rows * c->vocab_size * sizeof(float)) == 0,
           "%s round %d: logits after the placement change differ from one GPU's", name, round);
    free(got_logits);
    ina_expert_placement_free(&p);
    ina_expert_placement_free(&now);
  }
  if (e) {
    const int ok = generate_on(e, f, got);
    int equal = 0;
    for (int32_t p = 0; ok && p < f->count; p++)
      equal += memcmp(ref[p], got[p], (size_t)f->max_new * sizeof(int32_t)) == 0;
    CHECKF(ok && equal == f->count, "%s: tokens after placement changes equal one GPU's on %d of %d prompts", name,
           equal, f->count);
  }
  /* One rank has no other GPU to move experts to. */
  if (g_size > 1) CHECKF(moved_total > 0, "%s: no expert moved in three random placements", name);
  /* Refusals change nothing: an expert without a slot, and a limit the new experts pass. */
  if (e) {
    ina_expert_placement_t before = {0}, bad = {0}, after = {0};
    CHECK_OK(ina_engine_get_placement(e, &before));
    CHECK_OK(ina_expert_placement_copy(&before, &bad));
    for (size_t i = 0; bad.slot_expert && i < (size_t)bad.ep * (size_t)bad.slots_per_rank; i++)
      if (bad.slot_expert[i] == 0) bad.slot_expert[i] = -1; /* layer 0 loses expert 0 */
    int64_t moved = 0;
    ina_log_set_quiet_errors(1);
    const ina_status_t invalid = ina_engine_apply_placement(e, &bad, 0, &moved);
    ina_log_set_quiet_errors(0);
    CHECKF(invalid == INA_ERR_INVALID_ARGUMENT, "%s: a placement without expert 0 gave %d", name, (int)invalid);
    ina_expert_placement_free(&bad);
    ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
    eo.device = device;
    eo.ep_comm = ep;
    eo.max_expert_bytes = 1;
    ina_engine_t *capped = NULL;
    CHECK_OK(ina_engine_create(part, &eo, &capped));
    parallel_random_placement(rng, g_size, layers, c->n_routed_experts, &bad);
    ina_log_set_quiet_errors(1);
    const ina_status_t over = capped ? ina_engine_apply_placement(capped, &bad, 0, &moved) : INA_ERR_INTERNAL;
    ina_log_set_quiet_errors(0);
    CHECKF(over == INA_ERR_OUT_OF_MEMORY, "%s: a placement over max_expert_bytes gave %d", name, (int)over);
    ina_engine_destroy(capped);
    CHECK_OK(ina_engine_get_placement(e, &after));
    CHECKF(before.slot_expert && after.slot_expert && ina_expert_placement_equal(&before, &after),
           "%s: a refused placement changed the one in force", name);
    ina_expert_placement_free(&bad);
    ina_expert_placement_free(&before);
    ina_expert_placement_free(&after);
  }
  if (g_rank == 0) printf("  %s ep placements: 3 applied, %lld bytes moved, logits and tokens as one GPU's\n", name,
                          (long long)moved_total);
  ina_engine_destroy(e);
  free(want);
}

/* Rank r's slots hold rank (r + shift) % ranks' share of the experts, in order. */
static void shifted_placement(int32_t layers, int32_t experts, int32_t shift, ina_expert_placement_t *p) {
  const int32_t per = experts / g_size;
  CHECK_OK(ina_expert_placement_init(g_size, per, layers, experts, p));
  for (int32_t m = 0; p->slot_expert && m < layers; m++)
    for (int32_t r = 0; r < g_size; r++)
      for (int32_t s = 0; s < per; s++)
        p->slot_expert[ina_expert_placement_index(p, m, r, s)] = ((r + shift) % g_size) * per + s;
}

/* Experts a rank no longer holds give their device memory back: random:v2-lite (14 GB of
 * routed experts per rank over 2 GPUs) moves every rank's experts to the next rank and
 * back; each time the GPU's free memory must not drop by more than a twentieth of what
 * the rank received (it would drop by all of it if the experts given away stayed). */
static void check_expert_memory(ina_comm_t *ep, int32_t device) {
  ina_model_config_t c;
  CHECK_OK(ina_model_spec_config("random:v2-lite", &c));
  if (c.n_routed_experts % g_size != 0 || g_size < 2) {
    if (g_rank == 0) printf("  expert memory: skipped (%d ranks)\n", g_size);
    return;
  }
  ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
  mo.random_on_device = 1;
  mo.shard.expert_begin = c.n_routed_experts * g_rank / g_size;
  mo.shard.expert_end = c.n_routed_experts * (g_rank + 1) / g_size;
  ina_model_t *m = NULL;
  CHECK_OK(ina_model_open("random:v2-lite", &mo, &m));
  ina_engine_t *e = m ? make_engine(m, (layout_t){NULL, ep, 0}, device) : NULL;
  int32_t layers = 0;
  for (int32_t l = 0; l < c.num_layers; l++) layers += ina_cfg_layer_is_moe(&c, l);
  for (int32_t shift = 1; e && shift >= 0; shift--) {
    ina_expert_placement_t p = {0};
    shifted_placement(layers, c.n_routed_experts, shift, &p);
    size_t before = 0, after = 0;
    int64_t moved = 0;
    CHECK_OK(ina_cuda_mem_info(device, &before, NULL));
    CHECK_OK(ina_engine_apply_placement(e, &p, 0, &moved));
    CHECK_OK(ina_cuda_mem_info(device, &after, NULL));
    const int64_t received = moved / g_size, dropped = (int64_t)before - (int64_t)after;
    CHECKF(received > ((int64_t)1 << 30), "expert memory, shift %d: only %lld bytes received", shift,
           (long long)received);
    CHECKF(dropped <= received / 20, "expert memory, shift %d: free memory dropped by %.0f MiB after receiving %.0f MiB",
           shift, (double)dropped / 1048576.0, (double)received / 1048576.0);
    if (g_rank == 0)
      printf("  expert memory, shift %d: received %.0f MiB, free memory %+.0f MiB\n", shift,
             (double)received / 1048576.0, -(double)dropped / 1048576.0);
    ina_expert_placement_free(&p);
  }
  ina_engine_destroy(e);
  ina_model_destroy(m);
}

/* The step split of an EP + attention-DP engine over a generation: every part that runs
 * takes time (no tensor parallelism: its part stays 0), the parts add up to no more than
 * the wall time, and timing the steps changes no token. */
static void check_step_split(const char *name, const fixture_t *f, const ina_model_t *part, ina_comm_t *ep,
                             int32_t device) {
  int32_t plain[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW], timed[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW];
  const layout_t lay = {NULL, ep, 1};
  if (!generate(f, part, lay, device, plain)) return;
  ina_engine_options_t eo = engine_options(lay, device);
  eo.step_split = 1;
  ina_engine_t *e = NULL;
  CHECK_OK(ina_engine_create(part, &eo, &e));
  if (!e) return;
  const double t0 = test_now_s();
  const int ok = generate_on(e, f, timed);
  const double wall_ms = 1e3 * (test_now_s() - t0);
  ina_engine_step_split_t sp;
  memset(&sp, 0, sizeof sp);
  CHECK_OK(ina_engine_step_split(e, 1, &sp));
  const double sum = sp.attention_ms + sp.moe_ms + sp.ep_comm_ms + sp.tp_comm_ms + sp.other_ms;
  int same = ok;
  for (int32_t p = 0; ok && p < f->count; p++) same &= memcmp(plain[p], timed[p], (size_t)f->max_new * 4) == 0;
  CHECKF(same, "%s step split: timing the steps changed the tokens", name);
  CHECKF(sp.steps >= f->max_new, "%s step split: %lld steps timed, the generation ran at least %d", name,
         (long long)sp.steps, f->max_new);
  /* One rank exchanges nothing: its EP comm part stays 0 too. */
  CHECKF(sp.attention_ms > 0 && sp.moe_ms > 0 && (sp.ep_comm_ms > 0) == (g_size > 1) && sp.other_ms > 0 &&
             sp.tp_comm_ms == 0,
         "%s step split: attention %.3f, moe %.3f, ep %.3f, tp %.3f, other %.3f ms", name, sp.attention_ms,
         sp.moe_ms, sp.ep_comm_ms, sp.tp_comm_ms, sp.other_ms);
  CHECKF(sum <= wall_ms, "%s step split: parts add up to %.3f ms, more than the %.3f ms the steps took", name, sum,
         wall_ms);
  ina_engine_step_split_t after;
  CHECK_OK(ina_engine_step_split(e, 0, &after));
  CHECKF(after.steps == 0 && after.moe_ms == 0, "%s step split: the reset left %lld steps", name,
         (long long)after.steps);
  if (g_rank == 0)
    printf("  %s step split (ep+dp, %lld steps): attention %.2f, moe %.2f, ep comm %.2f, other %.2f ms of %.2f ms "
           "wall\n",
           name, (long long)sp.steps, sp.attention_ms, sp.moe_ms, sp.ep_comm_ms, sp.other_ms, wall_ms);
  ina_engine_destroy(e);
}

static void check_fixture(const char *dir, const char *name, ina_comm_t *tp, ina_comm_t *ep, int32_t device,
                          test_rng_t *rng) {
  fixture_t f;
  ina_model_t *whole = NULL, *part = NULL;
  CHECKF(load_fixture(dir, &f) == 0, "%s: cannot read the fixture", dir);
  CHECK_OK(ina_model_open(dir, NULL, &whole));
  if (!whole || f.count == 0) goto done;
  const ina_model_config_t *c = ina_model_config(whole);
  if (ina_cfg_has_indexer(c)) {
    const char *why = "DeepSeek-V3.2: the CUDA engine runs it on one GPU only so far";
    parallel_tally_skip(&g_tp, name, why);
    parallel_tally_skip(&g_ep, name, why);
    parallel_tally_skip(&g_dp, name, why);
    goto done;
  }
  /* TP over every rank, where it divides. */
  if (c->num_heads % g_size == 0 && c->intermediate_size % g_size == 0 && c->moe_intermediate_size % g_size == 0) {
    ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
    mo.shard.tp_rank = g_rank;
    mo.shard.tp_size = g_size;
    const ina_status_t st = ina_model_open(dir, &mo, &part);
    if (st == INA_OK) {
      if (check_layout(name, "tp", &f, whole, part, (layout_t){tp, NULL, 0}, device, 0, ORACLE_TP_NOISE))
        parallel_tally_ran(&g_tp, c);
      else
        parallel_tally_skip(&g_tp, name, "a comparison did not run");
    } else {
      parallel_tally_skip(&g_tp, name, "the shard cannot be opened");
    }
    ina_model_destroy(part);
    part = NULL;
  } else {
    parallel_tally_skip(&g_tp, name, "heads or intermediates do not split over the ranks");
  }
  /* EP over every rank. */
  {
    ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
    mo.shard.expert_begin = (int32_t)((int64_t)c->n_routed_experts * g_rank / g_size);
    mo.shard.expert_end = (int32_t)((int64_t)c->n_routed_experts * (g_rank + 1) / g_size);
    CHECK_OK(ina_model_open(dir, &mo, &part));
    if (part) {
      if (check_layout(name, "ep", &f, whole, part, (layout_t){NULL, ep, 0}, device, 1, 0))
        parallel_tally_ran(&g_ep, c);
      else
        parallel_tally_skip(&g_ep, name, "a comparison did not run");
    }
    if (part) check_placements(name, &f, whole, part, ep, device, rng);
    /* Attention DP over the EP ranks: each computes the attention of its own sequences,
     * whose plans and GEMM shapes differ from one GPU's, so rounding differs. Then one
     * sequence alone: the other ranks only pad their rows. */
    if (part) {
      fixture_t one = f;
      one.count = 1;
      const int both = check_layout(name, "ep+dp", &f, whole, part, (layout_t){NULL, ep, 1}, device, 0, 0) &
                       check_layout(name, "ep+dp, one sequence", &one, whole, part, (layout_t){NULL, ep, 1}, device, 0, 0);
      if (both)
        parallel_tally_ran(&g_dp, c);
      else
        parallel_tally_skip(&g_dp, name, "a comparison did not run");
    }
    if (part && c->n_routed_experts > 0) check_step_split(name, &f, part, ep, device);
  }
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
  const int32_t device = ina_bootstrap_device(boot);
  {
    /* A GPU of its own for every rank of a node (test_gpus_missing names why not). */
    char buf[256];
    const char *why = test_gpus_missing(ina_bootstrap_local_size(boot), buf, sizeof buf);
    if (!why && device < 0) why = "no CUDA device for this rank";
    if (why) {
      const int rc = g_rank == 0 ? test_skip_gpu("test_engine_gpu_parallel", why) : test_gpu_skip_status();
      ina_bootstrap_finalize(boot);
      return rc;
    }
  }
  const char *root = "tests/golden/fixtures";
  parallel_minimum_t min_tp = PARALLEL_MINIMUM_INIT, min_all = PARALLEL_MINIMUM_INIT;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--min-tp") == 0 && i + 1 < argc)
      min_tp.fixtures = atoi(argv[++i]);
    else if (strcmp(argv[i], "--min-tp-fp8") == 0 && i + 1 < argc)
      min_tp.fp8 = atoi(argv[++i]);
    else if (!parallel_minimum_arg(argc, argv, &i, &min_all))
      root = argv[i];
  }
  ina_comm_t *tp = NULL, *ep = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &g_world));
  /* Every rank in one group: the same NCCL communicator serves TP and EP runs. */
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_NCCL, &tp));
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_NCCL, &ep));
  int64_t seed = g_rank == 0 ? (int64_t)test_seed("test_engine_gpu_parallel") : 0;
  if (g_world) CHECK_OK(ina_comm_broadcast(g_world, &seed, 1, INA_DTYPE_I64, 0, NULL));
  test_rng_t rng = {(uint64_t)seed};
  if (g_rank == 0) printf("test_engine_gpu_parallel: %d ranks, one GPU each\n", g_size);
  char *names[GOLDEN_MAX_FIXTURES];
  const int count = g_world && tp && ep ? golden_fixture_names(root, names) : 0;
  CHECKF(count >= 6, "only %d fixtures in %s", count, root);
  for (int i = 0; i < count; i++) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
    check_fixture(dir, names[i], tp, ep, device, &rng);
    free(names[i]);
  }
  if (ep) check_expert_memory(ep, device);
  if (g_rank == 0)
    printf("test_engine_gpu_parallel: %lld of %lld rows compared with the oracle (the rest near a routing tie)\n",
           (long long)g_clean_rows, (long long)g_all_rows);
  CHECKF((double)g_clean_rows >= ORACLE_MIN_CLEAN * (double)g_all_rows,
         "only %lld of %lld rows clear of near-ties", (long long)g_clean_rows, (long long)g_all_rows);
  parallel_tally_check(&g_tp, &min_tp, "test_engine_gpu_parallel tp", g_rank);
  parallel_tally_check(&g_ep, &min_all, "test_engine_gpu_parallel ep", g_rank);
  parallel_tally_check(&g_dp, &min_all, "test_engine_gpu_parallel ep+dp", g_rank);
  if (g_rank == 0)
    printf("test_engine_gpu_parallel: free-running tokens equal to one GPU's on %d of %d prompts; %lld of %lld "
           "tokens compared by margin (the rest after a near-tie)\n",
           g_prompts_equal, g_prompts, (long long)g_greedy.compared, (long long)g_greedy.total);
  ina_comm_destroy(ep);
  ina_comm_destroy(tp);
  ina_comm_destroy(g_world);
  char name[64];
  snprintf(name, sizeof name, "test_engine_gpu_parallel rank %d", g_rank);
  const int rc = test_finish(name);
  ina_bootstrap_finalize(boot);
  return rc;
}
