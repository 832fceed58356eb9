#!/usr/bin/env bash
# Experiments h11, h44, h46 (docs/notes, the Hopper kernel: pricing the epilogue and the pre-activation's parts): builds with parts of the epilogue compiled out, timed against cuBLAS.
# Timing experiments on the Hopper kernel's epilogue, each build against
# cuBLAS in the same run (silu, the bench's default):
#   base   as shipped
#   skip   GATEDMLP_SM90_EXP_SKIP_EPILOGUE: no epilogue at all (Y never written);
#          bounds what overlapping it with the main loop could win
#   noact  GATEDMLP_SM90_EXP_NO_ACT: Y = g * u (no special functions)
# and on the pre-activation kernels (PRE = 1; run with --preact):
#   prenostore  GATEDMLP_SM90_EXP_PRE_NO_STORE: parked, never stored
#   prenopark   GATEDMLP_SM90_EXP_PRE_NO_PARK: stored, never parked (garbage)
#   prenobar    GATEDMLP_SM90_EXP_PRE_NO_BOTHBAR: no barrier of both
#               warpgroups before round 1 (racy: timing only)
#   prenowait   GATEDMLP_SM90_EXP_PRE_NO_WAIT: neither Y nor the held
#               stage's release waits for the stores to have read shared
#               memory (racy: timing only)
#   scripts/experiments/exp-epilogue.sh [bench args]     (default: 8B at M = 1024,4096,16384)
# VARIANTS picks builds (default: base skip).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--m 1024,4096,16384)
variants=(${VARIANTS:-base skip})
for v in "${variants[@]}"; do
  b=build-exp-$v
  case $v in
    base) flags="" ;;
    skip) flags="-DGATEDMLP_SM90_EXP_SKIP_EPILOGUE" ;;
    noact) flags="-DGATEDMLP_SM90_EXP_NO_ACT" ;;
    prenostore) flags="-DGATEDMLP_SM90_EXP_PRE_NO_STORE" ;;
    prenopark) flags="-DGATEDMLP_SM90_EXP_PRE_NO_PARK" ;;
    prenobar) flags="-DGATEDMLP_SM90_EXP_PRE_NO_BOTHBAR" ;;
    prenowait) flags="-DGATEDMLP_SM90_EXP_PRE_NO_WAIT" ;;
    *) echo "unknown variant $v"; exit 2 ;;
  esac
  # The builds in parallel.
  (cmake -S . -B $b -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="90a" -DCMAKE_CUDA_FLAGS="$flags" \
    -DGATEDMLP_BUILD_TESTS=OFF >/tmp/exp-$v.log 2>&1 && cmake --build $b -j"$(nproc)" --target gatedmlp_tool >>/tmp/exp-$v.log 2>&1 ||
    { tail -20 /tmp/exp-$v.log; echo "build of $v FAILED"; }) &
done
wait
for v in "${variants[@]}"; do [ -x build-exp-$v/tools/gatedmlp ] || exit 1; done
for v in "${variants[@]}" "${variants[@]}"; do
  echo "-- $v"
  # The first 100 columns and, with --preact, the cost column ("preact +x.x% (t ms without)").
  build-exp-$v/tools/gatedmlp bench "${args[@]}" 2>/dev/null | grep -E "^(model|8b|70b|405b|custom) " |
    sed -E 's/^(.{100}).*(preact [^)]*\)).*$/\1 | \2/; t; s/^(.{100}).*$/\1/'
done
