#!/usr/bin/env python3
"""Served docs/notes/quantized-decode.md (h66, h79): one quantized gate/up
call per M (int4 g64, 8B's shape, cold weights) for ncu to profile, on the
checkpoint's words and then on the repacked ones (repacked_kernel; the
same random words read in the other order):
    ncu --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
        -k regex:"quant_decode_kernel|repacked_kernel" python3 scripts/experiments/quant-decode-ncu.py [M ...]"""
import sys

import torch

import gatedmlp

k, u = 4096, 14336
ms = [int(v) for v in sys.argv[1:]] or [1, 16]
words = torch.randint(-2**31, 2**31 - 1, (2 * u, k // 8), dtype=torch.int32, device="cuda")
scales = (torch.rand(2 * u, k // 64, device="cuda") * 0.01).to(torch.bfloat16)
biases = (torch.rand(2 * u, k // 64, device="cuda") * -0.04).to(torch.bfloat16)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for repacked in (False, True):
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        flush.zero_()  # the weights out of L2
        gatedmlp.quantized_gate_up(x, words, scales, biases, repacked=repacked)
torch.cuda.synchronize()
