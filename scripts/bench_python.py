#!/usr/bin/env python3
"""Gate/up GEMM + SwiGLU through the Python binding against PyTorch, in one run.

For each problem (x [M, K], fused weights [2U, K], bf16) it times, with CUDA
events after a warm-up, the median of many runs, rotating x over more than
the L2 cache:

    torch.mm          x @ W^T into [M, 2U] (cuBLAS, the GEMM alone)
    mm + eager        the GEMM, then silu(g) * u as PyTorch ops
    mm + compiled     the GEMM, then silu(g) * u compiled by torch.compile
    gatedmlp          gatedmlp.gate_up (the framework-neutral binding)
    gatedmlp op       torch.ops.gatedmlp.gate_up (gatedmlp.torch)

and prints one table, with each gatedmlp time as a ratio to the GEMM alone
and to the best unfused path measured in the same run. Each output is
checked against a float64 reference first (the tolerance rule of the tests).

    python scripts/bench_python.py                      # Llama-3 8B and 70B shapes
    python scripts/bench_python.py --shapes 4096x14336 --m 1024 4096 --iters 50
"""

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

import gatedmlp
import gatedmlp.torch as gt

PROBLEMS = [  # name, K (hidden), U (intermediate)
    ("llama3-8b", 4096, 14336),
    ("llama3-70b", 8192, 28672),
]


def time_ms(fn, inputs, iters, warmup):
    """Median time of fn(inputs[i % len]) in ms, CUDA events around each call."""
    for i in range(warmup):
        fn(inputs[i % len(inputs)])
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(inputs[i % len(inputs)])
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def check(name, y, x, w, u):
    """The tolerance rule on one output: fused error <= 2x unfused + atol."""
    x64, w64 = x.double(), w.double()
    g64, u64 = x64 @ w64[:u].T, x64 @ w64[u:].T
    ref = F.silu(g64) * u64
    gu = x @ w.T
    unfused = F.silu(gu[:, :u]) * gu[:, u:]
    err = lambda t: ((t.double() - ref).norm() / ref.norm()).item()  # noqa: E731
    e_f, e_u = err(y), err(unfused)
    ok = bool(torch.isfinite(y).all()) and e_f <= 2 * e_u + 1e-6
    if not ok:
        print(f"FAIL {name}: rel err {e_f:.3e} vs unfused {e_u:.3e}", file=sys.stderr)
    return ok, e_f, e_u


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="*", help="KxU pairs, e.g. 4096x14336 (default: Llama-3 8B and 70B)")
    ap.add_argument("--m", nargs="*", type=int, default=[1024, 4096])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--l2-mb", type=float, default=128.0, help="bytes of x to rotate over, in MB (> L2)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_python: no CUDA device")

    problems = PROBLEMS
    if args.shapes:
        problems = [(s, *map(int, s.lower().split("x"))) for s in args.shapes]
    dev = torch.device("cuda")
    print(f"# {torch.cuda.get_device_name(dev)}, torch {torch.__version__}, gatedmlp {gatedmlp.__version__}")

    def silu_mul(gu):
        u = gu.shape[-1] // 2
        return F.silu(gu[:, :u]) * gu[:, u:]

    silu_mul_compiled = torch.compile(silu_mul)

    header = ["problem", "M", "K", "U", "mm ms", "mm TF/s", "+eager ms", "+compiled ms", "gatedmlp ms",
              "gatedmlp TF/s", "op ms", "vs mm", "vs best unfused", "rel err (unfused)"]
    rows = []
    all_ok = True
    for name, k, u in problems:
        w = (torch.randn(2 * u, k, device=dev) / k**0.5).to(torch.bfloat16)
        wt = w.T
        p_check = gatedmlp.Problem(m=args.m[0], k=k, u=u)
        print(f"# {name}: {gatedmlp.plan(p_check)}", flush=True)
        for m in args.m:
            n_x = max(2, int(args.l2_mb * 2**20 // (m * k * 2)) + 1)
            xs = [torch.randn(m, k, device=dev).to(torch.bfloat16) for _ in range(n_x)]
            y = torch.empty(m, u, device=dev, dtype=torch.bfloat16)
            gu = torch.empty(m, 2 * u, device=dev, dtype=torch.bfloat16)

            with torch.inference_mode():
                ok, e_f, e_u = check(f"{name} M={m}", gatedmlp.gate_up(xs[0], w), xs[0], w, u)
                ok2, _, _ = check(f"{name} M={m} op", gt.gate_up(xs[0], w), xs[0], w, u)
                all_ok &= ok and ok2

                t_mm = time_ms(lambda x: torch.mm(x, wt, out=gu), xs, args.iters, args.warmup)
                t_eager = time_ms(lambda x: silu_mul(torch.mm(x, wt)), xs, args.iters, args.warmup)
                t_comp = time_ms(lambda x: silu_mul_compiled(torch.mm(x, wt)), xs, args.iters, args.warmup)
                t_fused = time_ms(lambda x: gatedmlp.gate_up(x, w, out=y), xs, args.iters, args.warmup)
                t_op = time_ms(lambda x: gt.gate_up(x, w, out=y), xs, args.iters, args.warmup)

            flops = 2.0 * m * k * 2 * u
            best_unfused = min(t_eager, t_comp)
            rows.append([name, m, k, u, f"{t_mm:.3f}", f"{flops / t_mm / 1e9:.0f}", f"{t_eager:.3f}",
                         f"{t_comp:.3f}", f"{t_fused:.3f}", f"{flops / t_fused / 1e9:.0f}", f"{t_op:.3f}",
                         f"{t_fused / t_mm:.2f}x", f"{t_fused / best_unfused:.2f}x", f"{e_f:.2e} ({e_u:.2e})"])
            print("# done", name, m, flush=True)
        torch.cuda.empty_cache()

    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(v).rjust(wd) for v, wd in zip(r, widths)) + " |"  # noqa: E731
    print(line(header))
    print("|" + "|".join("-" * (wd + 2) for wd in widths) + "|")
    for r in rows:
        print(line(r))
    print("ratios < 1.00x are faster than the reference; times are medians of", args.iters, "runs")
    if not all_ok:
        sys.exit("bench_python: an output failed its accuracy check")


if __name__ == "__main__":
    main()
