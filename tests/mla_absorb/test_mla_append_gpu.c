/* The GPU append kernel (ina_mla_append) against its CPU reference (ina_mla_append_ref)
 * on the same inputs, cache byte for cache byte: DeepSeek's 512 + 64 and small dims
 * (64/16, 144/8, 128/16, 256/32), page sizes 1/16/64, shuffled destinations with skipped
 * tokens, both rope layouts, i32 and i64 positions, packed and split cache layouts, BF16
 * and FP8 caches. Caches start poisoned; bytes outside the written entries must keep the
 * poison.
 *
 * Kernel and reference follow the same arithmetic (mla/mla_append.h), so the bytes are
 * expected to be identical; the check allows one ulp per value (bf16 latent and rope,
 * e4m3 byte, fp32 scale) for the one step whose result the two sides do not pin down
 * exactly, sin and cos taken in double (CUDA's are within 2 ulp of double, glibc's within
 * 1), which could round differently to float once in about 2^28 values. The number of
 * values not bit-identical is printed and must stay below 1 in 10^4.
 * Skipped (exit 77) without a CUDA device. */

#include "tests/gpu_test_util.h"

#include "core/cuda.h"
#include "core/log.h"
#include "tests/mla_absorb/append_cases.h"

/* Totals over all cases, printed at the end. */
static int64_t g_values = 0, g_not_identical = 0;

/* Sign-magnitude bit patterns of `bits` bits mapped onto a monotone integer line, so two
 * adjacent representable values differ by 1 (+0 and -0 are both 0). */
static int64_t ordered(uint32_t v, int bits) {
  const uint32_t sign = 1u << (bits - 1);
  const int64_t magnitude = v & (sign - 1);
  return (v & sign) ? -magnitude : magnitude;
}

static int64_t ulp_distance(uint32_t a, uint32_t b, int bits) {
  const int64_t d = ordered(a, bits) - ordered(b, bits);
  return d < 0 ? -d : d;
}

/* Compares `n` elements of `bits` bits; counts those more than one ulp apart (bad) and
 * those not identical. */
static void compare_part(const uint8_t *got, const uint8_t *want, int64_t n, int bits, int64_t *bad,
                         int64_t *not_identical) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t a = 0, b = 0;
    memcpy(&a, got + i * (bits / 8), (size_t)(bits / 8));
    memcpy(&b, want + i * (bits / 8), (size_t)(bits / 8));
    if (a == b) continue;
    (*not_identical)++;
    if (ulp_distance(a, b, bits) > 1) (*bad)++;
  }
}

static void run_case(const append_case_t *c, test_rng_t *rng) {
  append_inputs_t in;
  ina_mla_cache_t host_cache, dev_cache;
  const int64_t bytes = append_cache_layout(c, NULL, &host_cache);
  const int32_t T = c->num_tokens;
  uint8_t *want = malloc((size_t)bytes), *got = malloc((size_t)bytes),
          *mask = malloc((size_t)bytes);
  void *d_cache = NULL, *d_kv = NULL, *d_w = NULL, *d_freq = NULL, *d_pos = NULL, *d_pages = NULL,
       *d_slots = NULL;
  char what[192];
  snprintf(what, sizeof what, "%s C %d R %d page %d pages %d tokens %d %s %s %s kv_stride %lld",
           c->format == INA_MLA_CACHE_FP8 ? "fp8" : "bf16", c->C, c->R, c->page_size, c->num_pages,
           T, c->split_layout ? "split" : "packed",
           c->rope_layout == INA_MLA_ROPE_PAIRS ? "pairs" : "halves",
           ina_dtype_name(c->positions_dtype), (long long)c->kv_stride);
  if (!want || !got || !mask || !append_make_inputs(c, &in, rng)) {
    CHECKF(0, "%s: out of memory", what);
    free(want);
    free(got);
    free(mask);
    return;
  }
  const size_t pos_bytes = (size_t)T * ina_dtype_size(c->positions_dtype);

  /* The reference, into a poisoned host cache. */
  append_cache_layout(c, want, &host_cache);
  memset(want, APPEND_POISON, (size_t)bytes);
  const ina_mla_append_params_t ref =
      append_params(c, in.kv, in.norm_weight, in.inv_freq, in.attention_factor,
                    append_positions(c, &in), in.page_ids, in.slots, host_cache);
  CHECK_OK(ina_mla_append_ref(&ref));

  /* The kernel, into a poisoned device cache of the same layout. */
  memset(got, APPEND_POISON, (size_t)bytes);
  CHECK_OK(ina_cuda_malloc(0, (size_t)bytes, &d_cache));
  CHECK_OK(ina_cuda_malloc(0, (size_t)T * (size_t)c->kv_stride * 2, &d_kv));
  CHECK_OK(ina_cuda_malloc(0, (size_t)c->C * 2, &d_w));
  CHECK_OK(ina_cuda_malloc(0, (size_t)c->R / 2 * sizeof(float), &d_freq));
  CHECK_OK(ina_cuda_malloc(0, pos_bytes, &d_pos));
  CHECK_OK(ina_cuda_malloc(0, (size_t)T * 4, &d_pages));
  CHECK_OK(ina_cuda_malloc(0, (size_t)T * 4, &d_slots));
  if (!d_cache || !d_kv || !d_w || !d_freq || !d_pos || !d_pages || !d_slots) goto done;
  CHECK_OK(ina_cuda_memcpy_h2d(d_cache, got, (size_t)bytes));
  CHECK_OK(ina_cuda_memcpy_h2d(d_kv, in.kv, (size_t)T * (size_t)c->kv_stride * 2));
  CHECK_OK(ina_cuda_memcpy_h2d(d_w, in.norm_weight, (size_t)c->C * 2));
  CHECK_OK(ina_cuda_memcpy_h2d(d_freq, in.inv_freq, (size_t)c->R / 2 * sizeof(float)));
  CHECK_OK(ina_cuda_memcpy_h2d(d_pos, append_positions(c, &in), pos_bytes));
  CHECK_OK(ina_cuda_memcpy_h2d(d_pages, in.page_ids, (size_t)T * 4));
  CHECK_OK(ina_cuda_memcpy_h2d(d_slots, in.slots, (size_t)T * 4));
  append_cache_layout(c, d_cache, &dev_cache);
  const ina_mla_append_params_t p =
      append_params(c, d_kv, d_w, d_freq, in.attention_factor, d_pos, d_pages, d_slots, dev_cache);
  CHECK_OK(ina_mla_append(&p, NULL));
  CHECK_OK(ina_cuda_synchronize());
  CHECK_OK(ina_cuda_memcpy_d2h(got, d_cache, (size_t)bytes));

  append_written_mask(c, &host_cache, want, &in, mask, bytes);
  const int64_t unpoisoned = append_count_unpoisoned(got, mask, bytes);
  CHECKF(unpoisoned == 0, "%s: %lld bytes outside the written entries changed", what,
         (long long)unpoisoned);
  int64_t bad = 0, not_identical = 0, values = 0;
  for (int32_t t = 0; t < T; t++) {
    if (in.page_ids[t] < 0) continue;
    const entry_parts_t e = append_entry_parts(&host_cache, want, in.page_ids[t], in.slots[t]);
    const int latent_bits = c->format == INA_MLA_CACHE_FP8 ? 8 : 16;
    compare_part(got + e.latent_at, want + e.latent_at, c->C, latent_bits, &bad, &not_identical);
    compare_part(got + e.rope_at, want + e.rope_at, c->R, 16, &bad, &not_identical);
    values += c->C + c->R;
    if (e.scale_bytes) {
      compare_part(got + e.scale_at, want + e.scale_at, c->C / 128, 32, &bad, &not_identical);
      values += c->C / 128;
    }
  }
  CHECKF(bad == 0, "%s: %lld values more than one ulp from the reference", what, (long long)bad);
  if (not_identical)
    printf("%s: %lld of %lld values differ by one ulp\n", what, (long long)not_identical,
           (long long)values);
  g_values += values;
  g_not_identical += not_identical;

done:
  ina_cuda_free(d_cache);
  ina_cuda_free(d_kv);
  ina_cuda_free(d_w);
  ina_cuda_free(d_freq);
  ina_cuda_free(d_pos);
  ina_cuda_free(d_pages);
  ina_cuda_free(d_slots);
  append_inputs_free(&in);
  free(want);
  free(got);
  free(mask);
}

static append_case_t make_case(ina_mla_cache_format_t format, int32_t C, int32_t R,
                               int32_t page_size, test_rng_t *rng) {
  append_case_t c;
  memset(&c, 0, sizeof c);
  c.format = format;
  c.C = C;
  c.R = R;
  c.page_size = page_size;
  c.num_tokens = (int32_t)test_rng_int(rng, 1, 300);
  c.num_pages = (c.num_tokens + page_size - 1) / page_size + (int32_t)test_rng_int(rng, 0, 4);
  c.split_layout = (int)test_rng_int(rng, 0, 1);
  c.rope_layout = test_rng_int(rng, 0, 1) ? INA_MLA_ROPE_HALVES : INA_MLA_ROPE_PAIRS;
  c.positions_dtype = test_rng_int(rng, 0, 1) ? INA_DTYPE_I64 : INA_DTYPE_I32;
  c.kv_stride = C + R + (test_rng_int(rng, 0, 2) ? 0 : test_rng_int(rng, 1, 50));
  return c;
}

/* Every format x rope layout x page size at DeepSeek's dims, then random small shapes. */
static void test_cases(test_rng_t *rng) {
  static const int32_t page_sizes[] = {1, 16, 64};
  for (int f = 0; f < 2; f++)
    for (int layout = 0; layout < 2; layout++)
      for (int ps = 0; ps < 3; ps++) {
        append_case_t c =
            make_case(f ? INA_MLA_CACHE_FP8 : INA_MLA_CACHE_BF16, 512, 64, page_sizes[ps], rng);
        c.rope_layout = layout ? INA_MLA_ROPE_HALVES : INA_MLA_ROPE_PAIRS;
        run_case(&c, rng);
      }
  static const int32_t small[][2] = {{64, 16}, {144, 8}, {128, 16}, {256, 32}, {512, 64}};
  for (int i = 0; i < 40; i++) {
    const int d = (int)test_rng_int(rng, 0, 4);
    ina_mla_cache_format_t format =
        test_rng_int(rng, 0, 1) ? INA_MLA_CACHE_FP8 : INA_MLA_CACHE_BF16;
    if (small[d][0] % 128 != 0) format = INA_MLA_CACHE_BF16;
    append_case_t c =
        make_case(format, small[d][0], small[d][1], page_sizes[test_rng_int(rng, 0, 2)], rng);
    run_case(&c, rng);
  }
  /* One token, one page of one slot. */
  append_case_t one = make_case(INA_MLA_CACHE_FP8, 512, 64, 1, rng);
  one.num_tokens = 1;
  one.num_pages = 1;
  run_case(&one, rng);
}

static void test_arguments(void) {
  ina_mla_append_params_t p = INA_MLA_APPEND_PARAMS_INIT;
  float dummy[4];
  p.cache.format = INA_MLA_CACHE_F32;
  p.cache.kv_lora_rank = 64;
  p.cache.rope_dim = 16;
  p.cache.page_size = 16;
  p.kv_stride = 80;
  ina_log_set_quiet_errors(1);
  CHECK(ina_mla_append(&p, NULL) == INA_ERR_UNSUPPORTED); /* the GPU writes no f32 cache */
  p.cache.format = INA_MLA_CACHE_FP8;                     /* 64 is not whole 128-blocks */
  CHECK(ina_mla_append(&p, NULL) == INA_ERR_UNSUPPORTED);
  p.cache.format = INA_MLA_CACHE_BF16;
  p.num_tokens = 1;
  CHECK(ina_mla_append(&p, NULL) == INA_ERR_INVALID_ARGUMENT); /* NULL pointers */
  p.num_tokens = 0;
  p.cache.latent = (char *)dummy + 1; /* not read: no tokens */
  ina_log_set_quiet_errors(0);
  CHECK_OK(ina_mla_append(&p, NULL));
  CHECK_OK(ina_cuda_synchronize());
}

int main(void) {
  const int skip = test_require_gpus("test_mla_append_gpu", 1);
  if (skip) return skip;
  test_rng_t rng = {test_seed("test_mla_append_gpu")};
  char name[128];
  printf("device: %s\n", ina_cuda_device_name(0, name, sizeof name));
  test_arguments();
  test_cases(&rng);
  printf("test_mla_append_gpu: %lld values compared, %lld not bit-identical\n", (long long)g_values,
         (long long)g_not_identical);
  CHECKF(g_not_identical * 10000 <= g_values, "%lld of %lld values not bit-identical",
         (long long)g_not_identical, (long long)g_values);
  return test_finish("test_mla_append_gpu");
}
