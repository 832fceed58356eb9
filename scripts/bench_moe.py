#!/usr/bin/env python3
"""Gathered (Mixture-of-Experts) gate/up + GLU in decode against its bar (the
MoE issue: >= 80 % of the read rate on the bytes of the distinct experts a
step touches), every number from one run on one GPU.

Per model (E experts, top k, K x U per expert), weight format (bf16; int4
affine g64 with bf16 scales and biases) and T tokens, under CUDA-graph
replay of 16 steps that each route the T tokens afresh (k distinct experts
per token, uniformly, as a top-k router picks) over two copies of all the
experts' weights, so that a step finds few of its experts in L2:

  gatedmlp            gatedmlp.gather_gate_up / quantized_gather_gate_up,
                      x [T, K], topk_ids [T, k] -> [T, k, U]
  grouped_mm + GLU    (bf16) what a PyTorch user runs: the rows sorted by
                      expert, torch._grouped_mm on [E, K, 2U], silu * mul

The bytes: the distinct experts' weights (and scales, biases) of each step,
averaged over the 16 routings, plus x and y; the read rate: the larger of a
2 GiB torch.sum and bf16 F.linear at M = 1, measured in the same run.

    python scripts/bench_moe.py [--models gpt-oss-20b,qwen3-30b-a3b,mixtral] [--t 1,4,16,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_quant import graph_time_us, read_rates  # noqa: E402

import gatedmlp  # noqa: E402

# E, top k, K (hidden), U (the expert's intermediate size).
MODELS = {
    "gpt-oss-20b": (32, 4, 2880, 2880),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "mixtral": (8, 2, 4096, 14336),
}
STEPS = 16  # routings per graph


def expert_bytes(fmt: str, k: int, u: int) -> int:
    rows = 2 * u
    if fmt == "bf16":
        return rows * k * 2
    return rows * k // 2 + 2 * rows * (k // 64) * 2  # int4 words + bf16 scales and biases


def make_weights(fmt: str, e: int, k: int, u: int):
    rows = 2 * u
    if fmt == "bf16":
        return (torch.randn(e, rows, k, device="cuda", dtype=torch.bfloat16) * 0.02,)
    words = torch.randint(-2**31, 2**31 - 1, (e, rows, k // 8), dtype=torch.int32, device="cuda")
    scales = (torch.rand(e, rows, k // 64, device="cuda") * 0.01).to(torch.bfloat16)
    biases = (torch.rand(e, rows, k // 64, device="cuda") * -0.04).to(torch.bfloat16)
    return words, scales, biases


def routing(t: int, e: int, topk: int) -> torch.Tensor:
    return torch.rand(t, e, device="cuda").topk(topk, dim=-1).indices.to(torch.int32)


def grouped_mm_glu(x, ids, w_t, e: int, u: int):
    """bf16 MoE gate/up as a PyTorch user writes it with _grouped_mm."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    rows = x.index_select(0, order // ids.shape[1])
    counts = torch.zeros(e, dtype=torch.int32, device=x.device).index_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    h = torch._grouped_mm(rows, w_t, offs=offs)
    return F.silu(h[:, :u]) * h[:, u:]


def bench_model(name: str, ts: list[int], fmts: list[str], rate: float) -> list[dict]:
    e, topk, k, u = MODELS[name]
    out = []
    for fmt in fmts:
        per_expert = expert_bytes(fmt, k, u)
        copies = 2 if 2 * e * per_expert < 40e9 else 1
        ws = [make_weights(fmt, e, k, u) for _ in range(copies)]
        for t in ts:
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            y = torch.empty(t, topk, u, device="cuda", dtype=torch.bfloat16)
            ids = [routing(t, e, topk) for _ in range(STEPS)]
            distinct = sum(int(torch.unique(i).numel()) for i in ids) / STEPS
            nbytes = distinct * per_expert + x.numel() * 2 + y.numel() * 2

            def call(i, w):
                if fmt == "bf16":
                    return gatedmlp.gather_gate_up(x, i, w[0], out=y, check_indices=False)
                return gatedmlp.quantized_gather_gate_up(x, i, w[0], w[1], w[2], out=y, mode="affine", bits=4,
                                                         group_size=64, check_indices=False)

            us = graph_time_us([lambda i=i, w=ws[n % copies]: call(i, w) for n, i in enumerate(ids)])
            row = {"model": name, "format": fmt, "T": t, "topk": topk, "experts": e, "K": k, "U": u,
                   "distinct": distinct, "bytes": nbytes, "gatedmlp_us": us,
                   "tbps": nbytes / (us * 1e-6) / 1e12, "roofline_pct": 100 * nbytes / (us * 1e-6) / rate}
            if fmt == "bf16":
                try:
                    wts = [w[0].transpose(1, 2) for w in ws]
                    gus = graph_time_us([lambda i=i, w=wts[n % copies]: grouped_mm_glu(x, i, w, e, u)
                                         for n, i in enumerate(ids)])
                    row["grouped_mm_glu_us"] = gus
                    row["speedup_vs_grouped_mm"] = gus / us
                except Exception as ex:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
                    row["grouped_mm_error"] = f"{type(ex).__name__}: {ex}"[:120]
            out.append(row)
            g = row.get("grouped_mm_glu_us")
            print(f"{name:14s} {fmt:5s} T={t:3d}  experts {distinct:6.1f}/{e:3d}  {nbytes / 1e6:8.1f} MB  "
                  f"gatedmlp {us:8.2f} us  {row['tbps']:5.2f} TB/s  {row['roofline_pct']:5.1f} % of read rate"
                  + (f"  grouped_mm+glu {g:8.2f} us ({g / us:4.2f}x)" if g else
                     ("  grouped_mm: " + row["grouped_mm_error"] if "grouped_mm_error" in row else "")),
                  flush=True)
        del ws
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--t", default="1,4,16,64")
    ap.add_argument("--formats", default="bf16,int4")
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.cuda.get_device_name(0)
    _, _, rate = read_rates(dev)
    rows = []
    for m in a.models.split(","):
        rows += bench_model(m, [int(v) for v in a.t.split(",")], a.formats.split(","), rate)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "read_rate": rate, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
