"""Fixtures: real `ferry serve` processes (killed at the end), unique addresses.

The `ferry` binary is `$FERRY_BIN`, else `target/debug/ferry` or `target/release/ferry`
of this repository (build it with `cargo build -p ferry-cli`). Without it the tests fail
loudly: they never pass without a real server.
"""

from __future__ import annotations

import importlib
import itertools
import socket
import threading
import os
import select
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ferry_client._wire import PREAMBLE, PREFIX, WELCOME, frame

REPO = Path(__file__).resolve().parents[3]
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
    pytest.fail(
        "no ferry binary: build it with `cargo build -p ferry-cli` or set FERRY_BIN"
    )


def unique_addr(tag: str) -> str:
    """An abstract socket address no other test (or test run) uses."""
    return f"unix:ferry-py-{tag}-{os.getpid()}-{next(_COUNTER)}"


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

    def __init__(
        self, api: str, addr: str | None = None, argv: list[str] | None = None
    ) -> None:
        """`argv`: another `ferry` command line than `serve` (the address is added last)."""
        self.api = api
        self.addr = addr or unique_addr(api)
        command = (
            [ferry_bin(), *argv, self.addr]
            if argv is not None
            else server_command(api, self.addr)
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


@pytest.fixture(scope="session")
def echo_peer() -> Iterator[EchoPeer]:
    """One `ferry __echo` for the whole run."""
    p = EchoPeer()
    yield p
    p.kill()


@pytest.fixture(scope="session")
def demo() -> Iterator[Server]:
    """One `ferry serve --api demo` for the whole run."""
    s = Server("demo")
    yield s
    s.kill()


@pytest.fixture(scope="session")
def conformance() -> Iterator[Server]:
    """One `ferry serve --api conformance` for the whole run."""
    s = Server("conformance")
    yield s
    s.kill()


@pytest.fixture
def own_server() -> Iterator[Server]:
    """A conformance server of this test alone (tests that kill it)."""
    s = Server("conformance")
    yield s
    s.kill()


# ---- the conformance report ---------------------------------------------------------

_REPORT: list[dict[str, object]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collects the outcome of every conformance case."""
    if "test_conformance.py::test_case[" not in report.nodeid:
        return
    name = report.nodeid.split("[", 1)[1].rstrip("]")
    if report.when == "call" or (report.when == "setup" and not report.passed):
        outcome = "pass" if report.passed else "ignored" if report.skipped else "fail"
        detail = None if report.passed else str(report.longrepr)[-4000:]
        _REPORT.append(
            {
                "name": name,
                "outcome": outcome,
                "detail": detail,
                "ms": round(report.duration * 1000),
            }
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Writes `$FERRY_CONFORMANCE_REPORT` (if set) for `cargo xtask conformance`."""
    path = os.environ.get("FERRY_CONFORMANCE_REPORT")
    if not path or not _REPORT:
        return
    import json

    column = os.environ.get("FERRY_CONFORMANCE_COLUMN", "python-sdk")
    report = {"backend": column, "viable": True, "reason": None, "cases": _REPORT}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(report, indent=2) + "\n")


def pytest_report_header() -> str:
    """Which ferry_client is under test (the installed package, in CI)."""
    import ferry_client

    return f"ferry_client {ferry_client.__version__} from {Path(ferry_client.__file__).parent}"


# ---- hostile servers on real sockets (for the client tests) ---------------------------


class FakeServer:
    """A listening socket whose one connection is handled by `script(conn)` in a thread."""

    def __init__(self, script: Callable[[socket.socket], None]) -> None:
        self.addr = unique_addr("fake")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind("\0" + self.addr.split(":", 1)[1])
        self.sock.listen(1)
        self.received = b""
        self.thread = threading.Thread(target=self._run, args=(script,), daemon=True)
        self.thread.start()

    def _run(self, script: Callable[[socket.socket], None]) -> None:
        conn, _ = self.sock.accept()
        conn.settimeout(5)
        try:
            script(conn)
            while True:  # keep what the client sends (e.g. its CLOSE)
                data = conn.recv(65536)
                if not data:
                    break
                self.received += data
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.thread.join(timeout=10)
        self.sock.close()


def handshake(conn: socket.socket, welcome: dict[str, Any] | None = None) -> bytes:
    """Reads the client's preamble and HELLO, answers with a preamble and `welcome` (by
    default: shm, no features); -> what the client sent."""
    buf = b""
    while len(buf) < len(PREAMBLE) + PREFIX.size:
        buf += conn.recv(65536)
    hlen = PREFIX.unpack_from(buf, len(PREAMBLE))[3]
    while len(buf) < len(PREAMBLE) + PREFIX.size + hlen:
        buf += conn.recv(65536)
    if welcome is None:
        welcome = {
            "version": 1,
            "channels": {"cpu": "shm"},
            "limits": {},
            "agent": "fake",
        }
    conn.sendall(PREAMBLE + frame(WELCOME, welcome))
    return buf


def read_request(conn: socket.socket) -> None:
    buf = conn.recv(65536)
    assert buf


@pytest.fixture
def fake() -> Iterator[Callable[[Callable[[socket.socket], None]], FakeServer]]:
    servers: list[FakeServer] = []

    def make(script: Callable[[socket.socket], None]) -> FakeServer:
        s = FakeServer(script)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def need(reason: str) -> None:
    """Skips a GPU test for `reason`, or fails it under FERRY_REQUIRE_CUDA=1."""
    if os.environ.get("FERRY_REQUIRE_CUDA") == "1":
        pytest.fail(f"FERRY_REQUIRE_CUDA=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def cp() -> Any:
    """CuPy with a usable CUDA device (else the test is skipped, see `need`)."""
    try:
        cupy = importlib.import_module("cupy")
    except ImportError:
        need("cupy is not installed")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            need("no CUDA device")
    except Exception as e:
        need(f"no usable CUDA device: {e}")
    return cupy
