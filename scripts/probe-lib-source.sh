#!/usr/bin/env bash
# Where the warps of a probe kernel and of the library's kernel stall, per
# SASS instruction and per opcode (ncu source counters), in the probe
# harness at one M: launches of the check phase, counted from 1 in the
# harness's order (scripts/probes/wide_tile.cu main(); default 4 = n88s5-tma
# and 16 = lib-88-c1).
#   BUILD=build-ab scripts/probe-lib-source.sh [M] [launch ...]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-/tmp}"
b="${BUILD:-build-ab}"
m="${1:-512}"
shift || true
launches=("$@")
[ ${#launches[@]} -eq 0 ] && launches=(4 16)
[ -f "$b/src/libgatedmlp.a" ] || { echo "$b/src/libgatedmlp.a missing (scripts/probe-waves.sh builds it)"; exit 1; }
[ -x "$out/wide_tile" ] || { LIB="$b" OUT="$out" scripts/probe-wide-tile.sh "$m" >/dev/null || exit 1; }
for n in "${launches[@]}"; do
  ncu --cache-control none --clock-control none -k regex:"probe_kernel|sm90_gemm_glu_kernel" --launch-skip $((n - 1)) \
    --launch-count 1 --section SourceCounters --section WarpStateStats --import-source no -f -o "$out/src$n" \
    "$out/wide_tile" "$m" >/dev/null 2>&1
  ncu -i "$out/src$n.ncu-rep" --page source --csv --print-source sass >"$out/src$n.csv" 2>&1
  echo "== launch $n: $(ncu -i "$out/src$n.ncu-rep" --page details 2>/dev/null | grep -m1 -oE '(probe_kernel|sm90_gemm_glu_kernel)<[^>]*>')"
  python3 scripts/ncu_source_top.py "$out/src$n.csv" 25
done
