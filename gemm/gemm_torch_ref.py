#!/usr/bin/env python3
"""torch's GEMM throughput on the shapes of bench_gemm, timed the same way, as the yardstick
for gemm/gemm.h (target: block-scaled FP8 >= 0.9x torch's per-tensor FP8 in the same run).

Variants, all y[M, N] = x[M, K] . W[N, K]^T with bf16 output:
  torch_bf16                 torch.matmul(x, W.t())
  torch_fp8_tensor           torch._scaled_mm, one fp32 scale per tensor (use_fast_accum=False)
  torch_fp8_tensor_fastacc   the same with use_fast_accum=True
  torch_fp8_block            torch._scaled_mm with 1x128 activation and 128x128 weight scales
                             (cuBLASLt's block-scaled mode, the one ina uses), where torch
                             accepts the shape
Timing as bench_gemm: one eager call estimates the time; a CUDA graph holds enough calls for
about 2 ms (1 to 64); median over 7 replays of replay time / calls, after 2 warm-up replays.
Weights and activations rotate over sets whose fp8 weights total at least 4x the L2.

Output: `name value unit formula` lines, as bench_gemm prints. With the path of a file
holding bench_gemm's output as argument, also a table of ina's FP8 TFLOP/s over torch's.

Usage: python3 gemm/gemm_torch_ref.py [bench_gemm_output.txt]
"""
import math
import re
import statistics
import sys

import torch

MS = [1, 8, 64, 128, 256, 512, 1024, 2048, 4096]
SHAPES = [(7168, 2048), (4096, 7168), (2048, 7168), (24576, 1536), (7168, 16384)]
MAX_M = max(MS)
TIMED_REPLAYS = 7
WARMUP_REPLAYS = 2
TARGET_GRAPH_MS = 2.0
MAX_CALLS = 64
MAX_SETS = 16
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def result(name, value, unit, formula):
    print(f"{name} {value:.6g} {unit} {formula}", flush=True)


def time_op(op, sets):
    """Median ms per call of op(set) from CUDA-graph replays; also the calls per graph."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch advises
        for i in range(3):
            op(i % sets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    start.record()
    op(0)
    stop.record()
    stop.synchronize()
    estimate = start.elapsed_time(stop)
    calls = max(1, min(MAX_CALLS, int(TARGET_GRAPH_MS / estimate) if estimate > 0 else MAX_CALLS))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            op(i % sets)
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    samples = []
    for _ in range(TIMED_REPLAYS):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) / calls)
    del graph
    return statistics.median(samples), calls


def quantize_tensor(t):
    scale = t.abs().amax().float().clamp(min=1e-12) / FP8_MAX
    return (t.float() / scale).to(FP8), scale.reshape(())


def quantize_rows_1x128(x):
    """[M, K] -> fp8 and [M, K/128] scales, outer-dim-major as _scaled_mm wants."""
    m, k = x.shape
    blocks = x.float().reshape(m, k // 128, 128)
    scale = blocks.abs().amax(dim=2).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale.unsqueeze(2)).to(FP8).reshape(m, k)
    return q, scale.t().contiguous().t()


def quantize_blocks_128x128(w):
    """[N, K] -> fp8 and [N/128, K/128] scales."""
    n, k = w.shape
    blocks = w.float().reshape(n // 128, 128, k // 128, 128)
    scale = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    q = (blocks / scale[:, None, :, None]).to(FP8).reshape(n, k)
    return q, scale


def bench_shape(n, k, l2_bytes, tflops):
    sets = max(2, min(MAX_SETS, math.ceil(4 * l2_bytes / (n * k))))
    gen = torch.Generator(device="cuda").manual_seed(n * 31 + k)
    w16 = [(torch.rand(n, k, device="cuda", generator=gen) - 0.5).mul_(0.1).to(torch.bfloat16)
           for _ in range(sets)]
    x16 = [(torch.rand(MAX_M, k, device="cuda", generator=gen) - 0.5).mul_(4.0).to(torch.bfloat16)
           for _ in range(sets)]
    w8t = [quantize_tensor(w) for w in w16]
    w8b = [quantize_blocks_128x128(w) for w in w16]
    for m in MS:
        x8t = [quantize_tensor(x[:m]) for x in x16]
        x8b = [quantize_rows_1x128(x[:m].contiguous()) for x in x16]
        variants = {
            "bf16": lambda s: torch.matmul(x16[s][:m], w16[s].t()),
            "fp8_tensor": lambda s: torch._scaled_mm(
                x8t[s][0], w8t[s][0].t(), scale_a=x8t[s][1], scale_b=w8t[s][1],
                out_dtype=torch.bfloat16, use_fast_accum=False),
            "fp8_tensor_fastacc": lambda s: torch._scaled_mm(
                x8t[s][0], w8t[s][0].t(), scale_a=x8t[s][1], scale_b=w8t[s][1],
                out_dtype=torch.bfloat16, use_fast_accum=True),
            "fp8_block": lambda s: torch._scaled_mm(
                x8b[s][0], w8b[s][0].t(), scale_a=x8b[s][1], scale_b=w8b[s][1].t(),
                out_dtype=torch.bfloat16),
        }
        for name, op in variants.items():
            label = f"torch_{name}_m{m}_n{n}_k{k}"
            try:
                ms, calls = time_op(op, sets)
            except (RuntimeError, ValueError) as e:  # a shape or mode torch does not take
                print(f"{label} skipped: {str(e).splitlines()[0][:160]}", flush=True)
                torch.cuda.synchronize()
                continue
            value = 2.0 * m * n * k / (ms * 1e-3) * 1e-12
            tflops[(name, m, n, k)] = value
            result(label + "_time", ms * 1e3, "us",
                   f"median over {TIMED_REPLAYS} CUDA-graph replays of replay time / {calls} "
                   f"calls, {sets} rotating sets")
            result(label + "_tflops", value, "TFLOP/s", "2*M*N*K / time")


def read_bench_gemm(path):
    """TFLOP/s of bench_gemm's lines `gemm_<variant>_m<M>_n<N>_k<K>_tflops <value> ...`."""
    found = {}
    pattern = re.compile(r"^gemm_(\w+?)_m(\d+)_n(\d+)_k(\d+)_tflops ([0-9.eE+-]+) ")
    with open(path) as f:
        for line in f:
            match = pattern.match(line)
            if match:
                v, m, n, k, value = match.groups()
                found[(v, int(m), int(n), int(k))] = float(value)
    return found


def main():
    if not torch.cuda.is_available():
        print("gemm_torch_ref: no CUDA device, skipped")
        return 77
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 << 20)
    print(f"device {props.name}, torch {torch.__version__}, L2 {l2_bytes >> 20} MiB", flush=True)
    tflops = {}
    for n, k in SHAPES:
        bench_shape(n, k, l2_bytes, tflops)
        torch.cuda.empty_cache()

    ina = read_bench_gemm(sys.argv[1]) if len(sys.argv) > 1 else {}
    print(f"\n{'M':>6} {'N x K':>13} {'torch bf16':>11} {'fp8 tensor':>11} {'fastacc':>9} "
          f"{'fp8 block':>10}" + (f" {'ina fp8':>9} {'ina/tensor':>11}" if ina else "") +
          "   (TFLOP/s)")
    for n, k in SHAPES:
        for m in MS:
            row = [tflops.get((v, m, n, k), 0.0)
                   for v in ("bf16", "fp8_tensor", "fp8_tensor_fastacc", "fp8_block")]
            line = f"{m:>6} {f'{n}x{k}':>13} {row[0]:>11.1f} {row[1]:>11.1f} {row[2]:>9.1f} {row[3]:>10.1f}"
            if ina:
                mine = ina.get(("fp8", m, n, k), 0.0)
                ratio = mine / row[1] if row[1] > 0 else 0.0
                line += f" {mine:>9.1f} {ratio:>11.2f}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
