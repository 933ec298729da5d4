/* The absorption GEMMs on the GPU (mla/mla_absorb.h) against a CPU reference in double:
 * q_abs = q_nope . W_UK[h] and out = o_latent . W_UV[h]^T for 1, 16 and 128 heads at
 * DeepSeek's dims and for small odd ones, 1..300 tokens (bucket edges included), bf16
 * weights and FP8 block-scaled weights dequantized on the GPU (compared against the
 * exactly dequantized fp8 values). Inputs are strided views (q_nope inside q with its
 * rope part, padded heads and tokens) and outputs are written into poisoned, padded
 * buffers whose gaps must keep the poison. Relative L2 error <= 1e-2; NaN never passes.
 * Also: the dequantization kernel byte for byte, replay of a captured CUDA graph with
 * new inputs, and argument checks. Skipped (exit 77) without a CUDA device. */

#include "tests/gpu_test_util.h"

#include "core/cuda.h"
#include "core/dtype.h"
#include "core/log.h"
#include "mla/mla_absorb.h"

#ifdef INA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#define BF16_POISON 0xFFFFu /* a NaN */
#define MAX_TOKENS 300
#define MAX_CHECKED_TOKENS 6 /* reference tokens per call for the large shapes */

/* The worst relative L2 error seen with bf16 and with FP8 weights, printed at the end. */
static double g_worst_error[2] = {0, 0};

typedef struct absorb_case {
  int32_t heads, nope, v, C, rope;
  int fp8;
} absorb_case_t;

/* Device and host copies of one layer's kv_b_proj weight and its f32 reference values. */
typedef struct weight {
  int64_t rows, cols;
  float *ref;       /* [rows, cols] the values the GEMMs should use */
  uint16_t *d_bf16; /* device [rows, cols] */
} weight_t;

/* Strided activations or outputs of [T, H, row] inside a padded buffer. */
typedef struct view {
  int64_t token_stride, head_stride, row, elems;
  uint16_t *host;
  uint16_t *dev;
} view_t;

static int64_t round8(int64_t x) { return (x + 7) / 8 * 8; }

static int view_alloc(view_t *v, int32_t T, int32_t H, int64_t row, int64_t head_stride,
                      int64_t token_pad) {
  v->row = row;
  v->head_stride = head_stride;
  v->token_stride = H * head_stride + token_pad;
  v->elems = T * v->token_stride;
  v->host = malloc((size_t)v->elems * 2);
  v->dev = NULL;
  if (!v->host || ina_cuda_malloc(0, (size_t)v->elems * 2, (void **)&v->dev) != INA_OK) return 0;
  return 1;
}

static void view_free(view_t *v) {
  free(v->host);
  ina_cuda_free(v->dev);
  v->host = NULL;
  v->dev = NULL;
}

static uint16_t *at(const view_t *v, int64_t t, int64_t h) {
  return v->host + t * v->token_stride + h * v->head_stride;
}

static void fill_random(view_t *v, test_rng_t *rng) {
  for (int64_t i = 0; i < v->elems; i++) v->host[i] = ina_f32_to_bf16(test_rng_normal(rng));
}

/* Weight values ~N(0, 0.05^2), as bf16 or as FP8 with 128x128 block scales. The GPU's bf16
 * copy of an FP8 weight is made by the dequantization kernel and checked byte for byte
 * against bf16(fp8 * scale). */
static int weight_make(weight_t *w, const absorb_case_t *c, test_rng_t *rng) {
  w->rows = (int64_t)c->heads * (c->nope + c->v);
  w->cols = c->C;
  const int64_t n = w->rows * w->cols;
  const int64_t nscales = ((w->rows + 127) / 128) * ((w->cols + 127) / 128);
  float *x = malloc((size_t)n * sizeof *x);
  uint16_t *bf16 = malloc((size_t)n * 2), *from_gpu = malloc((size_t)n * 2);
  uint8_t *q = malloc((size_t)n);
  float *scale = malloc((size_t)nscales * sizeof *scale);
  void *d_q = NULL, *d_scale = NULL;
  int ok = 0;
  w->ref = malloc((size_t)n * sizeof *w->ref);
  w->d_bf16 = NULL;
  if (!x || !bf16 || !from_gpu || !q || !scale || !w->ref) goto done;
  if (ina_cuda_malloc(0, (size_t)n * 2, (void **)&w->d_bf16) != INA_OK) goto done;
  for (int64_t i = 0; i < n; i++) x[i] = 0.05f * test_rng_normal(rng);
  if (!c->fp8) {
    for (int64_t i = 0; i < n; i++) {
      bf16[i] = ina_f32_to_bf16(x[i]);
      w->ref[i] = ina_bf16_to_f32(bf16[i]);
    }
    ok = ina_cuda_memcpy_h2d(w->d_bf16, bf16, (size_t)n * 2) == INA_OK;
    goto done;
  }
  CHECK_OK(ina_fp8_quantize_blocks(x, w->rows, w->cols, 128, 128, q, scale));
  CHECK_OK(ina_fp8_dequantize_blocks(q, scale, w->rows, w->cols, 128, 128, w->ref));
  for (int64_t i = 0; i < n; i++) bf16[i] = ina_f32_to_bf16(w->ref[i]);
  CHECK_OK(ina_cuda_malloc(0, (size_t)n, &d_q));
  CHECK_OK(ina_cuda_malloc(0, (size_t)nscales * sizeof(float), &d_scale));
  if (!d_q || !d_scale) goto done;
  CHECK_OK(ina_cuda_memcpy_h2d(d_q, q, (size_t)n));
  CHECK_OK(ina_cuda_memcpy_h2d(d_scale, scale, (size_t)nscales * sizeof(float)));
  CHECK_OK(ina_mla_absorb_dequantize_weight(d_q, d_scale, w->rows, w->cols, w->d_bf16, NULL));
  CHECK_OK(ina_cuda_synchronize());
  CHECK_OK(ina_cuda_memcpy_d2h(from_gpu, w->d_bf16, (size_t)n * 2));
  int64_t bad = 0;
  for (int64_t i = 0; i < n; i++) bad += from_gpu[i] != bf16[i];
  CHECKF(bad == 0, "dequantized [%lld, %lld] weight: %lld of %lld values differ",
         (long long)w->rows, (long long)w->cols, (long long)bad, (long long)n);
  ok = 1;
done:
  free(x);
  free(bf16);
  free(from_gpu);
  free(q);
  free(scale);
  ina_cuda_free(d_q);
  ina_cuda_free(d_scale);
  CHECK(ok);
  return ok;
}

static void weight_free(weight_t *w) {
  free(w->ref);
  ina_cuda_free(w->d_bf16);
}

/* Tokens whose outputs are compared: all of them for small shapes, else the first, the
 * last and random ones. Returns the count. */
static int32_t pick_tokens(int32_t T, int64_t work_per_token, int32_t *tokens, test_rng_t *rng) {
  if ((int64_t)T * work_per_token <= ((int64_t)1 << 26) || T <= MAX_CHECKED_TOKENS) {
    for (int32_t t = 0; t < T; t++) tokens[t] = t;
    return T;
  }
  tokens[0] = 0;
  tokens[1] = T - 1;
  for (int32_t i = 2; i < MAX_CHECKED_TOKENS; i++) tokens[i] = (int32_t)test_rng_int(rng, 1, T - 2);
  return MAX_CHECKED_TOKENS;
}

/* Compares output view `out` (read back from the device) with the double reference for
 * the chosen tokens: rel L2 <= 1e-2, every written value finite, gaps still poisoned.
 * `weight_row0` is the first weight row of head 0 (0 for W_UK, nope for W_UV);
 * absorb_q contracts over weight rows (out[c] = sum_k in[k] W[row0 + k, c]), absorb_v
 * over weight columns (out[j] = sum_c in[c] W[row0 + j, c]). */
static void check_output(const char *what, const absorb_case_t *c, const weight_t *w, int is_q,
                         const view_t *in, const view_t *out, int32_t T, test_rng_t *rng) {
  const int32_t H = c->heads;
  const int64_t in_row = in->row, out_row = out->row;
  int32_t tokens[MAX_TOKENS];
  const int32_t nt = pick_tokens(T, (int64_t)H * in_row * out_row, tokens, rng);
  float *got = malloc((size_t)nt * H * out_row * sizeof(float));
  float *ref = malloc((size_t)nt * H * out_row * sizeof(float));
  double *acc = malloc((size_t)out_row * sizeof(double));
  float *x = malloc((size_t)in_row * sizeof(float));
  CHECK(got && ref && acc && x);
  if (!got || !ref || !acc || !x) goto done;
  for (int32_t i = 0; i < nt; i++) {
    const int32_t t = tokens[i];
    for (int32_t h = 0; h < H; h++) {
      const int64_t row0 = (int64_t)h * (c->nope + c->v) + (is_q ? 0 : c->nope);
      ina_to_f32(at(in, t, h), INA_DTYPE_BF16, x, (size_t)in_row);
      for (int64_t j = 0; j < out_row; j++) acc[j] = 0;
      if (is_q) {
        for (int64_t k = 0; k < in_row; k++) {
          const float *wrow = w->ref + (row0 + k) * w->cols;
          for (int64_t j = 0; j < out_row; j++) acc[j] += (double)x[k] * wrow[j];
        }
      } else {
        for (int64_t j = 0; j < out_row; j++) {
          const float *wrow = w->ref + (row0 + j) * w->cols;
          double s = 0;
          for (int64_t k = 0; k < in_row; k++) s += (double)x[k] * wrow[k];
          acc[j] = s;
        }
      }
      float *g = got + ((int64_t)i * H + h) * out_row, *r = ref + ((int64_t)i * H + h) * out_row;
      ina_to_f32(at(out, t, h), INA_DTYPE_BF16, g, (size_t)out_row);
      for (int64_t j = 0; j < out_row; j++) r[j] = (float)acc[j];
    }
  }
  const double err = test_rel_l2(got, ref, (size_t)nt * H * out_row);
  CHECKF(err <= 1e-2, "%s: relative L2 error %.3g over %d tokens", what, err, nt);
  if (!(err <= g_worst_error[c->fp8])) g_worst_error[c->fp8] = err; /* NaN-safe */

  /* Every element of the T x H x out_row block written and finite; the rest poisoned. */
  int64_t nan_written = 0, unpoisoned = 0;
  for (int64_t i = 0; i < out->elems; i++) {
    const int64_t t = i / out->token_stride, r = i % out->token_stride;
    const int written = t < T && r < H * out->head_stride && r % out->head_stride < out_row;
    const uint16_t b = out->host[i];
    if (written)
      nan_written += (b & 0x7FFFu) > 0x7F80u;
    else
      unpoisoned += b != BF16_POISON;
  }
  CHECKF(nan_written == 0, "%s: %lld written values are NaN (unwritten?)", what,
         (long long)nan_written);
  CHECKF(unpoisoned == 0, "%s: %lld values outside the output changed", what,
         (long long)unpoisoned);
done:
  free(got);
  free(ref);
  free(acc);
  free(x);
}

static void poison(view_t *v) {
  for (int64_t i = 0; i < v->elems; i++) v->host[i] = BF16_POISON;
}

/* One call of each GEMM with T tokens on fresh inputs. */
static void run_tokens(const ina_mla_absorb_t *a, const absorb_case_t *c, const weight_t *w,
                       int32_t T, test_rng_t *rng) {
  const int32_t H = c->heads;
  view_t q, q_abs, o, out;
  char what[160];
  memset(&q, 0, sizeof q), memset(&q_abs, 0, sizeof q_abs), memset(&o, 0, sizeof o),
      memset(&out, 0, sizeof out);
  /* q_nope is the head of each [nope | rope] row of q; the others get padded strides. */
  const int ok =
      view_alloc(&q, T, H, c->nope, round8(c->nope + c->rope), 0) &&
      view_alloc(&q_abs, T, H, c->C, c->C + 8 * test_rng_int(rng, 0, 2),
                 8 * test_rng_int(rng, 0, 3)) &&
      view_alloc(&o, T, H, c->C, c->C + 8 * test_rng_int(rng, 0, 1), 8 * test_rng_int(rng, 0, 2)) &&
      view_alloc(&out, T, H, c->v, round8(c->v) + 8 * test_rng_int(rng, 0, 1),
                 8 * test_rng_int(rng, 0, 2));
  CHECK(ok);
  if (!ok) goto done;
  fill_random(&q, rng);
  fill_random(&o, rng);
  poison(&q_abs);
  poison(&out);
  CHECK_OK(ina_cuda_memcpy_h2d(q.dev, q.host, (size_t)q.elems * 2));
  CHECK_OK(ina_cuda_memcpy_h2d(o.dev, o.host, (size_t)o.elems * 2));
  CHECK_OK(ina_cuda_memcpy_h2d(q_abs.dev, q_abs.host, (size_t)q_abs.elems * 2));
  CHECK_OK(ina_cuda_memcpy_h2d(out.dev, out.host, (size_t)out.elems * 2));
  CHECK_OK(ina_mla_absorb_q(a, w->d_bf16, T, q.dev, q.token_stride, q.head_stride, q_abs.dev,
                            q_abs.token_stride, q_abs.head_stride, NULL));
  CHECK_OK(ina_mla_absorb_v(a, w->d_bf16, T, o.dev, o.token_stride, o.head_stride, out.dev,
                            out.token_stride, out.head_stride, NULL));
  CHECK_OK(ina_cuda_synchronize());
  CHECK_OK(ina_cuda_memcpy_d2h(q_abs.host, q_abs.dev, (size_t)q_abs.elems * 2));
  CHECK_OK(ina_cuda_memcpy_d2h(out.host, out.dev, (size_t)out.elems * 2));
  snprintf(what, sizeof what, "W_UK H %d nope %d v %d C %d %s T %d", H, c->nope, c->v, c->C,
           c->fp8 ? "fp8" : "bf16", T);
  check_output(what, c, w, 1, &q, &q_abs, T, rng);
  snprintf(what, sizeof what, "W_UV H %d nope %d v %d C %d %s T %d", H, c->nope, c->v, c->C,
           c->fp8 ? "fp8" : "bf16", T);
  check_output(what, c, w, 0, &o, &out, T, rng);
done:
  view_free(&q);
  view_free(&q_abs);
  view_free(&o);
  view_free(&out);
}

static ina_mla_absorb_t *create(const absorb_case_t *c) {
  ina_mla_absorb_dims_t dims = INA_MLA_ABSORB_DIMS_INIT;
  ina_mla_absorb_t *a = NULL;
  dims.num_heads = c->heads;
  dims.qk_nope_head_dim = c->nope;
  dims.v_head_dim = c->v;
  dims.kv_lora_rank = c->C;
  dims.max_tokens = MAX_TOKENS;
  CHECK_OK(ina_mla_absorb_create(&dims, &a));
  return a;
}

static void test_cases(test_rng_t *rng) {
  static const absorb_case_t cases[] = {
      {1, 128, 128, 512, 64, 0}, {16, 128, 128, 512, 64, 0}, {128, 128, 128, 512, 64, 0},
      {1, 128, 128, 512, 64, 1}, {16, 128, 128, 512, 64, 1}, {128, 128, 128, 512, 64, 1},
      {16, 64, 32, 256, 32, 1},  {3, 24, 40, 136, 8, 1},     {5, 16, 8, 64, 16, 0},
      {128, 32, 48, 520, 16, 1},
  };
  static const int32_t edges[] = {1, 2, 3, 64, 65, 128, 129, 256, 257, MAX_TOKENS};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const absorb_case_t *c = &cases[i];
    weight_t w;
    ina_mla_absorb_t *a = create(c);
    if (!a || !weight_make(&w, c, rng)) {
      ina_mla_absorb_destroy(a);
      continue;
    }
    /* Bucket edges on the small shapes, random counts (and the limit) on all. */
    const int small = (int64_t)c->heads * c->C <= 16 * 512;
    if (small)
      for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        run_tokens(a, c, &w, edges[e], rng);
    else {
      run_tokens(a, c, &w, 1, rng);
      run_tokens(a, c, &w, MAX_TOKENS, rng);
    }
    for (int r = 0; r < 2; r++)
      run_tokens(a, c, &w, (int32_t)test_rng_int(rng, 1, MAX_TOKENS), rng);
    weight_free(&w);
    ina_mla_absorb_destroy(a);
  }
}

#ifdef INA_HAVE_CUDA
/* Both GEMMs captured once into a CUDA graph, then replayed on new input values: the
 * replay must compute with the new values (no host-side state baked in but pointers). */
static void test_graph(test_rng_t *rng) {
  const absorb_case_t c = {16, 128, 128, 512, 64, 0};
  const int32_t T = 37;
  weight_t w;
  view_t q, q_abs, o, out;
  cudaStream_t stream = NULL;
  cudaGraph_t graph = NULL;
  cudaGraphExec_t exec = NULL;
  memset(&q, 0, sizeof q), memset(&q_abs, 0, sizeof q_abs), memset(&o, 0, sizeof o),
      memset(&out, 0, sizeof out);
  ina_mla_absorb_t *a = create(&c);
  if (!a || !weight_make(&w, &c, rng)) {
    ina_mla_absorb_destroy(a);
    return;
  }
  const int ok = view_alloc(&q, T, c.heads, c.nope, c.nope + c.rope, 0) &&
                 view_alloc(&q_abs, T, c.heads, c.C, c.C, 0) &&
                 view_alloc(&o, T, c.heads, c.C, c.C, 0) &&
                 view_alloc(&out, T, c.heads, c.v, c.v, 0);
  CHECK(ok);
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  if (!ok || !stream) goto done;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  CHECK_OK(ina_mla_absorb_q(a, w.d_bf16, T, q.dev, q.token_stride, q.head_stride, q_abs.dev,
                            q_abs.token_stride, q_abs.head_stride, stream));
  CHECK_OK(ina_mla_absorb_v(a, w.d_bf16, T, o.dev, o.token_stride, o.head_stride, out.dev,
                            out.token_stride, out.head_stride, stream));
  CHECK(cudaStreamEndCapture(stream, &graph) == cudaSuccess);
  CHECK(graph && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
  if (!exec) goto done;
  for (int replay = 0; replay < 2; replay++) {
    fill_random(&q, rng);
    fill_random(&o, rng);
    poison(&q_abs);
    poison(&out);
    CHECK_OK(ina_cuda_memcpy_h2d(q.dev, q.host, (size_t)q.elems * 2));
    CHECK_OK(ina_cuda_memcpy_h2d(o.dev, o.host, (size_t)o.elems * 2));
    CHECK_OK(ina_cuda_memcpy_h2d(q_abs.dev, q_abs.host, (size_t)q_abs.elems * 2));
    CHECK_OK(ina_cuda_memcpy_h2d(out.dev, out.host, (size_t)out.elems * 2));
    CHECK(cudaGraphLaunch(exec, stream) == cudaSuccess);
    CHECK(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK_OK(ina_cuda_memcpy_d2h(q_abs.host, q_abs.dev, (size_t)q_abs.elems * 2));
    CHECK_OK(ina_cuda_memcpy_d2h(out.host, out.dev, (size_t)out.elems * 2));
    check_output("graph replay W_UK", &c, &w, 1, &q, &q_abs, T, rng);
    check_output("graph replay W_UV", &c, &w, 0, &o, &out, T, rng);
  }
done:
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (stream) cudaStreamDestroy(stream);
  view_free(&q);
  view_free(&q_abs);
  view_free(&o);
  view_free(&out);
  weight_free(&w);
  ina_mla_absorb_destroy(a);
}
#endif

static void test_arguments(void) {
  const absorb_case_t c = {2, 16, 16, 64, 16, 0};
  ina_mla_absorb_dims_t dims = INA_MLA_ABSORB_DIMS_INIT;
  ina_mla_absorb_t *bad = (ina_mla_absorb_t *)&dims;
  ina_mla_absorb_t *a = create(&c);
  void *buf = NULL;
  CHECK_OK(ina_cuda_malloc(0, 1 << 16, &buf));
  if (!a || !buf) goto done;
  uint16_t *w = buf, *in = (uint16_t *)buf + 8192, *out = (uint16_t *)buf + 16384;
  ina_log_set_quiet_errors(1);
  dims.kv_lora_rank = 100; /* rows of 200 bytes: not 16-byte aligned */
  CHECK(ina_mla_absorb_create(&dims, &bad) == INA_ERR_UNSUPPORTED && bad == NULL);
  dims.kv_lora_rank = 512, dims.max_tokens = 0;
  CHECK(ina_mla_absorb_create(&dims, &bad) == INA_ERR_INVALID_ARGUMENT && bad == NULL);
  CHECK(ina_mla_absorb_create(NULL, &bad) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_mla_absorb_q(NULL, w, 1, in, 16, 16, out, 64, 64, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_mla_absorb_q(a, w, MAX_TOKENS + 1, in, 32, 16, out, 128, 64, NULL) ==
        INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_mla_absorb_q(a, w, -1, in, 32, 16, out, 128, 64, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_mla_absorb_q(a, w, 1, in + 1, 32, 16, out, 128, 64, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_mla_absorb_q(a, w, 1, in, 32, 18, out, 128, 64, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_mla_absorb_v(a, w, 1, in, 128, 64, out, 32, 8, NULL) == INA_ERR_INVALID_ARGUMENT);
  CHECK(ina_mla_absorb_v(a, NULL, 1, in, 128, 64, out, 32, 16, NULL) == INA_ERR_INVALID_ARGUMENT);
  ina_log_set_quiet_errors(0);
  /* No tokens: nothing to do, nothing dereferenced. */
  CHECK_OK(ina_mla_absorb_q(a, NULL, 0, NULL, 0, 0, NULL, 0, 0, NULL));
  CHECK_OK(ina_mla_absorb_dequantize_weight(NULL, NULL, 0, 512, NULL, NULL));
  CHECK_OK(ina_cuda_synchronize());
done:
  ina_cuda_free(buf);
  ina_mla_absorb_destroy(a);
}

int main(void) {
  const int skip = test_require_gpus("test_mla_absorb_gpu", 1);
  if (skip) return skip;
  test_rng_t rng = {test_seed("test_mla_absorb_gpu")};
  char name[128];
  printf("device: %s\n", ina_cuda_device_name(0, name, sizeof name));
  test_arguments();
  test_cases(&rng);
#ifdef INA_HAVE_CUDA
  test_graph(&rng);
#endif
  printf("test_mla_absorb_gpu: worst relative L2 error %.3g (bf16 weights), %.3g (fp8 weights)\n",
         g_worst_error[0], g_worst_error[1]);
  return test_finish("test_mla_absorb_gpu");
}
