"""The cuda-ipc channel of the Python SDK (PROTOCOL.md section 17) without a GPU: the
session against an in-memory fake driver (descriptors, the handle cache, leases,
releases, returns, the pool, closing, hostile input), and the "cupy is missing" errors
against a real `ferry serve`."""

from __future__ import annotations

import base64
import gc
import json
import os
import sys
from typing import Any

import numpy as np
import pytest

from conftest import Server
from fake_cuda import FakeCudaArray, FakeDeviceArray, FakeDriver, World, address
from ferry_client import Client, Pipe, ProtocolError, RpcError
from ferry_client import is_orphaned
from ferry_client._cuda import CUPY_HINT, CudaUnavailable, format_uuid
from ferry_client._cupy import make_driver
from ferry_client.generated.conformance import ConformanceClient
from ferry_client._rpc import RpcSession
from ferry_client._session import Session
from ferry_client._wire import CONTROL, MESSAGE, PREAMBLE, WELCOME, Frame, Limits
from ferry_client.errors import LimitError

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID1 = "GPU-11111111-0000-4000-8000-000000000001"
EVENT = base64.b64encode(b"\x01" * 64).decode()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def cuda_session(
    driver: FakeDriver, *, max_peer_bytes: int = 1 << 30, **kw: Any
) -> Session:
    s = Session(
        shm=False,
        token=None,
        agent="t",
        limits=Limits(),
        pool_limit=1 << 30,
        max_peer_bytes=max_peer_bytes,
        cuda=driver,
        **kw,
    )
    hello = json.loads(s.hello()[len(PREAMBLE) + 16 :])
    offer = [c for c in hello["channels"] if c["name"] == "cuda-ipc"]
    assert offer and offer[0]["devices"] == ["cuda"]
    welcome = {
        "version": 1,
        "channels": {"cpu": "inline", "cuda": "cuda-ipc"},
        "limits": {},
    }
    s.on_handshake(Frame(WELCOME, welcome, bytearray(), []))
    assert s.cuda is not None
    return s


def cuda_desc(
    mem: bytes,
    *,
    alloc_id: object = 7,
    alloc_size: object = 4096,
    offset: object = 0,
    length: object = 16,
    lease: object = 1,
    uuid: str = UUID0,
    dtype: str = "f32",
    shape: list[int] | None = None,
    device: str = "cuda:0",
    event: str = EVENT,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "meta": {
            "dtype": dtype,
            "shape": shape if shape is not None else [4],
            "device": device,
        },
        "data": {
            "cuda_ipc": {
                "device_uuid": uuid,
                "mem_handle": b64(mem),
                "alloc_id": alloc_id,
                "alloc_size": alloc_size,
                "offset": offset,
                "len": length,
                "event_handle": event,
                "lease": lease,
                **extra,
            }
        },
    }


def message(tensors: list[dict[str, Any]]) -> Frame:
    body = {"header": {"jsonrpc": "2.0", "id": 1, "result": None}, "tensors": tensors}
    return Frame(MESSAGE, json.loads(json.dumps(body)), bytearray(), [])


def receive(s: Session, tensors: list[dict[str, Any]]) -> list[Any]:
    got = s.receive(message(tensors))
    assert got is not None
    return got[1]


def sent_descs(s: Session, arrays: list[Any]) -> tuple[bytes, list[dict[str, Any]]]:
    """What the session writes for a message carrying `arrays`: (pending CONTROL
    frames, the MESSAGE's tensor descriptors)."""
    from ferry_client._cuda import cuda_array

    items = []
    for a in arrays:
        cu = cuda_array(a)
        assert cu is not None
        items.append((cu, "f32" if cu.dtype == np.float32 else "u8"))
    out = s.message('{"x":1}', items)
    head = bytes(out.parts[0])
    body = json.loads(head[16:])
    return out.before, body["tensors"]


# ---- receiving the server's memory --------------------------------------------------------


def test_descriptor_maps_once_waits_on_the_event_and_views_the_memory() -> None:
    world = World()
    h, buf = world.export(4096)
    buf[:32].view(np.float32)[:] = np.arange(8, dtype=np.float32)
    drv = FakeDriver(world)
    s = cuda_session(drv)
    [a] = receive(s, [cuda_desc(h, offset=16, length=16, lease=1)])
    assert isinstance(a, FakeDeviceArray) and a.dev == 0
    assert a.host.tolist() == [4.0, 5.0, 6.0, 7.0]  # a view of the server's bytes
    assert address(a.host) == address(buf) + 16
    assert drv.waits == [(0, b"\x01" * 64)]
    [b] = receive(s, [cuda_desc(h, length=32, shape=[8], lease=2)])
    assert drv.open_count == 1  # the cache: one mapping per allocation
    assert len(drv.events) == 1  # and one opened event per handle
    assert b.host.tolist() == list(range(8))
    buf[:4].view(np.float32)[0] = 42.0  # no copy: the server's writes show
    assert b.host[0] == 42.0


def test_the_cache_never_reuses_a_mapping_for_other_handle_bytes() -> None:
    world = World()
    h1, _ = world.export(4096)
    h2, buf2 = world.export(4096)
    buf2[:16].view(np.float32)[:] = 9.0
    drv = FakeDriver(world)
    s = cuda_session(drv)
    [a] = receive(s, [cuda_desc(h1, lease=1)])
    # The same allocation id with new handle bytes: the old allocation is gone and its
    # address may be reused; the old mapping must not be read for the new one.
    [b] = receive(s, [cuda_desc(h2, lease=2)])
    assert drv.open_count == 2
    assert b.host.tolist() == [9.0] * 4
    assert drv.closed == []  # `a` still uses the old mapping
    del a
    gc.collect()
    assert drv.closed == [h1]
    assert s.cuda is not None and set(s.cuda.cache) == {7}


def test_leases_are_released_per_device_with_an_event_when_arrays_go() -> None:
    world = World()
    h, _ = world.export(4096)
    drv = FakeDriver(world)
    s = cuda_session(drv)
    [a, b] = receive(
        s,
        [
            cuda_desc(h, lease=5),
            cuda_desc(h, lease=6, offset=16),
        ],
    )
    view = a[1:3]
    del a
    assert s.releases() == b""  # the view keeps lease 5
    del view, b
    gc.collect()
    rel = s.releases()
    assert drv.records == [0]  # one event, recorded after this side's last use
    body = json.loads(rel[16:])
    assert body == {
        "channel": "cuda-ipc",
        "body": {
            "release": sorted(body["body"]["release"]),
            "device": UUID0,
            "event": b64(bytes([0xE0]) * 64),
        },
    }
    assert sorted(body["body"]["release"]) == [5, 6]
    assert s.releases() == b""  # each lease once


def test_a_tensor_of_no_bytes_needs_no_memory() -> None:
    world = World()
    h, _ = world.export(64)
    s = cuda_session(FakeDriver(world))
    [a] = receive(s, [cuda_desc(h, alloc_size=64, length=0, shape=[0, 3], lease=3)])
    assert a.host.shape == (0, 3)


def test_strided_descriptors_view_with_strides() -> None:
    world = World()
    h, buf = world.export(4096)
    buf[:48].view(np.float32)[:] = np.arange(12, dtype=np.float32)
    s = cuda_session(FakeDriver(world))
    d = cuda_desc(h, length=48, shape=[3, 2])
    d["meta"]["strides"] = [1, 3]  # a transposed [2,3]
    [a] = receive(s, [d])
    assert a.host.tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]


def _mutate(**kw: Any) -> dict[str, Any]:
    return kw


@pytest.mark.parametrize(
    "change,text",
    [
        (_mutate(device="cpu:0"), "is not cuda:N"),
        (_mutate(device="cuda:x"), "is not cuda:N"),
        (_mutate(uuid="GPU-"), "is not a device UUID"),
        (_mutate(uuid="GPU-" + "a" * 100), "is not a device UUID"),
        (_mutate(uuid="GPU-zz"), "is not a device UUID"),
        (_mutate(event="AAAA"), "event_handle: expected base64 of 64 bytes"),
        (_mutate(event="!" * 88), "event_handle: not base64"),
        # 64-bit values are JSON numbers, at most 2^53 - 1 (PROTOCOL.md 5.5).
        (_mutate(offset="0"), "offset: expected an integer in 0..=9007199254740991"),
        (_mutate(offset=-1), "offset: expected an integer in 0..=9007199254740991"),
        (_mutate(offset=1.0), "offset: expected an integer"),
        (_mutate(length=True), "len: expected an integer"),
        (
            _mutate(alloc_id=2**53),
            "alloc_id: expected an integer in 0..=9007199254740991",
        ),
        (
            _mutate(alloc_size=2**64),
            "alloc_size: expected an integer in 0..=9007199254740991",
        ),
        (_mutate(lease=2**53), "lease: expected an integer in 0..=9007199254740991"),
        (_mutate(alloc_size=0), "alloc_size is 0"),
        (
            _mutate(alloc_size=1 << 40),
            "over the limit of .* bytes \\(max_peer_bytes\\)",
        ),
        (_mutate(offset=4090, length=16), "outside the allocation of 4096 bytes"),
        (
            _mutate(offset=2**53 - 1, length=1),
            "outside the allocation",
        ),
        (
            _mutate(uuid="GPU-99999999-0000-0000-0000-000000000000"),
            "is not visible here",
        ),
        (_mutate(length=12), "tensor needs 16 bytes but 12 are present"),
        (_mutate(lease=-1), "lease: expected an integer"),
        (_mutate(extra_field=1), "unknown fields"),
    ],
)
def test_hostile_descriptors(change: dict[str, Any], text: str) -> None:
    world = World()
    h, _ = world.export(4096)
    drv = FakeDriver(world)
    s = cuda_session(drv)
    with pytest.raises(ProtocolError, match=text):
        receive(s, [cuda_desc(h, **change)])
    assert drv.opened == {}  # nothing mapped for a descriptor that fails its checks


def test_hostile_handles_and_mappings() -> None:
    world = World()
    h, _ = world.export(4096)
    drv = FakeDriver(world)
    s = cuda_session(drv)
    bad = cuda_desc(h)
    bad["data"]["cuda_ipc"]["mem_handle"] = (
        b64(b"x" * 63) + "A"
    )  # 88 chars, not 64 bytes
    with pytest.raises(ProtocolError, match="mem_handle"):
        receive(s, [bad])
    with pytest.raises(ProtocolError, match="cuIpcOpenMemHandle failed"):
        receive(s, [cuda_desc(os.urandom(64))])  # a handle the driver cannot open
    drv.map_short = 1
    with pytest.raises(
        ProtocolError, match="claims 4096 bytes but the driver mapped 4095"
    ):
        receive(s, [cuda_desc(h)])
    assert drv.opened == {}  # the short mapping was closed at once
    drv.map_short = 0
    [a] = receive(s, [cuda_desc(h, lease=1)])
    with pytest.raises(ProtocolError, match="lease 1 granted twice"):
        receive(s, [cuda_desc(h, lease=1)])
    with pytest.raises(
        ProtocolError, match="was 4096 bytes on local device 0, now claims"
    ):
        receive(s, [cuda_desc(h, lease=2, alloc_size=8192)])
    with pytest.raises(ProtocolError, match="no channel for that device"):
        from test_wire import session as cpu_session

        RpcSession(cpu_session()).on_frame(message([cuda_desc(h)]))
    del a


def test_peer_limits_are_enforced_with_named_options() -> None:
    world = World()
    handles = [world.export(4096)[0] for _ in range(3)]
    s = cuda_session(FakeDriver(world), cuda_max_peer_allocs=2)
    receive(s, [cuda_desc(handles[0], alloc_id=1, lease=1)])
    receive(s, [cuda_desc(handles[1], alloc_id=2, lease=2)])
    with pytest.raises(ProtocolError, match="max_peer_allocs = 2") as e:
        receive(s, [cuda_desc(handles[2], alloc_id=3, lease=3)])
    assert e.value.code == "limit"
    s = cuda_session(FakeDriver(world), max_peer_bytes=6000)
    receive(s, [cuda_desc(handles[0], alloc_id=1, lease=1)])
    with pytest.raises(ProtocolError, match="max_peer_bytes = 6000"):
        receive(s, [cuda_desc(handles[1], alloc_id=2, lease=2)])


def test_retire_drops_the_mapping_once_no_tensor_uses_it() -> None:
    world = World()
    h, _ = world.export(4096)
    drv = FakeDriver(world)
    s = cuda_session(drv)
    [a] = receive(s, [cuda_desc(h, lease=1)])
    RpcSession(s).on_frame(
        Frame(
            CONTROL, {"channel": "cuda-ipc", "body": {"retire": [7]}}, bytearray(), []
        )
    )
    assert drv.closed == []
    del a
    gc.collect()
    assert drv.closed == [h]
    RpcSession(s).on_frame(
        Frame(
            CONTROL,
            {"channel": "cuda-ipc", "body": {"retire": [99]}},
            bytearray(),
            [],
        )
    )


# ---- sending ------------------------------------------------------------------------------


def test_alloc_sends_without_a_copy_and_releases_wait_on_the_event() -> None:
    drv = FakeDriver(World())
    s = cuda_session(drv)
    a = s.alloc_cuda((4,), np.dtype(np.float32), "cuda:1")
    assert isinstance(a, FakeDeviceArray)
    a.host[:] = [1.0, 2.0, 3.0, 4.0]
    _, [d] = sent_descs(s, [a])
    assert d["meta"] == {"dtype": "f32", "shape": [4], "device": "cuda:1"}
    loc = d["data"]["cuda_ipc"]
    assert loc["device_uuid"] == UUID1 and drv.copies == 0
    [(ptr, (dev, buf))] = drv.mallocs.items()
    assert dev == 1 and base64.b64decode(loc["mem_handle"]) == drv.mem_handle(1, ptr)
    assert loc["offset"] + address(buf) == address(a.host)
    assert loc["len"] == 16 and loc["alloc_size"] == buf.size
    lease = loc["lease"]
    assert drv.records == [1]
    release = {"release": [lease], "device": UUID1, "event": EVENT}
    RpcSession(s).on_frame(
        Frame(CONTROL, {"channel": "cuda-ipc", "body": release}, bytearray(), [])
    )
    assert drv.waits[-1] == (
        1,
        b"\x01" * 64,
    )  # reuse ordered after the server's last use
    assert s.cuda is not None and s.cuda.granted == {}
    with pytest.raises(ProtocolError, match="not granted"):
        RpcSession(s).on_frame(
            Frame(CONTROL, {"channel": "cuda-ipc", "body": release}, bytearray(), [])
        )


def test_other_cuda_arrays_are_copied_once_into_the_pool() -> None:
    drv = FakeDriver(World())
    s = cuda_session(drv)
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    src = FakeCudaArray(host.T, stream=77)  # strided, on the caller's own stream
    _, [d] = sent_descs(s, [src])
    assert drv.copies == 1 and drv.after == [(0, 77)]
    assert d["meta"]["shape"] == [4, 3] and "strides" not in d["meta"]
    loc = d["data"]["cuda_ipc"]
    [(ptr, (_, buf))] = drv.mallocs.items()
    off, n = int(loc["offset"]), int(loc["len"])
    got = buf[off : off + n].view(np.float32).reshape(4, 3)
    assert (got == host.T).all()
    # The slot is the lease's alone: released, it is reused by the next copy.
    assert s.cuda is not None
    lease = loc["lease"]
    s.cuda.control({"release": [lease], "device": UUID0, "event": EVENT})
    _, [d2] = sent_descs(s, [FakeCudaArray(host)])
    assert d2["data"]["cuda_ipc"]["offset"] == loc["offset"]


def test_server_memory_goes_back_by_reference_and_returns_view_own_memory() -> None:
    world = World()
    h, _ = world.export(4096)
    drv = FakeDriver(world)
    s = cuda_session(drv)
    [a] = receive(s, [cuda_desc(h, lease=4, shape=[4], length=16)])
    _, [d] = sent_descs(s, [a[1:3]])
    assert d["data"] == {
        "cuda_ipc_return": {
            "lease": 4,
            "offset": 4,
            "len": 8,
            "event_handle": b64(bytes([0xE0]) * 64),
        }
    }
    # The server sends this side's own memory back: a view of it, after its event.
    own = s.alloc_cuda((4,), np.dtype(np.float32), "cuda:0")
    _, [mine] = sent_descs(s, [own])
    lease = mine["data"]["cuda_ipc"]["lease"]
    ret = {
        "meta": {"dtype": "f32", "shape": [2], "device": "cuda:0"},
        "data": {
            "cuda_ipc_return": {
                "lease": lease,
                "offset": 8,
                "len": 8,
                "event_handle": EVENT,
            }
        },
    }
    [back] = receive(s, [ret])
    assert address(back.host) == address(own.host) + 8
    for bad, text in (
        ({"lease": 999}, "was never granted"),
        ({"offset": 12}, "outside lease"),
        ({"len": "8"}, "len: expected an integer"),
        ({"offset": 2**53}, "offset: expected an integer in 0..=9007199254740991"),
        ({"extra": 1}, "malformed cuda_ipc_return"),
    ):
        r = json.loads(json.dumps(ret))
        r["data"]["cuda_ipc_return"].update(bad)
        with pytest.raises(ProtocolError, match=text):
            receive(s, [r])


@pytest.mark.parametrize(
    "body,text",
    [
        (
            {"release": [1], "device": UUID0},
            "needs a valid `device` UUID and an `event`",
        ),
        ({"release": [1], "event": EVENT}, "needs a valid `device`"),
        ({"release": [1], "device": "GPU-99", "event": EVENT}, "not visible"),
        ({"release": [12345], "device": UUID0, "event": EVENT}, "not granted"),
        ({"release": [1], "device": UUID0, "event": "short"}, "expected base64"),
        ({"free": [1]}, "unknown control fields"),
        ({"retire": "7"}, "must be a list"),
        ({"retire": ["7"]}, "retire: expected an integer"),
        ({"retire": [2**53]}, "retire: expected an integer in 0..=9007199254740991"),
        (
            {"release": [2**53], "device": UUID0, "event": EVENT},
            "release: expected an integer in 0..=9007199254740991",
        ),
        ({}, "malformed control body"),
        ([], "malformed control body"),
    ],
)
def test_hostile_control_bodies(body: object, text: str) -> None:
    s = cuda_session(FakeDriver(World()))
    with pytest.raises(ProtocolError, match=text):
        RpcSession(s).on_frame(
            Frame(CONTROL, {"channel": "cuda-ipc", "body": body}, bytearray(), [])
        )


def test_a_release_is_all_or_nothing() -> None:
    s = cuda_session(FakeDriver(World()))
    a = s.alloc_cuda((4,), np.dtype(np.float32), "cuda:0")
    _, [d] = sent_descs(s, [a])
    lease = d["data"]["cuda_ipc"]["lease"]
    with pytest.raises(ProtocolError, match="not granted"):
        RpcSession(s).on_frame(
            Frame(
                CONTROL,
                {
                    "channel": "cuda-ipc",
                    "body": {"release": [lease, 999], "device": UUID0, "event": EVENT},
                },
                bytearray(),
                [],
            )
        )
    assert s.cuda is not None and lease in s.cuda.granted


def test_pool_limit_is_a_named_error() -> None:
    s = cuda_session(FakeDriver(World()), cuda_pool_limit=8 << 20)
    with pytest.raises(LimitError, match="cuda_pool_limit"):
        s.alloc_cuda((16 << 20,), np.dtype(np.uint8), "cuda:0")
    with pytest.raises(CudaUnavailable, match="cuda:5 is not a usable device"):
        s.alloc_cuda((4,), np.dtype(np.uint8), "cuda:5")
    with pytest.raises(ValueError, match="cuda:N"):
        s.alloc_cuda((4,), np.dtype(np.uint8), "gpu0")


# ---- closing ------------------------------------------------------------------------------


def test_close_orphans_held_tensors_and_keeps_them_mapped() -> None:
    world = World()
    h, _ = world.export(4096)
    drv = FakeDriver(world)
    s = cuda_session(drv)
    [a] = receive(s, [cuda_desc(h, lease=1)])
    own = s.alloc_cuda((4,), np.dtype(np.float32), "cuda:0")
    sent_descs(s, [own])
    assert not is_orphaned(a)
    s.close_channels()
    assert is_orphaned(a) and not is_orphaned(own)
    assert drv.events == {}  # the server's events are closed
    assert drv.closed == []  # the mapping stays while `a` lives
    assert s.cuda is not None and s.cuda.granted == {}
    with pytest.raises(CudaUnavailable, match="closed"):
        sent_descs(s, [a])
    del a
    gc.collect()
    assert drv.closed == [h]


# ---- without cupy --------------------------------------------------------------------------


def test_uuids_format_like_nvidia_smi() -> None:
    raw = bytes.fromhex("123456789abcdef0123456789abcdef0")
    assert format_uuid(raw) == "GPU-12345678-9abc-def0-1234-56789abcdef0"


def test_the_offer_names_pid_namespace_and_devices() -> None:
    s = Session(
        shm=False,
        token=None,
        agent="t",
        limits=Limits(),
        pool_limit=1,
        max_peer_bytes=1,
        cuda=FakeDriver(World()),
    )
    hello = json.loads(s.hello()[len(PREAMBLE) + 16 :])
    [offer] = [c for c in hello["channels"] if c["name"] == "cuda-ipc"]
    d = offer["domain"]
    assert d["pid"] == str(os.getpid()) and d["uuids"] == f"{UUID0},{UUID1}"
    assert d["pid_ns"] == os.readlink("/proc/self/ns/pid") and d["boot_id"]
    with pytest.raises(ProtocolError, match="not offered"):
        plain = Session(
            shm=False,
            token=None,
            agent="t",
            limits=Limits(),
            pool_limit=1,
            max_peer_bytes=1,
        )
        plain.hello()
        w = {"version": 1, "channels": {"cpu": "inline", "cuda": "cuda-ipc"}}
        plain.on_handshake(Frame(WELCOME, w, bytearray(), []))


def test_without_cupy_the_errors_name_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    with pytest.raises(CudaUnavailable, match="pip install cupy-cuda12x"):
        make_driver(True)
    assert make_driver(False)[0] is None
    driver, why = make_driver(None)
    assert driver is None and why  # auto: not offered, and the reason is kept


def test_without_cupy_a_real_connection_says_so(
    conformance: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = conformance
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(CudaUnavailable, match="`cupy` package"):
        Client.connect(server.addr, cuda=True)
    with pytest.raises(
        CudaUnavailable, match="`cupy` package"
    ):  # generated clients too
        ConformanceClient.connect(server.addr, cuda=True)
    with ConformanceClient.connect(server.addr, busy_poll_us=0, cuda=False) as gen:
        assert gen.client._spin == 0.0 and gen.client.channel == "shm"
    with Client.connect(server.addr) as c:  # the default: no CUDA, no error
        ok = np.arange(3, dtype=np.float32)
        assert (c.call("echo", {"tensor": ok}) == ok).all()
        dev = FakeCudaArray(np.zeros(4, dtype=np.float32))
        with pytest.raises(CudaUnavailable, match="cannot send a CUDA tensor"):
            c.call("echo", {"tensor": dev})
        with pytest.raises(CudaUnavailable, match="cannot allocate on cuda:0"):
            c.alloc([4], "f32", device="cuda:0")
        assert (c.call("echo", {"tensor": ok}) == ok).all()  # still fine
        # The server's CUDA tensors need the channel too: a typed error, not a hang.
        with pytest.raises(RpcError, match="no channel was negotiated for Cuda"):
            c.call("make_cuda", {"dtype": "f32", "shape": [4]})
    with Pipe.connect(server.addr, cuda=False) as p:
        with pytest.raises(CudaUnavailable, match="cuda=False"):
            p.send({}, [FakeCudaArray(np.zeros(4, dtype=np.float32))])


def test_missing_cupy_hint_names_the_install_command() -> None:
    assert "pip install cupy-cuda12x" in CUPY_HINT and "cupy" in CUPY_HINT


# ---- review fixes: dtype kept, empty arrays, foreign orphans, failed releases ------------


def test_bf16_goes_back_as_bf16() -> None:
    world = World()
    h, _ = world.export(4096)
    s = cuda_session(FakeDriver(world))
    [a] = receive(s, [cuda_desc(h, dtype="bf16", length=8, lease=1)])
    from ferry_client._cuda import cuda_array
    from ferry_client._cuda_channel import dtype_of

    cu = cuda_array(a)
    assert cu is not None and dtype_of(cu) == "bf16"  # not the u16 the interface says
    own = s.alloc_cuda(
        (4,), np.dtype(np.uint16, metadata={"ferry_dtype": "bf16"}), "cuda:0"
    )
    cu = cuda_array(own)
    assert cu is not None and dtype_of(cu) == "bf16"
    plain = cuda_array(FakeCudaArray(np.zeros(4, dtype=np.uint16)))
    assert plain is not None and dtype_of(plain) == "u16"


def test_empty_cuda_arrays_are_sent_without_asking_the_driver_for_pointer_0() -> None:
    drv = FakeDriver(World())
    s = cuda_session(drv)

    class Dev:
        id = 1

    empty = FakeCudaArray(np.zeros((0, 3), dtype=np.float32))
    empty.__cuda_array_interface__["data"] = (0, False)
    empty.device = Dev()  # type: ignore[attr-defined]
    _, [d] = sent_descs(s, [empty])
    assert d["meta"] == {"dtype": "f32", "shape": [0, 3], "device": "cuda:1"}
    assert d["data"]["cuda_ipc"]["len"] == 0


def test_an_orphan_cannot_be_sent_on_another_connection_either() -> None:
    world = World()
    h, _ = world.export(4096)
    drv = FakeDriver(world)
    first, second = cuda_session(drv), cuda_session(drv)
    [a] = receive(first, [cuda_desc(h, lease=1)])
    first.close_channels()
    with pytest.raises(CudaUnavailable, match="connection that has closed"):
        sent_descs(second, [a])
    assert drv.copies == 0


def test_releases_stay_queued_when_the_event_cannot_be_recorded() -> None:
    world = World()
    h, _ = world.export(4096)
    drv = FakeDriver(world)
    s = cuda_session(drv)
    [a] = receive(s, [cuda_desc(h, lease=3)])
    del a
    gc.collect()
    real = drv.record

    def broken(dev: int) -> bytes:
        raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")

    drv.record = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        s.releases()
    drv.record = real  # type: ignore[method-assign]
    body = json.loads(s.releases()[16:])
    assert body["body"]["release"] == [3]


def test_a_returned_tensor_names_its_own_lease() -> None:
    world = World()
    h, _ = world.export(4096)
    s = cuda_session(FakeDriver(world))
    # Two leases on the same bytes (the server sent one tensor twice).
    [a, b] = receive(s, [cuda_desc(h, lease=1), cuda_desc(h, lease=2)])
    _, [d] = sent_descs(s, [b])
    assert d["data"]["cuda_ipc_return"]["lease"] == 2
    _, [d] = sent_descs(s, [a])
    assert d["data"]["cuda_ipc_return"]["lease"] == 1
