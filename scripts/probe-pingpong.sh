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
#   source:   per-instruction stall sampling at 8B M = 4096, both kernels.
#   ncu:      8B M = 4096 (M=...), cooperative / ping-pong / cuBLAS: clock,
#             tensor-pipe activity, shared-memory bank reads and writes, L2.
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
  ncu)
    # 8B M = 4096 (or $M): cooperative, ping-pong and cuBLAS side by side:
    # clock, tensor-pipe activity, shared-memory bank traffic (TMA writes
    # and wgmma operand reads both pass through the banks), L2 throughput.
    m="${M:-4096}"
    for v in 0 1; do
      GATEDMLP_SM90_PINGPONG=$v ncu --clock-control none --kernel-name 'regex:gemm_glu_kernel|pingpong|nvjet|xmma|cutlass' \
        --launch-skip 2 --launch-count 2 \
        --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_reads.sum,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
        "$g" bench --m "$m" --reps 2 >"$out/pp-ncu-$m-$v.txt" 2>&1
      echo "--- ncu 8b M=$m, GATEDMLP_SM90_PINGPONG=$v"
      awk '/^  [a-zA-Z_].*\(/ {name = substr($1, 1, 44)} /gpu__time|cycles_elapsed|gmma|bank_|lts__t|sm__throughput|grid_size/ {print "  " name, $1, $(NF-1), $NF}' "$out/pp-ncu-$m-$v.txt"
    done ;;
  source)
    # Per-instruction stall sampling at 8B M = 4096: ping-pong, then the
    # cooperative kernel, each summarised by ncu_source_top.py.
    for v in 1 0; do
      kern=$([ $v = 1 ] && echo sm90_pingpong || echo sm90_gemm_glu_kernel)
      echo "--- stall sampling, GATEDMLP_SM90_PINGPONG=$v ($kern)"
      mkdir -p "$out/src-$v"
      GATEDMLP_SM90_PINGPONG=$v OUT="$out/src-$v" KERNEL=$kern BUILD="$b" scripts/profile-source.sh 4096 4096 14336 | head -45
    done ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done
