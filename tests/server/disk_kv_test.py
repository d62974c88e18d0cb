#!/usr/bin/env python3
"""Disk KV (--kv-dir): a restarted server restores a conversation's prefix from disk instead of
prefilling it and answers with the same tokens; corrupt, truncated, foreign-model, other-version
and half-written files are ignored with a log line; a small --kv-disk-budget evicts."""
import errno
import os
import shutil
import struct
import tempfile
import threading
import time

from ds4_server import Server, Suite, args, request, wait_until

binary, model = args()[:2]
suite = Suite()
work = tempfile.mkdtemp(prefix="ds4-disk-kv-")

SYS = "You are a careful assistant who answers about memory hierarchies and caches."
TURN1 = [{"role": "system", "content": SYS}, {"role": "user", "content": "What is a cache line?"}]
BODY1 = {"model": "ds4", "messages": TURN1, "max_tokens": 4, "temperature": 0, "reasoning_effort": "none", "logprobs": True}
HEADER = 40  # magic, version, reserved, model identity, token count, snapshot bytes (disk_kv.hpp)
found = {}


def fnv1a(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def token_bytes(r):
    return [bytes(e["bytes"]) for e in r["choices"][0]["logprobs"]["content"]]


def cached(r):
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


def kv_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".kv"))


def stats(s):
    return request(s, "GET", "/v1/stats")[1]


def settled(s, d):
    """/v1/stats once the writer thread is idle and it counts what is on disk: a save is written
    after the answer is sent."""
    def same():
        sd = stats(s)["disk_kv"]
        return sd["pending"] == 0 and sd["bytes"] == sum(os.path.getsize(os.path.join(d, f)) for f in kv_files(d))
    wait_until(same, 10, "disk KV stats to match the directory")
    return stats(s)


def check_restart_restores():
    d = os.path.join(work, "kv")
    with Server(binary, model, "--kv-dir", d) as a:
        st, r1 = request(a, "POST", "/v1/chat/completions", BODY1)
        assert st == 200 and cached(r1) == 0, r1["usage"]
        turn2 = TURN1 + [{"role": "assistant", "content": r1["choices"][0]["message"]["content"]}, {"role": "user", "content": "And a page?"}]
        body2 = dict(BODY1, messages=turn2)
        st, r2 = request(a, "POST", "/v1/chat/completions", body2)
        sa = settled(a, d)
        assert sa["disk_kv"]["saves"] >= 2 and sa["disk_kv"]["files"] == len(kv_files(d)), sa["disk_kv"]
        assert a.terminate() == 0
    assert len(kv_files(d)) >= 2 and not [f for f in os.listdir(d) if f.endswith(".tmp")]
    # A new process: turn 2 first, then turn 1 again, both from disk.
    with Server(binary, model, "--kv-dir", d) as b:
        st, b2 = request(b, "POST", "/v1/chat/completions", body2)
        assert cached(b2) >= r1["usage"]["prompt_tokens"], b2["usage"]
        assert token_bytes(b2) == token_bytes(r2), "restored from disk == prefilled"
        sb = stats(b)
        assert sb["disk_kv"]["hits"] == 1 and sb["disk_kv"]["restored_tokens"] == cached(b2), sb["disk_kv"]
        # Only the tokens not restored were prefilled.
        assert sb["steps"]["prefill_tokens"] == b2["usage"]["prompt_tokens"] - cached(b2), (sb["steps"], b2["usage"])
        st, b1 = request(b, "POST", "/v1/chat/completions", BODY1)
        assert cached(b1) == r1["usage"]["prompt_tokens"] - 1, b1["usage"]
        assert token_bytes(b1) == token_bytes(r1)
        sb = stats(b)
        assert sb["disk_kv"]["hits"] == 2 and sb["disk_kv"]["rejected_files"] == 0, sb["disk_kv"]
        assert 0 < sb["prefix_cache"]["hit_rate"] <= 1
        st, m = request(b, "GET", "/metrics")
        assert "\nds4_disk_kv_hits_total 2\n" in m and "\nds4_prefix_cache_hit_rate " in m, m
    found.update(dir=d, r1=r1)
    print(f"     restart: turn 2 restored {cached(b2)} of {b2['usage']['prompt_tokens']} prompt tokens from disk")


def rewrite(path, mutate):
    b = bytearray(open(path, "rb").read())
    mutate(b)
    b[-8:] = struct.pack("<Q", fnv1a(b[:-8]))
    open(path, "wb").write(b)


def check_bad_files_ignored():
    src = found["dir"]
    d = os.path.join(work, "bad")
    shutil.copytree(src, d)
    files = kv_files(d)
    assert len(files) >= 2, files
    # Every real file spoiled one way, plus copies spoiled the other ways: none may be used.
    paths = [os.path.join(d, f) for f in files]
    for i, p in enumerate(paths):
        b = bytearray(open(p, "rb").read())
        b[HEADER + (len(b) - HEADER) // 2] ^= 0x40  # one flipped bit in the body
        open(p, "wb").write(b)
    good = open(os.path.join(src, files[0]), "rb").read()
    open(os.path.join(d, "truncated.kv"), "wb").write(good[: len(good) // 2])
    open(os.path.join(d, "foreign.kv"), "wb").write(good)
    rewrite(os.path.join(d, "foreign.kv"), lambda b: b.__setitem__(slice(16, 24), struct.pack("<Q", 0x1234)))
    open(os.path.join(d, "version.kv"), "wb").write(good)
    rewrite(os.path.join(d, "version.kv"), lambda b: b.__setitem__(slice(8, 12), struct.pack("<I", 2)))
    open(os.path.join(d, "renamed.kv"), "wb").write(good)  # valid content under a name that is not its hash
    open(os.path.join(d, "0123456789abcdef.kv.tmp"), "wb").write(good[:100])  # a write killed midway
    with Server(binary, model, "--kv-dir", d) as s:
        st, r = request(s, "POST", "/v1/chat/completions", BODY1)
        assert st == 200 and cached(r) == 0, r["usage"]
        assert token_bytes(r) == token_bytes(found["r1"])
        sd = stats(s)["disk_kv"]
        assert sd["rejected_files"] == len(files) + 4 and sd["hits"] == 0, sd
        log = "".join(s.lines)
        for why in ("checksum mismatch", "truncated", "another model", "format version 2", "name does not match",
                    "removing unfinished write"):
            assert why in log, f"no log line for '{why}':\n{log}"
    assert not os.path.exists(os.path.join(d, "0123456789abcdef.kv.tmp"))


def check_budget_evicts():
    sizes = [os.path.getsize(os.path.join(found["dir"], f)) for f in kv_files(found["dir"])]
    budget = max(sizes) + min(sizes) // 2  # room for one file, not two
    d = os.path.join(work, "budget")
    with Server(binary, model, "--kv-dir", d, "--kv-disk-budget", str(budget)) as s:
        for q in ("What is a cache line?", "What is a TLB?", "What is a page walk?"):
            body = dict(BODY1, messages=[{"role": "system", "content": SYS}, {"role": "user", "content": q}])
            assert request(s, "POST", "/v1/chat/completions", body)[0] == 200
        sd = settled(s, d)["disk_kv"]
        on_disk = sum(os.path.getsize(os.path.join(d, f)) for f in kv_files(d))
        assert sd["evictions"] >= 1 and sd["bytes"] == on_disk <= budget and sd["files"] == len(kv_files(d)) >= 1, (sd, on_disk, budget)
    d2 = os.path.join(work, "tiny")
    with Server(binary, model, "--kv-dir", d2, "--kv-disk-budget", str(min(sizes) // 2)) as s:
        assert request(s, "POST", "/v1/chat/completions", BODY1)[0] == 200, "a save that cannot fit costs only the save"
        sd = stats(s)["disk_kv"]
        assert sd["saves"] == 0 and sd["save_errors"] >= 1 and kv_files(d2) == [], sd
        assert "over the whole budget" in "".join(s.lines)


def check_write_error_costs_only_the_save():
    # A write that fails midway (here EFBIG under a file-size limit, the path ENOSPC takes too):
    # logged, no .tmp left behind, no file indexed, the request served.
    wrapper = os.path.join(work, "limited.sh")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nulimit -f 8\nexec "{os.path.abspath(binary)}" "$@"\n')  # 8 blocks of 512 bytes
    os.chmod(wrapper, 0o755)
    d = os.path.join(work, "full")
    with Server(wrapper, model, "--kv-dir", d) as s:
        st, r = request(s, "POST", "/v1/chat/completions", BODY1)
        assert st == 200 and token_bytes(r) == token_bytes(found["r1"])
        sd = settled(s, d)["disk_kv"]
        assert sd["saves"] == 0 and sd["save_errors"] >= 1 and sd["files"] == 0, sd
        assert sd["last_error"] == os.strerror(errno.EFBIG), sd
        assert os.listdir(d) == [], os.listdir(d)
        assert "the prefix stays in memory only" in "".join(s.lines)
        assert request(s, "GET", "/health")[0] == 200


def check_kill_9_mid_write():
    # kill -9 at moments spread over a turn's saves: whatever was renamed into place is whole
    # (no file rejected at the next start), a cut write leaves only a .tmp that the start removes.
    d = os.path.join(work, "killed")
    shutil.copytree(found["dir"], d)
    before = set(kv_files(d))
    for delay in (0.05, 0.2, 0.4):
        s = Server(binary, model, "--kv-dir", d)
        body = dict(BODY1, messages=[{"role": "system", "content": SYS}, {"role": "user", "content": f"Question {delay}?"}])
        def send():
            try:
                request(s, "POST", "/v1/chat/completions", body, timeout=10)
            except OSError:  # the server is killed under it
                pass

        t = threading.Thread(target=send, daemon=True)
        try:
            t.start()
            time.sleep(delay)
        finally:
            s.kill()  # SIGKILL
        t.join(10)
    with Server(binary, model, "--kv-dir", d) as s:
        sd = stats(s)["disk_kv"]
        assert sd["rejected_files"] == 0 and sd["files"] == len(kv_files(d)), sd
        assert before <= set(kv_files(d)), "the earlier state is intact"
        assert not [f for f in os.listdir(d) if f.endswith(".tmp")]
        st, r = request(s, "POST", "/v1/chat/completions", BODY1)
        assert cached(r) == r["usage"]["prompt_tokens"] - 1 and token_bytes(r) == token_bytes(found["r1"]), r["usage"]


try:
    suite.run("restart restores the prefix from disk, same tokens", check_restart_restores)
    if found:
        suite.run("corrupt, truncated, foreign, other-version, half-written files ignored", check_bad_files_ignored)
        suite.run("kill -9 during disk KV writes: the previous state intact", check_kill_9_mid_write)
        suite.run("a small disk budget evicts least recently used", check_budget_evicts)
        suite.run("a failed write (file too large / disk full) costs only the save", check_write_error_costs_only_the_save)
finally:
    shutil.rmtree(work, ignore_errors=True)
suite.exit()
