#!/usr/bin/env python3
"""Disk KV (--kv-dir): a restarted server restores a conversation's prefix from disk instead of
prefilling it and answers with the same tokens; corrupt, truncated, foreign-model, other-version
and half-written files are ignored with a log line; a small --kv-disk-budget evicts."""
import errno
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time

from ds4_server import Server, Suite, args, request, stream, wait_until

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


def question(q):
    return dict(BODY1, messages=[{"role": "system", "content": SYS}, {"role": "user", "content": q}])


def wait_written(s, what, pred):
    """/v1/stats' disk_kv once the writer thread is idle and pred holds."""
    def done():
        sd = stats(s)["disk_kv"]
        return sd["pending"] == 0 and pred(sd)
    wait_until(done, 20, what)
    return stats(s)["disk_kv"]


def contents(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in kv_files(d)}


def check_full_disk(s, view, body, before, n_failed):
    """The server on a full --kv-dir (seen at `view`): the new prefix's saves fail with ENOSPC,
    counted and logged; the request is served; the files there before are untouched and still
    restore."""
    st, r = request(s, "POST", "/v1/chat/completions", body)
    assert st == 200, r
    sd = wait_written(s, "the failed saves", lambda sd: sd["save_errors"] >= n_failed)
    assert sd["saves"] == 0 and sd["save_errors"] == n_failed and sd["last_error"] == os.strerror(errno.ENOSPC), sd
    assert "No space left on device (the prefix stays in memory only)" in "".join(s.lines)
    assert "\nds4_disk_kv_save_errors_total %d\n" % n_failed in request(s, "GET", "/metrics")[1]
    assert contents(view) == before, "the previous files are intact"
    assert not [f for f in os.listdir(view) if f.endswith(".tmp")], os.listdir(view)
    # Still serving, and the earlier prefix is still trusted and restored.
    st, r1 = request(s, "POST", "/v1/chat/completions", BODY1)
    assert st == 200 and cached(r1) == r1["usage"]["prompt_tokens"] - 1 and token_bytes(r1) == token_bytes(found["r1"]), r1["usage"]
    assert stats(s)["disk_kv"]["hits"] == 1 and request(s, "GET", "/health")[0] == 200
    return r


def check_enospc_dev_full():
    # A genuine ENOSPC from the kernel on any Linux, no root: the save's temporary name is a
    # symlink to /dev/full, so the writer's own open/write/fsync path gets the error.
    body = question("Why is a full disk only a lost save?")
    names = os.path.join(work, "names")
    with Server(binary, model, "--kv-dir", names) as s:
        st, ref = request(s, "POST", "/v1/chat/completions", body)
        settled(s, names)
    new = kv_files(names)
    assert st == 200 and len(new) >= 1, new
    d = os.path.join(work, "devfull")
    shutil.copytree(found["dir"], d)
    before = contents(d)
    assert not set(new) & set(before), (new, list(before))
    for f in new:
        os.symlink("/dev/full", os.path.join(d, f + ".tmp"))
    with Server(binary, model, "--kv-dir", d) as s:
        r = check_full_disk(s, d, body, before, len(new))
        assert token_bytes(r) == token_bytes(ref)


def check_enospc_full_tmpfs():
    # A file system that is really full: a tmpfs mounted in a user namespace (no root needed where
    # unprivileged user namespaces are allowed), holding the earlier files and a filler.
    try:
        userns = subprocess.run(["unshare", "-rm", "true"], timeout=10, capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        userns = False
    if not userns:
        print("     skipped: no unprivileged user namespaces here (unshare -rm); the /dev/full case covers ENOSPC")
        return
    prev = found["dir"]
    before = contents(prev)
    d = os.path.join(work, "tmpfs")
    os.makedirs(d)
    size = (sum(len(b) for b in before.values()) // 4096 + 16) * 4096
    inner = os.path.join(work, "full_tmpfs.sh")
    with open(inner, "w") as f:
        f.write(f'set -e\nmount -t tmpfs -o size={size} ds4kv "{d}"\ncp "{prev}"/*.kv "{d}"/\n'
                f'dd if=/dev/zero of="{d}/filler" bs=4096 2>/dev/null || true\nexec "{os.path.abspath(binary)}" "$@"\n')
    wrapper = os.path.join(work, "full_tmpfs_wrapper.sh")
    with open(wrapper, "w") as f:
        f.write(f'#!/bin/sh\nexec unshare -rm /bin/sh "{inner}" "$@"\n')
    os.chmod(wrapper, 0o755)
    with Server(wrapper, model, "--kv-dir", d) as s:
        view = f"/proc/{s.proc.pid}/root{d}"  # the mount lives in the server's namespace
        assert contents(view) == before
        check_full_disk(s, view, question("What happens when the disk is full?"), before, 2)


def check_slow_disk_never_delays_a_step():
    # Every write waits 20 s in the writer: a request still answers at once (the step never
    # waits for the disk), a queue of one drops the saves that find it full, and SIGTERM with a
    # 0.5 s drain limit abandons the rest and leaves no file, whole or partial.
    d = os.path.join(work, "slow")
    with Server(binary, model, "--kv-dir", d, "--debug-disk-write-delay-ms", "20000", "--kv-disk-queue", "1",
                "--kv-disk-drain-s", "0.5") as s:
        t0 = time.monotonic()
        st, r = request(s, "POST", "/v1/chat/completions", BODY1)
        took = time.monotonic() - t0
        assert st == 200 and token_bytes(r) == token_bytes(found["r1"]) and took < 10, (st, took)
        for q in ("What is a TLB?", "What is a page walk?"):
            assert request(s, "POST", "/v1/chat/completions", question(q))[0] == 200
        sd = stats(s)["disk_kv"]
        assert sd["dropped"] >= 2 and 1 <= sd["pending"] <= 2 and sd["saves"] == 0, sd
        assert "write queue full" in "".join(s.lines)
        assert request(s, "GET", "/health")[0] == 200
        t0 = time.monotonic()
        assert s.terminate(timeout=20) == 0
        assert time.monotonic() - t0 < 4, "the drain limit bounds shutdown"
        assert "abandoned" in "".join(s.lines)
    assert os.listdir(d) == [], os.listdir(d)


def check_first_token_before_the_snapshot():
    # Each disk KV snapshot takes 4 s longer (a slow device-to-host copy): caching the prompt
    # takes one right after the prompt's last row, and the first token must already be on its way
    # (streamed before it), while the answer's end waits for it. Bounds far apart: the tiny
    # model's prompt takes milliseconds.
    d = os.path.join(work, "slow-snapshot")
    with Server(binary, model, "--kv-dir", d, "--debug-snapshot-delay-ms", "4000") as s:
        body = dict(question("What is a write-back cache?"), stream=True, max_tokens=3)
        first = []
        t0 = time.monotonic()

        def on_event(i, name, data):
            if not first and isinstance(data, dict) and any(c.get("delta", {}).get("content") or c.get("logprobs")
                                                            for c in data.get("choices", [])):
                first.append(time.monotonic() - t0)

        st, events, _ = stream(s, "/v1/chat/completions", body, timeout=60, on_event=on_event)
        took = time.monotonic() - t0
        assert st == 200 and first, (st, events[:3])
        assert first[0] < 2.0 and took >= 4.0, (first, took)
        assert settled(s, d)["disk_kv"]["saves"] >= 1


def check_sigterm_drains_the_queue():
    d = os.path.join(work, "drain")
    # Each write waits 1 s: SIGTERM right after the answer finds the turn's save still queued.
    with Server(binary, model, "--kv-dir", d, "--debug-disk-write-delay-ms", "1000") as s:
        st, r = request(s, "POST", "/v1/chat/completions", BODY1)
        assert st == 200
        assert s.terminate(timeout=30) == 0
        assert "finishing" in "".join(s.lines) and "abandoned" not in "".join(s.lines)
    assert len(kv_files(d)) == 2 and not [f for f in os.listdir(d) if f.endswith(".tmp")], os.listdir(d)
    with Server(binary, model, "--kv-dir", d) as s:
        sd = stats(s)["disk_kv"]
        assert sd["files"] == 2 and sd["rejected_files"] == 0, sd
        st, r1 = request(s, "POST", "/v1/chat/completions", BODY1)
        assert cached(r1) == r1["usage"]["prompt_tokens"] - 1 and token_bytes(r1) == token_bytes(found["r1"])


try:
    suite.run("restart restores the prefix from disk, same tokens", check_restart_restores)
    if found:
        suite.run("corrupt, truncated, foreign, other-version, half-written files ignored", check_bad_files_ignored)
        suite.run("kill -9 during disk KV writes: the previous state intact", check_kill_9_mid_write)
        suite.run("a small disk budget evicts least recently used", check_budget_evicts)
        suite.run("a failed write (file too large) costs only the save", check_write_error_costs_only_the_save)
        suite.run("ENOSPC (/dev/full) costs only the save, earlier files intact", check_enospc_dev_full)
        suite.run("ENOSPC (a full tmpfs) costs only the save, earlier files intact", check_enospc_full_tmpfs)
        suite.run("a slow disk never delays a step; a full queue drops; SIGTERM abandons cleanly", check_slow_disk_never_delays_a_step)
        suite.run("SIGTERM finishes the queued saves, all valid after a restart", check_sigterm_drains_the_queue)
        suite.run("the first token is streamed before the prompt's disk KV snapshot", check_first_token_before_the_snapshot)
finally:
    shutil.rmtree(work, ignore_errors=True)
suite.exit()
