#!/usr/bin/env bash
# Where does the library lose against the probe kernels of the same tile?
# Builds the tool (build-ab, sm_90a only, if missing), runs
# scripts/probe-wide-tile.sh with the library's calls in the same harness
# (LIB=build-ab), then ncu over one M: per kernel of the check phase (each
# variant once, in the harness's order) its time, DRAM bytes read and L2 hit
# rate, caches and clocks left as they are.
#   scripts/probe-lib-gap.sh [M list for the timing] [M for ncu]
#   (default: 512,1024,4096 and 512; $OUT as for probe-wide-tile.sh)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-/tmp}"
ms="${1:-512,1024,4096}"
SETTINGS="-" BUILD=build-ab MODEL=8b scripts/probe-waves.sh "${2:-512}" || exit 1
LIB=build-ab OUT="$out" scripts/probe-wide-tile.sh ${ms//,/ } | grep -v "^ptxas" || exit 1
ncu --cache-control none --clock-control none -k regex:"probe_kernel|sm90_gemm_glu_kernel" --launch-count 16 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg.per_second \
  "$out/wide_tile" "${2:-512}" 2>&1 | grep -E "probe_kernel|sm90_gemm_glu_kernel|gpu__time|dram__bytes|hit_rate|per_second" |
  sed -E 's/\(int, int, int, int\)|Context.*//' | cut -c1-150
