"""h88: the SM clock, power and throttle reasons while each probe variant
ran. Reads nvidia-smi's samples (timestamp, clocks.sm, power.draw,
temperature, clocks_throttle_reasons.active; csv, noheader, nounits) and the
probe's output lines, which end in "wall <start> <end>" (epoch seconds).

    python3 scripts/experiments/clock-summary.py clocks.csv probe.txt
"""

import statistics
import sys
from datetime import datetime


def main():
    samples = []
    for line in open(sys.argv[1]):
        f = [p.strip() for p in line.split(",")]
        if len(f) < 5:
            continue
        try:
            t = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(f[1]), float(f[2]), float(f[3]), f[4]))
        except ValueError:
            continue
    print("variant     samples  SM MHz (median, min)  power W (median, max)  throttle reasons seen")
    for line in open(sys.argv[2]):
        if " wall " not in line:
            continue
        name = line.split()[0]
        t0, t1 = (float(v) for v in line.rsplit("wall", 1)[1].split())
        inside = [s for s in samples if t0 <= s[0] <= t1]
        if not inside:
            print(f"{name:10s}  none")
            continue
        mhz = [s[1] for s in inside]
        watts = [s[2] for s in inside]
        reasons = sorted({s[4] for s in inside})
        print(f"{name:10s}  {len(inside):7d}  {statistics.median(mhz):6.0f} {min(mhz):6.0f}        "
              f"{statistics.median(watts):6.0f} {max(watts):6.0f}         {' '.join(reasons)}")


if __name__ == "__main__":
    main()
