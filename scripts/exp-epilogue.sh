#!/usr/bin/env bash
# Timing experiment: the Hopper kernel with and without its epilogue
# (GATEDMLP_SM90_EXP_SKIP_EPILOGUE: Y is never written), each against cuBLAS
# in the same run. The difference bounds what overlapping the epilogue with
# the next tile's main loop (a ping-pong schedule) could win.
#   scripts/exp-epilogue.sh [bench args]     (default: 8B at M = 1024,4096,16384)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--m 1024,4096,16384)
for v in base skip; do
  b=build-exp-$v
  flags=""
  [ $v = skip ] && flags="-DGATEDMLP_SM90_EXP_SKIP_EPILOGUE"
  cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" -DCMAKE_CUDA_FLAGS="$flags" \
    -DGATEDMLP_BUILD_TESTS=OFF >/dev/null && cmake --build $b -j"$(nproc)" --target gatedmlp_tool >/dev/null || exit 1
done
for v in base skip base skip; do
  echo "-- $v"
  build-exp-$v/tools/gatedmlp bench "${args[@]}" 2>/dev/null | grep -E "^(model|8b|70b|405b|custom) " | cut -c1-100
done
