"""An in-memory stand-in for the CUDA driver (`ferry_client._cuda.Driver`), for testing the
cuda-ipc channel's logic without a GPU: "device memory" is host memory (numpy buffers),
IPC handles are 64 random bytes naming an allocation of a `World` (the other process),
and every call is recorded so tests can check what the channel asked the driver to do.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ferry_client._cuda import CudaArray

_EMPTY = np.zeros(1, dtype=np.uint8)


def address(a: np.ndarray[Any, Any]) -> int:
    return int(a.__array_interface__["data"][0])


class World:
    """The server's side: allocations it exported and events it made."""

    def __init__(self) -> None:
        self.allocs: dict[bytes, np.ndarray[Any, Any]] = {}

    def export(self, size: int) -> tuple[bytes, np.ndarray[Any, Any]]:
        """A new server allocation: its IPC handle and its bytes."""
        h = os.urandom(64)
        buf = np.zeros(size, dtype=np.uint8)
        self.allocs[h] = buf
        return h, buf


class Holder:
    """What `wrap` returns arrays of: an array interface and the memory's owner."""

    def __init__(self, interface: dict[str, Any], owner: object) -> None:
        self.__array_interface__ = interface
        self.ferry_owner = owner


class FakeCudaArray:
    """A "CUDA array" made from host memory: what CuPy or torch would hand the client."""

    def __init__(self, host: np.ndarray[Any, Any], stream: int | None = None) -> None:
        self.host = host
        iface = dict(host.__array_interface__)
        iface["version"] = 3
        iface["stream"] = stream
        self.__cuda_array_interface__ = iface


class FakeDriver:
    """The fake driver: devices by UUID, mappings, events and allocations in host memory."""

    def __init__(self, world: World, uuids: list[str] | None = None) -> None:
        self.world = world
        self._uuids = (
            uuids
            if uuids is not None
            else [
                "GPU-00000000-0000-4000-8000-000000000000",
                "GPU-11111111-0000-4000-8000-000000000001",
            ]
        )
        self.opened: dict[int, tuple[int, bytes]] = {}  # ptr -> dev, handle
        self.closed: list[bytes] = []
        self.open_count = 0
        self.events: dict[int, tuple[int, bytes]] = {}
        self.destroyed: list[int] = []
        self.waits: list[tuple[int, bytes]] = []
        self.records: list[int] = []
        self.after: list[tuple[int, int]] = []
        self.mallocs: dict[int, tuple[int, np.ndarray[Any, Any]]] = {}
        self.freed: list[int] = []
        self.copies = 0
        self.map_short = 0
        """Bytes `open_mem` reports fewer than the allocation has (a lying server)."""
        self.fail_open = False
        self._next_event = 1

    def uuids(self) -> list[str]:
        return list(self._uuids)

    def open_mem(self, dev: int, handle: bytes) -> tuple[int, int]:
        if self.fail_open or handle not in self.world.allocs:
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE (1)")
        buf = self.world.allocs[handle]
        ptr = address(buf)
        assert ptr not in self.opened, "a handle opened twice without a close"
        self.opened[ptr] = (dev, handle)
        self.open_count += 1
        return ptr, buf.size - self.map_short

    def close_mem(self, dev: int, ptr: int) -> None:
        d, h = self.opened.pop(ptr)
        assert d == dev
        self.closed.append(h)

    def open_event(self, dev: int, handle: bytes) -> int:
        ev = self._next_event
        self._next_event += 1
        self.events[ev] = (dev, handle)
        return ev

    def destroy_event(self, dev: int, event: int) -> None:
        assert self.events.pop(event)[0] == dev
        self.destroyed.append(event)

    def wait_event(self, dev: int, event: int) -> None:
        d, h = self.events[event]
        assert d == dev
        self.waits.append((dev, h))

    def record(self, dev: int) -> bytes:
        self.records.append(dev)
        return bytes([0xE0 + dev]) * 64

    def after_stream(self, dev: int, stream: int) -> None:
        self.after.append((dev, stream))

    def malloc(self, dev: int, n: int) -> int:
        buf = np.zeros(n, dtype=np.uint8)
        ptr = address(buf)
        self.mallocs[ptr] = (dev, buf)
        return ptr

    def free(self, dev: int, ptr: int) -> None:
        assert self.mallocs.pop(ptr)[0] == dev
        self.freed.append(ptr)

    def mem_handle(self, dev: int, ptr: int) -> bytes:
        assert ptr in self.mallocs
        return ptr.to_bytes(8, "little") * 8

    def device_of(self, ptr: int) -> int:
        for p, (dev, buf) in self.mallocs.items():
            if p <= ptr < p + buf.size:
                return dev
        for p, (dev, h) in self.opened.items():
            if p <= ptr < p + self.world.allocs[h].size:
                return dev
        return 0

    def copy(self, dev: int, dst: int, src: CudaArray) -> None:
        self.copies += 1
        host = np.ascontiguousarray(src.obj.host)  # type: ignore[attr-defined]
        for p, (_, buf) in self.mallocs.items():
            if p <= dst and dst + host.nbytes <= p + buf.size:
                buf[dst - p : dst - p + host.nbytes] = host.reshape(-1).view(np.uint8)
                return
        raise AssertionError("copy to memory that is not allocated")

    def wrap(
        self,
        dev: int,
        ptr: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        strides: tuple[int, ...] | None,
        owner: object,
    ) -> Any:
        iface = {
            "version": 3,
            "shape": shape,
            "typestr": dtype.str,
            "strides": strides,
            "data": (ptr or address(_EMPTY), False),
        }
        arr = np.asarray(Holder(iface, owner))
        return FakeDeviceArray(arr, dev)


class FakeDeviceArray:
    """What the fake `wrap` returns: host memory posing as a device array (it has
    `__cuda_array_interface__`, so the client sends it as a CUDA tensor)."""

    def __init__(self, arr: np.ndarray[Any, Any], dev: int) -> None:
        self.host = arr
        self.dev = dev
        iface = dict(arr.__array_interface__)
        iface["version"] = 3
        iface["stream"] = None
        self.__cuda_array_interface__ = iface

    @property
    def base(self) -> object:
        return self.host.base

    def __getitem__(self, key: Any) -> FakeDeviceArray:
        return FakeDeviceArray(self.host[key], self.dev)
