"""h88: the binding's import of DLPack capsules, timed on any machine (no
GPU: CPU tensors, which make_problem describes without a device).
make_problem imports and describes x, w and y (3 tensors) or a quantized
call's 5; the exports alone are timed beside it, and subtracted.

    PYTHONPATH=<build>/python python3 scripts/experiments/import-cost.py
"""

import statistics
import time

import torch

import gatedmlp as G
from gatedmlp import _gatedmlp as C


def main():
    to = torch.utils.dlpack.to_dlpack
    k = u = 256
    x = torch.randn(1, k, dtype=torch.bfloat16)
    w = torch.randn(2 * u, k, dtype=torch.bfloat16)
    y = torch.empty(1, u, dtype=torch.bfloat16)
    wq = torch.zeros(2 * u, k // 8, dtype=torch.int32)
    s = torch.ones(2 * u, k // 64, dtype=torch.bfloat16)
    q = C.QuantFormat(mode=C.QuantMode.affine, bits=4, group_size=64, row_block=1)
    entries = {
        "3 exports": lambda: (to(x), to(w), to(y)),
        "make_problem, 3 tensors": lambda: C.make_problem(to(x), to(w), to(y)),
        "5 exports": lambda: (to(x), to(wq), to(y), to(s), to(s)),
        "make_problem, 5 tensors (int4)": lambda: C.make_problem(to(x), to(wq), to(y), scales=to(s), biases=to(s),
                                                                 quant=q),
    }
    res = {n: [] for n in entries}
    for f in entries.values():
        f()
    for _ in range(21):
        for n, f in entries.items():
            t0 = time.perf_counter()
            for _ in range(2000):
                f()
            res[n].append((time.perf_counter() - t0) / 2000 * 1e6)
    med = {n: statistics.median(v) for n, v in res.items()}
    print("host us per call, median of 21 x 2000")
    for n in entries:
        print(f"  {n:34s} {med[n]:6.2f}")
    print(f"  import + describe, 3 tensors        {med['make_problem, 3 tensors'] - med['3 exports']:6.2f}")
    print(f"  import + describe, 5 tensors        {med['make_problem, 5 tensors (int4)'] - med['5 exports']:6.2f}")


if __name__ == "__main__":
    main()
