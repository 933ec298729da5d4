/* ina_gpu_weights_random (engine_gpu.h): seeded random weights generated on the device,
 * in the form ina_gpu_weights_upload gives the tensors of ina_weights_random.
 *
 * The walk goes over the spec list of ina_weights_random_shell's weights (the config,
 * layer arrays and spec list ina_weights_random fills, with no tensor data), so names,
 * shapes, roles, order and the shard (held experts, tensor-parallel slices) are the
 * host's by construction. Each spec is generated as its window of the whole tensor
 * (full_shape, slice_dim, slice_begin), the values the host keeps of it; an FP8 slice is
 * whole 128x128 blocks of the whole tensor, so its bytes and scales are the whole
 * tensor's, as the host's slice quantizes them. A spec's place in
 * gpu_weights_t is found from the address of its (empty) host tensor in the shell. What
 * the host would store (make_random in weights.c: fp8 for LINEAR under fp8_e4m3, bf16
 * for the other roles then, the router bias always f32) and what the upload makes of
 * that (engine_gpu.h's rules) pick the kernel and the output form:
 *   embedding, kv_a_layernorm, non-FP8 linears   bf16(v)
 *   RMSNorm weights, router bias                  v, or float(bf16(v)) when stored bf16
 *   router, V3.2 weights_proj                     bf16 hi, plus lo when stored f32
 *   FP8 linears                                   e4m3 128x128 blocks, scales written in
 *                                                 the packed layout of gemm/gemm.h, or
 *                                                 dequantized to bf16 by the upload's own
 *                                                 kernel (kv_b_proj, shapes the FP8 GEMM
 *                                                 does not take), through a scratch buffer
 * Values are never staged in f32: each kernel writes the final form (engine_gpu_random.cu
 * says why it is bit-exact). The tied lm_head is a device copy of the embedding, as the
 * upload gives it its own buffer. */
#define INA_LOG_SUBSYS "model"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/check.h"
#include "core/cuda_check.h"
#include "core/log.h"
#include "gemm/gemm.h"
#include "mla/mla_absorb.h"
#include "model/engine_gpu.h"
#include "model/engine_gpu_random.h"

/* Progress is logged after every this many layers. */
#define LOG_EVERY_LAYERS 4

typedef struct random_ctx {
  gpu_weights_t *g;
  const ina_model_config_t *cfg; /* the shell's: FP8 block scaling set as for the host */
  uint64_t seed;
  ina_dtype_t dtype;
  cudaStream_t stream;
  void *scratch; /* e4m3 values and block scales of a linear dequantized to bf16 */
  size_t scratch_bytes;
} random_ctx_t;

/* Where a spec's tensor goes in gpu_weights_t, and in which form. */
typedef enum target_kind {
  TARGET_BF16,   /* bf16 buffer */
  TARGET_F32,    /* f32 buffer */
  TARGET_ROUTER, /* bf16 hi (+ lo): the router, V3.2's weights_proj */
  TARGET_LINEAR, /* gpu_linear_t */
  TARGET_KV_B,   /* layer->kv_b: a linear forced to bf16 */
} target_kind_t;

typedef struct target {
  target_kind_t kind;
  void **buffer;        /* BF16, F32 */
  gpu_linear_t *linear; /* LINEAR */
  gpu_layer_t *layer;   /* KV_B */
  uint16_t **hi, **lo;  /* ROUTER */
  int is_gate;          /* LINEAR: an MLP's gate_proj (gpu_weights_t.max_expert_inter) */
} target_t;

/* ---- what the host makes of a spec (model/weights.c) --------------------------------- */

/* FNV-1a over the tensor name, as weights.c keys its tensors. */
static uint64_t name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

/* fill_random's distribution of the spec: uniform on [offset - a, offset + a], with the
 * whole tensor's fan-in for linears (a column slice has fewer inputs than its layer). */
static ina_random_dist_t spec_dist(const ina_weight_spec_t *s, uint64_t seed) {
  ina_random_dist_t d = {ina_random_mix64(seed ^ name_hash(s->name)), 1.0, 0.0};
  switch (s->role) {
  case INA_WEIGHT_LINEAR:
  case INA_WEIGHT_LINEAR_BF16:
  case INA_WEIGHT_ROUTER: d.scale = sqrt(3.0 / (double)s->full_shape[1]); break;
  case INA_WEIGHT_EMBEDDING: d.scale = sqrt(3.0); break;
  case INA_WEIGHT_NORM:
    d.scale = 0.2;
    d.offset = 1.0;
    break;
  case INA_WEIGHT_ROUTER_BIAS: d.scale = 0.05; break;
  case INA_WEIGHT_BIAS: d.scale = 0.05; break;
  }
  return d;
}

/* make_random's storage dtype of the spec. */
static ina_dtype_t host_dtype(const ina_weight_spec_t *s, ina_dtype_t dtype) {
  if (s->role == INA_WEIGHT_ROUTER_BIAS) return INA_DTYPE_F32;
  if (dtype == INA_DTYPE_FP8_E4M3 && s->role != INA_WEIGHT_LINEAR) return INA_DTYPE_BF16;
  return dtype;
}

static int64_t spec_numel(const ina_weight_spec_t *s) {
  return s->ndim == 2 ? s->shape[0] * s->shape[1] : s->shape[0];
}

/* The part of its whole tensor the spec holds, indexed as fill_random indexes it (a
 * vector of n is [n, 1]). */
static ina_random_window_t spec_window(const ina_weight_spec_t *s) {
  ina_random_window_t w;
  w.full_rows = s->full_shape[0];
  w.full_cols = s->ndim == 2 ? s->full_shape[1] : 1;
  w.row0 = s->slice_dim == 0 ? s->slice_begin : 0;
  w.col0 = s->slice_dim == 1 ? s->slice_begin : 0;
  w.rows = s->shape[0];
  w.cols = s->ndim == 2 ? s->shape[1] : 1;
  return w;
}

/* ---- spec -> place in gpu_weights_t --------------------------------------------------- */

static gpu_linear_t *mlp_part(gpu_mlp_t *m, int32_t proj) {
  return proj == 0 ? &m->gate : proj == 1 ? &m->up : &m->down;
}

static int find_mlp(const ina_mlp_weights_t *m, gpu_mlp_t *gm, const ina_weight_spec_t *s, target_t *t) {
  const ina_linear_t *parts[3] = {&m->gate, &m->up, &m->down};
  for (int32_t p = 0; p < 3; p++) {
    if (s->linear != parts[p]) continue;
    t->kind = TARGET_LINEAR;
    t->linear = mlp_part(gm, p);
    t->is_gate = p == 0;
    return 1;
  }
  return 0;
}

static int find_in_layer(const ina_weights_t *w, gpu_weights_t *g, const ina_weight_spec_t *s, target_t *t) {
  const ina_layer_weights_t *L = &w->layers[s->layer];
  gpu_layer_t *G = &g->layers[s->layer];
  const struct {
    const ina_tensor_t *host;
    target_kind_t kind;
    void **buffer;
  } tensors[] = {
      {&L->input_norm, TARGET_F32, (void **)&G->input_norm},
      {&L->post_attention_norm, TARGET_F32, (void **)&G->post_attention_norm},
      {&L->q_a_norm, TARGET_F32, (void **)&G->q_a_norm},
      {&L->kv_a_norm, TARGET_BF16, (void **)&G->kv_a_norm},
      {&L->router_bias, TARGET_F32, (void **)&G->router_bias},
      {&L->index_k_norm, TARGET_F32, (void **)&G->index_k_norm},
      {&L->index_k_norm_bias, TARGET_F32, (void **)&G->index_k_norm_bias},
  };
  const struct {
    const ina_linear_t *host;
    gpu_linear_t *dev;
  } linears[] = {
      {&L->q_proj, &G->q_proj},       {&L->q_a_proj, &G->q_a_proj}, {&L->q_b_proj, &G->q_b_proj},
      {&L->kv_a_proj, &G->kv_a_proj}, {&L->o_proj, &G->o_proj},   {&L->index_wq_b, &G->index_wq_b},
      {&L->index_wk, &G->index_wk},
  };
  t->layer = G;
  if (s->expert >= 0) {
    t->kind = TARGET_LINEAR;
    t->linear = mlp_part(&G->experts[s->expert - w->expert_begin], s->expert_proj);
    t->is_gate = s->expert_proj == 0;
    return 1;
  }
  for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++) {
    if (s->tensor != tensors[i].host) continue;
    t->kind = tensors[i].kind;
    t->buffer = tensors[i].buffer;
    return 1;
  }
  for (size_t i = 0; i < sizeof linears / sizeof linears[0]; i++) {
    if (s->linear != linears[i].host) continue;
    t->kind = TARGET_LINEAR;
    t->linear = linears[i].dev;
    return 1;
  }
  if (s->tensor == &L->router || s->tensor == &L->index_weights_proj) {
    const int router = s->tensor == &L->router;
    t->kind = TARGET_ROUTER;
    t->hi = router ? &G->router_hi : &G->index_w_hi;
    t->lo = router ? &G->router_lo : &G->index_w_lo;
    return 1;
  }
  if (s->linear == &L->kv_b_proj) {
    t->kind = TARGET_KV_B;
    return 1;
  }
  return find_mlp(&L->mlp, &G->mlp, s, t);
}

static ina_status_t find_target(const ina_weights_t *w, gpu_weights_t *g, const ina_weight_spec_t *s,
                                target_t *t) {
  ina_status_t st = INA_OK;
  int found = 0;
  memset(t, 0, sizeof *t);
  if (s->layer >= 0) {
    found = find_in_layer(w, g, s, t);
  } else if (s->tensor == &w->embed) {
    t->kind = TARGET_BF16;
    t->buffer = (void **)&g->embed;
    found = 1;
  } else if (s->tensor == &w->final_norm) {
    t->kind = TARGET_F32;
    t->buffer = (void **)&g->final_norm;
    found = 1;
  } else if (s->linear == &w->lm_head) {
    t->kind = TARGET_LINEAR;
    t->linear = &g->lm_head;
    found = 1;
  }
  INA_REQUIRE(found, INA_ERR_INTERNAL, "gpu random weights: tensor '%s' has no place in the device weights",
              s->name);
fail:
  return st;
}

/* ---- generation ------------------------------------------------------------------------ */

static ina_status_t ensure_scratch(random_ctx_t *x, size_t bytes) {
  ina_status_t st = INA_OK;
  if (bytes <= x->scratch_bytes) return INA_OK;
  /* The old scratch may still be read by queued kernels. */
  INA_CUDA_CHECK(cudaStreamSynchronize(x->stream));
  INA_CUDA_CHECK(cudaFree(x->scratch));
  x->scratch = NULL;
  x->scratch_bytes = 0;
  INA_CUDA_CHECK(cudaMalloc(&x->scratch, bytes));
  x->scratch_bytes = bytes;
fail:
  return st;
}

/* An FP8 linear the GEMM does not take (or kv_b_proj): quantized into the scratch exactly
 * as on the host, then dequantized by the upload's kernel. */
static ina_status_t make_dequantized(random_ctx_t *x, const ina_random_dist_t *d, const ina_random_window_t *win,
                                     uint16_t **out) {
  ina_status_t st = INA_OK;
  const int64_t n = win->rows, k = win->cols;
  const int64_t nbr = (n + INA_GEMM_BLOCK - 1) / INA_GEMM_BLOCK, nbc = (k + INA_GEMM_BLOCK - 1) / INA_GEMM_BLOCK;
  const size_t q_bytes = ((size_t)(n * k) + 15) & ~(size_t)15;
  INA_CHECK(ensure_scratch(x, q_bytes + (size_t)(nbr * nbc) * sizeof(float)));
  uint8_t *q = x->scratch;
  float *scale_inv = (float *)((char *)x->scratch + q_bytes);
  INA_CHECK(ina_gpu_random_fp8_blocks(d, win, q, scale_inv, nbc, x->stream));
  INA_CHECK(ina_gpu_weights_alloc(x->g, (size_t)(n * k) * sizeof(uint16_t), (void **)out));
  INA_CHECK(ina_mla_absorb_dequantize_weight(q, scale_inv, n, k, *out, x->stream));
fail:
  return st;
}

/* An FP8 linear kept FP8: e4m3 values and the scales in ina_gemm_pack_w_scales' layout
 * (rows of ceil(k/128) scales padded with zeros to the packed row length). */
static ina_status_t make_fp8(random_ctx_t *x, const ina_random_dist_t *d, const ina_random_window_t *win,
                             const char *name, gpu_linear_t *out) {
  ina_status_t st = INA_OK;
  const int64_t n = out->n, k = out->k, count = ina_gemm_w_scale_count(n, k);
  const int64_t nbr = (n + INA_GEMM_BLOCK - 1) / INA_GEMM_BLOCK, nbc = (k + INA_GEMM_BLOCK - 1) / INA_GEMM_BLOCK;
  INA_REQUIRE(count > 0 && count % nbr == 0, INA_ERR_UNSUPPORTED,
              "gpu random weights: FP8 linear %s [%lld, %lld] has no packed scale layout", name, (long long)n,
              (long long)k);
  const int64_t stride = count / nbr;
  INA_CHECK(ina_gpu_weights_alloc(x->g, (size_t)(n * k), &out->w));
  INA_CHECK(ina_gpu_weights_alloc(x->g, (size_t)count * sizeof(float), (void **)&out->w_scale));
  if (stride > nbc) INA_CUDA_CHECK(cudaMemsetAsync(out->w_scale, 0, (size_t)count * sizeof(float), x->stream));
  INA_CHECK(ina_gpu_random_fp8_blocks(d, win, out->w, out->w_scale, stride, x->stream));
  out->fp8 = 1;
  if (k > x->g->fp8_max_k) x->g->fp8_max_k = k;
fail:
  return st;
}

static ina_status_t make_linear(random_ctx_t *x, const ina_weight_spec_t *s, const ina_random_dist_t *d,
                                const ina_random_window_t *win, int allow_fp8, gpu_linear_t *out) {
  ina_status_t st = INA_OK;
  memset(out, 0, sizeof *out);
  out->n = win->rows;
  out->k = win->cols;
  if (host_dtype(s, x->dtype) != INA_DTYPE_FP8_E4M3) {
    INA_CHECK(ina_gpu_weights_alloc(x->g, (size_t)(out->n * out->k) * sizeof(uint16_t), &out->w));
    INA_CHECK(ina_gpu_random_fill(d, win, INA_RANDOM_BF16, out->w, x->stream));
  } else if (allow_fp8 && ina_gpu_weights_fp8_gemm_takes(out->n, out->k)) {
    INA_CHECK(make_fp8(x, d, win, s->name, out));
  } else {
    if (allow_fp8)
      INA_LOG_I(INA_LOG_SUBSYS,
                "gpu random weights: FP8 linear %s [%lld, %lld] dequantized to bf16 (the FP8 GEMM needs N "
                "and K multiples of 16)", s->name, (long long)out->n, (long long)out->k);
    INA_CHECK(make_dequantized(x, d, win, (uint16_t **)&out->w));
  }
fail:
  return st;
}

static ina_status_t make_tensor(random_ctx_t *x, const ina_weights_t *shell, const ina_weight_spec_t *s) {
  ina_status_t st = INA_OK;
  target_t t;
  const ina_random_dist_t d = spec_dist(s, x->seed);
  const ina_random_window_t win = spec_window(s);
  const int64_t n = spec_numel(s);
  const ina_dtype_t stored = host_dtype(s, x->dtype);
  INA_REQUIRE(n > 0, INA_ERR_INTERNAL, "gpu engine: tensor %s is empty", s->name);
  INA_CHECK(find_target(shell, x->g, s, &t));
  switch (t.kind) {
  case TARGET_BF16:
    INA_CHECK(ina_gpu_weights_alloc(x->g, (size_t)n * sizeof(uint16_t), t.buffer));
    INA_CHECK(ina_gpu_random_fill(&d, &win, INA_RANDOM_BF16, *t.buffer, x->stream));
    break;
  case TARGET_F32:
    INA_CHECK(ina_gpu_weights_alloc(x->g, (size_t)n * sizeof(float), t.buffer));
    INA_CHECK(ina_gpu_random_fill(&d, &win, stored == INA_DTYPE_F32 ? INA_RANDOM_F32 : INA_RANDOM_F32_VIA_BF16,
                                  *t.buffer, x->stream));
    break;
  case TARGET_ROUTER:
    /* Replicated on every rank (model/weights.h): the hi + lo split takes whole tensors. */
    INA_REQUIRE(s->slice_dim < 0, INA_ERR_INTERNAL, "gpu random weights: router %s is sliced", s->name);
    INA_CHECK(ina_gpu_weights_alloc(x->g, (size_t)n * sizeof(uint16_t), (void **)t.hi));
    if (stored == INA_DTYPE_BF16) {
      INA_CHECK(ina_gpu_random_fill(&d, &win, INA_RANDOM_BF16, *t.hi, x->stream));
    } else {
      INA_CHECK(ina_gpu_weights_alloc(x->g, (size_t)n * sizeof(uint16_t), (void **)t.lo));
      INA_CHECK(ina_gpu_random_fill_hi_lo(&d, n, *t.hi, *t.lo, x->stream));
    }
    break;
  case TARGET_LINEAR:
    INA_CHECK(make_linear(x, s, &d, &win, 1, t.linear));
    if (t.is_gate && t.linear->n > x->g->max_expert_inter) x->g->max_expert_inter = t.linear->n;
    break;
  case TARGET_KV_B: {
    gpu_linear_t kv_b;
    INA_CHECK(make_linear(x, s, &d, &win, 0, &kv_b));
    t.layer->kv_b = kv_b.w;
    break;
  }
  }
fail:
  return st;
}

/* ---- the walk ---------------------------------------------------------------------------- */

/* What the upload would refuse, checked before anything is generated. */
static ina_status_t check_supported(const ina_weights_t *shell, const ina_model_config_t *cfg, ina_dtype_t dtype,
                                    const ina_weight_spec_t *specs, int32_t count) {
  ina_status_t st = INA_OK;
  for (int32_t i = 0; i < count; i++) {
    const ina_weight_spec_t *s = &specs[i];
    /* V3.2's k_norm is a LayerNorm with a bias, which the engine has; linears' are not. */
    const int k_norm_bias = s->layer >= 0 && s->tensor == &shell->layers[s->layer].index_k_norm_bias;
    INA_REQUIRE(s->role != INA_WEIGHT_BIAS || k_norm_bias, INA_ERR_UNSUPPORTED,
                "gpu engine: linear bias %s (attention_bias / mlp_bias): the GPU engine does not support "
                "biases yet; use the CPU engine (--device cpu)", s->name);
    INA_REQUIRE(host_dtype(s, dtype) != INA_DTYPE_FP8_E4M3 ||
                    (cfg->fp8_block_rows == INA_GEMM_BLOCK && cfg->fp8_block_cols == INA_GEMM_BLOCK),
                INA_ERR_UNSUPPORTED,
                "gpu engine: FP8 linear %s has %dx%d blocks; the GPU takes 128x128 blocks", s->name,
                cfg->fp8_block_rows, cfg->fp8_block_cols);
    if (host_dtype(s, dtype) == INA_DTYPE_FP8_E4M3 && s->slice_dim >= 0) {
      /* Its blocks must be the whole tensor's (ina_weights_random refuses the others too). */
      const int64_t begin = s->slice_begin, end = begin + s->shape[s->slice_dim];
      const int64_t full = s->full_shape[s->slice_dim];
      INA_REQUIRE(begin % INA_GEMM_BLOCK == 0 && (end % INA_GEMM_BLOCK == 0 || end == full), INA_ERR_UNSUPPORTED,
                  "gpu random weights: FP8 linear %s: the tensor-parallel slice of its %s is [%lld, %lld) of "
                  "%lld, not whole %d-wide scale blocks",
                  s->name, s->slice_dim == 0 ? "rows" : "columns", (long long)begin, (long long)end,
                  (long long)full, INA_GEMM_BLOCK);
    }
  }
fail:
  return st;
}

static double seconds_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* Layer arrays of g shaped like the shell's: experts[] holds the shard's experts. */
static ina_status_t alloc_layers(const ina_weights_t *shell, gpu_weights_t *g) {
  ina_status_t st = INA_OK;
  const ina_model_config_t *c = &shell->config;
  const int32_t held = shell->expert_end - shell->expert_begin;
  g->layers = calloc((size_t)c->num_layers, sizeof *g->layers);
  INA_CHECK_ALLOC(g->layers);
  g->num_layers = c->num_layers;
  for (int32_t l = 0; l < c->num_layers; l++) {
    gpu_layer_t *G = &g->layers[l];
    G->is_moe = shell->layers[l].is_moe;
    G->has_shared = shell->layers[l].has_shared;
    if (!G->is_moe) continue;
    G->experts = calloc((size_t)held + 1, sizeof *G->experts); /* + 1: never calloc(0) */
    INA_CHECK_ALLOC(G->experts);
  }
fail:
  return st;
}

/* After the last tensor of layer `l`: the experts' pointer tables, and progress. */
static ina_status_t finish_layer(random_ctx_t *x, int32_t l, const struct timespec *t0) {
  ina_status_t st = INA_OK;
  gpu_layer_t *G = &x->g->layers[l];
  const int32_t held = x->g->expert_end - x->g->expert_begin;
  if (G->is_moe && held > 0) INA_CHECK(ina_gpu_weights_expert_tables(x->g, held, G));
  if ((l + 1) % LOG_EVERY_LAYERS == 0 || l + 1 == x->cfg->num_layers) {
    INA_CUDA_CHECK(cudaStreamSynchronize(x->stream));
    INA_LOG_I(INA_LOG_SUBSYS, "gpu random weights: %d / %d layers, %.2f GiB, %.2f s", l + 1, x->cfg->num_layers,
              (double)x->g->device_bytes / (1024.0 * 1024.0 * 1024.0), seconds_since(t0));
  }
fail:
  return st;
}

ina_status_t ina_gpu_weights_random(const ina_model_config_t *cfg, const ina_shard_t *shard, uint64_t seed,
                                    ina_dtype_t dtype, cudaStream_t stream, gpu_weights_t *out) {
  ina_status_t st = INA_OK;
  ina_weights_t shell;
  ina_weight_spec_t *specs = NULL;
  int32_t count = 0;
  random_ctx_t x = {out, NULL, seed, dtype, stream, NULL, 0};
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  memset(out, 0, sizeof *out);
  memset(&shell, 0, sizeof shell);
  INA_CHECK(ina_weights_random_shell(cfg, dtype, shard, &shell));
  INA_CHECK(ina_weight_specs(&shell, &specs, &count));
  x.cfg = &shell.config;
  INA_CHECK(check_supported(&shell, x.cfg, dtype, specs, count));
  out->expert_begin = shell.expert_begin;
  out->expert_end = shell.expert_end;
  out->tp_rank = shell.tp_rank;
  out->tp_size = shell.tp_size;
  INA_LOG_I(INA_LOG_SUBSYS,
            "gpu random weights: %d tensors in %d layers, %s, seed %llu, tensor-parallel slice %d of %d, experts "
            "[%d, %d)",
            count, x.cfg->num_layers, ina_dtype_name(dtype), (unsigned long long)seed, shell.tp_rank,
            shell.tp_size, shell.expert_begin, shell.expert_end);
  INA_CHECK(alloc_layers(&shell, out));
  for (int32_t i = 0; i < count; i++) {
    INA_CHECK(make_tensor(&x, &shell, &specs[i]));
    /* The spec list holds each layer's tensors together, in layer order. */
    const int32_t layer = specs[i].layer;
    if (layer >= 0 && (i + 1 == count || specs[i + 1].layer != layer)) INA_CHECK(finish_layer(&x, layer, &t0));
  }
  if (x.cfg->tie_word_embeddings) {
    /* The upload gives the tied head its own bf16 copy of the embedding. */
    const int64_t n = (int64_t)x.cfg->vocab_size * x.cfg->hidden_size;
    out->lm_head.n = x.cfg->vocab_size;
    out->lm_head.k = x.cfg->hidden_size;
    INA_CHECK(ina_gpu_weights_alloc(out, (size_t)n * sizeof(uint16_t), &out->lm_head.w));
    INA_CUDA_CHECK(cudaMemcpyAsync(out->lm_head.w, out->embed, (size_t)n * sizeof(uint16_t),
                                   cudaMemcpyDeviceToDevice, stream));
  }
  INA_CUDA_CHECK(cudaStreamSynchronize(stream));
  INA_LOG_I(INA_LOG_SUBSYS, "gpu random weights: %.2f GiB in %lld buffers, %.2f s",
            (double)out->device_bytes / (1024.0 * 1024.0 * 1024.0), (long long)out->num_allocs,
            seconds_since(&t0));
fail:
  /* Kernels may still write into the scratch, or into the buffers a failure frees. */
  if (x.scratch || st != INA_OK) cudaStreamSynchronize(stream);
  cudaFree(x.scratch);
  free(specs);
  ina_weights_release(&shell);
  if (st != INA_OK) ina_gpu_weights_free(out);
  return st;
}
