#!/usr/bin/env bash
# h35: the narrow tile's column sets. Builds this tree (tests on) and the
# tree in $1 (the tool only; e.g. `git archive <commit> | tar -x -C abbase`),
# runs the smoke cases and the GPU suite on this tree, then alternates the
# two trees' 8B benchmarks ROUNDS times, each with cuBLAS in the same run,
# with the tile the model picks and with each tile forced.
#   scripts/probe-narrow-sets.sh BASE_TREE [M list]        env: ROUNDS (2), TESTS (1)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
base=$1
ms=${2:-256,512,1024,2048,4096,16384}
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
steps=(build smoke)
[ "${TESTS:-1}" = 1 ] && steps+=(test)
# The base tree's tool builds while this tree's tests run (they are GPU-bound).
scripts/gpu-check.sh build || exit 1
(cmake -S "$base" -B "$base/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" \
   -DGATEDMLP_BUILD_TESTS=OFF >"$out/base-build.log" 2>&1 &&
 cmake --build "$base/build-ab" -j"$(nproc)" --target gatedmlp_tool >>"$out/base-build.log" 2>&1; echo $? >"$out/base-build.rc") &
scripts/gpu-check.sh "${steps[@]:1}"
wait
[ "$(cat "$out/base-build.rc")" = 0 ] || { tail -20 "$out/base-build.log"; exit 1; }
for r in $(seq "${ROUNDS:-2}"); do
  for tile in "" 88 128; do
    for t in build-gpu "$base/build-ab"; do
      echo "-- ${t%%/build-ab}, tile ${tile:-picked}, round $r"
      GATEDMLP_SM90_TILE=$tile "$t/tools/gatedmlp" bench --model 8b --m "$ms" 2>/dev/null | grep -E "^8b " | cut -c1-100
    done
  done
done
