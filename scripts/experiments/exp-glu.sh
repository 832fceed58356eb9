#!/usr/bin/env bash
# Experiment h47 (docs/notes, the unfused baseline's GLU kernel): its TB/s against torch kernels moving the same bytes (glu_floor.py) and the traversal probe (probes/glu_bw.cu).
# The unfused baseline's GLU kernel against memory bandwidth (h47): the
# bench's "glu TB/s" column (the GLU kernel timed alone) for the plain call
# and for one that takes the general kernel (--preact), then torch kernels that
# move the same bytes (scripts/experiments/glu_floor.py), on one GPU.
#   scripts/experiments/exp-glu.sh [bench args]     (default: every model at M = 4096, 8B at 16384)
# NCU=1 adds ncu's view of one GLU launch of each kind (8B, M = 4096).
# PROBE=1 first runs scripts/experiments/probes/glu_bw.cu (the same bytes traversed in
# several orders), then stops unless PROBE_ONLY=0.
# Builds BUILD (default build-gpu, sm_90a only) if it has no tool.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
b="${BUILD:-build-gpu}"
if [ "${PROBE:-0}" = 1 ]; then
  nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/glu_bw.cu -o "$out/glu_bw" &&
    "$out/glu_bw" | tee "$out/glu-bw.txt"
  [ "${PROBE_ONLY:-1}" = 1 ] && exit
fi
if [ ! -x "$b/tools/gatedmlp" ]; then
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" -DGATEDMLP_BUILD_TESTS=OFF \
    >"$out/exp-glu-build.log" 2>&1 && cmake --build "$b" -j"$(nproc)" --target gatedmlp_tool >>"$out/exp-glu-build.log" 2>&1 ||
    { tail -20 "$out/exp-glu-build.log"; echo "build FAILED"; exit 1; }
fi
runs=("$@")
[ ${#runs[@]} -eq 0 ] && runs=(--model all --m 4096)
for extra in "" "--layout g1" "--act gelu_tanh" "--preact" "general" "general --act gelu_tanh"; do
  # "general": GATEDMLP_GLU_GENERAL=1, the general kernel on the plain call.
  e=(); [ "${extra%% *}" = general ] && e=(GATEDMLP_GLU_GENERAL=1)
  env "${e[@]}" "$b/tools/gatedmlp" bench "${runs[@]}" ${extra#general} 2>/dev/null | grep -E "^(8b|70b|405b|custom) " | sed "s/^/[${extra:-plain}] /"
done | tee "$out/exp-glu.txt"
python3 scripts/experiments/glu_floor.py 2>&1 | tee "$out/glu-floor.txt"
if [ "${NCU:-0}" = 1 ]; then
  for extra in "" "--preact"; do
    echo "== ncu, GLU kernel of bench --m 4096 $extra"
    ncu --kernel-name regex:^glu_kernel --launch-skip 3 --launch-count 1 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section LaunchStats --section InstructionStats \
      "$b/tools/gatedmlp" bench --m 4096 --reps 3 $extra 2>&1 |
      grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Warp Cycles Per Issued|Executed Ipc A|Executed Instructions  |Compute \(SM\)"
  done | tee "$out/exp-glu-ncu.txt"
fi
