#define INA_LOG_SUBSYS "model"
#include "model/weights.h"

#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

#define SHARD_V1_SIZE (offsetof(ina_shard_t, expert_end) + sizeof(int32_t))

/* ---- the spec list ---------------------------------------------------------------- */

/* The part of a tensor a rank holds: whole, or `len` rows (dim 0) or columns (dim 1)
 * from `begin` on. */
typedef struct part {
  int32_t dim;
  int64_t begin, len;
} part_t;

static const part_t WHOLE = {-1, 0, 0};

/* How tensor parallelism splits a linear layer y = W x + b with W [out, in]. */
typedef enum tp_split {
  TP_REPLICATED, /* every rank holds W and b whole */
  TP_SPLIT_OUT,  /* rows of W and b: each rank computes its own outputs */
  TP_SPLIT_IN,   /* columns of W: each rank computes a partial sum of y, which the engine
                    adds up over the ranks, so b is held by rank 0 alone */
} tp_split_t;

typedef struct spec_list {
  ina_weight_spec_t *items;
  int32_t count, capacity;
  ina_status_t status;
  int32_t tp_rank, tp_size;
} spec_list_t;

static ina_weight_spec_t *push(spec_list_t *l, ina_weight_role_t role, ina_tensor_t *tensor,
                               ina_linear_t *linear, int32_t layer, int64_t rows, int64_t cols,
                               part_t part, const char *fmt, ...) __attribute__((format(printf, 9, 10)));

/* Lists a tensor whose whole shape is [rows, cols] ([rows] when cols < 0), of which
 * this rank holds `part`. */
static ina_weight_spec_t *push(spec_list_t *l, ina_weight_role_t role, ina_tensor_t *tensor,
                               ina_linear_t *linear, int32_t layer, int64_t rows, int64_t cols,
                               part_t part, const char *fmt, ...) {
  if (l->status != INA_OK) return NULL;
  if (l->count == l->capacity) {
    int32_t cap = l->capacity ? l->capacity * 2 : 64;
    ina_weight_spec_t *p = realloc(l->items, (size_t)cap * sizeof *p);
    if (!p) {
      l->status = INA_ERR_OUT_OF_MEMORY;
      return NULL;
    }
    l->items = p;
    l->capacity = cap;
  }
  ina_weight_spec_t *s = &l->items[l->count++];
  memset(s, 0, sizeof *s);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->name, sizeof s->name, fmt, ap);
  va_end(ap);
  s->role = role;
  s->tensor = tensor;
  s->linear = linear;
  s->layer = layer;
  s->expert = -1;
  s->expert_proj = -1;
  s->ndim = cols >= 0 ? 2 : 1;
  s->full_shape[0] = rows;
  s->full_shape[1] = cols >= 0 ? cols : 0;
  s->shape[0] = s->full_shape[0];
  s->shape[1] = s->full_shape[1];
  /* One rank's share is the whole tensor: held as such (a loaded view, not a copy). */
  if (part.dim >= 0 && part.begin == 0 && part.len == s->full_shape[part.dim]) part = WHOLE;
  s->slice_dim = part.dim;
  if (part.dim >= 0) {
    s->shape[part.dim] = part.len;
    s->slice_begin = part.begin;
  }
  return s;
}

/* This rank's share of `groups` equal groups of `unit` rows or columns (heads of a
 * head dim, or single intermediate channels): the tp_rank-th of tp_size equal runs.
 * `what` names the group count and `tensor` the first tensor split by it, for the
 * message when tp_size does not divide it. */
static part_t tp_share(spec_list_t *l, int64_t groups, int64_t unit, const char *what,
                       const char *tensor) {
  part_t p = {0, 0, 0};
  if (l->status != INA_OK) return p;
  if (groups % l->tp_size != 0) {
    ina_error(INA_LOG_SUBSYS, "shard: tensor '%s': %s %lld is not divisible by tp_size %d", tensor,
              what, (long long)groups, l->tp_size);
    l->status = INA_ERR_INVALID_ARGUMENT;
    return p;
  }
  p.len = groups / l->tp_size * unit;
  p.begin = l->tp_rank * p.len;
  return p;
}

/* `share` is the run of outputs (TP_SPLIT_OUT) or inputs (TP_SPLIT_IN) this rank holds. */
static void push_linear(spec_list_t *l, ina_linear_t *lin, int32_t layer, int64_t out, int64_t in,
                        int with_bias, tp_split_t split, part_t share, const char *prefix) {
  part_t weight = WHOLE, bias = WHOLE;
  if (split == TP_SPLIT_OUT) weight = bias = (part_t){0, share.begin, share.len};
  if (split == TP_SPLIT_IN) weight = (part_t){1, share.begin, share.len};
  push(l, INA_WEIGHT_LINEAR, &lin->weight, lin, layer, out, in, weight, "%s.weight", prefix);
  if (with_bias && (split != TP_SPLIT_IN || l->tp_rank == 0))
    push(l, INA_WEIGHT_BIAS, &lin->bias, NULL, layer, out, -1, bias, "%s.bias", prefix);
}

/* gate and up split their outputs, down its inputs: each rank runs SiLU(gate) * up on
 * its own intermediate channels and down gives its partial sum. `what` names the
 * config quantity `inter` comes from. */
static void push_mlp(spec_list_t *l, ina_mlp_weights_t *m, int32_t layer, int64_t hidden,
                     int64_t inter, int with_bias, const char *what, const char *prefix) {
  char name[128];
  snprintf(name, sizeof name, "%s.gate_proj.weight", prefix);
  const part_t share = tp_share(l, inter, 1, what, name);
  snprintf(name, sizeof name, "%s.gate_proj", prefix);
  push_linear(l, &m->gate, layer, inter, hidden, with_bias, TP_SPLIT_OUT, share, name);
  snprintf(name, sizeof name, "%s.up_proj", prefix);
  push_linear(l, &m->up, layer, inter, hidden, with_bias, TP_SPLIT_OUT, share, name);
  snprintf(name, sizeof name, "%s.down_proj", prefix);
  push_linear(l, &m->down, layer, hidden, inter, with_bias, TP_SPLIT_IN, share, name);
}

static ina_status_t alloc_layers(ina_weights_t *w, const ina_model_config_t *cfg,
                                 const ina_shard_t *shard) {
  ina_status_t st = INA_OK;
  const ina_shard_t all = INA_SHARD_INIT;
  if (!shard) shard = &all;
  memset(w, 0, sizeof *w);
  INA_REQUIRE_VERSIONED(shard, SHARD_V1_SIZE, "shard", "INA_SHARD_INIT");
  INA_REQUIRE(shard->tp_size >= 1 && shard->tp_rank >= 0 && shard->tp_rank < shard->tp_size,
              INA_ERR_INVALID_ARGUMENT, "shard: tp_rank %d outside [0, tp_size %d)", shard->tp_rank,
              shard->tp_size);
  w->config = *cfg;
  w->tp_rank = shard->tp_rank;
  w->tp_size = shard->tp_size;
  w->expert_begin = shard->expert_begin;
  w->expert_end = shard->expert_end < 0 ? cfg->n_routed_experts : shard->expert_end;
  INA_REQUIRE(w->expert_begin >= 0 && w->expert_begin <= w->expert_end &&
                  w->expert_end <= cfg->n_routed_experts,
              INA_ERR_INVALID_ARGUMENT, "shard: expert range [%d, %d) outside 0..%d",
              w->expert_begin, w->expert_end, cfg->n_routed_experts);
  w->layers = calloc((size_t)cfg->num_layers, sizeof *w->layers);
  INA_CHECK_ALLOC(w->layers);
  for (int32_t i = 0; i < cfg->num_layers; i++) {
    ina_layer_weights_t *L = &w->layers[i];
    L->is_moe = ina_cfg_layer_is_moe(cfg, i);
    /* HF builds the shared-expert MLP even for n_shared_experts = 0 (with zero-width
     * weights); it then still adds its down_proj bias when mlp_bias is set. */
    L->has_shared = L->is_moe && (cfg->n_shared_experts > 0 || cfg->mlp_bias);
    if (!L->is_moe) continue;
    int32_t nlocal = w->expert_end - w->expert_begin;
    L->experts = calloc(nlocal > 0 ? (size_t)nlocal : 1, sizeof *L->experts);
    INA_CHECK_ALLOC(L->experts);
  }
  return INA_OK;
fail:
  ina_weights_release(w);
  return st;
}

ina_status_t ina_weight_specs(ina_weights_t *w, ina_weight_spec_t **specs, int32_t *count) {
  /* A w never prepared (all zero) holds nothing; count it as one rank. */
  spec_list_t l = {NULL, 0, 0, INA_OK, w->tp_size > 1 ? w->tp_rank : 0, w->tp_size > 1 ? w->tp_size : 1};
  const ina_model_config_t *cfg = &w->config;
  const int64_t H = cfg->hidden_size, heads = cfg->num_heads;
  const int64_t qk = ina_cfg_qk_head_dim(cfg), nv = cfg->qk_nope_head_dim + cfg->v_head_dim;
  *specs = NULL;
  *count = 0;
  push(&l, INA_WEIGHT_EMBEDDING, &w->embed, NULL, -1, cfg->vocab_size, H, WHOLE, "model.embed_tokens.weight");
  for (int32_t i = 0; i < cfg->num_layers; i++) {
    ina_layer_weights_t *L = &w->layers[i];
    char p[64], q[96], first[128];
    snprintf(p, sizeof p, "model.layers.%d", i);
    /* Each rank holds the heads of its share: their q, k_nope and v rows and o_proj's
     * columns. */
    snprintf(first, sizeof first, "%s.self_attn.%s.weight", p, cfg->q_lora_rank == 0 ? "q_proj" : "q_b_proj");
    const part_t q_rows = tp_share(&l, heads, qk, "num_attention_heads", first);
    const part_t kv_rows = tp_share(&l, heads, nv, "num_attention_heads", first);
    const part_t o_cols = tp_share(&l, heads, cfg->v_head_dim, "num_attention_heads", first);
    push(&l, INA_WEIGHT_NORM, &L->input_norm, NULL, i, H, -1, WHOLE, "%s.input_layernorm.weight", p);
    if (cfg->q_lora_rank == 0) {
      snprintf(q, sizeof q, "%s.self_attn.q_proj", p);
      push_linear(&l, &L->q_proj, i, heads * qk, H, 0, TP_SPLIT_OUT, q_rows, q);
    } else {
      snprintf(q, sizeof q, "%s.self_attn.q_a_proj", p);
      push_linear(&l, &L->q_a_proj, i, cfg->q_lora_rank, H, cfg->attention_bias, TP_REPLICATED, WHOLE, q);
      push(&l, INA_WEIGHT_NORM, &L->q_a_norm, NULL, i, cfg->q_lora_rank, -1, WHOLE,
"%s.self_attn.q_a_layernorm.weight", p);
      snprintf(q, sizeof q, "%s.self_attn.q_b_proj", p);
      push_linear(&l, &L->q_b_proj, i, heads * qk, cfg->q_lora_rank, 0, TP_SPLIT_OUT, q_rows, q);
    }
    snprintf(q, sizeof q, "%s.self_attn.kv_a_proj_with_mqa", p);
    push_linear(&l, &L->kv_a_proj, i, cfg->kv_lora_rank + cfg->qk_rope_head_dim, H,
                cfg->attention_bias, TP_REPLICATED, WHOLE, q);
    push(&l, INA_WEIGHT_NORM, &L->kv_a_norm, NULL, i, cfg->kv_lora_rank, -1, WHOLE,
"%s.self_attn.kv_a_layernorm.weight", p);
    snprintf(q, sizeof q, "%s.self_attn.kv_b_proj", p);
    push_linear(&l, &L->kv_b_proj, i, heads * nv, cfg->kv_lora_rank, 0, TP_SPLIT_OUT, kv_rows, q);
    snprintf(q, sizeof q, "%s.self_attn.o_proj", p);
    push_linear(&l, &L->o_proj, i, H, heads * cfg->v_head_dim, cfg->attention_bias, TP_SPLIT_IN, o_cols, q);
    if (ina_cfg_has_indexer(cfg)) {
      /* Small next to MLA (one key per token): every tensor-parallel rank holds it whole.
       * weights_proj is kept in high precision, as Hugging Face keeps it in fp32. */
      snprintf(q, sizeof q, "%s.self_attn.indexer.wq_b", p);
      push_linear(&l, &L->index_wq_b, i, (int64_t)cfg->index_n_heads * cfg->index_head_dim, cfg->q_lora_rank, 0,
                  TP_REPLICATED, WHOLE, q);
      snprintf(q, sizeof q, "%s.self_attn.indexer.wk", p);
      push_linear(&l, &L->index_wk, i, cfg->index_head_dim, H, 0, TP_REPLICATED, WHOLE, q);
      push(&l, INA_WEIGHT_NORM, &L->index_k_norm, NULL, i, cfg->index_head_dim, -1, WHOLE,
           "%s.self_attn.indexer.k_norm.weight", p);
      push(&l, INA_WEIGHT_BIAS, &L->index_k_norm_bias, NULL, i, cfg->index_head_dim, -1, WHOLE,
           "%s.self_attn.indexer.k_norm.bias", p);
      push(&l, INA_WEIGHT_ROUTER, &L->index_weights_proj, NULL, i, cfg->index_n_heads, H, WHOLE,
           "%s.self_attn.indexer.weights_proj.weight", p);
    }
    push(&l, INA_WEIGHT_NORM, &L->post_attention_norm, NULL, i, H, -1, WHOLE,
"%s.post_attention_layernorm.weight", p);
    if (!L->is_moe) {
      snprintf(q, sizeof q, "%s.mlp", p);
      push_mlp(&l, &L->mlp, i, H, cfg->intermediate_size, cfg->mlp_bias, "intermediate_size", q);
      continue;
    }
    push(&l, INA_WEIGHT_ROUTER, &L->router, NULL, i, cfg->n_routed_experts, H, WHOLE, "%s.mlp.gate.weight", p);
    if (cfg->scoring == INA_SCORING_SIGMOID_NOAUX_TC)
      push(&l, INA_WEIGHT_ROUTER_BIAS, &L->router_bias, NULL, i, cfg->n_routed_experts, -1, WHOLE,
"%s.mlp.gate.e_score_correction_bias", p);
    if (L->has_shared) {
      snprintf(q, sizeof q, "%s.mlp.shared_experts", p);
      push_mlp(&l, &L->mlp, i, H, (int64_t)cfg->moe_intermediate_size * cfg->n_shared_experts,
               cfg->mlp_bias, "moe_intermediate_size x n_shared_experts", q);
    }
    for (int32_t e = w->expert_begin; e < w->expert_end; e++) {
      int32_t first_item = l.count;
      snprintf(q, sizeof q, "%s.mlp.experts.%d", p, e);
      /* routed experts are 3-D parameters in HF and never have biases */
      push_mlp(&l, &L->experts[e - w->expert_begin], i, H, cfg->moe_intermediate_size, 0,
               "moe_intermediate_size", q);
      for (int32_t k = first_item; l.status == INA_OK && k < l.count; k++) {
        l.items[k].expert = e;
        l.items[k].expert_proj = k - first_item;
      }
    }
  }
  push(&l, INA_WEIGHT_NORM, &w->final_norm, NULL, -1, H, -1, WHOLE, "model.norm.weight");
  if (!cfg->tie_word_embeddings)
    push(&l, INA_WEIGHT_LINEAR_BF16, &w->lm_head.weight, &w->lm_head, -1, cfg->vocab_size, H, WHOLE,
         "lm_head.weight");
  if (l.status != INA_OK) {
    free(l.items);
    return l.status;
  }
  *specs = l.items;
  *count = l.count;
  return INA_OK;
}

ina_status_t ina_weights_prepare(ina_weights_t *w, const ina_model_config_t *cfg,
                                 const ina_shard_t *shard, ina_weight_spec_t **specs,
                                 int32_t *count) {
  ina_status_t st = INA_OK;
  *specs = NULL;
  *count = 0;
  INA_CHECK(alloc_layers(w, cfg, shard));
  INA_CHECK(ina_weight_specs(w, specs, count));
fail:
  if (st != INA_OK) ina_weights_release(w);
  return st;
}

/* ---- tensor-parallel parts ---------------------------------------------------------- */

static int64_t slice_len(const ina_weight_spec_t *s) { return s->shape[s->slice_dim]; }

/* The rows or columns [begin, begin + len) of `whole`, a contiguous [rows, cols] host
 * matrix or [n] vector: rows stay a view into whole's memory, columns are copied into
 * an owned tensor. */
static ina_status_t take_part(const ina_tensor_t *whole, int32_t dim, int64_t begin, int64_t len,
                              ina_tensor_t *out) {
  ina_status_t st = INA_OK;
  if (dim < 0) {
    *out = *whole;
    return INA_OK;
  }
  const size_t esize = ina_dtype_size(whole->dtype);
  const int64_t cols = whole->ndim == 2 ? whole->shape[1] : 1;
  int64_t shape[2] = {whole->shape[0], cols};
  shape[dim] = len;
  if (dim == 0) {
    *out = ina_tensor_wrap((char *)whole->data + (size_t)(begin * cols) * esize, whole->dtype, whole->ndim,
                           shape, whole->device);
    return INA_OK;
  }
  INA_CHECK(ina_tensor_alloc(out, whole->dtype, 2, shape, INA_CPU));
  for (int64_t r = 0; r < shape[0]; r++)
    memcpy((char *)out->data + (size_t)(r * len) * esize,
           (const char *)whole->data + (size_t)(r * cols + begin) * esize, (size_t)len * esize);
fail:
  return st;
}

/* An fp8 slice must consist of whole blocks of the sliced dimension (the last one may
 * be the tensor's ragged edge): a block has one scale, which two ranks cannot share. */
static ina_status_t check_fp8_slice(const ina_weight_spec_t *s, int32_t block_rows, int32_t block_cols,
                                    const char *where) {
  ina_status_t st = INA_OK;
  if (s->slice_dim < 0) return INA_OK;
  const int64_t block = s->slice_dim == 0 ? block_rows : block_cols;
  const int64_t begin = s->slice_begin, end = begin + slice_len(s), full = s->full_shape[s->slice_dim];
  const int64_t inside = begin % block != 0 ? begin : (end % block != 0 && end != full) ? end : -1;
  INA_REQUIRE(inside < 0, INA_ERR_UNSUPPORTED,
              "%s: fp8 tensor '%s': the tensor-parallel slice of its %s (dimension %d) is [%lld, %lld) "
              "of %lld; its boundary %lld falls inside a %lld-%s scale block",
              where, s->name, s->slice_dim == 0 ? "rows" : "columns", (int)s->slice_dim, (long long)begin,
              (long long)end, (long long)full, (long long)inside, (long long)block,
              s->slice_dim == 0 ? "row" : "column");
fail:
  return st;
}

/* The block scales of an fp8 slice: the rows or columns of scale_inv over its blocks. */
static ina_status_t take_scale_part(const ina_weight_spec_t *s, const ina_tensor_t *whole, ina_linear_t *lin) {
  if (s->slice_dim < 0) return take_part(whole, -1, 0, 0, &lin->scale_inv);
  const int64_t block = s->slice_dim == 0 ? lin->block_rows : lin->block_cols;
  const int64_t first = s->slice_begin / block;
  const int64_t end = (s->slice_begin + slice_len(s) + block - 1) / block;
  return take_part(whole, s->slice_dim, first, end - first, &lin->scale_inv);
}

/* ---- loading from a checkpoint ---------------------------------------------------- */

static int shape_matches(const ina_tensor_t *t, const ina_weight_spec_t *s) {
  if (t->ndim != s->ndim) return 0;
  for (int d = 0; d < s->ndim; d++)
    if (t->shape[d] != s->full_shape[d]) return 0;
  return 1;
}

static const char *shape_str(const ina_tensor_t *t, char *buf, size_t n) {
  return ina_tensor_describe(t, buf, n);
}

/* View of rows [row0, row0 + rows) of matrix `m` of expert e in a fused [E, R, C] tensor. */
static ina_tensor_t fused_expert_view(const ina_tensor_t *fused, int32_t e, int64_t row0, int64_t rows) {
  int64_t shape[2] = {rows, fused->shape[2]};
  size_t esize = ina_dtype_size(fused->dtype);
  char *base = (char *)fused->data + ((size_t)e * fused->shape[1] + (size_t)row0) * fused->shape[2] * esize;
  return ina_tensor_wrap(base, fused->dtype, 2, shape, fused->device);
}

/* Transformers >= 5 may save routed experts fused per layer:
 * mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I].
 * *out is the whole matrix of the spec's expert and projection. */
static ina_status_t get_fused_expert(ina_checkpoint_t *ck, const ina_weight_spec_t *s, const char *dir,
                                     ina_tensor_t *out) {
  ina_status_t st = INA_OK;
  char name[128];
  ina_tensor_t fused;
  const char *which = s->expert_proj == 2 ? "down_proj" : "gate_up_proj";
  snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", s->layer, which);
  if (!ina_checkpoint_has(ck, name)) {
    ina_error(INA_LOG_SUBSYS, "%s: tensor '%s' not found (nor fused '%s')", dir, s->name, name);
    return INA_ERR_NOT_FOUND;
  }
  INA_CHECK(ina_checkpoint_get(ck, name, &fused));
  const int64_t inter = s->expert_proj == 2 ? s->full_shape[1] : s->full_shape[0];
  const int64_t hidden = s->expert_proj == 2 ? s->full_shape[0] : s->full_shape[1];
  const int64_t rows = s->expert_proj == 2 ? hidden : 2 * inter;
  const int64_t cols = s->expert_proj == 2 ? inter : hidden;
  INA_REQUIRE(fused.ndim == 3 && fused.shape[0] > s->expert && fused.shape[1] == rows &&
                  fused.shape[2] == cols,
              INA_ERR_FORMAT, "%s: tensor '%s' has shape [%lld, %lld, %lld], expected [E, %lld, %lld]",
              dir, name, (long long)fused.shape[0], (long long)fused.shape[1],
              (long long)fused.shape[2], (long long)rows, (long long)cols);
  INA_REQUIRE(fused.dtype != INA_DTYPE_FP8_E4M3 && fused.dtype != INA_DTYPE_FP8_E5M2,
              INA_ERR_UNSUPPORTED, "%s: fused fp8 expert tensor '%s' is not supported", dir, name);
  *out = fused_expert_view(&fused, s->expert, s->expert_proj == 1 ? inter : 0,
                           s->expert_proj == 2 ? hidden : inter);
fail:
  return st;
}

static ina_status_t load_scale(ina_checkpoint_t *ck, const ina_weight_spec_t *s, const char *dir,
                               const ina_model_config_t *cfg) {
  ina_status_t st = INA_OK;
  char name[sizeof s->name + sizeof "_scale_inv"];
  char buf[64];
  ina_tensor_t whole;
  snprintf(name, sizeof name, "%s_scale_inv", s->name);
  INA_REQUIRE(ina_checkpoint_has(ck, name), INA_ERR_FORMAT,
              "%s: fp8 tensor '%s' has no block scales '%s'", dir, s->name, name);
  INA_CHECK(ina_checkpoint_get(ck, name, &whole));
  ina_linear_t *lin = s->linear;
  lin->block_rows = cfg->fp8_block_rows;
  lin->block_cols = cfg->fp8_block_cols;
  const int64_t want0 = (s->full_shape[0] + lin->block_rows - 1) / lin->block_rows;
  const int64_t want1 = (s->full_shape[1] + lin->block_cols - 1) / lin->block_cols;
  INA_REQUIRE(whole.dtype == INA_DTYPE_F32 && whole.ndim == 2 && whole.shape[0] == want0 &&
                  whole.shape[1] == want1,
              INA_ERR_FORMAT, "%s: tensor '%s' is %s, expected f32[%lld, %lld] (%dx%d blocks)", dir,
              name, shape_str(&whole, buf, sizeof buf), (long long)want0, (long long)want1,
              lin->block_rows, lin->block_cols);
  INA_CHECK(check_fp8_slice(s, lin->block_rows, lin->block_cols, dir));
  INA_CHECK(take_scale_part(s, &whole, lin));
fail:
  return st;
}

/* Maps the whole tensor of spec s, checks it, and sets s's tensor (and scales) to this
 * rank's part of it. */
static ina_status_t load_one(ina_checkpoint_t *ck, const ina_weight_spec_t *s, const char *dir,
                             const ina_model_config_t *cfg) {
  ina_status_t st = INA_OK;
  char buf[64];
  ina_tensor_t t;
  if (s->expert >= 0 && !ina_checkpoint_has(ck, s->name)) {
    INA_CHECK(get_fused_expert(ck, s, dir, &t));
  } else {
    INA_REQUIRE(ina_checkpoint_has(ck, s->name), INA_ERR_NOT_FOUND, "%s: tensor '%s' not found", dir,
                s->name);
    INA_CHECK(ina_checkpoint_get(ck, s->name, &t));
  }
  INA_REQUIRE(shape_matches(&t, s), INA_ERR_FORMAT, "%s: tensor '%s' is %s, expected shape [%lld%s%lld]",
              dir, s->name, shape_str(&t, buf, sizeof buf), (long long)s->full_shape[0],
              s->ndim == 2 ? ", " : "", s->ndim == 2 ? (long long)s->full_shape[1] : 0LL);
  const int fp8 = t.dtype == INA_DTYPE_FP8_E4M3 || t.dtype == INA_DTYPE_FP8_E5M2;
  INA_REQUIRE(ina_dtype_is_float(t.dtype), INA_ERR_FORMAT, "%s: tensor '%s' has integer dtype %s", dir,
              s->name, ina_dtype_name(t.dtype));
  if (fp8) {
    INA_REQUIRE(t.dtype == INA_DTYPE_FP8_E4M3 && s->linear != NULL, INA_ERR_UNSUPPORTED,
                "%s: tensor '%s' is %s; fp8 is supported for block-scaled linear weights (e4m3) only",
                dir, s->name, ina_dtype_name(t.dtype));
    INA_CHECK(load_scale(ck, s, dir, cfg));
  }
  INA_CHECK(take_part(&t, s->slice_dim, s->slice_begin, s->slice_dim >= 0 ? slice_len(s) : 0, s->tensor));
fail:
  return st;
}

ina_status_t ina_weights_load(const char *dir, const ina_shard_t *shard, ina_weights_t *w) {
  ina_status_t st = INA_OK;
  ina_weight_spec_t *specs = NULL;
  int32_t count = 0;
  ina_model_config_t cfg;
  char path[4096];
  memset(w, 0, sizeof *w);
  snprintf(path, sizeof path, "%s/config.json", dir);
  INA_CHECK(ina_model_config_load(path, &cfg));
  INA_CHECK(ina_weights_prepare(w, &cfg, shard, &specs, &count));
  INA_CHECK(ina_checkpoint_open(dir, &w->checkpoint));
  for (int32_t i = 0; i < count; i++) {
    INA_CHECK(load_one(w->checkpoint, &specs[i], dir, &cfg));
    if (i % 256 == 255) INA_LOG_D(INA_LOG_SUBSYS, "loaded %d / %d tensors", i + 1, count);
  }
  if (cfg.tie_word_embeddings) w->lm_head.weight = w->embed;
  free(specs);
  return INA_OK;
fail:
  free(specs);
  ina_weights_release(w);
  return st;
}

/* ---- seeded random weights -------------------------------------------------------- */

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
  return h;
}

/* Uniform in [-1, 1) from (key, index): counter-based, so any device or thread split
 * produces the same values. */
static float uniform_pm1(uint64_t key, uint64_t i) {
  uint64_t r = mix64(key + (i + 1) * 0x9E3779B97F4A7C15ull);
  return (float)((double)(r >> 40) * (1.0 / 8388608.0) - 1.0);
}

/* The values of spec s's part of its tensor, row-major: element (r, c) of the part is
 * element (slice rows + r, slice columns + c) of the whole tensor, and its value depends
 * on that index alone. */
static void fill_random(const ina_weight_spec_t *s, uint64_t seed, float *out) {
  const uint64_t key = mix64(seed ^ name_hash(s->name));
  /* Uniform on [-a, a] has std a / sqrt(3): linear layers get std 1/sqrt(fan_in) so
   * activations keep their scale through the network (the whole layer's fan_in). */
  double a = 1.0;
  double offset = 0.0;
  switch (s->role) {
  case INA_WEIGHT_LINEAR:
  case INA_WEIGHT_LINEAR_BF16:
  case INA_WEIGHT_ROUTER: a = sqrt(3.0 / (double)s->full_shape[1]); break;
  case INA_WEIGHT_EMBEDDING: a = sqrt(3.0); break;
  case INA_WEIGHT_NORM: a = 0.2; offset = 1.0; break;
  case INA_WEIGHT_ROUTER_BIAS: a = 0.05; break;
  case INA_WEIGHT_BIAS: a = 0.05; break;
  }
  const int64_t rows = s->shape[0], cols = s->ndim == 2 ? s->shape[1] : 1;
  const int64_t full_cols = s->ndim == 2 ? s->full_shape[1] : 1;
  const int64_t row0 = s->slice_dim == 0 ? s->slice_begin : 0, col0 = s->slice_dim == 1 ? s->slice_begin : 0;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++)
      out[r * cols + c] = (float)(offset + a * uniform_pm1(key, (uint64_t)((row0 + r) * full_cols + col0 + c)));
}

/* Random weights store LINEAR weights in fp8 (with block scales) when dtype is fp8. */
static int random_quantized(const ina_weight_spec_t *s, ina_dtype_t dtype) {
  return dtype == INA_DTYPE_FP8_E4M3 && s->role == INA_WEIGHT_LINEAR;
}

/* The dtype random weights of `dtype` store tensor s in: FP8 only for linears (the rest
 * bf16), the router's bias always f32. */
static ina_dtype_t random_store_dtype(const ina_weight_spec_t *s, ina_dtype_t dtype) {
  if (s->role == INA_WEIGHT_ROUTER_BIAS) return INA_DTYPE_F32;
  if (dtype == INA_DTYPE_FP8_E4M3 && !random_quantized(s, dtype)) return INA_DTYPE_BF16;
  return dtype;
}

static ina_status_t make_random(const ina_weight_spec_t *s, uint64_t seed, ina_dtype_t dtype,
                                const ina_model_config_t *cfg) {
  ina_status_t st = INA_OK;
  float *tmp = NULL;
  const int64_t n = s->ndim == 2 ? s->shape[0] * s->shape[1] : s->shape[0];
  const int quantize = random_quantized(s, dtype);
  const ina_dtype_t store = random_store_dtype(s, dtype);
  tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
  INA_CHECK_ALLOC(tmp);
  fill_random(s, seed, tmp);
  INA_CHECK(ina_tensor_alloc(s->tensor, store, s->ndim, s->shape, INA_CPU));
  if (quantize) {
    /* The part is whole blocks of the whole tensor (random_prepare checked), so its
     * blocks quantize to the whole tensor's bytes and scales. */
    ina_linear_t *lin = s->linear;
    lin->block_rows = cfg->fp8_block_rows;
    lin->block_cols = cfg->fp8_block_cols;
    int64_t sshape[2] = {(s->shape[0] + lin->block_rows - 1) / lin->block_rows,
                         (s->shape[1] + lin->block_cols - 1) / lin->block_cols};
    INA_CHECK(ina_tensor_alloc(&lin->scale_inv, INA_DTYPE_F32, 2, sshape, INA_CPU));
    INA_CHECK(ina_fp8_quantize_blocks(tmp, s->shape[0], s->shape[1], lin->block_rows,
                                      lin->block_cols, s->tensor->data, lin->scale_inv.data));
  } else {
    INA_CHECK(ina_from_f32(tmp, s->tensor->data, store, (size_t)n));
  }
fail:
  free(tmp);
  return st;
}

/* The configuration random weights of `dtype` have (FP8 block scaling for fp8_e4m3), the
 * layer arrays prepared and the spec list made; no tensor holds data yet. */
static ina_status_t random_prepare(const ina_model_config_t *cfg_in, ina_dtype_t dtype, const ina_shard_t *shard,
                                   ina_weights_t *w, ina_weight_spec_t **specs, int32_t *count) {
  ina_status_t st = INA_OK;
  ina_model_config_t cfg = *cfg_in;
  memset(w, 0, sizeof *w);
  INA_REQUIRE(dtype == INA_DTYPE_F32 || dtype == INA_DTYPE_BF16 || dtype == INA_DTYPE_FP8_E4M3,
              INA_ERR_INVALID_ARGUMENT, "random weights: dtype %s is not one of f32, bf16, fp8_e4m3",
              ina_dtype_name(dtype));
  cfg.fp8_block_scaled = dtype == INA_DTYPE_FP8_E4M3;
  if (cfg.fp8_block_scaled && cfg.fp8_block_rows <= 0) cfg.fp8_block_rows = cfg.fp8_block_cols = 128;
  INA_CHECK(ina_model_config_validate(&cfg, "random weights"));
  INA_CHECK(ina_weights_prepare(w, &cfg, shard, specs, count));
  for (int32_t i = 0; i < *count; i++)
    if (random_quantized(&(*specs)[i], dtype))
      INA_CHECK(check_fp8_slice(&(*specs)[i], cfg.fp8_block_rows, cfg.fp8_block_cols, "random weights"));
fail:
  return st;
}

int64_t ina_weights_random_bytes(const ina_weights_t *shell, ina_dtype_t dtype) {
  ina_weight_spec_t *specs = NULL;
  int32_t count = 0;
  int64_t bytes = 0;
  if (ina_weight_specs((ina_weights_t *)shell, &specs, &count) != INA_OK) return -1;
  const ina_model_config_t *c = &shell->config;
  for (int32_t i = 0; i < count; i++) {
    const ina_weight_spec_t *s = &specs[i];
    const int64_t rows = s->shape[0], cols = s->ndim == 2 ? s->shape[1] : 1;
    bytes += rows * cols * (int64_t)ina_dtype_size(random_store_dtype(s, dtype));
    if (random_quantized(s, dtype)) /* f32 scales of the 128 x 128 blocks */
      bytes += 4 * ((rows + c->fp8_block_rows - 1) / c->fp8_block_rows) *
               ((cols + c->fp8_block_cols - 1) / c->fp8_block_cols);
  }
  free(specs);
  return bytes;
}

ina_status_t ina_weights_random_shell(const ina_model_config_t *cfg, ina_dtype_t dtype, const ina_shard_t *shard,
                                      ina_weights_t *w) {
  ina_status_t st = INA_OK;
  ina_weight_spec_t *specs = NULL;
  int32_t count = 0;
  INA_CHECK(random_prepare(cfg, dtype, shard, w, &specs, &count));
  free(specs);
  return INA_OK;
fail:
  free(specs);
  ina_weights_release(w);
  return st;
}

ina_status_t ina_weights_random(const ina_model_config_t *cfg_in, uint64_t seed, ina_dtype_t dtype,
                                const ina_shard_t *shard, ina_weights_t *w) {
  ina_status_t st = INA_OK;
  ina_weight_spec_t *specs = NULL;
  int32_t count = 0;
  INA_CHECK(random_prepare(cfg_in, dtype, shard, w, &specs, &count));
  const ina_model_config_t cfg = w->config;
  for (int32_t i = 0; i < count; i++) INA_CHECK(make_random(&specs[i], seed, dtype, &cfg));
  if (cfg.tie_word_embeddings) {
    w->lm_head.weight = w->embed;
    w->lm_head.weight.owns_data = 0;
  }
  free(specs);
  return INA_OK;
fail:
  free(specs);
  ina_weights_release(w);
  return st;
}

/* ---- saving ----------------------------------------------------------------------- */

ina_status_t ina_weights_save(const ina_weights_t *w, const char *dir) {
  ina_status_t st = INA_OK;
  ina_weight_spec_t *specs = NULL;
  ina_st_write_entry_t *entries = NULL;
  char **scale_names = NULL;
  int32_t count = 0, n = 0, nscales = 0;
  char path[4096];
  INA_REQUIRE(w->expert_begin == 0 && w->expert_end == w->config.n_routed_experts,
              INA_ERR_INVALID_ARGUMENT, "save: weights hold experts [%d, %d), not all %d",
              w->expert_begin, w->expert_end, w->config.n_routed_experts);
  INA_REQUIRE(w->tp_size <= 1, INA_ERR_INVALID_ARGUMENT,
              "save: weights hold tensor-parallel slice %d of %d; only whole models are saved",
              w->tp_rank, w->tp_size);
  /* The spec walk only takes addresses; it does not modify w. */
  INA_CHECK(ina_weight_specs((ina_weights_t *)w, &specs, &count));
  entries = calloc((size_t)count * 2, sizeof *entries);
  scale_names = calloc((size_t)count, sizeof *scale_names);
  INA_CHECK_ALLOC(entries);
  INA_CHECK_ALLOC(scale_names);
  for (int32_t i = 0; i < count; i++) {
    const ina_weight_spec_t *s = &specs[i];
    const ina_tensor_t *t = s->tensor;
    INA_REQUIRE(t->data != NULL && t->device.type == INA_DEVICE_CPU, INA_ERR_INVALID_ARGUMENT,
                "save: tensor '%s' is not in host memory", s->name);
    ina_st_write_entry_t *e = &entries[n++];
    e->name = s->name;
    e->dtype = t->dtype;
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof e->shape);
    e->data = t->data;
    if (s->linear && !ina_tensor_is_empty(&s->linear->scale_inv)) {
      const ina_tensor_t *sc = &s->linear->scale_inv;
      char *name = malloc(strlen(s->name) + sizeof "_scale_inv");
      INA_CHECK_ALLOC(name);
      sprintf(name, "%s_scale_inv", s->name);
      scale_names[nscales++] = name;
      e = &entries[n++];
      e->name = name;
      e->dtype = sc->dtype;
      e->ndim = sc->ndim;
      memcpy(e->shape, sc->shape, sizeof e->shape);
      e->data = sc->data;
    }
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  {
    const char *meta[] = {"format", "pt", NULL};
    INA_CHECK(ina_safetensors_write(path, entries, (size_t)n, meta));
  }
  snprintf(path, sizeof path, "%s/config.json", dir);
  INA_CHECK(ina_model_config_save(&w->config, path));
fail:
  for (int32_t i = 0; i < nscales; i++) free(scale_names[i]);
  free(scale_names);
  free(entries);
  free(specs);
  return st;
}

/* ---- release ---------------------------------------------------------------------- */

static void release_linear(ina_linear_t *l) {
  ina_tensor_release(&l->weight);
  ina_tensor_release(&l->scale_inv);
  ina_tensor_release(&l->bias);
}

static void release_mlp(ina_mlp_weights_t *m) {
  release_linear(&m->gate);
  release_linear(&m->up);
  release_linear(&m->down);
}

void ina_weights_release(ina_weights_t *w) {
  if (!w) return;
  if (w->layers) {
    for (int32_t i = 0; i < w->config.num_layers; i++) {
      ina_layer_weights_t *L = &w->layers[i];
      ina_tensor_release(&L->input_norm);
      ina_tensor_release(&L->post_attention_norm);
      release_linear(&L->q_proj);
      release_linear(&L->q_a_proj);
      ina_tensor_release(&L->q_a_norm);
      release_linear(&L->q_b_proj);
      release_linear(&L->kv_a_proj);
      ina_tensor_release(&L->kv_a_norm);
      release_linear(&L->kv_b_proj);
      release_linear(&L->o_proj);
      release_linear(&L->index_wq_b);
      release_linear(&L->index_wk);
      ina_tensor_release(&L->index_k_norm);
      ina_tensor_release(&L->index_k_norm_bias);
      ina_tensor_release(&L->index_weights_proj);
      release_mlp(&L->mlp);
      ina_tensor_release(&L->router);
      ina_tensor_release(&L->router_bias);
      if (L->experts)
        for (int32_t e = 0; e < w->expert_end - w->expert_begin; e++) release_mlp(&L->experts[e]);
      free(L->experts);
    }
    free(w->layers);
  }
  ina_tensor_release(&w->embed);
  ina_tensor_release(&w->final_norm);
  if (w->config.tie_word_embeddings) w->lm_head.weight.owns_data = 0;
  release_linear(&w->lm_head);
  ina_checkpoint_close(w->checkpoint);
  memset(w, 0, sizeof *w);
}
