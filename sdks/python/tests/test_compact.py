"""Compact tensor descriptors (PROTOCOL.md 7.3): negotiated in the handshake, written for
re-sent pool arrays, read in every form, and refused when malformed."""

from __future__ import annotations

import socket
from collections.abc import Callable

import numpy as np
import pytest
from conftest import FakeServer, Server, handshake, read_request

from ferry_client import Client, ProtocolError, _session
from ferry_client._wire import MESSAGE, frame


def test_the_server_grants_compact_descriptors_and_both_directions_use_them(
    demo: Server,
) -> None:
    with Client.connect(demo.addr) as c:
        session = c._session
        assert session.compact, session.welcome
        assert session.welcome["features"] == ["compact_tensors", "shm_forget"]
        a = c.alloc((1920, 1080, 3), "f32")
        a[...] = 0.5
        for _ in range(3):  # announce, remember, then the compact memo
            back = c.call("echo", {"tensor": a})
            assert np.shares_memory(back, a) and back[7, 9, 2] == 0.5
            assert not back.flags.writeable
            del back
        out = c._rpc.request("echo", {"tensor": a}, 10_000)
        text = bytes(out.parts[0])
        assert b'["f32",[1920,1080,3],"shm",' in text and text.endswith(b",true]]}")
        out.done()
        assert session.pool is not None
        session.pool.revoke([max(session.pool.granted)])  # (never sent)
        # The server's own tensors (compact shm) and small ones (compact inline).
        made = c.call(
            "create_tensor", {"shape": [256, 256], "dtype": "f32", "fill": 2.0}
        )
        assert made.shape == (256, 256) and float(made[3, 4]) == 2.0
        small = np.arange(6, dtype=np.int64).reshape(2, 3)
        assert np.array_equal(c.call("echo", {"tensor": small}), small)
        strided = np.arange(64, dtype=np.float64).reshape(8, 8)[:, ::2]  # (object form)
        assert np.array_equal(c.call("echo", {"tensor": strided}), strided)


def test_without_the_feature_descriptors_are_objects(
    demo: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_session, "FEATURES", [])
    with Client.connect(demo.addr) as c:
        assert not c._session.compact
        assert "features" not in c._session.welcome
        a = c.alloc((64, 64), "f32")
        a[...] = 3.0
        for _ in range(3):
            back = c.call("echo", {"tensor": a})
            assert np.shares_memory(back, a) and back[1, 2] == 3.0
        out = c._rpc.request("echo", {"tensor": a}, 10_000)
        assert b',"lazy_release":true}}}' in bytes(out.parts[0])
        out.done()


# ---- a fake server that writes compact descriptors ----------------------------------


def compact_handshake(conn: socket.socket) -> None:
    """`handshake` on an inline connection, granting `compact_tensors`."""
    welcome = {
        "version": 1,
        "channels": {"cpu": "inline"},
        "limits": {},
        "agent": "fake",
        "features": ["compact_tensors"],
    }
    hello = handshake(conn, welcome)
    assert b'"features":["compact_tensors","shm_forget"]' in hello


def answer(desc: object, payload: bytes = b"") -> bytes:
    body = {
        "header": {"jsonrpc": "2.0", "id": 1, "result": {"$tensor": 0}},
        "tensors": [desc],
    }
    return frame(MESSAGE, body, len(payload)) + payload


def test_a_compact_inline_tensor_from_the_peer(
    fake: Callable[..., FakeServer],
) -> None:
    data = np.arange(6, dtype=np.int32).tobytes()

    def script(conn: socket.socket) -> None:
        compact_handshake(conn)
        read_request(conn)
        conn.sendall(answer(["i32", [2, 3], "inline", 0, 24], data))

    with Client.connect(fake(script).addr, timeout=5, shm=False) as c:
        assert c._session.compact
        got = c.call("x")
        assert got.dtype == np.int32 and got.shape == (2, 3)
        assert np.array_equal(got, np.arange(6, dtype=np.int32).reshape(2, 3))


@pytest.mark.parametrize(
    ("desc", "needle"),
    [
        (["i32", [2, 3], "inline", 0], "malformed compact tensor descriptor"),
        (["i32", [2, 3], "inline", 0, 24, 1], "malformed compact tensor descriptor"),
        (["i32", [2, 3], "quic_stream", 0, 24], "malformed compact tensor descriptor"),
        ([], "malformed compact tensor descriptor"),
        (["i31", [2, 3], "inline", 0, 24], "unknown dtype"),
        (["i32", [2, 3], "inline", -1, 24], "offset: expected an integer"),
        (["i32", [2, 3], "inline", 0, 2**64], "len: expected an integer"),
        (
            ["i32", [2, 3], "inline", 2**53, 24],
            "offset: expected an integer in 0..=9007199254740991",
        ),
        (["i32", [2, 3], "inline", 8, 24], "outside the payload"),
        (["i32", [2, 4], "inline", 0, 24], "needs 32 bytes but 24 are present"),
        (["i32", "2x3", "inline", 0, 24], "shape must be a list"),
        (["i32", [2, 3], "shm", 0, 0, 24, 1], "unexpected location shm"),
        (["i32", [2, 3], "shm_return", 1, 0, 24], "unexpected location shm_return"),
    ],
)
def test_malformed_compact_descriptors_close_the_connection(
    fake: Callable[..., FakeServer], desc: object, needle: str
) -> None:
    payload = bytes(24)

    def script(conn: socket.socket) -> None:
        compact_handshake(conn)
        read_request(conn)
        conn.sendall(answer(desc, payload))

    s = fake(script)
    c = Client.connect(s.addr, timeout=5, shm=False)
    with pytest.raises(ProtocolError, match=needle):
        c.call("x")
    c.close()
    s.close()
    assert b"protocol_error" in s.received


def test_a_server_without_the_feature_gets_no_compact_descriptors(
    fake: Callable[..., FakeServer],
) -> None:
    """`handshake` grants no feature: the client never writes the array form."""
    got: list[bytes] = []

    def script(conn: socket.socket) -> None:
        handshake(conn)
        for _ in range(3):
            got.append(conn.recv(65536))
            conn.sendall(
                frame(
                    MESSAGE, {"header": {"jsonrpc": "2.0", "id": len(got), "result": 1}}
                )
            )

    with Client.connect(fake(script).addr, timeout=5) as c:
        assert not c._session.compact
        a = c.alloc((64,), "u8")
        for _ in range(3):
            assert c.call("x", {"t": a}) == 1
    assert got and all(b'"shm":{' in m for m in got[1:]), got
    assert not any(b'"shm",' in m for m in got), got
