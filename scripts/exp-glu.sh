#!/usr/bin/env bash
# The unfused baseline's GLU kernel: its bandwidth per variant, and the torch
# kernels that move the same bytes (scripts/glu_floor.py), on one GPU.
#   scripts/exp-glu.sh [bench args]        (default: every model at M = 4096, 8B at 16384)
# VARIANTS: GATEDMLP_GLU_EXP settings "ROWS,STREAM" (default: the library's
# choice, "-"). Builds BUILD (default build-gpu, sm_90a only) if it has no tool.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
b="${BUILD:-build-gpu}"
if [ ! -x "$b/tools/gatedmlp" ]; then
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" -DGATEDMLP_BUILD_TESTS=OFF \
    >"$out/exp-glu-build.log" 2>&1 && cmake --build "$b" -j"$(nproc)" --target gatedmlp_tool >>"$out/exp-glu-build.log" 2>&1 ||
    { tail -20 "$out/exp-glu-build.log"; echo "build FAILED"; exit 1; }
fi
runs=("$@")
for v in ${VARIANTS:--}; do
  if [ "$v" = - ]; then unset GATEDMLP_GLU_EXP; else export GATEDMLP_GLU_EXP="$v"; fi
  if [ ${#runs[@]} -gt 0 ]; then
    "$b/tools/gatedmlp" bench "${runs[@]}"
  else
    "$b/tools/gatedmlp" bench --model all --m 4096
    "$b/tools/gatedmlp" bench --m 16384
  fi 2>/dev/null | grep -E "^(8b|70b|405b|custom) " | sed "s/^/glu=$v /"
done | tee "$out/exp-glu.txt"
unset GATEDMLP_GLU_EXP
python3 scripts/glu_floor.py 2>&1 | tee "$out/glu-floor.txt"
# NCU=1: ncu's view of one GLU launch (8B M = 4096) per variant.
if [ "${NCU:-0}" = 1 ]; then
  for v in ${VARIANTS:--}; do
    if [ "$v" = - ]; then unset GATEDMLP_GLU_EXP; else export GATEDMLP_GLU_EXP="$v"; fi
    echo "== ncu, glu=$v"
    ncu --kernel-name regex:glu_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
      "$b/tools/gatedmlp" bench --m 4096 --reps 3 2>&1 |
      grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit Reg|Grid Size|Issue Slots|Warp Cycles Per Issued|Stall|Executed Ipc|L2 Hit|Mem Busy|Max Bandwidth|SM Busy|Compute \(SM\)"
  done | tee "$out/exp-glu-ncu.txt"
  unset GATEDMLP_GLU_EXP
fi
