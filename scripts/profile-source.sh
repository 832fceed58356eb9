#!/usr/bin/env bash
# Where a kernel's warps stall, per SASS instruction (ncu source counters),
# on one large shape. Run after scripts/profile.sh (or profile-hopper.sh)
# built build-prof; KERNEL picks the kernel (default: the portable one), a
# regex on the function name, or with KERNEL_BASE=demangled on the whole
# name, template arguments included (one instantiation: e.g. the
# pre-activation kernel "sm90_gemm_glu_kernel<__nv_bfloat16, .int.0, .int.1, .int.1,";
# ncu writes the arguments as "(int)0").
#   [KERNEL=sm90_gemm_glu] [KERNEL_BASE=function|demangled] [BUILD=build-gpu] [BENCH_ARGS=--preact] scripts/profile-source.sh [M] [K] [U]
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
m="${1:-4096}" k="${2:-4096}" u="${3:-14336}"
b="${BUILD:-build-prof}" kern="${KERNEL:-sm80_gemm_glu}"
cmake --build "$b" -j"$(nproc)" >/dev/null 2>&1 || { echo "$b missing: run scripts/profile.sh first"; exit 1; }
ncu --clock-control none --kernel-name-base "${KERNEL_BASE:-function}" --kernel-name regex:"$kern" --launch-skip 2 --launch-count 1 --section SourceCounters --section WarpStateStats \
  --import-source no -f -o "$out/prof" "$b"/tools/gatedmlp bench --m "$m" --k "$k" --u "$u" --reps 3 ${BENCH_ARGS:-} >"$out/ncu.log" 2>&1
[ -f "$out/prof.ncu-rep" ] || { echo "ncu made no report:"; grep -E "==(ERROR|WARNING)==" "$out/ncu.log" | head; exit 1; }
ncu -i "$out/prof.ncu-rep" --page source --csv --print-source sass >"$out/source.csv" 2>&1
ncu -i "$out/prof.ncu-rep" --page details >"$out/details.txt" 2>&1
python3 scripts/ncu_source_top.py "$out/source.csv" 30
