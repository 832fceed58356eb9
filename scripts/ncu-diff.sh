#!/usr/bin/env bash
# Where one kernel spends what another does not: ncu's full set of sections
# (--set full, clocks locked to base) on two launches of one bench run, then
# every collected metric that differs by more than 3 % (scripts/ncu_diff.py,
# on the raw page), A -> B. KERNEL is a regex on the demangled name (template
# arguments included, which ncu writes as "(int)1") that matches both; SKIP
# launches of it are passed over first, and the next two are A and B in
# launch order (SWAP=1 turns them round; the names are printed). Output to
# $OUT or ./profile-out.
#   [KERNEL=regex] [SKIP=3] [SWAP=1] [BUILD=build-gpu] scripts/ncu-diff.sh [bench args]
# The default, `bench --m 4096 --preact` with SWAP=1, has A the call without
# the pre-activation and B the call with it.
set -uo pipefail
source "$(dirname "$0")/profile-env.sh"
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--m 4096 --preact)
ncu --set full --clock-control base --kernel-name-base demangled --kernel-name "regex:${KERNEL:-sm90_gemm_glu_kernel}" \
  --launch-skip "${SKIP:-3}" --launch-count 2 -f -o "$out/diff" "$b/tools/gatedmlp" bench "${args[@]}" --reps 3 \
  >"$out/ncu-diff.log" 2>&1
[ -f "$out/diff.ncu-rep" ] || { echo "ncu made no report:"; grep -E "==(ERROR|WARNING)==" "$out/ncu-diff.log" | head; exit 1; }
ncu -i "$out/diff.ncu-rep" --page raw --csv >"$out/diff-raw.csv" 2>&1
swap=()
[ "${SWAP:-1}" = 1 ] && swap=(--swap)
python3 scripts/ncu_diff.py "$out/diff-raw.csv" "${swap[@]}" --top "${TOP:-90}"
