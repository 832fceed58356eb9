#!/usr/bin/env python3
"""The whole gated MLP at decode sizes: gatedmlp against PyTorch, bf16 and int4.

Every number comes from one run on one GPU.

Per model shape (hidden H, intermediate I) and M, under CUDA-graph replay
with the weights rotated over copies that total more than 3x the L2 (a
model's layers each bring their own weights; bench_quant.py's harness):

  gatedmlp bf16       gatedmlp.mlp: gate_up (fused GLU) then down
  gatedmlp int4       gatedmlp.quantized_mlp on gatedmlp.quantize's int4
                      affine g64 arrays of bf16 weights (bf16 scales, biases)
  gatedmlp int4t      the same arrays in gatedmlp.tile's order (gate/up
                      tiled, down tiled with down=True), tiled=True; bytes
                      counted as int4's
  torch bf16          F.linear [2I, H] + silu * mul + F.linear [H, I]
  tinygemm int4       torch._weight_int4pack_mm (g64) + silu * mul +
                      torch._weight_int4pack_mm

Each row gives its time, the PyTorch bf16 chain's time over it, and its
share of the roofline: the bytes the MLP must move (all three matrices'
packed weights, scales and biases, x, h and y) over the best read rate
measured in the same run, the larger of a large torch.sum and bf16 F.linear
at M = 1 (bench_quant.py's).

    PYTHONPATH=build/python python3 scripts/bench_mlp.py [--shapes 8b,70b,...] [--m 1,4,16,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

import gatedmlp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import SHAPES, copies_for, graph_time_us, read_rates  # noqa: E402

GROUP = 64  # int4 affine groups, gatedmlp's and tinygemm's

IMPLS = ("gatedmlp_bf16", "gatedmlp_int4", "gatedmlp_int4t", "torch_bf16", "tinygemm_int4")


def rotated(make, nbytes: int) -> list:
    """make() once, then device copies of it: enough that the set is more
    than 3x the L2, so no call finds its weights there. Copies of one set
    serve as well as fresh ones (the cache holds addresses, not values) and
    quantize once per shape on the host."""
    first = make()
    return [first] + [tuple(None if t is None else t.clone() for t in first)
                      for _ in range(copies_for(nbytes) - 1)]


def int4_arrays(w: torch.Tensor):
    """gatedmlp.quantize's int4 g64 arrays of bf16 weights, on the GPU (the
    words as int32: DLPack's view of them)."""
    wq, s, b = gatedmlp.quantize(w, group_size=GROUP, bits=4)
    return wq.view(torch.int32).cuda(), s.cuda(), b.cuda()


def tinygemm_arrays(rows: int, k: int):
    """torch._weight_int4pack_mm's packed weights and scales / zeros (g64),
    random: its time does not depend on the values."""
    wq8 = torch.randint(0, 256, (rows, k // 2), dtype=torch.uint8, device="cuda")
    packed = torch._convert_weight_to_int4pack(wq8, 8)
    sz = (torch.rand(k // GROUP, rows, 2, device="cuda") * 0.01).to(torch.bfloat16)
    return packed, sz


def bench_shape(name: str, hidden: int, inter: int, ms: list[int], rate: float, impls: list[str]) -> list[dict]:
    H = hidden
    weights = 3 * H * inter  # gate, up and down
    bf16_bytes = weights * 2
    int4_bytes = weights // 2 + 2 * (weights // GROUP) * 2  # words, bf16 scales and biases
    sets = {}
    if "gatedmlp_bf16" in impls or "torch_bf16" in impls:
        sets["bf16"] = rotated(lambda: ((torch.randn(2 * inter, H, device="cuda") * 0.02).to(torch.bfloat16),
                                        (torch.randn(H, inter, device="cuda") * 0.02).to(torch.bfloat16)), bf16_bytes)
    if "gatedmlp_int4" in impls:
        def make_int4():
            gu = int4_arrays((torch.randn(2 * inter, H) * 0.02).to(torch.bfloat16))
            d = int4_arrays((torch.randn(H, inter) * 0.02).to(torch.bfloat16))
            return (*gu, *d)
        sets["int4"] = rotated(make_int4, int4_bytes)
    if "gatedmlp_int4t" in impls:
        def make_int4t():
            gq, gs, gb = int4_arrays((torch.randn(2 * inter, H) * 0.02).to(torch.bfloat16))
            dq, ds, db = int4_arrays((torch.randn(H, inter) * 0.02).to(torch.bfloat16))
            return (*gatedmlp.tile(gq, gs, gb, group_size=GROUP), *gatedmlp.tile(dq, ds, db, group_size=GROUP,
                                                                                 down=True))
        sets["int4t"] = rotated(make_int4t, int4_bytes)
    if "tinygemm_int4" in impls:
        sets["tinygemm"] = rotated(lambda: (*tinygemm_arrays(2 * inter, H), *tinygemm_arrays(H, inter)), int4_bytes)

    calls = {
        "gatedmlp_bf16": ("bf16", bf16_bytes, lambda x, y, a: gatedmlp.mlp(x, a[0], a[1], out=y)),
        "gatedmlp_int4": ("int4", int4_bytes, lambda x, y, a: gatedmlp.quantized_mlp(
            x, a[0], a[1], a[2], wq_down=a[3], scales_down=a[4], biases_down=a[5], out=y, group_size=GROUP,
            bits=4)),
        "gatedmlp_int4t": ("int4t", int4_bytes, lambda x, y, a: gatedmlp.quantized_mlp(
            x, a[0], a[1], wq_down=a[2], scales_down=a[3], out=y, group_size=GROUP, bits=4, tiled=True)),
        "torch_bf16": ("bf16", bf16_bytes, lambda x, y, a: torch_chain(x, a[0], a[1], inter)),
        "tinygemm_int4": ("tinygemm", int4_bytes, lambda x, y, a: tinygemm_chain(x, a, inter)),
    }
    rows = []
    for m in ms:
        x = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(m, H, device="cuda", dtype=torch.bfloat16)
        io = (m * H + m * inter + m * H) * 2  # x, h, y
        times = {}
        for impl in IMPLS:
            if impl not in impls:
                continue
            kind, nbytes, fn = calls[impl]
            t = graph_time_us([lambda a=a, fn=fn: fn(x, y, a) for a in sets[kind]])
            roof = (nbytes + io) / rate * 1e6
            times[impl] = t
            rows.append({"shape": name, "hidden": H, "intermediate": inter, "m": m, "impl": impl, "us": t,
                         "roofline_us": roof, "of_roofline": roof / t})
        base = times.get("torch_bf16")
        for r in rows[-len(times):]:
            r["vs_torch_bf16"] = base / r["us"] if base else float("nan")
            if r["impl"] in ("gatedmlp_int4", "gatedmlp_int4t") and "tinygemm_int4" in times:
                r["vs_tinygemm_int4"] = times["tinygemm_int4"] / r["us"]
        for r in rows[-len(times):]:
            extra = f"  {r['vs_tinygemm_int4']:5.2f}x tinygemm" if "vs_tinygemm_int4" in r else ""
            print(f"{name:10s} M={m:3d}  {r['impl']:14s} {r['us']:9.2f} us  {r['vs_torch_bf16']:5.2f}x torch bf16  "
                  f"{100 * r['of_roofline']:5.1f}% roofline{extra}", flush=True)
    return rows


def torch_chain(x, w_gu, w_d, inter):
    g = F.linear(x, w_gu)
    return F.linear(F.silu(g[:, :inter]) * g[:, inter:], w_d)


def tinygemm_chain(x, a, inter):
    g = torch._weight_int4pack_mm(x, a[0], GROUP, a[1])
    h = F.silu(g[:, :inter]) * g[:, inter:]
    return torch._weight_int4pack_mm(h, a[2], GROUP, a[3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    ap.add_argument("--m", default="1,4,16,64")
    ap.add_argument("--impls", default=",".join(IMPLS), help="rows to time")
    ap.add_argument("--json", default=None, help="write the rows and the read rates here")
    a = ap.parse_args()
    ms = [int(v) for v in a.m.split(",")]
    impls = a.impls.split(",")
    for s in a.shapes.split(","):
        if s not in SHAPES:
            ap.error(f"unknown shape {s!r}: one of {', '.join(SHAPES)}")
    for i in impls:
        if i not in IMPLS:
            ap.error(f"unknown impl {i!r}: one of {', '.join(IMPLS)}")
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name(0)
    sum_rate, lin_rate, rate = read_rates(dev)
    rows = []
    for s in a.shapes.split(","):
        hidden, inter = SHAPES[s]
        rows += bench_shape(s, hidden, inter, ms, rate, impls)
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "sum_rate": sum_rate, "flinear_rate": lin_rate,
                       "rate": rate, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
