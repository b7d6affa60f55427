"""`ferry.listen` / `ferry.connect`: headers and tensors both ways over shared memory,
between processes (`tests/pipe_peer.py`) and within one (threads, asyncio)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ferry
from tests.apps import mapping_of
from tests.conftest import ROOT, WAIT, unique_addr, wait_until

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    ml_dtypes = None

BIG = 1 << 14
"""Elements of the tensors that must go through shared memory (64 KiB of f32)."""


@pytest.fixture
def peer() -> Iterator[ferry.Pipe]:
    """A pipe to `tests.pipe_peer` in a child process (which must exit 0 at the end)."""
    addr = unique_addr("pipe")
    listener = ferry.listen(addr)
    assert listener.address == addr
    child = subprocess.Popen([sys.executable, "-m", "tests.pipe_peer", addr], cwd=ROOT)
    try:
        pipe = listener.accept(timeout=WAIT)
        yield pipe
        pipe.send({"op": "bye"})
        assert pipe.recv(timeout=WAIT)[0] == {"op": "bye"}
        assert child.wait(WAIT) == 0
        wait_until(lambda: pipe.closed, "the pipe to see the peer gone")
        with pytest.raises(ConnectionError):
            pipe.recv(timeout=WAIT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_channel_is_shm(peer: ferry.Pipe) -> None:
    assert peer.channel == "shm"
    assert not peer.closed


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the same-host ring is Linux only")
def test_pipes_on_one_host_use_the_ring(peer: ferry.Pipe) -> None:
    """Two processes on one host agree on the ring; many round trips through it (small
    headers, shm tensors, and a header too big for a ring record, which takes the socket)
    come back whole and in order."""
    assert peer.ring
    x = np.arange(BIG, dtype=np.float32)
    for i in range(200):
        peer.send({"op": "scale", "k": i, "note": None}, [x])
        header, ts = peer.recv(timeout=WAIT)
        assert header["op"] == "scaled"
        np.testing.assert_array_equal(ts[0], x * i)
    big_note = "n" * (600 << 10)
    peer.send({"op": "scale", "k": 2, "note": big_note}, [x])
    header, ts = peer.recv(timeout=WAIT)
    assert header["echo"] == big_note
    np.testing.assert_array_equal(ts[0], x * 2)


def test_header_and_tensors_both_ways(peer: ferry.Pipe) -> None:
    x = np.arange(BIG, dtype=np.float32).reshape(128, 128)
    y = np.arange(7, dtype=np.int64)
    note = {"nested": [1, None, "s", {"deep": True}], "f": 0.5}
    peer.send({"op": "scale", "k": 3, "note": note}, [x, y])
    header, ts = peer.recv(timeout=WAIT)
    assert header["op"] == "scaled"
    assert header["echo"] == note
    got = header["got"]
    assert got["dtypes"] == ["float32", "int64"]
    assert got["shapes"] == [[128, 128], [7]]
    assert got["writeable"] == [False, False]
    assert got["mappings"][0].startswith("/memfd:")  # the large one through shm
    assert got["sums"] == [float(x.sum(dtype=np.float64)), 21.0]
    assert [t.dtype for t in ts] == [np.float32, np.int64]
    np.testing.assert_array_equal(ts[0], x * 3)
    np.testing.assert_array_equal(ts[1], y * 3)
    assert not ts[0].flags.writeable
    assert mapping_of(ts[0]).startswith("/memfd:")


def test_allocated_tensors_are_not_copied_either_way(peer: ferry.Pipe) -> None:
    # This side to the peer: an array from `alloc` is shared, an ordinary one copied.
    shared = peer.alloc((BIG,), "f32")
    shared[...] = 1.0
    ordinary = np.ones(BIG, np.float32)
    peer.send({"op": "hold"}, [shared, ordinary])
    assert peer.recv(timeout=WAIT)[0] == {"op": "held", "first": [1.0, 1.0]}
    shared[...] = 5.0  # (a test only: the peer's view is of this very memory)
    ordinary[...] = 5.0
    peer.send({"op": "peek"})
    assert peer.recv(timeout=WAIT)[0] == {"op": "peeked", "first": [5.0, 1.0]}

    # The peer to this side: its `alloc`ed results view its memory.
    peer.send({"op": "scale", "k": 2}, [np.ones(BIG, np.float32)])
    _, ts = peer.recv(timeout=WAIT)
    np.testing.assert_array_equal(ts[0], np.full(BIG, 2.0, np.float32))
    peer.send({"op": "poke_sent", "value": 9.0})
    assert peer.recv(timeout=WAIT)[0] == {"op": "poked"}
    np.testing.assert_array_equal(ts[0], np.full(BIG, 9.0, np.float32))


def test_forwarding_received_tensors(peer: ferry.Pipe) -> None:
    x = np.arange(BIG, dtype=np.float64)
    small = np.array([True, False])
    peer.send({"op": "echo"}, [x, small])
    header, ts = peer.recv(timeout=WAIT)
    assert header == {"op": "echoed"}
    np.testing.assert_array_equal(ts[0], x)
    np.testing.assert_array_equal(ts[1], small)
    assert ts[1].dtype == np.bool_


def test_header_only_messages(peer: ferry.Pipe) -> None:
    peer.send({"op": "whatever"})
    header, ts = peer.recv(timeout=WAIT)
    assert header == {"op": "unknown", "what": "whatever"}
    assert ts == []


@pytest.fixture
def pair() -> Iterator[tuple[ferry.Pipe, ferry.Pipe]]:
    """Both ends of a pipe in this process (the connect in a thread)."""
    addr = unique_addr("pair")
    listener = ferry.listen(addr)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(ferry.connect(addr)), daemon=True)
    t.start()
    a = listener.accept(timeout=WAIT)
    t.join(WAIT)
    assert out, "connect did not return"
    yield a, out[0]


def test_in_process_pair(pair: tuple[ferry.Pipe, ferry.Pipe]) -> None:
    a, b = pair
    assert a.channel == b.channel == "shm"
    b.send([1, "two", None], [np.arange(3, dtype=np.uint8)])
    header, ts = a.recv(timeout=WAIT)
    assert header == [1, "two", None]
    np.testing.assert_array_equal(ts[0], np.arange(3, dtype=np.uint8))
    a.send(None)
    assert b.recv(timeout=WAIT) == (None, [])


@pytest.mark.parametrize("dtype", ["bool", "u8", "i64", "f16", "f32", "f64", "bf16"])
def test_dtypes(pair: tuple[ferry.Pipe, ferry.Pipe], dtype: str) -> None:
    a, b = pair
    if dtype == "bf16":
        if ml_dtypes is None:
            pytest.skip("ml_dtypes is not installed")
        x = np.array([1.5, -2.0, 3.0], dtype=ml_dtypes.bfloat16)
    else:
        x = (np.arange(-2, 4) % 2 == 0) if dtype == "bool" else np.arange(6)
        x = x.astype(
            {
                "bool": np.bool_,
                "u8": np.uint8,
                "i64": np.int64,
                "f16": np.float16,
                "f32": np.float32,
                "f64": np.float64,
            }[dtype]
        )
    out = a.alloc(x.shape, dtype)
    out[...] = x
    a.send({"dtype": dtype}, [x, out])
    header, ts = b.recv(timeout=WAIT)
    assert header == {"dtype": dtype}
    for t in ts:
        assert t.dtype == x.dtype
        np.testing.assert_array_equal(t, x)


def test_asyncio() -> None:
    async def main() -> None:
        addr = unique_addr("aio")
        listener = ferry.listen(addr)
        connecting = asyncio.ensure_future(asyncio.to_thread(ferry.connect, addr))
        server = await listener.aaccept(WAIT)
        client = await connecting
        x = np.arange(BIG, dtype=np.float32)
        await client.asend({"n": 1}, [x])
        header, ts = await server.arecv(WAIT)
        assert header == {"n": 1}
        out = server.alloc(ts[0].shape, ts[0].dtype)
        np.add(ts[0], 1, out=out)
        await server.asend({"n": header["n"] + 1}, [out])
        header, ts = await client.arecv(WAIT)
        assert header == {"n": 2}
        np.testing.assert_array_equal(ts[0], x + 1)
        assert mapping_of(ts[0]).startswith("/memfd:")

    asyncio.run(asyncio.wait_for(main(), WAIT))


def test_timeouts(pair: tuple[ferry.Pipe, ferry.Pipe]) -> None:
    a, _ = pair
    # In the caller's words (not "no message within Some(0.05) s").
    with pytest.raises(
        TimeoutError,
        match=r"^recv\(timeout=0\.05\): no message arrived within 0\.05 s; pass a longer "
        r"timeout, or timeout=None",
    ):
        a.recv(timeout=0.05)
    listener = ferry.listen(unique_addr("lonely"))
    with pytest.raises(TimeoutError):
        listener.accept(timeout=0.05)


def test_odd_timeouts_are_refused_or_mean_for_ever(pair: tuple[ferry.Pipe, ferry.Pipe]) -> None:
    """NaN and negative timeouts are a ValueError naming the call; an infinite or huge one
    waits for ever (no overflow, no panic)."""
    a, b = pair
    for bad in (float("nan"), -1.0):
        with pytest.raises(ValueError, match=r"^recv\(timeout="):
            a.recv(timeout=bad)
        with pytest.raises(ValueError, match=r"^send\(timeout="):
            a.send({}, timeout=bad)
    for long in (float("inf"), 1e300):
        a.send({"long": str(long)}, timeout=long)
        assert b.recv(timeout=long)[0] == {"long": str(long)}


def test_headers_must_be_json(pair: tuple[ferry.Pipe, ferry.Pipe]) -> None:
    a, b = pair
    with pytest.raises(ValueError):
        a.send({"x": float("nan")})
    with pytest.raises(TypeError):
        a.send({"x": object()})
    a.send({"still": "works"})
    assert b.recv(timeout=WAIT)[0] == {"still": "works"}


def test_connect_to_nobody() -> None:
    with pytest.raises(ConnectionError):
        ferry.connect(unique_addr("nobody"))


def test_headers_arrive_as_json_dumps_writes_them(pair: tuple[ferry.Pipe, ferry.Pipe]) -> None:
    """Plain headers are turned into JSON natively, the rest by `json.dumps`: either way
    the peer gets what `json.loads(json.dumps(header))` gives (tuples as lists, non-str
    keys as strings, str and int subclasses as their values)."""
    import enum
    import json

    class Kind(str, enum.Enum):
        A = "a"

    class Level(enum.IntEnum):
        HIGH = 3

    a, b = pair
    deep: Any = "leaf"
    for _ in range(100):
        deep = [deep]
    headers: list[Any] = [
        {"t": (1, 2.5, (None, True)), "u": "é\u2603", "n": -(2**63), "m": 2**64 - 1},
        {1: "one", 2.5: "x", None: "none", False: "no"},
        {"kind": Kind.A, "level": Level.HIGH},
        deep,
        [],
        "text",
        0.1,
    ]
    for h in headers:
        a.send(h)
        assert b.recv(timeout=WAIT)[0] == json.loads(json.dumps(h)), h


def test_views_of_received_and_allocated_tensors(pair: tuple[ferry.Pipe, ferry.Pipe]) -> None:
    """An array that is a received tensor, or an allocated one, whole goes back without a
    copy (the sender gets its own memory back); a part of one, or a view as another dtype,
    is copied, with its own shape and dtype."""
    a, b = pair
    out = a.alloc((BIG,), "f32")
    out[...] = np.arange(BIG, dtype=np.float32)
    a.send({}, [out])
    _, ts = b.recv(timeout=WAIT)
    got = ts[0]
    b.send({}, [got, got[1:], got.view(np.int32), got.reshape(128, 128)])
    _, back = a.recv(timeout=WAIT)
    ptr = out.__array_interface__["data"][0]
    assert back[0].__array_interface__["data"][0] == ptr, "the whole went back as it is"
    np.testing.assert_array_equal(back[0], out)
    assert back[1].__array_interface__["data"][0] != ptr, "a part is copied"
    np.testing.assert_array_equal(back[1], out[1:])
    assert back[2].dtype == np.int32
    np.testing.assert_array_equal(back[2], out.view(np.int32))
    assert back[3].shape == (128, 128)
    np.testing.assert_array_equal(back[3], out.reshape(128, 128))
    # An array from another pipe's alloc is copied into this one's memory.
    addr = unique_addr("other")
    listener = ferry.listen(addr)
    got_other: list[Any] = []
    t = threading.Thread(target=lambda: got_other.append(ferry.connect(addr)), daemon=True)
    t.start()
    c = listener.accept(timeout=WAIT)
    t.join(WAIT)
    foreign = got_other[0].alloc((BIG,), "f32")
    foreign[...] = 4.0
    a.send({}, [foreign])
    _, ts = b.recv(timeout=WAIT)
    np.testing.assert_array_equal(ts[0], np.full(BIG, 4.0, np.float32))
    foreign[...] = 5.0
    np.testing.assert_array_equal(ts[0], np.full(BIG, 4.0, np.float32))
    c.close()
