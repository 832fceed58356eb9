#!/usr/bin/env python3
"""Two kernels of one `ncu --page details --csv` export side by side: every
metric of the details page whose value differs by more than THRESHOLD (a
fraction, default 0.03) between launch A and launch B (the first and second
launch in the export unless --a / --b name IDs), largest relative change
first. Answers "where does B spend what A does not" (ncu-diff.sh).
    scripts/ncu_diff.py details.csv [--a ID] [--b ID] [--threshold 0.03] [--top 60]"""
import argparse
import csv


def num(v):
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--a")
    ap.add_argument("--b")
    ap.add_argument("--threshold", type=float, default=0.03)
    ap.add_argument("--top", type=int, default=60)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    h = next(i for i, r in enumerate(rows) if "Metric Name" in r)
    head = rows[h]
    ci, ck, cs, cm, cu, cv = (head.index(c) for c in ("ID", "Kernel Name", "Section Name", "Metric Name",
                                                      "Metric Unit", "Metric Value"))
    vals, names = {}, {}
    for r in rows[h + 1:]:
        if len(r) != len(head):
            continue
        names.setdefault(r[ci], r[ck])
        vals.setdefault(r[ci], {})[(r[cs], r[cm], r[cu])] = r[cv]
    ids = list(names)
    a, b = args.a or ids[0], args.b or ids[1]
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
