#!/usr/bin/env python3
"""Chart of `gatedmlp bench --json FILE`: TFLOP/s against M per model, with the roofline.

    python3 -m pip install -r scripts/requirements-chart.txt
    build/tools/gatedmlp bench --model all --json bench.json
    python3 scripts/bench_chart.py bench.json -o docs/bench.png

One column of panels per model in the JSON (the Llama-3 8B / 70B / 405B shapes
on the first row, the small shapes of `--model small` on the next, a custom
--k/--u shape after them). Each column has:

  * top: TFLOP/s (2 M K 2U / time) of the three paths the bench times in the
    same run -- the fused kernel, cuBLAS's GEMM alone (into [M, 2U]) and
    cuBLAS's GEMM + the GLU kernel -- against M, both axes log, under the
    roofline: attainable TFLOP/s = FLOPs / max(FLOPs / C, bytes / BW), with
    bytes = X + W + Y (+ the pre-activation when the run had --preact) at the
    run's dtype sizes, as docs/notes/floors-and-ceilings.md counts them ("The
    two numbers"). The roofline is the thick grey band, the compute ceiling C
    a dotted line, the memory line (BW x FLOPs / bytes) a dashed one, and the
    ridge M (where the two meet) a vertical dash-dot line.
  * bottom (unless --no-ratios): cuBLAS GEMM time / fused time and
    (cuBLAS GEMM + GLU) time / fused time, linear; above 1 the fused call is
    faster. At the top's scale the three paths often lie within a few
    percent of each other, which only the ratios show.

Why the top is log-log: M runs over 1 ... 65536 and the attainable rate over
~0.003 ... ~800 TFLOP/s; on a linear axis every point below M = 256 (the
weight-streaming regime) would sit on zero, and the memory-bound part of the
roofline is a straight line only in log-log.

Times: the JSON holds milliseconds per call for every row ("fused_ms",
"gemm_ms", "unfused_ms"); rows with "timing": "graph" (the small models, or
--graph) are per-call medians of CUDA-graph replays (the bench's table prints
those in microseconds), the others medians of CUDA-event timings. TFLOP/s are
recomputed from the times. Skipped rows and missing times leave gaps; a row
with "bad": true (the fused output disagreed with unfused) is marked with a
red cross.

Ceilings (C in TFLOP/s, BW in TB/s), first found wins:
  1. --ceiling-tflops / --ceiling-tbps;
  2. "ceiling_tflops" / "ceiling_tbps" in the JSON (bench.cpp does not write
     them today; add them by hand to pin a chart's roofline);
  3. the defaults for the JSON's "device" (--list-ceilings prints them):
     H100 SXM (80GB HBM3): 790 TFLOP/s, 3.35 TB/s
     H200:                 790 TFLOP/s, 4.8 TB/s
     C is the dense bf16 rate cuBLAS reaches on large gate/up GEMMs
     (docs/notes/floors-and-ceilings.md: 750-780 TFLOP/s measured on the H100;
     the 989 TFLOP/s datasheet peak is never reached with the clocks free), BW
     the HBM datasheet rate (docs/notes/drop-in-and-decode.md: the decode
     kernel streams weights at 3.0 TB/s on the H100; the H200 reads 4.3-4.8).
     Another device needs the two options, or --no-roofline.

Title and footnote: device, commit ("git_commit", or --commit) and date
(--date; else a "date" key in the JSON; else the JSON file's modification
date, marked as such), and the run's settings. A JSON with "synthetic": true
(the test fixture) is labelled SYNTHETIC in the title.

Headless: the Agg backend, no display needed. Exits 1 with a message naming
what is missing when the JSON is not a `gatedmlp bench` rows file.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import sys
import textwrap
from typing import NoReturn

PROG = "bench_chart.py"

# (regex on the JSON's "device", C TFLOP/s, BW TB/s, where the numbers come from)
DEVICE_CEILINGS = [
    (r"H200", 790.0, 4.8,
     "H200: dense bf16 as cuBLAS reaches it on the H100 (same GH100 SMs), HBM3e datasheet 4.8 TB/s"),
    (r"H100.*(HBM3|SXM)", 790.0, 3.35,
     "H100 SXM: dense bf16 as cuBLAS reaches it (docs/notes/floors-and-ceilings.md: 750-780 measured), HBM3 datasheet 3.35 TB/s"),
]

# Panel order and names. Models not listed here come after, in JSON order.
LARGE_MODELS = [("8b", "Llama-3 8B"), ("70b", "Llama-3 70B"), ("405b", "Llama-3 405B")]
SMALL_MODELS = [("qwen-0.5b", "Qwen2.5-0.5B"), ("1024x2816", "1024 x 2816 (Qwen1.5-0.5B)"),
                ("llama-1b", "Llama-3.2-1B"), ("llama-3b", "Llama-3.2-3B")]
MODEL_LABELS = dict(LARGE_MODELS + SMALL_MODELS + [("custom", "custom shape")])

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
REQUIRED_ROW_KEYS = ("model", "m", "k", "u", "fused_ms", "gemm_ms", "unfused_ms")

PATHS = [  # (row key, legend label, colour, marker)
    ("fused_ms", "gatedmlp (fused GEMM + GLU)", "#1f77b4", "o"),
    ("gemm_ms", "cuBLAS GEMM alone", "#ff7f0e", "s"),
    ("unfused_ms", "cuBLAS GEMM + GLU kernel", "#2ca02c", "^"),
]


def fail(msg: str) -> NoReturn:
    sys.stderr.write(f"{PROG}: error: {msg}\n")
    raise SystemExit(1)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Chart `gatedmlp bench --json FILE` as TFLOP/s against M per model, with the roofline "
                    "(compute and memory ceilings) and the time ratios against the fused kernel.",
        epilog="Example: python3 -m pip install -r scripts/requirements-chart.txt && "
               "python3 scripts/bench_chart.py bench.json -o docs/bench.png",
    )
    p.add_argument("json", nargs="?", help="the file `gatedmlp bench --json FILE` wrote")
    p.add_argument("-o", "--output", default="bench.png", help="PNG to write (default: bench.png); "
                   "its folder is created if missing")
    p.add_argument("--ceiling-tflops", type=float, metavar="C",
                   help="compute ceiling, dense TFLOP/s (default: the JSON's 'ceiling_tflops', else per device)")
    p.add_argument("--ceiling-tbps", type=float, metavar="BW",
                   help="memory ceiling, TB/s (default: the JSON's 'ceiling_tbps', else per device)")
    p.add_argument("--no-roofline", action="store_true", help="draw no roofline (any device)")
    p.add_argument("--no-ratios", action="store_true", help="leave out the time-ratio panels")
    p.add_argument("--models", metavar="LIST",
                   help="comma-separated models to draw, in this order (default: all in the JSON)")
    p.add_argument("--title", help="first title line (default: what the chart compares, and the device)")
    p.add_argument("--date", help="the run's date for the title (default: the JSON's 'date', else the file's "
                   "modification date)")
    p.add_argument("--commit", help="the commit for the title (default: the JSON's 'git_commit')")
    p.add_argument("--dpi", type=int, default=110, help="PNG resolution (default 110)")
    p.add_argument("--list-ceilings", action="store_true", help="print the per-device default ceilings and exit")
    args = p.parse_args(argv)
    if args.list_ceilings:
        for pattern, c, bw, why in DEVICE_CEILINGS:
            print(f"/{pattern}/: {c:g} TFLOP/s, {bw:g} TB/s  ({why})")
        raise SystemExit(0)
    if not args.json:
        p.error("the bench JSON is required")
    for name in ("ceiling_tflops", "ceiling_tbps"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            p.error(f"--{name.replace('_', '-')} must be a positive number, got {v}")
    if args.dpi < 20:
        p.error("--dpi must be >= 20")
    return args


# ---------------------------------------------------------------- reading

def num(v):
    """A JSON number as float; null (bench.cpp's non-finite) and anything else as NaN."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        fail(f"{path}: no such file (write one with `gatedmlp bench --model all --json {path}`)")
    except (OSError, UnicodeDecodeError) as e:
        fail(f"{path}: cannot read: {e}")
    except json.JSONDecodeError as e:
        fail(f"{path}: not valid JSON ({e}); is the bench run complete?")
    if not isinstance(doc, dict):
        fail(f"{path}: expected a JSON object as `gatedmlp bench --json` writes, got {type(doc).__name__}")
    tool = doc.get("tool")
    if tool == "gatedmlp bench --host":
        fail(f"{path}: this is `gatedmlp bench --host` output (host time per call), which has no rows per M "
             "to chart; run `gatedmlp bench --model all --json FILE`")
    if tool is not None and tool != "gatedmlp bench":
        fail(f"{path}: 'tool' is {tool!r}, expected 'gatedmlp bench'")
    rows = doc.get("rows")
    if not isinstance(rows, list):
        fail(f"{path}: no 'rows' list: not the JSON of `gatedmlp bench --json FILE`")
    if not rows:
        fail(f"{path}: 'rows' is empty: the bench timed no shape")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            fail(f"{path}: rows[{i}] is not an object")
        missing = [k for k in REQUIRED_ROW_KEYS if k not in r]
        if missing:
            fail(f"{path}: rows[{i}] lacks {', '.join(missing)} (needs {', '.join(REQUIRED_ROW_KEYS)})")
        for k in ("m", "k", "u"):
            if not (isinstance(r[k], int) and not isinstance(r[k], bool) and r[k] >= 1):
                fail(f"{path}: rows[{i}].{k} must be an integer >= 1, got {r[k]!r}")
    timed = [r for r in rows if not r.get("skipped") and any(num(r[k]) > 0 for k, *_ in PATHS)]
    if not timed:
        fail(f"{path}: none of the {len(rows)} rows has a time (all skipped, or every time null)")
    return doc


def dtype_bytes(doc, key, default="bf16"):
    name = doc.get(key) or default
    if name not in DTYPE_BYTES:
        fail(f"'{key}' is {name!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def ceilings(args, doc):
    """(C TFLOP/s, BW TB/s, source text) or None for no roofline."""
    if args.no_roofline:
        return None
    device = str(doc.get("device", ""))
    c, bw, src = args.ceiling_tflops, args.ceiling_tbps, []
    if c is not None or bw is not None:
        src.append("options")
    if c is None and num(doc.get("ceiling_tflops")) > 0:
        c = num(doc["ceiling_tflops"])
        src.append("JSON")
    if bw is None and num(doc.get("ceiling_tbps")) > 0:
        bw = num(doc["ceiling_tbps"])
        if "JSON" not in src:
            src.append("JSON")
    if c is None or bw is None:
        for pattern, dc, dbw, _why in DEVICE_CEILINGS:
            if re.search(pattern, device):
                if c is None:
                    c = dc
                if bw is None:
                    bw = dbw
                src.append(f"defaults for {device}")
                break
    if c is None or bw is None:
        fail(f"no default ceilings for device {device!r} (known: "
             + ", ".join(f"/{p}/" for p, *_ in DEVICE_CEILINGS)
             + "); pass --ceiling-tflops C and --ceiling-tbps BW, or --no-roofline")
    return c, bw, " + ".join(src)


# ---------------------------------------------------------------- the model

def flops(m, k, u):
    return 2.0 * m * k * 2.0 * u


def problem_bytes(m, k, u, s_in, s_out, s_pre):
    """X + W + Y (+ the pre-activation [M, 2U]) in bytes: the least one call must move."""
    return s_in * (m * k + 2.0 * u * k) + s_out * m * u + s_pre * 2.0 * m * u


def ridge_m(k, u, c_tflops, bw_tbps, s_in, s_out, s_pre):
    """The M where FLOPs / C = bytes / BW (compute-bound above it); None if never."""
    c, bw = c_tflops * 1e12, bw_tbps * 1e12
    den = 4.0 * k * u * bw - c * (s_in * k + s_out * u + s_pre * 2.0 * u)
    if den <= 0:
        return None
    return 2.0 * c * s_in * u * k / den


def m_label(m):
    if m >= 1024 and m % 1024 == 0:
        return f"{m // 1024}k"
    return str(m)


def group_models(doc, only):
    groups = {}
    for r in doc["rows"]:
        groups.setdefault(r["model"], []).append(r)
    for name, rows in groups.items():
        shapes = {(r["k"], r["u"]) for r in rows}
        if len(shapes) > 1:
            fail(f"model {name!r} has rows of several shapes {sorted(shapes)}; one (K, U) per model expected")
    if only:
        wanted = [s.strip() for s in only.split(",") if s.strip()]
        unknown = [w for w in wanted if w not in groups]
        if unknown:
            fail(f"--models: {', '.join(unknown)} not in the JSON (it has {', '.join(groups)})")
        return [[w for w in wanted]], groups
    large = [n for n, _ in LARGE_MODELS if n in groups]
    small = [n for n, _ in SMALL_MODELS if n in groups]
    other = [n for n in groups if n not in large and n not in small]
    layout = [row for row in (large + other, small) if row]
    return layout, groups


# ---------------------------------------------------------------- drawing

def draw(args, doc, out_path):
    try:
        import matplotlib
    except ImportError:
        fail("matplotlib is not installed: python3 -m pip install -r scripts/requirements-chart.txt")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    s_in = dtype_bytes(doc, "input_dtype")
    s_out = dtype_bytes(doc, "output_dtype", doc.get("input_dtype") or "bf16")
    s_pre = dtype_bytes(doc, "preact") if doc.get("preact") else 0
    ceil = ceilings(args, doc)
    layout, groups = group_models(doc, args.models)

    ncols = max(len(r) for r in layout)
    ratios = not args.no_ratios
    any_bad = any(r.get("bad") and num(r["fused_ms"]) > 0 for r in doc["rows"])

    # The texts first: the figure's head and foot are sized from their lines,
    # so the title, legend and footnote never overlap the panels.
    col_w = 4.3
    W = max(col_w * ncols, 6.4)
    device = doc.get("device", "unknown device")
    commit = args.commit or doc.get("git_commit") or "unknown commit"
    if args.date:
        date = args.date
    elif doc.get("date"):
        date = str(doc["date"])
    else:
        mtime = _dt.datetime.fromtimestamp(os.path.getmtime(args.json))
        date = f"{mtime:%Y-%m-%d} (file date)"
    head = args.title or f"gatedmlp fused gate/up GEMM + GLU against cuBLAS on {device}"
    sub = f"commit {commit} · {date}"
    if doc.get("synthetic"):
        sub += " · SYNTHETIC DATA (test fixture), not a measurement"
    wrap = max(40, int(W * 10))
    title = textwrap.fill(head, wrap) + "\n" + textwrap.fill(sub, wrap)

    inp = doc.get("input_dtype", "bf16")
    outp = doc.get("output_dtype", inp)
    run = (f"layout {doc.get('layout', '?')}, {doc.get('activation', '?')}, {inp} -> {outp}"
           + (f", +preact {doc['preact']}" if doc.get("preact") else "")
           + f"; schedule {doc.get('schedule', '?')}, path {doc.get('force_path', '?')}, "
           f"cuBLAS {doc.get('cublas_mode', '?')}; driver {doc.get('driver_version', '?')}, "
           f"runtime {doc.get('runtime_version', '?')}, cuBLASLt {doc.get('cublaslt_version', '?')}")
    foot = [f"{device} (sm_{str(doc.get('compute_capability', '?')).replace('.', '')}, "
            f"{doc.get('sm_count', '?')} SMs). {run}.",
            "Times: medians per call (CUDA events; the small shapes in CUDA-graph replay), inputs rotated "
            "past twice the L2, the three paths in the same run."]
    if ceil:
        c, bw, src = ceil
        pre = " + pre-activation" if s_pre else ""
        foot.append(f"Roofline: FLOPs / max(FLOPs / {c:g} TFLOP/s, bytes / {bw:g} TB/s), "
                    f"bytes = X + W + Y{pre} ({inp}/{outp}); ceilings from {src}.")
    foot = "\n".join(textwrap.fill(line, max(50, int(W * 19))) for line in foot)

    handles = [Line2D([], [], color=col, marker=mk, lw=1.6, ms=5, label=lab) for _k, lab, col, mk in PATHS]
    if ceil:
        c, bw, _ = ceil
        handles += [
            Line2D([], [], color="0.55", lw=6, alpha=0.35, label="roofline: attainable TFLOP/s"),
            Line2D([], [], color="0.35", lw=1, ls=":", label=f"compute ceiling {c:g} TFLOP/s"),
            Line2D([], [], color="0.35", lw=1, ls="--", label=f"memory line {bw:g} TB/s x FLOPs / bytes"),
        ]
    if any_bad:
        handles.append(Line2D([], [], color="red", marker="x", lw=0, ms=8, mew=2,
                              label="fused output disagreed with unfused ('bad')"))
    leg_cols = min(len(handles), 3 if W >= 11 else 2)
    leg_rows = math.ceil(len(handles) / leg_cols)

    # Sizes in inches.
    title_in = 0.1 + 0.21 * (title.count("\n") + 1)
    legend_in = 0.1 + 0.2 * leg_rows
    head_in = title_in + legend_in + 0.6  # + the first row's two-line panel titles
    foot_in = 0.55 + 0.14 * (foot.count("\n") + 1)  # the x label, then the footnote
    top_h, ratio_h, inner = 3.0, (1.3 if ratios else 0.0), (0.08 if ratios else 0.0)
    row_h, row_gap = top_h + ratio_h + inner, 1.05
    left_in, right_in = 0.75, 0.2
    H = head_in + len(layout) * row_h + (len(layout) - 1) * row_gap + foot_in
    fig = plt.figure(figsize=(W, H))
    outer = fig.add_gridspec(len(layout), ncols, left=left_in / W, right=1 - right_in / W,
                             top=1 - head_in / H, bottom=foot_in / H, hspace=row_gap / row_h,
                             wspace=0.6 / (col_w - 0.6))
    fig.suptitle(title, y=1 - 0.1 / H, va="top", fontsize=11.5,
                 color="firebrick" if doc.get("synthetic") else "black")
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - (0.05 + title_in) / H),
               ncols=leg_cols, fontsize=8.5, frameon=False)
    fig.text(0.5, 0.08 / H, foot, ha="center", va="bottom", fontsize=7.5, color="0.3")

    for li, names in enumerate(layout):
        for ci, name in enumerate(names):
            rows = sorted(groups[name], key=lambda r: r["m"])
            k, u = rows[0]["k"], rows[0]["u"]
            if ratios:
                cell = outer[li, ci].subgridspec(2, 1, height_ratios=[top_h, ratio_h], hspace=inner / 2.0)
                ax = fig.add_subplot(cell[0])
                axr = fig.add_subplot(cell[1], sharex=ax)
            else:
                ax, axr = fig.add_subplot(outer[li, ci]), None
            ms_all = [r["m"] for r in rows]
            lo, hi = min(ms_all) / 1.4, max(ms_all) * 1.4

            yvals = []  # what the y range must show: the data and the attainable rate
            # The roofline, behind the data.
            rm = None
            if ceil:
                c, bw, _ = ceil
                grid = np.geomspace(lo, hi, 256)
                f = flops(grid, k, u)
                mem = bw * 1e12 * f / problem_bytes(grid, k, u, s_in, s_out, s_pre) / 1e12
                roof = np.minimum(mem, c)
                yvals += [float(roof.min()), float(roof.max())]
                ax.plot(grid, roof, color="0.55", lw=6, alpha=0.35, solid_capstyle="butt", zorder=1)
                ax.axhline(c, color="0.35", lw=1, ls=":", zorder=1)
                ax.plot(grid, mem, color="0.35", lw=1, ls="--", zorder=1)
                rm = ridge_m(k, u, c, bw, s_in, s_out, s_pre)
                if rm is not None and lo < rm < hi:
                    ax.axvline(rm, color="0.6", lw=0.8, ls="-.", zorder=1)
                    ax.text(rm * 1.12, 0.03, f"ridge\nM≈{rm:.0f}", transform=ax.get_xaxis_transform(),
                            fontsize=7.5, color="0.35", va="bottom")

            for key, label, color, marker in PATHS:
                # A missing time is a NaN: the line breaks there instead of bridging it.
                xs, ys = [], []
                for r in rows:
                    t = num(r[key])
                    xs.append(r["m"])
                    ys.append(flops(r["m"], k, u) / (t * 1e-3) / 1e12 if t > 0 and not r.get("skipped")
                              else math.nan)
                yvals += [y for y in ys if y > 0]
                z = 5 if key == "fused_ms" else 3  # the fused line on top where the three meet
                ax.plot(xs, ys, color=color, marker=marker, ms=4.5, lw=1.6, zorder=z)
                if axr is not None and key != "fused_ms":
                    rx, ry = [], []
                    for r in rows:
                        tf, t = num(r["fused_ms"]), num(r[key])
                        rx.append(r["m"])
                        ry.append(t / tf if tf > 0 and t > 0 and not r.get("skipped") else math.nan)
                    axr.plot(rx, ry, color=color, marker=marker, ms=4.5, lw=1.6, zorder=3)
            for r in rows:
                if r.get("bad") and num(r["fused_ms"]) > 0:
                    y = flops(r["m"], k, u) / (num(r["fused_ms"]) * 1e-3) / 1e12
                    ax.plot([r["m"]], [y], marker="x", color="red", ms=10, mew=2, zorder=4)
            skipped = [m_label(r["m"]) for r in rows if r.get("skipped")]

            graph = any(r.get("timing") == "graph" for r in rows)
            title = f"{MODEL_LABELS.get(name, name)}\nK={k}, U={u}"
            title += ", CUDA-graph timing" if graph else ""
            ax.set_title(title, fontsize=9.5)
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(lo, hi)
            ax.set_ylim(min(yvals) / 1.7, max(yvals) * 1.7)
            if ceil:
                c = ceil[0]
                if c > max(yvals) * 1.7:
                    where = f"compute-bound from M≈{rm:,.0f}" if rm is not None else "never compute-bound"
                    ax.text(0.98, 0.03, f"memory-bound: compute ceiling {c:g} TFLOP/s\noff scale, {where}",
                            transform=ax.transAxes, ha="right", va="bottom", fontsize=7.5, color="0.35")
            ticks = sorted(set(ms_all))
            for a in (ax, axr):
                if a is None:
                    continue
                a.xaxis.set_major_locator(FixedLocator(ticks))
                a.xaxis.set_minor_locator(NullLocator())
                a.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: m_label(int(round(v)))))
                a.grid(True, which="major", color="0.9", lw=0.6)
                a.tick_params(labelsize=8)
            ax.grid(True, which="minor", axis="y", color="0.95", lw=0.4)
            if ci == 0:
                ax.set_ylabel("TFLOP/s (2·M·K·2U / time)", fontsize=8.5)
            if skipped:
                ax.text(0.02, 0.97, "skipped: M = " + ", ".join(skipped), transform=ax.transAxes,
                        fontsize=7.5, va="top", color="firebrick")
            if axr is not None:
                plt.setp(ax.get_xticklabels(), visible=False)
                axr.axhline(1.0, color=PATHS[0][2], lw=1.2)
                axr.set_xlabel("M (rows of X, tokens)", fontsize=8.5)
                ylo, yhi = axr.get_ylim()
                axr.set_ylim(min(ylo, 0.95), max(yhi, 1.05))
                if ci == 0:
                    axr.set_ylabel("time / fused time\n(> 1: fused faster)", fontsize=8)
            else:
                ax.set_xlabel("M (rows of X, tokens)", fontsize=8.5)

    folder = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(folder, exist_ok=True)
    try:
        fig.savefig(out_path, dpi=args.dpi, format="png")
    except OSError as e:
        fail(f"cannot write {out_path}: {e}")
    plt.close(fig)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    doc = load(args.json)
    draw(args, doc, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
