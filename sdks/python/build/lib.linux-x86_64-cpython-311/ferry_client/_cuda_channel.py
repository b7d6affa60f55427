"""The cuda-ipc channel's state for one connection (`CudaChannel`): the server's
mappings, events and leases held here; this side's pool and the leases granted to the
server. Descriptor syntax, the driver interface and the overview are in `_cuda`.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict, deque
from typing import Any

import numpy as np

from ._cuda import (
    MIB,
    PEER_EVENTS,
    CudaArray,
    CudaUnavailable,
    Driver,
    _bad,
    b64,
    handle,
    valid_uuid,
)
from ._freelist import FreeList
from ._wire import checked_span, layout, wire_int
from .errors import LimitError, ProtocolError
from .tensors import NUMPY_DTYPES, ferry_dtype


class Mapping:
    """A server allocation mapped into this process; unmapped when the last user (the
    cache or a `PeerLease`) lets go of it."""

    __slots__ = ("driver", "dev", "ptr", "size", "handle", "orphaned", "__weakref__")

    def __init__(
        self, driver: Driver, dev: int, ptr: int, size: int, handle: bytes
    ) -> None:
        self.driver = driver
        self.dev = dev
        self.ptr = ptr
        self.size = size
        self.handle = handle
        self.orphaned = False

    def __del__(self) -> None:
        try:
            self.driver.close_mem(self.dev, self.ptr)
        except Exception:  # interpreter shutdown, a lost device: nothing left to do
            pass


class PeerLease:
    """Keeps a lease on a range of the server's device memory while arrays use it (the
    memory owner of the arrays `decode` returns)."""

    __slots__ = (
        "mapping",
        "lease",
        "dev",
        "start",
        "length",
        "dtype",
        "_done",
        "__weakref__",
    )

    def __init__(
        self,
        mapping: Mapping,
        lease: int,
        dev: int,
        start: int,
        length: int,
        done: deque[tuple[int, int]],
        dtype: str = "",
    ) -> None:
        self.mapping = mapping
        self.dtype = dtype
        """The ferry dtype it arrived as (so a bf16 tensor goes back as bf16)."""
        self.lease = lease
        self.dev = dev
        self.start = start
        self.length = length
        self._done = done

    def __del__(self) -> None:
        self._done.append((self.lease, self.dev))


class Slab(FreeList):
    """One `cudaMalloc` allocation of this side's pool, carved into slots."""

    def __init__(self, driver: Driver, dev: int, alloc_id: int, size: int) -> None:
        ptr = driver.malloc(dev, size)
        try:
            self.handle = driver.mem_handle(dev, ptr)
        except BaseException:
            driver.free(dev, ptr)
            raise
        super().__init__(size)
        self.driver = driver
        self.dev = dev
        self.id = alloc_id
        self.ptr = ptr
        self.size = size

    def __del__(self) -> None:
        try:
            self.driver.free(self.dev, self.ptr)
        except Exception:
            pass


class Slot:
    """A range of a slab, in use by arrays or leases (`refs`)."""

    __slots__ = ("slab", "offset", "size", "refs")

    def __init__(self, slab: Slab, offset: int, size: int) -> None:
        self.slab = slab
        self.offset = offset
        self.size = size
        self.refs = 0


class OwnSlot:
    """Keeps a slot of this side's pool in use while arrays use it."""

    __slots__ = ("slot", "dtype", "_dropped", "__weakref__")

    def __init__(self, slot: Slot, dropped: deque[Slot], dtype: str = "") -> None:
        self.slot = slot
        self.dtype = dtype
        """The ferry dtype it was made or returned as."""
        self._dropped = dropped

    def __del__(self) -> None:
        self._dropped.append(self.slot)


class CudaChannel:
    """One connection's cuda-ipc state: the server's mappings, events and leases held
    here, and this side's pool and the leases granted to the server."""

    def __init__(
        self,
        driver: Driver,
        *,
        max_peer_bytes: int,
        max_peer_allocs: int = 4096,
        pool_limit: int = 4 << 30,
        slab_bytes: int = 64 * MIB,
    ) -> None:
        self.driver = driver
        self.uuids = driver.uuids()
        self.local = {u: i for i, u in enumerate(self.uuids) if u}
        """This process's ordinal of each usable device, by UUID ("" marks an ordinal
        whose device is not usable, e.g. compute mode prohibited)."""
        self.max_peer_bytes = max_peer_bytes
        self.max_peer_allocs = max_peer_allocs
        self.pool_limit = pool_limit
        self.slab_bytes = slab_bytes
        # the server's memory
        self.cache: dict[int, Mapping] = {}
        self.mapped = 0
        self.held: dict[int, weakref.ref[PeerLease]] = {}
        self.done: deque[tuple[int, int]] = deque()
        self.events: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        # this side's memory
        self.slabs: list[Slab] = []
        self.reserved = 0
        self.live: dict[int, Slot] = {}
        """Slots in use, by their address."""
        self.granted: dict[int, tuple[Slot, int, int]] = {}
        self.next_lease = 1
        self.next_alloc = 1
        self.dropped: deque[Slot] = deque()
        self.lock = threading.Lock()
        self.closed = False

    # ---- receiving ----------------------------------------------------------------------

    def decode(self, meta: dict[str, Any], r: object, dtype: np.dtype[Any]) -> Any:
        """A `cuda_ipc` descriptor -> a device array viewing the server's memory, after
        the checks of section 17.4 in their order."""
        device = meta.get("device")
        if not isinstance(device, str) or not re.fullmatch(r"cuda:[0-9]{1,9}", device):
            raise _bad(f"device {device!r:.40} is not cuda:N")
        if not isinstance(r, dict):
            raise _bad(f"cuda_ipc descriptor must be an object, got {r!r:.100}")
        extra = set(r) - {
            "device_uuid",
            "mem_handle",
            "alloc_id",
            "alloc_size",
            "offset",
            "len",
            "event_handle",
            "lease",
        }
        if extra:
            raise _bad(f"unknown fields {sorted(extra)}")
        uuid = r.get("device_uuid")
        if not valid_uuid(uuid):
            raise _bad(f"{uuid!r:.80} is not a device UUID")
        assert isinstance(uuid, str)
        mem = handle(r.get("mem_handle"), "mem_handle")
        event = handle(r.get("event_handle"), "event_handle")
        alloc_id = wire_int(r.get("alloc_id"), "alloc_id")
        alloc_size = wire_int(r.get("alloc_size"), "alloc_size")
        off = wire_int(r.get("offset"), "offset")
        n = wire_int(r.get("len"), "len")
        lease = wire_int(r.get("lease"), "lease")
        if alloc_size == 0:
            raise _bad("alloc_size is 0")
        if alloc_size > self.max_peer_bytes:
            raise _bad(
                f"alloc_size {alloc_size} is over the limit of {self.max_peer_bytes} bytes (max_peer_bytes)"
            )
        if off + n > alloc_size:
            raise _bad(
                f"range {off}+{n} is outside the allocation of {alloc_size} bytes"
            )
        dev = self.local.get(uuid)
        if dev is None:
            raise _bad(f"device {uuid} is not visible here")
        span, strided = checked_span(meta, dtype.itemsize, n)
        with self.lock:
            if lease in self.held:
                raise _bad(f"lease {lease} granted twice")
            mapping = self._mapping(alloc_id, alloc_size, mem, dev)
            self._wait(dev, event)
            holder = PeerLease(
                mapping, lease, dev, mapping.ptr + off, n, self.done, str(meta["dtype"])
            )
            self.held[lease] = weakref.ref(holder)
        shape = tuple(meta["shape"])
        strides = (
            tuple(s * dtype.itemsize for s in meta["strides"]) if strided else None
        )
        if span == 0:
            return self.driver.wrap(dev, 0, shape, dtype, None, holder)
        return self.driver.wrap(dev, holder.start, shape, dtype, strides, holder)

    def _mapping(self, alloc_id: int, size: int, mem: bytes, dev: int) -> Mapping:
        m = self.cache.get(alloc_id)
        if m is not None:
            if m.handle == mem:
                if m.size != size or m.dev != dev:
                    raise _bad(
                        f"allocation {alloc_id} was {m.size} bytes on local device {m.dev}, "
                        f"now claims {size} bytes on device {dev}"
                    )
                return m
            # The same id with other handle bytes: the old allocation is gone.
            del self.cache[alloc_id]
            self.mapped -= m.size
        if len(self.cache) >= self.max_peer_allocs:
            raise ProtocolError(
                f"peer CUDA allocations mapped by this connection is {len(self.cache) + 1}, over "
                f"the limit max_peer_allocs = {self.max_peer_allocs}; raise "
                "cuda_max_peer_allocs when connecting",
                "limit",
            )
        if self.mapped + size > self.max_peer_bytes:
            raise ProtocolError(
                f"peer CUDA memory mapped by this connection is {self.mapped + size}, over the "
                f"limit max_peer_bytes = {self.max_peer_bytes}; raise max_peer_bytes when "
                "connecting",
                "limit",
            )
        try:
            ptr, got = self.driver.open_mem(dev, mem)
        except Exception as e:
            raise ProtocolError(f"CUDA cuIpcOpenMemHandle failed: {e}") from None
        m = Mapping(self.driver, dev, ptr, size, mem)
        if got < size:
            raise _bad(
                f"allocation {alloc_id} claims {size} bytes but the driver mapped {got}"
            )
        self.cache[alloc_id] = m
        self.mapped += size
        return m

    def _wait(self, dev: int, handle_bytes: bytes) -> None:
        """The legacy default stream of `dev` waits on the peer's event."""
        entry = self.events.get(handle_bytes)
        if entry is None or entry[0] != dev:
            try:
                ev = self.driver.open_event(dev, handle_bytes)
            except Exception as e:
                raise ProtocolError(f"CUDA cuIpcOpenEventHandle failed: {e}") from None
            if entry is not None:
                self._destroy_event(entry)
            entry = (dev, ev)
            self.events[handle_bytes] = entry
            while len(self.events) > PEER_EVENTS:
                _, old = self.events.popitem(last=False)
                self._destroy_event(old)
        else:
            self.events.move_to_end(handle_bytes)
        try:
            self.driver.wait_event(dev, entry[1])
        except Exception as e:
            raise ProtocolError(f"CUDA cuStreamWaitEvent failed: {e}") from None

    def _destroy_event(self, entry: tuple[int, int]) -> None:
        try:
            self.driver.destroy_event(*entry)
        except Exception:
            pass

    def returned(self, r: object, meta: dict[str, Any], dtype: np.dtype[Any]) -> Any:
        """A `cuda_ipc_return` descriptor: a device array of this side's own memory."""
        device = meta.get("device")
        if not isinstance(device, str) or not device.startswith("cuda:"):
            raise _bad(f"device {device!r:.40} is not cuda:N")
        if not isinstance(r, dict) or set(r) != {
            "lease",
            "offset",
            "len",
            "event_handle",
        }:
            raise _bad(f"malformed cuda_ipc_return descriptor {r!r:.200}")
        lease = wire_int(r.get("lease"), "lease")
        off = wire_int(r.get("offset"), "offset")
        n = wire_int(r.get("len"), "len")
        event = handle(r.get("event_handle"), "event_handle")
        with self.lock:
            entry = self.granted.get(lease)
            if entry is None:
                raise _bad(f"returned lease {lease} was never granted")
            slot, start, length = entry
            if off + n > length:
                raise _bad(
                    f"returned range {off}+{n} is outside lease {lease} of {length} bytes"
                )
            span, strided = checked_span(meta, dtype.itemsize, n)
            dev = slot.slab.dev
            self._wait(dev, event)
            slot.refs += 1
        holder = OwnSlot(slot, self.dropped, str(meta["dtype"]))
        shape = tuple(meta["shape"])
        strides = (
            tuple(s * dtype.itemsize for s in meta["strides"]) if strided else None
        )
        if span == 0:
            return self.driver.wrap(dev, 0, shape, dtype, None, holder)
        ptr = slot.slab.ptr + start + off
        return self.driver.wrap(dev, ptr, shape, dtype, strides, holder)

    def control(self, body: object) -> None:
        """The server's CONTROL body: `release` (with `device` and `event`) and/or
        `retire`, parsed strictly (section 17.3); all or none of a release is applied."""
        if not isinstance(body, dict) or not body:
            raise _bad(f"malformed control body {body!r:.200}")
        extra = set(body) - {"release", "device", "event", "retire"}
        if extra:
            raise _bad(f"unknown control fields {sorted(extra)}")
        with self.lock:
            if "release" in body:
                ids = body["release"]
                uuid, ev = body.get("device"), body.get("event")
                if (
                    not isinstance(ids, list)
                    or not valid_uuid(uuid)
                    or not isinstance(ev, str)
                ):
                    raise _bad(
                        "a release needs a valid `device` UUID and an `event` handle"
                    )
                dev = self.local.get(uuid) if isinstance(uuid, str) else None
                if dev is None:
                    raise _bad(f"device {uuid} is not visible")
                raw = handle(ev, "event")
                leases = [wire_int(i, "release") for i in ids]
                for lease in leases:
                    if lease not in self.granted:
                        raise _bad(f"release of lease {lease}, which is not granted")
                    if self.granted[lease][0].slab.dev != dev:
                        raise _bad(f"release of lease {lease} names another device")
                if len(set(leases)) != len(leases):
                    raise _bad("a lease is released twice in one body")
                self._wait(dev, raw)
                for lease in leases:
                    self._unref(self.granted.pop(lease)[0])
            if "retire" in body:
                ids = body["retire"]
                if not isinstance(ids, list):
                    raise _bad("`retire` must be a list of allocation ids")
                for raw_id in [wire_int(i, "retire") for i in ids]:
                    m = self.cache.pop(raw_id, None)
                    if m is not None:
                        self.mapped -= m.size
            self._collect()

    def take_releases(self) -> list[dict[str, Any]]:
        """CONTROL bodies releasing every lease whose arrays are gone, one per device,
        each with an event recorded after this side's last use. If recording fails, the
        leases not released stay queued (and the error is raised)."""
        by_dev: dict[int, list[int]] = {}
        with self.lock:
            while self.done:
                lease, dev = self.done.popleft()
                if self.held.pop(lease, None) is not None:
                    by_dev.setdefault(dev, []).append(lease)
        out = []
        items = list(by_dev.items())
        for i, (dev, ids) in enumerate(items):
            try:
                ev = self.driver.record(dev)
            except BaseException:
                with self.lock:  # not released: queued again, for the next try
                    for d, rest in items[i:]:
                        for lease in rest:
                            self.held[lease] = _gone
                            self.done.append((lease, d))
                raise
            out.append({"release": ids, "device": self.uuids[dev], "event": b64(ev)})
        return out

    # ---- sending ------------------------------------------------------------------------

    def encode(
        self, arr: CudaArray, granted: list[int], keep: list[object]
    ) -> tuple[str, str, list[int] | None]:
        """A CUDA array to send -> (location JSON, device, element strides or None).
        Leases granted are appended to `granted` (revoked if the message is not sent);
        what must outlive the write (the lease holder of a tensor sent back) to `keep`."""
        if self.closed:
            raise CudaUnavailable("the connection is closed")
        owner = _owner(arr.obj)
        if isinstance(owner, PeerLease) and owner.mapping.orphaned:
            raise CudaUnavailable(
                "this CUDA tensor came over a connection that has closed; its memory is no "
                "longer guaranteed (pipe closed), so it cannot be sent"
            )
        dev = _device_hint(arr.obj) if arr.ptr == 0 else self.driver.device_of(arr.ptr)
        if not 0 <= dev < len(self.uuids) or not self.uuids[dev]:
            raise CudaUnavailable(
                f"the array is on cuda:{dev}, which is not a usable device here"
            )
        found = layout(arr.shape, arr.strides, arr.dtype.itemsize, arr.nbytes)
        span, strides = found if found is not None else (-1, None)  # (-1: copied)
        if arr.stream is not None and arr.stream != 1:
            self.driver.after_stream(dev, arr.stream)
        with self.lock:
            if span > 0:
                holder = self._peer_lease(owner, dev, arr.ptr, span)
                if holder is not None:
                    ev = self.driver.record(dev)
                    keep.append(holder)  # its release must not overtake this message
                    loc = (
                        '{"cuda_ipc_return":{"lease":%d,"offset":%d,"len":%d,"event_handle":"%s"}}'
                        % (holder.lease, arr.ptr - holder.start, span, b64(ev))
                    )
                    return loc, f"cuda:{dev}", strides
                slot = self._own_slot(dev, arr.ptr, span)
                if slot is not None:
                    start = arr.ptr - slot.slab.ptr
                    return (
                        self._grant(slot, start, span, granted),
                        f"cuda:{dev}",
                        strides,
                    )
            slot = self._slot(dev, arr.nbytes)
        try:
            if arr.nbytes:
                self.driver.copy(dev, slot.slab.ptr + slot.offset, arr)
            with self.lock:
                loc = self._grant(slot, slot.offset, arr.nbytes, granted)
        finally:
            with self.lock:
                self._unref(slot)  # the lease holds it now (if granted)
        return loc, f"cuda:{dev}", None

    def _peer_lease(
        self, owner: object, dev: int, ptr: int, span: int
    ) -> PeerLease | None:
        """The live lease on the server's memory holding `ptr..ptr+span`: the array's
        own (its memory owner) first, else any lease covering the range (e.g. a torch
        tensor made from a received array with DLPack)."""
        candidates: list[PeerLease] = []
        if isinstance(owner, PeerLease):
            candidates.append(owner)
        for ref in self.held.values():
            h = ref()
            if h is not None:
                candidates.append(h)
        for h in candidates:
            live = self.held.get(h.lease)
            if live is None or live() is not h:
                continue
            if h.dev == dev and h.start <= ptr and ptr + span <= h.start + h.length:
                return h
        return None

    def _own_slot(self, dev: int, ptr: int, span: int) -> Slot | None:
        for slot in self.live.values():
            base = slot.slab.ptr + slot.offset
            if slot.slab.dev == dev and base <= ptr and ptr + span <= base + slot.size:
                return slot
        return None

    def _grant(self, slot: Slot, start: int, n: int, granted: list[int]) -> str:
        slab = slot.slab
        ev = self.driver.record(slab.dev)  # (first: nothing to undo if it fails)
        lease = self.next_lease
        self.next_lease += 1
        slot.refs += 1
        self.granted[lease] = (slot, start, n)
        granted.append(lease)
        return (
            '{"cuda_ipc":{"device_uuid":"%s","mem_handle":"%s","alloc_id":%d,"alloc_size":%d,'
            '"offset":%d,"len":%d,"event_handle":"%s","lease":%d}}'
            % (
                self.uuids[slab.dev],
                b64(slab.handle),
                slab.id,
                slab.size,
                start,
                n,
                b64(ev),
                lease,
            )
        )

    def revoke(self, leases: list[int]) -> None:
        """Takes back leases granted for a message that was never sent."""
        with self.lock:
            for lease in leases:
                entry = self.granted.pop(lease, None)
                if entry is not None:
                    self._unref(entry[0])

    def alloc(self, shape: tuple[int, ...], dtype: np.dtype[Any], dev: int) -> Any:
        """A writable device array in this side's pool: sending it costs no copy."""
        if self.closed:
            raise CudaUnavailable("the connection is closed")
        if not 0 <= dev < len(self.uuids) or not self.uuids[dev]:
            usable = ", ".join(f"cuda:{i}" for i, u in enumerate(self.uuids) if u)
            raise CudaUnavailable(
                f"cuda:{dev} is not a usable device here (usable: {usable or 'none'})"
            )
        n = dtype.itemsize
        for d in shape:
            n *= d
        if n == 0:
            return self.driver.wrap(dev, 0, shape, dtype, None, None)
        with self.lock:
            slot = self._slot(dev, n)
        holder = OwnSlot(slot, self.dropped, ferry_dtype(dtype))
        return self.driver.wrap(
            dev, slot.slab.ptr + slot.offset, shape, dtype, None, holder
        )

    def _slot(self, dev: int, n: int) -> Slot:
        """A new slot of `n` bytes on `dev`, referenced once (call with the lock held)."""
        self._collect()
        align = 512
        for slab in self.slabs:
            if slab.dev == dev:
                off = slab.carve(max(n, 1), align)
                if off is not None:
                    return self._use(Slot(slab, off, n))
        size = max(self.slab_bytes, -(-n // (2 * MIB)) * 2 * MIB)
        if n > self.pool_limit:
            raise LimitError(
                f"cuda pool bytes needed is {n}, over the limit cuda_pool_limit = "
                f"{self.pool_limit} (a tensor larger than the whole pool; raise "
                "cuda_pool_limit when connecting)"
            )
        if self.reserved + size > self.pool_limit:
            size = -(-n // (2 * MIB)) * 2 * MIB
            if self.reserved + size > self.pool_limit:
                raise LimitError(
                    f"cuda pool full: no room for {n} bytes ({self.reserved} of cuda_pool_limit = "
                    f"{self.pool_limit} bytes reserved, all in use by arrays or by leases the "
                    "server holds; drop arrays, or raise cuda_pool_limit when connecting)"
                )
        slab = Slab(self.driver, dev, self.next_alloc, size)
        self.next_alloc += 1
        self.slabs.append(slab)
        self.reserved += size
        off = slab.carve(max(n, 1), align)
        assert off is not None
        return self._use(Slot(slab, off, n))

    def _use(self, slot: Slot) -> Slot:
        slot.refs = 1
        self.live[slot.slab.ptr + slot.offset] = slot
        return slot

    def _unref(self, slot: Slot) -> None:
        slot.refs -= 1
        if slot.refs == 0:
            self.live.pop(slot.slab.ptr + slot.offset, None)
            slot.slab.give_back(slot.offset, max(slot.size, 1))

    def _collect(self) -> None:
        while self.dropped:
            self._unref(self.dropped.popleft())

    # ---- closing ------------------------------------------------------------------------

    def close(self) -> None:
        """The connection ended: forgets the server's leases and this side's mappings
        (arrays still held keep theirs, orphaned) and closes the server's events."""
        with self.lock:
            self.closed = True
            for slot, _, _ in self.granted.values():
                self._unref(slot)
            self.granted.clear()
            for ref in self.held.values():
                h = ref()
                if h is not None:
                    h.mapping.orphaned = True
            self.held.clear()
            self.done.clear()
            self.cache.clear()
            self.mapped = 0
            for entry in self.events.values():
                self._destroy_event(entry)
            self.events.clear()


def is_orphaned(array: object) -> bool:
    """Whether a CUDA array received over a connection that has since closed (its bytes
    are no longer guaranteed: the server may reuse them). `False` for anything else."""
    owner = _owner(array)
    return isinstance(owner, PeerLease) and owner.mapping.orphaned


def _owner(array: object) -> object:
    """The memory owner of a CuPy array (or of the fake driver's arrays)."""
    for _ in range(64):
        data = getattr(array, "data", None)
        mem = getattr(data, "mem", None)
        owner = getattr(mem, "_owner", None) if mem is not None else None
        if owner is not None:
            return owner
        ferry_owner = getattr(array, "ferry_owner", None)
        if ferry_owner is not None:
            return ferry_owner
        base = getattr(array, "base", None)
        if base is None or base is array:
            return None
        array = base
    return None


class _Gone:
    __slots__ = ("__weakref__",)


_gone: weakref.ref[Any] = weakref.ref(_Gone())
"""A dead reference: a lease queued again for release after a failed attempt."""


def _device_hint(obj: object) -> int:
    """The device of an array without memory (pointer 0, which the driver cannot look
    up): CuPy's `device.id`, torch's `device.index`, else 0."""
    device = getattr(obj, "device", None)
    for attr in ("id", "index"):
        v = getattr(device, attr, None)
        if type(v) is int and v >= 0:
            return v
    return 0


def dtype_of(arr: CudaArray) -> str:
    """The ferry dtype to send a CUDA array as: the one ferry received or allocated it
    as (so bf16, which CuPy lacks, stays bf16), else its interface's."""
    owner = _owner(arr.obj)
    if isinstance(owner, (PeerLease, OwnSlot)) and owner.dtype in NUMPY_DTYPES:
        if NUMPY_DTYPES[owner.dtype].itemsize == arr.dtype.itemsize:
            return owner.dtype
    return ferry_dtype(arr.dtype)
