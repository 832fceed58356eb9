#!/usr/bin/env python3
"""gatedmlp as a drop-in for PyTorch / Hugging Face: host cost, whole models, decode shapes.

Every gatedmlp number is measured next to its PyTorch counterpart in the same
run, on the same tensors, so the ratios hold even when the absolute numbers
drift between runs or machines. Three sections (``--sections``):

host   Host (CPU) cost of one call of each entry point, in µs, on a problem so
       small (one row, K = U = 256, bf16) that the GPU finishes each call
       faster than Python issues the next: synchronize, t0, N calls, t1,
       synchronize; host µs = (t1 - t0) / N. No sync inside the loop, so the
       loop measures the issuing alone. The entry points run round-robin (the
       starting one rotates each repeat) so that clock or thermal drift hits all
       alike; the median over repeats is reported, with the ratio to
       F.linear(x, w) on the same tensors. "wall/host" is (time including the
       final sync) / (host time): near 1 means the GPU kept up; well above 1
       means the queue filled and the number is the GPU's, not the host's
       (flagged "GPU-bound?"). Bars: each gatedmlp Python entry point
       <= 1.25x F.linear; GatedMLP(x) (GatedMLP.from_module(mlp)) and the
       module patch_model swaps in <= the Hugging Face LlamaMLP(x) they
       replace. On sm_90 the FP8 entry points too (gatedmlp.fp8_gate_up
       with a bf16 or an FP8 Y, gatedmlp.torch.fp8_gate_up; per-token x,
       per-channel w), under the same 1.25x bar. Calls run under
       torch.inference_mode() with the garbage collector off. Every gatedmlp
       entry's output is checked first (the FP8 ones against float64 on
       their e4m3 inputs, within 2^-4). The quantized entry points too (int4
       g64, bf16 scales and biases), under the same 1.25x bar, checked
       against float64 on the dequantized weights.

model  Transformers models with 8B-sized layers (hidden 4096, intermediate
       14336; 4 layers, vocab 32000, bf16, random weights, SDPA attention
       where the model takes it, no downloads), unpatched and patched with
       gatedmlp.torch.patch_model:
         eager, one token        model(ids[:, :1], use_cache=False)
         eager, --seq tokens     model(ids, use_cache=False)          (4096)
         graph, one token        the eager one-token forward captured by hand
                                 in a torch.cuda.CUDAGraph, replayed
         compiled, one token     torch.compile(model, mode="reduce-overhead",
                                 fullgraph=True), i.e. Inductor with CUDA graph
                                 trees (only for --compile-models: compiling
                                 costs minutes)
       Both variants live in one model: patch_model swaps modules by name, the
       originals are kept, and the script swaps them back and forth, so eager
       and graph timings interleave unpatched/patched across repeats. The
       compiled variants are compiled and timed one after the other (each
       needs its own compilation). CUDA events around each call, warm-up
       first, median. The logits are checked: one float32 forward of the
       unpatched model (same weights upcast, TF32 off) is the reference, and
       the patched logits of every mode must satisfy
       err(patched) <= 2 * err(unpatched, same mode) + 1e-3 (relative
       Frobenius errors against the reference); the one-token reference is
       position 0 of the long forward (causal). Bars: patched/unpatched
       <= 1.0 eager, < 1.0 with CUDA graphs (hand-captured and compiled).

small  Decode-sized gate/up problems (K x U of 896x4864, 1024x2816, 2048x8192,
       3072x8192; M = 1, 2, 4, 8, 16; bf16). For each path a CUDA graph holds R
       calls (default 20) on rotating inputs and, when the weights fit in L2,
       rotating weight copies (together over --l2-mb) so that the weights come
       from HBM as in a real model; the graph is replayed many times, timed
       with CUDA events, and reported in µs per call:
         torch.mm            torch.mm(x, w.T) into [M, 2U] (the GEMM alone)
         mm + eager          the GEMM, then silu(g) * u as PyTorch ops
         mm + compiled       the same function through torch.compile (default
                             mode, static shapes), captured after warm-up
         gatedmlp            gatedmlp.gate_up(x, w, out=y)
         gt.gate_up          gatedmlp.torch.gate_up(x, w, out=y)
       Bar: gatedmlp / torch.mm <= 1.0. The outputs the replays wrote (first
       and last call of the graph) are checked against a float64 reference:
       err(gatedmlp) <= 2 * err(unfused bf16 mm + silu*mul) + 1e-6.

Run (GPU; gatedmlp importable, e.g. PYTHONPATH=build/python):

    python scripts/bench_dropin.py                               # everything, defaults
    python scripts/bench_dropin.py --sections host,small --quick
    python scripts/bench_dropin.py --sections model --models llama,qwen3,gemma2 --compile-models none
    python scripts/bench_dropin.py --json /tmp/dropin.json
    python scripts/bench_dropin.py --dry-run                     # the plan; touches no GPU
    python scripts/bench_dropin.py --selftest-cpu                # tiny models of every family on CPU

Prints the device and versions first, progress lines while it runs, then one
markdown table per section. Exits 1 if a correctness check fails or a
section errors; a missed speed bar is printed as MISSED and does not fail
the run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from torch import nn

# The references the tests use (tests/python/refs.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from refs import moe_reference  # noqa: E402

BF16 = torch.bfloat16

# Hugging Face families: config class, then overrides for the 8B-sized layers.
# Heads follow each family's own 7-12B models (head_dim 128, or 256 for Gemma).
# "head_dim" is given only to the configs that have that field; the others
# derive it as hidden / heads, which is the same number here.
FAMILIES = {
    "llama": ("LlamaConfig", dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128)),
    "mistral": ("MistralConfig", dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128)),
    "qwen2": ("Qwen2Config", dict(num_attention_heads=32, num_key_value_heads=8)),
    "qwen3": ("Qwen3Config", dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128)),
    "gemma": ("GemmaConfig", dict(num_attention_heads=16, num_key_value_heads=16, head_dim=256)),
    "gemma2": ("Gemma2Config", dict(num_attention_heads=16, num_key_value_heads=8, head_dim=256)),
    "gemma3": ("Gemma3TextConfig", dict(num_attention_heads=16, num_key_value_heads=8, head_dim=256)),
    # Phi-3 and OLMo 2: their default end-of-text ids lie outside the small vocabulary.
    "phi3": ("Phi3Config", dict(num_attention_heads=32, num_key_value_heads=32, eos_token_id=2)),
    # Granite 3 8B's multipliers: they scale the residual stream around the MLP.
    "granite": ("GraniteConfig", dict(num_attention_heads=32, num_key_value_heads=8, embedding_multiplier=12.0,
                                      residual_multiplier=0.22, attention_multiplier=0.0078125,
                                      logits_scaling=16.0)),
    "olmo2": ("Olmo2Config", dict(num_attention_heads=32, num_key_value_heads=32, eos_token_id=2)),
}
DEFAULT_MODELS = "llama,qwen3,gemma,phi3"
SMALL_SHAPES = [(896, 4864), (1024, 2816), (2048, 8192), (3072, 8192)]  # K x U
SMALL_MS = [1, 2, 4, 8, 16]

HOST_BAR = 1.25      # gatedmlp Python entry points vs F.linear
LOGITS_ATOL = 1e-3   # slack of the logits rule: bf16 rounding of the logits alone is ~1e-3
GEMM_ATOL = 1e-6     # slack of the gate/up rule (the library's tests use the same)

FAILURES: list[str] = []


def log(*a):
    print("#", *a, flush=True)


def fail(msg: str):
    FAILURES.append(msg)
    print(f"FAIL {msg}", file=sys.stderr, flush=True)


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def rel_err(a, ref) -> float:
    """||a - ref|| / ||ref||, accumulated in float64 (float32 differences for
    float32 references: the logits are too big to hold in float64 twice)."""
    dt = torch.float64 if ref.dtype == torch.float64 else torch.float32
    ref = ref.to(dt)
    d = a.to(dt) - ref
    num = torch.linalg.vector_norm(d, dtype=torch.float64)
    den = torch.linalg.vector_norm(ref, dtype=torch.float64)
    return float(num / den)


def rule_ok(e_new: float, e_old: float, atol: float, t=None) -> bool:
    """The tolerance rule: the new path's error at most twice the old one's, plus slack."""
    finite = True if t is None else bool(torch.isfinite(t).all())
    return finite and math.isfinite(e_new) and e_new <= 2 * e_old + atol


def bar_text(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def md_table(header, rows) -> str:
    rows = [[str(v) for v in r] for r in rows]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def free_memory(dev):
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


def timed_calls_ms(fn, n, dev):
    """Milliseconds of each of n calls of fn: CUDA events around each call on a
    GPU (so a host-bound call counts its issuing, a GPU-bound one its kernels),
    perf_counter on the CPU (selftest)."""
    if dev.type != "cuda":
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(dev)
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def load_gatedmlp():
    """(gatedmlp, gatedmlp.torch, patch_model or None). patch_model is
    exported from gatedmlp.torch (written in gatedmlp/hf.py)."""
    import gatedmlp
    import gatedmlp.torch as gt
    patch = getattr(gt, "patch_model", None)
    if patch is None:
        try:
            from gatedmlp.hf import patch_model as patch
        except ImportError:
            patch = None
    return gatedmlp, gt, patch


# ============================================================== section: host
def host_section(args, dev, G, results, patch_model=None):
    """Host µs per call of each entry point. G is (gatedmlp, gt) or None (CPU
    selftest: the torch entries only)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    k = u = 256
    torch.manual_seed(0)
    x = torch.randn(1, k, device=dev).to(BF16)
    x3 = x.view(1, 1, k)                        # [batch, seq, hidden], as a model calls its MLP
    w = (torch.randn(2 * u, k, device=dev) / k**0.5).to(BF16)
    wg, wu = w[:u], w[u:]                       # row slices of w: contiguous, no copy
    y = torch.empty(1, u, device=dev, dtype=BF16)
    mlp = LlamaMLP(LlamaConfig(hidden_size=k, intermediate_size=u)).to(device=dev, dtype=BF16).eval()
    # A Mixture-of-Experts layer's experts at one token (decode), as transformers runs them (eager) and
    # as gatedmlp does: Qwen3-MoE's module, small enough that the host is all of the time.
    moe = _hf_moe_experts(dev, hidden=k, inter=MOE_HOST["inter"], experts=MOE_HOST["experts"])
    top = MOE_HOST["top_k"]
    moe_ids = torch.randperm(MOE_HOST["experts"], device=dev)[:top].view(1, top)
    moe_wts = torch.softmax(torch.randn(1, top, device=dev), dim=-1)
    moe_impls = _hf_moe_impls(moe, x, moe_ids, moe_wts)  # {implementation: its own copy of the module}
    impl0 = next(iter(moe_impls))

    def linear_chunk():
        g, up = F.linear(x, w).chunk(2, dim=-1)
        return F.silu(g) * up

    entries = {  # name -> (call, kind); kind "gatedmlp" gets the 1.25x bar
        "python loop (lambda: None)": (lambda: None, "floor"),
        "torch.mm(x, w.T)": (lambda: torch.mm(x, w.T), "torch"),
        "F.linear(x, w)": (lambda: F.linear(x, w), "base"),
        "2x F.linear + silu*mul": (lambda: F.silu(F.linear(x, wg)) * F.linear(x, wu), "torch"),
        "F.linear + chunk + silu*mul": (linear_chunk, "torch"),
        "HF LlamaMLP(x)": (lambda: mlp(x3), "hf"),
    }
    for impl, m in moe_impls.items():  # the models' default first: the MoE rows' bar
        entries[f"HF Qwen3MoeExperts(x, ids, w) ({impl})"] = (
            lambda m=m: m(x, moe_ids, moe_wts), "hf_moe" if impl == impl0 else "torch")
    gmlp = pmlp = None
    if G is not None:
        # Built outside inference mode, as a model is loaded: parameters made
        # under inference_mode would be inference tensors.
        gmlp = G[1].GatedMLP.from_module(mlp).eval()
        gmoe = G[1].MoEExperts.from_module(moe).eval()
        # What patch_model puts in a model (a GatedMLP subclass; its forward
        # may do more), swapped into a holder so that `mlp` stays as it is.
        if patch_model is not None:
            holder = nn.Module()
            holder.mlp = mlp
            patch_model(holder)
            pmlp = holder.mlp if holder.mlp is not mlp else None
    checks = []
    with torch.inference_mode():
        # float64 references, for the correctness checks of the gatedmlp entries
        x64, w64 = x.double(), w.double()
        ref_gu = F.silu(x64 @ w64[:u].T) * (x64 @ w64[u:].T)
        e_unfused = rel_err(linear_chunk(), ref_gu)
        wd64 = mlp.down_proj.weight.double()
        ref_mlp = (F.silu(x64 @ mlp.gate_proj.weight.double().T) * (x64 @ mlp.up_proj.weight.double().T)) @ wd64.T
        e_hf = rel_err(mlp(x3).view(1, k), ref_mlp)
        ref_moe = moe_reference(x, moe_ids, moe_wts, moe.gate_up_proj, moe.down_proj, None, None, "silu", 0, "gate")
        e_hf_moe = rel_err(moe_impls["eager"](x, moe_ids, moe_wts), ref_moe)
        if G is not None:
            gm, gt = G
            op = torch.ops.gatedmlp.gate_up
            entries.update({
                "gatedmlp.gate_up(x, w, out=y)": (lambda: gm.gate_up(x, w, out=y), "gatedmlp"),
                "gatedmlp.gate_up(x, w)": (lambda: gm.gate_up(x, w), "gatedmlp"),
                "gatedmlp.torch.gate_up(x, w)": (lambda: gt.gate_up(x, w), "gatedmlp"),
                "gatedmlp.torch.gate_up(x, w, out=y)": (lambda: gt.gate_up(x, w, out=y), "gatedmlp"),
                # the raw op, every argument positional as GatedMLP.forward passes them
                "torch.ops.gatedmlp.gate_up": (lambda: op(x, w, None, None, None, ""), "gatedmlp"),
                "GatedMLP(x)": (lambda: gmlp(x3), "gatedmlp_module"),
            })
            if pmlp is not None:
                entries["patch_model's module(x)"] = (lambda: pmlp(x3), "gatedmlp_module")
            # The MoE entry points against the experts module they replace (three to four launches each:
            # gate/up, down, the sum over the top-k; the device-side index check adds two).
            w13, w2 = gmoe.w13, gmoe.w2
            entries.update({
                "gatedmlp.moe_mlp(..., check_indices=False)": (
                    lambda: gm.moe_mlp(x, moe_ids, moe_wts, w13, w2, check_indices=False), "gatedmlp_moe"),
                "gatedmlp.moe_mlp(..., check_indices='async')": (
                    lambda: gm.moe_mlp(x, moe_ids, moe_wts, w13, w2, check_indices="async"), "gatedmlp_moe"),
                "MoEExperts(x, ids, w)": (lambda: gmoe(x, moe_ids, moe_wts), "gatedmlp_moe"),
            })
            fp8_ref = None
            if torch.cuda.get_device_capability(dev) == (9, 0):
                # FP8 activations and weights (Hopper), per-token x and
                # per-channel w scales, the bf16 Y allocated or given; the
                # FP8 Y with its scales. Checked against float64 on the
                # dequantized e4m3 inputs.
                xq, sx = gm.quantize_fp8(x.float(), "row")
                wq, sw = gm.quantize_fp8(w.float(), "row")
                xd, wd = xq.double() * sx.double(), wq.double() * sw.double().reshape(-1, 1)
                fp8_ref = F.silu(xd @ wd[:u].T) * (xd @ wd[u:].T)
                y8 = torch.empty(1, u, device=dev, dtype=torch.float8_e4m3fn)
                ys8 = torch.empty(1, 2, device=dev)
                entries.update({
                    "gatedmlp.fp8_gate_up(xq, sx, wq, sw, out=y)": (
                        lambda: gm.fp8_gate_up(xq, sx, wq, sw, out=y), "gatedmlp_fp8"),
                    "gatedmlp.fp8_gate_up(xq, sx, wq, sw)": (lambda: gm.fp8_gate_up(xq, sx, wq, sw), "gatedmlp_fp8"),
                    "gatedmlp.torch.fp8_gate_up(xq, sx, wq, sw)": (
                        lambda: gt.fp8_gate_up(xq, sx, wq, sw), "gatedmlp_fp8"),
                    "gatedmlp.fp8_gate_up(..., out=y8, y_scale=s) (FP8 Y)": (
                        lambda: gm.fp8_gate_up(xq, sx, wq, sw, out=y8, y_scale=ys8), "gatedmlp_fp8"),
                })
            # Quantized weights (MLX's affine int4, groups of 64, bf16 scales and
            # biases: a bf16 model's own), checked against float64 on the
            # dequantized weights (the kernel rounds them to bf16: within 2^-6).
            # Names of their own: the FP8 entries' lambdas read wq and sw.
            qw, qs, qb = gm.quantize(w.float().cpu(), group_size=64, bits=4)
            qs, qb = qs.to(BF16), qb.to(BF16)
            wdq = gm.dequantize(qw, qs.float(), qb.float(), group_size=64, bits=4).double().to(dev)
            quant_ref = F.silu(x64 @ wdq[:u].T) * (x64 @ wdq[u:].T)
            qw, qs, qb = qw.view(torch.int32).to(dev), qs.to(dev), qb.to(dev)
            tw, tp = gm.tile(qw, qs, qb, group_size=64)  # the same weights in the tiled order (int4t)
            entries.update({
                "gatedmlp.quantized_gate_up(x, wq, s, b, out=y) (int4)": (
                    lambda: gm.quantized_gate_up(x, qw, qs, qb, out=y), "gatedmlp_quant"),
                "gatedmlp.quantized_gate_up(x, wq, s, b) (int4)": (
                    lambda: gm.quantized_gate_up(x, qw, qs, qb), "gatedmlp_quant"),
                "gatedmlp.torch.quantized_gate_up(x, wq, s, b) (int4)": (
                    lambda: gt.quantized_gate_up(x, qw, qs, qb), "gatedmlp_quant"),
                "gatedmlp.quantized_gate_up(x, wt, pairs, out=y, tiled=True) (int4t)": (
                    lambda: gm.quantized_gate_up(x, tw, tp, out=y, group_size=64, tiled=True), "gatedmlp_quant"),
                "gatedmlp.quantized_gate_up(x, wt, pairs, tiled=True) (int4t)": (
                    lambda: gm.quantized_gate_up(x, tw, tp, group_size=64, tiled=True), "gatedmlp_quant"),
                "gatedmlp.torch.quantized_gate_up(x, wt, pairs, tiled=True) (int4t)": (
                    lambda: gt.quantized_gate_up(x, tw, tp, group_size=64, tiled=True), "gatedmlp_quant"),
            })
            for name, (fn, kind) in entries.items():
                if kind == "gatedmlp_quant":
                    out = fn()
                    e = rel_err(out, quant_ref)
                    checks.append(dict(what=f"host {name} vs float64 on the dequantized weights", err=e,
                                       err_unfused=e_unfused, ok=e <= 2 ** -6))
            for name, (fn, kind) in entries.items():
                if kind == "gatedmlp":
                    out = fn()
                    e = rel_err(out, ref_gu)
                    ok = rule_ok(e, e_unfused, GEMM_ATOL, out)
                    checks.append(dict(what=f"host {name}", err=e, err_unfused=e_unfused, ok=ok))
            for name, (fn, kind) in entries.items():
                if kind == "gatedmlp_fp8":
                    out = fn()
                    if isinstance(out, tuple):  # the FP8 Y and its one scale per row and 128 columns
                        out = out[0].float() * out[1].repeat_interleave(128, dim=1)[:, :u]
                    e = rel_err(out, fp8_ref)
                    checks.append(dict(what=f"host {name} vs float64 on the e4m3 inputs", err=e, err_unfused=e_unfused,
                                       ok=e <= 2 ** -4))
            for name, (fn, kind) in entries.items():
                if kind == "gatedmlp_moe":
                    out = fn()
                    e = rel_err(out, ref_moe)
                    checks.append(dict(what=f"host {name} vs float64 experts", err=e, err_unfused=e_hf_moe,
                                       ok=rule_ok(e, e_hf_moe, GEMM_ATOL, out)))
            for name, (fn, kind) in entries.items():
                if kind == "gatedmlp_module":
                    out = fn().view(1, k)
                    e = rel_err(out, ref_mlp)
                    checks.append(dict(what=f"host {name} vs float64 MLP", err=e, err_unfused=e_hf,
                                       ok=rule_ok(e, e_hf, GEMM_ATOL, out)))
        for c in checks:
            if not c["ok"]:
                fail(f"{c['what']}: rel err {c['err']:.3e} vs unfused {c['err_unfused']:.3e}")
        sync(dev)

        n, reps = args.host_calls, args.host_reps
        names = list(entries)
        host = {nm: [] for nm in names}
        wall = {nm: [] for nm in names}
        log(f"host: {len(names)} entry points x {reps} repeats x {n} calls, round-robin")
        gc_on = gc.isenabled()
        gc.disable()  # a collection inside one entry's loop would charge it alone
        try:
            for r in range(-args.host_warmup_reps, reps):
                start = r % len(names)
                for nm in names[start:] + names[:start]:
                    fn = entries[nm][0]
                    sync(dev)
                    t0 = time.perf_counter()
                    for _ in range(n):
                        fn()
                    t1 = time.perf_counter()
                    sync(dev)
                    t2 = time.perf_counter()
                    if r >= 0:  # negative r: warm-up repeats, discarded
                        host[nm].append((t1 - t0) / n * 1e6)
                        wall[nm].append((t2 - t0) / (t1 - t0))
        finally:
            if gc_on:
                gc.enable()

    base = median(host["F.linear(x, w)"])
    hf = median(host["HF LlamaMLP(x)"])
    hf_moe = median(host[f"HF Qwen3MoeExperts(x, ids, w) ({impl0})"])
    rows = []
    for nm in names:
        kind = entries[nm][1]
        us = median(host[nm])
        row = dict(entry=nm, kind=kind, host_us=us, ratio_flinear=us / base, wall_over_host=median(wall[nm]),
                   samples=len(host[nm]))
        if kind in ("gatedmlp", "gatedmlp_fp8", "gatedmlp_quant"):
            row["bar"] = f"<= {HOST_BAR}x F.linear"
            row["bar_ok"] = us <= HOST_BAR * base
        elif kind == "gatedmlp_module":
            row["bar"] = "<= HF LlamaMLP"
            row["bar_ok"] = us <= hf
            row["ratio_hf"] = us / hf
        elif kind == "gatedmlp_moe":
            row["bar"] = f"<= HF experts ({impl0})"
            row["bar_ok"] = us <= hf_moe
            row["ratio_hf"] = us / hf_moe
        rows.append(row)
    results["host"] = dict(problem=dict(m=1, k=k, u=u, dtype="bf16"), moe=dict(MOE_HOST, hidden=k), calls=n,
                           repeats=reps, rows=rows, checks=checks)
    log("host: done")


def host_table(res):
    rows = []
    for r in res["rows"]:
        # The empty loop is too short for the ratio to mean anything (the sync alone shows).
        note = "GPU-bound?" if r["wall_over_host"] > 1.15 and r["kind"] != "floor" else ""
        bar = ""
        if "bar" in r:
            bar = f"{r['bar']}: {bar_text(r['bar_ok'])}"
            if "ratio_hf" in r:
                bar += f" ({r['ratio_hf']:.2f}x HF)"
        rows.append([r["entry"], f"{r['host_us']:.2f}", f"{r['ratio_flinear']:.2f}x", f"{r['wall_over_host']:.2f}",
                     bar, note])
    p, q = res["problem"], res["moe"]
    title = (f"### Host µs per call (M={p['m']}, K={p['k']}, U={p['u']}, bf16; the MoE rows one token, H={q['hidden']}, "
             f"I={q['inter']}, E={q['experts']}, top-{q['top_k']}; median of {res['repeats']} repeats x "
             f"{res['calls']} calls)")
    return title + "\n\n" + md_table(["entry point", "host µs", "x F.linear", "wall/host", "bar", "note"], rows)


MOE_HOST = dict(inter=128, experts=16, top_k=4)  # the host section's experts (hidden = its K)


def _hf_moe_experts(dev, *, hidden, inter, experts):
    """transformers' Qwen3-MoE experts module (its eager loop over the experts hit), random bf16 weights."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    cfg = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts)
    m = Qwen3MoeExperts(cfg)
    with torch.no_grad():
        m.gate_up_proj.normal_(0, hidden ** -0.5)
        m.down_proj.normal_(0, inter ** -0.5)
    return m.to(device=dev, dtype=BF16).eval()


def _hf_moe_impls(moe, x, ids, wts):
    """{implementation: a copy of moe set to it}, the models' default first: transformers 5's models pick
    "grouped_mm" (torch._grouped_mm) where it runs, else "eager" (a loop over the experts hit), which is
    timed either way."""
    import copy

    impls = {}
    for impl in ("grouped_mm", "eager"):
        m = copy.deepcopy(moe)
        m.config = copy.deepcopy(moe.config)
        m.config._experts_implementation = impl
        try:
            with torch.inference_mode():
                m(x, ids, wts)
        except Exception as e:  # noqa: BLE001 - any refusal: no grouped_mm on this device or torch
            log(f"host: transformers' {impl} experts do not run here ({type(e).__name__}: {e})")
            continue
        impls[impl] = m
    return impls


# ============================================================= section: model
def make_config(family, *, hidden, inter, layers, vocab, max_pos, heads=None, kv=None, head_dim=None):
    """The transformers config of a family at the given size. heads/kv/head_dim
    override the family's (tiny CPU models)."""
    import transformers
    cls_name, over = FAMILIES[family]
    over = dict(over)
    if heads is not None:
        mha = over["num_attention_heads"] == over["num_key_value_heads"]
        over["num_attention_heads"] = heads
        over["num_key_value_heads"] = heads if mha else kv
        if "head_dim" in over:
            over["head_dim"] = head_dim
    kw = dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, vocab_size=vocab,
              max_position_embeddings=max_pos, pad_token_id=0, use_cache=False, **over)
    if family == "gemma3":
        # Gemma 3 interleaves 5 sliding-window layers with one global one; with
        # few layers, make the last global so both kinds are in the model.
        kw["layer_types"] = ["sliding_attention"] * (layers - 1) + ["full_attention"]
    return getattr(transformers, cls_name)(**kw)


def build_model(cfg, dev, dtype):
    from transformers import AutoModelForCausalLM
    # Built directly on the device: initialising ~1B parameters on the CPU
    # would take longer than the benchmark.
    with torch.device(dev):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
        except ValueError:
            # Gemma 2 refuses SDPA (its attention logit soft-capping): its own eager attention.
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="eager")
    return model.eval().requires_grad_(False)


def reference_logits(model, ids):
    """Logits of a float32 forward of the same weights (TF32 off), as float32.
    The bf16 parameter storages are put back afterwards, untouched."""
    params = list(model.parameters())
    saved = [p.data for p in params]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for p in params:
            p.data = p.data.float()
        with torch.inference_mode():
            return model(input_ids=ids, use_cache=False).logits.float()
    finally:
        for p, d in zip(params, saved):
            p.data = d
        torch.backends.cuda.matmul.allow_tf32 = tf32


class Variants:
    """Both the unpatched and the patched MLP modules of one model, and a way
    to put either set in place. patch_model returns the names of the modules
    it replaced; the originals are read from a name -> module map taken
    before patching."""

    def __init__(self, model, names, before):
        self.model = model
        self.names = list(names)
        self.mods = {"unpatched": [before[n] for n in self.names],
                     "patched": [model.get_submodule(n) for n in self.names]}
        same = [n for n, a, b in zip(self.names, self.mods["unpatched"], self.mods["patched"]) if a is b]
        if same:
            raise RuntimeError(f"patch_model changed {same[0]} in place; this benchmark needs it swapped")
        self.current = "patched"

    def set(self, which):
        if which == self.current:
            return
        for name, mod in zip(self.names, self.mods[which]):
            parent, _, child = name.rpartition(".")
            setattr(self.model.get_submodule(parent), child, mod)
        self.current = which


def interleaved(variants, fns, warmup, reps, calls, dev, swap=True):
    """Median ms per call of fns[v] for v in ("unpatched", "patched"): the
    variants alternate by repeat (the one going first alternates too), so that
    drift affects both alike."""
    order = ["unpatched", "patched"]
    times = {v: [] for v in order}
    for v in order:
        if swap:
            variants.set(v)
        for _ in range(warmup):
            fns[v]()
    gc_on = gc.isenabled()
    gc.disable()  # an eager forward makes many Python objects: no collection lands in one variant's calls
    try:
        for r in range(reps):
            for v in (order if r % 2 == 0 else order[::-1]):
                if swap:
                    variants.set(v)
                times[v] += timed_calls_ms(fns[v], calls, dev)
    finally:
        if gc_on:
            gc.enable()
    return {v: median(t) for v, t in times.items()}


def capture_graph(fn, warmup=3):
    """A torch.cuda.CUDAGraph of one call of fn, and fn's output (graph
    memory: replays overwrite it). Warm-up on a side stream, as capture wants."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    torch.cuda.synchronize()
    return g, out


def compiled_one_token(model, ids1, args, dev, mode_label):
    """(ms per call, logits, notes, compile seconds) of a one-token forward through
    torch.compile(mode="reduce-overhead"): Inductor with CUDA graph trees.
    Falls back to fullgraph=False if the full graph does not trace."""
    from torch._dynamo.utils import counters
    notes = []
    torch._dynamo.reset()  # a fresh compilation (and fresh CUDA graph trees) per variant
    skips0 = counters["inductor"]["cudagraph_skips"]
    fullgraph = args.fullgraph
    t0 = time.perf_counter()
    while True:
        cm = torch.compile(model, mode="reduce-overhead", fullgraph=fullgraph, dynamic=False)

        def call():
            # A new step for the graph trees: the previous call's outputs may be overwritten.
            torch.compiler.cudagraph_mark_step_begin()
            return cm(input_ids=ids1, use_cache=False).logits
        try:
            with torch.no_grad():
                for _ in range(args.compile_warmup):  # warm-up, record, replay
                    call()
            break
        except Exception as e:  # noqa: BLE001 - any tracing failure: retry with graph breaks
            if not fullgraph:
                raise
            log(f"model {mode_label}: fullgraph=True failed ({type(e).__name__}: {str(e)[:200]}); "
                "retrying with fullgraph=False")
            notes.append("fullgraph=False (fullgraph=True failed)")
            fullgraph = False
            torch._dynamo.reset()
    sync(dev)
    compile_s = time.perf_counter() - t0
    with torch.no_grad():
        logits = call().clone()
        times = []
        for _ in range(args.model_reps):
            times += timed_calls_ms(call, args.model_calls, dev)
    skipped = counters["inductor"]["cudagraph_skips"] - skips0
    if skipped:
        notes.append(f"CUDA graphs SKIPPED {skipped}x (timing is without graphs)")
    log(f"model {mode_label}: compiled in {compile_s:.0f} s, {median(times):.3f} ms"
        + (f" [{'; '.join(notes)}]" if notes else ""))
    del cm
    torch._dynamo.reset()
    return median(times), logits, notes, compile_s


def model_one(family, args, dev, patch_model, compile_it, rows_out):
    """All timings and checks of one family; appends result rows."""
    seq = args.seq
    t_build = time.perf_counter()
    cfg = make_config(family, hidden=args.hidden, inter=args.intermediate, layers=args.layers, vocab=args.vocab,
                      max_pos=max(8192, seq), **getattr(args, "heads_override", {}))
    model = build_model(cfg, dev, BF16)
    sync(dev)
    attn = model.config._attn_implementation
    log(f"model {family}: built {type(model).__name__} ({attn} attention) in {time.perf_counter() - t_build:.1f} s, "
        f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters")
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(1, args.vocab, (1, seq), generator=gen).to(dev)
    ids1 = ids[:, :1].clone()

    ref = reference_logits(model, ids)  # [1, seq, vocab] float32
    ref1 = ref[:, :1]
    log(f"model {family}: float32 reference done")

    # Kept: patch_model drops its references to the old MLPs (their gate/up
    # weights would be freed), and this benchmark swaps them back in.
    before = dict(model.named_modules(remove_duplicate=False))
    names = patch_model(model)
    if len(names) != args.layers:
        raise RuntimeError(f"patch_model swapped {len(names)} modules, expected {args.layers}: {names}")
    var = Variants(model, names, before)
    log(f"model {family}: patched {len(names)} modules ({type(var.mods['patched'][0]).__name__} "
        f"for {type(var.mods['unpatched'][0]).__name__})")

    def add_row(mode, t, outs, refs, bar_strict, notes=(), extra=None):
        e_u = rel_err(outs["unpatched"], refs)
        e_p = rel_err(outs["patched"], refs)
        e_pu = rel_err(outs["patched"], outs["unpatched"])
        ok = rule_ok(e_p, e_u, LOGITS_ATOL, outs["patched"])
        ratio = t["patched"] / t["unpatched"]
        row = dict(model=family, mode=mode, unpatched_ms=t["unpatched"], patched_ms=t["patched"], ratio=ratio,
                   bar="< 1.0" if bar_strict else "<= 1.0", bar_ok=(ratio < 1.0) if bar_strict else (ratio <= 1.0),
                   err_patched=e_p, err_unpatched=e_u, err_patched_vs_unpatched=e_pu, check_ok=ok,
                   notes=list(notes) + ([f"{attn} attention"] if attn != "sdpa" else []), swapped=len(names))
        if extra:
            row.update(extra)
        rows_out.append(row)
        if not ok:
            fail(f"model {family} {mode}: logits rel err {e_p:.3e} vs unpatched {e_u:.3e} (float32 reference)")
        log(f"model {family} {mode}: {t['unpatched']:.3f} -> {t['patched']:.3f} ms ({ratio:.3f}x), "
            f"logits err {e_p:.2e} (unpatched {e_u:.2e})")

    def fwd(x):
        return lambda: model(input_ids=x, use_cache=False).logits

    def outputs(x):
        out = {}
        for v in ("unpatched", "patched"):
            var.set(v)
            out[v] = fwd(x)().float()
        return out

    with torch.inference_mode():
        # eager, one token: host-bound, so the events measure the issuing
        t = interleaved(var, {v: fwd(ids1) for v in ("unpatched", "patched")}, args.model_warmup,
                        args.model_reps, args.model_calls, dev)
        add_row("eager, 1 token", t, outputs(ids1), ref1, bar_strict=False)
        # eager, seq tokens: the GEMMs dominate
        t = interleaved(var, {v: fwd(ids) for v in ("unpatched", "patched")}, 1, args.model_long_reps, 2, dev)
        add_row(f"eager, {seq} tokens", t, outputs(ids), ref, bar_strict=False)

        if dev.type == "cuda" and args.graph:
            # One graph per variant, each with its own modules baked in; both
            # variants' weights stay alive, so the replays can alternate.
            graphs, outs = {}, {}
            try:
                for v in ("unpatched", "patched"):
                    var.set(v)
                    graphs[v], outs[v] = capture_graph(fwd(ids1))
                t = interleaved(var, {v: graphs[v].replay for v in graphs}, 3, args.model_reps,
                                args.model_calls, dev, swap=False)
                add_row("graph (hand capture), 1 token", t, {v: o.float() for v, o in outs.items()}, ref1,
                        bar_strict=True)
            except Exception as e:  # noqa: BLE001 - a capture failure is reported, not fatal to the rest
                fail(f"model {family} graph capture: {type(e).__name__}: {e}")
                traceback.print_exc()
            del graphs, outs
            free_memory(dev)

    if dev.type == "cuda" and compile_it:
        t, outs, notes, cs = {}, {}, {}, {}
        for v in ("unpatched", "patched"):
            var.set(v)
            t[v], outs[v], notes[v], cs[v] = compiled_one_token(model, ids1, args, dev, f"{family} compiled {v}")
        add_row("compiled reduce-overhead, 1 token", t, {v: o.float() for v, o in outs.items()}, ref1,
                bar_strict=True, notes=sorted(set(notes["unpatched"] + notes["patched"])),
                extra=dict(compile_s=cs))
    del model, var, ref, ref1, before
    free_memory(dev)


def model_section(args, dev, patch_model, results):
    rows = []
    results["model"] = dict(config=dict(hidden=args.hidden, intermediate=args.intermediate, layers=args.layers,
                                        vocab=args.vocab, seq=args.seq, dtype="bf16", attention="sdpa"),
                            rows=rows, errors=[])
    if patch_model is None:
        fail("model: gatedmlp.torch.patch_model is not importable")
        results["model"]["errors"].append("patch_model not importable")
        return
    for fam in args.models:
        log(f"model {fam}: start")
        try:
            model_one(fam, args, dev, patch_model, fam in args.compile_models, rows)
        except Exception as e:  # noqa: BLE001 - one family failing must not hide the others
            fail(f"model {fam}: {type(e).__name__}: {e}")
            traceback.print_exc()
            results["model"]["errors"].append(f"{fam}: {type(e).__name__}: {e}")
        torch._dynamo.reset()
        free_memory(dev)


def model_table(res):
    rows = []
    for r in res["rows"]:
        rows.append([r["model"], r["mode"], f"{r['unpatched_ms']:.3f}", f"{r['patched_ms']:.3f}",
                     f"{r['ratio']:.3f}x", f"{r['bar']}: {bar_text(r['bar_ok'])}",
                     f"{r['err_patched']:.2e} / {r['err_unpatched']:.2e} / {r['err_patched_vs_unpatched']:.2e}",
                     "ok" if r["check_ok"] else "FAIL", "; ".join(r["notes"])])
    c = res["config"]
    title = (f"### Model forward, patched vs unpatched (hidden {c['hidden']}, intermediate {c['intermediate']}, "
             f"{c['layers']} layers, vocab {c['vocab']}, bf16, SDPA)")
    out = title + "\n\n" + md_table(
        ["model", "mode", "unpatched ms", "patched ms", "patched/unpatched", "bar",
         "logits rel err: patched / unpatched vs fp32 / patched vs unpatched", "check", "notes"], rows)
    if res["errors"]:
        out += "\n\nerrors: " + "; ".join(res["errors"])
    return out


# ============================================================= section: small
def _mm_silu_mul(x, w):
    gu = torch.mm(x, w.t())
    u = gu.shape[-1] // 2
    return F.silu(gu[:, :u]) * gu[:, u:]


def small_section(args, dev, G, results):
    gm, gt = G
    # One compiled function for every shape, static shapes: raise the
    # recompile limit and make hitting it an error, so that no shape silently
    # runs uncompiled.
    torch._dynamo.config.recompile_limit = 1024
    torch._dynamo.config.accumulated_recompile_limit = 4096
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    compiled = torch.compile(_mm_silu_mul, dynamic=False)
    rows = []
    results["small"] = dict(graph_calls=args.graph_calls, l2_mb=args.l2_mb, rows=rows)
    for k, u in args.shapes:
        torch.manual_seed(k * 31 + u)
        w_bytes = 2 * u * k * 2
        # Weight copies over --l2-mb, so the replays stream weights from HBM
        # as a real decode step does (other layers' weights evict L2 there).
        n_w = max(1, math.ceil(args.l2_mb * 2**20 / w_bytes)) if args.l2_mb > 0 else 1
        ws = [(torch.randn(2 * u, k, device=dev) / k**0.5).to(BF16) for _ in range(n_w)]
        calls = max(args.graph_calls, n_w)
        for m in args.ms:
            label = f"{k}x{u} M={m}"
            try:
                rows.append(small_one(k, u, m, ws, calls, compiled, gm, gt, args, dev))
                r = rows[-1]
                log(f"small {label}: mm {r['mm_us']:.2f} µs, gatedmlp {r['gatedmlp_us']:.2f} µs "
                    f"({r['ratio_mm']:.2f}x mm), err {r['err_gatedmlp']:.2e} (unfused {r['err_unfused']:.2e})")
            except Exception as e:  # noqa: BLE001 - report and go on with the other shapes
                fail(f"small {label}: {type(e).__name__}: {e}")
                traceback.print_exc()
            free_memory(dev)
        del ws
        free_memory(dev)


def small_one(k, u, m, ws, calls, compiled, gm, gt, args, dev):
    n_w = len(ws)
    xs = [torch.randn(m, k, device=dev).to(BF16) for _ in range(calls)]
    gu_buf = torch.empty(m, 2 * u, device=dev, dtype=BF16)
    ys = torch.empty(calls, m, u, device=dev, dtype=BF16)
    ys2 = torch.empty(calls, m, u, device=dev, dtype=BF16)

    def W(i):
        return ws[i % n_w]

    def mm_eager(i):
        gu = torch.mm(xs[i], W(i).T)
        return F.silu(gu[:, :u]) * gu[:, u:]

    paths = {
        "mm": lambda i: torch.mm(xs[i], W(i).T, out=gu_buf),
        "mm_eager": mm_eager,
        "mm_compiled": lambda i: compiled(xs[i], W(i)),
        "gatedmlp": lambda i: gm.gate_up(xs[i], W(i), out=ys[i]),
        "gt": lambda i: gt.gate_up(xs[i], W(i), out=ys2[i]),
    }
    if not args.small_compiled:
        del paths["mm_compiled"]
    with torch.inference_mode():
        for fn in paths.values():  # compiles here, outside any stream games
            fn(0)
        torch.cuda.synchronize()
        graphs, outs = {}, {}
        for name, fn in paths.items():
            graphs[name], outs[name] = capture_graph(lambda fn=fn: [fn(i) for i in range(calls)], warmup=2)
        # Poison the outputs the gatedmlp graphs write, so that a replay that
        # writes nothing cannot pass the check with warm-up leftovers.
        ys.fill_(float("nan"))
        ys2.fill_(float("nan"))
        # Timing: graphs round-robin across repeats (the first one rotates),
        # `replays` replays between two events. The events of one repeat are
        # queued back to back and read after one sync, so the GPU never waits
        # for the host between paths; one untimed replay first fills the queue.
        names = list(graphs)
        per = {nm: [] for nm in names}
        for g in graphs.values():
            g.replay()
        torch.cuda.synchronize()
        for r in range(args.small_reps):
            start = r % len(names)
            order = names[start:] + names[:start]
            graphs[order[0]].replay()
            evs = []
            for nm in order:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(args.replays):
                    graphs[nm].replay()
                e1.record()
                evs.append((nm, e0, e1))
            torch.cuda.synchronize()
            for nm, e0, e1 in evs:
                per[nm].append(e0.elapsed_time(e1) * 1e3 / (args.replays * calls))
        us = {nm: median(v) for nm, v in per.items()}

        # Checks on what the replays wrote: first and last call of the graph.
        errs = {nm: [] for nm in names}
        e_unf, ok = [], True
        for i in sorted({0, calls - 1}):
            x64, w64 = xs[i].double(), W(i).double()
            ref = F.silu(x64 @ w64[:u].T) * (x64 @ w64[u:].T)
            e_u = rel_err(mm_eager(i), ref)  # the unfused bf16 path, eagerly
            e_unf.append(e_u)
            for nm in names:
                if nm == "mm":
                    continue
                out = outs[nm][i]
                e = rel_err(out, ref)
                errs[nm].append(e)
                if nm in ("gatedmlp", "gt") and not rule_ok(e, e_u, GEMM_ATOL, out):
                    ok = False
                    fail(f"small {k}x{u} M={m} {nm} call {i}: rel err {e:.3e} vs unfused {e_u:.3e}")
        del graphs, outs
    best_unfused = min(us[nm] for nm in ("mm_eager", "mm_compiled") if nm in us)
    return dict(k=k, u=u, m=m, calls_per_graph=calls, weight_copies=n_w,
                mm_us=us["mm"], mm_eager_us=us["mm_eager"], mm_compiled_us=us.get("mm_compiled", float("nan")),
                gatedmlp_us=us["gatedmlp"], gt_us=us["gt"], ratio_mm=us["gatedmlp"] / us["mm"],
                ratio_gt_mm=us["gt"] / us["mm"], ratio_best_unfused=us["gatedmlp"] / best_unfused,
                bar="<= 1.0x mm", bar_ok=us["gatedmlp"] <= us["mm"],
                err_gatedmlp=max(errs["gatedmlp"]), err_gt=max(errs["gt"]), err_unfused=min(e_unf),
                err_compiled=max(errs["mm_compiled"]) if "mm_compiled" in errs else float("nan"), check_ok=ok)


def small_table(res):
    rows = []
    for r in res["rows"]:
        rows.append([f"{r['k']}x{r['u']}", r["m"], f"{r['mm_us']:.2f}", f"{r['mm_eager_us']:.2f}",
                     f"{r['mm_compiled_us']:.2f}", f"{r['gatedmlp_us']:.2f}", f"{r['gt_us']:.2f}",
                     f"{r['ratio_mm']:.2f}x", f"{r['bar']}: {bar_text(r['bar_ok'])}",
                     f"{r['ratio_best_unfused']:.2f}x", f"{r['err_gatedmlp']:.2e} ({r['err_unfused']:.2e})",
                     "ok" if r["check_ok"] else "FAIL"])
    title = (f"### Decode shapes in CUDA-graph replay, µs per call ({res['graph_calls']}+ calls per graph, "
             f"weights rotated over {res['l2_mb']:.0f} MiB)")
    return title + "\n\n" + md_table(
        ["K x U", "M", "torch.mm", "mm+eager", "mm+compiled", "gatedmlp", "gt.gate_up", "gatedmlp/mm", "bar",
         "vs best unfused", "rel err (unfused)", "check"], rows)


# ================================================================ CPU selftest
class _TorchMLP(nn.Module):
    """A stand-in for GatedMLP in the CPU selftest: the same stacked [gate; up]
    weight, computed with PyTorch ops (gatedmlp refuses host tensors)."""

    def __init__(self, mlp):
        super().__init__()
        if hasattr(mlp, "gate_up_proj"):  # Phi-3: already stacked, gate first
            w = mlp.gate_up_proj.weight
            self.act = mlp.activation_fn
        else:
            w = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            self.act = mlp.act_fn
        self.w = nn.Parameter(w.detach().clone(), requires_grad=False)
        self.down_proj = mlp.down_proj

    def forward(self, x):
        g, u = F.linear(x, self.w).chunk(2, dim=-1)
        return self.down_proj(self.act(g) * u)


def _fake_patch_model(model, *, strict=True):
    names = [n for n, m in model.named_modules() if n.endswith(".mlp")]
    for n in names:
        parent, _, child = n.rpartition(".")
        setattr(model.get_submodule(parent), child, _TorchMLP(model.get_submodule(n)))
    return names


def selftest_cpu(args):
    dev = torch.device("cpu")
    torch.manual_seed(0)
    for fam in FAMILIES:
        cfg = make_config(fam, hidden=64, inter=96, layers=2, vocab=256, max_pos=128, heads=4, kv=2, head_dim=16)
        model = build_model(cfg, dev, torch.float32)
        ids = torch.randint(1, 256, (1, 7))
        ref = reference_logits(model, ids)
        before = dict(model.named_modules())
        names = _fake_patch_model(model)
        var = Variants(model, names, before)
        outs = {}
        with torch.inference_mode():
            for v in ("unpatched", "patched"):
                var.set(v)
                outs[v] = model(input_ids=ids, use_cache=False).logits
        e_u, e_p = rel_err(outs["unpatched"], ref), rel_err(outs["patched"], ref)
        assert outs["patched"].shape == (1, 7, 256), outs["patched"].shape
        assert rule_ok(e_p, e_u, LOGITS_ATOL, outs["patched"]), (fam, e_p, e_u)
        # position 0 of a causal forward is the one-token forward
        with torch.inference_mode():
            one = model(input_ids=ids[:, :1], use_cache=False).logits
        assert rel_err(one, ref[:, :1]) < 1e-4, fam
        print(f"selftest {fam}: {type(model).__name__}, mlp {type(before[names[0]]).__name__}, "
              f"{len(names)} swapped, logits err patched {e_p:.1e} unpatched {e_u:.1e}", flush=True)
    # The model-section driver end to end (eager modes; no graphs or compile on CPU), tiny sizes.
    a = argparse.Namespace(**vars(args))
    a.hidden, a.intermediate, a.layers, a.vocab, a.seq = 64, 96, 2, 256, 16
    a.model_reps, a.model_calls, a.model_long_reps, a.model_warmup = 2, 2, 1, 1
    a.models = ["llama", "phi3"]
    a.heads_override = dict(heads=4, kv=2, head_dim=16)
    results = {}
    model_section(a, dev, _fake_patch_model, results)
    print(model_table(results["model"]))
    # The host driver with the PyTorch entries only.
    a.host_calls, a.host_reps, a.host_warmup_reps = 20, 3, 1
    host_section(a, dev, None, results)
    print(host_table(results["host"]))
    json.dumps(results)
    if FAILURES:
        sys.exit(f"selftest: {len(FAILURES)} failure(s)")
    print("selftest-cpu: ok")


# ===================================================================== main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="host,model,small", help="comma list of host, model, small")
    ap.add_argument("--json", metavar="PATH", help="write every number here")
    ap.add_argument("--quick", action="store_true", help="fewer repeats (rough numbers)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit; no GPU needed")
    ap.add_argument("--selftest-cpu", action="store_true", help=argparse.SUPPRESS)
    g = ap.add_argument_group("host")
    g.add_argument("--host-calls", type=int, default=300, help="calls per timed loop")
    g.add_argument("--host-reps", type=int, default=101, help="timed loops per entry point")
    g.add_argument("--host-warmup-reps", type=int, default=3)
    g = ap.add_argument_group("model")
    g.add_argument("--models", default=DEFAULT_MODELS, help=f"comma list of {', '.join(FAMILIES)}, or all")
    g.add_argument("--compile-models", default="llama",
                   help="families also timed under torch.compile (reduce-overhead); 'none' for none")
    g.add_argument("--seq", type=int, default=4096, help="tokens of the long eager forward")
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--hidden", type=int, default=4096)
    g.add_argument("--intermediate", type=int, default=14336)
    g.add_argument("--vocab", type=int, default=32000)
    g.add_argument("--model-reps", type=int, default=20, help="repeats of the one-token timings")
    g.add_argument("--model-calls", type=int, default=10, help="calls per repeat of the one-token timings")
    g.add_argument("--model-long-reps", type=int, default=5, help="repeats of the long forward (2 calls each)")
    g.add_argument("--model-warmup", type=int, default=5)
    g.add_argument("--compile-warmup", type=int, default=3, help="calls to compile, record and replay once")
    g.add_argument("--fullgraph", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                   help="the hand-captured CUDA graph one-token timing")
    g = ap.add_argument_group("small")
    g.add_argument("--shapes", default=",".join(f"{k}x{u}" for k, u in SMALL_SHAPES), help="comma list of KxU")
    g.add_argument("--ms", default=",".join(map(str, SMALL_MS)), help="comma list of M")
    g.add_argument("--graph-calls", type=int, default=20, help="calls captured per graph (R)")
    g.add_argument("--replays", type=int, default=10, help="graph replays between two events")
    g.add_argument("--small-reps", type=int, default=15)
    g.add_argument("--l2-mb", type=float, default=128.0, help="rotate weight copies over this many MiB (0: none)")
    g.add_argument("--small-compiled", action=argparse.BooleanOptionalAction, default=True,
                   help="the torch.compile'd mm + silu*mul path (one compilation per shape)")
    args = ap.parse_args(argv)

    def csv(s):
        return [t.strip() for t in s.split(",") if t.strip()]
    args.sections = csv(args.sections)
    bad = set(args.sections) - {"host", "model", "small"}
    if bad:
        ap.error(f"unknown section(s) {sorted(bad)}")
    args.models = list(FAMILIES) if args.models.strip().lower() == "all" else [m.lower() for m in csv(args.models)]
    cm = args.compile_models.strip().lower()
    args.compile_models = [] if cm in ("", "none") else csv(cm)
    for m in args.models + args.compile_models:
        if m not in FAMILIES:
            ap.error(f"unknown model family {m!r}; known: {', '.join(FAMILIES)}")
    try:
        args.shapes = [tuple(int(v) for v in s.lower().split("x")) for s in csv(args.shapes)]
        args.ms = [int(v) for v in csv(args.ms)]
    except ValueError:
        ap.error("--shapes is KxU[,KxU...], --ms is M[,M...]")
    if any(len(s) != 2 for s in args.shapes):
        ap.error("--shapes is KxU[,KxU...]")
    if args.quick:
        args.host_reps = min(args.host_reps, 21)
        args.model_reps = min(args.model_reps, 6)
        args.model_long_reps = min(args.model_long_reps, 2)
        args.model_warmup = min(args.model_warmup, 2)
        args.small_reps = min(args.small_reps, 5)
    return args


def versions(dev):
    out = dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda)
    try:
        import transformers
        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    try:
        import gatedmlp
        out["gatedmlp"] = gatedmlp.__version__
    except ImportError as e:
        out["gatedmlp"] = f"not importable ({e})"
    out["device"] = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    # Blocking launches would turn every host time into host + GPU time.
    out["CUDA_LAUNCH_BLOCKING"] = os.environ.get("CUDA_LAUNCH_BLOCKING")
    return out


def main():
    args = parse_args()
    if args.selftest_cpu:
        selftest_cpu(args)
        return
    if args.dry_run:
        print("sections:", ", ".join(args.sections))
        if "host" in args.sections:
            print(f"host: M=1 K=U=256 bf16, {args.host_reps} repeats x {args.host_calls} calls")
        if "model" in args.sections:
            print(f"model: {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}, "
                  f"vocab {args.vocab}, seq {args.seq}; compiled: {', '.join(args.compile_models) or 'none'}")
            for fam in args.models:
                cfg = make_config(fam, hidden=args.hidden, inter=args.intermediate, layers=args.layers,
                                  vocab=args.vocab, max_pos=max(8192, args.seq))
                print(f"  {fam}: {type(cfg).__name__} heads {cfg.num_attention_heads}/{cfg.num_key_value_heads}"
                      f" head_dim {getattr(cfg, 'head_dim', None) or args.hidden // cfg.num_attention_heads}")
        if "small" in args.sections:
            print(f"small: shapes {args.shapes}, M {args.ms}, {args.graph_calls}+ calls per graph, "
                  f"weights over {args.l2_mb} MiB")
        return

    if not torch.cuda.is_available():
        sys.exit("bench_dropin: no CUDA device (see --dry-run and --selftest-cpu)")
    dev = torch.device("cuda")
    env = versions(dev)
    print(f"# {env['device']} | torch {env['torch']} (CUDA {env['cuda']}) | transformers {env['transformers']} | "
          f"gatedmlp {env['gatedmlp']} | python {env['python']}", flush=True)
    if env["CUDA_LAUNCH_BLOCKING"] not in (None, "", "0"):
        print("# WARNING: CUDA_LAUNCH_BLOCKING is set: host times include the GPU's", flush=True)
    results = dict(env=env, args={k: v for k, v in vars(args).items()}, failures=FAILURES)
    try:
        gm, gt, patch_model = load_gatedmlp()
    except ImportError as e:
        sys.exit(f"bench_dropin: gatedmlp is not importable ({e}); build it, or PYTHONPATH=build/python")
    G = (gm, gt)

    tables = []
    t_all = time.perf_counter()
    for sec in args.sections:  # in the order given
        t0 = time.perf_counter()
        log(f"section {sec}: start")
        try:
            if sec == "host":
                host_section(args, dev, G, results, patch_model)
                tables.append(host_table(results["host"]))
            elif sec == "model":
                model_section(args, dev, patch_model, results)
                tables.append(model_table(results["model"]))
            elif sec == "small":
                small_section(args, dev, G, results)
                tables.append(small_table(results["small"]))
        except Exception as e:  # noqa: BLE001 - the other sections still run
            fail(f"section {sec}: {type(e).__name__}: {e}")
            traceback.print_exc()
        log(f"section {sec}: {time.perf_counter() - t0:.0f} s")
        free_memory(dev)
    log(f"total {time.perf_counter() - t_all:.0f} s")

    print()
    for t in tables:
        print(t)
        print()
    print("Times are medians; ratios < 1 mean gatedmlp is faster. 'MISSED' marks a speed bar not met "
          "(it does not fail the run); 'FAIL' a correctness check (it does).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
        print(f"wrote {args.json}")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s):", *FAILURES, sep="\n  ", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
