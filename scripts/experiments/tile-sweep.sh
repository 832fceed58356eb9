#!/usr/bin/env bash
# Experiment (docs/notes, the portable kernel's versions, its tiles): each GATEDMLP_FORCE_TILE tile's random suites, then its benchmark.
# The portable kernel's tiles side by side: for each tile, the random GPU
# suites on the portable path with that tile forced (a tile must be correct
# for every shape before its speed counts), then the benchmark. Output to
# $OUT or ./sweep-out.
#   [TILES="large small"] [MODEL=8b] [MS=1024,4096,16384] scripts/experiments/tile-sweep.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/sweep-out}"
mkdir -p "$out"
b="${BUILD:-build-gpu}"  # gpu-check.sh's build, made here if missing
if [ ! -x "$b/tools/gatedmlp" ] || [ ! -x "$b/tests/test_gpu" ]; then
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="80;90a" >"$out/build.log" 2>&1 &&
    cmake --build "$b" -j"$(nproc)" >>"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
fi
export GATEDMLP_FORCE_PATH=portable
for t in ${TILES:-large small}; do
  export GATEDMLP_FORCE_TILE=$t
  echo "=== tile $t"
  timeout 300 "$b/tests/test_gpu" \
    --gtest_filter='GpuFused.Random*:GpuFused.EdgeShapes:GpuFused.LargerVectorShapes:GpuFused.EveryLayoutAndActivation' \
    >"$out/test-$t.log" 2>&1
  echo "tests: rc=$? $(grep -hoE '\[ cases \] [0-9]+' "$out/test-$t.log" | awk '{s+=$4} END {print s+0}') cases; $(grep -E 'PASSED|FAILED' "$out/test-$t.log" | tail -1)"
  "$b/tools/gatedmlp" bench --model "${MODEL:-8b}" --m "${MS:-1024,4096,16384}" --json "$out/bench-$t.json" \
    2>"$out/bench-$t.err" | tee "$out/bench-$t.txt" | grep -E "^(model|8b|70b|405b|custom) " | cut -c1-140
done
# SASS=1: the opcode mix of each portable bf16 kernel with 16-byte loads (sm_90a).
if [ "${SASS:-0}" = 1 ]; then
  cuobjdump -sass -arch sm_90a "$b/src/libgatedmlp.a" >"$out/sass.txt" 2>/dev/null
  awk '/Function : .*sm80_gemm_glu_kernelI13__nv_bfloat16.*Lb1E/ {f = $3; next} /Function :/ {f = ""}
       f && /\/\*[0-9a-f]{4}\*\// {op = $2; if (op ~ /^@/) op = $3; sub(/\..*/, "", op); n[f, op]++; t[f]++}
       END {for (k in n) {split(k, a, SUBSEP); if (n[k] * 100 >= t[a[1]]) printf "%s %6d %s\n", a[1], n[k], a[2]}}' \
    "$out/sass.txt" | sort -k1,1 -k2,2nr | tee "$out/sass-mix.txt"
fi
