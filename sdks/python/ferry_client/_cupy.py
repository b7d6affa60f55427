"""`CupyDriver`: the cuda-ipc channel's driver calls (`_cuda.Driver`) made through CuPy.

CuPy's runtime bindings give IPC handles, events, streams and memory; the one driver call
CuPy lacks, `cuMemGetAddressRange` (the size of an opened mapping, checked against what
the server claims), is called through ctypes on `libcuda.so.1`, which CuPy has loaded
already. Every call runs on the device it names (`with cupy.cuda.Device(dev)`), on the
legacy default stream (handle 0), as the Rust implementation does (PROTOCOL.md 17.3).

Written without a GPU to run it on (no machine here has one): see the package README's
"CUDA tensors" section for how to test it on a GPU machine.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import sys
from typing import Any

import numpy as np

from ._cuda import CUPY_HINT, CudaArray, CudaUnavailable, Driver, format_uuid

_EVENT_DISABLE_TIMING = 0x2
_EVENT_INTERPROCESS = 0x4
_COMPUTE_MODE_PROHIBITED = 2
_MEMCPY_DEVICE_TO_DEVICE = 3
_IPC_LAZY_PEER_ACCESS = 0x1


def load_cupy() -> Any:
    """`import cupy`, or `CudaUnavailable` naming the missing package."""
    try:
        return importlib.import_module("cupy")
    except ImportError as e:
        raise CudaUnavailable(f"{CUPY_HINT} ({e})") from None


class CupyDriver:
    """The real driver: CuPy (runtime API) plus `cuMemGetAddressRange` through ctypes."""

    def __init__(self) -> None:
        cp = load_cupy()
        self.cp = cp
        self.rt = cp.cuda.runtime
        try:
            count = int(self.rt.getDeviceCount())
            uuids = []
            for i in range(count):
                props = self.rt.getDeviceProperties(i)
                if props.get("computeMode") == _COMPUTE_MODE_PROHIBITED:
                    break  # ordinals must stay dense: stop at the first unusable one
                raw = props.get("uuid")
                if not isinstance(raw, bytes) or len(raw) != 16:
                    raise CudaUnavailable(
                        "this CuPy build does not report device UUIDs (CUDA 10 or newer needed)"
                    )
                uuids.append(format_uuid(raw))
        except CudaUnavailable:
            raise
        except Exception as e:  # CUDARuntimeError: no driver, no device
            raise CudaUnavailable(f"no usable CUDA device: {e}") from None
        if not uuids:
            raise CudaUnavailable(
                "no usable CUDA device (none, or compute mode prohibited)"
            )
        self._uuids = uuids
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
            self._range = self._cuda.cuMemGetAddressRange_v2
        except (OSError, AttributeError) as e:
            raise CudaUnavailable(f"cannot load the CUDA driver library: {e}") from None
        self._range.restype = ctypes.c_int
        self._range.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]
        self._own_events: dict[int, tuple[int, bytes]] = {}

    def _device(self, dev: int) -> Any:
        return self.cp.cuda.Device(dev)

    def uuids(self) -> list[str]:
        """UUIDs of the usable devices by ordinal."""
        return list(self._uuids)

    def open_mem(self, dev: int, handle: bytes) -> tuple[int, int]:
        """`cudaIpcOpenMemHandle`, then the mapping's size from `cuMemGetAddressRange`."""
        with self._device(dev):
            ptr = int(self.rt.ipcOpenMemHandle(handle, _IPC_LAZY_PEER_ACCESS))
            base, size = ctypes.c_uint64(), ctypes.c_size_t()
            status = self._range(ctypes.byref(base), ctypes.byref(size), ptr)
            if status != 0:
                self.rt.ipcCloseMemHandle(ptr)
                raise CudaUnavailable(
                    f"cuMemGetAddressRange failed: CUDA error {status}"
                )
            if base.value != ptr:
                self.rt.ipcCloseMemHandle(ptr)
                raise CudaUnavailable("the opened mapping does not start at its base")
            return ptr, int(size.value)

    def close_mem(self, dev: int, ptr: int) -> None:
        """Waits for the device's queued work, then `cudaIpcCloseMemHandle`."""
        with self._device(dev):
            self.rt.deviceSynchronize()
            self.rt.ipcCloseMemHandle(ptr)

    def open_event(self, dev: int, handle: bytes) -> int:
        """`cudaIpcOpenEventHandle`."""
        with self._device(dev):
            return int(self.rt.ipcOpenEventHandle(handle))

    def destroy_event(self, dev: int, event: int) -> None:
        """`cudaEventDestroy`."""
        with self._device(dev):
            self.rt.eventDestroy(event)

    def wait_event(self, dev: int, event: int) -> None:
        """The legacy default stream waits on `event`."""
        with self._device(dev):
            self.rt.streamWaitEvent(0, event, 0)

    def record(self, dev: int) -> bytes:
        """Records this process's interprocess event of `dev` (made once) on the legacy
        default stream; its handle."""
        with self._device(dev):
            own = self._own_events.get(dev)
            if own is None:
                ev = int(
                    self.rt.eventCreateWithFlags(
                        _EVENT_DISABLE_TIMING | _EVENT_INTERPROCESS
                    )
                )
                own = (ev, bytes(self.rt.ipcGetEventHandle(ev)))
                self._own_events[dev] = own
            self.rt.eventRecord(own[0], 0)
            return own[1]

    def after_stream(self, dev: int, stream: int) -> None:
        """The legacy default stream waits for the work queued on `stream` so far."""
        with self._device(dev):
            ev = int(self.rt.eventCreateWithFlags(_EVENT_DISABLE_TIMING))
            try:
                self.rt.eventRecord(ev, stream)
                self.rt.streamWaitEvent(0, ev, 0)
            finally:
                self.rt.eventDestroy(ev)

    def malloc(self, dev: int, n: int) -> int:
        """`cudaMalloc` (exportable with `cudaIpcGetMemHandle`)."""
        with self._device(dev):
            return int(self.rt.malloc(n))

    def free(self, dev: int, ptr: int) -> None:
        """Waits for the device's queued work, then `cudaFree`."""
        with self._device(dev):
            self.rt.deviceSynchronize()
            self.rt.free(ptr)

    def mem_handle(self, dev: int, ptr: int) -> bytes:
        """`cudaIpcGetMemHandle` of an allocation's base."""
        with self._device(dev):
            return bytes(self.rt.ipcGetMemHandle(ptr))

    def device_of(self, ptr: int) -> int:
        """The device a pointer's memory is on."""
        return int(self.rt.pointerGetAttributes(ptr).device)

    def copy(self, dev: int, dst: int, src: CudaArray) -> None:
        """One device-to-device copy of `src` (any layout) into `dst`, C-contiguous, on
        the legacy default stream."""
        cp = self.cp
        with self._device(dev), cp.cuda.Stream.null:
            target = self.wrap(dev, dst, src.shape, src.dtype, None, None)
            target[...] = cp.asarray(src.obj)

    def wrap(
        self,
        dev: int,
        ptr: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        strides: tuple[int, ...] | None,
        owner: object,
    ) -> Any:
        """A `cupy.ndarray` viewing `ptr` whose memory keeps `owner` alive."""
        cp = self.cp
        plain = np.dtype(dtype.str)  # (bf16's tag: a uint16 array on the device)
        n = plain.itemsize
        for d in shape:
            n *= d
        if strides is not None and shape:
            n = plain.itemsize + sum((d - 1) * s for d, s in zip(shape, strides) if d)
        mem = cp.cuda.UnownedMemory(ptr, n if ptr else 0, owner, device_id=dev)
        with self._device(dev):
            return cp.ndarray(
                shape,
                dtype=plain,
                memptr=cp.cuda.MemoryPointer(mem, 0),
                strides=strides,
            )


def make_driver(cuda: object) -> tuple[Driver | None, str]:
    """The driver for a client's `cuda` option, or `None` and why not.

    `False`: never. `None` (the default): when the application has imported CuPy already
    (importing it on its behalf would add a second or more to every connect) and a
    usable device exists. `True`: always, or `CudaUnavailable` saying what is missing.
    A `Driver` object is used as it is (tests).
    """
    if cuda is False:
        return None, "this client was connected with cuda=False"
    if cuda is None:
        if sys.modules.get("cupy") is None:
            if importlib.util.find_spec("cupy") is None:
                return None, CUPY_HINT
            return None, (
                "cupy is installed but was not imported when this client connected; "
                "import cupy first, or connect with cuda=True"
            )
        try:
            return CupyDriver(), ""
        except CudaUnavailable as e:
            return None, str(e)
    if cuda is True:
        return CupyDriver(), ""
    if not hasattr(cuda, "open_mem"):
        raise TypeError(f"cuda must be True, False, None or a driver, got {cuda!r:.80}")
    return cuda, ""  # type: ignore[return-value]
