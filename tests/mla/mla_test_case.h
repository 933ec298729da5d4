/* Random MLA attention problems for the GPU tests: ragged batches with a paged latent
 * cache (bf16 interleaved or in separate padded buffers, packed FP8, f32) on shuffled page
 * ids, bf16 queries, and the CPU reference's answer (mla/mla_ref.h).
 *
 * Cache slots no request may read (past kv_len in a last page, unused pages) hold NaN, so
 * a kernel that reads them fails loudly. Latent magnitudes vary per position over 2^-8 ..
 * 2^4, which moves FP8 block scales across the f16 range of the fast kernel.
 *
 * Header-only (static inline) so each test program takes what it uses. */
#ifndef INA_TESTS_MLA_MLA_TEST_CASE_H
#define INA_TESTS_MLA_MLA_TEST_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/threadpool.h"
#include "mla/mla.h"
#include "mla/mla_ref.h"
#include "tests/test_util.h"

#define MLA_BF16_NAN 0x7FC0u
#define MLA_FP8_NAN 0x7Fu

typedef enum {
  MLA_LAYOUT_PACKED = 0,   /* one buffer: bf16/f32 interleaved, or packed FP8 entries */
  MLA_LAYOUT_SEPARATE = 1, /* latent and rope in two buffers with padded strides */
} mla_layout_t;

typedef struct mla_shape {
  int32_t batch, max_batch, max_q_len, num_heads, kv_lora_rank, rope_dim, page_size;
  ina_mla_cache_format_t format;
  mla_layout_t layout;
  int padded_q;    /* queries and outputs with padded head and token strides */
  int odd_stride;  /* a q_nope token stride that is not even (forces the generic kernel) */
  float softmax_scale;
} mla_shape_t;

typedef struct mla_case {
  mla_shape_t s;
  int32_t tokens;
  int32_t *qo_indptr, *kv_len, *kv_indptr, *kv_indices;
  int32_t num_pages;
  /* queries, bf16 bits, with their strides (elements); f32 copies packed for the reference */
  uint16_t *q_nope, *q_pe;
  int64_t q_nope_ts, q_nope_hs, q_pe_ts, q_pe_hs, q_nope_elems, q_pe_elems;
  float *q_nope_f, *q_pe_f;
  int64_t out_ts, out_hs, out_elems;
  /* cache buffers (host); `cache` points into them */
  uint8_t *buf[2];
  size_t buf_bytes[2];
  ina_mla_cache_t cache;
  float *ref_out, *ref_lse; /* [tokens, heads, kv_lora_rank], [tokens, heads] */
} mla_case_t;

static inline void mla_case_free(mla_case_t *c) {
  free(c->qo_indptr);
  free(c->kv_len);
  free(c->kv_indptr);
  free(c->kv_indices);
  free(c->q_nope);
  free(c->q_pe);
  free(c->q_nope_f);
  free(c->q_pe_f);
  free(c->buf[0]);
  free(c->buf[1]);
  free(c->ref_out);
  free(c->ref_lse);
  memset(c, 0, sizeof *c);
}

static inline uint16_t mla_random_bf16(test_rng_t *rng, float scale) {
  return ina_f32_to_bf16(test_rng_normal(rng) * scale);
}

/* Writes the entry of one cache position: random latent (magnitude `mag`) and rope. */
static inline void mla_write_entry(mla_case_t *c, int64_t page, int64_t slot, float mag,
                                   test_rng_t *rng, float *tmp, uint8_t *q8) {
  const ina_mla_cache_t *k = &c->cache;
  const int32_t C = k->kv_lora_rank, R = k->rope_dim;
  char *lat = (char *)k->latent + page * k->latent_page_stride + slot * k->latent_token_stride;
  char *rope = (char *)k->rope + page * k->rope_page_stride + slot * k->rope_token_stride;
  for (int32_t i = 0; i < C; i++) tmp[i] = test_rng_normal(rng) * mag;
  switch (k->format) {
  case INA_MLA_CACHE_F32:
    memcpy(lat, tmp, sizeof(float) * (size_t)C);
    for (int32_t i = 0; i < R; i++) ((float *)rope)[i] = test_rng_normal(rng);
    return;
  case INA_MLA_CACHE_BF16:
    for (int32_t i = 0; i < C; i++) ((uint16_t *)lat)[i] = ina_f32_to_bf16(tmp[i]);
    break;
  case INA_MLA_CACHE_FP8: {
    float *scale = (float *)((char *)k->scale + page * k->scale_page_stride + slot * k->scale_token_stride);
    ina_fp8_quantize_blocks(tmp, 1, C, 1, 128, q8, scale);
    memcpy(lat, q8, (size_t)C);
    break;
  }
  }
  for (int32_t i = 0; i < R; i++) ((uint16_t *)rope)[i] = mla_random_bf16(rng, 1.0f);
}

/* Poisons one cache position (every byte of its entry reads as NaN). */
static inline void mla_poison_entry(mla_case_t *c, int64_t page, int64_t slot) {
  const ina_mla_cache_t *k = &c->cache;
  const int32_t C = k->kv_lora_rank, R = k->rope_dim;
  char *lat = (char *)k->latent + page * k->latent_page_stride + slot * k->latent_token_stride;
  char *rope = (char *)k->rope + page * k->rope_page_stride + slot * k->rope_token_stride;
  if (k->format == INA_MLA_CACHE_F32) {
    for (int32_t i = 0; i < C; i++) ((float *)lat)[i] = NAN;
    for (int32_t i = 0; i < R; i++) ((float *)rope)[i] = NAN;
    return;
  }
  if (k->format == INA_MLA_CACHE_FP8) {
    float *scale = (float *)((char *)k->scale + page * k->scale_page_stride + slot * k->scale_token_stride);
    memset(lat, MLA_FP8_NAN, (size_t)C);
    for (int32_t i = 0; i < C / 128; i++) scale[i] = NAN;
  } else {
    for (int32_t i = 0; i < C; i++) ((uint16_t *)lat)[i] = MLA_BF16_NAN;
  }
  for (int32_t i = 0; i < R; i++) ((uint16_t *)rope)[i] = MLA_BF16_NAN;
}

/* Lays out the cache for num_pages pages. Returns 0 on allocation failure. */
static inline int mla_alloc_cache(mla_case_t *c) {
  const mla_shape_t *s = &c->s;
  const int64_t P = c->num_pages, ps = s->page_size, C = s->kv_lora_rank, R = s->rope_dim;
  if (s->format == INA_MLA_CACHE_FP8) {
    c->buf_bytes[0] = (size_t)(P * ps * ina_mla_cache_fp8_entry_bytes((int32_t)C, (int32_t)R));
    c->buf[0] = malloc(c->buf_bytes[0]);
    if (!c->buf[0]) return 0;
    c->cache = ina_mla_cache_fp8_packed(c->buf[0], s->page_size, s->kv_lora_rank, s->rope_dim);
    return 1;
  }
  const int64_t elem = s->format == INA_MLA_CACHE_F32 ? 4 : 2;
  if (s->layout == MLA_LAYOUT_PACKED) {
    c->buf_bytes[0] = (size_t)(P * ps * (C + R) * elem);
    c->buf[0] = malloc(c->buf_bytes[0]);
    if (!c->buf[0]) return 0;
    c->cache = ina_mla_cache_interleaved(s->format, c->buf[0], s->page_size, s->kv_lora_rank, s->rope_dim);
    return 1;
  }
  /* Separate buffers: each token row padded by 16 bytes, each page by 32 more. */
  const int64_t lat_tok = C * elem + 16, rope_tok = R * elem + 16;
  const int64_t lat_page = lat_tok * ps + 32, rope_page = rope_tok * ps + 32;
  c->buf_bytes[0] = (size_t)(P * lat_page);
  c->buf_bytes[1] = (size_t)(P * rope_page);
  c->buf[0] = malloc(c->buf_bytes[0]);
  c->buf[1] = malloc(c->buf_bytes[1]);
  if (!c->buf[0] || !c->buf[1]) return 0;
  memset(c->buf[0], 0xFF, c->buf_bytes[0]); /* padding bytes: NaN patterns, never read */
  memset(c->buf[1], 0xFF, c->buf_bytes[1]);
  ina_mla_cache_t k = {s->format, s->page_size, s->kv_lora_rank, s->rope_dim,
                       c->buf[0], lat_page, lat_tok, c->buf[1], rope_page, rope_tok, NULL, 0, 0};
  c->cache = k;
  return 1;
}

/* Builds a random problem with the given lengths (q_lens[b] <= kv_lens[b]) and, when
 * `solve`, solves it with the reference (else ref_out / ref_lse are left unset: a case
 * that only sizes buffers). Returns 0 on failure (allocation, reference error). */
static inline int mla_case_build(mla_case_t *c, const mla_shape_t *s, const int32_t *q_lens,
                                 const int32_t *kv_lens, test_rng_t *rng, ina_threadpool_t *pool,
                                 int solve) {
  memset(c, 0, sizeof *c);
  c->s = *s;
  const int32_t B = s->batch, H = s->num_heads, C = s->kv_lora_rank, R = s->rope_dim, ps = s->page_size;
  c->qo_indptr = malloc(sizeof(int32_t) * (size_t)(B + 1));
  c->kv_len = malloc(sizeof(int32_t) * (size_t)(B > 0 ? B : 1));
  c->kv_indptr = malloc(sizeof(int32_t) * (size_t)(B + 1));
  if (!c->qo_indptr || !c->kv_len || !c->kv_indptr) return 0;
  c->qo_indptr[0] = 0;
  c->kv_indptr[0] = 0;
  for (int32_t b = 0; b < B; b++) {
    c->qo_indptr[b + 1] = c->qo_indptr[b] + q_lens[b];
    c->kv_len[b] = kv_lens[b];
    c->kv_indptr[b + 1] = c->kv_indptr[b] + (kv_lens[b] + ps - 1) / ps;
  }
  c->tokens = c->qo_indptr[B];
  const int32_t used_pages = c->kv_indptr[B];
  c->num_pages = used_pages + 3; /* a few pages nobody owns */

  /* Shuffled page ids: each request's pages lie scattered over the pool. */
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)c->num_pages);
  c->kv_indices = malloc(sizeof(int32_t) * (size_t)(used_pages > 0 ? used_pages : 1));
  if (!perm || !c->kv_indices) {
    free(perm);
    return 0;
  }
  for (int32_t i = 0; i < c->num_pages; i++) perm[i] = i;
  for (int32_t i = c->num_pages - 1; i > 0; i--) {
    const int32_t j = (int32_t)test_rng_int(rng, 0, i), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  memcpy(c->kv_indices, perm, sizeof(int32_t) * (size_t)used_pages);
  free(perm);

  if (!mla_alloc_cache(c)) return 0;
  float *tmp = malloc(sizeof(float) * (size_t)C);
  uint8_t *q8 = malloc((size_t)C);
  if (!tmp || !q8) {
    free(tmp);
    free(q8);
    return 0;
  }
  /* Poison everything, then write the positions requests own. */
  for (int64_t pg = 0; pg < c->num_pages; pg++)
    for (int64_t sl = 0; sl < ps; sl++) mla_poison_entry(c, pg, sl);
  for (int32_t b = 0; b < B; b++) {
    for (int32_t t = 0; t < kv_lens[b]; t++) {
      const float mag = ldexpf(1.0f, (int)test_rng_int(rng, -8, 4));
      mla_write_entry(c, c->kv_indices[c->kv_indptr[b] + t / ps], t % ps, mag, rng, tmp, q8);
    }
  }
  free(tmp);
  free(q8);

  /* Queries (and outputs) in [tokens, heads, dim] with optional padding. */
  const int64_t pad = s->padded_q ? 32 : 0;
  c->q_nope_hs = C + pad;
  c->q_nope_ts = H * c->q_nope_hs + (s->odd_stride ? 1 : 2 * pad);
  c->q_pe_hs = R + pad;
  c->q_pe_ts = H * c->q_pe_hs + 2 * pad;
  c->out_hs = C + pad;
  c->out_ts = H * c->out_hs + 2 * pad;
  c->q_nope_elems = (int64_t)(c->tokens > 0 ? c->tokens : 1) * c->q_nope_ts;
  c->q_pe_elems = (int64_t)(c->tokens > 0 ? c->tokens : 1) * c->q_pe_ts + 1;
  c->out_elems = (int64_t)(c->tokens > 0 ? c->tokens : 1) * c->out_ts;
  c->q_nope = malloc(sizeof(uint16_t) * (size_t)c->q_nope_elems);
  c->q_pe = malloc(sizeof(uint16_t) * (size_t)c->q_pe_elems);
  c->q_nope_f = malloc(sizeof(float) * (size_t)(c->tokens + 1) * (size_t)H * (size_t)C);
  c->q_pe_f = malloc(sizeof(float) * ((size_t)(c->tokens + 1) * (size_t)H * (size_t)R + 1));
  c->ref_out = malloc(sizeof(float) * (size_t)(c->tokens + 1) * (size_t)H * (size_t)C);
  c->ref_lse = malloc(sizeof(float) * (size_t)(c->tokens + 1) * (size_t)H);
  if (!c->q_nope || !c->q_pe || !c->q_nope_f || !c->q_pe_f || !c->ref_out || !c->ref_lse) return 0;
  for (int64_t i = 0; i < c->q_nope_elems; i++) c->q_nope[i] = MLA_BF16_NAN;
  for (int64_t i = 0; i < c->q_pe_elems; i++) c->q_pe[i] = MLA_BF16_NAN;
  for (int32_t t = 0; t < c->tokens; t++) {
    for (int32_t h = 0; h < H; h++) {
      for (int32_t d = 0; d < C; d++) {
        const uint16_t v = mla_random_bf16(rng, 1.0f);
        c->q_nope[t * c->q_nope_ts + h * c->q_nope_hs + d] = v;
        c->q_nope_f[((int64_t)t * H + h) * C + d] = ina_bf16_to_f32(v);
      }
      for (int32_t d = 0; d < R; d++) {
        const uint16_t v = mla_random_bf16(rng, 1.0f);
        c->q_pe[t * c->q_pe_ts + h * c->q_pe_hs + d] = v;
        c->q_pe_f[((int64_t)t * H + h) * R + d] = ina_bf16_to_f32(v);
      }
    }
  }

  if (!solve) return 1;
  ina_mla_ref_params_t rp = {B, H, C, R, s->softmax_scale, c->qo_indptr, c->kv_len, c->kv_indptr,
                             c->kv_indices, c->q_nope_f, c->q_pe_f, c->cache, c->ref_out, c->ref_lse};
  return ina_mla_attention_ref(&rp, pool) == INA_OK;
}

/* Compares a run's outputs (bf16 out with the case's strides, lse [tokens, heads]) with
 * the reference: relative L2 of out <= 1e-2, of lse <= lse_bound, no NaN anywhere.
 * Returns 1 when it passes; prints the errors either way when verbose. */
static inline int mla_case_compare(const mla_case_t *c, const uint16_t *out, const float *lse,
                                   double lse_bound, const char *what, double *out_err,
                                   double *lse_err) {
  const int32_t H = c->s.num_heads, C = c->s.kv_lora_rank;
  const size_t n = (size_t)c->tokens * (size_t)H * (size_t)C;
  float *got = malloc(sizeof(float) * (n > 0 ? n : 1));
  if (!got) return 0;
  for (int32_t t = 0; t < c->tokens; t++)
    for (int32_t h = 0; h < H; h++)
      for (int32_t d = 0; d < C; d++)
        got[((size_t)t * H + h) * C + d] = ina_bf16_to_f32(out[t * c->out_ts + h * c->out_hs + d]);
  *out_err = n > 0 ? test_rel_l2(got, c->ref_out, n) : 0.0;
  *lse_err = n > 0 ? test_rel_l2(lse, c->ref_lse, (size_t)c->tokens * (size_t)H) : 0.0;
  free(got);
  const int ok = *out_err <= 1e-2 && *lse_err <= lse_bound;
  if (!ok)
    fprintf(stderr, "%s: out rel L2 %.3g (bound 1e-2), lse rel L2 %.3g (bound %.1g)\n", what,
            *out_err, *lse_err, lse_bound);
  return ok;
}

#endif
