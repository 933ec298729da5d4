#!/usr/bin/env python3
"""Reference logits from Hugging Face transformers for any DeepSeek-V2/V3/V3.2 checkpoint.

    python3 tests/golden/hf_logits.py --model DIR --prompt-ids 1,2,3 [--prompt-ids 4,5] \
        --max-new-tokens 6 --out-prefix /tmp/ref

runs the model in float32 (eval mode, eager attention) and, per prompt P, does a
full forward over the prompt and a greedy generation of N new tokens. It writes

    PREFIX_P.npy  float32 [prompt_len + N - 1, vocab]: rows 0..prompt_len-1 are the
                  prompt forward, the rest the logits of decode steps 1..N-1
                  (row prompt_len-1 is also decode step 0). Together they equal
                  one forward over prompt + generated[:-1].
    PREFIX.json   {"prompts": [[...]], "generated": [[...]], "max_new_tokens": N, ...}

Generation ignores EOS: it always produces N tokens. The checks in the json
include the decode-vs-full-forward error; for V3.2 a large one means an exact
tie in the indexer's top-k (HF breaks such ties differently in the two paths).

A checkpoint whose config.json has "quantization_config": {"quant_method": "fp8", ...}
(DeepSeek-V3 release format: float8_e4m3fn weights plus float32 `weight_scale_inv`
per 128x128 block) is dequantized to float32 into a temporary directory first,
so transformers never sees the FP8 tensors.

Only stable transformers APIs are used (AutoModelForCausalLM.from_pretrained,
generate); the script works with transformers 5.x.
"""

import argparse
import glob
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

# ----------------------------------------------------------------------------
# FP8 block-scaled checkpoints


def dequantize_block_fp8(weight, scale_inv, block):
    """weight: float8 [rows, cols]; scale_inv: float32 [ceil(rows/b0), ceil(cols/b1)]."""
    rows, cols = weight.shape
    want = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(scale_inv.shape) != want:
        raise ValueError(f"scale_inv shape {tuple(scale_inv.shape)} does not fit weight {tuple(weight.shape)}")
    scale = scale_inv.float().repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return weight.float() * scale[:rows, :cols]


def write_dequantized_copy(model_dir, out_dir):
    """Writes an unquantized float32 copy of an FP8 block-scaled checkpoint into out_dir."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    quant = config.pop("quantization_config")
    block = tuple(quant.get("weight_block_size") or (128, 128))
    config["torch_dtype"] = "float32"
    config["dtype"] = "float32"
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{model_dir}: no *.safetensors files")
    weight_map = {}
    for path in files:
        tensors = {}
        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
            for name in names:
                if name.endswith("_scale_inv"):
                    continue
                tensor = f.get_tensor(name)
                if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
                    scale_name = name + "_scale_inv"
                    if scale_name not in names:
                        raise ValueError(f"{path}: FP8 tensor '{name}' has no '{scale_name}'")
                    tensor = dequantize_block_fp8(tensor, f.get_tensor(scale_name), block)
                elif tensor.is_floating_point():
                    tensor = tensor.float()
                tensors[name] = tensor.contiguous()
        base = os.path.basename(path)
        save_file(tensors, os.path.join(out_dir, base), metadata={"format": "pt"})
        weight_map.update({name: base for name in tensors})
    if len(files) > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=2)


def is_fp8_checkpoint(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        quant = json.load(f).get("quantization_config") or {}
    return quant.get("quant_method") == "fp8"


# ----------------------------------------------------------------------------
# running


def load_model(model_dir, device="cpu"):
    """float32, eval, eager attention; FP8 checkpoints are dequantized on the way in."""
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    source = model_dir
    scratch = None
    if is_fp8_checkpoint(model_dir):
        scratch = tempfile.mkdtemp(prefix="hf_logits_fp8_")
        write_dequantized_copy(model_dir, scratch)
        source = scratch
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, attn_implementation="eager")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    # The per-expert loop works for any shape; the default grouped matmul needs sizes
    # aligned to 16 bytes on the CPU.
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    return model.to(device).eval()


def greedy_config(max_new_tokens, pad_token_id):
    """A fresh generation config: greedy, no EOS stop, raw logits returned.

    The model's own generation_config.json may sample or stop at EOS; replacing
    it (rather than overriding single fields) keeps its defaults out.
    """
    from transformers import GenerationConfig

    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=False,
        num_beams=1,
        eos_token_id=None,
        pad_token_id=pad_token_id,
        output_logits=True,
        return_dict_in_generate=True,
    )


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@torch.no_grad()
def run_prompt(model, prompt, max_new_tokens):
    """Returns (logits [len + N - 1, vocab] float32, generated ids, checks dict)."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    device = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    prompt_logits = model(ids).logits[0].float().cpu().numpy()

    model.generation_config = greedy_config(max_new_tokens, pad_token_id=0)
    out = model.generate(ids, attention_mask=torch.ones_like(ids))
    generated = out.sequences[0, len(prompt):].tolist()
    if len(generated) != max_new_tokens:
        raise RuntimeError(f"generate returned {len(generated)} tokens, wanted {max_new_tokens}")
    step_logits = np.stack([step[0].float().cpu().numpy() for step in out.logits])
    logits = np.concatenate([prompt_logits, step_logits[1:]], axis=0).astype(np.float32)

    # The decode path (KV cache) and one forward over prompt + generated[:-1]
    # must agree, and every generated token must be the argmax of its row.
    full_ids = torch.tensor([prompt + generated[:-1]], dtype=torch.long, device=device)
    full_logits = model(full_ids).logits[0].float().cpu().numpy()
    checks = {
        "decode_vs_full_forward_rel_l2": rel_l2(logits, full_logits),
        "step0_vs_prompt_last_rel_l2": rel_l2(step_logits[0], prompt_logits[-1]),
    }
    argmax = logits[len(prompt) - 1:].argmax(-1).tolist()
    if argmax != generated:
        raise RuntimeError(f"greedy tokens {generated} are not the argmax of their logits {argmax}")
    return logits, generated, checks


def run_prompts(model, prompts, max_new_tokens):
    results = [run_prompt(model, prompt, max_new_tokens) for prompt in prompts]
    summary = {
        "prompts": [list(map(int, p)) for p in prompts],
        "generated": [r[1] for r in results],
        "max_new_tokens": max_new_tokens,
    }
    return [r[0] for r in results], summary, [r[2] for r in results]


def parse_ids(text):
    try:
        ids = [int(tok) for tok in text.split(",") if tok.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of token ids: {text!r}")
    if not ids:
        raise argparse.ArgumentTypeError("empty prompt")
    return ids


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="checkpoint directory (config.json + *.safetensors)")
    parser.add_argument("--prompt-ids", type=parse_ids, action="append", required=True,
                        help="comma-separated token ids; repeat for several prompts")
    parser.add_argument("--max-new-tokens", type=int, default=6)
    parser.add_argument("--out-prefix", required=True, help="writes PREFIX_P.npy per prompt and PREFIX.json")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = load_model(args.model, args.device)
    vocab = model.config.vocab_size
    for prompt in args.prompt_ids:
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            parser.error(f"token ids {bad} are outside the vocabulary [0, {vocab})")
    all_logits, summary, checks = run_prompts(model, args.prompt_ids, args.max_new_tokens)
    summary["checks"] = checks
    out_dir = os.path.dirname(os.path.abspath(args.out_prefix))
    os.makedirs(out_dir, exist_ok=True)
    for p, logits in enumerate(all_logits):
        np.save(f"{args.out_prefix}_{p}.npy", logits)
    with open(f"{args.out_prefix}.json", "w") as f:
        json.dump(summary, f, indent=1)
    for p, (prompt, generated, check) in enumerate(zip(summary["prompts"], summary["generated"], checks)):
        print(f"prompt {p}: len {len(prompt)} -> generated {generated} "
              f"(decode vs full forward rel_l2 {check['decode_vs_full_forward_rel_l2']:.2e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
