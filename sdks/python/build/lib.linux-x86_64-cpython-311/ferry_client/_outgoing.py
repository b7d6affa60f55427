"""Building MESSAGE frames with tensors, for a `Session`: each tensor goes the cheapest
way the channel allows (PROTOCOL.md 11.3), and a pool array sent again reuses its
descriptor (`_Sent`). Also what the layers above use to hand a message over: its
application JSON as text (`ENCODER`) and its tensors (`TensorRefs`, little-endian)."""

from __future__ import annotations

import json
import struct
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from . import _cuda, _shm
from ._wire import ALIGN, MESSAGE, layout
from .errors import LimitError

if TYPE_CHECKING:
    from ._session import Session

ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""Compact JSON text for a message's application JSON (NaN and infinities refused)."""

TensorRefs = list[tuple[Any, str]]
"""The tensors a message carries, in reference order: (numpy array or `CudaArray`,
ferry dtype)."""


def little_endian(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """`a`, or a little-endian copy of it (tensors travel little-endian)."""
    if a.dtype.byteorder == ">":
        return a.astype(a.dtype.newbyteorder("<"))
    return a


INLINE_BELOW = 16384
"""Tensors smaller than this that are not in shared memory travel inline (as ferry's own
sender does); larger ones are copied into the pool once."""

_ZEROS = bytes(ALIGN)
_PREFIX_PACK = struct.Struct("<BBHIQ").pack
_SHM = '{"shm":{"segment":%d,"offset":%d,"len":%d,"lease":%d}}'
_DESC = '{"meta":{"dtype":"%s","shape":[%s],"device":"%s"},"data":%s}'
_DESC_STRIDED = (
    '{"meta":{"dtype":"%s","shape":[%s],"strides":[%s],"device":"%s"},"data":%s}'
)


class Outgoing:
    """What to write for one message: `before` (pending releases, a CONTROL frame, or
    empty), then the MESSAGE frame's `parts`, with `fds` attached to the first byte of
    `parts` (PROTOCOL.md section 8)."""

    __slots__ = ("before", "parts", "fds", "segments", "keep")

    def __init__(
        self,
        before: bytes,
        parts: list[bytes | memoryview],
        fds: list[int],
        segments: list[_shm.Segment],
        keep: list[object],
    ) -> None:
        self.before = before
        self.parts = parts
        self.fds = fds
        self.segments = segments
        """Segments announced by this message: close their descriptors once it is
        written."""
        self.keep = keep
        """Arrays whose memory the frame refers to, kept alive until it is written."""

    def done(self) -> None:
        """The message was written (or never will be): closes announced descriptors."""
        for seg in self.segments:
            seg.close_fd()
        self.keep.clear()


class _Sent:
    """What a zero-copy descriptor of one pool array looked like (`Session._sent`): sending
    the same array again (a buffer filled and sent in a loop) then costs a lease and a
    string join, not the checks and formatting of the first time."""

    __slots__ = (
        "key",
        "ref",
        "holder",
        "shape",
        "strides",
        "dtype",
        "wire",
        "slot",
        "start",
        "span",
        "head",
        "tail",
    )

    def __init__(
        self,
        arr: npt.NDArray[Any],
        wire: str,
        holder: _shm.OwnView,
        slot: _shm.Slot,
        start: int,
        span: int,
        head: str,
        tail: str,
    ) -> None:
        self.key = id(arr)
        self.ref = weakref.ref(arr)
        self.holder = id(holder)
        """The holder's id, not the holder: a reference would keep its slot in use."""
        self.shape = arr.shape
        self.strides = arr.strides
        self.dtype = arr.dtype
        self.wire = wire
        """The ferry dtype it went as (numpy's u16 and bf16 compare equal)."""
        self.slot = slot
        self.start = start
        self.span = span
        self.head = head
        """The descriptor up to the lease number."""
        self.tail = tail
        """The descriptor after the lease number when sent again (with `lazy_release`)."""

    def matches(self, arr: npt.NDArray[Any], wire: str) -> bool:
        """Whether `arr` is the same array as then, going as the same dtype, with the same
        layout, in a segment the server knows. (An array's data cannot move without its
        base changing; while `arr` lives, so does its base holder, which owns the slot.)"""
        return (
            self.ref() is arr
            and wire == self.wire
            and self.slot.segment.announced
            and id(_base(arr)) == self.holder
            and arr.dtype is self.dtype
            and arr.shape == self.shape
            and arr.strides == self.strides
        )


def _base(arr: npt.NDArray[Any]) -> object:
    """`arr.base` (numpy's stubs type it as an array or None; a pool array's is a holder)."""
    base: object = arr.base
    return base


_LAZY = ',"lazy_release":true}}}'
"""The end of a re-sent array's descriptor: this side keeps that memory in use (the
array lives on), so the server may batch the lease's release by count and time instead
of returning it with the answer because it is large (PROTOCOL.md 11.5)."""
_LAZY_COMPACT = ",true]"
"""`_LAZY` in the compact form (PROTOCOL.md 7.3)."""

_SENT_MAX = 256
"""Most arrays `Session._sent` remembers (it starts over when full)."""


def build_message(s: Session, app_json: str, tensors: TensorRefs) -> Outgoing:
    """One MESSAGE frame carrying the application JSON (text) and `tensors`, preceded by
    the pending releases.

    Each tensor goes the cheapest way the channel allows: an array already in shared
    memory as a descriptor (no copy), an empty or small one inline, a large one copied
    once into the pool (PROTOCOL.md 11.3). Nothing is granted if the message turns out
    to be over the server's limits.
    """
    lim = s.peer_limits
    if not tensors:
        header = ('{"header":%s}' % app_json).encode()
        if len(header) > lim.max_header_bytes:
            raise LimitError(
                f"message header is {len(header)} bytes, over the server's limit "
                f"max_header_bytes = {lim.max_header_bytes}"
            )
        prefix = _PREFIX_PACK(MESSAGE, 0, 0, len(header), 0)
        return Outgoing(s.releases(), [prefix + header], [], [], [])
    if len(tensors) > lim.max_tensors:
        raise LimitError(
            f"tensors in one message is {len(tensors)}, over the server's limit max_tensors = {lim.max_tensors}"
        )
    if s._sent and s.pool is not None:
        fast = _resend(s, app_json, tensors, s.pool)
        if fast is not None:
            return fast
    descs: list[str] = []
    payload: list[bytes | memoryview] = []
    offset = 0
    fds: list[int] = []
    segments: list[_shm.Segment] = []
    keep: list[object] = []
    granted: list[int] = []
    cuda_granted: list[int] = []
    pool = s.pool
    try:
        memos: list[_Sent] = []
        for arr, dtype in tensors:
            if type(arr) is _cuda.CudaArray:
                descs.append(_cuda_desc(s, arr, dtype, cuda_granted, keep))
                keep.append(arr.obj)
                continue
            nbytes = arr.nbytes
            data: str | None = None
            strides: list[int] | None = None
            seg: _shm.Segment | None = None
            own: tuple[_shm.OwnView, _shm.Slot, int, int] | None = None
            if pool is not None and nbytes > 0:
                found = _zero_copy(s, pool, arr, granted)
                if found is not None:
                    data, strides, seg, own = found
                    keep.append(arr)
                elif nbytes >= INLINE_BELOW:
                    src = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
                    slot, start = pool.copy_in(src)
                    lease = pool.grant(slot, start, nbytes)
                    granted.append(lease)
                    seg = slot.segment
                    data = _SHM % (seg.id, start, nbytes, lease)
                if data is not None and seg is not None and not seg.announced:
                    data = data[:-2] + ',"announce":{"fd":%d,"size":%d}}}' % (
                        len(fds),
                        seg.size,
                    )
                    fds.append(seg.fd)
                    segments.append(seg)
                    seg.announced = True
                    own = None  # (remembered once its segment is announced)
            if data is None:
                pad = -offset % ALIGN
                if pad:
                    payload.append(_ZEROS[:pad])
                    offset += pad
                src = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
                if nbytes:
                    payload.append(src.reshape(-1).view(np.uint8).data)
                    keep.append(src)
                data = '{"inline":{"offset":%d,"len":%d}}' % (offset, nbytes)
                offset += nbytes
            shape = ",".join([str(d) for d in arr.shape])
            if strides is None:
                desc = _DESC % (dtype, shape, "cpu", data)
            else:
                desc = _DESC_STRIDED % (
                    dtype,
                    shape,
                    ",".join([str(x) for x in strides]),
                    "cpu",
                    data,
                )
            descs.append(desc)
            if own is not None:
                holder, slot, start, span = own
                if s.compact and strides is None:
                    head = '["%s",[%s],"shm",%d,%d,%d,' % (
                        dtype,
                        shape,
                        slot.segment.id,
                        start,
                        span,
                    )
                    tail = _LAZY_COMPACT
                else:
                    head = desc[: desc.rindex('"lease":') + 8]
                    tail = _LAZY
                memos.append(_Sent(arr, dtype, holder, slot, start, span, head, tail))
        if offset > lim.max_payload_bytes:
            raise LimitError(
                f"message payload is {offset} bytes, over the server's limit max_payload_bytes = "
                f"{lim.max_payload_bytes}"
            )
        if descs:
            header = (
                '{"header":%s,"tensors":[%s]}' % (app_json, ",".join(descs))
            ).encode()
        else:
            header = ('{"header":%s}' % app_json).encode()
        if len(header) > lim.max_header_bytes:
            raise LimitError(
                f"message header is {len(header)} bytes, over the server's limit max_header_bytes = "
                f"{lim.max_header_bytes}"
            )
        before = s.releases()
    except BaseException:
        if pool is not None:
            pool.revoke(granted)
            for announced in segments:
                announced.announced = False
        if s.cuda is not None:
            s.cuda.revoke(cuda_granted)
        raise
    # Remembered only now: a message that failed left its segments unannounced.
    if memos:
        sent = s._sent
        if len(sent) + len(memos) > _SENT_MAX:
            sent.clear()
        for memo in memos:
            sent[memo.key] = memo
    prefix = _PREFIX_PACK(MESSAGE, 0, len(fds), len(header), offset)
    return Outgoing(before, [prefix + header, *payload], fds, segments, keep)


def _resend(
    s: Session, app_json: str, tensors: TensorRefs, pool: _shm.ShmPool
) -> Outgoing | None:
    """`message` when every tensor is a pool array sent before with the same layout
    (`_Sent`): new leases and the remembered descriptors, nothing else to decide.
    `None` (nothing granted) when any is not, or the header is over the limit."""
    sent = s._sent
    memos: list[_Sent] = []
    for arr, wire in tensors:
        memo = sent.get(id(arr))
        if memo is None or type(arr) is not np.ndarray or not memo.matches(arr, wire):
            return None
        memos.append(memo)
    granted: list[int] = []
    descs: list[str] = []
    for memo in memos:
        lease = pool.grant(memo.slot, memo.start, memo.span)
        granted.append(lease)
        descs.append(memo.head + str(lease) + memo.tail)
    header = ('{"header":%s,"tensors":[%s]}' % (app_json, ",".join(descs))).encode()
    if len(header) > s.peer_limits.max_header_bytes:
        pool.revoke(granted)
        return None  # (the general way raises the limit error)
    try:
        before = s.releases()
    except BaseException:
        pool.revoke(granted)
        raise
    prefix = _PREFIX_PACK(MESSAGE, 0, 0, len(header), 0)
    keep: list[object] = [arr for arr, _ in tensors]
    return Outgoing(before, [prefix + header], [], [], keep)


def _cuda_desc(
    s: Session,
    arr: _cuda.CudaArray,
    dtype: str,
    granted: list[int],
    keep: list[object],
) -> str:
    """The descriptor of a CUDA array (section 17.2): sent back, zero-copy from the
    pool, or copied once into it."""
    if s.cuda is None:
        raise _cuda.CudaUnavailable(
            f"cannot send a CUDA tensor on this connection: {s.cuda_unavailable}"
        )
    data, device, strides = s.cuda.encode(arr, granted, keep)
    shape = ",".join([str(d) for d in arr.shape])
    if strides is None:
        return _DESC % (dtype, shape, device, data)
    return _DESC_STRIDED % (
        dtype,
        shape,
        ",".join([str(x) for x in strides]),
        device,
        data,
    )


def _zero_copy(
    s: Session, pool: _shm.ShmPool, arr: npt.NDArray[Any], granted: list[int]
) -> (
    tuple[
        str,
        list[int] | None,
        _shm.Segment | None,
        tuple[_shm.OwnView, _shm.Slot, int, int] | None,
    ]
    | None
):
    """A descriptor (location JSON, element strides, segment to announce, and what
    `_Sent` remembers of an array made straight from a pool holder) for an array
    already in shared memory: this side's pool, or a lease of the server's (sent back
    as `shm_return`). `None` for any other array."""
    base: object = arr.base
    direct = type(base) is _shm.OwnView or type(base) is _shm.PeerView
    for _ in range(64):
        if not isinstance(base, np.ndarray):
            break
        base = base.base
    own = type(base) is _shm.OwnView
    if not own and type(base) is not _shm.PeerView:
        return None
    found = layout(
        arr.shape,
        None if arr.flags.c_contiguous else arr.strides,
        arr.dtype.itemsize,
        arr.nbytes,
    )
    if found is None:
        return None
    span, strides = found
    # An array made straight from a view holder (`alloc`, a received array) starts at
    # the holder's address; only a view of it needs the array's own (a slower lookup:
    # `__array_interface__` builds a new dict).
    if direct:
        assert isinstance(base, (_shm.OwnView, _shm.PeerView))
        address: int = base.__array_interface__["data"][0]
    else:
        address = arr.__array_interface__["data"][0]
    if own:
        assert isinstance(base, _shm.OwnView)
        slot = base.slot
        if base.pool is not pool:
            return None
        start = address - slot.segment.address
        if start < slot.offset or start + span > slot.offset + slot.size:
            return None
        lease = pool.grant(slot, start, span)
        granted.append(lease)
        memo = (base, slot, start, span) if direct else None
        return (
            _SHM % (slot.segment.id, start, span, lease),
            strides,
            slot.segment,
            memo,
        )
    assert isinstance(base, _shm.PeerView)
    receiver = s.receiver
    if receiver is None or base.lease not in receiver.held:
        return None
    off = address - base.start
    if off < 0 or off + span > base.length:
        return None
    return (
        '{"shm_return":{"lease":%d,"offset":%d,"len":%d}}' % (base.lease, off, span),
        strides,
        None,
        None,
    )
