#!/usr/bin/env python3
"""Regenerates tests/golden/fixtures/: tiny DeepSeek-V2/V3/V3.2 checkpoints and HF logits.

    python3 tests/golden/make_fixtures.py [--only NAME ...] [--out DIR]

Each fixture is a small model with seeded random weights, saved the way
transformers saves it (or, for FP8, the way the DeepSeek-V3 release stores it),
plus Hugging Face's float32 logits for four prompts; README.md describes the
files. Every fixture is checked on the way out:
  * the plain-numpy forward of numpy_reference.py must match HF to 1e-5,
  * no routing decision, no greedy token and (V3.2) no indexer top-k boundary
    may be a near tie (otherwise a correct engine could pick a different
    expert, token or attended token set); a prompt that comes too close is
    redrawn from the next seed,
  * HF's cached decode must agree with its full forward over the same tokens.
The run is deterministic: the same transformers/torch versions rewrite the
same weights, configs and prompts, and byte-identical logits on the same CPU
(another CPU may differ in the last bits; README.md says more). Add a fixture
with --only NAME.
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_logits  # noqa: E402
import numpy_reference  # noqa: E402

PROMPT_LENGTHS = (1, 5, 9, 13)
MAX_NEW_TOKENS = 6
ROUTING_MARGIN = 1e-4  # smallest score gap at any expert/group choice
ARGMAX_MARGIN = 1e-3   # smallest top1 - top2 logit gap where a token is chosen
# V3.2: smallest gap between a query's k-th and (k+1)-th visible index score, relative to
# the largest |score| that query sees (a boundary among equal scores, such as relu's exact
# zeros, has gap 0 and is always rejected).
INDEXER_MARGIN = 1e-4
NUMPY_TOLERANCE = 1e-5
FP8_BLOCK = 128
FP8_MAX = 448.0

YARN_V3 = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}

V3_BASE = dict(
    vocab_size=192, hidden_size=48, intermediate_size=96, moe_intermediate_size=16,
    num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3,
    q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
    n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2, n_shared_experts=1,
    first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5,
    max_position_embeddings=256, rope_parameters=dict(YARN_V3, rope_theta=10000.0),
    rope_interleave=True, tie_word_embeddings=False, rms_norm_eps=1e-6,
    # Not read by transformers' DeepSeek-V3 (it always routes this way), kept as in the release.
    scoring_func="sigmoid", topk_method="noaux_tc",
)


def v3(**changes):
    return dict(V3_BASE, **changes)


# V3.2 = V3_BASE without rope_interleave (transformers' V3.2 always interleaves MLA's rope)
# plus the indexer.
V32_BASE = dict({k: v for k, v in V3_BASE.items() if k != "rope_interleave"},
                index_n_heads=3, index_head_dim=16, index_topk=4)


def v32(**changes):
    return dict(V32_BASE, **changes)


FIXTURES = [
    {
        "name": "v3_sigmoid",
        "doc": "V3 with q LoRA, odd head count, YaRN (mscale = mscale_all_dim), interleaved rope, "
               "grouped sigmoid routing with correction bias; rms_norm_eps 1e-5 so the fixed 1e-6 of "
               "q_a/kv_a_layernorm is visible",
        "model_type": "deepseek_v3", "storage": "f32", "seed": 1,
        "config": v3(rms_norm_eps=1e-5),
    },
    {
        "name": "v3_noqlora_tied",
        "doc": "V3 without q LoRA, plain rope (no scaling) non-interleaved, tied embeddings, "
               "norm_topk_prob false, 2 shared experts, top-3 from 1 of 2 groups, every layer MoE",
        "model_type": "deepseek_v3", "storage": "f32", "seed": 2,
        "config": v3(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, q_lora_rank=None, rope_parameters={"rope_type": "default",
                     "rope_theta": 10000.0}, rope_interleave=False, tie_word_embeddings=True,
                     norm_topk_prob=False, n_shared_experts=2, num_experts_per_tok=3, n_group=2,
                     topk_group=1, first_k_dense_replace=0, routed_scaling_factor=1.5),
    },
    {
        "name": "v3_yarn_plain",
        "doc": "V3 YaRN without mscale keys (attention_factor = 0.1 ln(factor) + 1 on cos/sin, "
               "softmax scale untouched), non-interleaved rope, rope_theta 50000",
        "model_type": "deepseek_v3", "storage": "f32", "seed": 3,
        "config": v3(rope_parameters={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32,
                                      "rope_theta": 50000.0},
                     rope_interleave=False, num_attention_heads=5, num_key_value_heads=5, vocab_size=160),
    },
    {
        "name": "v3_theta_1e6",
        "doc": "V3 plain rope (no scaling) with rope_theta 1e6, interleaved, 4 heads: a base far from "
               "the default 10000, so a loader or engine that ignores rope_theta moves every position "
               "past the first",
        "model_type": "deepseek_v3", "storage": "f32", "seed": 13,
        "config": v3(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, q_lora_rank=24,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    },
    {
        "name": "v3_mscale",
        "doc": "V3 YaRN with mscale 1.0 != mscale_all_dim 0.707 (attention_factor != 1 on cos/sin, "
               "softmax scale times get_mscale(factor, mscale_all_dim)^2), interleaved rope",
        "model_type": "deepseek_v3", "storage": "f32", "seed": 9,
        "config": v3(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, q_lora_rank=24, max_position_embeddings=128,
                     rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707,
                                      "rope_theta": 10000.0}),
    },
    {
        "name": "v2_softmax",
        "doc": "V2-Lite style: no q LoRA, softmax greedy top-k, 2 shared experts, YaRN with "
               "mscale = mscale_all_dim = 0.707; rms_norm_eps 1e-5",
        "model_type": "deepseek_v2", "storage": "f32", "seed": 4,
        "config": dict(
            vocab_size=192, hidden_size=48, intermediate_size=96, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
            q_lora_rank=None, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1,
            topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0,
            max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
                             "rope_theta": 10000.0},
            # Not read by transformers' DeepSeek-V2, kept as in the release.
            moe_layer_freq=1, scoring_func="softmax",
        ),
    },
    {
        "name": "v2_group",
        "doc": "V2 (236B style): q LoRA, group_limited_greedy (max per group, masked to 0), "
               "routed_scaling_factor 16, YaRN with mscale 0.707 != mscale_all_dim 1.0",
        "model_type": "deepseek_v2", "storage": "f32", "seed": 5,
        "config": dict(
            vocab_size=192, hidden_size=48, intermediate_size=96, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3,
            q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=1,
            first_k_dense_replace=1, topk_method="group_limited_greedy", norm_topk_prob=False,
            routed_scaling_factor=16.0, max_position_embeddings=512, rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 1.0,
                             "rope_theta": 10000.0},
            moe_layer_freq=1, scoring_func="softmax",
        ),
    },
    {
        "name": "v2_norm_topk_ignored",
        "doc": "V2 with norm_topk_prob true, which transformers' V2 router ignores (no renormalization, "
               "scaling always applied); plain rope; tied embeddings",
        "model_type": "deepseek_v2", "storage": "f32", "seed": 6,
        "config": dict(
            vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
            q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
            topk_method="greedy", norm_topk_prob=True, routed_scaling_factor=2.0,
            max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
    },
    {
        "name": "v3_bf16",
        "doc": "like v3_sigmoid, stored in bf16 (e_score_correction_bias stays f32); "
               "logits from HF float32 on the bf16 values",
        "model_type": "deepseek_v3", "storage": "bf16", "seed": 7,
        "config": v3(),
    },
    {
        "name": "v3_fp8",
        "doc": "V3 release format: float8_e4m3fn Linear weights with f32 weight_scale_inv per 128x128 "
               "block (ragged edges: hidden 160, kv_lora_rank 144, intermediate 192), other tensors bf16, "
               "release-style config.json (rope_scaling + rope_theta, quantization_config); "
               "logits from HF float32 on the dequantized weights",
        "model_type": "deepseek_v3", "storage": "fp8", "seed": 8,
        "config": v3(vocab_size=128, hidden_size=160, intermediate_size=192, moe_intermediate_size=32,
                     num_hidden_layers=2, q_lora_rank=96, kv_lora_rank=144),
    },
    # The fixtures below split over 2 and 4 tensor-parallel ranks (heads, intermediates and,
    # for FP8, every slice boundary on a 128 block), for the multi-rank tests.
    {
        "name": "v3_dense",
        "doc": "V3 without routed experts (n_routed_experts 0, so every layer is dense: "
               "first_k_dense_replace = num_hidden_layers), q LoRA, YaRN, 4 heads",
        "model_type": "deepseek_v3", "storage": "f32", "seed": 10,
        "config": v3(vocab_size=128, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                     q_lora_rank=24, intermediate_size=64, n_routed_experts=0, n_shared_experts=0,
                     first_k_dense_replace=3),
    },
    {
        "name": "v3_fp8_tp",
        "doc": "V3 release format (as v3_fp8) that splits 2 and 4 ways: 8 heads of qk 64 + 64 and "
               "v 64, intermediates 512, so each rank's rows or columns are whole 128 blocks; "
               "hidden 160, q_lora_rank 96 and kv_lora_rank 144 leave ragged blocks in the "
               "dimensions that are not split; top-2 of 4 experts, 1 shared, first layer dense",
        "model_type": "deepseek_v3", "storage": "fp8", "seed": 11,
        "config": v3(vocab_size=128, hidden_size=160, intermediate_size=512, moe_intermediate_size=512,
                     num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=8,
                     q_lora_rank=96, kv_lora_rank=144, qk_nope_head_dim=64, qk_rope_head_dim=64,
                     v_head_dim=64, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1),
    },
    {
        "name": "v2_group_bf16",
        "doc": "V2 group_limited_greedy with q LoRA stored in bf16, 8 heads, 2 shared experts; "
               "logits from HF float32 on the bf16 values",
        "model_type": "deepseek_v2", "storage": "bf16", "seed": 12,
        "config": dict(
            vocab_size=160, hidden_size=48, intermediate_size=96, moe_intermediate_size=16,
            num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=8,
            q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            n_routed_experts=8, num_experts_per_tok=3, n_group=4, topk_group=2, n_shared_experts=2,
            first_k_dense_replace=1, topk_method="group_limited_greedy", norm_topk_prob=False,
            routed_scaling_factor=2.0, max_position_embeddings=256, rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                             "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
                             "rope_theta": 10000.0},
            moe_layer_freq=1, scoring_func="softmax",
        ),
    },
    # DeepSeek-V3.2: V3 plus a lightning indexer per layer; MLA attends to its top index_topk
    # visible tokens only. Prompts of 1-13 tokens + 6 generated: index_topk 4 and 6 leave most
    # queries choosing.
    {
        "name": "v32_topk",
        "doc": "V3.2 with q LoRA, 3 heads, indexer of 3 heads x 16 dims (rope on the first 8, "
               "half-split, while MLA's rope is interleaved), index_topk 4; YaRN with mscale 1.0 != "
               "mscale_all_dim 0.707 (attention_factor != 1 on the cos/sin both share); "
               "first layer dense, then MoE",
        "model_type": "deepseek_v32", "storage": "f32", "seed": 14,
        "config": v32(rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                       "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.707,
                                       "rope_theta": 10000.0}),
    },
    {
        "name": "v32_bf16",
        "doc": "V3.2 stored in bf16 (weights_proj and e_score_correction_bias stay f32, as HF keeps "
               "them), 4 indexer heads x 32 dims, index_topk 6, 4 heads, release-style YaRN "
               "(mscale = mscale_all_dim); logits from HF float32 on the stored values",
        "model_type": "deepseek_v32", "storage": "bf16", "seed": 15,
        "config": v32(num_attention_heads=4, num_key_value_heads=4, index_n_heads=4, index_head_dim=32,
                      index_topk=6, vocab_size=160),
    },
    {
        "name": "v32_fp8",
        "doc": "V3.2 in the release format (as v3_fp8): float8_e4m3fn Linear weights, the indexer's "
               "wq_b (160 rows: a ragged block) and wk included, with f32 weight_scale_inv per 128x128 "
               "block; weights_proj, k_norm, router, embeddings and norms bf16; release-style "
               "config.json; 4 indexer heads x 40 dims, index_topk 5",
        "model_type": "deepseek_v32", "storage": "fp8", "seed": 16,
        "config": v32(vocab_size=128, hidden_size=160, intermediate_size=192, moe_intermediate_size=32,
                      num_hidden_layers=2, q_lora_rank=96, kv_lora_rank=144, index_n_heads=4,
                      index_head_dim=40, index_topk=5),
    },
    {
        "name": "v32_topk_large",
        "doc": "V3.2 with index_topk 64, more than any sequence here (at most 18 tokens): every visible "
               "token is selected, so it equals dense MLA (HF's top-k also returns masked future "
               "positions, which its causal mask keeps out); 2 layers, 4 heads",
        "model_type": "deepseek_v32", "storage": "f32", "seed": 17,
        "config": v32(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, q_lora_rank=24, index_topk=64),
    },
]


# ----------------------------------------------------------------------------
# weights


def init_std(name, shape, cfg):
    """Standard deviation of each tensor's random init.

    Projections get 1/sqrt(fan_in), so every sub-layer sees and produces
    unit-scale activations and each one moves the logits. Three tensors are
    made small on purpose: the (untied) embeddings and the down-projections
    into the q and kv latents, so that the inputs of input_layernorm (layer 0),
    q_a_layernorm and kv_a_layernorm have a mean square near 1e-3 and the
    RMSNorm epsilon changes the output well above the test tolerance.
    """
    fan_in = shape[-1]
    if name.endswith("embed_tokens.weight"):
        # Tied embeddings double as the LM head, which needs the larger scale.
        return 2.0 / math.sqrt(fan_in) if cfg.tie_word_embeddings else 0.03
    if name.endswith("q_a_proj.weight") or name.endswith("kv_a_proj_with_mqa.weight"):
        return math.sqrt(1e-3 / fan_in)
    if name.endswith("mlp.gate.weight"):
        return 1.5 / math.sqrt(fan_in)  # router logits of order 1: decisive but not one-hot
    if name.endswith("lm_head.weight"):
        return 2.0 / math.sqrt(fan_in)
    return 1.0 / math.sqrt(fan_in)


@torch.no_grad()
def init_weights(model, seed):
    """Fills every parameter and the correction bias from a seeded numpy RNG.

    The draws follow the sorted in-memory tensor names and shapes, so they are
    reproducible for a given transformers version (torch's RNG is not used).
    """
    cfg = model.config
    rng = np.random.default_rng(seed)
    tensors = dict(model.named_parameters())
    tensors.update({n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")})
    for name in sorted(tensors):
        tensor = tensors[name]
        shape = tuple(tensor.shape)
        if name.endswith("e_score_correction_bias"):
            values = rng.normal(0.0, 0.1, shape)
        elif name.endswith("k_norm.bias"):  # V3.2 indexer's LayerNorm
            values = rng.normal(0.0, 0.3, shape)
        elif tensor.dim() == 1:  # RMSNorm (and LayerNorm) weights
            values = rng.normal(1.0, 0.15, shape)
        else:
            values = rng.normal(0.0, init_std(name, shape, cfg), shape)
        if name.endswith("kv_a_proj_with_mqa.weight"):
            # Its last qk_rope_head_dim rows make k_pe, which is not normalized:
            # they keep unit scale so that rope matters; only the latent rows are small.
            rope_rows = cfg.qk_rope_head_dim
            values[-rope_rows:] = rng.normal(0.0, 1.0 / math.sqrt(shape[-1]), (rope_rows, shape[-1]))
        tensor.copy_(torch.from_numpy(values.astype(np.float32)))


def keeps_f32(name):
    """Tensors a bf16 checkpoint stores in f32: e_score_correction_bias (a buffer, as in the
    release) and V3.2's indexer weights_proj, which transformers keeps in fp32."""
    return name.endswith("e_score_correction_bias") or name.endswith("indexer.weights_proj.weight")


def round_to_bf16(model, storage):
    """Rounds every weight to bf16 values, except what the bf16 checkpoint keeps in f32."""
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if storage == "bf16" and keeps_f32(name):
                continue
            tensor.copy_(tensor.to(torch.bfloat16).float())


# ----------------------------------------------------------------------------
# checkpoint writers


def build_model(fixture):
    from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                              DeepseekV32Config, DeepseekV32ForCausalLM)

    classes = {"deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM),
               "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM),
               "deepseek_v32": (DeepseekV32Config, DeepseekV32ForCausalLM)}
    config_cls, model_cls = classes[fixture["model_type"]]
    config = config_cls(**fixture["config"])
    torch.manual_seed(fixture["seed"])
    model = model_cls(config).float().eval()
    init_weights(model, fixture["seed"])
    if fixture["storage"] in ("bf16", "fp8"):
        round_to_bf16(model, fixture["storage"])  # fp8 keeps its unquantized tensors in bf16
    return model


def save_f32_or_bf16(model, out_dir, storage):
    if storage == "bf16":
        model = model.to(torch.bfloat16)
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias = module.e_score_correction_bias.float()
            if hasattr(module, "weights_proj"):  # V3.2 indexer
                module.weights_proj.float()
    model.save_pretrained(out_dir, safe_serialization=True)


def is_fp8_quantized(name):
    """Which tensors the DeepSeek-V3 release stores in FP8: every Linear weight except the router
    (and, in V3.2, the indexer's weights_proj; its wq_b and wk are FP8, its k_norm is a norm)."""
    if not name.endswith(".weight") or ".layers." not in name:
        return False
    if "layernorm" in name or name.endswith("mlp.gate.weight"):
        return False
    if name.endswith("indexer.weights_proj.weight") or name.endswith("indexer.k_norm.weight"):
        return False
    return True


def quantize_block_fp8(weight):
    """weight f32 [rows, cols] -> (float8_e4m3fn q, f32 scale_inv [ceil(rows/128), ceil(cols/128)])."""
    rows, cols = weight.shape
    br, bc = math.ceil(rows / FP8_BLOCK), math.ceil(cols / FP8_BLOCK)
    scale_inv = torch.empty(br, bc, dtype=torch.float32)
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            rs = slice(i * FP8_BLOCK, (i + 1) * FP8_BLOCK)
            cs = slice(j * FP8_BLOCK, (j + 1) * FP8_BLOCK)
            block = weight[rs, cs]
            amax = block.abs().max().clamp(min=1e-12)
            scale_inv[i, j] = amax / FP8_MAX
            q[rs, cs] = (block / scale_inv[i, j]).to(torch.float8_e4m3fn)
    return q, scale_inv


def save_fp8(model, out_dir):
    """Writes the DeepSeek-V3 release layout: fp8 + weight_scale_inv, bf16 rest, release-style config."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory() as scratch:
        model.save_pretrained(scratch, safe_serialization=True)  # HF names (per-expert), f32
        with open(os.path.join(scratch, "config.json")) as f:
            config = json.load(f)
        tensors = {}
        with safe_open(os.path.join(scratch, "model.safetensors"), framework="pt") as f:
            for name in sorted(f.keys()):
                tensor = f.get_tensor(name)
                if is_fp8_quantized(name):
                    q, scale_inv = quantize_block_fp8(tensor)
                    tensors[name] = q
                    tensors[name + "_scale_inv"] = scale_inv
                elif name.endswith("e_score_correction_bias"):
                    tensors[name] = tensor.float()
                else:
                    tensors[name] = tensor.to(torch.bfloat16)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})

    # Release-style config.json: rope_scaling with "type" and a top-level rope_theta
    # instead of the rope_parameters that transformers writes.
    # The release also lacks the derived keys head_dim (= qk_rope_head_dim) and qk_head_dim
    # (and, for V3.2, mlp_layer_types and layer_types).
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    rope["type"] = rope.pop("rope_type")
    config["rope_scaling"] = rope
    for derived in ("dtype", "head_dim", "qk_head_dim", "mlp_layer_types", "layer_types"):
        config.pop(derived, None)
    config["torch_dtype"] = "bfloat16"
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(dict(sorted(config.items())), f, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------
# expected outputs


def draw_prompt(vocab, length, seed, index, attempt):
    rng = np.random.default_rng([seed, index, attempt])
    return rng.integers(0, vocab, size=length).tolist()


def make_fixture(fixture, out_root):
    out_dir = os.path.join(out_root, fixture["name"])
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    model = build_model(fixture)
    if fixture["storage"] == "fp8":
        save_fp8(model, out_dir)
    else:
        save_f32_or_bf16(model, out_dir, fixture["storage"])

    # References come from the saved files, loaded the way any checkpoint would be.
    reference = hf_logits.load_model(out_dir)
    checkpoint = numpy_reference.load_checkpoint(out_dir)
    vocab = reference.config.vocab_size
    prompts, generated, report = [], [], []
    for index, length in enumerate(PROMPT_LENGTHS):
        for attempt in range(50):
            prompt = draw_prompt(vocab, length, fixture["seed"], index, attempt)
            logits, tokens, checks = hf_logits.run_prompt(reference, prompt, MAX_NEW_TOKENS)
            ref_logits, margins = numpy_reference.forward(out_dir, prompt + tokens[:-1], checkpoint)
            decided = np.sort(logits[length - 1:], axis=-1)
            argmax_margin = float(np.min(decided[:, -1] - decided[:, -2]))
            near_tie = (margins["routing"] < ROUTING_MARGIN or argmax_margin < ARGMAX_MARGIN
                        or margins["indexer"] < INDEXER_MARGIN)
            if near_tie:
                # A tie may let HF's decode and full forward choose differently (so neither
                # check below is meaningful); redraw.
                continue
            err = numpy_reference.rel_l2(ref_logits, logits.astype(np.float64))
            if err > NUMPY_TOLERANCE:
                raise RuntimeError(f"{fixture['name']}: numpy reference differs from HF: rel_l2 {err:.3e}")
            if checks["decode_vs_full_forward_rel_l2"] > NUMPY_TOLERANCE:
                raise RuntimeError(f"{fixture['name']}: HF decode differs from its full forward: rel_l2 "
                                   f"{checks['decode_vs_full_forward_rel_l2']:.3e}")
            break
        else:
            raise RuntimeError(f"{fixture['name']}: prompt {index}: no draw without a near tie")
        prompts.append(prompt)
        generated.append(tokens)
        report.append((err, margins["routing"], argmax_margin, checks["decode_vs_full_forward_rel_l2"],
                       margins["indexer"], attempt))
        np.save(os.path.join(out_dir, f"logits_{index}.npy"), logits)

    expected = {"prompts": prompts, "generated": generated, "max_new_tokens": MAX_NEW_TOKENS}
    with open(os.path.join(out_dir, "expected.json"), "w") as f:
        json.dump(expected, f)
        f.write("\n")
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    parser.add_argument("--only", nargs="*", help="fixture names to rebuild (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # fixed reduction order: identical files on every run
    names = {f["name"] for f in FIXTURES}
    for name in args.only or []:
        if name not in names:
            parser.error(f"unknown fixture {name}; known: {', '.join(sorted(names))}")
    for fixture in FIXTURES:
        if args.only and fixture["name"] not in args.only:
            continue
        report = make_fixture(fixture, args.out)
        size = sum(os.path.getsize(os.path.join(args.out, fixture["name"], n))
                   for n in os.listdir(os.path.join(args.out, fixture["name"])))
        print(f"{fixture['name']}: {size / 1024:.0f} KiB: {fixture['doc']}")
        for p, (err, routing, argmax, decode, index, attempt) in enumerate(report):
            print(f"  prompt {p}: numpy vs HF rel_l2 {err:.2e}, routing margin {routing:.1e}, "
                  f"argmax margin {argmax:.1e}, HF decode vs full forward {decode:.1e}"
                  + (f", indexer margin {index:.1e}, draw {attempt}" if fixture["model_type"] == "deepseek_v32" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
