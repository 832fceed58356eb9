#!/usr/bin/env bash
# Profiles the portable kernel on one large shape and measures the raw
# mma.sync ceiling (scripts/experiments/probes/mma_peak.cu). Output to $OUT or ./profile-out.
#   scripts/profile.sh [M] [K] [U]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
m="${1:-4096}" k="${2:-4096}" u="${3:-14336}"
[ -n "${PROBE:-}" ] && nvcc -O3 -gencode arch=compute_90a,code=sm_90a scripts/experiments/probes/mma_peak.cu -o "$out/mma_peak" && "$out/mma_peak"
cmake -S . -B build-prof -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DGATEDMLP_BUILD_TESTS=OFF >/dev/null && cmake --build build-prof -j"$(nproc)" >"$out/build.log" 2>&1 || { tail "$out/build.log"; exit 1; }
ncu --kernel-name regex:sm80_gemm_glu --launch-skip 2 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats \
  --metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_tensor_op_hmma.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
  build-prof/tools/gatedmlp bench --path portable --m "$m" --k "$k" --u "$u" --reps 3 >"$out/ncu.txt" 2>&1
grep -E "stalled_.*ratio +[0-9]*\.[0-9]*[1-9]|inst_executed|Duration|Throughput|Pipe|Bank|bank|Stall|Warp Cycles|Issued|Occupancy|Registers|Shared Memory|L2 Hit|hmma|Block Limit" "$out/ncu.txt" | head -60
