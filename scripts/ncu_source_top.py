#!/usr/bin/env python3
"""Summarises an `ncu --page source --csv --print-source sass` export: the
stall-sampling columns by total, then the samples per opcode (the SASS
mnemonic without its modifiers), then the instructions with the most samples
and, for each, its three largest stall columns.
    scripts/ncu_source_top.py source.csv [N]"""
import csv
import sys


def num(v):
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    # The header is the first row that names a "Source" column.
    h = next(i for i, r in enumerate(rows) if "Source" in r)
    head, body = rows[h], [r for r in rows[h + 1:] if len(r) == len(rows[h])]
    src = head.index("Source")
    samp = [i for i, c in enumerate(head) if "Sampling" in c or c.startswith("stall") or "Stall" in c]
    allc = next((i for i in samp if "All" in head[i]), samp[0] if samp else None)
    if allc is None:
        print("no sampling columns:", head)
        return
    totals = sorted(((sum(num(r[i]) or 0 for r in body), head[i]) for i in samp), reverse=True)
    grand = sum(num(r[allc]) or 0 for r in body)
    print(f"{len(body)} instructions, {grand:.0f} samples")
    for t, name in totals[:16]:
        if t:
            print(f"  {t:10.0f}  {100 * t / max(grand, 1):5.1f}%  {name}")
    ops = {}
    for r in body:
        words = r[src].split()
        if words and words[0].startswith("@"):
            words = words[1:]
        op = words[0].split(".")[0] if words else "?"
        cnt, smp = ops.get(op, (0, 0))
        ops[op] = (cnt + 1, smp + (num(r[allc]) or 0))
    print("samples per opcode (instructions of it):")
    for op, (cnt, smp) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {smp:10.0f}  {100 * smp / max(grand, 1):5.1f}%  {op} ({cnt})")
    print(f"top {top} instructions by '{head[allc]}':")
    body.sort(key=lambda r: -(num(r[allc]) or 0))
    for r in body[:top]:
        s = num(r[allc]) or 0
        reasons = sorted(((num(r[i]) or 0, head[i]) for i in samp if i != allc and "Not" not in head[i]), reverse=True)[:3]
        why = ", ".join(f"{n.split('(')[0].strip()} {v:.0f}" for v, n in reasons if v)
        print(f"  {s:8.0f} {100 * s / max(grand, 1):5.1f}%  {r[src][:60]:60s} {why}")


if __name__ == "__main__":
    main()
