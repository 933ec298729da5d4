#!/usr/bin/python3
"""Every gRPC status code that proto/ documents for a call, provoked once each against
the real ina-agent, through the independent Python client of test_agent_grpc.py.

Each refusal is checked for its code and for details that name the cause. The refusals
must change nothing: afterwards a greedy Generate equals a local `ina generate` and
GetPlacement still reports the generation (and slots) the agent started with.

Agents: "main" (--admin-token-file, --max-running 1 --max-queued-requests 1,
--drain-grace-ms 60000), "small" (--max-tokens 512, no admin token) and, with --mpiexec,
"ep" (mpirun -np 2 ina-agent --ep: two ranks sharing the experts), all --model tiny on
the CPU.

  call                         code                 how it is provoked
  ---------------------------  -------------------  -------------------------------------
  Inference.Generate           INVALID_ARGUMENT     main: a prompt id == vocab_size
                                                    (details: "prompt_token_ids[1]");
                                                    small: prompt + max_tokens one token
                                                    over the KV capacity of --max-tokens
                                                    512 (details: "KV capacity"), never
                                                    RESOURCE_EXHAUSTED; the request that
                                                    just fits runs
  Inference.Generate           ALREADY_EXISTS       main: the request_id of the running
                                                    request, and of the queued one
  Inference.Generate           RESOURCE_EXHAUSTED   main: one request running (ignore_eos,
                                                    long max_tokens), one waiting for
                                                    admission, a third is refused
                                                    (details: "the queue is full")
  Inference.Generate           UNAVAILABLE          main: SIGTERM while a long stream
                                                    runs; during the drain (details: "not
                                                    serving")
  Placement.ApplyPlacement     INVALID_ARGUMENT     main: a logical expert out of range
                                                    (details: the field path
                                                    "placement.layers[L].slots[0]
                                                    .logical_expert")
  Placement.ApplyPlacement     FAILED_PRECONDITION  main: a stale expected_generation, and
                                                    0 (never valid); another layout (ep 2
                                                    on one rank)
  Placement.ApplyPlacement     FAILED_PRECONDITION  NOT PROVOKED: "a single-GPU engine
                               (single-rank engine  asked to change its placement" is the
                               changing placement)  CUDA engine's refusal
                                                    (model/engine_gpu_placement.c); the
                                                    CPU engine of one rank applies a new
                                                    order of its experts. The test checks
                                                    that instead: a shuffled placement
                                                    passes a dry run on "main".
  Placement.ApplyPlacement     UNAUTHENTICATED      main: no authorization metadata, and a
                                                    wrong bearer token
  Placement.ApplyPlacement     PERMISSION_DENIED    small: started without an admin token
                                                    (with and without a bearer token)
  Placement.ApplyPlacement     UNAVAILABLE          main: during the drain after SIGTERM
                                                    (details: "stopping")
  Placement.ApplyPlacement     RESOURCE_EXHAUSTED   ep (needs --mpiexec): every rank to
                                                    hold all 8 experts of every layer; the
                                                    dry run passes (its memory check reads
                                                    MemAvailable, and tiny's experts are
                                                    0.6 MB), then rank 1's address space
                                                    is capped at its current size
                                                    (prlimit RLIMIT_AS) for the real call:
                                                    rank 1 cannot allocate the experts it
                                                    would receive, every rank rolls back
                                                    (details: "expert move"; rank 1's log:
                                                    "no memory"). The cap is lifted after
                                                    the call. Without --mpiexec this row is
                                                    skipped, saying so.
  grpc.health.v1.Health/Check  NOT_FOUND            main: service "no.such.Service"
  Node.GetLoad                 UNIMPLEMENTED        NOT PROVOKED: service_node.c answers it
                               (include_expert_load) for an engine without per-expert
                                                    counters, but both engines (CPU and
                                                    CUDA) keep them; the test checks that
                                                    GetLoad with include_expert_load
                                                    answers the counters instead.
  (any) unknown method         UNIMPLEMENTED        main: /ina.v1.Node/NoSuchMethod
                                                    (details: "unknown method")

Exit status: 0 pass, 1 fail, 77 skip (as test_agent_grpc.py: no grpc or protobuf module
for /usr/bin/python3, or no protoc).
"""
import argparse
import importlib.util
import os
import queue
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_base():
    """test_agent_grpc.py as a module (it exits 77 itself without grpc or protobuf). No
    bytecode is written: the source tree stays as it was."""
    sys.dont_write_bytecode = True
    spec = importlib.util.spec_from_file_location("test_agent_grpc", os.path.join(HERE, "test_agent_grpc.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


base = _load_base()
import grpc  # noqa: E402  (present: the module above exits 77 without it)

SKIP = base.SKIP
RPC_TIMEOUT_S = base.RPC_TIMEOUT_S
START_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 10.0
WAIT_S = 10.0        # bound of every poll for a state (queued, draining)
LONG_STREAM_S = 60.0  # deadline of the streams kept running
ADMIN_TOKEN = base.ADMIN_TOKEN
Code = grpc.StatusCode


# ---- processes ---------------------------------------------------------------------------

class Launched(base.Agent):
    """ina-agent (or mpirun running it) with its own argv; stdout and stderr merged into
    the lines base.Agent collects. Remembers the pids of the ranks it announces so that
    kill() ends them too: mpirun puts each rank in a process group of its own."""

    def __init__(self, name, argv, env=None):
        self.name = name
        self.argv = argv
        self.rank_pids = {}
        print(f"[{name}] starting", " ".join(argv), flush=True)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env)
        self.lines = queue.Queue()
        self.output = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            m = re.search(r"ina-agent: rank (\d+) of \d+ .*\(pid (\d+)\)", line)
            if m:
                self.rank_pids[int(m.group(1))] = int(m.group(2))
            self.output.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def start(self):
        """The gRPC address once the agent says serving, or None."""
        m = self.wait_line(r"listening on (\S+)", START_TIMEOUT_S)
        if not m or not self.wait_line(r"ina-agent: serving$", START_TIMEOUT_S):
            return None
        return m.group(1)

    def log(self):
        return "".join(self.output)

    def exited(self, timeout_s):
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self):
        for pid in self.rank_pids.values():
            try:  # only a process that still runs an ina-agent (not a recycled pid)
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    exe = f.read().split(b"\0")[0].decode(errors="replace")
                if os.path.basename(exe) == "ina-agent":
                    os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        super().kill()


def agent_argv(agent, *flags):
    return [agent, "--model", "tiny", "--model-seed", base.MODEL_SEED, "--device", "cpu",
            "--listen", "127.0.0.1:0", *flags]


class Stream:
    """A Generate call read by a thread of its own, so that the test never blocks on it
    and the agent's writer is never held up by an unread stream."""

    def __init__(self, client, request, timeout_s=LONG_STREAM_S):
        self.request_id = request.request_id
        self.call = client.generate(request, timeout=timeout_s)
        self.responses = []
        self.error = None
        self.first = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for r in self.call:
                self.responses.append(r)
                self.first.set()
        except grpc.RpcError as e:
            self.error = e
        finally:
            self.first.set()
            self.done.set()

    def tokens(self):
        return sum(len(r.token_ids) for r in self.responses)

    def finish(self):
        return self.responses[-1].finish_reason if self.done.is_set() and self.responses else 0


# ---- helpers -----------------------------------------------------------------------------

def wait_for(cond, timeout_s=WAIT_S):
    """Polls cond() until it holds or timeout_s pass; returns its last value."""
    end = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v or time.monotonic() >= end:
            return v
        time.sleep(0.01)


def placement_slots(placement):
    return [sorted((s.ep_rank, s.slot, s.logical_expert) for s in lp.slots)
            for lp in sorted(placement.layers, key=lambda lp: lp.moe_layer)]


def greedy_still_works(c, client, pb, ina, what, rng, vocab):
    """A greedy Generate after the refusals: the tokens of a local `ina generate`."""
    inf = pb["inference"]
    prompt = [rng.randrange(4, vocab) for _ in range(5)]
    want = base.local_generate(ina, prompt, 8, True)
    req = inf.GenerateRequest(request_id=f"greedy-{what}", prompt_token_ids=prompt, max_tokens=8,
                              ignore_eos=True)
    got, _ = base.run_generate(c, client, pb, f"{what}: greedy Generate after the refusals", req)
    c.equal(got, want, f"{what}: greedy Generate after the refusals vs `ina generate`")


def refused(c, call, code, what, detail_words=()):
    """Checks.rpc_error, printing the details of an expected refusal for the log."""
    e = c.rpc_error(call, code, what, detail_words)
    if e is not None and e.code() == code:
        print(f"ok  {what}: {code.name} {e.details()!r}", flush=True)
    return e


def generate_call(client, request):
    return lambda: list(client.generate(request, timeout=RPC_TIMEOUT_S))


def apply_call(client, pb, placement, generation, dry_run=False, metadata=None):
    req = pb["placement"].ApplyPlacementRequest(placement=placement, expected_generation=generation,
                                                dry_run=dry_run)
    return lambda: client.apply_placement(req, timeout=RPC_TIMEOUT_S, metadata=metadata)


# ---- the agent with an admin token and a one-request queue ---------------------------------

def check_main(c, client, pb, agent, ina, rng):
    hp, node, inf, plc = pb["health"], pb["node"], pb["inference"], pb["placement"]
    admin = [("authorization", f"Bearer {ADMIN_TOKEN}")]
    info = client.get_node_info(node.GetNodeInfoRequest(), timeout=RPC_TIMEOUT_S)
    m = info.model
    vocab = m.vocab_size

    # grpc.health.v1.Health/Check: NOT_FOUND.
    unknown = hp.HealthCheckRequest(service="no.such.Service")
    refused(c, lambda: client.health_check(unknown, timeout=RPC_TIMEOUT_S), Code.NOT_FOUND,
            "Health/Check of an unknown service", ["unknown service", "no.such.Service"])
    # An unknown method: UNIMPLEMENTED.
    refused(c, lambda: client.raw_unary("/ina.v1.Node/NoSuchMethod")(b"", timeout=RPC_TIMEOUT_S),
            Code.UNIMPLEMENTED, "an unknown method", ["unknown method", "/ina.v1.Node/NoSuchMethod"])
    # Node.GetLoad with include_expert_load: the CPU engine keeps counters, so it answers.
    load = client.get_load(node.GetLoadRequest(include_expert_load=True), timeout=RPC_TIMEOUT_S)
    c.equal(len(load.expert_load), m.n_moe_layers,
            "GetLoad include_expert_load on the CPU engine (answers, not UNIMPLEMENTED): layers")

    start = client.get_placement(plc.GetPlacementRequest(), timeout=RPC_TIMEOUT_S).placement
    c.equal(start.generation, 1, "GetPlacement generation at start-up")

    # Inference.Generate: INVALID_ARGUMENT naming the field.
    bad_id = inf.GenerateRequest(request_id="bad-id", prompt_token_ids=[1, vocab], max_tokens=4)
    refused(c, generate_call(client, bad_id), Code.INVALID_ARGUMENT,
            "Generate with a prompt id == vocab_size",
            ["prompt_token_ids[1]", f"{vocab} >= vocab_size {vocab}"])

    # Placement.ApplyPlacement: UNAUTHENTICATED, INVALID_ARGUMENT, FAILED_PRECONDITION.
    refused(c, apply_call(client, pb, start, 1), Code.UNAUTHENTICATED, "ApplyPlacement without a token",
            ["bearer token"])
    refused(c, apply_call(client, pb, start, 1, metadata=[("authorization", "Bearer not-the-token")]),
            Code.UNAUTHENTICATED, "ApplyPlacement with a wrong token", ["bearer token"])
    layer = rng.randrange(m.n_moe_layers)
    bad = plc.ExpertPlacement()
    bad.CopyFrom(start)
    bad.layers[layer].slots[0].logical_expert = m.n_routed_experts
    refused(c, apply_call(client, pb, bad, 1, metadata=admin), Code.INVALID_ARGUMENT,
            "ApplyPlacement with a logical expert out of range",
            [f"placement.layers[{layer}].slots[0].logical_expert", str(m.n_routed_experts)])
    refused(c, apply_call(client, pb, start, 2, metadata=admin), Code.FAILED_PRECONDITION,
            "ApplyPlacement with a stale expected_generation",
            ["expected_generation: 2", "generation 1 is in force"])
    refused(c, apply_call(client, pb, start, 0, metadata=admin), Code.FAILED_PRECONDITION,
            "ApplyPlacement with expected_generation 0", ["expected_generation: missing"])
    other = plc.ExpertPlacement()
    other.CopyFrom(start)
    other.layout.ep = 2
    refused(c, apply_call(client, pb, other, 1, metadata=admin), Code.FAILED_PRECONDITION,
            "ApplyPlacement with another layout", ["placement.layout", "needs a restart"])
    # A single-rank CPU engine takes a new order of its experts (the FAILED_PRECONDITION of
    # the proto is the CUDA engine's): a dry run passes and applies nothing.
    shuffled = plc.ExpertPlacement()
    shuffled.CopyFrom(start)
    for lp in shuffled.layers:
        experts = [s.logical_expert for s in lp.slots]
        experts = experts[1:] + experts[:1]
        for s, x in zip(lp.slots, experts):
            s.logical_expert = x
    try:
        dry = apply_call(client, pb, shuffled, 1, dry_run=True, metadata=admin)()
        c.equal(dry.generation, 1, "ApplyPlacement dry run of a new order on one CPU rank: generation")
    except grpc.RpcError as e:
        c.check(False, "ApplyPlacement dry run of a new order on one CPU rank: "
                f"{e.code().name} {e.details()!r}")

    # Inference.Generate: ALREADY_EXISTS and RESOURCE_EXHAUSTED with one request running
    # and one waiting (--max-running 1 --max-queued-requests 1).
    long_tokens = m.max_context_tokens - 2
    def long_request(rid):
        return inf.GenerateRequest(request_id=rid, prompt_token_ids=[5, 6], max_tokens=long_tokens,
                                   ignore_eos=True, stream_interval=8)
    running = Stream(client, long_request("hold-running"))
    c.check(running.first.wait(WAIT_S) and running.responses,
            f"the long request should stream (error {running.error})")
    waiting = Stream(client, long_request("hold-waiting"))
    def load_now():
        return client.get_load(node.GetLoadRequest(), timeout=RPC_TIMEOUT_S)
    def one_and_one():
        l = load_now()
        return (l.running_requests, l.queued_requests) == (1, 1)
    c.check(wait_for(one_and_one),
            f"GetLoad should show 1 running and 1 queued: {load_now()}")
    for rid in ("hold-running", "hold-waiting"):
        refused(c, generate_call(client, long_request(rid)), Code.ALREADY_EXISTS,
                f"Generate with the request_id of the {rid[5:]} request",
                ["request_id", rid, "already in flight"])
    third = inf.GenerateRequest(request_id="third", prompt_token_ids=[7], max_tokens=4)
    refused(c, generate_call(client, third), Code.RESOURCE_EXHAUSTED,
            "Generate while one request runs and one waits",
            ["the queue is full", "--max-queued-requests 1"])
    l = load_now()
    c.equal((l.running_requests, l.queued_requests), (1, 1), "GetLoad after the refusals: running, queued")
    c.check(not running.done.is_set(),
            f"the long request should still run during the queue checks ({running.tokens()} tokens)")
    for s in (waiting, running):
        r = client.cancel(inf.CancelRequest(request_id=s.request_id), timeout=RPC_TIMEOUT_S)
        c.equal(r.cancelled, True, f"Cancel of {s.request_id}")
        c.check(s.done.wait(WAIT_S) and s.finish() == inf.FINISH_REASON_CANCELLED,
                f"{s.request_id} should end CANCELLED (error {s.error}, last {s.responses[-1:]})")
    def idle():
        l = load_now()
        return (l.running_requests, l.queued_requests) == (0, 0)
    c.check(wait_for(idle), f"the agent should be idle after the cancels: {load_now()}")

    # Nothing changed: greedy outputs and the placement.
    greedy_still_works(c, client, pb, ina, "main", rng, vocab)
    now = client.get_placement(plc.GetPlacementRequest(), timeout=RPC_TIMEOUT_S).placement
    c.equal(now.generation, start.generation, "main: GetPlacement generation after the refusals")
    c.equal(placement_slots(now), placement_slots(start), "main: GetPlacement slots after the refusals")

    # UNAVAILABLE while draining: SIGTERM with a long stream running and a long grace.
    draining = Stream(client, long_request("hold-drain"))
    c.check(draining.first.wait(WAIT_S) and draining.responses,
            f"the long request before SIGTERM should stream (error {draining.error})")
    agent.proc.send_signal(signal.SIGTERM)
    def not_serving():
        r = client.health_check(hp.HealthCheckRequest(service="ina.v1.Inference"), timeout=RPC_TIMEOUT_S)
        return r.status == hp.HealthCheckResponse.NOT_SERVING
    c.check(wait_for(not_serving), "health should say NOT_SERVING after SIGTERM")
    health = client.get_health(node.GetHealthRequest(), timeout=RPC_TIMEOUT_S)
    c.equal(node.NodeState.Name(health.state), "NODE_STATE_DRAINING", "Node.GetHealth after SIGTERM")
    late = inf.GenerateRequest(request_id="late", prompt_token_ids=[7], max_tokens=4)
    refused(c, generate_call(client, late), Code.UNAVAILABLE, "Generate while draining", ["not serving"])
    refused(c, apply_call(client, pb, start, 1, metadata=admin), Code.UNAVAILABLE,
            "ApplyPlacement while draining", ["stopping"])
    c.check(not draining.done.is_set() and agent.proc.poll() is None,
            f"the long stream should still run during the drain checks ({draining.tokens()} tokens, "
            f"error {draining.error})")
    r = client.cancel(inf.CancelRequest(request_id="hold-drain"), timeout=RPC_TIMEOUT_S)
    c.equal(r.cancelled, True, "Cancel of the stream that held the drain")
    c.check(draining.done.wait(WAIT_S) and draining.finish() == inf.FINISH_REASON_CANCELLED,
            f"the drained stream should end CANCELLED (error {draining.error})")
    c.equal(agent.exited(EXIT_TIMEOUT_S), 0, f"main: exit status within {EXIT_TIMEOUT_S:.0f} s of the cancel")


# ---- the agent without an admin token and a small KV cache --------------------------------

def check_small(c, client, pb, agent, ina, rng):
    node, inf, plc = pb["node"], pb["inference"], pb["placement"]
    info = client.get_node_info(node.GetNodeInfoRequest(), timeout=RPC_TIMEOUT_S)
    cap = info.model.max_context_tokens
    c.equal(cap, 512, "small: max_context_tokens with --max-tokens 512")
    prompt = [rng.randrange(4, info.model.vocab_size) for _ in range(100)]
    over = inf.GenerateRequest(request_id="over-kv", prompt_token_ids=prompt,
                               max_tokens=cap - len(prompt) + 1, ignore_eos=True)
    e = refused(c, generate_call(client, over), Code.INVALID_ARGUMENT,
                "Generate one token over the KV capacity",
                ["prompt_token_ids + max_tokens", f"{cap + 1} tokens", f"KV capacity of {cap} tokens"])
    c.check(e is None or e.code() != Code.RESOURCE_EXHAUSTED,
            "over the KV capacity is never RESOURCE_EXHAUSTED")
    # The request that just fits is served to its end.
    fits = inf.GenerateRequest(request_id="fits-kv", prompt_token_ids=prompt, max_tokens=cap - len(prompt),
                               ignore_eos=True, stream_interval=64)
    got, _ = base.run_generate(c, client, pb, "Generate that fills the KV capacity", fits)
    c.equal(len(got), cap - len(prompt), "Generate that fills the KV capacity: tokens")

    start = client.get_placement(plc.GetPlacementRequest(), timeout=RPC_TIMEOUT_S).placement
    for what, metadata in (("without a token", None),
                           ("with a bearer token", [("authorization", f"Bearer {ADMIN_TOKEN}")])):
        refused(c, apply_call(client, pb, start, start.generation, metadata=metadata), Code.PERMISSION_DENIED,
                f"ApplyPlacement {what} on an agent without an admin token",
                ["admin calls are refused", "without an admin token"])
    greedy_still_works(c, client, pb, ina, "small", rng, info.model.vocab_size)
    now = client.get_placement(plc.GetPlacementRequest(), timeout=RPC_TIMEOUT_S).placement
    c.equal(now.generation, start.generation, "small: GetPlacement generation after the refusals")
    c.equal(placement_slots(now), placement_slots(start), "small: GetPlacement slots after the refusals")
    agent.proc.send_signal(signal.SIGTERM)
    c.equal(agent.exited(EXIT_TIMEOUT_S), 0, "small: exit status after SIGTERM")


# ---- two ranks sharing the experts: a placement that does not fit ----------------------------

def vm_size_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmSize for pid {pid}")


def agent_has_asan(agent):
    """Whether rank 1's ina-agent runs with AddressSanitizer (gcc links its runtime,
    libasan, as a shared library)."""
    try:
        with open(f"/proc/{agent.rank_pids.get(1)}/maps") as f:
            return "libasan" in f.read()
    except OSError:
        return False


def check_ep(c, client, pb, agent, ina, rng):
    node, plc = pb["node"], pb["placement"]
    admin = [("authorization", f"Bearer {ADMIN_TOKEN}")]
    info = client.get_node_info(node.GetNodeInfoRequest(), timeout=RPC_TIMEOUT_S)
    m = info.model
    c.equal(info.world_size, 2, "ep: world_size")
    start = client.get_placement(plc.GetPlacementRequest(), timeout=RPC_TIMEOUT_S).placement
    ep = start.layout.ep
    c.equal((ep, start.generation), (2, 1), "ep: GetPlacement ep and generation")
    # Every rank holds every expert of every layer: rank 1 would receive the half it lacks.
    full = plc.ExpertPlacement()
    full.layout.CopyFrom(start.layout)
    full.slots_per_rank = m.n_routed_experts
    for lp in start.layers:
        layer = full.layers.add(moe_layer=lp.moe_layer)
        for r in range(ep):
            for x in range(m.n_routed_experts):
                layer.slots.add(ep_rank=r, slot=x, logical_expert=x)
    try:
        dry = apply_call(client, pb, full, 1, dry_run=True, metadata=admin)()
        c.equal(dry.generation, 1, "ep: dry run of every expert on every rank: generation")
    except grpc.RpcError as e:
        c.check(False, f"ep: dry run of every expert on every rank: {e.code().name} {e.details()!r}")
    pid = agent.rank_pids.get(1)
    if not c.check(pid, f"ep: rank 1's pid not printed: {agent.log()!r}"):
        return
    if agent_has_asan(agent):
        # AddressSanitizer maps its shadow memory as it goes: under an address-space cap it
        # aborts the process instead of letting an allocation fail.
        print("ep: ApplyPlacement RESOURCE_EXHAUSTED not provoked: the agent runs under "
              "AddressSanitizer, which cannot live under an address-space cap", flush=True)
        os.kill(agent.rank_pids[0], signal.SIGTERM)
        c.equal(agent.exited(EXIT_TIMEOUT_S + 10), 0, "ep: mpirun's exit status after SIGTERM to rank 0")
        return
    old = resource.prlimit(pid, resource.RLIMIT_AS)
    # Rank 1 may keep what it has mapped but map nothing more: the experts it would receive
    # (about 200 KB a layer) do not fit.
    resource.prlimit(pid, resource.RLIMIT_AS, (vm_size_bytes(pid), old[1]))
    try:
        refused(c, apply_call(client, pb, full, 1, metadata=admin), Code.RESOURCE_EXHAUSTED,
                "ep: ApplyPlacement whose experts do not fit in rank 1's memory",
                ["placement", "expert move"])
    finally:
        resource.prlimit(pid, resource.RLIMIT_AS, old)
    c.check(wait_for(lambda: "no memory" in agent.log(), 5.0),
            f"ep: rank 1 should log that it has no memory for the experts: {agent.log()!r}")
    now = client.get_placement(plc.GetPlacementRequest(), timeout=RPC_TIMEOUT_S).placement
    c.equal(now.generation, start.generation, "ep: GetPlacement generation after the refusal")
    c.equal(placement_slots(now), placement_slots(start), "ep: GetPlacement slots after the refusal")
    greedy_still_works(c, client, pb, ina, "ep", rng, m.vocab_size)
    os.kill(agent.rank_pids[0], signal.SIGTERM)  # rank 0 drains; the followers exit with it
    c.equal(agent.exited(EXIT_TIMEOUT_S + 10), 0, "ep: mpirun's exit status after SIGTERM to rank 0")


# ---- main --------------------------------------------------------------------------------

def run_agent(c, pb, name, launched, check, *args):
    """Starts `launched`, runs check(c, client, pb, launched, *args), kills it whatever
    happens."""
    try:
        address = launched.start()
        if not c.check(address, f"[{name}] ina-agent did not start serving; its output: {launched.log()!r}"):
            return
        print(f"[{name}] serving at {address}", flush=True)
        with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:
            check(c, base.Client(channel, pb), pb, launched, *args)
    finally:
        launched.kill()
        print(f"[{name}] output:\n" + "".join("  " + line for line in launched.output), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agent", required=True, help="path of ina-agent")
    ap.add_argument("--ina", required=True, help="path of ina")
    ap.add_argument("--proto-dir", required=True, help="the repository's proto/ folder")
    ap.add_argument("--mpiexec", default="", help="mpirun, for the RESOURCE_EXHAUSTED placement (two ranks)")
    args = ap.parse_args()
    if not shutil.which("protoc"):
        print("SKIP: protoc not found (install the Debian package protobuf-compiler)")
        return SKIP
    seed = int(os.environ.get("INA_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    print(f"test_agent_status_codes: seed {seed} (rerun with INA_TEST_SEED={seed})", flush=True)
    rng = random.Random(seed)
    t0 = time.monotonic()
    c = base.Checks()
    with tempfile.TemporaryDirectory(prefix="ina-status-") as tmp:
        pb = base.load_messages(args.proto_dir, tmp)
        token_file = os.path.join(tmp, "admin-token")
        with open(token_file, "w") as f:
            f.write(ADMIN_TOKEN + "\n")

        small = Launched("small", agent_argv(args.agent, "--threads", base.THREADS, "--max-tokens", "512"))
        run_agent(c, pb, "small", small, check_small, args.ina, rng)

        if args.mpiexec:
            env = dict(os.environ)
            if os.geteuid() == 0:  # as tests/agent/daemon passes it to mpirun under ctest
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
                env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            # A fixed mmap threshold: allocations of 128 KB or more (the experts' transfer
            # buffers) always map fresh memory, which the cap on rank 1 refuses; with
            # glibc's sliding threshold they may come from heap space mapped before the cap.
            env["MALLOC_MMAP_THRESHOLD_"] = "131072"
            argv = [args.mpiexec, "--oversubscribe", "-np", "2",
                    *agent_argv(args.agent, "--ep", "--threads", "1", "--admin-token-file", token_file)]
            ep = Launched("ep", argv, env=env)
            run_agent(c, pb, "ep", ep, check_ep, args.ina, rng)
        else:
            print("NOT CHECKED: ApplyPlacement RESOURCE_EXHAUSTED needs two ranks (--mpiexec)", flush=True)

        main_agent = Launched("main", agent_argv(args.agent, "--threads", base.THREADS,
                                                 "--admin-token-file", token_file, "--max-running", "1",
                                                 "--max-queued-requests", "1", "--drain-grace-ms", "60000"))
        run_agent(c, pb, "main", main_agent, check_main, args.ina, rng)
    took = time.monotonic() - t0
    if c.failed:
        print(f"test_agent_status_codes: FAILED {len(c.failed)} of {c.passed + len(c.failed)} checks "
              f"in {took:.1f} s (seed {seed})")
        for f in c.failed:
            print("  FAIL:", f)
        return 1
    print(f"test_agent_status_codes: all {c.passed} checks passed in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
