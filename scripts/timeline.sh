#!/usr/bin/env bash
# Per-CTA timeline of the Hopper kernel (src/sm90_gemm_glu/timeline.cuh):
# builds the tool with -DGATEDMLP_SM90_TIMELINE=ON into $BUILD (default
# build-tl), first checks that the instrumented kernel runs as fast as the
# release one ($REL, default build-gpu, if built: gemm / fused ratios side by
# side), then
# records GATEDMLP_SM90_TIMELINE_MAX launches per M after the first few and
# summarises them (scripts/timeline.py). Output to $OUT or ./timeline-out.
#   [MODEL=8b] [BUILD=build-tl] [REL=build-gpu] scripts/timeline.sh [M,M,...]   (default: 512,1024,4096)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/timeline-out}"
mkdir -p "$out"
b="${BUILD:-build-tl}" rel="${REL:-build-gpu}" model="${MODEL:-8b}" ms="${1:-512,1024,4096}"
if [ ! -x "$b/tools/gatedmlp" ]; then
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DGATEDMLP_BUILD_TESTS=OFF \
    -DGATEDMLP_SM90_TIMELINE=ON >"$out/build-tl.log" 2>&1 && cmake --build "$b" -j"$(nproc)" >>"$out/build-tl.log" 2>&1 ||
    { tail -30 "$out/build-tl.log"; exit 1; }
fi
if [ -x "$rel/tools/gatedmlp" ]; then
  echo "--- release vs instrumented (not recording), gemm / fused in the same runs"
  for tree in "$rel" "$b"; do
    "$tree/tools/gatedmlp" bench --model "$model" --m "$ms" --path hopper >"$out/bench-${tree//\//_}.txt" 2>&1
    echo "  $tree:"; grep -E "^(model|$model) " "$out/bench-${tree//\//_}.txt" | sed 's/^/    /'
  done
fi
IFS=, read -ra mlist <<<"$ms"
for m in "${mlist[@]}"; do
  f="$out/timeline-$model-$m.txt"
  rm -f "$f"
  GATEDMLP_SM90_TIMELINE="$f" GATEDMLP_SM90_TIMELINE_SKIP="${SKIP:-8}" GATEDMLP_SM90_TIMELINE_MAX="${LAUNCHES:-3}" \
    "$b/tools/gatedmlp" bench --model "$model" --m "$m" --path hopper --reps 20 >"$out/bench-tl-$m.txt" 2>&1
  python3 scripts/timeline.py "$f" | tee "$out/summary-$model-$m.txt"
done
