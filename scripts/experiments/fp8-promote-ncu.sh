#!/usr/bin/env bash
# h71: ncu on the FP8 kernels, all-of-K accumulation against per-k-block
# promotion (GATEDMLP_FP8_PROMOTE=1) and block scales, one call each at one
# shape: the tensor pipe's active cycles, shared-memory traffic and the
# consumer warps' stall reasons. BUILD: the build tree (default build-gpu).
#   scripts/experiments/fp8-promote-ncu.sh [K U M]
set -u
build=${BUILD:-build-gpu}
k=${1:-4096} u=${2:-14336} m=${3:-4096}
metrics=sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg.per_second,gpu__time_duration.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_membar.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_math_pipe_throttle.ratio,smsp__average_warp_latency_issue_stalled_mio_throttle.ratio,smsp__average_warp_latency_issue_stalled_short_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_dispatch_stall.ratio,smsp__average_warp_latency_issue_stalled_misc.ratio,smsp__average_warp_latency_issue_stalled_sleeping.ratio,smsp__average_warp_latency_issue_stalled_selected.ratio,smsp__average_warp_latency_issue_stalled_not_selected.ratio
# One pass: each of the three calls profiled once with the given metrics.
profile_pass() {
  local label=$1 mets=$2 run
  for run in "tensor 0" "tensor 1" "block 1"; do
    set -- $run
    echo "== $label$1 scales, GATEDMLP_FP8_PROMOTE=$2"
    GATEDMLP_FP8_PROMOTE=$2 PYTHONPATH="$build/python" ncu --kernel-name regex:sm90_gemm_glu_kernel --launch-skip 2 \
      --launch-count 1 --metrics "$mets" python3 "$(dirname "$0")/fp8-one-call.py" "$1" "$k" "$u" "$m" 2>&1 |
      grep -E "^\s+(sm__|gpu__|l1tex|smsp)|ERR" | sed 's/  */ /g'
  done
}
profile_pass "" "$metrics"
# h87: shared memory's banks as a whole (the wgmmas' operand reads and the
# copy engine's writes, not only the LSU's wavefronts above): is the
# promoting loop bound by them? SMEM_METRICS=0 skips this pass.
if [ "${SMEM_METRICS:-1}" = 1 ]; then
  profile_pass "banks: " l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_reads.sum,l1tex__data_bank_writes.sum,gpu__time_duration.sum
fi
