#!/usr/bin/env bash
# h97 (docs/notes/moe.md): the checkpoint-order quantized kernel's gathered
# gate/up with k-blocks of one chunk (GATEDMLP_QDECODE=2,1, as shipped) or
# two (2,2: twice the bytes each warp has in flight), timed in turn (ABA) on
# bench_moe.py's decode shapes. Needs `scripts/gpu-check.sh build pyext`
# first (build-gpu/python).   SETTINGS="2,1 2,2 2,1"  FORMATS=int4,mxfp4  TS=1,4,16,64
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
export PYTHONPATH="$PWD/build-gpu/python"
for s in ${SETTINGS:-2,1 2,2 2,1}; do
  echo "-- GATEDMLP_QDECODE=$s" | tee -a "$out/gather-unroll.txt"
  GATEDMLP_QDECODE=$s python3 scripts/bench_moe.py --formats "${FORMATS:-int4,mxfp4}" --t "${TS:-1,4,16,64}" 2>&1 |
    grep -E " T= " | tee -a "$out/gather-unroll.txt"
done
