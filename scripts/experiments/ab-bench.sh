#!/usr/bin/env bash
# Experiments v11-v13, v15, h21, h40, h41 (docs/notes, the portable kernel's versions and the Hopper kernel): A/B timing of source trees; preact-ab.sh and sass-compare.sh build their trees with it.
# A/B timing of source trees in one session: builds the tool (90a only) of
# this tree and of the tree in $1 (e.g. `git archive <commit> | tar -x -C
# old`), in parallel, then alternates their benchmarks ROUNDS times (each
# with cuBLAS in the same run). Several other trees: a comma-separated list.
# TILES: a Hopper tile setting per pass ("88 128", "-" for the model's pick;
# default: one pass, no setting). ROUNDS=0 only builds.
#   scripts/experiments/ab-bench.sh OTHER_TREE[,OTHER_TREE...] [bench args]      env: ROUNDS (3), TILES, GATEDMLP_* knobs pass through
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
IFS=, read -ra trees <<<".,$1"
shift
for t in "${trees[@]}"; do
  b="$t/build-ab"
  (mkdir -p "$b" && cmake -S "$t" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" \
     -DGATEDMLP_BUILD_TESTS=OFF >"$b/build.log" 2>&1 && cmake --build "$b" -j"$(nproc)" --target gatedmlp_tool >>"$b/build.log" 2>&1 ||
   { echo "build of $t FAILED"; tail -20 "$b/build.log"; }) &
done
wait
for t in "${trees[@]}"; do [ -x "$t/build-ab/tools/gatedmlp" ] || exit 1; done
for r in $(seq "${ROUNDS:-3}"); do
  for tile in ${TILES:--}; do
    for t in "${trees[@]}"; do
      if [ "$t" = . ]; then label="this tree"; else label=$t; fi
      echo "-- $label, round $r${TILES:+, tile $tile}"
      if [ "$tile" = - ]; then "$t/build-ab/tools/gatedmlp" bench "$@"; else GATEDMLP_SM90_TILE=$tile "$t/build-ab/tools/gatedmlp" bench "$@"; fi 2>/dev/null |
        grep -E "^(8b|70b|405b|custom) " | cut -c1-100
    done
  done
done
