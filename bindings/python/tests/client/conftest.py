"""Fixtures of the client tests: one `ferry serve` per API for the run, and the
conformance report (`$FERRY_CONFORMANCE_REPORT`, for `cargo xtask conformance`'s
`python-sdk` column)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.client.servers import EchoPeer, FakeServer, Server


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


@pytest.fixture
def fake() -> Iterator[Callable[[Callable[[socket.socket], None]], FakeServer]]:
    """Makes `FakeServer`s, closed after the test."""
    servers: list[FakeServer] = []

    def make(script: Callable[[socket.socket], None]) -> FakeServer:
        s = FakeServer(script)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


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
