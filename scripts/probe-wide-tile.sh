#!/usr/bin/env bash
# Does cuBLAS's wider tile make the Hopper main loop faster per FLOP?
# Builds scripts/probes/wide_tile.cu (a standalone probe, not library code)
# and times, at Llama-3 8B's gate/up (K = 4096, U = 14336), against cuBLAS's
# [M, 4096] x [4096, 28672] GEMM in the same run:
#   n128s4-*  128 tokens x 128 output columns (256 weight rows), 4 stages:
#             the production tile
#   n160s3-*  128 tokens x 160 output columns (320 weight rows), 3 stages:
#             cuBLAS's 320 x 128 tile
#   n128s3-none  the production tile with 3 stages (is it the stages?)
# and the epilogue: -none (main loop only, Y not written), -regs (bf16 pairs
# stored from registers), -tma (stmatrix + TMA stores, as production).
#
# Reading it: per M, a table of registers / local memory (must be 0) /
# shared memory and a correctness check of Y against silu(g) * u from the
# cuBLAS output (PASS needs every element within 2e-2 of max |Y|, the last,
# partial column tile included), then median and min ms over 20 interleaved
# rounds, TFLOP/s, and cublas/variant (> 1: faster than cuBLAS's GEMM). The
# question is answered by n160s3-tma against n128s4-tma (NOTES.md, h28):
# TFLOP/s counts the useful FLOPs of both (n160's last column tile is 96 of
# 160 columns, so it computes 0.4 % more than it is credited with). The
# -none variants are not the main loop's time: with the accumulators never
# read, ptxas drops work (they measured above the chip's dense peak on the
# H200). Mind the waves column:
# the probe has no split tail, so at M = 4096 the 128-column tiles run 27.15
# waves as 28 (97.0 % busy) and the 160-column ones 21.82 as 22 (99.2 %), a
# 2 % edge for n160 that is not the main loop's; at M = 16384 (108.6 as 109
# against 87.3 as 88: 99.6 % against 99.2 %) the comparison is cleaner.
#
#   scripts/probe-wide-tile.sh [M ...]      (default M = 4096 16384)
# Binary and ptxas log go to $OUT (default /tmp). Exits 1 if ptxas spills or
# serialises wgmma, 2 if a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || export PATH="${CUDA_HOME:?nvcc is not on PATH and CUDA_HOME is not set}/bin:$PATH"
out="${OUT:-/tmp}"
mkdir -p "$out"
log="$out/wide_tile.ptxas.txt"

nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -I src -I include -Xptxas -v \
  scripts/probes/wide_tile.cu -lcublas -o "$out/wide_tile" 2>"$log" || { cat "$log"; exit 1; }

# One line per probe_kernel<BN, STAGES, EPI> instantiation. The register
# count is the launch's (384 threads x 168); ptxas fits the consumers' code
# into setmaxnreg's 232 and the producer's into 40, and spills if it cannot.
# Shared memory is all dynamic: the probe prints it.
awk '/Compiling entry function/ { keep = $0 ~ /probe_kernel/; name = $0
       if (keep) { sub(/.*probe_kernelILi/, "", name); sub(/EEv.*/, "", name); gsub(/ELi/, ",", name) } }
     keep && /spill stores/ { spill = $0; sub(/^ */, "", spill) }
     keep && /Used [0-9]+ registers/ { regs = $0; sub(/.*Used /, "", regs); sub(/,.*/, "", regs)
       print "ptxas probe_kernel<" name ">: " regs ", " spill; keep = 0 }' "$log"
if grep -q "C75" "$log"; then
  echo "ptxas serialised wgmma (full log: $log):"; grep "C75" "$log"; exit 1
fi
if grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$log"; then
  echo "ptxas spilled (full log: $log)"; exit 1
fi

"$out/wide_tile" "$@"
