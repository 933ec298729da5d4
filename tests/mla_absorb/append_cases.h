/* Test cases of the MLA cache append (mla/mla_append.h) shared by the reference's CPU
 * test and the kernel's GPU test: cache layouts, random inputs, destinations.
 * Include after tests/test_util.h. */
#ifndef INA_TESTS_MLA_ABSORB_APPEND_CASES_H
#define INA_TESTS_MLA_ABSORB_APPEND_CASES_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "mla/mla_append.h"
#include "mla/mla_cache.h"

#define APPEND_POISON 0xFF /* e4m3 -NaN, bf16 and f32 NaN when repeated */

typedef struct append_case {
  ina_mla_cache_format_t format;
  int32_t C, R, page_size, num_pages, num_tokens;
  int split_layout; /* 0: one interleaved/packed buffer; 1: separate padded parts */
  ina_mla_rope_layout_t rope_layout;
  ina_dtype_t positions_dtype;
  int64_t kv_stride; /* elements, >= C + R */
} append_case_t;

/* Host inputs of one case. */
typedef struct append_inputs {
  uint16_t *kv;          /* [num_tokens, kv_stride] bf16 */
  uint16_t *norm_weight; /* [C] */
  float *inv_freq;       /* [R / 2] */
  float attention_factor;
  int64_t *positions64;
  int32_t *positions32;
  int32_t *page_ids, *slots;
  int32_t skipped; /* tokens with a negative page id */
} append_inputs_t;

static inline void append_inputs_free(append_inputs_t *in) {
  free(in->kv);
  free(in->norm_weight);
  free(in->inv_freq);
  free(in->positions64);
  free(in->positions32);
  free(in->page_ids);
  free(in->slots);
  memset(in, 0, sizeof *in);
}

static inline const void *append_positions(const append_case_t *c, const append_inputs_t *in) {
  return c->positions_dtype == INA_DTYPE_I64 ? (const void *)in->positions64
                                             : (const void *)in->positions32;
}

/* The cache of a case over a buffer at `base` (NULL to size it); returns the bytes it
 * spans. Split layouts pad tokens and pages so strides differ from the packed ones. */
static inline int64_t append_cache_layout(const append_case_t *c, void *base,
                                          ina_mla_cache_t *out) {
  const int64_t pages = c->num_pages, P = c->page_size, C = c->C, R = c->R;
  char *b = (char *)base;
  ina_mla_cache_t cache;
  if (!c->split_layout) {
    if (c->format == INA_MLA_CACHE_FP8) {
      cache = ina_mla_cache_fp8_packed(b, c->page_size, c->C, c->R);
    } else {
      cache = ina_mla_cache_interleaved(c->format, b, c->page_size, c->C, c->R);
    }
    *out = cache;
    return cache.latent_page_stride * pages;
  }
  const int64_t latent_elem = c->format == INA_MLA_CACHE_FP8   ? 1
                              : c->format == INA_MLA_CACHE_F32 ? 4
                                                               : 2;
  const int64_t rope_elem = c->format == INA_MLA_CACHE_F32 ? 4 : 2;
  const int64_t latent_token = C * latent_elem + 16, latent_page = latent_token * P + 64;
  const int64_t rope_token = R * rope_elem + 8, rope_page = rope_token * P + 32;
  const int64_t scale_token = c->format == INA_MLA_CACHE_FP8 ? (C / 128) * 4 + 4 : 0;
  const int64_t scale_page = scale_token * P + 16;
  const int64_t rope_at = latent_page * pages + 128;
  const int64_t scale_at = rope_at + rope_page * pages + 128;
  memset(&cache, 0, sizeof cache);
  cache.format = c->format;
  cache.page_size = c->page_size;
  cache.kv_lora_rank = c->C;
  cache.rope_dim = c->R;
  cache.latent = b;
  cache.latent_page_stride = latent_page;
  cache.latent_token_stride = latent_token;
  cache.rope = b + rope_at;
  cache.rope_page_stride = rope_page;
  cache.rope_token_stride = rope_token;
  if (c->format == INA_MLA_CACHE_FP8) {
    cache.scale = b + scale_at;
    cache.scale_page_stride = scale_page;
    cache.scale_token_stride = scale_token;
  }
  *out = cache;
  return scale_at + scale_page * pages + 128;
}

/* Random bf16 input rows: per-token magnitudes 2^-8 .. 2^8, with a few fixed oddities:
 * token 0 has an all-zero latent, token 1 (FP8 caches) one all-zero 128-value block. */
static inline void append_fill_kv(const append_case_t *c, uint16_t *kv, test_rng_t *rng) {
  for (int32_t t = 0; t < c->num_tokens; t++) {
    const float magnitude = ldexpf(1.0f, (int)test_rng_int(rng, -8, 8));
    uint16_t *row = kv + (int64_t)t * c->kv_stride;
    for (int64_t i = 0; i < c->kv_stride; i++)
      row[i] = ina_f32_to_bf16(test_rng_normal(rng) * magnitude);
    if (t == 0 && c->num_tokens > 2)
      for (int32_t i = 0; i < c->C; i++) row[i] = 0;
    if (t == 1 && c->C >= 256) {
      const int32_t block = (int32_t)test_rng_int(rng, 0, c->C / 128 - 1);
      for (int32_t i = 0; i < 128; i++) row[block * 128 + i] = (i & 1) ? 0x8000u : 0u;
    }
  }
}

/* Fills the inputs of case c: inputs, rope frequencies (theta 10000, sometimes a YaRN-like
 * attention factor), positions up to 160k, and distinct shuffled destinations with about
 * one token in ten skipped. Returns 0 on allocation failure. */
static inline int append_make_inputs(const append_case_t *c, append_inputs_t *in, test_rng_t *rng) {
  const int32_t T = c->num_tokens, half = c->R / 2;
  const int64_t capacity = (int64_t)c->num_pages * c->page_size;
  int64_t *order = malloc((size_t)(capacity > 0 ? capacity : 1) * sizeof *order);
  memset(in, 0, sizeof *in);
  in->kv = malloc((size_t)T * (size_t)c->kv_stride * 2 + 2);
  in->norm_weight = malloc((size_t)c->C * 2);
  in->inv_freq = malloc((size_t)half * sizeof(float));
  in->positions64 = malloc((size_t)T * 8 + 8);
  in->positions32 = malloc((size_t)T * 4 + 4);
  in->page_ids = malloc((size_t)T * 4 + 4);
  in->slots = malloc((size_t)T * 4 + 4);
  if (!order || !in->kv || !in->norm_weight || !in->inv_freq || !in->positions64 ||
      !in->positions32 || !in->page_ids || !in->slots) {
    free(order);
    append_inputs_free(in);
    return 0;
  }
  append_fill_kv(c, in->kv, rng);
  for (int32_t i = 0; i < c->C; i++) {
    const float w = 1.0f + 0.5f * test_rng_normal(rng);
    in->norm_weight[i] = ina_f32_to_bf16(test_rng_int(rng, 0, 63) == 0 ? 0.0f : w);
  }
  for (int32_t i = 0; i < half; i++) in->inv_freq[i] = (float)pow(10000.0, -2.0 * i / c->R);
  in->attention_factor =
      test_rng_int(rng, 0, 1) ? 1.0f : 1.0f + (float)test_rng_uniform(rng) * 0.3f;
  for (int32_t t = 0; t < T; t++) {
    int64_t pos = test_rng_int(rng, 0, 163840);
    if (t == 0) pos = 0;
    if (t == 1) pos = 163839;
    in->positions64[t] = pos;
    in->positions32[t] = (int32_t)pos;
  }
  /* Distinct destinations: the first T of a shuffled list of all slots. */
  for (int64_t i = 0; i < capacity; i++) order[i] = i;
  for (int64_t i = capacity - 1; i > 0; i--) {
    const int64_t j = test_rng_int(rng, 0, i), tmp = order[i];
    order[i] = order[j];
    order[j] = tmp;
  }
  for (int32_t t = 0; t < T; t++) {
    in->page_ids[t] = (int32_t)(order[t] / c->page_size);
    in->slots[t] = (int32_t)(order[t] % c->page_size);
    if (T > 1 && test_rng_int(rng, 0, 9) == 0) {
      /* Skipped: the slot is garbage on purpose, a skipped token must not look at it. */
      in->page_ids[t] = -1 - (int32_t)test_rng_int(rng, 0, 5);
      in->slots[t] = (int32_t)test_rng_int(rng, -1000, 1000);
      in->skipped++;
    }
  }
  free(order);
  return 1;
}

/* The append parameters of case c over `inputs` (host or device copies) and `cache`. */
static inline ina_mla_append_params_t append_params(const append_case_t *c, const uint16_t *kv,
                                                    const uint16_t *norm_weight,
                                                    const float *inv_freq, float attention_factor,
                                                    const void *positions, const int32_t *page_ids,
                                                    const int32_t *slots, ina_mla_cache_t cache) {
  ina_mla_append_params_t p = INA_MLA_APPEND_PARAMS_INIT;
  p.num_tokens = c->num_tokens;
  p.kv = kv;
  p.kv_stride = c->kv_stride;
  p.norm_weight = norm_weight;
  p.eps = 1e-6f;
  p.inv_freq = inv_freq;
  p.attention_factor = attention_factor;
  p.rope_layout = c->rope_layout;
  p.positions = positions;
  p.positions_dtype = c->positions_dtype;
  p.page_ids = page_ids;
  p.slots = slots;
  p.cache = cache;
  return p;
}

/* Byte ranges of one token's entry: latent, rope, scale (length 0 when absent). */
typedef struct entry_parts {
  int64_t latent_at, latent_bytes, rope_at, rope_bytes, scale_at, scale_bytes;
} entry_parts_t;

static inline entry_parts_t append_entry_parts(const ina_mla_cache_t *cache, const void *base,
                                               int64_t page, int64_t slot) {
  const char *b = (const char *)base;
  const int64_t C = cache->kv_lora_rank, R = cache->rope_dim;
  const int64_t elem = cache->format == INA_MLA_CACHE_F32 ? 4 : 2;
  entry_parts_t e;
  e.latent_at = (const char *)cache->latent - b + page * cache->latent_page_stride +
                slot * cache->latent_token_stride;
  e.latent_bytes = C * (cache->format == INA_MLA_CACHE_FP8 ? 1 : elem);
  e.rope_at = (const char *)cache->rope - b + page * cache->rope_page_stride +
              slot * cache->rope_token_stride;
  e.rope_bytes = R * elem;
  e.scale_at = 0;
  e.scale_bytes = 0;
  if (cache->format == INA_MLA_CACHE_FP8) {
    e.scale_at = (const char *)cache->scale - b + page * cache->scale_page_stride +
                 slot * cache->scale_token_stride;
    e.scale_bytes = (C / 128) * 4;
  }
  return e;
}

/* Marks the bytes of every written entry in `mask` (one byte per cache byte). */
static inline void append_written_mask(const append_case_t *c, const ina_mla_cache_t *cache,
                                       const void *base, const append_inputs_t *in, uint8_t *mask,
                                       int64_t bytes) {
  memset(mask, 0, (size_t)bytes);
  for (int32_t t = 0; t < c->num_tokens; t++) {
    if (in->page_ids[t] < 0) continue;
    const entry_parts_t e = append_entry_parts(cache, base, in->page_ids[t], in->slots[t]);
    memset(mask + e.latent_at, 1, (size_t)e.latent_bytes);
    memset(mask + e.rope_at, 1, (size_t)e.rope_bytes);
    if (e.scale_bytes) memset(mask + e.scale_at, 1, (size_t)e.scale_bytes);
  }
}

/* Bytes outside the mask that lost their poison. */
static inline int64_t append_count_unpoisoned(const uint8_t *cache_bytes, const uint8_t *mask,
                                              int64_t bytes) {
  int64_t bad = 0;
  for (int64_t i = 0; i < bytes; i++) bad += !mask[i] && cache_bytes[i] != APPEND_POISON;
  return bad;
}

#endif
