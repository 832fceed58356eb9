#!/usr/bin/env bash
# Runs one GPU test filter many times, each under a time limit, and says
# where a run that does not finish is stuck. Prints each run's exit code
# (124: still running at LIMIT; 3: the tests' own per-call limit named the
# call). For a run still going at LIMIT: the host threads' stacks (cuda-gdb),
# the GPU's load, and any stderr the tests had captured; for any failed run,
# the watchdog's report and the launcher's last log lines. (The hang of
# 2026-11-24 was a test loop: GPU at 0 %, main thread in the test's code.)
# The build has the Hopper kernel's watchdog (watchdog.cuh) unless
# WATCHDOG=OFF.
#   scripts/hang-hunt.sh [runs]
#   scripts/hang-hunt.sh selftest    (the watchdog build reports a hang made on purpose)
# env: BUILD (build dir, default build-wd), FILTER (gtest filter, default
# *OddRow*), LIMIT (seconds per run), SYNC_LIMIT (the tests' limit per
# device synchronisation), WATCHDOG (ON/OFF), SHOW, STACK_LINES (lines
# printed), plus any knobs to pass through (GATEDMLP_SM90_PAIR_COLS=0 ...).
set -uo pipefail
cd "$(dirname "$0")/.."
runs=${1:-10}
build=${BUILD:-build-wd}
filter=${FILTER:-*OddRow*}
limit=${LIMIT:-60}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DGATEDMLP_BUILD_TESTS=ON -DGATEDMLP_BUILD_TOOLS=OFF -DGATEDMLP_SM90_WATCHDOG="${WATCHDOG:-ON}" >/dev/null || exit 1
cmake --build "$build" --target test_gpu >"${TMPDIR:-/tmp}/hang-hunt-build.log" 2>&1 ||
  { tail -20 "${TMPDIR:-/tmp}/hang-hunt-build.log"; exit 1; }
log=${TMPDIR:-/tmp}/hang-hunt
mkdir -p "$log"
if [ "$runs" = selftest ]; then
  # The watchdog's own check: a launch made to hang (a missing arrival on a
  # ring stage's empty barrier) must be reported within seconds, naming the
  # stuck barrier, and end in an error from the trap, not in a hang.
  env GATEDMLP_SM90_WATCHDOG_SELFTEST=1 GATEDMLP_TEST_SYNC_LIMIT=90 timeout 150 \
    "$build/tests/test_gpu" --gtest_filter='GpuFused.FastPathLargeShapes' >"$log/selftest.out" 2>"$log/selftest.err"
  rc=$?
  grep -h "watchdog" "$log/selftest.err" "$log/selftest.out" | cut -c1-400 | head -"${SHOW:-30}"
  stuck=$(grep -c "stuck at" "$log/selftest.err")
  echo "selftest: rc=$rc (want 1: a failed test, not 124 or 3), $stuck stuck waits reported (want > 0)"
  [ "$rc" = 1 ] && [ "$stuck" -gt 0 ]
  exit
fi
fails=0
for i in $(seq "$runs"); do
  rm -f /tmp/gtest_captured_stream*
  env GATEDMLP_LOG=1 GATEDMLP_TEST_SYNC_LIMIT="${SYNC_LIMIT:-20}" stdbuf -oL -eL \
    "$build/tests/test_gpu" --gtest_filter="$filter" >"$log/run$i.out" 2>"$log/run$i.err" &
  pid=$!
  for _ in $(seq "$limit"); do
    sleep 1
    kill -0 "$pid" 2>/dev/null || break
  done
  if kill -0 "$pid" 2>/dev/null; then
    # Still running: where the host threads are, whether the GPU is busy,
    # and what a stderr capture of the tests holds (the first variant of
    # each case runs with its log captured).
    echo "  run $i still running after ${limit} s; host stacks:"
    dbg=$(command -v gdb || command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
    if [ -n "$dbg" ]; then
      timeout 90 "$dbg" -p "$pid" -batch -ex "thread apply all bt 16" 2>&1 | grep -E "^#|^Thread" |
        head -"${STACK_LINES:-50}" | cut -c1-220 | sed 's/^/    /'
    else
      echo "    (no gdb)"; cat "/proc/$pid/task/"*/wchan 2>/dev/null | sort | uniq -c | sed 's/^/    /'
    fi
    nvidia-smi --query-gpu=utilization.gpu,power.draw --format=csv,noheader | sed 's/^/  gpu: /'
    for f in /tmp/gtest_captured_stream*; do [ -f "$f" ] && tail -3 "$f" | sed 's/^/  captured: /'; done
    kill -9 "$pid"
    wait "$pid" 2>/dev/null
    rc=124
  else
    wait "$pid"
    rc=$?
  fi
  echo "run $i: rc=$rc $(grep -E '\[ cases \]' "$log/run$i.out" | tail -1)"
  if [ $rc -ne 0 ]; then
    fails=$((fails + 1))
    grep -h "watchdog\|HUNG" "$log/run$i.out" "$log/run$i.err" | head -${SHOW:-40}
    grep -hE -A7 "Failure" "$log/run$i.out" | head -12
    echo "  last launcher lines:"
    grep -h "\[gatedmlp\]" "$log/run$i.err" | tail -4 | sed 's/^/    /'
  fi
done
echo "hang-hunt: $fails of $runs runs failed"
