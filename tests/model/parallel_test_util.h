/* Shared by the multi-rank engine tests (test_engine_ep.c, test_engine_tp.c,
 * test_engine_placement.c, test_engine_dp.c, test_engine_gpu_parallel.c): greedy
 * generation of a golden fixture's prompts as one batch, on an engine with the given
 * tensor- and expert-parallel communicators (NULL: one rank), agreement checks over the
 * ranks, and the tally of what a test compared, which fails the test when fewer fixtures
 * ran than it requires (so that skips cannot leave it passing on nothing).
 * Include after tests/test_util.h and tests/golden/golden_fixture.h. */
#ifndef INA_TESTS_MODEL_PARALLEL_TEST_UTIL_H
#define INA_TESTS_MODEL_PARALLEL_TEST_UTIL_H

#include <stdlib.h>
#include <string.h>

#include "model/generate.h"
#include "model/model.h"
#include "moe_ep/expert_placement.h"

typedef struct fixture_run {
  ina_generate_request_t r[GOLDEN_MAX_PROMPTS]; /* outputs and logits of every prompt */
} fixture_run_t;

static inline void fixture_generate(const fixture_t *f, const ina_model_t *m, ina_comm_t *tp_comm,
                                    ina_comm_t *ep_comm, int32_t page_size, fixture_run_t *out) {
  const int32_t vocab = ina_model_config(m)->vocab_size;
  ina_engine_options_t eo = INA_ENGINE_OPTIONS_INIT;
  eo.page_size = page_size;
  eo.max_tokens = 4096;
  eo.num_threads = 1;
  eo.tp_comm = tp_comm;
  eo.ep_comm = ep_comm;
  ina_engine_t *e = NULL;
  memset(out, 0, sizeof *out);
  CHECK_OK(ina_engine_create(m, &eo, &e));
  if (!e) return;
  for (int32_t p = 0; p < f->count; p++) {
    const ina_sampling_params_t sp = INA_SAMPLING_PARAMS_INIT;
    ina_generate_request_t *r = &out->r[p];
    r->prompt = f->prompts[p];
    r->prompt_len = f->lens[p];
    r->max_new_tokens = f->max_new;
    r->sampling = sp;
    r->ignore_eos = 1;
    r->output = malloc((size_t)f->max_new * sizeof(int32_t));
    r->logits = malloc((size_t)(f->lens[p] + f->max_new) * vocab * sizeof(float));
    test_poison_f32(r->logits, (size_t)(f->lens[p] + f->max_new) * vocab);
  }
  CHECK_OK(ina_generate(e, out->r, f->count, NULL));
  ina_engine_destroy(e);
}

/* 1 on every rank when every rank of comm passes ok != 0 (0 when the gather fails). */
static inline int parallel_all_ranks(ina_comm_t *comm, int ok) {
  const int n = ina_comm_size(comm);
  int32_t mine = ok != 0, *all = calloc((size_t)n, sizeof *all);
  int every = all != NULL && ina_comm_all_gather(comm, &mine, all, 1, INA_DTYPE_I32, NULL) == INA_OK;
  for (int r = 0; r < n && every; r++) every = all[r] != 0;
  free(all);
  return every;
}

/* 1 when every rank of comm passes the same value. */
static inline int parallel_same_everywhere(ina_comm_t *comm, uint64_t value) {
  const int n = ina_comm_size(comm);
  uint64_t *all = calloc((size_t)n, sizeof *all);
  int same = all != NULL && ina_comm_all_gather(comm, &value, all, 1, INA_DTYPE_I64, NULL) == INA_OK;
  for (int r = 0; r < n && same; r++) same = all[r] == value;
  free(all);
  return same;
}

/* Uniform in [0, n). */
static inline int32_t parallel_rng_below(test_rng_t *rng, int64_t n) { return (int32_t)test_rng_int(rng, 0, n - 1); }

/* A random valid placement: every expert once on a random rank, then extra replicas and
 * empty slots at random, slots_per_rank anywhere from the least that fits to every expert. */
static inline void parallel_random_placement(test_rng_t *rng, int32_t ep, int32_t layers, int32_t experts,
                                             ina_expert_placement_t *p) {
  const int32_t least = (experts + ep - 1) / ep;
  const int32_t slots = least + parallel_rng_below(rng, (experts - least + 1));
  CHECK_OK(ina_expert_placement_init(ep, slots, layers, experts, p));
  int32_t *order = malloc((size_t)experts * sizeof *order), *used = calloc((size_t)ep, sizeof *used);
  for (int32_t l = 0; l < layers && order && used; l++) {
    memset(used, 0, (size_t)ep * sizeof *used);
    for (int32_t x = 0; x < experts; x++) order[x] = x;
    for (int32_t x = experts - 1; x > 0; x--) {
      const int32_t k = parallel_rng_below(rng, x + 1), t = order[x];
      order[x] = order[k];
      order[k] = t;
    }
    /* Each expert once, on a random rank with room. */
    for (int32_t i = 0; i < experts; i++) {
      int32_t r = parallel_rng_below(rng, ep);
      while (used[r] == slots) r = (r + 1) % ep;
      p->slot_expert[ina_expert_placement_index(p, l, r, used[r]++)] = order[i];
    }
    /* The other slots: a replica of an expert the rank lacks, or empty. */
    for (int32_t r = 0; r < ep; r++)
      for (int32_t s = used[r]; s < slots; s++) {
        if (parallel_rng_below(rng, 3) == 0) continue;
        const int32_t x = parallel_rng_below(rng, experts);
        int held = 0;
        for (int32_t k = 0; k < slots; k++) held |= ina_expert_placement_slot(p, l, r, k) == x;
        if (!held) p->slot_expert[ina_expert_placement_index(p, l, r, s)] = x;
      }
    /* Shuffle each rank's slots, so that experts do not sit in order. */
    for (int32_t r = 0; r < ep; r++)
      for (int32_t s = slots - 1; s > 0; s--) {
        const int32_t k = parallel_rng_below(rng, s + 1);
        int32_t *a = &p->slot_expert[ina_expert_placement_index(p, l, r, s)];
        int32_t *b = &p->slot_expert[ina_expert_placement_index(p, l, r, k)];
        const int32_t t = *a;
        *a = *b;
        *b = t;
      }
  }
  free(order);
  free(used);
  CHECK_OK(ina_expert_placement_validate(p));
}

/* ---- what a test compared ------------------------------------------------------------ */

/* The least a test must compare: fixtures whose every prompt was compared, how many of
 * them FP8 block-scaled checkpoints and how many with MoE layers. Set on the command line
 * (parallel_minimum_arg); every rank runs the same fixtures and skips, so every rank
 * counts alike. */
typedef struct parallel_minimum {
  int fixtures, fp8, moe;
} parallel_minimum_t;

/* At least one fixture (never fewer, whatever the command line says). */
#define PARALLEL_MINIMUM_INIT {1, 0, 0}

typedef struct parallel_tally {
  int fixtures, fp8, moe; /* fixtures fully compared */
  long long comparisons;  /* prompts compared, over every fixture and mode */
  int skipped;
  char skips[GOLDEN_MAX_FIXTURES][200]; /* "name (why)" */
} parallel_tally_t;

/* argv[*i] is one of --min-fixtures N, --min-fp8 N, --min-moe N: takes it and its value
 * (advancing *i) and returns 1; else returns 0. */
static inline int parallel_minimum_arg(int argc, char **argv, int *i, parallel_minimum_t *m) {
  int *field = strcmp(argv[*i], "--min-fixtures") == 0 ? &m->fixtures
               : strcmp(argv[*i], "--min-fp8") == 0    ? &m->fp8
               : strcmp(argv[*i], "--min-moe") == 0    ? &m->moe
                                                       : NULL;
  if (!field) return 0;
  CHECKF(*i + 1 < argc, "%s needs a number", argv[*i]);
  if (*i + 1 < argc) *field = atoi(argv[++*i]);
  return 1;
}

static inline int parallel_config_has_moe(const ina_model_config_t *c) {
  for (int32_t l = 0; l < c->num_layers; l++)
    if (ina_cfg_layer_is_moe(c, l)) return 1;
  return 0;
}

/* A fixture whose prompts were all compared (c: its config). */
static inline void parallel_tally_ran(parallel_tally_t *t, const ina_model_config_t *c) {
  t->fixtures++;
  t->fp8 += c->fp8_block_scaled != 0;
  t->moe += parallel_config_has_moe(c);
}

/* A fixture left out, and why (printed by parallel_tally_check). */
static inline void parallel_tally_skip(parallel_tally_t *t, const char *name, const char *why) {
  if (t->skipped < GOLDEN_MAX_FIXTURES)
    snprintf(t->skips[t->skipped], sizeof t->skips[0], "%s (%s)", name, why);
  t->skipped++;
}

/* Rank 0 prints what ran and what was skipped; every rank fails below the minimum (and
 * with no fixture compared at all, whatever the minimum). */
static inline void parallel_tally_check(const parallel_tally_t *t, const parallel_minimum_t *m,
                                        const char *test, int rank) {
  const int least = m->fixtures > 1 ? m->fixtures : 1;
  if (rank == 0) {
    printf("%s: compared %d fixtures (%d FP8, %d with MoE layers) in %lld prompt comparisons on rank 0; "
           "at least %d (%d FP8, %d with MoE layers) required\n",
           test, t->fixtures, t->fp8, t->moe, t->comparisons, least, m->fp8, m->moe);
    printf("%s: skipped %d fixtures\n", test, t->skipped);
    for (int i = 0; i < t->skipped && i < GOLDEN_MAX_FIXTURES; i++) printf("  skipped %s\n", t->skips[i]);
  }
  CHECKF(t->fixtures >= least, "%s: %d fixtures compared, at least %d required", test, t->fixtures, least);
  CHECKF(t->fp8 >= m->fp8, "%s: %d FP8 fixtures compared, at least %d required", test, t->fp8, m->fp8);
  CHECKF(t->moe >= m->moe, "%s: %d fixtures with MoE layers compared, at least %d required", test, t->moe,
         m->moe);
}

static inline void fixture_run_free(fixture_run_t *r) {
  for (int32_t p = 0; p < GOLDEN_MAX_PROMPTS; p++) {
    free(r->r[p].output);
    free(r->r[p].logits);
  }
}

#endif
