#!/usr/bin/env bash
# h87 (docs/notes/fp8.md): is the promoting FP8 loop bound by shared-memory
# bandwidth? The no-memory probe with X from registers (fast_rs,
# quarter_rs beside fast and quarter), then ncu on the library's kernels
# (stall reasons and the banks' reads and writes). Builds the library and
# the Python extension for sm_90a in build-gpu first. Output under $OUT.
#   scripts/experiments/fp8-smem-check.sh [K U M]
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
OUT="$out" scripts/experiments/fp8-promote-peak.sh 4096 2>&1 | tee "$out/peak.txt"
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DGATEDMLP_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" >"$out/build.log" 2>&1 &&
  cmake --build build-gpu --target _gatedmlp -j"$(nproc)" >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "== build: $(( $(date +%s) - t0 )) s"
scripts/experiments/fp8-promote-ncu.sh "$@" 2>&1 | tee "$out/ncu.txt"
