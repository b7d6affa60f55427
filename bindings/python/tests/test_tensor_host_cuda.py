"""`ferry.ray`'s `TensorHost` with CUDA tensors (`put_device`), on the simulated GPU
(`tests/fake_cuda.py`): a peer whose pipe negotiated cuda-ipc maps a copy made on the
device, a peer without it gets the bytes copied to the host, and freeing the id lets the
owner's memory go. The same path between Ray actors on a real GPU:
`tests/gpu/check_ray_cuda.py`.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from ferry import _native, _tensors
from tests.fake_cuda import FakeDeviceArray, read, simulated_gpu

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="TensorHost and shared memory are Linux-only"
)

WAIT = 30.0
"""Seconds any wait gives up after (a failure, never a measurement)."""


@pytest.fixture
def gpu() -> Iterator[Any]:
    yield from simulated_gpu()


def host_on(proc: Any) -> _native.TensorHost:
    """A host whose channels are simulated process `proc`'s."""
    addr = f"unix:ferry-test-dhost-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    proc.activate()
    try:
        return _native.TensorHost([addr])
    finally:
        _native._fake_cuda_deactivate()  # type: ignore[attr-defined]


def connect_as(proc: Any, addr: str) -> _native.Pipe:
    proc.activate()
    try:
        return _native.connect(addr)
    finally:
        _native._fake_cuda_deactivate()  # type: ignore[attr-defined]


def ask(p: _native.Pipe, obj_id: str) -> tuple[dict[str, Any], list[Any]]:
    p.send(json.dumps({"get": obj_id}), [], WAIT)
    m = p.recv(WAIT)
    return json.loads(m.header), list(m.tensors)


def test_a_peer_with_cuda_ipc_maps_a_device_copy_and_never_sees_the_host(gpu: Any) -> None:
    a, b = gpu.process(), gpu.process()
    h = host_on(a)
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = FakeDeviceArray(a, data)
    h.put_device("o1", [_tensors.device_out(x, None)])
    assert h.count == 1 and h.nbytes == data.nbytes
    p = connect_as(b, h.addresses[0])
    try:
        head, (got,) = ask(p, "o1")
        assert head == {"ok": "o1"}, "no host copy on a pipe with cuda-ipc"
        assert isinstance(got, _native.DeviceTensor) and got.received
        assert (got.dtype, list(got.shape)) == ("f32", [3, 4])
        np.testing.assert_array_equal(read(b, got), data)
        assert a.calls("cuMemcpyDtoH") == 0, "never through the host"
        assert a.calls("cuMemcpyDtoDAsync") == 1, "one copy, on the device"
        assert h.host_copies == (0, 0)
        del got
    finally:
        p.close()
    assert h.free("o1") and h.count == 0 and h.nbytes == 0
    h.close()
    x.free()


def test_a_peer_without_cuda_ipc_gets_a_host_copy_it_can_move_to_its_device(gpu: Any) -> None:
    a, b = gpu.process(), gpu.broken_process("libcuda.so.1 is not installed")
    h = host_on(a)
    f32 = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    i64 = np.arange(5, dtype=np.int64)
    xs = [FakeDeviceArray(a, f32), FakeDeviceArray(a, i64)]
    h.put_device("o2", [_tensors.device_out(x, None) for x in xs])
    p = connect_as(b, h.addresses[0])
    try:
        for _ in range(2):  # asked twice: copied twice, the same bytes
            head, got = ask(p, "o2")
            assert head == {"ok": "o2", "host_copy": True}
            assert [type(t) for t in got] == [_native.TensorRef, _native.TensorRef]
            np.testing.assert_array_equal(np.asarray(got[0]).view(np.float32).reshape(8, 8), f32)
            np.testing.assert_array_equal(np.asarray(got[1]).view(np.int64), i64)
        assert h.host_copies == (2, 2 * (f32.nbytes + i64.nbytes))
        assert a.calls("cuMemcpyDtoH") == 4
        head, got = ask(p, "gone")
        assert head == {"missing": "gone"} and got == []
    finally:
        p.close()
    h.close()
    for x in xs:
        x.free()


def test_freeing_the_id_lets_the_owners_memory_go(gpu: Any) -> None:
    a = gpu.process()
    h = host_on(a)

    class Owner:
        """Stands for a torch tensor: counts the holds on it."""

        def __init__(self) -> None:
            self.arr = FakeDeviceArray(a, np.ones(16, dtype=np.float32))

        @property
        def __cuda_array_interface__(self) -> dict[str, Any]:
            return self.arr.__cuda_array_interface__

        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 0)

    o = Owner()
    base = sys.getrefcount(o)
    h.put_device("o3", [_tensors.device_out(o, None)])
    gc.collect()
    assert sys.getrefcount(o) > base, "the host holds the owner while it holds the id"
    with pytest.raises(MemoryError, match="max_host_mib"):
        addr = f"unix:ferry-test-dhost-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        a.activate()
        try:
            small = _native.TensorHost([addr], max_bytes=32)
        finally:
            _native._fake_cuda_deactivate()  # type: ignore[attr-defined]
        small.put_device("big", [_tensors.device_out(o, None)])
    small.close()
    assert h.free("o3")
    gc.collect()
    assert sys.getrefcount(o) == base, "freeing the id let the owner go"
    h.close()
    o.arr.free()
