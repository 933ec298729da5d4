#!/bin/bash
# `ina model info`: the configuration of a model without loading its weights, V3.2's
# indexer, and the KV cache bytes per token and layer, checked against the formula
#   bf16:  2 * (kv_lora_rank + qk_rope_head_dim) [+ 2 * index_head_dim]
#   FP8:   kv_lora_rank + 4 * ceil(kv_lora_rank / 128) + 2 * qk_rope_head_dim
#          [+ index_head_dim + 4]      (the 656-byte latent entry; e4m3 key + fp32 scale)
# at DeepSeek-V3.2's shapes (512, 64, 128: 1408 and 656 + 132 = 788) and tiny's (64, 16:
# 160 and 64 + 4 + 32 = 100, no indexer); an unknown model is refused, naming it.
# usage: test_model_info.sh INA
set -u
ina=$1
failed=0
expect() { # expect WHAT OUTPUT PATTERN
  if grep -qF -- "$3" <<<"$2"; then echo "ok: $1"; else echo "FAIL: $1: no '$3' in:"; echo "$2"; failed=1; fi
}

out=$("$ina" model info --model random:v3.2-layers 2>&1) || { echo "FAIL: v3.2-layers exit $?"; failed=1; }
expect "V3.2 named" "$out" "DeepSeek-V3.2, 4 layers (1 dense), hidden 7168, 128 heads"
expect "V3.2 indexer" "$out" "DSA indexer: 64 heads x 128, top 2048 tokens per query"
expect "V3.2 cache" "$out" "cache per token: 1408 bytes per layer in bf16 (latent 1024 + rope 128 + index key 256), 788 with an FP8 latent and key"

out=$("$ina" model info --model v3.2-tiny 2>&1) || { echo "FAIL: v3.2-tiny exit $?"; failed=1; }
expect "v3.2-tiny indexer" "$out" "DSA indexer: 3 heads x 32, top 8 tokens per query"
expect "v3.2-tiny cache" "$out" "cache per token: 224 bytes per layer in bf16 (latent 128 + rope 32 + index key 64), 136 with an FP8 latent and key"

out=$("$ina" model info --model tiny 2>&1) || { echo "FAIL: tiny exit $?"; failed=1; }
expect "tiny named" "$out" "DeepSeek-V3, 4 layers (1 dense)"
expect "tiny cache" "$out" "cache per token: 160 bytes per layer in bf16 (latent 128 + rope 32), 100 with an FP8 latent;"
if grep -q "indexer" <<<"$out"; then echo "FAIL: tiny shows an indexer"; failed=1; fi

rc=0
out=$("$ina" model info --model no-such-model 2>&1) || rc=$?
[ "$rc" = 1 ] || { echo "FAIL: an unknown model exited $rc, not 1"; failed=1; }
expect "unknown model refused" "$out" "model 'no-such-model' is neither a checkpoint directory nor a built-in model"

[ "$failed" = 0 ] && echo "test_model_info: passed"
exit "$failed"
