#!/usr/bin/env bash
# h35: the narrow tile's column sets. Builds the tool (90a only) of this tree
# and of each tree in $1 (comma-separated; e.g. `git archive <commit> | tar -x
# -C abbase`), in parallel; with TESTS=1 also this tree's full build, the
# smoke cases and the GPU suite (scripts/gpu-check.sh). Then alternates the
# trees' 8B benchmarks ROUNDS times, each with cuBLAS in the same run, for
# each tile setting in TILES ("-": the model's pick).
#   scripts/probe-narrow-sets.sh OTHER_TREE[,OTHER_TREE...] [M list]   env: ROUNDS (2), TESTS (0), TILES ("- 88 128")
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
IFS=, read -ra trees <<<".,$1"
ms=${2:-256,512,1024,2048,4096,16384}
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
for t in "${trees[@]}"; do
  (cmake -S "$t" -B "$t/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" \
     -DGATEDMLP_BUILD_TESTS=OFF >"$t/build-ab.log" 2>&1 &&
   cmake --build "$t/build-ab" -j"$(nproc)" --target gatedmlp_tool >>"$t/build-ab.log" 2>&1 ||
   { echo "build of $t FAILED"; tail -20 "$t/build-ab.log"; }) &
done
wait
[ "${TESTS:-0}" = 1 ] && scripts/gpu-check.sh build smoke test
for r in $(seq "${ROUNDS:-2}"); do
  for tile in ${TILES:-- 88 128}; do
    for t in "${trees[@]}"; do
      echo "-- tree $t, tile $tile, round $r"
      GATEDMLP_SM90_TILE=${tile#-} "$t/build-ab/tools/gatedmlp" bench --model 8b --m "$ms" 2>/dev/null | grep -E "^8b " | cut -c1-100
    done
  done
done
