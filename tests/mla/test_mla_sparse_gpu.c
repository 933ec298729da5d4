/* Sparse MLA on the GPU (mla/mla.h: ina_mla_sparse_plan + ina_mla_run with indices)
 * against the CPU reference of DeepSeek Sparse Attention (attention/dsa.h, sparse MLA
 * with INA_DSA_BACKEND_REF) on fresh random problems: decode, MTP (q_len 2-4) and
 * prefill chunks; 1 / 3 / 16 / 20 / 64 / 128 heads; top-k 7 / 64 / 2048 with visible
 * lengths below and above k; page sizes 1 / 16 / 64 on shuffled page ids; bf16 caches
 * (packed and separate padded) and the 656-byte FP8 entry. Besides DeepSeek's 512 + 64
 * on the tensor-core kernels, small dims (32 + 8, 64 + 16, 64 + 0, 128 + 16 with FP8)
 * and 512 + 64 over an f32 cache run on the generic fp32 kernel, with 3 / 4 / 17 / 20
 * heads, decode, MTP, prefill chunks of 5-20 tokens and splits. Index rows are what the top-k
 * writes: min(k, visible) distinct visible positions in random order, then -1. The cache
 * slots no request owns hold NaN, and outputs are poisoned before each run.
 *
 * Error model, per output element (token s, head h, dim d), with p_t the reference's
 * softmax weights over the selected positions and A_d = sum_t p_t |v_td|:
 *   - scores: products of bf16 (or f16-converted FP8) values are exact in f32. An
 *     mma.sync adds its 16 products in at most two groups of 8, each summed with one
 *     truncation, into its f32 accumulator (the published measurements of NVIDIA's
 *     tensor cores: a group's exact products, one final truncation); the kernels then
 *     add the k-steps' chains and the 4
 *     warps' partial scores in f32. That is at most 576 / 8 + 8 additions, each off by
 *     at most 2^-23 of a partial sum bounded by sum_d |q_d k_td|, so the score of t is
 *     within E_t = (576 / 8 + 8) * 2^-23 * sum_d |q_d k_td| of the exact one (the
 *     worst case of one addition per product, 576, would make the bound too loose to
 *     reject a 5 % error). Through the softmax this moves each p_t
 *     by a factor within exp(+-2 scale max_t E_t): a relative error
 *     r_s = exp(2 scale max_t E_t) - 1 on every p_t, so up to r_s A_d on out_d;
 *   - P V: p_t enters the tensor cores rounded to bf16 (2^-9 relative) while the
 *     normalizing sum uses the unrounded p: up to 2^-9 A_d. With FP8 the kernels multiply
 *     e4m3 values e_td (|e| <= 448) by P'_t = p_t s_t 2^10 in f16 (s_t the position's
 *     scale for d's block; the output is multiplied back by 2^-10), rounded once (twice
 *     on the wgmma kernel's columns 256.., whose P' is rounded from an f16 p_t 2^10):
 *     2^-11 relative each where P' is a normal f16, within the 2^-9 above; below f16's
 *     normal range (p_t s_t 2^10 < 2^-14) a rounding is off by up to 2^-25 absolute,
 *     which is 2^-35 |e_td| on out_d, or 2^-35 |v_td| for the first rounding of the twice
 *     rounded ones: U_d = 2^-35 sum_t (|e_td| + |v_td|) in all, added to the bound below
 *     (it matters only where out_d itself is that small);
 *   - ex2.approx and the output's bf16 rounding: 2^-9 |out_d| (+ 2^-22 A_d);
 * so |gpu - ref| <= (2^-9 + 2^-22 + r_s) A_d + 2^-9 |ref_d| + 2^-9 (2^-9 A_d + ...) and
 * the test takes |gpu - ref| <= (2^-8 + 2 r_s) A_d + 2^-8 |ref_d| + U_d + 1e-30 for every
 * element (the doubled terms cover the f32 arithmetic of the normalization and of the
 * reference itself). lse: |gpu - ref| <= 2 scale max_t E_t + 2^-20 (1 + |lse|).
 *
 * The generic kernel (dims other than 512 + 64, or an f32 cache) computes in fp32 with
 * no tensor cores, so only the score term changes. A score is D = C + R sequential fmaf
 * in the order d = 0 .. D - 1 (latent, then rope), each rounding once, by at most 2^-24
 * of the partial sum it produces: with S_t = sum_k |sum_{d < k} q_d k_td| (exact prefix
 * sums, k = 1 .. D; the computed ones differ by second-order terms, under D^2 2^-48
 * sum_d |q_d k_td|) that is 2^-24 S_t in all. Add one rounding of an FP8 entry's value
 * * scale, three of the base-2 scale (log2(e), scale * log2(e), score * that), two of
 * score - max (relative to the largest sum_d |q_d k_td|) and the reference's own f32
 * score, each within 2^-24 sum_d |q_d k_td|: E_t = 2^-24 (S_t + 7 sum_d |q_d k_td|) +
 * D^2 2^-48 sum_d |q_d k_td|, into r_s as above. (The a-priori D 2^-24 sum_d |q_d k_td|
 * would be some sqrt(D) times wider: at 512 + 64 over latents up to 2^4 it would hide
 * a 5 % error.) P V accumulates p_t (unrounded) into fp32 outputs,
 * at most 33 roundings per block of 32 positions and a few more to normalize and merge
 * splits: (35 ceil(m / 32) + 20) * 2^-24 A_d <= 2^-12.8 A_d for m = min(topk, visible)
 * <= 2048, plus 2^-21 A_d for ex2.approx and the reference's f32 sum (m + 2) * 2^-24 A_d,
 * well inside the 2^-8 A_d above (which there also paid for p in bf16). Its softmax sum
 * takes two roundings per block and five in the warp tree, and the combine one per
 * split (at most one per 64 positions), so its lse gets (3 ceil(m / 32) + 16) * 2^-24
 * more.
 * The latents span 2^-8 .. 2^4 per position and the scores are peaked, so a few
 * positions carry most of the weight: then A_d ~ |out_d| and the bound is about 1 % of
 * the output. The test shows what it rejects on each case, with mutations applied to
 * the reference's side (the GPU's correct output must then fail the comparison):
 *   (1) the heaviest selected position of one row swapped for an unselected one (a
 *       gather of the wrong row), on the token with the longest visible length;
 *   (2) one head's query scaled by 1.05, where that moves the reference output by more
 *       than 4 times the bound ("n/a" when a single position carries the row);
 *   (3) one row's output scaled by 1.05 (a normalization error), on the row whose bound
 *       is tightest; the report counts the rows where a 5 % error would show.
 *
 * A CUDA graph of the run is captured once per bucket and replayed after a re-plan with
 * new lengths and new indices. Skipped (exit 77) without a GPU. */
#include <math.h>

#include "attention/dsa.h"
#include "tests/gpu_test_util.h"
#include "tests/mla/mla_test_gpu.h"

#if INA_HAVE_CUDA
#include <cuda_runtime.h>

typedef struct spec {
  const char *name;
  int32_t C, R; /* kv_lora_rank, rope_dim */
  int32_t batch, min_q, max_q, heads, topk, page_size, kv_min, kv_max;
  ina_mla_cache_format_t format;
  mla_layout_t layout;
  int32_t num_sms; /* 0: the device's */
} spec_t;

#define SPEC(name, batch, max_q, heads, topk, page, kv_min, kv_max, fmt, layout, sms)                      \
  {name, 512, 64, batch, 1, max_q, heads, topk, page, kv_min, kv_max, INA_MLA_CACHE_##fmt, MLA_LAYOUT_##layout, \
   sms}
/* Other dims (the generic kernel), with the least q_len a request draws. */
#define GSPEC(name, C, R, batch, min_q, max_q, heads, topk, page, kv_min, kv_max, fmt, sms)                   \
  {name, C, R, batch, min_q, max_q, heads, topk, page, kv_min, kv_max, INA_MLA_CACHE_##fmt, MLA_LAYOUT_PACKED, sms}

static const spec_t specs[] = {
    SPEC("decode h16 k2048 bf16 p64", 8, 1, 16, 2048, 64, 1500, 9000, BF16, PACKED, 0),
    SPEC("decode h16 k2048 fp8 p64", 8, 1, 16, 2048, 64, 1500, 9000, FP8, PACKED, 0),
    SPEC("decode h128 k2048 bf16 p64", 3, 1, 128, 2048, 64, 2100, 6000, BF16, PACKED, 0),
    SPEC("decode h128 k2048 fp8 p64", 3, 1, 128, 2048, 64, 2100, 6000, FP8, PACKED, 0),
    SPEC("mtp q2 h128 k2048 fp8 p64", 2, 2, 128, 2048, 64, 100, 5000, FP8, PACKED, 0),
    SPEC("mtp q1..4 h16 k64 bf16 p1", 6, 4, 16, 64, 1, 2, 300, BF16, PACKED, 0),
    SPEC("mtp q1..4 h64 k64 fp8 p16", 5, 4, 64, 64, 16, 2, 400, FP8, PACKED, 0),
    SPEC("h3 q1..4 k7 bf16 p16", 6, 4, 3, 7, 16, 1, 40, BF16, PACKED, 0),
    SPEC("h1 q1..3 k7 fp8 p1", 5, 3, 1, 7, 1, 1, 30, FP8, PACKED, 0),
    SPEC("h20 q1..4 k64 bf16 separate", 4, 4, 20, 64, 16, 10, 500, BF16, SEPARATE, 0),
    SPEC("prefill q1..48 h16 k64 bf16 p64", 3, 48, 16, 64, 64, 48, 700, BF16, PACKED, 0),
    SPEC("prefill q1..24 h128 k2048 fp8 p64", 2, 24, 128, 2048, 64, 24, 3000, FP8, PACKED, 0),
    SPEC("decode h16 k2048 bf16 p16, 5 CTAs", 6, 1, 16, 2048, 16, 100, 4000, BF16, PACKED, 5),
    SPEC("decode h128 k2048 bf16 p1, 300 CTAs", 2, 1, 128, 2048, 1, 2000, 3000, BF16, PACKED, 300),
    GSPEC("generic 32+8 decode h3 k7 bf16 p1", 32, 8, 8, 1, 1, 3, 7, 1, 1, 40, BF16, 0),
    GSPEC("generic 64+16 decode h4 k16 bf16 p16", 64, 16, 8, 1, 1, 4, 16, 16, 1, 60, BF16, 0),
    GSPEC("generic 32+8 mtp q2..4 h4 k16 bf16 p64", 32, 8, 6, 2, 4, 4, 16, 64, 4, 50, BF16, 0),
    GSPEC("generic 64+16 mtp q1..4 h3 k64 bf16 p1", 64, 16, 5, 1, 4, 3, 64, 1, 2, 300, BF16, 0),
    GSPEC("generic 32+8 prefill q5..20 h3 k16 bf16 p16", 32, 8, 3, 5, 20, 3, 16, 16, 5, 80, BF16, 0),
    GSPEC("generic 64+16 prefill q5..20 h4 k64 bf16 p64", 64, 16, 3, 5, 20, 4, 64, 64, 20, 400, BF16, 0),
    GSPEC("generic 64+16 prefill q5..20 h4 k32 f32 p16", 64, 16, 3, 5, 20, 4, 32, 16, 5, 200, F32, 0),
    GSPEC("generic 64+0 mtp q1..4 h4 k16 bf16 p16", 64, 0, 5, 1, 4, 4, 16, 16, 1, 100, BF16, 0),
    GSPEC("generic 128+16 mtp q1..3 h3 k48 fp8 p16", 128, 16, 5, 1, 3, 3, 48, 16, 1, 300, FP8, 0),
    GSPEC("generic 64+16 decode h20 k2048 bf16 p64", 64, 16, 4, 1, 1, 20, 2048, 64, 1500, 6000, BF16, 0),
    GSPEC("generic 32+8 q1..4 h17 k300 bf16 p1, 3 CTAs", 32, 8, 6, 1, 4, 17, 300, 1, 10, 1000, BF16, 3),
    GSPEC("generic 512+64 f32 mtp q1..2 h16 k256 p64", 512, 64, 4, 1, 2, 16, 256, 64, 100, 1000, F32, 0),
};

/* The row of query token s: visible positions drawn without replacement, then -1. */
static void draw_indices(const mla_case_t *c, int32_t topk, test_rng_t *rng, int32_t *indices) {
  int32_t max_kv = 1;
  for (int32_t b = 0; b < c->s.batch; b++) max_kv = c->kv_len[b] > max_kv ? c->kv_len[b] : max_kv;
  int32_t *perm = malloc(sizeof(int32_t) * (size_t)max_kv);
  if (!perm) return;
  for (int32_t b = 0; b < c->s.batch; b++) {
    const int32_t q_len = c->qo_indptr[b + 1] - c->qo_indptr[b];
    for (int32_t j = 0; j < q_len; j++) {
      const int32_t s = c->qo_indptr[b] + j, visible = c->kv_len[b] - q_len + j + 1;
      const int32_t m = visible < topk ? visible : topk;
      for (int32_t t = 0; t < visible; t++) perm[t] = t;
      for (int32_t i = 0; i < m; i++) { /* partial Fisher-Yates */
        const int32_t k = (int32_t)test_rng_int(rng, i, visible - 1), x = perm[i];
        perm[i] = perm[k];
        perm[k] = x;
      }
      int32_t *row = indices + (int64_t)s * topk;
      for (int32_t i = 0; i < topk; i++) row[i] = i < m ? perm[i] : -1;
    }
  }
  free(perm);
}

/* Cache values of position t of request b (latent C then rope R), in double; with an FP8
 * cache and raw set, also the magnitudes of the stored e4m3 latents (before their scales). */
static void read_entry(const mla_case_t *c, int32_t b, int32_t t, double *v, double *raw) {
  const ina_mla_cache_t *k = &c->cache;
  const int32_t C = k->kv_lora_rank, R = k->rope_dim, ps = k->page_size;
  const int64_t page = c->kv_indices[c->kv_indptr[b] + t / ps], slot = t % ps;
  const uint8_t *lat = (const uint8_t *)k->latent + page * k->latent_page_stride + slot * k->latent_token_stride;
  const uint8_t *rope = (const uint8_t *)k->rope + page * k->rope_page_stride + slot * k->rope_token_stride;
  if (k->format == INA_MLA_CACHE_F32) {
    for (int32_t d = 0; d < C + R; d++) {
      float x;
      memcpy(&x, d < C ? lat + 4 * d : rope + 4 * (d - C), 4);
      v[d] = x;
    }
    return;
  }
  for (int32_t d = 0; d < C; d++) {
    if (k->format == INA_MLA_CACHE_FP8) {
      float sc;
      memcpy(&sc, (const uint8_t *)k->scale + page * k->scale_page_stride + slot * k->scale_token_stride +
                      4 * (d / 128), 4);
      v[d] = (double)ina_fp8_e4m3_to_f32(lat[d]) * sc;
      if (raw) raw[d] = fabs((double)ina_fp8_e4m3_to_f32(lat[d]));
    } else {
      uint16_t x;
      memcpy(&x, lat + 2 * d, 2);
      v[d] = ina_bf16_to_f32(x);
    }
  }
  for (int32_t d = 0; d < R; d++) {
    uint16_t x;
    memcpy(&x, rope + 2 * d, 2);
    v[C + d] = ina_bf16_to_f32(x);
  }
}

/* Whether a case runs on the generic fp32 kernel (ina_mla_run's choice for the layouts
 * this test builds, all of them aligned for the fast kernels). */
static int runs_generic(const mla_shape_t *s) {
  return !(s->kv_lora_rank == 512 && s->rope_dim == 64) || s->format == INA_MLA_CACHE_F32;
}

/* Per-element bounds of the error model above: bound[s, h, d] for out, lse_bound[s, h]. */
static int error_bounds(const mla_case_t *c, const int32_t *indices, int32_t topk, const float *ref_out,
                        const float *ref_lse, float *bound, float *lse_bound) {
  const int32_t H = c->s.num_heads, C = c->s.kv_lora_rank, R = c->s.rope_dim, D = C + R;
  const double scale = c->s.softmax_scale;
  const int generic = runs_generic(&c->s);
  double *kv = malloc(sizeof(double) * (size_t)topk * (size_t)D);
  double *score = malloc(sizeof(double) * (size_t)topk), *err = malloc(sizeof(double) * (size_t)topk);
  double *a = malloc(sizeof(double) * (size_t)C);
  /* FP8 on the tensor-core kernels: raw e4m3 magnitudes, and the underflow term per dim */
  const int fp8_f16 = c->s.format == INA_MLA_CACHE_FP8 && !generic;
  double *raw = fp8_f16 ? malloc(sizeof(double) * (size_t)topk * (size_t)C) : NULL;
  double *underflow = calloc((size_t)C, sizeof(double));
  if (!kv || !score || !err || !a || !underflow || (fp8_f16 && !raw)) {
    free(kv), free(score), free(err), free(a), free(raw), free(underflow);
    return 0;
  }
  for (int32_t b = 0; b < c->s.batch; b++) {
    for (int32_t s = c->qo_indptr[b]; s < c->qo_indptr[b + 1]; s++) {
      const int32_t *row = indices + (int64_t)s * topk;
      int32_t m = 0;
      while (m < topk && row[m] >= 0) m++;
      for (int32_t i = 0; i < m; i++) read_entry(c, b, row[i], kv + (int64_t)i * D, raw ? raw + (int64_t)i * C : NULL);
      /* FP8: sum_t |e4m3_td| + |v_td|, the weight of the f16 underflow of P' (see the model) */
      if (raw)
        for (int32_t d = 0; d < C; d++) {
          double sum = 0.0;
          for (int32_t i = 0; i < m; i++) sum += raw[(int64_t)i * C + d] + fabs(kv[(int64_t)i * D + d]);
          underflow[d] = ldexp(sum, -35);
        }
      for (int32_t h = 0; h < H; h++) {
        const float *qn = c->q_nope_f + ((int64_t)s * H + h) * C, *qp = c->q_pe_f + ((int64_t)s * H + h) * R;
        double mx = -INFINITY, max_err = 0.0, l = 0.0;
        for (int32_t i = 0; i < m; i++) {
          const double *k = kv + (int64_t)i * D;
          double dot = 0.0, mag = 0.0, prefix = 0.0; /* prefix: S_t, the generic kernel's partial sums */
          for (int32_t d = 0; d < C; d++) dot += qn[d] * k[d], mag += fabs(qn[d] * k[d]), prefix += fabs(dot);
          for (int32_t d = 0; d < R; d++) dot += qp[d] * k[C + d], mag += fabs(qp[d] * k[C + d]), prefix += fabs(dot);
          score[i] = scale * dot;
          err[i] = generic ? ldexp(1.0, -24) * (prefix + 7.0 * mag) + (double)D * D * ldexp(1.0, -48) * mag
                           : (double)(D / 8 + 8) * ldexp(1.0, -23) * mag;
          mx = score[i] > mx ? score[i] : mx;
          max_err = err[i] > max_err ? err[i] : max_err;
        }
        for (int32_t i = 0; i < m; i++) l += exp(score[i] - mx);
        for (int32_t d = 0; d < C; d++) a[d] = 0.0;
        for (int32_t i = 0; i < m; i++) {
          const double p = exp(score[i] - mx) / l;
          for (int32_t d = 0; d < C; d++) a[d] += p * fabs(kv[(int64_t)i * D + d]);
        }
        const double r_s = expm1(2.0 * scale * max_err);
        const int64_t o = ((int64_t)s * H + h) * C;
        for (int32_t d = 0; d < C; d++)
          bound[o + d] = (float)((ldexp(1.0, -8) + 2.0 * r_s) * a[d] + ldexp(1.0, -8) * fabs(ref_out[o + d]) +
                                 underflow[d] + 1e-30);
        const double sum_err = generic ? (double)(3 * ((m + 31) / 32) + 16) * ldexp(1.0, -24) : 0.0;
        lse_bound[(int64_t)s * H + h] =
            (float)(2.0 * scale * max_err + ldexp(1.0, -20) * (1.0 + fabs(ref_lse[(int64_t)s * H + h])) + sum_err);
      }
    }
  }
  free(kv), free(score), free(err), free(a), free(raw), free(underflow);
  return 1;
}

/* Elements over their bound; *rows_bad counts (token, head) rows with any. With `report`
 * the first few are printed with their bound (the comparisons of the GPU's output with
 * the reference, not those against the mutations). */
static int64_t count_over(const mla_case_t *c, const uint16_t *out, const float *lse, const float *ref_out,
                          const float *ref_lse, const float *bound, const float *lse_bound, int64_t *rows_bad,
                          double *worst, int report) {
  const int32_t H = c->s.num_heads, C = c->s.kv_lora_rank;
  int64_t over = 0;
  *rows_bad = 0;
  *worst = 0.0;
  for (int32_t s = 0; s < c->tokens; s++)
    for (int32_t h = 0; h < H; h++) {
      const int64_t o = ((int64_t)s * H + h) * C;
      int bad = 0;
      for (int32_t d = 0; d < C; d++) {
        const double g = ina_bf16_to_f32(out[s * c->out_ts + h * c->out_hs + d]);
        const double e = fabs(g - ref_out[o + d]);
        if (!(e <= bound[o + d])) {
          if (over++ < 3 && report)
            fprintf(stderr, "  over: token %d head %d dim %d: gpu %.6g ref %.6g |diff| %.3g bound %.3g\n", s, h, d, g,
                    ref_out[o + d], e, bound[o + d]);
          bad = 1;
        }
        if (e / bound[o + d] > *worst || isnan(e)) *worst = isnan(e) ? INFINITY : e / bound[o + d];
      }
      const double el = fabs((double)lse[(int64_t)s * H + h] - ref_lse[(int64_t)s * H + h]);
      if (!(el <= lse_bound[(int64_t)s * H + h])) {
        if (over++ < 3 && report)
          fprintf(stderr, "  over: token %d head %d lse: gpu %.9g ref %.9g |diff| %.3g bound %.3g\n", s, h,
                  (double)lse[(int64_t)s * H + h], (double)ref_lse[(int64_t)s * H + h], el,
                  (double)lse_bound[(int64_t)s * H + h]);
        bad = 1;
      }
      *rows_bad += bad;
    }
  return over;
}

typedef struct gpu_run {
  mla_dev_t d;
  void *indices; /* device [tokens, topk] */
} gpu_run_t;

static ina_mla_sparse_plan_params_t sparse_params(const mla_case_t *c, const spec_t *sp) {
  ina_mla_sparse_plan_params_t p = INA_MLA_SPARSE_PLAN_PARAMS_INIT;
  p.batch = c->s.batch;
  p.max_tokens = sp->batch * sp->max_q;
  p.qo_indptr = c->qo_indptr;
  p.kv_len = c->kv_len;
  p.topk = sp->topk;
  p.num_heads = sp->heads;
  p.kv_lora_rank = sp->C;
  p.rope_dim = sp->R;
  p.page_size = sp->page_size;
  p.num_sms = sp->num_sms;
  return p;
}

/* A captured run: the graph and the stream it was captured on. */
typedef struct captured {
  cudaStream_t stream;
  cudaGraphExec_t exec;
} captured_t;

/* Plans and runs on the case's uploaded inputs (through `cap`: captured on the first
 * call, replayed after a re-plan on later ones, when not NULL), and brings out and lse
 * back. */
static void gpu_attend(gpu_run_t *g, const mla_case_t *c, const spec_t *sp, const int32_t *indices,
                       captured_t *cap, uint16_t *out, float *lse) {
  ina_mla_plan_info_t info;
  const size_t tokens = (size_t)(c->tokens > 0 ? c->tokens : 1);
  CHECK_OK(mla_dev_upload(&g->d, c));
  CHECK_OK(ina_cuda_memcpy_h2d(g->indices, indices, 4 * tokens * (size_t)sp->topk));
  const ina_mla_sparse_plan_params_t pp = sparse_params(c, sp);
  CHECK_OK(ina_mla_sparse_plan(&pp, g->d.host_ws, g->d.ws, NULL, &info));
  CHECK_OK(ina_cuda_synchronize()); /* the schedule's copy on the default stream */
  ina_mla_run_params_t rp = mla_run_params(c, &g->d);
  rp.indices = g->indices;
  if (!cap) {
    CHECK_OK(ina_mla_run(&info, g->d.ws, &rp, NULL));
  } else {
    if (!cap->exec) {
      cudaGraph_t graph = NULL;
      CHECK(cudaStreamCreateWithFlags(&cap->stream, cudaStreamNonBlocking) == cudaSuccess);
      CHECK(cudaStreamBeginCapture(cap->stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
      CHECK_OK(ina_mla_run(&info, g->d.ws, &rp, cap->stream));
      CHECK(cudaStreamEndCapture(cap->stream, &graph) == cudaSuccess);
      CHECK(graph && cudaGraphInstantiate(&cap->exec, graph, 0) == cudaSuccess);
      if (graph) cudaGraphDestroy(graph);
    }
    if (cap->exec) CHECK(cudaGraphLaunch(cap->exec, cap->stream) == cudaSuccess);
    CHECK(cudaStreamSynchronize(cap->stream) == cudaSuccess);
  }
  CHECK_OK(ina_cuda_synchronize());
  CHECK_OK(ina_cuda_memcpy_d2h(out, g->d.out, 2 * (size_t)c->out_elems));
  CHECK_OK(ina_cuda_memcpy_d2h(lse, g->d.lse, 4 * tokens * (size_t)c->s.num_heads));
}

static void draw_lengths(const spec_t *sp, test_rng_t *rng, int32_t *q_lens, int32_t *kv_lens) {
  for (int32_t b = 0; b < sp->batch; b++) {
    q_lens[b] = (int32_t)test_rng_int(rng, sp->min_q, sp->max_q);
    kv_lens[b] = (int32_t)test_rng_int(rng, sp->kv_min, sp->kv_max);
    if (kv_lens[b] < q_lens[b]) kv_lens[b] = q_lens[b];
  }
}

typedef struct solved {
  mla_case_t c;
  int32_t *indices;
  float *ref_out, *ref_lse, *bound, *lse_bound;
} solved_t;

static void solved_free(solved_t *x) {
  mla_case_free(&x->c);
  free(x->indices), free(x->ref_out), free(x->ref_lse), free(x->bound), free(x->lse_bound);
  memset(x, 0, sizeof *x);
}

static int reference(solved_t *x, int32_t topk, ina_threadpool_t *pool) {
  const mla_case_t *c = &x->c;
  const int32_t H = c->s.num_heads, C = c->s.kv_lora_rank;
  const size_t rows = (size_t)(c->tokens > 0 ? c->tokens : 1) * (size_t)H;
  ina_dsa_mla_plan_params_t pp = INA_DSA_MLA_PLAN_PARAMS_INIT;
  pp.backend = INA_DSA_BACKEND_REF;
  pp.batch = c->s.batch;
  pp.qo_indptr = c->qo_indptr;
  pp.kv_len = c->kv_len;
  pp.num_heads = H;
  pp.kv_lora_rank = C;
  pp.rope_dim = c->s.rope_dim;
  pp.page_size = c->s.page_size;
  pp.index_stride = topk;
  size_t bytes = 0;
  ina_dsa_plan_info_t info;
  if (ina_dsa_mla_workspace_size(&pp, &bytes) != INA_OK) return 0;
  void *ws = malloc(bytes > 0 ? bytes : 1);
  x->ref_out = malloc(sizeof(float) * rows * (size_t)C);
  x->ref_lse = malloc(sizeof(float) * rows);
  x->bound = malloc(sizeof(float) * rows * (size_t)C);
  x->lse_bound = malloc(sizeof(float) * rows);
  int ok = ws && x->ref_out && x->ref_lse && x->bound && x->lse_bound &&
           ina_dsa_mla_plan(&pp, ws, bytes, &info) == INA_OK;
  if (ok) {
    ina_dsa_mla_run_params_t rp = INA_DSA_MLA_RUN_PARAMS_INIT;
    rp.q_nope = c->q_nope_f;
    rp.q_pe = c->q_pe_f;
    rp.cache = c->cache;
    rp.kv_indptr = c->kv_indptr;
    rp.kv_indices = c->kv_indices;
    rp.indices = x->indices;
    rp.softmax_scale = c->s.softmax_scale;
    rp.out = x->ref_out;
    rp.lse = x->ref_lse;
    ok = ina_dsa_mla_run(&info, ws, &rp, pool, NULL) == INA_OK &&
         error_bounds(c, x->indices, topk, x->ref_out, x->ref_lse, x->bound, x->lse_bound);
  }
  free(ws);
  return ok;
}

/* scale: the softmax scale, or 0 for a random one (a graph replays with the scale it
 * was captured with, so a case replayed on another's graph takes that one's). */
static int build(solved_t *x, const spec_t *sp, float scale, test_rng_t *rng, ina_threadpool_t *pool) {
  memset(x, 0, sizeof *x);
  int32_t q_lens[64], kv_lens[64];
  draw_lengths(sp, rng, q_lens, kv_lens);
  mla_shape_t s = {sp->batch, sp->batch, sp->max_q, sp->heads, sp->C, sp->R, sp->page_size, sp->format,
                   sp->layout, sp->layout == MLA_LAYOUT_SEPARATE, 0, 0.0f};
  s.softmax_scale = scale > 0.0f ? scale : (float)(test_rng_uniform(rng) * 0.05 + 0.02);
  if (!mla_case_build(&x->c, &s, q_lens, kv_lens, rng, pool, 0)) return 0;
  x->indices = malloc(sizeof(int32_t) * (size_t)(x->c.tokens > 0 ? x->c.tokens : 1) * (size_t)sp->topk);
  if (!x->indices) return 0;
  draw_indices(&x->c, sp->topk, rng, x->indices);
  return reference(x, sp->topk, pool);
}

/* Rows (token, head) where replacing reference output `alt` for `ref` moves some element
 * by more than 4 times its bound: the rows a mutation must be caught on. */
static int64_t measurable_rows(const mla_case_t *c, const float *ref, const float *alt, const float *bound) {
  const int32_t H = c->s.num_heads, C = c->s.kv_lora_rank;
  int64_t rows = 0;
  for (int64_t r = 0; r < (int64_t)c->tokens * H; r++) {
    int moved = 0;
    for (int32_t d = 0; d < C && !moved; d++) moved = fabs(alt[r * C + d] - ref[r * C + d]) > 4.0 * bound[r * C + d];
    rows += moved;
  }
  return rows;
}

static void run_spec(const spec_t *sp, test_rng_t *rng, ina_threadpool_t *pool) {
  solved_t x, y;
  gpu_run_t g;
  captured_t cap_run = {NULL, NULL};
  memset(&g, 0, sizeof g);
  memset(&y, 0, sizeof y);
  uint16_t *out = NULL;
  float *lse = NULL;
  const int built = build(&x, sp, 0.0f, rng, pool);
  CHECKF(built, "%s: building the case failed: %s", sp->name, ina_last_error());
  if (!built) goto done;
  /* Device buffers for the bucket: a case of the bucket's largest shape sizes them. */
  {
    mla_case_t cap;
    spec_t big = *sp;
    big.kv_min = big.kv_max;
    int32_t q_lens[64], kv_lens[64];
    for (int32_t b = 0; b < sp->batch; b++) q_lens[b] = sp->max_q, kv_lens[b] = sp->kv_max;
    mla_shape_t s = x.c.s;
    if (!mla_case_build(&cap, &s, q_lens, kv_lens, rng, pool, 0)) {
      CHECKF(0, "%s: sizing case failed", sp->name);
      mla_case_free(&cap);
      goto done;
    }
    CHECK_OK(mla_dev_alloc(&g.d, &cap, sp->num_sms));
    ina_mla_sparse_plan_params_t pp = sparse_params(&cap, sp);
    size_t hb = 0, db = 0;
    CHECK_OK(ina_mla_sparse_workspace_size(&pp, &hb, &db));
    free(g.d.host_ws);
    ina_cuda_free(g.d.ws);
    g.d.host_ws = malloc(hb);
    CHECK(g.d.host_ws != NULL);
    CHECK_OK(ina_cuda_malloc(0, db, &g.d.ws));
    CHECK_OK(ina_cuda_malloc(0, 4 * (size_t)cap.tokens * (size_t)sp->topk, &g.indices));
    out = malloc(2 * (size_t)cap.out_elems);
    lse = malloc(4 * (size_t)cap.tokens * (size_t)sp->heads);
    mla_case_free(&cap);
    if (!g.d.host_ws || !g.d.ws || !g.indices || !out || !lse) goto done;
  }

  int64_t rows_bad = 0;
  double worst = 0.0;
  gpu_attend(&g, &x.c, sp, x.indices, NULL, out, lse);
  const int64_t over = count_over(&x.c, out, lse, x.ref_out, x.ref_lse, x.bound, x.lse_bound, &rows_bad, &worst, 1);
  CHECKF(over == 0, "%s: %lld elements over their bound in %lld rows (worst %.3g x bound)", sp->name,
         (long long)over, (long long)rows_bad, worst);
  const double worst_first = worst;
  const int64_t stray = mla_stray_writes(&x.c, out);
  CHECKF(stray == 0, "%s: %lld elements outside the output were written", sp->name, (long long)stray);

  /* Mutations, applied to the reference's side: the comparison must reject the GPU's
   * (correct) output against them wherever they are measurable. */
  const int32_t H = sp->heads, C = sp->C, R = sp->R, tokens = x.c.tokens;
  int caught_index = -1, caught_q = -1, caught_out = 0;
  int64_t rows_5pct = 0; /* rows where a 5 % output error exceeds the bound */
  {
    /* (1) the selected position of most weight for head 0 of the token with the longest
     * visible length, swapped for the first unselected one (a gather of a wrong row) */
    int32_t s_pick = -1, b_pick = -1, vis_pick = 0;
    for (int32_t b = 0; b < x.c.s.batch; b++) {
      const int32_t q_len = x.c.qo_indptr[b + 1] - x.c.qo_indptr[b];
      for (int32_t j = 0; j < q_len; j++) {
        const int32_t vis = x.c.kv_len[b] - q_len + j + 1;
        if (vis > sp->topk && vis > vis_pick) s_pick = x.c.qo_indptr[b] + j, b_pick = b, vis_pick = vis;
      }
    }
    if (s_pick >= 0) {
      int32_t *row = x.indices + (int64_t)s_pick * sp->topk;
      const float *qn = x.c.q_nope_f + (int64_t)s_pick * H * C, *qp = x.c.q_pe_f + (int64_t)s_pick * H * R;
      double kv[640], best = -INFINITY; /* C + R <= 640 */
      int32_t best_i = 0;
      for (int32_t i = 0; i < sp->topk; i++) {
        read_entry(&x.c, b_pick, row[i], kv, NULL);
        double dot = 0.0;
        for (int32_t d = 0; d < C; d++) dot += qn[d] * kv[d];
        for (int32_t d = 0; d < R; d++) dot += qp[d] * kv[C + d];
        if (dot > best) best = dot, best_i = i;
      }
      char *taken = calloc((size_t)vis_pick, 1);
      if (taken) {
        for (int32_t i = 0; i < sp->topk; i++) taken[row[i]] = 1;
        int32_t other = 0;
        while (taken[other]) other++; /* vis_pick > topk: one is free */
        free(taken);
        const int32_t saved = row[best_i];
        row[best_i] = other;
        solved_t m = {.c = x.c, .indices = x.indices};
        if (reference(&m, sp->topk, pool)) {
          int64_t rb = 0;
          double w = 0;
          const int64_t rows = measurable_rows(&x.c, x.ref_out, m.ref_out, x.bound);
          const int64_t o = count_over(&x.c, out, lse, m.ref_out, m.ref_lse, m.bound, m.lse_bound, &rb, &w, 0);
          caught_index = rows == 0 ? -1 : o > 0;
        }
        free(m.ref_out), free(m.ref_lse), free(m.bound), free(m.lse_bound);
        row[best_i] = saved;
      }
    }
    /* (2) head 0 of token 0 with its query scaled by 1.05 */
    solved_t m = {.c = x.c, .indices = x.indices};
    float *qn = x.c.q_nope_f, *qp = x.c.q_pe_f;
    float saved_q[640];
    for (int32_t d = 0; d < C; d++) saved_q[d] = qn[d], qn[d] *= 1.05f;
    for (int32_t d = 0; d < R; d++) saved_q[C + d] = qp[d], qp[d] *= 1.05f;
    if (reference(&m, sp->topk, pool)) {
      int64_t rb = 0;
      double w = 0;
      const int64_t rows = measurable_rows(&x.c, x.ref_out, m.ref_out, x.bound);
      const int64_t o = count_over(&x.c, out, lse, m.ref_out, m.ref_lse, m.bound, m.lse_bound, &rb, &w, 0);
      caught_q = rows == 0 ? -1 : o > 0;
    }
    for (int32_t d = 0; d < C; d++) qn[d] = saved_q[d];
    for (int32_t d = 0; d < R; d++) qp[d] = saved_q[C + d];
    free(m.ref_out), free(m.ref_lse), free(m.bound), free(m.lse_bound);
    /* (3) one row's output 5 % off (a normalization error). Whether 5 % shows depends
     * on the row: with weight spread over many positions A_d >> |out_d| and the bound
     * is wide. Count the rows where it would show, and apply it to the row whose bound
     * is tightest relative to its output. */
    int64_t r_pick = 0;
    double best = INFINITY;
    for (int64_t r = 0; r < (int64_t)tokens * H; r++) {
      double b = 0.0, o = 0.0;
      int shows = 0;
      for (int32_t d = 0; d < C; d++) {
        b += x.bound[r * C + d], o += fabs(x.ref_out[r * C + d]);
        shows |= 0.05 * fabs(x.ref_out[r * C + d]) > x.bound[r * C + d];
      }
      rows_5pct += shows;
      if (o > 0.0 && b / o < best) best = b / o, r_pick = r;
    }
    for (int32_t d = 0; d < C; d++) x.ref_out[r_pick * C + d] *= 1.05f;
    {
      int64_t rb = 0;
      double w = 0;
      caught_out = count_over(&x.c, out, lse, x.ref_out, x.ref_lse, x.bound, x.lse_bound, &rb, &w, 0) > 0;
    }
    for (int32_t d = 0; d < C; d++) x.ref_out[r_pick * C + d] /= 1.05f;
  }
  CHECKF(caught_index != 0, "%s: a swapped index passed the bound", sp->name);
  CHECKF(caught_q != 0, "%s: a 5 %% query error passed the bound", sp->name);
  CHECKF(caught_out, "%s: a row's output 5 %% off passed the bound", sp->name);

  /* The graph: captured on this case, replayed on a fresh one of the same bucket. */
  gpu_attend(&g, &x.c, sp, x.indices, &cap_run, out, lse);
  const int64_t over_capture = count_over(&x.c, out, lse, x.ref_out, x.ref_lse, x.bound, x.lse_bound, &rows_bad, &worst, 1);
  CHECKF(over_capture == 0, "%s: the captured run differs (%lld elements over)", sp->name, (long long)over_capture);
  const int built_y = build(&y, sp, x.c.s.softmax_scale, rng, pool);
  CHECK(built_y);
  int64_t over_replay = -1;
  if (built_y) {
    gpu_attend(&g, &y.c, sp, y.indices, &cap_run, out, lse);
    over_replay = count_over(&y.c, out, lse, y.ref_out, y.ref_lse, y.bound, y.lse_bound, &rows_bad, &worst, 1);
    CHECKF(over_replay == 0, "%s: the graph replayed after a re-plan differs (%lld elements over)", sp->name,
           (long long)over_replay);
  }
  printf("  %-38s tokens %4d: worst %.2f of the bound (replay %.2f); mutations caught: index %s, query x1.05 %s, "
         "row x1.05 %s (it shows on %lld of %lld rows); graph replay %s\n",
         sp->name, tokens, worst_first, worst, caught_index < 0 ? "n/a" : caught_index ? "yes" : "NO",
         caught_q < 0 ? "n/a" : caught_q ? "yes" : "NO", caught_out ? "yes" : "NO", (long long)rows_5pct,
         (long long)tokens * H, over_replay == 0 ? "ok" : "FAILED");
done:
  if (cap_run.exec) cudaGraphExecDestroy(cap_run.exec);
  if (cap_run.stream) cudaStreamDestroy(cap_run.stream);
  ina_cuda_free(g.indices);
  mla_dev_free(&g.d);
  solved_free(&x);
  solved_free(&y);
  free(out);
  free(lse);
}

int main(void) {
  const int skip = test_require_gpus("test_mla_sparse_gpu", 1);
  if (skip) return skip;
  char name[128];
  printf("test_mla_sparse_gpu: %s\n", ina_cuda_device_name(0, name, sizeof name));
  test_rng_t rng = {test_seed("test_mla_sparse_gpu")};
  ina_threadpool_t *pool = NULL;
  CHECK_OK(ina_threadpool_create(0, &pool));
  for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) run_spec(&specs[i], &rng, pool);
  ina_threadpool_destroy(pool);
  return test_finish("test_mla_sparse_gpu");
}

#else /* a build without CUDA has no sparse kernels to run */
int main(void) {
  return test_skip_gpu("test_mla_sparse_gpu", "this build has no CUDA");
}
#endif
