#!/usr/bin/env python3
"""h71: three fp8_gate_up calls of one scaling (tensor, row or block) at one
shape, for a profiler (fp8-promote-ncu.sh profiles the third).
    fp8-one-call.py SCALING K U M"""
import sys

import torch

import gatedmlp

scaling, k, u, m = sys.argv[1], *map(int, sys.argv[2:5])
x = torch.randn(m, k, device="cuda")
w = torch.randn(2 * u, k, device="cuda") * 0.02
xg, wg = {"tensor": ("tensor", "tensor"), "row": ("row", "row"), "block": ("block", "block128")}[scaling]
xq, sx = gatedmlp.quantize_fp8(x, xg)
wq, sw = gatedmlp.quantize_fp8(w, wg)
y = torch.empty(m, u, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    gatedmlp.fp8_gate_up(xq, sx, wq, sw, out=y)
torch.cuda.synchronize()
