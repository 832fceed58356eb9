#!/usr/bin/env bash
# h20, the epilogue under the tensor cores' work: benchmarks of one build with
# the overlap on and off (GATEDMLP_SM90_OVERLAP=0), and of an older source
# tree's build if OLD names one (e.g. `git archive <commit> | tar -x -C OLD`),
# alternated ROUNDS times, each against cuBLAS in the same run.
#   BUILD=build-gpu OLD=ab-old scripts/probe-overlap.sh [bench args]
# Default bench args: 8B at M = 512, 1024, 4096, 16384.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
build=${BUILD:-build-gpu}
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--model 8b --m 512,1024,4096,16384)
if [ -n "${OLD:-}" ]; then
  cmake -S "$OLD" -B "$OLD/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" \
    -DGATEDMLP_BUILD_TESTS=OFF >/tmp/ab-old.log 2>&1 && cmake --build "$OLD/build-ab" -j"$(nproc)" --target gatedmlp_tool \
    >>/tmp/ab-old.log 2>&1 || { tail -20 /tmp/ab-old.log; exit 1; }
fi
show() { grep -E "^(model|8b|70b|405b|custom) " | cut -c1-110; }
for r in $(seq "${ROUNDS:-2}"); do
  echo "-- overlap on, round $r";  "$build/tools/gatedmlp" bench "${args[@]}" 2>/dev/null | show
  echo "-- overlap off, round $r"; GATEDMLP_SM90_OVERLAP=0 "$build/tools/gatedmlp" bench "${args[@]}" 2>/dev/null | show
  if [ -n "${OLD:-}" ]; then echo "-- $OLD, round $r"; "$OLD/build-ab/tools/gatedmlp" bench "${args[@]}" 2>/dev/null | show; fi
done
