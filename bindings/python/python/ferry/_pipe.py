"""`ferry.listen` / `ferry.connect`: a header and tensors, without JSON-RPC.

Over shm both directions are zero-copy: received tensors are read-only numpy views of the
peer's memory; an array from `Pipe.alloc`, or a received one sent back whole, is sent
without a copy. Any other array is copied once: into the pipe's memory, or, under 16 KiB,
into the message itself (a copy costs less than sharing memory there).

CUDA tensors go over the cuda-ipc channel where both ends negotiated it (one host, two
processes, a shared GPU): received ones are `ferry.DeviceTensor`s mapping the peer's
device memory (`torch.as_tensor(x, device="cuda")`, `torch.from_dlpack(x)`,
`cupy.asarray(x)`: no copy); one from `Pipe.alloc_device` is sent without a copy, any
other (a CUDA torch tensor, a CuPy array) is copied once on the device. Never through the
host: without cuda-ipc, sending one raises `DeviceTensorError`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np

from . import _native, _tensors


class Pipe:
    """One end of a connection between two processes."""

    def __init__(self, native: _native.Pipe) -> None:
        self._native = native
        self._allocated: list[_native.OutTensor] = []
        self._devices = _tensors.new_devices()

    @property
    def channel(self) -> str:
        """The negotiated channel (`shm` on one host, `inline` otherwise)."""
        return self._native.channel

    @property
    def ring(self) -> bool:
        """True when frames go through the same-host ring (both ends on one Linux host,
        over a unix socket): `recv` then waits on shared memory, with no thread wake-up
        when the answer comes within the ring's spin window."""
        return self._native.ring

    @property
    def closed(self) -> bool:
        """True once the peer is gone."""
        return self._native.closed

    @property
    def device_channel(self) -> str | None:
        """The channel negotiated for CUDA tensors (`"cuda-ipc"`), or None: CUDA tensors
        cannot be sent on this pipe (`DeviceTensorError`)."""
        return self._native.device_channel

    def stats(self) -> dict[str, Any]:
        """Each negotiated channel's counters, by channel name (e.g. `"cuda-ipc"`:
        `copies_in`, device copies made to send tensors from outside its pool;
        `leases_granted`, tensors of this side the peer still holds)."""
        stats: dict[str, Any] = json.loads(self._native.stats())
        return stats

    def alloc_device(
        self, shape: tuple[int, ...] | list[int], dtype: object = "f32", device: int = 0
    ) -> _native.DeviceTensor:
        """A tensor on `cuda:device` in the cuda-ipc channel's memory: fill it (through
        `torch.as_tensor(t, device="cuda")` or `cupy.asarray(t)`, no copy) and send it
        (or that view of it) without a copy. Like `torch.empty`, its contents are
        unspecified. Do not write to it once sent. `DeviceTensorError` when this pipe has
        no cuda-ipc channel."""
        out = self._native.alloc_device(
            [int(n) for n in shape], _tensors.dtype_name(dtype), int(device)
        )
        return _tensors.remember(self._devices, out)

    def alloc(
        self, shape: tuple[int, ...] | list[int], dtype: object = "f32"
    ) -> np.ndarray[Any, Any]:
        """A writable array in this pipe's memory: sending it costs no copy. Do not write
        to it once sent."""
        out = self._native.alloc([int(n) for n in shape], _tensors.dtype_name(dtype))
        self._allocated.append(out)
        if len(self._allocated) > 64:
            del self._allocated[:-64]
        return _tensors.out_array(out)

    def send(
        self,
        header: Any = None,
        tensors: list[Any] | tuple[Any, ...] = (),
        *,
        timeout: float | None = None,
    ) -> None:
        """Sends `header` (any JSON value) and `tensors` (numpy, torch, anything with
        `__dlpack__` or `__array_interface__`; CUDA tensors: see the module docs).

        A send waits while the peer does not read (its buffers are full). `timeout`
        bounds that wait: past it, `TimeoutError`, and nothing was sent (the pipe stays
        open). If the peer process dies meanwhile, the send fails with
        `BrokenPipeError` (a `ConnectionError`) and the pipe is closed."""
        # In one native call: the header turned into JSON there (`json.dumps` only for
        # what is not plain JSON types), received tensors and arrays from `alloc` sent as
        # they are; `_to_out` copies any other array into this pipe's memory (a CUDA
        # tensor: on the device, into the cuda-ipc pool).
        self._native.send_objects(header, tensors, timeout, self._to_out)

    def _to_out(self, x: object) -> _tensors.Out:
        return _tensors.to_out(x, self._native.alloc, self._allocated, None, self._devices)

    def _received(self, t: Any) -> Any:
        out = _tensors.to_numpy(t)
        if isinstance(out, _native.DeviceTensor):  # a view of it sent back: by reference
            _tensors.remember(self._devices, out)
        return out

    def recv(self, timeout: float | None = None) -> tuple[Any, list[Any]]:
        """The next message: its header and its tensors (read-only numpy views, and
        `DeviceTensor`s for CUDA tensors; released when the last reference dies).
        `TimeoutError` after `timeout` seconds."""
        return self._native.recv_objects(timeout, self._received)

    def close(self) -> None:
        """Closes the pipe: the peer's `recv` fails with `ConnectionError`. Safe to call
        from another thread while a `send` is stuck on a peer that does not read: it does
        not wait for it, and that send fails with `ConnectionError`."""
        self._native.close()

    def __enter__(self) -> Pipe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def asend(
        self,
        header: Any = None,
        tensors: list[Any] | tuple[Any, ...] = (),
        *,
        timeout: float | None = None,
    ) -> None:
        """`send` for asyncio (runs in a worker thread)."""
        await asyncio.to_thread(lambda: self.send(header, tensors, timeout=timeout))

    async def arecv(self, timeout: float | None = None) -> tuple[Any, list[Any]]:
        """`recv` for asyncio (waits in a worker thread)."""
        return await asyncio.to_thread(self.recv, timeout)


class Listener:
    """A listening address; `accept()` gives a `Pipe` per peer."""

    def __init__(self, native: _native.Listener) -> None:
        self._native = native

    @property
    def address(self) -> str:
        """The address peers connect to."""
        return self._native.address

    def accept(self, timeout: float | None = None) -> Pipe:
        """Waits for the next peer (`TimeoutError` after `timeout` seconds)."""
        return Pipe(self._native.accept(timeout))

    async def aaccept(self, timeout: float | None = None) -> Pipe:
        """`accept` for asyncio."""
        return await asyncio.to_thread(self.accept, timeout)


def listen(addr: str, *, token: str | None = None, shm_pool_mib: int | None = None) -> Listener:
    """Listens on `addr` (`unix:NAME`, a socket path, `quic://HOST:PORT`).

    `shm_pool_mib`: the most shared memory (MiB, default 2048) each accepted pipe holds for
    what it sends; memory nothing uses any more is given back while the pipe lives.
    """
    return Listener(_native.listen(addr, token=token, shm_pool_mib=shm_pool_mib))


def connect(addr: str, *, token: str | None = None, shm_pool_mib: int | None = None) -> Pipe:
    """Connects to a `listen`ing peer.

    `shm_pool_mib`: the most shared memory (MiB, default 2048) this pipe holds for what it
    sends; memory nothing uses any more is given back while the pipe lives.
    """
    return Pipe(_native.connect(addr, token=token, shm_pool_mib=shm_pool_mib))
