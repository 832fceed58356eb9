#!/usr/bin/env bash
# h82's open question: why the quantized decode kernel's Hopper form (int4
# words dequantized into wgmma's register A operand) is slower than the
# register kernel at M <= 16. ncu on the probe (probes/quant_wgmma.cu) at 8B,
# M = 1: the form (w1t1s8) against the register kernel with column groups,
# the first launch of each (its Y check), clocks as ncu sets them.
# Needs a CUDA machine with ncu; output to $OUT or ./profile-out.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude scripts/experiments/probes/quant_wgmma.cu \
  -lcublas -lcuda -o "$out/quant_wgmma" || exit 1
sections="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis"
for k in 'regex:qwgmmaILi8ELi1ELi1ELi8E' 'regex:quant_decode_kernel.*Li1ELi1ELi2ELb0ELi2E'; do
  ncu $sections --kernel-name-base mangled --kernel-name "$k" --launch-count 1 "$out/quant_wgmma" 2>/dev/null |
    grep -E "qwgmma|quant_decode_kernel|Duration|DRAM Throughput|Issue Slots Busy|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Shared Memory|L1/TEX Hit|Mem Busy|Max Bandwidth|Stall|stall" |
    head -40
  echo "----"
done | tee "$out/quant-wgmma-ncu.txt"
