"""The cuda-ipc channel (PROTOCOL.md section 17): CUDA tensors shared with the server
without a copy, through legacy CUDA IPC.

- Receiving: a `cuda_ipc` descriptor names the server's allocation (IPC handle of its
  base, id, size), a range of it, an IPC event the server recorded after its writes, and a
  lease. `CudaChannel.decode` checks it (section 17.4, in order), maps the allocation once
  per connection (`cuIpcOpenMemHandle`; the cache is keyed by id *and* handle bytes, so a
  reused address never hits a stale mapping), makes the legacy default stream wait on the
  event, and returns a device array (a CuPy array with the real driver) whose memory owner
  is a `PeerLease`. When the last array (or DLPack consumer, e.g. a torch tensor) using it
  is garbage-collected, the lease joins the release queue; releases go out per device
  with an event recorded after this side's last use.
- Sending: a CUDA array (anything with `__cuda_array_interface__`: CuPy, torch, numba)
  inside a lease of the server goes back as `cuda_ipc_return`; one in this side's pool
  (`alloc(..., device="cuda:N")`) goes as `cuda_ipc` without a copy; any other is copied
  once (device to device, on the legacy default stream) into the pool. The pool is
  `cudaMalloc` slabs (exportable with `cudaIpcGetMemHandle`, unlike stream-ordered pool
  memory), carved into slots.
- Closing: the server's leases are forgotten, cached mappings leave the cache; arrays
  still held keep their mapping open (so queued GPU work never faults) but are
  *orphaned*: the server may reuse that memory, and sending them fails.

This module holds the descriptor syntax and the driver interface; `_cuda_channel` the
per-connection state. All driver calls go through `Driver` (`CupyDriver` in `_cupy.py` on
a real GPU; the tests use an in-memory fake), so all of it is tested without a GPU.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from typing import Any, Protocol

import numpy as np

from .errors import FerryError, ProtocolError

NAME = "cuda-ipc"
HANDLE_BYTES = 64
HANDLE_CHARS = 88
MAX_UUID = 64
MIB = 1 << 20
PEER_EVENTS = 64
"""Most of the server's IPC events one connection keeps open."""

CUPY_HINT = (
    "CUDA tensors need the `cupy` package, which is not installed: install the build for "
    "your CUDA version, e.g. `pip install cupy-cuda12x` "
    "(https://docs.cupy.dev/en/stable/install.html)"
)

_UUID = re.compile(r"(GPU|MIG)-[0-9a-fA-F-]+")


class CudaUnavailable(FerryError):
    """CUDA tensors cannot be used on this connection: the `cupy` package is missing, no
    usable device, or the server did not accept the cuda-ipc channel. The message says
    which, and what to do."""


class Driver(Protocol):
    """The CUDA calls the channel makes. Device numbers are this process's ordinals;
    streams are the legacy default stream unless named."""

    def uuids(self) -> list[str]:
        """The UUID of each usable device by ordinal, as `nvidia-smi -L` prints them."""
        ...

    def open_mem(self, dev: int, handle: bytes) -> tuple[int, int]:
        """Maps a peer's allocation: (pointer, size the driver reports for the mapping)."""
        ...

    def close_mem(self, dev: int, ptr: int) -> None:
        """Unmaps what `open_mem` mapped (after the device finished its queued work)."""
        ...

    def open_event(self, dev: int, handle: bytes) -> int:
        """Opens a peer's IPC event."""
        ...

    def destroy_event(self, dev: int, event: int) -> None:
        """Destroys an event opened with `open_event`."""
        ...

    def wait_event(self, dev: int, event: int) -> None:
        """Makes the legacy default stream of `dev` wait on `event`."""
        ...

    def record(self, dev: int) -> bytes:
        """Records this process's IPC event of `dev` on its legacy default stream and
        returns the event's IPC handle."""
        ...

    def after_stream(self, dev: int, stream: int) -> None:
        """Orders the legacy default stream after the work queued on `stream` so far."""
        ...

    def malloc(self, dev: int, n: int) -> int:
        """Exportable device memory (`cudaMalloc`)."""
        ...

    def free(self, dev: int, ptr: int) -> None:
        """Frees what `malloc` gave."""
        ...

    def mem_handle(self, dev: int, ptr: int) -> bytes:
        """The IPC handle of the allocation based at `ptr`."""
        ...

    def device_of(self, ptr: int) -> int:
        """The device ordinal a pointer belongs to."""
        ...

    def copy(self, dev: int, dst: int, src: CudaArray) -> None:
        """Copies `src` (any layout) C-contiguously to `dst`, on the legacy default
        stream."""
        ...

    def wrap(
        self,
        dev: int,
        ptr: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        strides: tuple[int, ...] | None,
        owner: object,
    ) -> Any:
        """A device array (CuPy) viewing `ptr`, keeping `owner` alive; `ptr` is 0 for an
        array of no bytes."""
        ...


class CudaArrayLike(Protocol):
    """Anything with `__cuda_array_interface__` (CuPy, torch CUDA tensors, numba)."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """The array's CUDA Array Interface (version 2 or 3)."""
        ...


class CudaArray:
    """What `__cuda_array_interface__` says about an array to send."""

    __slots__ = ("obj", "ptr", "shape", "strides", "dtype", "stream", "nbytes")

    def __init__(self, obj: object, iface: dict[str, Any]) -> None:
        try:
            shape = tuple(int(d) for d in iface["shape"])
            dtype = np.dtype(iface["typestr"])
            ptr = int(iface["data"][0])
            raw = iface.get("strides")
            strides = None if raw is None else tuple(int(s) for s in raw)
            stream = iface.get("stream")
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise CudaUnavailable(
                f"a {type(obj).__name__} has an unusable __cuda_array_interface__: {e}"
            ) from None
        if dtype.byteorder == ">" or dtype.kind not in "biufc":
            raise CudaUnavailable(f"CUDA arrays of dtype {dtype} cannot be sent")
        if strides is not None and len(strides) != len(shape):
            raise CudaUnavailable("__cuda_array_interface__ strides do not match shape")
        if strides is not None and strides == _c_strides(shape, dtype.itemsize):
            strides = None
        self.obj = obj
        self.ptr = ptr
        self.shape = shape
        self.strides = strides
        self.dtype = np.dtype(dtype.str)
        self.stream = stream if type(stream) is int else None
        n = dtype.itemsize
        for d in shape:
            n *= d
        self.nbytes = n


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out = []
    step = itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def cuda_array(value: object) -> CudaArray | None:
    """`value` as a `CudaArray` if it is a CUDA array (has `__cuda_array_interface__`),
    else `None`."""
    if isinstance(value, np.ndarray):
        return None
    try:
        iface = getattr(value, "__cuda_array_interface__", None)
    except Exception:  # torch raises for a CPU tensor
        return None
    if not isinstance(iface, dict):
        return None
    return CudaArray(value, iface)


def domain(driver: Driver) -> dict[str, str] | None:
    """The cuda-ipc offer's domain (section 17.1), or `None` where it cannot work."""
    uuids = driver.uuids()
    if not uuids:
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot_id = f.read().strip()
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return {
        "boot_id": boot_id,
        "pid_ns": pid_ns,
        "pid": str(os.getpid()),
        "uuids": ",".join(uuids),
    }


def format_uuid(raw: bytes, prefix: str = "GPU") -> str:
    """16 bytes as `nvidia-smi` prints a UUID: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`."""
    h = raw.hex()
    return f"{prefix}-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _bad(reason: str) -> ProtocolError:
    return ProtocolError(f"channel {NAME}: invalid descriptor from peer: {reason}")


def handle(v: object, field: str) -> bytes:
    """A handle: canonical base64 of exactly 64 bytes."""
    if not isinstance(v, str) or len(v) != HANDLE_CHARS:
        got = len(v) if isinstance(v, str) else type(v).__name__
        raise _bad(
            f"{field}: expected base64 of {HANDLE_BYTES} bytes ({HANDLE_CHARS} characters), got {got} characters"
        )
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError) as e:
        raise _bad(f"{field}: not base64: {e}") from None
    if len(raw) != HANDLE_BYTES or base64.b64encode(raw).decode() != v:
        raise _bad(f"{field}: not canonical base64 of {HANDLE_BYTES} bytes")
    return raw


def b64(raw: bytes) -> str:
    """A handle as the wire carries it."""
    return base64.b64encode(raw).decode()


def valid_uuid(v: object) -> bool:
    """Whether `v` has the form of a device UUID (`GPU-`/`MIG-`, hex digits, dashes)."""
    return isinstance(v, str) and len(v) <= MAX_UUID and bool(_UUID.fullmatch(v))
