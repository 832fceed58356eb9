#!/usr/bin/env bash
# Host µs per Python entry point, before and after a Python-only change (h74), in
# one run on one machine: bench_dropin's host section with another tree's
# Python package and with this tree's, both beside this build's extension
# (a Python-only change leaves the extension as it is), alternated in
# rounds so that drift between them shows as spread, not as a difference.
#
#   BEFORE=<folder holding gatedmlp/*.py of the old tree> scripts/experiments/host-before-after.sh [rounds]
#
# Make the folder with, say:
#   mkdir -p before-pkg && git archive <commit> python/gatedmlp | tar -x -C before-pkg --strip-components=1
# Needs the extension built in $BUILD (default build-gpu; gpu-check.sh's
# pyext step builds it). HOST_ARGS: more bench_dropin arguments (default
# --host-reps 31). Tables go to $OUT (default gpu-check-out).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${BUILD:-build-gpu}"
before="$(cd "${BEFORE:?BEFORE=<folder with the old gatedmlp package>}" && pwd)"
out="${OUT:-$PWD/gpu-check-out}"
rounds="${1:-2}"
mkdir -p "$out"
so=$(ls "$PWD/$build/python/gatedmlp/"_gatedmlp*.so)
ln -sf "$so" "$before/gatedmlp/"
for r in $(seq 1 "$rounds"); do
  for side in before after; do
    path=$([ "$side" = before ] && echo "$before" || echo "$PWD/$build/python")
    echo "### round $r: $side"
    PYTHONPATH="$path" python3 scripts/bench_dropin.py --sections host ${HOST_ARGS:---host-reps 31} \
      --json "$out/host-$side-$r.json" 2>&1 | tee "$out/host-$side-$r.txt" | grep -E "^\|" || true
  done
done
