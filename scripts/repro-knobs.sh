#!/usr/bin/env bash
# One benchmark shape under several settings of the Hopper kernel's knobs,
# each with a time limit: which setting makes a case hang (rc 124) or
# disagree with the unfused path (rc 1). The launcher's log line says how
# the call was run.
#   scripts/repro-knobs.sh "bench args" [VAR=VALUE ...]
#   env: BUILD (build-gpu), LIMIT (seconds per run, 30), REPS (timed calls per path, 3)
#   e.g. scripts/repro-knobs.sh "--m 384 --k 136 --u 384 --layout g128 --preact" GATEDMLP_SM90_PAIR_COLS=0
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
b=${BUILD:-build-gpu}
args=$1; shift
if [ ! -x "$b/tools/gatedmlp" ]; then
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" -DGATEDMLP_BUILD_TESTS=OFF \
    >/tmp/repro-build.log 2>&1 && cmake --build "$b" -j"$(nproc)" --target gatedmlp_tool >>/tmp/repro-build.log 2>&1 ||
    { tail -20 /tmp/repro-build.log; exit 1; }
fi
for s in - "$@"; do
  echo "== $([ "$s" = - ] && echo default || echo "$s")"
  if [ "$s" = - ]; then set --; else set -- "$s"; fi
  # shellcheck disable=SC2086
  env "$@" GATEDMLP_LOG=1 timeout "${LIMIT:-30}" "$b/tools/gatedmlp" bench $args --reps "${REPS:-3}" 2>&1 |
    grep -E "sm90:|^custom|rror" | sort | uniq -c | head -6
  echo "   rc=${PIPESTATUS[0]}"
done
