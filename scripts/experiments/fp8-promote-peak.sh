#!/usr/bin/env bash
# Experiment h73 (docs/notes/fp8.md): the FP8 main loop's ceiling with and
# without fp32 promotion, no memory traffic (probes/fp8_promote_peak.cu).
#   [CLOCKS=1] scripts/experiments/fp8-promote-peak.sh [k-blocks per CTA]   (default 8192)
# CLOCKS=1 (h88): also samples the SM clock, power and throttle reasons every
# 100 ms while it runs, into $OUT/fp8_promote_peak.clocks.csv, and prints a
# summary per variant (the probe prints each variant's start and end times).
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
if [ "${CLOCKS:-0}" = 1 ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader,nounits -lms 100 >"$out/fp8_promote_peak.clocks.csv" &
  smi=$!
  sleep 1
  "$out/fp8_promote_peak" "$@" | tee "$out/fp8_promote_peak.txt"
  kill $smi
  python3 scripts/experiments/clock-summary.py "$out/fp8_promote_peak.clocks.csv" "$out/fp8_promote_peak.txt"
else
  "$out/fp8_promote_peak" "$@"
fi
