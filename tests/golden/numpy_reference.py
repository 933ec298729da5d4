#!/usr/bin/env python3
"""Plain-numpy DeepSeek-V2/V3/V3.2 forward, written from HF_SEMANTICS.md alone.

It reads a checkpoint directory the way the C loader has to (config.json plus
safetensors files with per-expert tensor names; F32, BF16 and F8_E4M3 with
128x128 `weight_scale_inv` blocks) and computes the logits of every position
of one prompt in float64. It needs neither torch nor transformers, so agreement
with the Hugging Face logits stored in the fixtures checks the equations in
HF_SEMANTICS.md, not a second copy of the HF code.

    python3 tests/golden/numpy_reference.py tests/golden/fixtures/v3_sigmoid

compares against every logits_P.npy of a fixture and prints the relative L2
error per prompt. `forward()` also returns routing, argmax and (V3.2) indexer
top-k margins, which make_fixtures.py uses to reject inputs whose expert
choice, greedy token or selected token set is a near tie (those would make the
golden test flaky rather than strict).
"""

import argparse
import glob
import json
import math
import os
import struct
import sys

import numpy as np

# ----------------------------------------------------------------------------
# safetensors reading (format: u64 little-endian header length, JSON header,
# raw little-endian data; offsets in the header are relative to the data start)


def _e4m3_table():
    """Value of each of the 256 float8 e4m3fn bytes (bias 7, no inf, 0x7f/0xff NaN)."""
    table = np.zeros(256, dtype=np.float64)
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        exponent = (byte >> 3) & 0xF
        mantissa = byte & 0x7
        if exponent == 0xF and mantissa == 0x7:
            table[byte] = np.nan
        elif exponent == 0:
            table[byte] = sign * (mantissa / 8.0) * 2.0 ** -6
        else:
            table[byte] = sign * (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
    return table


E4M3_VALUES = _e4m3_table()


def read_safetensors(path):
    """Returns {name: (dtype string, float64 array)}."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        shape = info["shape"]
        dtype = info["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4").astype(np.float64)
        elif dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32).astype(np.float64)
        elif dtype == "F8_E4M3":
            arr = E4M3_VALUES[np.frombuffer(raw, dtype=np.uint8)]
        else:
            raise ValueError(f"{path}: tensor '{name}': unsupported dtype {dtype}")
        tensors[name] = (dtype, arr.reshape(shape))
    return tensors


def dequantize_block_fp8(weight, scale_inv, block=(128, 128)):
    """w[i, j] = q[i, j] * scale_inv[i // 128, j // 128]; edge blocks are ragged."""
    rows, cols = weight.shape
    expanded = np.repeat(np.repeat(scale_inv, block[0], axis=0), block[1], axis=1)
    return weight * expanded[:rows, :cols]


def load_checkpoint(model_dir):
    """Returns (config dict, {name: float64 array}) with FP8 weights dequantized."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    raw = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
        raw.update(read_safetensors(path))
    quant = config.get("quantization_config") or {}
    block = tuple(quant.get("weight_block_size", (128, 128)))
    weights = {}
    for name, (dtype, arr) in raw.items():
        if name.endswith("_scale_inv"):
            continue
        if dtype == "F8_E4M3":
            scale_name = name + "_scale_inv"
            if scale_name not in raw:
                raise ValueError(f"{model_dir}: FP8 tensor '{name}' has no '{scale_name}'")
            arr = dequantize_block_fp8(arr, raw[scale_name][1], block)
        weights[name] = arr
    return config, weights


# ----------------------------------------------------------------------------
# configuration


class Config:
    """The config.json keys the forward reads, with HF defaults (see HF_SEMANTICS.md)."""

    def __init__(self, cfg):
        self.model_type = cfg["model_type"]
        if self.model_type not in ("deepseek_v2", "deepseek_v3", "deepseek_v32"):
            raise ValueError(f"unsupported model_type {self.model_type}")
        v32 = self.model_type == "deepseek_v32"
        v3 = self.model_type == "deepseek_v3" or v32  # V3.2 routes, norms and ropes MLA as V3
        self.v3 = v3
        self.v32 = v32
        self.vocab_size = cfg["vocab_size"]
        self.hidden_size = cfg["hidden_size"]
        self.num_layers = cfg["num_hidden_layers"]
        self.num_heads = cfg["num_attention_heads"]
        self.q_lora_rank = cfg.get("q_lora_rank", 1536)
        self.kv_lora_rank = cfg.get("kv_lora_rank", 512)
        self.qk_nope = cfg.get("qk_nope_head_dim", 128)
        self.qk_rope = cfg.get("qk_rope_head_dim", 64)
        self.v_head = cfg.get("v_head_dim", 128)
        self.rms_eps = cfg.get("rms_norm_eps", 1e-6)
        self.first_k_dense = cfg.get("first_k_dense_replace", 3 if v3 else 0)
        self.n_routed = cfg.get("n_routed_experts", 256 if v3 else 64)
        self.top_k = cfg.get("num_experts_per_tok", 8 if v3 else None)
        self.n_group = cfg.get("n_group", 8 if v3 else None)
        self.topk_group = cfg.get("topk_group", 4 if v3 else None)
        self.norm_topk_prob = cfg.get("norm_topk_prob", True if v3 else False)
        self.routed_scale = cfg.get("routed_scaling_factor", 2.5 if v3 else 1.0)
        self.topk_method = cfg.get("topk_method", "greedy")  # read by V2 only
        self.tie = cfg.get("tie_word_embeddings", False)
        # V2 and V3.2 always interleave MLA's rope (V3.2 ignores a rope_interleave key).
        self.rope_interleave = cfg.get("rope_interleave", True) if v3 and not v32 else True
        # Which layers are MoE: V3.2 reads mlp_layer_types (written by save_pretrained,
        # derived from first_k_dense_replace when absent, as in the release config).
        layer_types = cfg.get("mlp_layer_types") if v32 else None
        if layer_types is None:
            dense = min(self.first_k_dense, self.num_layers)
            layer_types = ["dense"] * dense + ["sparse"] * (self.num_layers - dense)
        if len(layer_types) != self.num_layers or set(layer_types) - {"dense", "sparse"}:
            raise ValueError(f"bad mlp_layer_types {layer_types}")
        self.moe_layers = [t == "sparse" for t in layer_types]
        if v32:
            if self.q_lora_rank is None:
                raise ValueError("deepseek_v32 needs q_lora_rank (its indexer reads the q latent)")
            self.index_topk = cfg.get("index_topk", 2048)
            self.index_n_heads = cfg.get("index_n_heads", 64)
            self.index_head_dim = cfg.get("index_head_dim", 128)
            if self.index_head_dim < self.qk_rope:
                raise ValueError("index_head_dim must be at least qk_rope_head_dim")
        self.max_pos = cfg.get("max_position_embeddings", 4096 if v3 else 2048)
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        rope.setdefault("rope_type", rope.get("type", "default"))
        rope.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
        if rope["rope_type"] not in ("default", "yarn"):
            raise ValueError(f"unsupported rope_type {rope['rope_type']}")
        if rope["rope_type"] == "yarn":
            rope.setdefault("original_max_position_embeddings", self.max_pos)
        self.rope = rope


# ----------------------------------------------------------------------------
# building blocks


def rms_norm(x, weight, eps):
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def layer_norm(x, weight, bias, eps):
    centered = x - np.mean(x, axis=-1, keepdims=True)
    return weight * (centered / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + eps)) + bias


def silu(x):
    return x / (1.0 + np.exp(-x))


def yarn_get_mscale(scale, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rope_tables(cfg, positions):
    """cos, sin of shape [T, rope_dim/2], already multiplied by attention_factor.

    inv_freq and the angle pos*inv_freq are rounded to float32 like HF does;
    the cos/sin themselves are evaluated in float64.
    """
    dim = cfg.qk_rope
    rope = cfg.rope
    base = float(rope["rope_theta"])
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    pos_freqs = np.power(np.float32(base), exponents, dtype=np.float32)
    attention_factor = 1.0
    if rope["rope_type"] == "default":
        inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)
    else:
        factor = rope.get("factor")
        original = rope["original_max_position_embeddings"]
        if factor is None:
            factor = cfg.max_pos / original
        mscale = rope.get("mscale")
        mscale_all_dim = rope.get("mscale_all_dim")
        attention_factor = rope.get("attention_factor")
        if attention_factor is None:
            if mscale and mscale_all_dim:
                attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
            else:
                attention_factor = yarn_get_mscale(factor)
        beta_fast = rope.get("beta_fast") or 32
        beta_slow = rope.get("beta_slow") or 1

        def correction_dim(rotations):
            return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

        low = correction_dim(beta_fast)
        high = correction_dim(beta_slow)
        if rope.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
        extrapolation_weight = (np.float32(1) - ramp).astype(np.float32)
        inv_extra = (np.float32(1.0) / pos_freqs).astype(np.float32)
        inv_inter = (np.float32(1.0) / (np.float32(factor) * pos_freqs)).astype(np.float32)
        inv_freq = (inv_inter * (np.float32(1) - extrapolation_weight) + inv_extra * extrapolation_weight).astype(np.float32)
    angles = (np.asarray(positions, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float32)
    angles = angles.astype(np.float64)
    return np.cos(angles) * attention_factor, np.sin(angles) * attention_factor


def apply_rope(x, cos, sin, interleaved):
    """x: [T, heads, dim]; rotates pair j by angle j (pairs (2j, 2j+1) or (j, j+dim/2))."""
    half = x.shape[-1] // 2
    c = cos[:, None, :]
    s = sin[:, None, :]
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
    else:
        a, b = x[..., :half], x[..., half:]
    # The output layout does not matter as long as q and k use the same one.
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def softmax_scale(cfg):
    scale = (cfg.qk_nope + cfg.qk_rope) ** -0.5
    rope = cfg.rope
    if rope["rope_type"] != "default":
        mscale_all_dim = rope.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = yarn_get_mscale(rope["factor"], mscale_all_dim)
            scale = scale * m * m
    return scale


def linear(x, w):
    return x @ w.T


def attention(cfg, w, prefix, h, cos, sin, margins=None):
    """MLA over the causal context; V3.2 keeps only the indexer's top-k of it."""
    T = h.shape[0]
    H, dn, dr, dv = cfg.num_heads, cfg.qk_nope, cfg.qk_rope, cfg.v_head
    if cfg.q_lora_rank is None:
        q = linear(h, w[prefix + "q_proj.weight"])
    else:
        q_latent = linear(h, w[prefix + "q_a_proj.weight"])
        q_latent = rms_norm(q_latent, w[prefix + "q_a_layernorm.weight"], 1e-6)  # fixed eps, not rms_norm_eps
        q = linear(q_latent, w[prefix + "q_b_proj.weight"])
    q = q.reshape(T, H, dn + dr)
    q_nope, q_pe = q[..., :dn], q[..., dn:]

    compressed = linear(h, w[prefix + "kv_a_proj_with_mqa.weight"])
    latent = rms_norm(compressed[:, : cfg.kv_lora_rank], w[prefix + "kv_a_layernorm.weight"], 1e-6)
    k_pe = compressed[:, cfg.kv_lora_rank :].reshape(T, 1, dr)

    interleaved = cfg.rope_interleave
    q_pe = apply_rope(q_pe, cos, sin, interleaved)
    k_pe = apply_rope(k_pe, cos, sin, interleaved)

    kv = linear(latent, w[prefix + "kv_b_proj.weight"]).reshape(T, H, dn + dv)
    k_nope, v = kv[..., :dn], kv[..., dn:]

    scores = np.einsum("ihd,jhd->hij", q_nope, k_nope) + np.einsum("ihd,jd->hij", q_pe, k_pe[:, 0, :])
    scores = scores * softmax_scale(cfg)
    causal = np.tril(np.ones((T, T), dtype=bool))
    if cfg.v32:
        causal = indexer(cfg, w, prefix + "indexer.", h, q_latent, cos, sin, margins)
    scores = np.where(causal[None], scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("hij,jhd->ihd", probs, v).reshape(T, H * dv)
    return linear(out, w[prefix + "o_proj.weight"])


def indexer(cfg, w, prefix, h, q_latent, cos, sin, margins):
    """V3.2 lightning indexer: which visible tokens each query keeps, as a bool [T, T] mask.

    Appends, per query with more than index_topk visible tokens, the gap between
    its k-th and (k+1)-th best visible score divided by the largest |score| it
    sees (0 for a boundary among equal scores, e.g. the exact zeros of relu).
    """
    T = h.shape[0]
    heads, dim, dr = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope
    q = linear(q_latent, w[prefix + "wq_b.weight"]).reshape(T, heads, dim)
    k = linear(h, w[prefix + "wk.weight"])
    k = layer_norm(k, w[prefix + "k_norm.weight"], w[prefix + "k_norm.bias"], 1e-6).reshape(T, 1, dim)
    # Rope on the FIRST qk_rope_head_dim dims, half-split, whatever MLA's layout; same cos/sin.
    q = np.concatenate([apply_rope(q[..., :dr], cos, sin, False), q[..., dr:]], axis=-1)
    k = np.concatenate([apply_rope(k[..., :dr], cos, sin, False), k[..., dr:]], axis=-1)[:, 0, :]
    dots = np.maximum(np.einsum("shd,td->sht", q, k) * dim ** -0.5, 0.0)  # relu per head
    head_weights = linear(h, w[prefix + "weights_proj.weight"]) * heads ** -0.5
    scores = np.einsum("sh,sht->st", head_weights, dots)
    keep = np.zeros((T, T), dtype=bool)
    for s in range(T):
        visible = scores[s, : s + 1]
        if s + 1 <= cfg.index_topk:
            keep[s, : s + 1] = True  # every visible token
            continue
        order = np.argsort(-visible, kind="stable")
        keep[s, order[: cfg.index_topk]] = True
        ordered = visible[order]
        scale = float(np.max(np.abs(visible)))
        gap = float(ordered[cfg.index_topk - 1] - ordered[cfg.index_topk])
        if margins is not None:
            margins.append(gap / scale if gap > 0 else 0.0)
    return keep


def mlp(x, w, prefix):
    gate = linear(x, w[prefix + "gate_proj.weight"])
    up = linear(x, w[prefix + "up_proj.weight"])
    return linear(silu(gate) * up, w[prefix + "down_proj.weight"])


def _gap(values, k):
    """values[k-1] - values[k] of the descending sort: how far the k-th choice is from a tie."""
    if k >= values.shape[-1]:
        return math.inf
    ordered = np.sort(values)[::-1]
    if not np.isfinite(ordered[k]):
        return math.inf
    return float(ordered[k - 1] - ordered[k])


def route(cfg, w, prefix, x, margins):
    """Returns (indices [T, k], weights [T, k]) exactly as the HF router picks them."""
    logits = linear(x, w[prefix + "gate.weight"])
    E, k = cfg.n_routed, cfg.top_k
    indices = np.zeros((x.shape[0], k), dtype=np.int64)
    weights = np.zeros((x.shape[0], k))
    for t in range(x.shape[0]):
        if cfg.v3:
            scores = 1.0 / (1.0 + np.exp(-logits[t]))
            choice = scores + w[prefix + "gate.e_score_correction_bias"]
            grouped = choice.reshape(cfg.n_group, E // cfg.n_group)
            group_scores = np.sort(grouped, axis=-1)[:, ::-1][:, :2].sum(axis=-1)
            margins.append(_gap(group_scores, cfg.topk_group))
            keep = np.argsort(-group_scores, kind="stable")[: cfg.topk_group]
            mask = np.zeros(cfg.n_group, dtype=bool)
            mask[keep] = True
            choice = np.where(np.repeat(mask, E // cfg.n_group), choice, -np.inf)
            margins.append(_gap(choice, k))
            top = np.argsort(-choice, kind="stable")[:k]
            chosen = scores[top]
            if cfg.norm_topk_prob:
                chosen = chosen / (chosen.sum() + 1e-20)
        else:
            scores = np.exp(logits[t] - logits[t].max())
            scores /= scores.sum()
            if cfg.topk_method == "group_limited_greedy":
                group_scores = scores.reshape(cfg.n_group, E // cfg.n_group).max(axis=-1)
                margins.append(_gap(group_scores, cfg.topk_group))
                keep = np.argsort(-group_scores, kind="stable")[: cfg.topk_group]
                mask = np.zeros(cfg.n_group, dtype=bool)
                mask[keep] = True
                scores = np.where(np.repeat(mask, E // cfg.n_group), scores, 0.0)
            elif cfg.topk_method != "greedy":
                raise ValueError(f"unsupported topk_method {cfg.topk_method}")
            margins.append(_gap(scores, k))
            top = np.argsort(-scores, kind="stable")[:k]
            chosen = scores[top]  # V2 never renormalizes, whatever norm_topk_prob says
        indices[t] = top
        weights[t] = chosen * cfg.routed_scale
    return indices, weights


def moe(cfg, w, prefix, x, margins):
    indices, weights = route(cfg, w, prefix, x, margins)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for slot in range(cfg.top_k):
            e = indices[t, slot]
            out[t] += weights[t, slot] * mlp(x[t : t + 1], w, f"{prefix}experts.{e}.")[0]
    return out + mlp(x, w, prefix + "shared_experts.")


def forward(model_dir, token_ids, checkpoint=None):
    """Logits [T, vocab] of every position, plus margins that say how close to a tie the run was.

    Returns (logits, {"routing": smallest gap at any routing decision,
                      "argmax": smallest top1 - top2 logit gap over positions,
                      "indexer": (V3.2) smallest relative gap at any top-k boundary,
                                 inf when no query sees more than index_topk tokens}).
    """
    raw_cfg, w = checkpoint if checkpoint is not None else load_checkpoint(model_dir)
    cfg = Config(raw_cfg)
    T = len(token_ids)
    x = w["model.embed_tokens.weight"][np.asarray(token_ids)]
    cos, sin = rope_tables(cfg, np.arange(T))
    routing_margins, indexer_margins = [], []
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], cfg.rms_eps)
        x = x + attention(cfg, w, p + "self_attn.", h, cos, sin, indexer_margins)
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], cfg.rms_eps)
        if cfg.moe_layers[layer]:
            x = x + moe(cfg, w, p + "mlp.", h, routing_margins)
        else:
            x = x + mlp(h, w, p + "mlp.")
    x = rms_norm(x, w["model.norm.weight"], cfg.rms_eps)
    head = w["model.embed_tokens.weight"] if cfg.tie else w["lm_head.weight"]
    logits = linear(x, head)
    top2 = np.sort(logits, axis=-1)[:, -2:]
    margins = {
        "routing": min(routing_margins) if routing_margins else math.inf,
        "argmax": float(np.min(top2[:, 1] - top2[:, 0])),
        "indexer": min(indexer_margins) if indexer_margins else math.inf,
    }
    return logits, margins


def cfg_is_v32(checkpoint):
    return checkpoint[0]["model_type"] == "deepseek_v32"


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("fixture", nargs="+", help="fixture directory (config.json, model.safetensors, expected.json)")
    parser.add_argument("--tol", type=float, default=1e-5, help="largest relative L2 error accepted")
    args = parser.parse_args()
    worst = 0.0
    for fixture in args.fixture:
        checkpoint = load_checkpoint(fixture)
        with open(os.path.join(fixture, "expected.json")) as f:
            expected = json.load(f)
        for p, (prompt, generated) in enumerate(zip(expected["prompts"], expected["generated"])):
            ids = prompt + generated[:-1]
            ref = np.load(os.path.join(fixture, f"logits_{p}.npy"))
            logits, margins = forward(fixture, ids, checkpoint)
            err = rel_l2(logits, ref.astype(np.float64))
            same = int(np.sum(logits.argmax(-1) == ref.argmax(-1)))
            worst = max(worst, err)
            print(f"{os.path.basename(fixture.rstrip('/'))} prompt {p} (len {len(prompt)}+{len(generated)}): "
                  f"rel_l2 {err:.3e}, argmax {same}/{len(ids)}, routing margin {margins['routing']:.2e}"
                  + (f", indexer margin {margins['indexer']:.2e}" if cfg_is_v32(checkpoint) else ""))
    print(f"worst rel_l2 {worst:.3e} (tol {args.tol:g})")
    return 0 if worst <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
