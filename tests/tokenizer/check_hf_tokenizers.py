#!/usr/bin/env python3
"""Compares ina's tokenizer with Hugging Face `tokenizers` on random text.

Builds several tokenizer.json files with the library (BPE trained on mixed-script text:
DeepSeek-V3's Sequence of Split regexes then ByteLevel(add_prefix_space=false,
use_regex=false); GPT-2's ByteLevel with its regex under NFC and individual digits; NFKC
with the other Split behaviors, invert, Digits and ignore_merges; merges written in both
JSON forms; byte_fallback with a ByteFallback / Fuse / Strip / Replace decoder; unk_token
with fuse_unk; added special tokens with lstrip / rstrip / single_word / normalized
variants; a TemplateProcessing BOS), then draws random strings (seeded) that mix Latin,
CJK, kana, Hangul, Cyrillic, Greek, Arabic and Devanagari, emoji with ZWJ sequences,
whitespace runs (spaces, tabs, newlines, CR LF, NEL, ideographic and no-break spaces),
digit runs, punctuation, characters that NFC / NFKC change, the added tokens themselves
and invalid UTF-8 bytes. For those the reference is `tokenizers` on
bytes.decode('utf-8', errors='replace'), as ina reads invalid UTF-8.

tokenize_driver (tests/tokenizer/tokenize_driver.c) encodes every string with ina and
decodes the ids; the ids must equal `tokenizers`' for every string, and ina's decode of
them must equal `tokenizers`' decode. The driver also checks that the streaming
detokenizer adds up to the decode and never emits part of a character.

Usage: check_hf_tokenizers.py --driver build/tests/tokenizer/tokenize_driver [--count 100000]
       [--seed 1] [--keep DIR]
Exits 77 (skipped) when `tokenizers` is not importable.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
except ImportError:
    print("check_hf_tokenizers: skipped (the Python package `tokenizers` is not importable)")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tokenizer"))
import make_builtin  # noqa: E402  (DeepSeek-V3's pre-tokenizer regexes)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"            # lstrip
ASSISTANT = "<｜Assistant｜>"  # rstrip
TOOL = "<tool_call>"          # lstrip and rstrip
WORD = "zork"                 # single_word, not special
PHRASE = "ﬁne print"          # normalized (its NFKC form is "fine print"), not special
SPECIALS = [BOS, EOS, USER, ASSISTANT, TOOL]

# ---- random text --------------------------------------------------------------------

WORDS = ("the of and tokenizer model DeepSeek inference Hello World naïve café résumé ÉCOLE "
         "don't it's we'll they're I'm you've she'd zork zorkzork print fine").split()
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["...", "—", "–", "“", "”", "«", "»", "、", "。", "！", "？",
                                                    "・", "¿", "¡", "§", "©", "€", "£", "→", "∑", "√"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", " \n", "\u3000", "\u00a0", "\u2003", "\x0b",
          "\x0c", "\x85", "\u2028", " \t ", " \x85 ", "\u180e ", "\u205f"]
EMOJI = ["😀", "😂", "🙏", "🚀", "🎉", "👍🏽", "👨‍👩‍👧‍👦", "👩‍💻", "🏳️‍🌈", "❤️", "🇯🇵", "🇫🇷", "1️⃣", "✨",
         "🤖", "🧑🏿‍🚀", "☕"]
NORMALIZABLE = ["e\u0301", "A\u030a", "\u212b", "ﬁ", "ﬂ", "Ａ", "ｂ", "１２", "①", "²", "™", "㎏", "ｶ", "ﾞ",
                "\u1e9b\u0323", "Ω", "ǅ", "ᄀ\u1161", "Ⅻ", "½"]
INVALID = [b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\x80", b"\xbf\xbf",
           b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\xe0\x80\x80", b"\xf8\x88\x80\x80\x80"]


def rand_range(rng, lo, hi, n):
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


def rand_piece(rng):
    k = rng.random()
    n = rng.randint(1, 8)
    if k < 0.22:
        w = rng.choice(WORDS)
        return rng.choice(["", " "]) + (w.capitalize() if rng.random() < 0.2 else w)
    if k < 0.30:
        return rand_range(rng, 0x61, 0x7A, n) if rng.random() < 0.5 else rand_range(rng, 0xC0, 0xFF, n).replace(
            "×", "x").replace("÷", "y")
    if k < 0.36:
        return rng.choice([rand_range(rng, 0x4E00, 0x9FA5, n), rand_range(rng, 0x3041, 0x3096, n),
                           rand_range(rng, 0x30A1, 0x30FA, n), rand_range(rng, 0xAC00, 0xD7A3, n)])
    if k < 0.40:
        return rand_range(rng, 0x0410, 0x044F, n)
    if k < 0.43:
        return rand_range(rng, 0x0391, 0x03A9, n).replace("\u03a2", "Σ")
    if k < 0.47:
        s = ""
        for _ in range(n):
            s += chr(rng.randint(0x0621, 0x063A))
            if rng.random() < 0.3:
                s += chr(rng.randint(0x064B, 0x0652))
        return s
    if k < 0.51:
        s = ""
        for _ in range(n):
            s += chr(rng.randint(0x0915, 0x0939))
            if rng.random() < 0.5:
                s += chr(rng.choice([0x093E, 0x093F, 0x0940, 0x0947, 0x094B, 0x094D, 0x0902]))
        return s
    if k < 0.57:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 3)))
    if k < 0.68:
        return "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 3)))
    if k < 0.75:
        d = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 9)))
        if rng.random() < 0.15:
            d += rng.choice(["٣٤", "१२", "１２", "²³", "½"])
        return d
    if k < 0.83:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 4)))
    if k < 0.88:
        return rng.choice(NORMALIZABLE)
    if k < 0.95:
        t = rng.choice(SPECIALS + [WORD, PHRASE, "fine print", "<tool_call", "<｜User"])
        return rng.choice(["", " ", "  ", "\n", "x"]) + t + rng.choice(["", " ", "  ", "\n", "y"])
    if k < 0.97:
        return rng.choice(["\x00", "\x07", "\x1b", "\x7f", "\u200b", "\u200d", "\ufeff", "\u00ad", "\u180e",
                           "\x1c", "\u2160", "x\u0301"])
    return rng.choice(["'s", "'t", "'re", "'ll", " 's", "'D"])


def rand_text(rng):
    parts = [rand_piece(rng).encode("utf-8") for _ in range(rng.randint(1, 12))]
    if rng.random() < 0.10:
        for _ in range(rng.randint(1, 3)):
            parts.insert(rng.randint(0, len(parts)), rng.choice(INVALID))
    return b"".join(parts)


# ---- tokenizers -----------------------------------------------------------------------


def training_text(rng):
    texts = [rand_text(rng).decode("utf-8", errors="replace") for _ in range(4000)]
    for path in make_builtin.training_files(ROOT):
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def added_tokens(normalized_phrase=True):
    return [
        AddedToken(BOS, special=True, normalized=False),
        AddedToken(EOS, special=True, normalized=False),
        AddedToken(USER, special=True, normalized=False, lstrip=True),
        AddedToken(ASSISTANT, special=True, normalized=False, rstrip=True),
        AddedToken(TOOL, special=True, normalized=False, lstrip=True, rstrip=True),
        AddedToken(WORD, special=False, normalized=False, single_word=True),
        AddedToken(PHRASE, special=False, normalized=normalized_phrase),
    ]


def train(model, pre, normalizer, decoder, texts, vocab_size, alphabet=None, limit_alphabet=None):
    tok = Tokenizer(model)
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoder
    kw = dict(vocab_size=vocab_size, min_frequency=2, show_progress=False, special_tokens=[BOS, EOS])
    if alphabet is not None:
        kw["initial_alphabet"] = alphabet
    if limit_alphabet is not None:
        kw["limit_alphabet"] = limit_alphabet
    tok.train_from_iterator(texts, trainer=trainers.BpeTrainer(**kw))
    return tok


def with_json(tok, edit):
    data = json.loads(tok.to_str())
    edit(data)
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def legacy_merges(data):
    data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in data["model"]["merges"]]


def build_all(rng):
    texts = training_text(rng)
    out = {}

    # DeepSeek-V3: its pre-tokenizer and decoder, merges as pairs.
    v3 = train(models.BPE(), make_builtin.deepseek_v3_pre_tokenizer(), None, decoders.ByteLevel(), texts, 3000,
               alphabet=pre_tokenizers.ByteLevel.alphabet())
    v3.post_processor = processors.ByteLevel(trim_offsets=False)
    v3.add_tokens(added_tokens())
    out["deepseek_v3"] = (v3, [])
    # The same with a BOS template and add_special.
    v3b = Tokenizer.from_str(v3.to_str())
    v3b.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, 0)])
    out["deepseek_v3_bos"] = (v3b, ["--add-special"])
    out["deepseek_v3_skip"] = (v3, ["--skip-special"])

    # GPT-2 style: NFC, individual digits, ByteLevel with its regex and a prefix space;
    # merges in the legacy "a b" form.
    gpt2_pre = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
    gpt2 = train(models.BPE(), gpt2_pre, normalizers.NFC(), decoders.ByteLevel(), texts, 2500,
                 alphabet=pre_tokenizers.ByteLevel.alphabet())
    # ignore_merges with whole words in the vocabulary that no merge builds: the merges
    # that make the random text's words are taken out (a trained vocabulary's tokens are
    # all built by its merges, which would hide ignore_merges).
    def whole_words(d):
        to_bytes = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        words = {to_bytes.pre_tokenize_str(f)[0][0] for w in WORDS for f in (w, " " + w, " " + w.capitalize())}
        merges = d["model"]["merges"]
        d["model"]["merges"] = [m for m in merges if "".join(m) not in words]
        d["model"]["ignore_merges"] = True

    out["gpt2_nfc_ignore_merges_words"] = (with_json(gpt2, whole_words), [])
    gpt2.add_tokens(added_tokens())
    out["gpt2_nfc_legacy"] = (gpt2, ["legacy"])

    # NFKC, the other Split behaviors, invert, contiguous digits, ignore_merges.
    splits = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next"),
        pre_tokenizers.Split(Regex(r"[\p{P}\p{S}]"), behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"\p{Han}+|\p{Hiragana}+|\p{Katakana}+"), behavior="isolated", invert=True),
        pre_tokenizers.Split("--", behavior="removed"),
        pre_tokenizers.Split(Regex(r"[aeiou]"), behavior="contiguous"),
        pre_tokenizers.Digits(individual_digits=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    nfkc = train(models.BPE(ignore_merges=True), splits,
                 normalizers.Sequence([normalizers.NFKC(), normalizers.NFC()]), decoders.ByteLevel(), texts, 2500,
                 alphabet=pre_tokenizers.ByteLevel.alphabet())
    nfkc.add_tokens(added_tokens())
    out["nfkc_splits_ignore_merges"] = (nfkc, [])
    out["nfkc_splits_merges_legacy"] = (with_json(nfkc, lambda d: d["model"].update(ignore_merges=False)), ["legacy"])

    # Oniguruma's classes where they differ from PCRE2's: \s (U+0085 in, U+180E out), \w
    # and \W outside and inside brackets (No such as ² counts outside only), with
    # Removed so that every difference shows in the ids.
    ws = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\s+"), behavior="removed"),
                                  pre_tokenizers.Split(Regex(r"\W+"), behavior="removed"),
                                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    wsr = train(models.BPE(), ws, None, decoders.ByteLevel(), texts, 1500, alphabet=pre_tokenizers.ByteLevel.alphabet())
    wsr.add_tokens(added_tokens())
    out["classes_outside_brackets"] = (wsr, [])
    cls = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"[^\w\s]+|[\s]"), behavior="removed"),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    clr = train(models.BPE(), cls, None, decoders.ByteLevel(), texts, 1500, alphabet=pre_tokenizers.ByteLevel.alphabet())
    out["classes_inside_brackets"] = (clr, [])

    # Not byte-level: characters, byte_fallback for the rest, a Llama-style decoder.
    bf_dec = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                decoders.Strip(" ", 1, 0)])
    bf_pre = pre_tokenizers.Sequence([pre_tokenizers.Split(" ", behavior="merged_with_next"),
                                      pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")])
    bf = train(models.BPE(byte_fallback=True, unk_token="<unk>"), bf_pre, normalizers.NFC(), bf_dec, texts, 1500,
               limit_alphabet=150)

    def add_bytes(d):
        vocab = d["model"]["vocab"]
        n = max(vocab.values()) + 1
        for b in range(256):
            name = f"<0x{b:02X}>"
            if name not in vocab:
                vocab[name] = n
                n += 1
        if "<unk>" not in vocab:
            vocab["<unk>"] = n

    bfj = with_json(bf, add_bytes)
    bfj.add_tokens(added_tokens(normalized_phrase=False))
    out["byte_fallback"] = (bfj, [])

    # unk_token with fuse_unk instead of byte fallback (no decoder: tokens joined).
    def unk(d):
        add_bytes(d)
        d["model"].update(byte_fallback=False, fuse_unk=True)
        d["decoder"] = None

    unkj = with_json(bf, unk)
    unkj.add_tokens(added_tokens())
    out["unk_fuse"] = (unkj, [])
    return out


# ---- comparison -----------------------------------------------------------------------


def run_driver(driver, tok_path, texts_path, out_path, flags):
    r = subprocess.run([driver, tok_path, texts_path, out_path, "--threads", "2"] + flags, capture_output=True,
                       text=True)
    if r.returncode not in (0, 3):
        sys.exit(f"check_hf_tokenizers: {driver} failed ({r.returncode}): {r.stderr[-2000:]}")
    with open(out_path, "rb") as f:
        data = f.read()
    res, off = [], 0
    while off < len(data):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        ids = list(struct.unpack_from(f"<{n}i", data, off))
        off += 4 * n
        (tl,) = struct.unpack_from("<I", data, off)
        off += 4
        res.append((ids, data[off:off + tl].decode("utf-8")))
        off += tl
    return res, r.returncode, r.stderr


# Regex classes, on every code point assigned in this Python's Unicode tables (Python
# 3.11: Unicode 14, which PCRE2 10.42 also has): the characters a Split(pattern,
# Removed) leaves must be the same. Then the normalization forms of every such code
# point on its own: ina must give `tokenizers`' result, or, where `tokenizers`' tables
# (the unicode-normalization crate) are older than utf8proc's and disagree with Python's
# unicodedata, unicodedata's; those are counted apart.
CLASS_PATTERNS = [r"\w", r"[\w]", r"\W", r"[^\w]", r"\s", r"[\s]", r"\S", r"\d", r"[^\w\s]", r"\p{N}",
                  r"[^\r\n\p{L}\p{P}\p{S}]", r"[\p{L}\p{M}]", r"\p{P}|\p{S}", r"[一-龥\u3040-ゟ゠-ヿ]",
                  r"\p{Han}", r"\p{Hiragana}", r"\p{Katakana}", r"[\p{Latin}\p{Greek}]", r"\p{Cyrillic}", r"\p{Arabic}",
                  r"\p{Devanagari}", r"\P{Common}", r"\p{Inherited}", r"\p{Hangul}"]


def byte_vocab():
    return {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}


def write_texts(path, texts):
    with open(path, "wb") as f:
        for t in texts:
            f.write(struct.pack("<I", len(t)) + t)


def check_classes(driver, work):
    import unicodedata
    cps = [c for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    text = "".join(chr(c) for c in cps)
    texts_path = os.path.join(work, "classes.bin")
    write_texts(texts_path, [text.encode("utf-8")])
    tok_path = os.path.join(work, "classes.json")
    failed = 0
    for pat in CLASS_PATTERNS:
        tok = Tokenizer(models.BPE(vocab=byte_vocab(), merges=[]))
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pat), behavior="removed"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.save(tok_path)
        ref = tok.encode(text).ids
        got, rc, err = run_driver(driver, tok_path, texts_path, os.path.join(work, "classes.out"), [])
        if got[0][0] != ref:
            failed += 1
            diff = sorted(ord(c) for c in set(tok.decode(ref)) ^ set(got[0][1]))
            print(f"class {pat!r}: differs on {len(diff)} code points, e.g. {[hex(c) for c in diff[:12]]}")
    print(f"regex classes: {len(CLASS_PATTERNS)} patterns on {len(cps)} code points: "
          f"{'all equal' if not failed else f'{failed} differ'}")

    singles_path = os.path.join(work, "singles.bin")
    write_texts(singles_path, [chr(c).encode("utf-8") for c in cps])
    forms = {"NFC": normalizers.NFC, "NFD": normalizers.NFD, "NFKC": normalizers.NFKC, "NFKD": normalizers.NFKD}
    for form, cls in forms.items():
        tok = Tokenizer(models.BPE(vocab=byte_vocab(), merges=[]))
        tok.normalizer = cls()
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.save(tok_path)
        ref = [e.ids for e in tok.encode_batch([chr(c) for c in cps])]
        got, rc, err = run_driver(driver, tok_path, singles_path, os.path.join(work, "singles.out"), [])
        newer, bad = [], []
        for i, c in enumerate(cps):
            if got[i][0] == ref[i]:
                continue
            want = unicodedata.normalize(form, chr(c))
            if got[i][1] == want and tok.decode(ref[i]) != want:
                newer.append(c)
            else:
                bad.append(c)
        print(f"{form}: {len(cps)} code points, ina differs from tokenizers on {len(bad)}"
              f"{' e.g. ' + str([hex(c) for c in bad[:8]]) if bad else ''}; {len(newer)} more where tokenizers' "
              f"tables are older than Unicode 14 (ina gives unicodedata's form){' e.g. ' + str([hex(c) for c in newer[:6]]) if newer else ''}")
        failed += bool(bad)
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--driver", required=True)
    ap.add_argument("--count", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", help="write the tokenizers and texts here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        class_failures = check_classes(args.driver, args.keep or tmp)

    t0 = time.time()
    rng = random.Random(args.seed)
    toks = build_all(rng)
    texts = [rand_text(rng) for _ in range(args.count)]
    strs = [t.decode("utf-8", errors="replace") for t in texts]
    invalid = sum(1 for t, s in zip(texts, strs) if s.encode("utf-8") != t)

    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or tmp
        os.makedirs(work, exist_ok=True)
        texts_path = os.path.join(work, "texts.bin")
        with open(texts_path, "wb") as f:
            for t in texts:
                f.write(struct.pack("<I", len(t)) + t)
        for name, (tok, flags) in toks.items():
            tok_path = os.path.join(work, f"{name}.json")
            text = tok.to_str()
            if "legacy" in flags:  # merges as "a b" strings, which `tokenizers` no longer writes
                data = json.loads(text)
                legacy_merges(data)
                text = json.dumps(data, ensure_ascii=False)
                tok = Tokenizer.from_str(text)
                flags = [f for f in flags if f != "legacy"]
            with open(tok_path, "w", encoding="utf-8") as f:
                f.write(text)
            add_special = "--add-special" in flags
            skip = "--skip-special" in flags
            ref_ids = [e.ids for e in tok.encode_batch(strs, add_special_tokens=add_special)]
            ref_text = tok.decode_batch(ref_ids, skip_special_tokens=skip)
            got, rc, err = run_driver(args.driver, tok_path, texts_path, os.path.join(work, f"{name}.out"), flags)
            bad_ids = [i for i in range(len(texts)) if got[i][0] != ref_ids[i]]
            bad_text = [i for i in range(len(texts)) if got[i][0] == ref_ids[i] and got[i][1] != ref_text[i]]
            status = "ok" if not bad_ids and not bad_text and rc == 0 else "FAILED"
            print(f"{name:28s} vocab {tok.get_vocab_size():5d}: {len(texts)} texts, ids differ in {len(bad_ids)}, "
                  f"decode differs in {len(bad_text)}, stream {'ok' if rc == 0 else 'FAILED'}: {status}")
            if rc != 0:
                print("  " + "\n  ".join(err.strip().splitlines()[:5]))
            for i in bad_ids[:3]:
                print(f"  text {i}: {texts[i]!r}\n    hf  {ref_ids[i]}\n    ina {got[i][0]}")
            for i in bad_text[:3]:
                print(f"  text {i}: {texts[i]!r}\n    hf  decode {ref_text[i]!r}\n    ina decode {got[i][1]!r}")
            if status != "ok":
                failed += 1
    print(f"check_hf_tokenizers: {len(toks)} tokenizers x {args.count} texts ({invalid} with invalid UTF-8), "
          f"{time.time() - t0:.1f} s: {'all equal' if not failed else f'{failed} tokenizer(s) differ'}")
    return 1 if failed or class_failures else 0


if __name__ == "__main__":
    sys.exit(main())
