"""A real ds4-server process on 127.0.0.1 (port 0) and a small HTTP client, standard library only.

Every wait is bounded: a server that does not print its URL within START_S, a response that does
not finish within the per-request timeout, fails the test instead of hanging it.
"""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

START_S = 30
live_servers = []  # for the log tails a failure prints


class Server:
    def __init__(self, binary, model, *flags, api_key=None):
        # The CPU backend unless DS4_SERVER_BACKEND says otherwise: these are cpu-labelled tests,
        # the same on any machine; DS4_SERVER_BACKEND=cuda runs the suite on a GPU.
        args = [binary, "--model", model, "--port", "0", "--backend", os.environ.get("DS4_SERVER_BACKEND", "cpu"), *flags]
        if api_key:
            args += ["--api-key", api_key]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.port = None
        found = threading.Event()

        def pump():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    found.set()
            found.set()

        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(START_S) or self.port is None:
            self.kill()
            raise RuntimeError("ds4-server did not start:\n" + "".join(self.lines))
        live_servers.append(self)

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def terminate(self, timeout=30):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self):
        if self in live_servers:
            live_servers.remove(self)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()


def request(server_or_conn, method, path, body=None, headers=None, timeout=60, raw=None):
    """One request; returns (status, parsed JSON or text). Uses a fresh connection unless given one."""
    conn = server_or_conn.conn(timeout) if isinstance(server_or_conn, Server) else server_or_conn
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request(method, path, body=data, headers=h)
    resp = conn.getresponse()
    text = resp.read().decode("utf-8")
    ctype = resp.getheader("Content-Type", "")
    return resp.status, (json.loads(text) if ctype.startswith("application/json") else text)


def stream(server_or_conn, path, body, headers=None, timeout=60, on_event=None):
    """A streaming request; returns (status, events, comments). events: [(event name or None, data)],
    data parsed as JSON unless it is [DONE]; comments: for each SSE comment, how many events had
    arrived before it. on_event(i, name, data) may return True to hang up."""
    conn = server_or_conn.conn(timeout) if isinstance(server_or_conn, Server) else server_or_conn
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    conn.request("POST", path, body=json.dumps(body).encode(), headers=h)
    resp = conn.getresponse()
    if resp.status != 200 or not resp.getheader("Content-Type", "").startswith("text/event-stream"):
        text = resp.read().decode()
        return resp.status, json.loads(text), []
    events, comments, name, data = [], [], None, []
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\r\n")
        if line.startswith(":"):
            comments.append(len(events))
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
        elif line == "" and data:
            payload = "\n".join(data)
            parsed = payload if payload == "[DONE]" else json.loads(payload)
            events.append((name, parsed))
            name, data = None, []
            if on_event and on_event(len(events) - 1, events[-1][0], parsed):
                conn.close()
                return 200, events, comments
    return 200, events, comments


def chat(prompt, **extra):
    body = {"model": "ds4", "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 8}
    body.update(extra)
    return body


def wait_until(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


class Suite:
    """Named checks run in order; a failure is reported with its name and the run goes on."""

    def __init__(self):
        self.failed = []

    def run(self, name, fn, *args):
        t0 = time.monotonic()
        try:
            fn(*args)
            print(f"ok   {name} ({time.monotonic() - t0:.2f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            import traceback
            traceback.print_exc()
            print(f"FAIL {name}: {e}", flush=True)
            for server in live_servers:
                print("server log tail:\n" + "".join(server.lines[-20:]), flush=True)
            self.failed.append(name)

    def exit(self):
        if self.failed:
            print("failed: " + ", ".join(self.failed))
            sys.exit(1)
        print("all passed")
        sys.exit(0)


def args():
    """argv: ds4-server binary, model file, [ds4-cli binary]."""
    if len(sys.argv) < 3 or not os.path.exists(sys.argv[1]) or not os.path.exists(sys.argv[2]):
        print("usage: test.py DS4_SERVER MODEL [DS4_CLI]; missing input: " + " ".join(sys.argv[1:]))
        sys.exit(1)
    return sys.argv[1:]
