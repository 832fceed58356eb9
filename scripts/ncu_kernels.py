#!/usr/bin/env python3
"""Per-kernel summary of an `ncu --csv` run of `gatedmlp bench` (profile-ceiling.sh).

Groups the profiled launches by kernel (the fused kernel by its template
arguments, so the pre-activation kernels (PRE = 1) stand apart; every other
GEMM kernel as cuBLAS; the unfused path's elementwise kernel as glu), prints
the median of each metric per kernel, then two bounds:

  unfused / fused    = (t_cublas + t_glu) / t_fused, what the bench's "unfused"
                       column measures, here at the profiled clock;
  ... at peak        = the same with the fused kernel's time cut to its share
                       of the tensor peak: what a fused kernel could reach with
                       its tensor pipe never idle at this clock, the ratio's
                       ceiling. The share is FLOPS / (time x clock x SMs x
                       4096, the dense 16-bit FLOPs per SM and clock of sm_90:
                       989 TFLOP/s at 1.83 GHz on 132 SMs) when --flops gives
                       the GEMM's FLOPs, else ncu's tensor-pipe activity.

usage: ncu_kernels.py FILE.csv [--flops F]
"""
import csv
import re
import statistics
import sys

TIME = "gpu__time_duration.sum"
CLOCK = "sm__cycles_elapsed.avg.per_second"
SMS = "device__attribute_multiprocessor_count"
PEAK_PER_SM_CLOCK = 4096
GMMA = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
SHOW = [
    (TIME, "time us", 1e-3),
    (CLOCK, "clock GHz", 1e-9),
    (GMMA, "tensor %", 1),
    ("dram__bytes_read.sum", "DRAM rd MB", 1e-6),
    ("dram__bytes_write.sum", "DRAM wr MB", 1e-6),
    ("lts__t_sector_hit_rate.pct", "L2 hit %", 1),
]
# ncu prints times in ns or us, byte counts in byte/Kbyte/Mbyte/Gbyte, rates
# in hz/Khz/Mhz/Ghz, depending on size: bring each to the base unit.
SCALE = {"ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "nsecond": 1,
         "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
         "hz": 1, "Khz": 1e3, "Mhz": 1e6, "Ghz": 1e9, "cycle/second": 1,
         "cycle/nsecond": 1e9, "cycle/usecond": 1e6, "%": 1, "": 1}


def label(name):
    m = re.search(r"sm90_gemm_glu_kernel<([^>]*)>", name)
    if m:
        args = [a.strip() for a in m.group(1).split(",")]
        # <T, ACT, CM, PRE, BNO>
        if len(args) == 5:
            return f"fused PRE={args[3]} CM={args[2]} BNO={args[4]}"
        return "fused " + m.group(1)
    if "sm80_gemm_glu" in name:
        return "fused (portable)"
    if re.search(r"\bglu_kernel\b", name):
        return "glu (unfused)"
    return "cublas gemm"


def main(path, flops):
    per = {}
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    head = next((i for i, r in enumerate(rows) if "Metric Name" in r), None)
    if head is None:
        sys.exit(f"{path}: no ncu CSV table (ncu failed? see the .log beside it)")
    cols = rows[head]
    k_name, k_id = cols.index("Kernel Name"), cols.index("ID")
    k_metric, k_unit, k_value = cols.index("Metric Name"), cols.index("Metric Unit"), cols.index("Metric Value")
    for r in rows[head + 1:]:
        if len(r) < len(cols):
            continue
        try:
            v = float(r[k_value].replace(",", "")) * SCALE.get(r[k_unit], 1)
        except ValueError:
            continue
        per.setdefault(label(r[k_name]), {}).setdefault(r[k_metric], {})[r[k_id]] = v
    if not per:
        sys.exit(f"{path}: no kernels")
    med = {k: {m: statistics.median(vals.values()) for m, vals in ms.items()} for k, ms in per.items()}
    def share(k):  # of the tensor peak, in %
        m = med[k]
        if flops and TIME in m and CLOCK in m and m.get(SMS):
            return 100 * flops / (m[TIME] * 1e-9 * m[CLOCK] * m[SMS] * PEAK_PER_SM_CLOCK)
        return m.get(GMMA)

    print(f"{'kernel':34s} {'n':>3s} " + " ".join(f"{h:>10s}" for _, h, _ in SHOW) + ("  peak %" if flops else ""))
    for k in sorted(med):
        n = max(len(v) for v in per[k].values())
        cells = [f"{med[k][m] * s:10.3f}" if m in med[k] else f"{'-':>10s}" for m, _, s in SHOW]
        tail = f"  {share(k):6.1f}" if flops and share(k) and not k.startswith("glu") else ""
        print(f"{k:34s} {n:3d} " + " ".join(cells) + tail)
    cub, glu = med.get("cublas gemm", {}).get(TIME), med.get("glu (unfused)", {}).get(TIME)
    for k in sorted(med):
        if not k.startswith("fused") or TIME not in med[k]:
            continue
        t, busy = med[k][TIME], share(k)
        line = f"{k}: cublas / fused {cub / t:.3f}" if cub else k
        if cub and glu:
            line += f", unfused / fused {(cub + glu) / t:.3f} (glu {100 * glu / (cub + glu):.1f} % of unfused)"
            if busy:
                line += f", at peak {(cub + glu) / (t * busy / 100):.3f}"
        print(line)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and sys.argv[2] != "--flops"):
        sys.exit(__doc__)
    main(sys.argv[1], float(sys.argv[3]) if len(sys.argv) == 4 else None)
