#!/usr/bin/env bash
# The ping-pong Hopper kernel (src/sm90_gemm_glu/pingpong.cuh) against the
# cooperative one: correctness, then timing, each from its own build. Output to
# $OUT or ./profile-out.
#   scripts/probe-pingpong.sh [steps...]   (default: build test sanitize ab)
#   build:    Release build of tools and tests for sm_90a in build-pp.
#   test:     the fast-path and random GPU suites with GATEDMLP_SM90_PINGPONG=1
#             (every call the ping-pong kernel takes goes to it), time-limited.
#   sanitize: memcheck, racecheck and synccheck on a few of those cases.
#   ab:       gatedmlp bench, ping-pong off / on interleaved, two rounds: 8B at
#             every M, 70B and 405B at the headline M, the M = 512 small-weight
#             shape.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
b=build-pp
g="$b/tools/gatedmlp"
rows() { grep -E "^(8b|70b|405b|custom) " | cut -c1-120; }

for step in ${@:-build test sanitize ab}; do
  case "$step" in
  build)
    t0=$(date +%s)
    cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" >"$out/pp-build.log" 2>&1 &&
      cmake --build "$b" -j"$(nproc)" >>"$out/pp-build.log" 2>&1 || { tail -30 "$out/pp-build.log"; exit 1; }
    echo "== build: ok in $(( $(date +%s) - t0 )) s" ;;
  test)
    GATEDMLP_SM90_PINGPONG=1 timeout 300 "$b/tests/test_gpu" \
      --gtest_filter='GpuFused.FastPath*:GpuFused.Random*:GpuFused.EdgeShapes:GpuFused.LargeTileShapes' >"$out/pp-test.log" 2>&1
    rc=$?
    grep -E "^\[ (cases|seed) \]|FAILED|Failure|error" "$out/pp-test.log" | head -30
    echo "== test (ping-pong): rc=$rc; $(grep -E 'PASSED|FAILED' "$out/pp-test.log" | tail -1)" ;;
  sanitize)
    for tool in memcheck racecheck synccheck; do
      GATEDMLP_SM90_PINGPONG=1 GATEDMLP_TEST_CASES=10 timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 3 \
        "$b/tests/test_gpu" --gtest_filter='GpuFused.FastPathEveryLayoutActivationOption' >"$out/pp-sanitize-$tool.log" 2>&1
      echo "== compute-sanitizer $tool: rc=$?, $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/pp-sanitize-$tool.log" | tail -1)"
    done ;;
  ab)
    for round in 1 2; do
      for v in 0 1; do
        echo "=== round $round, GATEDMLP_SM90_PINGPONG=$v"
        { GATEDMLP_SM90_PINGPONG=$v "$g" bench --model 8b
          for mdl in 70b 405b; do GATEDMLP_SM90_PINGPONG=$v "$g" bench --model $mdl --m 1024,4096,16384; done
          GATEDMLP_SM90_PINGPONG=$v "$g" bench --m 512 --k 1024 --u 4096; } 2>/dev/null | rows
      done
    done ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done
