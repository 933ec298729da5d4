/* The CPU reference of the append kernel (mla/mla_append.h): RMSNorm, rope and the cache
 * write, one token at a time, in the arithmetic the header spells out. */
#define INA_LOG_SUBSYS "mla"
#include "mla/mla_append.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "mla/mla_append_args.h"

/* y = w * (x * inv), inv = 1 / sqrt(float(sum(x^2) / n) + eps). Each square of a value
 * widened from bf16 is exact in double and so is their sum for any realistic row, which
 * makes the result independent of the order the kernel sums in. */
static void rms_normalize(const float *x, const uint16_t *weight, int32_t n, float eps, float *y) {
  double sum_squares = 0;
  for (int32_t i = 0; i < n; i++) sum_squares += (double)x[i] * x[i];
  const float inv = 1.0f / sqrtf((float)(sum_squares / n) + eps);
  for (int32_t i = 0; i < n; i++) y[i] = ina_bf16_to_f32(weight[i]) * (x[i] * inv);
}

/* Rotates x (R values) in place for position `pos`; the pairs follow `layout`. */
static void rotate(float *x, int32_t R, int64_t pos, const float *inv_freq, float attention_factor,
                   ina_mla_rope_layout_t layout) {
  const int32_t half = R / 2;
  for (int32_t i = 0; i < half; i++) {
    const float angle = (float)pos * inv_freq[i];
    const float c = (float)cos((double)angle) * attention_factor;
    const float s = (float)sin((double)angle) * attention_factor;
    float *a = layout == INA_MLA_ROPE_PAIRS ? &x[2 * i] : &x[i];
    float *b = layout == INA_MLA_ROPE_PAIRS ? &x[2 * i + 1] : &x[i + half];
    const float xa = *a, xb = *b;
    *a = xa * c - xb * s;
    *b = xb * c + xa * s;
  }
}

static int64_t position_of(const ina_mla_append_params_t *p, int32_t token) {
  return p->positions_dtype == INA_DTYPE_I64 ? ((const int64_t *)p->positions)[token]
                                             : ((const int32_t *)p->positions)[token];
}

/* Writes the normalized latent (C values) and rope'd key (R values) of `row` into the
 * entry of (page, slot). */
static ina_status_t write_entry(const ina_mla_cache_t *c, int64_t page, int64_t slot,
                                const float *row) {
  ina_status_t st = INA_OK;
  char *latent = (char *)c->latent + page * c->latent_page_stride + slot * c->latent_token_stride;
  char *rope = (char *)c->rope + page * c->rope_page_stride + slot * c->rope_token_stride;
  const int32_t C = c->kv_lora_rank, R = c->rope_dim;
  switch (c->format) {
  case INA_MLA_CACHE_F32:
    memcpy(latent, row, (size_t)C * sizeof(float));
    memcpy(rope, row + C, (size_t)R * sizeof(float));
    break;
  case INA_MLA_CACHE_BF16:
    INA_CHECK(ina_from_f32(row, latent, INA_DTYPE_BF16, (size_t)C));
    INA_CHECK(ina_from_f32(row + C, rope, INA_DTYPE_BF16, (size_t)R));
    break;
  case INA_MLA_CACHE_FP8: {
    float *scale = (float *)((char *)c->scale + page * c->scale_page_stride +
                             slot * c->scale_token_stride);
    INA_CHECK(ina_fp8_quantize_blocks(row, 1, C, 1, 128, (uint8_t *)latent, scale));
    INA_CHECK(ina_from_f32(row + C, rope, INA_DTYPE_BF16, (size_t)R));
    break;
  }
  }
fail:
  return st;
}

ina_status_t ina_mla_append_ref(const ina_mla_append_params_t *p) {
  ina_status_t st = INA_OK;
  float *row = NULL, *x = NULL;
  INA_CHECK(ina_mla_append_check_args(p, "ina_mla_append_ref"));
  if (p->num_tokens == 0) return INA_OK;
  const ina_mla_cache_t *c = &p->cache;
  const int32_t C = c->kv_lora_rank, R = c->rope_dim;
  row = malloc((size_t)(C + R) * sizeof(float));
  x = malloc((size_t)(C + R) * sizeof(float));
  INA_CHECK_ALLOC(row);
  INA_CHECK_ALLOC(x);
  for (int32_t t = 0; t < p->num_tokens; t++) {
    const int32_t page = p->page_ids[t], slot = p->slots[t];
    if (page < 0) continue;
    INA_REQUIRE(slot >= 0 && slot < c->page_size, INA_ERR_INVALID_ARGUMENT,
                "ina_mla_append_ref: token %d: slot %d outside a page of %d", t, slot,
                c->page_size);
    ina_to_f32(p->kv + (int64_t)t * p->kv_stride, INA_DTYPE_BF16, x, (size_t)(C + R));
    rms_normalize(x, p->norm_weight, C, p->eps, row);
    memcpy(row + C, x + C, (size_t)R * sizeof(float));
    rotate(row + C, R, position_of(p, t), p->inv_freq, p->attention_factor, p->rope_layout);
    INA_CHECK(write_entry(c, page, slot, row));
  }
fail:
  free(row);
  free(x);
  return st;
}
