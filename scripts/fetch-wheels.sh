#!/usr/bin/env bash
# Downloads the test-time extras that a GPU machine without a package index
# needs (MLX's CPU backend, for the tests that compare against mlx) as wheels
# into .whl/, where scripts/gpu-check.sh's pyext step installs them from.
#   scripts/fetch-wheels.sh        (on a machine with an index; then carry .whl/)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
# The GPU machines run CPython 3.12 on x86-64 Linux; the version is CI's
# (scripts/python-cpu-test.sh), so both compare against the same MLX.
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --platform manylinux_2_35_x86_64 -d .whl "mlx==0.32.4" "mlx-cpu==0.32.4"
ls -l .whl
