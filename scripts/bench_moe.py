#!/usr/bin/env python3
"""Mixture-of-Experts benchmarks, every number from one run on one GPU, in
three modes (--mode, default decode).

decode: gathered gate/up + GLU in decode against its bar (the MoE issue:
>= 80 % of the read rate on the bytes of the distinct experts a step
touches).

  Per model (E experts, top k, K x U per expert), weight format (bf16; int4
  affine g64 with bf16 scales and biases; int4t: the same in the tiled order,
  gatedmlp.tile, its bytes counted as int4's; mxfp4: e2m1 values with an
  e8m0 scale per 32, gpt-oss's own) and T tokens, under CUDA-graph
  replay of 16 steps that each route the T tokens afresh (k distinct experts
  per token, uniformly, as a top-k router picks) over two copies of all the
  experts' weights, so that a step finds few of its experts in L2:

    gatedmlp            gatedmlp.gather_gate_up / quantized_gather_gate_up,
                        x [T, K], topk_ids [T, k] -> [T, k, U]
    grouped_mm + GLU    (bf16) what a PyTorch user runs: the rows sorted by
                        expert, torch._grouped_mm on [E, K, 2U], silu * mul

  The bytes: the distinct experts' weights (and scales, biases) of each
  step, averaged over the 16 routings, plus x and y; the read rate: the
  larger of a 2 GiB torch.sum and bf16 F.linear at M = 1, measured in the
  same run.

prefill: grouped gate/up + GLU on rows already sorted by expert, bf16,
against what a PyTorch user runs on the same inputs.

  Per model and rows per expert (default gpt-oss-20b 512, qwen3-30b-a3b 512,
  mixtral 2048; --rows-per-expert a,b,... replaces them for every model),
  R = rows per expert x E sorted rows: x [R, K] random bf16, w13 [E, 2U, K]
  random bf16 x 0.02 (each expert's gate rows, then its up rows), offsets
  int32 [E] the cumulative row ends (torch._grouped_mm's offs). Two
  routings of the R rows:

    uniform   every expert gets R / E rows.
    skewed    expert 0 gets min(15 R / E, R) rows (15x the mean); the
              others share the rest, R minus that: each of experts 1 ... E-1
              gets floor(rest / (E - 1)) rows and the first rest mod (E - 1)
              of them one more. With E <= 15 (Mixtral's 8) expert 0 takes
              all R rows and the others none.

  Under CUDA-graph replay (bench_quant's graph_time_us, warm-up first):

    gatedmlp            gatedmlp.grouped_gate_up(x, offsets, w13, out=out)
                        -> [R, U] (stacked layout, group 0)
    grouped_mm          torch._grouped_mm(x, w_t, offs=offsets) -> [R, 2U]
                        alone, w_t = w13.transpose(1, 2) (a view)
    + GLU eager         the same, then F.silu(h[:, :U]) * h[:, U:]
    + GLU compiled      that function through torch.compile (default mode,
                        compiled for each shape)

  TFLOP/s on 2 R K 2U flops; each ratio is the baseline's time over
  gatedmlp's. The bar: >= 1.1x the faster of grouped_mm + GLU eager and
  compiled. Before timing, gatedmlp's output is checked against the eager
  baseline's: max |diff| / max |baseline| must be <= 2e-2.

block: the whole experts block of a MoE layer against transformers.

  Per model, transformers' experts module (GptOssExperts, Qwen3MoeExperts,
  MixtralExperts, built from a config of the model's real sizes: hidden,
  expert intermediate, experts, top k; one layer; random bf16 weights on
  the GPU) and gatedmlp.torch.MoEExperts.from_module of it, at T tokens
  (--t, default 1,16,512,8192): x [T, H] random bf16, the routing a top-k
  router hands the experts (int64 ids of the top k of random logits, the
  softmax over those k as weights, in the dtype the model's router gives:
  bf16 for gpt-oss and Qwen3-MoE, float32 for Mixtral):

    hf loop             the transformers module with experts_implementation
                        "eager": its own loop over the experts hit
    hf grouped_mm       the same module with "grouped_mm" (what
                        from_pretrained picks on a GPU by default)
    hf compiled         the grouped_mm module through torch.compile(module)
                        (default mode and dynamic shapes, as they come)
    gatedmlp            MoEExperts(x, ids, weights), as patch_model swaps it
                        in (its id check on)
    moe_mlp             gatedmlp.moe_mlp on the module's tensors, out given,
                        check_indices=False: the call without the module
                        and the id check

  CUDA events around back-to-back calls (not CUDA graphs: the transformers
  forwards do data-dependent host work), warm-up first, enough calls per
  repeat for ~100 ms, median over 5 repeats of the time per call; "host" is
  the host's time issuing each call in the same loops. Ratios: each
  transformers time over gatedmlp's. Checked first: max |diff| / max |hf
  loop| of gatedmlp's and moe_mlp's outputs must be <= 5e-2 (the other
  transformers outputs' diffs are printed too). GATEDMLP_MOE_GROUPED=0/1 in
  the environment forces moe_mlp's gathered / grouped path (recorded in
  the JSON). A compilation running over --compile-timeout seconds is
  stopped and the compiled baseline skipped for the rest of that model.

A failed check prints FAILED and makes the exit status 1 (the run goes on);
a baseline that cannot run is reported and skipped.

    python scripts/bench_moe.py [--models gpt-oss-20b,qwen3-30b-a3b,mixtral] [--t 1,4,16,64] [--json out.json]
    python scripts/bench_moe.py --mode prefill [--models ...] [--rows-per-expert 512,2048] [--json out.json]
    python scripts/bench_moe.py --mode block [--models ...] [--t 1,16,512,8192] [--json out.json]

--formats bf16,int4 picks decode's weight formats; --compile-timeout S
(default 600; 0: no compiled baseline) bounds each torch.compile in
prefill and block. The JSON holds every row, each with its "mode".
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import statistics
import sys
import time

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

PREFILL_ROWS = {"gpt-oss-20b": 512, "qwen3-30b-a3b": 512, "mixtral": 2048}  # rows per expert
SKEW = 15            # the skewed routing's busiest expert: this many times the mean
PREFILL_CALLS = 3    # calls per CUDA graph in prefill (each is 0.1 ms or more)
PREFILL_TOL = 2e-2   # max |diff| / max |ref| of gatedmlp's [R, U] against grouped_mm + GLU
PREFILL_BAR = 1.1    # gatedmlp against the faster grouped_mm + GLU
BLOCK_TOL = 5e-2     # max |diff| / max |ref| of the block's output against transformers' loop
BLOCK_REPS = 5

# transformers' experts module of each model: (models subpackage, config
# class, experts class, config fields with the model's sizes from MODELS,
# the dtype its router hands the experts their weights in).
HF_EXPERTS = {
    "gpt-oss-20b": ("gpt_oss", "GptOssConfig", "GptOssExperts",
                    lambda e, k, h, i: dict(hidden_size=h, intermediate_size=i, num_local_experts=e,
                                            num_experts_per_tok=k), torch.bfloat16),
    "qwen3-30b-a3b": ("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeExperts",
                      lambda e, k, h, i: dict(hidden_size=h, moe_intermediate_size=i, num_experts=e,
                                              num_experts_per_tok=k, hidden_act="silu"), torch.bfloat16),
    "mixtral": ("mixtral", "MixtralConfig", "MixtralExperts",
                lambda e, k, h, i: dict(hidden_size=h, intermediate_size=i, num_local_experts=e,
                                        num_experts_per_tok=k, hidden_act="silu"), torch.float32),
}

FAILURES: list[str] = []


def fail(msg: str) -> None:
    """A failed check: said loudly, remembered for the exit status."""
    FAILURES.append(msg)
    print(f"FAILED: {msg}", flush=True)


def rel_max_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def short(ex: Exception) -> str:
    return f"{type(ex).__name__}: {ex}"[:160].replace("\n", " ")


def free_memory() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


class CompileTimeout(BaseException):
    """A compilation stopped for running too long (a BaseException, so that
    no `except Exception` inside torch swallows it)."""


def call_with_timeout(fn, seconds: float):
    """fn(), stopped by SIGALRM after `seconds`: a torch.compile that takes
    too long is reported and skipped instead of eating the run."""
    def on_alarm(signum, frame):
        raise CompileTimeout(f"compilation stopped after {seconds:g} s (--compile-timeout)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ================================================================ decode
def expert_bytes(fmt: str, k: int, u: int) -> int:
    rows = 2 * u
    if fmt == "bf16":
        return rows * k * 2
    if fmt == "mxfp4":
        return rows * k // 2 + rows * (k // 32)  # e2m1 words + e8m0 scales
    return rows * k // 2 + 2 * rows * (k // 64) * 2  # int4 words + bf16 scales and biases


def make_weights(fmt: str, e: int, k: int, u: int):
    rows = 2 * u
    if fmt == "bf16":
        return (torch.randn(e, rows, k, device="cuda", dtype=torch.bfloat16) * 0.02,)
    if fmt == "int4t":  # the same arrays in the tiled order (gatedmlp.tile, per expert)
        return gatedmlp.tile(*make_weights("int4", e, k, u), group_size=64)
    words = torch.randint(-2**31, 2**31 - 1, (e, rows, k // 8), dtype=torch.int32, device="cuda")
    if fmt == "mxfp4":  # scales 2^-8 ... 2^-4 (e8m0 119 ... 123)
        return words, torch.randint(119, 124, (e, rows, k // 32), dtype=torch.uint8, device="cuda")
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
                if fmt == "mxfp4":
                    return gatedmlp.quantized_gather_gate_up(x, i, w[0], w[1], out=y, mode="mxfp4", bits=4,
                                                             group_size=32, check_indices=False)
                return gatedmlp.quantized_gather_gate_up(x, i, w[0], w[1], w[2] if len(w) > 2 else None, out=y,
                                                         mode="affine", bits=4,
                                                         group_size=64, check_indices=False, tiled=fmt == "int4t")

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


# ================================================================ prefill
def expert_rows(routing_name: str, e: int, per_expert: int) -> list[int]:
    """Rows of each expert among R = per_expert x E sorted rows: uniform,
    or skewed (expert 0 gets SKEW times the mean, capped at R; the rest
    split as evenly as possible over the others, the first ones taking the
    remainder, one row each)."""
    if routing_name == "uniform" or e == 1:
        return [per_expert] * e
    r = per_expert * e
    hot = min(SKEW * per_expert, r)
    base, extra = divmod(r - hot, e - 1)
    return [hot] + [base + (1 if j < extra else 0) for j in range(e - 1)]


def sorted_glu(x, w_t, offs):
    """bf16 MoE gate/up + GLU on rows already sorted by expert, as a PyTorch
    user writes it: one grouped GEMM into [R, 2U], then silu(gate) * up."""
    h = torch._grouped_mm(x, w_t, offs=offs)
    u = h.shape[1] // 2
    return F.silu(h[:, :u]) * h[:, u:]


def loop_glu(x, w13, counts):
    """The same, expert by expert with F.linear: the check's reference only
    where torch._grouped_mm cannot run."""
    u = w13.shape[1] // 2
    out = torch.empty(x.shape[0], u, device=x.device, dtype=x.dtype)
    start = 0
    for j, c in enumerate(counts):
        if c:
            h = F.linear(x[start:start + c], w13[j])
            out[start:start + c] = F.silu(h[:, :u]) * h[:, u:]
        start += c
    return out


def bench_prefill_model(name: str, per_expert_list: list[int], compile_timeout: float) -> list[dict]:
    e, _, k, u = MODELS[name]
    rows = []
    for per_expert in per_expert_list:
        r = per_expert * e
        x = torch.randn(r, k, device="cuda", dtype=torch.bfloat16)
        w13 = torch.randn(e, 2 * u, k, device="cuda", dtype=torch.bfloat16) * 0.02
        out = torch.empty(r, u, device="cuda", dtype=torch.bfloat16)
        uniform = torch.full((e,), per_expert, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)

        # _grouped_mm wants [E, K, 2U]: w13's transposed view (what a user
        # passes); if it is refused, a contiguous copy made once, here.
        w_t, w_form, base_error = w13.transpose(1, 2), "view", None
        try:
            sorted_glu(x, w_t, uniform)
        except Exception as ex:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
            print(f"{name}: torch._grouped_mm refuses the transposed view ({short(ex)}); using a contiguous copy",
                  flush=True)
            w_t, w_form = w13.transpose(1, 2).contiguous(), "contiguous"
            try:
                sorted_glu(x, w_t, uniform)
            except Exception as ex2:  # noqa: BLE001
                base_error = short(ex2)

        # The compiled baseline: one compilation per shape (the routings
        # share it: offsets are data, not shape).
        compiled, compile_s, compile_error = None, None, None
        if base_error is None and compile_timeout > 0:
            torch._dynamo.reset()
            cfn = torch.compile(sorted_glu, dynamic=False)
            t0 = time.perf_counter()
            try:
                call_with_timeout(lambda: cfn(x, w_t, uniform), compile_timeout)
                torch.cuda.synchronize()
                compiled = cfn
            except (Exception, CompileTimeout) as ex:  # noqa: BLE001 - reported, the run goes on
                compile_error = short(ex)
                torch._dynamo.reset()
            compile_s = time.perf_counter() - t0
            if compile_error:
                print(f"{name}: torch.compile of grouped_mm + GLU failed after {compile_s:.0f} s: {compile_error}",
                      flush=True)

        for routing_name in ("uniform", "skewed"):
            counts = expert_rows(routing_name, e, per_expert)
            offs = torch.tensor(counts, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
            row = {"mode": "prefill", "model": name, "routing": routing_name, "R": r, "experts": e, "K": k, "U": u,
                   "rows_per_expert": per_expert, "max_rows": max(counts), "empty_experts": counts.count(0),
                   "w_t": w_form, "flops": 2 * r * k * 2 * u}
            if compile_s is not None:
                row["compile_s"] = compile_s
            for key, v in (("grouped_mm_error", base_error), ("compile_error", compile_error)):
                if v:
                    row[key] = v
            what = f"prefill {name} {routing_name} R={r}"

            # Correctness first: gatedmlp (offsets checked) against the
            # eager baseline's GLU output.
            try:
                ref = sorted_glu(x, w_t, offs) if base_error is None else loop_glu(x, w13, counts)
                got = gatedmlp.grouped_gate_up(x, offs, w13)
                row["check_rel_max_diff"] = diff = rel_max_diff(got, ref)
                if not diff <= PREFILL_TOL:  # also catches NaN
                    fail(f"{what}: max |gatedmlp - grouped_mm + GLU| / max |grouped_mm + GLU| = {diff:.3e} "
                         f"> {PREFILL_TOL}")
                del ref, got
            except Exception as ex:  # noqa: BLE001 - gatedmlp failing is a failure of the run
                row["gatedmlp_error"] = short(ex)
                fail(f"{what}: gatedmlp.grouped_gate_up raised {short(ex)}")
                rows.append(row)
                continue

            # CUDA graphs of PREFILL_CALLS calls each; offsets go unchecked
            # inside (the check reads them back, which a capture cannot).
            try:
                us = graph_time_us([lambda: gatedmlp.grouped_gate_up(x, offs, w13, out=out, check_offsets=False)]
                                   * PREFILL_CALLS)
            except Exception as ex:  # noqa: BLE001 - gatedmlp failing is a failure of the run
                row["gatedmlp_error"] = short(ex)
                fail(f"{what}: gatedmlp.grouped_gate_up in a CUDA graph raised {short(ex)}")
                rows.append(row)
                continue
            row["gatedmlp_us"] = us
            row["gatedmlp_tflops"] = row["flops"] / (us * 1e-6) / 1e12
            baselines = [("grouped_mm", lambda: torch._grouped_mm(x, w_t, offs=offs)),
                         ("grouped_mm_glu", lambda: sorted_glu(x, w_t, offs))]
            if compiled is not None:
                baselines.append(("grouped_mm_glu_compiled", lambda: compiled(x, w_t, offs)))
            if base_error is None:
                for key, fn in baselines:
                    try:
                        row[f"{key}_us"] = b_us = graph_time_us([fn] * PREFILL_CALLS)
                        row[f"{key}_tflops"] = row["flops"] / (b_us * 1e-6) / 1e12
                        row[f"speedup_vs_{key}"] = b_us / us
                    except Exception as ex:  # noqa: BLE001 - reported, the run goes on
                        row[f"{key}_error"] = short(ex)
            glus = [row[f"{key}_us"] for key in ("grouped_mm_glu", "grouped_mm_glu_compiled") if f"{key}_us" in row]
            if glus:
                row["speedup_vs_best_glu"] = min(glus) / us
                row["bar_met"] = row["speedup_vs_best_glu"] >= PREFILL_BAR
            rows.append(row)

            def col(key, label):
                if f"{key}_us" in row:
                    return f"  {label} {row[f'{key}_us']:8.1f} us ({row[f'speedup_vs_{key}']:4.2f}x)"
                return f"  {label}: {row.get(f'{key}_error', 'not run')}"

            print(f"{name:14s} {routing_name:7s} R={r:6d} E={e:3d} K={k} U={u} max rows {max(counts):6d}  "
                  f"diff {row['check_rel_max_diff']:.1e}  gatedmlp {us:8.1f} us {row['gatedmlp_tflops']:6.1f} TFLOP/s"
                  + col("grouped_mm", "grouped_mm") + col("grouped_mm_glu", "+glu eager")
                  + col("grouped_mm_glu_compiled", "+glu compiled")
                  + (f"  bar {PREFILL_BAR}x: {'met' if row['bar_met'] else 'MISSED'}" if "bar_met" in row else ""),
                  flush=True)
        del x, w13, w_t, out, compiled
        torch._dynamo.reset()
        free_memory()
    return rows


# ================================================================ block
def events_time_us(fn, reps: int = BLOCK_REPS, target_ms: float = 100.0, warmup: int = 3):
    """(median time per call, median host time per call) in us of fn called
    back to back, CUDA events around each repeat's calls (enough of them for
    ~target_ms); the host time is the same loop's issuing, without the final
    wait. No CUDA graph: the transformers forwards do data-dependent host
    work, and their time includes it as a user's would."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    n = max(3, min(1000, int(target_ms / max(a.elapsed_time(b), 1e-3))))
    dev_us, host_us = [], []
    gc_on = gc.isenabled()
    gc.disable()  # an eager forward makes many Python objects: no collection lands in one variant's loop
    try:
        for _ in range(reps):
            torch.cuda.synchronize()
            a.record()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t1 = time.perf_counter()
            b.record()
            b.synchronize()
            dev_us.append(a.elapsed_time(b) * 1e3 / n)
            host_us.append((t1 - t0) * 1e6 / n)
    finally:
        if gc_on:
            gc.enable()
    return statistics.median(dev_us), statistics.median(host_us)


def hf_experts(name: str):
    """transformers' experts module of the model at its real sizes (a config
    of one layer), random bf16 weights on the GPU: weights of unit-scale
    preactivations for unit-scale inputs, biases of order 0.1."""
    import importlib

    import transformers

    sub, config_name, class_name, fields, _ = HF_EXPERTS[name]
    e, topk, h, i = MODELS[name]
    cfg = getattr(transformers, config_name)(num_hidden_layers=1, **fields(e, topk, h, i))
    cfg._experts_implementation = "eager"
    cls = getattr(importlib.import_module(f"transformers.models.{sub}.modeling_{sub}"), class_name)
    with torch.device("meta"):  # no throwaway float32 weights on the host
        m = cls(cfg)
    m = m.to(torch.bfloat16).to_empty(device="cuda").eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() == 3:
                # [E, out, in]; gpt-oss stores [E, in, out]
                fan_in = p.shape[1] if class_name == "GptOssExperts" else p.shape[2]
                p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
            else:
                p.normal_(0.0, 0.1, generator=gen)
    return m


def block_routing(t: int, e: int, topk: int, dtype):
    """What a top-k router hands the experts: the int64 ids of the top k of
    random logits, and the softmax over those k, in the router's dtype."""
    logits = torch.randn(t, e, device="cuda")
    top, ids = logits.topk(topk, dim=-1)
    return ids, top.softmax(-1).to(dtype)


def bench_block_model(name: str, ts: list[int], compile_timeout: float) -> list[dict]:
    from gatedmlp.torch import MoEExperts

    e, topk, h, i = MODELS[name]
    routing_dtype = HF_EXPERTS[name][4]
    hf = hf_experts(name)
    gm = MoEExperts.from_module(hf)
    params = (gatedmlp.ActivationParams(clamp_alpha=gm.clamp_alpha, clamp_limit=gm.clamp_limit)
              if gm.activation == "swiglu_clamped" else None)

    def impl(which):
        # The transformers forward reads its experts implementation from the
        # config on every call; the compiled module is only ever called
        # with "grouped_mm" set, which its guards then see unchanged.
        hf.config._experts_implementation = which

    torch._dynamo.reset()
    compiled = torch.compile(hf) if compile_timeout > 0 else None
    compile_error = None if compiled is not None else "not run (--compile-timeout 0)"
    rows = []
    for t in ts:
        x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
        ids, wts = block_routing(t, e, topk, routing_dtype)
        y = torch.empty_like(x)

        def direct():
            return gatedmlp.moe_mlp(x, ids, wts, gm.w13, gm.w2, gm.b13, gm.b2, activation=gm.activation,
                                    act_params=params, group=gm.group, first=gm.first, out=y, check_indices=False)

        row = {"mode": "block", "model": name, "T": t, "topk": topk, "experts": e, "H": h, "I": i,
               "routing_weights_dtype": str(routing_dtype).replace("torch.", ""),
               "GATEDMLP_MOE_GROUPED": os.environ.get("GATEDMLP_MOE_GROUPED")}
        what = f"block {name} T={t}"

        # Outputs first, against transformers' own loop.
        impl("eager")
        ref = hf(x, ids, wts)
        for key, fn in (("gatedmlp", lambda: gm(x, ids, wts)), ("moe_mlp", direct)):
            try:
                row[f"{key}_rel_max_diff"] = diff = rel_max_diff(fn(), ref)
                if not diff <= BLOCK_TOL:  # also catches NaN
                    fail(f"{what}: max |{key} - transformers| / max |transformers| = {diff:.3e} > {BLOCK_TOL}")
            except Exception as ex:  # noqa: BLE001 - gatedmlp failing is a failure of the run
                row[f"{key}_error"] = short(ex)
                fail(f"{what}: {key} raised {short(ex)}")
        impl("grouped_mm")
        try:
            row["hf_grouped_mm_rel_max_diff"] = rel_max_diff(hf(x, ids, wts), ref)
        except Exception as ex:  # noqa: BLE001 - a baseline that cannot run is reported, not fatal
            row["hf_grouped_mm_error"] = short(ex)
        if compiled is not None:
            # The first call at a new T may (re)compile: its time is compile_s.
            t0 = time.perf_counter()
            try:
                got = call_with_timeout(lambda: compiled(x, ids, wts), compile_timeout)
                torch.cuda.synchronize()
                row["hf_compiled_rel_max_diff"] = rel_max_diff(got, ref)
            except (Exception, CompileTimeout) as ex:  # noqa: BLE001 - reported, the run goes on
                compile_error = f"at T={t}: {short(ex)}"
                compiled = None
                torch._dynamo.reset()
            row["compile_s"] = time.perf_counter() - t0
        if compile_error:
            row["hf_compiled_error"] = compile_error
        del ref

        variants = [("hf_loop", "eager", lambda: hf(x, ids, wts)),
                    ("hf_grouped_mm", "grouped_mm", lambda: hf(x, ids, wts)),
                    ("gatedmlp", None, lambda: gm(x, ids, wts)),
                    ("moe_mlp", None, direct)]
        if compiled is not None:
            variants.insert(2, ("hf_compiled", "grouped_mm", lambda: compiled(x, ids, wts)))
        for key, which, fn in variants:
            if f"{key}_error" in row:
                continue
            if which:
                impl(which)
            try:
                row[f"{key}_us"], row[f"{key}_host_us"] = events_time_us(fn)
            except Exception as ex:  # noqa: BLE001 - reported, the run goes on
                row[f"{key}_error"] = short(ex)
        g = row.get("gatedmlp_us")
        for key in ("hf_loop", "hf_grouped_mm", "hf_compiled"):
            if g and f"{key}_us" in row:
                row[f"{key}_over_gatedmlp"] = row[f"{key}_us"] / g
        rows.append(row)

        def col(key, label):
            if f"{key}_us" not in row:
                return f"  {label}: {row.get(f'{key}_error', 'not run')}"
            s = f"  {label} {row[f'{key}_us']:9.1f} us"
            if f"{key}_over_gatedmlp" in row:
                s += f" ({row[f'{key}_over_gatedmlp']:5.2f}x)"
            elif key in ("gatedmlp", "moe_mlp"):
                s += f" (host {row[f'{key}_host_us']:6.1f})"
            return s

        diffs = " ".join(f"{row[f'{key}_rel_max_diff']:.1e}" for key in ("gatedmlp", "moe_mlp")
                         if f"{key}_rel_max_diff" in row)
        print(f"{name:14s} T={t:5d}" + col("hf_loop", "hf loop") + col("hf_grouped_mm", "hf grouped_mm")
              + col("hf_compiled", "hf compiled") + col("gatedmlp", "gatedmlp") + col("moe_mlp", "moe_mlp")
              + f"  diff {diffs}", flush=True)
        del x, ids, wts, y
    del hf, gm, compiled
    torch._dynamo.reset()
    free_memory()
    return rows


# ================================================================ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("decode", "prefill", "block"), default="decode")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=E,TOPK,H,I",
                    help="decode: a model shape of one's own (experts, top k, hidden, intermediate), "
                         "then named in --models; may be repeated")
    ap.add_argument("--t", help="tokens per call, comma-separated (decode: default 1,4,16,64; block: 1,16,512,8192)")
    ap.add_argument("--formats", default="bf16,int4,int4t,mxfp4", help="decode: weight formats")
    ap.add_argument("--rows-per-expert", help="prefill: rows per expert for every model, comma-separated "
                    "(default: " + ", ".join(f"{m} {n}" for m, n in PREFILL_ROWS.items()) + ")")
    ap.add_argument("--compile-timeout", type=float, default=600.0,
                    help="prefill, block: seconds a torch.compile baseline may take (0: not compiled)")
    ap.add_argument("--json")
    a = ap.parse_args()
    for s in a.shape:
        name, _, dims = s.partition("=")
        try:
            MODELS[name] = tuple(int(v) for v in dims.split(","))
            assert len(MODELS[name]) == 4 and min(MODELS[name]) > 0
        except (ValueError, AssertionError):
            ap.error(f"--shape {s!r}: expected NAME=E,TOPK,H,I, four positive integers")
    models = a.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    dev = torch.cuda.get_device_name(0)
    result = {"device": dev, "torch": torch.__version__, "mode": a.mode}
    rows = []
    if a.mode == "decode":
        _, _, rate = read_rates(dev)
        result["read_rate"] = rate
        for m in models:
            rows += bench_model(m, [int(v) for v in (a.t or "1,4,16,64").split(",")], a.formats.split(","), rate)
    elif a.mode == "prefill":
        print(f"device {dev}; torch {torch.__version__}; gatedmlp {gatedmlp.__version__}", flush=True)
        if not hasattr(gatedmlp, "grouped_gate_up"):
            fail("this gatedmlp has no grouped_gate_up (the grouped prefill API)")
            return 1
        for m in models:
            per = [int(v) for v in a.rows_per_expert.split(",")] if a.rows_per_expert else [PREFILL_ROWS[m]]
            rows += bench_prefill_model(m, per, a.compile_timeout)
    else:
        import transformers

        transformers.logging.set_verbosity_error()
        result["transformers"] = transformers.__version__
        print(f"device {dev}; torch {torch.__version__}; transformers {transformers.__version__}; "
              f"gatedmlp {gatedmlp.__version__}; GATEDMLP_MOE_GROUPED={os.environ.get('GATEDMLP_MOE_GROUPED', '')}",
              flush=True)
        with torch.no_grad():  # inference: MoEExperts refuses to run where a gradient would be needed
            for m in models:
                rows += bench_block_model(m, [int(v) for v in (a.t or "1,16,512,8192").split(",")],
                                          a.compile_timeout)
    for r in rows:
        r.setdefault("mode", a.mode)
    result["rows"] = rows
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
