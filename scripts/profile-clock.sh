#!/usr/bin/env bash
# Is a shape slower per FLOP because of the chip's clock or because of the
# kernel? For each M, ncu times one fused call and one cuBLAS GEMM twice: with
# the clocks left free (what the benchmark sees) and locked to base (--clock-control
# base), and reports time, mean SM clock, DRAM bytes and the L2 hit rate.
# Output to $OUT or ./profile-out.
#   [GATEDMLP_PATH=portable|hopper] [CLOCKS="none base"] scripts/profile-clock.sh [MODEL] [M,M,...]   (default: 8b 16384,65536)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
model="${1:-8b}" ms="${2:-16384,65536}" path="${GATEDMLP_PATH:-portable}"
b="${BUILD:-build-gpu}"
[ -x "$b/tools/gatedmlp" ] || { echo "build $b first (scripts/gpu-check.sh build)"; exit 1; }
# The fused kernel and cuBLAS's GEMM kernel (whatever cuBLASLt picks: nvjet,
# sm90_xmma, cutlass), skipping the warm-up round.
kernels='regex:gemm_glu_kernel|nvjet|xmma|cutlass'
metrics=gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
IFS=, read -ra mlist <<<"$ms"
for m in "${mlist[@]}"; do
  for cc in ${CLOCKS:-none base}; do
    f="$out/clock-$model-$m-$cc.txt"
    ncu --clock-control "$cc" --kernel-name "$kernels" --launch-skip 2 --launch-count 4 --metrics "$metrics" \
      "$b/tools/gatedmlp" bench --model "$model" --m "$m" --path "$path" --reps 2 >"$f" 2>&1
    echo "--- $model M=$m clocks=$cc"
    awk '/^  [a-zA-Z_].*\(/ {name = substr($1, 1, 40)} /gpu__time_duration|cycles_elapsed|dram__bytes|hit_rate/ {print "  " name, $1, $(NF-1), $NF}' "$f"
  done
done
