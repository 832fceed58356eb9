#!/usr/bin/env bash
# Experiment h73 (docs/notes/fp8.md): the FP8 main loop's ceiling with and
# without fp32 promotion, no memory traffic (probes/fp8_promote_peak.cu).
#   scripts/experiments/fp8-promote-peak.sh [k-blocks per CTA]   (default 8192)
# Exits 1 if ptxas spills or serialises a wgmma.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v nvcc >/dev/null || export PATH="${CUDA_HOME:?nvcc is not on PATH and CUDA_HOME is not set}/bin:$PATH"
out="${OUT:-/tmp}"
mkdir -p "$out"
log="$out/fp8_promote_peak.ptxas.txt"
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I src -I include -Xptxas -v \
  scripts/experiments/probes/fp8_promote_peak.cu -o "$out/fp8_promote_peak" 2>"$log" || { cat "$log"; exit 1; }
if grep -qE "[1-9][0-9]* bytes spill|C7518|C7510" "$log"; then cat "$log"; exit 1; fi
"$out/fp8_promote_peak" "$@"
