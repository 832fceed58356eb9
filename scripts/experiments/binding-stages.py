"""h88 (docs/notes/drop-in-and-decode.md): where each Python entry point's
host time goes, stage by stage inside the binding. The stages need the
extension built with -DGATEDMLP_PY_TIMERS (scripts/experiments/binding-stages.sh;
without it, the totals only);
the stages are timed with steady_clock inside _C.gate_up, the total from
Python, "outside" is the total less the stages (the Python wrapper, the
argument conversion into the binding, the allocation, the DLPack exports,
and the destruction of the imported views after the launch).

    PYTHONPATH=build-timers/python python3 scripts/experiments/binding-stages.py
"""

import statistics
import time

import torch
import torch.nn.functional as F

import gatedmlp as G
import gatedmlp.torch as GT
from gatedmlp import _gatedmlp as C


def main():
    dev = torch.device("cuda")
    k = u = 256
    bf = torch.bfloat16
    x = torch.randn(1, k, device=dev, dtype=bf)
    w = torch.randn(2 * u, k, device=dev, dtype=bf) / 16
    y = torch.empty(1, u, device=dev, dtype=bf)
    xq, sx = G.quantize_fp8(x.float(), "row")
    wq, sw = G.quantize_fp8(w.float(), "row")
    qw, qs, qb = G.quantize(w.float().cpu(), group_size=64, bits=4)
    qw, qs, qb = qw.view(torch.int32).to(dev), qs.to(bf).to(dev), qb.to(bf).to(dev)
    to = torch.utils.dlpack.to_dlpack
    stream = torch.cuda.current_stream().cuda_stream
    alloc = GT._workspace_alloc(x.device)
    op = torch.ops.gatedmlp.gate_up
    options = any(a.name == "options" for a in op.default._schema.arguments)
    # Without the timers (a build without -DGATEDMLP_PY_TIMERS): totals only.
    timers = getattr(C, "_stage_timers", lambda: {"calls": 0})
    entries = {
        "F.linear(x, w)": lambda: F.linear(x, w),
        "x.new_empty(1, u)": lambda: x.new_empty(1, u),
        "_C.gate_up bf16 (as the torch path calls it)": lambda: C.gate_up(
            to(x), to(w), to(y), stream=stream, workspace_alloc=alloc, hold_workspace=True),
        "gatedmlp.gate_up(x, w, out=y)": lambda: G.gate_up(x, w, out=y),
        "gatedmlp.gate_up(x, w)": lambda: G.gate_up(x, w),
        "gatedmlp.torch.gate_up(x, w)": lambda: GT.gate_up(x, w),
        # the raw op as GatedMLP.forward passes it: the options string, or (a
        # tree before h88) the 13-argument schema
        "torch.ops.gatedmlp.gate_up": (lambda: op(x, w, None, None, None, "")) if options else (
            lambda: op(x, w, None, None, None, "silu", 1.702, 7.0, 0, "gate", "out_in", 1.0, None)),
        "gatedmlp.quantized_gate_up(x, wq, s, b)": lambda: G.quantized_gate_up(x, qw, qs, qb),
        "gatedmlp.quantized_gate_up(..., out=y)": lambda: G.quantized_gate_up(x, qw, qs, qb, out=y),
        "gatedmlp.torch.quantized_gate_up": lambda: GT.quantized_gate_up(x, qw, qs, qb),
        "gatedmlp.fp8_gate_up(xq, sx, wq, sw)": lambda: G.fp8_gate_up(xq, sx, wq, sw),
        "gatedmlp.torch.fp8_gate_up": lambda: GT.fp8_gate_up(xq, sx, wq, sw),
    }
    reps, n = 21, 500
    total = {nm: [] for nm in entries}
    stages = {nm: [] for nm in entries}
    with torch.inference_mode():
        for f in entries.values():
            f()
        torch.cuda.synchronize()
        for _ in range(reps):
            for nm, f in entries.items():
                torch.cuda.synchronize()
                timers()
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                t1 = time.perf_counter()
                total[nm].append((t1 - t0) / n * 1e6)
                stages[nm].append(timers())
    torch.cuda.synchronize()
    names = [s for s in stages["F.linear(x, w)"][0] if s != "calls"]
    print(f"{torch.cuda.get_device_name()}: host us per call, median of {reps} x {n}; the binding's stages, medians")
    base = statistics.median(total["F.linear(x, w)"])
    for nm in entries:
        t = statistics.median(total[nm])
        calls = statistics.median(s["calls"] for s in stages[nm]) / n
        line = f"  {nm:46s} {t:6.2f} us ({t / base:4.2f}x F.linear)"
        if calls:
            parts = {s: statistics.median(d[s] for d in stages[nm]) / 1e3 * calls for s in names}
            inside = sum(parts.values())
            line += f"  inside {inside:5.2f}, outside {t - inside:5.2f}: " + ", ".join(
                f"{s} {v:.2f}" for s, v in parts.items())
        print(line)


if __name__ == "__main__":
    main()
