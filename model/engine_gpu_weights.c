/* Upload of a model's weights for the CUDA engine: the rules are in engine_gpu.h. */
#define INA_LOG_SUBSYS "model"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/cuda_check.h"
#include "core/log.h"
#include "gemm/gemm.h"
#include "mla/mla_absorb.h"
#include "model/engine_gpu.h"

/* Host conversion works through staging buffers of this many elements, so a large
 * tensor (a V3 embedding is 0.9 G values) never needs a whole f32 copy on the host. */
#define CONVERT_CHUNK ((size_t)1 << 20)

ina_status_t ina_gpu_weights_alloc(gpu_weights_t *g, size_t bytes, void **out) {
  ina_status_t st = INA_OK;
  void *p = NULL;
  *out = NULL;
  if (g->num_allocs == g->cap_allocs) {
    int64_t cap = g->cap_allocs ? 2 * g->cap_allocs : 256;
    void **grown = realloc(g->allocs, (size_t)cap * sizeof *grown);
    INA_CHECK_ALLOC(grown);
    g->allocs = grown;
    g->cap_allocs = cap;
  }
  INA_CUDA_CHECK(cudaMalloc(&p, bytes > 0 ? bytes : 16));
  g->allocs[g->num_allocs++] = p;
  g->device_bytes += (int64_t)bytes;
  *out = p;
fail:
  return st;
}

/* t (any float dtype but FP8) converted to `to` (BF16 or F32) in a new device buffer. */
static ina_status_t upload_as(gpu_weights_t *g, const ina_tensor_t *t, ina_dtype_t to, const char *what,
                              void **out) {
  ina_status_t st = INA_OK;
  float *f32 = NULL;
  void *conv = NULL;
  const size_t n = (size_t)ina_tensor_numel(t), esize = ina_dtype_size(to);
  *out = NULL;
  INA_REQUIRE(t->data != NULL && n > 0, INA_ERR_INTERNAL, "gpu engine: tensor %s is empty", what);
  INA_REQUIRE(t->dtype == INA_DTYPE_F32 || t->dtype == INA_DTYPE_BF16 || t->dtype == INA_DTYPE_F16,
              INA_ERR_UNSUPPORTED, "gpu engine: tensor %s is stored as %s; expected f32, bf16 or f16",
              what, ina_dtype_name(t->dtype));
  INA_CHECK(ina_gpu_weights_alloc(g, n * esize, out));
  if (t->dtype == to) {
    INA_CUDA_CHECK(cudaMemcpy(*out, t->data, n * esize, cudaMemcpyHostToDevice));
    return INA_OK;
  }
  f32 = malloc(CONVERT_CHUNK * sizeof(float));
  conv = malloc(CONVERT_CHUNK * esize);
  INA_CHECK_ALLOC(f32);
  INA_CHECK_ALLOC(conv);
  for (size_t begin = 0; begin < n; begin += CONVERT_CHUNK) {
    const size_t count = n - begin < CONVERT_CHUNK ? n - begin : CONVERT_CHUNK;
    ina_to_f32((const char *)t->data + begin * ina_dtype_size(t->dtype), t->dtype, f32, count);
    if (to == INA_DTYPE_F32)
      memcpy(conv, f32, count * sizeof(float));
    else
      INA_CHECK(ina_from_f32(f32, conv, to, count));
    INA_CUDA_CHECK(cudaMemcpy((char *)*out + begin * esize, conv, count * esize, cudaMemcpyHostToDevice));
  }
fail:
  free(f32);
  free(conv);
  return st;
}

/* An f32 matrix (the router, V3.2's weights_proj) as bf16 hi + lo (see engine_gpu.h);
 * lo stays NULL for one that is already exact in bf16. */
static ina_status_t upload_hi_lo(gpu_weights_t *g, const ina_tensor_t *t, const char *what, uint16_t **hi_out,
                                 uint16_t **lo_out) {
  ina_status_t st = INA_OK;
  float *f32 = NULL;
  uint16_t *hi = NULL, *lo = NULL;
  const size_t n = (size_t)ina_tensor_numel(t);
  INA_CHECK(upload_as(g, t, INA_DTYPE_BF16, what, (void **)hi_out));
  if (t->dtype == INA_DTYPE_BF16) return INA_OK;
  f32 = malloc(n * sizeof(float));
  hi = malloc(n * sizeof(uint16_t));
  lo = malloc(n * sizeof(uint16_t));
  INA_CHECK_ALLOC(f32);
  INA_CHECK_ALLOC(hi);
  INA_CHECK_ALLOC(lo);
  ina_to_f32(t->data, t->dtype, f32, n);
  INA_CHECK(ina_from_f32(f32, hi, INA_DTYPE_BF16, n));
  for (size_t i = 0; i < n; i++) f32[i] -= ina_bf16_to_f32(hi[i]);
  INA_CHECK(ina_from_f32(f32, lo, INA_DTYPE_BF16, n));
  INA_CHECK(ina_gpu_weights_alloc(g, n * sizeof(uint16_t), (void **)lo_out));
  INA_CUDA_CHECK(cudaMemcpy(*lo_out, lo, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
fail:
  free(f32);
  free(hi);
  free(lo);
  return st;
}

/* An FP8 weight dequantized to bf16 on the device. */
static ina_status_t dequantize_fp8(gpu_weights_t *g, const ina_linear_t *lin, int64_t n, int64_t k,
                                   cudaStream_t stream, uint16_t **out) {
  ina_status_t st = INA_OK;
  uint8_t *w8 = NULL;
  float *scale = NULL;
  const size_t scale_count = (size_t)ina_tensor_numel(&lin->scale_inv);
  INA_CUDA_CHECK(cudaMalloc((void **)&w8, (size_t)(n * k)));
  INA_CUDA_CHECK(cudaMalloc((void **)&scale, scale_count * sizeof(float)));
  INA_CUDA_CHECK(cudaMemcpy(w8, lin->weight.data, (size_t)(n * k), cudaMemcpyHostToDevice));
  INA_CUDA_CHECK(cudaMemcpy(scale, lin->scale_inv.data, scale_count * sizeof(float), cudaMemcpyHostToDevice));
  INA_CHECK(ina_gpu_weights_alloc(g, (size_t)(n * k) * sizeof(uint16_t), (void **)out));
  INA_CHECK(ina_mla_absorb_dequantize_weight(w8, scale, n, k, *out, stream));
  INA_CUDA_CHECK(cudaStreamSynchronize(stream));
fail:
  cudaFree(w8);
  cudaFree(scale);
  return st;
}

/* One linear. allow_fp8 = 0 forces bf16 (kv_b_proj). */
int ina_gpu_weights_fp8_gemm_takes(int64_t n, int64_t k) { return n % 16 == 0 && k % 16 == 0; }

static ina_status_t upload_linear(gpu_weights_t *g, const ina_linear_t *lin, const char *what, int allow_fp8,
                                  cudaStream_t stream, gpu_linear_t *out) {
  ina_status_t st = INA_OK;
  float *packed = NULL;
  const ina_tensor_t *w = &lin->weight;
  memset(out, 0, sizeof *out);
  INA_REQUIRE(w->ndim == 2, INA_ERR_INTERNAL, "gpu engine: linear %s is not 2-d", what);
  INA_REQUIRE(ina_tensor_is_empty(&lin->bias), INA_ERR_UNSUPPORTED,
              "gpu engine: linear %s has a bias (attention_bias / mlp_bias), which the GPU engine "
              "does not support yet; use the CPU engine (--device cpu)", what);
  out->n = w->shape[0];
  out->k = w->shape[1];
  if (w->dtype != INA_DTYPE_FP8_E4M3) return upload_as(g, w, INA_DTYPE_BF16, what, &out->w);

  const int64_t sr = (out->n + INA_GEMM_BLOCK - 1) / INA_GEMM_BLOCK, sc = (out->k + INA_GEMM_BLOCK - 1) / INA_GEMM_BLOCK;
  INA_REQUIRE(lin->block_rows == INA_GEMM_BLOCK && lin->block_cols == INA_GEMM_BLOCK &&
                  lin->scale_inv.dtype == INA_DTYPE_F32 && ina_tensor_numel(&lin->scale_inv) == sr * sc,
              INA_ERR_UNSUPPORTED,
              "gpu engine: FP8 linear %s has %dx%d blocks (scale_inv %s, %lld values); the GPU takes "
              "128x128 blocks with f32 scales [%lld, %lld]",
              what, lin->block_rows, lin->block_cols, ina_dtype_name(lin->scale_inv.dtype),
              (long long)ina_tensor_numel(&lin->scale_inv), (long long)sr, (long long)sc);
  if (!allow_fp8 || !ina_gpu_weights_fp8_gemm_takes(out->n, out->k)) {
    if (allow_fp8)
      INA_LOG_I(INA_LOG_SUBSYS,
                "gpu engine: FP8 linear %s [%lld, %lld] dequantized to bf16 (the FP8 GEMM needs N and K "
                "multiples of 16)", what, (long long)out->n, (long long)out->k);
    return dequantize_fp8(g, lin, out->n, out->k, stream, (uint16_t **)&out->w);
  }
  {
    const int64_t count = ina_gemm_w_scale_count(out->n, out->k);
    packed = malloc((size_t)count * sizeof(float));
    INA_CHECK_ALLOC(packed);
    INA_CHECK(ina_gemm_pack_w_scales(lin->scale_inv.data, out->n, out->k, packed));
    INA_CHECK(ina_gpu_weights_alloc(g, (size_t)(out->n * out->k), &out->w));
    INA_CUDA_CHECK(cudaMemcpy(out->w, w->data, (size_t)(out->n * out->k), cudaMemcpyHostToDevice));
    INA_CHECK(ina_gpu_weights_alloc(g, (size_t)count * sizeof(float), (void **)&out->w_scale));
    INA_CUDA_CHECK(cudaMemcpy(out->w_scale, packed, (size_t)count * sizeof(float), cudaMemcpyHostToDevice));
    out->fp8 = 1;
    if (out->k > g->fp8_max_k) g->fp8_max_k = out->k;
  }
fail:
  free(packed);
  return st;
}

static ina_status_t upload_mlp(gpu_weights_t *g, const ina_mlp_weights_t *m, const char *what, cudaStream_t s,
                               gpu_mlp_t *out) {
  ina_status_t st = INA_OK;
  char name[160];
  snprintf(name, sizeof name, "%s.gate_proj", what);
  INA_CHECK(upload_linear(g, &m->gate, name, 1, s, &out->gate));
  snprintf(name, sizeof name, "%s.up_proj", what);
  INA_CHECK(upload_linear(g, &m->up, name, 1, s, &out->up));
  snprintf(name, sizeof name, "%s.down_proj", what);
  INA_CHECK(upload_linear(g, &m->down, name, 1, s, &out->down));
  if (out->gate.n > g->max_expert_inter) g->max_expert_inter = out->gate.n;
fail:
  return st;
}

/* Part i of an MLP: 0 gate, 1 up, 2 down (the order of gpu_layer_t.grouped_*). */
static const gpu_linear_t *mlp_part(const gpu_mlp_t *m, int i) { return i == 0 ? &m->gate : i == 1 ? &m->up : &m->down; }

/* The grouped GEMM takes the experts when they share one mode and their N and K are
 * multiples of 16 for FP8 or 8 for bf16 (which also keeps the rows 16-byte aligned). */
ina_status_t ina_gpu_weights_expert_tables(gpu_weights_t *g, int32_t num_experts, gpu_layer_t *L) {
  ina_status_t st = INA_OK;
  const void **w = NULL;
  const float **scale = NULL;
  const int fp8 = L->experts[0].gate.fp8;
  const int64_t align = fp8 ? 16 : 8;
  for (int32_t x = 0; x < num_experts; x++) {
    for (int i = 0; i < 3; i++) {
      const gpu_linear_t *part = mlp_part(&L->experts[x], i), *first = mlp_part(&L->experts[0], i);
      if (part->fp8 != fp8 || part->n % align != 0 || part->k % align != 0 || part->n != first->n ||
          part->k != first->k)
        return INA_OK; /* the per-expert path serves this layer */
    }
  }
  w = malloc((size_t)num_experts * sizeof *w);
  scale = malloc((size_t)num_experts * sizeof *scale);
  INA_CHECK_ALLOC(w);
  INA_CHECK_ALLOC(scale);
  for (int i = 0; i < 3; i++) {
    for (int32_t x = 0; x < num_experts; x++) {
      const gpu_linear_t *part = mlp_part(&L->experts[x], i);
      w[x] = part->w;
      scale[x] = part->w_scale;
    }
    INA_CHECK(ina_gpu_weights_alloc(g, (size_t)num_experts * sizeof *w, (void **)&L->grouped_w[i]));
    INA_CUDA_CHECK(cudaMemcpy(L->grouped_w[i], w, (size_t)num_experts * sizeof *w, cudaMemcpyHostToDevice));
    if (fp8) {
      INA_CHECK(ina_gpu_weights_alloc(g, (size_t)num_experts * sizeof *scale, (void **)&L->grouped_scale[i]));
      INA_CUDA_CHECK(cudaMemcpy(L->grouped_scale[i], scale, (size_t)num_experts * sizeof *scale,
                                cudaMemcpyHostToDevice));
    }
  }
  L->grouped_fp8 = fp8;
fail:
  free(w);
  free(scale);
  return st;
}

static ina_status_t upload_layer(gpu_weights_t *g, const ina_layer_weights_t *L, const ina_model_config_t *c,
                                 int32_t l, cudaStream_t s, gpu_layer_t *out) {
  ina_status_t st = INA_OK;
  char name[128];
#define NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix), name)
  INA_CHECK(upload_as(g, &L->input_norm, INA_DTYPE_F32, NAME("input_layernorm"), (void **)&out->input_norm));
  INA_CHECK(upload_as(g, &L->post_attention_norm, INA_DTYPE_F32, NAME("post_attention_layernorm"),
                      (void **)&out->post_attention_norm));
  if (c->q_lora_rank > 0) {
    INA_CHECK(upload_linear(g, &L->q_a_proj, NAME("self_attn.q_a_proj"), 1, s, &out->q_a_proj));
    INA_CHECK(upload_as(g, &L->q_a_norm, INA_DTYPE_F32, NAME("self_attn.q_a_layernorm"), (void **)&out->q_a_norm));
    INA_CHECK(upload_linear(g, &L->q_b_proj, NAME("self_attn.q_b_proj"), 1, s, &out->q_b_proj));
  } else {
    INA_CHECK(upload_linear(g, &L->q_proj, NAME("self_attn.q_proj"), 1, s, &out->q_proj));
  }
  INA_CHECK(upload_linear(g, &L->kv_a_proj, NAME("self_attn.kv_a_proj_with_mqa"), 1, s, &out->kv_a_proj));
  INA_CHECK(upload_as(g, &L->kv_a_norm, INA_DTYPE_BF16, NAME("self_attn.kv_a_layernorm"), (void **)&out->kv_a_norm));
  {
    gpu_linear_t kv_b;
    INA_CHECK(upload_linear(g, &L->kv_b_proj, NAME("self_attn.kv_b_proj"), 0, s, &kv_b));
    out->kv_b = kv_b.w;
  }
  INA_CHECK(upload_linear(g, &L->o_proj, NAME("self_attn.o_proj"), 1, s, &out->o_proj));
  if (ina_cfg_has_indexer(c)) {
    INA_CHECK(upload_linear(g, &L->index_wq_b, NAME("self_attn.indexer.wq_b"), 1, s, &out->index_wq_b));
    INA_CHECK(upload_linear(g, &L->index_wk, NAME("self_attn.indexer.wk"), 1, s, &out->index_wk));
    INA_CHECK(upload_as(g, &L->index_k_norm, INA_DTYPE_F32, NAME("self_attn.indexer.k_norm.weight"),
                        (void **)&out->index_k_norm));
    INA_CHECK(upload_as(g, &L->index_k_norm_bias, INA_DTYPE_F32, NAME("self_attn.indexer.k_norm.bias"),
                        (void **)&out->index_k_norm_bias));
    INA_CHECK(upload_hi_lo(g, &L->index_weights_proj, NAME("self_attn.indexer.weights_proj.weight"),
                           &out->index_w_hi, &out->index_w_lo));
  }
  out->is_moe = L->is_moe;
  out->has_shared = L->has_shared;
  if (!L->is_moe || L->has_shared)
    INA_CHECK(upload_mlp(g, &L->mlp, L->is_moe ? NAME("mlp.shared_experts") : NAME("mlp"), s, &out->mlp));
  if (L->is_moe) {
    INA_CHECK(upload_hi_lo(g, &L->router, NAME("mlp.gate.weight"), &out->router_hi, &out->router_lo));
    if (!ina_tensor_is_empty(&L->router_bias))
      INA_CHECK(upload_as(g, &L->router_bias, INA_DTYPE_F32, NAME("mlp.gate.e_score_correction_bias"),
                          (void **)&out->router_bias));
    const int32_t held = g->expert_end - g->expert_begin;
    out->experts = calloc((size_t)held + 1, sizeof *out->experts);
    INA_CHECK_ALLOC(out->experts);
    for (int32_t x = 0; x < held; x++) {
      char expert[96];
      snprintf(expert, sizeof expert, "model.layers.%d.mlp.experts.%d", l, g->expert_begin + x);
      INA_CHECK(upload_mlp(g, &L->experts[x], expert, s, &out->experts[x]));
    }
    if (held > 0) INA_CHECK(ina_gpu_weights_expert_tables(g, held, out));
  }
#undef NAME
fail:
  return st;
}

ina_status_t ina_gpu_weights_upload(const ina_weights_t *w, const ina_model_config_t *c, cudaStream_t stream,
                                    gpu_weights_t *out) {
  ina_status_t st = INA_OK;
  memset(out, 0, sizeof *out);
  out->expert_begin = w->expert_begin;
  out->expert_end = w->expert_end;
  out->tp_rank = w->tp_rank;
  out->tp_size = w->tp_size;
  INA_CHECK(upload_as(out, &w->embed, INA_DTYPE_BF16, "model.embed_tokens.weight", (void **)&out->embed));
  INA_CHECK(upload_as(out, &w->final_norm, INA_DTYPE_F32, "model.norm.weight", (void **)&out->final_norm));
  INA_CHECK(upload_linear(out, &w->lm_head, "lm_head", 1, stream, &out->lm_head));
  out->layers = calloc((size_t)c->num_layers, sizeof *out->layers);
  INA_CHECK_ALLOC(out->layers);
  out->num_layers = c->num_layers;
  for (int32_t l = 0; l < c->num_layers; l++) INA_CHECK(upload_layer(out, &w->layers[l], c, l, stream, &out->layers[l]));
  return INA_OK;
fail:
  ina_gpu_weights_free(out);
  return st;
}

static int compare_ptr(const void *a, const void *b) {
  const uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

ina_status_t ina_gpu_weights_disown(gpu_weights_t *g, void **ptrs, int64_t count) {
  ina_status_t st = INA_OK;
  void **wanted = malloc((size_t)count * sizeof *wanted + 1), **taken = malloc((size_t)count * sizeof *taken + 1);
  int64_t kept = 0, num_taken = 0;
  INA_CHECK_ALLOC(wanted);
  INA_CHECK_ALLOC(taken);
  memcpy(wanted, ptrs, (size_t)count * sizeof *wanted);
  qsort(wanted, (size_t)count, sizeof *wanted, compare_ptr);
  for (int64_t i = 0; i < g->num_allocs; i++) {
    void *p = g->allocs[i];
    if (bsearch(&p, wanted, (size_t)count, sizeof *wanted, compare_ptr))
      taken[num_taken++] = p; /* in allocs order, which is address-unsorted: sorted below */
    else
      g->allocs[kept++] = p;
  }
  g->num_allocs = kept;
  qsort(taken, (size_t)num_taken, sizeof *taken, compare_ptr);
  for (int64_t i = 0; i < count; i++)
    if (!ptrs[i] || !bsearch(&ptrs[i], taken, (size_t)num_taken, sizeof *taken, compare_ptr)) ptrs[i] = NULL;
fail:
  free(wanted);
  free(taken);
  return st;
}

void ina_gpu_weights_free(gpu_weights_t *g) {
  if (!g) return;
  for (int64_t i = 0; i < g->num_allocs; i++) cudaFree(g->allocs[i]);
  free(g->allocs);
  if (g->layers)
    for (int32_t l = 0; l < g->num_layers; l++) free(g->layers[l].experts);
  free(g->layers);
  memset(g, 0, sizeof *g);
}
