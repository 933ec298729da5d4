/* dtype conversions against two independent oracles:
 *  - golden tables made by numpy / ml_dtypes (tests/core/gen_dtype_tables.py, committed in
 *    tests/core/data/): exhaustive decoding of bf16, f16 and both fp8 formats, and
 *    encoding of dense input sets around every rounding midpoint;
 *  - a nearest-value search over each format's code list (round to nearest, ties to
 *    even, overflow when the nearest is one step past the largest finite value), run on
 *    fresh random inputs.
 * Plus bulk helpers, dtype names, and block-scaled fp8 quantization round trips. */
#include <float.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/dtype.h"
#include "core/log.h"
#include "tests/test_util.h"

/* ---- helpers ------------------------------------------------------------------------ */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static int f32_bits_are_nan(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

/* Equal bit patterns (so -0 != +0), or both NaN whatever their payload. */
static int same_f32(uint32_t got, uint32_t want) {
  if (f32_bits_are_nan(got) || f32_bits_are_nan(want))
    return f32_bits_are_nan(got) && f32_bits_are_nan(want);
  return got == want;
}

/* Where the golden tables live: tests run from the repository root (ctest's working
 * directory); INA_CORE_TEST_DATA overrides it. */
static const char *data_dir(void) {
  const char *env = getenv("INA_CORE_TEST_DATA");
  return env && *env ? env : "tests/core/data";
}

/* Reads a whole table, which must have exactly `bytes` bytes; NULL (and a failed check)
 * otherwise. The caller frees it. */
static uint8_t *load_table(const char *name, size_t bytes) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", data_dir(), name);
  FILE *f = fopen(path, "rb");
  CHECKF(f != NULL, "cannot open golden table %s (run from the repository root)", path);
  if (!f) return NULL;
  uint8_t *buf = malloc(bytes + 1);
  size_t got = buf ? fread(buf, 1, bytes + 1, f) : 0;
  fclose(f);
  CHECKF(got == bytes, "%s: %zu bytes, expected %zu", path, got, bytes);
  if (got != bytes) {
    free(buf);
    return NULL;
  }
  return buf;
}

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Counts mismatches of one table comparison and reports the first few. */
typedef struct {
  const char *what;
  long mismatches;
} tally_t;

static void tally(tally_t *t, int ok, uint32_t input, uint32_t got, uint32_t want) {
  if (ok) return;
  if (t->mismatches++ < 8)
    fprintf(stderr, "%s: input 0x%08x: got 0x%x, expected 0x%x\n", t->what, input, got, want);
}

static void tally_done(tally_t *t) {
  CHECKF(t->mismatches == 0, "%s: %ld mismatches", t->what, t->mismatches);
}

/* ---- formats, described independently of the implementation ---------------------------- */

typedef struct {
  const char *name;
  int bits; /* 8 or 16 */
  int man_bits;
  int bias;
  uint32_t max_finite; /* largest finite magnitude code */
  /* The magnitude code one step past max_finite. The formula below gives it the value the
   * format would have with an unbounded exponent, so "nearest is this code" means overflow,
   * and for non-saturating casts this is also the result code: infinity for bf16, f16 and
   * e5m2, NaN (S.1111.111) for e4m3fn. */
  uint32_t overflow_code;
  int has_inf;
} format_t;

static const format_t FMT_BF16 = {"bf16", 16, 7, 127, 0x7F7F, 0x7F80, 1};
static const format_t FMT_F16 = {"f16", 16, 10, 15, 0x7BFF, 0x7C00, 1};
static const format_t FMT_E4M3 = {"e4m3fn", 8, 3, 7, 0x7E, 0x7F, 0};
static const format_t FMT_E5M2 = {"e5m2", 8, 2, 15, 0x7B, 0x7C, 1};

/* Value of a magnitude code from the textbook formula (exact in double). */
static double code_value(const format_t *f, uint32_t code) {
  uint32_t e = code >> f->man_bits, m = code & ((1u << f->man_bits) - 1u);
  if (e == 0) return ldexp((double)m, 1 - f->bias - f->man_bits);
  return ldexp((double)((1u << f->man_bits) + m), (int)e - f->bias - f->man_bits);
}

static int code_is_nan(const format_t *f, uint32_t code) {
  uint32_t mag = code & ((1u << (f->bits - 1)) - 1u);
  return f->has_inf ? mag > f->overflow_code : mag == f->overflow_code;
}

/* Nearest magnitude code to a >= 0, ties to the even code (the code's low bit is the
 * mantissa's); may return overflow_code. Differences are exact in double: the neighbours
 * are within a factor of two of a (Sterbenz). */
static uint32_t oracle_round_magnitude(const format_t *f, double a) {
  if (a >= code_value(f, f->overflow_code)) return f->overflow_code;
  uint32_t lo = 0, hi = f->overflow_code; /* invariant: value(lo) <= a < value(hi) */
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (code_value(f, mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  double below = a - code_value(f, lo), above = code_value(f, hi) - a;
  if (below < above) return lo;
  if (above < below) return hi;
  return (lo & 1u) ? hi : lo;
}

/* Full expected code for an f32 input; NaN inputs give some NaN code. */
static uint32_t oracle_encode(const format_t *f, float x, int saturate) {
  uint32_t sign = (f32_bits(x) >> 31) << (f->bits - 1);
  if (isnan(x)) return sign | ((1u << (f->bits - 1)) - 1u); /* all ones: NaN in every format */
  uint32_t mag = isinf(x) ? f->overflow_code : oracle_round_magnitude(f, fabs((double)x));
  if (mag == f->overflow_code && saturate) mag = f->max_finite;
  return sign | mag;
}

static uint32_t encode(const format_t *f, float x, int saturate) {
  if (f == &FMT_BF16) return ina_f32_to_bf16(x);
  if (f == &FMT_F16) return ina_f32_to_f16(x);
  if (f == &FMT_E4M3) return ina_f32_to_fp8_e4m3(x, saturate);
  return ina_f32_to_fp8_e5m2(x, saturate);
}

static float decode(const format_t *f, uint32_t code) {
  if (f == &FMT_BF16) return ina_bf16_to_f32((uint16_t)code);
  if (f == &FMT_F16) return ina_f16_to_f32((uint16_t)code);
  if (f == &FMT_E4M3) return ina_fp8_e4m3_to_f32((uint8_t)code);
  return ina_fp8_e5m2_to_f32((uint8_t)code);
}

static int same_code(const format_t *f, uint32_t got, uint32_t want) {
  if (code_is_nan(f, got) || code_is_nan(f, want))
    return code_is_nan(f, got) && code_is_nan(f, want);
  return got == want;
}

/* ---- golden tables: decoding ----------------------------------------------------------- */

static void test_decode_tables(void) {
  const struct {
    const char *file;
    const format_t *fmt;
    uint32_t count;
  } tables[] = {
      {"bf16_to_f32.bin", &FMT_BF16, 65536},
      {"f16_to_f32.bin", &FMT_F16, 65536},
      {"fp8_e4m3_to_f32.bin", &FMT_E4M3, 256},
      {"fp8_e5m2_to_f32.bin", &FMT_E5M2, 256},
  };
  for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++) {
    uint8_t *table = load_table(tables[t].file, tables[t].count * 4);
    if (!table) continue;
    tally_t mism = {tables[t].file, 0};
    for (uint32_t code = 0; code < tables[t].count; code++) {
      uint32_t want = le32(table + 4 * code);
      uint32_t got = f32_bits(decode(tables[t].fmt, code));
      tally(&mism, same_f32(got, want), code, got, want);
      /* The NaN sign survives decoding. */
      if (f32_bits_are_nan(want))
        tally(&mism, (got >> 31) == (code >> (tables[t].fmt->bits - 1)), code, got, want);
    }
    tally_done(&mism);
    free(table);
  }
  CHECK(ina_fp8_e4m3_to_f32(0x7E) == INA_FP8_E4M3_MAX);
  CHECK(ina_fp8_e4m3_to_f32(0xFE) == -INA_FP8_E4M3_MAX);
  CHECK(ina_fp8_e5m2_to_f32(0x7B) == INA_FP8_E5M2_MAX);
  CHECK(ina_fp8_e4m3_to_f32(0x01) == 0x1p-9f); /* smallest subnormal */
  CHECK(ina_fp8_e5m2_to_f32(0x01) == 0x1p-16f);
  CHECK(ina_f16_to_f32(0x0001) == 0x1p-24f);
}

/* ---- golden tables: encoding ----------------------------------------------------------- */

/* Every bf16 pattern as an f32 input, to both fp8 formats. The saturating expectation is
 * the table entry of the input clamped to the largest finite value (exact in bf16). */
static void test_fp8_encode_tables(void) {
  const struct {
    const char *file;
    const format_t *fmt;
    float max;
  } tables[] = {
      {"f32_to_fp8_e4m3.bin", &FMT_E4M3, INA_FP8_E4M3_MAX},
      {"f32_to_fp8_e5m2.bin", &FMT_E5M2, INA_FP8_E5M2_MAX},
  };
  for (size_t t = 0; t < 2; t++) {
    const format_t *fmt = tables[t].fmt;
    uint8_t *table = load_table(tables[t].file, 65536);
    if (!table) continue;
    char what_sat[64];
    snprintf(what_sat, sizeof what_sat, "%s saturate=1", tables[t].file);
    tally_t mism = {tables[t].file, 0}, mism_sat = {what_sat, 0};
    for (uint32_t i = 0; i < 65536; i++) {
      float x = bits_f32(i << 16);
      uint32_t want = table[i];
      uint32_t got = encode(fmt, x, 0);
      tally(&mism, same_code(fmt, got, want), i << 16, got, want);
      if (code_is_nan(fmt, want) && isnan(x))
        tally(&mism, (got & 0x80u) == (want & 0x80u), i << 16, got, want);

      float clamped = isnan(x) ? x : fminf(fmaxf(x, -tables[t].max), tables[t].max);
      uint32_t want_sat = table[f32_bits(clamped) >> 16];
      uint32_t got_sat = encode(fmt, x, 1);
      tally(&mism_sat, same_code(fmt, got_sat, want_sat), i << 16, got_sat, want_sat);
      /* Saturation never invents a NaN or an infinity. */
      if (!isnan(x))
        tally(&mism_sat, !code_is_nan(fmt, got_sat) && (got_sat & 0x7Fu) <= fmt->max_finite,
              i << 16, got_sat, want_sat);
    }
    tally_done(&mism);
    tally_done(&mism_sat);
    free(table);
  }
}

static const uint32_t BF16_LOWS[] = {0x7FFF, 0x8000, 0x8001};
static const uint32_t F16_LOWS[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2FFF,
                                    0x3000, 0x3001, 0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xF000, 0xFFFF};

/* The upper halves of the f32 -> f16 inputs: exponent field 0, 255, or 101..143. */
static int f16_table_has_hi(uint32_t hi) {
  uint32_t e = (hi >> 7) & 0xFFu;
  return e == 0 || e == 255 || (e >= 127 - 26 && e <= 127 + 16);
}

static void test_bf16_f16_encode_tables(void) {
  const size_t nb = sizeof BF16_LOWS / sizeof BF16_LOWS[0];
  uint8_t *table = load_table("f32_to_bf16.bin", 65536 * nb * 2);
  if (table) {
    tally_t mism = {"f32_to_bf16.bin", 0};
    size_t k = 0;
    for (uint32_t hi = 0; hi < 65536; hi++)
      for (size_t l = 0; l < nb; l++, k++) {
        uint32_t in = hi << 16 | BF16_LOWS[l];
        uint32_t want = le16(table + 2 * k), got = ina_f32_to_bf16(bits_f32(in));
        tally(&mism, same_code(&FMT_BF16, got, want), in, got, want);
        if (f32_bits_are_nan(in)) tally(&mism, (got >> 15) == (in >> 31), in, got, want);
      }
    tally_done(&mism);
    free(table);
  }

  const size_t nf = sizeof F16_LOWS / sizeof F16_LOWS[0];
  size_t nhi = 0;
  for (uint32_t hi = 0; hi < 65536; hi++) nhi += (size_t)f16_table_has_hi(hi);
  CHECK(nhi == 45 * 256);
  table = load_table("f32_to_f16.bin", nhi * nf * 2);
  if (table) {
    tally_t mism = {"f32_to_f16.bin", 0};
    size_t k = 0;
    for (uint32_t hi = 0; hi < 65536; hi++) {
      if (!f16_table_has_hi(hi)) continue;
      for (size_t l = 0; l < nf; l++, k++) {
        uint32_t in = hi << 16 | F16_LOWS[l];
        uint32_t want = le16(table + 2 * k), got = ina_f32_to_f16(bits_f32(in));
        tally(&mism, same_code(&FMT_F16, got, want), in, got, want);
        if (f32_bits_are_nan(in)) tally(&mism, (got >> 15) == (in >> 31), in, got, want);
      }
    }
    tally_done(&mism);
    free(table);
  }
}

/* ---- random inputs against the nearest-value oracle ------------------------------------ */

/* A random f32 that is interesting for `f`: uniform bits, or a value in or near the
 * format's range, or a rounding midpoint of the format nudged by 0 or 1 f32 ulp. */
static float random_input(test_rng_t *rng, const format_t *f) {
  uint64_t r = test_rng_next(rng);
  switch (r % 3) {
  case 0: return bits_f32((uint32_t)(r >> 32));
  case 1: {
    int min_exp = 1 - f->bias - f->man_bits - 3;
    int max_exp = (int)(f->overflow_code >> f->man_bits) - f->bias + 2;
    if (max_exp > 127) max_exp = 127;
    if (min_exp < -149) min_exp = -149;
    float v = ldexpf(1.0f + (float)test_rng_uniform(rng), (int)test_rng_int(rng, min_exp, max_exp));
    return (r >> 8) & 1 ? -v : v;
  }
  default: {
    uint32_t code = (uint32_t)test_rng_int(rng, 0, f->overflow_code - 1);
    double mid = 0.5 * (code_value(f, code) + code_value(f, code + 1));
    float v = (float)mid; /* exact: a midpoint needs one more bit than the format has */
    int nudge = (int)test_rng_int(rng, -1, 1);
    if (nudge) v = nextafterf(v, nudge > 0 ? INFINITY : 0.0f);
    return (r >> 8) & 1 ? -v : v;
  }
  }
}

static void test_random_against_oracle(uint64_t seed) {
  const format_t *formats[] = {&FMT_BF16, &FMT_F16, &FMT_E4M3, &FMT_E5M2};
  test_rng_t rng = {seed};
  for (size_t fi = 0; fi < 4; fi++) {
    const format_t *f = formats[fi];
    int sat_modes = f->bits == 8 ? 2 : 1; /* bf16 and f16 have no saturating cast */
    for (int sat = 0; sat < sat_modes; sat++) {
      char what[64];
      snprintf(what, sizeof what, "random f32 -> %s saturate=%d", f->name, sat);
      tally_t mism = {what, 0};
      for (int i = 0; i < 200000; i++) {
        float x = random_input(&rng, f);
        uint32_t want = oracle_encode(f, x, sat), got = encode(f, x, sat);
        tally(&mism, same_code(f, got, want), f32_bits(x), got, want);
      }
      /* Fixed edge cases: zeros, infinities, NaNs of both signs, f32 extremes. */
      const float edges[] = {0.0f,     -0.0f,   INFINITY,  -INFINITY,  NAN,  -NAN, FLT_MAX,
                             -FLT_MAX, FLT_MIN, 0x1p-149f, -0x1p-149f, 1.0f, -1.0f};
      for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        uint32_t want = oracle_encode(f, edges[i], sat), got = encode(f, edges[i], sat);
        tally(&mism, same_code(f, got, want), f32_bits(edges[i]), got, want);
        tally(&mism, (got >> (f->bits - 1)) == (f32_bits(edges[i]) >> 31), f32_bits(edges[i]), got,
              want);
      }
      tally_done(&mism);
    }
    /* Every code decodes to its formula value and encodes back to itself. */
    tally_t mism = {"decode/encode round trip", 0};
    for (uint32_t code = 0; code < (1u << f->bits); code++) {
      if (code_is_nan(f, code)) {
        tally(&mism, isnan(decode(f, code)), code, 0, 0);
        continue;
      }
      uint32_t mag = code & ((1u << (f->bits - 1)) - 1u);
      double v = mag == f->overflow_code ? INFINITY : code_value(f, mag);
      if (code >> (f->bits - 1)) v = -v;
      tally(&mism, (double)decode(f, code) == v, code, f32_bits(decode(f, code)), 0);
      tally(&mism, encode(f, decode(f, code), 0) == code, code, encode(f, decode(f, code), 0),
            code);
    }
    tally_done(&mism);
  }
}

/* ---- bulk helpers and names -------------------------------------------------------------- */

/* x converted to dt and back by the scalar functions (fp8 saturating, as ina_from_f32). */
static float scalar_round_trip(ina_dtype_t dt, float x) {
  switch (dt) {
  case INA_DTYPE_F16: return ina_f16_to_f32(ina_f32_to_f16(x));
  case INA_DTYPE_BF16: return ina_bf16_to_f32(ina_f32_to_bf16(x));
  case INA_DTYPE_FP8_E4M3: return ina_fp8_e4m3_to_f32(ina_f32_to_fp8_e4m3(x, 1));
  case INA_DTYPE_FP8_E5M2: return ina_fp8_e5m2_to_f32(ina_f32_to_fp8_e5m2(x, 1));
  default: return x;
  }
}

static void test_bulk(uint64_t seed) {
  test_rng_t rng = {seed ^ 0xB01Cu};
  enum { N = 1000 };
  float src[N], back[N];
  uint8_t raw[N * 8];
  for (int i = 0; i < N; i++)
    src[i] = test_rng_normal(&rng) * ldexpf(1.0f, (int)test_rng_int(&rng, -20, 20));
  src[0] = NAN;
  src[1] = INFINITY;
  src[2] = -1e30f;

  for (int d = 0; d < INA_DTYPE_COUNT; d++) {
    ina_dtype_t dt = (ina_dtype_t)d;
    if (!ina_dtype_is_float(dt)) continue;
    test_poison_f32(back, N);
    memset(raw, 0xA5, sizeof raw);
    CHECK_OK(ina_from_f32(src, raw, dt, N));
    ina_to_f32(raw, dt, back, N);
    int ok = 1;
    for (int i = 0; i < N; i++)
      if (!same_f32(f32_bits(back[i]), f32_bits(scalar_round_trip(dt, src[i])))) ok = 0;
    CHECKF(ok, "bulk round trip through %s differs from the scalar conversions",
           ina_dtype_name(dt));
    /* Bytes beyond n are untouched. */
    CHECK(raw[N * ina_dtype_size(dt)] == 0xA5);
  }
  /* fp8 bulk conversion saturates. */
  uint8_t q[2];
  const float big[2] = {1e6f, -INFINITY};
  CHECK_OK(ina_from_f32(big, q, INA_DTYPE_FP8_E4M3, 2));
  CHECK(q[0] == 0x7E && q[1] == 0xFE);
  CHECK_OK(ina_from_f32(big, q, INA_DTYPE_FP8_E5M2, 2));
  CHECK(q[0] == 0x7B && q[1] == 0xFB);

  /* Integers to f32. */
  int32_t i32[4] = {0, -7, 123456, INT32_MIN};
  int64_t i64[3] = {5, -((int64_t)1 << 40), 16777217};
  ina_to_f32(i32, INA_DTYPE_I32, back, 4);
  CHECK(back[0] == 0.0f && back[1] == -7.0f && back[2] == 123456.0f && back[3] == -2147483648.0f);
  ina_to_f32(i64, INA_DTYPE_I64, back, 3);
  CHECK(back[0] == 5.0f && back[1] == -0x1p40f && back[2] == 16777216.0f);

  ina_log_set_quiet_errors(1);
  CHECK(ina_from_f32(src, raw, INA_DTYPE_I32, 4) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_from_f32(src, raw, INA_DTYPE_COUNT, 4) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_from_f32(NULL, raw, INA_DTYPE_F16, 4) == INA_ERR_INVALID_ARGUMENT);
  CHECK_OK(ina_from_f32(NULL, NULL, INA_DTYPE_F16, 0));
  back[0] = 1.0f;
  ina_to_f32(raw, INA_DTYPE_COUNT, back, 1); /* misuse: NaN out, error recorded */
  CHECK(isnan(back[0]));
  CHECK(strstr(ina_last_error(), "dtype") != NULL);
  ina_log_set_quiet_errors(0);
}

static void test_names(void) {
  const struct {
    ina_dtype_t dt;
    size_t size;
    const char *name, *st_name;
    int is_float;
  } expected[] = {
      {INA_DTYPE_F32, 4, "f32", "F32", 1},
      {INA_DTYPE_F16, 2, "f16", "F16", 1},
      {INA_DTYPE_BF16, 2, "bf16", "BF16", 1},
      {INA_DTYPE_FP8_E4M3, 1, "fp8_e4m3", "F8_E4M3", 1},
      {INA_DTYPE_FP8_E5M2, 1, "fp8_e5m2", "F8_E5M2", 1},
      {INA_DTYPE_I32, 4, "i32", "I32", 0},
      {INA_DTYPE_I64, 8, "i64", "I64", 0},
  };
  CHECK(sizeof expected / sizeof expected[0] == INA_DTYPE_COUNT);
  for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
    ina_dtype_t dt = expected[i].dt;
    CHECK(ina_dtype_size(dt) == expected[i].size);
    CHECK(strcmp(ina_dtype_name(dt), expected[i].name) == 0);
    CHECK(strcmp(ina_dtype_safetensors_name(dt), expected[i].st_name) == 0);
    CHECK(ina_dtype_is_float(dt) == expected[i].is_float);
    ina_dtype_t parsed = INA_DTYPE_COUNT;
    CHECK_OK(ina_dtype_from_safetensors(expected[i].st_name, &parsed));
    CHECK(parsed == dt);
  }
  CHECK(ina_dtype_size(INA_DTYPE_COUNT) == 0);
  CHECK(ina_dtype_size((ina_dtype_t)-1) == 0);
  CHECK(ina_dtype_name(INA_DTYPE_COUNT) != NULL);
  CHECK(!ina_dtype_is_float(INA_DTYPE_COUNT));

  ina_log_set_quiet_errors(1);
  const char *unsupported[] = {"BOOL", "F8_E8M0", "U8", "F64", "bf16", "BF16 ", ""};
  for (size_t i = 0; i < sizeof unsupported / sizeof unsupported[0]; i++) {
    ina_dtype_t parsed = INA_DTYPE_F32;
    ina_clear_error();
    CHECK(ina_dtype_from_safetensors(unsupported[i], &parsed) == INA_ERR_UNSUPPORTED);
    CHECK(parsed == INA_DTYPE_COUNT);
    char quoted[32];
    snprintf(quoted, sizeof quoted, "\"%s\"", unsupported[i]);
    CHECKF(strstr(ina_last_error(), quoted) != NULL, "error \"%s\" does not name %s",
           ina_last_error(), quoted);
  }
  ina_dtype_t parsed;
  CHECK(ina_dtype_from_safetensors(NULL, &parsed) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_dtype_from_safetensors("F32", NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
}

/* ---- block-scaled fp8 ------------------------------------------------------------------- */

/* Quantizes a random [rows, cols] matrix (with per-row magnitudes spread over many
 * binades and, when asked, one all-zero block) and checks scales, codes and the
 * dequantized round trip. */
static void check_block_round_trip(test_rng_t *rng, int64_t rows, int64_t cols, int br, int bc,
                                   int zero_block) {
  size_t n = (size_t)(rows * cols);
  int64_t nbr = (rows + br - 1) / br, nbc = (cols + bc - 1) / bc;
  size_t ns = (size_t)(nbr * nbc);
  float *x = malloc((n + 1) * sizeof *x), *out = malloc((n + 1) * sizeof *out);
  float *scale = malloc((ns + 1) * sizeof *scale);
  uint8_t *q = malloc(n + 1);
  for (int64_t r = 0; r < rows; r++) {
    float row_mag = ldexpf(1.0f, (int)test_rng_int(rng, -12, 12));
    for (int64_t c = 0; c < cols; c++) x[r * cols + c] = test_rng_normal(rng) * row_mag;
  }
  int64_t zb_r = -1, zb_c = -1;
  if (zero_block && ns > 0) {
    zb_r = test_rng_int(rng, 0, nbr - 1);
    zb_c = test_rng_int(rng, 0, nbc - 1);
    for (int64_t r = zb_r * br; r < rows && r < (zb_r + 1) * br; r++)
      for (int64_t c = zb_c * bc; c < cols && c < (zb_c + 1) * bc; c++) x[r * cols + c] = 0.0f;
  }
  test_poison_f32(scale, ns + 1);
  scale[ns] = 12345.0f; /* guard: nothing past the scale array is written */
  test_poison_f32(out, n + 1);
  out[n] = 12345.0f;
  memset(q, 0x7F, n + 1);

  CHECK_OK(ina_fp8_quantize_blocks(x, rows, cols, br, bc, q, scale));
  CHECK(scale[ns] == 12345.0f);
  CHECK(q[n] == 0x7F);
  long bad_scale = 0, bad_max = 0, bad_zero = 0, bad_err = 0, nan_codes = 0;
  for (int64_t b_r = 0; b_r < nbr; b_r++)
    for (int64_t b_c = 0; b_c < nbc; b_c++) {
      int64_t r0 = b_r * br, r1 = r0 + br < rows ? r0 + br : rows;
      int64_t c0 = b_c * bc, c1 = c0 + bc < cols ? c0 + bc : cols;
      float amax = 0.0f;
      int64_t arg = -1;
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
          if (fabsf(x[r * cols + c]) > amax) {
            amax = fabsf(x[r * cols + c]);
            arg = r * cols + c;
          }
      float s = scale[b_r * nbc + b_c];
      float want_s = amax == 0.0f ? 1.0f : amax / 448.0f;
      if (s != want_s) bad_scale++;
      if (b_r == zb_r && b_c == zb_c) {
        for (int64_t r = r0; r < r1; r++)
          for (int64_t c = c0; c < c1; c++) bad_zero += q[r * cols + c] != 0;
        bad_zero += s != 1.0f;
      }
      /* The block's largest magnitude maps to +-448 exactly. */
      if (arg >= 0 && q[arg] != (x[arg] < 0 ? 0xFE : 0x7E)) bad_max++;
    }
  for (size_t i = 0; i < n; i++) nan_codes += (q[i] & 0x7F) == 0x7F;
  CHECKF(bad_scale == 0, "[%lld, %lld] blocks %dx%d: %ld wrong scales", (long long)rows,
         (long long)cols, br, bc, bad_scale);
  CHECKF(bad_max == 0, "[%lld, %lld] blocks %dx%d: %ld block maxima not at +-448", (long long)rows,
         (long long)cols, br, bc, bad_max);
  CHECKF(bad_zero == 0, "[%lld, %lld] blocks %dx%d: all-zero block not quantized to 0 with scale 1",
         (long long)rows, (long long)cols, br, bc);
  CHECK(nan_codes == 0);

  CHECK_OK(ina_fp8_dequantize_blocks(q, scale, rows, cols, br, bc, out));
  CHECK(out[n] == 12345.0f);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      size_t i = (size_t)(r * cols + c);
      double s = scale[(r / br) * nbc + c / bc];
      /* e4m3 keeps 3 mantissa bits: half an ulp is at most 2^-4 of the value for normals,
       * and 2^-10 (times the scale) in the subnormal range below 2^-6. */
      double bound = fmax(0x1p-4 * fabs(x[i]), 0x1p-10 * s) * (1 + 1e-5) + 1e-6 * fabs(x[i]);
      if (!(fabs((double)out[i] - x[i]) <= bound)) {
        if (bad_err++ < 4)
          fprintf(stderr, "  [%lld, %lld]: x %g -> %g (scale %g)\n", (long long)r, (long long)c,
                  x[i], out[i], s);
      }
    }
  CHECKF(bad_err == 0, "[%lld, %lld] blocks %dx%d: %ld elements beyond the e4m3 error bound",
         (long long)rows, (long long)cols, br, bc, bad_err);
  if (n > 0) {
    double rel = test_rel_l2(out, x, n);
    CHECKF(rel < 0.04, "[%lld, %lld] blocks %dx%d: relative L2 error %g", (long long)rows,
           (long long)cols, br, bc, rel);
  }
  free(x);
  free(out);
  free(scale);
  free(q);
}

static void test_fp8_blocks(uint64_t seed) {
  test_rng_t rng = {seed ^ 0xF8F8u};
  const int blocks[][2] = {{1, 128}, {128, 128}, {3, 5}};
  const int64_t shapes[][2] = {{1, 1},     {1, 128},   {1, 129},  {2, 255}, {3, 127}, {128, 128},
                               {129, 257}, {200, 300}, {1, 1000}, {0, 7},   {7, 0}};
  for (size_t b = 0; b < 3; b++) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
      check_block_round_trip(&rng, shapes[s][0], shapes[s][1], blocks[b][0], blocks[b][1],
                             (int)(s & 1));
    for (int k = 0; k < 6; k++)
      check_block_round_trip(&rng, test_rng_int(&rng, 1, 300), test_rng_int(&rng, 1, 400),
                             blocks[b][0], blocks[b][1], k & 1);
  }

  /* A block whose magnitude is tiny still round-trips (scale stays positive). */
  float tiny[2] = {0x1p-140f, -0x1p-141f}, back[2];
  uint8_t q[2];
  float s;
  CHECK_OK(ina_fp8_quantize_blocks(tiny, 1, 2, 1, 128, q, &s));
  CHECK(s > 0.0f);
  CHECK_OK(ina_fp8_dequantize_blocks(q, &s, 1, 2, 1, 128, back));
  CHECK(back[0] > 0.0f && back[1] < 0.0f);

  /* Argument validation. */
  ina_log_set_quiet_errors(1);
  float x[4] = {1, 2, 3, 4}, out[4];
  CHECK(ina_fp8_quantize_blocks(NULL, 2, 2, 1, 128, q, &s) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_quantize_blocks(x, 2, 2, 1, 128, NULL, &s) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_quantize_blocks(x, 2, 2, 1, 128, q, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_quantize_blocks(x, -1, 2, 1, 128, q, &s) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_quantize_blocks(x, 2, -2, 1, 128, q, &s) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_quantize_blocks(x, 2, 2, 0, 128, q, &s) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_quantize_blocks(x, 2, 2, 1, -128, q, &s) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_quantize_blocks(x, INT64_MAX, 2, 1, 128, q, &s) == INA_ERR_INVALID_ARGUMENT);
  CHECK(strstr(ina_last_error(), "ina_fp8_quantize_blocks") != NULL);
  CHECK(ina_fp8_dequantize_blocks(NULL, &s, 2, 2, 1, 128, out) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_dequantize_blocks(q, NULL, 2, 2, 1, 128, out) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_dequantize_blocks(q, &s, 2, 2, 1, 128, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_dequantize_blocks(q, &s, 2, 2, 128, 0, out) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_fp8_dequantize_blocks(q, &s, -5, 2, 128, 128, out) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
}

int main(void) {
  uint64_t seed = test_seed("test_dtype");
  test_decode_tables();
  test_fp8_encode_tables();
  test_bf16_f16_encode_tables();
  test_random_against_oracle(seed);
  test_bulk(seed);
  test_names();
  test_fp8_blocks(seed);
  return test_finish("test_dtype");
}
