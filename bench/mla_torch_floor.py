#!/usr/bin/env python3
"""The floor beside bench_mla: naive absorbed MLA decode written in torch.

Per request, the dense (unpaged) latent cache kv [b, s_k, 576] holds the 512 latent
values and the 64 rope'd key values of each token; q [b, h, 576] holds the absorbed query
and its rope part. One decode step is

    scores = (q . kv^T) * scale            einsum, bf16 in, fp32 softmax
    p      = softmax(scores).to(bf16)
    out    = p . kv[..., :512]             einsum

which is what a framework gives without a fused kernel: the scores round-trip through
memory and the cache is read twice. Figures use bench_mla's formulas (s_q = 1):

    bytes = b*s_k*576*2 (cache, once per request) + b*h*576*2 (queries) + b*h*512*2 (out)
    FLOPs = b*h*(2*576*s_k + 2*512*s_k)

Timing: N calls captured in one CUDA graph (rotating cache + query sets when one call's
data is under ~4x L2), replayed with CUDA events, median over replays / N; --no-graph
times back-to-back eager calls with events instead. On the CPU (--device cpu, for
checking the script) a host clock is used.

Usage: mla_torch_floor.py [--device cuda|cpu] [--tiny] [--shape SUBSTR[,...]] [--reps N]
                          [--no-graph]
Prints `name value unit formula` lines, one JSON line, and a short table last.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch

KV_LORA = 512
ROPE = 64
QK = KV_LORA + ROPE
SCALE = 1.0 / math.sqrt(192.0)  # DeepSeek-V3's qk_head_dim, as in bench_mla
ROTATE_BYTES = 200e6  # ~4x the H200's 50 MB L2
MAX_SETS = 16
GRAPH_TARGET_MS = 20.0
MAX_GRAPH_CALLS = 256

# (name, heads, batch, kv length): bench_mla's 16- and 128-head rows at 4k and 8k.
SHAPES = [
    ("h16_b128_kv4k", 16, 128, 4096),
    ("h16_b128_kv8k", 16, 128, 8192),
    ("h128_b64_kv4k", 128, 64, 4096),
    ("h128_b64_kv8k", 128, 64, 8192),
    ("h128_b128_kv4k", 128, 128, 4096),
    ("h128_b128_kv8k", 128, 128, 8192),
]
TINY_SHAPES = [
    ("tiny_h16_b4_kv256", 16, 4, 256),
    ("tiny_h128_b2_kv128", 128, 2, 128),
]


def mla_naive(q, kv):
    """q [b, h, 576], kv [b, s_k, 576] -> out [b, h, 512] (dtype of kv)."""
    scores = torch.einsum("bhc,bkc->bhk", q, kv).float() * SCALE
    p = torch.softmax(scores, dim=-1).to(kv.dtype)
    return torch.einsum("bhk,bkc->bhc", p, kv[..., :KV_LORA])


def figures(heads, batch, kv_len):
    nbytes = batch * kv_len * QK * 2 + batch * heads * QK * 2 + batch * heads * KV_LORA * 2
    flops = batch * heads * (2 * QK * kv_len + 2 * KV_LORA * kv_len)
    return nbytes, flops


def rel_l2(out, ref):
    out, ref = out.double(), ref.double()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


def check(q, kv):
    """The bf16 path against the same formula in float64 on the first two requests."""
    n = min(2, q.shape[0])
    got = mla_naive(q[:n], kv[:n])
    qd, kvd = q[:n].double(), kv[:n].double()
    p = torch.softmax(torch.einsum("bhc,bkc->bhk", qd, kvd) * SCALE, dim=-1)
    ref = torch.einsum("bhk,bkc->bhc", p, kvd[..., :KV_LORA])
    assert got.shape == ref.shape == (n, q.shape[1], KV_LORA), (got.shape, ref.shape)
    return rel_l2(got, ref)


def time_cpu(fn, sets, reps):
    samples = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        fn(i % sets)
        if i:  # the first call warms up
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), 1, "host clock"


def time_cuda_eager(fn, sets, calls, reps):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for rep in range(reps + 2):  # two warm-up batches
        start.record()
        for i in range(calls):
            fn(i % sets)
        stop.record()
        stop.synchronize()
        if rep >= 2:
            samples.append(start.elapsed_time(stop) / calls)
    return statistics.median(samples), calls, "back-to-back eager calls between CUDA events"


def time_cuda_graph(fn, sets, calls, reps):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream (cuBLAS handles etc.)
        for i in range(max(3, sets)):
            fn(i % sets)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % sets)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for rep in range(reps + 2):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        if rep >= 2:
            samples.append(start.elapsed_time(stop) / calls)
    del graph
    return statistics.median(samples), calls, "one CUDA graph replay of the calls"


def bench_shape(name, heads, batch, kv_len, args, gen):
    device = torch.device(args.device)
    nbytes, flops = figures(heads, batch, kv_len)
    working_set = batch * kv_len * QK * 2 + batch * heads * (QK + KV_LORA) * 2
    sets = 1
    if device.type == "cuda" and working_set < ROTATE_BYTES:
        sets = min(MAX_SETS, math.ceil(ROTATE_BYTES / working_set))
    # Uniform in [-1, 1), as bench_mla's caches and queries.
    kvs = [(torch.rand(batch, kv_len, QK, generator=gen, device=device) * 2 - 1).to(torch.bfloat16)
           for _ in range(sets)]
    qs = [(torch.rand(batch, heads, QK, generator=gen, device=device) * 2 - 1).to(torch.bfloat16)
          for _ in range(sets)]
    err = check(qs[0], kvs[0])
    out = mla_naive(qs[0], kvs[0])
    assert out.shape == (batch, heads, KV_LORA) and out.dtype == torch.bfloat16, out.shape
    if not torch.isfinite(out).all():
        raise RuntimeError(f"{name}: output has NaN or infinity")
    del out

    def fn(i):
        return mla_naive(qs[i], kvs[i])

    if device.type == "cuda":
        torch.cuda.synchronize()
        rough, _, _ = time_cuda_eager(fn, sets, sets, 3)
        calls = max(sets, min(MAX_GRAPH_CALLS, math.ceil(GRAPH_TARGET_MS / max(rough, 1e-3))))
        calls = (calls + sets - 1) // sets * sets
        if args.no_graph:
            ms, calls, how = time_cuda_eager(fn, sets, calls, args.reps)
        else:
            try:
                ms, calls, how = time_cuda_graph(fn, sets, calls, args.reps)
            except RuntimeError as e:  # capture failed: fall back, say so
                print(f"{name}: graph capture failed ({e}); timing eager calls", file=sys.stderr)
                torch.cuda.synchronize()
                ms, calls, how = time_cuda_eager(fn, sets, calls, args.reps)
    else:
        ms, calls, how = time_cpu(fn, sets, args.reps)
    return {
        "name": name, "heads": heads, "batch": batch, "kv": kv_len, "sets": sets,
        "calls": calls, "how": how, "ms": ms, "bytes": nbytes, "flops": flops,
        "tbs": nbytes / (ms * 1e-3) / 1e12, "tflops": flops / (ms * 1e-3) / 1e12, "rel_l2": err,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="small shapes, for checking the script")
    ap.add_argument("--shape", default=None, help="comma-separated substrings of shape names")
    ap.add_argument("--reps", type=int, default=20, help="timed replays (median)")
    ap.add_argument("--no-graph", action="store_true", help="time eager calls, not a CUDA graph")
    ap.add_argument("--seed", type=int, default=0x4D4C41)
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("mla_torch_floor: no CUDA device, skipped")
        return 77

    shapes = TINY_SHAPES if args.tiny else SHAPES
    if args.shape:
        keys = [k for k in args.shape.split(",") if k]
        shapes = [s for s in shapes if any(k in s[0] for k in keys)]
    device_name = (torch.cuda.get_device_name(torch.device(args.device))
                   if args.device.startswith("cuda") else "cpu")
    print(f"device {device_name}; torch {torch.__version__}")
    gen = torch.Generator(device=args.device)
    gen.manual_seed(args.seed)

    rows, results, failed = [], [], 0
    for name, heads, batch, kv_len in shapes:
        r = bench_shape(name, heads, batch, kv_len, args, gen)
        rows.append(r)
        ok = r["rel_l2"] <= 1e-2
        failed += not ok
        what = f"naive torch MLA, {heads} heads, batch {batch}, kv {kv_len}"
        figs = [
            ("time", r["ms"] * 1e3, "us",
             f"{what}; median over {args.reps} timed samples of {r['calls']} calls ({r['how']}), "
             f"/ calls; {r['sets']} rotating sets"),
            ("bw", r["tbs"], "TB/s",
             f"(b*s_k*1152 cache + b*h*1152 queries + b*h*1024 outputs) = {r['bytes']} bytes / time"),
            ("flops", r["tflops"], "TFLOP/s",
             f"b*h*(2*576*s_k + 2*512*s_k) = {r['flops']} FLOP / time"),
            ("rel_l2", r["rel_l2"], "",
             "first two requests against the same formula in float64 (limit 1e-2): "
             + ("ok" if ok else "FAILED")),
        ]
        for suffix, value, unit, formula in figs:
            entry = {"name": f"mla_torch_{name}_{suffix}", "value": value, "unit": unit,
                     "formula": formula}
            results.append(entry)
            print(f"{entry['name']} {value:.6g} {unit} {formula}")
        sys.stdout.flush()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()

    print(json.dumps({"bench": "mla_torch_floor", "device": device_name, "results": results}))
    print(f"\n== mla_torch_floor summary ({device_name}) ==")
    print(f"{'shape':<20} {'sets':>4} {'calls':>5} {'time_us':>10} {'TB/s':>7} {'TFLOP/s':>8} "
          f"{'rel_l2':>9}")
    for r in rows:
        print(f"{r['name']:<20} {r['sets']:>4} {r['calls']:>5} {r['ms'] * 1e3:>10.2f} "
              f"{r['tbs']:>7.3f} {r['tflops']:>8.1f} {r['rel_l2']:>9.2e}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
