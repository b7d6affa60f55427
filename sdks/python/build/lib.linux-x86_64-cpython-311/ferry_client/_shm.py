"""The shm channel (PROTOCOL.md section 11): sealed memfd segments, leases, releases.

- `ShmReceiver` maps the server's segments read-only (after checking seals and size) and
  turns `shm` descriptors into read-only numpy arrays that view the mapping. Each array's
  base is a `PeerView` holding the lease; when the last array (or view, or DLPack
  capsule) referring to it is garbage-collected, the lease joins the release queue, which
  the client sends as one CONTROL frame before its next frame.
- `ShmPool` is this side's sending memory: segments carved into slots. `alloc` gives a
  writable array in a slot (sending it costs no copy); other arrays are copied into a slot
  once. A slot is reused when no array of this process refers to it and the server has
  released every lease on it.

Garbage collection may run anywhere, even inside this module: the holders' `__del__`
only append to a queue, which the owner drains at safe points.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np
import numpy.typing as npt

from ._freelist import FreeList
from ._wire import checked_span, uint, wire_int
from .errors import LimitError, ProtocolError
from .tensors import storage_dtype

F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SEAL, F_SEAL_SHRINK, F_SEAL_GROW = 0x1, 0x2, 0x4
NEEDED_SEALS = F_SEAL_SHRINK | F_SEAL_GROW
MIB = 1 << 20
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
"""Linux's MAP_NORESERVE (Python's mmap module does not name it)."""


def shm_domain() -> dict[str, str] | None:
    """The shm offer's domain (boot id, IPC and network namespace), or `None` where shm
    cannot work (not Linux, no sealed memfds)."""
    if not hasattr(os, "memfd_create"):
        return None
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            domain = {"boot_id": f.read().strip()}
        for ns in ("ipc", "net"):
            domain[ns + "_ns"] = os.readlink(f"/proc/self/ns/{ns}")
        fd = os.memfd_create("ferry-probe", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
        finally:
            os.close(fd)
    except OSError:
        return None
    return domain


def _address(a: npt.NDArray[Any]) -> int:
    return int(a.__array_interface__["data"][0])


_U8 = np.dtype(np.uint8)

_TYPESTR: dict[np.dtype[Any], str] = {}
"""`dtype.str` by dtype, for `array_interface`."""


def array_interface(
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    strides: tuple[int, ...] | None,
    address: int,
    readonly: bool,
) -> dict[str, Any]:
    """A numpy `__array_interface__` for memory at `address`."""
    typestr = _TYPESTR.get(dtype)
    if typestr is None:
        # (a property that builds the string each time; ml_dtypes' float8 say "<f1" or
        # "<V1", which numpy cannot read back: their bytes as uint8, viewed by make_array)
        typestr = storage_dtype(dtype).str
        if len(_TYPESTR) < 64:
            _TYPESTR[dtype] = typestr
    return {
        "version": 3,
        "shape": shape,
        "typestr": typestr,
        "strides": strides,
        "data": (address, readonly),
    }


def make_array(holder: Any, dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """The array `holder.__array_interface__` describes, with `dtype` (which may carry
    metadata, e.g. bf16's tag); its base is `holder`."""
    arr: npt.NDArray[Any] = np.asarray(holder)
    got = arr.dtype
    if got is not dtype and (got != dtype or got.metadata != dtype.metadata):
        arr = arr.view(dtype)
    return arr


class PeerView:
    """Keeps a lease on the server's memory while arrays refer to it."""

    __slots__ = ("__array_interface__", "segment", "lease", "start", "length", "_done")

    def __init__(
        self,
        segment: npt.NDArray[np.uint8],
        lease: int,
        start: int,
        length: int,
        done: deque[int],
        interface: dict[str, Any],
    ) -> None:
        self.segment = segment  # keeps the mapping alive
        self.lease = lease
        self.start = start  # address of the leased range
        self.length = length
        self._done = done
        self.__array_interface__ = interface

    def __del__(self) -> None:
        self._done.append(self.lease)


class ShmReceiver:
    """The server's segments, mapped read-only, and the leases this side holds."""

    def __init__(self, max_peer_bytes: int) -> None:
        self.max_peer_bytes = max_peer_bytes
        self.segments: dict[int, npt.NDArray[np.uint8]] = {}
        self.mapped = 0
        self.held: dict[int, int] = {}
        """Leases held -> the segment each is on."""
        self.done: deque[int] = deque()

    def take_releases(self) -> list[int]:
        """Leases whose arrays are gone, to release now (each once)."""
        out: list[int] = []
        while self.done:
            lease = self.done.popleft()
            if self.held.pop(lease, None) is not None:
                out.append(lease)
        return out

    def decode(
        self, meta: dict[str, Any], r: object, dtype: np.dtype[Any], fds: list[int]
    ) -> npt.NDArray[Any]:
        """An `shm` descriptor as a read-only array viewing the server's memory."""
        if not isinstance(r, dict):
            raise ProtocolError(f"shm descriptor must be an object, got {r!r}")
        # Every number first, as a header parse would (PROTOCOL.md 5.5).
        seg_id = wire_int(r.get("segment"), "segment")
        off = wire_int(r.get("offset"), "offset")
        n = wire_int(r.get("len"), "len")
        lease = wire_int(r.get("lease"), "lease")
        ann = r.get("announce")
        if ann is not None:
            if not isinstance(ann, dict):
                raise ProtocolError(f"announce must be an object, got {ann!r}")
            i, size = (
                uint(ann.get("fd"), "announce.fd"),
                wire_int(ann.get("size"), "announce.size"),
            )
            if seg_id in self.segments:
                raise ProtocolError(f"segment {seg_id} announced twice")
            if i >= len(fds) or fds[i] < 0:
                raise ProtocolError(f"announced descriptor {i} is not in the frame")
            fd, fds[i] = fds[i], -1
            if self.mapped + size > self.max_peer_bytes:
                os.close(fd)
                raise ProtocolError(
                    f"bytes of peer shared memory mapped is {self.mapped + size}, over the limit "
                    f"max_peer_bytes = {self.max_peer_bytes}"
                )
            self.segments[seg_id] = open_segment(fd, size, seg_id)
            self.mapped += size
        seg = self.segments.get(seg_id)
        if seg is None:
            raise ProtocolError(f"unknown segment {seg_id}")
        lazy = r.get("lazy_release", False)
        if type(lazy) is not bool:
            raise ProtocolError(f"lazy_release must be a boolean, got {lazy!r:.40}")
        if off + n > len(seg):
            raise ProtocolError(
                f"range {off}+{n} is outside segment {seg_id} of {len(seg)} bytes"
            )
        if lease in self.held:
            raise ProtocolError(f"lease {lease} granted twice")
        span, strided = checked_span(meta, dtype.itemsize, n)
        start = _address(seg) + off
        shape = tuple(meta["shape"])
        strides = (
            tuple(s * dtype.itemsize for s in meta["strides"]) if strided else None
        )
        if span == 0:
            # No byte of the lease is read: the array needs no memory of its own.
            self.done.append(lease)
            self.held[lease] = seg_id
            return np.empty(shape, dtype)
        holder = PeerView(
            seg,
            lease,
            start,
            n,
            self.done,
            array_interface(shape, dtype, strides, start, True),
        )
        self.held[lease] = seg_id
        return make_array(holder, dtype)

    def forget(self, ids: object) -> None:
        """The server's `forget` (feature `shm_forget`, PROTOCOL.md 11.5): it will never use
        these segments again. They leave the table (and `max_peer_bytes`' count); the
        mapping goes once no array refers to it."""
        if not isinstance(ids, list):
            raise ProtocolError(f"forget must be a list, got {ids!r:.100}")
        for raw in ids:
            seg_id = wire_int(raw, "forget")
            seg = self.segments.get(seg_id)
            if seg is None:
                raise ProtocolError(f"forget of segment {seg_id}, which is not mapped")
            if seg_id in self.held.values():
                raise ProtocolError(
                    f"forget of segment {seg_id}, on which leases are held"
                )
            del self.segments[seg_id]
            self.mapped -= len(seg)


def open_segment(fd: int, size: int, seg_id: int) -> npt.NDArray[np.uint8]:
    """Checks a received memfd (seals, then size), maps it (private, copy-on-write) and
    closes `fd`.

    Returns the mapping as a read-only byte array (which keeps the mapping alive).
    """
    try:
        try:
            seals = fcntl.fcntl(fd, F_GET_SEALS)
        except OSError as e:
            raise ProtocolError(
                f"segment {seg_id} refused: cannot read seals ({e}); not a memfd?"
            ) from None
        if seals & NEEDED_SEALS != NEEDED_SEALS:
            raise ProtocolError(
                f"segment {seg_id} refused: seals are {seals:#x}; SHRINK and GROW are required"
            )
        actual = os.fstat(fd).st_size
        if size == 0 or actual != size:
            raise ProtocolError(
                f"segment {seg_id} announced as {size} bytes but is {actual}"
            )
        try:
            # Private (copy-on-write) and writable, like the Rust receiver: arrays made from
            # it are read-only, but foreign code that writes anyway (a torch tensor over a
            # received array: `torch.from_numpy` cannot make a read-only tensor) copies the
            # page it touches instead of faulting, and never reaches the server.
            # MAP_NORESERVE: no swap is reserved for pages nobody writes.
            mm = mmap.mmap(
                fd,
                size,
                flags=mmap.MAP_PRIVATE | MAP_NORESERVE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        except (OSError, ValueError, OverflowError) as e:
            raise ProtocolError(
                f"segment {seg_id}: cannot map {size} bytes: {e}"
            ) from None
    finally:
        os.close(fd)
    seg = np.frombuffer(mm, dtype=np.uint8)
    seg.flags.writeable = False
    return seg


class Slot:
    """A range of one of this side's segments, in use by arrays or leases."""

    __slots__ = ("segment", "offset", "size", "refs", "ro")

    def __init__(self, segment: Segment, offset: int, size: int) -> None:
        self.segment = segment
        self.offset = offset
        self.size = size
        self.refs = 0
        self.ro: weakref.ref[npt.NDArray[np.uint8]] | None = None
        """A read-only byte view of the whole slot, while an `alloc`'d array on it lives:
        the base of what the server sends back into it (`ShmPool.returned`)."""


class OwnView:
    """Keeps a slot of this side's pool in use while arrays refer to it."""

    __slots__ = ("__array_interface__", "slot", "pool", "_dropped", "ro")

    def __init__(self, pool: ShmPool, slot: Slot, interface: dict[str, Any]) -> None:
        self.pool = pool
        self.slot = slot
        self._dropped = pool.dropped
        self.__array_interface__ = interface
        self.ro: npt.NDArray[np.uint8] | None = None
        """`Slot.ro`, kept alive by the `alloc`'d array this holds."""

    def __del__(self) -> None:
        self._dropped.append(self.slot)


class Segment(FreeList):
    """One sealed memfd of this side, mapped read-write (carved into slots)."""

    def __init__(self, seg_id: int, size: int) -> None:
        fd = os.memfd_create("ferry-shm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
            self.mm = mmap.mmap(
                fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except BaseException:
            os.close(fd)
            raise
        super().__init__(size)
        self.id = seg_id
        self.size = size
        self.fd = fd  # until announced
        self.announced = False
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.address = _address(self.bytes)

    def close_fd(self) -> None:
        """Closes the descriptor (after it was sent, or when the pool goes)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ShmPool:
    """This side's sending memory: sealed segments carved into slots, and the leases the
    server holds on them."""

    def __init__(self, pool_limit: int, segment_bytes: int = 64 * MIB) -> None:
        self.pool_limit = pool_limit
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = []
        self.reserved = 0
        self.granted: dict[
            int, tuple[Slot, int, int]
        ] = {}  # lease -> slot, start offset, len
        self.next_lease = 1
        self.dropped: deque[Slot] = deque()
        self.lock = threading.Lock()

    def collect(self) -> None:
        """Applies the drops of arrays garbage-collected since the last call."""
        while self.dropped:
            self._unref(self.dropped.popleft())

    def _unref(self, slot: Slot) -> None:
        slot.refs -= 1
        if slot.refs == 0:
            slot.segment.give_back(slot.offset, slot.size)

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
        """A writable, C-contiguous array in a new slot."""
        n = int(np.prod(shape, dtype=object)) * dtype.itemsize
        with self.lock:
            slot = self._slot(n)
            slot.refs += 2  # (the array's holder and the read-only view's)
        address = slot.segment.address + slot.offset
        holder = OwnView(
            self, slot, array_interface(shape, dtype, None, address, False)
        )
        # What the server sends back into this slot views it through `ro` (no holder
        # per answer); `ro` lives while the array does, or longer if what viewed it does.
        ro = make_array(
            OwnView(self, slot, array_interface((n,), _U8, None, address, True)), _U8
        )
        holder.ro = ro
        slot.ro = weakref.ref(ro)
        return make_array(holder, dtype)

    def _slot(self, n: int) -> Slot:
        self.collect()
        align = 4096 if n >= 4096 else 64
        for seg in self.segments:
            off = seg.carve(n, align)
            if off is not None:
                return Slot(seg, off, n)
        size = max(self.segment_bytes, -(-n // (2 * MIB)) * 2 * MIB)
        if n > self.pool_limit:
            raise LimitError(
                f"shm pool bytes needed is {n}, over the limit pool_limit = {self.pool_limit} "
                "(a tensor larger than the whole pool; raise pool_limit when connecting)"
            )
        if self.reserved + size > self.pool_limit:
            size = max(-(-n // (2 * MIB)) * 2 * MIB, 0)
            if self.reserved + size > self.pool_limit:
                raise LimitError(
                    f"shm pool full: no room for {n} bytes ({self.reserved} of pool_limit = "
                    f"{self.pool_limit} bytes reserved, all in use by arrays or by leases the "
                    "server holds; drop arrays, or raise pool_limit when connecting)"
                )
        seg = Segment(len(self.segments), size)
        self.segments.append(seg)
        self.reserved += size
        off = seg.carve(n, align)
        assert off is not None
        return Slot(seg, off, n)

    def copy_in(self, arr: npt.NDArray[Any]) -> tuple[Slot, int]:
        """Copies `arr` into a new slot (the one copy of a send); -> slot, its offset."""
        n = arr.nbytes
        with self.lock:
            slot = self._slot(n)
        dst = slot.segment.bytes[slot.offset : slot.offset + n]
        np.copyto(dst.view(arr.dtype).reshape(arr.shape), arr, casting="no")
        return slot, slot.offset

    def grant(self, slot: Slot, start: int, length: int) -> int:
        """A new lease on `start..start+length` of `slot`'s segment."""
        with self.lock:
            lease = self.next_lease
            self.next_lease += 1
            slot.refs += 1
            self.granted[lease] = (slot, start, length)
        return lease

    def revoke(self, leases: list[int]) -> None:
        """Takes back leases granted for a message that was never sent."""
        with self.lock:
            for lease in leases:
                entry = self.granted.pop(lease, None)
                if entry is not None:
                    self._unref(entry[0])

    def release(self, ids: object) -> None:
        """The server's CONTROL body `{"release": [..]}` (strict, PROTOCOL.md 11.5; a
        `forget` beside it is taken off first, by `ShmReceiver.forget`)."""
        if (
            not isinstance(ids, dict)
            or len(ids) != 1
            or "release" not in ids
            or not isinstance(ids["release"], list)
        ):
            raise ProtocolError(f"malformed shm control body {ids!r}")
        granted = self.granted
        with self.lock:
            for raw in ids["release"]:
                lease = wire_int(raw, "release")
                entry = granted.pop(lease, None)
                if entry is None:
                    raise ProtocolError(
                        f"release of lease {lease}, which is not granted"
                    )
                self._unref(entry[0])
            self.collect()

    def returned(
        self, r: object, meta: dict[str, Any], dtype: np.dtype[Any]
    ) -> npt.NDArray[Any]:
        """An `shm_return` descriptor: a read-only array of this side's own memory."""
        if not isinstance(r, dict):
            raise ProtocolError(f"shm_return descriptor must be an object, got {r!r}")
        return self.returned_at(
            r.get("lease"), r.get("offset"), r.get("len"), meta, dtype
        )

    def returned_at(
        self,
        lease: object,
        off: object,
        n: object,
        meta: dict[str, Any],
        dtype: np.dtype[Any],
    ) -> npt.NDArray[Any]:
        """`returned` of the descriptor's three numbers (unchecked yet)."""
        lease = wire_int(lease, "lease")
        off = wire_int(off, "offset")
        n = wire_int(n, "len")
        # Read without the lock first (one dict read): when the slot's read-only view
        # lives, it holds the slot itself, so the view needs no reference of its own even
        # if the lease goes meanwhile (`revoke`, `forget_leases` on another thread).
        # Otherwise the lease is looked up again under the lock, with the reference taken.
        entry = self.granted.get(lease)
        if entry is None:
            raise ProtocolError(f"returned lease {lease} was never granted")
        slot, start, length = entry
        if off + n > length:
            raise ProtocolError(
                f"returned range {off}+{n} is outside lease {lease} of {length} bytes"
            )
        ro_ref = slot.ro
        ro = ro_ref() if ro_ref is not None else None
        if ro is None:
            with self.lock:
                # (by the slot: compiled code may box the entry tuple anew)
                again = self.granted.get(lease)
                if again is None or again[0] is not slot:
                    raise ProtocolError(f"returned lease {lease} is no longer granted")
                slot.refs += 1
        itemsize = dtype.itemsize
        try:
            span, strided = checked_span(meta, itemsize, n)
        except ProtocolError:
            if ro is None:
                with self.lock:
                    self._unref(slot)
            raise
        shape = tuple(meta["shape"])
        strides = tuple(s * itemsize for s in meta["strides"]) if strided else None
        if ro is not None:
            # A view of the slot's read-only view, which keeps the slot in use.
            arr: npt.NDArray[Any] = np.ndarray(
                shape, dtype, ro, start - slot.offset + off, strides
            )
            return arr
        address = slot.segment.address + start + off
        holder = OwnView(
            self, slot, array_interface(shape, dtype, strides, address, True)
        )
        return make_array(holder, dtype)

    def forget_leases(self) -> None:
        """The connection ended: the server holds nothing any more."""
        with self.lock:
            for slot, _, _ in self.granted.values():
                self._unref(slot)
            self.granted.clear()
            for seg in self.segments:
                seg.close_fd()
