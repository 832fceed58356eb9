"""Host µs of the binding's own part of a call (h74; the extension, no Python
wrapper): _C.gate_up on a cached problem, bf16 (the decode kernel at M = 1)
against FP8 (the Hopper kernel), with the DLPack exports it needs, and the
exports alone. Tells how much of an entry point's host time is the C++
side (import, describe, run()'s cached plan, the launch) and how much the
Python wrapper. Then the parts of an entry point one by one (h86): an
allocation (sizes as a tuple and as arguments), make_problem, the entry
points themselves, and a no-op operator with gate_up's schema (what the
dispatcher's trip into a Python kernel costs by itself).

    PYTHONPATH=build-gpu/python python3 scripts/experiments/binding-cost.py
"""

import statistics
import time

import torch

import gatedmlp as G
from gatedmlp import _gatedmlp as C


def main():
    dev = torch.device("cuda")
    k = u = 256
    to = torch.utils.dlpack.to_dlpack
    stream = torch.cuda.current_stream().cuda_stream
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(2 * u, k, device=dev, dtype=torch.bfloat16) / 16
    y = torch.empty(1, u, device=dev, dtype=torch.bfloat16)
    xq, sx = G.quantize_fp8(x.float(), "row")
    wq, sw = G.quantize_fp8(w.float(), "row")
    wq32 = wq.view(torch.int32)
    q = C.QuantFormat(mode=C.QuantMode.fp8_e4m3, bits=8, group_size=0, row_block=1)
    y8 = torch.empty(1, u, device=dev, dtype=torch.float8_e4m3fn)
    ys8 = torch.empty(1, 2, device=dev)
    alloc = G._workspace_alloc(x)
    import gatedmlp.torch as GT
    op = torch.ops.gatedmlp.gate_up
    # The floor of a Python-defined operator: gate_up's schema, a kernel that
    # does nothing (the dispatcher boxing 13 arguments into a Python call).
    lib = torch.library.Library("gatedmlp_probe", "DEF")
    lib.define("noop(Tensor x, Tensor w, Tensor? w_up, Tensor? bias, Tensor? bias_up, str activation, "
               "float clamp_alpha, float clamp_limit, int group, str first, str storage, float alpha, "
               "ScalarType? out_dtype) -> Tensor")
    lib.impl("noop", lambda *a: a[0], "CompositeExplicitAutograd")
    noop = torch.ops.gatedmlp_probe.noop

    entries = {
        "3 exports": lambda: (to(x), to(w), to(y)),
        "5 exports": lambda: (to(xq), to(wq32), to(y), to(sw), to(sx)),
        "_C.gate_up bf16 (decode kernel)": lambda: C.gate_up(to(x), to(w), to(y), stream=stream,
                                                             workspace_alloc=alloc),
        "_C.gate_up fp8, bf16 Y": lambda: C.gate_up(to(xq), to(wq32), to(y), stream=stream, workspace_alloc=alloc,
                                                    scales=to(sw), x_scales=to(sx), quant=q, x_fp8=True),
        "_C.gate_up fp8, FP8 Y": lambda: C.gate_up(to(xq), to(wq32), to(y8), stream=stream, workspace_alloc=alloc,
                                                   scales=to(sw), x_scales=to(sx), quant=q, x_fp8=True,
                                                   y_scales=to(ys8)),
        "torch.empty(1) (caching allocator)": lambda: torch.empty(1, device=dev),
        # Where the rest of an entry point's time goes: the parts one by one.
        "python call (lambda: None)": lambda: None,
        "1 export": lambda: to(x),
        "x.new_empty((1, u))": lambda: x.new_empty((1, u)),
        "current raw stream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "_C.make_problem bf16 (import + describe)": lambda: C.make_problem(to(x), to(w), to(y)),
        "_C.gate_up bf16, all keywords given": lambda: C.gate_up(
            to(x), to(w), to(y), None, None, None, None, activation=C.Activation.silu, clamp_alpha=1.702,
            clamp_limit=7.0, group=0, first=C.Half.gate, storage=C.WeightStorage.out_in, alpha=1.0,
            stream=stream, workspace_alloc=alloc, hold_workspace=True),
        "F.linear(x, w)": lambda: torch.nn.functional.linear(x, w),
        "gatedmlp.gate_up(x, w, out=y)": lambda: G.gate_up(x, w, out=y),
        "gatedmlp.torch.gate_up(x, w)": lambda: GT.gate_up(x, w),
        "no-op operator, gate_up's schema": lambda: noop(x, w, None, None, None, "silu", 1.702, 7.0, 0, "gate",
                                                         "out_in", 1.0, None),
        "x.new_empty(1, u) (varargs)": lambda: x.new_empty(1, u),
        "torch.ops.gatedmlp.gate_up": lambda: op(x, w, None, None, None, ""),
    }
    p = C.make_problem(to(xq), to(wq32), to(y), scales=to(sw), quant=q, x_scales=to(sx), x_fp8=True)
    print("fp8 problem:", p)
    print("fp8 config:", C.plan(p))
    res = {n: [] for n in entries}
    with torch.inference_mode():
        for n, f in entries.items():
            f()
        torch.cuda.synchronize()
        for _ in range(31):
            for n, f in entries.items():
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(300):
                    f()
                res[n].append((time.perf_counter() - t0) / 300 * 1e6)
    torch.cuda.synchronize()
    print(f"\n{torch.cuda.get_device_name()}: host µs per call, median of 31 x 300")
    for n in entries:
        print(f"  {n:40s} {statistics.median(res[n]):7.2f}")


if __name__ == "__main__":
    main()
