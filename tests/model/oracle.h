/* The oracle of the CUDA engine: the CPU engine in INA_ENGINE_NUMERICS_GPU, which rounds
 * to bf16 (and quantizes to e4m3) exactly where the CUDA engine does, compared row by row.
 *
 * Error model (the numerics rules are in docs/NUMERICS.md):
 *   - Both engines round at the same points, so they differ only in what happens between
 *     two roundings: fp32 sums in another order and fp32 intrinsics (relative to a sum of
 *     K terms about u * sqrt(K), u = 2^-24; at most 2^-16 for the K <= 2^12 of these
 *     models: u * sqrt(2^10) = 2^-19 is ORACLE_NOISE), and one rounding the oracle does not
 *     make: the MLA kernels' softmax weights P go to bf16 for P . V (mla/mla_fast.cuh),
 *     2^-9 relative on the attention output (ORACLE_ATTENTION_NOISE).
 *   - Such a difference changes a value's bf16 rounding now and then, by one ulp, and the
 *     network carries those flips on to the logits. How far, depends on the model and the
 *     inputs, so the oracle measures it: ORACLE_TWINS runs of the oracle with every value
 *     scaled by 1 + u * ORACLE_NOISE before its rounding (u uniform in [-1, 1); the
 *     attention output by 2^-9) give the spread that a second correct implementation
 *     shows. A row's bound is ORACLE_SAFETY times the largest twin error of its kind
 *     (prefill rows and decode rows apart): the CUDA engine is one more draw of the same
 *     noise, and the factor covers the draws the twins did not make.
 *   - Expert choice is a discontinuity: where the router's top choices lie within
 *     ORACLE_TIE_MARGIN of each other (ina_router_ref_margins; one bf16 ulp of the unit
 *     scores), noise may pick other experts and move the row by 10-90 %. Such a row and
 *     every later row of its sequence (which attend to its cache entries) are counted
 *     apart and not bounded; at least ORACLE_MIN_CLEAN of a run's rows must be clean
 *     (oracle_enough_rows), or the run proves nothing.
 *   - On the golden fixtures (tiny random models) the network is chaotic: one flipped ulp
 *     grows to 1-3 % of a row's logits, so the twins' spread, not the per-op noise, sets
 *     the bounds (2-7e-2 on bf16 fixtures, 0.1-0.2 on v3_fp8, where a flip in an e4m3
 *     input moves a value by up to 12 %).
 *   - A non-finite logit fails, always.
 * The same comparison rejects the deliberate bugs of tests/model/test_oracle_mutations.c,
 * so a bound that lets a 5 % bug through cannot stand. */
#ifndef INA_TESTS_MODEL_ORACLE_H
#define INA_TESTS_MODEL_ORACLE_H

#include <math.h>
#include <string.h>

#include "model/engine_test_hooks.h"
#include "model/model.h"
#include "../test_util.h"

#define ORACLE_MAX_SEQS 8
#define ORACLE_MAX_STEPS 64
#define ORACLE_NOISE 0x1p-19f
#define ORACLE_ATTENTION_NOISE 0x1p-9f
#define ORACLE_TWINS 2
#define ORACLE_SAFETY 2.0
#define ORACLE_TIE_MARGIN 0x1p-8f
#define ORACLE_MIN_CLEAN 0.25

/* Teacher-forced logits of n sequences: prompt k, then steps[k] forced tokens. logits[k]
 * [lens[k] + steps, vocab]; margin[k] [lens[k] + steps] (the oracle's routing margins, or
 * NULL for an engine without them). */
typedef struct oracle_run {
  int32_t n, steps, vocab;
  int32_t lens[ORACLE_MAX_SEQS];
  float *logits[ORACLE_MAX_SEQS];
  float *margin[ORACLE_MAX_SEQS];
} oracle_run_t;

static inline void oracle_run_free(oracle_run_t *r) {
  for (int32_t k = 0; k < r->n; k++) {
    free(r->logits[k]);
    free(r->margin[k]);
  }
  memset(r, 0, sizeof *r);
}

/* The routing margins of the last step's rows: sequence k's rows [qo[k], qo[k + 1]) into
 * margin[k] from row first_row[k] on. */
static inline void oracle_take_margins(ina_engine_t *e, float *const *margin, const int32_t *qo, int32_t n,
                                       const int32_t *first_row) {
  int64_t count = 0;
  if (ina_engine_route_margins(e, NULL, 0, &count) != INA_OK || count <= 0) return;
  float *m = malloc((size_t)count * sizeof *m);
  if (!m) return;
  if (ina_engine_route_margins(e, m, count, &count) == INA_OK)
    for (int32_t k = 0; k < n; k++)
      if (margin[k])
        for (int32_t t = qo[k]; t < qo[k + 1] && t < count; t++) margin[k][first_row[k] + t - qo[k]] = m[t];
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
  const int margins = ina_engine_route_margins(e, NULL, 0, &(int64_t){0}) == INA_OK;
  int rc = -1;
  memset(out, 0, sizeof *out);
  out->n = n;
  out->steps = steps;
  out->vocab = vocab;
  for (int32_t k = 0; k < n; k++) {
    const size_t rows = (size_t)(lens[k] + steps);
    out->lens[k] = lens[k];
    out->logits[k] = malloc(rows * (size_t)vocab * sizeof(float));
    out->margin[k] = margins ? malloc(rows * sizeof(float)) : NULL;
    test_poison_f32(out->logits[k], rows * (size_t)vocab);
    if (margins)
      for (size_t r = 0; r < rows; r++) out->margin[k][r] = INFINITY;
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
      if (ok) oracle_take_margins(e, out->margin + g0, qo, g, first);
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
      if (ok) oracle_take_margins(e, out->margin + g0, qo, g, first);
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

/* Row errors of `got` against the oracle's run `want` (whose margins mark the near-tie rows). */
typedef struct oracle_rows {
  double max_prefill, max_decode;   /* largest clean-row relative L2 error of each kind */
  int64_t prefill, decode;          /* clean rows of each kind */
  int64_t tied;                     /* rows at or after a near-tie of their sequence */
  int64_t nonfinite;                /* rows of got with a NaN or an infinite logit */
} oracle_rows_t;

static inline void oracle_compare(const oracle_run_t *got, const oracle_run_t *want, oracle_rows_t *out) {
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
      if (want->margin[k] && want->margin[k][r] < ORACLE_TIE_MARGIN) tied = 1;
      if (tied) {
        out->tied++;
        continue;
      }
      const double err = sqrt(d2) / (w2 > 0 ? sqrt(w2) : 1);
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

/* The bound for comparisons with `base` (an oracle run of model m with these options and
 * inputs): ORACLE_SAFETY x the largest error of ORACLE_TWINS noisy oracle runs. */
static inline int oracle_twin_bound(const ina_model_t *m, const ina_engine_options_t *o, int32_t *const *prompts,
                                    const int32_t *lens, int32_t n, const int32_t (*next)[ORACLE_MAX_STEPS],
                                    int32_t steps, int batched, const oracle_run_t *base, oracle_bound_t *bound) {
  ina_engine_options_t opts = *o;
  opts.numerics = INA_ENGINE_NUMERICS_GPU;
  bound->prefill = bound->decode = 0;
  for (int t = 0; t < ORACLE_TWINS; t++) {
    ina_engine_t *twin = NULL;
    oracle_run_t r;
    oracle_rows_t rows;
    CHECK_OK(ina_engine_create(m, &opts, &twin));
    if (!twin) return -1;
    CHECK_OK(ina_engine_set_rounding_noise(twin, ORACLE_NOISE, ORACLE_ATTENTION_NOISE, 0x5eed0000u + (uint64_t)t));
    const int rc = oracle_forced_run(twin, prompts, lens, n, next, steps, batched, &r);
    ina_engine_destroy(twin);
    if (rc != 0) {
      oracle_run_free(&r);
      return -1;
    }
    oracle_compare(&r, base, &rows);
    oracle_run_free(&r);
    if (rows.max_prefill > bound->prefill) bound->prefill = rows.max_prefill;
    if (rows.max_decode > bound->decode) bound->decode = rows.max_decode;
  }
  bound->prefill *= ORACLE_SAFETY;
  bound->decode *= ORACLE_SAFETY;
  return 0;
}

/* 1 when rows hold: every logit finite and every clean row within its bound. */
static inline int oracle_accepts(const oracle_rows_t *r, const oracle_bound_t *b) {
  return r->nonfinite == 0 && r->max_prefill <= b->prefill && r->max_decode <= b->decode;
}

/* 1 when enough rows were clean of near-ties for a verdict to mean something. */
static inline int oracle_enough_rows(const oracle_rows_t *r) {
  const int64_t all = r->prefill + r->decode + r->tied + r->nonfinite;
  return r->decode > 0 && (double)(r->prefill + r->decode) >= ORACLE_MIN_CLEAN * (double)all;
}

static inline void oracle_print(const char *what, const oracle_rows_t *r, const oracle_bound_t *b) {
  printf("  %-30s prefill %3lld rows max %.2e (bound %.2e), decode %3lld rows max %.2e (bound %.2e), "
         "%lld after a near-tie, %lld non-finite\n",
         what, (long long)r->prefill, r->max_prefill, b->prefill, (long long)r->decode, r->max_decode, b->decode,
         (long long)r->tied, (long long)r->nonfinite);
}

#endif
