"""Real `ferry serve` processes (killed at the end) and unique addresses, for the tests of
the client side of the `ferry` package (`ferry.Client`, generated clients, references,
the store, placement).

The `ferry` binary is `$FERRY_BIN`, else `target/debug/ferry` or `target/release/ferry`
of this repository (build it with `cargo build -p ferry-cli`). Without it the tests fail
loudly: they never pass without a real server.
"""

from __future__ import annotations

import itertools
import os
import select
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
_COUNTER = itertools.count()


def ferry_bin() -> str:
    """The `ferry` binary the tests run."""
    env = os.environ.get("FERRY_BIN")
    if env:
        return env
    for profile in ("debug", "release"):
        candidate = REPO / "target" / profile / "ferry"
        if candidate.exists():
            return str(candidate)
    pytest.fail("no ferry binary: build it with `cargo build -p ferry-cli` or set FERRY_BIN")


def unique_addr(tag: str) -> str:
    """An abstract socket address no other test (or test run) uses."""
    return f"unix:ferry-pyc-{tag}-{os.getpid()}-{next(_COUNTER)}"


def server_command(api: str, addr: str) -> list[str]:
    """`ferry serve ADDR --api API`; for the conformance API,
    `$FERRY_CONFORMANCE_SERVER` (a command line, `{addr}` standing for the address)
    replaces it: the scenario then checks another server of the same API (the Python
    one, for `cargo xtask conformance`'s `python-server` column)."""
    other = os.environ.get("FERRY_CONFORMANCE_SERVER")
    if api == "conformance" and other:
        return [part.replace("{addr}", addr) for part in shlex.split(other)]
    return [ferry_bin(), "serve", addr, "--api", api]


class Server:
    """A `ferry serve` child process (or `$FERRY_CONFORMANCE_SERVER`'s)."""

    def __init__(self, api: str, addr: str | None = None, argv: list[str] | None = None) -> None:
        """`argv`: another `ferry` command line than `serve` (the address is added last)."""
        self.api = api
        self.addr = addr or unique_addr(api)
        command = (
            [ferry_bin(), *argv, self.addr] if argv is not None else server_command(api, self.addr)
        )
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_ready(30.0)

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None:
                self.kill()
                pytest.fail(f"ferry serve {self.addr} did not start (got {line!r})")
            ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 1)
                if not chunk:
                    continue
                line += chunk
        assert line.startswith(b"listening on"), line
        self.listening = line.decode().split()[-1]
        """The address the server says it listens on (a QUIC one with its pin)."""

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class EchoPeer:
    """A `ferry __echo` child process: serves ferry pipes, sending every message back
    (the peer of `ferry bench`); it exits when its stdin closes."""

    def __init__(self) -> None:
        self.addr = unique_addr("echo")
        self.proc = subprocess.Popen(
            [ferry_bin(), "__echo", self.addr],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30.0)
        line = self.proc.stdout.readline() if ready else b""
        if not line.startswith(b"ready "):
            self.kill()
            pytest.fail(f"ferry __echo {self.addr} did not start (got {line!r})")

    def kill(self) -> None:
        """SIGKILL, and reap."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


def need(reason: str) -> None:
    """Skips a GPU test for `reason`, or fails it under FERRY_REQUIRE_CUDA=1."""
    if os.environ.get("FERRY_REQUIRE_CUDA") == "1":
        pytest.fail(f"FERRY_REQUIRE_CUDA=1 but {reason}")
    pytest.skip(reason)


class FakeServer:
    """A listening socket whose one connection is handled by `script(conn)` in a thread
    (a peer that is not a ferry server)."""

    def __init__(self, script: Callable[[socket.socket], None]) -> None:
        self.addr = unique_addr("fake")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind("\0" + self.addr.split(":", 1)[1])
        self.sock.listen(1)
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script: Callable[[socket.socket], None]) -> None:
        conn, _ = self.sock.accept()
        conn.settimeout(5)
        try:
            script(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.thread.join(timeout=10)
        self.sock.close()
