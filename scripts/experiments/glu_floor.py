#!/usr/bin/env python3
# Experiment h47 (docs/notes, the unfused baseline's GLU kernel): torch's bandwidth floor for the GLU's bytes, run by exp-glu.sh.
"""What the unfused path's elementwise half could run at: torch kernels that
move the same bytes as the GLU kernel, timed alone on the GPU.

For each [M, 2U] bf16 intermediate a (the unfused GEMM's output) it times
  mul     torch.mul(a[:, :U], a[:, U:], out=y)   reads 2U, writes U per row:
          the GLU kernel's traffic without its activation
  silu*u  F.silu(a[:, :U]) * a[:, U:]            what plain PyTorch runs (two kernels)
  mul2    torch.mul(g, u, out=y)                 the same bytes from two separate tensors
  copy    b.copy_(a)                             reads and writes 2U per row
  read    a.sum()                                reads 2U per row
  write   b.fill_(1)                             writes 2U per row
and prints each one's time and bytes moved per second (the intermediates are
far larger than the L2, so no rotation is needed).

  python3 scripts/experiments/glu_floor.py [--shapes 4096x14336,4096x28672]   (M x U)
"""
import argparse

import torch
import torch.nn.functional as F


def median_ms(fn, reps=30):
    for _ in range(3):
        fn()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    ev[0].record()
    for i in range(reps):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    t = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(reps))
    return t[reps // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="4096x14336,16384x14336,4096x28672,4096x53248")
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'M':>6} {'U':>6} | {'op':<7} {'ms':>8} {'TB/s':>6}")
    for s in args.shapes.split(","):
        m, u = (int(v) for v in s.lower().split("x"))
        a = torch.randn(m, 2 * u, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, u, device="cuda", dtype=torch.bfloat16)
        b = torch.empty_like(a)
        g, up = a[:, :u].contiguous(), a[:, u:].contiguous()
        n = a.numel() * a.element_size()
        ops = [
            ("mul", lambda: torch.mul(a[:, :u], a[:, u:], out=y), n + n // 2),
            ("mul2", lambda: torch.mul(g, up, out=y), n + n // 2),
            # silu reads g and writes it, the product reads both and writes y.
            ("silu*u", lambda: F.silu(a[:, :u]) * a[:, u:], n // 2 * 2 + n + n // 2),
            ("copy", lambda: b.copy_(a), 2 * n),
            ("read", lambda: a.sum(), n),
            ("write", lambda: b.fill_(1), n),
        ]
        for name, fn, nbytes in ops:
            ms = median_ms(fn)
            print(f"{m:>6} {u:>6} | {name:<7} {ms:8.4f} {nbytes / ms / 1e9:6.2f}")
        del a, y, b, g, up
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
