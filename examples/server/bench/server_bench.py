#!/usr/bin/env python3
"""ds4-server load generator (standard library only): N concurrent clients, each sending streaming
/v1/chat/completions requests back to back, measuring requests/s and time to first token.

  server_bench.py --url http://127.0.0.1:8000 --clients 1 16 256 [--requests-per-client K] [--max-tokens M]
  server_bench.py --server build/examples/server/ds4-server --model .cache/ds4-tiny.gguf --clients 1 16 256

TTFT is measured by the client: request sent -> first SSE chunk carrying a token (logprobs are
requested so every token makes a chunk, even one that ends inside a UTF-8 character). The
server's own ttft_ms (from its timings) is reported beside it.
"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import threading
import time
import urllib.parse


def one_request(host, port, body, timeout):
    """One streaming chat request: a dict with the client's TTFT and total time (s), the tokens and
    text streamed, and the server's timings and usage (from the last chunks that carry them)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    r = {"first": None, "tokens": 0, "text": "", "timings": {}, "usage": {}}
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        chunk = json.loads(line[6:])
        for choice in chunk.get("choices") or []:
            lp = (choice.get("logprobs") or {}).get("content") or []
            if lp:
                r["tokens"] += len(lp)
                if r["first"] is None:
                    r["first"] = time.monotonic() - t0
            r["text"] += (choice.get("delta") or {}).get("content") or ""
        r["timings"] = chunk.get("timings") or r["timings"]
        r["usage"] = chunk.get("usage") or r["usage"]
    conn.close()
    r["total"] = time.monotonic() - t0
    return r


def start_server(args, echo=print, follow=False):
    """Starts ds4-server with `args` (which pass --port 0); returns (process, URL). Its output goes
    to echo, line by line, until it listens (with follow, for as long as it runs)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = None
    for line in proc.stdout:
        echo(line.rstrip())
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
            break
    if url is None:
        proc.wait(30)
        raise RuntimeError(f"ds4-server exited ({proc.returncode}) before it listened")
    threading.Thread(target=lambda: [echo(line.rstrip()) if follow else None for line in proc.stdout], daemon=True).start()
    return proc, url


def run_level(host, port, clients, per_client, max_tokens, timeout):
    results, errors, lock = [], [], threading.Lock()

    def client(i):
        for k in range(per_client):
            body = json.dumps({"model": "ds4", "messages": [{"role": "user", "content": f"Benchmark request {i}.{k}"}],
                               "max_tokens": max_tokens, "temperature": 0, "reasoning_effort": "none",
                               "stream": True, "logprobs": True}).encode()
            try:
                r = one_request(host, port, body, timeout)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(repr(e))

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    wall = time.monotonic() - t0
    ttft = sorted(r["first"] for r in results if r["first"] is not None)
    server_ttft = sorted(r["timings"]["ttft_ms"] / 1e3 for r in results if "ttft_ms" in r["timings"])
    tokens = sum(r["tokens"] for r in results)

    def pct(v, p):
        return v[min(len(v) - 1, int(p * len(v)))] * 1e3 if v else float("nan")

    return {"clients": clients, "requests": len(results), "errors": len(errors), "wall_s": wall,
            "requests_per_s": len(results) / wall, "tokens_per_s": tokens / wall,
            "ttft_ms_p50": pct(ttft, 0.5), "ttft_ms_p90": pct(ttft, 0.9), "ttft_ms_max": pct(ttft, 1.0),
            "server_ttft_ms_p50": pct(server_ttft, 0.5), "first_error": errors[0] if errors else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url")
    ap.add_argument("--server", help="start this ds4-server binary (port 0) instead of --url")
    ap.add_argument("--model")
    ap.add_argument("--server-args", default="", help="extra flags for --server")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--requests-per-client", type=int, default=0, help="0: 16 for 1 client, 2 for 16, 1 for more")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    proc = None
    if a.server:
        args = [a.server, "--port", "0", "--max-seqs", str(max(a.clients))] + (["--model", a.model] if a.model else []) + a.server_args.split()
        proc, a.url = start_server(args)
    u = urllib.parse.urlparse(a.url)
    try:
        print("| clients | requests | errors | req/s | tok/s | TTFT p50 ms | TTFT p90 ms | TTFT max ms | server TTFT p50 ms |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for c in a.clients:
            per = a.requests_per_client or (16 if c == 1 else 2 if c <= 16 else 1)
            r = run_level(u.hostname, u.port, c, per, a.max_tokens, a.timeout)
            print(f"| {c} | {r['requests']} | {r['errors']} | {r['requests_per_s']:.2f} | {r['tokens_per_s']:.1f} | "
                  f"{r['ttft_ms_p50']:.0f} | {r['ttft_ms_p90']:.0f} | {r['ttft_ms_max']:.0f} | {r['server_ttft_ms_p50']:.0f} |", flush=True)
            if r["first_error"]:
                print("first error:", r["first_error"])
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
