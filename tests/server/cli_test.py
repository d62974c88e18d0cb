#!/usr/bin/env python3
"""The server's tokens equal ds4-cli's for the same chat turn: greedy, and seeded sampling (the
draw is a function of (seed, position) on the backend, so both front ends must agree exactly).
The comparison is on bytes: ds4-cli prints each token's bytes; the server's logprobs carry them."""
import os
import subprocess

from ds4_server import Server, Suite, args, request

binary, model, cli = args()[:3]
if not os.path.exists(cli):
    print("ds4-cli not found: " + cli)
    raise SystemExit(1)
suite = Suite()
N = 12


def cli_bytes(prompt, *flags):
    r = subprocess.run([cli, "--model", model, "--prompt", prompt, "-n", str(N), "--threads", "2", "--backend", os.environ.get("DS4_SERVER_BACKEND", "cpu"), *flags],
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout.endswith(b"\n"), "ds4-cli ends its reply with a newline"
    return r.stdout[:-1]


def server_bytes(s, prompt, **sampling):
    body = {"model": "ds4", "messages": [{"role": "user", "content": prompt}], "max_tokens": N, "logprobs": True}
    body.update(sampling)
    st, r = request(s, "POST", "/v1/chat/completions", body)
    assert st == 200, r
    return bytes(b for e in r["choices"][0]["logprobs"]["content"] for b in e["bytes"])


def check(s, prompt, cli_flags, sampling):
    want = cli_bytes(prompt, *cli_flags)
    got = server_bytes(s, prompt, **sampling)
    assert got == want, f"server {got!r} != ds4-cli {want!r}"
    assert len(want) > 0


with Server(binary, model, "--threads", "2") as s:
    suite.run("greedy == ds4-cli", check, s, "Write a haiku about memory bandwidth.", ["--temp", "0"], {"temperature": 0})
    suite.run("greedy, thinking off == ds4-cli --no-think", check, s, "Hello", ["--temp", "0", "--no-think"],
              {"temperature": 0, "reasoning_effort": "none"})
    suite.run("seeded sampling == ds4-cli", check, s, "Tell me a story", ["--temp", "0.8", "--top-k", "40", "--seed", "7"],
              {"temperature": 0.8, "top_k": 40, "seed": 7})
suite.exit()
