#!/usr/bin/env bash
# h79 (docs/notes/quantized-decode.md): where the int4 decode kernels' time
# goes at 8B, M = 1 and 16, on the checkpoint's words (quant_decode_kernel)
# and on the repacked ones (repacked_kernel): ncu's throughput, issue and
# stall sections plus the L1 wavefronts and tensor-pipe use, caches flushed
# (cold weights). Needs the extension in build-gpu (gpu-check.sh pyext).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
metrics="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,"
metrics+="sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,"
metrics+="l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts.sum,"
metrics+="sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,"
metrics+="smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,"
metrics+="smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,"
metrics+="smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,"
metrics+="smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,"
metrics+="smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,"
metrics+="smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,"
metrics+="smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
PYTHONPATH="$PWD/build-gpu/python" ncu --csv --page raw --print-units base -k regex:"quant_decode_kernel|repacked_kernel" \
  --metrics "$metrics" python3 scripts/experiments/quant-decode-ncu.py ${MS:-1 16} >"$out/ncu-repacked.csv" 2>"$out/ncu-repacked.err"
python3 - "$out/ncu-repacked.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hdr]
for r in rows[hdr + 2:]:
    d = dict(zip(h, r))
    name = "repacked" if "repacked" in d["Kernel Name"] else "checkpoint"
    print(f"== {name} grid {d.get('Grid Size', '')}")
    for k in h:
        if "__" in k:
            print(f"  {k:95s} {d[k]}")
PY
