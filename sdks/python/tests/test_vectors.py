"""The shared test vectors (`conformance/vectors/*.json`, written from the Rust
implementation by `cargo xtask codegen`), read with this package's own implementation:
frames through `FrameReader`, MESSAGE frames and WELCOME/REFUSE through a `Session`, error
objects through a generated client's `error_from_code`; and the frames written back with
`frame()`. The Rust (`conformance/tests/vectors.rs`) and TypeScript
(`sdks/typescript/test/vectors.test.ts`) tests read the same files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ferry_client import Refused, _constants, _session
from ferry_client._session import Session
from ferry_client._wire import MESSAGE, PREAMBLE, REFUSE, WELCOME, Frame, FrameReader
from ferry_client._wire import Limits, frame
from ferry_client.errors import ProtocolError, RpcError
from ferry_client.generated import demo
from ferry_client.tensors import NUMPY_DTYPES, ferry_dtype

VECTORS = Path(__file__).resolve().parents[3] / "conformance" / "vectors"


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


def limits_of(v: dict[str, Any]) -> Limits:
    return Limits(**v["limits"]) if v.get("limits") else Limits()


def read_frame(data: bytes, limits: Limits = Limits()) -> Frame:
    """One frame of `data` (no preamble), through the reader the client uses."""
    reader = FrameReader(limits, expect_preamble=False)
    reader.feed(data, [])
    f = reader.next_frame()
    assert f is not None, "a whole frame"
    return f


def check_error(name: str, e: ProtocolError, want: dict[str, Any]) -> None:
    assert e.code == want["kind"], (name, str(e))
    if "contains" in want:
        assert want["contains"] in str(e), (name, str(e))


def offered_inline() -> Session:
    """A session that sent its HELLO offering inline only."""
    s = Session(
        shm=False,
        token=None,
        agent="vectors",
        limits=Limits(),
        pool_limit=1 << 20,
        max_peer_bytes=1 << 20,
    )
    s.hello()
    return s


def session() -> Session:
    """A session that offered inline only and was welcomed by an inline server."""
    s = offered_inline()
    welcome = load("handshake.json")["welcomes"][0]
    s.on_handshake(Frame(WELCOME, json.loads(welcome["welcome_json"]), bytearray(), []))
    return s


def test_constants_are_the_packages() -> None:
    assert list(NUMPY_DTYPES) == list(_constants.DTYPES)
    for name, dtype in NUMPY_DTYPES.items():
        assert dtype.itemsize == _constants.ITEMSIZE[name], name
    assert set(_session.FEATURES) <= set(_constants.FEATURES)
    assert PREAMBLE == _constants.MAGIC + bytes([_constants.PROTOCOL_VERSION, 0])


def test_preambles() -> None:
    for p in load("frames.json")["preambles"]:
        reader = FrameReader(Limits())
        reader.feed(bytes.fromhex(p["hex"]), [])
        if "error" in p:
            with pytest.raises(ProtocolError) as e:
                reader.next_frame()
            check_error(p["name"], e.value, p["error"])
        else:
            assert reader.next_frame() is None, p["name"]


def test_frames_decode_and_encode() -> None:
    kinds = set()
    for v in load("frames.json")["frames"]:
        data = bytes.fromhex(v["hex"])
        f = read_frame(data)
        kinds.add(f.kind)
        assert f.kind == v["kind"], v["name"]
        assert _constants.FRAME_KINDS[f.kind] == v["kind_name"], v["name"]
        assert f.header == v["header"], v["name"]
        assert bytes(f.payload).hex() == v["payload_hex"], v["name"]
        header = json.loads(v["header_json"])  # (keeps the writer's key order)
        assert frame(f.kind, header, len(f.payload)) + bytes(f.payload) == data, v[
            "name"
        ]
    # Every kind but RING (the same-host ring, which this client does not speak: it refuses
    # the kind like an unknown one).
    assert kinds == set(_constants.FRAME_KINDS) - {_constants.RING}


def test_malformed_frames_are_refused() -> None:
    for v in load("frames.json")["malformed"]:
        with pytest.raises(ProtocolError) as e:
            read_frame(bytes.fromhex(v["hex"]), limits_of(v))
        check_error(v["name"], e.value, v["error"])


def test_ring_frames_are_refused() -> None:
    """RING (7) is the same-host ring's kind, which this client never agrees to: a server
    that sends one is refused as for an unknown kind."""
    close = b'{"code":"normal","message":""}'
    with pytest.raises(ProtocolError, match="unexpected frame kind 7"):
        read_frame(frame(_constants.RING, json.loads(close), 0))


def span_bytes(a: Any) -> bytes:
    """The bytes of an array's span (its elements' memory from the first to the last)."""
    if a.size == 0:
        return b""
    last = sum((n - 1) * s for n, s in zip(a.shape, a.strides))
    span = last + a.itemsize
    raw = a.view(np.dtype((np.void, a.itemsize)))  # (any dtype, same strides)
    flat = np.lib.stride_tricks.as_strided(
        raw, shape=(span // a.itemsize,), strides=(a.itemsize,)
    )
    return flat.tobytes()


def test_messages_decode() -> None:
    v = load("messages.json")
    for m in v["messages"]:
        s = session()
        got = s.receive(read_frame(bytes.fromhex(m["hex"])))
        assert got is not None, m["name"]
        header, arrays = got
        assert header == m["header"], m["name"]
        assert len(arrays) == len(m["tensors"]), m["name"]
        for a, want in zip(arrays, m["tensors"]):
            assert ferry_dtype(a.dtype) == want["dtype"], m["name"]
            assert list(a.shape) == want["shape"], m["name"]
            if "strides" in want:
                assert [st // a.itemsize for st in a.strides] == want["strides"]
            assert span_bytes(a).hex() == want["data_hex"], m["name"]
    for m in v["malformed"]:
        s = session()
        s.limits = limits_of(m)
        with pytest.raises(ProtocolError) as e:
            s.receive(read_frame(bytes.fromhex(m["hex"]), limits_of(m)))
        check_error(m["name"], e.value, m["error"])


def decode_one(text: str, payload_len: int) -> Any:
    header = {"header": None, "tensors": [json.loads(text)]}
    got = session().receive(Frame(MESSAGE, header, bytearray(payload_len), []))
    assert got is not None
    return got[1][0]


def test_descriptors_in_both_forms() -> None:
    v = load("descriptors.json")
    for d in v["descriptors"]:
        texts = [d["object_json"]] + ([d["compact_json"]] if d["compact_json"] else [])
        inline = d["location"].get("inline")
        for text in texts:
            if inline is None:  # (shm, quic: not on an inline connection)
                with pytest.raises(ProtocolError):
                    decode_one(text, 1 << 16)
                continue
            a = decode_one(text, inline["offset"] + inline["len"])
            assert ferry_dtype(a.dtype) == d["meta"]["dtype"], d["name"]
            assert list(a.shape) == d["meta"]["shape"], d["name"]
            strides = d["meta"].get("strides")
            if strides is not None:
                assert [st // a.itemsize for st in a.strides] == strides, d["name"]
    for d in v["malformed"]:
        with pytest.raises(ProtocolError):
            decode_one(d["json"], 16)


def test_welcomes_and_refusals() -> None:
    v = load("handshake.json")
    for w in v["welcomes"]:
        assert w["offered"] == ["inline"]
        s = offered_inline()
        f = Frame(WELCOME, json.loads(w["welcome_json"]), bytearray(), [])
        if "error" in w:
            with pytest.raises(ProtocolError) as e:
                s.on_handshake(f)
            check_error(w["name"], e.value, w["error"])
        else:
            s.on_handshake(f)
            assert s.peer_limits == Limits(**w["peer_limits"]), w["name"]
    for r in v["refusals"]:
        with pytest.raises(Refused) as refused:
            session().on_handshake(
                Frame(REFUSE, json.loads(r["json"]), bytearray(), [])
            )
        assert refused.value.reason == r["reason"], r["name"]


def test_error_objects() -> None:
    v = load("errors.json")
    for e in v["errors"]:
        obj = json.loads(e["json"])
        err = demo.error_from_code(obj["code"], obj["message"], obj.get("data"))
        assert isinstance(err, RpcError), e["name"]
        assert type(err).__name__ == e["class"], e["name"]
        assert (err.code, err.message, err.data) == (
            obj["code"],
            obj["message"],
            obj.get("data"),
        )
    for code, row in v["table"].items():
        assert _constants.ERROR_CODES[int(code)] == (row["name"], row["message"])
        assert _constants.ERROR_CLASSES[int(code)] == row["class"]
        assert getattr(_constants, row["name"]) == int(code)
    assert not hasattr(demo, "TimeoutError") and not hasattr(demo, "RpcTimeoutError")


def test_the_worked_example() -> None:
    for step in load("worked_example.json")["steps"]:
        data = bytes.fromhex(step["hex"])
        assert len(data) == step["len"]
        if step["what"] == "preamble":
            assert data == PREAMBLE
            continue
        f = read_frame(data)
        assert frame(f.kind, f.header, len(f.payload)) + bytes(f.payload) == data
