"""`CupyDriver`: the cuda-ipc channel's driver calls (`_cuda.Driver`) made through CuPy.

CuPy's runtime bindings give IPC handles, events, streams and memory; three driver calls
CuPy lacks or gets wrong are made through ctypes on `libcuda.so.1` (loaded by CuPy
already): `cuInit`, `cuDeviceGetUuid_v2` (device UUIDs, as the Rust side reads them) and
`cuMemGetAddressRange_v2` (the size of an opened mapping, checked against what the
server claims). Every call runs on the device it names (`with cupy.cuda.Device(dev)`), on the
legacy default stream (handle 0), as the Rust implementation does (PROTOCOL.md 17.3).

Written without a GPU to run it on (no machine here has one): see the package README's
"CUDA tensors" section for how to test it on a GPU machine.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import sys
import threading
from typing import Any

import numpy as np

from ._cuda import CUPY_HINT, CudaArray, CudaUnavailable, Driver, format_uuid
from .tensors import storage_dtype

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
    """The real driver: CuPy (runtime API) plus three driver calls through ctypes
    (`cuInit`, `cuDeviceGetUuid_v2`, `cuMemGetAddressRange_v2`). One per process
    (`shared()`): it counts opened IPC handles, as the Rust implementation does, so two
    connections mapping the same allocation share one mapping."""

    def __init__(self) -> None:
        cp = load_cupy()
        self.cp = cp
        self.rt = cp.cuda.runtime
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
            self._range = self._cuda.cuMemGetAddressRange_v2
            get_uuid = getattr(self._cuda, "cuDeviceGetUuid_v2", None)
            if get_uuid is None:
                get_uuid = self._cuda.cuDeviceGetUuid
        except (OSError, AttributeError) as e:
            raise CudaUnavailable(f"cannot load the CUDA driver library: {e}") from None
        self._range.restype = ctypes.c_int
        self._range.argtypes = [
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_uint64,
        ]
        try:
            count = int(self.rt.getDeviceCount())
            uuids = []
            for i in range(count):
                props = self.rt.getDeviceProperties(i)
                if props.get("computeMode") == _COMPUTE_MODE_PROHIBITED:
                    uuids.append("")  # not usable (ordinals stay CUDA's)
                    continue
                uuids.append(self._uuid(get_uuid, i))
        except CudaUnavailable:
            raise
        except Exception as e:  # CUDARuntimeError: no driver, no device
            raise CudaUnavailable(f"no usable CUDA device: {e}") from None
        if not any(uuids):
            raise CudaUnavailable(
                "no usable CUDA device (none, or compute mode prohibited)"
            )
        self._uuids = uuids
        self._lock = threading.Lock()
        self._own_events: dict[int, tuple[int, bytes]] = {}
        self._maps: dict[tuple[int, bytes], list[int]] = {}
        """(device, handle) -> [pointer, mapped size, users]."""
        self._by_ptr: dict[tuple[int, int], bytes] = {}

    def _uuid(self, get_uuid: Any, ordinal: int) -> str:
        """A device's UUID as the driver gives it, which is how Rust reads it
        (`cuDeviceGetUuid_v2`: a MIG instance's own under MIG). CuPy's device properties
        are not used: they cut the 16 bytes at the first zero byte."""
        if int(self._cuda.cuInit(0)) != 0:
            raise CudaUnavailable("cuInit failed: no usable CUDA driver")
        dev = ctypes.c_int()
        status = int(self._cuda.cuDeviceGet(ctypes.byref(dev), ordinal))
        if status != 0:
            raise CudaUnavailable(f"cuDeviceGet({ordinal}) failed: CUDA error {status}")
        raw = (ctypes.c_ubyte * 16)()
        status = int(get_uuid(ctypes.byref(raw), dev))
        if status != 0:
            raise CudaUnavailable(f"cuDeviceGetUuid failed: CUDA error {status}")
        return format_uuid(bytes(raw))

    def _device(self, dev: int) -> Any:
        return self.cp.cuda.Device(dev)

    def uuids(self) -> list[str]:
        """UUIDs of the devices by ordinal ("" for one that is not usable)."""
        return list(self._uuids)

    def open_mem(self, dev: int, handle: bytes) -> tuple[int, int]:
        """`cudaIpcOpenMemHandle` (once per process and handle; users counted), then the
        mapping's size from `cuMemGetAddressRange`."""
        with self._lock:
            known = self._maps.get((dev, handle))
            if known is not None:
                known[2] += 1
                return known[0], known[1]
            with self._device(dev):
                ptr = int(self.rt.ipcOpenMemHandle(handle, _IPC_LAZY_PEER_ACCESS))
                base, size = ctypes.c_uint64(), ctypes.c_size_t()
                status = self._range(ctypes.byref(base), ctypes.byref(size), ptr)
                if status != 0 or base.value != ptr:
                    self.rt.ipcCloseMemHandle(ptr)
                    raise CudaUnavailable(
                        f"cuMemGetAddressRange failed: CUDA error {status}"
                        if status
                        else "the opened mapping does not start at its base"
                    )
            self._maps[(dev, handle)] = [ptr, int(size.value), 1]
            self._by_ptr[(dev, ptr)] = handle
            return ptr, int(size.value)

    def close_mem(self, dev: int, ptr: int) -> None:
        """Drops one user of a mapping; the last one closes it
        (`cudaIpcCloseMemHandle`) once the work queued so far is done."""
        with self._lock:
            handle = self._by_ptr.get((dev, ptr))
            entry = self._maps.get((dev, handle)) if handle is not None else None
            if entry is None or handle is None:
                return
            entry[2] -= 1
            if entry[2] > 0:
                return
            del self._maps[(dev, handle)]
            del self._by_ptr[(dev, ptr)]
        with self._device(dev):
            self._drain()
            self.rt.ipcCloseMemHandle(ptr)

    def _drain(self) -> None:
        """Waits for the work queued on the current device's legacy default stream (and,
        through it, on every blocking stream) so far: cheaper than
        `cudaDeviceSynchronize`, and allowed while another stream captures a graph."""
        ev = int(self.rt.eventCreateWithFlags(_EVENT_DISABLE_TIMING))
        try:
            self.rt.eventRecord(ev, 0)
            self.rt.eventSynchronize(ev)
        finally:
            self.rt.eventDestroy(ev)

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
        with self._lock, self._device(dev):
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
        """`cudaFree` (which itself waits for the device's queued work)."""
        with self._device(dev):
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
        # (CuPy lacks bf16 and the float8s: their raw bits, uint16 or uint8, on the device)
        plain = storage_dtype(dtype)
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


_SHARED: CupyDriver | None = None
_SHARED_LOCK = threading.Lock()


def shared() -> CupyDriver:
    """This process's `CupyDriver`, made on first use (a failure is not remembered: a
    later try may succeed)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = CupyDriver()
        return _SHARED


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
            return shared(), ""
        except CudaUnavailable as e:
            return None, str(e)
    if cuda is True:
        return shared(), ""
    if not hasattr(cuda, "open_mem"):
        raise TypeError(f"cuda must be True, False, None or a driver, got {cuda!r:.80}")
    return cuda, ""  # type: ignore[return-value]
