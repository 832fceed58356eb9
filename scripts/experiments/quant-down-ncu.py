#!/usr/bin/env python3
"""For docs/notes/down-projection.md (h67, the open question): one quantized
down projection per M (int4 g64, 8B's [4096, 14336], cold weights) for ncu
to profile, alone and next to the gate/up call of the same MLP:
    ncu --section WarpStateStats --section SchedulerStats --section SpeedOfLight --section Occupancy \
        -k regex:quant_decode_kernel python3 scripts/experiments/quant-down-ncu.py [M ...]
The first kernel of each M is gate/up (2 x 14336 rows of K = 4096), the
second the down projection (4096 rows of K = 14336)."""
import sys

import torch

import gatedmlp

hidden, inter = 4096, 14336
ms = [int(v) for v in sys.argv[1:]] or [1, 16]


def arrays(rows, k):
    words = torch.randint(-2**31, 2**31 - 1, (rows, k // 8), dtype=torch.int32, device="cuda")
    scales = (torch.rand(rows, k // 64, device="cuda") * 0.01).to(torch.bfloat16)
    biases = (torch.rand(rows, k // 64, device="cuda") * -0.04).to(torch.bfloat16)
    return words, scales, biases


gate_up, down = arrays(2 * inter, hidden), arrays(hidden, inter)
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for m in ms:
    x = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
    flush.zero_()  # the weights out of L2
    h = gatedmlp.quantized_gate_up(x, *gate_up)
    flush.zero_()
    gatedmlp.quantized_down(h, *down)
torch.cuda.synchronize()
