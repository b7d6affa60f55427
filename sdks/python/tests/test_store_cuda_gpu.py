"""GPU bundles in the Python store reader on a real GPU (CuPy, and torch where installed).

There is no JSON-RPC way to publish a GPU bundle yet (`store.publish` copies into host
buckets; device buckets come from `Store::publish_device` in Rust), so no `ferry serve`
answers `store.open` with device buckets. These tests check the reader at the Python
level instead: `store.open`-shaped answers whose buckets are CuPy arrays, first this
process's own memory, then memory of a real `ferry serve` mapped through the cuda-ipc
channel (`make_cuda` of the conformance API). Skipped where CuPy or a device is missing
(and the second where `ferry` lacks the `cuda-ipc` feature); `FERRY_REQUIRE_CUDA=1`
turns the skips into failures. Run as test_cuda_gpu.py says.
"""

from __future__ import annotations

import gc
import importlib
from typing import Any

import numpy as np
import numpy.typing as npt

from conftest import Server, need
from ferry_client.store import _bundle
from test_store_cuda import ENTRIES, SIZES, Entry, fill, opened

_BITS: dict[str, tuple[str, str, type]] = {
    "bf16": ("bfloat16", "int16", np.int16),
    "f8e4m3fn": ("float8_e4m3fn", "uint8", np.uint8),
}
"""Dtypes CuPy lacks: their torch dtype, and the torch and numpy integer types their bits
compare as."""


def _check(
    cp: Any,
    buckets: list[Any],
    entries: list[Entry],
    want: dict[str, npt.NDArray[Any]],
) -> None:
    """Every tensor of the bundle over `buckets` is a CuPy view of its bucket, and a CUDA
    torch tensor over the same memory with `as_torch=True`, holding `want`."""
    b = _bundle(opened(buckets, entries), False)
    for name, dtype, shape, bucket, offset in entries:
        t = b[name]
        assert isinstance(t, cp.ndarray), name
        assert t.shape == tuple(shape), name
        if t.size:
            assert t.data.ptr == buckets[bucket].data.ptr + offset, name
        bits = _BITS.get(dtype)
        v = want[name]
        plain = v.view(np.uint16 if dtype == "bf16" else np.uint8) if bits else v
        assert t.dtype == plain.dtype, name
        assert np.array_equal(cp.asnumpy(t), plain), name
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return
    tb = _bundle(opened(buckets, entries), True)
    for name, dtype, shape, bucket, offset in entries:
        t = tb[name]
        assert t.is_cuda and tuple(t.shape) == tuple(shape), name
        if t.numel():
            assert t.data_ptr() == buckets[bucket].data.ptr + offset, name
        bits = _BITS.get(dtype)
        v = want[name]
        got = t.cpu()
        if bits:
            assert t.dtype == getattr(torch, bits[0]), name
            got, v = got.view(getattr(torch, bits[1])), v.view(bits[2])
        assert np.array_equal(got.numpy(), v), name


def test_a_gpu_bundle_opens_as_cupy_and_torch_views(cp: Any) -> None:
    host = [np.zeros(n, dtype=np.uint8) for n in SIZES]
    want = fill(host)
    buckets = [cp.asarray(h) for h in host]
    _check(cp, buckets, ENTRIES, want)


def test_a_bucket_mapped_from_a_server_opens_in_place(
    cp: Any, conformance: Server
) -> None:
    """A bucket of a real server's device memory (mapped through cuda-ipc, leased): the
    tensors view it, and one still held keeps it after the bucket and bundle are gone."""
    from ferry_client.generated.conformance import ConformanceClient

    with ConformanceClient.connect(conformance.addr, cuda=True) as c:
        if c.client.welcome.get("channels", {}).get("cuda") != "cuda-ipc":
            need("the ferry binary was built without the cuda-ipc feature")
        host = c.make("u8", [4096])
        bucket = c.make_cuda("u8", [4096])
        assert isinstance(bucket, cp.ndarray)
        entries: list[Entry] = [
            ("a", "f32", [4, 8], 0, 0),
            ("b", "bf16", [3], 0, 128),
            ("c", "u8", [2, 5], 0, 1000),
        ]
        want: dict[str, npt.NDArray[Any]] = {
            "a": host[0:128].view(np.float32).reshape(4, 8),
            "b": host[128:134].view(np.uint16),
            "c": host[1000:1010].reshape(2, 5),
        }
        _check(cp, [bucket], entries, want)
        b = _bundle(opened([bucket], entries), False)
        kept = b["c"]
        del b, bucket
        gc.collect()
        c.client.flush_releases()
        assert np.array_equal(cp.asnumpy(kept), want["c"])
        del kept
        gc.collect()
        c.client.flush_releases()
