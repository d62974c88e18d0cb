"""Prints the short table of bench/device.sh from Google Benchmark JSON files."""
import json
import sys

rows = []
for path in sys.argv[1:]:
    try:
        data = json.load(open(path))
    except (OSError, ValueError) as e:
        print(f"{path}: unreadable ({e})")
        continue
    for b in data.get("benchmarks", []):
        rows.append((b["name"], b.get("us", 0), b.get("GB/s", 0), b.get("pct_ceil", 0), b.get("ceil_GB/s", 0),
                     b.get("TFLOP/s", 0), b.get("TOP/s", 0), b.get("pct_peak", 0)))
# int8 GEMM rows (gemm_bench, moe_gemm_bench) add TOP/s and the share of the measured int8 mma peak.
print(f"{'benchmark':48s} {'us':>9s} {'GB/s':>8s} {'%ceil':>6s} {'ceil':>7s} {'TOP/s':>7s} {'%peak':>6s}")
for name, us, gbs, pct, ceil, tf, tops, peak in rows:
    print(f"{name:48s} {us:9.2f} {gbs:8.0f} {pct:6.1f} {ceil:7.0f} {tops:7.1f} {peak:6.1f}")
