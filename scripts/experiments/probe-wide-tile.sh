#!/usr/bin/env bash
# Experiments h28, h32, h33, h49, h55 (docs/notes, the wide-tile, narrow-tile and ping-pong probes): builds and runs the standalone Hopper tile probe probes/wide_tile.cu.
# Which tile width runs the Hopper main loop fastest, per M?
# Builds scripts/experiments/probes/wide_tile.cu (a standalone probe, not library code)
# and times, at Llama-3 8B's gate/up (K = 4096, U = 14336), against cuBLAS's
# [M, 4096] x [4096, 28672] GEMM in the same run, tiles of 128 tokens x
# BN output columns (2 BN weight rows) with S stages, nBNsS-*:
#   n128s4  the production tile (128 gate + 128 up rows), 4 stages
#   n160s3  cuBLAS's M = 4096 tile (320 weight rows), 3 stages (h28)
#   n112s4  224 weight rows, 4 stages: 8B M = 512 is 3.88 waves of it
#   n88s5   176 weight rows, 5 stages: cuBLAS's M = 512 tile
#           (nvjet 176x128), 4.94 waves at M = 512 (h32)
#   n88pp-s5, n88pp-s4, n80pp-s5, n96pp-s4: ping-pong (each consumer
#           warpgroup a whole 128 x BN tile in turn; h49, h55)
# and the epilogue: -regs (bf16 pairs stored from registers), -tma
# (stmatrix + TMA stores, as production; the last BN % 32 columns from
# registers), -tma1 (one m64n(2BN)k16 per slice, as production). Then the
# n128 and n88 kernels launched as the library launches (-cl1, -cl2: with a
# cluster attribute they do not use), with the library's tensor ranks
# (-5d), and with the CTAs that share a weight tile spread over the grid
# (-spr); with LIB, the library's own calls (lib-128, lib-88, and -c1: one-CTA
# clusters, no split tail). docs/notes/hopper-kernel.md h33.
#
# Reading it: per M, a table of registers / local memory (must be 0) /
# shared memory and a correctness check of Y against silu(g) * u from the
# cuBLAS output (PASS needs every element within 2e-2 of max |Y|, the last,
# partial column tile included), then median and min ms over 20 interleaved
# rounds, TFLOP/s, and cublas/variant (> 1: faster than cuBLAS's GEMM).
# TFLOP/s counts useful FLOPs (a partial last column tile computes more
# than it is credited with). Mind the waves column: the probe has no split
# tail, so a partial last wave costs its whole time (8B M = 512: n128 is
# 3.39 waves run as 4, n88 4.94 as 5), unlike the library, whose split tail
# shares the last wave's k-blocks out.
#
#   scripts/experiments/probe-wide-tile.sh [M ...]      (default M = 512 1024 4096)
# Binary and ptxas log go to $OUT (default /tmp). Exits 1 if ptxas spills or
# serialises wgmma, 2 if a check fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v nvcc >/dev/null || export PATH="${CUDA_HOME:?nvcc is not on PATH and CUDA_HOME is not set}/bin:$PATH"
out="${OUT:-/tmp}"
mkdir -p "$out"
log="$out/wide_tile.ptxas.txt"

# LIB=<build dir with src/libgatedmlp.a>: also time the library's own call
# (each tile) in the same harness.
lib=()
[ -n "${LIB:-}" ] && lib=(-DPROBE_WITH_LIBRARY "$LIB/src/libgatedmlp.a")
nvcc -O3 -std=c++20 -gencode arch=compute_90a,code=sm_90a -I src -I include -Xptxas -v \
  scripts/experiments/probes/wide_tile.cu "${lib[@]}" -lcublas -o "$out/wide_tile" 2>"$log" || { cat "$log"; exit 1; }

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
