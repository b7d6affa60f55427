"""`Pipe`: message-level round trips through `ferry __echo`, and hostile peers."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from conftest import EchoPeer, FakeServer, Server, handshake, read_request

from ferry_client import (
    BF16,
    CallTimeout,
    ConnectionClosed,
    Message,
    ParamsError,
    Pipe,
    ProtocolError,
    Tensor,
)
from ferry_client import _shm
from ferry_client._wire import CLOSE, MESSAGE, frame

Script = Callable[[socket.socket], None]


def _owner(a: npt.NDArray[Any]) -> object:
    """The object at the end of `a`'s chain of bases (the holder of its memory)."""
    base: object = a.base
    while isinstance(base, np.ndarray):
        base = base.base
    return base


def test_zero_copy_round_trip(echo_peer: EchoPeer) -> None:
    with Pipe.connect(echo_peer.addr) as p:
        assert p.channel == "shm"
        frame_ = p.alloc((1920, 1080, 3), "f32")
        frame_[...] = 0.5
        for i in range(3):
            p.send({"seq": i, "name": "frame"}, [frame_])
            m = p.recv(timeout=10)
            assert isinstance(m, Message)
            assert m.header == {"seq": i, "name": "frame"}
            (back,) = m.tensors
            assert back.shape == (1920, 1080, 3) and back.dtype == np.float32
            assert np.shares_memory(back, frame_)  # its own memory, sent back
            assert not back.flags.writeable
            assert isinstance(_owner(back), _shm.OwnView)


def test_copies_inline_and_dtypes(echo_peer: EchoPeer) -> None:
    with Pipe.connect(echo_peer.addr) as p:
        heap = np.arange(1 << 16, dtype=np.int64)  # large: copied once into shm
        small = np.arange(5, dtype=np.uint8)  # small: inline
        bits = np.array([0x3F80, 0x4000], dtype=np.uint16)
        strided = np.arange(64, dtype=np.float64).reshape(8, 8)[:, ::2]
        p.send(None, [heap, small, Tensor(bits, "bf16"), strided])
        header, (h, s, b, st) = p.recv(timeout=10)
        assert header is None
        assert np.array_equal(h, heap) and not np.shares_memory(h, heap)
        assert np.array_equal(s, small)
        assert b.dtype == BF16 and b.tolist() == [0x3F80, 0x4000]
        assert np.array_equal(st, strided)
        p.send([], [])
        assert p.recv(timeout=10) == Message([], [])


def test_inline_channel(echo_peer: EchoPeer) -> None:
    with Pipe.connect(echo_peer.addr, shm=False) as p:
        assert p.channel == "inline"
        a = np.linspace(0, 1, 100_000, dtype=np.float32)
        p.send({"x": 1}, [a])
        m = p.recv(timeout=10)
        assert m.header == {"x": 1} and np.array_equal(m.tensors[0], a)


def test_recv_times_out_and_the_pipe_stays_usable(echo_peer: EchoPeer) -> None:
    with Pipe.connect(echo_peer.addr, timeout=0.2) as p:
        t0 = time.monotonic()
        with pytest.raises(CallTimeout):
            p.recv()
        # A hang guard, not a measurement: nothing comes unless asked, so a timeout not
        # kept would wait for ever.
        assert time.monotonic() - t0 < 60
        p.send("again")
        assert p.recv(timeout=10).header == "again"


def test_bad_messages_are_refused_before_sending(echo_peer: EchoPeer) -> None:
    with Pipe.connect(echo_peer.addr) as p:
        with pytest.raises(ParamsError):
            p.send({"x": float("nan")})
        with pytest.raises(ParamsError):
            p.send({"x": np.zeros(3)})  # tensors go in the list, not the header
        with pytest.raises(ParamsError):
            p.send({}, [[1, 2, 3]])  # type: ignore[list-item]
        p.send("fine")
        assert p.recv(timeout=10).header == "fine"  # nothing was half-sent


def test_hostile_peer(fake: Callable[[Script], FakeServer]) -> None:
    def script(conn: socket.socket) -> None:
        handshake(conn)
        read_request(conn)
        conn.sendall(struct.pack("<BBHIQ", MESSAGE, 0, 0, 10, 0) + b"{not json}")

    s = fake(script)
    p = Pipe.connect(s.addr, timeout=5)
    p.send("hello")
    with pytest.raises(ProtocolError, match="malformed"):
        p.recv()
    with pytest.raises(ConnectionClosed):  # the error once, then "closed"
        p.recv()
    with pytest.raises(ConnectionClosed):
        p.send("more")
    s.close()
    assert s.received.startswith(bytes([CLOSE])), s.received[:40]
    assert b"protocol_error" in s.received
    p.close()


def test_peer_closes(fake: Callable[[Script], FakeServer]) -> None:
    def script(conn: socket.socket) -> None:
        handshake(conn)
        read_request(conn)
        conn.sendall(frame(MESSAGE, {"header": {"bye": True}}))
        conn.sendall(frame(CLOSE, {"code": "normal", "message": ""}))

    s = fake(script)
    with Pipe.connect(s.addr, timeout=5) as p:
        p.send("hello")
        assert p.recv().header == {"bye": True}
        with pytest.raises(ConnectionClosed):
            p.recv()
        assert p.closed


def test_peer_gone() -> None:
    peer = EchoPeer()
    p = Pipe.connect(peer.addr, timeout=5)
    p.send(1)
    assert p.recv().header == 1
    peer.kill()
    with pytest.raises(ConnectionClosed):
        p.recv()
    assert p.closed
    p.close()


def test_a_receive_only_loop_releases_the_peers_memory(conformance: Server) -> None:
    """Leases of received tensors go back at the next `recv()` even when nothing is
    sent: a consumer that only receives must not pin the server's pool."""
    with Pipe.connect(conformance.addr) as p:
        assert p.channel == "shm"
        request = {
            "jsonrpc": "2.0",
            "method": "make",
            "params": {"dtype": "f32", "shape": [256, 1024]},
            "id": 1,
        }
        p.send(request)
        msg = p.recv(timeout=10)
        [arr] = msg.tensors
        assert arr.shape == (256, 1024) and not arr.flags.writeable
        receiver = p._session.receiver
        assert receiver is not None and len(receiver.held) == 1
        del arr, msg
        with pytest.raises(CallTimeout):
            p.recv(timeout=0.05)  # nothing comes, but the release went out first
        assert receiver.held == {} and not receiver.done
