"""Hugging Face transformers on the GPU as a reference point for `ina generate`:
DeepSeek-V2-Lite's shapes (the built-in `v2-lite` configuration of model/config.c) with
random bf16 weights made on the GPU, greedy generation of the same prompts as the ina
runs in bench/RESULTS.md (8 prompts, 64 new tokens each, no stop at eos), timed with
CUDA synchronization: prefill (the first token) and decode tokens/s.

usage: python3 bench/hf_decode_reference.py [--new 64] [--batch 8]
Needs torch with CUDA and transformers with DeepseekV2 (the GPU machine has both)."""
import argparse
import sys
import time

import torch
import transformers


def v2_lite_config():
    return transformers.DeepseekV2Config(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, norm_topk_prob=False, routed_scaling_factor=1.0,
        topk_method="greedy", max_position_embeddings=163840, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                         "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707},
        bos_token_id=100000, eos_token_id=100001)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--batch", type=int, default=8, help="prompts (the ina runs use 8)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("hf_decode_reference: no CUDA device", file=sys.stderr)
        return 77
    torch.manual_seed(0)
    cfg = v2_lite_config()
    t0 = time.time()
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters made on the GPU "
          f"in {time.time() - t0:.1f} s")
    # The ina runs' prompts: one of 20 tokens and seven of 4, left-padded to one batch.
    prompts = [[1, 15, 42, 7, 300, 12, 99, 5, 61, 2000, 33, 8, 17, 400, 23, 9, 71, 5, 3, 11]]
    prompts += [[i, i * 7, i * 13, i * 31] for i in range(2, 9)]
    prompts = prompts[:args.batch]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device="cuda")
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device="cuda")
    kwargs = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, **kwargs)  # warm-up
        torch.cuda.synchronize()
        t0 = time.time()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
        torch.cuda.synchronize()
        first = time.time() - t0
        t0 = time.time()
        model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, **kwargs)
        torch.cuda.synchronize()
        total = time.time() - t0
    decode = total - first
    print(f"prefill (first token, batch {len(prompts)}): {first * 1e3:.1f} ms")
    print(f"decode: {len(prompts) * (args.new - 1)} tokens in {decode:.3f} s "
          f"({len(prompts) * (args.new - 1) / decode:.1f} tokens/s, batch {len(prompts)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
