#!/usr/bin/env bash
# The decode kernel's instantiations for M = 9 ... 16 side by side
# (GATEDMLP_DECODE_M16=VARIANT, see decode_glu.cuh launch_any), each checked
# by the decode tests first and then timed on the `small` model set at
# M = 8 and 16 with cuBLAS in the same run. Needs a built build-gpu
# (scripts/gpu-check.sh build): scripts/experiments/decode-variants.sh [VARIANTS]
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
g=build-gpu/tools/gatedmlp
cuobjdump --dump-resource-usage build-gpu/src/libgatedmlp.a 2>/dev/null | grep -A1 "Function.*decode_glu_kernel" |
  grep -oE "decode_glu_kernelI[A-Za-z0-9_]*|REG:[0-9]+ STACK:[0-9]+ SHARED:[0-9]+ LOCAL:[0-9]+" | paste - - | sort -u | tee "$out/decode_resources.txt"
for v in ${1:-0 1 2 3 4}; do
  GATEDMLP_DECODE_M16=$v build-gpu/tests/test_gpu --gtest_filter='GpuDecode.*' >"$out/decode_tests_$v.log" 2>&1
  echo "== variant $v: decode tests rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/decode_tests_$v.log" | tr '\n' ' ')"
  GATEDMLP_DECODE_M16=$v "$g" bench --model small --m 8,16 2>/dev/null | grep -E "^(qwen|1024|llama)" | cut -c1-100 |
    sed "s/^/v$v /"
  GATEDMLP_DECODE_M16=$v "$g" bench --graph --m 16 2>/dev/null | grep -E "^8b " | cut -c1-100 | sed "s/^/v$v /"
done | tee "$out/decode_variants.txt"
