/* GPU MLA attention (mla/mla.h: plan + run) against the CPU reference
 * (ina_mla_attention_ref) on fresh random problems: uniform and skewed lengths (one 32k
 * request among short ones), page sizes 1 / 16 / 64 on shuffled page ids, 1 / 3 / 16 /
 * 128 heads, query lengths 1..16 (and a 128-token chunk), bf16 / FP8 / f32 caches,
 * interleaved and separate padded layouts, small dims (generic kernel), and grids of a few
 * CTAs (many items per CTA, many splits) or more CTAs than SMs. Buckets with 64+ query
 * rows per request (20 / 64 / 128 heads, or 16 heads with 4+ query tokens) take the
 * wgmma kernel (64-row groups; "wgmma" in the report), over a bf16 or an FP8 cache.
 *
 * Outputs are poisoned (NaN) before each run and unread cache slots hold NaN; bf16 out
 * must be within relative L2 1e-2 of the reference, lse within 1e-4 (1e-3 for FP8, whose
 * fast kernel rounds dequantized values to f16), and stride padding must stay untouched.
 *
 * `--small`: a few tiny cases, for compute-sanitizer. Skipped (exit 77) without a GPU. */
#include <time.h>

#include "mla/mla_schedule.h"
#include "tests/gpu_test_util.h"
#include "tests/mla/mla_test_gpu.h"

typedef enum { KV_UNIFORM, KV_SKEWED, KV_TINY } kv_dist_t;

typedef struct spec {
  const char *name;
  mla_shape_t s;
  int32_t num_sms; /* 0: the device's */
  kv_dist_t dist;
  int32_t kv_max;
} spec_t;

#define SHAPE(batch, max_batch, max_q, heads, C, R, page, fmt, layout, padded, odd) \
  {batch, max_batch, max_q, heads, C, R, page, INA_MLA_CACHE_##fmt, MLA_LAYOUT_##layout, padded, odd, 0.0f}

static const spec_t full_specs[] = {
    {"decode h16 bf16 p64", SHAPE(8, 16, 1, 16, 512, 64, 64, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 8192},
    {"decode h16 fp8 p64", SHAPE(8, 16, 1, 16, 512, 64, 64, FP8, PACKED, 0, 0), 0, KV_UNIFORM, 8192},
    {"skewed 32k h16 bf16 p16", SHAPE(24, 32, 1, 16, 512, 64, 16, BF16, PACKED, 0, 0), 0, KV_SKEWED, 32768},
    {"skewed 32k h16 fp8 p64", SHAPE(24, 32, 1, 16, 512, 64, 64, FP8, PACKED, 0, 0), 0, KV_SKEWED, 32768},
    {"page 1 h16 bf16", SHAPE(4, 4, 1, 16, 512, 64, 1, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 2000},
    {"page 1 h16 fp8 q1..4", SHAPE(4, 4, 4, 16, 512, 64, 1, FP8, PACKED, 0, 0), 0, KV_UNIFORM, 2000},
    {"h1 q1..16 bf16 p16", SHAPE(6, 8, 16, 1, 512, 64, 16, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 3000},
    {"h3 q1..16 fp8 p64", SHAPE(6, 8, 16, 3, 512, 64, 64, FP8, PACKED, 0, 0), 0, KV_UNIFORM, 3000},
    {"h128 decode bf16 p64", SHAPE(3, 4, 1, 128, 512, 64, 64, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 2048},
    {"h128 q1..4 fp8 p16", SHAPE(2, 4, 4, 128, 512, 64, 16, FP8, PACKED, 0, 0), 0, KV_UNIFORM, 1024},
    {"h128 q1..4 bf16 p1 skewed", SHAPE(6, 8, 4, 128, 512, 64, 1, BF16, PACKED, 0, 0), 0, KV_SKEWED, 6000},
    {"h128 decode bf16 p64 skewed, 7 CTAs", SHAPE(12, 16, 1, 128, 512, 64, 64, BF16, PACKED, 0, 0), 7, KV_SKEWED, 20000},
    {"h128 decode bf16 p16, 300 CTAs", SHAPE(5, 8, 1, 128, 512, 64, 16, BF16, PACKED, 0, 0), 300, KV_UNIFORM, 3000},
    {"h64 decode bf16 p64", SHAPE(8, 8, 1, 64, 512, 64, 64, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 5000},
    {"h64 q1..2 bf16 p1, 3 CTAs", SHAPE(4, 4, 2, 64, 512, 64, 1, BF16, PACKED, 0, 0), 3, KV_UNIFORM, 1500},
    {"h20 q1..4 bf16 p16 (80 rows)", SHAPE(6, 8, 4, 20, 512, 64, 16, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 3000},
    {"mtp h16 q4 bf16 p64, 5 CTAs", SHAPE(9, 12, 4, 16, 512, 64, 64, BF16, PACKED, 0, 0), 5, KV_UNIFORM, 4000},
    {"h128 q1..3 bf16 separate padded", SHAPE(3, 4, 3, 128, 512, 64, 64, BF16, SEPARATE, 1, 0), 0, KV_UNIFORM, 1200},
    {"h64 fp8 p64 (grouped plan)", SHAPE(5, 8, 1, 64, 512, 64, 64, FP8, PACKED, 0, 0), 0, KV_UNIFORM, 3000},
    {"mtp h16 q1..16 bf16 p64", SHAPE(6, 8, 16, 16, 512, 64, 64, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 8192},
    {"chunk q1..128 h16 bf16 p64", SHAPE(2, 2, 128, 16, 512, 64, 64, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 700},
    {"separate padded h16 bf16 q1..4", SHAPE(5, 8, 4, 16, 512, 64, 16, BF16, SEPARATE, 1, 0), 0, KV_UNIFORM, 3000},
    {"tiny kv, 3 CTAs h16 bf16", SHAPE(40, 64, 2, 16, 512, 64, 16, BF16, PACKED, 0, 0), 3, KV_TINY, 0},
    {"5 CTAs h16 fp8", SHAPE(16, 16, 1, 16, 512, 64, 64, FP8, PACKED, 0, 0), 5, KV_UNIFORM, 3000},
    {"300 CTAs h16 bf16 q1..2", SHAPE(6, 8, 2, 16, 512, 64, 64, BF16, PACKED, 0, 0), 300, KV_UNIFORM, 3000},
    {"generic 64+16 bf16 h3", SHAPE(5, 8, 4, 3, 64, 16, 16, BF16, PACKED, 0, 0), 0, KV_UNIFORM, 3000},
    {"generic 144+8 bf16 separate h5 p1", SHAPE(5, 8, 3, 5, 144, 8, 1, BF16, SEPARATE, 1, 0), 0, KV_UNIFORM, 2000},
    {"generic 32+8 f32 h16", SHAPE(6, 8, 2, 16, 32, 8, 64, F32, PACKED, 0, 0), 0, KV_UNIFORM, 3000},
    {"generic 128+16 fp8 h7, 9 CTAs", SHAPE(5, 8, 2, 7, 128, 16, 16, FP8, PACKED, 0, 0), 9, KV_UNIFORM, 3000},
    {"generic 512+64 odd q stride h16", SHAPE(4, 4, 2, 16, 512, 64, 64, BF16, PACKED, 1, 1), 0, KV_UNIFORM, 2000},
    {"generic 512+64 odd q stride h32 q1..2", SHAPE(3, 4, 2, 32, 512, 64, 16, BF16, PACKED, 1, 1), 0, KV_UNIFORM, 1500},
    {"generic 512+64 f32 cache h16", SHAPE(3, 4, 1, 16, 512, 64, 64, F32, PACKED, 0, 0), 0, KV_UNIFORM, 2000},
};

static const spec_t small_specs[] = {
    {"small decode h16 bf16 p16", SHAPE(3, 4, 1, 16, 512, 64, 16, BF16, PACKED, 0, 0), 4, KV_UNIFORM, 300},
    {"small q1..3 h16 fp8 p64", SHAPE(2, 4, 3, 16, 512, 64, 64, FP8, PACKED, 0, 0), 3, KV_UNIFORM, 200},
    {"small q1..5 h3 bf16 p1", SHAPE(2, 2, 5, 3, 512, 64, 1, BF16, PACKED, 0, 0), 2, KV_UNIFORM, 150},
    {"small h64 q1..2 bf16 p16", SHAPE(2, 2, 2, 64, 512, 64, 16, BF16, PACKED, 0, 0), 3, KV_UNIFORM, 300},
    {"small generic 64+16 bf16 h3", SHAPE(2, 2, 2, 3, 64, 16, 16, BF16, PACKED, 0, 0), 2, KV_UNIFORM, 100},
    {"small generic 128+16 fp8 h2", SHAPE(2, 2, 2, 2, 128, 16, 16, FP8, PACKED, 0, 0), 2, KV_UNIFORM, 100},
};

/* Random lengths for a spec: q_len in 1..max_q_len (sometimes 0), kv_len >= q_len. */
static void draw_lengths(const spec_t *sp, test_rng_t *rng, int32_t *q_lens, int32_t *kv_lens) {
  const int32_t B = sp->s.batch, long_one = (int32_t)test_rng_int(rng, 0, B - 1);
  for (int32_t b = 0; b < B; b++) {
    int32_t q = (int32_t)test_rng_int(rng, 1, sp->s.max_q_len);
    if (B > 2 && test_rng_int(rng, 0, 15) == 0) q = 0; /* a request with no query this step */
    int32_t kv = q;
    switch (sp->dist) {
    case KV_UNIFORM: kv = (int32_t)test_rng_int(rng, q > 0 ? q : 0, sp->kv_max); break;
    case KV_SKEWED: kv = b == long_one ? sp->kv_max : (int32_t)test_rng_int(rng, q, 64); break;
    case KV_TINY: kv = q + (int32_t)test_rng_int(rng, 0, 3); break;
    }
    if (kv < q) kv = q;
    q_lens[b] = q;
    kv_lens[b] = kv;
  }
  if (sp->dist == KV_SKEWED && q_lens[long_one] == 0) q_lens[long_one] = 1;
}

/* One spec with fresh random lengths and data: plan, run, compare. */
static void run_spec(const spec_t *sp, test_rng_t *rng, ina_threadpool_t *pool, double *ref_s,
                     double *gpu_s) {
  int32_t *q_lens = malloc(sizeof(int32_t) * (size_t)sp->s.batch);
  int32_t *kv_lens = malloc(sizeof(int32_t) * (size_t)sp->s.batch);
  mla_case_t c;
  mla_dev_t d;
  ina_mla_plan_info_t info;
  uint16_t *out = NULL;
  float *lse = NULL;
  memset(&c, 0, sizeof c);
  memset(&d, 0, sizeof d);
  CHECK(q_lens && kv_lens);
  if (!q_lens || !kv_lens) goto done;
  mla_shape_t s = sp->s;
  /* DeepSeek's scale is 1/sqrt(192) (times a yarn factor): vary it to get flat and
   * peaked distributions. */
  s.softmax_scale = (float)(test_rng_uniform(rng) * 0.2 + 0.02);
  draw_lengths(sp, rng, q_lens, kv_lens);

  double t0 = test_now_s();
  const int built = mla_case_build(&c, &s, q_lens, kv_lens, rng, pool, 1);
  *ref_s += test_now_s() - t0;
  CHECKF(built, "%s: building the case failed: %s", sp->name, ina_last_error());
  if (!built) goto done;

  t0 = test_now_s();
  CHECK_OK(mla_dev_alloc(&d, &c, sp->num_sms));
  CHECK_OK(mla_dev_upload(&d, &c));
  ina_mla_plan_params_t pp = mla_plan_params(&c, sp->num_sms);
  ina_mla_run_params_t rp = mla_run_params(&c, &d);
  CHECK_OK(ina_mla_plan(&pp, d.host_ws, d.ws, NULL, &info));
  CHECK_OK(ina_mla_run(&info, d.ws, &rp, NULL));
  CHECK_OK(ina_cuda_synchronize());
  out = malloc(2 * (size_t)c.out_elems);
  lse = malloc(4 * (size_t)(c.tokens > 0 ? c.tokens : 1) * (size_t)s.num_heads);
  CHECK(out && lse);
  if (!out || !lse) goto done;
  CHECK_OK(ina_cuda_memcpy_d2h(out, d.out, 2 * (size_t)c.out_elems));
  CHECK_OK(ina_cuda_memcpy_d2h(lse, d.lse, 4 * (size_t)(c.tokens > 0 ? c.tokens : 1) * (size_t)s.num_heads));
  *gpu_s += test_now_s() - t0;

  const double lse_bound = s.format == INA_MLA_CACHE_FP8 && info.path == INA_MLA_PATH_FAST ? 1e-3 : 1e-4;
  double out_err = 0, lse_err = 0;
  const int ok = mla_case_compare(&c, out, lse, lse_bound, sp->name, &out_err, &lse_err);
  CHECKF(ok, "%s: GPU result differs from the reference", sp->name);
  const int64_t stray = mla_stray_writes(&c, out);
  CHECKF(stray == 0, "%s: %lld output elements outside the tensor were written", sp->name, (long long)stray);
  int32_t max_kv = 0;
  for (int32_t b = 0; b < s.batch; b++) max_kv = kv_lens[b] > max_kv ? kv_lens[b] : max_kv;
  /* the kernel ina_mla_run picks (mla_run.cu), for the report */
  const int grouped = ina_mla_group_tiles(s.max_q_len, s.num_heads, s.kv_lora_rank, s.rope_dim) > 1;
  const char *kernel = info.path != INA_MLA_PATH_FAST || s.odd_stride || s.format == INA_MLA_CACHE_F32 ? "generic"
                       : grouped ? "wgmma  "
                                                                   : "mma    ";
  printf("  %-36s tokens %4d max kv %5d kernel %s CTAs %3d max splits %3d: out %.2e lse %.2e%s\n",
         sp->name, c.tokens, max_kv, kernel, info.num_ctas,
         info.num_splits_max, out_err, lse_err, ok && stray == 0 ? "" : "  FAILED");
done:
  mla_dev_free(&d);
  mla_case_free(&c);
  free(out);
  free(lse);
  free(q_lens);
  free(kv_lens);
}

int main(int argc, char **argv) {
  const int small = argc > 1 && strcmp(argv[1], "--small") == 0;
  const int skip = test_require_gpus("test_mla_gpu", 1);
  if (skip) return skip;
  char name[128];
  printf("test_mla_gpu: %s%s\n", ina_cuda_device_name(0, name, sizeof name), small ? " (small)" : "");
  test_rng_t rng = {test_seed("test_mla_gpu")};
  ina_threadpool_t *pool = NULL;
  CHECK_OK(ina_threadpool_create(0, &pool));
  const spec_t *specs = small ? small_specs : full_specs;
  const size_t n = small ? sizeof small_specs / sizeof *small_specs : sizeof full_specs / sizeof *full_specs;
  const int reps = small ? 1 : 2;
  double ref_s = 0, gpu_s = 0;
  for (int rep = 0; rep < reps; rep++)
    for (size_t i = 0; i < n; i++) run_spec(&specs[i], &rng, pool, &ref_s, &gpu_s);
  printf("test_mla_gpu: reference %.1f s, GPU side (copies included) %.1f s\n", ref_s, gpu_s);
  ina_threadpool_destroy(pool);
  return test_finish("test_mla_gpu");
}
