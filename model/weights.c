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

typedef struct spec_list {
  ina_weight_spec_t *items;
  int32_t count, capacity;
  ina_status_t status;
} spec_list_t;

static ina_weight_spec_t *push(spec_list_t *l, ina_weight_role_t role, ina_tensor_t *tensor,
                               ina_linear_t *linear, int32_t layer, int64_t rows, int64_t cols,
                               const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static ina_weight_spec_t *push(spec_list_t *l, ina_weight_role_t role, ina_tensor_t *tensor,
                               ina_linear_t *linear, int32_t layer, int64_t rows, int64_t cols,
                               const char *fmt, ...) {
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
  s->shape[0] = rows;
  s->shape[1] = cols >= 0 ? cols : 0;
  return s;
}

static void push_linear(spec_list_t *l, ina_linear_t *lin, int32_t layer, int64_t out, int64_t in,
                        int with_bias, const char *prefix) {
  push(l, INA_WEIGHT_LINEAR, &lin->weight, lin, layer, out, in, "%s.weight", prefix);
  if (with_bias) push(l, INA_WEIGHT_BIAS, &lin->bias, NULL, layer, out, -1, "%s.bias", prefix);
}

static void push_mlp(spec_list_t *l, ina_mlp_weights_t *m, int32_t layer, int64_t hidden,
                     int64_t inter, int with_bias, const char *prefix) {
  char name[128];
  snprintf(name, sizeof name, "%s.gate_proj", prefix);
  push_linear(l, &m->gate, layer, inter, hidden, with_bias, name);
  snprintf(name, sizeof name, "%s.up_proj", prefix);
  push_linear(l, &m->up, layer, inter, hidden, with_bias, name);
  snprintf(name, sizeof name, "%s.down_proj", prefix);
  push_linear(l, &m->down, layer, hidden, inter, with_bias, name);
}

static ina_status_t alloc_layers(ina_weights_t *w, const ina_model_config_t *cfg,
                                 const ina_shard_t *shard) {
  ina_status_t st = INA_OK;
  const ina_shard_t all = INA_SHARD_INIT;
  if (!shard) shard = &all;
  memset(w, 0, sizeof *w);
  INA_REQUIRE_VERSIONED(shard, SHARD_V1_SIZE, "shard", "INA_SHARD_INIT");
  INA_REQUIRE(shard->tp_size == 1 && shard->tp_rank == 0, INA_ERR_UNSUPPORTED,
              "shard: tensor-parallel slicing (tp_size %d) is not supported by this loader",
              shard->tp_size);
  w->config = *cfg;
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
  spec_list_t l = {NULL, 0, 0, INA_OK};
  const ina_model_config_t *cfg = &w->config;
  const int64_t H = cfg->hidden_size, heads = cfg->num_heads;
  const int64_t qk = ina_cfg_qk_head_dim(cfg);
  *specs = NULL;
  *count = 0;
  push(&l, INA_WEIGHT_EMBEDDING, &w->embed, NULL, -1, cfg->vocab_size, H, "model.embed_tokens.weight");
  for (int32_t i = 0; i < cfg->num_layers; i++) {
    ina_layer_weights_t *L = &w->layers[i];
    char p[64], q[96];
    snprintf(p, sizeof p, "model.layers.%d", i);
    push(&l, INA_WEIGHT_NORM, &L->input_norm, NULL, i, H, -1, "%s.input_layernorm.weight", p);
    if (cfg->q_lora_rank == 0) {
      snprintf(q, sizeof q, "%s.self_attn.q_proj", p);
      push_linear(&l, &L->q_proj, i, heads * qk, H, 0, q);
    } else {
      snprintf(q, sizeof q, "%s.self_attn.q_a_proj", p);
      push_linear(&l, &L->q_a_proj, i, cfg->q_lora_rank, H, cfg->attention_bias, q);
      push(&l, INA_WEIGHT_NORM, &L->q_a_norm, NULL, i, cfg->q_lora_rank, -1,
"%s.self_attn.q_a_layernorm.weight", p);
      snprintf(q, sizeof q, "%s.self_attn.q_b_proj", p);
      push_linear(&l, &L->q_b_proj, i, heads * qk, cfg->q_lora_rank, 0, q);
    }
    snprintf(q, sizeof q, "%s.self_attn.kv_a_proj_with_mqa", p);
    push_linear(&l, &L->kv_a_proj, i, cfg->kv_lora_rank + cfg->qk_rope_head_dim, H,
                cfg->attention_bias, q);
    push(&l, INA_WEIGHT_NORM, &L->kv_a_norm, NULL, i, cfg->kv_lora_rank, -1,
"%s.self_attn.kv_a_layernorm.weight", p);
    snprintf(q, sizeof q, "%s.self_attn.kv_b_proj", p);
    push_linear(&l, &L->kv_b_proj, i, heads * (cfg->qk_nope_head_dim + cfg->v_head_dim),
                cfg->kv_lora_rank, 0, q);
    snprintf(q, sizeof q, "%s.self_attn.o_proj", p);
    push_linear(&l, &L->o_proj, i, H, heads * cfg->v_head_dim, cfg->attention_bias, q);
    push(&l, INA_WEIGHT_NORM, &L->post_attention_norm, NULL, i, H, -1,
"%s.post_attention_layernorm.weight", p);
    if (!L->is_moe) {
      snprintf(q, sizeof q, "%s.mlp", p);
      push_mlp(&l, &L->mlp, i, H, cfg->intermediate_size, cfg->mlp_bias, q);
      continue;
    }
    push(&l, INA_WEIGHT_ROUTER, &L->router, NULL, i, cfg->n_routed_experts, H, "%s.mlp.gate.weight", p);
    if (cfg->scoring == INA_SCORING_SIGMOID_NOAUX_TC)
      push(&l, INA_WEIGHT_ROUTER_BIAS, &L->router_bias, NULL, i, cfg->n_routed_experts, -1,
"%s.mlp.gate.e_score_correction_bias", p);
    if (L->has_shared) {
      snprintf(q, sizeof q, "%s.mlp.shared_experts", p);
      push_mlp(&l, &L->mlp, i, H, (int64_t)cfg->moe_intermediate_size * cfg->n_shared_experts,
               cfg->mlp_bias, q);
    }
    for (int32_t e = w->expert_begin; e < w->expert_end; e++) {
      int32_t first = l.count;
      snprintf(q, sizeof q, "%s.mlp.experts.%d", p, e);
      /* routed experts are 3-D parameters in HF and never have biases */
      push_mlp(&l, &L->experts[e - w->expert_begin], i, H, cfg->moe_intermediate_size, 0, q);
      for (int32_t k = first; l.status == INA_OK && k < l.count; k++) {
        l.items[k].expert = e;
        l.items[k].expert_proj = k - first;
      }
    }
  }
  push(&l, INA_WEIGHT_NORM, &w->final_norm, NULL, -1, H, -1, "model.norm.weight");
  if (!cfg->tie_word_embeddings)
    push(&l, INA_WEIGHT_LINEAR_BF16, &w->lm_head.weight, &w->lm_head, -1, cfg->vocab_size, H,
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

/* ---- loading from a checkpoint ---------------------------------------------------- */

static int shape_matches(const ina_tensor_t *t, const ina_weight_spec_t *s) {
  if (t->ndim != s->ndim) return 0;
  for (int d = 0; d < s->ndim; d++)
    if (t->shape[d] != s->shape[d]) return 0;
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
 * mlp.experts.gate_up_proj [E, 2I, H] and mlp.experts.down_proj [E, H, I]. */
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
  const int64_t inter = s->expert_proj == 2 ? s->shape[1] : s->shape[0];
  const int64_t hidden = s->expert_proj == 2 ? s->shape[0] : s->shape[1];
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
  snprintf(name, sizeof name, "%s_scale_inv", s->name);
  INA_REQUIRE(ina_checkpoint_has(ck, name), INA_ERR_FORMAT,
              "%s: fp8 tensor '%s' has no block scales '%s'", dir, s->name, name);
  ina_linear_t *lin = s->linear;
  INA_CHECK(ina_checkpoint_get(ck, name, &lin->scale_inv));
  lin->block_rows = cfg->fp8_block_rows;
  lin->block_cols = cfg->fp8_block_cols;
  const int64_t want0 = (s->shape[0] + lin->block_rows - 1) / lin->block_rows;
  const int64_t want1 = (s->shape[1] + lin->block_cols - 1) / lin->block_cols;
  INA_REQUIRE(lin->scale_inv.dtype == INA_DTYPE_F32 && lin->scale_inv.ndim == 2 &&
                  lin->scale_inv.shape[0] == want0 && lin->scale_inv.shape[1] == want1,
              INA_ERR_FORMAT, "%s: tensor '%s' is %s, expected f32[%lld, %lld] (%dx%d blocks)", dir,
              name, shape_str(&lin->scale_inv, buf, sizeof buf), (long long)want0, (long long)want1,
              lin->block_rows, lin->block_cols);
fail:
  return st;
}

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
              dir, s->name, shape_str(&t, buf, sizeof buf), (long long)s->shape[0],
              s->ndim == 2 ? ", " : "", s->ndim == 2 ? (long long)s->shape[1] : 0LL);
  const int fp8 = t.dtype == INA_DTYPE_FP8_E4M3 || t.dtype == INA_DTYPE_FP8_E5M2;
  INA_REQUIRE(ina_dtype_is_float(t.dtype), INA_ERR_FORMAT, "%s: tensor '%s' has integer dtype %s", dir,
              s->name, ina_dtype_name(t.dtype));
  if (fp8) {
    INA_REQUIRE(t.dtype == INA_DTYPE_FP8_E4M3 && s->linear != NULL, INA_ERR_UNSUPPORTED,
                "%s: tensor '%s' is %s; fp8 is supported for block-scaled linear weights (e4m3) only",
                dir, s->name, ina_dtype_name(t.dtype));
    INA_CHECK(load_scale(ck, s, dir, cfg));
  }
  *s->tensor = t;
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

static void fill_random(const ina_weight_spec_t *s, uint64_t seed, float *out, int64_t n) {
  const uint64_t key = mix64(seed ^ name_hash(s->name));
  /* Uniform on [-a, a] has std a / sqrt(3): linear layers get std 1/sqrt(fan_in) so
   * activations keep their scale through the network. */
  double a = 1.0;
  double offset = 0.0;
  switch (s->role) {
  case INA_WEIGHT_LINEAR:
  case INA_WEIGHT_LINEAR_BF16:
  case INA_WEIGHT_ROUTER: a = sqrt(3.0 / (double)s->shape[1]); break;
  case INA_WEIGHT_EMBEDDING: a = sqrt(3.0); break;
  case INA_WEIGHT_NORM: a = 0.2; offset = 1.0; break;
  case INA_WEIGHT_ROUTER_BIAS: a = 0.05; break;
  case INA_WEIGHT_BIAS: a = 0.05; break;
  }
  for (int64_t i = 0; i < n; i++) out[i] = (float)(offset + a * uniform_pm1(key, (uint64_t)i));
}

static ina_status_t make_random(const ina_weight_spec_t *s, uint64_t seed, ina_dtype_t dtype,
                                const ina_model_config_t *cfg) {
  ina_status_t st = INA_OK;
  float *tmp = NULL;
  const int64_t n = s->ndim == 2 ? s->shape[0] * s->shape[1] : s->shape[0];
  const int quantize = dtype == INA_DTYPE_FP8_E4M3 && s->role == INA_WEIGHT_LINEAR;
  ina_dtype_t store = dtype;
  if (dtype == INA_DTYPE_FP8_E4M3 && !quantize) store = INA_DTYPE_BF16;
  if (s->role == INA_WEIGHT_ROUTER_BIAS) store = INA_DTYPE_F32;
  tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
  INA_CHECK_ALLOC(tmp);
  fill_random(s, seed, tmp, n);
  INA_CHECK(ina_tensor_alloc(s->tensor, store, s->ndim, s->shape, INA_CPU));
  if (quantize) {
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
fail:
  return st;
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
