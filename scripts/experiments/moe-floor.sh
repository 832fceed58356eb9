#!/usr/bin/env bash
# h98 (docs/notes/moe.md): the MoE decode bar's own ceiling. The fastest
# one-kernel read of the distinct experts' gate/up bytes, routed as
# bench_moe.py routes them (probes/moe_read_floor.cu), then bench_moe.py's
# own rows in the same session, so that each format's time can be set
# against its floor.
# Needs `scripts/gpu-check.sh build pyext` first (build-gpu/python) for the
# bench; the probe is standalone.
#   FORMATS=bf16,int4t,int4,mxfp4  TS=1,4,16,64
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/moe_read_floor.cu -o "$out/moe_read_floor" &&
  "$out/moe_read_floor" | tee "$out/moe-floor.txt"
rm -f "$out/moe_read_floor"
[ -d build-gpu/python ] || exit 0
PYTHONPATH="$PWD/build-gpu/python" python3 scripts/bench_moe.py --formats "${FORMATS:-bf16,int4t,int4,mxfp4}" \
  --t "${TS:-1,4,16,64}" --json "$out/moe-floor-bench.json" 2>&1 | tee "$out/moe-floor-bench.txt" | grep -E "read rate|T="
