#!/usr/bin/env python3
"""Serving benchmark of ina-agent's OpenAI-compatible HTTP API (POST /v1/completions, streamed).

Sends --num-prompts streamed completions, at most --concurrency in flight and/or arriving
as a Poisson process of --request-rate per second (inf: all at once), measures each one
from the client and prints the serving figures in the manner of vLLM's
benchmarks/benchmark_serving.py (same metric names and formulas; see below).

Requests. Input and output lengths are drawn per request from --input-len-dist and
--output-len-dist ("fixed:N" or N, "uniform:LO:HI" inclusive, "normal:MEAN:STD" rounded
and clipped to >= 1), seeded by --seed. The prompt is, by default (--prompt-type ids), a
list of random token ids in [0, --vocab) of exactly the drawn length ("prompt": [ids],
which the agent accepts and checks against its vocabulary); with --prompt-type text it is
random words from a fixed list of 200 English words, round(length / --tokens-per-word)
of them (default 1.3: a word taken as about 1.3 tokens, as a large BPE vocabulary splits
English; the built-in tiny model's 1024-token vocabulary splits them into about 2). The
prompt's real length is whatever the server's tokenizer makes of it: the report takes it
from usage.prompt_tokens. Every request asks for max_tokens = the
drawn output length with ignore_eos true, temperature --temperature (default 0: greedy;
above 0 each request also sends "seed": --seed + its index), stream true and
stream_options.include_usage true. --warmup N requests (own seed, same distributions,
same concurrency) run first and are checked but not measured. The same --seed gives the
same prompts: a server with a prefix cache answers a repeated run's prompts from it (the
report counts usage.prompt_tokens_details.cached_tokens), so give each run its own seed.

Measured per request (time.perf_counter(), on the client):
  TTFT   send -> the first chunk whose choices[0].text is non-empty. "Send" is when the
         request gets its slot (after the --concurrency limit, as vLLM's client does):
         time spent waiting for a slot in this client is not counted; opening a TCP
         connection, when no kept-alive one is idle, is.
  E2E    send -> "data: [DONE]".
  output tokens  usage.completion_tokens of the final usage chunk.
  TPOT   (E2E - TTFT) / (output tokens - 1): time per output token after the first
         (requests with one output token have none).
  ITL    inter-token latency: the gaps between consecutive content chunks (non-empty
         text), divided over the tokens the later chunk carries. The server streams
         text, so a chunk can carry several tokens (its connection thread renders all
         tokens queued since it last woke; a token whose text ends inside a UTF-8
         character is held until the next). Tokens per chunk:
           --token-counts estimate (default): a request with N output tokens and K
             content chunks is taken to spread its N - 1 tokens after the first
             evenly over its K - 1 gaps: one sample per gap, g x (K - 1) / (N - 1), so
             that its samples average to its time per token from the first chunk to the
             last. Exact when every chunk carries one token (K = N); otherwise an
             estimate, which keeps the shape of the gaps: applied to streams whose
             exact counts were known (ina-agent, tiny, 2 CPU cores, concurrency 1, 4,
             16, two runs) its mean came within 2 % of the exact one, p50, p90 and p99
             within 25 % (giving the surplus to the longest gaps instead cut p99 by
             30-50 %: a long gap is mostly one token held up by another request's
             prefill, not several). The report gives N - K summed over the requests
             (tokens_beyond_chunks): 0 means every chunk carried one token.
           --token-counts logprobs: asks for "logprobs": 0 and takes len(logprobs.tokens)
             of each chunk, exact: a gap g before a chunk of n tokens gives n samples of
             g / n; a chunk with text but no token (a held byte flushed at the end)
             gives none, its gap joins the next; tokens of a chunk without text count
             with the next content chunk. The server then also computes and
             sends log-probabilities, which changes what is measured (see
             bench/RESULTS.md).
         Tokens of the first chunk beyond its first have no gap and give no sample.
         ITL statistics are over all samples of all requests pooled (vLLM's way); TTFT,
         TPOT and E2E are over requests.
Checks, before any timing is reported (a failed check fails the run, exit 1): HTTP 200;
the stream ends with [DONE] and has a usage chunk; finish_reason "length";
completion_tokens == max_tokens (ignore_eos); total_tokens == prompt + completion; with
token-id prompts prompt_tokens == the ids sent; at least one content chunk; with
--token-counts logprobs the chunks' tokens add up to completion_tokens.

A second request class, "side" (--side-num-prompts N, --side-request-rate R,
--side-input-len-dist, --side-output-len-dist; default none), runs alongside the measured
requests to make a mixed workload (e.g. long prompts landing while many short-prompt
streams decode): side requests arrive as a Poisson process of R per second from the
measured run's start (the first one after an exponential gap) until N were sent or the
last measured request is done, whichever comes first; they are not counted against
--concurrency, have their own prompts (seed --seed + 2000003, so they repeat neither the
measured nor the warm-up prompts) and are checked like the measured ones (a failed one
fails the run). They do not enter the measured figures below (duration, throughputs,
TTFT, ITL, ...): they are reported apart (sent, TTFT, E2E, their tokens), and the
measured ITL samples are split into those whose gap overlaps a side request's prompt
window (its send -> its first token: its queueing and prefill, as the client sees them)
and the rest, with the share of the duration those windows cover. Warm-up sends no side
requests.

Reported (duration = first request sent -> last request done, warm-up excluded):
  requests/s = successful requests / duration; output tokens/s = sum of completion_tokens
  / duration; total tokens/s = sum of (prompt_tokens + completion_tokens) / duration;
  mean, p50, p90, p99 of TTFT, ITL, TPOT and E2E in ms (percentiles interpolated
  linearly between order statistics, as numpy's default); failed requests. A progress
  line (done/total, failed, elapsed) goes to stderr while it runs. --json FILE writes the
  configuration, the results and per-request figures. Exit status: 0 all requests
  succeeded and every check held; 1 otherwise; 2 bad usage.

Why asyncio over raw HTTP/1.1 and not threads with http.client: one event loop takes
every timestamp in one thread, so hundreds of streams in flight do not contend for the
GIL between the read of a chunk and its timestamp, and Poisson arrivals are a sleep in
one loop instead of a thread per request. http.client is also awkward for streamed
server-sent events (it hides chunk boundaries behind a buffered file). The cost is a
small HTTP/1.1 client here: keep-alive connections pooled (reused only after a response
was read to its end; a reused connection that the server closed while idle is retried
once on a new one), chunked or Content-Length bodies, http and https. The client's own
cost per chunk (a read, a JSON parse) is tens of microseconds of this process's one core:
it bounds what it can measure at high chunk rates, so watch the client's CPU when the
server is very fast, and it takes CPU from a server on the same cores.
"""
import argparse
import asyncio
import json
import math
import os
import random
import ssl
import sys
import time
import urllib.parse

WORDS = (
    "the of and to in is was that for on as with by he at from his it an were are which this be or had "
    "not but first one their its new after who they have her she two been other when there all during "
    "into school time may years more most only over city some world would where later up such used many "
    "can state about national out known university united then made three also system under between each "
    "part well several people year second against game film until series water before early through team "
    "both family music war work because within since however around north south east west house long "
    "life name river company number group town began called include area public main end way general "
    "small high four great played released former county local following based age day left last village "
    "given being same place members back old law did while could built season power near home title "
    "found field five center light book album line point order common among human air road church "
    "history language black white red green mountain island bridge market garden window paper letter "
    "table open close large young strong dark quick "
).split()
assert len(WORDS) == 200 and len(set(WORDS)) == 200


# ---- lengths and prompts --------------------------------------------------------------------

class LengthDist:
    """'fixed:N' (or 'N'), 'uniform:LO:HI' (inclusive), 'normal:MEAN:STD' (rounded, >= 1)."""

    def __init__(self, spec):
        self.spec = spec
        parts = spec.split(":")
        try:
            if len(parts) == 1:
                parts = ["fixed", parts[0]]
            kind, vals = parts[0], [float(p) for p in parts[1:]]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{spec!r}: numbers expected after the kind")
        if kind == "fixed" and len(vals) == 1 and vals[0] >= 1 and vals[0] == int(vals[0]):
            self.kind, self.args = kind, (int(vals[0]),)
        elif kind == "uniform" and len(vals) == 2 and 1 <= vals[0] <= vals[1] and all(v == int(v) for v in vals):
            self.kind, self.args = kind, (int(vals[0]), int(vals[1]))
        elif kind == "normal" and len(vals) == 2 and vals[1] >= 0:
            self.kind, self.args = kind, (vals[0], vals[1])
        else:
            raise argparse.ArgumentTypeError(
                f"{spec!r}: expected fixed:N, uniform:LO:HI (1 <= LO <= HI, integers) or normal:MEAN:STD")

    def draw(self, rng):
        if self.kind == "fixed":
            return self.args[0]
        if self.kind == "uniform":
            return rng.randint(*self.args)
        return max(1, int(round(rng.gauss(*self.args))))


def make_requests(n, seed, args, input_len_dist=None, output_len_dist=None):
    """[(prompt, prompt_len or None, max_tokens)]: lengths first, then prompts, one rng.
    The distributions default to --input-len-dist and --output-len-dist."""
    rng = random.Random(seed)
    ind = input_len_dist or args.input_len_dist
    outd = output_len_dist or args.output_len_dist
    lens = [(ind.draw(rng), outd.draw(rng)) for _ in range(n)]
    out = []
    for in_len, out_len in lens:
        if args.prompt_type == "ids":
            out.append(([rng.randrange(args.vocab) for _ in range(in_len)], in_len, out_len))
        else:
            words = max(1, int(round(in_len / args.tokens_per_word)))
            out.append((" ".join(rng.choice(WORDS) for _ in range(words)), None, out_len))
    return out


# ---- a small HTTP/1.1 client ------------------------------------------------------------------

class HTTPError(Exception):
    pass


class Stale(Exception):
    """A kept-alive connection the server had closed: nothing of the answer came."""


class Pool:
    def __init__(self, url):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise SystemExit(f"serving_bench: --base-url {url!r}: http://HOST[:PORT] or https://... expected")
        self.host, self.ssl = u.hostname, u.scheme == "https"
        self.port = u.port or (443 if self.ssl else 80)
        self.prefix = u.path.rstrip("/")
        self.idle = []
        self.opened = 0

    async def get(self):
        while self.idle:
            r, w = self.idle.pop()
            if not w.is_closing() and not r.at_eof():
                return r, w, True
            w.close()
        ctx = ssl.create_default_context() if self.ssl else None
        r, w = await asyncio.open_connection(self.host, self.port, ssl=ctx, limit=1 << 22)
        self.opened += 1
        return r, w, False

    def put(self, conn):
        self.idle.append(conn)

    def close(self):
        for _, w in self.idle:
            w.close()
        self.idle = []


async def read_head(r):
    line = await r.readline()
    if not line:
        raise Stale()
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise HTTPError(f"bad status line {line[:80]!r}")
    headers = {}
    while True:
        h = await r.readline()
        if h in (b"\r\n", b"\n"):
            break
        if not h:
            raise HTTPError("connection closed inside the response head")
        k, _, v = h.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(parts[1]), parts[0], headers


async def body_pieces(r, headers):
    """Yields (bytes, perf_counter at their arrival) of the body; the last item is
    (None, keep_alive)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await r.readline()
            if not size_line:
                raise HTTPError("connection closed inside a chunked body")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while (await r.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                yield None, True
                return
            data = await r.readexactly(size + 2)
            yield data[:-2], time.perf_counter()
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left > 0:
            data = await r.read(min(left, 1 << 16))
            if not data:
                raise HTTPError("connection closed inside the body")
            left -= len(data)
            yield data, time.perf_counter()
        yield None, True
    else:
        while True:
            data = await r.read(1 << 16)
            if not data:
                break
            yield data, time.perf_counter()
        yield None, False


# ---- one request ------------------------------------------------------------------------------

class Result:
    def __init__(self, index, prompt_len, max_tokens):
        self.index, self.sent_prompt_len, self.max_tokens = index, prompt_len, max_tokens
        self.start = self.ttft = self.e2e = None
        self.chunks = []  # (perf_counter, text length, tokens from logprobs or None)
        self.usage = None
        self.finish = None
        self.done = False
        self.error = None  # transport / HTTP / server error: a failed request
        self.check = None  # a result that is wrong: a failed check
        self.pending = 0  # logprobs tokens of chunks without text, counted with the next content chunk


def request_bytes(pool, args, prompt, max_tokens, index):
    body = {"model": args.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": args.temperature}
    if args.temperature > 0:
        body["seed"] = args.seed + index
    if args.token_counts == "logprobs":
        body["logprobs"] = 0
    data = json.dumps(body, separators=(",", ":")).encode()
    host = pool.host if pool.port in (80, 443) else f"{pool.host}:{pool.port}"
    head = (f"POST {pool.prefix}/v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(data)}\r\nConnection: keep-alive\r\n")
    if args.api_key:
        head += f"Authorization: Bearer {args.api_key}\r\n"
    return head.encode() + b"\r\n" + data


def handle_event(res, payload, t):
    if payload == "[DONE]":
        res.done = True
        res.e2e = t - res.start
        return
    try:
        obj = json.loads(payload)
    except ValueError:
        raise HTTPError(f"an event that is not JSON: {payload[:120]!r}")
    if "error" in obj:
        e = obj["error"]
        raise HTTPError(f"error event: {e.get('message', e) if isinstance(e, dict) else e}")
    if obj.get("usage"):
        res.usage = obj["usage"]
    for ch in obj.get("choices") or []:
        text = ch.get("text") or ""
        lp = ch.get("logprobs")
        n = len(lp["tokens"]) if isinstance(lp, dict) and isinstance(lp.get("tokens"), list) else None
        if not text and n:
            res.pending += n
        elif text:
            if n is not None:
                n, res.pending = n + res.pending, 0
            res.chunks.append((t, len(text), n))
            if res.ttft is None:
                res.ttft = t - res.start
        if ch.get("finish_reason"):
            res.finish = ch["finish_reason"]


async def one_stream(pool, data, res):
    for attempt in range(2):
        res.start = time.perf_counter()
        r, w, reused = await pool.get()
        keep = False
        try:
            try:
                w.write(data)
                await w.drain()
                status, _, headers = await read_head(r)
            except (Stale, ConnectionResetError, BrokenPipeError):
                if reused and attempt == 0:
                    continue  # the server closed it while idle: again, on a new connection
                raise HTTPError("the server closed the connection without an answer")
            if status != 200:
                body = b""
                async for piece, _ in body_pieces(r, headers):
                    if piece is None:
                        break
                    body += piece
                try:
                    msg = json.loads(body)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    msg = body[:200].decode("utf-8", "replace")
                raise HTTPError(f"HTTP {status}: {msg}")
            buf = b""
            async for piece, t in body_pieces(r, headers):
                if piece is None:
                    keep = t and headers.get("connection", "").lower() != "close"
                    break
                buf += piece
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        break
                    event, buf = buf[:cut], buf[cut + 2:]
                    for line in event.split(b"\n"):
                        line = line.rstrip(b"\r")
                        if line.startswith(b"data:"):
                            handle_event(res, line[5:].strip().decode("utf-8"), t)
            if not res.done:
                raise HTTPError("the stream ended without data: [DONE]")
            return
        finally:
            if keep:
                pool.put((r, w))
            else:
                w.close()


def check_result(res, args):
    """The result's first wrong figure, or None."""
    u = res.usage
    if u is None:
        return "no usage chunk (stream_options.include_usage)"
    if res.finish != "length":
        return f"finish_reason {res.finish!r}, expected 'length' (ignore_eos, max_tokens {res.max_tokens})"
    if u.get("completion_tokens") != res.max_tokens:
        return f"usage.completion_tokens {u.get('completion_tokens')} != max_tokens {res.max_tokens} (ignore_eos)"
    if u.get("total_tokens") != u.get("prompt_tokens", 0) + u.get("completion_tokens", 0):
        return f"usage.total_tokens {u.get('total_tokens')} != prompt_tokens + completion_tokens"
    if res.sent_prompt_len is not None and u.get("prompt_tokens") != res.sent_prompt_len:
        return f"usage.prompt_tokens {u.get('prompt_tokens')} != the {res.sent_prompt_len} ids sent"
    if not res.chunks:
        return "no chunk with text"
    if args.token_counts == "logprobs":
        if any(n is None for _, _, n in res.chunks):
            return "a chunk without logprobs.tokens (--token-counts logprobs)"
        counted = sum(n for _, _, n in res.chunks) + res.pending
        if counted != u["completion_tokens"]:
            return f"the chunks' logprobs count {counted} tokens, usage {u['completion_tokens']}"
    return None


def itl_gaps(res, args):
    """ITL samples of one checked request as (seconds, gap start, gap end) on perf_counter."""
    times = [t for t, _, _ in res.chunks]
    n_tokens = res.usage["completion_tokens"]
    samples = []
    if args.token_counts == "logprobs":
        prev = None
        for (t, _, n) in res.chunks:
            if n == 0:
                continue  # text without a token (a held byte flushed): its gap joins the next
            if prev is not None:
                samples.extend([((t - prev) / n, prev, t)] * n)
            prev = t
        return samples
    # Estimate: the request's tokens after the first chunk spread evenly over its gaps.
    if len(times) > 1 and n_tokens > 1:
        per_gap = (n_tokens - 1) / (len(times) - 1)
        samples = [((times[i] - times[i - 1]) / per_gap, times[i - 1], times[i]) for i in range(1, len(times))]
    return samples


def itl_samples(res, args):
    """ITL samples (seconds) of one checked request."""
    return [x for x, _, _ in itl_gaps(res, args)]


# ---- the run ------------------------------------------------------------------------------------

class Progress:
    def __init__(self, total, label, quiet):
        self.total, self.label, self.quiet = total, label, quiet
        self.done = self.failed = 0
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def line(self, final=False):
        if self.quiet:
            return
        now = time.perf_counter()
        if not final and now - self.last < (0.5 if self.tty else 5.0):
            return
        self.last = now
        s = f"serving_bench: {self.label}{self.done}/{self.total} done, {self.failed} failed, {now - self.t0:.1f} s"
        if self.tty:
            sys.stderr.write("\r" + s + ("\n" if final else ""))
        else:
            sys.stderr.write(s + "\n")
        sys.stderr.flush()


async def one_request(pool, args, i, prompt, prompt_len, max_tokens, sem, prog, in_flight):
    """One request under the optional semaphore sem; returns its checked Result."""
    res = Result(i, prompt_len, max_tokens)
    data = request_bytes(pool, args, prompt, max_tokens, i)
    if sem:
        await sem.acquire()
    in_flight[0] += 1
    in_flight[1] = max(in_flight[1], in_flight[0])
    try:
        await asyncio.wait_for(one_stream(pool, data, res), args.timeout)
    except asyncio.TimeoutError:
        res.error = f"no answer within --timeout {args.timeout} s"
    except (HTTPError, OSError, asyncio.IncompleteReadError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}" if not isinstance(e, HTTPError) else str(e)
    finally:
        in_flight[0] -= 1
        if sem:
            sem.release()
    if res.error is None:
        res.check = check_result(res, args)
    prog.done += 1
    prog.failed += res.error is not None or res.check is not None
    prog.line()
    return res


async def run_side(pool, args, reqs, stop):
    """The side class (--side-*): Poisson arrivals of --side-request-rate per second, no
    concurrency limit, until reqs are all sent or stop is set; returns [Result] of those sent
    (after they finished) and their max in flight."""
    prog = Progress(len(reqs), "side ", args.quiet)
    arrivals = random.Random(args.seed + 104729)
    in_flight = [0, 0]
    tasks = []
    for i, (prompt, plen, mt) in enumerate(reqs):
        try:
            await asyncio.wait_for(stop.wait(), arrivals.expovariate(args.side_request_rate))
            break  # the measured requests are done: no more arrivals
        except asyncio.TimeoutError:
            pass
        tasks.append(asyncio.ensure_future(one_request(pool, args, i, prompt, plen, mt, None, prog, in_flight)))
    prog.total = len(tasks)
    results = await asyncio.gather(*tasks)
    prog.line(final=True)
    return results, in_flight[1]


async def run_set(pool, args, reqs, label, rate, side=None):
    """Runs reqs, and the side class's requests side (a list, or None) while they run;
    returns [Result], the duration in seconds, the max in flight, and the side's
    ([Result], max in flight) or None. The duration and the max in flight are reqs' own."""
    sem = asyncio.Semaphore(args.concurrency) if args.concurrency else None
    prog = Progress(len(reqs), label, args.quiet)
    arrivals = random.Random(args.seed + 7919)
    in_flight = [0, 0]  # now, max

    async def ticker():
        while True:
            await asyncio.sleep(0.5)
            prog.line()

    tick = asyncio.ensure_future(ticker())
    t0 = time.perf_counter()
    stop = asyncio.Event()
    side_task = asyncio.ensure_future(run_side(pool, args, side, stop)) if side else None
    tasks = []
    for i, (prompt, plen, mt) in enumerate(reqs):
        tasks.append(asyncio.ensure_future(one_request(pool, args, i, prompt, plen, mt, sem, prog, in_flight)))
        if rate != math.inf and i + 1 < len(reqs):
            await asyncio.sleep(arrivals.expovariate(rate))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - t0
    stop.set()
    tick.cancel()
    prog.line(final=True)
    side_out = await side_task if side_task else None
    return results, duration, in_flight[1], side_out


def stats(xs):
    """mean, p50, p90, p99 (linear interpolation between order statistics), in ms."""
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None, "n": 0}
    s = sorted(xs)

    def pct(p):
        k = (len(s) - 1) * p / 100
        lo = math.floor(k)
        hi = min(lo + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": 1e3 * sum(s) / len(s), "p50": 1e3 * pct(50), "p90": 1e3 * pct(90), "p99": 1e3 * pct(99),
            "max": 1e3 * s[-1], "n": len(s)}


def union_length(wins, t_first, t_last):
    """Seconds of [t_first, t_last] covered by the union of the windows [(start, end)]."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, t_first), min(e, t_last)) for s, e in wins):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def fmt(v):
    return "-" if v is None else f"{v:.2f}"


async def main_async(args):
    pool = Pool(args.base_url)
    try:
        if args.warmup:
            warm, _, _, _ = await run_set(pool, args, make_requests(args.warmup, args.seed + 1_000_003, args),
                                       "warm-up ", math.inf if args.concurrency else args.request_rate)
            bad = [r for r in warm if r.error or r.check]
            if bad:
                for r in bad[:5]:
                    print(f"serving_bench: warm-up request {r.index}: {r.error or r.check}", file=sys.stderr)
                print(f"serving_bench: FAILED: {len(bad)} of {len(warm)} warm-up requests failed", file=sys.stderr)
                return 1
        reqs = make_requests(args.num_prompts, args.seed, args)
        side = (make_requests(args.side_num_prompts, args.seed + 2_000_003, args, args.side_input_len_dist,
                              args.side_output_len_dist) if args.side_num_prompts else None)
        results, duration, max_in_flight, side_out = await run_set(pool, args, reqs, "", args.request_rate, side)
    finally:
        pool.close()
    side_results, side_max_in_flight = side_out if side_out else ([], 0)
    side_failed = [r for r in side_results if r.error]
    side_wrong = [r for r in side_results if not r.error and r.check]
    side_ok = [r for r in side_results if not r.error and not r.check]
    for r in (side_failed + side_wrong)[:10]:
        print(f"serving_bench: side request {r.index} (max_tokens {r.max_tokens}): "
              f"{r.error or 'CHECK FAILED: ' + r.check}", file=sys.stderr)

    failed = [r for r in results if r.error]
    wrong = [r for r in results if not r.error and r.check]
    ok = [r for r in results if not r.error and not r.check]
    for r in (failed + wrong)[:10]:
        print(f"serving_bench: request {r.index} (max_tokens {r.max_tokens}): {r.error or 'CHECK FAILED: ' + r.check}",
              file=sys.stderr)
    config = {k: (v.spec if isinstance(v, LengthDist) else "inf" if v == math.inf else v)
              for k, v in vars(args).items() if k not in ("api_key", "api_key_file")}
    out = {"config": config, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "num_prompts": len(results),
           "completed": len(ok), "failed": len(failed), "failed_checks": len(wrong),
           "errors": [f"request {r.index}: {r.error or r.check}" for r in failed + wrong][:50]}
    if side_out:
        out["side"] = {"sent": len(side_results), "completed": len(side_ok), "failed": len(side_failed),
                       "failed_checks": len(side_wrong), "max_in_flight": side_max_in_flight,
                       "errors": [f"side request {r.index}: {r.error or r.check}"
                                  for r in side_failed + side_wrong][:50]}
    if wrong or side_wrong:
        n_wrong, n_all = len(wrong) + len(side_wrong), len(results) + len(side_results)
        print(f"serving_bench: CHECK FAILED: {n_wrong} of {n_all} requests returned a wrong result; "
              f"no timings reported", file=sys.stderr)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return 1

    in_tok = sum(r.usage["prompt_tokens"] for r in ok)
    cached = sum((r.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for r in ok)
    out_tok = sum(r.usage["completion_tokens"] for r in ok)
    itl, multi, chunks, gaps = [], 0, 0, []
    for r in ok:
        g = itl_gaps(r, args)
        gaps += g
        itl += [x for x, _, _ in g]
        multi += max(0, r.usage["completion_tokens"] - len(r.chunks))
        chunks += len(r.chunks)
    tpot = [(r.e2e - r.ttft) / (r.usage["completion_tokens"] - 1) for r in ok if r.usage["completion_tokens"] > 1]
    t_zero = min(r.start for r in results + side_results if r.start is not None)
    rel = lambda t: None if t is None else t - t_zero  # per-request send times from the first send
    out.update({
        "duration_s": duration, "max_in_flight": max_in_flight, "connections_opened": pool.opened,
        "total_input_tokens": in_tok, "total_output_tokens": out_tok,
        "cached_prompt_tokens": cached, "content_chunks": chunks,
        "tokens_beyond_chunks": multi, "token_counts": args.token_counts,
        "request_throughput": len(ok) / duration, "output_throughput": out_tok / duration,
        "total_token_throughput": (in_tok + out_tok) / duration,
        "ttft_ms": stats([r.ttft for r in ok]), "itl_ms": stats(itl), "tpot_ms": stats(tpot),
        "e2e_ms": stats([r.e2e for r in ok]),
        "requests": [{"index": r.index, "prompt_tokens": r.usage["prompt_tokens"] if r.usage else None,
                      "max_tokens": r.max_tokens, "start_s": rel(r.start), "ttft_s": r.ttft, "e2e_s": r.e2e,
                      "chunks": len(r.chunks),
                      "error": r.error} for r in results],
    })
    if side_out:
        # The side requests' prompt windows: send -> first token (their prefill, queueing included).
        # A measured ITL sample "overlaps" when its gap intersects one of them.
        wins = sorted((r.start, r.start + r.ttft) for r in side_ok)
        over, clear = [], []
        for x, a, b in gaps:
            (over if any(s < b and e > a for s, e in wins) else clear).append(x)
        s_in = sum(r.usage["prompt_tokens"] for r in side_ok)
        s_out = sum(r.usage["completion_tokens"] for r in side_ok)
        out["side"].update({
            "total_input_tokens": s_in, "total_output_tokens": s_out,
            "cached_prompt_tokens": sum((r.usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
                                        for r in side_ok),
            "ttft_ms": stats([r.ttft for r in side_ok]), "e2e_ms": stats([r.e2e for r in side_ok]),
            "tpot_ms": stats([(r.e2e - r.ttft) / (r.usage["completion_tokens"] - 1) for r in side_ok
                              if r.usage["completion_tokens"] > 1]),
            "itl_ms_during_side_prompts": stats(over), "itl_ms_outside_side_prompts": stats(clear),
            "side_prompt_time_fraction": union_length(wins, t_first=min(r.start for r in ok),
                                                      t_last=max(r.start + r.e2e for r in ok)) / duration
            if ok else None,
            "requests": [{"index": r.index, "prompt_tokens": r.usage["prompt_tokens"] if r.usage else None,
                          "max_tokens": r.max_tokens, "start_s": rel(r.start), "ttft_s": r.ttft, "e2e_s": r.e2e,
                          "chunks": len(r.chunks),
                          "error": r.error} for r in side_results],
        })
    if not ok:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        print(f"serving_bench: FAILED: all {len(results)} requests failed", file=sys.stderr)
        return 1
    lim = f"concurrency {args.concurrency}" if args.concurrency else "no concurrency limit"
    print(f"============ Serving benchmark: {args.model} at {args.base_url} ============")
    print(f"requests: {len(results)} ({lim}, request rate {args.request_rate}/s, max in flight {max_in_flight}); "
          f"input {args.input_len_dist.spec} ({args.prompt_type}), output {args.output_len_dist.spec}")
    print(f"{'successful requests':<34}{len(ok)}")
    print(f"{'failed requests':<34}{len(failed)}")
    print(f"{'duration (s)':<34}{duration:.3f}")
    print(f"{'input / output tokens':<34}{in_tok} / {out_tok}")
    print(f"{'cached prompt tokens':<34}{cached} (usage.prompt_tokens_details.cached_tokens)")
    print(f"{'requests/s':<34}{len(ok) / duration:.2f}")
    print(f"{'output tokens/s':<34}{out_tok / duration:.1f}")
    print(f"{'total tokens/s':<34}{(in_tok + out_tok) / duration:.1f}")
    print(f"{'content chunks':<34}{chunks} for {out_tok} tokens (ITL's tokens per chunk: {args.token_counts})")
    print(f"{'ms':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name, key in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms")):
        s = out[key]
        print(f"{name:<10}{fmt(s['mean']):>10}{fmt(s['p50']):>10}{fmt(s['p90']):>10}{fmt(s['p99']):>10}")
    if side_out:
        sd = out["side"]
        print(f"---- side requests: {sd['sent']} sent at Poisson {args.side_request_rate}/s while the measured "
              f"ones ran (max in flight {side_max_in_flight}); input {args.side_input_len_dist.spec}, "
              f"output {args.side_output_len_dist.spec} ----")
        if not sd["sent"]:
            print("(no side request arrived before the measured ones were done)")
        print(f"{'successful / failed side requests':<34}{sd['completed']} / {sd['failed']}")
        print(f"{'side input / output tokens':<34}{sd['total_input_tokens']} / {sd['total_output_tokens']}")
        print(f"{'side cached prompt tokens':<34}{sd['cached_prompt_tokens']}")
        print(f"{'side prompt windows cover':<34}{100 * sd['side_prompt_time_fraction']:.1f} % of the duration "
              f"(send -> first token)")
        print(f"{'ms':<26}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}{'n':>8}")
        for name, s in (("side TTFT", sd["ttft_ms"]), ("side E2E", sd["e2e_ms"]),
                        ("ITL during side prompts", sd["itl_ms_during_side_prompts"]),
                        ("ITL outside side prompts", sd["itl_ms_outside_side_prompts"])):
            print(f"{name:<26}{fmt(s['mean']):>10}{fmt(s['p50']):>10}{fmt(s['p90']):>10}{fmt(s['p99']):>10}"
                  f"{fmt(s['max']):>10}{s['n']:>8}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if failed or side_failed:
        n_failed, n_all = len(failed) + len(side_failed), len(results) + len(side_results)
        print(f"serving_bench: FAILED: {n_failed} of {n_all} requests failed", file=sys.stderr)
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser(
        prog="serving_bench.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n")[0], epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--base-url", help="the server, http://HOST:PORT (default http://127.0.0.1:--port)")
    ap.add_argument("--port", type=int, help="the server's port on 127.0.0.1 (without --base-url)")
    ap.add_argument("--model", default="tiny", help="the model's served name (default tiny)")
    ap.add_argument("--api-key", default=os.environ.get("INA_API_KEY"),
                    help="sent as 'Authorization: Bearer KEY' (default: $INA_API_KEY, else none)")
    ap.add_argument("--api-key-file", help="the key is the first line of this file")
    ap.add_argument("--num-prompts", type=int, default=64, help="measured requests (default 64)")
    ap.add_argument("--concurrency", type=int, help="at most this many requests in flight (default: no limit)")
    ap.add_argument("--request-rate", type=float, default=math.inf,
                    help="Poisson arrivals per second (default inf: all at once)")
    ap.add_argument("--input-len-dist", type=LengthDist, default=LengthDist("uniform:16:128"),
                    help="prompt length in tokens (default uniform:16:128)")
    ap.add_argument("--output-len-dist", type=LengthDist, default=LengthDist("uniform:16:64"),
                    help="max_tokens (default uniform:16:64)")
    ap.add_argument("--prompt-type", choices=("ids", "text"), default="ids",
                    help="random token ids of the exact length (default) or random words")
    ap.add_argument("--tokens-per-word", type=float, default=1.3,
                    help="text prompts: tokens a word is taken to make (default 1.3)")
    ap.add_argument("--vocab", type=int, default=1024, help="token ids are drawn from [0, VOCAB) (default 1024)")
    ap.add_argument("--seed", type=int, default=0, help="seed of lengths, prompts and arrivals (default 0)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0, greedy)")
    ap.add_argument("--warmup", type=int, default=0, help="unmeasured requests first (default 0)")
    ap.add_argument("--token-counts", choices=("estimate", "logprobs"), default="estimate",
                    help="how ITL knows a chunk's tokens (default estimate; see below)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take (default 600)")
    ap.add_argument("--side-num-prompts", type=int, default=0,
                    help="a second request class, 'side' (default 0: none): at most this many requests")
    ap.add_argument("--side-request-rate", type=float,
                    help="side requests' Poisson arrivals per second while the measured ones run (needed with "
                         "--side-num-prompts)")
    ap.add_argument("--side-input-len-dist", type=LengthDist, default=LengthDist("uniform:16:128"),
                    help="side prompt length in tokens (default uniform:16:128)")
    ap.add_argument("--side-output-len-dist", type=LengthDist, default=LengthDist("uniform:16:64"),
                    help="side max_tokens (default uniform:16:64)")
    ap.add_argument("--json", help="write the configuration and results to this file")
    ap.add_argument("--quiet", action="store_true", help="no progress line")
    args = ap.parse_args()
    if args.base_url is None:
        if args.port is None:
            ap.error("--base-url or --port is needed")
        args.base_url = f"http://127.0.0.1:{args.port}"
    elif args.port is not None:
        ap.error("--base-url and --port: give one")
    if args.api_key_file:
        with open(args.api_key_file) as f:
            args.api_key = f.readline().strip()
    if args.num_prompts < 1 or args.warmup < 0 or args.vocab < 1:
        ap.error("--num-prompts and --vocab must be >= 1, --warmup >= 0")
    if args.concurrency is not None and args.concurrency < 1:
        ap.error("--concurrency must be >= 1")
    if not args.request_rate > 0:
        ap.error("--request-rate must be > 0 (inf: all at once)")
    if not args.tokens_per_word > 0:
        ap.error("--tokens-per-word must be > 0")
    if args.temperature < 0:
        ap.error("--temperature must be >= 0")
    if args.side_num_prompts < 0:
        ap.error("--side-num-prompts must be >= 0")
    if args.side_num_prompts and not (args.side_request_rate and 0 < args.side_request_rate < math.inf):
        ap.error("--side-num-prompts needs a finite --side-request-rate > 0")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
