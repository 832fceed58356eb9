#!/usr/bin/env bash
# Experiments h24, h29, h32, h33, h42, h49, h53, h54 (docs/notes, the Hopper kernel's waves, tiles, clusters and ping-pong kernels): fused and cuBLAS per M under several knob settings.
# Fused and cuBLAS time against the number of waves: one model's shape at
# many M, once per setting of the kernel's knobs (default: as shipped, then
# the split tail off), so that the ratios show where partial waves and
# partial cluster units cost.
#   scripts/experiments/probe-waves.sh [M list]
#   env: BUILD (build-ab), MODEL (8b), SETTINGS (space-separated; "-" is the
#        default, else VAR=VALUE[,VAR=VALUE...], e.g. "- GATEDMLP_SM90_CLUSTER=1")
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
b=${BUILD:-build-ab}
ms=${1:-256,384,512,640,768,896,1024,1536,2048,3072,4096}
if [ ! -x "$b/tools/gatedmlp" ]; then
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" -DGATEDMLP_BUILD_TESTS=OFF \
    >/tmp/probe-waves-build.log 2>&1 && cmake --build "$b" -j"$(nproc)" --target gatedmlp_tool >>/tmp/probe-waves-build.log 2>&1 ||
    { tail -20 /tmp/probe-waves-build.log; exit 1; }
fi
for s in ${SETTINGS:-- GATEDMLP_SM90_SPLIT_TAIL=0}; do
  echo "-- $([ "$s" = - ] && echo default || echo "$s")"
  if [ "$s" = - ]; then set --; else IFS=, read -ra kv <<<"$s"; set -- "${kv[@]}"; fi
  env "$@" "$b/tools/gatedmlp" bench --model "${MODEL:-8b}" --m "$ms" 2>/dev/null | grep -E "^(8b|70b|405b|custom) " | cut -c1-100
done
