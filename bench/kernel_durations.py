"""Per-kernel durations of one decode step from an ncu raw CSV (bench/device.sh DS4_KERNELS=1).

ncu runs each kernel alone (serialized, no PDL overlap), so a launch's duration includes its own
launch, ramp and drain: the sum over a step is larger than the graph step, and the difference is
what overlap already hides. The step is the run of launches that ends at a sampling launch and
holds one hc pre launch per sublayer at one row (the warm-up step when the count stops early).
Rows: one per kernel, grid and matrix size: launches, summed, median and max us, MB read from DRAM
a launch, TB/s at the median.
usage: python3 bench/kernel_durations.py ncu.csv
"""
import collections
import csv
import re
import statistics
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    lines = [l for l in open(sys.argv[1], errors="replace") if l.startswith('"')]
    if len(lines) < 3:
        sys.exit(f"{sys.argv[1]}: no ncu rows (was the filter or the launch count too narrow?)")
    rows = list(csv.reader(lines))
    head = {h: i for i, h in enumerate(rows[0])}
    for need in ("Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "launch__grid_size"):
        if need not in head:
            sys.exit(f"{sys.argv[1]}: no column {need}")
    launches = []
    for r in rows[2:]:  # rows[1]: units (ns, byte)
        name = re.sub(r"\(.*", "", r[head["Kernel Name"]]).replace("void ", "").replace("ds4::kernels::", "")
        name = name.replace("detail::", "")
        launches.append((name, number(r[head["gpu__time_duration.sum"]]), number(r[head["dram__bytes_read.sum"]]),
                         r[head["launch__grid_size"]]))
    ends = [i for i, l in enumerate(launches) if l[0].startswith("sampling_kernel")]
    steps, start = [], 0
    for e in ends:
        steps.append((start, e + 1))
        start = e + 1
    steps = [s for s in steps if any(l[0].startswith("hc_pre_kernel<1,") for l in launches[s[0]:s[1]])]
    if not steps:
        sys.exit("no decode step (a run of launches ending at sampling_kernel with one-row hc pre launches)")
    a, b = steps[-1]
    step = launches[a:b]
    print(f"decode step: launches {a}..{b - 1} of {len(launches)}, {len(step)} launches, "
          f"{sum(l[1] for l in step) / 1e3:.1f} us summed in isolation")
    # One row per kernel, grid and matrix size (two matrices may share a grid: out_a and the shared
    # expert's gate+up both take 512 CTAs).
    groups = collections.defaultdict(list)
    for name, ns, by, grid in step:
        groups[(name, grid, round(by / 1e6))].append((ns, by))
    table = []
    for (name, grid, _), v in groups.items():
        ns = [x[0] for x in v]
        med = statistics.median(ns)
        mb = statistics.mean(x[1] for x in v) / 1e6
        table.append((sum(ns), name, grid, len(v), med, max(ns), mb))
    print(f"{'kernel':46s} {'grid':>7s} {'n':>4s} {'sum us':>8s} {'med us':>7s} {'max us':>7s} {'MB':>7s} {'TB/s':>5s}")
    for total, name, grid, n, med, mx, mb in sorted(table, reverse=True):
        tbs = mb * 1e6 / med / 1e3 if med > 0 else 0.0
        print(f"{name[:46]:46s} {grid:>7s} {n:4d} {total / 1e3:8.1f} {med / 1e3:7.2f} {mx / 1e3:7.2f} {mb:7.1f} {tbs:5.2f}")


if __name__ == "__main__":
    main()
