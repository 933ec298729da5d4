#!/usr/bin/env python3
"""Compares ina's native chat formats (tokenizer/chat_format.h) with Hugging Face
transformers' rendering of the release chat templates in tests/chat/templates.

For every template, --count random conversations (seeded: 1-6 messages, an optional system
prompt, multi-line, unicode and empty content, </think> inside answers, add_generation_prompt
and, where the template has it, thinking on and off) are rendered by transformers'
apply_chat_template(tokenize=False) on a tokenizer carrying the template and by
chat_render_driver, and the two texts must be equal byte for byte. Conversations a template
fails on (a null content) must be refused by ina too; roles ina does not render (tool) and
thinking on a format without it must be refused with a message naming the message and field.
Recognition: each template must be recognized as its format, re-laid-out copies too, and
generic templates (ChatML, Llama-3, Mistral) must be refused.

Exit 0 when everything held, 1 otherwise, 77 when jinja2 or transformers is missing.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"

# template file -> (format, has thinking)
TEMPLATES = {
    "deepseek-v2-lite-chat.jinja": ("deepseek-v2", False),
    "deepseek-v3.jinja": ("deepseek-v3", False),
    "deepseek-v3-0324.jinja": ("deepseek-v3-0324", False),
    "deepseek-v3.1.jinja": ("deepseek-v3.1", True),
    "deepseek-v3.2-exp.jinja": ("deepseek-v3.2-exp", True),
}

GENERIC = {
    "chatml": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "llama-3": "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
    "mistral": "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}",
}

PIECES = [
    "Hello", "How are you?", "1+1=?", "   leading and trailing   ", "tabs\there", "line one\nline two\n",
    "\n", "\n\n", "crlf\r\nline", "Ünïcödé", "日本語のテキスト", "中文：你好，世界！", "emoji 🤖🚀", "עברית", "e\u0301",
    "math: ∑ x² ≤ ∞", "quotes ' \" `", "back\\slash \\n", "{{ not jinja }}", "{% if x %}", "<think>", "</think>",
    "<｜User｜>", "<｜Assistant｜>", EOS, "User: ", "Assistant:", "```json\n{\"a\": 1}\n```", "\u00a0nbsp",
]


def rand_text(rng, allow_think):
    r = rng.random()
    if r < 0.12:
        return ""
    parts = []
    for _ in range(rng.randint(1, 5)):
        p = rng.choice(PIECES)
        if not allow_think and "think>" in p:
            p = "plain"
        parts.append(p)
        parts.append(rng.choice(["", " ", "\n", "  "]))
    return "".join(parts)


def rand_answer(rng):
    s = rand_text(rng, True)
    if rng.random() < 0.3:  # a reasoning part before the answer, sometimes twice
        s = rand_text(rng, False) + "</think>" + s
        if rng.random() < 0.3:
            s = rand_text(rng, False) + "</think>" + s
    return s


def rand_conversation(rng):
    n = rng.randint(1, 6)
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": rand_text(rng, True)})
    alternate = rng.random() < 0.8
    for i in range(n - len(msgs) if msgs else n):
        if alternate:
            role = "user" if i % 2 == 0 else "assistant"
        else:
            role = rng.choice(["user", "assistant", "system", "user", "assistant"])
        msgs.append({"role": role, "content": rand_answer(rng) if role == "assistant" else rand_text(rng, True)})
    if not msgs:
        msgs.append({"role": "user", "content": rand_text(rng, True)})
    return msgs


def relaid(t):
    """The template laid out as a person would: spaces in tags, trim markers, indentation."""
    t = t.replace("{%-", "{%").replace("-%}", "%}")
    t = t.replace("{%", "{%- ").replace("%}", " -%}\n    ")
    return t.replace("{{", "{{ ").replace("}}", " }}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", required=True)
    ap.add_argument("--templates", required=True)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    try:
        import jinja2  # noqa: F401
        import transformers
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast
    except Exception as e:  # noqa: BLE001
        print(f"check_chat_templates: skipped: jinja2/transformers/tokenizers unavailable ({e})")
        return 77

    def make_tokenizer(template, bos, eos):
        tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                      bos_token=bos, eos_token=eos, unk_token="<unk>")
        tok.chat_template = template
        return tok

    rng = random.Random(args.seed)
    requests, expect = [], []  # expect[i]: ("equal", text, where) | ("refuse", substring, where)
    for fname, (fmt, has_thinking) in TEMPLATES.items():
        template = open(os.path.join(args.templates, fname), encoding="utf-8").read()
        requests.append({"op": "recognize", "template": template})
        expect.append(("format", fmt, fname))
        requests.append({"op": "recognize", "template": relaid(template)})
        expect.append(("format", fmt, fname + " re-laid-out"))
        toks = {"deepseek": make_tokenizer(template, BOS, EOS), "other": make_tokenizer(template, "<s>", "</s>")}
        for k in range(args.count):
            msgs = rand_conversation(rng)
            agp = rng.random() < 0.5
            thinking = has_thinking and rng.random() < 0.5
            which = "other" if rng.random() < 0.1 else "deepseek"
            bos, eos = (BOS, EOS) if which == "deepseek" else ("<s>", "</s>")
            where = f"{fname} #{k}"
            req = {"op": "render", "format": fmt, "messages": msgs, "add_generation_prompt": agp,
                   "thinking": thinking, "bos_token": bos, "eos_token": eos}
            kind = rng.random()
            if kind < 0.05:  # a null content: the template fails on it, ina must refuse it
                i = rng.randrange(len(msgs))
                msgs[i]["content"] = None
                try:
                    toks[which].apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, thinking=thinking)
                    print(f"note: {where}: the template accepted a null content")
                except Exception:  # noqa: BLE001
                    pass
                requests.append(req)
                expect.append(("refuse", f"messages[{i}].content is NULL", where))
                continue
            if kind < 0.08:  # a tool result: rendered by the template, refused by ina
                i = rng.randrange(len(msgs))
                msgs[i]["role"] = "tool"
                requests.append(req)
                expect.append(("refuse", f"messages[{i}].role: 'tool' is not supported by {fmt}", where))
                continue
            if kind < 0.10 and not has_thinking:  # thinking on a format without it
                req["thinking"] = True
                requests.append(req)
                expect.append(("refuse", f"thinking: {fmt} has no thinking mode", where))
                continue
            kwargs = {"thinking": True} if thinking else ({"thinking": False} if has_thinking and rng.random() < 0.5 else {})
            text = toks[which].apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, **kwargs)
            requests.append(req)
            expect.append(("equal", text, where))
    for name, t in GENERIC.items():
        requests.append({"op": "recognize", "template": t})
        expect.append(("refuse", "not one of the known DeepSeek formats", "generic " + name))

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump({"requests": requests}, f, ensure_ascii=False)
        path = f.name
    try:
        proc = subprocess.run([args.driver, path], capture_output=True, timeout=120)
    finally:
        os.unlink(path)
    if proc.returncode != 0:
        print(f"check_chat_templates: driver failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
        return 1
    results = json.loads(proc.stdout.decode("utf-8"))["results"]
    assert len(results) == len(requests)

    counts = {"equal": 0, "refuse": 0, "format": 0}
    failures = []
    for req, (kind, want, where), res in zip(requests, expect, results):
        if kind == "equal":
            ok = res.get("ok") and res["text"] == want
            if not ok:
                failures.append(f"{where}: messages={json.dumps(req['messages'], ensure_ascii=False)} "
                                f"add_generation_prompt={req['add_generation_prompt']} thinking={req['thinking']}\n"
                                f"  transformers: {want!r}\n  ina:          "
                                f"{res.get('text') if res.get('ok') else 'refused: ' + res.get('error', '')!r}")
        elif kind == "refuse":
            ok = not res.get("ok") and want in res.get("error", "")
            if not ok:
                failures.append(f"{where}: expected a refusal naming {want!r}, got {res}")
        else:
            ok = res.get("ok") and res.get("format") == want
            if not ok:
                failures.append(f"{where}: expected format {want}, got {res}")
        if ok:
            counts[kind] += 1
    total = {k: sum(1 for e in expect if e[0] == k) for k in counts}
    for f in failures[:10]:
        print("MISMATCH", f)
    print(f"check_chat_templates: transformers {transformers.__version__}, seed {args.seed}, "
          f"{len(TEMPLATES)} templates x {args.count} conversations: "
          f"{counts['equal']}/{total['equal']} renderings equal, {counts['refuse']}/{total['refuse']} refusals, "
          f"{counts['format']}/{total['format']} recognitions")
    print(f"{len(requests) - len(failures)} passed, {len(failures)} failed")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
