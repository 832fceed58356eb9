#!/usr/bin/env bash
# Warp stall reasons and instruction counts of the probe kernels against the
# library's, one M, in the probe harness (scripts/probe-wide-tile.sh with
# LIB=$BUILD): ncu over the check phase (each variant launched once, in the
# harness's order), caches and clocks left as they are. Prints per kernel
# its time, instructions executed, and every stall reason above 0.05 warps
# per issued instruction.
#   BUILD=build-ab scripts/probe-lib-stalls.sh [M]      (default 512)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-/tmp}"
b="${BUILD:-build-ab}"
m="${1:-512}"
[ -f "$b/src/libgatedmlp.a" ] || { echo "$b/src/libgatedmlp.a missing (scripts/probe-waves.sh builds it)"; exit 1; }
LIB="$b" OUT="$out" scripts/probe-wide-tile.sh "$m" >/dev/null || exit 1
ncu --cache-control none --clock-control none -k regex:"probe_kernel|sm90_gemm_glu_kernel" --launch-count 16 \
  --section WarpStateStats --metrics gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second \
  --page raw --csv "$out/wide_tile" "$m" >"$out/stalls.csv" 2>/dev/null
python3 - "$out/stalls.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
names, units = rows[hdr], rows[hdr + 1]
want = [j for j, n in enumerate(names) if n in ("gpu__time_duration.sum", "smsp__inst_executed.sum", "sm__cycles_elapsed.avg.per_second")
        or ("issue_stalled" in n and n.endswith("per_issue_active.ratio"))]
kcol = names.index("Kernel Name")
for r in rows[hdr + 2:]:
    if len(r) < len(names): continue
    k = r[kcol].replace("(anonymous namespace)::", "").replace("gatedmlp::", "")[:60]
    parts = []
    for j in want:
        try: v = float(r[j].replace(",", ""))
        except ValueError: continue
        n = names[j].replace("smsp__average_warps_issue_stalled_", "").replace("_per_issue_active.ratio", "")
        if "issue_stalled" in names[j] and v < 0.05: continue
        parts.append(f"{n}={v:.4g}")
    print(k + "\n   " + " ".join(parts))
PY
