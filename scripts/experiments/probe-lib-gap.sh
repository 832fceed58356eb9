#!/usr/bin/env bash
# Experiment h33 (docs/notes, what the library adds to the probe kernel): ncu timings, stalls and SASS hot spots of the library's calls against the probe kernels of the same tile.
# Where does the library lose against the probe kernels of the same tile?
# The probe harness (scripts/experiments/probe-wide-tile.sh) with the library's calls in
# it (LIB=$BUILD; BUILD default build-ab, the tool and library built by
# scripts/experiments/probe-waves.sh if missing), then ncu over the harness's check
# phase, where each variant runs once in the harness's order (counted from
# 1: scripts/experiments/probes/wide_tile.cu main()). Caches and clocks are left as they
# are. Output to $OUT (default /tmp).
#   scripts/experiments/probe-lib-gap.sh time [M list] [M]   timings at each M of the list
#       (default 512,1024,4096), then per kernel at M (default 512) its time,
#       DRAM bytes read, L2 hit rate and clock
#   scripts/experiments/probe-lib-gap.sh stalls [M]          per kernel its time,
#       instructions executed and every stall reason above 0.05 warps per
#       issued instruction
#   scripts/experiments/probe-lib-gap.sh source [M] [launch ...]   per SASS instruction
#       and per opcode, for the given launches (default 4 = n88s5-tma and
#       20 = lib-88-c1)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-/tmp}"
b="${BUILD:-build-ab}"
mode="${1:-time}"
shift || true
kernels='probe_kernel|sm90_gemm_glu_kernel'
launches_in_check=20  # the variants of wide_tile.cu main(), each launched once
[ -f "$b/src/libgatedmlp.a" ] || SETTINGS="-" BUILD="$b" MODEL=8b scripts/experiments/probe-waves.sh 512 >/dev/null || exit 1
case "$mode" in
time)
  ms="${1:-512,1024,4096}" m="${2:-512}"
  LIB="$b" OUT="$out" scripts/experiments/probe-wide-tile.sh ${ms//,/ } | grep -v "^ptxas" || exit 1
  ncu --cache-control none --clock-control none -k regex:"$kernels" --launch-count $launches_in_check \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg.per_second \
    "$out/wide_tile" "$m" 2>&1 | grep -E "$kernels|gpu__time|dram__bytes|hit_rate|per_second" |
    sed -E 's/\(int, int, int, int\)|Context.*//' | cut -c1-150 ;;
stalls)
  m="${1:-512}"
  LIB="$b" OUT="$out" scripts/experiments/probe-wide-tile.sh "$m" >/dev/null || exit 1
  ncu --cache-control none --clock-control none -k regex:"$kernels" --launch-count $launches_in_check \
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
  ;;
source)
  m="${1:-512}"
  shift || true
  launches=("$@")
  [ ${#launches[@]} -eq 0 ] && launches=(4 20)
  LIB="$b" OUT="$out" scripts/experiments/probe-wide-tile.sh "$m" >/dev/null || exit 1
  for n in "${launches[@]}"; do
    ncu --cache-control none --clock-control none -k regex:"$kernels" --launch-skip $((n - 1)) --launch-count 1 \
      --section SourceCounters --section WarpStateStats --import-source no -f -o "$out/src$n" "$out/wide_tile" "$m" >/dev/null 2>&1
    ncu -i "$out/src$n.ncu-rep" --page source --csv --print-source sass >"$out/src$n.csv" 2>&1
    echo "== launch $n: $(ncu -i "$out/src$n.ncu-rep" --page details 2>/dev/null | grep -m1 -oE "($kernels)<[^>]*>")"
    python3 scripts/ncu_source_top.py "$out/src$n.csv" 25
  done ;;
*) echo "usage: scripts/experiments/probe-lib-gap.sh time|stalls|source ..."; exit 2 ;;
esac
