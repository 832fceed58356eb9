#!/usr/bin/env bash
# The SASS of one kernel of a build, with its size and the instructions that
# say where time can hide: calls (64-bit division and other subroutines),
# local-memory spills (STL/LDL), HGMMA, barrier waits.
#   scripts/sass-of.sh BUILD_DIR [KERNEL_REGEX] [OUT_FILE]
# (default: the bf16 silu kernel with clusters of two and no TMA
# pre-activation, what the 8B benchmark runs; OUT_FILE defaults to
# BUILD_DIR/kernel.sass)
set -uo pipefail
export PATH="/usr/local/cuda/bin:$PATH"
b="$1" re="${2:-sm90_gemm_glu_kernelI13__nv_bfloat16Li0ELi2ELi0E}" out="${3:-$1/kernel.sass}"
cuobjdump -sass -arch sm_90a "$b/src/libgatedmlp.a" 2>/dev/null |
  awk -v re="$re" '/Function :/ {keep = ($0 ~ re)} keep' >"$out"
n=$(grep -cE '^ +/\*[0-9a-f]{4,}\*/' "$out")
echo "$re: $n instructions ($((n * 16)) bytes);" \
  "CALL $(grep -c 'CALL' "$out"), STL $(grep -c ' STL' "$out"), LDL $(grep -c ' LDL' "$out")," \
  "HGMMA $(grep -c 'HGMMA' "$out"), SYNCS $(grep -c 'SYNCS' "$out")"
