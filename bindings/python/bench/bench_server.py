"""Python-served functions against Rust-served ones, measured in the same run
(`cargo xtask bench-python-server`, or run it with `FERRY_BIN` set to a release `ferry`).

Rows (p50/p99 in microseconds), each pair interleaved in rounds so a noisy neighbour hits
both alike:

- `call-add`: `add(1, 2)` from the Python client (`ferry.Client`) to `ferry serve` (Rust
  handler) and to `python -m ferry serve` (the same API's `add` in Python).
- `echo-zero-copy`: `echo` of an f32[1920,1080,3] tensor (24.9 MB) made with
  `client.alloc` (shared memory): both servers send the received tensor back as it is.
- `calls-per-s-16-clients`: 16 client processes calling `add` as fast as they can.
- `pipe-rtt-64B` and `pipe-rtt-24.9MB`: Python to Python without RPC: `ferry.connect`
  to a `ferry.listen` peer that sends every message back, beside the same round trip by
  `multiprocessing.shared_memory` plus a unix socket (the tensor written once into a
  shared segment, its name and size sent over the socket, the peer maps it and answers).

The issue's targets: Python-served `add` p50 <= 1.5x Rust-served; echo <= 1.5x;
16 clients >= 50% of the Rust-served calls/s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

import ferry
from ferry import Client

HERE = Path(__file__).resolve().parent
SHAPE = (1920, 1080, 3)

PIPE_PEER = r"""
import sys, threading, ferry
from ferry import _native
l = _native.listen(sys.argv[1])
print("listening", flush=True)
def serve(p):
    while True:
        try:
            m = p.recv(60.0)
        except Exception:
            return
        p.send(m.header, m.tensors)  # the received tensors, sent back as they are
while True:
    try:
        p = l.accept(60.0)
    except TimeoutError:
        break
    threading.Thread(target=serve, args=(p,), daemon=True).start()
"""

SHM_PEER = r"""
import socket, sys
from multiprocessing import shared_memory, resource_tracker
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0" + sys.argv[1]); s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
seen = {}
while True:
    d = c.recv(256)
    if not d:
        break
    name, size = d.decode().split()
    if name not in seen:
        seen[name] = shared_memory.SharedMemory(name=name)
        resource_tracker.unregister(seen[name]._name, "shared_memory")
    view = seen[name].buf[: int(size)]  # the peer's bytes, mapped: what a consumer reads
    view.release()
    c.sendall(d)
"""

CLIENT_LOOP = r"""
import sys, time
from ferry import Client
c = Client.connect(sys.argv[1])
n = int(sys.argv[2])
for _ in range(50):
    c.call("add", [1, 2])
sys.stdin.readline()
t = time.perf_counter()
for _ in range(n):
    c.call("add", [1, 2])
print(time.perf_counter() - t, flush=True)
"""


class Row:
    """Samples of one case."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.samples: list[float] = []

    def p(self, q: float) -> float:
        s = sorted(self.samples)
        return s[min(len(s) - 1, int(len(s) * q))] * 1e6


def start(cmd: list[str], ready: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=cwd)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(ready):
        proc.kill()
        raise SystemExit(f"{cmd}: unexpected first line {line!r}")
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def interleave(cases: dict[str, Callable[[], None]], n: int, rounds: int) -> dict[str, Row]:
    rows = {k: Row(k) for k in cases}
    per = max(1, n // rounds)
    for _ in range(rounds):
        for k, f in cases.items():
            for _ in range(per):
                t = time.perf_counter()
                f()
                rows[k].samples.append(time.perf_counter() - t)
    return rows


def calls_per_s(addr: str, clients: int, calls: int) -> float:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT_LOOP, addr, str(calls)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(clients)
    ]
    time.sleep(1.0)  # every client connected and warm
    t = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        out, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"a client failed: {out}")
    return clients * calls / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=4000, help="timed add calls per server")
    ap.add_argument("--echoes", type=int, default=200, help="timed echoes per server")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--client-calls", type=int, default=1500, help="calls per client")
    ap.add_argument("--json", action="store_true", help="one JSON object per row")
    a = ap.parse_args()
    ferry_bin = os.environ.get("FERRY_BIN")
    if not ferry_bin:
        raise SystemExit(
            "set FERRY_BIN to a release `ferry` binary (cargo xtask bench-python-server does)"
        )
    tag = f"{os.getpid()}"
    rust_addr, py_addr = f"unix:ferry-bench-rs-{tag}", f"unix:ferry-bench-py-{tag}"
    procs = [
        start([ferry_bin, "serve", rust_addr], "listening on"),
        start(
            [sys.executable, "-m", "ferry", "serve", "bench_app:app", py_addr],
            "listening on",
            cwd=HERE,
        ),
    ]
    out: list[tuple[str, str, float, float, str]] = []
    try:
        rs, py = Client.connect(rust_addr), Client.connect(py_addr)
        assert rs.call("add", [1, 2]) == py.call("add", [1, 2]) == 3
        rows = interleave(
            {"rust": lambda: rs.call("add", [1, 2]), "python": lambda: py.call("add", [1, 2])},
            a.calls,
            a.rounds,
        )
        out += [("call-add", k, r.p(0.5), r.p(0.99), "") for k, r in rows.items()]
        x_rs, x_py = rs.alloc(SHAPE, "f32"), py.alloc(SHAPE, "f32")
        x_rs[...] = 1.0
        x_py[...] = 1.0
        for c, x in ((rs, x_rs), (py, x_py)):
            y = c.call("echo", {"tensor": x})
            assert y.shape == SHAPE and y[0, 0, 0] == 1.0
            del y
        rows = interleave(
            {
                "rust": lambda: rs.call("echo", {"tensor": x_rs}),
                "python": lambda: py.call("echo", {"tensor": x_py}),
            },
            a.echoes,
            a.rounds,
        )
        out += [("echo-zero-copy", k, r.p(0.5), r.p(0.99), "") for k, r in rows.items()]
        rs.close()
        py.close()
        rates = {
            "rust": calls_per_s(rust_addr, a.clients, a.client_calls),
            "python": calls_per_s(py_addr, a.clients, a.client_calls),
        }
        out += [
            (f"calls-per-s-{a.clients}-clients", k, v, 0.0, f"{v:.0f} calls/s")
            for k, v in rates.items()
        ]
    finally:
        for p in procs:
            stop(p)
    out += pipes(a, tag)
    for name, who, p50, p99, note in out:
        if a.json:
            print(json.dumps({"case": name, "server": who, "p50_us": p50, "p99_us": p99}))
        elif note:
            print(f"{name:<26} {who:<12} {note}")
        else:
            print(f"{name:<26} {who:<12} p50 {p50:9.1f} us   p99 {p99:9.1f} us")
    ratios = summarize(out)
    for line in ratios:
        print(line)


def pipes(a: argparse.Namespace, tag: str) -> list[tuple[str, str, float, float, str]]:
    addr, shm_addr = f"unix:ferry-bench-pipe-{tag}", f"ferry-bench-shm-{tag}"
    peer = start([sys.executable, "-c", PIPE_PEER, addr], "listening")
    shm_peer = start([sys.executable, "-c", SHM_PEER, shm_addr], "listening")
    out: list[tuple[str, str, float, float, str]] = []
    seg = None
    try:
        rust_pipe = ferry.connect(addr)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect("\0" + shm_addr)
        nbytes = int(np.prod(SHAPE)) * 4
        seg = shared_memory.SharedMemory(create=True, size=nbytes)
        arr = np.ndarray(SHAPE, np.float32, buffer=seg.buf)
        arr[...] = 1.0
        big_rust = rust_pipe.alloc(SHAPE, "f32")
        big_rust[...] = 1.0
        msg64 = {"pad": "x" * 48}
        shm_msg = f"{seg.name} {nbytes}".encode()

        def shm_rtt() -> None:
            sock.sendall(shm_msg)
            sock.recv(256)

        def small_shm() -> None:
            sock.sendall(shm_msg[:64])
            sock.recv(256)

        for label, n, cases in (
            (
                "pipe-rtt-64B",
                a.calls,
                {
                    "ferry.Pipe": lambda: (rust_pipe.send(msg64), rust_pipe.recv()),
                    "shm+socket": small_shm,
                },
            ),
            (
                "pipe-rtt-24.9MB",
                a.echoes,
                {
                    "ferry.Pipe": lambda: (rust_pipe.send({}, [big_rust]), rust_pipe.recv()),
                    "shm+socket": shm_rtt,
                },
            ),
        ):
            rows = interleave(cases, n, a.rounds)  # type: ignore[arg-type]
            out += [(label, k, r.p(0.5), r.p(0.99), "") for k, r in rows.items()]
        rust_pipe.close()
        sock.close()
    finally:
        if seg is not None:
            seg.close()
            seg.unlink()
        stop(peer)
        stop(shm_peer)
    return out


def summarize(out: list[tuple[str, str, float, float, str]]) -> list[str]:
    by = {(n, w): p50 for n, w, p50, _, _ in out}
    lines = ["", "ratios (same run):"]

    def ratio(case: str, a: str, b: str, target: str) -> None:
        if (case, a) in by and (case, b) in by and by[(case, b)] > 0:
            lines.append(f"  {case}: {a}/{b} = {by[(case, a)] / by[(case, b)]:.2f}  ({target})")

    ratio("call-add", "python", "rust", "target <= 1.5")
    ratio("echo-zero-copy", "python", "rust", "target <= 1.5")
    for n, _ in by:
        if n.startswith("calls-per-s"):
            ratio(n, "python", "rust", "target >= 0.5")
            break
    ratio("pipe-rtt-64B", "ferry.Pipe", "shm+socket", "p50 ratio")
    ratio("pipe-rtt-24.9MB", "ferry.Pipe", "shm+socket", "p50 ratio")
    return lines


if __name__ == "__main__":
    main()
