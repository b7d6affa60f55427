"""CUDA tensors between `ferry.Client` / `ferry.AsyncClient` and a Python-served
`ferry.App` over the cuda-ipc channel, on a simulated GPU.

The server and the client are two simulated processes of one simulated GPU
(`tests/fake_cuda.py`), the app served on a thread of this test process: params and
results travel as cuda-ipc descriptors (never through the host), the handler gets
`ferry.DeviceTensor`s, `Context.alloc_device` answers without a copy, and a caller without
cuda-ipc gets a typed error on either side. The same path between two real processes on a
GPU, with torch and CuPy, is `tests/gpu/check_cuda.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import ferry
from tests.conftest import WAIT
from tests.fake_cuda import (
    FakeDeviceArray,
    connect,
    deactivate,
    read,
    serving,
    simulated_gpu,
)

app = ferry.App("cuda-fake")
SERVER: dict[str, Any] = {}
"""The simulated process the app runs as (its driver reads and writes device memory)."""


@app.function
def describe(x: np.ndarray) -> dict[str, Any]:
    return {
        "type": type(x).__name__,
        "received": x.received,
        "device": x.device,
        "dtype": x.dtype,
        "shape": x.shape,
        "sum": float(read(SERVER["proc"], x).sum()),
    }


@app.function
def echo(x: np.ndarray) -> np.ndarray:
    return x


class _View:
    """Another library's view of a device tensor (what torch.as_tensor(x) is)."""

    def __init__(self, x: ferry.DeviceTensor) -> None:
        self.__cuda_array_interface__ = x.__cuda_array_interface__
        self._dev = x.__dlpack_device__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._dev


@app.function
def view_of(x: np.ndarray) -> Any:
    return _View(x)  # type: ignore[arg-type]


@app.function
def plus_one(x: np.ndarray, ctx: ferry.Context) -> Any:
    data = read(SERVER["proc"], x) + 1
    out = ctx.alloc_device(list(data.shape), "f32")
    SERVER["proc"].write(out.data_ptr, data.astype(np.float32).tobytes())
    return out


@app.function
def fresh(n: int) -> Any:
    """Another library's device array (what a CuPy result is): copied once, on the device."""
    return FakeDeviceArray(SERVER["proc"], np.arange(n, dtype=np.float32))


@app.function
def channel_of_caller(ctx: ferry.Context) -> str | None:
    return ctx.device_channel


@pytest.fixture
def gpu() -> Iterator[Any]:
    yield from simulated_gpu()


@pytest.fixture
def served(gpu: Any) -> Iterator[tuple[str, Any]]:
    """The app served as one simulated process; its address and the simulated GPU."""
    SERVER["proc"] = gpu.process()
    with serving(app, SERVER["proc"]) as addr:
        yield addr, gpu
    SERVER.clear()


def test_device_params_and_results_travel_over_cuda_ipc(served: tuple[str, Any]) -> None:
    addr, gpu = served
    me = gpu.process()
    with connect(addr, me) as c:
        assert c.device_channel == "cuda-ipc"
        assert c.call("channel_of_caller") == "cuda-ipc"
        x = FakeDeviceArray(me, np.arange(6, dtype=np.float32).reshape(2, 3))
        assert c.call("describe", {"x": x}) == {
            "type": "DeviceTensor",
            "received": True,
            "device": "cuda:0",
            "dtype": "f32",
            "shape": [2, 3],
            "sum": 15.0,
        }
        y = c.call("plus_one", {"x": x})
        assert isinstance(y, ferry.DeviceTensor) and y.received
        np.testing.assert_array_equal(read(me, y), np.arange(1, 7).reshape(2, 3))
        z = c.call("fresh", {"n": 5})
        np.testing.assert_array_equal(read(me, z), np.arange(5))
        assert me.calls("cuMemcpyDtoH") == 2, "only this test's own reads"
        assert SERVER["proc"].calls("cuMemcpyDtoH") == 2, "only the handlers' own reads"


def test_a_client_allocation_is_passed_without_a_copy(served: tuple[str, Any]) -> None:
    addr, gpu = served
    me = gpu.process()
    with connect(addr, me) as c:
        t = c.alloc_device((4,), "f32")
        me.write(t.data_ptr, np.full(4, 2, dtype=np.float32).tobytes())
        copies = me.calls("cuMemcpyDtoDAsync")
        assert c.call("describe", {"x": t})["sum"] == 8.0
        assert me.calls("cuMemcpyDtoDAsync") == copies, "lent, not copied"
        # A param the handler sends back (or a view of it) is the caller's own memory again.
        back = c.call("echo", {"x": t})
        assert back.data_ptr == t.data_ptr
        server_copies = SERVER["proc"].calls("cuMemcpyDtoDAsync")
        assert c.call("view_of", {"x": t}).data_ptr == t.data_ptr
        assert SERVER["proc"].calls("cuMemcpyDtoDAsync") == server_copies, "not copied"
        assert me.open_imports == 0


def test_as_torch_gives_the_device_tensor_where_torch_has_no_cuda(
    served: tuple[str, Any],
) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch can use CUDA here: tests/gpu/check_cuda.py checks the torch path")
    addr, gpu = served
    me = gpu.process()
    with connect(addr, me, as_torch=True) as c:
        y = c.call("plus_one", {"x": FakeDeviceArray(me, np.zeros(3, dtype=np.float32))})
        assert isinstance(y, ferry.DeviceTensor), "torch cannot map device memory here"
        np.testing.assert_array_equal(read(me, y), np.ones(3))


def test_async_client_passes_device_tensors(served: tuple[str, Any]) -> None:
    addr, gpu = served
    me = gpu.process()

    async def main() -> Any:
        me.activate()
        try:
            c = await ferry.AsyncClient.connect(addr, timeout=WAIT)
        finally:
            deactivate()
        try:
            x = FakeDeviceArray(me, np.arange(3, dtype=np.float32))
            y = await c.call("plus_one", {"x": x})
            return read(me, y).copy()
        finally:
            await c.close()

    np.testing.assert_array_equal(asyncio.run(asyncio.wait_for(main(), WAIT)), [1, 2, 3])


def test_a_caller_without_cuda_ipc_gets_typed_errors(served: tuple[str, Any]) -> None:
    """Params: `DeviceTensorError` before anything is sent. Results: the handler's device
    tensor cannot go back, and the caller gets `TensorError` saying so (never a silent
    copy to the host)."""
    addr, gpu = served
    broken = gpu.broken_process("no CUDA driver in this container")
    with connect(addr, broken) as c:
        assert c.device_channel is None
        assert c.call("channel_of_caller") is None
        me = gpu.process()  # memory of some process, never read: the call stops first
        x = FakeDeviceArray(me, np.ones(2, dtype=np.float32))
        with pytest.raises(ferry.DeviceTensorError, match="the params hold a cuda:0 tensor"):
            c.call("describe", {"x": x})
        with pytest.raises(ferry.DeviceTensorError):
            c.alloc_device((2,), "f32")
        with pytest.raises(ferry.TensorError, match="no channel for CUDA tensors") as e:
            c.call("fresh", {"n": 2})
        assert "fresh" in str(e.value.data)
        assert c.call("channel_of_caller") is None, "the connection is still fine"
