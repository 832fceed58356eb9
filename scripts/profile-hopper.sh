#!/usr/bin/env bash
# Where the Hopper kernel's time goes on the big shapes: the SM clock and
# board power while the benchmark runs (one sample every 100 ms), and an ncu
# summary (clock, DRAM bytes, L2 hit rate, tensor-pipe activity) of one fused
# call per shape. The card's clocks are left as they are (--clock-control
# none), so the numbers are what the benchmark sees. Output to $OUT or
# ./profile-out.
#   [NCU=0] scripts/profile-hopper.sh [MODEL] [M,M,...]        (default: 405b 4096,16384)
# CLUSTERS="1 2" repeats the bench (and ncu) for each GATEDMLP_SM90_CLUSTER.
# SETTINGS="- VAR=VALUE[,VAR=VALUE...] ..." repeats them for each set of knobs
# ("-" is the default), as in experiments/probe-waves.sh; it overrides CLUSTERS.
# BENCH_ARGS="--preact" passes more options to every bench (and ncu) run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
model="${1:-405b}" ms="${2:-4096,16384}"
b="${BUILD:-build-prof}"  # BUILD=build-gpu reuses gpu-check.sh's build
if [ ! -x "$b/tools/gatedmlp" ]; then
  cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DGATEDMLP_BUILD_TESTS=OFF >"$out/build.log" 2>&1 && cmake --build "$b" -j"$(nproc)" >>"$out/build.log" 2>&1 ||
    { tail -20 "$out/build.log"; exit 1; }
fi
g="$b/tools/gatedmlp"

settings=${SETTINGS:-}
if [ -z "$settings" ]; then
  for cl in ${CLUSTERS:-default}; do
    settings+="$([ "$cl" = default ] && echo - || echo "GATEDMLP_SM90_CLUSTER=$cl") "
  done
fi
n=0
for s in $settings; do
  n=$((n + 1))
  cl=$n  # names this setting's output files
  if [ "$s" = - ]; then set --; else IFS=, read -ra kv <<<"$s"; set -- "${kv[@]}"; fi
  for kv in "$@"; do export "${kv?}"; done
  echo "=== setting $n: $([ "$s" = - ] && echo default || echo "$s")"
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 100 >"$out/smi.csv" 2>&1 &
  smi=$!
  "$g" bench --model "$model" --m "$ms" ${BENCH_ARGS:-} --json "$out/bench-$model-c$cl.json" 2>"$out/bench.err" | tee "$out/bench-$model.txt"
  kill "$smi" 2>/dev/null
  # Clock and power while the GPU was busy (samples above 300 W).
  awk -F', ' 'NR > 1 && $4 + 0 > 300 {n++; c += $2; p += $4; if ($2 + 0 < cmin || cmin == 0) cmin = $2 + 0}
    END {if (n) printf "busy samples %d: mean SM clock %.0f MHz (min %d), mean power %.0f W\n", n, c / n, cmin, p / n}' \
    "$out/smi.csv" | tee "$out/smi-summary.txt"

  IFS=, read -ra mlist <<<"$ms"
  for m in "${mlist[@]}"; do
    [ "${NCU:-1}" = 0 ] && break
    ncu --clock-control none --kernel-name regex:sm90_gemm_glu --launch-skip 1 --launch-count 1 \
      --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,lts__t_sectors_op_write.sum,smsp__inst_executed_op_global_st.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
      "$g" bench --model "$model" --m "$m" --reps 2 ${BENCH_ARGS:-} >"$out/ncu-$model-$m-c$cl.txt" 2>&1
    echo "--- ncu $model M=$m"
    grep -E "gpu__time|cycles_elapsed|dram__bytes|hit_rate|gmma|sm__throughput|lts__t_|global_st" "$out/ncu-$model-$m-c$cl.txt" | head -14
  done
  for kv in "$@"; do unset "${kv%%=*}"; done
done
