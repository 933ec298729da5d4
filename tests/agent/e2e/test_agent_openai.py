#!/usr/bin/env python3
"""The OpenAI-compatible HTTP API of ina-agent, through the official `openai` client.

Starts `ina-agent --model tiny --device cpu --http-listen 127.0.0.1:0 --api-key-file F`
(the built-in model speaks text with its built-in tokenizer) and checks:

  * GET /v1/models and /health;
  * /v1/completions, greedy, whole and streamed: the streamed chunks add up to the
    whole answer's text, finish_reason "length" after max_tokens with ignore_eos, usage
    counts (completion_tokens = max_tokens, total = prompt + completion);
    include_usage's final chunk; a list of prompts gives one choice per prompt, each
    equal to that prompt alone;
  * stop strings: a piece of a greedy answer's middle as the stop string ends the answer
    right before it (finish_reason "stop"), whole and streamed;
  * /v1/chat/completions, whole and streamed, when the model has a chat format;
  * 32 concurrent greedy streams whose texts equal the same requests run alone;
  * a client that disconnects mid-stream: its request is cancelled (the running requests
    gauge of /metrics goes back to 0 and the cancelled counter moves) while the agent
    keeps serving;
  * bad input, each answered with its HTTP status and an OpenAI error body whose
    message names the field (and `param` where there is one), after which a good
    request still works: bad JSON, a wrong type, temperature out of range, n = 2,
    unknown model (404), no or a wrong API key (401), unknown path (404), wrong method
    (405), a body over the limit (413), prompt ids outside the vocabulary, max_tokens
    beyond the context;
  * draining: after SIGTERM a running stream goes on to its end while new requests get
    503, then the agent exits 0; an agent that admits one request and queues one answers
    429 beyond that; with --tls-cert / --tls-key the API answers over HTTPS only;
  * a checkpoint whose chat template is no DeepSeek format answers chat with a 400 that
    says so while completions keep working.

Exit status: 0 pass, 1 fail, 77 skip (no `openai` module for this python3; `pip install
openai`, or scripts/install-torch.sh, which installs the tests' Python packages).
"""
import argparse
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SKIP = 77
API_KEY = "e2e-openai-key"
START_TIMEOUT_S = 60.0

try:
    import openai
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import {e.name} (pip install openai; scripts/install-torch.sh installs it)")
    sys.exit(SKIP)


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = []

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed.append(what)
            print(f"FAIL: {what}", flush=True)
        return bool(cond)

    def equal(self, got, want, what):
        return self.check(got == want, f"{what}: got {got!r}, expected {want!r}")


def start_agent(agent, work, extra=(), model="tiny"):
    key_file = os.path.join(work, "key")
    with open(key_file, "w") as f:
        f.write(API_KEY + "\n")
    log = open(os.path.join(work, "agent.log"), "w+")
    cmd = [agent, "--model", model, "--device", "cpu", "--threads", "2", "--http-listen", "127.0.0.1:0",
           "--api-key-file", key_file, "--metrics-listen", "127.0.0.1:0", "--max-tokens", "8192", *extra]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + START_TIMEOUT_S
    http_port = metrics_port = None
    while time.time() < deadline:
        log.seek(0)
        text = log.read()
        m = re.search(r"HTTP API on 127\.0\.0\.1:(\d+)", text)
        mm = re.search(r"metrics on 127\.0\.0\.1:(\d+)", text)
        if m and mm and "serving\n" in text:
            http_port, metrics_port = int(m.group(1)), int(mm.group(1))
            break
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    if http_port is None:
        log.seek(0)
        print(log.read())
        proc.kill()
        raise SystemExit("FAIL: the agent did not start serving its HTTP API")
    return proc, log, http_port, metrics_port


def stop_agent(proc, c, what):
    """SIGTERM, and the agent must exit 0 within 30 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        c.equal(proc.wait(timeout=30), 0, f"{what}'s exit status")
    except subprocess.TimeoutExpired:
        proc.kill()
        c.check(False, f"{what} did not stop")


def raw(port, method, path, body=None, headers=None):
    """(status, parsed JSON or text) of one request, without the client."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    h = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    h.update(headers or {})
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    text = resp.read().decode("utf-8", "replace")
    conn.close()
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def metric(port, series):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def stream_text(client, **kw):
    chunks = list(client.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return text, finish, chunks


def check_unknown_template(agent, ina, c):
    """A checkpoint whose chat template is no DeepSeek format: chat answers 400 saying so,
    completions keep working. The checkpoint is tiny's (ina model init) with the built-in
    tokenizer's files and a ChatML template."""
    work = tempfile.mkdtemp(prefix="ina_openai_tmpl_")
    model = os.path.join(work, "model")
    subprocess.run([ina, "model", "init", "--config", "tiny", "--out", model], check=True, capture_output=True)
    here = os.path.dirname(os.path.abspath(__file__))
    tok_dir = os.path.join(here, "..", "..", "..", "tokenizer")
    with open(os.path.join(tok_dir, "builtin_tiny.json")) as f, open(os.path.join(model, "tokenizer.json"), "w") as g:
        g.write(f.read())
    with open(os.path.join(tok_dir, "builtin_tiny_config.json")) as f:
        config = json.load(f)
    config["chat_template"] = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with open(os.path.join(model, "tokenizer_config.json"), "w") as g:
        json.dump(config, g)
    proc, log, port, _ = start_agent(agent, work, [], model=model)
    try:
        name = model
        status, body = raw(port, "POST", "/v1/chat/completions",
                           {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        c.equal(status, 400, "an unknown chat template: chat status")
        c.check("DeepSeek" in json.dumps(body) and "chat-format" in json.dumps(body),
                f"an unknown chat template: the message says so: {body}")
        status, body = raw(port, "POST", "/v1/completions", {"model": name, "prompt": "Hi", "max_tokens": 4})
        c.equal(status, 200, "an unknown chat template: completions still work")
    finally:
        stop_agent(proc, c, "the template agent")


def check_tokenizer_option(agent, c):
    """--tokenizer DIR: the built-in tokenizer's files in a directory serve the same text as
    the built-in itself; a directory without tokenizer.json, or a tokenizer with fewer ids
    than the model's vocabulary, stops the agent at start with a message that says so."""
    here = os.path.dirname(os.path.abspath(__file__))
    tok_dir = os.path.join(here, "..", "..", "..", "tokenizer")
    work = tempfile.mkdtemp(prefix="ina_openai_tok_")
    good = os.path.join(work, "good")
    os.makedirs(good)
    with open(os.path.join(tok_dir, "builtin_tiny.json")) as f:
        tok = json.load(f)
    with open(os.path.join(good, "tokenizer.json"), "w") as g:
        json.dump(tok, g)
    with open(os.path.join(tok_dir, "builtin_tiny_config.json")) as f, \
            open(os.path.join(good, "tokenizer_config.json"), "w") as g:
        g.write(f.read())
    request = {"model": "tiny", "prompt": "The paged cache", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    texts = []
    for extra in ([], ["--tokenizer", good]):
        proc, log, port, _ = start_agent(agent, work, extra)
        try:
            status, body = raw(port, "POST", "/v1/completions", request)
            c.equal(status, 200, f"--tokenizer ({extra}): status")
            texts.append(body["choices"][0]["text"] if status == 200 else None)
        finally:
            stop_agent(proc, c, f"the agent with {extra}")
    c.check(texts[0] is not None and texts[0] == texts[1],
            f"--tokenizer with the built-in's files: the same text ({texts})")

    small = os.path.join(work, "small")
    os.makedirs(small)
    keep = 1000  # tiny's vocabulary has 1024 ids
    vocab = {t: i for t, i in tok["model"]["vocab"].items() if i < keep}
    tok["model"]["vocab"] = vocab
    tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                              if ("".join(m) if isinstance(m, list) else m.replace(" ", "")) in vocab]
    tok["added_tokens"] = [a for a in tok.get("added_tokens", []) if a["id"] < keep]
    with open(os.path.join(small, "tokenizer.json"), "w") as g:
        json.dump(tok, g)
    for path, want in ((os.path.join(work, "missing"), "tokenizer.json"), (small, "fewer than the model's vocabulary")):
        log_path = os.path.join(work, "refused.log")
        with open(log_path, "w") as log:
            rc = subprocess.run([agent, "--model", "tiny", "--device", "cpu", "--http-listen", "127.0.0.1:0",
                                 "--tokenizer", path], stdout=log, stderr=subprocess.STDOUT, timeout=60).returncode
        with open(log_path) as f:
            text = f.read()
        c.check(rc != 0 and want in text and path in text,
                f"--tokenizer {os.path.basename(path)}: refused at start, naming it (exit {rc}: {text[-300:]!r})")


def check_queue_full(agent, c):
    """An agent that admits one request and queues one more answers 429 beyond that."""
    work = tempfile.mkdtemp(prefix="ina_openai_queue_")
    proc, log, port, _ = start_agent(agent, work, ["--max-running", "1", "--max-queued-requests", "1"])
    conns, statuses = [], []
    try:
        body = json.dumps({"model": "tiny", "prompt": "q", "max_tokens": 3000, "temperature": 0, "ignore_eos": True,
                           "stream": True})
        for _ in range(3):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/v1/completions", body=body,
                         headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
            conns.append(conn)
        refused = None
        for conn in conns:
            resp = conn.getresponse()
            statuses.append(resp.status)
            if resp.status == 429:
                refused = json.loads(resp.read())
        c.check(429 in statuses, f"a full queue: one of three answered 429, got {statuses}")
        if refused:
            c.equal(refused["error"]["type"], "rate_limit_error", "429: error type")
            c.check("queue" in refused["error"]["message"], f"429: the message says why: {refused}")
    finally:
        for conn in conns:
            conn.close()
        stop_agent(proc, c, "the queue agent")


def check_tls(agent, c):
    """--tls-cert / --tls-key: the HTTP API answers over HTTPS (a self-signed certificate for
    127.0.0.1 that the client trusts), and not in plain HTTP."""
    if not shutil.which("openssl"):
        print("note: no openssl command; the TLS case is not run")
        return
    work = tempfile.mkdtemp(prefix="ina_openai_tls_")
    cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    proc, log, port, _ = start_agent(agent, work, ["--tls-cert", cert, "--tls-key", key])
    try:
        client = openai.OpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0, timeout=60,
                               http_client=openai.DefaultHttpx2Client(verify=cert))
        r = client.completions.create(model="tiny", prompt="secure", max_tokens=4, temperature=0,
                                      extra_body={"ignore_eos": True})
        c.equal(r.usage.completion_tokens, 4, "TLS: a completion over HTTPS")
        try:
            raw(port, "GET", "/v1/models")
            c.check(False, "TLS: a plain HTTP request was answered")
        except (http.client.HTTPException, OSError):
            c.check(True, "TLS: plain HTTP is refused")
    finally:
        stop_agent(proc, c, "the TLS agent")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", required=True)
    ap.add_argument("--ina", required=True)
    args = ap.parse_args()
    c = Checks()
    work = tempfile.mkdtemp(prefix="ina_openai_")
    proc, log, port, metrics_port = start_agent(args.agent, work)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    try:
        models = client.models.list()
        c.equal([m.id for m in models.data], ["tiny"], "/v1/models ids")
        status, _ = raw(port, "GET", "/health", headers={"Authorization": ""})
        c.equal(status, 200, "/health without a key")

        # Whole and streamed greedy completions.
        prompt = "The paged cache holds"
        whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                          extra_body={"ignore_eos": True})
        text = whole.choices[0].text
        c.equal(whole.choices[0].finish_reason, "length", "whole: finish_reason")
        c.equal(whole.usage.completion_tokens, 24, "whole: completion_tokens")
        c.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + 24, "whole: total_tokens")
        c.check(whole.usage.prompt_tokens >= 2, f"whole: prompt_tokens {whole.usage.prompt_tokens}")
        c.check(len(text) > 0, "whole: some text")
        s_text, s_finish, chunks = stream_text(client, model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                               extra_body={"ignore_eos": True},
                                               stream_options={"include_usage": True})
        c.equal(s_text, text, "streamed text = whole text")
        c.equal(s_finish, ["length"], "streamed finish reasons")
        c.check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices,
                "include_usage: a last chunk with usage and no choices")

        # Log probabilities: one entry per generated token; greedy picks the most likely.
        lp = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=3,
                                       extra_body={"ignore_eos": True})
        L = lp.choices[0].logprobs
        c.equal(len(L.tokens), 6, "logprobs: one token per generated token")
        c.equal("".join(L.tokens) == lp.choices[0].text or "\ufffd" in lp.choices[0].text, True,
                "logprobs: the tokens spell the text")
        c.check(all(x <= 0 for x in L.token_logprobs), f"logprobs: all <= 0: {L.token_logprobs}")
        c.check(all(1 <= len(t) <= 3 for t in L.top_logprobs), "logprobs: at most 3 alternatives each")
        c.check(all(abs(max(t.values()) - x) < 1e-6 for t, x in zip(L.top_logprobs, L.token_logprobs)),
                "logprobs: greedy tokens are the most likely")
        c.equal(lp.choices[0].text, text[:len(lp.choices[0].text)], "logprobs: the same greedy text")
        chat_lp = raw(port, "POST", "/v1/chat/completions",
                      {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                       "temperature": 0, "logprobs": True, "top_logprobs": 2})
        if chat_lp[0] == 200:
            content = chat_lp[1]["choices"][0]["logprobs"]["content"]
            c.equal(len(content), chat_lp[1]["usage"]["completion_tokens"], "chat logprobs: one per token")
            c.check(all(len(x["top_logprobs"]) == 2 and x["logprob"] <= 0 for x in content),
                    "chat logprobs: 2 alternatives each")

        # A list of prompts: one choice each, equal to the prompt alone.
        prompts = ["Experts hold", "The scheduler admits", "A"]
        multi = client.completions.create(model="tiny", prompt=prompts, max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True})
        c.equal(sorted(ch.index for ch in multi.choices), [0, 1, 2], "prompt list: choice indexes")
        for ch in multi.choices:
            alone = client.completions.create(model="tiny", prompt=prompts[ch.index], max_tokens=12, temperature=0,
                                              extra_body={"ignore_eos": True})
            c.equal(ch.text, alone.choices[0].text, f"prompt list: choice {ch.index} = alone")

        # Stop strings: a piece of the greedy answer's middle.
        if len(text) >= 8:
            cut = len(text) // 2
            stop = text[cut:cut + 3]
            want = text[:text.find(stop)]
            got = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, stop=[stop],
                                            extra_body={"ignore_eos": True})
            c.equal(got.choices[0].text, want, f"stop {stop!r}: whole text")
            c.equal(got.choices[0].finish_reason, "stop", "stop: whole finish_reason")
            s_text, s_finish, _ = stream_text(client, model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                              stop=[stop], extra_body={"ignore_eos": True})
            c.equal(s_text, want, "stop: streamed text")
            c.equal(s_finish, ["stop"], "stop: streamed finish_reason")
        else:
            c.check(False, f"the greedy answer {text!r} is too short for the stop test")

        # Chat, when the model has a chat format.
        status, body = raw(port, "POST", "/v1/chat/completions",
                           {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8,
                            "temperature": 0})
        if status == 200:
            chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                                  max_tokens=8, temperature=0)
            s = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                               max_tokens=8, temperature=0, stream=True)
            parts = list(s)
            c.equal(parts[0].choices[0].delta.role, "assistant", "chat stream: the role first")
            c.equal("".join(p.choices[0].delta.content or "" for p in parts if p.choices), chat.choices[0].message.content,
                    "chat: streamed = whole")
        else:
            c.check(status == 400 and "chat" in json.dumps(body), f"chat without a format: 400 naming it, got {status} {body}")

        # 32 concurrent streams equal the same requests alone.
        reqs = [(f"Request {i} of the batch says", 8 + (i % 9)) for i in range(32)]
        alone = [client.completions.create(model="tiny", prompt=p, max_tokens=n, temperature=0,
                                           extra_body={"ignore_eos": True}).choices[0].text for p, n in reqs]
        results = [None] * len(reqs)

        def run(i):
            p, n = reqs[i]
            results[i] = stream_text(client, model="tiny", prompt=p, max_tokens=n, temperature=0,
                                     extra_body={"ignore_eos": True})[0]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        c.equal(sum(results[i] == alone[i] for i in range(len(reqs))), len(reqs), "concurrent streams equal alone")

        # A disconnect mid-stream cancels the request.
        cancelled_before = metric(metrics_port, 'ina_requests_total{reason="cancelled"}')
        pages_before = metric(metrics_port, "ina_kv_pages_used")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("POST", "/v1/completions",
                     body=json.dumps({"model": "tiny", "prompt": "long", "max_tokens": 4000, "temperature": 0,
                                      "ignore_eos": True, "stream": True}),
                     headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        c.equal(resp.status, 200, "long stream: status")
        resp.read1(200)  # the first events
        conn.sock.shutdown(2)  # the server sees the connection end, though no send has failed yet
        resp.close()
        conn.close()
        # The finish counters move when the request ends; the running and page gauges are
        # sampled every 200 ms, so they may still show the time before the request began.
        # Wait for the counter first (the 4000-token request cannot end by length within
        # this bound, even under the sanitizers), then for the gauges.
        deadline = time.time() + 20
        while time.time() < deadline and \
                metric(metrics_port, 'ina_requests_total{reason="cancelled"}') <= cancelled_before:
            time.sleep(0.1)
        c.check(metric(metrics_port, 'ina_requests_total{reason="cancelled"}') > cancelled_before,
                "after the disconnect: a request was cancelled")
        deadline = time.time() + 5
        while time.time() < deadline and metric(metrics_port, "ina_running_requests") > 0:
            time.sleep(0.1)
        c.equal(metric(metrics_port, "ina_running_requests"), 0.0, "after the disconnect: nothing runs")
        # Its prompt fills no whole page, so nothing of it stays in the prefix cache; the
        # pages in use are at most those before it (it may have pushed cached pages out).
        deadline = time.time() + 5
        while time.time() < deadline and metric(metrics_port, "ina_kv_pages_used") > pages_before:
            time.sleep(0.1)
        pages_after = metric(metrics_port, "ina_kv_pages_used")
        c.check(pages_after <= pages_before,
                f"after the disconnect: its pages are back ({pages_after:.0f} used, {pages_before:.0f} before; the "
                "prefix cache may have given some up to it)")

        # Bad input: status, an error body naming the field; the agent goes on.
        good = {"model": "tiny", "prompt": "x", "max_tokens": 2}
        cases = [
            ("bad JSON", "POST", "/v1/completions", b"{\"model\": ", None, 400, None),
            ("prompt of a wrong type", "POST", "/v1/completions", dict(good, prompt=5), None, 400, "prompt"),
            ("temperature out of range", "POST", "/v1/completions", dict(good, temperature=3.5), None, 400,
             "temperature"),
            ("n = 2", "POST", "/v1/completions", dict(good, n=2), None, 400, "n"),
            ("unknown model", "POST", "/v1/completions", dict(good, model="gpt-9"), None, 404, "model"),
            ("no API key", "POST", "/v1/completions", good, {"Authorization": ""}, 401, None),
            ("a wrong API key", "POST", "/v1/completions", good, {"Authorization": "Bearer nope"}, 401, None),
            ("unknown path", "POST", "/v1/embeddings", good, None, 404, None),
            ("wrong method", "GET", "/v1/completions", None, None, 405, None),
            ("a body over the limit", "POST", "/v1/completions", b"x" * (9 << 20), None, 413, None),
            ("prompt ids outside the vocabulary", "POST", "/v1/completions", dict(good, prompt=[1, 2, 99999]), None,
             400, "prompt"),
            ("max_tokens beyond the context", "POST", "/v1/completions", dict(good, max_tokens=10 ** 6), None, 400,
             "max_tokens"),
        ]
        for what, method, path, body, headers, want_status, field in cases:
            status, answer = raw(port, method, path, body, headers)
            c.equal(status, want_status, f"{what}: status")
            err = answer.get("error") if isinstance(answer, dict) else None
            c.check(isinstance(err, dict) and err.get("message"), f"{what}: an OpenAI error body, got {answer!r}")
            if field and isinstance(err, dict):
                c.check(field in (err.get("message") or ""), f"{what}: the message names {field}: {err}")
                c.check((err.get("param") or "").startswith(field), f"{what}: param {err.get('param')!r} is {field}")
            ok = client.completions.create(model="tiny", prompt="still", max_tokens=2, temperature=0)
            c.equal(len(ok.choices), 1, f"after {what}: the agent still serves")
        # Draining: a long stream goes on to its end while new requests get 503.
        long_result = {}

        def long_stream():
            long_result["text"], long_result["finish"], _ = stream_text(
                client, model="tiny", prompt="drain", max_tokens=600, temperature=0, extra_body={"ignore_eos": True})

        # A generation of an earlier case (a stream its client left, cancelled at the next
        # step) may still count as running: the count below must be the long stream's.
        deadline = time.time() + 20
        while time.time() < deadline and metric(metrics_port, "ina_running_requests") > 0:
            time.sleep(0.05)
        t = threading.Thread(target=long_stream)
        t.start()
        deadline = time.time() + 20
        while time.time() < deadline and metric(metrics_port, "ina_running_requests") < 1:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        status = None
        deadline = time.time() + 10
        while time.time() < deadline:
            status, body = raw(port, "POST", "/v1/completions", good)
            if status != 200:
                break
        c.equal(status, 503, "while draining: new requests")
        t.join(timeout=120)
        c.equal(long_result.get("finish"), ["length"], "while draining: the running stream ends normally")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        c.equal(rc, 0, "the agent's exit status after SIGTERM")
        if c.failed:
            log.seek(0)
            print("agent log (last lines):\n" + "".join(log.readlines()[-30:]))
    check_queue_full(args.agent, c)
    check_tls(args.agent, c)
    check_unknown_template(args.agent, args.ina, c)
    check_tokenizer_option(args.agent, c)
    print(f"test_agent_openai: {c.passed} checks passed, {len(c.failed)} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
