#!/usr/bin/env bash
# Experiment h77 (docs/notes/drop-in-and-decode.md): the decode epilogue's
# code size, checked and timed in one machine session:
#   1. probes/decode_wgmma.cu (probe-decode-small.sh wgmma): at 81367b6 the
#      probe's Hopper-form kernel against itself with the library's Params,
#      finish() and tensor maps, the library's kernel and cuBLAS; later, the
#      variants its header names;
#   2. a 90a build of the tests and the tool (gpu-check.sh build);
#   3. every suite that runs finish(): decode, quantized decode, gathered,
#      activations;
#   4. `gatedmlp bench` on the small models and 8B, graph-timed, as
#      shipped and with the Hopper form forced on (=1) and off (=0);
#   5. racecheck over the decode suites (the Hopper form's ring).
# PROBE=0 leaves out step 1. Needs a CUDA machine. Output to $OUT or ./profile-out.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
[ "${PROBE:-1}" = 1 ] && scripts/experiments/probe-decode-small.sh wgmma | tail -21
ARCHS=90a BUILD_TARGETS="test_gpu gatedmlp_tool" scripts/gpu-check.sh build | tail -1
timeout 150 build-gpu/tests/test_gpu --gtest_filter='GpuDecode.*:GpuQuant.*:GpuGather.*:GpuActivation.*' \
  >"$out/suites.log" 2>&1
echo "suites: rc=$? $(grep -hoE '\[ cases \] [0-9]+' "$out/suites.log" | awk '{s+=$4} END {print s+0}') cases;" \
  "$(grep -E '^\[  (PASSED|FAILED) ' "$out/suites.log" | tr '\n' ' ')"
grep -E "^\[  FAILED|Failure" "$out/suites.log" | head -10
BUILD=build-gpu MODELS="small 8b" ROUNDS=1 SETTINGS="GATEDMLP_DECODE_HOPPER=1 GATEDMLP_DECODE_HOPPER=0" \
  scripts/experiments/probe-decode-small.sh bench >/dev/null
for f in "$out"/bench-*.txt; do echo "-- $(basename "$f")"; cat "$f"; done
GATEDMLP_TEST_CASES=12 timeout 80 compute-sanitizer --tool racecheck --error-exitcode 3 build-gpu/tests/test_gpu \
  --gtest_filter='GpuDecode.Random*:GpuDecode.EveryLayout*' >"$out/racecheck.log" 2>&1
echo "racecheck (decode suites): rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/racecheck.log" | tail -1)"
