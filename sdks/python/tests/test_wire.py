"""The frame layer and the session, sans-IO: hostile bytes, descriptors and messages from
a server always end in a typed error, never a crash, a hang or an out-of-bounds read."""

from __future__ import annotations

import fcntl
import json
import os
import struct
from typing import Any

import numpy as np
import pytest

from ferry_client import ConnectionClosed, ProtocolError, ResultError, RpcError
from ferry_client._rpc import RpcSession, encode_params, responses
from ferry_client._session import Session
from ferry_client._shm import F_ADD_SEALS, F_SEAL_GROW, F_SEAL_SEAL, F_SEAL_SHRINK
from ferry_client._wire import (
    CLOSE,
    CONTROL,
    MESSAGE,
    PREAMBLE,
    WELCOME,
    Frame,
    FrameReader,
    Limits,
    byte_span,
    dumps,
    frame,
    tensor_keys,
)
from ferry_client.errors import ParamsError, Refused


def frames_of(
    data: bytes, limits: Limits = Limits(), fds: list[int] | None = None
) -> list[Frame]:
    r = FrameReader(limits)
    r.feed(data, fds or [])
    out = []
    while (f := r.next_frame()) is not None:
        out.append(f)
    return out


def msg(header: object, payload: bytes = b"", fds: int = 0) -> bytes:
    return frame(MESSAGE, header, len(payload), fds) + payload


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_a_claimed_payload_costs_only_what_arrived() -> None:
    # A hostile server announces 3 GiB and sends 100 bytes: the client commits memory for
    # what arrived, not for the claim (a bytearray would zero all 3 GiB first).
    limits = Limits(max_payload_bytes=4 << 30)
    r = FrameReader(limits)
    before = _rss_kib()
    r.feed(PREAMBLE + frame(MESSAGE, {"header": 1}, 3 << 30) + b"x" * 100, [])
    assert r.next_frame() is None and r.in_payload
    view = r.direct()
    assert view is not None and len(view) == (3 << 30) - 100
    grew = _rss_kib() - before
    assert grew < 2048, f"a 3 GiB claim grew the client by {grew} KiB"
    # An honest large frame still arrives whole.
    r = FrameReader(limits)
    body = bytes(range(256)) * 4096
    r.feed(PREAMBLE + msg({"header": 2}, body), [])
    f = r.next_frame()
    assert f is not None and bytes(f.payload) == body


def test_frames_split_anywhere() -> None:
    data = PREAMBLE + msg({"header": 1}, b"abc") + frame(CONTROL, {"x": 1})
    for step in (1, 3, 7, len(data)):
        r = FrameReader(Limits())
        got: list[Frame] = []
        for i in range(0, len(data), step):
            r.feed(data[i : i + step], [])
            while (f := r.next_frame()) is not None:
                got.append(f)
        assert [(f.kind, f.header, bytes(f.payload)) for f in got] == [
            (MESSAGE, {"header": 1}, b"abc"),
            (CONTROL, {"x": 1}, b""),
        ]


@pytest.mark.parametrize(
    "data,code,text",
    [
        (b"HTTP/1.1 200 OK\r\n", "protocol_error", "not a ferry peer"),
        (
            PREAMBLE + struct.pack("<BBHIQ", 9, 0, 0, 0, 0),
            "protocol_error",
            "unknown kind",
        ),
        (PREAMBLE + struct.pack("<BBHIQ", 4, 1, 0, 0, 0), "protocol_error", "reserved"),
        (
            PREAMBLE + struct.pack("<BBHIQ", 4, 0, 0, 2**32 - 1, 0),
            "limit",
            "max_header_bytes",
        ),
        (
            PREAMBLE + struct.pack("<BBHIQ", 4, 0, 0, 2, 2**64 - 1),
            "limit",
            "max_payload_bytes",
        ),
        (PREAMBLE + struct.pack("<BBHIQ", 4, 0, 65, 2, 0), "limit", "max_fds"),
        (
            PREAMBLE + struct.pack("<BBHIQ", 4, 0, 2, 2, 0) + b"{}",
            "protocol_error",
            "file descriptor mismatch",
        ),
        (
            PREAMBLE + struct.pack("<BBHIQ", 4, 0, 0, 3, 0) + b"{]}",
            "protocol_error",
            "malformed frame header",
        ),
        (
            PREAMBLE + struct.pack("<BBHIQ", 4, 0, 0, 6, 0) + b"\xff\xfe{}  ",
            "protocol_error",
            "malformed",
        ),
    ],
)
def test_hostile_prefixes(data: bytes, code: str, text: str) -> None:
    with pytest.raises(ProtocolError) as e:
        frames_of(data)
    assert e.value.code == code and text in str(e.value), e.value


def test_deep_json_is_a_protocol_error() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(ProtocolError):
        frames_of(PREAMBLE + struct.pack("<BBHIQ", 4, 0, 0, len(deep), 0) + deep)


def test_queued_descriptors_are_bounded() -> None:
    r = FrameReader(Limits())
    with pytest.raises(ProtocolError, match="no frame claims"):
        for _ in range(2000):
            r.feed(b"", [-1])
    assert len(r.take_stray_fds()) > 1024


def test_byte_span_is_checked() -> None:
    assert byte_span({"shape": [2, 3]}, 4) == (24, False)
    assert byte_span({"shape": []}, 8) == (8, False)
    assert byte_span({"shape": [2, 0]}, 4) == (0, False)
    assert byte_span({"shape": [2, 3], "strides": [1, 2]}, 4) == (24, True)
    assert byte_span({"shape": [2**64 - 1], "strides": [0]}, 1) == (1, True)
    for bad in (
        {"shape": [2**63, 4]},
        {"shape": [2**64]},
        {"shape": [1] * 65},
        {"shape": [2], "strides": [-1]},
        {"shape": [2], "strides": [1, 1]},
        {"shape": [2**40, 2**40], "strides": [2**40, 1]},
        {"shape": "x"},
        {"shape": [True]},
    ):
        with pytest.raises(ProtocolError):
            byte_span(bad, 8)


def test_limits_from_json() -> None:
    assert Limits.from_json({"max_fds": 3}).max_fds == 3
    assert Limits.from_json(None) == Limits()
    bad: object
    for bad in ([], {"max_fds": -1}, {"max_fds": 2**16}, {"max_tensors": "many"}):
        with pytest.raises(ProtocolError):
            Limits.from_json(bad)


# ---- the session ----------------------------------------------------------------------


def session(channel: str = "shm") -> Session:
    s = Session(
        shm=True,
        token=None,
        agent="t",
        limits=Limits(),
        pool_limit=1 << 30,
        max_peer_bytes=1 << 30,
    )
    s.hello()
    if channel == "inline":
        s.offered = ["inline"]
    welcome = {
        "version": 1,
        "channels": {"cpu": channel},
        "limits": {},
        "agent": "test",
    }
    s.on_handshake(Frame(WELCOME, welcome, bytearray(), []))
    return s


def response(
    result: object,
    tensors: list[dict[str, Any]],
    payload: bytes = b"",
    fds: list[int] | None = None,
) -> Frame:
    body = {"header": {"jsonrpc": "2.0", "id": 1, "result": result}, "tensors": tensors}
    return Frame(MESSAGE, json.loads(json.dumps(body)), bytearray(payload), fds or [])


def desc(
    data: dict[str, Any], dtype: str = "u8", shape: list[int] | None = None, **meta: Any
) -> dict[str, Any]:
    return {
        "meta": {
            "dtype": dtype,
            "shape": shape if shape is not None else [4],
            "device": "cpu",
            **meta,
        },
        "data": data,
    }


def desc_shm(
    shm: dict[str, Any], dtype: str = "u8", shape: list[int] | None = None
) -> dict[str, Any]:
    return desc({"shm": shm}, dtype, shape)


def memfd(size: int, seals: int = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) -> int:
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seals:
        fcntl.fcntl(fd, F_ADD_SEALS, seals)
    return fd


def test_inline_results_decode() -> None:
    s = session("inline")
    payload = bytes(range(4)) + bytes(60) + np.arange(2, dtype="<f4").tobytes()
    f = response(
        {"a": {"$tensor": 0}, "b": [{"$tensor": 1}]},
        [
            desc({"inline": {"offset": 0, "len": 4}}),
            desc({"inline": {"offset": 64, "len": 8}}, "f32", [2]),
        ],
        payload,
    )
    [(rid, out)] = RpcSession(s).on_frame(f)
    assert rid == 1 and isinstance(out, dict)
    assert out["a"].tolist() == [0, 1, 2, 3]
    assert out["b"][0].tolist() == [0.0, 1.0]


@pytest.mark.parametrize(
    "tensors,text",
    [
        ([desc({"inline": {"offset": 0, "len": 99}})], "outside the payload"),
        ([desc({"inline": {"offset": 2**53 - 1, "len": 2}})], "outside the payload"),
        (
            [desc({"inline": {"offset": 2**64 - 1, "len": 2}})],
            "offset: expected an integer in 0..=9007199254740991",
        ),
        ([desc({"inline": {"offset": -1, "len": 2}})], "expected an integer"),
        ([desc({"inline": {"offset": 0, "len": 3}})], "needs 4 bytes"),
        ([desc({"inline": {"offset": 0, "len": 4}}, dtype="q8")], "unknown dtype"),
        ([desc({"inline": {"offset": 0, "len": 4}}, device="cuda:0")], "no channel"),
        ([desc({"quic": {}})], "unknown location"),
        ([desc({"inline": {}, "shm": {}})], "exactly one key"),
        ([{"meta": 3}], "malformed tensor descriptor"),
        (
            [desc({"shm": {"segment": 0, "offset": 0, "len": 4, "lease": 1}})],
            "unexpected location",
        ),
    ],
)
def test_hostile_inline_descriptors(tensors: list[dict[str, Any]], text: str) -> None:
    s = session("inline")
    with pytest.raises(ProtocolError, match=text):
        RpcSession(s).on_frame(response(None, tensors, bytes(16)))


def test_hostile_shm_descriptors() -> None:
    def check(
        tensors: list[dict[str, Any]],
        fds: list[int],
        text: str,
        s: Session | None = None,
    ) -> None:
        with pytest.raises(ProtocolError, match=text):
            RpcSession(s or session()).on_frame(response(None, tensors, b"", fds))
        for fd in fds:  # every descriptor was closed
            with pytest.raises(OSError):
                os.fstat(fd)

    shm = {"segment": 0, "offset": 0, "len": 4, "lease": 1}
    check([desc_shm(shm)], [], "unknown segment 0")
    check(
        [desc_shm({**shm, "announce": {"fd": 1, "size": 4096}})],
        [memfd(4096)],
        "descriptor 1 is not in the frame",
    )
    check(
        [desc_shm({**shm, "announce": {"fd": 0, "size": 4096}})],
        [memfd(4096, 0)],
        "SHRINK and GROW",
    )
    check(
        [desc_shm({**shm, "announce": {"fd": 0, "size": 8192}})],
        [memfd(4096)],
        "announced as 8192 bytes but is 4096",
    )
    check(
        [desc_shm({**shm, "announce": {"fd": 0, "size": 0}})],
        [memfd(0)],
        "announced as 0 bytes",
    )
    r, w = os.pipe()
    os.close(w)
    check([desc_shm({**shm, "announce": {"fd": 0, "size": 4096}})], [r], "not a memfd")
    check(
        [desc_shm({**shm, "len": 8192, "announce": {"fd": 0, "size": 4096}})],
        [memfd(4096)],
        "outside segment",
    )
    check(
        [desc_shm({**shm, "announce": {"fd": 0, "size": 2**40}})],
        [memfd(4096)],
        "max_peer_bytes",
    )
    s = session()
    ok = desc_shm({**shm, "announce": {"fd": 0, "size": 4096}})
    [(_, arr)] = RpcSession(s).on_frame(
        response({"$tensor": 0}, [ok], b"", [memfd(4096)])
    )
    assert isinstance(arr, np.ndarray) and not arr.flags.writeable
    check([desc_shm({**shm, "segment": 0})], [], "lease 1 granted twice", s)
    check(
        [desc_shm({**shm, "announce": {"fd": 0, "size": 4096}})],
        [memfd(4096)],
        "announced twice",
        session_with_segment(),
    )
    check(
        [desc({"shm_return": {"lease": 9, "offset": 0, "len": 4}})], [], "never granted"
    )
    check([desc_shm({**shm, "lease": 2}, dtype="f64")], [], "needs 32 bytes", s)


def session_with_segment() -> Session:
    s = session()
    shm = {
        "segment": 0,
        "offset": 0,
        "len": 4,
        "lease": 1,
        "announce": {"fd": 0, "size": 4096},
    }
    RpcSession(s).on_frame(response(None, [desc_shm(shm)], b"", [memfd(4096)]))
    return s


def test_shm_leases_are_released_when_arrays_go() -> None:
    s = session_with_segment()  # the array of lease 1 was dropped at once
    assert s.releases() == frame(CONTROL, {"channel": "shm", "body": {"release": [1]}})
    assert s.releases() == b""
    shm = {"segment": 0, "offset": 8, "len": 8, "lease": 2}
    [(_, arr)] = RpcSession(s).on_frame(
        response({"$tensor": 0}, [desc_shm(shm, shape=[8])])
    )
    view = arr[2:4]  # type: ignore[index]
    del arr
    assert s.releases() == b""  # the view keeps the lease
    del view
    assert s.releases() == frame(CONTROL, {"channel": "shm", "body": {"release": [2]}})


@pytest.mark.parametrize(
    "body,text",
    [
        ({"channel": "shm", "body": {"release": [5]}}, "not granted"),
        ({"channel": "shm", "body": {"free": [1]}}, "malformed shm control body"),
        ({"channel": "shm", "body": {"release": [-1]}}, "expected an integer"),
        ({"channel": "cuda-ipc", "body": {}}, "does not use"),
        ({"nope": 1}, "control frame"),
    ],
)
def test_hostile_control_frames(body: object, text: str) -> None:
    with pytest.raises(ProtocolError, match=text):
        RpcSession(session()).on_frame(Frame(CONTROL, body, bytearray(), []))


def test_close_frames() -> None:
    with pytest.raises(ConnectionClosed) as e:
        RpcSession(session()).on_frame(
            Frame(CLOSE, {"code": "limit", "message": "too big"}, bytearray(), [])
        )
    assert e.value.code == "limit" and "too big" in str(e.value)
    with pytest.raises(ConnectionClosed):
        RpcSession(session()).on_frame(Frame(CLOSE, "garbage", bytearray(), []))


def test_handshake_answers() -> None:
    s = Session(
        shm=False, token="x", agent="t", limits=Limits(), pool_limit=1, max_peer_bytes=1
    )
    hello = s.hello()
    assert hello.startswith(PREAMBLE)
    body = json.loads(hello[len(PREAMBLE) + 16 :])
    assert body["token"] == "x" and [c["name"] for c in body["channels"]] == ["inline"]
    for bad, err in (
        (Frame(3, {"reason": "bad_token"}, bytearray(), []), Refused),
        (
            Frame(
                WELCOME, {"version": 2, "channels": {"cpu": "inline"}}, bytearray(), []
            ),
            ProtocolError,
        ),
        (
            Frame(WELCOME, {"version": 1, "channels": {"cpu": "shm"}}, bytearray(), []),
            ProtocolError,
        ),
        (
            Frame(WELCOME, {"version": 1, "channels": {}}, bytearray(), []),
            ProtocolError,
        ),
        (Frame(WELCOME, [], bytearray(), []), ProtocolError),
        (Frame(MESSAGE, {}, bytearray(), []), ProtocolError),
    ):
        with pytest.raises(err):
            s.on_handshake(bad)


def test_responses_and_results() -> None:
    [(rid, err)] = responses(
        {
            "jsonrpc": "2.0",
            "id": 3,
            "error": {"code": -32601, "message": "nope", "data": 1},
        },
        [],
    )
    assert (
        rid == 3 and isinstance(err, RpcError) and err.code == -32601 and err.data == 1
    )
    [(_, bad_ref)] = responses({"id": 1, "result": {"x": {"$tensor": 4}}}, [])
    assert isinstance(bad_ref, ResultError)
    [(_, schema)] = responses({"id": 1, "result": {"$tensor": {"oneOf": []}}}, [])
    assert schema == {"$tensor": {"oneOf": []}}  # not a tensor: an OpenRPC schema, say
    inline = {"$tensor": {"dtype": "i16", "shape": [2], "data": "AQACAA=="}}
    [(_, t)] = responses({"id": 1, "result": [inline]}, [])
    assert isinstance(t, list) and t[0].tolist() == [1, 2]
    for bad in ([1], {"result": 1}, {"id": 1}, {"id": 1, "error": {"code": "x"}}):
        with pytest.raises(ProtocolError):
            responses(bad, [])


def test_the_tensor_walk_stops_at_the_last_tensor_the_text_can_hold() -> None:
    a, b = np.arange(2), np.arange(3)
    # Breadth-first: the refs at the top are found before the large list beside them.
    manifest: list[Any] = [["x", "f32", [2], 0, 0]] * 500
    text = dumps(
        {"id": 1, "result": {"buckets": [{"$tensor": 0}], "manifest": manifest}}
    ).decode()
    assert tensor_keys(text) == 1
    [(_, r)] = responses(json.loads(text), [a], tensor_keys(text))
    assert isinstance(r, dict) and r["buckets"][0] is a
    # A string equal to the key makes the count too high: every tensor is still found.
    app = {"id": 1, "result": [["$tensor"], {"k": [{"$tensor": 1}]}, {"$tensor": 0}]}
    text = dumps(app).decode()
    assert tensor_keys(text) == 3
    [(_, r)] = responses(json.loads(text), [a, b], tensor_keys(text))
    assert isinstance(r, list) and r[1]["k"][0] is b and r[2] is a
    # A key spelt with an escape cannot be counted: the walk goes to the end.
    text = '{"id":1,"result":[[[{"\\u0024tensor":0}]]]}'
    assert tensor_keys(text) == -1
    [(_, r)] = responses(json.loads(text), [a], tensor_keys(text))
    assert isinstance(r, list) and r[0][0][0] is a
    # No tensor at all: nothing is walked, and the result is what was parsed.
    assert tensor_keys('{"id":1,"result":[{"a":[1]}]}') == 0
    [(_, r)] = responses({"id": 1, "result": [{"$tensor": 0}]}, [a], 0)
    assert r == [{"$tensor": 0}]  # (a count of 0 promises there is none to replace)
    # The reader counts as it parses a frame's header.
    reader = FrameReader(Limits(), expect_preamble=False)
    reader.feed(frame(MESSAGE, {"header": {"x": {"$tensor": 0}}}), [])
    f = reader.next_frame()
    assert f is not None and f.refs == 1
    # Batches share the count.
    batch = [{"id": 1, "result": {"$tensor": 0}}, {"id": 2, "result": [{"$tensor": 1}]}]
    [(_, r1), (_, r2)] = responses(batch, [a, b], 2)
    assert r1 is a and isinstance(r2, list) and r2[0] is b


def test_params_encoding() -> None:
    tensors: list[Any] = []
    a = np.arange(3, dtype=">i4")  # big-endian: sent little-endian
    out = encode_params(
        {"a": a, "n": np.int64(3), "t": (1, 2.5), "f": np.float32(0.5)}, tensors
    )
    assert out == {"a": {"$tensor": 0}, "n": 3, "t": [1, 2.5], "f": 0.5}
    assert tensors[0][1] == "i32" and tensors[0][0].dtype.byteorder in "<="
    for bad in ({1: 2}, {"x": object()}, {"x": np.zeros(2, dtype="M8[s]")}):
        with pytest.raises(ParamsError):
            encode_params(bad, [])
    deep: list[Any] = []
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ParamsError):
        encode_params(deep, [])


def test_unsendable_params_say_where_what_and_what_to_do() -> None:
    """The errors a user meets for params ferry cannot send name the place in the params,
    the value's type, and what to send instead (not "a object cannot be sent")."""
    with pytest.raises(ParamsError) as e:
        encode_params({"x": [1, {"y": object()}]}, [])
    msg = str(e.value)
    assert msg.startswith("params['x'][1]['y'] is of type object (<object object at"), (
        msg
    )
    assert (
        "which ferry cannot send: pass JSON values" in msg and "numpy arrays" in msg
    ), msg
    with pytest.raises(ParamsError, match=r"^params\[0\] is of type set \(\{1\}\)"):
        encode_params([{1}], [])
    with pytest.raises(
        ParamsError, match=r"got 1 \(int\): .*convert the key with str\(\)"
    ):
        encode_params({1: 2}, [])
    from ferry_client._rpc import request_json

    with pytest.raises(
        ParamsError, match="NaN or infinite float.*inside a numpy array"
    ):
        request_json("add", [float("nan"), 1], 1, [])


def _general(params: object) -> tuple[str, str, list[tuple[str, str]]]:
    """`params` encoded the general way (two passes), or the error it ends with."""
    from ferry_client._outgoing import ENCODER as _ENCODER

    t: list[Any] = []
    try:
        text = _ENCODER.encode(encode_params(params, t))
    except (ParamsError, ValueError) as e:
        return ("error", f"{type(e).__name__}: {e}", [])
    return ("ok", text, [(a.dtype.str, d) for a, d in t])


def test_fast_params_are_the_general_params() -> None:
    from enum import IntEnum

    from ferry_client import Tensor
    from ferry_client._rpc import params_json

    class Small(IntEnum):
        A = 1

    class Key(str):
        pass

    deep: list[Any] = [1]
    for _ in range(40):
        deep = [deep]
    a = np.arange(3, dtype=np.float32)
    cases: list[object] = [
        [1, 2],
        {"a": 1, "b": [True, False, None, -0.0, 1e300, 2**70, 'é\u2028"\\']},
        {"tensor": a, "more": [a, Tensor(a), {"x": np.arange(2, dtype=">i4")}]},
        {"$tensor": 0},
        ((1, 2), [], {}, ""),
        {"nan": float("nan")},
        [float("inf")],
        {1: "non-string key"},
        {Key("k"): 1},
        [Small.A, np.int64(3), np.float32(0.5)],
        [0] * 65,
        {"deep": deep},
        {"x": np.zeros(2, dtype=np.complex64)},
        {"x": object()},
    ]
    for params in cases:
        t1: list[Any] = []
        t2: list[Any] = []
        try:
            fast = ("ok", params_json(params, t1), [(x.dtype.str, d) for x, d in t1])
        except (ParamsError, ValueError) as e:
            fast = ("error", f"{type(e).__name__}: {e}", [])
        assert fast == _general(params), params
        if fast[0] == "ok":
            # references number on from the tensors already there
            t2.append((a, "f32"))
            again = params_json(params, t2)
            assert again.count('{"$tensor":') == fast[1].count('{"$tensor":')
            assert len(t2) == 1 + len(t1)


def test_decode_json_is_the_decoder() -> None:
    from ferry_client._wire import decode_json

    for text in [
        '{"a":[1,2.5,"x",null,true]}',
        ' {"a":1}',
        '{"a":1} ',
        '{"a":1}{"b":2}',
        '{"a":1} x',
        "",
        "   ",
        "[1,",
        '"\\ud800"',
        "NaN",
        "[" * 100_000,
    ]:
        try:
            want: object = ("ok", json.JSONDecoder().decode(text))
        except (ValueError, RecursionError) as e:
            want = ("error", type(e).__name__, str(e))
        try:
            got: object = ("ok", decode_json(text))
        except (ValueError, RecursionError) as e:
            got = ("error", type(e).__name__, str(e))
        assert got == want, text[:40]


def test_the_package_runs_compiled_or_interpreted_as_expected() -> None:
    """`pip install` compiles the hot modules with mypyc where a C compiler is; `cargo
    xtask sdk-python` says which it expects, so that a silent fallback shows."""
    import ferry_client

    expect = os.environ.get("FERRY_EXPECT_COMPILED")
    if expect is None:
        pytest.skip("FERRY_EXPECT_COMPILED is not set (cargo xtask sdk-python sets it)")
    where = ferry_client.client.__file__
    assert ferry_client.COMPILED == (expect == "1"), f"ferry_client.client is {where}"
