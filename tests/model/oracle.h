/* The oracle of the CUDA engine: the CPU engine in INA_ENGINE_NUMERICS_GPU, which rounds
 * to bf16 (and quantizes to e4m3) exactly where the CUDA engine does, compared row by row.
 *
 * Error model (the numerics rules are in docs/NUMERICS.md):
 *   - Both engines round at the same points, so they differ only in what happens between
 *     two roundings: fp32 sums in another order and fp32 intrinsics, a few fp32 ulp of the
 *     value (ORACLE_NOISE = 2^-22, four ulp; on the H200 the rows of the golden fixtures
 *     that no flip reached agreed to 1e-7), and one rounding the oracle does not make: the
 *     tensor-core MLA kernels (kv_lora_rank 512, rope 64) take the softmax weights P in
 *     bf16 for P . V (mla/mla_fast.cuh), 2^-9 relative on the attention output
 *     (oracle_attention_noise).
 *   - Such a difference changes a value's bf16 rounding now and then, by one ulp, and the
 *     network carries those flips on to the logits. How far, depends on the model and the
 *     inputs, so the oracle measures it: ORACLE_TWINS runs of the oracle with every value
 *     scaled by 1 + u * ORACLE_NOISE before its rounding (u uniform in [-1, 1); the
 *     attention output by 2^-9) give the spread that a second correct implementation
 *     shows. A row's bound is ORACLE_SAFETY times the largest twin error of its kind
 *     (prefill rows and decode rows apart): the CUDA engine is one more draw of the same
 *     noise, and the factor covers the draws the twins did not make.
 *   - Expert choice is a discontinuity: where the router's top choices lie close, noise
 *     may pick other experts and move the row by 10-90 %. A row is near a tie when a twin
 *     routed it to other experts than the oracle did or came within a quarter of its
 *     margin (ina_router_ref_margins) of doing so (the noise model decides), or when that
 *     margin is below ORACLE_TIE_MARGIN, 16 times the fp32 noise of the router's scores;
 *     runs of the same tokens pool their twins' findings. Such a row and every later row of its sequence
 *     (which attend to its cache entries) are counted apart and not bounded; at least
 *     ORACLE_MIN_CLEAN of a run's rows must be clean (oracle_enough_rows), or the run
 *     proves nothing.
 *   - On the golden fixtures (tiny random models) the network is chaotic: one flipped ulp
 *     grows to 1-3 % of a row's logits, so the twins' spread, not the per-op noise, sets
 *     the bounds (3-9e-2 on bf16 fixtures, 0.1-0.16 on FP8 ones, where a flip in an e4m3
 *     input moves a value by up to 12 %).
 *   - A non-finite logit fails, always.
 * The same comparison rejects the deliberate bugs of tests/model/test_oracle_mutations.c,
 * so a bound that lets a 5 % bug through cannot stand. */
#ifndef INA_TESTS_MODEL_ORACLE_H
#define INA_TESTS_MODEL_ORACLE_H

#include <math.h>
#include <string.h>

#include "core/log.h"
#include "model/engine_test_hooks.h"
#include "model/model.h"
#include "../test_util.h"

#define ORACLE_MAX_SEQS 256 /* a graph bucket's worth */
#define ORACLE_MAX_STEPS 64
#define ORACLE_NOISE 0x1p-22f
#define ORACLE_P_BF16_NOISE 0x1p-9f
/* Under tensor parallelism each rank rounds its partial sum to bf16 before the all-reduce
 * adds them: a bf16 rounding of every summed output, half an ulp (2^-9) and a little more
 * for the sum of those roundings. */
#define ORACLE_TP_NOISE 0x1p-8f
#define ORACLE_TWINS 32
#define ORACLE_SAFETY 2.0
#define ORACLE_TIE_MARGIN 0x1p-16f
#define ORACLE_MIN_CLEAN 0.25

/* Teacher-forced logits of n sequences: prompt k, then `steps` forced tokens. logits[k]
 * [lens[k] + steps, vocab]; route[k] [lens[k] + steps] (the oracle's routes, or NULL for
 * an engine without them); tied[k] the rows a twin routed otherwise (oracle_twin_bound). */
typedef struct oracle_run {
  int32_t n, steps, vocab;
  int32_t lens[ORACLE_MAX_SEQS];
  float *logits[ORACLE_MAX_SEQS];
  ina_engine_route_t *route[ORACLE_MAX_SEQS];
  unsigned char *tied[ORACLE_MAX_SEQS];
} oracle_run_t;

static inline void oracle_run_free(oracle_run_t *r) {
  for (int32_t k = 0; k < r->n; k++) {
    free(r->logits[k]);
    free(r->route[k]);
    free(r->tied[k]);
  }
  memset(r, 0, sizeof *r);
}

/* The routes of the last step's rows: sequence k's rows [qo[k], qo[k + 1]) into route[k]
 * from row first_row[k] on. */
static inline void oracle_take_routes(ina_engine_t *e, ina_engine_route_t *const *route, const int32_t *qo, int32_t n,
                                      const int32_t *first_row) {
  int64_t count = 0;
  if (ina_engine_routes(e, NULL, 0, &count) != INA_OK || count <= 0) return;
  ina_engine_route_t *m = malloc((size_t)count * sizeof *m);
  if (!m) return;
  if (ina_engine_routes(e, m, count, &count) == INA_OK)
    for (int32_t k = 0; k < n; k++)
      if (route[k])
        for (int32_t t = qo[k]; t < qo[k + 1] && t < count; t++) route[k][first_row[k] + t - qo[k]] = m[t];
  free(m);
}

/* Prefill of every prompt as one ragged batch (logits of every position), then `steps`
 * decode steps feeding next[k][s]; batched 0 runs each sequence alone instead. Returns 0
 * on success. */
static inline int oracle_forced_run(ina_engine_t *e, int32_t *const *prompts, const int32_t *lens, int32_t n,
                                    const int32_t (*next)[ORACLE_MAX_STEPS], int32_t steps, int batched,
                                    oracle_run_t *out) {
  const int32_t vocab = ina_engine_config(e)->vocab_size;
  ina_page_pool_t *pool = ina_engine_page_pool(e);
  /* Only the oracle keeps routes: asked quietly, as a CUDA engine refuses with an error. */
  ina_log_set_quiet_errors(1);
  const int routes = ina_engine_routes(e, NULL, 0, &(int64_t){0}) == INA_OK;
  ina_log_set_quiet_errors(0);
  int rc = -1;
  memset(out, 0, sizeof *out);
  CHECKF(n >= 1 && n <= ORACLE_MAX_SEQS && steps >= 0 && steps <= ORACLE_MAX_STEPS,
         "oracle: %d sequences and %d steps, at most %d and %d", n, steps, ORACLE_MAX_SEQS, ORACLE_MAX_STEPS);
  if (n < 1 || n > ORACLE_MAX_SEQS || steps < 0 || steps > ORACLE_MAX_STEPS) return -1;
  out->n = n;
  out->steps = steps;
  out->vocab = vocab;
  for (int32_t k = 0; k < n; k++) {
    const size_t rows = (size_t)(lens[k] + steps);
    out->lens[k] = lens[k];
    out->logits[k] = malloc(rows * (size_t)vocab * sizeof(float));
    out->route[k] = routes ? malloc(rows * sizeof *out->route[k]) : NULL;
    out->tied[k] = calloc(rows, 1);
    test_poison_f32(out->logits[k], rows * (size_t)vocab);
    if (routes)
      for (size_t r = 0; r < rows; r++) out->route[k][r] = (ina_engine_route_t){INFINITY, 0};
  }
  for (int32_t g0 = 0; g0 < n; g0 += batched ? n : 1) {
    const int32_t g = batched ? n : 1;
    ina_kv_seq_t seqs[ORACLE_MAX_SEQS];
    ina_kv_seq_t *ptrs[ORACLE_MAX_SEQS];
    int32_t qo[ORACLE_MAX_SEQS + 1], total = 0, first[ORACLE_MAX_SEQS];
    for (int32_t k = 0; k < g; k++) total += lens[g0 + k];
    int32_t *tokens = malloc((size_t)total * sizeof *tokens);
    float *logits = malloc((size_t)total * (size_t)vocab * sizeof(float));
    int ok = tokens && logits;
    qo[0] = 0;
    for (int32_t k = 0; k < g; k++) {
      const ina_kv_seq_t empty = INA_KV_SEQ_INIT;
      seqs[k] = empty;
      ptrs[k] = &seqs[k];
      if (ok) memcpy(tokens + qo[k], prompts[g0 + k], (size_t)lens[g0 + k] * sizeof(int32_t));
      qo[k + 1] = qo[k] + lens[g0 + k];
      first[k] = 0;
    }
    if (ok) {
      ina_batch_t b = {g, ptrs, qo, tokens, 1};
      test_poison_f32(logits, (size_t)total * (size_t)vocab);
      ina_status_t st = ina_engine_forward(e, &b, logits);
      CHECK_OK(st);
      ok = st == INA_OK;
      for (int32_t k = 0; ok && k < g; k++)
        memcpy(out->logits[g0 + k], logits + (int64_t)qo[k] * vocab, (size_t)lens[g0 + k] * (size_t)vocab * sizeof(float));
      if (ok && routes) oracle_take_routes(e, out->route + g0, qo, g, first);
    }
    for (int32_t s = 0; ok && s < steps; s++) {
      ina_batch_t b = {g, ptrs, qo, tokens, 0};
      for (int32_t k = 0; k < g; k++) {
        tokens[k] = next[g0 + k][s];
        qo[k + 1] = k + 1;
        first[k] = lens[g0 + k] + s;
      }
      qo[0] = 0;
      test_poison_f32(logits, (size_t)g * (size_t)vocab);
      ina_status_t st = ina_engine_forward(e, &b, logits);
      CHECK_OK(st);
      ok = st == INA_OK;
      for (int32_t k = 0; ok && k < g; k++)
        memcpy(out->logits[g0 + k] + (int64_t)(lens[g0 + k] + s) * vocab, logits + (int64_t)k * vocab,
               (size_t)vocab * sizeof(float));
      if (ok && routes) oracle_take_routes(e, out->route + g0, qo, g, first);
    }
    for (int32_t k = 0; k < g; k++) ina_kv_seq_release(pool, &seqs[k]);
    free(tokens);
    free(logits);
    if (!ok) goto done;
  }
  rc = 0;
done:
  return rc;
}

/* Row errors of `got` against the oracle's run `want` (whose routes mark the near-tie rows). */
typedef struct oracle_rows {
  double max_prefill, max_decode;   /* largest clean-row relative L2 error of each kind */
  int64_t prefill, decode;          /* clean rows of each kind */
  int64_t tied;                     /* rows at or after a near-tie of their sequence */
  int64_t nonfinite;                /* rows of got with a NaN or an infinite logit */
} oracle_rows_t;

/* INA_ORACLE_ROWS=1 prints every row above 1e-4 (sequence, row, error, margin). */
static inline void oracle_compare(const oracle_run_t *got, const oracle_run_t *want, oracle_rows_t *out) {
  const char *verbose = getenv("INA_ORACLE_ROWS");
  memset(out, 0, sizeof *out);
  const int32_t vocab = want->vocab;
  for (int32_t k = 0; k < want->n; k++) {
    int tied = 0;
    for (int32_t r = 0; r < want->lens[k] + want->steps; r++) {
      const float *g = got->logits[k] + (int64_t)r * vocab, *w = want->logits[k] + (int64_t)r * vocab;
      double d2 = 0, w2 = 0;
      int finite = 1;
      for (int32_t v = 0; v < vocab; v++) {
        finite &= isfinite(g[v]) != 0;
        const double d = (double)g[v] - w[v];
        d2 += d * d;
        w2 += (double)w[v] * w[v];
      }
      if (!finite) {
        out->nonfinite++;
        continue;
      }
      if ((want->route[k] && want->route[k][r].margin < ORACLE_TIE_MARGIN) || (want->tied[k] && want->tied[k][r]))
        tied = 1;
      if (tied) {
        out->tied++;
        continue;
      }
      const double err = sqrt(d2) / (w2 > 0 ? sqrt(w2) : 1);
      if (verbose && verbose[0] == '1' && err > 1e-4)
        printf("    sequence %d row %d (%s): %.3e, routing margin %.3g\n", k, r, r < want->lens[k] ? "prefill" : "decode",
               err, want->route[k] ? (double)want->route[k][r].margin : -1.0);
      if (r < want->lens[k]) {
        out->prefill++;
        if (err > out->max_prefill) out->max_prefill = err;
      } else {
        out->decode++;
        if (err > out->max_decode) out->max_decode = err;
      }
    }
  }
}

typedef struct oracle_bound {
  double prefill, decode;
} oracle_bound_t;

/* The twins' noise for model c: a sum order's everywhere, and on the attention output the
 * P . V rounding of the tensor-core kernels where they run (mla/mla_plan.c picks them for
 * kv_lora_rank 512, rope 64). */
static inline ina_engine_noise_t oracle_noise(const ina_model_config_t *c, uint64_t seed) {
  const ina_engine_noise_t n = {ORACLE_NOISE,
                                c->kv_lora_rank == 512 && c->qk_rope_head_dim == 64 ? ORACLE_P_BF16_NOISE : ORACLE_NOISE,
                                0, seed};
  return n;
}

/* ORACLE_TWINS noisy runs of the oracle beside `base` (an oracle run of model m with these
 * options and inputs); `reduced` is the noise of the outputs tensor parallelism sums
 * (ORACLE_TP_NOISE under TP, else 0). Marks in base->tied the rows near a tie by the noise model itself:
 * rows a twin routed to other experts, and rows whose margin a twin moved by 3/4 of it
 * while that twin still routed the sequence alike (past a twin's first other choice its
 * rows carry that choice's consequences, not noise). Returns 0 on success. */
typedef struct oracle_twins {
  int count; /* runs made: ORACLE_TWINS, or fewer where a full set costs too much */
  oracle_run_t run[ORACLE_TWINS];
} oracle_twins_t;

static inline void oracle_twins_free(oracle_twins_t *tw) {
  for (int t = 0; t < ORACLE_TWINS; t++) oracle_run_free(&tw->run[t]);
}

static inline int oracle_twins_make_n(const ina_model_t *m, const ina_engine_options_t *o, int32_t *const *prompts,
                                      const int32_t *lens, int32_t n, const int32_t (*next)[ORACLE_MAX_STEPS],
                                      int32_t steps, int batched, float reduced, int count, oracle_run_t *base,
                                      oracle_twins_t *tw) {
  ina_engine_options_t opts = *o;
  int rc = 0;
  opts.numerics = INA_ENGINE_NUMERICS_GPU;
  memset(tw, 0, sizeof *tw);
  tw->count = count < ORACLE_TWINS ? count : ORACLE_TWINS;
  for (int t = 0; rc == 0 && t < tw->count; t++) {
    ina_engine_t *twin = NULL;
    CHECK_OK(ina_engine_create(m, &opts, &twin));
    if (!twin) return -1;
    ina_engine_noise_t noise = oracle_noise(ina_model_config(m), 0x5eed0000u + (uint64_t)t);
    noise.reduced = reduced;
    CHECK_OK(ina_engine_set_rounding_noise(twin, &noise));
    rc = oracle_forced_run(twin, prompts, lens, n, next, steps, batched, &tw->run[t]);
    ina_engine_destroy(twin);
  }
  for (int t = 0; rc == 0 && t < tw->count; t++)
    for (int32_t k = 0; k < n && base->route[k] && tw->run[t].route[k]; k++) {
      int parted = 0;
      for (int32_t r = 0; r < lens[k] + steps; r++) {
        const ina_engine_route_t a = base->route[k][r], b = tw->run[t].route[k][r];
        parted |= a.experts != b.experts;
        base->tied[k][r] |= a.experts != b.experts || (!parted && fabs((double)a.margin - b.margin) >= 0.75 * a.margin);
      }
    }
  return rc;
}

static inline int oracle_twins_make(const ina_model_t *m, const ina_engine_options_t *o, int32_t *const *prompts,
                                    const int32_t *lens, int32_t n, const int32_t (*next)[ORACLE_MAX_STEPS],
                                    int32_t steps, int batched, float reduced, oracle_run_t *base,
                                    oracle_twins_t *tw) {
  return oracle_twins_make_n(m, o, prompts, lens, n, next, steps, batched, reduced, ORACLE_TWINS, base, tw);
}

/* Runs of the same inputs (other batching or paging) share what their twins found: near a
 * tie is a property of the model and the tokens, and more draws find more of them. */
static inline void oracle_share_ties(oracle_run_t *const *runs, int count) {
  for (int32_t k = 0; count > 0 && k < runs[0]->n; k++)
    for (int32_t r = 0; r < runs[0]->lens[k] + runs[0]->steps; r++) {
      unsigned char tied = 0;
      for (int i = 0; i < count; i++) tied |= runs[i]->tied[k][r];
      for (int i = 0; i < count; i++) runs[i]->tied[k][r] = tied;
    }
}

/* ORACLE_SAFETY x the largest error of the twins against base, on base's clean rows. */
static inline void oracle_twins_bound(const oracle_twins_t *tw, const oracle_run_t *base, oracle_bound_t *bound) {
  bound->prefill = bound->decode = 0;
  for (int t = 0; t < tw->count; t++) {
    oracle_rows_t rows;
    oracle_compare(&tw->run[t], base, &rows);
    if (rows.max_prefill > bound->prefill) bound->prefill = rows.max_prefill;
    if (rows.max_decode > bound->decode) bound->decode = rows.max_decode;
  }
  bound->prefill *= ORACLE_SAFETY;
  bound->decode *= ORACLE_SAFETY;
}

/* oracle_twins_make and oracle_twins_bound in one. */
static inline int oracle_twin_bound(const ina_model_t *m, const ina_engine_options_t *o, int32_t *const *prompts,
                                    const int32_t *lens, int32_t n, const int32_t (*next)[ORACLE_MAX_STEPS],
                                    int32_t steps, int batched, oracle_run_t *base, oracle_bound_t *bound) {
  oracle_twins_t tw;
  const int rc = oracle_twins_make(m, o, prompts, lens, n, next, steps, batched, 0, base, &tw);
  if (rc == 0) oracle_twins_bound(&tw, base, bound);
  oracle_twins_free(&tw);
  return rc;
}

/* 1 when rows hold: every logit finite and every clean row within its bound. */
static inline int oracle_accepts(const oracle_rows_t *r, const oracle_bound_t *b) {
  return r->nonfinite == 0 && r->max_prefill <= b->prefill && r->max_decode <= b->decode;
}

/* 1 when enough rows were clean of near-ties for a verdict to mean something. */
static inline int oracle_enough_rows(const oracle_rows_t *r) {
  const int64_t all = r->prefill + r->decode + r->tied + r->nonfinite;
  return (double)(r->prefill + r->decode) >= ORACLE_MIN_CLEAN * (double)all;
}

static inline void oracle_print(const char *what, const oracle_rows_t *r, const oracle_bound_t *b) {
  printf("  %-30s prefill %3lld rows max %.2e (bound %.2e), decode %3lld rows max %.2e (bound %.2e), "
         "%lld after a near-tie, %lld non-finite\n",
         what, (long long)r->prefill, r->max_prefill, b->prefill, (long long)r->decode, r->max_decode, b->decode,
         (long long)r->tied, (long long)r->nonfinite);
}

/* Free-running greedy tokens against a reference's: while the tokens agree both runs see
 * the same inputs, and wherever the reference's top-2 margin exceeds twice the largest
 * distance of got's logits from the reference's on that row (so no logit moved far enough
 * to swap the two), got must pick the reference's token. After the first step whose
 * margin is smaller the runs may legitimately part, and are not compared further.
 * ref_logits[p] / got_logits[p]: [lens[p] + max_new - 1 or more, vocab]. */
typedef struct oracle_greedy_count {
  int64_t compared, total;
} oracle_greedy_count_t;

static inline void oracle_greedy_against(const char *what, int32_t n, const int32_t *lens, int32_t max_new, int32_t vocab,
                           float *const *ref_logits, const int32_t (*ref_tokens)[ORACLE_MAX_STEPS], float *const *got_logits,
                           const int32_t (*got_tokens)[ORACLE_MAX_STEPS], oracle_greedy_count_t *count) {
  for (int32_t p = 0; p < n; p++) {
    for (int32_t s = 0; s < max_new; s++) {
      const int64_t r = lens[p] - 1 + s;
      const float *ref = ref_logits[p] + r * vocab, *got = got_logits[p] + r * vocab;
      double dist = 0;
      float top = -INFINITY, second = -INFINITY;
      for (int32_t v = 0; v < vocab; v++) {
        dist = fmax(dist, fabs((double)got[v] - ref[v]));
        if (ref[v] > top) {
          second = top;
          top = ref[v];
        } else if (ref[v] > second) {
          second = ref[v];
        }
      }
      count->total++;
      if (!((double)top - second > 2 * dist)) break; /* a near-tie (or NaN): the runs may part here */
      count->compared++;
      CHECKF(got_tokens[p][s] == ref_tokens[p][s], "%s, prompt %d: greedy token %d is %d, the reference's %d (margin %.3g > 2 x %.3g)",
             what, p, s, got_tokens[p][s], ref_tokens[p][s], (double)top - second, dist);
      if (got_tokens[p][s] != ref_tokens[p][s]) break;
    }
  }
}

#endif
