/* The weights of a DeepSeek-V2/V3 model, in their stored dtype (f32, bf16, f16, or fp8
 * e4m3 with 128x128 block scales): loaded from a Hugging Face checkpoint as views into
 * its mapping, or made from a seed.
 *
 * Every tensor of the model is described once by a spec list (ina_weight_specs): its
 * Hugging Face name, shape, role and where it goes in ina_weights_t. Loading, random
 * initialization and `ina model init` all walk that list, so they cannot disagree.
 *
 * Sharding: ina_shard_t selects the routed experts a rank holds (expert parallelism):
 * only their tensors are mapped or generated. It also selects a tensor-parallel slice:
 * with T = tp_size, r = tp_rank, H = num_attention_heads (H % T == 0), rank r holds the
 * heads [h0, h0 + Hl), Hl = H / T, h0 = r * Hl, and 1/T of every MLP's intermediate
 * channels [i0, i0 + Il), Il = I / T, i0 = r * Il (I % T == 0; I is intermediate_size for
 * dense MLPs, moe_intermediate_size x n_shared_experts for shared experts,
 * moe_intermediate_size for each held routed expert):
 *   q_proj, q_b_proj  rows [h0 * qk, (h0 + Hl) * qk)   qk = qk_nope + qk_rope head dims
 *   kv_b_proj         rows [h0 * nv, (h0 + Hl) * nv)   nv = qk_nope + v head dims
 *   o_proj            columns [h0 * v, (h0 + Hl) * v)  v = v_head_dim
 *   gate, up          rows [i0, i0 + Il)
 *   down              columns [i0, i0 + Il)
 * Biases follow their weight's rows; the biases of o_proj and down (whose outputs are
 * partial sums the engine adds up over the ranks) are held whole by rank 0 and empty on
 * the others. Everything else (embeddings, norms, q_a_proj, kv_a_proj_with_mqa, router,
 * lm_head) is replicated whole. FP8 slices must start and end on block boundaries (or
 * at the tensor's end); their scale_inv is sliced with them. Row slices of a loaded
 * checkpoint are views into its mapping; column slices are owned copies.
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
  /* DeepSeek-V3.2's lightning indexer (ina_cfg_has_indexer), whole on every rank: */
  ina_linear_t index_wq_b;          /* q_lora_rank -> index_n_heads x index_head_dim */
  ina_linear_t index_wk;            /* hidden -> index_head_dim */
  ina_tensor_t index_k_norm;        /* LayerNorm(index_head_dim) weight, eps 1e-6 */
  ina_tensor_t index_k_norm_bias;   /* and its bias */
  ina_tensor_t index_weights_proj;  /* [index_n_heads, hidden]: each head's weight per token */
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
  int32_t tp_rank, tp_size;         /* tensor-parallel slice r of T (0 <= r < T) */
  int32_t expert_begin, expert_end; /* routed experts held; expert_end < 0: all */
} ina_shard_t;

#define INA_SHARD_INIT {sizeof(ina_shard_t), 1, 0, 1, 0, -1}

typedef struct ina_weights {
  ina_model_config_t config;
  int32_t expert_begin, expert_end;
  int32_t tp_rank, tp_size; /* tensor-parallel slice held (0 of 1: whole) */
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
  int64_t shape[2]; /* of the tensor in w: the tensor-parallel slice */
  ina_weight_role_t role;
  ina_tensor_t *tensor; /* destination (for linears: &linear->weight) */
  ina_linear_t *linear; /* non-NULL for linear weights (scale_inv goes there) */
  int32_t layer;        /* -1 for embeddings, final norm and head */
  int32_t expert;       /* routed expert index, or -1 */
  int32_t expert_proj;  /* 0 gate, 1 up, 2 down for routed experts */
  /* Tensor parallelism: the whole tensor (as the checkpoint stores it and random values
   * are drawn for) has full_shape. slice_dim -1: w holds it whole (shape == full_shape);
   * 0: rows [slice_begin, slice_begin + shape[0]); 1: columns [slice_begin, slice_begin
   * + shape[1]). A rank that holds a tensor empty (a row-parallel bias off rank 0) does
   * not list it. */
  int64_t full_shape[2];
  int32_t slice_dim;
  int64_t slice_begin;
} ina_weight_spec_t;

/* Allocate the layer arrays of w for cfg and shard, and list every tensor it needs into
 * a malloc'ed array (*specs, *count; the caller frees it). Tied embeddings list no
 * lm_head. A tp_rank outside [0, tp_size), or heads or an intermediate size that
 * tp_size does not divide, give INA_ERR_INVALID_ARGUMENT naming the tensor and sizes. */
ina_status_t ina_weights_prepare(ina_weights_t *w, const ina_model_config_t *cfg,
                                 const ina_shard_t *shard, ina_weight_spec_t **specs,
                                 int32_t *count);

/* List the tensors of an already prepared w (pointers into w); the caller frees *specs.
 * Only takes addresses: w is not modified. */
ina_status_t ina_weight_specs(ina_weights_t *w, ina_weight_spec_t **specs, int32_t *count);

/* Load from a checkpoint directory (config.json + safetensors). shard may be NULL (all
 * experts, whole tensors). An fp8 slice boundary inside a block gives
 * INA_ERR_UNSUPPORTED naming the tensor, dimension, boundary and block size. */
ina_status_t ina_weights_load(const char *dir, const ina_shard_t *shard, ina_weights_t *w);

/* Seeded random weights for cfg stored as `dtype` (f32, bf16, or fp8_e4m3 for the
 * LINEAR role with 128x128 block scales; other roles then bf16). The values depend only
 * on (seed, tensor name, element index in the whole tensor), not on the shard or thread
 * count: a slice holds exactly the whole tensor's values (and fp8 scales) at its
 * positions. Shard errors as ina_weights_prepare and ina_weights_load. */
ina_status_t ina_weights_random(const ina_model_config_t *cfg, uint64_t seed, ina_dtype_t dtype,
                                const ina_shard_t *shard, ina_weights_t *w);

/* What ina_weights_random(cfg, seed, dtype, shard, w) makes, without the data: w's
 * config (with the FP8 block scaling of dtype), expert range, tensor-parallel slice and
 * layer arrays, every tensor empty; it fails where ina_weights_random would on the
 * shard. For an engine that generates the same weights in its own memory (the spec
 * list of w then gives each tensor's slice of the whole). */
/* Bytes the random weights of `dtype` take in the shard `shell` describes (a shell from
 * ina_weights_random_shell: shapes, no data); -1 on error. */
int64_t ina_weights_random_bytes(const ina_weights_t *shell, ina_dtype_t dtype);
ina_status_t ina_weights_random_shell(const ina_model_config_t *cfg, ina_dtype_t dtype, const ina_shard_t *shard,
                                      ina_weights_t *w);

/* Write w (all experts, whole tensors: tp_size 1, else INA_ERR_INVALID_ARGUMENT) as a
 * Hugging Face checkpoint: config.json + model.safetensors. */
ina_status_t ina_weights_save(const ina_weights_t *w, const char *dir);

/* Free owned tensors and close the checkpoint; w becomes empty. NULL is a no-op. */
void ina_weights_release(ina_weights_t *w);

#ifdef __cplusplus
}
#endif
#endif
