#!/usr/bin/env bash
# Runs GPU test filters one by one, each under a short time limit, so that a
# hanging kernel names the test (and the environment) that hangs.
#   scripts/debug-tests.sh [build dir]
# env: FILTERS (gtest filters), VARIANTS (each NAME=VALUE, or - for none), LIMIT (seconds)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
for v in ${VARIANTS:--}; do
  for f in ${FILTERS:-GpuFused.EdgeShapes GpuFused.LargerVectorShapes GpuFused.FastPathLargeShapes GpuFused.FastPathEveryLayoutActivationOption}; do
    if [ "$v" = - ]; then envs=(); else envs=("$v"); fi
    env "${envs[@]}" timeout "${LIMIT:-30}" "$build/tests/test_gpu" --gtest_filter="$f" >/tmp/dbg.log 2>&1
    rc=$?
    echo "[$v] $f: rc=$rc (124 = timed out) $(grep -E '\[ cases \]' /tmp/dbg.log | tail -1)"
    [ $rc -ne 0 ] && grep -E "Failure|Actual|Problem\{|Config\{" /tmp/dbg.log | head -8
  done
done
