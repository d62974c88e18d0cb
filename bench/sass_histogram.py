#!/usr/bin/env python3
"""Opcode histogram of the kernels in `cuobjdump --dump-sass` output whose name matches a pattern.

usage: cuobjdump --dump-sass -arch sm_90a BIN | bench/sass_histogram.py PATTERN [--loop]

Per kernel: instruction count and the opcodes (modifiers dropped) by count. With --loop, only the
instructions between the first and the last backward branch target of the kernel's largest loop
body are counted (the innermost hot loop, found as the longest span between a label and a BRA
back to it), which is where a GEMM spends its time.
"""
import re
import sys
from collections import Counter


def kernels(lines):
    name, body = None, []
    for line in lines:
        m = re.search(r"Function : (\S+)", line)
        if m:
            if name:
                yield name, body
            name, body = m.group(1), []
        elif name:
            body.append(line)
    if name:
        yield name, body


def instructions(body):
    out = []
    for line in body:
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", line)
        if m:
            out.append((int(m.group(1), 16), m.group(3).split(".")[0], m.group(3) + m.group(4)))
    return out


def hot_loop(ins):
    best = None
    for addr, op, text in ins:
        if op == "BRA":
            m = re.search(r"0x([0-9a-f]+)", text)
            if m:
                target = int(m.group(1), 16)
                if target < addr and (best is None or addr - target > best[1] - best[0]):
                    best = (target, addr)
    if best is None:
        return ins
    return [i for i in ins if best[0] <= i[0] <= best[1]]


def main():
    pattern = re.compile(sys.argv[1])
    loop = "--loop" in sys.argv
    for name, body in kernels(sys.stdin):
        if not pattern.search(name):
            continue
        ins = instructions(body)
        if loop:
            ins = hot_loop(ins)
        hist = Counter(op for _, op, _ in ins)
        print(f"{name}: {len(ins)} instructions{' (largest loop)' if loop else ''}")
        print("  " + ", ".join(f"{op} {n}" for op, n in hist.most_common(24)))


if __name__ == "__main__":
    main()
