#!/usr/bin/env bash
# How far the fused kernel is from what its tensor pipe allows, at one clock.
# For each MODEL:M, ncu profiles 15 launches of the bench's paths after the
# first round (cuBLAS GEMM, unfused GEMM + GLU, fused; with BENCH_ARGS=--preact also
# the fused call without the pre-activation) with the SM clock locked
# (CLOCK=base, the default; CLOCK=none leaves it free), and scripts/ncu_kernels.py
# prints per kernel: time, clock, tensor-pipe activity, DRAM bytes, L2 hit
# rate, share of the tensor peak (the FLOPs over time x clock x SMs x 4096);
# then unfused / fused at that clock, and what it would be with the fused
# kernel at the tensor peak (the ratio's ceiling).
# Output to $OUT or ./profile-out.
#   [CLOCK=base|none] [BENCH_ARGS=...] [BUILD=build-gpu] scripts/profile-ceiling.sh [MODEL:M ...]
#   (default: 8b:4096 70b:4096 405b:4096)
set -uo pipefail
source "$(dirname "$0")/profile-env.sh"
cases=("$@")
[ ${#cases[@]} -eq 0 ] && cases=(8b:4096 70b:4096 405b:4096)
metrics=device__attribute_multiprocessor_count,gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct
tag=$(echo "${BENCH_ARGS:-}" | tr -dc 'a-z0-9')
for c in "${cases[@]}"; do
  model=${c%%:*} m=${c##*:}
  case $model in  # K, U of the bench's models: the GEMM's FLOPs, 2 M K 2U
    8b) ku="4096 14336" ;; 70b) ku="8192 28672" ;; 405b) ku="16384 53248" ;; *) echo "model $model?"; exit 2 ;;
  esac
  flops=$(echo "$ku" | awk -v m="$m" '{printf "%.0f", 4 * m * $1 * $2}')
  f="$out/ceiling-$model-$m-${CLOCK:-base}${tag:+-$tag}"
  # --reps 2: a warm-up round, a sizing round, two timed rounds (4 or, with
  # --preact, 5 launches each); the first 5 launches (module load, cuBLASLt
  # set-up) are skipped.
  # shellcheck disable=SC2086
  ncu --csv --clock-control "${CLOCK:-base}" --kernel-name 'regex:glu_kernel|nvjet|xmma|cutlass|gemm' \
    --launch-skip 5 --launch-count 15 --metrics "$metrics" \
    "$b/tools/gatedmlp" bench --model "$model" --m "$m" --reps 2 ${BENCH_ARGS:-} >"$f.csv" 2>"$f.log"
  echo "--- $model M=$m clock=${CLOCK:-base} ${BENCH_ARGS:-}"
  python3 scripts/ncu_kernels.py "$f.csv" --flops "$flops" || tail -5 "$f.log"
done
