/* MoE router, CPU reference: from the router gate's logits to each token's experts and
 * their combine weights, reproducing Hugging Face transformers (5.x) DeepSeek routing.
 *
 * Methods, as transformers computes them (models/deepseek_v{2,3}/modeling_deepseek_v{2,3}.py):
 *
 *   INA_ROUTER_SIGMOID_NOAUX_TC (DeepseekV3TopkRouter, topk_method "noaux_tc"):
 *     scores = sigmoid(logits); choice = scores + correction_bias;
 *     group score = sum of the two largest choice scores of the group;
 *     keep the topk_group best groups; the choice scores of the other experts become
 *     -inf (transformers 5.x) or 0.0 (when noaux_mask_zero is set: DeepSeek's own
 *     modeling_deepseek.py and transformers 4.x);
 *     ids = top_k of the masked choice scores; weights = scores[ids] (no bias);
 *     if norm_topk_prob: weights /= (sum(weights) + 1e-20); then weights *= routed_scaling_factor.
 *
 *   INA_ROUTER_SOFTMAX_GREEDY (DeepseekV2TopkRouter, "greedy"):
 *     scores = softmax(logits) in fp32; ids = top_k of scores;
 *     weights = scores[ids] * routed_scaling_factor.
 *
 *   INA_ROUTER_SOFTMAX_GROUP_GREEDY (DeepseekV2TopkRouter, "group_limited_greedy"):
 *     scores = softmax(logits); group score = max score of the group; keep the topk_group
 *     best groups; the scores of the other experts become 0.0; ids = top_k of the masked
 *     scores; weights = scores[ids] * routed_scaling_factor.
 *
 *   DeepSeek-V2 differs from V3 in the weights: transformers' V2 router never normalizes
 *   (norm_topk_prob is ignored by both softmax methods) and always multiplies by
 *   routed_scaling_factor. (DeepSeek's own V2 code normalized when norm_topk_prob and
 *   top_k > 1 and then skipped the scaling; the published V2 / V2-Lite configs set
 *   norm_topk_prob = false, where both agree.) The softmax methods ignore
 *   noaux_mask_zero; GREEDY also ignores n_group and topk_group.
 *
 * Ordering and ties: a token's experts come out in descending order of the score they
 * were chosen by (the masked choice score, bias included, for NOAUX_TC; the masked
 * softmax score for the V2 methods). Equal scores, for groups and for experts, go to the
 * lower index. torch.topk leaves both the order (sorted=False) and ties unspecified, so
 * compare with transformers as sets. NaN logits give valid, distinct ids whose choice is
 * unspecified.
 *
 * Numerics: fp32 throughout, like torch (sigmoid as 1 / (1 + exp(-x)); softmax as
 * exp(x - max) times the reciprocal of the sum, the sum taken over 8 interleaved float
 * lanes like torch's vectorized reduction). Results agree with torch to a few ulp, not
 * bit for bit (torch's vectorized exp differs from libm's).
 *
 * Thread safety: the functions are reentrant; distinct calls share no state. */
#ifndef INA_MOE_EP_ROUTER_H
#define INA_MOE_EP_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ina_router_method {
  INA_ROUTER_SOFTMAX_GREEDY = 0,       /* V2 topk_method "greedy" */
  INA_ROUTER_SOFTMAX_GROUP_GREEDY = 1, /* V2 "group_limited_greedy": group score = max */
  INA_ROUTER_SIGMOID_NOAUX_TC = 2,     /* V3 "noaux_tc": sigmoid, + e_score_correction_bias for choice, group score = sum of top-2 */
  INA_ROUTER_METHOD_COUNT
} ina_router_method_t;

typedef struct ina_router_config {
  size_t struct_size; /* sizeof(ina_router_config_t), set by the INIT macro */
  uint32_t version;   /* 1 */
  ina_router_method_t method;
  int32_t num_experts; /* routed experts (n_routed_experts), >= 1 */
  int32_t top_k;       /* experts per token (num_experts_per_tok), 1..num_experts */
  int32_t n_group;     /* expert groups; divides num_experts (group methods only) */
  int32_t topk_group;  /* groups kept per token, 1..n_group (group methods only) */
  int norm_topk_prob;  /* nonzero: normalize the chosen weights (NOAUX_TC only, see above) */
  float routed_scaling_factor; /* finite, > 0 */
  int noaux_mask_zero; /* NOAUX_TC: nonzero fills dropped groups' choice scores with 0.0
                          instead of -inf (DeepSeek remote code / transformers 4.x) */
} ina_router_config_t;

#define INA_ROUTER_CONFIG_INIT \
  {sizeof(ina_router_config_t), 1, INA_ROUTER_SIGMOID_NOAUX_TC, 0, 0, 1, 1, 0, 1.0f, 0}

/* Checks the config: struct_size / version, method, num_experts >= 1,
 * 1 <= top_k <= num_experts, routed_scaling_factor finite and > 0, and for the group
 * methods: n_group >= 1 dividing num_experts, 1 <= topk_group <= n_group,
 * top_k <= topk_group * (num_experts / n_group) (the experts left in the kept groups),
 * and for NOAUX_TC at least 2 experts per group (the group score sums the top 2).
 * Returns INA_ERR_INVALID_ARGUMENT with a message naming the field and its value. */
ina_status_t ina_router_config_validate(const ina_router_config_t *cfg);

/* Routes `tokens` tokens.
 *   logits          [tokens, num_experts] f32: the router gate's output, computed in fp32.
 *   correction_bias [num_experts] f32, finite: e_score_correction_bias; required for
 *                   NOAUX_TC and must be NULL for the other methods.
 *   ids             [tokens, top_k] out: expert ids, descending by choice score.
 *   weights         [tokens, top_k] out: combine weights matching ids.
 * tokens == 0 is a no-op (pointers may then be NULL). Caller owns all buffers; the
 * function allocates O(num_experts) scratch. On error the outputs are unspecified. */
ina_status_t ina_router_ref(const ina_router_config_t *cfg, const float *logits,
                            const float *correction_bias, int64_t tokens, int32_t *ids,
                            float *weights);

/* How close each token's routing came to a different choice: margin[t] is the smallest
 * gap, over every choice the router makes for the token (the kept groups against the
 * best dropped one, then the top_k experts against the best one left out), between the
 * last kept and the first rejected score, in the units of that choice (choice scores
 * with the bias for NOAUX_TC, group scores, softmax scores); +inf when nothing was left
 * out. A perturbation of the logits that moves no choice score by margin / 4 (a NOAUX_TC
 * group score sums two of them) leaves the ids' set unchanged. Arguments and errors as ina_router_ref. */
ina_status_t ina_router_ref_margins(const ina_router_config_t *cfg, const float *logits,
                                    const float *correction_bias, int64_t tokens, float *margin);

#ifdef __cplusplus
}
#endif
#endif
