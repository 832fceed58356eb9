#!/usr/bin/env bash
# h87 (docs/notes/fp8.md): the promoting FP8 loop of this tree against a base
# tree's, on one GPU. BASE: a folder holding the base tree's versions of the
# files that differ, at their paths in the repository (e.g. made by
# `git show <rev>:<path>`); the base is this tree with those files over it.
# Builds both (Python extension; this tree's GPU tests too) side by side,
# runs this tree's FP8 suites, then fp8-promote-ab.py on base and this tree
# in turn (ROUNDS pairs, default 1). Output under $OUT.
# AB_SCRIPT: another timing script to alternate instead (h94: bench_quant.py
# for the quantized decode kernel).
#   BASE=ab-base [GTEST_FILTER='GpuFp8.*'] [PYTEST=1] [ROUNDS=1] [AB_SCRIPT=...] [AB_ARGS=...] scripts/experiments/fp8-loop-ab.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/gpu-check-out}"
mkdir -p "$out"
source scripts/experiments/ab-tree.sh
bt=/tmp/fp8-loop-ab-base
ab_base_tree "$bt" || exit 1
t0=$(date +%s)
half=$(( $(nproc) / 2 ))
(ab_conf "$PWD" build-gpu && cmake --build build-gpu --target _gatedmlp test_gpu -j"$half") >"$out/build.log" 2>&1 &
(ab_conf "$bt" "$bt/build-gpu" && cmake --build "$bt/build-gpu" --target _gatedmlp -j"$half") >"$out/build-base.log" 2>&1 &
wait
[ -f build-gpu/tests/test_gpu ] || { tail -30 "$out/build.log"; exit 1; }
ls "$bt"/build-gpu/python/gatedmlp/_gatedmlp*.so >/dev/null 2>&1 || { tail -30 "$out/build-base.log"; exit 1; }
echo "== builds: $(( $(date +%s) - t0 )) s"
build-gpu/tests/test_gpu --gtest_filter="${GTEST_FILTER:-GpuFp8.*}" >"$out/fp8test.log" 2>&1
echo "== GpuFp8: rc=$?; $(grep -hoE '[0-9]+ cases,' "$out/fp8test.log" | awk '{s+=$1} END {print s+0}') cases; $(grep -E 'PASSED|FAILED' "$out/fp8test.log" | tail -3 | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure" "$out/fp8test.log" | head -10
if [ "${PYTEST:-1}" = 1 ]; then
  (cd /tmp && PYTHONPATH="$OLDPWD/build-gpu/python" python3 -m pytest "$OLDPWD/tests/python/test_fp8.py" \
    "$OLDPWD/tests/python/test_fp8_module.py" -q -p no:cacheprovider) >"$out/pytest.log" 2>&1
  echo "== pytest fp8: rc=$?; $(tail -1 "$out/pytest.log")"
  grep -E "FAILED" "$out/pytest.log" | head -10
fi
for r in $(seq "${ROUNDS:-1}"); do
  for tree in "$bt" "$PWD"; do
    echo "== $([ "$tree" = "$PWD" ] && echo this tree || echo base), pair $r"
    PYTHONPATH="$tree/build-gpu/python" python3 "${AB_SCRIPT:-scripts/experiments/fp8-promote-ab.py}" ${AB_ARGS:---model 8b,70b,qwen3-32b --m 2048,4096 --rounds 3}
  done
done 2>&1 | tee "$out/ab.txt"
