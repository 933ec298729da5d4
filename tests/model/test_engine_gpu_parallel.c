/* Tensor and expert parallelism of the CUDA engine under mpirun, one GPU per rank:
 * `test_engine_gpu_parallel FIXTURES` on 2 ranks (more work too). For each golden fixture
 * every rank runs the fixture's prompts as one batch of greedy generation on its own GPU
 * with the whole model (the one-GPU reference), then with its shard over NCCL: TP over
 * all ranks (when the heads and intermediates divide) and EP over all ranks.
 * EP must be bit for bit one GPU's: the same tokens and the same teacher-forced logits.
 * TP sums partial outputs in bf16 in another order than one GPU, so it (and EP too) is
 * held to what rounding allows and a bug does not:
 *   - teacher forced on the reference's tokens (prompt and generated tokens as one
 *     prefill, every row's logits): the median over rows of the row's relative L2 error
 *     against the one-GPU logits <= ROW_BOUND, and the argmax equal on >= 95 % of rows;
 *   - free-running greedy tokens equal to the one-GPU tokens on >= 80 % of all prompts
 *     (the count is printed per fixture);
 *   - every rank's tokens equal (all ranks run the same batch).
 * A wrong head slice, a missing all-reduce or an expert computed twice moves every row
 * by far more than ROW_BOUND. EP engines also switch to three random expert placements
 * (replicas, experts moved between GPUs), after each of which their logits and tokens
 * stay one GPU's bit for bit; an invalid placement and one over max_expert_bytes are
 * refused and change nothing. Attention data parallelism over the EP ranks (each rank
 * the attention of its own sequences, the MoE layers over all ranks' rows) is held to
 * the TP bounds, on the fixture's prompts and on one prompt alone (the other ranks only
 * pad); every rank must return the same logits. Experts a rank gives away free their
 * device memory (random:v2-lite's experts rotated between the GPUs and back). Labelled
 * gpu: every rank exits 77 without a CUDA device. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/cuda.h"
#include "core/log.h"
#include "model/generate.h"
#include "model/model.h"
#include "tests/test_util.h"
#include "tests/golden/golden_fixture.h"
#include "tests/model/parallel_test_util.h"

#define ROW_BOUND 2e-2
#define ARGMAX_SHARE 0.95
#define TOKENS_SHARE 0.8

static int g_rank, g_size;
static ina_comm_t *g_world;
static int g_prompts, g_prompts_equal;

static int32_t argmax(const float *row, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; i++)
    if (row[i] > row[best]) best = i;
  return best;
}

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

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void check_layout(const char *name, const char *what, const fixture_t *f, const ina_model_t *whole,
                         const ina_model_t *part, layout_t lay, int32_t device, int exact) {
  const int32_t vocab = ina_model_config(whole)->vocab_size;
  int32_t ref[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW], got[GOLDEN_MAX_PROMPTS][GOLDEN_MAX_NEW];
  if (!generate(f, whole, k_one_gpu, device, ref) || !generate(f, part, lay, device, got)) return;
  int equal = 0;
  uint64_t h = 1469598103934665603ull;
  for (int32_t p = 0; p < f->count; p++) {
    equal += memcmp(ref[p], got[p], (size_t)f->max_new * sizeof(int32_t)) == 0;
    for (int32_t i = 0; i < f->max_new; i++) h = (h ^ (uint64_t)got[p][i]) * 1099511628211ull;
  }
  CHECKF(parallel_same_everywhere(g_world, h), "%s %s: the ranks generated different tokens", name, what);
  g_prompts += f->count;
  g_prompts_equal += equal;
  int32_t rows = 0, rows2 = 0;
  float *a = forced_logits(f, whole, k_one_gpu, device, ref, &rows);
  float *b = forced_logits(f, part, lay, device, ref, &rows2);
  if (a && b && rows == rows2) {
    /* Every rank returns every row (under attention DP, gathered from their ranks). */
    uint64_t lh = 1469598103934665603ull;
    const unsigned char *bytes = (const unsigned char *)b;
    for (size_t i = 0; i < (size_t)rows * vocab * sizeof *b; i++) lh = (lh ^ bytes[i]) * 1099511628211ull;
    CHECKF(parallel_same_everywhere(g_world, lh), "%s %s: the ranks returned different logits", name, what);
    double *err = malloc((size_t)rows * sizeof *err);
    int32_t same_argmax = 0;
    for (int32_t r = 0; r < rows && err; r++) {
      err[r] = test_rel_l2(b + (int64_t)r * vocab, a + (int64_t)r * vocab, (size_t)vocab);
      same_argmax += argmax(a + (int64_t)r * vocab, vocab) == argmax(b + (int64_t)r * vocab, vocab);
    }
    if (exact) {
      int32_t same_rows = 0;
      for (int32_t r = 0; r < rows; r++)
        same_rows += memcmp(a + (int64_t)r * vocab, b + (int64_t)r * vocab, (size_t)vocab * sizeof *a) == 0;
      CHECKF(same_rows == rows, "%s %s: %d of %d rows of logits differ from one GPU's (bit for bit)", name, what,
             rows - same_rows, rows);
      CHECKF(equal == f->count, "%s %s: tokens differ from one GPU's on %d of %d prompts", name, what,
             f->count - equal, f->count);
    }
    if (err) {
      qsort(err, (size_t)rows, sizeof *err, cmp_double);
      const double median = err[rows / 2], worst = err[rows - 1];
      CHECKF(median <= ROW_BOUND, "%s %s: median row error %.3g against one GPU > %g", name, what, median,
             ROW_BOUND);
      CHECKF(same_argmax >= ARGMAX_SHARE * rows, "%s %s: argmax equal on %d of %d rows", name, what,
             same_argmax, rows);
      if (g_rank == 0)
        printf("  %s %s: rows %d, median error %.2e, worst %.2e, argmax equal %d / %d; free-running "
               "tokens equal on %d of %d prompts\n",
               name, what, rows, median, worst, same_argmax, rows, equal, f->count);
    }
    free(err);
  } else {
    CHECKF(0, "%s %s: no forced logits", name, what);
  }
  free(a);
  free(b);
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
  CHECKF(moved_total > 0, "%s: no expert moved in three random placements", name);
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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
  const double t0 = now_s();
  const int ok = generate_on(e, f, timed);
  const double wall_ms = 1e3 * (now_s() - t0);
  ina_engine_step_split_t sp;
  memset(&sp, 0, sizeof sp);
  CHECK_OK(ina_engine_step_split(e, 1, &sp));
  const double sum = sp.attention_ms + sp.moe_ms + sp.ep_comm_ms + sp.tp_comm_ms + sp.other_ms;
  int same = ok;
  for (int32_t p = 0; ok && p < f->count; p++) same &= memcmp(plain[p], timed[p], (size_t)f->max_new * 4) == 0;
  CHECKF(same, "%s step split: timing the steps changed the tokens", name);
  CHECKF(sp.steps >= f->max_new, "%s step split: %lld steps timed, the generation ran at least %d", name,
         (long long)sp.steps, f->max_new);
  CHECKF(sp.attention_ms > 0 && sp.moe_ms > 0 && sp.ep_comm_ms > 0 && sp.other_ms > 0 && sp.tp_comm_ms == 0,
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
  /* TP over every rank, where it divides. */
  if (c->num_heads % g_size == 0 && c->intermediate_size % g_size == 0 && c->moe_intermediate_size % g_size == 0) {
    ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
    mo.shard.tp_rank = g_rank;
    mo.shard.tp_size = g_size;
    const ina_status_t st = ina_model_open(dir, &mo, &part);
    if (st == INA_OK)
      check_layout(name, "tp", &f, whole, part, (layout_t){tp, NULL, 0}, device, 0);
    else if (g_rank == 0)
      printf("  %s tp: skipped (%s)\n", name, ina_last_error());
    ina_model_destroy(part);
    part = NULL;
  } else if (g_rank == 0) {
    printf("  %s tp: skipped (heads or intermediates do not split %d ways)\n", name, g_size);
  }
  /* EP over every rank. */
  {
    ina_model_options_t mo = INA_MODEL_OPTIONS_INIT;
    mo.shard.expert_begin = (int32_t)((int64_t)c->n_routed_experts * g_rank / g_size);
    mo.shard.expert_end = (int32_t)((int64_t)c->n_routed_experts * (g_rank + 1) / g_size);
    CHECK_OK(ina_model_open(dir, &mo, &part));
    if (part) check_layout(name, "ep", &f, whole, part, (layout_t){NULL, ep, 0}, device, 1);
    if (part) check_placements(name, &f, whole, part, ep, device, rng);
    /* Attention DP over the EP ranks: each computes the attention of its own sequences,
     * whose plans and GEMM shapes differ from one GPU's, so rounding differs. Then one
     * sequence alone: the other ranks only pad their rows. */
    if (part) check_layout(name, "ep+dp", &f, whole, part, (layout_t){NULL, ep, 1}, device, 0);
    if (part) {
      fixture_t one = f;
      one.count = 1;
      check_layout(name, "ep+dp, one sequence", &one, whole, part, (layout_t){NULL, ep, 1}, device, 0);
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
  if (device < 0) {
    if (g_rank == 0) printf("test_engine_gpu_parallel: no CUDA device, skipped\n");
    ina_bootstrap_finalize(boot);
    return TEST_SKIP;
  }
  const char *root = argc > 1 ? argv[1] : "tests/golden/fixtures";
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
  CHECKF(g_prompts > 0 && g_prompts_equal >= TOKENS_SHARE * g_prompts,
         "free-running greedy tokens equal to one GPU's on %d of %d prompts", g_prompts_equal, g_prompts);
  if (g_rank == 0)
    printf("test_engine_gpu_parallel: free-running tokens equal to one GPU's on %d of %d prompts\n",
           g_prompts_equal, g_prompts);
  ina_comm_destroy(ep);
  ina_comm_destroy(tp);
  ina_comm_destroy(g_world);
  char name[64];
  snprintf(name, sizeof name, "test_engine_gpu_parallel rank %d", g_rank);
  const int rc = test_finish(name);
  ina_bootstrap_finalize(boot);
  return rc;
}
