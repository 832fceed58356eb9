#!/usr/bin/env bash
# Experiment h92 (docs/notes/fp8.md): cuBLASLt's own FP8 kernels for
# torch._scaled_mm per tensor, row-wise and with block scales, named by ncu
# (grid, threads, registers, shared memory, cluster, time at ncu's clock),
# then timed in graph replay outside ncu. Needs only torch (no build).
#   scripts/experiments/fp8-cublas-kernels.sh [model] [M]
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
model=${1:-8b}
m=${2:-4096}
py=scripts/experiments/fp8-cublas-kernels.py
python3 "$py" --model "$model" --m "$m" | tee "$out/fp8-cublas-times-$model-$m.txt"
ncu --csv --launch-skip 0 --launch-count 30 --kernel-name regex:'^(?!.*(fill|elementwise|vectorized)).*' \
  --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__cluster_dim_x,launch__cluster_dim_y,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active \
  python3 "$py" --model "$model" --m "$m" --reps 1 >"$out/fp8-cublas-ncu-$model-$m.csv" 2>"$out/fp8-cublas-ncu-$model-$m.err"
python3 - "$out/fp8-cublas-ncu-$model-$m.csv" <<'PY' | tee "$out/fp8-cublas-kernels-$model-$m.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
ix = {h: i for i, h in enumerate(head)}
seen = {}
for r in body:
    key = (r[ix["ID"]], r[ix["Kernel Name"]])
    seen.setdefault(key, {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]] + " " + r[ix["Metric Unit"]]
for (i, name), mets in seen.items():
    print(f"{i:>3} {name[:110]}")
    print("     " + "; ".join(f"{k.split('__')[-1]}={v.strip()}" for k, v in sorted(mets.items())))
PY
