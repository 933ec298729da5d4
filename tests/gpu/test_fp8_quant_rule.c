/* The GPU quantizer's arithmetic (core/fp8_quant_rule.h: a reciprocal and a correcting FMA
 * instead of a division per value) against the CPU reference ina_fp8_quantize_blocks, on
 * the CPU, so it runs without a GPU. For a block amax, every bf16 x with |x| <= amax (both
 * signs) is quantized in blocks led by amax; scales and e4m3 bytes must match bit for
 * bit. Each run checks the edge amax values and fresh random ones;
 * INA_TEST_EXHAUSTIVE=1 checks all 32639 finite positive bf16 amax (about a minute). */

#include "tests/test_util.h"

#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "core/fp8_quant_rule.h"
#include "core/log.h"

#define BLOCK 128
#define MAX_BF16_FINITE 0x7F7Fu
#define RANDOM_AMAX_PER_RUN 150
#define MAX_REPORTED_MISMATCHES 8

typedef struct {
  float *x;
  uint8_t *q_ref;
  float *scale_ref;
  size_t capacity_blocks;
} buffers_t;

static float bf16(uint32_t bits) { return ina_bf16_to_f32((uint16_t)bits); }

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* Quantizes `n` values, BLOCK - 1 per block behind the block's amax, with the reference
 * and with the rule; returns the number of differing bytes and scales. */
static int64_t compare_blocks(buffers_t *b, float amax, const float *values, size_t n) {
  const size_t per_block = BLOCK - 1, blocks = (n + per_block - 1) / per_block;
  int64_t bad = 0;
  if (blocks > b->capacity_blocks) {
    CHECKF(0, "internal: %zu blocks needed, %zu allocated", blocks, b->capacity_blocks);
    return 1;
  }
  for (size_t k = 0; k < blocks; k++) {
    float *row = b->x + k * BLOCK;
    row[0] = amax;
    for (size_t j = 1; j < BLOCK; j++) {
      size_t i = k * per_block + j - 1;
      row[j] = i < n ? values[i] : 0.0f; /* padding: zeros leave amax unchanged */
    }
  }
  CHECK_OK(
      ina_fp8_quantize_blocks(b->x, (int64_t)blocks, BLOCK, 1, BLOCK, b->q_ref, b->scale_ref));

  const float scale = ina_fp8_rule_scale_inv(amax);
  const float recip = ina_fp8_rule_reciprocal(scale);
  const int use_reciprocal = ina_fp8_rule_use_reciprocal(amax);
  for (size_t k = 0; k < blocks; k++) {
    if (f32_bits(b->scale_ref[k]) != f32_bits(scale) && bad++ < MAX_REPORTED_MISMATCHES)
      fprintf(stderr, "amax %a: scale_inv %a, reference %a\n", amax, scale, b->scale_ref[k]);
    for (size_t j = 0; j < BLOCK; j++) {
      const float x = b->x[k * BLOCK + j];
      const float quotient = ina_fp8_rule_quotient(x, scale, recip, use_reciprocal);
      const uint8_t got = ina_f32_to_fp8_e4m3(quotient, 1);
      const uint8_t want = b->q_ref[k * BLOCK + j];
      if (got != want && bad++ < MAX_REPORTED_MISMATCHES)
        fprintf(stderr, "amax %a (%s path): x %a -> 0x%02x, reference 0x%02x\n", amax,
                use_reciprocal ? "reciprocal" : "division", x, got, want);
    }
  }
  return bad;
}

/* Every bf16 x with |x| <= amax, both signs. */
static int64_t check_amax(buffers_t *b, float *values, uint32_t amax_bits) {
  size_t n = 0;
  for (uint32_t xb = 0; xb <= amax_bits; xb++) {
    values[n++] = bf16(xb);
    values[n++] = bf16(xb | 0x8000u);
  }
  return compare_blocks(b, bf16(amax_bits), values, n);
}

static void check_special_blocks(buffers_t *b) {
  /* All-zero block: scale 1, signed zeros kept. */
  const float zeros[] = {0.0f, -0.0f, 0.0f, -0.0f};
  CHECK(compare_blocks(b, 0.0f, zeros, 4) == 0);
  CHECK(!ina_fp8_rule_use_reciprocal(0.0f));
  /* An infinite amax divides like the reference: finite values become zeros. */
  const float with_inf[] = {1.0f, -2.0f, 0.0f, -0.0f, 448.0f, -3e38f};
  CHECK(compare_blocks(b, INFINITY, with_inf, sizeof with_inf / sizeof with_inf[0]) == 0);
  CHECK(!ina_fp8_rule_use_reciprocal(INFINITY));
  /* The threshold itself and its neighbours. */
  CHECK(ina_fp8_rule_use_reciprocal(INA_FP8_RULE_MIN_FAST_AMAX));
  CHECK(!ina_fp8_rule_use_reciprocal(nextafterf(INA_FP8_RULE_MIN_FAST_AMAX, 0.0f)));
  CHECK(ina_fp8_rule_use_reciprocal(bf16(MAX_BF16_FINITE)));
}

int main(void) {
  test_rng_t rng = {test_seed("test_fp8_quant_rule")};
  const char *exhaustive_env = getenv("INA_TEST_EXHAUSTIVE");
  const int exhaustive = exhaustive_env && strcmp(exhaustive_env, "1") == 0;
  /* Edge amax: smallest subnormal, both sides of the reciprocal threshold (2^-100 is
   * 0x0D80 in bf16), 1, 448, the largest finite. */
  static const uint32_t edges[] = {0x0001u, 0x007Fu, 0x0080u, 0x0D7Fu, 0x0D80u, 0x0D81u,
                                   0x3F80u, 0x43E0u, 0x7F00u, MAX_BF16_FINITE};
  const size_t max_values = 2 * ((size_t)MAX_BF16_FINITE + 1);
  buffers_t b;
  b.capacity_blocks = max_values / (BLOCK - 1) + 1;
  b.x = malloc(b.capacity_blocks * BLOCK * sizeof *b.x);
  b.q_ref = malloc(b.capacity_blocks * BLOCK);
  b.scale_ref = malloc(b.capacity_blocks * sizeof *b.scale_ref);
  float *values = malloc(max_values * sizeof *values);
  CHECK(b.x && b.q_ref && b.scale_ref && values);
  if (!(b.x && b.q_ref && b.scale_ref && values)) return test_finish("test_fp8_quant_rule");

  CHECKF(bf16(0x0D80u) == INA_FP8_RULE_MIN_FAST_AMAX, "0x0D80 is %a", bf16(0x0D80u));
  check_special_blocks(&b);
  int64_t bad = 0, amax_checked = 0;
  if (exhaustive) {
    for (uint32_t a = 1; a <= MAX_BF16_FINITE; a++, amax_checked++)
      bad += check_amax(&b, values, a);
  } else {
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++, amax_checked++)
      bad += check_amax(&b, values, edges[i]);
    for (int i = 0; i < RANDOM_AMAX_PER_RUN; i++, amax_checked++)
      bad += check_amax(&b, values, (uint32_t)test_rng_int(&rng, 1, MAX_BF16_FINITE));
  }
  printf("test_fp8_quant_rule: %lld amax values checked%s\n", (long long)amax_checked,
         exhaustive ? " (exhaustive)" : "");
  CHECKF(bad == 0, "%lld mismatches", (long long)bad);

  free(b.x);
  free(b.q_ref);
  free(b.scale_ref);
  free(values);
  return test_finish("test_fp8_quant_rule");
}
