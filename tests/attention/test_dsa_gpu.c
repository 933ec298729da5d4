/* The GPU lightning indexer (attention/dsa_gpu.h: index scores and top-k) against the
 * plain-C reference (attention/dsa.h, INA_DSA_BACKEND_REF) on fresh random inputs.
 *
 * Score cases: ragged batches of decode (q_len 1), MTP (q_len 2..4) and prefill chunks
 * (q_len up to 300) with some requests shorter than k and some longer; page sizes 1, 16
 * and 64 with shuffled, non-contiguous page ids; 1, 3, 20 and 64 heads; head_dim 16, 64
 * and 128; bf16 keys and both FP8 layouts (inline, paged); k 1, 7 and 2048; a
 * score_stride past the bucket's max_kv_len; buckets larger than the step. The CUDA-core
 * fallback gets its own cases: 4 heads x 40 dims (bf16, FP8 inline and paged, page sizes
 * 1 and 64), 5 x 17 (FP8 rows and scales at odd addresses), 3 x 1, 65 x 128 and the
 * largest shape, 128 x 256; and shapes the tensor cores take (3 x 16, 3 x 32, 64 x 128)
 * with the device cache 1 to 3 bytes past an aligned address, which sends them to the
 * fallback too. The reference gets the SAME bf16-rounded q, converted to f32, and the same
 * cache bytes.
 *
 * Score bound (checked on every element). Both sides read identical key values (bf16, or
 * e4m3 bytes that convert exactly, times the same f32 scale) and identical q, so every
 * product q_hd k_d is exact on both. The reference sums in double and rounds once; the
 * GPU's tensor core adds the D products in fp32 in its own order (the error of one
 * addition is at most 2^-23 of the magnitudes involved, allowing truncation instead of
 * rounding), the epilogue rounds c = softmax_scale * scale_t and acc * c once each (2^-24
 * each), relu is 1-Lipschitz, and the sum over heads of w_h * relu(.) by fma adds H
 * more roundings. With A_h = c * sum_d |q_hd k_d| (k_d the stored value, FP8 before its
 * scale, which c carries) and S = sum_h |w_h| A_h:
 *   |gpu - ref| <= 2^-23 (D + H + 4) S + 2^-24 |ref| + 2^-126
 * The test allows twice that.
 *
 * FP8 query (INA_DSA_GPU_QUERY_FP8). The reference gets q rounded to FP8 per head
 * (ina_dsa_index_query_round_fp8: the GPU's bytes times its scale, within 2^-24), so both
 * sides multiply the same e4m3 values, exactly. The FP8 tensor cores do not accumulate in
 * fp32: Hopper keeps 13 fraction bits (DeepSeek-V3's report measures about 14 significant
 * bits). Model, per wgmma of 32 dims: its 32 products and the incoming accumulator are
 * aligned to the largest, 2^e <= M < 2^(e+1), each truncated to a multiple of 2^(e-13)
 * (losing less than that, and no more than itself), and the sum is stored to 13 fraction
 * bits again. fp8_accumulation_error adds these losses up over the head's dims: E_h. With
 * F_h = |w_h sq_h| softmax_scale |scale_t| and S = sum_h F_h sum_d |q8_hd k_d|:
 *   |gpu - ref| <= sum_h F_h E_h + 2^-23 (H + 6) S + 2^-24 |ref| + 2^-126
 * (the epilogue's roundings as above, one more for w_h sq_h and one for the reference's
 * f32 q); the test allows twice that. E_h is about 2^-13 of sum_d |q8_hd k_d| times a few,
 * so a 5 % error of the score stands out only where the heads' terms do not cancel: the
 * FP8 query's shapes draw positive weights (the mutation check below then catches it on
 * nearly every position; with signed weights |ref| is ~1 % of S and it could not).
 *
 * The CUDA-core fallback rounds the same steps (fp32 fma over
 * the D dims in order, c, acc * c, H fmas over the heads), so one bound serves both
 * kernels. A relative L2 bound would hide a bug in a few elements;
 * this per-element bound does not. Positions from visible to score_stride - 1 must be
 * exactly -INFINITY; rows of the bucket past the step's tokens must keep their poison.
 *
 * Top-k: the GPU top-k and the reference top-k on the SAME (GPU-produced) scores must
 * agree exactly in every index (the order is fully determined by the scores). Further
 * rows are made for the top-k alone (uploaded scores): many exact ties, -INFINITY, NaN
 * (both signs), -0 against +0, all-equal rows, rows shorter than k, and long rows of
 * 65536 .. 131072 positions with k = 2048 (random, tie-heavy and mostly-NaN).
 *
 * End to end: GPU score -> GPU top-k against ref score -> ref top-k. Rows whose selected
 * sets differ are counted (reported as near ties); every difference must be explained by
 * the score bound: for x selected only by the GPU and y only by the reference,
 * ref[y] - ref[x] <= b_x + b_y, i.e. max_y (ref[y] - b_y) <= min_x (ref[x] + b_x).
 *
 * Graph: score + top-k captured once in a CUDA graph; re-planned with other lengths and
 * page tables of the same bucket (new data in the same buffers), replayed and checked as
 * above; a batch-0 plan replayed must leave the poisoned outputs untouched.
 *
 * Mutations (reasoned through; each must make this test fail; the first is also run, see
 * check_mutation: the reference times 1.05 must fall outside the bound at more than half
 * of the nonzero positions of every shape):
 *  - scale x1.05 on one head in the epilogue: that head's term changes by 5 % of
 *    w_h relu(.), far above 2^-22 (D + H + 4) S ~ 1e-4 S for most positions: the score
 *    check fails on nearly every element.
 *  - ties broken by higher position (pmask - t replaced by t): the tie rows (values from
 *    {0, 1, 2, 3}, all-equal rows) give other indices: the exact top-k check fails.
 *  - NaN mapped above -inf (or -0 != +0): the NaN / signed-zero rows differ: exact check.
 *  - off by one at the causal bound (visible - 1 or visible + 1 positions scored): with
 *    visible + 1, position visible holds a score instead of -inf (the -inf check fails);
 *    with visible - 1 the last visible position holds -inf (the score check fails, the
 *    reference has a finite score there); the top-k reading one more position selects
 *    it in rows where visible < k (exact check on the same scores).
 *  - the FP8 scale ignored or read from the neighbouring slot: wrong by the ratio of
 *    two scales on most positions: the score check.
 *  - a wrong page lookup (t / page_size off, or indptr of the next request): different
 *    keys: the score check (page tables are shuffled, so neighbouring pages differ).
 *  - -inf tail not written, or the kernel writing rows past total_tokens: poison checks.
 *  - a graph whose kernels kept the captured step's lengths: the replay after a re-plan
 *    differs from the reference of the new lengths.
 *
 * Skipped (exit 77) without a GPU; INA_REQUIRE_GPU=1 makes that a failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/dsa.h"
#include "attention/dsa_gpu.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "tests/gpu_test_util.h"

#if INA_HAVE_CUDA
#include <cuda_runtime.h>

#define NAME "test_dsa_gpu"
#define CUDA_OK(call) CHECKF((call) == cudaSuccess, "%s failed", #call)

/* KEYS_FP8_PADDED: the engine's entry, [e4m3 x dim | f32 scale] padded to 16 bytes. */
typedef enum { KEYS_BF16, KEYS_FP8_INLINE, KEYS_FP8_PAGED, KEYS_FP8_PADDED } key_layout_t;
static const char *layout_name[] = {"bf16", "fp8-inline", "fp8-paged", "fp8-padded"};

typedef struct shape {
  const char *name;
  int32_t batch, q_min, q_max, kv_min, kv_max; /* kv_len in [max(q, kv_min), kv_max] */
  int32_t page_size, heads, dim, topk;
  key_layout_t layout;
  int32_t extra_tokens, extra_kv, extra_stride; /* bucket and stride past the step */
  int32_t key_offset; /* bytes the device cache starts past an aligned address */
  int32_t fp8_query;  /* INA_DSA_GPU_QUERY_FP8 (the reference gets the FP8-rounded q) */
} shape_t;

static const shape_t shapes[] = {
    {"decode b8 h64 d128 fp8-paged p64 k2048", 8, 1, 1, 100, 5000, 64, 64, 128, 2048, KEYS_FP8_PAGED, 4, 1000, 0, 0, 0},
    {"decode b6 h64 d128 fp8-inline p16 k7", 6, 1, 1, 1, 3000, 16, 64, 128, 7, KEYS_FP8_INLINE, 0, 0, 0, 0, 0},
    {"mtp b5 q2..4 h64 d128 bf16 p1 k2048", 5, 2, 4, 1000, 3500, 1, 64, 128, 2048, KEYS_BF16, 3, 0, 37, 0, 0},
    {"prefill b2 q..300 h3 d64 bf16 p16 k1", 2, 1, 300, 1, 700, 16, 3, 64, 1, KEYS_BF16, 0, 200, 0, 0, 0},
    {"prefill b3 q..200 h64 d64 fp8-paged p16 k7", 3, 50, 200, 200, 900, 16, 64, 64, 7, KEYS_FP8_PAGED, 0, 0, 5, 0, 0},
    {"ragged b7 q1..4 h20 d128 fp8-paged p64 k2048", 7, 1, 4, 1, 4000, 64, 20, 128, 2048, KEYS_FP8_PAGED, 2, 0, 0, 0, 0},
    {"decode b9 h1 d64 fp8-inline p1 k7", 9, 1, 1, 1, 2000, 1, 1, 64, 7, KEYS_FP8_INLINE, 0, 0, 0, 0, 0},
    {"mtp b4 q1..3 h3 d128 fp8-inline p64 k2048", 4, 1, 3, 1, 2500, 64, 3, 128, 2048, KEYS_FP8_INLINE, 1, 3000, 100, 0, 0},
    {"decode b4 h64 d128 bf16 p64 k2048", 4, 1, 1, 2049, 6000, 64, 64, 128, 2048, KEYS_BF16, 0, 0, 0, 0, 0},
    {"decode b3 h20 d16 bf16 p1 k7", 3, 1, 1, 1, 1500, 1, 20, 16, 7, KEYS_BF16, 0, 0, 0, 0, 0},
    {"decode b3 h64 d48 fp8-paged p16 k1", 3, 1, 1, 1, 1200, 16, 64, 48, 1, KEYS_FP8_PAGED, 0, 0, 0, 0, 0},
    /* The CUDA-core kernel: shapes the tensor cores do not take (V3.2 test fixtures with
     * 4 heads x 40 dims, odd dims, more than 64 heads, the largest shape) ... */
    {"decode b6 h4 d40 bf16 p1 k7", 6, 1, 1, 1, 2500, 1, 4, 40, 7, KEYS_BF16, 2, 0, 0, 0, 0},
    {"decode b5 h4 d40 bf16 p64 k2048", 5, 1, 1, 100, 4000, 64, 4, 40, 2048, KEYS_BF16, 0, 500, 3, 0, 0},
    {"mtp b4 q1..3 h4 d40 fp8-paged p64 k2048", 4, 1, 3, 1, 3000, 64, 4, 40, 2048, KEYS_FP8_PAGED, 1, 0, 0, 0, 0},
    {"prefill b2 q..150 h4 d40 fp8-inline p1 k7", 2, 1, 150, 1, 600, 1, 4, 40, 7, KEYS_FP8_INLINE, 0, 100, 0, 0, 0},
    {"decode b4 h4 d40 fp8-paged p1 k7", 4, 1, 1, 1, 1500, 1, 4, 40, 7, KEYS_FP8_PAGED, 0, 0, 0, 0, 0},
    {"decode b4 h4 d40 fp8-inline p64 k7", 4, 1, 1, 1, 1500, 64, 4, 40, 7, KEYS_FP8_INLINE, 0, 0, 0, 0, 0},
    {"decode b4 h5 d17 fp8-inline p1 k7 (byte-aligned rows and scales)", 4, 1, 1, 1, 1200, 1, 5, 17, 7, KEYS_FP8_INLINE, 0, 0, 0, 0, 0},
    {"mtp b3 q1..2 h3 d1 bf16 p64 k7", 3, 1, 2, 1, 900, 64, 3, 1, 7, KEYS_BF16, 0, 0, 0, 0, 0},
    {"decode b3 h65 d128 fp8-paged p64 k2048", 3, 1, 1, 1, 2500, 64, 65, 128, 2048, KEYS_FP8_PAGED, 0, 0, 0, 0, 0},
    {"decode b2 h128 d256 bf16 p16 k7", 2, 1, 2, 1, 700, 16, 128, 256, 7, KEYS_BF16, 1, 0, 0, 0, 0},
    {"decode b2 h128 d256 fp8-inline p1 k7", 2, 1, 1, 1, 500, 1, 128, 256, 7, KEYS_FP8_INLINE, 0, 0, 0, 0, 0},
    /* ... and shapes the tensor cores take, given rows they cannot load (the fallback
     * again); 3 heads x 16 and x 32 (V3.2 fixtures) also run on the tensor cores. */
    {"decode b5 h3 d16 bf16 p1 k7", 5, 1, 1, 1, 2000, 1, 3, 16, 7, KEYS_BF16, 0, 0, 0, 0, 0},
    {"mtp b4 q1..3 h3 d32 fp8-paged p64 k2048", 4, 1, 3, 1, 3000, 64, 3, 32, 2048, KEYS_FP8_PAGED, 0, 0, 0, 0, 0},
    {"decode b5 h3 d16 bf16 p64 k7 (keys +2 bytes)", 5, 1, 1, 1, 2000, 64, 3, 16, 7, KEYS_BF16, 0, 0, 0, 2, 0},
    {"decode b5 h3 d16 fp8-inline p1 k7 (keys +1 byte)", 5, 1, 1, 1, 2000, 1, 3, 16, 7, KEYS_FP8_INLINE, 0, 0, 0, 1, 0},
    {"mtp b4 q1..3 h3 d32 fp8-paged p1 k7 (keys +3 bytes)", 4, 1, 3, 1, 1500, 1, 3, 32, 7, KEYS_FP8_PAGED, 0, 0, 0, 3, 0},
    {"decode b3 h64 d128 bf16 p64 k2048 (keys +2 bytes)", 3, 1, 1, 1, 3000, 64, 64, 128, 2048, KEYS_BF16, 0, 0, 0, 2, 0},
    /* The FP8 query (DeepSeek's release indexer, FP8 tensor cores): V3.2's 64 x 128 on the
     * paged and the engine's padded layout, MTP and prefill rows, fewer and odd heads,
     * every dim-step count (32, 64, 96, 128 dims), page sizes 1, 16 and 64. */
    {"decode b8 h64 d128 fp8-paged p64 k2048 fp8-query", 8, 1, 1, 100, 5000, 64, 64, 128, 2048, KEYS_FP8_PAGED, 4, 1000, 0, 0, 1},
    {"mtp b5 q1..4 h64 d128 fp8-padded p1 k2048 fp8-query", 5, 1, 4, 1, 3500, 1, 64, 128, 2048, KEYS_FP8_PADDED, 3, 0, 37, 0, 1},
    {"prefill b3 q..200 h20 d64 fp8-paged p16 k7 fp8-query", 3, 50, 200, 200, 900, 16, 20, 64, 7, KEYS_FP8_PAGED, 0, 0, 5, 0, 1},
    {"decode b4 h3 d32 fp8-padded p64 k7 fp8-query", 4, 1, 1, 1, 2500, 64, 3, 32, 7, KEYS_FP8_PADDED, 0, 0, 0, 0, 1},
    {"mtp b4 q1..3 h63 d96 fp8-paged p64 k2048 fp8-query", 4, 1, 3, 1, 3000, 64, 63, 96, 2048, KEYS_FP8_PAGED, 1, 0, 0, 0, 1},
};

/* One step's inputs on the host. */
typedef struct step {
  int32_t batch, tokens, max_kv;
  int32_t *qo_indptr, *kv_len, *kv_indptr, *kv_indices;
  int64_t num_pages;
} step_t;

static void step_free(step_t *s) {
  free(s->qo_indptr);
  free(s->kv_len);
  free(s->kv_indptr);
  free(s->kv_indices);
  memset(s, 0, sizeof *s);
}

/* Random lengths and a shuffled page table over num_pages pages (more than needed). */
static void make_step(const shape_t *sh, int32_t batch, test_rng_t *rng, step_t *s) {
  memset(s, 0, sizeof *s);
  s->batch = batch;
  s->qo_indptr = calloc((size_t)batch + 1, sizeof(int32_t));
  s->kv_len = calloc((size_t)batch + 1, sizeof(int32_t));
  s->kv_indptr = calloc((size_t)batch + 1, sizeof(int32_t));
  int64_t pages = 0;
  for (int32_t b = 0; b < batch; b++) {
    const int32_t q = (int32_t)test_rng_int(rng, sh->q_min, sh->q_max);
    int32_t lo = sh->kv_min > q ? sh->kv_min : q;
    if (lo > sh->kv_max) lo = sh->kv_max;
    const int32_t kv = (int32_t)test_rng_int(rng, lo, sh->kv_max);
    s->qo_indptr[b + 1] = s->qo_indptr[b] + (q <= kv ? q : kv);
    s->kv_len[b] = kv;
    if (kv > s->max_kv) s->max_kv = kv;
    pages += (kv + sh->page_size - 1) / sh->page_size;
    s->kv_indptr[b + 1] = (int32_t)pages;
  }
  s->tokens = s->qo_indptr[batch];
  s->num_pages = pages + pages / 3 + 2;
  /* A random injection of the used slots into [0, num_pages). */
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)s->num_pages);
  for (int64_t i = 0; i < s->num_pages; i++) perm[i] = (int32_t)i;
  for (int64_t i = s->num_pages - 1; i > 0; i--) {
    const int64_t j = test_rng_int(rng, 0, i);
    const int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  s->kv_indices = malloc(sizeof(int32_t) * (size_t)(pages ? pages : 1));
  memcpy(s->kv_indices, perm, sizeof(int32_t) * (size_t)pages);
  free(perm);
}

static int64_t padded_token_bytes(int32_t dim) { return ((int64_t)dim + 4 + 15) / 16 * 16; }

static ina_dsa_index_cache_t cache_of(key_layout_t layout, const void *keys, int32_t ps, int32_t dim) {
  if (layout == KEYS_BF16) return ina_dsa_index_cache_dense(INA_DSA_KEY_BF16, keys, ps, dim);
  if (layout == KEYS_FP8_INLINE) return ina_dsa_index_cache_fp8_inline(keys, ps, dim);
  if (layout == KEYS_FP8_PADDED) {
    ina_dsa_index_cache_t c = ina_dsa_index_cache_fp8_inline(keys, ps, dim);
    c.token_stride = c.scale_stride = padded_token_bytes(dim);
    c.page_stride = c.token_stride * ps;
    return c;
  }
  return ina_dsa_index_cache_fp8_paged(keys, ps, dim);
}

/* Bytes of one page of the cache in `layout`. */
static int64_t page_bytes_of(key_layout_t layout, int32_t ps, int32_t dim) {
  if (layout == KEYS_FP8_PADDED) return padded_token_bytes(dim) * ps;
  return ina_dsa_index_key_bytes(layout == KEYS_BF16 ? INA_DSA_KEY_BF16 : INA_DSA_KEY_FP8, dim) * ps;
}

/* Host data of one step: cache bytes, q (bf16 bits and their f32 values), weights. */
typedef struct inputs {
  void *cache;
  size_t cache_bytes;
  ina_dsa_index_cache_t desc; /* over the host cache */
  uint16_t *q16;
  float *q32, *w;
  /* FP8 query: q rounded to FP8 (the reference's q), its e4m3 values before the scale,
   * and the scale of each token's head. */
  float *q8, *qe, *qscale;
} inputs_t;

static void inputs_free(inputs_t *in) {
  free(in->cache);
  free(in->q16);
  free(in->q32);
  free(in->w);
  free(in->q8);
  free(in->qe);
  free(in->qscale);
  memset(in, 0, sizeof *in);
}

static void make_inputs(const shape_t *sh, const step_t *s, test_rng_t *rng, inputs_t *in) {
  memset(in, 0, sizeof *in);
  const int32_t D = sh->dim, H = sh->heads;
  const int64_t page_bytes = page_bytes_of(sh->layout, sh->page_size, D);
  in->cache_bytes = (size_t)(page_bytes * s->num_pages);
  in->cache = malloc(in->cache_bytes);
  memset(in->cache, 0xFF, in->cache_bytes); /* unused slots: NaN bf16 / NaN e4m3 */
  in->desc = cache_of(sh->layout, in->cache, sh->page_size, D);
  float *key = malloc(sizeof(float) * (size_t)D);
  for (int32_t b = 0; b < s->batch; b++)
    for (int32_t t = 0; t < s->kv_len[b]; t++) {
      /* Keys of varied magnitude (FP8 scales differ per token), a few all-zero. */
      const float mag = (float)exp(test_rng_normal(rng));
      const int zero = test_rng_int(rng, 0, 199) == 0;
      for (int32_t d = 0; d < D; d++) key[d] = zero ? 0.0f : mag * test_rng_normal(rng);
      const int32_t page = s->kv_indices[s->kv_indptr[b] + t / sh->page_size];
      CHECK_OK(ina_dsa_index_key_store(&in->desc, page, t % sh->page_size, key, D));
    }
  free(key);
  const size_t nq = (size_t)s->tokens * H * D, nw = (size_t)s->tokens * H;
  in->q16 = malloc(sizeof(uint16_t) * (nq ? nq : 1));
  in->q32 = malloc(sizeof(float) * (nq ? nq : 1));
  in->w = malloc(sizeof(float) * (nw ? nw : 1));
  for (size_t i = 0; i < nq; i++) {
    in->q16[i] = ina_f32_to_bf16(test_rng_normal(rng));
    in->q32[i] = ina_bf16_to_f32(in->q16[i]);
  }
  /* The FP8 query's weights are positive: its bound grows with sum_h |w_h| (...), which a
   * 5 % error of the score outweighs only when the heads' terms do not cancel (see the
   * header's FP8 query bound). */
  for (size_t i = 0; i < nw; i++)
    in->w[i] = (sh->fp8_query ? fabsf(test_rng_normal(rng)) : test_rng_normal(rng)) / sqrtf((float)H);
  if (!sh->fp8_query) return;
  in->q8 = malloc(sizeof(float) * (nq ? nq : 1));
  in->qe = malloc(sizeof(float) * (nq ? nq : 1));
  in->qscale = malloc(sizeof(float) * (nw ? nw : 1));
  CHECK_OK(ina_dsa_index_query_round_fp8(in->q32, (int32_t)nw, D, in->q8));
  uint8_t *bytes = malloc((size_t)D);
  for (size_t r = 0; r < nw; r++) {
    CHECK_OK(ina_dsa_index_key_quantize_fp8(in->q32 + r * D, D, bytes, &in->qscale[r]));
    ina_to_f32(bytes, INA_DTYPE_FP8_E4M3, in->qe + r * D, (size_t)D);
  }
  free(bytes);
}

/* Device buffers of a bucket, reused across steps (graph replays need fixed pointers). */
typedef struct device {
  void *host_ws, *ws;
  void *cache;
  uint16_t *q;
  float *w, *scores;
  int32_t *indices, *kv_indptr, *kv_indices;
  size_t cache_cap, q_cap, w_cap, indptr_cap, indices_cap;
} device_t;

static void device_free(device_t *d) {
  if (d->host_ws) cudaFreeHost(d->host_ws);
  cudaFree(d->ws);
  cudaFree(d->cache);
  cudaFree(d->q);
  cudaFree(d->w);
  cudaFree(d->scores);
  cudaFree(d->indices);
  cudaFree(d->kv_indptr);
  cudaFree(d->kv_indices);
  memset(d, 0, sizeof *d);
}

/* Bucket of a shape: max_tokens / max_kv_len / stride from the step's plus the extras. */
typedef struct bucket {
  int32_t max_tokens, max_kv, stride;
} bucket_t;

static ina_dsa_gpu_plan_params_t plan_params(const shape_t *sh, const bucket_t *bk, const step_t *s) {
  ina_dsa_gpu_plan_params_t p = INA_DSA_GPU_PLAN_PARAMS_INIT;
  p.batch = s->batch;
  p.qo_indptr = s->qo_indptr;
  p.kv_len = s->kv_len;
  p.max_tokens = bk->max_tokens;
  p.max_kv_len = bk->max_kv;
  p.page_size = sh->page_size;
  p.num_heads = sh->heads;
  p.head_dim = sh->dim;
  p.topk = sh->topk;
  p.score_stride = bk->stride;
  return p;
}

static int device_alloc(device_t *d, const shape_t *sh, const bucket_t *bk, size_t cache_cap,
                        size_t indices_cap, int32_t max_batch) {
  memset(d, 0, sizeof *d);
  ina_dsa_gpu_plan_params_t p = plan_params(sh, bk, &(step_t){0});
  size_t hb = 0, db = 0;
  CHECK_OK(ina_dsa_gpu_workspace_size(&p, &hb, &db));
  const size_t T = (size_t)bk->max_tokens;
  d->cache_cap = cache_cap;
  d->q_cap = T * sh->heads * sh->dim;
  d->w_cap = T * sh->heads;
  d->indptr_cap = (size_t)max_batch + 1;
  d->indices_cap = indices_cap;
  int ok = cudaHostAlloc(&d->host_ws, hb, cudaHostAllocDefault) == cudaSuccess &&
           cudaMalloc(&d->ws, db) == cudaSuccess && cudaMalloc(&d->cache, cache_cap + 16) == cudaSuccess &&
           cudaMalloc((void **)&d->q, 2 * d->q_cap) == cudaSuccess &&
           cudaMalloc((void **)&d->w, 4 * d->w_cap) == cudaSuccess &&
           cudaMalloc((void **)&d->scores, 4 * T * (size_t)bk->stride) == cudaSuccess &&
           cudaMalloc((void **)&d->indices, 4 * T * (size_t)sh->topk) == cudaSuccess &&
           cudaMalloc((void **)&d->kv_indptr, 4 * d->indptr_cap) == cudaSuccess &&
           cudaMalloc((void **)&d->kv_indices, 4 * (indices_cap ? indices_cap : 1)) == cudaSuccess;
  CHECKF(ok, "device allocation failed");
  return ok;
}

/* Copies a step's inputs into the device buffers and poisons the outputs (0xFF: NaN
 * scores; 0x7F: indices 0x7F7F7F7F, never a valid answer). */
static int upload(device_t *d, const shape_t *sh, const bucket_t *bk, const step_t *s, const inputs_t *in) {
  const size_t T = (size_t)bk->max_tokens;
  int ok = in->cache_bytes <= d->cache_cap && (size_t)s->kv_indptr[s->batch] <= d->indices_cap;
  CHECKF(ok, "step does not fit the device buffers");
  if (!ok) return 0;
  ok = cudaMemcpy((char *)d->cache + sh->key_offset, in->cache, in->cache_bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(d->q, in->q16, 2 * (size_t)s->tokens * sh->heads * sh->dim, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(d->w, in->w, 4 * (size_t)s->tokens * sh->heads, cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(d->kv_indptr, s->kv_indptr, 4 * ((size_t)s->batch + 1), cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemcpy(d->kv_indices, s->kv_indices, 4 * (size_t)s->kv_indptr[s->batch], cudaMemcpyHostToDevice) == cudaSuccess &&
       cudaMemset(d->scores, 0xFF, 4 * T * (size_t)bk->stride) == cudaSuccess &&
       cudaMemset(d->indices, 0x7F, 4 * T * (size_t)sh->topk) == cudaSuccess;
  CHECKF(ok, "upload failed");
  return ok;
}

static ina_dsa_gpu_score_run_params_t score_params(const device_t *d, const shape_t *sh) {
  ina_dsa_gpu_score_run_params_t p = INA_DSA_GPU_SCORE_RUN_PARAMS_INIT;
  p.q = d->q;
  p.weights = d->w;
  p.cache = cache_of(sh->layout, (char *)d->cache + sh->key_offset, sh->page_size, sh->dim);
  p.kv_indptr = d->kv_indptr;
  p.kv_indices = d->kv_indices;
  p.softmax_scale = 1.0f / sqrtf((float)sh->dim);
  p.scores = d->scores;
  p.query_format = sh->fp8_query ? INA_DSA_GPU_QUERY_FP8 : INA_DSA_GPU_QUERY_BF16;
  return p;
}

/* ---- the reference and the bounds --------------------------------------------------- */

typedef struct expect {
  float *ref;     /* [tokens, stride] reference scores */
  float *bound;   /* [tokens, stride] allowed |gpu - ref| */
  int32_t *visible;
} expect_t;

static void expect_free(expect_t *e) {
  free(e->ref);
  free(e->bound);
  free(e->visible);
  memset(e, 0, sizeof *e);
}

typedef struct bound_job {
  const shape_t *sh;
  const step_t *s;
  const inputs_t *in;
  const int32_t *request;
  expect_t *e;
  int32_t stride;
  float softmax_scale;
} bound_job_t;

/* The FP8 tensor cores' accumulation of one head's dot product q . k (e4m3 values, each
 * product exact), as the header models it: per wgmma of 32 dims, the 32 products and the
 * incoming accumulator are aligned to the largest of them, 2^e <= M < 2^(e+1), each
 * keeping its bits down to 2^(e-13) (truncated: it loses less than that, and at most its
 * own magnitude), and the sum is stored to 13 fraction bits again. Sets *abs_sum to
 * sum_d |q_d k_d| and *err to the bound on |gpu acc - exact dot| (first-order: the
 * incoming accumulator's magnitude is taken as |exact partial sum| + the error so far). */
static void fp8_accumulation_error(const float *q, const float *key, int32_t D, double *abs_sum, double *err) {
  double partial = 0, E = 0, S = 0;
  for (int32_t k0 = 0; k0 < D; k0 += 32) {
    const int32_t k1 = k0 + 32 < D ? k0 + 32 : D;
    double M = fabs(partial) + E, sum = 0;
    for (int32_t d = k0; d < k1; d++) {
      const double p = (double)q[d] * key[d];
      if (fabs(p) > M) M = fabs(p);
    }
    if (M == 0) continue;
    const double quantum = ldexp(1.0, ilogb(M) - 13);
    double loss = fmin(fabs(partial) + E, quantum);
    for (int32_t d = k0; d < k1; d++) {
      const double p = (double)q[d] * key[d];
      loss += fmin(fabs(p), quantum);
      sum += p;
      S += fabs(p);
    }
    partial += sum;
    E += loss + ldexp(fabs(partial) + E + loss, -13);
  }
  *abs_sum = S;
  *err = E;
}

/* The error model of the header, per element, in double. */
static void bound_items(void *ctx, int64_t begin, int64_t end, int worker) {
  (void)worker;
  const bound_job_t *j = ctx;
  const int32_t H = j->sh->heads, D = j->sh->dim, ps = j->sh->page_size;
  const ina_dsa_index_cache_t *c = &j->in->desc;
  float *key = malloc(sizeof(float) * (size_t)D);
  for (int64_t s = begin; s < end; s++) {
    const int32_t b = j->request[s];
    for (int32_t t = 0; t < j->e->visible[s]; t++) {
      const int64_t page = j->s->kv_indices[j->s->kv_indptr[b] + t / ps], slot = t % ps;
      const char *base = (const char *)c->keys + page * c->page_stride;
      double kscale = 1.0;
      if (c->format == INA_DSA_KEY_FP8) {
        float f;
        memcpy(&f, base + c->scale_offset + slot * c->scale_stride, sizeof f);
        kscale = f;
        ina_to_f32(base + slot * c->token_stride, INA_DTYPE_FP8_E4M3, key, (size_t)D);
      } else {
        ina_to_f32(base + slot * c->token_stride, INA_DTYPE_BF16, key, (size_t)D);
      }
      const double ref = j->e->ref[s * j->stride + t];
      double S = 0, bound;
      if (!j->sh->fp8_query) {
        for (int32_t h = 0; h < H; h++) {
          const float *q = j->in->q32 + (s * H + h) * D;
          double a = 0;
          for (int32_t d = 0; d < D; d++) a += fabs((double)q[d] * key[d]);
          S += fabs((double)j->in->w[s * H + h]) * a * fabs(kscale) * j->softmax_scale;
        }
        bound = ldexp((double)(D + H + 4), -23) * S + ldexp(fabs(ref), -24) + ldexp(1.0, -126);
      } else {
        double acc_err = 0; /* sum_h F_h E_h, the tensor cores' part */
        for (int32_t h = 0; h < H; h++) {
          const float *q = j->in->qe + (s * H + h) * D;
          double a = 0, E = 0;
          fp8_accumulation_error(q, key, D, &a, &E);
          const double F = fabs((double)j->in->w[s * H + h] * j->in->qscale[s * H + h]) * fabs(kscale) * j->softmax_scale;
          S += F * a;
          acc_err += F * E;
        }
        bound = acc_err + ldexp((double)(H + 6), -23) * S + ldexp(fabs(ref), -24) + ldexp(1.0, -126);
      }
      j->e->bound[s * j->stride + t] = (float)(2.0 * bound);
    }
  }
  free(key);
}

static int reference(const shape_t *sh, const bucket_t *bk, const step_t *s, const inputs_t *in,
                     ina_threadpool_t *pool, expect_t *e) {
  memset(e, 0, sizeof *e);
  ina_dsa_score_plan_params_t pp = INA_DSA_SCORE_PLAN_PARAMS_INIT;
  pp.backend = INA_DSA_BACKEND_REF;
  pp.batch = s->batch;
  pp.qo_indptr = s->qo_indptr;
  pp.kv_len = s->kv_len;
  pp.num_heads = sh->heads;
  pp.head_dim = sh->dim;
  pp.page_size = sh->page_size;
  pp.score_stride = bk->stride;
  size_t bytes = 0;
  ina_dsa_plan_info_t info;
  CHECK_OK(ina_dsa_score_workspace_size(&pp, &bytes));
  void *ws = malloc(bytes);
  CHECK_OK(ina_dsa_score_plan(&pp, ws, bytes, &info));
  const size_t n = (size_t)s->tokens * bk->stride;
  e->ref = malloc(sizeof(float) * (n ? n : 1));
  e->bound = calloc(n ? n : 1, sizeof(float));
  e->visible = malloc(sizeof(int32_t) * (size_t)(s->tokens ? s->tokens : 1));
  int32_t *request = malloc(sizeof(int32_t) * (size_t)(s->tokens ? s->tokens : 1));
  for (int32_t b = 0; b < s->batch; b++) {
    const int32_t q = s->qo_indptr[b + 1] - s->qo_indptr[b];
    for (int32_t j = 0; j < q; j++) {
      request[s->qo_indptr[b] + j] = b;
      e->visible[s->qo_indptr[b] + j] = s->kv_len[b] - q + j + 1;
    }
  }
  ina_dsa_score_run_params_t rp = INA_DSA_SCORE_RUN_PARAMS_INIT;
  rp.q = sh->fp8_query ? in->q8 : in->q32;
  rp.weights = in->w;
  rp.cache = in->desc;
  rp.kv_indptr = s->kv_indptr;
  rp.kv_indices = s->kv_indices;
  rp.softmax_scale = 1.0f / sqrtf((float)sh->dim);
  rp.scores = e->ref;
  const ina_status_t st = ina_dsa_score_run(&info, ws, &rp, pool, NULL);
  CHECK_OK(st);
  bound_job_t job = {sh, s, in, request, e, bk->stride, rp.softmax_scale};
  if (st == INA_OK) ina_parallel_for(pool, s->tokens, 1, bound_items, &job);
  free(request);
  free(ws);
  return st == INA_OK;
}

/* Reference top-k over host scores [tokens, stride] for the step's visible lengths. */
static int ref_topk(const step_t *s, int32_t stride, int32_t k, const float *scores, ina_threadpool_t *pool,
                    int32_t *out) {
  ina_dsa_topk_plan_params_t pp = INA_DSA_TOPK_PLAN_PARAMS_INIT;
  pp.backend = INA_DSA_BACKEND_REF;
  pp.batch = s->batch;
  pp.qo_indptr = s->qo_indptr;
  pp.kv_len = s->kv_len;
  pp.topk = k;
  pp.score_stride = stride;
  size_t bytes = 0;
  ina_dsa_plan_info_t info;
  CHECK_OK(ina_dsa_topk_workspace_size(&pp, &bytes));
  void *ws = malloc(bytes);
  CHECK_OK(ina_dsa_topk_plan(&pp, ws, bytes, &info));
  ina_dsa_topk_run_params_t rp = INA_DSA_TOPK_RUN_PARAMS_INIT;
  rp.scores = scores;
  rp.indices = out;
  const ina_status_t st = ina_dsa_topk_run(&info, ws, &rp, pool, NULL);
  CHECK_OK(st);
  free(ws);
  return st == INA_OK;
}

/* ---- checks ------------------------------------------------------------------------- */

static int is_poison_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u == 0xFFFFFFFFu;
}

/* Every score element against the bound; -inf tails; untouched rows past the step. */
static int check_scores(const char *what, const step_t *s, const bucket_t *bk, const expect_t *e,
                        const float *got) {
  int64_t bad = 0, bad_tail = 0, bad_rows = 0, first = -1;
  double worst = 0;
  for (int64_t i = 0; i < (int64_t)s->tokens * bk->stride; i++) {
    const int64_t row = i / bk->stride, t = i % bk->stride;
    if (t >= e->visible[row]) {
      if (!(isinf(got[i]) && got[i] < 0)) {
        if (first < 0) first = i;
        bad_tail++;
      }
      continue;
    }
    const double err = fabs((double)got[i] - e->ref[i]);
    if (!(err <= e->bound[i])) {
      if (first < 0) first = i;
      bad++;
    }
    if (e->bound[i] > 0 && err / e->bound[i] > worst) worst = err / e->bound[i];
  }
  for (int64_t i = (int64_t)s->tokens * bk->stride; i < (int64_t)bk->max_tokens * bk->stride; i++)
    if (!is_poison_f32(got[i])) bad_rows++;
  CHECKF(bad == 0 && bad_tail == 0 && bad_rows == 0,
         "%s: %lld scores outside the bound, %lld tail elements not -inf, %lld elements written past "
         "the step's rows; first at token %lld position %lld: gpu %.9g ref %.9g bound %.3g", what,
         (long long)bad, (long long)bad_tail, (long long)bad_rows,
         first < 0 ? -1LL : (long long)(first / bk->stride), first < 0 ? -1LL : (long long)(first % bk->stride),
         first < 0 ? 0.0 : (double)got[first], first < 0 ? 0.0 : (double)e->ref[first],
         first < 0 ? 0.0 : (double)e->bound[first]);
  printf("  %s: worst |gpu - ref| / bound %.3g\n", what, worst);
  return bad == 0 && bad_tail == 0 && bad_rows == 0;
}

/* The mutation the bound must reject, run rather than reasoned: the reference scaled by
 * 1.05 (what a 5 % error in softmax_scale or in the FP8 scale does, relu(1.05 x) being
 * 1.05 relu(x)) must fall outside the bound, by check_scores' own predicate, on more than
 * half of the positions with a nonzero score (one would fail the test). Those with |ref|
 * far below S, where the weighted heads cancel, may pass, and zeros cannot fail: on the
 * shapes here 82 % (128 heads x 256 dims, the loosest bound) to 100 % are caught. */
static void check_mutation(const char *what, const step_t *s, const bucket_t *bk, const expect_t *e) {
  int64_t nonzero = 0, caught = 0;
  for (int64_t i = 0; i < (int64_t)s->tokens * bk->stride; i++) {
    if (i % bk->stride >= e->visible[i / bk->stride] || e->ref[i] == 0.0f) continue;
    nonzero++;
    const double err = fabs((double)(e->ref[i] * 1.05f) - e->ref[i]);
    caught += !(err <= e->bound[i]);
  }
  CHECKF(2 * caught > nonzero, "%s: the bound rejects a 5 %% score error at only %lld of %lld "
         "nonzero positions", what, (long long)caught, (long long)nonzero);
  printf("  %s: a 5 %% error is outside the bound at %lld of %lld nonzero positions\n", what,
         (long long)caught, (long long)nonzero);
}

static int check_topk_equal(const char *what, int32_t tokens, int32_t k, const int32_t *got,
                            const int32_t *want) {
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < (int64_t)tokens * k; i++)
    if (got[i] != want[i]) {
      if (first < 0) first = i;
      bad++;
    }
  CHECKF(bad == 0, "%s: %lld of %lld indices differ from the reference's on the same scores; first at "
         "token %lld rank %lld: gpu %d ref %d", what, (long long)bad, (long long)tokens * k,
         (long long)(first / k), (long long)(first % k), first < 0 ? 0 : got[first], first < 0 ? 0 : want[first]);
  return bad == 0;
}

static int cmp_i32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* GPU score -> GPU top-k against ref score -> ref top-k: differing sets must be near ties. */
static void check_end_to_end(const char *what, const step_t *s, const bucket_t *bk, int32_t k,
                             const expect_t *e, const int32_t *gpu_idx, const int32_t *ref_idx) {
  int64_t rows_differ = 0, unexplained = 0;
  int32_t *a = malloc(sizeof(int32_t) * (size_t)k), *b = malloc(sizeof(int32_t) * (size_t)k);
  for (int32_t r = 0; r < s->tokens; r++) {
    memcpy(a, gpu_idx + (int64_t)r * k, sizeof(int32_t) * (size_t)k);
    memcpy(b, ref_idx + (int64_t)r * k, sizeof(int32_t) * (size_t)k);
    qsort(a, (size_t)k, sizeof *a, cmp_i32);
    qsort(b, (size_t)k, sizeof *b, cmp_i32);
    if (!memcmp(a, b, sizeof(int32_t) * (size_t)k)) continue;
    rows_differ++;
    /* max over y in ref only of ref - bound, min over x in gpu only of ref + bound. */
    double hi = -INFINITY, lo = INFINITY;
    int32_t i = 0, j = 0;
    const float *ref = e->ref + (int64_t)r * bk->stride, *bd = e->bound + (int64_t)r * bk->stride;
    while (i < k || j < k) {
      if (j >= k || (i < k && a[i] < b[j])) { /* gpu only */
        if (a[i] < 0 || a[i] >= e->visible[r]) lo = -INFINITY;
        else if ((double)ref[a[i]] + bd[a[i]] < lo) lo = (double)ref[a[i]] + bd[a[i]];
        i++;
      } else if (i >= k || b[j] < a[i]) { /* ref only */
        if (b[j] >= 0 && (double)ref[b[j]] - bd[b[j]] > hi) hi = (double)ref[b[j]] - bd[b[j]];
        j++;
      } else {
        i++;
        j++;
      }
    }
    if (!(hi <= lo)) unexplained++;
  }
  free(a);
  free(b);
  CHECKF(unexplained == 0, "%s: %lld rows select sets that the score bound cannot explain", what,
         (long long)unexplained);
  printf("  %s: %lld of %d rows differ end to end, all near ties within the score bound\n", what,
         (long long)rows_differ, s->tokens);
}

/* Runs score + top-k on the device for an uploaded step and checks everything. */
static void run_and_check(const char *what, const shape_t *sh, const bucket_t *bk, const step_t *s,
                          const expect_t *e, device_t *d, ina_threadpool_t *pool, int run, cudaStream_t stream) {
  const size_t T = (size_t)bk->max_tokens;
  float *got = malloc(4 * T * (size_t)bk->stride);
  int32_t *idx = malloc(4 * T * (size_t)sh->topk);
  int32_t *want = malloc(4 * (T ? T : 1) * (size_t)sh->topk);
  int32_t *e2e = malloc(4 * (T ? T : 1) * (size_t)sh->topk);
  if (run) {
    ina_dsa_gpu_plan_info_t info;
    ina_dsa_gpu_plan_params_t pp = plan_params(sh, bk, s);
    CHECK_OK(ina_dsa_gpu_plan(&pp, d->host_ws, d->ws, stream, &info));
    ina_dsa_gpu_score_run_params_t sp = score_params(d, sh);
    CHECK_OK(ina_dsa_gpu_score_run(&info, d->ws, &sp, stream));
    ina_dsa_gpu_topk_run_params_t tp = INA_DSA_GPU_TOPK_RUN_PARAMS_INIT;
    tp.scores = d->scores;
    tp.indices = d->indices;
    CHECK_OK(ina_dsa_gpu_topk_run(&info, d->ws, &tp, stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaMemcpy(got, d->scores, 4 * T * (size_t)bk->stride, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(idx, d->indices, 4 * T * (size_t)sh->topk, cudaMemcpyDeviceToHost));
  check_scores(what, s, bk, e, got);
  if (ref_topk(s, bk->stride, sh->topk, got, pool, want))
    check_topk_equal(what, s->tokens, sh->topk, idx, want);
  int64_t bad_rows = 0;
  for (size_t i = (size_t)s->tokens * sh->topk; i < T * (size_t)sh->topk; i++) bad_rows += idx[i] != 0x7F7F7F7F;
  CHECKF(bad_rows == 0, "%s: top-k wrote %lld indices past the step's rows", what, (long long)bad_rows);
  if (ref_topk(s, bk->stride, sh->topk, e->ref, pool, e2e)) check_end_to_end(what, s, bk, sh->topk, e, idx, e2e);
  free(got);
  free(idx);
  free(want);
  free(e2e);
}

static bucket_t bucket_of(const shape_t *sh, const step_t *s) {
  bucket_t bk = {s->tokens + sh->extra_tokens, s->max_kv + sh->extra_kv, 0};
  if (bk.max_tokens < 1) bk.max_tokens = 1;
  if (bk.max_kv < 1) bk.max_kv = 1;
  bk.stride = bk.max_kv + sh->extra_stride;
  return bk;
}

static void test_shape(const shape_t *sh, test_rng_t *rng, ina_threadpool_t *pool, cudaStream_t stream) {
  step_t s;
  inputs_t in;
  expect_t e;
  device_t d;
  char what[256];
  snprintf(what, sizeof what, "%s", sh->name);
  make_step(sh, sh->batch, rng, &s);
  make_inputs(sh, &s, rng, &in);
  const bucket_t bk = bucket_of(sh, &s);
  const int have_ref = reference(sh, &bk, &s, &in, pool, &e);
  if (have_ref) check_mutation(what, &s, &bk, &e);
  if (have_ref && device_alloc(&d, sh, &bk, in.cache_bytes, (size_t)s.kv_indptr[s.batch], s.batch)) {
    if (upload(&d, sh, &bk, &s, &in)) run_and_check(what, sh, &bk, &s, &e, &d, pool, 1, stream);
    device_free(&d);
  }
  expect_free(&e);
  inputs_free(&in);
  step_free(&s);
}

/* ---- graph replay ------------------------------------------------------------------- */

static void test_graph(int fp8_query, test_rng_t *rng, ina_threadpool_t *pool, cudaStream_t stream) {
  const shape_t sh = {"graph h64 d128 fp8-paged p16 k2048", 6, 1, 3, 1, 3000, 16, 64, 128, 2048,
                      KEYS_FP8_PAGED, 0, 0, 0, 0, fp8_query};
  const bucket_t bk = {18, 3000, 3000};
  const int32_t max_batch = 6;
  /* Buffers sized for the largest step the bucket allows. */
  const int64_t max_pages = (int64_t)max_batch * ((bk.max_kv + sh.page_size - 1) / sh.page_size);
  const size_t cache_cap = (size_t)((max_pages + max_pages / 3 + 2) * (sh.dim + 4) * sh.page_size);
  device_t d;
  if (!device_alloc(&d, &sh, &bk, cache_cap, (size_t)max_pages, max_batch)) return;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  for (int round = 0; round < 5; round++) {
    step_t s;
    inputs_t in;
    expect_t e;
    const int32_t batch = round == 3 ? 0 : (int32_t)test_rng_int(rng, 1, max_batch);
    make_step(&sh, batch, rng, &s);
    make_inputs(&sh, &s, rng, &in);
    char what[128];
    snprintf(what, sizeof what, "graph%s round %d (batch %d, %d tokens)", fp8_query ? " fp8-query" : "", round,
             batch, s.tokens);
    if (reference(&sh, &bk, &s, &in, pool, &e) && upload(&d, &sh, &bk, &s, &in)) {
      ina_dsa_gpu_plan_info_t info;
      ina_dsa_gpu_plan_params_t pp = plan_params(&sh, &bk, &s);
      CHECK_OK(ina_dsa_gpu_plan(&pp, d.host_ws, d.ws, stream, &info));
      if (!exec) {
        ina_dsa_gpu_score_run_params_t sp = score_params(&d, &sh);
        ina_dsa_gpu_topk_run_params_t tp = INA_DSA_GPU_TOPK_RUN_PARAMS_INIT;
        tp.scores = d.scores;
        tp.indices = d.indices;
        CUDA_OK(cudaStreamSynchronize(stream));
        CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        CHECK_OK(ina_dsa_gpu_score_run(&info, d.ws, &sp, stream));
        CHECK_OK(ina_dsa_gpu_topk_run(&info, d.ws, &tp, stream));
        CUDA_OK(cudaStreamEndCapture(stream, &graph));
        CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      }
      if (exec) {
        CUDA_OK(cudaGraphLaunch(exec, stream));
        run_and_check(what, &sh, &bk, &s, &e, &d, pool, 0, stream);
      }
    }
    expect_free(&e);
    inputs_free(&in);
    step_free(&s);
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  device_free(&d);
}

/* ---- top-k alone on constructed scores ---------------------------------------------- */

typedef enum { ROW_RANDOM, ROW_TIES, ROW_SPECIAL, ROW_EQUAL, ROW_MOSTLY_NAN, ROW_SIGNED_ZERO } row_kind_t;

static float special_value(test_rng_t *rng, row_kind_t kind) {
  uint32_t u;
  float f;
  switch (kind) {
  case ROW_RANDOM: return test_rng_normal(rng);
  case ROW_TIES: return (float)test_rng_int(rng, 0, 3);
  case ROW_EQUAL: return 1.5f;
  case ROW_SIGNED_ZERO: return test_rng_int(rng, 0, 1) ? 0.0f : -0.0f;
  case ROW_MOSTLY_NAN:
    if (test_rng_int(rng, 0, 9)) {
      u = test_rng_int(rng, 0, 1) ? 0x7FC00001u : 0xFFC00000u; /* NaNs of both signs */
      memcpy(&f, &u, sizeof f);
      return f;
    }
    return test_rng_int(rng, 0, 1) ? -INFINITY : (float)test_rng_int(rng, -2, 2);
  case ROW_SPECIAL:
    switch (test_rng_int(rng, 0, 7)) {
    case 0: return -INFINITY;
    case 1: return INFINITY;
    case 2: u = 0x7FC00000u; memcpy(&f, &u, sizeof f); return f;
    case 3: u = 0xFF800001u; memcpy(&f, &u, sizeof f); return f;
    case 4: return -0.0f;
    case 5: return 0.0f;
    case 6: return 1e-45f; /* the smallest subnormal */
    default: return (float)test_rng_int(rng, -3, 3);
    }
  }
  return 0.0f;
}

static void test_topk_rows(const char *what, int32_t batch, int32_t kv_lo, int32_t kv_hi, int32_t k,
                           row_kind_t kind, test_rng_t *rng, ina_threadpool_t *pool, cudaStream_t stream) {
  const shape_t sh = {what, batch, 1, 1, kv_lo, kv_hi, 64, 1, 16, k, KEYS_BF16, 0, 0, 0, 0, 0};
  step_t s;
  make_step(&sh, batch, rng, &s);
  /* Random and tie rows get 16-byte aligned rows (the top-k's float4 loads, with a scalar
   * tail where visible is not a multiple of 4), the others odd strides (scalar loads). */
  const int32_t stride = kind == ROW_RANDOM || kind == ROW_TIES ? (s.max_kv + 3) / 4 * 4 : s.max_kv + 3;
  const bucket_t bk = {s.tokens + 1, s.max_kv, stride};
  const size_t n = (size_t)bk.max_tokens * bk.stride;
  float *scores = malloc(4 * n);
  int32_t *got = malloc(4 * (size_t)bk.max_tokens * k), *want = malloc(4 * (size_t)bk.max_tokens * k);
  for (size_t i = 0; i < n; i++) scores[i] = special_value(rng, kind);
  device_t d;
  memset(&d, 0, sizeof d);
  ina_dsa_gpu_plan_params_t pp = plan_params(&sh, &bk, &s);
  size_t hb = 0, db = 0;
  CHECK_OK(ina_dsa_gpu_workspace_size(&pp, &hb, &db));
  int ok = cudaHostAlloc(&d.host_ws, hb, cudaHostAllocDefault) == cudaSuccess && cudaMalloc(&d.ws, db) == cudaSuccess &&
           cudaMalloc((void **)&d.scores, 4 * n) == cudaSuccess &&
           cudaMalloc((void **)&d.indices, 4 * (size_t)bk.max_tokens * k) == cudaSuccess &&
           cudaMemcpy(d.scores, scores, 4 * n, cudaMemcpyHostToDevice) == cudaSuccess &&
           cudaMemset(d.indices, 0x7F, 4 * (size_t)bk.max_tokens * k) == cudaSuccess;
  CHECKF(ok, "%s: device setup failed", what);
  if (ok) {
    ina_dsa_gpu_plan_info_t info;
    CHECK_OK(ina_dsa_gpu_plan(&pp, d.host_ws, d.ws, stream, &info));
    ina_dsa_gpu_topk_run_params_t tp = INA_DSA_GPU_TOPK_RUN_PARAMS_INIT;
    tp.scores = d.scores;
    tp.indices = d.indices;
    CHECK_OK(ina_dsa_gpu_topk_run(&info, d.ws, &tp, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(got, d.indices, 4 * (size_t)bk.max_tokens * k, cudaMemcpyDeviceToHost));
    if (ref_topk(&s, bk.stride, k, scores, pool, want)) check_topk_equal(what, s.tokens, k, got, want);
    int64_t past = 0;
    for (int64_t i = (int64_t)s.tokens * k; i < (int64_t)bk.max_tokens * k; i++) past += got[i] != 0x7F7F7F7F;
    CHECKF(past == 0, "%s: %lld indices written past the step's rows", what, (long long)past);
    printf("  %s: %d rows of %d..%d positions, k %d: equal to the reference\n", what, s.tokens, kv_lo, s.max_kv, k);
  }
  device_free(&d);
  free(scores);
  free(got);
  free(want);
  step_free(&s);
}

/* ---- refusals ----------------------------------------------------------------------- */

static void test_refusals(void) {
  const int32_t qo[2] = {0, 1}, kv[1] = {10};
  ina_dsa_gpu_plan_params_t p = INA_DSA_GPU_PLAN_PARAMS_INIT;
  p.batch = 1;
  p.qo_indptr = qo;
  p.kv_len = kv;
  p.max_tokens = 4;
  p.max_kv_len = 16;
  p.page_size = 16;
  p.num_heads = 64;
  p.head_dim = 128;
  p.topk = 8;
  char host_ws[256];
  ina_dsa_gpu_plan_info_t info;
  CHECK(ina_dsa_gpu_plan(&p, host_ws, NULL, NULL, &info) == INA_OK && info.total_tokens == 1);
  ina_dsa_gpu_plan_params_t q = p;
  /* Shapes outside the tensor cores' plan (the CUDA-core kernel takes them) ... */
  q.head_dim = 72;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_OK && info.head_dim == 72);
  q.head_dim = 1;
  q.num_heads = INA_DSA_GPU_MAX_HEADS;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_OK);
  q.head_dim = INA_DSA_GPU_MAX_HEAD_DIM;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_OK);
  /* ... up to the GPU limits. */
  q = p;
  q.head_dim = INA_DSA_GPU_MAX_HEAD_DIM + 1;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_ERR_UNSUPPORTED && info.magic == 0);
  q = p;
  q.num_heads = INA_DSA_GPU_MAX_HEADS + 1;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_ERR_UNSUPPORTED);
  q = p;
  q.head_dim = 0;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.topk = INA_DSA_GPU_MAX_TOPK + 1;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_ERR_UNSUPPORTED);
  q = p;
  q.max_kv_len = 8; /* kv_len 10 past the bucket */
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.max_tokens = 0;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_ERR_INVALID_ARGUMENT);
  q = p;
  q.score_stride = 15;
  CHECK(ina_dsa_gpu_plan(&q, host_ws, NULL, NULL, &info) == INA_ERR_INVALID_ARGUMENT);
  /* A run refuses an unplanned info and f32 keys. */
  memset(&info, 0, sizeof info);
  ina_dsa_gpu_topk_run_params_t tp = INA_DSA_GPU_TOPK_RUN_PARAMS_INIT;
  CHECK(ina_dsa_gpu_topk_run(&info, host_ws, &tp, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_dsa_gpu_plan(&p, host_ws, NULL, NULL, &info) == INA_OK);
  ina_dsa_gpu_score_run_params_t sp = INA_DSA_GPU_SCORE_RUN_PARAMS_INIT;
  float dummy[4];
  sp.q = (const uint16_t *)dummy;
  sp.weights = dummy;
  sp.scores = dummy;
  sp.kv_indptr = (const int32_t *)dummy;
  sp.kv_indices = (const int32_t *)dummy;
  sp.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_F32, dummy, 16, 128);
  sp.softmax_scale = 1.0f;
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  sp.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_FP8, dummy, 16, 128);
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_INVALID_ARGUMENT);
  /* Alignment neither kernel has: odd bf16 rows, odd q, weights off 4 bytes. */
  sp.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_BF16, (const char *)dummy + 1, 16, 128);
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  sp.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_BF16, dummy, 16, 128);
  sp.cache.token_stride = 257;
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  sp.cache = ina_dsa_index_cache_dense(INA_DSA_KEY_BF16, dummy, 16, 128);
  sp.q = (const uint16_t *)((const char *)dummy + 1);
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  sp.q = (const uint16_t *)dummy;
  sp.weights = (const float *)((const char *)dummy + 2);
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  sp.weights = dummy;
  /* The FP8 query: a format that is none, bf16 keys, 132-byte inline rows (not 16-byte
   * aligned), q off 16 bytes, shapes past 64 heads or off the 32-dim step. */
  sp.query_format = (ina_dsa_gpu_query_format_t)7;
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_INVALID_ARGUMENT);
  sp.query_format = INA_DSA_GPU_QUERY_FP8;
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED); /* bf16 keys */
  static _Alignas(16) char keys[64];
  sp.cache = ina_dsa_index_cache_fp8_inline(keys, 16, 128);
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  sp.cache = ina_dsa_index_cache_fp8_paged(keys, 16, 128);
  sp.q = (const uint16_t *)(keys + 8);
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  sp.q = (const uint16_t *)keys;
  ina_dsa_gpu_plan_params_t r = p;
  r.num_heads = 65;
  CHECK(ina_dsa_gpu_plan(&r, host_ws, NULL, NULL, &info) == INA_OK);
  sp.cache = ina_dsa_index_cache_fp8_paged(keys, 16, 128);
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  r = p;
  r.head_dim = 48;
  CHECK(ina_dsa_gpu_plan(&r, host_ws, NULL, NULL, &info) == INA_OK);
  sp.cache = ina_dsa_index_cache_fp8_paged(keys, 16, 48);
  CHECK(ina_dsa_gpu_score_run(&info, host_ws, &sp, NULL) == INA_ERR_UNSUPPORTED);
  /* The host rounding refuses what the key quantizer refuses. */
  float bad[2] = {1.0f, NAN}, out[2] = {7.0f, 7.0f};
  CHECK(ina_dsa_index_query_round_fp8(bad, 1, 2, out) == INA_ERR_INVALID_ARGUMENT && out[0] == 7.0f);
  CHECK(ina_dsa_index_query_round_fp8(NULL, 1, 2, out) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_dsa_index_query_round_fp8(bad, 1, 0, out) == INA_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  /* The refusals touch no device (nothing they pass reaches a launch): they run here too. */
  test_refusals();
  const int skip = test_require_gpus(NAME, 1);
  if (skip) return test_checks_failed_ ? test_finish(NAME) : skip;
  test_rng_t rng = {test_seed(NAME)};
  char dev[128];
  printf(NAME ": %s\n", ina_cuda_device_name(0, dev, sizeof dev));
  ina_threadpool_t *pool = NULL;
  CHECK_OK(ina_threadpool_create(8, &pool));
  cudaStream_t stream = NULL;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    printf("%s (%s keys)\n", shapes[i].name, layout_name[shapes[i].layout]);
    test_shape(&shapes[i], &rng, pool, stream);
  }
  printf("graph\n");
  test_graph(0, &rng, pool, stream);
  printf("graph, FP8 query\n");
  test_graph(1, &rng, pool, stream);
  printf("top-k alone\n");
  test_topk_rows("ties {0..3} k2048", 6, 1, 6000, 2048, ROW_TIES, &rng, pool, stream);
  test_topk_rows("ties {0..3} k7", 6, 1, 3000, 7, ROW_TIES, &rng, pool, stream);
  test_topk_rows("inf/nan/zeros k2048", 6, 1, 5000, 2048, ROW_SPECIAL, &rng, pool, stream);
  test_topk_rows("inf/nan/zeros k1", 8, 1, 500, 1, ROW_SPECIAL, &rng, pool, stream);
  test_topk_rows("signed zeros k7", 4, 1, 300, 7, ROW_SIGNED_ZERO, &rng, pool, stream);
  test_topk_rows("all equal k2048", 3, 1, 9000, 2048, ROW_EQUAL, &rng, pool, stream);
  test_topk_rows("mostly NaN k2048", 4, 1, 20000, 2048, ROW_MOSTLY_NAN, &rng, pool, stream);
  test_topk_rows("short rows k2048", 8, 1, 2047, 2048, ROW_RANDOM, &rng, pool, stream);
  test_topk_rows("long random 64k..128k k2048", 4, 65536, 131072, 2048, ROW_RANDOM, &rng, pool, stream);
  test_topk_rows("long ties 64k..128k k2048", 2, 65536, 131072, 2048, ROW_TIES, &rng, pool, stream);
  test_topk_rows("long all-equal 128k k2048", 1, 131072, 131072, 2048, ROW_EQUAL, &rng, pool, stream);
  test_topk_rows("long mostly NaN 100k k2048", 2, 100000, 100000, 2048, ROW_MOSTLY_NAN, &rng, pool, stream);
  if (stream) cudaStreamDestroy(stream);
  ina_threadpool_destroy(pool);
  return test_finish(NAME);
}

#else /* a build without CUDA has no kernels to test */
int main(void) { return test_skip_gpu("test_dsa_gpu", "this build has no CUDA"); }
#endif
