"""`ferry.Client` / `ferry.AsyncClient` on the Rust client: every address, numpy and torch
in and out, lifecycle, asyncio, errors. Real servers in child processes (`ferry.spawn`,
`ferry serve`); every wait bounded, no timing asserted."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ferry
from ferry import _native
from tests import apps
from tests.conftest import ROOT, WAIT, Served, pid_gone, read_line, unique_addr, wait_until


def _memfd_mapped(addr: int) -> bool:
    """Whether this process maps `addr` from a memfd (shared memory from the peer)."""
    with open("/proc/self/maps") as f:
        for line in f:
            span = line.split(maxsplit=1)[0]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= addr < hi:
                return "memfd:" in line
    return False


def ferry_bin() -> str:
    """`$FERRY_BIN` (CI sets it), else this checkout's `target/{debug,release}/ferry`."""
    env = os.environ.get("FERRY_BIN")
    if env:
        return env
    for profile in ("debug", "release"):
        candidate = ROOT.parents[1] / "target" / profile / "ferry"
        if candidate.exists():
            return str(candidate)
    pytest.fail("no ferry binary: build it with `cargo build -p ferry-cli` or set FERRY_BIN")


@pytest.fixture
def quic_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private config directory for the QUIC identity of the servers a test starts."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture
def rust_server() -> Iterator[str]:
    """`ferry serve unix:NAME` (the Rust demo server); its address."""
    p = subprocess.Popen(
        [ferry_bin(), "serve", unique_addr("rust")],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = read_line(p.stdout)
        m = re.match(r"listening on (unix:\S+)", line)
        assert m, line
        yield m.group(1)
    finally:
        p.kill()
        p.wait(WAIT)


# ---- addresses -------------------------------------------------------------------------


def test_the_client_is_the_native_one(client: ferry.Client) -> None:
    assert isinstance(client._native, _native.Client)
    assert ferry.Client.__module__ == "ferry._client"
    assert client.channel == "shm" and client.transport == "unix"
    assert client.call("add", [1, 2]) == 3


def test_a_unix_socket_path(tmp_path: Path) -> None:
    addr = f"unix:{tmp_path / 'app.sock'}"
    with ferry.spawn(apps.app, addr) as c:
        assert c.address == addr and c.transport == "unix"
        assert c.call("add", {"a": 2, "b": 3}) == 5


def test_quic_with_a_pin_and_a_token(quic_home: Path) -> None:
    with ferry.spawn(apps.app, "quic://127.0.0.1:0", token="s3cret") as c:
        addr = c.address
        assert addr.startswith("quic://127.0.0.1:") and "#sha256=" in addr, addr
        assert (c.transport, c.channel) == ("quic", "quic")
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(c.call("scale", [x, 3.0]), x * 3)
        with pytest.raises(ferry.Refused) as e:
            ferry.Client.connect(addr)
        assert e.value.reason == "bad_token" and addr in str(e.value)
        bare = addr.split("#")[0]
        with pytest.raises(ferry.FerryError, match="sha256"):
            ferry.Client.connect(bare, token="s3cret")


def test_the_rust_server_with_tensors(rust_server: str) -> None:
    with ferry.Client.connect(rust_server, timeout=WAIT) as c:
        assert c.transport == "unix"
        assert c.call("add", {"a": 1, "b": 2}) == 3
        x = np.arange(6, dtype=np.float64).reshape(2, 3)
        np.testing.assert_array_equal(c.call("echo", {"tensor": x}), x)
        assert c.call("sum", {"tensor": x}) == 15.0
        doc = c.discover()
        assert doc["openrpc"] == "1.3.2"


# ---- tensors: numpy and torch, in and out ------------------------------------------------


def test_numpy_results_are_zero_copy_and_read_only(client: ferry.Client, key: str) -> None:
    r = client.call("kept_shared", [key, 4])
    assert _memfd_mapped(r.__array_interface__["data"][0])
    assert r.flags.writeable is False
    with pytest.raises(ValueError, match="read-only"):
        r[0] = 5.0
    client.call("poke", [key, 7.0])
    assert r.tolist() == [7.0] * 4  # the server's memory itself, not a copy


def test_alloc_sends_without_a_copy(client: ferry.Client) -> None:
    a = client.alloc([3], "f32")
    a[...] = [1.0, 2.0, 3.0]
    info = client.call("inspect_array", [a])
    assert info["sum"] == 6.0
    t = client.alloc([2, 2], "f32", as_torch=True)
    t.fill_(2.0)
    assert client.call("inspect_array", [t])["sum"] == 8.0


def test_torch_params_and_results() -> None:
    torch = pytest.importorskip("torch")
    with ferry.spawn(apps.app, unique_addr("torch")) as c:
        x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        r = c.call("scale", [x, 2.0])
        assert isinstance(r, np.ndarray)
        np.testing.assert_array_equal(r, x.numpy() * 2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "not writable" warning from torch
            t = c.call("scale", [x, 2.0], as_torch=True)
        assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
        assert torch.equal(t, x * 2)
        for dtype in (torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64):
            v = torch.ones(4, dtype=dtype)
            back = c.call("echo", [v], as_torch=True)
            assert back.dtype == dtype and torch.equal(back, v), dtype
        for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            v = torch.tensor([1.0, -2.0, 0.5]).to(dtype)
            back = c.call("echo", [v], as_torch=True)
            assert back.dtype == dtype
            assert torch.equal(back.float(), v.float()), dtype


def test_a_client_may_default_to_torch(served: Served) -> None:
    torch = pytest.importorskip("torch")
    with ferry.Client.connect(served.addr, timeout=WAIT, as_torch=True) as c:
        assert isinstance(c.call("scale", [np.ones(3, np.float32), 2.0]), torch.Tensor)
        assert isinstance(
            c.call("scale", [np.ones(3, np.float32), 2.0], as_torch=False), np.ndarray
        )


def test_torch_results_are_zero_copy_and_copy_on_write(client: ferry.Client, key: str) -> None:
    torch = pytest.importorskip("torch")
    t = client.call("kept_shared", [key, 1024], as_torch=True)
    assert _memfd_mapped(t.data_ptr())
    client.call("poke", [key, 9.0])
    assert torch.all(t == 9.0)  # a view of the server's memory
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.add_(1.0)  # copies the pages it touches into this process
    client.call("poke", [key, 3.0])
    assert torch.all(t == 10.0)  # the write stayed here; the server's later write not seen
    other = client.call("kept_shared", [key + "-2", 4])
    assert other.tolist() == [1.0] * 4


# ---- lifecycle ---------------------------------------------------------------------------


def test_closed_at_once_when_the_server_dies() -> None:
    addr = unique_addr("dies")
    with ferry.spawn(apps.app, addr) as c:
        pid = c.call("pid")
        assert not c.closed and c.close_reason is None
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: pid_gone(pid), "the server to die")
        wait_until(lambda: c.closed, "the client to see the connection closed")
        assert c.close_reason
        with pytest.raises(ferry.ConnectionClosed) as e:
            c.call("add", [1, 2])
        assert addr in str(e.value)
        assert isinstance(e.value, ConnectionError)


def test_an_idle_client_is_closed_by_the_server_and_says_why() -> None:
    addr = unique_addr("idle")
    with ferry.spawn(apps.app, addr, idle_timeout=0.3) as first:
        c = ferry.Client.connect(addr, timeout=WAIT, keepalive=None)
        wait_until(lambda: c.closed, "the server to close the idle connection")
        assert "idle" in (c.close_reason or ""), c.close_reason
        with pytest.raises(ferry.ConnectionClosed, match="idle"):
            c.call("add", [1, 2])
        # reconnect=True: a call on a closed client connects again first.
        r = ferry.Client.connect(addr, timeout=WAIT, keepalive=None, reconnect=True)
        wait_until(lambda: r.closed, "the server to close the idle connection")
        assert r.call("add", [1, 2]) == 3 and not r.closed
        r.close()
        del first


def test_keepalive_keeps_a_held_idle_client() -> None:
    addr = unique_addr("keepalive")
    with ferry.spawn(apps.app, addr, idle_timeout=0.5):
        kept = ferry.Client.connect(addr, timeout=WAIT, keepalive=0.05)
        bare = ferry.Client.connect(addr, timeout=WAIT, keepalive=None)
        wait_until(lambda: bare.closed, "the server to close the idle connection")
        assert not kept.closed, kept.close_reason
        assert kept.call("add", [1, 2]) == 3


def test_connect_timeout_waits_for_a_starting_server() -> None:
    addr = unique_addr("late")
    got: list[Any] = []

    def connect() -> None:
        try:
            c = ferry.Client.connect(addr, timeout=WAIT, connect_timeout=WAIT)
            got.append(c.call("add", [2, 2]))
            c.close()
        except BaseException as e:
            got.append(e)

    t = threading.Thread(target=connect, daemon=True)
    t.start()
    time.sleep(0.3)  # (not a measurement: the connect starts before the server)
    assert not got
    with ferry.spawn(apps.app, addr):
        t.join(WAIT)
    assert got == [4]


def test_without_connect_timeout_a_missing_server_is_an_error_naming_it() -> None:
    addr = unique_addr("nobody")
    with pytest.raises(ferry.ConnectionClosed) as e:
        ferry.Client.connect(addr)
    assert addr in str(e.value) and "connect_timeout" in str(e.value)
    with pytest.raises(ferry.CallTimeout) as t:
        ferry.Client.connect(addr, connect_timeout=0.2)
    assert addr in str(t.value)


# ---- errors ------------------------------------------------------------------------------


def test_errors_are_one_tree(client: ferry.Client) -> None:
    with pytest.raises(ferry.rpc_errors.MethodNotFoundError) as e:
        client.call("no_such_method")
    assert isinstance(e.value, ferry.RpcError) and isinstance(e.value, ferry.FerryError)
    with pytest.raises(ferry.ParamsError, match=r'params\[0\]\["x"\]'):
        client.call("add", [{"x": object()}, 1])
    with pytest.raises(ferry.CallTimeout) as t:
        client.call("nap", ["k", 2.0], timeout=0.1)
    assert client.address in str(t.value)


def test_rpc_errors_match_the_generated_table() -> None:
    from ferry._constants import ERROR_CLASSES

    assert {c: k.__name__ for c, k in ferry.rpc_errors.ERRORS.items()} == ERROR_CLASSES
    for code, cls in ferry.rpc_errors.ERRORS.items():
        assert code == cls.CODE and issubclass(cls, ferry.RpcError)
        assert getattr(ferry, cls.__name__) is cls


def test_batch_notify_and_tasks(client: ferry.Client) -> None:
    out = client.batch(
        [("add", [1, 2]), ("no_such_method", None), ("scale", [np.ones(2, np.float32), 3.0])]
    )
    assert out[0] == 3
    assert isinstance(out[1], ferry.rpc_errors.MethodNotFoundError)
    np.testing.assert_array_equal(out[2], [3.0, 3.0])
    client.notify("add", [1, 2])
    task = client.submit("add", [20, 22])
    assert client.task_result(task, wait_ms=int(WAIT * 1000)) == 42
    assert client.task_status(client.submit("add", [1, 1], keep=True))["state"] in (
        "running",
        "done",
    )


# ---- asyncio -----------------------------------------------------------------------------


def test_asyncio_calls_in_flight_at_once(served: Served, key: str) -> None:
    async def main() -> None:
        c = await ferry.AsyncClient.connect(served.addr, timeout=WAIT)
        try:
            # `gather` waits until n calls are inside it at once: only concurrent calls pass.
            n = 2
            got = await asyncio.gather(*(c.call("gather", [key, n]) for _ in range(n)))
            assert got == [True] * n
            sums = await asyncio.gather(*(c.call("add", [i, i]) for i in range(50)))
            assert sums == [2 * i for i in range(50)]
            x = np.arange(4, dtype=np.float32)
            np.testing.assert_array_equal(await c.call("scale", [x, 2.0]), x * 2)
            assert (await c.batch([("add", [1, 2])])) == [3]
            task = await c.submit("add", [1, 2])
            assert await c.task_result(task, wait_ms=int(WAIT * 1000)) == 3
            assert (await c.discover())["openrpc"]
            with pytest.raises(ferry.rpc_errors.MethodNotFoundError):
                await c.call("no_such_method")
        finally:
            await c.close()
        assert c.closed

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_asyncio_cancel_cancels_on_the_server(served: Served, key: str) -> None:
    async def main() -> None:
        c = await ferry.AsyncClient.connect(served.addr, timeout=WAIT)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(c.call("wait_cancel", [key]), 0.3)
        assert await c.call("add", [1, 1]) == 2
        await c.close()

    asyncio.run(asyncio.wait_for(main(), WAIT))
    with ferry.Client.connect(served.addr, timeout=WAIT) as c:
        wait_until(lambda: c.call("record", [key]) == "cancelled", "the call to be cancelled")


def test_asyncio_connect_timeout_and_errors_name_the_address() -> None:
    addr = unique_addr("anobody")

    async def main() -> None:
        with pytest.raises(ferry.ConnectionClosed, match=re.escape(addr)):
            await ferry.AsyncClient.connect(addr)
        with pytest.raises(ferry.CallTimeout, match=re.escape(addr)):
            await ferry.AsyncClient.connect(addr, connect_timeout=0.2)

    asyncio.run(asyncio.wait_for(main(), WAIT))
