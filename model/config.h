/* DeepSeek-V2 / V3 model configuration: what ina reads from a Hugging Face config.json,
 * and the built-in named configurations used with seeded random weights.
 *
 * Thread safety: plain data; parsing functions are thread-safe. */
#ifndef INA_MODEL_CONFIG_H
#define INA_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "moe_ep/router.h"

#ifdef __cplusplus
extern "C" {
#endif

struct json_t; /* jansson's */

typedef enum ina_arch { INA_ARCH_DEEPSEEK_V2 = 2, INA_ARCH_DEEPSEEK_V3 = 3 } ina_arch_t;

/* How the rope half of q and k is laid out before rotation.
 * PAIRS: dims (2i, 2i+1) rotate together by frequency i (DeepSeek-V2's complex form,
 *        and V3 with rope_interleave = true, which HF computes as a de-interleave
 *        followed by rotate_half: the same values in another order, so the same
 *        attention scores).
 * HALVES: dims (i, i + d/2) rotate together (rotate_half on un-interleaved weights). */
typedef enum ina_rope_layout { INA_ROPE_PAIRS = 0, INA_ROPE_HALVES = 1 } ina_rope_layout_t;

typedef enum ina_scoring {
  INA_SCORING_SOFTMAX_GREEDY = 0,       /* V2 topk_method "greedy" */
  INA_SCORING_SOFTMAX_GROUP_GREEDY = 1, /* V2 topk_method "group_limited_greedy" */
  INA_SCORING_SIGMOID_NOAUX_TC = 2,     /* V3 "noaux_tc" */
} ina_scoring_t;

typedef struct ina_model_config {
  ina_arch_t arch;
  int32_t vocab_size;
  int32_t hidden_size;
  int32_t intermediate_size;     /* dense MLP */
  int32_t moe_intermediate_size; /* per routed expert; shared experts use n_shared x this */
  int32_t num_layers;
  int32_t num_heads;
  int32_t q_lora_rank; /* 0 when q_lora_rank is null (q_proj instead of q_a/q_b) */
  int32_t kv_lora_rank;
  int32_t qk_nope_head_dim;
  int32_t qk_rope_head_dim;
  int32_t v_head_dim;
  int32_t n_routed_experts; /* 0: no MoE layers */
  int32_t num_experts_per_tok;
  int32_t n_shared_experts;
  int32_t n_group;    /* 1 when not grouped */
  int32_t topk_group; /* 1 when not grouped */
  int32_t first_k_dense_replace;
  int norm_topk_prob;
  double routed_scaling_factor;
  ina_scoring_t scoring;
  double rms_norm_eps;
  int tie_word_embeddings;
  int attention_bias;
  int mlp_bias; /* V2: biases on the dense MLP and shared experts (not routed experts) */
  int32_t max_position_embeddings;
  int32_t bos_token_id; /* -1 when absent */
  int32_t eos_token_id; /* -1 when absent */
  /* RoPE */
  ina_rope_layout_t rope_layout;
  double rope_theta;
  int rope_yarn; /* 0: default rope */
  double yarn_factor;
  double yarn_beta_fast, yarn_beta_slow;
  double yarn_mscale, yarn_mscale_all_dim; /* 0 when absent */
  double yarn_attention_factor;            /* < 0 when absent (derived) */
  int32_t yarn_original_max_position;
  int yarn_truncate;
  /* DeepSeek-V3.2 (model_type deepseek_v32): V3 with DeepSeek Sparse Attention, a
   * lightning indexer in every attention layer that keeps the index_topk best cached
   * tokens of each query for MLA. index_topk 0: no indexer (V2, V3). */
  int32_t index_topk;
  int32_t index_n_heads;
  int32_t index_head_dim;
  /* Weights: FP8 block-scaled checkpoint (quantization_config fp8, 128x128 blocks). */
  int fp8_block_scaled;
  int32_t fp8_block_rows, fp8_block_cols;
} ina_model_config_t;

/* Parse a Hugging Face config.json (DeepseekV2ForCausalLM / DeepseekV3ForCausalLM, by
 * model_type or architectures). Unsupported features (other rope types, activations,
 * scoring functions) give INA_ERR_UNSUPPORTED; a missing required key gives
 * INA_ERR_NOT_FOUND; ill-typed or out-of-range values give INA_ERR_FORMAT; each message
 * names the file and the key. */
ina_status_t ina_model_config_load(const char *config_json_path, ina_model_config_t *out);
/* The same over a config.json already parsed (a JSON object; anything else is
 * INA_ERR_FORMAT). `where` names it in messages (NULL: "config.json"). */
ina_status_t ina_model_config_from_json(const struct json_t *root, const char *where,
                                        ina_model_config_t *out);
/* Cross-field validation (positive sizes, groups dividing experts, ...). */
ina_status_t ina_model_config_validate(const ina_model_config_t *cfg, const char *where);

/* Built-in configurations: "tiny", "v2-lite", "v3-layers". INA_ERR_NOT_FOUND otherwise. */
ina_status_t ina_model_config_builtin(const char *name, ina_model_config_t *out);
/* NULL-terminated list of built-in names. */
const char *const *ina_model_config_builtin_names(void);

/* Write the configuration as a Hugging Face config.json that transformers loads. */
ina_status_t ina_model_config_save(const ina_model_config_t *cfg, const char *path);

/* Derived quantities. */
static inline int32_t ina_cfg_qk_head_dim(const ina_model_config_t *c) {
  return c->qk_nope_head_dim + c->qk_rope_head_dim;
}
/* The router settings of the model's MoE layers (method, experts, groups, scaling). */
ina_router_config_t ina_cfg_router_config(const ina_model_config_t *c);

/* 1 for DeepSeek-V3.2: every attention layer has a lightning indexer. */
static inline int ina_cfg_has_indexer(const ina_model_config_t *c) { return c->index_topk > 0; }

static inline int ina_cfg_layer_is_moe(const ina_model_config_t *c, int32_t layer) {
  return c->n_routed_experts > 0 && layer >= c->first_k_dense_replace;
}
/* Softmax scale of attention: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
 * under YaRN when mscale_all_dim is set (as HF's yarn_apply_mscale). */
double ina_cfg_softmax_scale(const ina_model_config_t *c);
/* Inverse frequencies (qk_rope_head_dim / 2 of them) and the cos/sin scale, exactly as
 * HF computes them (default rope or YaRN). */
void ina_cfg_rope_inv_freq(const ina_model_config_t *c, float *inv_freq, float *attention_factor);

#ifdef __cplusplus
}
#endif
#endif
