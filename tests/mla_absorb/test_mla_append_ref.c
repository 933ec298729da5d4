/* The CPU reference of the MLA cache append (ina_mla_append_ref) against the textbook
 * math in double: y = w * x / sqrt(mean(x^2) + eps) and a plain rotation of each rope
 * pair, the angle float(pos) * inv_freq in float32 as HF computes it. Checked in every
 * cache format (F32 to fp32 accuracy, BF16 to its rounding, FP8 to e4m3 rounding with
 * the scale amax / 448), on packed and split layouts, both rope layouts, i32 and i64
 * positions; untouched bytes and skipped tokens must keep their poison; bad arguments
 * must be refused. Also checks that the GPU entry points refuse to run where there is
 * no device. */

#include "tests/test_util.h"

#include "core/cuda.h"
#include "core/log.h"
#include "mla/mla_absorb.h"
#include "tests/mla_absorb/append_cases.h"

/* The expected entry of token t in double: latent (C values) then rope (R values). */
static void expected_entry(const append_case_t *c, const append_inputs_t *in, int32_t t,
                           double *out) {
  const uint16_t *row = in->kv + (int64_t)t * c->kv_stride;
  double mean_square = 0;
  for (int32_t i = 0; i < c->C; i++) {
    const double x = ina_bf16_to_f32(row[i]);
    mean_square += x * x;
  }
  mean_square /= c->C;
  for (int32_t i = 0; i < c->C; i++)
    out[i] =
        ina_bf16_to_f32(in->norm_weight[i]) * ina_bf16_to_f32(row[i]) / sqrt(mean_square + 1e-6);
  const int32_t half = c->R / 2;
  const int64_t pos = in->positions64[t];
  for (int32_t i = 0; i < half; i++) {
    const int32_t ia = c->rope_layout == INA_MLA_ROPE_PAIRS ? 2 * i : i;
    const int32_t ib = c->rope_layout == INA_MLA_ROPE_PAIRS ? 2 * i + 1 : i + half;
    const double angle = (float)pos * in->inv_freq[i];
    const double a = ina_bf16_to_f32(row[c->C + ia]), b = ina_bf16_to_f32(row[c->C + ib]);
    out[c->C + ia] = (a * cos(angle) - b * sin(angle)) * in->attention_factor;
    out[c->C + ib] = (b * cos(angle) + a * sin(angle)) * in->attention_factor;
  }
}

/* |got - want| within `rel` of the larger of |want| and `floor`. */
static int close_to(double got, double want, double rel, double floor) {
  const double scale = fabs(want) > floor ? fabs(want) : floor;
  return fabs(got - want) <= rel * scale;
}

/* Checks the entry written for token t against the expected values. Returns the number
 * of bad values. */
static int64_t check_entry(const append_case_t *c, const ina_mla_cache_t *cache,
                           const uint8_t *base, const append_inputs_t *in, int32_t t,
                           const double *want) {
  const entry_parts_t e = append_entry_parts(cache, base, in->page_ids[t], in->slots[t]);
  const int32_t C = c->C, R = c->R;
  int64_t bad = 0;
  double row_max = 0, rope_max = 0;
  for (int32_t i = 0; i < C; i++) row_max = fmax(row_max, fabs(want[i]));
  for (int32_t i = 0; i < R; i++) rope_max = fmax(rope_max, fabs(want[C + i]));
  for (int32_t i = 0; i < C + R; i++) {
    const int latent = i < C;
    const uint8_t *part = base + (latent ? e.latent_at : e.rope_at);
    const int32_t k = latent ? i : i - C;
    /* fp32 results carry a few roundings of 2^-24 of their operands: relative to the
     * value for the latent, relative to the row's largest for the rope, whose rotation
     * can cancel. */
    const double floor = latent ? row_max * 1e-3 : rope_max * 0.5;
    int ok = 0;
    double got = 0;
    if (c->format == INA_MLA_CACHE_F32) {
      got = ((const float *)part)[k];
      ok = close_to(got, want[i], 1e-6, floor);
    } else if (c->format == INA_MLA_CACHE_BF16 || !latent) {
      /* bf16 rounds to 2^-8 of the value; a small absolute floor covers the fp32 part */
      got = ina_bf16_to_f32(((const uint16_t *)part)[k]);
      ok = close_to(got, want[i], 0x1p-8 * 1.001, (latent ? row_max : rope_max) * 1e-3);
    } else {
      const float scale = ((const float *)(base + e.scale_at))[k / 128];
      double amax = 0;
      for (int32_t j = k / 128 * 128; j < k / 128 * 128 + 128; j++)
        amax = fmax(amax, fabs(want[j]));
      const double want_scale = amax == 0 ? 1.0 : amax / 448.0;
      got = ina_fp8_e4m3_to_f32(part[k]) * (double)scale;
      /* e4m3 keeps 3 fraction bits (half an ulp: 2^-4 relative); its subnormals step by
       * 2^-9, so small values are off by up to 2^-10 of the scale. */
      ok = close_to(scale, want_scale, 1e-6, 0) &&
           fabs(got - want[i]) <= fmax(0x1p-4 * fabs(want[i]), 0x1p-10 * want_scale) * 1.001;
    }
    if (!ok && bad++ < 4)
      fprintf(stderr, "  token %d value %d (%s): got %.9g, expected %.9g\n", t, i,
              latent ? "latent" : "rope", got, want[i]);
  }
  return bad;
}

static void run_case(const append_case_t *c, test_rng_t *rng) {
  append_inputs_t in;
  ina_mla_cache_t cache;
  const int64_t bytes = append_cache_layout(c, NULL, &cache);
  uint8_t *buf = malloc((size_t)bytes), *mask = malloc((size_t)bytes);
  double *want = malloc((size_t)(c->C + c->R) * sizeof *want);
  char what[160];
  snprintf(what, sizeof what, "format %d C %d R %d page %d tokens %d %s %s %s", (int)c->format,
           c->C, c->R, c->page_size, c->num_tokens, c->split_layout ? "split" : "packed",
           c->rope_layout == INA_MLA_ROPE_PAIRS ? "pairs" : "halves",
           ina_dtype_name(c->positions_dtype));
  CHECK(buf && mask && want);
  if (!buf || !mask || !want || !append_make_inputs(c, &in, rng)) {
    CHECKF(0, "%s: out of memory", what);
    free(buf);
    free(mask);
    free(want);
    return;
  }
  append_cache_layout(c, buf, &cache);
  memset(buf, APPEND_POISON, (size_t)bytes);
  const ina_mla_append_params_t p =
      append_params(c, in.kv, in.norm_weight, in.inv_freq, in.attention_factor,
                    append_positions(c, &in), in.page_ids, in.slots, cache);
  CHECK_OK(ina_mla_append_ref(&p));

  int64_t bad = 0;
  for (int32_t t = 0; t < c->num_tokens; t++) {
    if (in.page_ids[t] < 0) continue;
    expected_entry(c, &in, t, want);
    bad += check_entry(c, &cache, buf, &in, t, want);
  }
  CHECKF(bad == 0, "%s: %lld values off", what, (long long)bad);
  append_written_mask(c, &cache, buf, &in, mask, bytes);
  const int64_t unpoisoned = append_count_unpoisoned(buf, mask, bytes);
  CHECKF(unpoisoned == 0, "%s: %lld bytes outside the written entries changed", what,
         (long long)unpoisoned);
  append_inputs_free(&in);
  free(buf);
  free(mask);
  free(want);
}

static void test_cases(test_rng_t *rng) {
  static const int32_t dims[][2] = {{512, 64}, {64, 16}, {144, 8}, {256, 32}, {128, 2}};
  static const int32_t page_sizes[] = {1, 16, 64};
  for (int i = 0; i < 30; i++) {
    append_case_t c;
    memset(&c, 0, sizeof c);
    c.format = (ina_mla_cache_format_t)(i % 3);
    const int d = (int)test_rng_int(rng, 0, 4);
    c.C = dims[d][0];
    c.R = dims[d][1];
    if (c.format == INA_MLA_CACHE_FP8 && c.C % 128 != 0)
      c.C = 128 * (int32_t)test_rng_int(rng, 1, 4);
    c.page_size = page_sizes[test_rng_int(rng, 0, 2)];
    c.num_tokens = (int32_t)test_rng_int(rng, 1, 70);
    c.num_pages = (c.num_tokens + c.page_size - 1) / c.page_size + (int32_t)test_rng_int(rng, 0, 3);
    c.split_layout = (int)test_rng_int(rng, 0, 1);
    c.rope_layout = test_rng_int(rng, 0, 1) ? INA_MLA_ROPE_HALVES : INA_MLA_ROPE_PAIRS;
    c.positions_dtype = test_rng_int(rng, 0, 1) ? INA_DTYPE_I64 : INA_DTYPE_I32;
    c.kv_stride = c.C + c.R + (test_rng_int(rng, 0, 1) ? 0 : test_rng_int(rng, 1, 40));
    run_case(&c, rng);
  }
}

/* Parameters the reference must refuse, and the edge it must accept. */
static void test_arguments(test_rng_t *rng) {
  const append_case_t c = {INA_MLA_CACHE_FP8,  256,           16, 4, 2, 3, 0,
                           INA_MLA_ROPE_PAIRS, INA_DTYPE_I64, 272};
  append_inputs_t in;
  ina_mla_cache_t cache;
  const int64_t bytes = append_cache_layout(&c, NULL, &cache);
  uint8_t *buf = malloc((size_t)bytes);
  CHECK(buf != NULL);
  if (!buf || !append_make_inputs(&c, &in, rng)) {
    free(buf);
    return;
  }
  append_cache_layout(&c, buf, &cache);
  for (int32_t t = 0; t < c.num_tokens; t++) { /* none skipped */
    in.page_ids[t] = t / c.page_size;
    in.slots[t] = t % c.page_size;
  }
  const ina_mla_append_params_t good = append_params(&c, in.kv, in.norm_weight, in.inv_freq, 1.0f,
                                                     in.positions64, in.page_ids, in.slots, cache);
  ina_mla_append_params_t p;
  CHECK_OK(ina_mla_append_ref(&good));
  ina_log_set_quiet_errors(1);
  CHECK(ina_mla_append_ref(NULL) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.struct_size = 8;
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.num_tokens = -1;
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.kv_stride = c.C + c.R - 1;
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.cache.rope_dim = 15;
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.cache.kv_lora_rank = 192; /* FP8 needs whole 128-value blocks */
  CHECK(ina_mla_append_ref(&p) == INA_ERR_UNSUPPORTED);
  p = good, p.positions_dtype = INA_DTYPE_F32;
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.rope_layout = (ina_mla_rope_layout_t)7;
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.cache.scale = NULL;
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.cache.scale_token_stride += 2; /* fp32 scales off their alignment */
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  p = good, p.kv = NULL;
  CHECK(ina_mla_append_ref(&p) == INA_ERR_INVALID_ARGUMENT);
  in.slots[1] = c.page_size; /* one past the page */
  CHECK(ina_mla_append_ref(&good) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "token 1") != NULL);
  in.slots[1] = 1;
  ina_log_set_quiet_errors(0);
  /* No tokens: nothing is read, NULL pointers are fine. */
  p = good, p.num_tokens = 0, p.kv = NULL, p.page_ids = NULL, p.cache.latent = NULL;
  CHECK_OK(ina_mla_append_ref(&p));
  append_inputs_free(&in);
  free(buf);
}

/* Without a device the GPU entry points refuse to run rather than crash. */
static void test_no_device(void) {
  if (ina_cuda_device_count() > 0) return;
  ina_mla_absorb_dims_t dims = INA_MLA_ABSORB_DIMS_INIT;
  ina_mla_absorb_t *a = (ina_mla_absorb_t *)&dims; /* must be reset to NULL */
  ina_log_set_quiet_errors(1);
  CHECK(ina_mla_absorb_create(&dims, &a) == INA_ERR_UNSUPPORTED);
  CHECK(a == NULL);
#ifndef INA_HAVE_CUDA
  ina_mla_append_params_t p = INA_MLA_APPEND_PARAMS_INIT;
  CHECK(ina_mla_append(&p, NULL) == INA_ERR_UNSUPPORTED);
#endif
  ina_log_set_quiet_errors(0);
  ina_mla_absorb_destroy(NULL);
}

int main(void) {
  test_rng_t rng = {test_seed("test_mla_append_ref")};
  test_cases(&rng);
  test_arguments(&rng);
  test_no_device();
  return test_finish("test_mla_append_ref");
}
