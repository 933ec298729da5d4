#!/usr/bin/env python3
"""Writes router_cases.bin: routing cases computed by the transformers DeepSeek router
modules themselves (DeepseekV3TopkRouter, DeepseekV2TopkRouter), which test_router.c
compares ina_router_ref against.

The routers take hidden states and apply their gate; giving them hidden_size ==
num_experts and an identity gate weight makes the gate's output equal the chosen logits
bit for bit (checked below), so the modules' own routing code runs on known logits.

Run from anywhere with torch and transformers installed:
    python3 tests/moe_ep/gen_router_cases.py
CI has no torch: the output file is committed.

File format, all little-endian:
    magic    8 bytes  b"INARTR01"
    count    u32      number of cases
    per case:
      i32 x 8  method (ina_router_method_t), num_experts, top_k, n_group, topk_group,
               norm_topk_prob, tokens, has_bias
      f32      routed_scaling_factor
      f32      logits[tokens * num_experts]
      f32      bias[num_experts]            (only when has_bias)
      i32      ids[tokens * top_k]          (as torch.topk returned them: order unspecified)
      f32      weights[tokens * top_k]      (matching ids)
"""
import os
import struct

import numpy as np
import torch
import transformers
from transformers.models.deepseek_v2.configuration_deepseek_v2 import DeepseekV2Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

SOFTMAX_GREEDY, SOFTMAX_GROUP_GREEDY, SIGMOID_NOAUX_TC = 0, 1, 2
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "router_cases.bin")
TOKENS = 12


def make_router(method, experts, top_k, n_group, topk_group, norm, scale):
    common = dict(hidden_size=experts, n_routed_experts=experts, num_experts_per_tok=top_k,
                  n_group=n_group, topk_group=topk_group, norm_topk_prob=bool(norm),
                  routed_scaling_factor=scale, num_attention_heads=1, num_key_value_heads=1)
    if method == SIGMOID_NOAUX_TC:
        router = DeepseekV3TopkRouter(DeepseekV3Config(**common))
    else:
        topk_method = "greedy" if method == SOFTMAX_GREEDY else "group_limited_greedy"
        router = DeepseekV2TopkRouter(DeepseekV2Config(topk_method=topk_method, **common))
    with torch.no_grad():
        router.weight.copy_(torch.eye(experts, dtype=torch.float32))
    return router.eval()


def run_case(gen, method, experts, top_k, n_group, topk_group, norm, scale, logit_std,
             bias_mean=0.0, bias_std=0.0):
    router = make_router(method, experts, top_k, n_group, topk_group, norm, scale)
    logits = torch.randn(TOKENS, experts, generator=gen, dtype=torch.float32) * logit_std
    bias = None
    if method == SIGMOID_NOAUX_TC:
        bias = (torch.randn(experts, generator=gen, dtype=torch.float32) * bias_std + bias_mean)
        with torch.no_grad():
            router.e_score_correction_bias.copy_(bias)
    with torch.no_grad():
        router_logits, weights, ids = router(logits)
    assert torch.equal(router_logits, logits), "identity gate changed the logits"
    assert ids.shape == (TOKENS, top_k) and weights.dtype == torch.float32
    out = struct.pack("<8i", method, experts, top_k, n_group, topk_group, norm, TOKENS,
                      bias is not None)
    out += struct.pack("<f", scale)
    out += logits.numpy().astype("<f4").tobytes()
    if bias is not None:
        out += bias.numpy().astype("<f4").tobytes()
    out += ids.to(torch.int32).numpy().astype("<i4").tobytes()
    out += weights.numpy().astype("<f4").tobytes()
    return out


def main():
    gen = torch.Generator().manual_seed(20240607)
    # (method, experts, top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor,
    #  logit std, [bias mean, bias std])
    cases = [
        # DeepSeek-V3 shape.
        (SIGMOID_NOAUX_TC, 256, 8, 8, 4, 1, 2.5, 2.0, 0.0, 0.5),
        (SIGMOID_NOAUX_TC, 64, 6, 4, 2, 0, 1.0, 1.0, 0.1, 0.3),
        (SIGMOID_NOAUX_TC, 16, 4, 1, 1, 1, 1.5, 3.0, 0.0, 1.0),
        (SIGMOID_NOAUX_TC, 32, 5, 8, 3, 1, 2.5, 1.0, 0.0, 0.2),
        # Biases so negative that every kept choice score is below 0: selects between
        # the -inf fill of transformers 5.x and the 0.0 fill of older code.
        (SIGMOID_NOAUX_TC, 48, 6, 8, 2, 1, 2.5, 1.0, -3.0, 0.5),
        # DeepSeek-V2-Lite shape, and norm_topk_prob set (transformers ignores it for V2).
        (SOFTMAX_GREEDY, 64, 6, 1, 1, 0, 1.0, 1.5),
        (SOFTMAX_GREEDY, 40, 3, 1, 1, 1, 2.0, 4.0),
        (SOFTMAX_GREEDY, 8, 1, 1, 1, 0, 1.0, 1.0),
        # DeepSeek-V2 shape.
        (SOFTMAX_GROUP_GREEDY, 160, 6, 8, 3, 0, 16.0, 2.0),
        (SOFTMAX_GROUP_GREEDY, 64, 8, 8, 2, 1, 1.0, 1.0),
        (SOFTMAX_GROUP_GREEDY, 24, 2, 6, 1, 0, 1.0, 3.0),
    ]
    blob = b"INARTR01" + struct.pack("<I", len(cases))
    for case in cases:
        blob += run_case(gen, *case)
    with open(OUT, "wb") as f:
        f.write(blob)
    print(f"{OUT}: {len(cases)} cases, {len(blob)} bytes "
          f"(torch {torch.__version__}, transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
