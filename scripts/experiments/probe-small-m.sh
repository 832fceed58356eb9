#!/usr/bin/env bash
# Experiment (docs/notes, the Hopper kernel's open small-M bars, what cuBLAS runs at small M and at 8B M = 4096; the portable kernel on the H200, its clock): why small M misses its bars, and the power cap at M = 65536.
# Why the Hopper kernel misses the small-M bars (8B M = 64 and 512), and
# which clock limit the portable kernel runs into at M = 65536. Needs a build
# (BUILD, default build-prof: scripts/profile-hopper.sh makes one). Output to
# $OUT or ./profile-out.
#   scripts/experiments/probe-small-m.sh [steps...]     (default: scale narrow ncu source clock)
#   scale:  bench M = 64 and 512 as shipped, with the split tail forced, and
#           at M = 64 on fewer resident CTAs (GATEDMLP_SM90_CLUSTERS): if the
#           time grows as 1 / CTAs, each SM's stream is the limit, if not, DRAM.
#   narrow: M = 1 ... 128, X boxes of M rows against 128-row boxes.
#   ncu:    DRAM bytes and throughput, tensor-pipe activity, fused and cuBLAS.
#   gmma:   wgmma shared-memory wavefronts and bank conflicts, ours and
#           cuBLAS's, at M = 4096 and 512.
#   source: per-instruction stall sampling of the Hopper kernel at M = 512.
#   clock:  SM clock, power and throttle reasons (nvidia-smi, every 100 ms)
#           while the portable kernel's benchmark runs at M = 65536.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
b="${BUILD:-build-prof}"
g="$b/tools/gatedmlp"
[ -x "$g" ] || { echo "build $b first"; exit 1; }
rows() { grep -E "^(model|8b|70b|405b|custom) " | cut -c1-140; }

for step in ${@:-scale narrow ncu source clock}; do
  case "$step" in
  scale)
    echo "=== as shipped"; "$g" bench --m 64,512 2>/dev/null | rows
    echo "=== split tail forced"; GATEDMLP_SM90_SPLIT_TAIL=force "$g" bench --m 64,512 2>/dev/null | rows
    for c in 96 66 33; do
      echo "=== M = 64 on $c resident CTAs"; GATEDMLP_SM90_CLUSTERS=$c "$g" bench --m 64 2>/dev/null | rows
    done ;;
  narrow)
    # X boxes of only M rows (rounded up to 8) against full 128-row boxes
    # mostly past the edge (GATEDMLP_SM90_NARROW_X=0), three rounds
    # interleaved so that drift hits both alike.
    for round in 1 2 3; do
      for v in 1 0; do
        echo "=== round $round, GATEDMLP_SM90_NARROW_X=$v"
        GATEDMLP_SM90_NARROW_X=$v "$g" bench --m 1,16,64,100,128 2>/dev/null | rows | grep -v '^model'
      done
    done ;;
  ncu)
    for m in 64 512; do
      ncu --clock-control none --kernel-name 'regex:gemm_glu_kernel|nvjet|xmma|cutlass' --launch-skip 2 --launch-count 2 \
        --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size \
        "$g" bench --m "$m" --reps 2 >"$out/ncu-small-$m.txt" 2>&1
      echo "--- ncu 8b M=$m"
      awk '/^  [a-zA-Z_].*\(/ {name = substr($1, 1, 40)} /gpu__time|cycles_elapsed|dram__|hit_rate|gmma|grid_size/ {print "  " name, $1, $(NF-1), $NF}' "$out/ncu-small-$m.txt"
    done ;;
  gmma)
    # How the tensor pipe's shared-memory operand reads fare, ours against
    # cuBLAS at 8B M = 4096 and 512: wgmma instructions, the shared-memory
    # wavefronts and bank conflicts they cause, bank reads against peak.
    for m in 4096 512; do
      ncu --clock-control none --kernel-name 'regex:gemm_glu_kernel|nvjet|xmma|cutlass' --launch-skip 2 --launch-count 2 \
        --metrics gpu__time_duration.sum,sm__cycles_elapsed.avg.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_tensor_op_gmma.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_gmma.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_gmma.sum,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed \
        "$g" bench --m "$m" --reps 2 >"$out/ncu-gmma-$m.txt" 2>&1
      echo "--- ncu gmma 8b M=$m"
      awk '/^  [a-zA-Z_].*\(/ {name = substr($1, 1, 40)} /gpu__time|cycles_elapsed|sm__throughput|gmma|bank_/ {print "  " name, $1, $(NF-1), $NF}' "$out/ncu-gmma-$m.txt"
    done ;;
  source)
    OUT="$out" KERNEL=sm90_gemm_glu BUILD="$b" scripts/profile-source.sh 512 4096 14336 | head -40 ;;
  clock)
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
      --format=csv,noheader -lms 100 >"$out/smi-portable.csv" 2>&1 &
    smi=$!
    "$g" bench --m 16384,65536 --path portable 2>/dev/null | rows
    kill "$smi" 2>/dev/null
    # Busy samples (over 300 W): clock and power per throttle-reason mask
    # (0x4 power cap, 0x20 / 0x40 thermal, 0x8 HW slowdown).
    awk -F', ' '$3 + 0 > 300 {k = $5; n[k]++; c[k] += $2; p[k] += $3; t[k] += $4}
      END {for (k in n) printf "reasons %s: %d samples, mean SM clock %.0f MHz, %.0f W, %.0f C\n", k, n[k], c[k] / n[k], p[k] / n[k], t[k] / n[k]}' \
      "$out/smi-portable.csv" ;;
  *) echo "unknown step $step"; exit 2 ;;
  esac
done
