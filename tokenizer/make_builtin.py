#!/usr/bin/env python3
"""Writes tokenizer/builtin_tiny.json, the built-in tokenizer of the built-in models
(tiny, v3.2-tiny: vocabulary 1024, BOS 0, EOS 1).

A byte-level BPE of exactly 1024 ids trained with Hugging Face `tokenizers` on this
repository's English documentation (README.md, then docs/*.md in name order), with
DeepSeek-V3's pre-tokenizer: the Sequence of three Split regexes (digit runs of up to
three, CJK / kana runs, then words, punctuation and whitespace) followed by
ByteLevel(add_prefix_space=false, use_regex=false), a ByteLevel decoder and
post-processor. Ids 0 and 1 are the special tokens BOS and EOS, 2..257 the 256 byte
symbols, the rest merges. The trainer is deterministic for a given input, so running the
script on the same documents writes the same file; the committed JSON is what the
library embeds (tokenizer/embed.cmake), so later edits of the documents change nothing
until the script is run again (which changes the built-in models' token ids).

The committed file was trained on the documents as of commit 6ed1fb3:
  python3 tokenizer/make_builtin.py --check --at 6ed1fb3
trains on them again (read from git) and compares.

Usage: python3 tokenizer/make_builtin.py [--check] [--at COMMIT]   (from the repository root)
--check: train again and fail when the result differs from the committed file.
--at COMMIT: read README.md and docs/*.md as they are in COMMIT instead of the work tree.
"""
import glob
import json
import os
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
VOCAB_SIZE = 1024

# DeepSeek-V3's tokenizer.json pre-tokenizer regexes (the \r \n in the third are the
# characters themselves, as the JSON holds them).
DEEPSEEK_V3_SPLITS = [
    r"\p{N}{1,3}",
    "[一-龥\u3040-ゟ゠-ヿ]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
]


def deepseek_v3_pre_tokenizer():
    steps = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in DEEPSEEK_V3_SPLITS]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def training_files(root):
    return [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


def git_texts(root, rev):
    def show(path):
        return subprocess.run(["git", "-C", root, "show", f"{rev}:{path}"], check=True, capture_output=True).stdout
    names = subprocess.run(["git", "-C", root, "ls-tree", "--name-only", rev, "docs/"], check=True,
                           capture_output=True, text=True).stdout.split()
    paths = ["README.md"] + sorted(n for n in names if n.endswith(".md"))
    return [show(p).decode("utf-8") for p in paths]


def build(root, rev=None):
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = deepseek_v3_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=1, show_progress=False,
                                  special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    if rev:
        texts = git_texts(root, rev)
    else:
        texts = []
        for path in training_files(root):
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        sys.exit(f"make_builtin: trained {tok.get_vocab_size()} ids, not {VOCAB_SIZE}: more text is needed")
    if tok.token_to_id(BOS) != 0 or tok.token_to_id(EOS) != 1:
        sys.exit("make_builtin: BOS / EOS are not ids 0 / 1")
    # Compact but one vocabulary entry or merge per line, so that a retrain diffs readably.
    data = json.loads(tok.to_str())
    lines = []
    for key, value in data.items():
        if key == "model":
            model = dict(value)
            vocab, merges = model.pop("vocab"), model.pop("merges")
            head = json.dumps(model, ensure_ascii=False)[:-1]
            body = ",\n".join(json.dumps(k, ensure_ascii=False) + ":" + str(v) for k, v in vocab.items())
            mbody = ",\n".join(json.dumps(m, ensure_ascii=False) for m in merges)
            lines.append(f'"model":{head},"vocab":{{\n{body}}},\n"merges":[\n{mbody}]}}')
        else:
            lines.append(json.dumps(key) + ":" + json.dumps(value, ensure_ascii=False))
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    if json.loads(text) != data:
        sys.exit("make_builtin: the compact form does not read back as the tokenizer")
    return text


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(root, "tokenizer", "builtin_tiny.json")
    args = sys.argv[1:]
    rev = args[args.index("--at") + 1] if "--at" in args and args.index("--at") + 1 < len(args) else None
    text = build(root, rev)
    if "--check" in args:
        with open(out, encoding="utf-8") as f:
            if f.read() != text:
                sys.exit(f"make_builtin: {out} differs from a fresh training")
        print(f"{out}: up to date")
        return
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {out} ({len(text.encode())} bytes, {VOCAB_SIZE} ids)")


if __name__ == "__main__":
    main()
