#!/usr/bin/env python3
"""Time to first token of a long conversation turn through ds4-server over HTTP: with the prefix
cache, without it, and restored from disk KV after a restart (standard library only).

  prefix_ttft_bench.py --server build/examples/server/ds4-server --model .cache/ds4-tiny.gguf \\
                       [--tokens 32768] [--ctx 65536] [--work DIR] [--server-args "..."] \\
                       [--backend cpu|cuda] [--cases cache,nocache,disk]

Turn 1 is a user message of about --tokens prompt tokens; turn 2 is the same conversation plus the
assistant's answer and a short new user message. Three servers, one after the other:
  A  prefix cache on, --kv-dir: turn 1 (a full prefill), then turn 2 (the cached conversation);
     SIGTERM (the disk KV writer finishes its queue);
  B  --prefix-cache 0: turn 2 alone (the whole conversation prefilled again);
  C  a restart on what A's --kv-dir held after turn 1: turn 2 (the conversation's longest stored
     prefix restored from disk, the rest prefilled).
--cases leaves B (nocache) or C (disk) out where each server start is costly (a full-shape model
loads in about half a minute on the H200); A always runs, and without C it has no --kv-dir.
TTFT is measured by the client (request sent -> first SSE chunk carrying a token; logprobs make
every token a chunk) and reported beside the server's own ttft_ms and cached_tokens.

The tiny model's context is 4096 tokens; --ctx writes a copy of the model whose
deepseek4.context_length says --ctx (as a "custom" preset: the same shape numbers and weight
bytes; the rope's original context stays 65536, so positions up to it are what the shape was
built for), so a 32K turn fits.
"""
import argparse
import http.client
import json
import os
import shutil
import signal
import struct
import tempfile
import time
import urllib.parse

from server_bench import one_request, start_server

CONTEXT_KEY = "deepseek4.context_length"
PRESET_KEY = "ds4.synth.preset"
# GGUF value types (gguf spec): fixed sizes, 8 = string, 9 = array.
GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
GGUF_U32, GGUF_STRING, GGUF_ARRAY = 4, 8, 9


def gguf_string(s):
    return struct.pack("<Q", len(s)) + s


def with_context(src, dst, ctx):
    """A copy of the GGUF `src` at `dst` with context_length `ctx`. A reduced preset's shape is
    its constants, context included, so the copy's preset is "custom": its keys are its shape
    (the same numbers, checked against the model's structural rules when it is opened)."""
    with open(src, "rb") as f:
        b = f.read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", b, 0)
    if magic != b"GGUF":
        raise SystemExit(f"{src}: not a GGUF file")
    at, out, alignment, seen = 24, bytearray(b[:24]), 32, set()

    def string_at(i):
        n = struct.unpack_from("<Q", b, i)[0]
        return b[i + 8:i + 8 + n], i + 8 + n

    def value_end(kind, i):
        if kind == GGUF_STRING:
            return string_at(i)[1]
        if kind == GGUF_ARRAY:
            item, n = struct.unpack_from("<IQ", b, i)
            i += 12
            if item in GGUF_SIZES:
                return i + n * GGUF_SIZES[item]
            for _ in range(n):
                i = value_end(item, i)
            return i
        return i + GGUF_SIZES[kind]

    for _ in range(n_kv):
        key, i = string_at(at)
        kind = struct.unpack_from("<I", b, i)[0]
        end = value_end(kind, i + 4)
        name = key.decode()
        if name == CONTEXT_KEY and kind == GGUF_U32:
            out += b[at:i + 4] + struct.pack("<I", ctx)
            seen.add(name)
        elif name == PRESET_KEY and kind == GGUF_STRING:
            out += b[at:i + 4] + gguf_string(b"custom")
            seen.add(name)
        else:
            out += b[at:end]
        if name == "general.alignment":
            alignment = struct.unpack_from("<I", b, i + 4)[0]
        at = end
    if seen != {CONTEXT_KEY, PRESET_KEY}:
        raise SystemExit(f"{src}: no {CONTEXT_KEY} (u32) or {PRESET_KEY} (string) key: not a ds4-synth GGUF")
    for _ in range(n_tensors):  # name, dims, type, offset (relative to the data section: unchanged)
        _, i = string_at(at)
        n_dims = struct.unpack_from("<I", b, i)[0]
        end = i + 4 + 8 * n_dims + 4 + 8
        out += b[at:end]
        at = end
    data = -(-at // alignment) * alignment
    out += bytes(-len(out) % alignment)
    with open(dst, "wb") as f:
        f.write(out)
        f.write(memoryview(b)[data:])


class server:
    running = []  # killed if the run stops early

    def __init__(self, binary, model, backend, flags, log):
        args = [binary, "--model", model, "--port", "0", "--backend", backend, *flags]
        self.proc, url = start_server(args, lambda line: log.write(line + "\n"), follow=True)
        self.port = urllib.parse.urlparse(url).port
        server.running.append(self.proc)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(600)


def turn(port, messages, timeout, max_tokens=8):
    """One streaming chat turn: (client TTFT s, answer text, server ttft_ms, cached tokens, prompt tokens)."""
    body = {"model": "ds4", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "reasoning_effort": "none",
            "stream": True, "logprobs": True, "stream_options": {"include_usage": True}}
    r = one_request("127.0.0.1", port, json.dumps(body).encode(), timeout)
    cached = (r["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return r["first"], r["text"], r["timings"].get("ttft_ms"), cached, r["usage"].get("prompt_tokens")


def stats(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/v1/stats")
    return json.loads(conn.getresponse().read())


def filler(n_words, seed):
    # Words from a fixed list in a seeded order: text the tokenizer splits like prose.
    words = ("memory cache line page table walk buffer kernel thread queue batch token prefix state "
             "snapshot disk write read latency bandwidth device host stream graph layer expert").split()
    x, out = seed, []
    for _ in range(n_words):
        x = (x * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        out.append(words[(x >> 33) % len(words)])
    return " ".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32768, help="turn 1's prompt tokens (about)")
    ap.add_argument("--ctx", type=int, default=65536, help="context_length written into the model copy; 0 = use --model as is")
    ap.add_argument("--work", help="directory for the model copy, disk KV and logs (default: a temporary one, removed)")
    ap.add_argument("--server-args", default="", help="extra flags for every server")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--backend", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--cases", default="cache,nocache,disk", help="which of turn 2's cases run (comma list)")
    a = ap.parse_args()
    cases = set(a.cases.split(","))
    if not cases <= {"cache", "nocache", "disk"}:
        raise SystemExit(f"--cases {a.cases}: expected a comma list of cache, nocache, disk")
    work = a.work or tempfile.mkdtemp(prefix="ds4-prefix-ttft-")
    os.makedirs(work, exist_ok=True)
    model = a.model
    if a.ctx:
        model = os.path.join(work, f"model-ctx{a.ctx}.gguf")
        with_context(a.model, model, a.ctx)
    kv, kv1 = os.path.join(work, "kv"), os.path.join(work, "kv-turn1")
    shutil.rmtree(kv, ignore_errors=True)
    shutil.rmtree(kv1, ignore_errors=True)
    extra = a.server_args.split()
    log = open(os.path.join(work, "servers.log"), "w")
    try:
        # A: calibrate words per token on a short text, then the two turns with the cache on.
        s = server(a.server, model, a.backend, (["--kv-dir", kv] if "disk" in cases else []) + extra, log)
        _, _, _, _, probe_tokens = turn(s.port, [{"role": "user", "content": filler(400, 7)}], a.timeout, 1)
        words = int(400 * (a.tokens - 32) / (probe_tokens - 8))
        conv = [{"role": "user", "content": "Summarise these notes. " + filler(words, 1)}]
        t1 = turn(s.port, conv, a.timeout)
        # What disk KV holds after turn 1 (turn 2 would add its own prefix): C restarts on it.
        if "disk" in cases:
            deadline = time.monotonic() + 600
            while stats(s.port)["disk_kv"]["pending"] > 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            shutil.copytree(kv, kv1)
        conv2 = conv + [{"role": "assistant", "content": t1[1]}, {"role": "user", "content": "And in one word?"}]
        t2 = turn(s.port, conv2, a.timeout)
        s.stop()
        t2_nocache = t2_disk = None
        if "nocache" in cases:
            # B: the same turn 2 with no prefix cache (and no disk KV).
            s = server(a.server, model, a.backend, ["--prefix-cache", "0", *extra], log)
            t2_nocache = turn(s.port, conv2, a.timeout)
            s.stop()
        if "disk" in cases:
            # C: a restart on A's disk KV.
            s = server(a.server, model, a.backend, ["--kv-dir", kv1, *extra], log)
            t2_disk = turn(s.port, conv2, a.timeout)
            s.stop()
    finally:
        for p in server.running:
            if p.poll() is None:
                p.kill()
                p.wait(30)
        log.close()
    print(f"turn 1: {t1[4]} prompt tokens; turn 2: {t2[4]} prompt tokens")
    print("| case | prompt tokens | cached tokens | client TTFT s | server ttft_ms |")
    print("|---|---:|---:|---:|---:|")
    for name, r in (("turn 1 (full prefill)", t1), ("turn 2, prefix cache", t2), ("turn 2, no prefix cache", t2_nocache),
                    ("turn 2, restart + disk KV restore", t2_disk)):
        if r is None:
            continue
        print(f"| {name} | {r[4]} | {r[3]} | {r[0]:.3f} | {r[2]:.0f} |")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
