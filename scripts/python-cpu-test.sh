#!/usr/bin/env bash
# Builds the Python extension from a build tree and runs the Python tests that
# need no GPU (GPU tests skip themselves). Installs its Python dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
python3 -m pip install --quiet --disable-pip-version-check "nanobind>=2.0" numpy pytest
# For the gatedmlp.torch tests and patch_model on transformers models (they
# skip without these). Pinned to the versions the GPU machine runs. The PyPI
# torch wheel pulls the nvidia-* CUDA packages (~3 GB); it cannot import
# without them even when no GPU is used.
python3 -m pip install --quiet --disable-pip-version-check "torch==2.11.0" "transformers==5.17.0"
# MLX's CPU backend: gatedmlp.quantize must give mlx.core.quantize's bits
# (tests/python/test_quant.py; skipped without it).
python3 -m pip install --quiet --disable-pip-version-check "mlx[cpu]==0.32.4"
# A build tree of its own, so the C++ test tree does not start to need nanobind.
cmake -S . -B build-python-ci -G Ninja -DCMAKE_BUILD_TYPE=Release -DGATEDMLP_WERROR=ON \
  -DGATEDMLP_BUILD_PYTHON=ON -DGATEDMLP_BUILD_TESTS=OFF -DGATEDMLP_BUILD_TOOLS=OFF \
  -DPython_EXECUTABLE="$(command -v python3)"
cmake --build build-python-ci --target _gatedmlp
HF_HUB_OFFLINE=1 PYTHONPATH=build-python-ci/python python3 -m pytest tests/python -q
