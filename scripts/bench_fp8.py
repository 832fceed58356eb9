#!/usr/bin/env python3
"""FP8 gate/up (FP8 activations and weights, Hopper) against its bars (the
FP8 issue), every number from one run on one GPU.

Per model (8b: K 4096, U 14336; 70b: K 8192, U 28672; qwen3-32b: K 5120,
U 25600) and M (default 1024, 2048, 4096, 8192, 16384): x [M, K] random
bf16, the stacked gate/up weights [2U, K] (gate rows, then up rows) random
bf16 x 0.02, and their FP8 forms from gatedmlp.quantize_fp8 (scale = amax
/ 448): per tensor (x and w one scale each), and row-wise (x per token
[M, 1], w per output channel [2U, 1]). Under CUDA-graph replay
(bench_quant's graph_time_us: warm-up on a side stream first, CALLS calls
per graph, the median of --iters replays), the weights not rotated (at
these M the calls are compute-bound; as bench_moe's prefill mode):

  bf16 gatedmlp          gatedmlp.gate_up(x, w, out=y), bf16 weights
  fp8 gatedmlp tensor    gatedmlp.fp8_gate_up(xq, sx, wq, sw, out=y), per-tensor scales
  fp8 gatedmlp row       the same, x per token, w per output channel
  _scaled_mm tensor/row  torch._scaled_mm(xq, wq.t(), scale_a, scale_b,
                         out_dtype=bf16) -> [M, 2U], the GEMM alone with
                         the same scaling (wq.t(): the column-major view
                         _scaled_mm wants; row-wise scale_b [1, 2U])
  + GLU eager            that, then F.silu(h[:, :U]) * h[:, U:]
  + GLU compiled         that function through torch.compile (default
                         mode, compiled for each shape)

TFLOP/s on 2 M K 2U flops. The bars (ratios are the baseline's time over
fp8 gatedmlp's): fp8 gatedmlp >= 1.75x bf16 gatedmlp at M >= 2048, and
>= 1.0x _scaled_mm alone with the same scaling at M >= 1024. Before
timing, each fp8 output is checked against _scaled_mm + GLU eager's of the
same scaling: max |diff| / max |baseline| must be <= 2e-2 (FAILED
otherwise, and the exit status 1; the run goes on).

Accuracy, per model at one M (--acc-m, default 2048): against a float64
reference on the dequantized inputs (xq * sx, wq * sw; silu(g) * u), the
max relative error (max |y - ref| / max |ref|) and the mean relative error
(mean |y - ref| / mean |ref|) of fp8 gatedmlp (bf16 out) and of _scaled_mm
with fp32 out (bf16 where _scaled_mm refuses fp32 for that scaling) + the
GLU in fp32, rounded to bf16, per scaling.

    PYTHONPATH=build-gpu/python python3 scripts/bench_fp8.py [--model 8b,70b,qwen3-32b]
        [--m 1024,2048,4096,8192,16384] [--iters 20] [--acc-m 2048] [--compile-timeout 600] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_moe import CompileTimeout, call_with_timeout, free_memory, rel_max_diff, short  # noqa: E402
from bench_quant import graph_time_us  # noqa: E402

import gatedmlp  # noqa: E402

MODELS = {"8b": (4096, 14336), "70b": (8192, 28672), "qwen3-32b": (5120, 25600)}  # K, U
DEFAULT_M = (1024, 2048, 4096, 8192, 16384)
CALLS = 3             # calls per CUDA graph (each is 0.1 ms or more)
CHECK_TOL = 2e-2      # max |fp8 gatedmlp - _scaled_mm + GLU| / max |_scaled_mm + GLU|
BAR_VS_BF16 = 1.75    # fp8 gatedmlp against bf16 gatedmlp ...
BAR_VS_BF16_M = 2048  # ... from this M on
BAR_VS_MM = 1.0       # fp8 gatedmlp against _scaled_mm alone (same scaling) ...
BAR_VS_MM_M = 1024    # ... from this M on
SCALINGS = ("tensor", "row")

FAILURES: list[str] = []


def fail(msg: str) -> None:
    """A failed check: said loudly, remembered for the exit status."""
    FAILURES.append(msg)
    print(f"FAILED: {msg}", flush=True)


def scaled_mm(xq, wt, sa, sb, out_dtype=torch.bfloat16):
    """The FP8 GEMM alone: [M, K] x [K, 2U] (wt column-major), scaled."""
    return torch._scaled_mm(xq, wt, scale_a=sa, scale_b=sb, out_dtype=out_dtype)


def scaled_mm_glu(xq, wt, sa, sb):
    """FP8 gate/up + GLU as a PyTorch user writes it: one scaled GEMM into
    [M, 2U] bf16, then silu(gate) * up."""
    h = torch._scaled_mm(xq, wt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    u = h.shape[1] // 2
    return F.silu(h[:, :u]) * h[:, u:]


class Quantized:
    """One scaling's FP8 tensors: gatedmlp's arguments (xq [M, K], sx; wq
    [2U, K], sw) and _scaled_mm's (wq.t(), scale_a, scale_b)."""

    def __init__(self, x, w, scaling):
        self.xq, self.sx = gatedmlp.quantize_fp8(x, scaling)
        self.wq, self.sw = gatedmlp.quantize_fp8(w, scaling)
        self.wt = self.wq.t()
        if scaling == "tensor":
            self.sa, self.sb = self.sx.reshape(()), self.sw.reshape(())
        else:
            self.sa, self.sb = self.sx, self.sw.reshape(1, -1)  # [M, 1], [1, 2U]

    def rows(self, m):
        """The first m rows of x (a view) with their scales."""
        sx = self.sx if self.sx.numel() == 1 else self.sx[:m]
        sa = self.sa if self.sa.numel() == 1 else self.sa[:m]
        return self.xq[:m], sx, sa


def time_us(fn, iters):
    return graph_time_us([fn] * CALLS, reps=iters)


def bench_model(name: str, ms: list[int], iters: int, compile_timeout: float) -> list[dict]:
    k, u = MODELS[name]
    mmax = max(ms)
    x16 = torch.randn(mmax, k, device="cuda", dtype=torch.bfloat16)
    w16 = torch.randn(2 * u, k, device="cuda", dtype=torch.bfloat16) * 0.02
    q = {s: Quantized(x16, w16, s) for s in SCALINGS}
    y = torch.empty(mmax, u, device="cuda", dtype=torch.bfloat16)

    # _scaled_mm + GLU compiled: one function per scaling, recompiled per M
    # (dynamic=False), each compilation bounded by compile_timeout.
    compiled = {}
    if compile_timeout > 0:
        torch._dynamo.reset()
        cfg = torch._dynamo.config  # recompilations allowed per function: one per M
        limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, limit, max(getattr(cfg, limit), 2 * len(ms)))
        compiled = {s: torch.compile(scaled_mm_glu, dynamic=False) for s in SCALINGS}

    rows = []
    for m in sorted(ms):
        x, out = x16[:m], y[:m]
        row = {"model": name, "M": m, "K": k, "U": u, "flops": 2 * m * k * 2 * u}
        what = f"{name} M={m}"

        def put(key, fn):
            try:
                row[f"{key}_us"] = us = time_us(fn, iters)
                row[f"{key}_tflops"] = row["flops"] / (us * 1e-6) / 1e12
            except Exception as ex:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
                row[f"{key}_error"] = short(ex)

        put("bf16_gatedmlp", lambda: gatedmlp.gate_up(x, w16, out=out))
        for s in SCALINGS:
            qs = q[s]
            xq, sx, sa = qs.rows(m)
            # Correctness first: fp8 gatedmlp against _scaled_mm + GLU eager.
            try:
                got = gatedmlp.fp8_gate_up(xq, sx, qs.wq, qs.sw)
            except Exception as ex:  # noqa: BLE001 - gatedmlp failing is a failure of the run
                row[f"fp8_{s}_error"] = short(ex)
                fail(f"{what}: gatedmlp.fp8_gate_up ({s} scaling) raised {short(ex)}")
                continue
            try:
                ref = scaled_mm_glu(xq, qs.wt, sa, qs.sb)
                row[f"fp8_{s}_check_rel_max_diff"] = diff = rel_max_diff(got, ref)
                if not diff <= CHECK_TOL:  # also catches NaN
                    fail(f"{what}: max |fp8 gatedmlp - _scaled_mm + GLU| / max |_scaled_mm + GLU| ({s} scaling) = "
                         f"{diff:.3e} > {CHECK_TOL}")
                del ref
            except Exception as ex:  # noqa: BLE001
                row[f"scaled_mm_{s}_error"] = short(ex)
            del got
            put(f"fp8_{s}", lambda xq=xq, sx=sx, qs=qs: gatedmlp.fp8_gate_up(xq, sx, qs.wq, qs.sw, out=out))
            if f"scaled_mm_{s}_error" not in row:
                put(f"scaled_mm_{s}", lambda xq=xq, sa=sa, qs=qs: scaled_mm(xq, qs.wt, sa, qs.sb))
                put(f"scaled_mm_glu_{s}", lambda xq=xq, sa=sa, qs=qs: scaled_mm_glu(xq, qs.wt, sa, qs.sb))
            if s in compiled and f"scaled_mm_{s}_error" not in row:
                cfn = compiled[s]
                t0 = time.perf_counter()
                try:
                    call_with_timeout(lambda: cfn(xq, qs.wt, sa, qs.sb), compile_timeout)
                    torch.cuda.synchronize()
                    row[f"compile_{s}_s"] = time.perf_counter() - t0
                    put(f"scaled_mm_glu_compiled_{s}", lambda xq=xq, sa=sa, qs=qs, cfn=cfn: cfn(xq, qs.wt, sa, qs.sb))
                except (Exception, CompileTimeout) as ex:  # noqa: BLE001 - reported, the run goes on
                    row[f"scaled_mm_glu_compiled_{s}_error"] = short(ex)
                    print(f"{what}: torch.compile of _scaled_mm + GLU ({s}) failed after "
                          f"{time.perf_counter() - t0:.0f} s: {short(ex)}", flush=True)
                    del compiled[s]
        # Ratios (the baseline's time over fp8 gatedmlp's) and the bars.
        for s in SCALINGS:
            t = row.get(f"fp8_{s}_us")
            if t is None:
                continue
            for base in ("bf16_gatedmlp", f"scaled_mm_{s}", f"scaled_mm_glu_{s}", f"scaled_mm_glu_compiled_{s}"):
                if f"{base}_us" in row:
                    row[f"fp8_{s}_vs_{base.replace('_' + s, '')}"] = row[f"{base}_us"] / t
            if m >= BAR_VS_BF16_M and f"fp8_{s}_vs_bf16_gatedmlp" in row:
                row[f"bar_{s}_vs_bf16_met"] = row[f"fp8_{s}_vs_bf16_gatedmlp"] >= BAR_VS_BF16
            if m >= BAR_VS_MM_M and f"fp8_{s}_vs_scaled_mm" in row:
                row[f"bar_{s}_vs_scaled_mm_met"] = row[f"fp8_{s}_vs_scaled_mm"] >= BAR_VS_MM
        rows.append(row)
        print_row(row)
    del x16, w16, q, y, compiled
    torch._dynamo.reset()
    free_memory()
    return rows


def print_row(row):
    def col(key, label):
        if f"{key}_us" in row:
            return f"  {label} {row[f'{key}_us']:8.1f} us {row[f'{key}_tflops']:6.1f} TF"
        return f"  {label}: {row.get(f'{key}_error', 'not run')}"

    line = f"{row['model']:9s} M={row['M']:5d}" + col("bf16_gatedmlp", "bf16 gatedmlp")
    for s in SCALINGS:
        line += f"\n   {s:6s}" + col(f"fp8_{s}", "fp8 gatedmlp")
        for key, label in ((f"scaled_mm_{s}", "_scaled_mm"), (f"scaled_mm_glu_{s}", "+glu"),
                           (f"scaled_mm_glu_compiled_{s}", "+glu compiled")):
            line += col(key, label)
        if f"fp8_{s}_us" in row:
            line += f"\n          fp8 / bf16 gatedmlp {row.get(f'fp8_{s}_vs_bf16_gatedmlp', float('nan')):5.2f}x"
            if f"bar_{s}_vs_bf16_met" in row:
                line += f" (bar {BAR_VS_BF16}x: {'met' if row[f'bar_{s}_vs_bf16_met'] else 'MISSED'})"
            line += f"  vs _scaled_mm {row.get(f'fp8_{s}_vs_scaled_mm', float('nan')):5.2f}x"
            if f"bar_{s}_vs_scaled_mm_met" in row:
                line += f" (bar {BAR_VS_MM}x: {'met' if row[f'bar_{s}_vs_scaled_mm_met'] else 'MISSED'})"
            line += (f"  vs +glu {row.get(f'fp8_{s}_vs_scaled_mm_glu', float('nan')):5.2f}x"
                     f"  vs +glu compiled {row.get(f'fp8_{s}_vs_scaled_mm_glu_compiled', float('nan')):5.2f}x"
                     f"  check {row.get(f'fp8_{s}_check_rel_max_diff', float('nan')):.1e}")
    print(line, flush=True)


def summary(rows):
    """The bars' table: one line per model and M."""
    print(f"\nbars: fp8 / bf16 gatedmlp >= {BAR_VS_BF16}x at M >= {BAR_VS_BF16_M}; fp8 gatedmlp / _scaled_mm "
          f">= {BAR_VS_MM}x at M >= {BAR_VS_MM_M} (same scaling)")
    print(f"{'model':9s} {'M':>6s} | " + " | ".join(f"{s + ' vs bf16':>14s} {s + ' vs mm':>14s}" for s in SCALINGS))
    for r in rows:
        cells = []
        for s in SCALINGS:
            for key, bar in ((f"fp8_{s}_vs_bf16_gatedmlp", f"bar_{s}_vs_bf16_met"),
                             (f"fp8_{s}_vs_scaled_mm", f"bar_{s}_vs_scaled_mm_met")):
                v = r.get(key)
                mark = "" if bar not in r else (" ok" if r[bar] else " MISS")
                cells.append(f"{(f'{v:.2f}x' if v is not None else 'n/a') + mark:>14s}")
        print(f"{r['model']:9s} {r['M']:6d} | " + " | ".join(" ".join(cells[i:i + 2]) for i in range(0, len(cells), 2)))


# ---------------------------------------------------------------- accuracy
def rel_errors(y, ref):
    d = (y.double() - ref).abs()
    return (d.max() / ref.abs().max().clamp_min(1e-300)).item(), (d.mean() / ref.abs().mean().clamp_min(1e-300)).item()


def accuracy_model(name: str, m: int) -> list[dict]:
    k, u = MODELS[name]
    x16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w16 = torch.randn(2 * u, k, device="cuda", dtype=torch.bfloat16) * 0.02
    out = []
    for s in SCALINGS:
        qs = Quantized(x16, w16, s)
        xd = qs.xq.double() * qs.sx.double().reshape(-1, 1) if s == "row" else qs.xq.double() * qs.sx.double()
        wd = qs.wq.double() * (qs.sw.double().reshape(-1, 1) if s == "row" else qs.sw.double())
        h = xd @ wd.T
        del xd, wd
        ref = F.silu(h[:, :u]) * h[:, u:]
        del h
        row = {"model": name, "M": m, "K": k, "U": u, "scaling": s}
        try:
            y = gatedmlp.fp8_gate_up(qs.xq, qs.sx, qs.wq, qs.sw)
            row["gatedmlp_max_rel"], row["gatedmlp_mean_rel"] = rel_errors(y, ref)
            del y
        except Exception as ex:  # noqa: BLE001
            row["gatedmlp_error"] = short(ex)
            fail(f"accuracy {name} M={m} ({s}): gatedmlp.fp8_gate_up raised {short(ex)}")
        try:
            try:
                h32 = scaled_mm(qs.xq, qs.wt, qs.sa, qs.sb, torch.float32)
                row["scaled_mm_out"] = "fp32"
            except RuntimeError:  # _scaled_mm takes only bf16 out for this scaling
                h32 = scaled_mm(qs.xq, qs.wt, qs.sa, qs.sb, torch.bfloat16).float()
                row["scaled_mm_out"] = "bf16"
            y = (F.silu(h32[:, :u]) * h32[:, u:]).to(torch.bfloat16)
            del h32
            row["scaled_mm_glu_max_rel"], row["scaled_mm_glu_mean_rel"] = rel_errors(y, ref)
            del y
        except Exception as ex:  # noqa: BLE001 - a baseline that cannot run is reported
            row["scaled_mm_error"] = short(ex)
        out.append(row)

        def cell(key):
            if f"{key}_max_rel" in row:
                return f"max {row[f'{key}_max_rel']:.3e} mean {row[f'{key}_mean_rel']:.3e}"
            return row.get(f"{key.split('_glu')[0]}_error", "not run")

        print(f"{name:9s} M={m:5d} {s:6s}  fp8 gatedmlp (bf16 out): {cell('gatedmlp')}   _scaled_mm "
              f"({row.get('scaled_mm_out', '-')} out) + GLU fp32 -> bf16: {cell('scaled_mm_glu')}", flush=True)
        del qs, ref
        free_memory()
    del x16, w16
    free_memory()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=",".join(MODELS), help="models, comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--m", default=",".join(str(m) for m in DEFAULT_M), help="M values, comma-separated")
    ap.add_argument("--iters", type=int, default=20, help="CUDA-graph replays per timing (the median is kept)")
    ap.add_argument("--acc-m", type=int, default=2048, help="M of the accuracy table (0: no accuracy table)")
    ap.add_argument("--compile-timeout", type=float, default=600.0,
                    help="seconds a torch.compile baseline may take (0: not compiled)")
    ap.add_argument("--json")
    a = ap.parse_args()
    models = a.model.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    ms = [int(v) for v in a.m.split(",")]
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name(0)
    cap = torch.cuda.get_device_capability(0)
    print(f"device {dev} (sm_{cap[0]}{cap[1]}); torch {torch.__version__}; gatedmlp {gatedmlp.__version__}; "
          f"{CALLS} calls per CUDA graph, median of {a.iters} replays", flush=True)
    result = {"device": dev, "capability": list(cap), "torch": torch.__version__, "gatedmlp": gatedmlp.__version__,
              "iters": a.iters, "calls_per_graph": CALLS}
    if not hasattr(gatedmlp, "fp8_gate_up"):
        fail("this gatedmlp has no fp8_gate_up (the FP8 activations API)")
        return 1
    rows, acc = [], []
    with torch.no_grad():
        for name in models:
            rows += bench_model(name, ms, a.iters, a.compile_timeout)
        summary(rows)
        if a.acc_m > 0:
            print(f"\naccuracy at M = {a.acc_m} against float64 on the dequantized inputs (silu): max |y - ref| / "
                  "max |ref|, mean |y - ref| / mean |ref|", flush=True)
            for name in models:
                acc += accuracy_model(name, a.acc_m)
    result["rows"] = rows
    result["accuracy"] = acc
    if FAILURES:
        result["failures"] = FAILURES
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    if FAILURES:
        print(f"{len(FAILURES)} check(s) FAILED:", *FAILURES, sep="\n  ", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
