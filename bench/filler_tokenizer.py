#!/usr/bin/env python3
"""Writes a tokenizer directory whose ids cover a built-in model's whole vocabulary, for
serving benchmarks of the built-ins that carry no tokenizer (random:v2-lite has 102400
ids, the built-in tokenizer 1024): the built-in tokenizer's files (tokenizer/builtin_tiny*.json)
with plain vocabulary tokens appended, id i spelled "Ġw<i>" (ByteLevel's form of " w<i>"),
so every id a random-weight model samples decodes to a short word. No merge makes them,
so text prompts encode as the built-in tokenizer does; token-id prompts reach all ids.

usage: bench/filler_tokenizer.py VOCAB OUT_DIR"""
import json
import os
import sys


def main():
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) == 2 else 2
    vocab, out = int(sys.argv[1]), sys.argv[2]
    here = os.path.dirname(os.path.abspath(__file__))
    tok_dir = os.path.join(here, "..", "tokenizer")
    with open(os.path.join(tok_dir, "builtin_tiny.json")) as f:
        tok = json.load(f)
    ids = set(tok["model"]["vocab"].values()) | {a["id"] for a in tok.get("added_tokens", [])}
    if vocab < len(ids):
        print(f"filler_tokenizer: VOCAB {vocab} is below the built-in tokenizer's {len(ids)} ids", file=sys.stderr)
        return 2
    for i in range(max(ids) + 1, vocab):
        tok["model"]["vocab"]["\u0120w%d" % i] = i
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w") as g:
        json.dump(tok, g, ensure_ascii=False)
    with open(os.path.join(tok_dir, "builtin_tiny_config.json")) as f, \
            open(os.path.join(out, "tokenizer_config.json"), "w") as g:
        g.write(f.read())
    print(f"filler_tokenizer: {vocab} ids in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
