#!/usr/bin/env bash
# A/B timing of two source trees in one session: builds the tool of this tree
# and of the tree in $1 (e.g. `git archive <commit> | tar -x -C old`), then
# alternates their benchmarks ROUNDS times (each with cuBLAS in the same run).
# Several other trees: OTHER_TREE as a comma-separated list.
#   scripts/ab-bench.sh OTHER_TREE[,OTHER_TREE...] [bench args]      env: ROUNDS (3), GATEDMLP_* knobs pass through
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
IFS=, read -ra others <<<"$1"
shift
for t in . "${others[@]}"; do
  b="$t/build-ab"
  cmake -S "$t" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" -DGATEDMLP_BUILD_TESTS=OFF \
    >/tmp/ab-build.log 2>&1 && cmake --build "$b" -j"$(nproc)" --target gatedmlp_tool >>/tmp/ab-build.log 2>&1 ||
    { tail -20 /tmp/ab-build.log; exit 1; }
done
for r in $(seq "${ROUNDS:-3}"); do
  for t in . "${others[@]}"; do
    if [ "$t" = . ]; then label="this tree"; else label=$t; fi
    echo "-- $label, round $r"
    "$t/build-ab/tools/gatedmlp" bench "$@" 2>/dev/null | grep -E "^(8b|70b|405b|custom) " | cut -c1-100
  done
done
