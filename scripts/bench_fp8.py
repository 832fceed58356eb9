#!/usr/bin/env python3
"""FP8 gate/up (FP8 activations and weights, Hopper) against its bars (the
FP8 issue), every number from one run on one GPU.

Per model (8b: K 4096, U 14336; 70b: K 8192, U 28672; qwen3-32b: K 5120,
U 25600) and M (default 1024, 2048, 4096, 8192, 16384): x [M, K] random
bf16, the stacked gate/up weights [2U, K] (gate rows, then up rows) random
bf16 x 0.02, and their FP8 forms from gatedmlp.quantize_fp8 (scale = amax
/ 448): per tensor (x and w one scale each), row-wise (x per token
[M, 1], w per output channel [2U, 1]), and block (x per token and 128
columns of K, [M, K / 128], "block"; w per 128 x 128 block, [2U / 128,
K / 128], "block128": DeepSeek-V3's scaling). Under CUDA-graph replay
(bench_quant's graph_time_us: warm-up on a side stream first, CALLS calls
per graph, the median of --iters replays), the weights not rotated (at
these M the calls are compute-bound; as bench_moe's prefill mode):

  bf16 gatedmlp          gatedmlp.gate_up(x, w, out=y), bf16 weights
  fp8 gatedmlp tensor    gatedmlp.fp8_gate_up(xq, sx, wq, sw, out=y), per-tensor scales
  fp8 gatedmlp row       the same, x per token, w per output channel
  fp8 gatedmlp block     the same, x 1 x 128 blocks, w 128 x 128 blocks
  _scaled_mm tensor/row  torch._scaled_mm(xq, wq.t(), scale_a, scale_b,
                         out_dtype=bf16) -> [M, 2U], the GEMM alone with
                         the same scaling (wq.t(): the column-major view
                         _scaled_mm wants; row-wise scale_b [1, 2U])
  _scaled_mm block       the same with blockwise scales, where this torch
                         and GPU take them (cuBLAS's 1 x 128 x 128 x 128
                         kernels, sm_90, CUDA >= 12.9): scale_a [M, K / 128]
                         column-major (strides (1, M)), scale_b [K / 128,
                         2U / 128] with strides (1, round_up(K / 128, 4)) or
                         (1, K / 128), or torch.nn.functional.scaled_mm
                         with ScalingType.BlockWise1x128 / BlockWise128x128;
                         the first form that runs and agrees with the
                         dequantized reference is used, else "n/a"
  + GLU eager            that, then F.silu(h[:, :U]) * h[:, U:]
  + GLU compiled         that function through torch.compile (default
                         mode, compiled for each shape)

TFLOP/s on 2 M K 2U flops. The bars (ratios are the baseline's time over
fp8 gatedmlp's): fp8 gatedmlp >= 1.75x bf16 gatedmlp at M >= 2048, and
>= 1.0x _scaled_mm alone with the same scaling at M >= 1024; and block
scaling costs at most 10 %: fp8 gatedmlp per-tensor time / block time >=
0.9 at every M (both timed in the same run). Before timing, each fp8
output is checked against _scaled_mm + GLU eager's of the same scaling
(block: against the bf16 GEMM of the dequantized inputs (xq * sx, wq *
sw, rounded to bf16) + GLU, which does not depend on _scaled_mm taking
block scales): max |diff| / max |baseline| must be <= 2e-2 (FAILED
otherwise, and the exit status 1; the run goes on).

--fp8-out (default "row"; "row,mn", or "none"): fp8 gatedmlp with an FP8
Y, float8_e4m3fn [M, U] with its 1 x 128 group scales ([M, U / 128] fp32,
row-major "row" or MN-major "mn", strides (1, align4(M))), per scaling,
against the same call's bf16 Y, the two CUDA graphs replayed in turn
(--iters x 2 of each, at least 40; the medians): the bar is time with the
FP8 Y <= 1.03x the bf16 Y's (the FP8 issue); checked first (the FP8 Y
times its scales against the bf16 Y: max |diff| / max |bf16 Y| <= 2^-4,
one e4m3 step).

--promote: GATEDMLP_FP8_PROMOTE for the fp8 gatedmlp calls ("1": each
128-deep k-block summed apart and added into fp32; unset, the default: all
of K summed in the tensor cores' accumulator; block-scaled calls always
promote). "env" (the default) leaves the environment as it is; "off"
unsets the variable, "on" sets it to 1; "both" runs every fp8 gatedmlp
check, timing and accuracy row twice, unset and 1, and prints both and the
ratio (time with 1 / time unset: > 1 means promotion is the slower). The
bars use the first (unset).

Accuracy, per model at one M (--acc-m, default 2048): against a float64
reference on the dequantized inputs (xq * sx, wq * sw; silu(g) * u), the
max relative error (max |y - ref| / max |ref|) and the mean relative error
(mean |y - ref| / mean |ref|) of fp8 gatedmlp (bf16 out) and of _scaled_mm
with fp32 out (bf16 where _scaled_mm refuses fp32 for that scaling; block
scales: bf16 out, "n/a" where it takes none) + the GLU in fp32, rounded to
bf16, per scaling.

Output: one block of lines per model and M, then the bars' table, then the
accuracy lines; --json writes every number (keys fp8_<scaling>_us,
fp8_<scaling>_vs_<baseline>, bar_<...>_met; with --promote both also
fp8_<scaling>_promote_us and fp8_<scaling>_promote_vs_default).

    PYTHONPATH=build-gpu/python python3 scripts/bench_fp8.py [--model 8b,70b,qwen3-32b]
        [--m 1024,2048,4096,8192,16384] [--iters 20] [--acc-m 2048] [--compile-timeout 600]
        [--promote env|on|off|both] [--fp8-out row|mn|row,mn|none] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_moe import CompileTimeout, call_with_timeout, free_memory, rel_max_diff, short  # noqa: E402
from bench_quant import capture_graph, graph_time_us, replay_us  # noqa: E402

import gatedmlp  # noqa: E402

MODELS = {"8b": (4096, 14336), "70b": (8192, 28672), "qwen3-32b": (5120, 25600)}  # K, U
DEFAULT_M = (1024, 2048, 4096, 8192, 16384)
CALLS = 3             # calls per CUDA graph (each is 0.1 ms or more)
CHECK_TOL = 2e-2      # max |fp8 gatedmlp - _scaled_mm + GLU| / max |_scaled_mm + GLU|
BAR_VS_BF16 = 1.75    # fp8 gatedmlp against bf16 gatedmlp ...
BAR_VS_BF16_M = 2048  # ... from this M on
BAR_VS_MM = 1.0       # fp8 gatedmlp against _scaled_mm alone (same scaling) ...
BAR_VS_MM_M = 1024    # ... from this M on
BAR_BLOCK_VS_TENSOR = 0.9  # fp8 gatedmlp block scaling against its own per-tensor time, at every M
BAR_FP8_OUT = 1.03    # fp8 gatedmlp with an FP8 Y and its scales: time at most this x the bf16 Y's
CHECK_FP8_OUT_TOL = 2.0 ** -4  # max |FP8 Y x scale - bf16 Y| / max |bf16 Y|: one e4m3 step
SCALINGS = ("tensor", "row", "block")
QUANT = {"tensor": ("tensor", "tensor"), "row": ("row", "row"), "block": ("block", "block128")}  # x's, w's
PROMOTE_ENV = "GATEDMLP_FP8_PROMOTE"
# --promote: the settings each fp8 gatedmlp measurement runs under, as
# (key suffix, GATEDMLP_FP8_PROMOTE: None unset, "1", or KEEP the environment's).
KEEP = object()
PROMOTE_MODES = {"env": [("", KEEP)], "off": [("", None)], "on": [("", "1")],
                 "both": [("", None), ("_promote", "1")]}

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


def glu(h):
    u = h.shape[1] // 2
    return F.silu(h[:, :u]) * h[:, u:]


def ceil_div(a, b):
    return -(-a // b)


def deq_x(xq, sx, blocked, dtype=torch.float32):
    """x_e4m3 * sx (sx 1 value, [M, 1], or with blocked [M, K / 128]),
    computed in fp32 (fp64 for a float64 result), returned as dtype."""
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    if blocked:
        return (xq.to(ct) * sx.to(ct).repeat_interleave(128, dim=1)[:, :xq.shape[1]]).to(dtype)
    return (xq.to(ct) * sx.to(ct)).to(dtype)


def deq_w(wq, sw, blocked, dtype=torch.float32):
    """w_e4m3 * sw (sw 1 value, [2U, 1], or with blocked [2U / 128, K / 128]),
    computed as deq_x does, one 128-row block at a time with blocked (no
    scale expanded to w's size)."""
    n, k = wq.shape
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    if not blocked:
        return (wq.to(ct) * sw.to(ct)).to(dtype)
    out = torch.empty(n, k, device=wq.device, dtype=dtype)
    for i in range(0, n, 128):
        s = sw[i // 128].to(ct).repeat_interleave(128)[:k]
        out[i:i + 128] = (wq[i:i + 128].to(ct) * s).to(dtype)
    return out


# Blockwise _scaled_mm: the forms a torch may take 1 x 128 (A) x 128 x 128
# (B) scales in; each returns [M, 2U] bf16 (cuBLAS's blockwise kernels give
# bf16 only). sa: [M, K / 128] column-major (strides (1, M)); sw: the
# weights' [2U / 128, K / 128] row-major; they build scale_b from it.
def _padded_sb(sw):
    """[nb, round_up(kb, 4)] with sw in its first kb columns (the row
    stride cuBLAS wants 16-byte aligned)."""
    nb, kb = sw.shape
    p = torch.zeros(nb, ceil_div(kb, 4) * 4, device=sw.device, dtype=torch.float32)
    p[:, :kb] = sw
    return p


BLOCK_FORMS = {
    # torch._scaled_mm, scale_b [K / 128, 2U / 128] with strides (1, round_up(K / 128, 4)).
    "_scaled_mm, scale_b strides (1, L4)": lambda sw: _padded_sb(sw)[:, :sw.shape[1]].t(),
    # torch._scaled_mm, scale_b = sw.t(): strides (1, K / 128).
    "_scaled_mm, scale_b strides (1, K/128)": lambda sw: sw.float().contiguous().t(),
    # torch.nn.functional.scaled_mm (v2): scale_b [round_up(K / 128, 4), 2U / 128], strides (1, L4).
    "F.scaled_mm BlockWise1x128 x BlockWise128x128": lambda sw: _padded_sb(sw).t(),
}


def block_scaled_mm(form, xq, wt, sa, sb):
    if form.startswith("F.scaled_mm"):
        st = F.ScalingType
        return F.scaled_mm(xq, wt, sa, st.BlockWise1x128, sb, st.BlockWise128x128, output_dtype=torch.bfloat16)
    return torch._scaled_mm(xq, wt, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)


def block_scaled_mm_glu(form, xq, wt, sa, sb):
    return glu(block_scaled_mm(form, xq, wt, sa, sb))


class Quantized:
    """One scaling's FP8 tensors: gatedmlp's arguments (xq [M, K], sx; wq
    [2U, K], sw) and _scaled_mm's (wq.t(), scale_a, scale_b; block: scale_a
    from rows(), scale_b from sb_for() in the form find_block_form picks)."""

    def __init__(self, x, w, scaling):
        xg, wg = QUANT[scaling]
        self.scaling = scaling
        self.xq, self.sx = gatedmlp.quantize_fp8(x, xg)
        self.wq, self.sw = gatedmlp.quantize_fp8(w, wg)
        self.wt = self.wq.t()
        if scaling == "tensor":
            self.sa, self.sb = self.sx.reshape(()), self.sw.reshape(())
        elif scaling == "row":
            self.sa, self.sb = self.sx, self.sw.reshape(1, -1)  # [M, 1], [1, 2U]
        else:
            self.sa, self.sb = None, None  # per M and per form (rows(), sb_for())

    def rows(self, m):
        """The first m rows of x (a view) with their scales (block: scale_a
        column-major for those m rows, a copy)."""
        sx = self.sx if self.sx.numel() == 1 else self.sx[:m]
        if self.scaling == "block":
            return self.xq[:m], sx, sx.t().contiguous().t()
        sa = self.sa if self.sa.numel() == 1 else self.sa[:m]
        return self.xq[:m], sx, sa

    def sb_for(self, form):
        return BLOCK_FORMS[form](self.sw)


def find_block_form(qs, xq, sa, ref):
    """The first blockwise _scaled_mm form that runs on these tensors and
    agrees with ref (the dequantized GEMM + GLU) within CHECK_TOL: (form,
    scale_b, rel diff), or (None, None, why not)."""
    whys = []
    for form in BLOCK_FORMS:
        try:
            sb = qs.sb_for(form)
            y = block_scaled_mm_glu(form, xq, qs.wt, sa, sb)
            torch.cuda.synchronize()
            diff = rel_max_diff(y, ref)
            del y
            if diff <= CHECK_TOL:
                return form, sb, diff
            whys.append(f"{form}: differs from the dequantized reference by {diff:.1e}")
        except Exception as ex:  # noqa: BLE001 - a form this torch / GPU refuses
            whys.append(f"{form}: {short(ex)}")
    return None, None, "; ".join(whys)[:400]


@contextlib.contextmanager
def promote_env(value):
    """GATEDMLP_FP8_PROMOTE set to value (None: unset; KEEP: as it is) for
    the block, restored after (the library reads it when it plans a call,
    and plans again when the environment changes)."""
    if value is KEEP:
        yield
        return
    old = os.environ.get(PROMOTE_ENV)
    if value is None:
        os.environ.pop(PROMOTE_ENV, None)
    else:
        os.environ[PROMOTE_ENV] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(PROMOTE_ENV, None)
        else:
            os.environ[PROMOTE_ENV] = old


def time_us(fn, iters):
    return graph_time_us([fn] * CALLS, reps=iters)


def ab_time_us(fn_a, fn_b, reps):
    """Median per-call times of fn_a and fn_b (CALLS calls per CUDA graph),
    their graphs replayed in turn (a, b, a, b, ...), so that clock and
    temperature drift, which moved one call's separate timings by up to 5 %
    between runs, falls on both alike; for a bar of a few per cent between
    two forms of one kernel."""
    ga, gb = capture_graph([fn_a] * CALLS), capture_graph([fn_b] * CALLS)
    ta, tb = [], []
    for _ in range(reps):
        ta.append(replay_us(ga, CALLS))
        tb.append(replay_us(gb, CALLS))
    ta.sort()
    tb.sort()
    return ta[len(ta) // 2], tb[len(tb) // 2]


def fp8_out_scales(m, u, layout, device):
    """An FP8 Y's scales, [m, ceil(u / 128)] fp32: row-major, or MN-major
    (strides (1, align4(m)))."""
    g = ceil_div(u, 128)
    if layout == "mn":
        return torch.empty(g, ceil_div(m, 4) * 4, device=device).t()[:m]
    return torch.empty(m, g, device=device)


def bench_model(name: str, ms: list[int], iters: int, compile_timeout: float, promote: str,
                fp8_out: list[str]) -> list[dict]:
    k, u = MODELS[name]
    mmax = max(ms)
    modes = PROMOTE_MODES[promote]
    x16 = torch.randn(mmax, k, device="cuda", dtype=torch.bfloat16)
    w16 = torch.randn(2 * u, k, device="cuda", dtype=torch.bfloat16) * 0.02
    q = {s: Quantized(x16, w16, s) for s in SCALINGS}
    y = torch.empty(mmax, u, device="cuda", dtype=torch.bfloat16)
    y8 = torch.empty(mmax, u, device="cuda", dtype=torch.float8_e4m3fn)
    # Block scaling's check: the bf16 GEMM of the dequantized inputs + GLU
    # (independent of _scaled_mm's blockwise support).
    wdq16 = deq_w(q["block"].wq, q["block"].sw, True, torch.bfloat16)

    # _scaled_mm + GLU compiled: one function per scaling, recompiled per M
    # (dynamic=False), each compilation bounded by compile_timeout.
    compiled = {}
    if compile_timeout > 0:
        torch._dynamo.reset()
        cfg = torch._dynamo.config  # recompilations allowed per function: one per M
        limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, limit, max(getattr(cfg, limit), 2 * len(ms)))
        compiled = {s: torch.compile(scaled_mm_glu if s != "block" else block_scaled_mm_glu, dynamic=False)
                    for s in SCALINGS}

    rows = []
    for m in sorted(ms):
        x, out = x16[:m], y[:m]
        row = {"model": name, "M": m, "K": k, "U": u, "flops": 2 * m * k * 2 * u, "promote": promote}
        what = f"{name} M={m}"

        def put(key, fn, env=KEEP):
            try:
                with promote_env(env):
                    row[f"{key}_us"] = us = time_us(fn, iters)
                row[f"{key}_tflops"] = row["flops"] / (us * 1e-6) / 1e12
            except Exception as ex:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
                row[f"{key}_error"] = short(ex)

        put("bf16_gatedmlp", lambda: gatedmlp.gate_up(x, w16, out=out))
        for s in SCALINGS:
            qs = q[s]
            xq, sx, sa = qs.rows(m)
            # The baseline's GEMM + GLU (block: the form of _scaled_mm that
            # takes block scales, if any) and the reference the fp8 output
            # is checked against.
            mm = mm_glu = sb = None
            if s == "block":
                ref = glu(deq_x(xq, sx, True, torch.bfloat16) @ wdq16.t())
                form, sb, why = find_block_form(qs, xq, sa, ref)
                if form is None:
                    row["scaled_mm_block_error"] = "n/a: " + why
                else:
                    row["scaled_mm_block_form"] = form
                    mm = lambda xq=xq, sa=sa, sb=sb, f=form: block_scaled_mm(f, xq, qs.wt, sa, sb)  # noqa: E731
                    mm_glu = lambda xq=xq, sa=sa, sb=sb, f=form: block_scaled_mm_glu(f, xq, qs.wt, sa, sb)  # noqa: E731
                check_against = "the dequantized bf16 GEMM + GLU"
            else:
                sb = qs.sb
                mm = lambda xq=xq, sa=sa, qs=qs: scaled_mm(xq, qs.wt, sa, qs.sb)  # noqa: E731
                mm_glu = lambda xq=xq, sa=sa, qs=qs: scaled_mm_glu(xq, qs.wt, sa, qs.sb)  # noqa: E731
                try:
                    ref = mm_glu()
                except Exception as ex:  # noqa: BLE001
                    row[f"scaled_mm_{s}_error"] = short(ex)
                    ref = mm = mm_glu = None
                check_against = "_scaled_mm + GLU"
            # Correctness first, under each promotion setting, then timing.
            for suffix, env in modes:
                key = f"fp8_{s}{suffix}"
                try:
                    with promote_env(env):
                        got = gatedmlp.fp8_gate_up(xq, sx, qs.wq, qs.sw)
                except Exception as ex:  # noqa: BLE001 - gatedmlp failing is a failure of the run
                    row[f"{key}_error"] = short(ex)
                    fail(f"{what}: gatedmlp.fp8_gate_up ({s} scaling{promote_label(env)}) raised {short(ex)}")
                    continue
                if ref is not None:
                    row[f"{key}_check_rel_max_diff"] = diff = rel_max_diff(got, ref)
                    if not diff <= CHECK_TOL:  # also catches NaN
                        fail(f"{what}: max |fp8 gatedmlp - {check_against}| / max |{check_against}| ({s} scaling"
                             f"{promote_label(env)}) = {diff:.3e} > {CHECK_TOL}")
                put(key, lambda xq=xq, sx=sx, qs=qs: gatedmlp.fp8_gate_up(xq, sx, qs.wq, qs.sw, out=out), env)
                if suffix:
                    del got
                    continue
                # The FP8 Y (default promotion setting only): checked against
                # this call's bf16 Y, then timed.
                for layout in fp8_out:
                    okey = f"fp8_{s}_fp8out_{layout}"
                    ys = fp8_out_scales(m, u, layout, x.device)
                    try:
                        with promote_env(env):
                            q8, _ = gatedmlp.fp8_gate_up(xq, sx, qs.wq, qs.sw, out=y8[:m], y_scale=ys,
                                                         y_scale_layout=layout)
                        deq = q8.float() * ys.repeat_interleave(128, dim=1)[:, :u]
                        row[f"{okey}_check_rel_max_diff"] = diff = rel_max_diff(deq, got)
                        del deq
                        if not diff <= CHECK_FP8_OUT_TOL:
                            fail(f"{what}: max |FP8 Y x scale - bf16 Y| / max |bf16 Y| ({s} scaling, {layout} scales)"
                                 f" = {diff:.3e} > {CHECK_FP8_OUT_TOL}")
                    except Exception as ex:  # noqa: BLE001
                        row[f"{okey}_error"] = short(ex)
                        fail(f"{what}: gatedmlp.fp8_gate_up with an FP8 Y ({s}, {layout}) raised {short(ex)}")
                        continue
                    # Timed in turn with the bf16 Y (ab_time_us): the bar is a
                    # few per cent, the size of the drift between runs.
                    try:
                        with promote_env(env):
                            t16, t8 = ab_time_us(
                                lambda xq=xq, sx=sx, qs=qs: gatedmlp.fp8_gate_up(xq, sx, qs.wq, qs.sw, out=out),
                                lambda xq=xq, sx=sx, qs=qs, ys=ys, lay=layout: gatedmlp.fp8_gate_up(
                                    xq, sx, qs.wq, qs.sw, out=y8[:m], y_scale=ys, y_scale_layout=lay),
                                max(2 * iters, 40))
                        row[f"{okey}_us"] = t8
                        row[f"{okey}_tflops"] = row["flops"] / (t8 * 1e-6) / 1e12
                        row[f"{okey}_bf16_out_us"] = t16
                        row[f"{okey}_vs_bf16_out"] = t8 / t16
                        row[f"bar_{okey}_met"] = t8 / t16 <= BAR_FP8_OUT
                    except Exception as ex:  # noqa: BLE001
                        row[f"{okey}_error"] = short(ex)
                del got
            del ref
            if mm is not None:
                put(f"scaled_mm_{s}", mm)
                put(f"scaled_mm_glu_{s}", mm_glu)
            if s in compiled and mm is not None:
                cfn = compiled[s]
                args = (form, xq, qs.wt, sa, sb) if s == "block" else (xq, qs.wt, sa, qs.sb)
                t0 = time.perf_counter()
                try:
                    call_with_timeout(lambda: cfn(*args), compile_timeout)
                    torch.cuda.synchronize()
                    row[f"compile_{s}_s"] = time.perf_counter() - t0
                    put(f"scaled_mm_glu_compiled_{s}", lambda cfn=cfn, args=args: cfn(*args))
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
            if s != "tensor" and "fp8_tensor_us" in row:
                row[f"fp8_{s}_vs_fp8_tensor"] = row["fp8_tensor_us"] / t
            for suffix, _ in modes[1:]:
                if f"fp8_{s}{suffix}_us" in row:
                    row[f"fp8_{s}{suffix}_vs_default"] = row[f"fp8_{s}{suffix}_us"] / t
        if "fp8_block_vs_fp8_tensor" in row:
            row["bar_block_vs_tensor_met"] = row["fp8_block_vs_fp8_tensor"] >= BAR_BLOCK_VS_TENSOR
        rows.append(row)
        print_row(row)
    del x16, w16, q, y, y8, compiled, wdq16
    torch._dynamo.reset()
    free_memory()
    return rows


def promote_label(env):
    return "" if env is KEEP else f", {PROMOTE_ENV}={'1' if env == '1' else 'unset'}"


def print_row(row):
    def col(key, label):
        if f"{key}_us" in row:
            return f"  {label} {row[f'{key}_us']:8.1f} us {row[f'{key}_tflops']:6.1f} TF"
        err = row.get(f"{key}_error", "not run")
        return f"  {label}: {'n/a' if err.startswith('n/a') else err}"

    def ratio(key):
        return row.get(key, float("nan"))

    modes = PROMOTE_MODES[row.get("promote", "env")]
    line = f"{row['model']:9s} M={row['M']:5d}" + col("bf16_gatedmlp", "bf16 gatedmlp")
    for s in SCALINGS:
        line += f"\n   {s:6s}" + col(f"fp8_{s}", "fp8 gatedmlp")
        for key, label in ((f"scaled_mm_{s}", "_scaled_mm"), (f"scaled_mm_glu_{s}", "+glu"),
                           (f"scaled_mm_glu_compiled_{s}", "+glu compiled")):
            line += col(key, label)
        for suffix, env in modes[1:]:
            line += "\n         " + col(f"fp8_{s}{suffix}", f"fp8 gatedmlp {PROMOTE_ENV}={env}")
            line += f"  time =1 / unset {ratio(f'fp8_{s}{suffix}_vs_default'):5.2f}x"
            if s == "block":
                line += " (block scales promote either way)"
        if f"fp8_{s}_us" in row:
            line += f"\n          fp8 / bf16 gatedmlp {ratio(f'fp8_{s}_vs_bf16_gatedmlp'):5.2f}x"
            if f"bar_{s}_vs_bf16_met" in row:
                line += f" (bar {BAR_VS_BF16}x: {'met' if row[f'bar_{s}_vs_bf16_met'] else 'MISSED'})"
            if f"fp8_{s}_vs_scaled_mm" in row:
                line += f"  vs _scaled_mm {ratio(f'fp8_{s}_vs_scaled_mm'):5.2f}x"
            else:
                line += "  vs _scaled_mm   n/a"
            if f"bar_{s}_vs_scaled_mm_met" in row:
                line += f" (bar {BAR_VS_MM}x: {'met' if row[f'bar_{s}_vs_scaled_mm_met'] else 'MISSED'})"
            line += (f"  vs +glu {ratio(f'fp8_{s}_vs_scaled_mm_glu'):5.2f}x"
                     f"  vs +glu compiled {ratio(f'fp8_{s}_vs_scaled_mm_glu_compiled'):5.2f}x")
            if s == "block":
                line += f"  vs fp8 tensor {ratio('fp8_block_vs_fp8_tensor'):5.2f}x"
                if "bar_block_vs_tensor_met" in row:
                    line += f" (bar {BAR_BLOCK_VS_TENSOR}x: {'met' if row['bar_block_vs_tensor_met'] else 'MISSED'})"
            line += f"  check {ratio(f'fp8_{s}_check_rel_max_diff'):.1e}"
            for layout in ("row", "mn"):
                okey = f"fp8_{s}_fp8out_{layout}"
                if f"{okey}_us" in row or f"{okey}_error" in row:
                    line += "\n         " + col(okey, f"FP8 Y ({layout} scales)")
                    if f"{okey}_vs_bf16_out" in row:
                        line += (f"  time / bf16 Y {row[f'{okey}_vs_bf16_out']:5.3f}x (bar <= {BAR_FP8_OUT}x: "
                                 f"{'met' if row[f'bar_{okey}_met'] else 'MISSED'})"
                                 f"  check {ratio(f'{okey}_check_rel_max_diff'):.1e}")
            for suffix, _ in modes[1:]:
                line += f" check{suffix} {ratio(f'fp8_{s}{suffix}_check_rel_max_diff'):.1e}"
    print(line, flush=True)


def summary(rows):
    """The bars' table: one line per model and M."""
    both = any(len(PROMOTE_MODES[r.get("promote", "env")]) > 1 for r in rows)
    print(f"\nbars: fp8 / bf16 gatedmlp >= {BAR_VS_BF16}x at M >= {BAR_VS_BF16_M}; fp8 gatedmlp / _scaled_mm "
          f">= {BAR_VS_MM}x at M >= {BAR_VS_MM_M} (same scaling); fp8 block / fp8 tensor (gatedmlp's own) >= "
          f"{BAR_BLOCK_VS_TENSOR}x; FP8 Y time / bf16 Y's <= {BAR_FP8_OUT}x" +
          (f"; promote: time with {PROMOTE_ENV}=1 / unset" if both else ""))
    head = [f"{s + ' vs bf16':>14s} {s + ' vs mm':>14s}" for s in SCALINGS]
    head[-1] += f" {'block vs tensor':>15s}"
    if both:
        head.append(" ".join(f"{s + ' promote':>16s}" for s in SCALINGS))
    print(f"{'model':9s} {'M':>6s} | " + " | ".join(head))
    for r in rows:
        groups = []
        for s in SCALINGS:
            cells = []
            for key, bar in ((f"fp8_{s}_vs_bf16_gatedmlp", f"bar_{s}_vs_bf16_met"),
                             (f"fp8_{s}_vs_scaled_mm", f"bar_{s}_vs_scaled_mm_met")):
                v = r.get(key)
                mark = "" if bar not in r else (" ok" if r[bar] else " MISS")
                cells.append(f"{(f'{v:.2f}x' if v is not None else 'n/a') + mark:>14s}")
            if s == "block":
                v = r.get("fp8_block_vs_fp8_tensor")
                bar = r.get("bar_block_vs_tensor_met")
                mark = "" if bar is None else (" ok" if bar else " MISS")
                cells.append(f"{(f'{v:.2f}x' if v is not None else 'n/a') + mark:>15s}")
            groups.append(" ".join(cells))
        if both:
            cells = []
            for s in SCALINGS:
                v = r.get(f"fp8_{s}_promote_vs_default")
                cells.append(f"{f'{v:.2f}x' if v is not None else 'n/a':>16s}")
            groups.append(" ".join(cells))
        # The FP8 Y: time / the bf16 Y's, per scaling and scale layout.
        cells = []
        for s in SCALINGS:
            for layout in ("row", "mn"):
                v = r.get(f"fp8_{s}_fp8out_{layout}_vs_bf16_out")
                if v is not None:
                    ok = r[f"bar_fp8_{s}_fp8out_{layout}_met"]
                    cells.append(f"FP8 Y {s}/{layout} {v:.3f}x{' ok' if ok else ' MISS'}")
        if cells:
            groups.append(" ".join(cells))
        print(f"{r['model']:9s} {r['M']:6d} | " + " | ".join(groups))


# ---------------------------------------------------------------- accuracy
def rel_errors(y, ref):
    d = (y.double() - ref).abs()
    return (d.max() / ref.abs().max().clamp_min(1e-300)).item(), (d.mean() / ref.abs().mean().clamp_min(1e-300)).item()


def accuracy_model(name: str, m: int, promote: str) -> list[dict]:
    k, u = MODELS[name]
    modes = PROMOTE_MODES[promote]
    x16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w16 = torch.randn(2 * u, k, device="cuda", dtype=torch.bfloat16) * 0.02
    out = []
    for s in SCALINGS:
        qs = Quantized(x16, w16, s)
        blocked = s == "block"
        xd = deq_x(qs.xq, qs.sx, blocked, torch.float64)
        wd = deq_w(qs.wq, qs.sw, blocked, torch.float64)
        h = xd @ wd.T
        del xd, wd
        ref = F.silu(h[:, :u]) * h[:, u:]
        del h
        row = {"model": name, "M": m, "K": k, "U": u, "scaling": s, "promote": promote}
        for suffix, env in modes:
            try:
                with promote_env(env):
                    y = gatedmlp.fp8_gate_up(qs.xq, qs.sx, qs.wq, qs.sw)
                row[f"gatedmlp{suffix}_max_rel"], row[f"gatedmlp{suffix}_mean_rel"] = rel_errors(y, ref)
                del y
            except Exception as ex:  # noqa: BLE001
                row[f"gatedmlp{suffix}_error"] = short(ex)
                fail(f"accuracy {name} M={m} ({s}{promote_label(env)}): gatedmlp.fp8_gate_up raised {short(ex)}")
        try:
            if blocked:
                # cuBLAS's blockwise kernels give bf16 only.
                xq, _, sa = qs.rows(m)
                form, sb, why = find_block_form(qs, xq, sa, ref)
                if form is None:
                    raise RuntimeError("n/a: " + why)
                h32 = block_scaled_mm(form, xq, qs.wt, sa, sb).float()
                row["scaled_mm_out"] = "bf16"
                row["scaled_mm_form"] = form
            else:
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
            row["scaled_mm_error"] = str(ex)[:400] if str(ex).startswith("n/a") else short(ex)
        out.append(row)

        def cell(key):
            if f"{key}_max_rel" in row:
                return f"max {row[f'{key}_max_rel']:.3e} mean {row[f'{key}_mean_rel']:.3e}"
            err = row.get(f"{key.split('_glu')[0]}_error", "not run")
            return "n/a" if err.startswith("n/a") else err

        line = f"{name:9s} M={m:5d} {s:6s}  fp8 gatedmlp (bf16 out): {cell('gatedmlp')}"
        for suffix, env in modes[1:]:
            line += f"   {PROMOTE_ENV}={env}: {cell('gatedmlp' + suffix)}"
        print(line + f"   _scaled_mm ({row.get('scaled_mm_out', '-')} out) + GLU fp32 -> bf16: "
              f"{cell('scaled_mm_glu')}", flush=True)
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
    ap.add_argument("--promote", choices=list(PROMOTE_MODES), default="env",
                    help=f"{PROMOTE_ENV} for the fp8 gatedmlp calls: env (as it is), off (unset), on (1), both "
                         "(each measurement twice, unset and 1, and their ratio)")
    ap.add_argument("--fp8-out", default="row",
                    help="FP8 Y scale layouts to time against the bf16 Y: row, mn, row,mn or none")
    ap.add_argument("--json")
    a = ap.parse_args()
    fp8_out = [] if a.fp8_out == "none" else a.fp8_out.split(",")
    if any(v not in ("row", "mn") for v in fp8_out):
        ap.error(f"--fp8-out takes row, mn (comma-separated) or none, got {a.fp8_out!r}")
    models = a.model.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    ms = [int(v) for v in a.m.split(",")]
    torch.manual_seed(0)
    dev = torch.cuda.get_device_name(0)
    cap = torch.cuda.get_device_capability(0)
    env_promote = os.environ.get(PROMOTE_ENV)
    print(f"device {dev} (sm_{cap[0]}{cap[1]}); torch {torch.__version__}; gatedmlp {gatedmlp.__version__}; "
          f"{CALLS} calls per CUDA graph, median of {a.iters} replays; --promote {a.promote} ({PROMOTE_ENV} "
          f"{'unset' if env_promote is None else repr(env_promote)} in the environment)", flush=True)
    result = {"device": dev, "capability": list(cap), "torch": torch.__version__, "gatedmlp": gatedmlp.__version__,
              "iters": a.iters, "calls_per_graph": CALLS, "promote": a.promote, "promote_env": env_promote}
    if not hasattr(gatedmlp, "fp8_gate_up"):
        fail("this gatedmlp has no fp8_gate_up (the FP8 activations API)")
        return 1
    rows, acc = [], []
    with torch.no_grad():
        for name in models:
            rows += bench_model(name, ms, a.iters, a.compile_timeout, a.promote, fp8_out)
        summary(rows)
        if a.acc_m > 0:
            print(f"\naccuracy at M = {a.acc_m} against float64 on the dequantized inputs (silu): max |y - ref| / "
                  "max |ref|, mean |y - ref| / mean |ref|", flush=True)
            for name in models:
                acc += accuracy_model(name, a.acc_m, a.promote)
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
