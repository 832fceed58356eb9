#!/usr/bin/env bash
# h79 (docs/notes/quantized-decode.md): the repacked int4 decode kernel's
# SASS at 8B, M = 1 (KERNEL: a regex, default repacked_kernel; the
# checkpoint-order one is quant_decode_kernel): ncu source counters, the
# instructions executed per opcode and the stall samples of the hottest
# instructions. Needs the extension in build-gpu (gpu-check.sh pyext).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PATH="/usr/local/cuda/bin:$PATH"
out="${OUT:-$PWD/profile-out}"
mkdir -p "$out"
kern="${KERNEL:-repacked_kernel}"
PYTHONPATH="$PWD/build-gpu/python" ncu --kernel-name regex:"$kern" --launch-count 1 --section SourceCounters \
  --section WarpStateStats --import-source no -f -o "$out/src-$kern" python3 scripts/experiments/quant-decode-ncu.py 1 \
  >"$out/ncu-src.log" 2>&1
[ -f "$out/src-$kern.ncu-rep" ] || { echo "ncu made no report:"; tail -5 "$out/ncu-src.log"; exit 1; }
ncu -i "$out/src-$kern.ncu-rep" --page source --csv --print-source sass >"$out/source-$kern.csv" 2>&1
python3 scripts/ncu_source_top.py "$out/source-$kern.csv" 25
python3 - "$out/source-$kern.csv" <<'PY'
import csv, collections, sys
rows = list(csv.reader(open(sys.argv[1], newline="")))
h = next(i for i, r in enumerate(rows) if "Source" in r)
head = rows[h]
src = head.index("Source")
ex = next(i for i, c in enumerate(head) if c.startswith("Instructions Executed"))
by = collections.Counter()
total = 0
for r in rows[h + 1:]:
    if len(r) != len(head):
        continue
    try:
        n = float(r[ex].replace(",", ""))
    except ValueError:
        continue
    op = r[src].strip().split()[0] if r[src].strip() else "?"
    if op.startswith("@"):
        op = r[src].strip().split()[1]
    by[op.split(".")[0]] += n
    total += n
print(f"warp instructions executed: {total:.0f}")
for op, n in by.most_common(25):
    print(f"  {op:10s} {n:12.0f} {100 * n / total:5.1f} %")
PY
