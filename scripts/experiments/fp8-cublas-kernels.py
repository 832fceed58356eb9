#!/usr/bin/env python3
"""Which kernels cuBLASLt runs for torch._scaled_mm (FP8 e4m3, bf16 out) per
tensor, row-wise and with DeepSeek-style block scales (1 x 128 for A,
128 x 128 for B), on the gate/up GEMM of a model at M rows: run under ncu
(fp8-cublas-kernels.sh) it names them, their grids, threads, registers and
shared memory (experiment h92, docs/notes/fp8.md). Also prints each form's
time in CUDA-graph replay, so that the block/tensor ratio of cuBLASLt
itself stands beside gatedmlp's.

usage: fp8-cublas-kernels.py [--model 8b] [--m 4096] [--reps 20]
"""
import argparse

import torch

SHAPES = {"8b": (4096, 14336), "70b": (8192, 28672), "qwen3-32b": (5120, 25600)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="8b", choices=SHAPES)
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    k, u = SHAPES[a.model]
    n, m = 2 * u, a.m
    dev = "cuda"
    f8 = torch.float8_e4m3fn
    xq = (torch.randn(m, k, device=dev) * 0.5).to(f8)
    wq = (torch.randn(n, k, device=dev) * 0.5).to(f8)
    wt = wq.t()
    one = torch.ones((), device=dev)
    forms = {
        "tensor": lambda: torch._scaled_mm(xq, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
        "row": lambda: torch._scaled_mm(xq, wt, scale_a=torch.ones(m, 1, device=dev),
                                        scale_b=torch.ones(1, n, device=dev), out_dtype=torch.bfloat16),
    }
    # Block scales: A [M, K/128] column-major, B [K/128, N/128] with strides (1, K/128 rounded up to 4).
    kb, nb = (k + 127) // 128, (n + 127) // 128
    sa = torch.ones(kb, m, device=dev).t()
    pad = torch.ones(nb, (kb + 3) // 4 * 4, device=dev)
    sb = pad[:, :kb].t()
    forms["block"] = lambda: torch._scaled_mm(xq, wt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    flops = 2.0 * m * k * n
    times = {}
    for name, f in forms.items():
        try:
            f()
            torch.cuda.synchronize()
        except Exception as e:  # a torch without this form
            print(f"{name}: not available ({type(e).__name__}: {str(e)[:120]})")
            continue
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(3):
                f()
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                for _ in range(a.reps):
                    f()
        g.replay()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            torch.cuda.synchronize()
            best = min(best, e0.elapsed_time(e1) * 1e3 / a.reps)
        times[name] = best
        print(f"{name:7s} {a.model} M={m}: {best:9.1f} us  {flops / best / 1e6:7.0f} TFLOP/s")
    if "block" in times and "tensor" in times:
        print(f"cuBLASLt block / tensor (time ratio tensor/block): {times['tensor'] / times['block']:.3f}")


if __name__ == "__main__":
    main()
