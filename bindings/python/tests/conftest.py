"""Fixtures and helpers of the ferry tests.

Everything is real: the apps of `tests/apps.py` are served by child processes
(`ferry.spawn`, `python -m ferry serve`) on abstract unix sockets with names unique to
this process and test, clients talk to them over shared memory, plain JSON and HTTP.
Every wait is bounded; no test asserts how long anything took.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

import ferry
from tests import apps

ROOT = Path(__file__).resolve().parents[1]
"""bindings/python: the working directory under which `tests.apps` imports."""

WAIT = 30.0
"""Seconds any wait of a test gives up after (a failure, never a measurement)."""

T = TypeVar("T")


def unique_addr(tag: str = "t") -> str:
    """A fresh abstract unix address, unique to this process and call."""
    return f"unix:ferry-test-{os.getpid()}-{tag}-{secrets.token_hex(6)}"


def wait_until(
    check: Callable[[], T], what: str, timeout: float = WAIT, interval: float = 0.01
) -> T:
    """Polls `check` until it returns something true (returned), failing after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout} s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def pid_gone(pid: int) -> bool:
    """Whether process `pid` has exited (gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def memfd_count(pid: int) -> int:
    """Descriptors of process `pid` that are memfds (its shared memory segments)."""
    return apps._count_memfd(pid)


class PlainJson:
    """A plain (newline-delimited) JSON-RPC connection on a unix socket."""

    def __init__(self, addr: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(WAIT)
        self.sock.connect("\0" + addr.removeprefix("unix:"))
        self.file = self.sock.makefile("rb")

    def send(self, request: Any) -> None:
        self.sock.sendall(json.dumps(request).encode() + b"\n")

    def receive(self) -> Any:
        line = self.file.readline()
        assert line, "the server closed the connection"
        return json.loads(line)

    def call(self, request: Any) -> Any:
        self.send(request)
        return self.receive()

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class Background:
    """A call made in a thread; `result()` is its result or the exception it raised."""

    def __init__(
        self, client: ferry.Client, method: str, params: Any, timeout: float | None = None
    ) -> None:
        self._out: list[Any] = []
        self._t = threading.Thread(
            target=self._run, args=(client, method, params, timeout), daemon=True
        )
        self._t.start()

    def _run(self, client: ferry.Client, method: str, params: Any, timeout: float | None) -> None:
        try:
            self._out.append(client.call(method, params, timeout=timeout))
        except BaseException as e:
            self._out.append(e)

    def result(self) -> Any:
        self._t.join(WAIT)
        assert not self._t.is_alive(), "the call did not end"
        return self._out[0]


@dataclass
class Served:
    """The app served by a child process for the whole session."""

    addr: str
    pid: int


@pytest.fixture(scope="session")
def served() -> Iterator[Served]:
    addr = unique_addr("app")
    with ferry.spawn(apps.app, addr) as c:
        yield Served(addr, c.call("pid"))


@pytest.fixture
def client(served: Served) -> Iterator[ferry.Client]:
    """A fresh connection to the session's server."""
    with ferry.Client.connect(served.addr, timeout=WAIT) as c:
        yield c


@pytest.fixture
def key() -> str:
    """A name no other test uses, for the app's module-level records."""
    return secrets.token_hex(8)


def read_line(stream: Any, timeout: float = WAIT) -> str:
    """The next line of a child's pipe, waiting at most `timeout`."""
    ready, _, _ = select.select([stream], [], [], timeout)
    if not ready:
        pytest.fail(f"no line from the child within {timeout} s")
    line: str = stream.readline()
    return line


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default. A test run started in the
    background by a non-interactive shell (`cmd &`) inherits SIGINT ignored, and Python then
    keeps ignoring it, as a daemon should; the tests stand for a server in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class CliServer:
    """`python -m ferry serve tests.apps:app ADDR` in a child process."""

    def __init__(self, addr: str, *extra: str) -> None:
        self.addr = addr
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ferry", "serve", "tests.apps:app", addr, *extra],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_default_sigint,
        )
        self.lines: list[str] = []
        while not any(line.startswith("listening on ") for line in self.lines):
            line = read_line(self.proc.stdout)
            if not line:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                pytest.fail(f"the server exited before listening: {self.lines} {err}")
            self.lines.append(line.strip())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Sends `sig`; the exit code (the test fails if it does not exit in time)."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the server did not exit within {WAIT} s of signal {sig}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for s in (self.proc.stdout, self.proc.stderr):
            if s is not None:
                s.close()


@pytest.fixture
def cli_server() -> Iterator[Callable[..., CliServer]]:
    """Starts `python -m ferry serve` servers; kills any left running at the end."""
    started: list[CliServer] = []

    def start(addr: str | None = None, *extra: str) -> CliServer:
        s = CliServer(addr or unique_addr("cli"), *extra)
        started.append(s)
        return s

    yield start
    for s in started:
        with contextlib.suppress(Exception):
            s.close()
