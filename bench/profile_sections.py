"""Where a kernel's warps spend their time, by section of its code.

Reads the per-instruction SASS table that bench/device.sh writes for DS4_PROFILE
(`ncu --import profile.ncu-rep --page source --csv --print-source sass`) and cuts the
instruction stream at every barrier wait, EXIT, setmaxnreg and call, which in the warp-specialised
kernels separates the prologue, each warpgroup's tile loop and each epilogue. For every section
with at least --min percent of the stall samples it prints the section's share, its executed warp
instructions, its two largest stall reasons and its hottest instructions. Figures are samples of
all warps: a section that only 4 of 16 warps run weighs 4x more in wall time than its share says.

usage: python3 bench/profile_sections.py profile_sass.csv [--min 1.0] [--top 3]
"""
import argparse
import csv
import sys

CUTS = ("BAR.SYNC", "EXIT", "SETMAXNREG", "CALL", "RET")
SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(row, index, key):
    try:
        return float(row[index[key]].replace(",", ""))
    except (KeyError, ValueError, IndexError):
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--min", type=float, default=1.0, help="smallest section share shown (percent)")
    ap.add_argument("--top", type=int, default=3, help="hottest instructions shown per section")
    args = ap.parse_args()
    try:
        rows = list(csv.reader(open(args.csv, newline="")))
    except OSError as e:
        sys.exit(f"{args.csv}: {e}")
    header_at = next((i for i, r in enumerate(rows) if "Source" in r and SAMPLES in r), None)
    if header_at is None:
        sys.exit(f"{args.csv}: no SASS table with '{SAMPLES}' (was the profile taken with SourceCounters?)")
    header, data = rows[header_at], rows[header_at + 1:]
    index = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(number(r, index, SAMPLES) for r in data) or 1.0

    sections, start = [], 0
    for i, r in enumerate(data):
        text = r[index["Source"]].strip()
        if any(c in text for c in CUTS) or i == len(data) - 1:
            sections.append((start, i))
            start = i + 1
    print(f"{'rows':>11s} {'share':>6s} {'warp instr':>11s}  top stalls / ends with")
    for a, b in sections:
        part = data[a:b + 1]
        share = 100.0 * sum(number(r, index, SAMPLES) for r in part) / total
        if share < args.min:
            continue
        executed = sum(number(r, index, EXECUTED) for r in part)
        reasons = sorted(((sum(number(r, index, h) for r in part), h) for h in stalls), reverse=True)[:2]
        reasons_text = ", ".join(f"{h[6:]} {100.0 * v / total:.1f}%" for v, h in reasons if v > 0)
        end = part[-1][index["Source"]].strip()[:40]
        print(f"{a:5d}-{b:<5d} {share:5.1f}% {executed:11.0f}  {reasons_text}  | {end}")
        hot = sorted(part, key=lambda r: -number(r, index, SAMPLES))[:args.top]
        for r in hot:
            print(f"{'':20s} {100.0 * number(r, index, SAMPLES) / total:5.1f}%  {r[index['Source']].strip()[:70]}")


if __name__ == "__main__":
    main()
