"""CUDA tensors through `ferry.Pipe` over the cuda-ipc channel, on a simulated GPU.

The two ends of each pipe are two simulated processes of one simulated GPU
(`tests/fake_cuda.py`: the in-memory CUDA driver of ferry-cuda-ipc, in the `__testing`
build of `ferry._native`), over a real unix socket and the real handshake, channel,
leases and handle cache: what runs on a GPU, minus the GPU. What only a GPU shows (torch
and CuPy on real mappings, two real processes, streams) is `tests/gpu/check_cuda.py`.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ferry
from tests.conftest import WAIT, wait_until
from tests.fake_cuda import FakeDeviceArray, pipe_pair, read, simulated_gpu


@pytest.fixture
def gpu() -> Iterator[Any]:
    yield from simulated_gpu()


class ViewOf:
    """Another library's array over the memory of a `DeviceTensor` (as
    `cupy.asarray(t)` would be): the same `__cuda_array_interface__`."""

    def __init__(self, t: ferry.DeviceTensor) -> None:
        self._cai = dict(t.__cuda_array_interface__)
        self._dev = t.__dlpack_device__()

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._cai

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._dev


def leases(p: ferry.Pipe) -> int:
    """Leases on `p`'s side's device memory the peer holds."""
    return int(p.stats()["cuda-ipc"]["leases_granted"])


def test_a_cuda_array_travels_over_cuda_ipc_without_a_host_copy(gpu: Any) -> None:
    a, b = gpu.process(), gpu.process()
    with pipe_pair(a, b) as (tx, rx):
        assert tx.device_channel == rx.device_channel == "cuda-ipc"
        data = np.arange(20, dtype=np.float32).reshape(4, 5)
        x = FakeDeviceArray(a, data)
        tx.send({"n": 1}, [x, np.arange(3)], timeout=WAIT)
        header, (got, host) = rx.recv(WAIT)
        assert header == {"n": 1}
        assert isinstance(got, ferry.DeviceTensor) and got.received and not got.orphaned
        assert (got.device, got.device_index, got.dtype, got.shape) == ("cuda:0", 0, "f32", [4, 5])
        assert got.nbytes == 80 and got.strides is None
        # Never through the host: no device-to-host copy on either side (before this
        # test's own read below); one copy on the device, into the channel's exportable
        # pool (the array is the user's memory).
        assert a.calls("cuMemcpyDtoH") == 0 and b.calls("cuMemcpyDtoH") == 0
        np.testing.assert_array_equal(read(b, got), data)
        np.testing.assert_array_equal(host, np.arange(3))
        assert a.calls("cuMemcpyDtoDAsync") == 1
        assert tx.stats()["cuda-ipc"]["copies_in"] == 1
        assert b.open_imports == 1, "the receiver mapped the sender's allocation"
        x.free()


def test_alloc_device_is_lent_without_a_copy(gpu: Any) -> None:
    """A tensor from `alloc_device` (or another library's view of it) is sent without any
    copy: the receiver maps the very memory the sender wrote (a write the sender makes
    afterwards, breaking the contract on purpose, shows through the receiver's mapping)."""
    a, b = gpu.process(), gpu.process()
    with pipe_pair(a, b) as (tx, rx):
        t = tx.alloc_device((2, 3), "i32")
        assert isinstance(t, ferry.DeviceTensor) and not t.received
        assert (t.device, t.dtype, t.shape, t.nbytes) == ("cuda:0", "i32", [2, 3], 24)
        a.write(t.data_ptr, np.arange(6, dtype=np.int32).tobytes())
        tx.send(None, [t])
        _, (got,) = rx.recv(WAIT)
        np.testing.assert_array_equal(read(b, got), np.arange(6).reshape(2, 3))
        assert tx.stats()["cuda-ipc"]["copies_in"] == 0
        assert a.calls("cuMemcpyDtoDAsync") == 0
        a.write(t.data_ptr, np.full(6, 7, dtype=np.int32).tobytes())
        np.testing.assert_array_equal(read(b, got), np.full((2, 3), 7))
        # Another library's array over it is recognised as the allocation: no copy.
        tx.send(None, [ViewOf(t)])
        _, (again,) = rx.recv(WAIT)
        np.testing.assert_array_equal(read(b, again), np.full((2, 3), 7))
        assert tx.stats()["cuda-ipc"]["copies_in"] == 0


# The C structs of dlpack.h, to read a capsule as a consumer (torch, CuPy) does.
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_set_name = ctypes.pythonapi.PyCapsule_SetName
_set_name.restype = ctypes.c_int
_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]
_USED = b"used_dltensor"
"""The name a consumer gives a capsule it took (kept alive here: the capsule points at it)."""


def _consume(capsule: Any) -> dict[str, Any]:
    """What a DLPack consumer sees in `capsule`; takes it (renames it) and, as the consumer
    does once done with the memory, calls its deleter."""
    ptr = _get_pointer(capsule, b"dltensor")
    m = _DLManagedTensor.from_address(ptr)
    t = m.dl_tensor
    seen = {
        "data": t.data or 0,
        "device": (t.device.device_type, t.device.device_id),
        "dtype": (t.dtype.code, t.dtype.bits, t.dtype.lanes),
        "shape": [t.shape[i] for i in range(t.ndim)],
        "strides": None if not t.strides else [t.strides[i] for i in range(t.ndim)],
        "byte_offset": t.byte_offset,
    }
    assert _set_name(capsule, _USED) == 0
    m.deleter(ctypes.cast(ptr, ctypes.POINTER(_DLManagedTensor)))
    return seen


def test_a_received_device_tensor_is_a_cuda_array_and_a_dlpack_capsule(gpu: Any) -> None:
    a, b = gpu.process(), gpu.process()
    with pipe_pair(a, b) as (tx, rx):
        tx.send(None, [FakeDeviceArray(a, np.arange(6, dtype=np.float32).reshape(2, 3))])
        _, (got,) = rx.recv(WAIT)
        cai = got.__cuda_array_interface__
        assert cai == {
            "version": 3,
            "shape": (2, 3),
            "typestr": "<f4",
            "data": (got.data_ptr, False),
            "strides": None,
            "stream": 1,
        }
        assert got.__dlpack_device__() == (2, 0)
        seen = _consume(got.__dlpack__(stream=1, max_version=(1, 0)))
        assert seen == {
            "data": got.data_ptr,
            "device": (2, 0),
            "dtype": (2, 32, 1),
            "shape": [2, 3],
            "strides": None,
            "byte_offset": 0,
        }
        with pytest.raises(BufferError, match="dl_device"):
            got.__dlpack__(dl_device=(1, 0))
        with pytest.raises(BufferError, match="copy=True"):
            got.__dlpack__(copy=True)
        # Every ferry dtype has a DLPack type (float8: its bits, as uint8).
        for dtype, want in [
            ("bf16", (4, 16)),
            ("bool", (6, 8)),
            ("f8e4m3fn", (1, 8)),
            ("c64", (5, 64)),
        ]:
            t = tx.alloc_device((3,), dtype)
            assert _consume(t.__dlpack__())["dtype"] == (*want, 1), dtype


def test_a_received_tensor_is_released_when_its_last_holder_goes(gpu: Any) -> None:
    """The lease on the sender's memory ends when the receiver's last holder (here a
    DLPack capsule, as torch holds one) lets go; closing the pipe unmaps the allocation."""
    a, b = gpu.process(), gpu.process()
    with pipe_pair(a, b) as (tx, rx):
        tx.send(None, [FakeDeviceArray(a, np.ones(8, dtype=np.float32))])
        _, (got,) = rx.recv(WAIT)
        assert leases(tx) == 1
        capsule = got.__dlpack__()
        del got
        gc.collect()
        assert leases(tx) == 1, "the unconsumed capsule still holds the tensor"
        del capsule
        gc.collect()
        wait_until(lambda: leases(tx) == 0, "the lease to come back")
        # A consumed capsule holds it until the consumer's deleter runs.
        tx.send(None, [FakeDeviceArray(a, np.ones(8, dtype=np.float32))])
        _, (got,) = rx.recv(WAIT)
        _consume(got.__dlpack__())
        del got
        gc.collect()
        wait_until(lambda: leases(tx) == 0, "the second lease to come back")
        assert b.open_imports >= 1, "mappings are cached while the pipe lives"
    wait_until(lambda: b.open_imports == 0, "the receiver's mappings to close with the pipe")
    assert b.live_events == 0


def test_a_tensor_held_past_its_pipe_keeps_its_mapping_until_dropped(gpu: Any) -> None:
    a, b = gpu.process(), gpu.process()
    with pipe_pair(a, b) as (tx, rx):
        tx.send(None, [FakeDeviceArray(a, np.ones(4, dtype=np.float32))])
        _, (got,) = rx.recv(WAIT)
    assert got.orphaned
    with pytest.raises(BufferError, match="closed"):
        got.__cuda_array_interface__  # noqa: B018 - the getter raises
    with pytest.raises(BufferError, match="closed"):
        got.__dlpack__()
    assert b.open_imports == 1, "the mapping stays while the tensor lives"
    del got
    gc.collect()
    wait_until(lambda: b.open_imports == 0, "the mapping to close once the tensor is dropped")


def test_a_tensor_sent_back_is_the_senders_own_memory(gpu: Any) -> None:
    a, b = gpu.process(), gpu.process()
    with pipe_pair(a, b) as (tx, rx):
        t = tx.alloc_device((4,), "f32")
        a.write(t.data_ptr, np.arange(4, dtype=np.float32).tobytes())
        tx.send(None, [t])
        _, (got,) = rx.recv(WAIT)
        rx.send(None, [got])
        _, (back,) = tx.recv(WAIT)
        assert back.data_ptr == t.data_ptr, "its own pool memory, not a mapping of itself"
        np.testing.assert_array_equal(read(a, back), np.arange(4))
        assert rx.stats()["cuda-ipc"]["returns_sent"] == 1
        # Another library's view of a received tensor (what torch.from_dlpack(got) is)
        # goes back the same way: recognised, not copied.
        rx.send(None, [ViewOf(got)])
        _, (view_back,) = tx.recv(WAIT)
        assert view_back.data_ptr == t.data_ptr
        assert rx.stats()["cuda-ipc"]["returns_sent"] == 2
        assert rx.stats()["cuda-ipc"]["copies_in"] == 0
        assert a.open_imports == 0, "a process never opens its own handle"


def test_without_cuda_ipc_device_tensors_are_refused_not_copied_to_the_host(gpu: Any) -> None:
    a, b = gpu.process(), gpu.broken_process("libcuda.so.1 is not installed")
    with pipe_pair(a, b) as (tx, rx):
        assert tx.device_channel is None and rx.device_channel is None
        x = FakeDeviceArray(a, np.ones(4, dtype=np.float32))
        with pytest.raises(
            ferry.DeviceTensorError, match=r"cuda:0 tensor.*no channel for CUDA"
        ) as e:
            tx.send(None, [np.arange(2), x])
        assert isinstance(e.value, ferry.ParamsError), "a ParamsError, as for any unsendable value"
        assert ".cpu()" in str(e.value), "it says what to do"
        with pytest.raises(ferry.DeviceTensorError, match="no channel for CUDA"):
            tx.alloc_device((4,), "f32")
        assert a.calls("cuMemcpyDtoH") == 0 and a.calls("cuMemcpyDtoDAsync") == 0
        tx.send("still open", [np.arange(3)])
        header, (host,) = rx.recv(WAIT)
        assert header == "still open"
        np.testing.assert_array_equal(host, np.arange(3))


def test_dtypes_and_layouts_ferry_cannot_send_are_typed_errors(gpu: Any) -> None:
    a, b = gpu.process(), gpu.process()
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pipe_pair(a, b) as (tx, rx):
        refused = [
            (FakeDeviceArray(a, base, typestr=">f4"), "big-endian"),
            (FakeDeviceArray(a, base, typestr="|V4"), "no ferry dtype"),
            (FakeDeviceArray(a, base.view(np.int64)[:, :1], typestr="<m8"), "no ferry dtype"),
            (FakeDeviceArray(a, base, strides=(16, 2)), "whole"),
            (FakeDeviceArray(a, base, strides=(-16, 4)), "negative"),
            (FakeDeviceArray(a, base, mask=object()), "mask"),
        ]
        for x, needle in refused:
            with pytest.raises(ferry.DeviceTensorError, match=needle):
                tx.send(None, [x])
        assert leases(tx) == 0, "nothing was sent"
        # Strides of whole elements travel, and arrive as strides.
        column_major = FakeDeviceArray(a, base, strides=(4, 12))
        tx.send(None, [column_major])
        _, (got,) = rx.recv(WAIT)
        assert got.strides == [1, 3]
        assert got.__cuda_array_interface__["strides"] == (4, 12)
        want = np.lib.stride_tricks.as_strided(base.ravel(), shape=(3, 4), strides=(4, 12))
        np.testing.assert_array_equal(read(b, got), want)
