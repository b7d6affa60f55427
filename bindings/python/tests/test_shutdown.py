"""`python -m ferry serve tests.apps:app ADDR` stopped by SIGINT and SIGTERM: a clean
exit (code 0) within a bounded wait, with clients connected and calls running; socket
files removed; shared memory given back when clients leave."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable

import numpy as np
import pytest

import ferry
from ferry.errors import ConnectionClosed
from tests.conftest import (
    ROOT,
    WAIT,
    Background,
    CliServer,
    memfd_count,
    read_line,
    unique_addr,
    wait_until,
)

CANCELLED = -32002

Start = Callable[..., CliServer]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_idle_server_stops(cli_server: Start, sig: int) -> None:
    s = cli_server()
    assert s.lines == [f"listening on {s.addr}"]
    with ferry.Client.connect(s.addr, timeout=WAIT) as c:
        assert c.call("add", [1, 2]) == 3.0
    assert s.stop(sig) == 0


@pytest.mark.parametrize(
    ("sig", "method", "params"),
    [
        (signal.SIGINT, "spin", ["k1"]),
        (signal.SIGTERM, "spin", ["k2"]),
        (signal.SIGTERM, "wait_cancel", ["k3"]),
        (signal.SIGINT, "sleeper", ["k4"]),
        (signal.SIGTERM, "sleeper", ["k5"]),
    ],
    ids=["SIGINT-sync", "SIGTERM-sync", "SIGTERM-sync-wait", "SIGINT-async", "SIGTERM-async"],
)
def test_stops_with_a_call_running(
    cli_server: Start, sig: int, method: str, params: list[str]
) -> None:
    """The running call is cancelled (the handler sees it and ends), the caller gets an
    answer or a closed connection, and the process exits 0: no thread holds it up and no
    handler comes back into Python while the interpreter shuts down."""
    s = cli_server()
    c = ferry.Client.connect(s.addr, timeout=WAIT)
    try:
        call = Background(c, method, params)
        wait_until(lambda: c.call("record", params) == "running", "the call to start")
        assert s.stop(sig) == 0
        r = call.result()
        assert isinstance(r, (ferry.RpcError, ConnectionClosed)), r
        if isinstance(r, ferry.RpcError):
            assert r.code == CANCELLED
    finally:
        c.close()
    err = s.proc.stderr.read() if s.proc.stderr else ""
    assert "Fatal Python error" not in err
    if sig == signal.SIGINT:
        assert "ferrytest: stopped" in err


def test_stop_waits_for_a_handler_that_ignores_cancellation(cli_server: Start) -> None:
    s = cli_server()
    c = ferry.Client.connect(s.addr, timeout=WAIT)
    try:
        call = Background(c, "nap", ["k", 0.5])
        wait_until(lambda: c.call("record", ["k"]) == "running", "the call to start")
        assert s.stop(signal.SIGTERM) == 0
        assert isinstance(call.result(), (ferry.RpcError, ConnectionClosed))
    finally:
        c.close()


def test_socket_file_is_removed(cli_server: Start) -> None:
    with tempfile.TemporaryDirectory(prefix="ferry-") as d:
        path = os.path.join(d, "x.sock")
        s = cli_server(f"unix:{path}")
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        with ferry.Client.connect(f"unix:{path}", timeout=WAIT) as c:
            assert c.call("add", [2, 3]) == 5.0
        assert s.stop(signal.SIGTERM) == 0
        assert not os.path.exists(path)
        # And it can be served again at once.
        s2 = cli_server(f"unix:{path}")
        with ferry.Client.connect(f"unix:{path}", timeout=WAIT) as c:
            assert c.call("add", [2, 4]) == 6.0
        assert s2.stop(signal.SIGINT) == 0
        assert not os.path.exists(path)


def test_shared_memory_is_given_back(cli_server: Start) -> None:
    """While clients exchange tensors the server holds memfds; once they disconnect the
    count goes back to what it was before."""
    s = cli_server()
    baseline = memfd_count(s.pid)
    clients = [ferry.Client.connect(s.addr, timeout=WAIT) for _ in range(3)]
    x = np.ones(1 << 18, np.float32)  # 1 MiB: through shared memory
    results = []
    for c in clients:
        assert c.channel == "shm"
        results.append(c.call("scale", [x, 2]))
        results.append(c.call("copy_of", [x]))
    assert all(float(r[0]) in (1.0, 2.0) for r in results)
    during = memfd_count(s.pid)
    assert during > baseline
    del results
    for c in clients:
        c.close()
    wait_until(lambda: memfd_count(s.pid) == baseline, "the server to unmap the clients' memory")
    # A new client still works, and leaving gives its memory back too.
    with ferry.Client.connect(s.addr, timeout=WAIT) as c:
        np.testing.assert_array_equal(c.call("scale", [x, 3]), x * 3)
    wait_until(lambda: memfd_count(s.pid) == baseline, "the server to unmap the memory")
    assert s.stop(signal.SIGTERM) == 0


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("tests.apps:nothing", "has no attribute 'nothing'"),
        ("tests.apps:Point", "is a type, not a ferry.App"),
        ("tests.no_such_module:app", "cannot import 'tests.no_such_module'"),
        ("tests.apps", "give the app as MODULE:ATTRIBUTE"),
    ],
)
def test_cli_refuses_what_is_not_an_app(spec: str, says: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ferry", "serve", spec, unique_addr("bad")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert out.returncode != 0
    assert says in out.stderr


def test_cli_debug_flag(cli_server: Start) -> None:
    s = cli_server(None, "--debug")
    with ferry.Client.connect(s.addr, timeout=WAIT) as c:
        with pytest.raises(ferry.RpcError) as e:
            c.call("crash", [1])
        assert e.value.data["traceback"].startswith("Traceback (most recent call last):")
    assert s.stop(signal.SIGTERM) == 0


def test_cli_app_dir() -> None:
    """`--app-dir DIR` imports the app's module from DIR (uvicorn's option), from any
    working directory; a missing DIR is refused by name."""
    addr = unique_addr("appdir")
    cmd = [sys.executable, "-m", "ferry", "serve", "conformance_app:app", addr]
    proc = subprocess.Popen(
        [*cmd, "--app-dir", str(ROOT / "tests")],
        cwd="/",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = read_line(proc.stdout)
        assert line.startswith("listening on"), line
        with ferry.Client.connect(addr, timeout=WAIT) as c:
            assert c.call("slow", {"ms": 1}) == 1
    finally:
        proc.kill()
        proc.wait()
        for s in (proc.stdout, proc.stderr):
            if s is not None:
                s.close()
    out = subprocess.run(
        [*cmd, "--app-dir", "/no/such/dir"],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert out.returncode != 0
    assert "--app-dir '/no/such/dir' is not a directory" in out.stderr
