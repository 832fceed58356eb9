#!/usr/bin/env python3
"""Two kernels of one ncu CSV export side by side: every metric whose value
differs by more than THRESHOLD (a fraction, default 0.03) between launch A
and launch B (the first and second launch in the export, or --swap), largest
relative change first. Reads `--page raw --csv` (one row per launch, every
collected metric) or `--page details --csv` (one row per metric). Answers
"where does B spend what A does not" (ncu-diff.sh).
    scripts/ncu_diff.py FILE.csv [--swap] [--threshold 0.03] [--top 60]"""
import argparse
import csv

from ncu_source_top import num


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--swap", action="store_true")
    ap.add_argument("--threshold", type=float, default=0.03)
    ap.add_argument("--top", type=int, default=60)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    h = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head = rows[h]
    ci, ck = head.index("ID"), head.index("Kernel Name")
    vals, names = {}, {}
    if "Metric Name" in head:  # details: one row per metric
        cs, cm, cu, cv = (head.index(c) for c in ("Section Name", "Metric Name", "Metric Unit", "Metric Value"))
        for r in rows[h + 1:]:
            if len(r) <= cv:
                continue
            names.setdefault(r[ci], r[ck])
            vals.setdefault(r[ci], {})[(r[cs], r[cm], r[cu])] = r[cv]
    else:  # raw: a row of units, then one row per launch
        units = rows[h + 1]
        for r in rows[h + 2:]:
            if len(r) != len(head):
                continue
            names.setdefault(r[ci], r[ck])
            vals[r[ci]] = {("", head[j], units[j]): r[j] for j in range(ck + 1, len(head))}
    ids = list(names)
    if len(ids) < 2:
        raise SystemExit(f"{args.csv}: {len(ids)} launch(es), need two")
    a, b = (ids[1], ids[0]) if args.swap else (ids[0], ids[1])
    print(f"A = launch {a}: {names[a][:110]}\nB = launch {b}: {names[b][:110]}")
    diffs = []
    for key, va in vals[a].items():
        vb = vals[b].get(key)
        x, y = num(va), num(vb)
        if x is None or y is None or (x == 0 and y == 0):
            continue
        rel = (y - x) / abs(x) if x else float("inf")
        if abs(rel) > args.threshold:
            diffs.append((abs(rel), rel, key, va, vb))
    diffs.sort(key=lambda d: -d[0])
    print(f"{len(diffs)} metrics differ by more than {100 * args.threshold:.0f} %:")
    for _, rel, (sec, met, unit), va, vb in diffs[:args.top]:
        print(f"  {rel * 100:+8.1f}%  {sec[:24]:24s} {met[:48]:48s} {va:>14s} -> {vb:>14s} {unit}")


if __name__ == "__main__":
    main()
