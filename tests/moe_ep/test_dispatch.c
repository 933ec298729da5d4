/* Expert-parallel dispatch and combine (moe_ep/dispatch.h) against the one-rank
 * definition, under mpirun on any number of ranks (the whole group is the
 * communicator; one rank also runs without one).
 *
 * Each trial draws, the same on every rank: experts E (12 over 8 ranks among them:
 * uneven), extra replicas, hidden, top_k, layout and payloads; and per rank its tokens
 * (some ranks none), rows, routing (some entries -1) and weights. An expert is a row
 * function f_e that mixes a row's elements (a row must arrive whole and in place) and
 * does not depend on the other rows, as an expert MLP. Checks, on every rank:
 *   - out equals the one-rank combine of f_{ids}(x) bit for bit, the outputs buffer
 *     poisoned with NaN before the experts write it (a row read from outside the counts
 *     shows); with an FP8 payload the reference rows are x through
 *     ina_fp8_quantize_blocks and back, so the equality still holds bit for bit;
 *   - the stats: rows sent = distinct (token, destination rank) pairs by the replica
 *     rule, bytes = remote rows x row bytes, control bytes = their slot entries and one
 *     8-byte header per peer and step;
 *   - the FP8 rounding meets the header's bound max(2^-4 |x|, 2^-10 s) on every element;
 *   - a rank that passes a bad routing fails the dispatch on every rank (no hang), and
 *     the next dispatch works;
 *   - every other trial runs two exchanges at once in the two-batch-overlap order
 *     (dispatch A, dispatch B started; A finished, its experts, its combine started; B
 *     likewise; then both combines finished), the second with the tokens reversed: its
 *     output is the first's reversed, bit for bit; a bad routing there fails the first
 *     finish on every rank, the second exchange is drained, and both work again;
 *   - on 8 ranks, DeepSeek-V3's routing (256 experts, 8 groups, top 4 groups, top 8, the
 *     real router on random logits) with one group per rank: no token reaches more than
 *     4 ranks, and the bytes dispatched are printed against the all-gather exchange's
 *     (every row to every other rank, then a ring all-reduce of the outputs) and must be
 *     at most 0.4 of them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/bootstrap.h"
#include "comm/comm.h"
#include "core/dtype.h"
#include "core/log.h"
#include "moe_ep/dispatch.h"
#include "moe_ep/router.h"
#include "tests/comm/comm_test_data.h"

#define TRIALS 48
#define MAX_TOKENS 9

typedef struct trial {
  int32_t E, K, slots, layout;
  int64_t H;
  ina_ep_payload_t dispatch_payload, combine_payload;
  int32_t *slot_expert;            /* [n][slots] */
  int32_t *first, *rank, *slot;    /* replicas in (rank, slot) order */
  int32_t bad_rank;                /* >= 0: this rank routes to an expert out of range */
} trial_t;

static float bf16_round(float v) { return ina_bf16_to_f32(ina_f32_to_bf16(v)); }

/* Expert e on one row. */
static void expert_row(int32_t e, const float *x, int64_t H, int bf16_out, float *y) {
  const float a = 1.0f + 0.125f * (float)e, b = 0.03125f * (float)(e + 1);
  for (int64_t d = 0; d < H; d++) {
    float v = x[d] * a - 0.5f * x[(d + 1) % H] + b * (float)(d % 7);
    y[d] = bf16_out ? bf16_round(v) : v;
  }
}

static void trial_free(trial_t *t) {
  free(t->slot_expert);
  free(t->first);
  free(t->rank);
  free(t->slot);
}

/* The shared part of trial `i`: the same draws on every rank. */
static void trial_make(uint64_t seed, int i, int32_t n, trial_t *t) {
  test_rng_t r = comm_test_rng(seed, -1, (uint64_t)i);
  memset(t, 0, sizeof *t);
  t->E = i % 4 == 0 ? 12 : (int32_t)test_rng_int(&r, 1, 3 * n + 2);
  t->K = (int32_t)test_rng_int(&r, 1, t->E < 8 ? t->E : 8);
  static const int64_t widths[] = {1, 7, 64, 128, 200, 256};
  t->H = widths[test_rng_int(&r, 0, 5)];
  t->layout = (int32_t)test_rng_int(&r, 0, 1);
  t->dispatch_payload = (ina_ep_payload_t)test_rng_int(&r, 0, 2);
  t->combine_payload = (ina_ep_payload_t)test_rng_int(&r, 0, 1);
  t->bad_rank = i % 11 == 5 ? (int32_t)(i % n) : -1;
  /* Contiguous experts per rank, then up to n extra replicas on ranks that lack them. */
  int32_t base = (t->E + n - 1) / n, extra = (int32_t)test_rng_int(&r, 0, n);
  t->slots = base + 2;
  t->slot_expert = malloc((size_t)n * (size_t)t->slots * sizeof(int32_t));
  for (int32_t k = 0; k < n * t->slots; k++) t->slot_expert[k] = -1;
  int32_t *used = calloc((size_t)n, sizeof(int32_t));
  for (int32_t x = 0; x < t->E; x++) {
    const int32_t rk = (int32_t)((int64_t)x * n / t->E);
    t->slot_expert[rk * t->slots + used[rk]++] = x;
  }
  for (int32_t j = 0; j < extra; j++) {
    const int32_t x = (int32_t)test_rng_int(&r, 0, t->E - 1), rk = (int32_t)test_rng_int(&r, 0, n - 1);
    int has = 0;
    for (int32_t s = 0; s < used[rk]; s++) has |= t->slot_expert[rk * t->slots + s] == x;
    if (!has && used[rk] < t->slots) t->slot_expert[rk * t->slots + used[rk]++] = x;
  }
  free(used);
  t->first = calloc((size_t)t->E + 1, sizeof(int32_t));
  t->rank = malloc((size_t)n * (size_t)t->slots * sizeof(int32_t));
  t->slot = malloc((size_t)n * (size_t)t->slots * sizeof(int32_t));
  int32_t at = 0;
  for (int32_t x = 0; x < t->E; x++) {
    t->first[x] = at;
    for (int32_t rk = 0; rk < n; rk++)
      for (int32_t s = 0; s < t->slots; s++)
        if (t->slot_expert[rk * t->slots + s] == x) {
          t->rank[at] = rk;
          t->slot[at++] = s;
        }
  }
  t->first[t->E] = at;
}

static size_t row_bytes(ina_ep_payload_t p, int64_t H) {
  return p == INA_EP_PAYLOAD_F32 ? (size_t)H * 4 : p == INA_EP_PAYLOAD_BF16 ? (size_t)H * 2
                                                  : (size_t)H + 4 * (size_t)((H + 127) / 128);
}

/* The FP8 payload's rounding against the header's bound, on every element. */
static void check_fp8_bound(const float *x, int64_t H) {
  uint8_t *q = malloc((size_t)H);
  float *s = malloc((size_t)((H + 127) / 128) * sizeof *s), *back = malloc((size_t)H * sizeof *back);
  CHECK_OK(ina_fp8_quantize_blocks(x, 1, H, 1, 128, q, s));
  CHECK_OK(ina_fp8_dequantize_blocks(q, s, 1, H, 1, 128, back));
  for (int64_t d = 0; d < H; d++) {
    const double err = fabs((double)back[d] - (double)x[d]);
    const double bound = fmax(ldexp(fabs((double)x[d]), -4), ldexp((double)s[d / 128], -10));
    CHECKF(err <= bound, "fp8 row element %lld: %g -> %g, error %g > bound %g", (long long)d, (double)x[d],
           (double)back[d], err, bound);
  }
  free(q);
  free(s);
  free(back);
}

/* The experts on what this rank received, into outputs poisoned beforehand. */
static void run_experts(ina_ep_exchange_t *ex, const trial_t *t, int32_t me, int64_t H, int bf16_out, int i) {
  ina_ep_received_t got;
  ina_ep_received(ex, &got);
  float *outs = ina_ep_outputs(ex);
  const int64_t places = got.layout == INA_EP_LAYOUT_MASKED ? (int64_t)got.slots * got.capacity : got.first[got.slots];
  test_poison_f32(outs, (size_t)(places * H));
  for (int32_t s = 0; s < got.slots; s++) {
    const int32_t e = t->slot_expert[me * t->slots + s];
    const int64_t begin = got.layout == INA_EP_LAYOUT_MASKED ? s * got.capacity : got.first[s];
    CHECKF(got.count[s] == 0 || e >= 0, "trial %d: empty slot %d received %lld rows", i, (int)s, (long long)got.count[s]);
    if (got.layout == INA_EP_LAYOUT_CONTIGUOUS)
      CHECKF(got.first[s + 1] - got.first[s] == got.count[s], "trial %d: slot %d's segment", i, (int)s);
    for (int64_t j = begin; j < begin + got.count[s] && e >= 0; j++) expert_row(e, got.rows + j * H, H, bf16_out, outs + j * H);
  }
}

/* overlap: two exchanges in flight at once (dispatch.h's halves). */
static void run_trial(ina_comm_t *comm, uint64_t seed, int i, int32_t n, int32_t me, int overlap) {
  trial_t t;
  trial_make(seed, i, n, &t);
  test_rng_t r = comm_test_rng(seed, me, 1000 + (uint64_t)i);
  const int64_t T = (i + me) % 5 == 0 ? 0 : test_rng_int(&r, 1, MAX_TOKENS);
  const int32_t K = t.K;
  const int64_t H = t.H;
  const int bf16_in = t.dispatch_payload == INA_EP_PAYLOAD_BF16, bf16_out = t.combine_payload == INA_EP_PAYLOAD_BF16;
  float *x = malloc(((size_t)(T * H) + 1) * sizeof *x), *w = malloc(((size_t)(T * K) + 1) * sizeof *w);
  int32_t *ids = malloc(((size_t)(T * K) + 1) * sizeof *ids);
  float *out = malloc(((size_t)(T * H) + 1) * sizeof *out), *ref = malloc(((size_t)(T * H) + 1) * sizeof *ref);
  float *y = malloc(((size_t)(T * K * H) + 1) * sizeof *y), *xq = malloc(((size_t)H + 1) * sizeof *xq);
  float *x2 = malloc(((size_t)(T * H) + 1) * sizeof *x2), *w2 = malloc(((size_t)(T * K) + 1) * sizeof *w2);
  float *out2 = malloc(((size_t)(T * H) + 1) * sizeof *out2);
  int32_t *ids2 = malloc(((size_t)(T * K) + 1) * sizeof *ids2);
  for (int64_t k = 0; k < T * H; k++) {
    const float v = test_rng_normal(&r) * (k % 5 == 0 ? 8.0f : 1.0f);
    x[k] = bf16_in ? bf16_round(v) : v;
  }
  for (int64_t tok = 0; tok < T; tok++) {
    /* K distinct experts, some entries dropped (-1). */
    for (int32_t k = 0; k < K; k++) {
      int32_t e;
      int again;
      do {
        e = (int32_t)test_rng_int(&r, 0, t.E - 1);
        again = 0;
        for (int32_t j = 0; j < k; j++) again |= ids[tok * K + j] == e;
      } while (again);
      ids[tok * K + k] = e;
      w[tok * K + k] = (float)test_rng_uniform(&r);
    }
    if (K > 1 && test_rng_int(&r, 0, 3) == 0) ids[tok * K + test_rng_int(&r, 0, K - 1)] = -1;
  }
  if (t.bad_rank == me && T > 0) ids[0] = t.E; /* out of range */

  ina_ep_config_t cfg = INA_EP_CONFIG_INIT;
  cfg.layout = (ina_ep_layout_t)t.layout;
  cfg.dispatch_payload = t.dispatch_payload;
  cfg.combine_payload = t.combine_payload;
  cfg.hidden = H;
  cfg.top_k = K;
  cfg.slots_per_rank = t.slots;
  cfg.max_tokens_per_rank = MAX_TOKENS;
  ina_ep_exchange_t *ex = NULL, *ex2 = NULL;
  CHECK_OK(ina_ep_exchange_create(comm, &cfg, &ex));
  const ina_ep_replicas_t rep = {t.E, t.first, t.rank, t.slot};
  const int any_bad = t.bad_rank >= 0 && (t.bad_rank + i) % 5 != 0; /* that rank has tokens */
  ina_ep_stats_t stats;
  test_poison_f32(out, (size_t)(T * H));
  if (!overlap) {
    ina_log_set_quiet_errors(any_bad);
    const ina_status_t st = ina_ep_dispatch(ex, &rep, x, ids, T);
    ina_log_set_quiet_errors(0);
    if (any_bad) {
      CHECKF(st != INA_OK, "trial %d: rank %d routed outside the experts, yet rank %d's dispatch passed", i,
             (int)t.bad_rank, (int)me);
      /* The exchange still works: the same layer with the bad entry dropped. */
      if (t.bad_rank == me) ids[0] = -1;
      CHECK_OK(ina_ep_dispatch(ex, &rep, x, ids, T));
    } else {
      CHECKF(st == INA_OK, "trial %d: dispatch: %s", i, ina_last_error());
    }
    run_experts(ex, &t, me, H, bf16_out, i);
    CHECK_OK(ina_ep_combine(ex, w, out, &stats));
  } else {
    /* Two exchanges in flight at once, in the two-batch-overlap order: the second
     * carries the same tokens in reverse order (other replicas then serve them), so its
     * output is the first's reversed, bit for bit. */
    CHECK_OK(ina_ep_exchange_create(comm, &cfg, &ex2));
    for (int pass = 0; pass < 2; pass++) {
      for (int64_t tok = 0; tok < T; tok++) {
        memcpy(x2 + tok * H, x + (T - 1 - tok) * H, (size_t)H * sizeof *x2);
        memcpy(ids2 + tok * K, ids + (T - 1 - tok) * K, (size_t)K * sizeof *ids2);
        memcpy(w2 + tok * K, w + (T - 1 - tok) * K, (size_t)K * sizeof *w2);
      }
      CHECK_OK(ina_ep_dispatch_start(ex, &rep, x, ids, T));
      CHECK_OK(ina_ep_dispatch_start(ex2, &rep, x2, ids2, T));
      ina_log_set_quiet_errors(any_bad);
      const ina_status_t st = ina_ep_dispatch_finish(ex);
      ina_log_set_quiet_errors(0);
      if (any_bad && pass == 0) {
        /* Every rank fails the first finish; the second exchange is drained on every
         * rank, and both work again with the bad entry dropped. */
        CHECKF(st != INA_OK, "trial %d: rank %d routed outside the experts, yet rank %d's overlapped dispatch passed", i,
               (int)t.bad_rank, (int)me);
        CHECK_OK(ina_ep_exchange_drain(ex2));
        if (t.bad_rank == me) ids[0] = -1;
        continue;
      }
      CHECKF(st == INA_OK, "trial %d: overlapped dispatch: %s", i, ina_last_error());
      run_experts(ex, &t, me, H, bf16_out, i);
      CHECK_OK(ina_ep_combine_start(ex));
      CHECK_OK(ina_ep_dispatch_finish(ex2));
      run_experts(ex2, &t, me, H, bf16_out, i);
      CHECK_OK(ina_ep_combine_start(ex2));
      test_poison_f32(out2, (size_t)(T * H));
      CHECK_OK(ina_ep_combine_finish(ex, w, out, &stats));
      CHECK_OK(ina_ep_combine_finish(ex2, w2, out2, NULL));
      break;
    }
    int64_t bad2 = -1;
    for (int64_t tok = 0; tok < T && bad2 < 0; tok++)
      if (memcmp(out2 + tok * H, out + (T - 1 - tok) * H, (size_t)H * sizeof *out) != 0) bad2 = tok;
    CHECKF(bad2 < 0, "trial %d: rank %d: the second exchange's token %lld differs from the first's token %lld", i,
           (int)me, (long long)bad2, (long long)(T - 1 - bad2));
    ina_ep_exchange_destroy(ex2);
  }

  /* The reference: every expert here, on the rows as the payload carries them. */
  for (int64_t tok = 0; tok < T; tok++) {
    const float *row = x + tok * H;
    if (t.dispatch_payload == INA_EP_PAYLOAD_FP8) {
      uint8_t *q = malloc((size_t)H);
      float *sc = malloc((size_t)((H + 127) / 128) * sizeof *sc);
      CHECK_OK(ina_fp8_quantize_blocks(row, 1, H, 1, 128, q, sc));
      CHECK_OK(ina_fp8_dequantize_blocks(q, sc, 1, H, 1, 128, xq));
      free(q);
      free(sc);
      check_fp8_bound(row, H);
      row = xq;
    }
    for (int32_t k = 0; k < K; k++)
      if (ids[tok * K + k] >= 0) expert_row(ids[tok * K + k], row, H, bf16_out, y + (tok * K + k) * H);
  }
  /* The one-rank engine's combine, written out: pairs in expert order, then token, then
   * k (HF's loop order), each added to its token's row. */
  memset(ref, 0, (size_t)(T * H) * sizeof *ref);
  for (int32_t e = 0; e < t.E; e++)
    for (int64_t tok = 0; tok < T; tok++)
      for (int32_t k = 0; k < K; k++)
        if (ids[tok * K + k] == e)
          for (int64_t d = 0; d < H; d++) ref[tok * H + d] += y[(tok * K + k) * H + d] * w[tok * K + k];
  int64_t bad = -1;
  for (int64_t k = 0; k < T * H && bad < 0; k++)
    if (memcmp(&out[k], &ref[k], sizeof(float)) != 0) bad = k;
  CHECKF(bad < 0, "trial %d (E %d, K %d, H %lld, %s, payloads %d/%d): rank %d token %lld column %lld: %.9g, one rank %.9g",
         i, (int)t.E, (int)K, (long long)H, ina_ep_layout_name(cfg.layout), (int)t.dispatch_payload,
         (int)t.combine_payload, (int)me, (long long)(bad / (H ? H : 1)), (long long)(bad % (H ? H : 1)),
         bad >= 0 ? (double)out[bad] : 0.0, bad >= 0 ? (double)ref[bad] : 0.0);

  /* Traffic: one row per distinct (token, destination rank), by the replica rule. */
  int64_t rows = 0, remote = 0;
  for (int64_t tok = 0; tok < T; tok++) {
    uint8_t seen[64] = {0};
    for (int32_t k = 0; k < K; k++) {
      const int32_t e = ids[tok * K + k];
      if (e < 0) continue;
      const int32_t R = t.first[e + 1] - t.first[e];
      const int32_t d = t.rank[t.first[e] + (int32_t)((tok * n + me) % R)];
      if (!seen[d]) {
        seen[d] = 1;
        rows++;
        remote += d != me;
      }
    }
  }
  CHECKF(stats.rows_sent == rows && stats.rows_remote == remote, "trial %d: rank %d sent %lld rows (%lld remote), expected %lld (%lld)",
         i, (int)me, (long long)stats.rows_sent, (long long)stats.rows_remote, (long long)rows, (long long)remote);
  CHECKF(stats.dispatch_bytes == remote * (int64_t)row_bytes(t.dispatch_payload, H) &&
             stats.meta_bytes == remote * K * 4 + 2 * (n - 1) * 8,
         "trial %d: dispatch bytes %lld, meta %lld for %lld remote rows of %zu bytes", i, (long long)stats.dispatch_bytes,
         (long long)stats.meta_bytes, (long long)remote, row_bytes(t.dispatch_payload, H));
  ina_ep_exchange_destroy(ex);
  trial_free(&t);
  free(x), free(w), free(ids), free(out), free(ref), free(y), free(xq);
  free(x2), free(w2), free(out2), free(ids2);
}

/* V3's routing over 8 ranks, one expert group (32 experts) per rank. */
static void run_v3_routing(ina_comm_t *comm, uint64_t seed, int32_t n, int32_t me) {
  enum { E = 256, K = 8, H = 128, T = 32 };
  test_rng_t r = comm_test_rng(seed, me, 99);
  float *logits = malloc((size_t)T * E * sizeof *logits), *bias = calloc(E, sizeof *bias);
  float *w = malloc((size_t)T * K * sizeof *w), *x = malloc((size_t)T * H * sizeof *x), *out = malloc((size_t)T * H * sizeof *out);
  int32_t *ids = malloc((size_t)T * K * sizeof *ids);
  int32_t first[E + 1], rank[E], slot[E];
  for (int64_t i = 0; i < (int64_t)T * E; i++) logits[i] = test_rng_normal(&r);
  for (int64_t i = 0; i < (int64_t)T * H; i++) x[i] = test_rng_normal(&r);
  ina_router_config_t rc = INA_ROUTER_CONFIG_INIT;
  rc.num_experts = E, rc.top_k = K, rc.n_group = 8, rc.topk_group = 4, rc.norm_topk_prob = 1;
  rc.routed_scaling_factor = 2.5f;
  CHECK_OK(ina_router_ref(&rc, logits, bias, T, ids, w));
  for (int32_t e = 0; e <= E; e++) first[e] = e;
  for (int32_t e = 0; e < E; e++) {
    rank[e] = e / (E / n);
    slot[e] = e % (E / n);
  }
  ina_ep_config_t cfg = INA_EP_CONFIG_INIT;
  cfg.dispatch_payload = INA_EP_PAYLOAD_BF16;
  cfg.combine_payload = INA_EP_PAYLOAD_BF16;
  cfg.hidden = H, cfg.top_k = K, cfg.slots_per_rank = E / n;
  ina_ep_exchange_t *ex = NULL;
  CHECK_OK(ina_ep_exchange_create(comm, &cfg, &ex));
  const ina_ep_replicas_t rep = {E, first, rank, slot};
  ina_ep_stats_t st;
  CHECK_OK(ina_ep_dispatch(ex, &rep, x, ids, T));
  CHECK_OK(ina_ep_combine(ex, w, out, &st)); /* the outputs are not looked at here */
  CHECKF(st.rows_sent <= 4 * T, "V3 routing: rank %d sent %lld rows for %d tokens (at most 4 ranks each)", (int)me,
         (long long)st.rows_sent, (int)T);
  const double allgather = (double)(n - 1) * T * H * 2 * 3; /* rows out, then 2 (n - 1) T rows of the all-reduce */
  CHECKF(st.dispatch_bytes + st.meta_bytes <= 0.4 * allgather, "V3 routing: rank %d dispatched %lld bytes, all-gather %.0f",
         (int)me, (long long)(st.dispatch_bytes + st.meta_bytes), allgather);
  if (me == 0)
    printf("V3 routing on %d ranks, %d tokens per rank, hidden %d bf16: rank 0 sent %lld rows (%.2f ranks per token), "
           "%lld dispatch + %lld combine bytes = %.3f of the all-gather exchange's %.0f (dispatch alone %.3f)\n",
           (int)n, (int)T, (int)H, (long long)st.rows_sent, (double)st.rows_sent / T, (long long)(st.dispatch_bytes + st.meta_bytes),
           (long long)st.combine_bytes, (double)(st.dispatch_bytes + st.meta_bytes + st.combine_bytes) / allgather,
           allgather, (double)(st.dispatch_bytes + st.meta_bytes) / allgather);
  ina_ep_exchange_destroy(ex);
  free(logits), free(bias), free(w), free(x), free(out), free(ids);
}

int main(int argc, char **argv) {
  ina_bootstrap_t *boot = NULL;
  if (ina_bootstrap_init(&argc, &argv, &boot) != INA_OK) return 1;
  ina_comm_t *c = NULL;
  CHECK_OK(ina_bootstrap_world_comm(boot, INA_COMM_BACKEND_MPI, &c));
  if (!c) return 1;
  const int32_t n = ina_comm_size(c), me = ina_comm_rank(c);
  const uint64_t seed = comm_test_seed("test_dispatch");
  for (int i = 0; i < TRIALS; i++) run_trial(c, seed, i, n, me, i % 2);
  if (n == 1)
    for (int i = 0; i < TRIALS; i++) run_trial(NULL, seed, i, 1, 0, i % 2); /* no communicator */
  if (n == 8) run_v3_routing(c, seed, n, me);
  {
    /* Configurations refused by name. */
    ina_ep_config_t cfg = INA_EP_CONFIG_INIT;
    ina_ep_exchange_t *ex = NULL;
    cfg.hidden = 8, cfg.top_k = 2, cfg.slots_per_rank = 1, cfg.backend = INA_EP_BACKEND_NVLINK;
    ina_log_set_quiet_errors(1);
    CHECK(ina_ep_exchange_create(c, &cfg, &ex) == INA_ERR_UNSUPPORTED && ex == NULL);
    cfg.backend = INA_EP_BACKEND_MPI, cfg.combine_payload = INA_EP_PAYLOAD_FP8;
    CHECK(ina_ep_exchange_create(c, &cfg, &ex) == INA_ERR_INVALID_ARGUMENT);
    cfg.combine_payload = INA_EP_PAYLOAD_F32, cfg.layout = INA_EP_LAYOUT_MASKED;
    CHECK(ina_ep_exchange_create(c, &cfg, &ex) == INA_ERR_INVALID_ARGUMENT);
    CHECK(strstr(ina_last_error(), "max_tokens_per_rank") != NULL);
    ina_log_set_quiet_errors(0);
  }
  printf("rank %d/%d: %s\n", (int)me, (int)n, test_checks_failed_ ? "FAILED" : "ok");
  ina_comm_destroy(c);
  const int rc = test_finish("test_dispatch");
  ina_bootstrap_finalize(boot);
  return rc;
}
