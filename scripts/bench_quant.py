#!/usr/bin/env python3
"""Quantized gate/up decode against its bars (the quantized-weights issue),
every number from one run on one GPU.

Per shape (K x U) and M, under CUDA-graph replay with the weights rotated
over copies that total more than 3x the L2 (a model's layers each bring
their own weights, so a decode step finds none of them in L2):

  bf16 gatedmlp        gatedmlp.gate_up, 16-bit weights
  int4 / int8 / mxfp4  gatedmlp.quantized_gate_up (affine g64 with bf16
  / fp8                scales and biases; MXFP4 with e8m0 scales; FP8 e4m3
                       with fp32 128 x 128 block scales)
  int4r                int4 g64 with the words repacked (gatedmlp.repack):
                       the same bytes, the scales applied to the sums
  int4t                int4 g64 in the tiled order (gatedmlp.tile): the same
                       bytes in 1 KB tiles of 16 rows x 128 of K
  tinygemm int4        torch._weight_int4pack_mm (g64) on the [2U, K]
                       weights, alone and + silu*mul (what PyTorch / torchao
                       users run)
  F.linear bf16        cuBLAS, the [2U, K] GEMM alone

The roofline: the bytes a call must move (packed words, scales, biases, x,
y) over the best read rate measured in the same run, the larger of a large
torch.sum and bf16 F.linear at M = 1 (bytes of its weights over its time).

    python scripts/bench_quant.py [--shapes 8b,70b,...] [--m 1,4,8,16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

import gatedmlp

SHAPES = {
    "8b": (4096, 14336),
    "70b": (8192, 28672),
    "qwen3-32b": (5120, 25600),
    "1024x2816": (1024, 2816),
    "2048x8192": (2048, 8192),
}


def capture_graph(fn_list):
    """fn_list's calls captured in one CUDA graph, after a warm-up on a side
    stream (plans, workspaces, lazy init outside the capture), replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fn_list:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fn_list:
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_us(g, calls: int) -> float:
    """One replay of graph g, in microseconds per call of its `calls`."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000.0 / calls


def graph_time_us(fn_list, reps: int = 20) -> float:
    """Median per-call time of fn_list (one call per rotated copy) replayed in a CUDA graph."""
    g = capture_graph(fn_list)
    times = sorted(replay_us(g, len(fn_list)) for _ in range(reps))
    return times[len(times) // 2]


def read_rate_sum() -> float:
    """Bytes per second of torch.sum over 2 GiB (a read-only stream)."""
    x = torch.empty(1 << 30, dtype=torch.bfloat16, device="cuda").normal_()
    x.sum()
    torch.cuda.synchronize()
    best = math.inf
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum()
        b.record()
        b.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    del x
    return (1 << 31) / best


def read_rates(dev: str):
    """The roofline's read rate: the larger of a 2 GiB torch.sum and bf16
    F.linear at M = 1 on 8B's gate/up with cold weights, measured now. Prints
    the device and the rates; returns (sum rate, F.linear rate, the larger)."""
    sum_rate = read_rate_sum()
    k, u = SHAPES["8b"]
    ws = [torch.randn(2 * u, k, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    x1 = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    lin_rate = 2 * u * k * 2 / (graph_time_us([lambda w=w: F.linear(x1, w) for w in ws]) * 1e-6)
    del ws
    rate = max(sum_rate, lin_rate)
    print(f"device {dev}; torch {torch.__version__}; read rate: sum {sum_rate / 1e12:.3f} TB/s, "
          f"F.linear M=1 (8B) {lin_rate / 1e12:.3f} TB/s; roofline uses {rate / 1e12:.3f} TB/s", flush=True)
    return sum_rate, lin_rate, rate


def copies_for(nbytes: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(64, math.ceil(3 * l2 / max(nbytes, 1))))


def quant_arrays(rows: int, k: int, mode: str, bits: int, group: int):
    if mode == "fp8_e4m3":  # float8 weights with DeepSeek's 128 x 128 block scales
        w8 = (torch.randn(rows, k, device="cuda") * 0.05).to(torch.float8_e4m3fn)
        scales = torch.rand(-(-rows // 128), -(-k // 128), device="cuda") * 0.01
        return w8.view(torch.int32), scales, None
    words = torch.randint(-2**31, 2**31 - 1, (rows, k * bits // 32), dtype=torch.int32, device="cuda")
    words = words.view(torch.uint32)
    if mode == "mxfp4":
        scales = torch.randint(118, 126, (rows, k // 32), dtype=torch.uint8, device="cuda")
        return words, scales, None
    scales = (torch.rand(rows, k // group, device="cuda") * 0.01).to(torch.bfloat16)
    biases = (torch.rand(rows, k // group, device="cuda") * -0.04).to(torch.bfloat16)
    return words, scales, biases


def bench_shape(name: str, k: int, u: int, ms: list[int], rate: float, formats: list[str],
                baselines: bool = True, group: int = 64) -> list[dict]:
    rows = 2 * u
    bf16_bytes = rows * k * 2
    out = []
    # 16-bit weights and tinygemm's, rotated.
    nb = copies_for(bf16_bytes)
    w16 = [torch.randn(rows, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(nb)]
    fmts = {f: v for f, v in {"int4": ("affine", 4, group, False), "int4r": ("affine", 4, group, True),
                              "int4t": ("affine", 4, group, False), "int8": ("affine", 8, 64, False),
                              "mxfp4": ("mxfp4", 4, 32, False), "fp8": ("fp8_e4m3", 8, 128, False)}.items()
            if f in formats}
    qs = {}
    for f, (mode, bits, group, _) in fmts.items():
        scale_bytes = {"mxfp4": rows * (k // group), "fp8_e4m3": -(-rows // 128) * -(-k // 128) * 4}
        nbytes = rows * k * bits // 8 + scale_bytes.get(mode, rows * (k // group) * 4)
        make = (lambda: gatedmlp.tile(*quant_arrays(rows, k, mode, bits, group), group_size=group)) if f == "int4t" \
            else (lambda: quant_arrays(rows, k, mode, bits, group))
        qs[f] = ([make() for _ in range(copies_for(nbytes))], nbytes)
    tg_bytes = rows * k // 2 + (k // 64) * rows * 4
    tg = []
    for _ in range(copies_for(tg_bytes)):
        wq8 = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, device="cuda")
        packed = torch._convert_weight_to_int4pack(wq8, 8)
        sz = (torch.rand(k // 64, rows, 2, device="cuda") * 0.01).to(torch.bfloat16)
        tg.append((packed, sz))
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, u, device="cuda", dtype=torch.bfloat16)
        h = torch.empty(m, rows, device="cuda", dtype=torch.bfloat16)
        row = {"shape": name, "k": k, "u": u, "m": m}
        io = (m * k + m * u) * 2
        nan = float("nan")
        row["bf16_gatedmlp_us"] = graph_time_us([lambda w=w: gatedmlp.gate_up(x, w, out=y) for w in w16])
        row["flinear_us"] = graph_time_us([lambda w=w: torch.mm(x, w.t(), out=h) for w in w16]) if baselines else nan
        row["tinygemm_us"] = graph_time_us(
            [lambda p=p: torch._weight_int4pack_mm(x, p[0], 64, p[1]) for p in tg]) if baselines else nan

        def tg_glu(p):
            g = torch._weight_int4pack_mm(x, p[0], 64, p[1])
            return F.silu(g[:, :u]) * g[:, u:]

        row["tinygemm_glu_us"] = graph_time_us([lambda p=p: tg_glu(p) for p in tg]) if baselines else nan
        for f, (mode, bits, group, repacked) in fmts.items():
            arrays, nbytes = qs[f]
            # Random words: the same bytes in either order (the tests check the numbers).
            fn = [lambda a=a: gatedmlp.quantized_gate_up(x, a[0], a[1], a[2] if len(a) > 2 else None, out=y,
                                                         mode=mode, bits=bits,
                                                         group_size=group, repacked=repacked, tiled=f == "int4t")
                  for a in arrays]
            t = graph_time_us(fn)
            row[f"{f}_us"] = t
            row[f"{f}_roofline_us"] = (nbytes + io) / rate * 1e6
            row[f"{f}_of_roofline"] = row[f"{f}_roofline_us"] / t
        for f in fmts:
            row[f"{f}_vs_bf16"] = row["bf16_gatedmlp_us"] / row[f"{f}_us"]
        for f in ("int4", "int4r", "int4t"):
            if f in fmts:
                row[f"{f}_vs_tinygemm"] = row["tinygemm_us"] / row[f"{f}_us"]
                row[f"{f}_vs_tinygemm_glu"] = row["tinygemm_glu_us"] / row[f"{f}_us"]
        out.append(row)
        line = (f"{name:10s} M={m:3d}  bf16 {row['bf16_gatedmlp_us']:8.2f}  F.linear {row['flinear_us']:8.2f}  "
                f"tinygemm {row['tinygemm_us']:8.2f} (+glu {row['tinygemm_glu_us']:8.2f})")
        for f in fmts:
            line += (f"  {f} {row[f + '_us']:8.2f} ({100 * row[f + '_of_roofline']:5.1f}% roof, "
                     f"{row[f + '_vs_bf16']:.2f}x bf16)")
        for f in ("int4", "int4r", "int4t"):
            if f in fmts:
                line += f" {f}/tinygemm {row[f + '_vs_tinygemm']:.2f}x"
        print(line, flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--m", default="1,4,8,16")
    ap.add_argument("--json", default=None)
    ap.add_argument("--formats", default="int4,int4t,int4r,int8,mxfp4,fp8")
    ap.add_argument("--no-baselines", action="store_true", help="time gatedmlp only (tuning sweeps)")
    ap.add_argument("--group", type=int, default=64, help="int4 / int4r group size (32, 64, 128)")
    a = ap.parse_args()
    ms = [int(v) for v in a.m.split(",")]
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name(0)
    sum_rate, lin_rate, rate = read_rates(dev)
    rows = []
    for s in a.shapes.split(","):
        k, u = SHAPES[s]
        rows += bench_shape(s, k, u, ms, rate, a.formats.split(","), not a.no_baselines, a.group)
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "sum_rate": sum_rate, "flinear_rate": lin_rate,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
