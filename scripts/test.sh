#!/usr/bin/env bash
# Builds everything and runs the test suite: CPU tests always, GPU tests when a
# device is present (otherwise CTest lists them as skipped).
#   scripts/test.sh            # preset "default"
#   scripts/test.sh ci         # warnings are errors
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
export PATH="/usr/local/cuda/bin:$PATH"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
cmake --workflow --preset "$preset"
