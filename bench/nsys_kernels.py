#!/usr/bin/env python3
"""The kernels of an `nsys stats --report cuda_gpu_kern_sum --format csv` file as a short table:
total ms, launches, median us per launch, name (template arguments kept, parameters dropped),
largest total first."""
import csv
import io
import sys


def rows(text):
    lines = text.splitlines()
    # nsys prints progress lines before the CSV header.
    start = next((i for i, l in enumerate(lines) if "Total Time" in l and "Name" in l), None)
    if start is None:
        raise SystemExit("nsys_kernels: no kernel table in the input")
    return list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))


def short(name, width=90):
    depth, out = 0, []
    for ch in name:  # drop the parameter list, keep template arguments
        if ch == "(" and depth == 0:
            break
        depth += ch == "<"
        depth -= ch == ">"
        out.append(ch)
    s = "".join(out).replace("ds4::kernels::", "").replace("detail::", "")
    return s if len(s) <= width else s[: width - 3] + "..."


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: nsys_kernels.py KERN_SUM.csv")
    with open(sys.argv[1]) as f:
        table = rows(f.read())
    table.sort(key=lambda r: -float(r["Total Time (ns)"]))
    total = sum(float(r["Total Time (ns)"]) for r in table)
    print(f"{'total ms':>10} {'share':>6} {'launches':>9} {'med us':>9}  kernel")
    for r in table[:40]:
        t = float(r["Total Time (ns)"])
        print(f"{t / 1e6:10.2f} {100 * t / total:5.1f}% {int(r['Instances']):9d} {float(r['Med (ns)']) / 1e3:9.2f}  {short(r['Name'])}")
    print(f"{total / 1e6:10.2f} all kernels, {sum(int(r['Instances']) for r in table)} launches")


if __name__ == "__main__":
    main()
