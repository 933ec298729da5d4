#define INA_LOG_SUBSYS "model"
#include "model/config.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/check.h"
#include "core/json.h"

/* ---- YaRN scales (HF's yarn_get_mscale and the attention factor it derives) --------- */

static double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

/* The cos/sin scale: attention_factor when given, else derived from the mscales. */
static double yarn_attention_factor(const ina_model_config_t *c) {
  if (c->yarn_attention_factor >= 0) return c->yarn_attention_factor;
  if (c->yarn_mscale != 0 && c->yarn_mscale_all_dim != 0)
    return yarn_get_mscale(c->yarn_factor, c->yarn_mscale) /
           yarn_get_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
  return yarn_get_mscale(c->yarn_factor, 1.0);
}

/* ---- parsing ---------------------------------------------------------------------- */

static ina_status_t get_i32(const json_t *o, const char *key, const char *where, int32_t *out) {
  int64_t v;
  ina_status_t st = ina_json_get_int(o, key, where, &v);
  if (st != INA_OK) return st;
  if (v < INT32_MIN || v > INT32_MAX) {
    ina_error(INA_LOG_SUBSYS, "%s: key '%s': value %lld out of range", where, key, (long long)v);
    return INA_ERR_FORMAT;
  }
  *out = (int32_t)v;
  return INA_OK;
}

static ina_status_t get_i32_opt(const json_t *o, const char *key, const char *where, int32_t dflt,
                                int32_t *out) {
  int64_t v;
  ina_status_t st = ina_json_get_int_opt(o, key, where, dflt, &v);
  if (st != INA_OK) return st;
  if (v < INT32_MIN || v > INT32_MAX) {
    ina_error(INA_LOG_SUBSYS, "%s: key '%s': value %lld out of range", where, key, (long long)v);
    return INA_ERR_FORMAT;
  }
  *out = (int32_t)v;
  return INA_OK;
}

/* eos_token_id may be an int or a list of ints (the first one is taken). A token id is
 * in [0, INT32_MAX]: -1 stands for "absent" here, and a wider value would be cut. */
static ina_status_t get_token_id(const json_t *o, const char *key, const char *where, int32_t *out) {
  const json_t *v = json_object_get(o, key);
  *out = -1;
  if (!v || json_is_null(v)) return INA_OK;
  if (json_is_array(v) && json_array_size(v) > 0) v = json_array_get(v, 0);
  if (!json_is_integer(v)) {
    ina_error(INA_LOG_SUBSYS, "%s: key '%s': expected a token id", where, key);
    return INA_ERR_FORMAT;
  }
  const json_int_t id = json_integer_value(v);
  if (id < 0 || id > INT32_MAX) {
    ina_error(INA_LOG_SUBSYS, "%s: key '%s': token id %lld is outside [0, %d]", where, key,
              (long long)id, INT32_MAX);
    return INA_ERR_FORMAT;
  }
  *out = (int32_t)id;
  return INA_OK;
}

/* V3.2 is V3's architecture with an indexer (*sparse = 1). */
static ina_status_t detect_arch(const json_t *root, const char *where, ina_arch_t *arch, int *sparse) {
  const char *model_type = NULL;
  ina_status_t st = INA_OK;
  INA_CHECK(ina_json_get_string_opt(root, "model_type", where, NULL, &model_type));
  if (!model_type) {
    const json_t *archs = json_object_get(root, "architectures");
    const json_t *first = json_is_array(archs) ? json_array_get(archs, 0) : NULL;
    const char *a = json_is_string(first) ? json_string_value(first) : "";
    model_type = strstr(a, "DeepseekV32")  ? "deepseek_v32"
                 : strstr(a, "DeepseekV3") ? "deepseek_v3"
                 : strstr(a, "DeepseekV2") ? "deepseek_v2"
                                           : a;
  }
  *sparse = 0;
  if (strcmp(model_type, "deepseek_v32") == 0) {
    *arch = INA_ARCH_DEEPSEEK_V3;
    *sparse = 1;
  } else if (strcmp(model_type, "deepseek_v3") == 0) {
    *arch = INA_ARCH_DEEPSEEK_V3;
  } else if (strcmp(model_type, "deepseek_v2") == 0) {
    *arch = INA_ARCH_DEEPSEEK_V2;
  } else {
    st = INA_ERR_UNSUPPORTED;
    ina_error(INA_LOG_SUBSYS, "%s: model_type '%s' is not supported (deepseek_v2, deepseek_v3, deepseek_v32)",
              where, model_type);
  }
fail:
  return st;
}

/* transformers' V3.2 decides each layer's MLP by mlp_layer_types ("dense" / "sparse",
 * one per layer), derived from first_k_dense_replace when absent. ina's layers are a dense
 * prefix and MoE after it: a list of that shape sets first_k_dense_replace, any other
 * is refused, naming the layer. */
static ina_status_t parse_mlp_layer_types(const json_t *root, const char *path, ina_model_config_t *c) {
  ina_status_t st = INA_OK;
  const json_t *types = json_object_get(root, "mlp_layer_types");
  if (!types || json_is_null(types)) return INA_OK;
  INA_REQUIRE(json_is_array(types) && (int64_t)json_array_size(types) == c->num_layers, INA_ERR_FORMAT,
              "%s: mlp_layer_types must be a list of num_hidden_layers (%d) strings", path, c->num_layers);
  int32_t dense = 0;
  for (int32_t l = 0; l < c->num_layers; l++) {
    const char *t = json_string_value(json_array_get(types, (size_t)l));
    INA_REQUIRE(t && (strcmp(t, "dense") == 0 || strcmp(t, "sparse") == 0), INA_ERR_FORMAT,
                "%s: mlp_layer_types[%d] must be \"dense\" or \"sparse\"", path, (int)l);
    const int is_dense = strcmp(t, "dense") == 0;
    INA_REQUIRE(!is_dense || dense == l, INA_ERR_UNSUPPORTED,
                "%s: mlp_layer_types[%d] is \"dense\" after a \"sparse\" layer; only dense layers "
                "first, then MoE layers, are supported",
                path, (int)l);
    dense += is_dense;
  }
  c->first_k_dense_replace = dense;
fail:
  return st;
}

static ina_status_t parse_rope(const json_t *root, const char *where, ina_model_config_t *c) {
  ina_status_t st = INA_OK;
  const char *rope_key = "rope_parameters";
  const json_t *rope = json_object_get(root, rope_key);
  if (!json_is_object(rope)) rope = json_object_get(root, rope_key = "rope_scaling");
  if (rope && !json_is_null(rope) && !json_is_object(rope)) {
    ina_error(INA_LOG_SUBSYS, "%s: key 'rope_scaling': expected an object", where);
    return INA_ERR_FORMAT;
  }
  if (!json_is_object(rope)) rope = NULL;
  INA_CHECK(ina_json_get_double_opt(root, "rope_theta", where, 10000.0, &c->rope_theta));
  const char *type = "default";
  c->rope_yarn = 0;
  if (rope) {
    INA_CHECK(ina_json_get_double_opt(rope, "rope_theta", where, c->rope_theta, &c->rope_theta));
    const char *t1 = NULL, *t2 = NULL;
    INA_CHECK(ina_json_get_string_opt(rope, "rope_type", where, NULL, &t1));
    INA_CHECK(ina_json_get_string_opt(rope, "type", where, NULL, &t2));
    type = t1 ? t1 : t2 ? t2 : "default";
  }
  if (strcmp(type, "yarn") == 0) {
    c->rope_yarn = 1;
    double orig;
    INA_CHECK(ina_json_get_double_opt(rope, "factor", where, -1.0, &c->yarn_factor));
    INA_CHECK(ina_json_get_double_opt(rope, "original_max_position_embeddings", where,
                                      c->max_position_embeddings, &orig));
    /* A count of positions: 4096 or 4096.0, never 4096.5 or beyond int32. */
    INA_REQUIRE(orig >= 1 && orig <= INT32_MAX && orig == floor(orig), INA_ERR_FORMAT,
                "%s: %s.original_max_position_embeddings (max_position_embeddings when absent) "
                "must be an integer in [1, %d] (got %g)",
                where, rope_key, INT32_MAX, orig);
    c->yarn_original_max_position = (int32_t)orig;
    if (c->yarn_factor <= 0) c->yarn_factor = (double)c->max_position_embeddings / orig;
    INA_CHECK(ina_json_get_double_opt(rope, "beta_fast", where, 32.0, &c->yarn_beta_fast));
    INA_CHECK(ina_json_get_double_opt(rope, "beta_slow", where, 1.0, &c->yarn_beta_slow));
    /* HF takes `beta or default`: an explicit 0 means the default too. */
    if (c->yarn_beta_fast == 0) c->yarn_beta_fast = 32.0;
    if (c->yarn_beta_slow == 0) c->yarn_beta_slow = 1.0;
    INA_CHECK(ina_json_get_double_opt(rope, "mscale", where, 0.0, &c->yarn_mscale));
    INA_CHECK(ina_json_get_double_opt(rope, "mscale_all_dim", where, 0.0, &c->yarn_mscale_all_dim));
    /* Negative stands for "derive it" here; an explicit value must be positive (as
     * transformers requires), or saving would turn it into "derive it". */
    const json_t *af = json_object_get(rope, "attention_factor");
    INA_CHECK(ina_json_get_double_opt(rope, "attention_factor", where, -1.0,
                                      &c->yarn_attention_factor));
    INA_REQUIRE(af == NULL || json_is_null(af) || c->yarn_attention_factor > 0, INA_ERR_FORMAT,
                "%s: %s.attention_factor must be positive (got %g)", where, rope_key,
                c->yarn_attention_factor);
    INA_CHECK(ina_json_get_bool_opt(rope, "truncate", where, 1, &c->yarn_truncate));
  } else if (strcmp(type, "default") != 0) {
    ina_error(INA_LOG_SUBSYS, "%s: rope type '%s' is not supported (default, yarn)", where, type);
    return INA_ERR_UNSUPPORTED;
  }
fail:
  return st;
}

static ina_status_t parse_scoring(const json_t *root, const char *where, ina_model_config_t *c) {
  ina_status_t st = INA_OK;
  const char *method = NULL, *func = NULL;
  INA_CHECK(ina_json_get_string_opt(root, "topk_method", where,
                                    c->arch == INA_ARCH_DEEPSEEK_V3 ? "noaux_tc" : "greedy", &method));
  INA_CHECK(ina_json_get_string_opt(root, "scoring_func", where,
                                    c->arch == INA_ARCH_DEEPSEEK_V3 ? "sigmoid" : "softmax", &func));
  if (c->arch == INA_ARCH_DEEPSEEK_V3) {
    /* HF's DeepseekV3 router always scores with sigmoid + correction bias (noaux_tc). */
    INA_REQUIRE(strcmp(func, "sigmoid") == 0 && strcmp(method, "noaux_tc") == 0, INA_ERR_UNSUPPORTED,
                "%s: DeepseekV3 with scoring_func '%s' / topk_method '%s' is not supported "
                "(sigmoid / noaux_tc)", where, func, method);
    c->scoring = INA_SCORING_SIGMOID_NOAUX_TC;
  } else if (strcmp(method, "greedy") == 0) {
    c->scoring = INA_SCORING_SOFTMAX_GREEDY;
  } else if (strcmp(method, "group_limited_greedy") == 0) {
    c->scoring = INA_SCORING_SOFTMAX_GROUP_GREEDY;
  } else {
    INA_REQUIRE(0, INA_ERR_UNSUPPORTED,
                "%s: topk_method '%s' is not supported for DeepseekV2 (greedy, group_limited_greedy)",
                where, method);
  }
fail:
  return st;
}

static ina_status_t parse_quantization(const json_t *root, const char *where, ina_model_config_t *c) {
  ina_status_t st = INA_OK;
  const json_t *q = json_object_get(root, "quantization_config");
  c->fp8_block_scaled = 0;
  c->fp8_block_rows = c->fp8_block_cols = 128;
  if (!q || json_is_null(q)) return INA_OK;
  INA_REQUIRE(json_is_object(q), INA_ERR_FORMAT, "%s: key 'quantization_config': expected an object",
              where);
  const char *method = NULL, *fmt = NULL;
  INA_CHECK(ina_json_get_string(q, "quant_method", where, &method));
  INA_REQUIRE(strcmp(method, "fp8") == 0, INA_ERR_UNSUPPORTED,
              "%s: quantization_config.quant_method '%s' is not supported (fp8)", where, method);
  INA_CHECK(ina_json_get_string_opt(q, "fmt", where, "e4m3", &fmt));
  INA_REQUIRE(strcmp(fmt, "e4m3") == 0, INA_ERR_UNSUPPORTED,
              "%s: quantization_config.fmt '%s' is not supported (e4m3)", where, fmt);
  const json_t *block = json_object_get(q, "weight_block_size");
  INA_REQUIRE(json_is_array(block) && json_array_size(block) == 2 &&
                  json_is_integer(json_array_get(block, 0)) && json_is_integer(json_array_get(block, 1)),
              INA_ERR_FORMAT, "%s: quantization_config.weight_block_size: expected [rows, cols]", where);
  const json_int_t rows = json_integer_value(json_array_get(block, 0));
  const json_int_t cols = json_integer_value(json_array_get(block, 1));
  INA_REQUIRE(rows > 0 && rows <= INT32_MAX && cols > 0 && cols <= INT32_MAX, INA_ERR_FORMAT,
              "%s: quantization_config.weight_block_size [%lld, %lld] must be positive 32-bit "
              "integers", where, (long long)rows, (long long)cols);
  c->fp8_block_rows = (int32_t)rows;
  c->fp8_block_cols = (int32_t)cols;
  c->fp8_block_scaled = 1;
fail:
  return st;
}

ina_status_t ina_model_config_load(const char *path, ina_model_config_t *c) {
  ina_status_t st = INA_OK;
  json_t *root = NULL;
  memset(c, 0, sizeof *c);
  INA_CHECK(ina_json_load_file(path, &root));
  INA_CHECK(ina_model_config_from_json(root, path, c));
fail:
  json_decref(root);
  return st;
}

ina_status_t ina_model_config_from_json(const json_t *root, const char *where,
                                        ina_model_config_t *c) {
  ina_status_t st = INA_OK;
  const char *act = NULL;
  const char *path = where ? where : "config.json";
  memset(c, 0, sizeof *c);
  INA_REQUIRE(json_is_object(root), INA_ERR_FORMAT, "%s: expected a JSON object at the top",
              path);
  int sparse = 0;
  INA_CHECK(detect_arch(root, path, &c->arch, &sparse));
  INA_CHECK(get_i32(root, "vocab_size", path, &c->vocab_size));
  INA_CHECK(get_i32(root, "hidden_size", path, &c->hidden_size));
  INA_CHECK(get_i32(root, "intermediate_size", path, &c->intermediate_size));
  INA_CHECK(get_i32(root, "num_hidden_layers", path, &c->num_layers));
  INA_CHECK(get_i32(root, "num_attention_heads", path, &c->num_heads));
  {
    /* MLA has one latent per token, shared by all heads: a separate KV head count
     * means nothing here and transformers breaks on any value but the head count. */
    int32_t kv_heads;
    INA_CHECK(get_i32_opt(root, "num_key_value_heads", path, c->num_heads, &kv_heads));
    INA_REQUIRE(kv_heads == c->num_heads, INA_ERR_UNSUPPORTED,
                "%s: num_key_value_heads (%d) must equal num_attention_heads (%d) for MLA", path,
                kv_heads, c->num_heads);
  }
  INA_CHECK(get_i32_opt(root, "q_lora_rank", path, 0, &c->q_lora_rank));
  INA_CHECK(get_i32(root, "kv_lora_rank", path, &c->kv_lora_rank));
  INA_CHECK(get_i32(root, "qk_nope_head_dim", path, &c->qk_nope_head_dim));
  INA_CHECK(get_i32(root, "qk_rope_head_dim", path, &c->qk_rope_head_dim));
  INA_CHECK(get_i32(root, "v_head_dim", path, &c->v_head_dim));
  INA_CHECK(get_i32_opt(root, "n_routed_experts", path, 0, &c->n_routed_experts));
  INA_CHECK(get_i32_opt(root, "num_experts_per_tok", path, 0, &c->num_experts_per_tok));
  INA_CHECK(get_i32_opt(root, "n_shared_experts", path, 0, &c->n_shared_experts));
  INA_CHECK(get_i32_opt(root, "moe_intermediate_size", path, 0, &c->moe_intermediate_size));
  INA_CHECK(get_i32_opt(root, "n_group", path, 1, &c->n_group));
  INA_CHECK(get_i32_opt(root, "topk_group", path, 1, &c->topk_group));
  INA_CHECK(get_i32_opt(root, "first_k_dense_replace", path, 0, &c->first_k_dense_replace));
  INA_CHECK(ina_json_get_bool_opt(root, "norm_topk_prob", path,
                                  c->arch == INA_ARCH_DEEPSEEK_V3, &c->norm_topk_prob));
  INA_CHECK(ina_json_get_double_opt(root, "routed_scaling_factor", path,
                                    c->arch == INA_ARCH_DEEPSEEK_V3 ? 2.5 : 1.0,
                                    &c->routed_scaling_factor));
  INA_CHECK(ina_json_get_double_opt(root, "rms_norm_eps", path, 1e-6, &c->rms_norm_eps));
  INA_CHECK(ina_json_get_bool_opt(root, "tie_word_embeddings", path, 0, &c->tie_word_embeddings));
  INA_CHECK(ina_json_get_bool_opt(root, "attention_bias", path, 0, &c->attention_bias));
  INA_CHECK(ina_json_get_bool_opt(root, "mlp_bias", path, 0, &c->mlp_bias));
  INA_REQUIRE(!c->mlp_bias || c->arch == INA_ARCH_DEEPSEEK_V2, INA_ERR_UNSUPPORTED,
              "%s: mlp_bias is a DeepseekV2 option; DeepseekV3 has no MLP biases", path);
  INA_CHECK(get_i32_opt(root, "max_position_embeddings", path, 4096, &c->max_position_embeddings));
  INA_CHECK(get_token_id(root, "bos_token_id", path, &c->bos_token_id));
  INA_CHECK(get_token_id(root, "eos_token_id", path, &c->eos_token_id));
  INA_CHECK(ina_json_get_string_opt(root, "hidden_act", path, "silu", &act));
  INA_REQUIRE(strcmp(act, "silu") == 0, INA_ERR_UNSUPPORTED,
              "%s: hidden_act '%s' is not supported (silu)", path, act);
  {
    /* V2 and V3.2 always interleave MLA's rope (transformers' V3.2 keeps the key in its
     * configs but never reads it); V3 reads rope_interleave. */
    int interleave = 1;
    INA_CHECK(ina_json_get_bool_opt(root, "rope_interleave", path, 1, &interleave));
    c->rope_layout = (c->arch == INA_ARCH_DEEPSEEK_V2 || sparse || interleave) ? INA_ROPE_PAIRS : INA_ROPE_HALVES;
  }
  if (sparse) INA_CHECK(parse_mlp_layer_types(root, path, c));
  if (sparse) { /* transformers' defaults: DeepSeek-V3.2's release */
    INA_CHECK(get_i32_opt(root, "index_topk", path, 2048, &c->index_topk));
    INA_CHECK(get_i32_opt(root, "index_n_heads", path, 64, &c->index_n_heads));
    INA_CHECK(get_i32_opt(root, "index_head_dim", path, 128, &c->index_head_dim));
    INA_REQUIRE(c->index_topk > 0, INA_ERR_FORMAT, "%s: index_topk must be positive (got %d)", path, c->index_topk);
  }
  INA_CHECK(parse_rope(root, path, c));
  if (c->n_routed_experts > 0) INA_CHECK(parse_scoring(root, path, c));
  INA_CHECK(parse_quantization(root, path, c));
  /* Greedy routing (V2) never reads the group keys, and HF accepts any value there. */
  if (!json_is_integer(json_object_get(root, "n_group")) || c->scoring == INA_SCORING_SOFTMAX_GREEDY)
    c->n_group = 1;
  if (!json_is_integer(json_object_get(root, "topk_group")) || c->scoring == INA_SCORING_SOFTMAX_GREEDY)
    c->topk_group = 1;
  INA_CHECK(ina_model_config_validate(c, path));
fail:
  return st;
}

ina_status_t ina_model_config_validate(const ina_model_config_t *c, const char *where) {
  ina_status_t st = INA_OK;
/* messages use the config.json key names */
#define POSITIVE_KEY(f, key) \
  INA_REQUIRE(c->f > 0, INA_ERR_FORMAT, "%s: %s must be positive (got %lld)", where, key, (long long)c->f)
#define POSITIVE(f) POSITIVE_KEY(f, #f)
  POSITIVE(vocab_size);
  POSITIVE(hidden_size);
  POSITIVE_KEY(num_layers, "num_hidden_layers");
  POSITIVE_KEY(num_heads, "num_attention_heads");
  POSITIVE(kv_lora_rank);
  POSITIVE(qk_nope_head_dim);
  POSITIVE(qk_rope_head_dim);
  POSITIVE(v_head_dim);
  POSITIVE(max_position_embeddings);
  INA_REQUIRE(c->q_lora_rank >= 0, INA_ERR_FORMAT, "%s: q_lora_rank must be >= 0 or null", where);
  INA_REQUIRE(c->qk_rope_head_dim % 2 == 0, INA_ERR_FORMAT,
              "%s: qk_rope_head_dim must be even (got %d)", where, c->qk_rope_head_dim);
  INA_REQUIRE(c->first_k_dense_replace >= 0, INA_ERR_FORMAT,
              "%s: first_k_dense_replace must be >= 0", where);
  if (c->first_k_dense_replace > 0 || c->n_routed_experts == 0) POSITIVE(intermediate_size);
  if (c->n_routed_experts > 0 && c->first_k_dense_replace < c->num_layers) {
    POSITIVE(moe_intermediate_size);
    POSITIVE(num_experts_per_tok);
    POSITIVE(n_group);
    POSITIVE(topk_group);
    INA_REQUIRE(c->n_shared_experts >= 0, INA_ERR_FORMAT, "%s: n_shared_experts must be >= 0", where);
    INA_REQUIRE(c->n_routed_experts % c->n_group == 0, INA_ERR_FORMAT,
                "%s: n_group (%d) must divide n_routed_experts (%d)", where, c->n_group,
                c->n_routed_experts);
    INA_REQUIRE(c->topk_group <= c->n_group, INA_ERR_FORMAT,
                "%s: topk_group (%d) must be <= n_group (%d)", where, c->topk_group, c->n_group);
    INA_REQUIRE(c->num_experts_per_tok <= c->topk_group * (c->n_routed_experts / c->n_group),
                INA_ERR_FORMAT,
                "%s: num_experts_per_tok (%d) exceeds the experts of the top %d groups", where,
                c->num_experts_per_tok, c->topk_group);
    if (c->scoring == INA_SCORING_SIGMOID_NOAUX_TC)
      INA_REQUIRE(c->n_routed_experts / c->n_group >= 2, INA_ERR_FORMAT,
                  "%s: noaux_tc routing needs at least 2 experts per group", where);
  }
  if (ina_cfg_has_indexer(c)) {
    POSITIVE(index_n_heads);
    POSITIVE(index_head_dim);
    /* The indexer's query is wq_b of the q LoRA output; its rope covers the key's first
     * qk_rope_head_dim dims. */
    INA_REQUIRE(c->q_lora_rank > 0, INA_ERR_FORMAT,
                "%s: deepseek_v32 needs a q_lora_rank (the indexer's query comes from the q LoRA output)", where);
    INA_REQUIRE(c->index_head_dim >= c->qk_rope_head_dim, INA_ERR_FORMAT,
                "%s: index_head_dim (%d) must be at least qk_rope_head_dim (%d): the indexer ropes that many dims",
                where, c->index_head_dim, c->qk_rope_head_dim);
    INA_REQUIRE(c->index_n_heads <= INT32_MAX / c->index_head_dim, INA_ERR_FORMAT,
                "%s: index_n_heads x index_head_dim (%d x %d) overflows 32 bits", where, c->index_n_heads,
                c->index_head_dim);
  }
  /* ina_cfg_qk_head_dim adds them in int32. */
  INA_REQUIRE(c->qk_nope_head_dim <= INT32_MAX - c->qk_rope_head_dim, INA_ERR_FORMAT,
              "%s: qk_nope_head_dim + qk_rope_head_dim (%d + %d) overflows 32 bits", where,
              c->qk_nope_head_dim, c->qk_rope_head_dim);
  /* The frequencies are rope_theta^(-2i/d) in float32, as transformers computes them: a
   * base that is not a positive normal float32 gives infinities or NaN. */
  INA_REQUIRE(c->rope_theta >= FLT_MIN && c->rope_theta <= FLT_MAX, INA_ERR_FORMAT,
              "%s: rope_theta must be a positive float32 in [%g, %g] (got %g)", where,
              (double)FLT_MIN, (double)FLT_MAX, c->rope_theta);
  if (c->rope_yarn) {
    INA_REQUIRE(c->yarn_original_max_position > 0, INA_ERR_FORMAT,
                "%s: yarn rope needs a positive original_max_position_embeddings (got %d)", where,
                c->yarn_original_max_position);
    /* transformers refuses factor < 1 too; below it the interpolated frequencies grow. */
    INA_REQUIRE(c->yarn_factor >= 1, INA_ERR_FORMAT,
                "%s: yarn rope needs a factor >= 1 (got %g)", where, c->yarn_factor);
    /* The dims to interpolate are log(original / (beta * 2 pi)) / log(rope_theta) (times
     * d / 2): beta must be > 0 and rope_theta must not be 1. */
    INA_REQUIRE(c->rope_theta != 1, INA_ERR_FORMAT,
                "%s: yarn rope needs a rope_theta other than 1 (its correction range divides by "
                "ln(rope_theta))", where);
    INA_REQUIRE(c->yarn_beta_fast > 0 && c->yarn_beta_slow > 0, INA_ERR_FORMAT,
                "%s: yarn rope needs positive beta_fast and beta_slow (got %g, %g)", where,
                c->yarn_beta_fast, c->yarn_beta_slow);
    /* 0.1 * mscale * ln(factor) + 1 scales the attention: it must stay positive and
     * finite, for the softmax scale and for the cos/sin scale (a float32). */
    const double m = yarn_get_mscale(c->yarn_factor, c->yarn_mscale);
    const double m_all = yarn_get_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
    const double scale = ina_cfg_softmax_scale(c), af = yarn_attention_factor(c);
    INA_REQUIRE(isfinite(m) && m > 0 && isfinite(m_all) && m_all > 0, INA_ERR_FORMAT,
                "%s: yarn mscale %g and mscale_all_dim %g with factor %g give an attention "
                "scale that is not positive and finite (0.1 * mscale * ln(factor) + 1 must be)",
                where, c->yarn_mscale, c->yarn_mscale_all_dim, c->yarn_factor);
    INA_REQUIRE(isfinite(scale) && scale > 0 && af >= FLT_MIN && af <= FLT_MAX, INA_ERR_FORMAT,
                "%s: yarn gives a softmax scale of %g and an attention factor of %g: both must "
                "be positive and finite (in float32 for the attention factor)",
                where, scale, af);
  }
#undef POSITIVE
#undef POSITIVE_KEY
fail:
  return st;
}

/* ---- built-in configurations ------------------------------------------------------ */

static const char *const builtin_names[] = {"tiny", "v2-lite", "v3-layers", "v3.2-tiny", "v3.2-layers", NULL};

const char *const *ina_model_config_builtin_names(void) { return builtin_names; }

static void base_v3(ina_model_config_t *c) {
  memset(c, 0, sizeof *c);
  c->arch = INA_ARCH_DEEPSEEK_V3;
  c->scoring = INA_SCORING_SIGMOID_NOAUX_TC;
  c->norm_topk_prob = 1;
  c->routed_scaling_factor = 2.5;
  c->rms_norm_eps = 1e-6;
  c->rope_layout = INA_ROPE_PAIRS;
  c->rope_theta = 10000.0;
  c->yarn_attention_factor = -1.0;
  c->yarn_truncate = 1;
  c->bos_token_id = 0;
  c->eos_token_id = 1;
  c->fp8_block_rows = c->fp8_block_cols = 128;
}

static void set_yarn(ina_model_config_t *c, double factor, int32_t original, double mscale) {
  c->rope_yarn = 1;
  c->yarn_factor = factor;
  c->yarn_original_max_position = original;
  c->yarn_beta_fast = 32.0;
  c->yarn_beta_slow = 1.0;
  c->yarn_mscale = mscale;
  c->yarn_mscale_all_dim = mscale;
  c->max_position_embeddings = (int32_t)(factor * original);
}

ina_status_t ina_model_config_builtin(const char *name, ina_model_config_t *c) {
  if (!name || !c) return INA_ERR_INVALID_ARGUMENT;
  if (strcmp(name, "tiny") == 0) {
    /* A few MB: every feature of V3 (q LoRA, YaRN, dense + MoE layers, groups, shared
     * expert) at toy sizes, with an odd head count. */
    base_v3(c);
    c->vocab_size = 1024;
    c->hidden_size = 128;
    c->intermediate_size = 256;
    c->moe_intermediate_size = 64;
    c->num_layers = 4;
    c->num_heads = 3;
    c->q_lora_rank = 96;
    c->kv_lora_rank = 64;
    c->qk_nope_head_dim = 32;
    c->qk_rope_head_dim = 16;
    c->v_head_dim = 32;
    c->n_routed_experts = 8;
    c->num_experts_per_tok = 2;
    c->n_shared_experts = 1;
    c->n_group = 4;
    c->topk_group = 2;
    c->first_k_dense_replace = 1;
    set_yarn(c, 4.0, 1024, 1.0);
    return INA_OK;
  }
  if (strcmp(name, "v2-lite") == 0) {
    /* DeepSeek-V2-Lite's shapes (15.7B parameters). */
    base_v3(c);
    c->arch = INA_ARCH_DEEPSEEK_V2;
    c->scoring = INA_SCORING_SOFTMAX_GREEDY;
    c->norm_topk_prob = 0;
    c->routed_scaling_factor = 1.0;
    c->vocab_size = 102400;
    c->hidden_size = 2048;
    c->intermediate_size = 10944;
    c->moe_intermediate_size = 1408;
    c->num_layers = 27;
    c->num_heads = 16;
    c->q_lora_rank = 0;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    c->n_routed_experts = 64;
    c->num_experts_per_tok = 6;
    c->n_shared_experts = 2;
    c->n_group = 1;
    c->topk_group = 1;
    c->first_k_dense_replace = 1;
    c->bos_token_id = 100000;
    c->eos_token_id = 100001;
    set_yarn(c, 40.0, 4096, 0.707);
    return INA_OK;
  }
  if (strcmp(name, "v3.2-tiny") == 0 || strcmp(name, "v3.2-layers") == 0) {
    /* DeepSeek-V3.2: tiny's or V3-layers' shapes with a lightning indexer. tiny's keeps
     * 8 tokens per query, fewer than most prompts, so that the choice matters, with an
     * odd head count; the layers' are the release's (64 heads x 128, 2048 tokens). */
    const int small = strcmp(name, "v3.2-tiny") == 0;
    const ina_status_t st = ina_model_config_builtin(small ? "tiny" : "v3-layers", c);
    if (st != INA_OK) return st;
    c->index_topk = small ? 8 : 2048;
    c->index_n_heads = small ? 3 : 64;
    c->index_head_dim = small ? 32 : 128;
    return INA_OK;
  }
  if (strcmp(name, "v3-layers") == 0) {
    /* DeepSeek-V3's shapes with 4 layers: one dense layer, three MoE layers. */
    base_v3(c);
    c->vocab_size = 129280;
    c->hidden_size = 7168;
    c->intermediate_size = 18432;
    c->moe_intermediate_size = 2048;
    c->num_layers = 4;
    c->num_heads = 128;
    c->q_lora_rank = 1536;
    c->kv_lora_rank = 512;
    c->qk_nope_head_dim = 128;
    c->qk_rope_head_dim = 64;
    c->v_head_dim = 128;
    c->n_routed_experts = 256;
    c->num_experts_per_tok = 8;
    c->n_shared_experts = 1;
    c->n_group = 8;
    c->topk_group = 4;
    c->first_k_dense_replace = 1;
    set_yarn(c, 40.0, 4096, 1.0);
    return INA_OK;
  }
  ina_error(INA_LOG_SUBSYS, "unknown built-in model '%s' (tiny, v2-lite, v3-layers, v3.2-tiny, v3.2-layers)", name);
  return INA_ERR_NOT_FOUND;
}

/* ---- derived quantities ----------------------------------------------------------- */

double ina_cfg_softmax_scale(const ina_model_config_t *c) {
  double scale = 1.0 / sqrt((double)ina_cfg_qk_head_dim(c));
  if (c->rope_yarn && c->yarn_mscale_all_dim != 0) {
    double m = yarn_get_mscale(c->yarn_factor, c->yarn_mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

void ina_cfg_rope_inv_freq(const ina_model_config_t *c, float *inv_freq, float *attention_factor) {
  const int dim = c->qk_rope_head_dim, half = dim / 2;
  const float base = (float)c->rope_theta;
  if (!c->rope_yarn) {
    for (int i = 0; i < half; i++) inv_freq[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
    *attention_factor = 1.0f;
    return;
  }
  const double factor = c->yarn_factor;
  const double af = yarn_attention_factor(c);
  /* find_correction_range: the dims whose wavelength falls between beta_fast and
   * beta_slow rotations over the original context get a linear mix of interpolated and
   * extrapolated frequencies. */
  const double two_pi = 6.283185307179586;
  const double orig = (double)c->yarn_original_max_position;
  double low = (dim * log(orig / (c->yarn_beta_fast * two_pi))) / (2 * log((double)c->rope_theta));
  double high = (dim * log(orig / (c->yarn_beta_slow * two_pi))) / (2 * log((double)c->rope_theta));
  if (c->yarn_truncate) {
    low = floor(low);
    high = ceil(high);
  }
  if (low < 0) low = 0;
  if (high > dim - 1) high = dim - 1;
  if (low == high) high += 0.001;
  for (int i = 0; i < half; i++) {
    /* torch computes these in float32 */
    float pos_freq = powf(base, (float)(2 * i) / (float)dim);
    float extrapolation = 1.0f / pos_freq;
    float interpolation = 1.0f / ((float)factor * pos_freq);
    float ramp = ((float)i - (float)low) / (float)(high - low);
    ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
    float extrapolation_factor = 1.0f - ramp;
    inv_freq[i] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  *attention_factor = (float)af;
}

/* ---- saving ----------------------------------------------------------------------- */

static json_t *rope_json(const ina_model_config_t *c) {
  json_t *r = json_object();
  json_object_set_new(r, "rope_theta", json_real(c->rope_theta));
  if (!c->rope_yarn) {
    json_object_set_new(r, "rope_type", json_string("default"));
    return r;
  }
  json_object_set_new(r, "rope_type", json_string("yarn"));
  json_object_set_new(r, "factor", json_real(c->yarn_factor));
  json_object_set_new(r, "original_max_position_embeddings",
                      json_integer(c->yarn_original_max_position));
  json_object_set_new(r, "beta_fast", json_real(c->yarn_beta_fast));
  json_object_set_new(r, "beta_slow", json_real(c->yarn_beta_slow));
  json_object_set_new(r, "mscale", json_real(c->yarn_mscale));
  json_object_set_new(r, "mscale_all_dim", json_real(c->yarn_mscale_all_dim));
  if (c->yarn_attention_factor >= 0)
    json_object_set_new(r, "attention_factor", json_real(c->yarn_attention_factor));
  /* Absent reads as true: a false must be written, or the saved model would rotate
   * differently. */
  json_object_set_new(r, "truncate", json_boolean(c->yarn_truncate));
  return r;
}

ina_status_t ina_model_config_save(const ina_model_config_t *c, const char *path) {
  ina_status_t st = INA_OK;
  const int v3 = c->arch == INA_ARCH_DEEPSEEK_V3;
  json_t *o = json_object();
  INA_CHECK_ALLOC(o);
  const int v32 = v3 && ina_cfg_has_indexer(c);
  json_object_set_new(o, "architectures",
                      json_pack("[s]", v32  ? "DeepseekV32ForCausalLM"
                                       : v3 ? "DeepseekV3ForCausalLM"
                                            : "DeepseekV2ForCausalLM"));
  json_object_set_new(o, "model_type", json_string(v32 ? "deepseek_v32" : v3 ? "deepseek_v3" : "deepseek_v2"));
  if (v32) {
    json_object_set_new(o, "index_topk", json_integer(c->index_topk));
    json_object_set_new(o, "index_n_heads", json_integer(c->index_n_heads));
    json_object_set_new(o, "index_head_dim", json_integer(c->index_head_dim));
  }
  json_object_set_new(o, "vocab_size", json_integer(c->vocab_size));
  json_object_set_new(o, "hidden_size", json_integer(c->hidden_size));
  json_object_set_new(o, "intermediate_size", json_integer(c->intermediate_size));
  json_object_set_new(o, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
  json_object_set_new(o, "num_hidden_layers", json_integer(c->num_layers));
  json_object_set_new(o, "num_attention_heads", json_integer(c->num_heads));
  json_object_set_new(o, "num_key_value_heads", json_integer(c->num_heads));
  json_object_set_new(o, "q_lora_rank", c->q_lora_rank ? json_integer(c->q_lora_rank) : json_null());
  json_object_set_new(o, "kv_lora_rank", json_integer(c->kv_lora_rank));
  json_object_set_new(o, "qk_nope_head_dim", json_integer(c->qk_nope_head_dim));
  json_object_set_new(o, "qk_rope_head_dim", json_integer(c->qk_rope_head_dim));
  json_object_set_new(o, "v_head_dim", json_integer(c->v_head_dim));
  json_object_set_new(o, "n_routed_experts", json_integer(c->n_routed_experts));
  json_object_set_new(o, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
  json_object_set_new(o, "n_shared_experts", json_integer(c->n_shared_experts));
  json_object_set_new(o, "n_group", json_integer(c->n_group));
  json_object_set_new(o, "topk_group", json_integer(c->topk_group));
  json_object_set_new(o, "first_k_dense_replace", json_integer(c->first_k_dense_replace));
  json_object_set_new(o, "norm_topk_prob", json_boolean(c->norm_topk_prob));
  json_object_set_new(o, "routed_scaling_factor", json_real(c->routed_scaling_factor));
  json_object_set_new(o, "topk_method",
                      json_string(c->scoring == INA_SCORING_SIGMOID_NOAUX_TC ? "noaux_tc"
                                  : c->scoring == INA_SCORING_SOFTMAX_GROUP_GREEDY
                                      ? "group_limited_greedy"
                                      : "greedy"));
  json_object_set_new(o, "scoring_func",
                      json_string(c->scoring == INA_SCORING_SIGMOID_NOAUX_TC ? "sigmoid" : "softmax"));
  json_object_set_new(o, "rms_norm_eps", json_real(c->rms_norm_eps));
  json_object_set_new(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
  json_object_set_new(o, "attention_bias", json_boolean(c->attention_bias));
  if (!v3) json_object_set_new(o, "mlp_bias", json_boolean(c->mlp_bias));
  json_object_set_new(o, "max_position_embeddings", json_integer(c->max_position_embeddings));
  json_object_set_new(o, "hidden_act", json_string("silu"));
  if (c->bos_token_id >= 0) json_object_set_new(o, "bos_token_id", json_integer(c->bos_token_id));
  if (c->eos_token_id >= 0) json_object_set_new(o, "eos_token_id", json_integer(c->eos_token_id));
  if (v3) json_object_set_new(o, "rope_interleave", json_boolean(c->rope_layout == INA_ROPE_PAIRS));
  json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
  json_object_set_new(o, "rope_parameters", rope_json(c));
  if (c->fp8_block_scaled)
    json_object_set_new(o, "quantization_config",
                        json_pack("{s:s, s:s, s:s, s:[i,i]}", "quant_method", "fp8", "fmt", "e4m3",
                                  "activation_scheme", "dynamic", "weight_block_size",
                                  c->fp8_block_rows, c->fp8_block_cols));
  INA_REQUIRE(json_dump_file(o, path, JSON_INDENT(2) | JSON_SORT_KEYS) == 0, INA_ERR_IO,
              "cannot write %s", path);
fail:
  json_decref(o);
  return st;
}

ina_router_config_t ina_cfg_router_config(const ina_model_config_t *c) {
  ina_router_config_t rc = INA_ROUTER_CONFIG_INIT;
  rc.method = c->scoring == INA_SCORING_SIGMOID_NOAUX_TC      ? INA_ROUTER_SIGMOID_NOAUX_TC
              : c->scoring == INA_SCORING_SOFTMAX_GROUP_GREEDY ? INA_ROUTER_SOFTMAX_GROUP_GREEDY
                                                               : INA_ROUTER_SOFTMAX_GREEDY;
  rc.num_experts = c->n_routed_experts;
  rc.top_k = c->num_experts_per_tok;
  rc.n_group = c->n_group;
  rc.topk_group = c->topk_group;
  rc.norm_topk_prob = c->norm_topk_prob;
  rc.routed_scaling_factor = (float)c->routed_scaling_factor;
  return rc;
}
