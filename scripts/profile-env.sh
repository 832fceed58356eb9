# Sourced by the profiling scripts that run the bench of an existing build:
# the repository root as working directory, the CUDA tools on PATH, $out (OUT
# or ./profile-out) and $b (BUILD or build-gpu) with its gatedmlp tool.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
b="${BUILD:-build-gpu}"
[ -x "$b/tools/gatedmlp" ] || { echo "build $b first (ARCHS=90a scripts/gpu-check.sh build)"; exit 1; }
