#!/usr/bin/env bash
# h88 (docs/notes/drop-in-and-decode.md): builds the Python extension with
# the binding's stage timers (-DGATEDMLP_PY_TIMERS, python/src/stage_timers.hpp)
# and prints each entry point's host time, stage by stage.
#   scripts/experiments/binding-stages.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
cmake -S . -B build-timers -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_CXX_FLAGS=-DGATEDMLP_PY_TIMERS -DGATEDMLP_BUILD_TESTS=OFF -DGATEDMLP_BUILD_PYTHON=ON \
  -DPython_EXECUTABLE="$(command -v python3)" >/tmp/build-timers.log 2>&1 &&
  cmake --build build-timers -j"$(nproc)" --target _gatedmlp >>/tmp/build-timers.log 2>&1 ||
  { tail -30 /tmp/build-timers.log; exit 1; }
PYTHONPATH=build-timers/python python3 scripts/experiments/binding-stages.py
