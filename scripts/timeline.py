#!/usr/bin/env python3
"""Summarise the Hopper kernel's per-CTA timeline (a build with
-DGATEDMLP_SM90_TIMELINE=ON, run with GATEDMLP_SM90_TIMELINE=FILE; see
src/sm90_gemm_glu/timeline.cuh and scripts/timeline.sh).

    scripts/timeline.py FILE [--cta N]

For each recorded launch it prints where the time between the first CTA's
first instruction and the last CTA's exit went: the start-up, the whole
items, the spread of the clusters' finishing times before the split tail,
the tail's pieces and the owners' waits for partials, and the end. Times in
microseconds from the launch's first event.
"""
import argparse
import statistics
from collections import defaultdict

ENTRY, SYNCED, LOAD, LOADED, PIECE, FIRST_FULL, MAIN_DONE, HANDED, ADDED, EPI_DONE, DRAINED, EXIT = range(1, 13)
ROLE_NAMES = {0: "whole", 1: "partial", 2: "owner"}


def stats(xs):
    xs = sorted(xs)
    if not xs:
        return "-"
    q = lambda f: xs[min(len(xs) - 1, int(f * (len(xs) - 1) + 0.5))]
    return f"min {xs[0]:8.2f}  p50 {q(0.5):8.2f}  p90 {q(0.9):8.2f}  max {xs[-1]:8.2f}  (n={len(xs)})"


def load(path):
    launches = []
    for line in open(path):
        f = line.split()
        if not f:
            continue
        if f[0] == "launch":
            kv = dict(zip(f[2::2], f[3::2]))
            launches.append({"info": {k: int(v) for k, v in kv.items()}, "ev": []})
        elif f[0] == "ev" and launches:
            _, _, cta, role, point, w, item, kb0, kb1, prole, t = f
            launches[-1]["ev"].append((int(cta), int(role), int(point), int(w), int(item), int(kb0), int(kb1),
                                       int(prole), int(t) / 1000.0))
    return launches


def summarise(lz, show_cta):
    info = lz["info"]
    cm = info["cm"]
    # (cta, role) -> point -> w -> event
    by = defaultdict(lambda: defaultdict(dict))
    for cta, role, point, w, item, kb0, kb1, prole, t in lz["ev"]:
        by[(cta, role)][point][w] = (t, item, kb0, kb1, prole)
    ctas = sorted({c for c, _ in by})
    print(f"--- launch: M {info['m']} K {info['k']} U {info['u']} batch {info['batch']}: {info['tiles']} items, "
          f"{info['ctas']} CTAs in clusters of {cm}, {info['k_blocks']} k-blocks per item, split tail from item "
          f"{info['sk_first']} ({info['sk_iters']} k-blocks)")
    entry = [by[(c, 0)][ENTRY][0][0] for c in ctas if 0 in by[(c, 0)][ENTRY]]
    exits = [by[(c, r)][EXIT][0][0] for c in ctas for r in range(3) if 0 in by[(c, r)][EXIT]]
    span = max(exits) if exits else float("nan")
    print(f"span (first entry -> last exit): {span:.2f} us")
    print(f"entry:                         {stats(entry)}")
    print(f"set-up (entry -> synced):      {stats([by[(c, 0)][SYNCED][0][0] - by[(c, 0)][ENTRY][0][0] for c in ctas if 0 in by[(c, 0)][SYNCED]])}")
    print(f"first load issued:             {stats([by[(c, 0)][LOAD][0][0] for c in ctas if 0 in by[(c, 0)][LOAD]])}")
    first_data = [by[(c, r)][FIRST_FULL][0][0] for c in ctas for r in (1, 2) if 0 in by[(c, r)][FIRST_FULL]]
    print(f"first stage full (consumers):  {stats(first_data)}")
    # The same, each from its own CTA's entry: the launch's spread of CTA
    # starts taken out.
    own = lambda c, r, pt: by[(c, r)][pt][0][0] - by[(c, 0)][ENTRY][0][0]
    has = lambda c, r, pt: 0 in by[(c, r)][pt] and 0 in by[(c, 0)][ENTRY]
    print(f"  own entry -> synced:         {stats([own(c, 0, SYNCED) for c in ctas if has(c, 0, SYNCED)])}")
    print(f"  own entry -> first load:     {stats([own(c, 0, LOAD) for c in ctas if has(c, 0, LOAD)])}")
    print(f"  own entry -> first full:     {stats([own(c, r, FIRST_FULL) for c in ctas for r in (1, 2) if has(c, r, FIRST_FULL)])}")
    print(f"  own entry -> first wait:     {stats([own(c, r, PIECE) for c in ctas for r in (1, 2) if has(c, r, PIECE)])}")

    # Per piece, consumer warpgroup 1 (role 1) and 2 alike.
    whole_time, epi_time, wait_first, main_time = [], [], [], []
    tail_rows = []
    whole_end = defaultdict(float)  # cluster -> time its whole items finished (max over its CTAs and roles)
    last_epi = {}
    for c in ctas:
        for r in (1, 2):
            ev = by[(c, r)]
            prev_end = None
            for w in sorted(ev[PIECE]):
                t0, item, kb0, kb1, prole = ev[PIECE][w]
                ff = ev[FIRST_FULL].get(w, (None,))[0]
                md = ev[MAIN_DONE].get(w, (None,))[0]
                ed = ev[EPI_DONE].get(w, (None,))[0]
                hd = ev[HANDED].get(w, (None,))[0]
                ad = ev[ADDED].get(w, (None,))[0]
                if ff is not None:
                    wait_first.append(ff - t0)
                whole = kb0 == 0 and kb1 == info["k_blocks"] and prole == 0
                if whole and ed is not None and md is not None:
                    main_time.append(md - ff)
                    epi_time.append(ed - md)
                    if prev_end is not None:
                        whole_time.append(ed - prev_end)
                    whole_end[c // cm] = max(whole_end[c // cm], ed)
                if item >= info["sk_first"] and info["sk_iters"] > 0:
                    tail_rows.append((c, r, w, item, kb0, kb1, prole, t0, ff, md, hd, ad, ed))
                end = ed if ed is not None else hd
                if end is not None:
                    prev_end = end
                    last_epi[(c, r)] = end
    print(f"whole item, end to end:        {stats(whole_time)}")
    print(f"  main loop (first full->done):{stats(main_time)}")
    print(f"  epilogue (done -> stores):   {stats(epi_time)}")
    print(f"  first-stage wait per piece:  {stats(wait_first)}")
    if whole_end:
        ends = list(whole_end.values())
        print(f"clusters' whole items done:    {stats(ends)}  spread {max(ends) - min(ends):.2f}")
    if tail_rows:
        dur = [md - t0 for (_, _, _, _, _, _, _, t0, _, md, *_r) in tail_rows if md is not None]
        print(f"tail pieces: {len(tail_rows)}; main loop {stats(dur)}")
        owner_wait = [ad - md for (*_a, md, hd, ad, ed) in tail_rows if ad is not None and md is not None]
        print(f"  owners' partial adds (main done -> added): {stats(owner_wait)}")
        tail_start = [t0 for (_, _, w, _, _, _, _, t0, *_r) in tail_rows]
        print(f"  tail pieces start:           {stats(tail_start)}")
        # Each owner's critical path: its own main loop's end (md), the last of
        # the partials it adds being handed over (the same item, the CTA of the
        # same rank in the lower clusters, the same warpgroup), and the adds.
        handed = defaultdict(list)  # (item, rank, warpgroup) -> times partials were handed
        for (c, r, w, item, kb0, kb1, prole, t0, ff, md, hd, ad, ed) in tail_rows:
            if prole == 1 and hd is not None:
                handed[(item, c % cm, r)].append(hd)
        late, adds = [], []
        for (c, r, w, item, kb0, kb1, prole, t0, ff, md, hd, ad, ed) in tail_rows:
            hs = handed.get((item, c % cm, r))
            if prole != 2 or ad is None or md is None or not hs:
                continue
            late.append(max(hs) - md)
            adds.append(ad - max(md, max(hs)))
        print(f"  first-stage wait, tail pieces: {stats([ff - t0 for (*_a, t0, ff, md, hd, ad, ed) in tail_rows if ff is not None])}")
        print(f"  owners: last partial handed - own main done: {stats(late)}")
        print(f"  owners: adds after both (-> added):          {stats(adds)}")
        handed_at = [hd for (*_a, hd, ad, ed) in tail_rows if hd is not None]
        print(f"  partials handed:             {stats(handed_at)}")
    ends = list(last_epi.values())
    print(f"last stores issued per warpgroup: {stats(ends)}")
    drained = [by[(c, r)][DRAINED][0][0] for c in ctas for r in (1, 2) if 0 in by[(c, r)][DRAINED]]
    print(f"drained (last TMA store done): {stats(drained)}")
    print(f"exit:                          {stats(exits)}")
    if ends:
        n = info["tiles"] * info["k_blocks"]
        per_kb = statistics.median(main_time) / info["k_blocks"] if main_time else float("nan")
        clusters = info["ctas"] // cm
        ideal = n / clusters * per_kb
        print(f"ideal main loops alone (all k-blocks / clusters x median k-block time {per_kb:.3f}): {ideal:.2f} us; "
              f"span - ideal = {span - ideal:.2f} us")
    last = max(by, key=lambda k: by[k][EXIT].get(0, (0,))[0])
    c_show = show_cta if show_cta is not None else last[0]
    print(f"CTA {c_show} (the last to exit unless --cta), its pieces:")
    for r in (0, 1, 2):
        ev = by[(c_show, r)]
        pts = sorted((t, p, w) for p, ws in ev.items() for w, (t, *_x) in ws.items())
        line = " ".join(f"{['', 'entry', 'sync', 'load', 'loaded', 'piece', 'full', 'main', 'handed', 'added', 'epi', 'drain', 'exit'][p]}{w}@{t:.1f}"
                        for t, p, w in pts[-14:])
        print(f"  role {r}: {line}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--cta", type=int)
    a = ap.parse_args()
    for lz in load(a.file):
        summarise(lz, a.cta)


if __name__ == "__main__":
    main()
