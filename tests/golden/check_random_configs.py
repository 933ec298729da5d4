#!/usr/bin/env python3
"""Property test: any small DeepSeek-V2/V3/V3.2 checkpoint saved by transformers runs in ina like in HF.

    python3 tests/golden/check_random_configs.py --ina build/tools/ina --count 30 --seed 1 [--keep DIR]

Each trial draws a random configuration inside the features ina supports
(V2, V3 or, in about a quarter of the trials, V3.2; q LoRA or not; odd head
counts; 1-4 layers with any mix of dense and MoE layers, or no MoE at all;
2-16 routed experts in groups, 0-2 shared experts; V2 greedy or
group_limited_greedy; default or YaRN rope with or without mscale /
mscale_all_dim / beta / truncate / attention_factor keys; V3 interleaved or
half-split rope; tied embeddings; attention biases; any rms_norm_eps,
rope_theta, routed_scaling_factor, norm_topk_prob; ina's KV page size and
thread count vary too). V3.2 trials are V3 ones with q LoRA always (HF's
V3.2 requires it: its indexer reads the q latent), a rope_interleave key
true, false or absent (its MLA rope is always interleaved: HF's V3.2 never
reads the key, and ina must not either) and a lightning indexer of 1-5 heads
(1 rarely: see sample_indexer) of index_head_dim from qk_rope_head_dim to
qk_rope_head_dim + 40, odd sizes included, with an index_topk of 1-10 in 4
trials of 5, below most sequences so that the selection matters, otherwise
15-299 (every visible token selected); bf16 checkpoints store the indexer's
weights_proj in float32 (as HF keeps it) or bf16. The script builds the model with the
transformers classes, fills it with seeded random weights of random scale and
saves it with save_pretrained in float32 or bfloat16. The reference is
hf_logits.py's: HF in float32 (on the stored bf16 values for bf16
checkpoints), one forward over prompt + generated[:-1] for 1-3 random prompts
of 1-12 tokens and 4 greedy tokens that never stop at EOS. ina runs the same
directory with --ignore-eos --dump-logits; a trial passes when every prompt's
relative L2 error is within the bound (1e-4 for float32 weights, 2e-2 for
bf16) and the greedy tokens are identical.

Two limits come from HF, not ina: V2 draws even qk_nope_head_dim and
kv_lora_rank (HF's V2 rope needs them even), and the HF models run their
experts with the modeling file's eager loop (torch's grouped_mm, the default,
rejects rows that are not a multiple of 16 bytes on the CPU).

A near tie in the HF run (top-2 logit gap below 1e-3 at a generated token, or
a gap below 1e-4 between the last chosen and the first rejected expert or
group at any routing decision, recorded by hooks on the routers; in V3.2 also
a gap below make_fixtures' INDEXER_MARGIN, 1e-4 of the query's largest
|score|, between the k-th and the (k+1)-th visible index score of any query
that sees more than index_topk tokens, in any layer, exact ties included,
recorded by hooks on the indexers) would let a correct engine pick another
token, expert or attended token set, so such a prompt is redrawn, and after
too many redraws the weights are. A V3.2 prompt is redrawn too when HF's
cached decode differs from its full forward by more than 1e-5 (relative L2),
as make_fixtures requires. Configurations and weights come from numpy
generators seeded with (seed, trial[, attempt]) (the family from its own
(seed, trial, 32), so V2/V3 trials draw what they drew before V3.2 was
added), and `--seed S --trial T` repeats one trial exactly.

Prints one line per trial and a final `N passed, M failed`; exits 1 on any
failure. A failing trial's checkpoint, HF reference (hf_P.npy, hf.json) and
ina output stay on disk, with the commands that reproduce the comparison.
Exits 77 (skipped, as ctest's SKIP_RETURN_CODE) with a message when numpy,
torch, transformers or safetensors cannot be imported (scripts/install-torch.sh
installs them).
"""

import argparse
import copy
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import warnings  # noqa: E402

warnings.filterwarnings("ignore")  # transformers/torch chatter (zero-element tensors, rope factor notes)

SKIP = 77  # ctest's SKIP_RETURN_CODE for this test

try:
    import numpy as np  # noqa: E402
    import safetensors  # noqa: E402,F401
    import torch  # noqa: E402
    import transformers  # noqa: E402,F401
except ImportError as exc:
    print(f"check_random_configs: skipped ({exc}; scripts/install-torch.sh installs numpy, torch, "
          "transformers and safetensors)")
    sys.exit(SKIP)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_logits  # noqa: E402
from make_fixtures import INDEXER_MARGIN, NUMPY_TOLERANCE as DECODE_TOLERANCE  # noqa: E402

MAX_NEW_TOKENS = 4
ARGMAX_MARGIN = 1e-3   # smallest top1 - top2 HF logit gap where a greedy token is chosen
ROUTING_MARGIN = 1e-4  # smallest gap between the last chosen and first rejected expert / group
# INDEXER_MARGIN (make_fixtures'): smallest V3.2 indexer top-k gap relative to the query's largest
# |score|; DECODE_TOLERANCE: largest V3.2 HF decode-vs-full-forward relative L2 (both as the fixtures)
V32_SHARE = 0.25       # fraction of trials that draw DeepSeek-V3.2
PROMPT_DRAWS = 8       # redraws of one prompt before the weights are redrawn
WEIGHT_DRAWS = 6       # redraws of the weights before a trial is given up as untestable
FAIL_ROOT = "/tmp/ina_random_configs"

# ----------------------------------------------------------------------------
# configurations


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _loguniform(rng, low, high):
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def sample_rope(rng, max_position):
    theta = float(rng.choice([10000.0, _loguniform(rng, 100.0, 1e6)]))
    if rng.random() < 0.4:
        return {"rope_type": "default", "rope_theta": theta}
    rope = {"rope_type": "yarn", "rope_theta": theta}
    # factor is required by HF's yarn; 1.0 (no scaling, mscale terms vanish) is an edge case.
    rope["factor"] = 1.0 if rng.random() < 0.12 else round(float(rng.uniform(1.0, 40.0)), 3)
    if rng.random() < 0.75:  # absent: HF falls back to max_position_embeddings
        rope["original_max_position_embeddings"] = int(rng.integers(4, 4097))
    mscale_choices = [0.707, 1.0, round(float(rng.uniform(0.1, 2.0)), 4), 0.0]
    presence = rng.choice(["none", "mscale", "all_dim", "equal", "different"],
                          p=[0.25, 0.1, 0.15, 0.2, 0.3])
    if presence in ("mscale", "equal", "different"):
        rope["mscale"] = float(rng.choice(mscale_choices, p=[0.3, 0.3, 0.35, 0.05]))
    if presence == "all_dim":
        rope["mscale_all_dim"] = float(rng.choice(mscale_choices, p=[0.3, 0.3, 0.35, 0.05]))
    elif presence == "equal":
        rope["mscale_all_dim"] = rope["mscale"]
    elif presence == "different":
        rope["mscale_all_dim"] = round(float(rng.uniform(0.1, 2.0)), 4)
    if rng.random() < 0.25:
        rope["beta_fast"] = float(rng.choice([32.0, round(float(rng.uniform(4.0, 64.0)), 2)]))
        rope["beta_slow"] = float(rng.choice([1.0, round(float(rng.uniform(0.25, 3.0)), 2)]))
    if rng.random() < 0.2:
        rope["truncate"] = bool(rng.random() < 0.5)
    if rng.random() < 0.1:
        rope["attention_factor"] = round(float(rng.uniform(0.5, 2.0)), 4)
    return rope


def sample_routing(rng, v3, experts):
    """num_experts_per_tok, n_group, topk_group (and V2's topk_method) that HF and ina accept."""
    out = {}
    if v3:
        groups = [g for g in _divisors(experts) if experts // g >= 2]  # V3 sums the top 2 per group
        method = "noaux_tc"
    else:
        method = str(rng.choice(["greedy", "group_limited_greedy"]))
        groups = _divisors(experts)
        out["topk_method"] = method
    if method == "greedy":
        out["num_experts_per_tok"] = int(rng.integers(1, experts + 1))
        if rng.random() < 0.5:  # unused by greedy; present in some releases
            g = int(rng.choice(groups))
            out.update(n_group=g, topk_group=int(rng.integers(1, g + 1)))
        return out
    g = int(rng.choice(groups))
    kept = int(rng.integers(1, g + 1))
    out.update(n_group=g, topk_group=kept,
               num_experts_per_tok=int(rng.integers(1, kept * (experts // g) + 1)))
    return out


def sample_config(rng, v32=False):
    """Returns (model_type, config kwargs, storage options, ina options); v32: a DeepSeek-V3.2
    configuration (V3 with q LoRA, which its indexer reads; main adds the rope_interleave key
    that HF's V3.2 ignores)."""
    v3 = bool(rng.random() < 0.5) or v32
    heads = int(rng.integers(1, 8))
    if v3:
        hidden = int(rng.integers(16, 97))
    else:  # V2's config insists on hidden_size % num_attention_heads == 0
        hidden = heads * int(rng.integers(max(1, math.ceil(16 / heads)), 96 // heads + 1))
    layers = int(rng.integers(1, 5))
    max_position = int(rng.choice([64, 512, 4096, int(rng.integers(16, 8193))]))
    cfg = dict(
        vocab_size=int(rng.integers(32, 301)),
        hidden_size=hidden,
        intermediate_size=int(rng.integers(16, 129)),
        moe_intermediate_size=int(rng.integers(8, 49)),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        q_lora_rank=None if rng.random() < 0.4 and not v32 else int(rng.integers(8, 65)),
        kv_lora_rank=int(rng.integers(8, 65)),
        qk_nope_head_dim=int(rng.integers(4, 33)),
        qk_rope_head_dim=2 * int(rng.integers(1, 9)),
        v_head_dim=int(rng.integers(4, 33)),
        n_shared_experts=int(rng.integers(0, 3)),
        norm_topk_prob=bool(rng.random() < 0.5),
        routed_scaling_factor=float(rng.choice([1.0, 2.5, round(float(rng.uniform(0.25, 16.0)), 3)])),
        tie_word_embeddings=bool(rng.random() < 0.35),
        rms_norm_eps=float(rng.choice([1e-6, 1e-5, _loguniform(rng, 1e-8, 1e-2)])),
        attention_bias=bool(rng.random() < 0.25),
        max_position_embeddings=max_position,
        rope_parameters=sample_rope(rng, max_position),
    )
    if v3 and not v32:
        cfg["rope_interleave"] = bool(rng.random() < 0.5)
    elif not v3:
        # HF's V2 rope goes through torch.view_as_complex on slices of the q and kv_a
        # projections, which fails unless qk_nope + qk_rope and kv_lora_rank + qk_rope are even.
        cfg["qk_nope_head_dim"] += cfg["qk_nope_head_dim"] % 2
        cfg["kv_lora_rank"] += cfg["kv_lora_rank"] % 2
    moe = rng.choice(["moe", "dense_first_k", "no_experts"], p=[0.82, 0.09, 0.09])
    if moe == "no_experts":
        # HF cannot build a MoE layer without experts, so every layer is dense.
        cfg.update(n_routed_experts=0, first_k_dense_replace=layers)
    else:
        experts = int(rng.integers(2, 17))
        cfg["n_routed_experts"] = experts
        # "moe" keeps at least one MoE layer; "dense_first_k" configures experts but uses none
        cfg["first_k_dense_replace"] = layers if moe == "dense_first_k" else int(rng.integers(0, layers))
        cfg.update(sample_routing(rng, v3, experts))
    if v32:
        cfg.update(sample_indexer(rng, cfg["qk_rope_head_dim"]))
    storage = {
        "dtype": str(rng.choice(["f32", "bf16"])),
        # the DeepSeek releases keep the correction bias in float32 inside bf16 checkpoints
        "bias_f32": bool(rng.random() < 0.5),
    }
    if v32:  # transformers keeps the indexer's weights_proj in float32; the FP8 release has it bf16
        storage["proj_f32"] = bool(rng.random() < 0.5)
    # how ina runs it: KV pages of 1-7 tokens make prompts span pages; several threads split the work
    engine = {"page_size": int(rng.choice([16, 16, 1, 3, 7])), "threads": int(rng.integers(1, 4))}
    return ("deepseek_v32" if v32 else "deepseek_v3" if v3 else "deepseek_v2"), cfg, storage, engine


def sample_indexer(rng, rope_dim):
    """V3.2's lightning indexer: 1-5 heads of index_head_dim >= qk_rope_head_dim (it ropes that
    many leading dims; HF needs nothing else, odd sizes included) and an index_topk that is
    mostly below the sequences' lengths (at most 15 tokens: 12 + 3 generated ones fed back), so
    that the selection matters, and otherwise at or above them (every visible token selected)."""
    if rng.random() < 0.8:
        topk = int(rng.integers(1, 11))
    else:
        topk = int(rng.choice([15, 16, int(rng.integers(17, 300))]))
    # a single head rarely gives a testable draw: relu makes about half its scores exactly 0, so
    # the boundary mostly falls among equal scores and the draw is redrawn
    return {"index_n_heads": int(rng.choice([1, 2, 3, 4, 5], p=[0.1, 0.225, 0.225, 0.225, 0.225])),
            "index_head_dim": rope_dim + int(rng.choice([0, int(rng.integers(1, 9)), int(rng.integers(9, 41))])),
            "index_topk": topk}


def describe(model_type, cfg, storage):
    """One short line: the features a failure would point at."""
    bf16_note = ""
    if storage["dtype"] == "bf16":
        kept = ["bias f32" if storage["bias_f32"] else "bias bf16"]
        if "proj_f32" in storage:
            kept.append("proj f32" if storage["proj_f32"] else "proj bf16")
        bf16_note = "(" + ", ".join(kept) + ")"
    short = {"deepseek_v2": "v2", "deepseek_v3": "v3", "deepseek_v32": "v3.2"}[model_type]
    parts = [short + " " + storage["dtype"] + bf16_note]
    parts.append(f"L{cfg['num_hidden_layers']} D{cfg['hidden_size']} H{cfg['num_attention_heads']} "
                 f"q{cfg['q_lora_rank'] or '-'} kv{cfg['kv_lora_rank']} "
                 f"n{cfg['qk_nope_head_dim']}/r{cfg['qk_rope_head_dim']}/v{cfg['v_head_dim']} "
                 f"I{cfg['intermediate_size']} V{cfg['vocab_size']}")
    if model_type == "deepseek_v32":
        parts.append(f"index H{cfg['index_n_heads']}x{cfg['index_head_dim']} topk {cfg['index_topk']}")
    E = cfg["n_routed_experts"]
    if E == 0 or cfg["first_k_dense_replace"] >= cfg["num_hidden_layers"]:
        parts.append("dense")
    else:
        method = cfg.get("topk_method", "noaux_tc")
        groups = f" G{cfg.get('n_group')}/{cfg.get('topk_group')}" if method != "greedy" else ""
        parts.append(f"E{E} k{cfg['num_experts_per_tok']}{groups} {method} S{cfg['n_shared_experts']} "
                     f"Im{cfg['moe_intermediate_size']} fk{cfg['first_k_dense_replace']} "
                     f"norm{int(cfg['norm_topk_prob'])} rsf{cfg['routed_scaling_factor']:g}")
    rope = cfg["rope_parameters"]
    text = f"{rope['rope_type']} th{rope['rope_theta']:.4g}"
    if rope["rope_type"] == "yarn":
        text += f" f{rope['factor']:g} o{rope.get('original_max_position_embeddings', '-')}"
        text += f" m{rope.get('mscale', '-')}/{rope.get('mscale_all_dim', '-')}"
        for key, short in (("beta_fast", "bf"), ("beta_slow", "bs"), ("truncate", "tr"), ("attention_factor", "af")):
            if key in rope:
                text += f" {short}{rope[key]}"
    if model_type == "deepseek_v3":
        text += " il" if cfg["rope_interleave"] else " half"
    parts.append(text)
    flags = [f"eps{cfg['rms_norm_eps']:.1e}"]
    if cfg["tie_word_embeddings"]:
        flags.append("tied")
    if cfg["attention_bias"]:
        flags.append("attn_bias")
    if cfg.get("mlp_bias"):
        flags.append("mlp_bias")
    if model_type == "deepseek_v32" and "rope_interleave" in cfg:
        flags.append(f"rope_interleave key {str(cfg['rope_interleave']).lower()}")
    parts.append(" ".join(flags))
    return " | ".join(parts)


# ----------------------------------------------------------------------------
# model and weights


def build_model(model_type, cfg):
    from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM,
                              DeepseekV32Config, DeepseekV32ForCausalLM)

    classes = {"deepseek_v2": (DeepseekV2Config, DeepseekV2ForCausalLM),
               "deepseek_v3": (DeepseekV3Config, DeepseekV3ForCausalLM),
               "deepseek_v32": (DeepseekV32Config, DeepseekV32ForCausalLM)}
    config_cls, model_cls = classes[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_cls(config_cls(**copy.deepcopy(cfg))).float().eval()
    model.set_attn_implementation("eager")  # as hf_logits.load_model does for the reference
    use_eager_experts(model)
    return model


def use_eager_experts(model):
    """The per-expert loop of the modeling file instead of the default torch grouped_mm,
    which on the CPU rejects weights whose rows are not a multiple of 16 bytes (hidden 65, ...)."""
    model.set_experts_implementation("eager")


def sample_scales(rng):
    """Per-trial init scales: unit-scale activations with random gain, some pathways made small."""
    return {
        "gain": float(rng.uniform(0.6, 1.6)),
        # small embeddings / latent down-projections make rms_norm_eps (and the fixed 1e-6 of
        # the latent norms) visible; unit ones exercise the usual regime
        "embed": float(rng.choice([0.03, 0.3, 1.0])),
        "latent": float(rng.choice([math.sqrt(1e-3), 1.0])),
        "router": float(rng.uniform(1.0, 3.0)),
        "head": float(rng.uniform(1.0, 3.0)),
        "norm_spread": float(rng.uniform(0.05, 0.3)),
        "score_bias": float(rng.uniform(0.01, 0.1)),
        "linear_bias": float(rng.uniform(0.05, 0.5)),
    }


def init_std(name, fan_in, tied, scales):
    if name.endswith("embed_tokens.weight"):
        # tied embeddings are also the LM head, which needs the head's scale
        return scales["head"] / math.sqrt(fan_in) if tied else scales["embed"]
    if name.endswith("q_a_proj.weight") or name.endswith("kv_a_proj_with_mqa.weight"):
        return scales["latent"] / math.sqrt(fan_in)
    if name.endswith("mlp.gate.weight"):
        return scales["router"] / math.sqrt(fan_in)
    if name.endswith("lm_head.weight"):
        return scales["head"] / math.sqrt(fan_in)
    return scales["gain"] / math.sqrt(fan_in)


@torch.no_grad()
def init_weights(model, rng, scales):
    """Fills every parameter (and the V3 correction bias buffer) from a numpy generator."""
    cfg = model.config
    tensors = dict(model.named_parameters())
    tensors.update({n: b for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")})
    for name in sorted(tensors):
        tensor = tensors[name]
        shape = tuple(tensor.shape)
        if tensor.numel() == 0:  # n_shared_experts = 0 gives [0, D] shared-expert weights
            continue
        if name.endswith("e_score_correction_bias"):
            values = rng.normal(0.0, scales["score_bias"], shape)
        elif name.endswith(".bias"):  # attention biases, V3.2's indexer k_norm (a LayerNorm) bias
            values = rng.normal(0.0, scales["linear_bias"], shape)
        elif tensor.dim() == 1:  # RMSNorm (and the k_norm LayerNorm) weights
            values = rng.normal(1.0, scales["norm_spread"], shape)
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            values = rng.normal(0.0, scales["gain"] / math.sqrt(shape[-1]), shape)  # fused [E, out, in]
        else:
            values = rng.normal(0.0, init_std(name, shape[-1], cfg.tie_word_embeddings, scales), shape)
        if name.endswith("kv_a_proj_with_mqa.weight"):
            # the last qk_rope_head_dim rows make k_pe, which no norm rescales: keep them unit scale
            rope_rows = cfg.qk_rope_head_dim
            values[-rope_rows:] = rng.normal(0.0, scales["gain"] / math.sqrt(shape[-1]), (rope_rows, shape[-1]))
        tensor.copy_(torch.from_numpy(values.astype(np.float32)))


def weight_tensors(model):
    """(name, tensor) of everything a checkpoint stores; not the rope inv_freq buffers, recomputed on load."""
    weights = list(model.named_parameters())
    weights += [(n, b) for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")]
    return weights


def keeps_f32(name, storage):
    """Whether a bf16 checkpoint stores this tensor in float32 (the correction bias, V3.2's weights_proj)."""
    if name.endswith("e_score_correction_bias"):
        return storage["bias_f32"]
    return name.endswith("indexer.weights_proj.weight") and storage.get("proj_f32", False)


@torch.no_grad()
def round_to_bf16(model, storage):
    for name, tensor in weight_tensors(model):
        if not keeps_f32(name, storage):
            tensor.copy_(tensor.to(torch.bfloat16).float())


@torch.no_grad()
def save_checkpoint(model, out_dir, storage):
    """save_pretrained in float32, or in bfloat16 (optionally keeping the correction bias and
    V3.2's weights_proj float32)."""
    to_save = model
    if storage["dtype"] == "bf16":
        to_save = copy.deepcopy(model).to(torch.bfloat16)
        originals = dict(weight_tensors(model))
        for name, tensor in weight_tensors(to_save):
            if keeps_f32(name, storage):  # from the float32 model: the bf16 copy has rounded it
                module_name, attr = name.rsplit(".", 1)
                module = to_save.get_submodule(module_name)
                value = originals[name].detach().clone()
                if isinstance(getattr(module, attr), torch.nn.Parameter):
                    setattr(module, attr, torch.nn.Parameter(value, requires_grad=False))
                else:
                    setattr(module, attr, value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to_save.save_pretrained(out_dir, safe_serialization=True)


# ----------------------------------------------------------------------------
# the HF reference and its margins


def _gap(sorted_desc, k):
    """Per-row gap between choice k-1 and the first rejected one (inf where nothing is rejected)."""
    if k >= sorted_desc.shape[-1]:
        return torch.full(sorted_desc.shape[:-1], math.inf, dtype=torch.float64)
    last, first_out = sorted_desc[..., k - 1].double(), sorted_desc[..., k].double()
    gap = last - first_out
    return torch.where(torch.isfinite(first_out), gap, torch.full_like(gap, math.inf))


def router_margin(router, logits):
    """Smallest decision gap of one router call, recomputed the way the router decides (float32)."""
    logits = logits.float()
    E, k = logits.shape[-1], router.top_k
    margins = []
    if hasattr(router, "e_score_correction_bias"):  # V3: sigmoid + bias, groups by top-2 sum
        scores = logits.sigmoid() + router.e_score_correction_bias
        G, Gk = router.num_group, router.topk_group
        grouped = scores.view(-1, G, E // G)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        margins.append(_gap(group_scores.sort(dim=-1, descending=True)[0], Gk))
        kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(Gk, dim=-1)[1], 1.0)
        mask = kept.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
        scores = scores.masked_fill(~mask, float("-inf"))
    else:  # V2: softmax, optionally groups by max with the rest masked to 0
        scores = logits.softmax(dim=-1, dtype=torch.float32)
        if router.topk_method == "group_limited_greedy":
            G, Gk = router.num_group, router.topk_group
            group_scores = scores.view(-1, G, E // G).max(dim=-1).values
            margins.append(_gap(group_scores.sort(dim=-1, descending=True)[0], Gk))
            kept = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(Gk, dim=-1)[1], 1.0)
            mask = kept.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E).bool()
            scores = scores.masked_fill(~mask, 0.0)
    margins.append(_gap(scores.sort(dim=-1, descending=True)[0], k))
    return min(float(m.min()) for m in margins)


@torch.no_grad()
def indexer_margin(indexer, hidden_states, q_resid, position_embeddings):
    """Smallest top-k boundary gap of one V3.2 indexer call over its own tokens (a forward without
    earlier cache entries), relative to the largest |score| the query sees, as numpy_reference's
    indexer margin: 0 for a boundary between equal scores (relu's exact zeros), inf when no query
    sees more than index_topk tokens. The scores are recomputed the way the indexer computes
    them (float32)."""
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    B, S, _ = hidden_states.shape
    k = indexer.index_topk
    if S <= k:
        return math.inf
    H, di, dr = indexer.n_heads, indexer.head_dim, indexer.qk_rope_head_dim
    q = indexer.wq_b(q_resid).view(B, S, H, di)
    q_rot, q_pass = torch.split(q, [dr, di - dr], dim=-1)
    key = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(key, [dr, di - dr], dim=-1)
    cos, sin = position_embeddings
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = torch.cat([q_rot, q_pass], dim=-1)
    key = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
    dots = torch.relu(torch.matmul(q.float(), key.transpose(-1, -2).float().unsqueeze(1)) * indexer.softmax_scale)
    weights = indexer.weights_proj(hidden_states.to(indexer.weights_proj.weight.dtype)).float() * H ** -0.5
    scores = torch.matmul(weights.unsqueeze(-2), dots).squeeze(-2)  # [B, S, S]
    smallest = math.inf
    for s in range(k, S):  # query s sees tokens 0..s
        visible = scores[:, s, : s + 1].double()
        ordered = visible.sort(dim=-1, descending=True).values
        gap = ordered[:, k - 1] - ordered[:, k]
        scale = visible.abs().max(dim=-1).values
        relative = torch.where(gap > 0, gap / scale, torch.zeros_like(gap))
        smallest = min(smallest, float(relative.min()))
    return smallest


class MarginMonitor:
    """Forward hooks on every router and V3.2 indexer: the smallest routing gap and the smallest
    relative indexer top-k gap seen since the last reset. Indexer calls of a decode step (one
    query against cached keys) are not measured: the full forward over prompt + generated[:-1]
    that hf_logits.run_prompt also runs holds the same queries over the same visible tokens."""

    def __init__(self, model):
        self.handles = []
        self.reset()
        for module in model.modules():
            name = type(module).__name__
            if name.endswith("TopkRouter"):
                self.handles.append(module.register_forward_hook(self._record_router))
            elif name.endswith("Indexer"):
                self.handles.append(module.register_forward_hook(self._record_indexer, with_kwargs=True))

    def _record_router(self, module, inputs, output):
        self.routing = min(self.routing, router_margin(module, output[0]))

    def _record_indexer(self, module, args, kwargs, output):
        names = ("hidden_states", "q_resid", "position_embeddings", "attention_mask")
        values = dict(zip(names, args), **{n: kwargs[n] for n in names if n in kwargs})
        hidden_states, mask = values["hidden_states"], values["attention_mask"]
        if mask.shape[-1] != hidden_states.shape[1]:  # decode step: keys from the cache
            return
        self.indexer = min(self.indexer, indexer_margin(module, hidden_states, values["q_resid"],
                                                        values["position_embeddings"]))

    def reset(self):
        self.routing = math.inf
        self.indexer = math.inf

    def close(self):
        for handle in self.handles:
            handle.remove()


def argmax_margin(logits, prompt_len):
    decided = np.sort(logits[prompt_len - 1:].astype(np.float64), axis=-1)
    return float(np.min(decided[:, -1] - decided[:, -2]))


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    norm = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / norm) if norm > 0 else float(np.linalg.norm(a))


# ----------------------------------------------------------------------------
# ina


def run_ina(ina, model_dir, prompts, out_prefix, engine):
    """Runs `ina generate`; returns (command, [logits per prompt] or None, [tokens per prompt] or None, text)."""
    dump = out_prefix + ".npy"
    cmd = [ina, "generate", "--device", "cpu", "--model", model_dir]
    for prompt in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, prompt))]
    cmd += ["--max-new-tokens", str(MAX_NEW_TOKENS), "--ignore-eos", "--dump-logits", dump,
            "--page-size", str(engine["page_size"]), "--threads", str(engine["threads"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        return cmd, None, None, text
    tokens = {}
    for match in re.finditer(r"^prompt (\d+):([\d,\s]*)$", proc.stdout, re.MULTILINE):
        tokens[int(match.group(1))] = [int(t) for t in match.group(2).replace(" ", "").split(",") if t]
    paths = [dump] if len(prompts) == 1 else [f"{out_prefix}_{p}.npy" for p in range(len(prompts))]
    logits = [np.load(path) if os.path.exists(path) else None for path in paths]
    return cmd, logits, [tokens.get(p) for p in range(len(prompts))], text


# ----------------------------------------------------------------------------
# one trial


class Trial:
    """One trial's configuration and prompt lengths, a function of (seed, index) alone."""

    def __init__(self, seed, index):
        self.seed, self.index = seed, index
        # the family from a generator of its own, so that the V2/V3 trials draw as they did before V3.2
        v32 = bool(np.random.default_rng([seed, index, 32]).random() < V32_SHARE)
        rng = np.random.default_rng([seed, index])
        self.model_type, self.cfg, self.storage, self.engine = sample_config(rng, v32)
        self.num_prompts = int(rng.integers(1, 4))
        self.prompt_lengths = [int(rng.integers(1, 13)) for _ in range(self.num_prompts)]


def draw_prompt(trial, attempt, p, draw):
    rng = np.random.default_rng([trial.seed, trial.index, attempt, p, draw, 7])
    return rng.integers(0, trial.cfg["vocab_size"], size=trial.prompt_lengths[p]).tolist()


def hf_reference(trial, model, model_dir, attempt):
    """Saved checkpoint -> (prompts, logits, tokens, margins, prompt redraws) free of near ties, or None."""
    reference = hf_logits.load_model(model_dir)
    use_eager_experts(reference)
    # The reload must hold exactly the weights that were saved: a key HF failed to load would
    # be randomly initialized and make ina look wrong.
    saved = dict(weight_tensors(model))
    loaded = dict(weight_tensors(reference))
    if saved.keys() != loaded.keys():
        raise RuntimeError(f"HF reload of {model_dir}: tensors {sorted(saved.keys() ^ loaded.keys())} "
                           "appear on one side only")
    for name, tensor in saved.items():
        if not torch.equal(tensor, loaded[name].float()):
            raise RuntimeError(f"HF reload of {model_dir}: '{name}' differs from what was saved")
    monitor = MarginMonitor(reference)
    v32 = trial.model_type == "deepseek_v32"
    prompts, logits, tokens, margins = [], [], [], []
    redraws = 0
    try:
        for p in range(trial.num_prompts):
            for draw in range(PROMPT_DRAWS):
                redraws += draw > 0
                prompt = draw_prompt(trial, attempt, p, draw)
                monitor.reset()
                try:
                    out, generated, checks = hf_logits.run_prompt(reference, prompt, MAX_NEW_TOKENS)
                except RuntimeError:  # generated token not the argmax of its row: an exact tie
                    continue
                margin = (argmax_margin(out, len(prompt)), monitor.routing, monitor.indexer)
                # V3.2: HF's cached decode must agree with its full forward, as make_fixtures
                # requires (torch.topk breaks exact index-score ties differently in the two)
                consistent = not v32 or checks["decode_vs_full_forward_rel_l2"] <= DECODE_TOLERANCE
                if margin[0] >= ARGMAX_MARGIN and margin[1] >= ROUTING_MARGIN and margin[2] >= INDEXER_MARGIN \
                        and consistent:
                    break
            else:
                return None
            prompts.append(prompt)
            logits.append(out)
            tokens.append(generated)
            margins.append(margin)
    finally:
        monitor.close()
    return prompts, logits, tokens, margins, redraws


def numpy_diagnosis(model_dir, prompts, hf_out, ina_out):
    """Where the plain-numpy forward of HF_SEMANTICS.md sits between HF and ina (no biases there)."""
    import numpy_reference

    lines = []
    checkpoint = numpy_reference.load_checkpoint(model_dir)
    for p, (prompt, ref, ours) in enumerate(zip(prompts, hf_out, ina_out)):
        seq = prompt + [int(t) for t in ref[len(prompt) - 1:].argmax(-1)[:-1]]
        logits, _ = numpy_reference.forward(model_dir, seq, checkpoint)
        line = f"    numpy_reference prompt {p}: vs HF {rel_l2(logits, ref):.2e}"
        if ours is not None and ours.shape == ref.shape:
            line += f", vs ina {rel_l2(logits, ours):.2e}"
        lines.append(line)
    return lines


def row_profile(ours, ref, prompt_len):
    """Relative error per row: tells a prefill bug (rows < prompt_len) from a decode bug."""
    rows = np.linalg.norm(ours.astype(np.float64) - ref, axis=-1) / np.maximum(np.linalg.norm(ref, axis=-1), 1e-30)
    return (f"rows 0..{prompt_len - 1} (prefill) max {rows[:prompt_len].max():.1e}, "
            f"decode rows max {rows[prompt_len:].max() if len(rows) > prompt_len else 0.0:.1e}, "
            f"first row above 1e-4: {int(np.argmax(rows > 1e-4)) if (rows > 1e-4).any() else '-'}")


def run_trial(trial, args, work_root):
    """Returns a dict: status pass/fail/skip, errors, line, details."""
    tol = args.tol_f32 if trial.storage["dtype"] == "f32" else args.tol_bf16
    trial_dir = os.path.join(work_root, f"seed{trial.seed}_trial{trial.index}")
    model_dir = os.path.join(trial_dir, "model")
    result = {"status": "skip", "errors": [], "dir": trial_dir, "dtype": trial.storage["dtype"], "details": []}
    reference = None
    for attempt in range(WEIGHT_DRAWS):
        shutil.rmtree(trial_dir, ignore_errors=True)
        os.makedirs(model_dir)
        rng = np.random.default_rng([trial.seed, trial.index, attempt, 1])
        model = build_model(trial.model_type, trial.cfg)
        init_weights(model, rng, sample_scales(rng))
        if trial.storage["dtype"] == "bf16":
            round_to_bf16(model, trial.storage)
        save_checkpoint(model, model_dir, trial.storage)
        reference = hf_reference(trial, model, model_dir, attempt)
        if reference is not None:
            result["attempt"] = attempt
            result["prompt_redraws"] = reference[4]
            break
    if reference is None:
        result["line"] = f"SKIP (every draw came within a near tie after {WEIGHT_DRAWS} weight draws)"
        return result
    prompts, hf_out, hf_tokens, margins, _ = reference
    result["margins"] = margins

    for p, logits in enumerate(hf_out):
        np.save(os.path.join(trial_dir, f"hf_{p}.npy"), logits)
    with open(os.path.join(trial_dir, "hf.json"), "w") as f:
        json.dump({"prompts": prompts, "generated": hf_tokens, "max_new_tokens": MAX_NEW_TOKENS,
                   "margins": [{"argmax": m[0], "routing": m[1], "indexer": m[2]} for m in margins]},
                  f, indent=1)

    engine = dict(trial.engine, **({"threads": args.threads} if args.threads else {}))
    cmd, ina_out, ina_tokens, text = run_ina(args.ina, model_dir, prompts, os.path.join(trial_dir, "ina"), engine)
    result["cmd"] = cmd
    result["prompts"] = prompts
    if ina_out is None:
        result["status"] = "fail"
        result["line"] = "ina failed: " + text.replace("\n", " / ")[:400]
        return result
    failed = False
    pieces = []
    for p, (ours, ref, want, got) in enumerate(zip(ina_out, hf_out, hf_tokens, ina_tokens)):
        if ours is None or ours.shape != ref.shape or not np.all(np.isfinite(ours)):
            shape = None if ours is None else ours.shape
            pieces.append(f"p{p}: bad logits (shape {shape}, want {ref.shape})")
            failed = True
            result["errors"].append(math.inf)
            continue
        err = rel_l2(ours, ref)
        same = got == want
        result["errors"].append(err)
        # ina's CPU engine computes bf16 checkpoints in float32 too, so a bf16 error above the
        # float32 bound passes the criterion but is worth a look
        note = " (above the f32 bound)" if err > args.tol_f32 and err <= tol else ""
        pieces.append(f"p{p}(len {len(prompts[p])}) {err:.1e}{note}{'' if same else ' TOKENS DIFFER'}")
        if err > tol or not same:
            failed = True
            result["details"].append(f"    prompt {p}: {row_profile(ours, ref.astype(np.float64), len(prompts[p]))}; "
                                     f"tokens HF {want} ina {got}")
    result["status"] = "fail" if failed else "pass"
    routing = min(m[1] for m in margins)
    indexer = min(m[2] for m in margins)
    result["line"] = ("rel_l2 " + ", ".join(pieces) + f" (tol {tol:g}); HF margins: argmax "
                      f"{min(m[0] for m in margins):.1e}" + (f", routing {routing:.1e}" if routing < math.inf else "")
                      + (f", indexer {indexer:.1e}" if indexer < math.inf else ""))
    if failed and not (trial.cfg["attention_bias"] or trial.cfg.get("mlp_bias")):
        try:
            result["details"] += numpy_diagnosis(model_dir, prompts, hf_out, ina_out)
        except Exception as exc:  # diagnosis is best effort
            result["details"].append(f"    numpy_reference failed: {exc}")
    return result


def reproduce_lines(script, args, trial, result, original_dir):
    d = result["dir"]
    lines = [f"  kept: {d} (model/, hf_P.npy + hf.json = HF reference, ina*.npy = ina's logits)",
             "  reproduce:",
             f"    python3 {script} --ina {args.ina} --seed {trial.seed} --trial {trial.index} --keep /tmp/repro"]
    if "cmd" in result:
        lines.append("    " + " ".join(result["cmd"]).replace(original_dir, d))
    n = len(result.get("prompts", []))
    ours = [f"{d}/ina.npy"] if n == 1 else [f"{d}/ina_{p}.npy" for p in range(n)]
    tol = args.tol_f32 if result["dtype"] == "f32" else args.tol_bf16
    for p in range(n):
        lines.append(f"    python3 {os.path.dirname(script)}/compare_npy.py {ours[p]} {d}/hf_{p}.npy --tol {tol:g}")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ina", required=True, help="path of the ina executable")
    parser.add_argument("--count", type=int, default=30, help="number of trials")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trial", type=int, action="append",
                        help="run only these trial indices of --seed (repeatable), e.g. to reproduce a failure")
    parser.add_argument("--keep", help="keep every trial's checkpoint and outputs under this directory")
    parser.add_argument("--tol-f32", type=float, default=1e-4, help="relative L2 bound for float32 checkpoints")
    parser.add_argument("--tol-bf16", type=float, default=2e-2, help="relative L2 bound for bf16 checkpoints")
    parser.add_argument("--threads", type=int, help="ina --threads (default: drawn per trial, 1-3)")
    parser.add_argument("--mlp-bias", action="store_true",
                        help="also draw V2's mlp_bias (HF honours it; outside the DeepSeek releases)")
    args = parser.parse_args()
    if not os.access(args.ina, os.X_OK):
        parser.error(f"{args.ina} is not an executable")
    args.ina = os.path.abspath(args.ina)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    script = os.path.relpath(os.path.abspath(__file__))

    work_root = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="ina_random_configs_")
    os.makedirs(work_root, exist_ok=True)
    indices = args.trial if args.trial else list(range(args.count))
    passed = failed = skipped = 0
    worst = {}
    started = time.time()
    for index in indices:
        trial = Trial(args.seed, index)
        if args.mlp_bias and trial.model_type == "deepseek_v2":
            trial.cfg["mlp_bias"] = bool(np.random.default_rng([args.seed, index, 99]).random() < 0.5)
        if trial.model_type == "deepseek_v32":
            # A rope_interleave key that HF's V3.2 ignores: true, false, or none.
            choice = int(np.random.default_rng([args.seed, index, 98]).integers(0, 3))
            if choice < 2:
                trial.cfg["rope_interleave"] = bool(choice)
        summary = describe(trial.model_type, trial.cfg, trial.storage) + f" | page {trial.engine['page_size']}"
        try:
            result = run_trial(trial, args, work_root)
        except Exception as exc:  # a harness error is a failure too, never a silent pass
            result = {"status": "fail", "line": f"error: {type(exc).__name__}: {exc}", "errors": [],
                      "dir": os.path.join(work_root, f"seed{args.seed}_trial{index}"),
                      "dtype": trial.storage["dtype"], "details": []}
        redraws = "".join(f" [{what} redrawn {result[key]}x]" for key, what in
                          (("prompt_redraws", "prompts"), ("attempt", "weights")) if result.get(key))
        print(f"trial {index} [seed {args.seed}] {result['status'].upper()}: {summary} :: {result['line']}{redraws}",
              flush=True)
        for err in result["errors"]:
            if err > worst.get(result["dtype"], (-1.0, None))[0]:
                worst[result["dtype"]] = (err, index)
        if result["status"] == "pass":
            passed += 1
        elif result["status"] == "skip":
            skipped += 1
        else:
            failed += 1
            for line in result["details"]:
                print(line)
            original_dir = result["dir"]
            if not args.keep:  # move the evidence out of the scratch directory
                dest = os.path.join(FAIL_ROOT, os.path.basename(result["dir"]))
                shutil.rmtree(dest, ignore_errors=True)
                os.makedirs(FAIL_ROOT, exist_ok=True)
                if os.path.isdir(result["dir"]):
                    shutil.move(result["dir"], dest)
                    result["dir"] = dest
            for line in reproduce_lines(script, args, trial, result, original_dir):
                print(line)
        if not args.keep and result["status"] != "fail":
            shutil.rmtree(result["dir"], ignore_errors=True)
    if not args.keep:
        shutil.rmtree(work_root, ignore_errors=True)
    for dtype in sorted(worst):
        print(f"worst rel_l2 {dtype}: {worst[dtype][0]:.2e} (trial {worst[dtype][1]})")
    print(f"elapsed {time.time() - started:.0f} s" + (f"; {skipped} skipped (near ties)" if skipped else ""))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
