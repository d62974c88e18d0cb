#!/usr/bin/env python3
"""Summarises a kernel timeline written by libds4_timeline.so (bench/cupti_timeline.cpp).

Usage: timeline_summary.py timeline.csv

Takes the graph replayed most often (the decode step of a ds4-bench run), drops its first replay,
and prints per replay (medians over replays and layers): the step's span, and for each sublayer
the waits that decide its length: in the ffn, how long the MoE finish waited past the routed
experts for the side stream's shared expert and how late the shared SwiGLU started after the
shared gate+up; in the attention sublayer, which of the two streams reached the join last and
the gap from the join to the first indexer kernel. Node ids follow capture order, so a sublayer
is the run of nodes from one hc_pre to the next.
"""
import collections
import csv
import re
import statistics
import subprocess
import sys


def short_names(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    result = {}
    for n, d in zip(names, out):
        d = re.sub(r"\(.*", "", d)
        d = re.sub(r"<.*", "", d)
        result[n] = d.split("::")[-1]
    return result


def wall_shares(kernels):
    """Splits a step's wall time among its kernels: an instant when k kernels run counts 1/k to
    each, an idle instant counts to "idle before <the kernel that starts next>". The shares sum to
    the step's span, so they say where the step's length goes, where per-kernel durations (which
    overlap across streams and, under PDL, include the wait for the previous kernel) cannot."""
    points = sorted([(s, 1, n) for s, _, n in kernels] + [(e, -1, n) for _, e, n in kernels])
    share, live, prev = collections.Counter(), collections.Counter(), points[0][0]
    idle_since = None
    for t, kind, n in points:
        count = sum(live.values())
        if count:
            for name, c in live.items():
                share[name] += (t - prev) * c / count
        elif idle_since is not None and kind == 1 and t > idle_since:
            share["idle before " + n] += t - idle_since
        live[n] += kind
        if live[n] == 0:
            del live[n]
        idle_since = t if not live else None
        prev = t
    return share


def main(path):
    rows = list(csv.DictReader(open(path)))
    by_graph_launch = collections.defaultdict(list)
    for r in rows:
        if r["graph"] != "0":
            by_graph_launch[(r["graph"], r["corr"])].append(r)
    if not by_graph_launch:
        sys.exit(f"{path}: no graph-launched kernels")
    launches = collections.Counter(g for g, _ in by_graph_launch)
    kernels = collections.Counter(r["graph"] for r in rows if r["graph"] != "0")
    graph = max(launches, key=lambda g: (launches[g], kernels[g]))
    names = short_names(sorted({r["name"] for r in rows}))
    steps = [v for (g, _), v in by_graph_launch.items() if g == graph][1:]
    if not steps:
        sys.exit(f"{path}: graph {graph} was replayed once only")
    m = collections.defaultdict(list)
    per_kernel = collections.defaultdict(list)
    wall = collections.Counter()
    for v in steps:
        for name, us in wall_shares([(int(r["start"]) / 1e3, int(r["end"]) / 1e3, names[r["name"]]) for r in v]).items():
            wall[name] += us
        k = sorted(((int(r["node"]) & 0xFFFFFFFF, names[r["name"]], int(r["start"]) / 1e3, int(r["end"]) / 1e3,
                    int(r["gx"])) for r in v))
        m["step span (us)"].append(max(x[3] for x in k) - min(x[2] for x in k))
        for x in k:
            per_kernel[x[1]].append(x[3] - x[2])
        starts = [i for i, x in enumerate(k) if x[1] == "hc_pre_kernel"]
        for j, i0 in enumerate(starts):
            seg = k[i0:starts[j + 1] if j + 1 < len(starts) else len(k)]
            nm = [x[1] for x in seg]
            hc_end = seg[0][3]
            q8 = [x for x in seg if x[1] == "matvec_q8_0_kernel"]
            if "moe_experts_kernel" in nm and "moe_finish_kernel" in nm:
                experts = seg[nm.index("moe_experts_kernel")]
                finish = seg[nm.index("moe_finish_kernel")]
                shared_end = max(x[3] for x in q8)
                m["ffn: hc_pre end -> finish end"].append(finish[3] - hc_end)
                router = "moe_router_kernel" if "moe_router_kernel" in nm else "moe_router_cluster_kernel"
                m["ffn: hc_pre end -> router end"].append(seg[nm.index(router)][3] - hc_end)
                m["ffn: router end -> experts start"].append(experts[2] - seg[nm.index(router)][3])
                m["ffn: hc_pre end -> experts end"].append(experts[3] - hc_end)
                m["ffn: shared expert end past experts end"].append(max(0.0, shared_end - experts[3]))
                if "moe_shared_act_kernel" in nm:
                    m["ffn: shared SwiGLU start past shared gate+up end"].append(
                        seg[nm.index("moe_shared_act_kernel")][2] - q8[0][3])
            elif "attention_merge_kernel" in nm or "attention_merge_few_kernel" in nm:
                merge = "attention_merge_kernel" if "attention_merge_kernel" in nm else "attention_merge_few_kernel"
                a = nm.index("attention_decode_wgmma_kernel") if "attention_decode_wgmma_kernel" in nm else nm.index(merge)
                before = seg[:a]
                side = [x for x in before if x[1] in ("kv_store_kernel", "compressor_decode_kernel")]
                kind = ("ratio 4" if "indexer_prepare_kernel" in nm else
                        "compressed" if "compressor_decode_kernel" in nm else "raw")
                # The F16 matvec in either form (the persistent one is the default since the
                # thirty-sixth session; DS4_F16_FORM=1 runs the one-group-per-CTA kernel).
                f16 = [x for x in before if x[1] in ("matvec_f16_kernel", "matvec_f16_stream_kernel")]
                main_end = f16[-1][3] if kind == "ratio 4" else seg[nm.index("norm_rope_vec_kernel")][3]
                side_end = max(x[3] for x in side)
                m[f"attn {kind}: hc_pre end -> out_b end"].append(q8[-1][3] - hc_end)
                m[f"attn {kind}: side end past main end at the join"].append(side_end - main_end)
                if kind == "ratio 4":
                    m[f"attn {kind}: join -> indexer_prepare start"].append(
                        seg[nm.index("indexer_prepare_kernel")][2] - max(side_end, main_end))
    print(f"{path}: graph {graph}, {len(steps)} replays after the first, {len(steps[0])} kernels each")
    print(f"{'measure':58s} {'n':>5s} {'median us':>10s} {'per step us':>12s}")
    for key, vals in m.items():
        print(f"{key:58s} {len(vals):5d} {statistics.median(vals):10.2f} {sum(vals) / len(steps):12.1f}")
    print(f"\n{'kernel':40s} {'per step':>8s} {'median us':>10s} (start to end: with PDL it includes the wait)")
    for name, vals in sorted(per_kernel.items(), key=lambda kv: -sum(kv[1])):
        print(f"{name:40s} {len(vals) / len(steps):8.0f} {statistics.median(vals):10.2f}")
    print(f"\n{'share of the step':40s} {'us a step':>10s} {'%':>6s} (concurrent kernels split an instant; idle "
          f"time goes to the kernel that starts next)")
    span = sum(wall.values())
    for name, us in wall.most_common():
        print(f"{name:40s} {us / len(steps):10.1f} {100 * us / span:6.1f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
