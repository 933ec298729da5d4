/* The reference of DeepSeek Sparse Attention (attention/dsa.h) against brute force
 * written here, on fresh random inputs over many shapes: ragged and skewed requests (1
 * to a few hundred tokens, one long among short ones), page sizes 1, 16 and 64 with
 * shuffled page ids, odd head counts, k below and above the context, prefill (several
 * causal query tokens per request) and decode (one), f32 and bf16 index keys, f32 /
 * bf16 / FP8 latent caches. Every output is poisoned (NaN, or a junk index) before each
 * run and every row is bounded.
 *
 * Index score. The brute force sums in double. Error model of an f32 implementation
 * (recursive summation, first order in eps = FLT_EPSILON = 2^-23): the D-term dot
 * product errs by at most D eps/2 times sum_d |q_d k_d|, the scale and the weight
 * multiplications by eps/2 each, the H-term sum over heads by H eps/2 times its sum of
 * |terms|, relu is 1-Lipschitz, so
 *     |score - exact| <= (D + H + 4) * eps * S,  S = scale * sum_h |w_h| sum_d |q_hd k_d|
 * (c = D + H + 4, about twice the first-order constant). Positions past the causal bound
 * must be -inf exactly.
 *
 * Top-k. (a) Exactly against a full sort of the scores the op was given, under the tie
 * rule of the header, on the computed scores and on scores with planted ties (rounded
 * to a coarse grid, some -inf and NaN among the visible ones). (b) Against a full sort
 * of the exact (double) scores: rank i must hold the exact rank-i position, or one whose
 * exact score is within 2 E of it, E the largest score bound of the row (sorting is
 * 1-Lipschitz in the max norm, so no correct implementation of an f32 score can move
 * further); such near-ties are counted and reported.
 *
 * Sparse MLA. Against ina_mla_attention_ref on a cache that holds only each query's
 * selected entries, in its row's order (one request per query token), for the indices
 * the top-k chose and for random index rows with -1 holes (an empty row must give 0 and
 * lse -inf). Error model of either side: a selected score (C + R terms) errs by at most
 * d_t = (C + R + 2) eps scale sum |q e_t|, so with Delta = max d_t the softmax weights
 * err by a relative 2 Delta and the n-term weighted sum adds (n + 4) eps, giving
 *     |out_c - exact_c| <= (2 Delta + (n + 4) eps) max_t |latent_tc|,
 *     |lse - exact|     <= Delta + (n + 4) eps (1 + |lse|),
 * and twice these between the two implementations.
 *
 * FP8 index keys (e4m3 with one f32 scale per token, inline and paged layouts, written
 * by ina_dsa_index_key_store). The quantizer bit for bit against amax / 448 written out
 * here, and every value within the e4m3 model (2^-4 + 2^-23) |k| + 2^-10 scale. The
 * score, over the shapes above with dims of their own, (a) against this test's double
 * loop over the dequantized keys, read from the layout's byte offsets as the header
 * words them: the products are exact in double on both sides, so only the sums' order,
 * the one scale multiplication per head and the final f32 rounding differ:
 * |got - exact^| <= 2^-24 |exact^| + 2 (D + H + 5) 2^-53 S^ + 2^-150;
 * (b) against the exact score of the f32 keys before quantization, within (a) plus the
 * e4m3 model propagated through the 1-Lipschitz relu. The top-k on those scores as
 * above. The cache buffer holds e4m3 NaN bytes before the keys are stored, so a byte
 * the store missed shows. */

#include "tests/test_util.h"

#include <float.h>

#include "attention/dsa.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "mla/mla_ref.h"

#define NAME "test_dsa_ref"
#define MAX_BATCH 8
#define EPS ((double)FLT_EPSILON)
#define INDEX_POISON 0x7f7f7f7f

typedef struct shape {
  int32_t batch, kv_len[MAX_BATCH], q_len[MAX_BATCH];
  int32_t page_size;
  int32_t H, D;            /* index heads, index head dim */
  ina_dsa_key_format_t key_format;
  int32_t topk;
  int32_t score_pad;       /* score_stride = max kv_len + pad */
  int32_t mla_heads, C, R; /* sparse MLA */
  ina_mla_cache_format_t cache_format;
} shape_t;

/* A step: its lengths and a page table with shuffled page ids shared by both caches. */
typedef struct step {
  int32_t tokens, max_kv, num_pages;
  int32_t qo_indptr[MAX_BATCH + 1], kv_indptr[MAX_BATCH + 1];
  int32_t *kv_indices;
  int32_t *request, *pos; /* per query token */
} step_t;

static void make_step(test_rng_t *rng, const shape_t *sh, step_t *st) {
  memset(st, 0, sizeof *st);
  int32_t pages = 0;
  for (int32_t b = 0; b < sh->batch; b++) {
    st->qo_indptr[b + 1] = st->qo_indptr[b] + sh->q_len[b];
    st->kv_indptr[b] = pages;
    pages += (sh->kv_len[b] + sh->page_size - 1) / sh->page_size + (int32_t)test_rng_int(rng, 0, 1);
    st->kv_indptr[b + 1] = pages;
    if (sh->kv_len[b] > st->max_kv) st->max_kv = sh->kv_len[b];
  }
  st->tokens = st->qo_indptr[sh->batch];
  st->num_pages = pages + 3; /* a few pages nobody uses */
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)st->num_pages);
  for (int32_t i = 0; i < st->num_pages; i++) perm[i] = i;
  for (int32_t i = st->num_pages - 1; i > 0; i--) {
    const int32_t j = (int32_t)test_rng_int(rng, 0, i), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  st->kv_indices = malloc(sizeof(int32_t) * (size_t)(pages + 1));
  for (int32_t i = 0; i < pages; i++) st->kv_indices[i] = perm[i];
  free(perm);
  st->request = malloc(sizeof(int32_t) * (size_t)(st->tokens + 1));
  st->pos = malloc(sizeof(int32_t) * (size_t)(st->tokens + 1));
  for (int32_t b = 0; b < sh->batch; b++)
    for (int32_t j = 0; j < sh->q_len[b]; j++) {
      st->request[st->qo_indptr[b] + j] = b;
      st->pos[st->qo_indptr[b] + j] = sh->kv_len[b] - sh->q_len[b] + j;
    }
}

static void free_step(step_t *st) {
  free(st->kv_indices);
  free(st->request);
  free(st->pos);
}

/* Slot of position t of request b: page id * page_size + t % page_size. */
static int64_t slot_of(const shape_t *sh, const step_t *st, int32_t b, int32_t t) {
  return (int64_t)st->kv_indices[st->kv_indptr[b] + t / sh->page_size] * sh->page_size +
         t % sh->page_size;
}

/* ---- exact (double) index scores and their bounds -------------------------------- */

static void exact_scores(const shape_t *sh, const step_t *st, const float *q, const float *w,
                         const float *keys, float scale, double *ref, double *bound, int64_t stride) {
  const int32_t H = sh->H, D = sh->D;
  for (int32_t s = 0; s < st->tokens; s++) {
    const int32_t b = st->request[s];
    for (int32_t t = 0; t <= st->pos[s]; t++) {
      const float *k = keys + slot_of(sh, st, b, t) * D;
      double score = 0, mag = 0;
      for (int32_t h = 0; h < H; h++) {
        const float *qh = q + ((int64_t)s * H + h) * D;
        double dot = 0, absdot = 0;
        for (int32_t d = 0; d < D; d++) {
          dot += (double)qh[d] * k[d];
          absdot += fabs((double)qh[d] * k[d]);
        }
        const double x = dot * scale;
        score += (double)w[s * H + h] * (x > 0 ? x : 0);
        mag += fabs((double)w[s * H + h]) * scale * absdot;
      }
      ref[s * stride + t] = score;
      bound[s * stride + t] = (D + H + 4) * EPS * mag;
    }
  }
}

/* ---- top-k by a full sort ----------------------------------------------------------- */

typedef struct sort_key {
  double v;
  int nan;
  int32_t t;
} sort_key_t;

/* The header's order, written from its wording: higher first, NaN last, then lower
 * position. */
static int cmp_key(const void *pa, const void *pb) {
  const sort_key_t *a = pa, *b = pb;
  if (a->nan != b->nan) return a->nan ? 1 : -1;
  if (!a->nan && a->v != b->v) return a->v > b->v ? -1 : 1;
  return (a->t > b->t) - (a->t < b->t);
}

/* Positions 0 .. n-1 sorted by the values. */
static void full_sort_f32(const float *v, int32_t n, sort_key_t *keys) {
  for (int32_t t = 0; t < n; t++) {
    keys[t].v = v[t];
    keys[t].nan = isnan(v[t]);
    keys[t].t = t;
  }
  qsort(keys, (size_t)n, sizeof *keys, cmp_key);
}

/* The op's rows must equal the sort of the scores it was given, exactly. Returns the
 * number of bad rows. */
static int check_topk_exact(const shape_t *sh, const step_t *st, const float *scores,
                            int64_t stride, const int32_t *idx, sort_key_t *keys, const char *what) {
  int bad = 0;
  const int32_t k = sh->topk;
  for (int32_t s = 0; s < st->tokens; s++) {
    const int32_t visible = st->pos[s] + 1, m = visible < k ? visible : k;
    full_sort_f32(scores + s * stride, visible, keys);
    const int32_t *row = idx + (int64_t)s * k;
    int ok = 1;
    int32_t at = -1;
    for (int32_t i = 0; i < k && ok; i++) {
      const int32_t want = i < m ? keys[i].t : -1;
      if (row[i] != want) ok = 0, at = i;
    }
    if (!ok) {
      if (bad < 3)
        fprintf(stderr, "  %s: token %d (visible %d, k %d): rank %d holds %d, want %d\n", what, s,
                visible, k, at, row[at], at < m ? keys[at].t : -1);
      bad++;
    }
  }
  return bad;
}

/* Ranks against the exact scores, near-ties allowed. */
static int check_topk_vs_exact(const shape_t *sh, const step_t *st, const double *ref,
                               const double *bound, int64_t stride, const int32_t *idx,
                               sort_key_t *keys, int64_t *near_ties) {
  int bad = 0;
  const int32_t k = sh->topk;
  for (int32_t s = 0; s < st->tokens; s++) {
    const int32_t visible = st->pos[s] + 1, m = visible < k ? visible : k;
    double E = 0;
    for (int32_t t = 0; t < visible; t++) {
      keys[t].v = ref[s * stride + t];
      keys[t].nan = 0;
      keys[t].t = t;
      if (bound[s * stride + t] > E) E = bound[s * stride + t];
    }
    qsort(keys, (size_t)visible, sizeof *keys, cmp_key);
    const int32_t *row = idx + (int64_t)s * k;
    for (int32_t i = 0; i < k; i++) {
      if (i >= m) {
        if (row[i] != -1) {
          if (bad < 3) fprintf(stderr, "  topk: token %d: rank %d past the visible %d holds %d\n", s, i, visible, row[i]);
          bad++;
          break;
        }
        continue;
      }
      if (row[i] == keys[i].t) continue;
      if (row[i] < 0 || row[i] >= visible ||
          fabs(ref[s * stride + row[i]] - keys[i].v) > 2 * E) {
        if (bad < 3)
          fprintf(stderr, "  topk: token %d (visible %d, k %d): rank %d holds %d (exact %.9g), "
                  "want %d (exact %.9g), allowed 2E = %.3g\n", s, visible, k, i, row[i],
                  row[i] >= 0 && row[i] < visible ? ref[s * stride + row[i]] : NAN, keys[i].t,
                  keys[i].v, 2 * E);
        bad++;
        break;
      }
      (*near_ties)++;
    }
    /* Distinct positions: a near-tie swap must not repeat one. */
    for (int32_t i = 0; i < m; i++)
      for (int32_t j = i + 1; j < m; j++)
        if (row[i] == row[j]) {
          if (bad < 3) fprintf(stderr, "  topk: token %d lists %d twice\n", s, row[i]);
          bad++;
          i = m;
          break;
        }
  }
  return bad;
}

/* ---- the latent cache --------------------------------------------------------------- */

typedef struct latent_cache {
  uint8_t *buf;
  int64_t entry_bytes;
  ina_mla_cache_t desc;
} latent_cache_t;

static void latent_alloc(const shape_t *sh, int32_t page_size, int64_t slots, latent_cache_t *lc) {
  const ina_mla_cache_format_t f = sh->cache_format;
  lc->entry_bytes = f == INA_MLA_CACHE_FP8 ? ina_mla_cache_fp8_entry_bytes(sh->C, sh->R)
                                           : (int64_t)(sh->C + sh->R) * (f == INA_MLA_CACHE_F32 ? 4 : 2);
  const int64_t pages = (slots + page_size - 1) / page_size;
  lc->buf = malloc((size_t)(pages * page_size * lc->entry_bytes + 16));
  lc->desc = f == INA_MLA_CACHE_FP8 ? ina_mla_cache_fp8_packed(lc->buf, page_size, sh->C, sh->R)
                                    : ina_mla_cache_interleaved(f, lc->buf, page_size, sh->C, sh->R);
}

/* Random entries in every slot (FP8: scale = amax / 448 per 128 values). */
static void latent_fill(test_rng_t *rng, const shape_t *sh, latent_cache_t *lc, int64_t slots) {
  float *x = malloc(sizeof(float) * (size_t)(sh->C + sh->R));
  for (int64_t s = 0; s < slots; s++) {
    uint8_t *e = lc->buf + s * lc->entry_bytes;
    for (int32_t i = 0; i < sh->C + sh->R; i++) x[i] = test_rng_normal(rng);
    switch (sh->cache_format) {
    case INA_MLA_CACHE_F32: memcpy(e, x, sizeof(float) * (size_t)(sh->C + sh->R)); break;
    case INA_MLA_CACHE_BF16:
      for (int32_t i = 0; i < sh->C + sh->R; i++) {
        const uint16_t v = ina_f32_to_bf16(x[i]);
        memcpy(e + 2 * i, &v, 2);
      }
      break;
    case INA_MLA_CACHE_FP8:
      for (int32_t blk = 0; blk < sh->C / 128; blk++) {
        float amax = 0;
        for (int32_t i = 0; i < 128; i++) amax = fmaxf(amax, fabsf(x[blk * 128 + i]));
        const float scale = amax / 448.0f;
        memcpy(e + sh->C + 4 * blk, &scale, 4);
        for (int32_t i = 0; i < 128; i++) e[blk * 128 + i] = ina_f32_to_fp8_e4m3(x[blk * 128 + i] / scale, 1);
      }
      for (int32_t i = 0; i < sh->R; i++) {
        const uint16_t v = ina_f32_to_bf16(x[sh->C + i]);
        memcpy(e + sh->C + 4 * (sh->C / 128) + 2 * i, &v, 2);
      }
      break;
    }
  }
  free(x);
}

/* Latent value c of slot `slot` as f32 (for the bound's max |latent|). */
static float latent_value(const shape_t *sh, const latent_cache_t *lc, int64_t slot, int32_t c) {
  const uint8_t *e = lc->buf + slot * lc->entry_bytes;
  switch (sh->cache_format) {
  case INA_MLA_CACHE_F32: { float v; memcpy(&v, e + 4 * c, 4); return v; }
  case INA_MLA_CACHE_BF16: { uint16_t v; memcpy(&v, e + 2 * c, 2); return ina_bf16_to_f32(v); }
  case INA_MLA_CACHE_FP8: { float s; memcpy(&s, e + sh->C + 4 * (c / 128), 4); return ina_fp8_e4m3_to_f32(e[c]) * s; }
  }
  return NAN;
}

/* Sum |q . e| terms of the unscaled score of one entry. */
static double entry_absdot(const shape_t *sh, const latent_cache_t *lc, int64_t slot,
                           const float *qn, const float *qp) {
  const uint8_t *e = lc->buf + slot * lc->entry_bytes;
  double m = 0;
  for (int32_t c = 0; c < sh->C; c++) m += fabs((double)qn[c] * latent_value(sh, lc, slot, c));
  for (int32_t r = 0; r < sh->R; r++) {
    float v;
    if (sh->cache_format == INA_MLA_CACHE_F32) {
      memcpy(&v, e + 4 * (sh->C + r), 4);
    } else {
      uint16_t u;
      const int64_t off = sh->cache_format == INA_MLA_CACHE_BF16 ? 2 * (sh->C + r)
                                                                 : sh->C + 4 * (sh->C / 128) + 2 * r;
      memcpy(&u, e + off, 2);
      v = ina_bf16_to_f32(u);
    }
    m += fabs((double)qp[r] * v);
  }
  return m;
}

/* Sparse MLA with `sel` against ina_mla_attention_ref over a cache of only the selected
 * entries. Returns the number of bad (token, head) rows. */
static int check_sparse_mla(test_rng_t *rng, const shape_t *sh, const step_t *st,
                            const latent_cache_t *lc, const int32_t *sel, const float *qn,
                            const float *qp, float scale, ina_threadpool_t *pool,
                            const char *what, double *worst_ratio) {
  const int32_t T = st->tokens, Hm = sh->mla_heads, C = sh->C, R = sh->R, K = sh->topk;
  int bad = 0;
  ina_dsa_mla_plan_params_t pp = INA_DSA_MLA_PLAN_PARAMS_INIT;
  pp.batch = sh->batch;
  pp.qo_indptr = st->qo_indptr;
  pp.kv_len = sh->kv_len;
  pp.num_heads = Hm;
  pp.kv_lora_rank = C;
  pp.rope_dim = R;
  pp.page_size = sh->page_size;
  pp.index_stride = K;
  size_t ws_bytes = 0;
  CHECK_OK(ina_dsa_mla_workspace_size(&pp, &ws_bytes));
  void *ws = malloc(ws_bytes);
  ina_dsa_plan_info_t info;
  CHECK_OK(ina_dsa_mla_plan(&pp, ws, ws_bytes, &info));
  float *out = malloc(sizeof(float) * (size_t)T * Hm * C + 4);
  float *lse = malloc(sizeof(float) * (size_t)T * Hm + 4);
  test_poison_f32(out, (size_t)T * Hm * C);
  test_poison_f32(lse, (size_t)T * Hm);
  ina_dsa_mla_run_params_t rp = INA_DSA_MLA_RUN_PARAMS_INIT;
  rp.q_nope = qn;
  rp.q_pe = qp;
  rp.cache = lc->desc;
  rp.kv_indptr = st->kv_indptr;
  rp.kv_indices = st->kv_indices;
  rp.indices = sel;
  rp.softmax_scale = scale;
  rp.out = out;
  rp.lse = lse;
  CHECK_OK(ina_dsa_mla_run(&info, ws, &rp, pool, NULL));

  /* The compacted cache: query token s with n_s > 0 selected becomes request r of its
   * own, its entries in row order; pages of a random size. */
  int32_t *count = calloc((size_t)T + 1, sizeof(int32_t));
  int64_t total = 0;
  int32_t nreq = 0;
  for (int32_t s = 0; s < T; s++) {
    for (int32_t i = 0; i < K; i++) count[s] += sel[(int64_t)s * K + i] >= 0;
    total += count[s];
    nreq += count[s] > 0;
  }
  const int32_t cps = (int32_t)test_rng_int(rng, 1, 9);
  latent_cache_t cc;
  latent_alloc(sh, cps, total + (int64_t)nreq * cps, &cc);
  int32_t *c_qo = malloc(sizeof(int32_t) * (size_t)(nreq + 1));
  int32_t *c_kvlen = malloc(sizeof(int32_t) * (size_t)(nreq + 1));
  int32_t *c_kvptr = malloc(sizeof(int32_t) * (size_t)(nreq + 1));
  int32_t *c_pages = malloc(sizeof(int32_t) * (size_t)(total / cps + nreq + 1));
  int32_t *c_tok = malloc(sizeof(int32_t) * (size_t)(nreq + 1));
  float *c_qn = malloc(sizeof(float) * ((size_t)nreq * Hm * C + 1));
  float *c_qp = malloc(sizeof(float) * ((size_t)nreq * Hm * R + 1));
  int32_t r = 0, page = 0;
  c_qo[0] = 0;
  c_kvptr[0] = 0;
  for (int32_t s = 0; s < T; s++) {
    if (count[s] == 0) continue;
    c_tok[r] = s;
    c_qo[r + 1] = r + 1;
    c_kvlen[r] = count[s];
    const int32_t npages = (count[s] + cps - 1) / cps;
    for (int32_t i = 0; i < npages; i++) c_pages[c_kvptr[r] + i] = page + i;
    int32_t n = 0;
    for (int32_t i = 0; i < K; i++) {
      const int32_t t = sel[(int64_t)s * K + i];
      if (t < 0) continue;
      memcpy(cc.buf + ((int64_t)page * cps + n) * cc.entry_bytes,
             lc->buf + slot_of(sh, st, st->request[s], t) * lc->entry_bytes, (size_t)lc->entry_bytes);
      n++;
    }
    page += npages;
    c_kvptr[r + 1] = c_kvptr[r] + npages;
    memcpy(c_qn + (int64_t)r * Hm * C, qn + (int64_t)s * Hm * C, sizeof(float) * (size_t)Hm * C);
    memcpy(c_qp + (int64_t)r * Hm * R, qp + (int64_t)s * Hm * R, sizeof(float) * (size_t)Hm * R);
    r++;
  }
  float *c_out = malloc(sizeof(float) * ((size_t)nreq * Hm * C + 1));
  float *c_lse = malloc(sizeof(float) * ((size_t)nreq * Hm + 1));
  test_poison_f32(c_out, (size_t)nreq * Hm * C);
  test_poison_f32(c_lse, (size_t)nreq * Hm);
  ina_mla_ref_params_t mp = {nreq, Hm, C, R, scale, c_qo, c_kvlen, c_kvptr, c_pages,
                             c_qn, c_qp, cc.desc, c_out, c_lse};
  CHECK_OK(ina_mla_attention_ref(&mp, pool));

  float *vmax = malloc(sizeof(float) * (size_t)C);
  r = 0;
  for (int32_t s = 0; s < T; s++) {
    if (count[s] == 0) {
      for (int32_t h = 0; h < Hm; h++) {
        int ok = lse[s * Hm + h] == -INFINITY;
        for (int32_t c = 0; c < C; c++) ok &= out[((int64_t)s * Hm + h) * C + c] == 0.0f;
        if (!ok) {
          if (bad < 3) fprintf(stderr, "  %s: token %d selects nothing: want 0 and lse -inf\n", what, s);
          bad++;
        }
      }
      continue;
    }
    const int32_t n = count[s];
    for (int32_t c = 0; c < C; c++) {
      float m = 0;
      for (int32_t i = 0; i < K; i++) {
        const int32_t t = sel[(int64_t)s * K + i];
        if (t >= 0) m = fmaxf(m, fabsf(latent_value(sh, lc, slot_of(sh, st, st->request[s], t), c)));
      }
      vmax[c] = m;
    }
    for (int32_t h = 0; h < Hm; h++) {
      const float *qnh = qn + ((int64_t)s * Hm + h) * C, *qph = qp + ((int64_t)s * Hm + h) * R;
      double delta = 0;
      for (int32_t i = 0; i < K; i++) {
        const int32_t t = sel[(int64_t)s * K + i];
        if (t < 0) continue;
        const double d = (C + R + 2) * EPS * scale *
                         entry_absdot(sh, lc, slot_of(sh, st, st->request[s], t), qnh, qph);
        if (d > delta) delta = d;
      }
      const float *o = out + ((int64_t)s * Hm + h) * C, *want = c_out + ((int64_t)r * Hm + h) * C;
      const double rel = 2 * (2 * delta + (n + 4) * EPS);
      int ok = 1;
      int32_t at = 0;
      double worst = 0;
      for (int32_t c = 0; c < C; c++) {
        const double err = fabs((double)o[c] - want[c]), allowed = rel * vmax[c];
        if (!(err <= allowed)) ok = 0, at = c;
        if (allowed > 0 && err / allowed > worst) worst = err / allowed;
      }
      const double l = lse[s * Hm + h], lw = c_lse[r * Hm + h];
      const double lse_allowed = 2 * (delta + (n + 4) * EPS * (1 + fabs(lw)));
      if (!(fabs(l - lw) <= lse_allowed)) ok = 0, at = -1;
      if (lse_allowed > 0 && fabs(l - lw) / lse_allowed > worst) worst = fabs(l - lw) / lse_allowed;
      if (worst > *worst_ratio) *worst_ratio = worst;
      if (!ok) {
        if (bad < 3) {
          if (at >= 0)
            fprintf(stderr, "  %s: token %d head %d (%d selected): out[%d] %.9g, want %.9g, allowed %.3g\n",
                    what, s, h, n, at, o[at], want[at], rel * vmax[at]);
          else
            fprintf(stderr, "  %s: token %d head %d (%d selected): lse %.9g, want %.9g, allowed %.3g\n",
                    what, s, h, n, l, lw, lse_allowed);
        }
        bad++;
      }
    }
    r++;
  }
  free(vmax);
  free(c_out);
  free(c_lse);
  free(c_qo);
  free(c_kvlen);
  free(c_kvptr);
  free(c_pages);
  free(c_tok);
  free(c_qn);
  free(c_qp);
  free(cc.buf);
  free(count);
  free(out);
  free(lse);
  free(ws);
  return bad;
}

/* ---- one shape ------------------------------------------------------------------------ */

static void run_shape(test_rng_t *rng, const shape_t *sh, ina_threadpool_t *pool, int index) {
  step_t st;
  make_step(rng, sh, &st);
  const int32_t T = st.tokens, H = sh->H, D = sh->D, K = sh->topk;
  const int64_t stride = st.max_kv + sh->score_pad;
  const int64_t slots = (int64_t)st.num_pages * sh->page_size;

  /* Index inputs: q and keys normal (the keys are layer-normed), weights of both signs
   * with the n_heads^-1/2 factor folded in. */
  float *q = malloc(sizeof(float) * ((size_t)T * H * D + 1));
  float *w = malloc(sizeof(float) * ((size_t)T * H + 1));
  float *keys = malloc(sizeof(float) * (size_t)(slots * D));
  void *key_buf = malloc((size_t)(slots * D * 4));
  for (int64_t i = 0; i < (int64_t)T * H * D; i++) q[i] = test_rng_normal(rng);
  for (int64_t i = 0; i < (int64_t)T * H; i++) w[i] = test_rng_normal(rng) / sqrtf((float)H);
  for (int64_t i = 0; i < slots * D; i++) {
    const float x = test_rng_normal(rng);
    if (sh->key_format == INA_DSA_KEY_BF16) {
      const uint16_t v = ina_f32_to_bf16(x);
      ((uint16_t *)key_buf)[i] = v;
      keys[i] = ina_bf16_to_f32(v);
    } else {
      ((float *)key_buf)[i] = x;
      keys[i] = x;
    }
  }
  const float scale = 1.0f / sqrtf((float)D);

  /* 1. scores */
  ina_dsa_score_plan_params_t sp = INA_DSA_SCORE_PLAN_PARAMS_INIT;
  sp.batch = sh->batch;
  sp.qo_indptr = st.qo_indptr;
  sp.kv_len = sh->kv_len;
  sp.num_heads = H;
  sp.head_dim = D;
  sp.page_size = sh->page_size;
  sp.score_stride = sh->score_pad ? (int32_t)stride : 0;
  size_t ws_bytes = 0;
  CHECK_OK(ina_dsa_score_workspace_size(&sp, &ws_bytes));
  void *ws = malloc(ws_bytes);
  ina_dsa_plan_info_t info;
  CHECK_OK(ina_dsa_score_plan(&sp, ws, ws_bytes, &info));
  CHECK(info.score_stride == stride);
  float *scores = malloc(sizeof(float) * ((size_t)T * stride + 1));
  test_poison_f32(scores, (size_t)T * stride);
  ina_dsa_score_run_params_t rp = INA_DSA_SCORE_RUN_PARAMS_INIT;
  rp.q = q;
  rp.weights = w;
  rp.cache = ina_dsa_index_cache_dense(sh->key_format, key_buf, sh->page_size, D);
  rp.kv_indptr = st.kv_indptr;
  rp.kv_indices = st.kv_indices;
  rp.softmax_scale = scale;
  rp.scores = scores;
  CHECK_OK(ina_dsa_score_run(&info, ws, &rp, pool, NULL));

  double *ref = malloc(sizeof(double) * ((size_t)T * stride + 1));
  double *bound = malloc(sizeof(double) * ((size_t)T * stride + 1));
  exact_scores(sh, &st, q, w, keys, scale, ref, bound, stride);
  int bad_rows = 0;
  double worst = 0;
  for (int32_t s = 0; s < T; s++) {
    int ok = 1;
    int32_t at = 0;
    for (int32_t t = 0; t < stride; t++) {
      const float got = scores[s * stride + t];
      if (t <= st.pos[s]) {
        const double err = fabs((double)got - ref[s * stride + t]);
        if (!(err <= bound[s * stride + t])) ok = 0, at = t;
        if (err / bound[s * stride + t] > worst) worst = err / bound[s * stride + t];
      } else if (!(isinf(got) && got < 0)) {
        ok = 0, at = t;
      }
    }
    if (!ok) {
      if (bad_rows < 3)
        fprintf(stderr, "  score: token %d (pos %d): [%d] = %.9g, want %.9g +- %.3g\n", s, st.pos[s],
                at, scores[s * stride + at], at <= st.pos[s] ? ref[s * stride + at] : -INFINITY,
                at <= st.pos[s] ? bound[s * stride + at] : 0.0);
      bad_rows++;
    }
  }
  CHECKF(bad_rows == 0, "shape %d: %d of %d score rows out of bounds", index, bad_rows, T);

  /* 2. top-k */
  ina_dsa_topk_plan_params_t tp = INA_DSA_TOPK_PLAN_PARAMS_INIT;
  tp.batch = sh->batch;
  tp.qo_indptr = st.qo_indptr;
  tp.kv_len = sh->kv_len;
  tp.topk = K;
  tp.score_stride = (int32_t)stride;
  size_t tws_bytes = 0;
  CHECK_OK(ina_dsa_topk_workspace_size(&tp, &tws_bytes));
  void *tws = malloc(tws_bytes);
  ina_dsa_plan_info_t tinfo;
  CHECK_OK(ina_dsa_topk_plan(&tp, tws, tws_bytes, &tinfo));
  int32_t *idx = malloc(sizeof(int32_t) * ((size_t)T * K + 1));
  for (int64_t i = 0; i < (int64_t)T * K; i++) idx[i] = INDEX_POISON;
  ina_dsa_topk_run_params_t kp = INA_DSA_TOPK_RUN_PARAMS_INIT;
  kp.scores = scores;
  kp.indices = idx;
  CHECK_OK(ina_dsa_topk_run(&tinfo, tws, &kp, pool, NULL));
  sort_key_t *skeys = malloc(sizeof(sort_key_t) * (size_t)(st.max_kv + 1));
  int bad = check_topk_exact(sh, &st, scores, stride, idx, skeys, "topk (given scores)");
  CHECKF(bad == 0, "shape %d: %d of %d top-k rows differ from the sort of their scores", index, bad, T);
  int64_t near_ties = 0;
  bad = check_topk_vs_exact(sh, &st, ref, bound, stride, idx, skeys, &near_ties);
  CHECKF(bad == 0, "shape %d: %d of %d top-k rows differ from the exact order beyond near-ties",
         index, bad, T);

  /* Planted ties: the scores on a coarse grid, a few visible -inf and NaN. */
  float *tied = malloc(sizeof(float) * ((size_t)T * stride + 1));
  for (int32_t s = 0; s < T; s++)
    for (int32_t t = 0; t < stride; t++) {
      float v = scores[s * stride + t];
      if (t <= st.pos[s]) {
        v = roundf(v * 4.0f) / 4.0f;
        const int64_t u = test_rng_int(rng, 0, 39);
        if (u == 0) v = -INFINITY;
        if (u == 1) v = NAN;
      } else {
        v = NAN; /* past the bound: must not be read as a candidate */
      }
      tied[s * stride + t] = v;
    }
  for (int64_t i = 0; i < (int64_t)T * K; i++) idx[i] = INDEX_POISON;
  kp.scores = tied;
  CHECK_OK(ina_dsa_topk_run(&tinfo, tws, &kp, pool, NULL));
  bad = check_topk_exact(sh, &st, tied, stride, idx, skeys, "topk (planted ties)");
  CHECKF(bad == 0, "shape %d: %d of %d top-k rows on tied scores break the tie rule", index, bad, T);
  /* Restore the real selection for sparse MLA. */
  for (int64_t i = 0; i < (int64_t)T * K; i++) idx[i] = INDEX_POISON;
  kp.scores = scores;
  CHECK_OK(ina_dsa_topk_run(&tinfo, tws, &kp, pool, NULL));

  /* 3. sparse MLA over the top-k's choice and over random rows with holes. */
  latent_cache_t lc;
  latent_alloc(sh, sh->page_size, slots, &lc);
  latent_fill(rng, sh, &lc, slots);
  const int32_t Hm = sh->mla_heads, C = sh->C, R = sh->R;
  float *qn = malloc(sizeof(float) * ((size_t)T * Hm * C + 1));
  float *qp = malloc(sizeof(float) * ((size_t)T * Hm * R + 1));
  for (int64_t i = 0; i < (int64_t)T * Hm * C; i++) qn[i] = test_rng_normal(rng);
  for (int64_t i = 0; i < (int64_t)T * Hm * R; i++) qp[i] = test_rng_normal(rng);
  const float mscale = (float)(1.5 / sqrt((double)(C + R)));
  double mla_worst = 0;
  bad = check_sparse_mla(rng, sh, &st, &lc, idx, qn, qp, mscale, pool, "sparse mla (top-k)", &mla_worst);
  CHECKF(bad == 0, "shape %d: %d of %d sparse MLA rows (top-k indices) out of bounds", index, bad, T * Hm);
  int32_t *rnd = malloc(sizeof(int32_t) * ((size_t)T * K + 1));
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)(st.max_kv + 1));
  for (int32_t s = 0; s < T; s++) {
    const int32_t visible = st.pos[s] + 1;
    int32_t *row = rnd + (int64_t)s * K;
    for (int32_t i = 0; i < K; i++) row[i] = -1;
    if (s == T / 2) continue; /* one row selects nothing */
    for (int32_t t = 0; t < visible; t++) perm[t] = t;
    for (int32_t t = visible - 1; t > 0; t--) {
      const int32_t j = (int32_t)test_rng_int(rng, 0, t), x = perm[t];
      perm[t] = perm[j];
      perm[j] = x;
    }
    const int32_t n = (int32_t)test_rng_int(rng, 1, visible < K ? visible : K);
    /* n distinct positions at random places of the row. */
    int32_t placed = 0;
    for (int32_t i = 0; i < K && placed < n; i++)
      if (test_rng_int(rng, 0, K - i - 1) < n - placed) row[i] = perm[placed++];
  }
  bad = check_sparse_mla(rng, sh, &st, &lc, rnd, qn, qp, mscale, pool, "sparse mla (random)", &mla_worst);
  CHECKF(bad == 0, "shape %d: %d of %d sparse MLA rows (random indices) out of bounds", index, bad, T * Hm);

  printf("  shape %2d: batch %d tokens %4d max_kv %3d page %2d | index H %2d D %3d %s k %4d: "
         "score err/bound <= %.3f, near-ties %lld | mla heads %2d C %3d R %2d %s: err/bound <= %.3f\n",
         index, sh->batch, T, st.max_kv, sh->page_size, H, D,
         sh->key_format == INA_DSA_KEY_BF16 ? "bf16" : "f32 ", K, worst, (long long)near_ties, Hm, C,
         R, sh->cache_format == INA_MLA_CACHE_F32 ? "f32 " : sh->cache_format == INA_MLA_CACHE_BF16 ? "bf16" : "fp8 ",
         mla_worst);

  free(rnd);
  free(perm);
  free(qn);
  free(qp);
  free(lc.buf);
  free(tied);
  free(skeys);
  free(idx);
  free(tws);
  free(ref);
  free(bound);
  free(scores);
  free(ws);
  free(q);
  free(w);
  free(keys);
  free(key_buf);
  free_step(&st);
}

/* Shape i: every property cycles independently so the combinations vary. */
static void make_shape(test_rng_t *rng, int i, shape_t *sh) {
  static const int32_t pages[] = {1, 64, 16, 64, 1};
  static const int32_t heads[] = {1, 3, 5, 7, 64, 3};
  static const int32_t dims[] = {16, 32, 64, 128, 72};
  static const int32_t topks[] = {1, 5, 32, 100, 2048, 7, 300};
  memset(sh, 0, sizeof *sh);
  sh->batch = (int32_t)test_rng_int(rng, 1, 5);
  const int mode = i % 3; /* 0 decode, 1 prefill, 2 mixed */
  const int long_one = i % 2 == 0 ? (int)test_rng_int(rng, 0, sh->batch - 1) : -1;
  for (int32_t b = 0; b < sh->batch; b++) {
    sh->kv_len[b] = b == long_one ? (int32_t)test_rng_int(rng, 150, 400) : (int32_t)test_rng_int(rng, 1, 40);
    int32_t q_len = 1;
    if (mode == 1 || (mode == 2 && b % 2 == 1)) {
      /* A whole prompt (the long one too), or a chunk at the end of the context. */
      q_len = test_rng_int(rng, 0, 1) ? sh->kv_len[b] : (int32_t)test_rng_int(rng, 1, 8);
      if (q_len > sh->kv_len[b]) q_len = sh->kv_len[b];
    }
    /* A request of the batch with no query token this step (mixed steps only). */
    if (mode == 2 && b % 3 == 2 && test_rng_int(rng, 0, 1)) q_len = 0;
    sh->q_len[b] = q_len;
  }
  sh->page_size = pages[i % 5];
  sh->H = heads[i % 6];
  sh->D = dims[i % 5];
  if (sh->H == 64 && mode != 0 && sh->D > 64) sh->D = 64; /* keep the brute force quick */
  sh->key_format = i % 4 < 2 ? INA_DSA_KEY_F32 : INA_DSA_KEY_BF16;
  sh->topk = topks[i % 7];
  sh->score_pad = i % 3 == 2 ? (int32_t)test_rng_int(rng, 1, 5) : 0;
  switch (i % 4) {
  case 0: sh->cache_format = INA_MLA_CACHE_F32; sh->mla_heads = 3; sh->C = 64; sh->R = 16; break;
  case 1: sh->cache_format = INA_MLA_CACHE_BF16; sh->mla_heads = 16; sh->C = 128; sh->R = 64; break;
  case 2: sh->cache_format = INA_MLA_CACHE_FP8; sh->mla_heads = 1; sh->C = 512; sh->R = 64; break;
  default: sh->cache_format = INA_MLA_CACHE_F32; sh->mla_heads = 5; sh->C = 96; sh->R = 0; break;
  }
}

/* ---- refusals ------------------------------------------------------------------------- */

static int refused(ina_status_t s, ina_status_t want, const char *needle) {
  return s == want && strstr(ina_last_error(), needle) != NULL;
}

static void test_errors(void) {
  ina_log_set_quiet_errors(1);
  const int32_t qo[] = {0, 2}, kv[] = {5}, kv_bad[] = {1};
  char ws[4096];
  ina_dsa_plan_info_t info;
  size_t bytes;

  ina_dsa_topk_plan_params_t tp = INA_DSA_TOPK_PLAN_PARAMS_INIT;
  tp.batch = 1;
  tp.qo_indptr = qo;
  tp.kv_len = kv;
  tp.topk = 0;
  CHECK(refused(ina_dsa_topk_plan(&tp, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "topk"));
  CHECK(info.op == 0);
  tp.topk = 4;
  CHECK(refused(ina_dsa_topk_plan(NULL, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "NULL"));
  CHECK(refused(ina_dsa_topk_plan(&tp, NULL, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "workspace"));
  CHECK(refused(ina_dsa_topk_plan(&tp, ws, 8, &info), INA_ERR_INVALID_ARGUMENT, "workspace"));
  tp.kv_len = kv_bad;
  CHECK(refused(ina_dsa_topk_plan(&tp, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "kv_len"));
  tp.kv_len = kv;
  tp.score_stride = 3;
  CHECK(refused(ina_dsa_topk_plan(&tp, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "score_stride"));
  tp.score_stride = 0;
  ina_dsa_topk_plan_params_t old = tp;
  old.struct_size = 8;
  CHECK(refused(ina_dsa_topk_plan(&old, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "struct_size"));
  tp.backend = INA_DSA_BACKEND_CUDA;
  CHECK(refused(ina_dsa_topk_plan(&tp, ws, sizeof ws, &info), INA_ERR_UNSUPPORTED, "backend"));
  tp.backend = INA_DSA_BACKEND_REF;
  CHECK_OK(ina_dsa_topk_workspace_size(&tp, &bytes));
  CHECK(bytes <= sizeof ws);
  CHECK_OK(ina_dsa_topk_plan(&tp, ws, sizeof ws, &info));
  float scores[2 * 5];
  int32_t idx[2 * 4];
  for (int i = 0; i < 10; i++) scores[i] = (float)(i % 3);
  ina_dsa_topk_run_params_t kp = INA_DSA_TOPK_RUN_PARAMS_INIT;
  kp.scores = scores;
  kp.indices = NULL;
  CHECK(refused(ina_dsa_topk_run(&info, ws, &kp, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "indices"));
  kp.indices = idx;
  CHECK_OK(ina_dsa_topk_run(&info, ws, &kp, NULL, NULL));
  /* Token 0 sits at position 3 (4 visible: 0 1 2 0): 2, then 1, then the zeros by position. */
  CHECK(idx[0] == 2 && idx[1] == 1 && idx[2] == 0 && idx[3] == 3);
  /* Token 1 at position 4, row 2 0 1 2 0: the twos (positions 0, 3), the one (2), then
   * the first zero (1); k = 4 leaves out position 4. */
  CHECK(idx[4] == 0 && idx[5] == 3 && idx[6] == 2 && idx[7] == 1);

  /* A score run refuses top-k's plan, and a plan for another workspace. */
  ina_dsa_score_run_params_t sr = INA_DSA_SCORE_RUN_PARAMS_INIT;
  CHECK(refused(ina_dsa_score_run(&info, ws, &sr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "operation"));
  char ws2[4096];
  memset(ws2, 0, sizeof ws2);
  CHECK(refused(ina_dsa_topk_run(&info, ws2, &kp, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "workspace"));

  ina_dsa_score_plan_params_t sp = INA_DSA_SCORE_PLAN_PARAMS_INIT;
  sp.batch = 1;
  sp.qo_indptr = qo;
  sp.kv_len = kv;
  sp.num_heads = 0;
  sp.head_dim = 8;
  sp.page_size = 2;
  CHECK(refused(ina_dsa_score_plan(&sp, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "num_heads"));
  sp.num_heads = 3;
  sp.page_size = 0;
  CHECK(refused(ina_dsa_score_plan(&sp, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "page_size"));
  sp.page_size = 2;
  const int32_t qo_bad[] = {1, 2};
  sp.qo_indptr = qo_bad;
  CHECK(refused(ina_dsa_score_plan(&sp, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "qo_indptr"));
  sp.qo_indptr = qo;
  CHECK_OK(ina_dsa_score_plan(&sp, ws, sizeof ws, &info));
  float q[2 * 3 * 8] = {0}, w[2 * 3] = {0}, keys[6 * 8] = {0}, out[2 * 5];
  const int32_t kv_indptr[] = {0, 3}, kv_indices[] = {0, 1, 2}, kv_indptr_short[] = {0, 2};
  sr.q = q;
  sr.weights = w;
  sr.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_F32, keys, 2, 8);
  sr.kv_indptr = kv_indptr;
  sr.kv_indices = kv_indices;
  sr.softmax_scale = 0.25f;
  sr.scores = NULL;
  CHECK(refused(ina_dsa_score_run(&info, ws, &sr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "scores"));
  sr.scores = out;
  sr.cache.page_size = 4;
  CHECK(refused(ina_dsa_score_run(&info, ws, &sr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "page_size"));
  sr.cache.page_size = 2;
  sr.kv_indptr = kv_indptr_short;
  CHECK(refused(ina_dsa_score_run(&info, ws, &sr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "pages"));
  sr.kv_indptr = kv_indptr;
  sr.softmax_scale = 0;
  CHECK(refused(ina_dsa_score_run(&info, ws, &sr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "softmax_scale"));
  sr.softmax_scale = 0.25f;
  CHECK_OK(ina_dsa_score_run(&info, ws, &sr, NULL, NULL));

  ina_dsa_mla_plan_params_t mp = INA_DSA_MLA_PLAN_PARAMS_INIT;
  mp.batch = 1;
  mp.qo_indptr = qo;
  mp.kv_len = kv;
  mp.num_heads = 1;
  mp.kv_lora_rank = 4;
  mp.rope_dim = 2;
  mp.page_size = 2;
  mp.index_stride = 0;
  CHECK(refused(ina_dsa_mla_plan(&mp, ws, sizeof ws, &info), INA_ERR_INVALID_ARGUMENT, "index_stride"));
  mp.index_stride = 3;
  CHECK_OK(ina_dsa_mla_plan(&mp, ws, sizeof ws, &info));
  float lat[6 * 6] = {0}, qn[2 * 4] = {0}, qp[2 * 2] = {0}, mo[2 * 4], ml[2];
  ina_dsa_mla_run_params_t mr = INA_DSA_MLA_RUN_PARAMS_INIT;
  mr.q_nope = qn;
  mr.q_pe = qp;
  mr.cache = ina_mla_cache_interleaved(INA_MLA_CACHE_F32, lat, 2, 4, 2);
  mr.kv_indptr = kv_indptr;
  mr.kv_indices = kv_indices;
  mr.softmax_scale = 0.5f;
  mr.out = mo;
  mr.lse = ml;
  const int32_t sel_ok[] = {3, -1, 0, 4, 1, -1}, sel_far[] = {3, 4, -1, 0, 1, 2},
                sel_dup[] = {0, -1, 0, 1, 2, 3}, sel_neg[] = {0, -2, 1, 1, 2, 3};
  mr.indices = sel_far; /* token 0 sees positions 0..3 */
  CHECK(refused(ina_dsa_mla_run(&info, ws, &mr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "indices[1] = 4"));
  mr.indices = sel_dup;
  CHECK(refused(ina_dsa_mla_run(&info, ws, &mr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "twice"));
  mr.indices = sel_neg;
  CHECK(refused(ina_dsa_mla_run(&info, ws, &mr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "indices[1] = -2"));
  mr.indices = sel_ok;
  mr.cache.kv_lora_rank = 8;
  CHECK(refused(ina_dsa_mla_run(&info, ws, &mr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "kv_lora_rank"));
  mr.cache.kv_lora_rank = 4;
  mr.q_nope = NULL;
  CHECK(refused(ina_dsa_mla_run(&info, ws, &mr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "q_nope"));
  mr.q_nope = qn;
  CHECK_OK(ina_dsa_mla_run(&info, ws, &mr, NULL, NULL));
  CHECK(ml[0] > -INFINITY && ml[1] > -INFINITY && mo[0] == 0.0f); /* zero latents: out 0 */

  /* An empty step plans and runs without any tensor. */
  const int32_t qo0[] = {0};
  mp.batch = 0;
  mp.qo_indptr = qo0;
  mp.kv_len = NULL;
  CHECK_OK(ina_dsa_mla_plan(&mp, ws, sizeof ws, &info));
  ina_dsa_mla_run_params_t empty = INA_DSA_MLA_RUN_PARAMS_INIT;
  empty.softmax_scale = 1;
  empty.cache = mr.cache;
  CHECK_OK(ina_dsa_mla_run(&info, ws, &empty, NULL, NULL));
  ina_log_set_quiet_errors(0);
}

/* ---- FP8 index keys ------------------------------------------------------------------- */

/* The e4m3 quantization error model of ina_dsa_index_key_quantize_fp8 (dsa.h): for a
 * scale that is a normal f32, |e4m3 * scale - k_d| <= U8 |k_d| + 2^-10 scale. */
#define U8 (0x1p-4 + 0x1p-23)
#define SUB8 0x1p-10

/* Where the test itself expects slot `slot` of page `page` (layout 0 inline, 1 paged),
 * written from the layout's wording in dsa.h rather than from the descriptor. */
static const uint8_t *fp8_key_at(const uint8_t *buf, int layout, int32_t page_size, int32_t D,
                                 int64_t page, int32_t slot, float *scale) {
  const uint8_t *p = buf + page * page_size * (int64_t)(D + 4), *k, *s;
  if (layout == 0) {
    k = p + (int64_t)slot * (D + 4);
    s = k + D;
  } else {
    k = p + (int64_t)slot * D;
    s = p + (int64_t)page_size * D + 4 * (int64_t)slot;
  }
  memcpy(scale, s, 4);
  return k;
}

/* A key of D values whose magnitude, spread and zero pattern depend on `kind`. */
static void fp8_make_key(test_rng_t *rng, int64_t kind, int32_t D, float *x) {
  const float mag = ldexpf(1.0f, (int)test_rng_int(rng, -6, 6));
  for (int32_t d = 0; d < D; d++) x[d] = kind == 0 ? 0.0f : mag * test_rng_normal(rng);
  if (kind == 1) x[test_rng_int(rng, 0, D - 1)] *= 60.0f; /* an outlier: many e4m3 subnormals */
  if (kind == 2)
    for (int32_t d = 0; d < D; d += 3) x[d] = 0.0f; /* exact zeros among the values */
}

/* The quantizer: bytes and scale bit for bit against the rule written out here
 * (scale = amax / 448, byte = e4m3(x / scale) saturating; an all-zero key scale 1), the
 * error model on every value, the underflowing scale, refusals of non-finite keys. */
static void test_fp8_quantize(test_rng_t *rng) {
  static const int32_t dims[] = {1, 16, 30, 128, 200};
  uint8_t q[256 + 8];
  float x[256];
  int bad_bytes = 0, bad_model = 0;
  double worst = 0;
  for (int rep = 0; rep < 400; rep++) {
    const int32_t D = dims[rep % 5];
    fp8_make_key(rng, rep % 7 == 0 ? 0 : test_rng_int(rng, 1, 3), D, x);
    uint8_t sbuf[8];
    memset(q, 0x7f, sizeof q);
    CHECK_OK(ina_dsa_index_key_quantize_fp8(x, D, q, sbuf + 1)); /* unaligned scale */
    float scale;
    memcpy(&scale, sbuf + 1, 4);
    float amax = 0;
    for (int32_t d = 0; d < D; d++) amax = fmaxf(amax, fabsf(x[d]));
    const float want_scale = amax == 0.0f ? 1.0f : amax / 448.0f;
    if (memcmp(&scale, &want_scale, 4) != 0) bad_bytes++;
    for (int32_t d = 0; d < D; d++) {
      if (q[d] != ina_f32_to_fp8_e4m3(x[d] / want_scale, 1)) bad_bytes++;
      const double err = fabs((double)ina_fp8_e4m3_to_f32(q[d]) * scale - x[d]);
      const double allowed = U8 * fabs((double)x[d]) + SUB8 * scale;
      if (!(err <= allowed)) bad_model++;
      if (err / allowed > worst) worst = err / allowed;
    }
    if (q[D] != 0x7f) bad_bytes++; /* nothing past the key */
    if (amax == 0.0f) {
      int zero = scale == 1.0f;
      for (int32_t d = 0; d < D; d++) zero &= q[d] == 0;
      CHECKF(zero, "an all-zero key must quantize to scale 1 and zero bytes");
    }
  }
  CHECKF(bad_bytes == 0, "fp8 quantizer: %d bytes or scales differ from amax / 448", bad_bytes);
  CHECKF(bad_model == 0, "fp8 quantizer: %d values outside the e4m3 error model", bad_model);
  /* amax / 448 underflows: the smallest subnormal scale, as core's rule. */
  float tiny[4] = {0x1p-148f, 0.0f, -0x1p-149f, 0.0f}, s;
  CHECK_OK(ina_dsa_index_key_quantize_fp8(tiny, 4, q, &s));
  CHECK(s == 0x1p-149f);
  ina_log_set_quiet_errors(1);
  float badkey[3] = {1.0f, NAN, 2.0f};
  memset(q, 0x55, 4);
  s = 7.0f;
  CHECK(refused(ina_dsa_index_key_quantize_fp8(badkey, 3, q, &s), INA_ERR_INVALID_ARGUMENT, "finite"));
  badkey[1] = INFINITY;
  CHECK(refused(ina_dsa_index_key_quantize_fp8(badkey, 3, q, &s), INA_ERR_INVALID_ARGUMENT, "finite"));
  CHECK(q[0] == 0x55 && q[1] == 0x55 && s == 7.0f); /* nothing written */
  CHECK(refused(ina_dsa_index_key_quantize_fp8(x, 0, q, &s), INA_ERR_INVALID_ARGUMENT, "head_dim"));
  CHECK(refused(ina_dsa_index_key_quantize_fp8(x, 3, NULL, &s), INA_ERR_INVALID_ARGUMENT, "NULL"));
  ina_log_set_quiet_errors(0);
  printf("  fp8 quantizer: 400 keys, bit-exact to amax / 448, error / model <= %.3f\n", worst);
}

/* The score over an FP8 index cache (layout 0 inline, 1 paged), keys written by
 * ina_dsa_index_key_store. Two checks of every visible score:
 *  (a) against this test's own double loop over the dequantized keys e4m3_d * scale:
 *      the products (q_d e4m3_d in the reference, which then multiplies the head's sum
 *      by the scale; q_d e4m3_d scale here) are exact in double, so the two differ only
 *      by the sums' order and the scale, softmax-scale and weight multiplications (at
 *      most D + H + 4 roundings of 2^-53 each, relative to S^ = scale_sm sum_h |w_h|
 *      sum_d |q_hd k^_d|, on either side) and the final f32 rounding (2^-24 |score|):
 *          |got - exact^| <= 2^-24 |exact^| + 2 (D + H + 5) 2^-53 S^ + 2^-150
 *      (2^-150: half of f32's subnormal spacing, for a score rounding into that range)
 *  (b) against the exact score of the f32 keys before quantization: relu is
 *      1-Lipschitz, so the key error model (U8 |x_d| + 2^-10 scale_t per value) gives
 *          |got - exact_x| <= bound (a) + scale_sm sum_h |w_h| sum_d |q_hd| (U8 |x_d| + 2^-10 scale_t)
 * Then the top-k on these scores, exactly against the sort of the scores it was given
 * and against the exact order with near-ties within 2 bound (a). */
static void run_fp8_shape(test_rng_t *rng, const shape_t *sh, int layout, ina_threadpool_t *pool,
                          int index) {
  step_t st;
  make_step(rng, sh, &st);
  const int32_t T = st.tokens, H = sh->H, D = sh->D, K = sh->topk, ps = sh->page_size;
  const int64_t stride = st.max_kv + sh->score_pad;
  const int64_t slots = (int64_t)st.num_pages * ps;
  const size_t buf_bytes = (size_t)(slots * (D + 4));
  uint8_t *buf = malloc(buf_bytes + 1);
  memset(buf, 0x7f, buf_bytes); /* e4m3 NaN bytes, scales 3.4e38: a stray read shows */
  const ina_dsa_index_cache_t cache = layout == 0 ? ina_dsa_index_cache_fp8_inline(buf, ps, D)
                                                  : ina_dsa_index_cache_fp8_paged(buf, ps, D);
  float *x = malloc(sizeof(float) * (size_t)(slots * D));     /* the f32 keys */
  double *kq = malloc(sizeof(double) * (size_t)(slots * D));  /* dequantized, by this test */
  float *kscale = malloc(sizeof(float) * (size_t)slots);
  for (int64_t sl = 0; sl < slots; sl++) {
    fp8_make_key(rng, sl % 11 == 4 ? 0 : test_rng_int(rng, 1, 3), D, x + sl * D);
    CHECK_OK(ina_dsa_index_key_store(&cache, sl / ps, (int32_t)(sl % ps), x + sl * D, D));
  }
  for (int64_t sl = 0; sl < slots; sl++) {
    const uint8_t *k = fp8_key_at(buf, layout, ps, D, sl / ps, (int32_t)(sl % ps), &kscale[sl]);
    for (int32_t d = 0; d < D; d++) kq[sl * D + d] = (double)ina_fp8_e4m3_to_f32(k[d]) * kscale[sl];
  }
  float *q = malloc(sizeof(float) * ((size_t)T * H * D + 1));
  float *w = malloc(sizeof(float) * ((size_t)T * H + 1));
  for (int64_t i = 0; i < (int64_t)T * H * D; i++) q[i] = test_rng_normal(rng);
  for (int64_t i = 0; i < (int64_t)T * H; i++) w[i] = test_rng_normal(rng) / sqrtf((float)H);
  const float scale = 1.0f / sqrtf((float)D);

  ina_dsa_score_plan_params_t sp = INA_DSA_SCORE_PLAN_PARAMS_INIT;
  sp.batch = sh->batch;
  sp.qo_indptr = st.qo_indptr;
  sp.kv_len = sh->kv_len;
  sp.num_heads = H;
  sp.head_dim = D;
  sp.page_size = ps;
  sp.score_stride = sh->score_pad ? (int32_t)stride : 0;
  size_t ws_bytes = 0;
  CHECK_OK(ina_dsa_score_workspace_size(&sp, &ws_bytes));
  void *ws = malloc(ws_bytes);
  ina_dsa_plan_info_t info;
  CHECK_OK(ina_dsa_score_plan(&sp, ws, ws_bytes, &info));
  float *scores = malloc(sizeof(float) * ((size_t)T * stride + 1));
  test_poison_f32(scores, (size_t)T * stride);
  ina_dsa_score_run_params_t rp = INA_DSA_SCORE_RUN_PARAMS_INIT;
  rp.q = q;
  rp.weights = w;
  rp.cache = cache;
  rp.kv_indptr = st.kv_indptr;
  rp.kv_indices = st.kv_indices;
  rp.softmax_scale = scale;
  rp.scores = scores;
  CHECK_OK(ina_dsa_score_run(&info, ws, &rp, pool, NULL));

  double *ref = malloc(sizeof(double) * ((size_t)T * stride + 1));
  double *bound = malloc(sizeof(double) * ((size_t)T * stride + 1));
  int bad_a = 0, bad_b = 0, bad_pad = 0;
  double worst_a = 0, worst_b = 0;
  for (int32_t s = 0; s < T; s++) {
    const int32_t b = st.request[s];
    int row_a = 0, row_b = 0;
    for (int32_t t = 0; t <= st.pos[s]; t++) {
      const int64_t sl = slot_of(sh, &st, b, t);
      const double *kh = kq + sl * D;
      const float *xk = x + sl * D;
      double e_q = 0, e_x = 0, mag = 0, qerr = 0;
      for (int32_t h = 0; h < H; h++) {
        const float *qh = q + ((int64_t)s * H + h) * D;
        double dq = 0, dx = 0, absdot = 0, kerr = 0;
        for (int32_t d = 0; d < D; d++) {
          dq += (double)qh[d] * kh[d];
          dx += (double)qh[d] * xk[d];
          absdot += fabs((double)qh[d] * kh[d]);
          kerr += fabs((double)qh[d]) * (U8 * fabs((double)xk[d]) + SUB8 * kscale[sl]);
        }
        const double wh = w[s * H + h], a = dq * scale, c = dx * scale;
        e_q += wh * (a > 0 ? a : 0);
        e_x += wh * (c > 0 ? c : 0);
        mag += fabs(wh) * scale * absdot;
        qerr += fabs(wh) * scale * kerr;
      }
      const double got = scores[s * stride + t];
      const double ba = 0x1p-24 * fabs(e_q) + 2.0 * (D + H + 5) * 0x1p-53 * mag + 0x1p-150;
      const double bb = ba + qerr;
      ref[s * stride + t] = e_q;
      bound[s * stride + t] = ba;
      const double ea = fabs(got - e_q), eb = fabs(got - e_x);
      if (!(ea <= ba)) {
        if (bad_a + row_a < 3)
          fprintf(stderr, "  fp8 score: token %d pos %d: %.9g, dequantized keys give %.9g +- %.3g\n",
                  s, t, got, e_q, ba);
        row_a = 1;
      }
      if (!(eb <= bb)) {
        if (bad_b + row_b < 3)
          fprintf(stderr, "  fp8 score: token %d pos %d: %.9g, the f32 keys give %.9g +- %.3g\n", s,
                  t, got, e_x, bb);
        row_b = 1;
      }
      if (ba > 0 && ea / ba > worst_a) worst_a = ea / ba;
      if (bb > 0 && eb / bb > worst_b) worst_b = eb / bb;
    }
    for (int32_t t = st.pos[s] + 1; t < stride; t++)
      if (!(isinf(scores[s * stride + t]) && scores[s * stride + t] < 0)) bad_pad++;
    bad_a += row_a;
    bad_b += row_b;
  }
  CHECKF(bad_a == 0, "fp8 shape %d: %d of %d score rows off the dequantized keys' score", index,
         bad_a, T);
  CHECKF(bad_b == 0, "fp8 shape %d: %d of %d score rows outside the e4m3 error model", index,
         bad_b, T);
  CHECKF(bad_pad == 0, "fp8 shape %d: %d scores past the causal bound are not -inf", index, bad_pad);

  ina_dsa_topk_plan_params_t tp = INA_DSA_TOPK_PLAN_PARAMS_INIT;
  tp.batch = sh->batch;
  tp.qo_indptr = st.qo_indptr;
  tp.kv_len = sh->kv_len;
  tp.topk = K;
  tp.score_stride = (int32_t)stride;
  size_t tws_bytes = 0;
  CHECK_OK(ina_dsa_topk_workspace_size(&tp, &tws_bytes));
  void *tws = malloc(tws_bytes);
  ina_dsa_plan_info_t tinfo;
  CHECK_OK(ina_dsa_topk_plan(&tp, tws, tws_bytes, &tinfo));
  int32_t *idx = malloc(sizeof(int32_t) * ((size_t)T * K + 1));
  for (int64_t i = 0; i < (int64_t)T * K; i++) idx[i] = INDEX_POISON;
  ina_dsa_topk_run_params_t kp = INA_DSA_TOPK_RUN_PARAMS_INIT;
  kp.scores = scores;
  kp.indices = idx;
  CHECK_OK(ina_dsa_topk_run(&tinfo, tws, &kp, pool, NULL));
  sort_key_t *skeys = malloc(sizeof(sort_key_t) * (size_t)(st.max_kv + 1));
  int bad = check_topk_exact(sh, &st, scores, stride, idx, skeys, "fp8 topk (given scores)");
  CHECKF(bad == 0, "fp8 shape %d: %d of %d top-k rows differ from the sort of their scores", index,
         bad, T);
  int64_t near_ties = 0;
  bad = check_topk_vs_exact(sh, &st, ref, bound, stride, idx, skeys, &near_ties);
  CHECKF(bad == 0, "fp8 shape %d: %d of %d top-k rows differ from the exact order beyond near-ties",
         index, bad, T);

  printf("  fp8 shape %2d: %s batch %d tokens %4d max_kv %3d page %2d | H %2d D %3d k %4d: "
         "err/bound (a) dequantized <= %.3f, (b) e4m3 model <= %.3f, near-ties %lld\n",
         index, layout == 0 ? "inline" : "paged ", sh->batch, T, st.max_kv, ps, H, D, K, worst_a,
         worst_b, (long long)near_ties);
  free(skeys);
  free(idx);
  free(tws);
  free(ref);
  free(bound);
  free(scores);
  free(ws);
  free(q);
  free(w);
  free(kscale);
  free(kq);
  free(x);
  free(buf);
  free_step(&st);
}

/* The FP8 descriptors and the refusals around them. */
static void test_fp8_layouts(void) {
  /* The helpers' fields, written out: V3.2's 128 dims, 132 bytes per token. */
  uint8_t buf[4 * 132];
  const ina_dsa_index_cache_t in = ina_dsa_index_cache_fp8_inline(buf, 4, 128);
  CHECK(in.format == INA_DSA_KEY_FP8 && in.token_stride == 132 && in.page_stride == 4 * 132 &&
        in.scale_offset == 128 && in.scale_stride == 132);
  const ina_dsa_index_cache_t pg = ina_dsa_index_cache_fp8_paged(buf, 4, 128);
  CHECK(pg.format == INA_DSA_KEY_FP8 && pg.token_stride == 128 && pg.page_stride == 4 * 132 &&
        pg.scale_offset == 4 * 128 && pg.scale_stride == 4);
  CHECK(ina_dsa_index_key_bytes(INA_DSA_KEY_FP8, 128) == 132 &&
        ina_dsa_index_key_bytes(INA_DSA_KEY_BF16, 128) == 256 &&
        ina_dsa_index_key_bytes(INA_DSA_KEY_F32, 128) == 512);
  const ina_dsa_index_cache_t dn = ina_dsa_index_cache_dense(INA_DSA_KEY_BF16, buf, 4, 64);
  CHECK(dn.token_stride == 128 && dn.page_stride == 512 && dn.scale_stride == 0);

  ina_log_set_quiet_errors(1);
  const int32_t qo[] = {0, 1}, kv[] = {3}, kv_indptr[] = {0, 1}, kv_indices[] = {0};
  char ws[1024];
  ina_dsa_plan_info_t info;
  ina_dsa_score_plan_params_t sp = INA_DSA_SCORE_PLAN_PARAMS_INIT;
  sp.batch = 1;
  sp.qo_indptr = qo;
  sp.kv_len = kv;
  sp.num_heads = 2;
  sp.head_dim = 128;
  sp.page_size = 4;
  CHECK_OK(ina_dsa_score_plan(&sp, ws, sizeof ws, &info));
  float q[2 * 128] = {0}, w[2] = {1, 1}, out[3], key[128] = {0};
  ina_dsa_score_run_params_t sr = INA_DSA_SCORE_RUN_PARAMS_INIT;
  sr.q = q;
  sr.weights = w;
  sr.kv_indptr = kv_indptr;
  sr.kv_indices = kv_indices;
  sr.softmax_scale = 0.125f;
  sr.scores = out;
  sr.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_FP8, buf, 4, 128);
  CHECK(refused(ina_dsa_score_run(&info, ws, &sr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "scale_stride"));
  CHECK(refused(ina_dsa_index_key_store(&sr.cache, 0, 0, key, 128), INA_ERR_INVALID_ARGUMENT, "scale_stride"));
  sr.cache = in;
  sr.cache.format = (ina_dsa_key_format_t)3;
  CHECK(refused(ina_dsa_score_run(&info, ws, &sr, NULL, NULL), INA_ERR_INVALID_ARGUMENT, "format"));
  CHECK(refused(ina_dsa_index_key_store(&sr.cache, 0, 0, key, 128), INA_ERR_INVALID_ARGUMENT, "format"));
  CHECK(refused(ina_dsa_index_key_store(&in, 0, 4, key, 128), INA_ERR_INVALID_ARGUMENT, "slot"));
  CHECK(refused(ina_dsa_index_key_store(&in, -1, 0, key, 128), INA_ERR_INVALID_ARGUMENT, "page"));
  CHECK(refused(ina_dsa_index_key_store(&in, 0, 0, key, 64), INA_ERR_INVALID_ARGUMENT, "head_dim"));
  ina_log_set_quiet_errors(0);
  /* All-zero keys in both layouts: scale 1, scores exactly 0. */
  for (int layout = 0; layout < 2; layout++) {
    memset(buf, 0x7f, sizeof buf);
    sr.cache = layout == 0 ? in : pg;
    for (int32_t slot = 0; slot < 4; slot++) CHECK_OK(ina_dsa_index_key_store(&sr.cache, 0, slot, key, 128));
    for (int32_t i = 0; i < 2 * 128; i++) q[i] = 1.0f;
    test_poison_f32(out, 3);
    CHECK_OK(ina_dsa_score_run(&info, ws, &sr, NULL, NULL));
    CHECK(out[0] == 0.0f && out[1] == 0.0f && out[2] == 0.0f);
    for (int32_t slot = 0; slot < 4; slot++) {
      float s;
      fp8_key_at(buf, layout, 4, 128, 0, slot, &s);
      CHECK(s == 1.0f);
    }
  }
}

/* FP8 shape i: the shapes of make_shape (ragged, skewed, page sizes 1 / 16 / 64, k below
 * and above the context, prefill and decode) with FP8 keys and dims of their own (130
 * and 200 span two of the reference's 128-value chunks, 30 leaves the inline scales
 * unaligned). */
static void make_fp8_shape(test_rng_t *rng, int i, shape_t *sh) {
  static const int32_t dims[] = {128, 64, 30, 200, 16, 130};
  make_shape(rng, i, sh);
  sh->key_format = INA_DSA_KEY_FP8;
  sh->D = dims[i % 6];
  if (sh->H == 64 && i % 3 != 0 && sh->D > 64) sh->D = 64; /* keep the brute force quick */
}

int main(void) {
  test_rng_t rng = {test_seed(NAME)};
  ina_threadpool_t *pool = NULL;
  CHECK_OK(ina_threadpool_create(2, &pool));
  test_errors();
  const int shapes = 42;
  for (int i = 0; i < shapes; i++) {
    shape_t sh;
    make_shape(&rng, i, &sh);
    run_shape(&rng, &sh, i % 2 ? pool : NULL, i);
  }
  test_fp8_quantize(&rng);
  test_fp8_layouts();
  const int fp8_shapes = 36;
  for (int i = 0; i < fp8_shapes; i++) {
    shape_t sh;
    make_fp8_shape(&rng, i, &sh);
    run_fp8_shape(&rng, &sh, i % 4 < 2 ? 0 : 1, i % 2 ? pool : NULL, i);
  }
  ina_threadpool_destroy(pool);
  return test_finish(NAME);
}
