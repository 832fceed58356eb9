#!/usr/bin/env bash
# h88 (docs/notes/drop-in-and-decode.md): host µs per Python entry point of
# this tree against a base tree's, library and extension included, on one
# machine. BASE: a folder holding the base tree's versions of the files that
# differ, at their paths in the repository (e.g. made by `git show
# <rev>:<path>`); the base is this tree with those files over it. Builds both
# (Python extension; this tree's GPU tests too) side by side, runs this
# tree's GpuApi suite, then, in ROUNDS pairs (default 2), each tree's
# binding-stages.py (totals) and bench_dropin.py --sections host in turn.
# STAGES=1 also builds this tree with the binding's stage timers and prints
# its stages last. Output under $OUT.
#   BASE=ab-base [ROUNDS=2] [STAGES=1] scripts/experiments/host-ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
source scripts/experiments/ab-tree.sh
bt=/tmp/host-ab-base
ab_base_tree "$bt" || exit 1
t0=$(date +%s)
n=$([ "${STAGES:-0}" = 1 ] && echo 3 || echo 2)
jobs=$(( $(nproc) / n ))
(ab_conf "$PWD" build-gpu && cmake --build build-gpu --target _gatedmlp test_gpu -j"$jobs") >"$out/build.log" 2>&1 &
(ab_conf "$bt" "$bt/build-gpu" && cmake --build "$bt/build-gpu" --target _gatedmlp -j"$jobs") >"$out/build-base.log" 2>&1 &
if [ "${STAGES:-0}" = 1 ]; then
  (ab_conf "$PWD" build-timers -DCMAKE_CXX_FLAGS=-DGATEDMLP_PY_TIMERS -DGATEDMLP_BUILD_TESTS=OFF &&
   cmake --build build-timers --target _gatedmlp -j"$jobs") >"$out/build-timers.log" 2>&1 &
fi
wait
[ -f build-gpu/tests/test_gpu ] || { tail -30 "$out/build.log"; exit 1; }
ls "$bt"/build-gpu/python/gatedmlp/_gatedmlp*.so >/dev/null 2>&1 || { tail -30 "$out/build-base.log"; exit 1; }
echo "== builds: $(( $(date +%s) - t0 )) s"
build-gpu/tests/test_gpu --gtest_filter='GpuApi.*' >"$out/gpuapi.log" 2>&1
echo "== GpuApi: rc=$?; $(grep -E 'PASSED|FAILED' "$out/gpuapi.log" | tail -3 | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure" "$out/gpuapi.log" | head -10
for r in $(seq "${ROUNDS:-2}"); do
  for tree in "$bt" "$PWD"; do
    side=$([ "$tree" = "$PWD" ] && echo this || echo base)
    echo "== $side tree, pair $r"
    PYTHONPATH="$tree/build-gpu/python" python3 "$tree/scripts/experiments/binding-stages.py"
    PYTHONPATH="$tree/build-gpu/python" python3 "$tree/scripts/bench_dropin.py" --sections host --host-reps 31 \
      --json "$out/host-$side-$r.json" 2>&1 | grep -E "^\|" || true
  done
done 2>&1 | tee "$out/ab.txt"
if [ "${STAGES:-0}" = 1 ]; then
  echo "== this tree with the stage timers"
  PYTHONPATH=build-timers/python python3 scripts/experiments/binding-stages.py 2>&1 | tee "$out/stages.txt"
fi
