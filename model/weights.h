/* The weights of a DeepSeek-V2/V3 model, in their stored dtype (f32, bf16, f16, or fp8
 * e4m3 with 128x128 block scales): loaded from a Hugging Face checkpoint as views into
 * its mapping, or made from a seed.
 *
 * Every tensor of the model is described once by a spec list (ina_weight_specs): its
 * Hugging Face name, shape, role and where it goes in ina_weights_t. Loading, random
 * initialization and `ina model init` all walk that list, so they cannot disagree.
 *
 * Sharding: ina_shard_t selects the routed experts a rank holds (expert parallelism):
 * only their tensors are mapped or generated. Tensor parallel slicing is declared here
 * for later versions and must be tp_size = 1 now.
 *
 * Ownership: ina_weights_release frees owned tensors and closes the checkpoint.
 * Thread safety: read-only after loading. */
#ifndef INA_MODEL_WEIGHTS_H
#define INA_MODEL_WEIGHTS_H

#include <stdint.h>

#include "core/safetensors.h"
#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ina_linear {
  ina_tensor_t weight;    /* [out, in] */
  ina_tensor_t scale_inv; /* fp8 weights only: f32 [ceil(out/br), ceil(in/bc)]; else empty */
  ina_tensor_t bias;      /* [out] or empty */
  int32_t block_rows, block_cols;
} ina_linear_t;

typedef struct ina_mlp_weights {
  ina_linear_t gate, up, down; /* SiLU(gate(x)) * up(x) -> down */
} ina_mlp_weights_t;

typedef struct ina_layer_weights {
  ina_tensor_t input_norm, post_attention_norm;
  ina_linear_t q_proj;   /* when q_lora_rank == 0 */
  ina_linear_t q_a_proj; /* when q_lora_rank > 0 */
  ina_tensor_t q_a_norm;
  ina_linear_t q_b_proj;
  ina_linear_t kv_a_proj; /* -> kv_lora_rank + qk_rope_head_dim */
  ina_tensor_t kv_a_norm;
  ina_linear_t kv_b_proj; /* kv_lora_rank -> heads x (qk_nope + v) */
  ina_linear_t o_proj;
  int is_moe;
  ina_mlp_weights_t mlp;     /* dense MLP, or the shared experts of a MoE layer */
  int has_shared;            /* MoE layer with shared experts (or V2 mlp_bias, see weights.c) */
  ina_tensor_t router;       /* [n_routed_experts, hidden] */
  ina_tensor_t router_bias;  /* [n_routed_experts] (V3 e_score_correction_bias) */
  ina_mlp_weights_t *experts; /* [shard expert_end - expert_begin] */
} ina_layer_weights_t;

typedef struct ina_shard {
  size_t struct_size;
  uint32_t version;
  int32_t tp_rank, tp_size;         /* tensor parallel slice (tp_size 1 in this version) */
  int32_t expert_begin, expert_end; /* routed experts held; expert_end < 0: all */
} ina_shard_t;

#define INA_SHARD_INIT {sizeof(ina_shard_t), 1, 0, 1, 0, -1}

typedef struct ina_weights {
  ina_model_config_t config;
  int32_t expert_begin, expert_end;
  ina_tensor_t embed;      /* [vocab, hidden] */
  ina_tensor_t final_norm; /* [hidden] */
  ina_linear_t lm_head;    /* [vocab, hidden]; shares embed's data when tied */
  ina_layer_weights_t *layers;
  ina_checkpoint_t *checkpoint; /* loaded weights are views into it; NULL for random */
} ina_weights_t;

/* The role of a tensor, which decides its random distribution and whether it is stored
 * in FP8 in a block-scaled checkpoint. */
typedef enum ina_weight_role {
  INA_WEIGHT_LINEAR,      /* nn.Linear weight, FP8 in block-scaled checkpoints */
  INA_WEIGHT_LINEAR_BF16, /* nn.Linear weight kept in high precision (lm_head) */
  INA_WEIGHT_EMBEDDING,
  INA_WEIGHT_NORM,
  INA_WEIGHT_ROUTER,
  INA_WEIGHT_ROUTER_BIAS,
  INA_WEIGHT_BIAS, /* nn.Linear bias (attention_bias) */
} ina_weight_role_t;

typedef struct ina_weight_spec {
  char name[128];
  int ndim;
  int64_t shape[2];
  ina_weight_role_t role;
  ina_tensor_t *tensor; /* destination (for linears: &linear->weight) */
  ina_linear_t *linear; /* non-NULL for linear weights (scale_inv goes there) */
  int32_t layer;        /* -1 for embeddings, final norm and head */
  int32_t expert;       /* routed expert index, or -1 */
  int32_t expert_proj;  /* 0 gate, 1 up, 2 down for routed experts */
} ina_weight_spec_t;

/* Allocate the layer arrays of w for cfg and shard, and list every tensor it needs into
 * a malloc'ed array (*specs, *count; the caller frees it). Tied embeddings list no
 * lm_head. */
ina_status_t ina_weights_prepare(ina_weights_t *w, const ina_model_config_t *cfg,
                                 const ina_shard_t *shard, ina_weight_spec_t **specs,
                                 int32_t *count);

/* List the tensors of an already prepared w (pointers into w); the caller frees *specs.
 * Only takes addresses: w is not modified. */
ina_status_t ina_weight_specs(ina_weights_t *w, ina_weight_spec_t **specs, int32_t *count);

/* Load from a checkpoint directory (config.json + safetensors). shard may be NULL (all). */
ina_status_t ina_weights_load(const char *dir, const ina_shard_t *shard, ina_weights_t *w);

/* Seeded random weights for cfg stored as `dtype` (f32, bf16, or fp8_e4m3 for the
 * LINEAR role with 128x128 block scales; other roles then bf16). The values depend only
 * on (seed, tensor name, element index), not on the shard or thread count. */
ina_status_t ina_weights_random(const ina_model_config_t *cfg, uint64_t seed, ina_dtype_t dtype,
                                const ina_shard_t *shard, ina_weights_t *w);

/* What ina_weights_random(cfg, seed, dtype, shard, w) makes, without the data: w's
 * config (with the FP8 block scaling of dtype), expert range and layer arrays, every
 * tensor empty. For an engine that generates the same weights in its own memory. */
ina_status_t ina_weights_random_shell(const ina_model_config_t *cfg, ina_dtype_t dtype, const ina_shard_t *shard,
                                      ina_weights_t *w);

/* Write w (all experts) as a Hugging Face checkpoint: config.json + model.safetensors. */
ina_status_t ina_weights_save(const ina_weights_t *w, const char *dir);

/* Free owned tensors and close the checkpoint; w becomes empty. NULL is a no-op. */
void ina_weights_release(ina_weights_t *w);

#ifdef __cplusplus
}
#endif
#endif
