#!/usr/bin/python3
"""End-to-end test of ina-agent through an independent gRPC client.

The client is Python's grpcio with message classes generated at test time by
`protoc --python_out` from proto/: it shares no code with the agent or with the C
client of `ina`, so it checks the wire contract of proto/ itself. Services are called
through grpc.Channel.unary_unary / unary_stream with the messages' SerializeToString /
FromString (no generated service stubs: Debian's grpc_tools is too old for the
protobuf runtime it ships).

Covered: grpc.health.v1 Check and Watch (NOT_SERVING -> SERVING at start-up,
SERVING -> NOT_SERVING on SIGTERM, unknown services), ina.v1.Node GetNodeInfo /
GetHealth / GetLoad, ina.v1.Inference Generate (greedy, streamed, token for token
equal to a local `ina generate`; stop ids) and its refusals, Cancel (unknown,
running and finished ids; a client that goes away),
ina.v1.Placement GetPlacement and ApplyPlacement (admin token, stale generations,
malformed placements named by field path, a dry run, changes that keep outputs equal),
undecodable request bytes, a scrape of Prometheus /metrics (--metrics-listen) after
the generations, and a clean exit on SIGTERM.

Exit status: 0 pass, 1 fail, 77 skip (no grpc or protobuf module for /usr/bin/python3,
or no protoc).
"""
import argparse
import importlib.util
import os
import queue
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
ADMIN_TOKEN = "e2e-admin-token"
MODEL_SEED = "0"
THREADS = "2"  # the agent and `ina generate` run with the same thread count
RPC_TIMEOUT_S = 20.0
START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 10.0

try:
    import grpc
    import google.protobuf  # noqa: F401  (the generated modules need it)
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import {e.name} "
          "(install the Debian packages python3-grpcio and python3-protobuf)")
    sys.exit(SKIP)


class Checks:
    """Records failed checks and goes on, so one run reports every mismatch."""

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

    def rpc_error(self, call, code, what, detail_words=()):
        """Runs call(), which must raise grpc.RpcError with `code` and details holding
        every word of detail_words. Returns the error (or None)."""
        try:
            result = call()
        except grpc.RpcError as e:
            self.equal(e.code(), code, f"{what}: status code")
            for word in detail_words:
                self.check(word in (e.details() or ""),
                                 f"{what}: details {e.details()!r} should name '{word}'")
            return e
        self.check(False, f"{what}: expected {code.name}, the call succeeded with {result!r}")
        return None


# ---- generated messages ----------------------------------------------------------------

def load_messages(proto_dir, out_dir):
    """protoc --python_out for the agent's .proto files; returns the modules by stem.
    The modules are loaded from their paths: grpc/health/v1/health_pb2.py would
    otherwise be looked up inside the installed grpc package."""
    protoc = shutil.which("protoc")
    files = ["ina/v1/node.proto", "ina/v1/inference.proto", "ina/v1/placement.proto",
             "grpc/health/v1/health.proto"]
    subprocess.run([protoc, f"-I{proto_dir}", f"--python_out={out_dir}", *files], check=True)
    modules = {}
    for f in files:
        stem = os.path.basename(f)[:-len(".proto")]
        path = os.path.join(out_dir, f[:-len(".proto")] + "_pb2.py")
        spec = importlib.util.spec_from_file_location(f"e2e_{stem}_pb2", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules[stem] = module
    return modules


class Client:
    """Typed calls built from grpc.Channel.unary_unary / unary_stream."""

    def __init__(self, channel, pb):
        self.pb = pb
        node, inf, plc, hp = pb["node"], pb["inference"], pb["placement"], pb["health"]

        def unary(path, req, resp):
            return channel.unary_unary(path, request_serializer=req.SerializeToString,
                                       response_deserializer=resp.FromString)

        def stream(path, req, resp):
            return channel.unary_stream(path, request_serializer=req.SerializeToString,
                                        response_deserializer=resp.FromString)

        self.health_check = unary("/grpc.health.v1.Health/Check", hp.HealthCheckRequest,
                                  hp.HealthCheckResponse)
        self.health_watch = stream("/grpc.health.v1.Health/Watch", hp.HealthCheckRequest,
                                   hp.HealthCheckResponse)
        self.get_node_info = unary("/ina.v1.Node/GetNodeInfo", node.GetNodeInfoRequest, node.NodeInfo)
        self.get_health = unary("/ina.v1.Node/GetHealth", node.GetHealthRequest, node.NodeHealth)
        self.get_load = unary("/ina.v1.Node/GetLoad", node.GetLoadRequest, node.NodeLoad)
        self.generate = stream("/ina.v1.Inference/Generate", inf.GenerateRequest, inf.GenerateResponse)
        self.cancel = unary("/ina.v1.Inference/Cancel", inf.CancelRequest, inf.CancelResponse)
        self.get_placement = unary("/ina.v1.Placement/GetPlacement", plc.GetPlacementRequest,
                                   plc.GetPlacementResponse)
        self.apply_placement = unary("/ina.v1.Placement/ApplyPlacement", plc.ApplyPlacementRequest,
                                     plc.ApplyPlacementResponse)
        # Bytes in, bytes out: for requests that are not protobuf at all.
        self.raw_unary = lambda path: channel.unary_unary(path)
        self.raw_stream = lambda path: channel.unary_stream(path)


# ---- the agent process -----------------------------------------------------------------

class Agent:
    """ina-agent as a child process; a thread collects its stdout lines."""

    def __init__(self, path, token_dir):
        # The admin token comes from a file (--admin-token-file), as deploy/ passes it.
        token_file = os.path.join(token_dir, "admin-token")
        with open(token_file, "w") as f:
            f.write(ADMIN_TOKEN + "\n")
        argv = [path, "--model", "tiny", "--model-seed", MODEL_SEED, "--device", "cpu",
                "--listen", "127.0.0.1:0", "--threads", THREADS, "--admin-token-file", token_file,
                "--drain-grace-ms", "2000", "--metrics-listen", "127.0.0.1:0"]
        print("starting", " ".join(argv), flush=True)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.output = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)  # EOF

    def wait_line(self, pattern, timeout_s):
        """The first match of `pattern` in a stdout line within timeout_s, or None."""
        end = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                return None
            if line is None:
                return None
            m = re.search(pattern, line)
            if m:
                return m

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# ---- the local reference ---------------------------------------------------------------

def local_generate(ina, prompt, max_new, ignore_eos):
    """Token ids from `ina generate` in this process's machine, from its "prompt 0:" line."""
    argv = [ina, "generate", "--model", "tiny", "--model-seed", MODEL_SEED, "--device", "cpu",
            "--threads", THREADS, "--prompt-ids", ",".join(map(str, prompt)),
            "--max-new-tokens", str(max_new)]
    if ignore_eos:
        argv.append("--ignore-eos")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {out.returncode}: {out.stderr}")
    m = re.search(r"^prompt 0:(.*)$", out.stdout, re.M)
    if not m:
        raise RuntimeError(f"{' '.join(argv)}: no 'prompt 0:' line in {out.stdout!r}")
    return [int(t) for t in m.group(1).replace(" ", "").split(",") if t]


# ---- the checks --------------------------------------------------------------------------

def check_start_up(c, client, pb):
    """Health answers as soon as the address is printed: NOT_SERVING during the warm-up
    or already SERVING, then SERVING; a Watch ends its sequence on SERVING."""
    hp = pb["health"].HealthCheckResponse
    watch = client.health_watch(pb["health"].HealthCheckRequest(service=""), timeout=START_TIMEOUT_S)
    first = client.health_check(pb["health"].HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
    c.check(first.status in (hp.NOT_SERVING, hp.SERVING),
            f"first health Check: {hp.ServingStatus.Name(first.status)}, expected NOT_SERVING or SERVING")
    seen = []
    for msg in watch:
        seen.append(hp.ServingStatus.Name(msg.status))
        if msg.status == hp.SERVING:
            break
    watch.cancel()
    print("health Watch at start-up:", " -> ".join(seen), flush=True)
    c.check(seen and seen[-1] == "SERVING", f"Watch never reported SERVING: {seen}")
    c.check(all(s == "NOT_SERVING" for s in seen[:-1]),
            f"Watch before SERVING should only say NOT_SERVING: {seen}")

    for service in ("", "ina.v1.Node", "ina.v1.Inference", "ina.v1.Placement"):
        r = client.health_check(pb["health"].HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
        c.equal(hp.ServingStatus.Name(r.status), "SERVING", f"health Check '{service}' once serving")
    c.rpc_error(lambda: client.health_check(pb["health"].HealthCheckRequest(service="no.such.Service"),
                                            timeout=RPC_TIMEOUT_S),
                grpc.StatusCode.NOT_FOUND, "health Check of an unknown service")
    unknown = client.health_watch(pb["health"].HealthCheckRequest(service="no.such.Service"),
                                  timeout=RPC_TIMEOUT_S)
    msg = next(unknown)
    unknown.cancel()
    c.equal(hp.ServingStatus.Name(msg.status), "SERVICE_UNKNOWN", "health Watch of an unknown service")


def host_mem_total_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def check_node(c, client, pb, agent_pid):
    node = pb["node"]
    info = client.get_node_info(node.GetNodeInfoRequest(), timeout=RPC_TIMEOUT_S)
    c.equal(info.hostname, socket.gethostname(), "NodeInfo.hostname")
    c.equal(len(info.gpus), 0, "NodeInfo.gpus on --device cpu")
    c.equal(info.world_size, 1, "NodeInfo.world_size")
    c.equal(len(info.ranks), 1, "NodeInfo.ranks")
    if info.ranks:
        r = info.ranks[0]
        c.equal((r.global_rank, r.local_rank, r.pid), (0, 0, agent_pid), "NodeInfo.ranks[0] rank and pid")
        c.equal((r.tp_rank, r.dp_rank, r.ep_rank), (0, 0, 0), "NodeInfo.ranks[0] tp/dp/ep ranks")
    m = info.model
    c.equal(m.name, "tiny", "NodeInfo.model.name")
    c.check(m.architecture in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
            f"NodeInfo.model.architecture: {m.architecture!r}")
    c.check(m.vocab_size > 0, f"NodeInfo.model.vocab_size: {m.vocab_size}")
    c.check(0 < m.n_moe_layers <= m.n_layers,
            f"NodeInfo.model: n_moe_layers {m.n_moe_layers} of n_layers {m.n_layers}")
    c.check(0 < m.n_experts_per_token <= m.n_routed_experts,
            f"NodeInfo.model: n_experts_per_token {m.n_experts_per_token} of {m.n_routed_experts}")
    c.check(m.max_context_tokens > 0, f"NodeInfo.model.max_context_tokens: {m.max_context_tokens}")
    c.equal(m.weight_dtype, "bf16", "NodeInfo.model.weight_dtype (random weights' default)")
    c.check(m.eos_token_id < m.vocab_size, f"NodeInfo.model.eos_token_id {m.eos_token_id} >= vocab_size")
    c.check(re.fullmatch(r"\d+\.\d+\.\d+.*", info.build.version),
            f"NodeInfo.build.version: {info.build.version!r}, expected a semantic version")
    c.check(re.fullmatch(r"(\d+\.\d+)?", info.build.cuda_version),
            f"NodeInfo.build.cuda_version: {info.build.cuda_version!r}, expected '' or N.M")
    c.check((info.build.cuda_version == "") == (len(info.build.cuda_archs) == 0),
            f"NodeInfo.build.cuda_archs {list(info.build.cuda_archs)} with cuda_version "
            f"{info.build.cuda_version!r}")
    c.check(re.fullmatch(r"([0-9a-f]{40})?", info.build.git_commit),
            f"NodeInfo.build.git_commit: {info.build.git_commit!r}, expected 40 hex digits or ''")
    c.equal(info.host_memory_bytes, host_mem_total_bytes(), "NodeInfo.host_memory_bytes vs /proc/meminfo")

    health = client.get_health(node.GetHealthRequest(), timeout=RPC_TIMEOUT_S)
    c.equal(node.NodeState.Name(health.state), "NODE_STATE_SERVING", "Node.GetHealth state")
    c.equal([node.NodeState.Name(r.state) for r in health.ranks], ["NODE_STATE_SERVING"],
            "Node.GetHealth ranks")
    load = client.get_load(node.GetLoadRequest(), timeout=RPC_TIMEOUT_S)
    c.equal(load.kv_page_size, 16, "NodeLoad.kv_page_size (the default page size)")
    c.equal((load.queued_requests, load.running_requests), (0, 0), "NodeLoad queues when idle")
    c.check(load.kv_pages_free > 0, f"NodeLoad.kv_pages_free: {load.kv_pages_free}")
    return info


def run_generate(c, client, pb, what, request):
    """Streams one Generate; checks the per-message invariants; returns (ids, responses)."""
    inf = pb["inference"]
    responses = list(client.generate(request, timeout=RPC_TIMEOUT_S))
    ids = [t for r in responses for t in r.token_ids]
    if not c.check(responses, f"{what}: no response"):
        return ids, responses
    done = 0
    for i, r in enumerate(responses):
        last = i == len(responses) - 1
        c.equal(r.request_id, request.request_id, f"{what}: response {i} request_id")
        c.equal(r.prompt_tokens, len(request.prompt_token_ids), f"{what}: response {i} prompt_tokens")
        done += len(r.token_ids)
        c.equal(r.completion_tokens, done, f"{what}: response {i} completion_tokens")
        c.check((r.finish_reason != inf.FINISH_REASON_UNSPECIFIED) == last,
                f"{what}: response {i} of {len(responses)} has finish_reason "
                f"{inf.FinishReason.Name(r.finish_reason)}")
        c.check(r.HasField("timings") == last, f"{what}: response {i}: timings only in the last one")
    t = responses[-1].timings
    c.check(0 < t.first_token_us <= t.total_us and t.queue_us <= t.first_token_us,
            f"{what}: timings queue {t.queue_us} <= first token {t.first_token_us} <= total {t.total_us}")
    return ids, responses


def check_expert_load(c, client, pb, info):
    """GetLoad's per-expert counters: reset, then one generation of P prompt tokens and N
    new ones forwards P + N - 1 tokens, each routed to n_experts_per_token experts in
    every MoE layer."""
    node, inf, m = pb["node"], pb["inference"], info.model
    client.get_load(node.GetLoadRequest(include_expert_load=True, reset_expert_load=True),
                    timeout=RPC_TIMEOUT_S)
    prompt, new = [3, 1, 4, 1, 5], 6
    run_generate(c, client, pb, "Generate for the expert counters",
                 inf.GenerateRequest(request_id="e2e-experts", prompt_token_ids=prompt,
                                     max_tokens=new, ignore_eos=True))
    load = client.get_load(node.GetLoadRequest(include_expert_load=True), timeout=RPC_TIMEOUT_S)
    c.equal(sorted(e.moe_layer for e in load.expert_load), list(range(m.n_moe_layers)),
            "NodeLoad.expert_load: one entry per MoE layer")
    want = (len(prompt) + new - 1) * m.n_experts_per_token
    for e in load.expert_load:
        c.equal(len(e.tokens), m.n_routed_experts, f"expert_load[{e.moe_layer}]: one counter per expert")
        c.equal(sum(e.tokens), want, f"expert_load[{e.moe_layer}]: tokens routed after the reset")
    c.check(load.expert_load_seconds > 0, f"NodeLoad.expert_load_seconds: {load.expert_load_seconds}")
    plain = client.get_load(node.GetLoadRequest(), timeout=RPC_TIMEOUT_S)
    c.equal(len(plain.expert_load), 0, "NodeLoad.expert_load without include_expert_load")


def check_stop_ids(c, client, pb, prompt, reference):
    """A stop id taken from the middle of a reference generation ends the same request
    right after its first occurrence, with FINISH_REASON_STOP naming it."""
    inf = pb["inference"]
    stop = reference[len(reference) // 2]
    want = reference[:reference.index(stop) + 1]
    what = f"Generate with stop_token_ids [{stop}] (prompt {prompt})"
    req = inf.GenerateRequest(request_id="e2e-stop", prompt_token_ids=prompt, max_tokens=len(reference),
                              ignore_eos=True, stop_token_ids=[stop])
    got, responses = run_generate(c, client, pb, what, req)
    c.equal(got, want, f"{what}: ids")
    if responses:
        final = responses[-1]
        c.equal((inf.FinishReason.Name(final.finish_reason), final.stop_token_id),
                ("FINISH_REASON_STOP", stop), f"{what}: finish_reason and stop_token_id")


def check_cancel(c, client, pb, load_request):
    """A long generation: its request_id is taken while it runs (ALREADY_EXISTS), Cancel
    ends it with FINISH_REASON_CANCELLED; a client that goes away frees its request."""
    inf = pb["inference"]
    long_request = inf.GenerateRequest(request_id="e2e-long", prompt_token_ids=[5, 6], max_tokens=4000,
                                       ignore_eos=True)
    stream = client.generate(long_request, timeout=RPC_TIMEOUT_S)
    first = next(stream)
    c.check(len(first.token_ids) == 1 and first.finish_reason == inf.FINISH_REASON_UNSPECIFIED,
            f"long Generate: first response {first}")
    c.rpc_error(lambda: list(client.generate(long_request, timeout=RPC_TIMEOUT_S)),
                grpc.StatusCode.ALREADY_EXISTS, "Generate with the request_id of a running request",
                ["request_id", "e2e-long"])
    r = client.cancel(inf.CancelRequest(request_id="e2e-long"), timeout=RPC_TIMEOUT_S)
    c.equal(r.cancelled, True, "Cancel of a running request")
    rest = list(stream)
    n = len(first.token_ids) + sum(len(x.token_ids) for x in rest)
    c.check(rest and rest[-1].finish_reason == inf.FINISH_REASON_CANCELLED,
            f"cancelled Generate should end with FINISH_REASON_CANCELLED, last response "
            f"{rest[-1] if rest else None}")
    c.check(n < 4000, f"cancelled Generate still produced all {n} tokens")
    r = client.cancel(inf.CancelRequest(request_id="e2e-long"), timeout=RPC_TIMEOUT_S)
    c.equal(r.cancelled, False, "Cancel of a request already cancelled")

    # The client cancels its own call: the agent must notice and drop the request.
    gone = client.generate(inf.GenerateRequest(request_id="e2e-gone", prompt_token_ids=[7], max_tokens=4000,
                                               ignore_eos=True), timeout=RPC_TIMEOUT_S)
    next(gone)
    gone.cancel()
    end = time.monotonic() + RPC_TIMEOUT_S
    while time.monotonic() < end:
        load = client.get_load(load_request, timeout=RPC_TIMEOUT_S)
        if load.running_requests == 0 and load.queued_requests == 0:
            break
        time.sleep(0.01)
    c.equal((load.running_requests, load.queued_requests), (0, 0),
            "NodeLoad after the client cancelled its Generate call")
    r = client.cancel(inf.CancelRequest(request_id="e2e-gone"), timeout=RPC_TIMEOUT_S)
    c.equal(r.cancelled, False, "Cancel of a request whose client went away")


def check_generate(c, client, pb, ina, info, rng):
    inf = pb["inference"]
    vocab = info.model.vocab_size
    cases = []  # (prompt, max_new, ignore_eos, stream_interval)
    for _ in range(3):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 24))]
        cases.append((prompt, rng.randint(2, 12), True, 0))
    cases.append(([rng.randrange(vocab)], 1, True, 0))                           # one token
    cases.append(([rng.randrange(vocab) for _ in range(5)], 7, True, 3))       # chunks 3,3,1
    cases.append(([info.model.eos_token_id, 1, 2], 16, False, 0))              # EOS may end it
    for n, (prompt, max_new, ignore_eos, interval) in enumerate(cases):
        what = f"Generate #{n} (prompt {prompt}, max_tokens {max_new}, ignore_eos {ignore_eos}, " \
               f"stream_interval {interval})"
        want = local_generate(ina, prompt, max_new, ignore_eos)
        req = inf.GenerateRequest(request_id=f"e2e-{n}", prompt_token_ids=prompt, max_tokens=max_new,
                                  ignore_eos=ignore_eos, stream_interval=interval)
        got, responses = run_generate(c, client, pb, what, req)
        c.equal(got, want, f"{what}: streamed ids vs `ina generate`")
        if not responses:
            continue
        final = responses[-1]
        with_tokens = [len(r.token_ids) for r in responses if r.token_ids]
        step = interval or 1
        c.check(all(k == step for k in with_tokens[:-1]) and with_tokens[-1] <= step,
                f"{what}: tokens per response {with_tokens}, expected chunks of {step}")
        if len(got) > 1:
            c.check(len(responses) > 1, f"{what}: {len(got)} tokens came in a single response")
        if len(got) == max_new:
            c.equal(inf.FinishReason.Name(final.finish_reason), "FINISH_REASON_LENGTH", f"{what}: finish")
        else:
            c.equal(inf.FinishReason.Name(final.finish_reason), "FINISH_REASON_STOP", f"{what}: finish")
            c.equal((got[-1:], final.stop_token_id), ([info.model.eos_token_id], info.model.eos_token_id),
                    f"{what}: a generation cut short ends with EOS")
        print(f"ok  {what}: {got} in {len(responses)} responses", flush=True)
        if n == 0:
            check_stop_ids(c, client, pb, prompt, want)

    # Refusals, before any response, with the field named in the details.
    c.rpc_error(lambda: list(client.generate(inf.GenerateRequest(request_id="e2e-empty", max_tokens=4),
                                             timeout=RPC_TIMEOUT_S)),
                grpc.StatusCode.INVALID_ARGUMENT, "Generate with an empty prompt", ["prompt_token_ids"])
    c.rpc_error(lambda: list(client.generate(inf.GenerateRequest(request_id="e2e-vocab",
                                                                 prompt_token_ids=[1, vocab], max_tokens=4),
                                             timeout=RPC_TIMEOUT_S)),
                grpc.StatusCode.INVALID_ARGUMENT, "Generate with an id >= vocab_size",
                ["prompt_token_ids[1]", str(vocab)])
    c.rpc_error(lambda: list(client.generate(inf.GenerateRequest(prompt_token_ids=[1], max_tokens=4),
                                             timeout=RPC_TIMEOUT_S)),
                grpc.StatusCode.INVALID_ARGUMENT, "Generate without request_id", ["request_id"])
    c.rpc_error(lambda: list(client.generate(inf.GenerateRequest(request_id="e2e-zero", prompt_token_ids=[1]),
                                             timeout=RPC_TIMEOUT_S)),
                grpc.StatusCode.INVALID_ARGUMENT, "Generate with max_tokens 0", ["max_tokens"])

    check_cancel(c, client, pb, pb["node"].GetLoadRequest())
    r = client.cancel(inf.CancelRequest(request_id="e2e-never-submitted"), timeout=RPC_TIMEOUT_S)
    c.equal(r.cancelled, False, "Cancel of an unknown request_id")
    r = client.cancel(inf.CancelRequest(request_id="e2e-0"), timeout=RPC_TIMEOUT_S)
    c.equal(r.cancelled, False, "Cancel of a finished request_id")


def check_placement(c, client, pb, info, rng):
    """GetPlacement at start-up; ApplyPlacement refusals (tokens, stale generation,
    malformed placements naming the field, another layout), a dry run, and real changes
    (the experts in a new order, then back) that leave greedy outputs unchanged."""
    plc, inf = pb["placement"], pb["inference"]
    admin = [("authorization", f"Bearer {ADMIN_TOKEN}")]
    got = client.get_placement(plc.GetPlacementRequest(), timeout=RPC_TIMEOUT_S).placement
    m = info.model
    c.equal((got.layout.tp, got.layout.dp, got.layout.ep), (1, 1, 1), "GetPlacement layout tp/dp/ep")
    c.equal(got.generation, 1, "GetPlacement generation")
    c.equal(got.slots_per_rank, m.n_routed_experts, "GetPlacement slots_per_rank")
    c.equal(sorted(layer.moe_layer for layer in got.layers), list(range(m.n_moe_layers)),
            "GetPlacement layers")
    identity = [(0, e, e) for e in range(m.n_routed_experts)]
    for layer in got.layers:
        slots = sorted((s.ep_rank, s.slot, s.logical_expert) for s in layer.slots)
        c.equal(slots, identity, f"GetPlacement layer {layer.moe_layer}: slots (ep_rank, slot, expert)")

    def apply(placement, generation, dry_run=False, metadata=admin):
        request = plc.ApplyPlacementRequest(placement=placement, expected_generation=generation,
                                            dry_run=dry_run)
        return lambda: client.apply_placement(request, timeout=RPC_TIMEOUT_S, metadata=metadata)

    c.rpc_error(apply(got, 1, metadata=None), grpc.StatusCode.UNAUTHENTICATED, "ApplyPlacement without a token")
    c.rpc_error(apply(got, 1, metadata=[("authorization", "Bearer wrong-token")]),
                grpc.StatusCode.UNAUTHENTICATED, "ApplyPlacement with a wrong token")
    c.rpc_error(apply(got, 0), grpc.StatusCode.FAILED_PRECONDITION, "ApplyPlacement without expected_generation",
                ["expected_generation"])
    # Broken copies, each refused with the field path.
    layer = rng.randrange(m.n_moe_layers)
    def broken(edit):
        p = plc.ExpertPlacement()
        p.CopyFrom(got)
        edit(p)
        return p
    cases = [
        ("an expert out of range", lambda p: setattr(p.layers[layer].slots[0], "logical_expert", m.n_routed_experts),
         grpc.StatusCode.INVALID_ARGUMENT, f"placement.layers[{layer}].slots[0].logical_expert"),
        ("an expert without a slot", lambda p: p.layers[layer].slots.pop(),
         grpc.StatusCode.INVALID_ARGUMENT, f"placement.layers[{layer}]: logical expert"),
        ("a rank outside ep", lambda p: setattr(p.layers[layer].slots[1], "ep_rank", 1),
         grpc.StatusCode.INVALID_ARGUMENT, f"placement.layers[{layer}].slots[1].ep_rank"),
        ("a layer twice", lambda p: setattr(p.layers[layer], "moe_layer", (layer + 1) % m.n_moe_layers),
         grpc.StatusCode.INVALID_ARGUMENT, "appears twice"),
        ("no slots per rank", lambda p: setattr(p, "slots_per_rank", 0),
         grpc.StatusCode.INVALID_ARGUMENT, "placement.slots_per_rank"),
        ("another layout", lambda p: setattr(p.layout, "ep", 2),
         grpc.StatusCode.FAILED_PRECONDITION, "placement.layout"),
    ]
    if m.n_moe_layers == 1:
        cases = [k for k in cases if k[0] != "a layer twice"]
    for what, edit, code, words in cases:
        c.rpc_error(apply(broken(edit), 1), code, f"ApplyPlacement with {what}", [words])

    prompt = [rng.randrange(4, m.vocab_size) for _ in range(4)]
    def greedy(tag):
        ids, _ = run_generate(c, client, pb, f"Generate {tag}",
                              inf.GenerateRequest(request_id=f"e2e-place-{tag}", prompt_token_ids=prompt,
                                                  max_tokens=8, ignore_eos=True))
        return ids
    before = greedy("before")
    dry = apply(got, 1, dry_run=True)()
    c.equal(dry.generation, 1, "ApplyPlacement dry_run: the generation stays")
    # The experts of every layer in a new order over the slots, then the original back.
    shuffled = plc.ExpertPlacement()
    shuffled.CopyFrom(got)
    for lp in shuffled.layers:
        experts = [s.logical_expert for s in lp.slots]
        rng.shuffle(experts)
        for s, x in zip(lp.slots, experts):
            s.logical_expert = x
    for step, (placement, generation) in enumerate([(shuffled, 1), (got, 2)]):
        resp = apply(placement, generation)()
        c.equal(resp.generation, generation + 1, f"ApplyPlacement {step + 1}: the new generation")
        now = client.get_placement(plc.GetPlacementRequest(), timeout=RPC_TIMEOUT_S).placement
        c.equal(now.generation, generation + 1, f"GetPlacement after ApplyPlacement {step + 1}")
        c.equal([sorted((s.ep_rank, s.slot, s.logical_expert) for s in lp.slots) for lp in now.layers],
                [sorted((s.ep_rank, s.slot, s.logical_expert) for s in lp.slots) for lp in placement.layers],
                f"GetPlacement after ApplyPlacement {step + 1}: the slots applied")
        c.equal(greedy(f"after-{step + 1}"), before, f"greedy tokens after ApplyPlacement {step + 1}")
    c.rpc_error(apply(got, 1), grpc.StatusCode.FAILED_PRECONDITION, "ApplyPlacement with a stale generation",
                ["generation 3 is in force"])


def check_garbage(c, client, pb):
    """Bytes that are not protobuf (a truncated varint; a length past the end) are
    refused with INVALID_ARGUMENT, and the agent goes on serving."""
    blobs = [b"\xff\xff\xff", b"\x0a\x7fshort"]
    for blob in blobs:
        for path in ("/ina.v1.Node/GetNodeInfo", "/ina.v1.Inference/Cancel", "/ina.v1.Placement/GetPlacement",
                     "/grpc.health.v1.Health/Check"):
            c.rpc_error(lambda: client.raw_unary(path)(blob, timeout=RPC_TIMEOUT_S),
                        grpc.StatusCode.INVALID_ARGUMENT, f"{path} with bytes {blob!r}")
        c.rpc_error(lambda: client.raw_unary("/ina.v1.Placement/ApplyPlacement")(
                        blob, timeout=RPC_TIMEOUT_S, metadata=[("authorization", f"Bearer {ADMIN_TOKEN}")]),
                    grpc.StatusCode.INVALID_ARGUMENT, f"ApplyPlacement with bytes {blob!r}")
        c.rpc_error(lambda: list(client.raw_stream("/ina.v1.Inference/Generate")(blob, timeout=RPC_TIMEOUT_S)),
                    grpc.StatusCode.INVALID_ARGUMENT, f"Generate with bytes {blob!r}")
    c.rpc_error(lambda: client.raw_unary("/ina.v1.Node/NoSuchMethod")(b"", timeout=RPC_TIMEOUT_S),
                grpc.StatusCode.UNIMPLEMENTED, "an unknown method")
    # Still serving, and still generating.
    hp = pb["health"]
    r = client.health_check(hp.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
    c.equal(hp.HealthCheckResponse.ServingStatus.Name(r.status), "SERVING", "health after garbage requests")
    inf = pb["inference"]
    out = list(client.generate(inf.GenerateRequest(request_id="e2e-after-garbage", prompt_token_ids=[3, 4],
                                                   max_tokens=2, ignore_eos=True), timeout=RPC_TIMEOUT_S))
    c.equal(sum(len(x.token_ids) for x in out), 2, "Generate after garbage requests: tokens")


METRIC_LINE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*'
                         r'(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? '
                         r'(\S+)$')


def check_metrics(c, metrics_address):
    """GET /metrics: 200, the 0.0.4 text format line by line, counters that moved."""
    import urllib.request
    # No proxy between the test and a loopback address, whatever the environment says.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{metrics_address}/metrics", timeout=10) as resp:
        c.equal(resp.status, 200, "GET /metrics status")
        c.check(resp.headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"),
                f"/metrics content type {resp.headers.get('Content-Type')!r}")
        text = resp.read().decode("utf-8")
    values = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            continue
        m = METRIC_LINE.match(line)
        if not c.check(m, f"/metrics line does not parse: {line!r}"):
            continue
        try:
            values[line.rsplit(" ", 1)[0]] = float(m.group(4))
        except ValueError:
            c.check(False, f"/metrics value is not a number: {line!r}")
    finished = sum(v for k, v in values.items() if k.startswith("ina_requests_total{"))
    c.check(finished >= 1, f"ina_requests_total should count the generations, got {finished}")
    c.check(values.get("ina_generated_tokens_total", 0) >= finished,
            "ina_generated_tokens_total should count their tokens")
    c.check(values.get("ina_time_to_first_token_seconds_count", 0) >= 1,
            "the time-to-first-token histogram should have observations")
    c.check(values.get("ina_scheduler_steps_total", 0) >= 1, "ina_scheduler_steps_total should move")
    c.check(values.get("ina_kv_pages_free", 0) > 0, "ina_kv_pages_free should be positive")
    # Every MoE layer routed the same tokens: the layers' sums agree and are positive.
    layer_sums = {}
    for k, v in values.items():
        m = re.match(r'ina_expert_routed_tokens_total\{moe_layer="(\d+)",expert="\d+"\}$', k)
        if m:
            layer_sums[m.group(1)] = layer_sums.get(m.group(1), 0) + v
    c.check(layer_sums and len(set(layer_sums.values())) == 1 and min(layer_sums.values()) > 0,
            f"ina_expert_routed_tokens_total per MoE layer: {layer_sums}")
    print(f"metrics scrape: {len(values)} series, {finished:.0f} requests finished", flush=True)


def check_sigterm(c, client, pb, agent):
    """SIGTERM: health goes NOT_SERVING (seen by a Watch opened before), the process
    says stopped and exits 0 within EXIT_TIMEOUT_S."""
    hp = pb["health"]
    watch = client.health_watch(hp.HealthCheckRequest(service="ina.v1.Inference"), timeout=RPC_TIMEOUT_S)
    first = next(watch)
    c.equal(hp.HealthCheckResponse.ServingStatus.Name(first.status), "SERVING", "Watch before SIGTERM")
    t0 = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    seen = []
    try:
        for msg in watch:
            seen.append(hp.HealthCheckResponse.ServingStatus.Name(msg.status))
    except grpc.RpcError as e:  # the server ends the stream when it shuts down
        seen.append(f"<{e.code().name}>")
    print("health Watch after SIGTERM:", " -> ".join(seen), flush=True)
    c.check(seen and seen[0] == "NOT_SERVING", f"Watch after SIGTERM should say NOT_SERVING first: {seen}")
    try:
        status = agent.proc.wait(timeout=EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        status = None
    c.equal(status, 0, f"ina-agent exit status within {EXIT_TIMEOUT_S:.0f} s of SIGTERM")
    print(f"ina-agent exited {status} {time.monotonic() - t0:.2f} s after SIGTERM", flush=True)
    c.check(agent.wait_line(r"ina-agent: stopped", 5.0) is not None,
            f"ina-agent should print 'stopped'; its output: {''.join(agent.output)!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", required=True, help="path of ina-agent")
    ap.add_argument("--ina", required=True, help="path of ina")
    ap.add_argument("--proto-dir", required=True, help="the repository's proto/ folder")
    args = ap.parse_args()
    if not shutil.which("protoc"):
        print("SKIP: protoc not found (install the Debian package protobuf-compiler)")
        return SKIP
    seed = int(os.environ.get("INA_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"test_agent_grpc: seed {seed} (rerun with INA_TEST_SEED={seed})", flush=True)
    rng = random.Random(seed)

    c = Checks()
    agent = None
    with tempfile.TemporaryDirectory(prefix="ina-e2e-") as tmp:
        pb = load_messages(args.proto_dir, tmp)
        try:
            agent = Agent(args.agent, tmp)
            m = agent.wait_line(r"listening on (\S+)", START_TIMEOUT_S)
            if not c.check(m, f"ina-agent printed no address; its output: {''.join(agent.output)!r}"):
                return 1
            address = m.group(1)
            m = agent.wait_line(r"metrics on (\S+)", START_TIMEOUT_S)
            if not c.check(m, f"ina-agent printed no metrics address; its output: {''.join(agent.output)!r}"):
                return 1
            metrics_address = m.group(1)
            print("ina-agent at", address, flush=True)
            # No proxy between the test and a loopback address, whatever the environment says.
            with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:
                client = Client(channel, pb)
                check_start_up(c, client, pb)
                info = check_node(c, client, pb, agent.proc.pid)
                check_generate(c, client, pb, args.ina, info, rng)
                check_expert_load(c, client, pb, info)
                check_placement(c, client, pb, info, rng)
                check_garbage(c, client, pb)
                check_metrics(c, metrics_address)
                check_sigterm(c, client, pb, agent)
        finally:
            if agent:
                agent.kill()
    if c.failed:
        print(f"test_agent_grpc: FAILED {len(c.failed)} of {c.passed + len(c.failed)} checks (seed {seed})")
        return 1
    print(f"test_agent_grpc: all {c.passed} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
