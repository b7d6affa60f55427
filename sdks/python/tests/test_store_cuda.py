"""GPU bundles in the Python store reader (PROTOCOL.md section 20) without a GPU: a
`store.open` answer whose buckets travel over the cuda-ipc channel (section 17) is decoded
by a session on the in-memory fake driver (`fake_cuda`), and each tensor must be a view of
its mapped bucket (pointer = bucket base + offset, its dtype, its shape, no copy) that
holds the bucket's lease. The same reader on CuPy and torch with a real GPU is in
`test_store_cuda_gpu.py`."""

from __future__ import annotations

import base64
import gc
import json
import sys
import types
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from fake_cuda import FakeCudaArray, FakeDeviceArray, FakeDriver, World, address
from ferry_client import Bundle, ResultError
from ferry_client._rpc import RpcSession
from ferry_client._session import Session
from ferry_client._wire import MESSAGE, Frame
from ferry_client.store import _bundle
from test_cuda import cuda_desc, cuda_session

Entry = tuple[str, str, list[int], int, int]
"""A manifest entry: name, dtype, shape, bucket, byte offset."""

ENTRIES: list[Entry] = [
    ("w", "f32", [4, 8], 0, 0),
    ("b", "f16", [3], 0, 128),
    ("norm", "bf16", [2, 2], 0, 136),
    ("step", "i64", [], 0, 144),
    ("fp8", "f8e4m3fn", [5], 1, 0),
    ("z", "c64", [2], 1, 8),
    ("empty", "f32", [0, 3], 1, 24),
]
SIZES = [4096, 64]


def columns(entries: list[Entry]) -> dict[str, npt.NDArray[Any]]:
    """The manifest columns `store.open` answers (PROTOCOL.md section 20)."""

    def text(lines: list[str]) -> npt.NDArray[np.uint8]:
        return np.frombuffer("\n".join(lines).encode(), dtype=np.uint8)

    return {
        "names": text([e[0] for e in entries]),
        "dtypes": text([e[1] for e in entries]),
        "table": np.array(
            [[e[3], e[4], len(e[2])] for e in entries], dtype=np.uint64
        ).reshape(-1, 3),
        "dims": np.array([d for e in entries for d in e[2]], dtype=np.uint64),
    }


def opened(buckets: list[Any], entries: list[Entry]) -> dict[str, Any]:
    """A `store.open` result (as the client has it once decoded)."""
    return {
        "name": "gpu",
        "version": 3,
        "digest": None,
        "metadata": {"step": 7},
        "bytes": 0,
        "published_ms": 0,
        "buckets": buckets,
        "manifest": columns(entries),
    }


def values(dtype: str, shape: list[int], seed: int) -> npt.NDArray[Any]:
    """Test values of a ferry dtype, as the numpy dtype holding them."""
    n = int(np.prod(shape)) if shape else 1
    x = np.arange(seed, seed + n, dtype=np.float64).reshape(shape) / 4
    if dtype == "bf16":
        return x.astype(ml_dtypes.bfloat16)
    if dtype == "f8e4m3fn":
        return x.astype(ml_dtypes.float8_e4m3fn)
    return x.astype({"f32": "<f4", "f16": "<f2", "i64": "<i8", "c64": "<c8"}[dtype])


def fill(bufs: Sequence[npt.NDArray[np.uint8]]) -> dict[str, npt.NDArray[Any]]:
    """Writes every entry's values into the server's buckets; returns them by name."""
    out = {}
    for i, (name, dtype, shape, bucket, offset) in enumerate(ENTRIES):
        v = values(dtype, shape, 10 * i)
        bufs[bucket][offset : offset + v.nbytes] = v.reshape(-1).view(np.uint8)
        out[name] = v
    return out


class CupyLike(FakeDeviceArray):
    """A fake device array with what the store reader uses of a CuPy array: slicing,
    `view` and `reshape`, each a view of the same memory (as in CuPy)."""

    def __getitem__(self, key: Any) -> CupyLike:
        return CupyLike(self.host[key], self.dev)

    def view(self, dtype: Any) -> CupyLike:
        return CupyLike(self.host.view(dtype), self.dev)

    def reshape(self, shape: tuple[int, ...]) -> CupyLike:
        out = self.host.reshape(shape)
        assert np.shares_memory(out, self.host) or out.size == 0  # a view, never a copy
        return CupyLike(out, self.dev)

    @property
    def ptr(self) -> int:
        return int(self.__cuda_array_interface__["data"][0])


class CupyLikeDriver(FakeDriver):
    """The fake driver whose decoded arrays are `CupyLike` (the real driver's are CuPy)."""

    def wrap(self, *args: Any, **kw: Any) -> CupyLike:
        a = super().wrap(*args, **kw)
        return CupyLike(a.host, a.dev)


def store_open_message(descs: list[dict[str, Any]], entries: list[Entry]) -> Frame:
    """A `store.open` response whose buckets are the message's tensors `descs` and whose
    manifest columns are inline tensors (the answer's layout is the real one; how the
    columns travel does not matter to the reader)."""

    def inline(a: npt.NDArray[Any]) -> dict[str, Any]:
        dtype = {np.dtype(np.uint8): "u8", np.dtype(np.uint64): "u64"}[a.dtype]
        data = base64.b64encode(a.tobytes()).decode()
        return {"$tensor": {"dtype": dtype, "shape": list(a.shape), "data": data}}

    result = opened([{"$tensor": i} for i in range(len(descs))], entries)
    result["manifest"] = {k: inline(v) for k, v in result["manifest"].items()}
    body = {"header": {"jsonrpc": "2.0", "id": 1, "result": result}, "tensors": descs}
    return Frame(MESSAGE, json.loads(json.dumps(body)), bytearray(), [])


def gpu_bundle(
    as_torch: bool = False,
) -> tuple[Bundle, Session, CupyLikeDriver, list[npt.NDArray[np.uint8]]]:
    """A session on the fake driver that received a `store.open` answer of a GPU bundle
    (buckets `SIZES`, tensors `ENTRIES`, filled by `fill`), and the bundle read from it;
    also the server's bucket memory."""
    world = World()
    exported = [world.export(n) for n in SIZES]
    drv = CupyLikeDriver(world)
    s = cuda_session(drv)
    descs = [
        cuda_desc(
            h,
            alloc_id=10 + i,
            alloc_size=n,
            length=n,
            lease=100 + i,
            dtype="u8",
            shape=[n],
        )
        for i, ((h, _), n) in enumerate(zip(exported, SIZES))
    ]
    [(rid, result)] = RpcSession(s).on_frame(store_open_message(descs, ENTRIES))
    assert rid == 1
    return _bundle(result, as_torch), s, drv, [buf for _, buf in exported]


def test_a_gpu_bundle_opens_as_views_of_its_mapped_buckets() -> None:
    b, _, drv, bufs = gpu_bundle()
    want = fill(bufs)
    assert (b.name, b.version, b.metadata) == ("gpu", 3, {"step": 7})
    assert list(b) == [e[0] for e in ENTRIES]
    assert drv.open_count == 2  # one mapping per bucket
    for name, dtype, shape, bucket, offset in ENTRIES:
        t = b[name]
        assert isinstance(t, CupyLike), name
        if t.host.size:  # (a view of no bytes has no address to check)
            assert t.ptr == address(bufs[bucket]) + offset, name  # a view: no copy
        assert t.host.shape == tuple(shape), name
        # CuPy lacks bf16 and the float8s: their raw bits, as the channel decodes them
        plain = {"bf16": np.uint16, "f8e4m3fn": np.uint8}.get(dtype)
        assert t.host.dtype == (plain or want[name].dtype), name
        assert t.host.dtype.metadata is None, name  # (CuPy takes no tagged dtypes)
        v = want[name]
        assert np.array_equal(t.host, v.view(plain) if plain else v), name
        assert b[name] is t  # made once
    assert drv.copies == 0
    bufs[0][:4] = np.frombuffer(np.float32(42.0).tobytes(), np.uint8)
    assert b["w"].host[0, 0] == 42.0  # the server's memory itself


def test_a_tensor_holds_its_buckets_lease_and_nothing_else() -> None:
    b, s, _, bufs = gpu_bundle()
    fill(bufs)
    w, fp8 = b["w"], b["fp8"]
    del b
    gc.collect()
    assert s.releases() == b""  # each bucket still viewed
    del fp8
    gc.collect()
    body = json.loads(s.releases()[16:])
    assert body["body"]["release"] == [101]
    assert float(w.host[1, 0]) == 2.0  # still mapped
    del w
    gc.collect()
    assert json.loads(s.releases()[16:])["body"]["release"] == [100]


def test_as_torch_goes_through_dlpack_and_views_the_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`as_torch=True` on device buckets: `torch.from_dlpack` of the CuPy view (the
    integer type of the bits for bf16 and the float8s, then `.view(torch.<dtype>)`). torch
    is a stand-in here: a real one needs a GPU (test_store_cuda_gpu.py)."""

    class Tensor:
        def __init__(self, src: CupyLike, dtype: object) -> None:
            self.src, self.dtype = src, dtype

        def view(self, dtype: object) -> Tensor:
            return Tensor(self.src, dtype)

    torch = types.ModuleType("torch")
    torch.from_dlpack = lambda a: Tensor(a, str(a.host.dtype))  # type: ignore[attr-defined]
    for name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        setattr(torch, name, f"torch.{name}")
    monkeypatch.setitem(sys.modules, "torch", torch)
    b, _, _, bufs = gpu_bundle(as_torch=True)
    want = {
        "w": "float32",
        "b": "float16",
        "norm": "torch.bfloat16",
        "step": "int64",
        "fp8": "torch.float8_e4m3fn",
        "z": "complex64",
        "empty": "float32",
    }
    for name, _, shape, bucket, offset in ENTRIES:
        t = b[name]
        assert isinstance(t, Tensor)
        assert t.dtype == want[name], name
        if t.src.host.size:
            assert t.src.ptr == address(bufs[bucket]) + offset, name
        assert t.src.host.shape == tuple(shape), name
    # torch.from_dlpack takes int16, not uint16, before torch 2.3: the bits go as int16
    assert b["norm"].src.host.dtype == np.int16
    assert b["fp8"].src.host.dtype == np.uint8


def test_host_and_device_buckets_each_give_their_kind() -> None:
    b, _, _, bufs = gpu_bundle()
    host = np.zeros(64, dtype=np.uint8)
    host[:8] = np.arange(2, dtype=np.float32).view(np.uint8)
    result = opened(
        [host, b._buckets[1]], [("h", "f32", [2], 0, 0), ("d", "u8", [3], 1, 5)]
    )
    mixed = _bundle(result, False)
    assert isinstance(mixed["h"], np.ndarray) and mixed["h"].tolist() == [0.0, 1.0]
    assert isinstance(mixed["d"], CupyLike)
    assert mixed["d"].ptr == address(bufs[1]) + 5


@pytest.mark.parametrize(
    "bucket,text",
    [
        ([0, 1], "bucket 0 is a list: neither a u8 vector in host memory"),
        ("abc", "bucket 0 is a str: neither"),
        ({"$tensor": 0}, "bucket 0 is a dict: neither"),
        (
            np.zeros(4, dtype=np.float32),
            "bucket 0 is a float32 array .* not a u8 vector",
        ),
        (np.zeros((2, 2), dtype=np.uint8), r"shape \(2, 2\), not a u8 vector"),
        (
            FakeCudaArray(np.zeros(4, dtype=np.float32)),
            "bucket 0 is a device array of float32",
        ),
        (
            FakeCudaArray(np.zeros(8, dtype=np.uint8)[::2]),
            r"device array of uint8 and shape \(4,\) \(strided\)",
        ),
    ],
)
def test_a_bucket_that_is_neither_is_a_clear_error(bucket: object, text: str) -> None:
    with pytest.raises(ResultError, match=text):
        _bundle(opened([bucket], [("x", "u8", [1], 0, 0)]), False)


@pytest.mark.parametrize(
    "entry,text",
    [
        (("x", "f32", [16], 1, 8), "'x' lies outside bucket 1"),
        (("x", "u8", [1], 1, 64), "'x' lies outside bucket 1"),
        (("x", "f32", [2], 5, 0), "bad manifest entry for 'x'"),
        (("x", "f99", [2], 0, 0), "bad manifest entry for 'x'"),
        (("x", "f32", [2], 1, 6), "'x' at byte 6 of device bucket 1 is not aligned"),
    ],
)
def test_a_manifest_entry_outside_a_device_bucket_fails_on_lookup(
    entry: Entry, text: str
) -> None:
    b, _, _, _ = gpu_bundle()
    bad = _bundle(opened(b._buckets, [entry, ("ok", "u8", [64], 1, 0)]), False)
    assert isinstance(bad["ok"], CupyLike)
    with pytest.raises(ResultError, match=text):
        bad["x"]
