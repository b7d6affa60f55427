"""A fresh client's `add` against `ferry serve` with a crowd of parked connections open:
silent sockets (connected, never a byte) and slowloris ones (a request begun, then one
byte a second), against the same server quiet, in the same run; then how long the server
takes to close the crowd (its descriptor count).

    FERRY_BIN=target/release/ferry python sdks/python/bench/crowd.py [--idle 1000] [--slow 100]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import threading
import time

from ferry_client import Client


def p50_p99(c: Client, n: int) -> tuple[float, float]:
    s = []
    for _ in range(n):
        t = time.perf_counter()
        c.call("add", [1, 2])
        s.append(time.perf_counter() - t)
    s.sort()
    return s[len(s) // 2] * 1e6, s[min(len(s) - 1, int(len(s) * 0.99))] * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--idle", type=int, default=1000, help="silent connections")
    ap.add_argument("--slow", type=int, default=100, help="slowloris connections")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument(
        "--watch", type=float, default=40.0, help="seconds to watch the crowd closed"
    )
    a = ap.parse_args()
    ferry_bin = os.environ.get("FERRY_BIN", "target/release/ferry")
    addr = f"unix:ferry-crowd-{os.getpid()}"
    srv = subprocess.Popen(
        [ferry_bin, "serve", addr],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert srv.stdout is not None
    srv.stdout.readline()
    name = "\0" + addr.removeprefix("unix:")

    def fds() -> int:
        return len(os.listdir(f"/proc/{srv.pid}/fd"))

    stop = threading.Event()
    crowd: list[socket.socket] = []
    try:
        with Client.connect(addr) as c:
            quiet = p50_p99(c, a.calls)
        before = fds()
        for _ in range(a.idle):
            s = socket.socket(socket.AF_UNIX)
            s.connect(name)
            crowd.append(s)
        slow = []
        for _ in range(a.slow):
            s = socket.socket(socket.AF_UNIX)
            s.connect(name)
            s.send(b"{")
            slow.append(s)
        crowd += slow

        def trickle() -> None:
            while not stop.wait(1.0):
                for s in slow:
                    try:
                        s.send(b" ")
                    except OSError:
                        pass

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(1.0)
        with Client.connect(addr) as c:
            loaded = p50_p99(c, a.calls)
        print(f"server descriptors: {before} quiet, {fds()} with the crowd")
        print(f"add p50/p99 quiet:      {quiet[0]:7.1f} / {quiet[1]:7.1f} us")
        print(
            f"add p50/p99 with crowd: {loaded[0]:7.1f} / {loaded[1]:7.1f} us"
            f"  (p50 {loaded[0] / quiet[0]:.2f}x)"
        )
        start = time.monotonic()
        while time.monotonic() - start < a.watch:
            time.sleep(1.0)
            n = fds()
            if n <= before:
                break
        print(
            f"crowd closed by the server: {fds()} descriptors after {time.monotonic() - start:.0f} s"
        )
    finally:
        stop.set()
        for s in crowd:
            s.close()
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait()


if __name__ == "__main__":
    main()
