#!/usr/bin/env bash
# Where the portable kernel's warps stall, per SASS instruction (ncu source
# counters), on one large shape. Run after scripts/profile.sh built build-prof.
#   scripts/profile-source.sh [M] [K] [U]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
m="${1:-4096}" k="${2:-4096}" u="${3:-14336}"
cmake --build build-prof -j"$(nproc)" >/dev/null 2>&1 || { echo "build-prof missing: run scripts/profile.sh first"; exit 1; }
ncu --kernel-name regex:sm80_gemm_glu --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats \
  --import-source no -o "$out/prof" build-prof/tools/gatedmlp bench --m "$m" --k "$k" --u "$u" --reps 3 >/dev/null 2>&1
ncu -i "$out/prof.ncu-rep" --page source --csv --print-source sass >"$out/source.csv" 2>&1
ncu -i "$out/prof.ncu-rep" --page details >"$out/details.txt" 2>&1
head -3 "$out/source.csv" | cut -c1-400
