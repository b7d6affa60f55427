"""One connection's protocol state, sans-IO: handshake, messages with tensors, JSON-RPC.

`Session` is shared by the blocking and the asyncio client. It builds the bytes to send
(`hello`, `request`, `notification`, `close_frame`) and consumes received frames
(`on_handshake`, `on_frame`), returning what happened; the clients move the bytes.
Call order: `hello()`, then feed frames to `on_handshake()` until it returns True, then
`request()`/`on_frame()` in any order, then `close_frame()`.
"""

from __future__ import annotations

import os
import struct
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _cuda, _cuda_channel, _shm
from ._jsonrpc import (
    ENCODER,
    Outcome,
    TensorRefs,
    encode_params,
    little_endian,
    params_json,
    request_json,
    responses,
)
from ._wire import (
    ALIGN,
    CLOSE,
    CONTROL,
    HELLO,
    MESSAGE,
    PREAMBLE,
    REFUSE,
    U64_MAX,
    VERSION,
    WELCOME,
    Frame,
    FrameReader,
    Limits,
    frame,
    layout,
    checked_span,
    uint,
)
from .errors import (
    ConnectionClosed,
    LimitError,
    ProtocolError,
    Refused,
)
from .tensors import NUMPY_DTYPES

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

__all__ = [
    "ENCODER",
    "Outcome",
    "Outgoing",
    "Session",
    "encode_params",
    "little_endian",
    "params_json",
    "responses",
]


_PEER_FAULTS = (
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    OverflowError,
    RecursionError,
)
"""What a malformed frame that no check foresaw can raise while it is decoded."""


@dataclass
class Outgoing:
    """What to write for one message: `before` (pending releases, a CONTROL frame, or
    empty), then the MESSAGE frame's `parts`, with `fds` attached to the first byte of
    `parts` (PROTOCOL.md section 8)."""

    before: bytes
    parts: list[bytes | memoryview]
    fds: list[int]
    segments: list[_shm.Segment]
    """Segments announced by this message: close their descriptors once it is written."""
    keep: list[object]
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
        """The descriptor up to the lease number (its end is `}}}`)."""

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


_SENT_MAX = 256
"""Most arrays `Session._sent` remembers (it starts over when full)."""


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


class Session:
    """The protocol state of one client connection (see the module docs)."""

    def __init__(
        self,
        *,
        shm: bool,
        token: str | None,
        agent: str,
        limits: Limits,
        pool_limit: int,
        max_peer_bytes: int,
        cuda: _cuda.Driver | None = None,
        cuda_unavailable: str = "",
        cuda_pool_limit: int = 4 << 30,
        cuda_max_peer_allocs: int = 4096,
    ) -> None:
        self.limits = limits
        self.reader = FrameReader(limits)
        self.domain = _shm.shm_domain() if shm else None
        self.token = token
        self.agent = agent
        self.pool_limit = pool_limit
        self.max_peer_bytes = max_peer_bytes
        self.channel = ""
        self.welcome: dict[str, Any] = {}
        self.peer_limits = Limits()
        self.receiver: _shm.ShmReceiver | None = None
        self.pool: _shm.ShmPool | None = None
        self._next_id = 1
        self.offered: list[str] = []
        self.cuda_driver = cuda
        self.cuda_domain = _cuda.domain(cuda) if cuda is not None else None
        self.cuda: _cuda_channel.CudaChannel | None = None
        self.cuda_unavailable = cuda_unavailable or (
            "this client did not offer the cuda-ipc channel (connect with cuda=True)"
        )
        """Why `cuda` is None: what a CUDA tensor's error says."""
        if cuda is not None and self.cuda_domain is None:
            self.cuda_unavailable = "no usable CUDA device, or /proc cannot be read"
        self.cuda_pool_limit = cuda_pool_limit
        self.cuda_max_peer_allocs = cuda_max_peer_allocs
        self._sent: dict[int, _Sent] = {}
        """Pool arrays sent before, by `id` (see `_Sent`)."""

    # ---- handshake ----------------------------------------------------------------------

    def hello(self) -> bytes:
        """The preamble and the HELLO frame (sent at once, PROTOCOL.md 6.4)."""
        channels: list[dict[str, Any]] = []
        if self.domain is not None:
            channels.append({"name": "shm", "devices": ["cpu"], "domain": self.domain})
        if self.cuda_domain is not None:
            channels.append(
                {"name": _cuda.NAME, "devices": ["cuda"], "domain": self.cuda_domain}
            )
        channels.append({"name": "inline", "devices": ["cpu"], "domain": {}})
        self.offered = [c["name"] for c in channels]
        hello: dict[str, Any] = {
            "protocol": "ferry",
            "version": VERSION,
            "channels": channels,
        }
        if self.token is not None:
            hello["token"] = self.token
        hello["agent"] = self.agent
        hello["limits"] = self.limits.to_json()
        return PREAMBLE + frame(HELLO, hello)

    def on_handshake(self, f: Frame) -> None:
        """The server's answer to HELLO: WELCOME sets the session up; REFUSE raises
        `Refused`; anything else is a `ProtocolError`."""
        try:
            if f.kind == REFUSE:
                refusal = (
                    f.header
                    if isinstance(f.header, dict)
                    else {"reason": repr(f.header)}
                )
                raise Refused(refusal)
            if f.kind != WELCOME:
                raise ProtocolError(
                    f"expected WELCOME or REFUSE, got frame kind {f.kind}"
                )
            w = f.header
            if not isinstance(w, dict):
                raise ProtocolError(f"WELCOME must be an object, got {w!r}")
            if w.get("version") != VERSION:
                raise ProtocolError(
                    f"the server speaks version {w.get('version')!r}, not {VERSION}"
                )
            chosen = w.get("channels")
            if not isinstance(chosen, dict) or "cpu" not in chosen:
                raise ProtocolError(f"WELCOME has no channel for cpu: {chosen!r}")
            cpu = chosen["cpu"]
            if cpu not in self.offered:
                raise ProtocolError(
                    f"the server chose channel {cpu!r}, which was not offered"
                )
            self.peer_limits = Limits.from_json(w.get("limits"))
            self.channel = str(cpu)
            self.welcome = w
            if cpu == "shm":
                self.receiver = _shm.ShmReceiver(self.max_peer_bytes)
                self.pool = _shm.ShmPool(self.pool_limit)
            cuda = chosen.get("cuda")
            if cuda is not None and (cuda != _cuda.NAME or self.cuda_domain is None):
                raise ProtocolError(
                    f"the server chose channel {cuda!r} for cuda, which was not offered"
                )
            if cuda is not None and self.cuda_driver is not None:
                self.cuda = _cuda_channel.CudaChannel(
                    self.cuda_driver,
                    max_peer_bytes=self.max_peer_bytes,
                    max_peer_allocs=self.cuda_max_peer_allocs,
                    pool_limit=self.cuda_pool_limit,
                )
            elif self.cuda_domain is not None:
                self.cuda_unavailable = (
                    "the server did not accept the cuda-ipc channel (it has no usable "
                    "CUDA device shared with this process, runs in another pid namespace "
                    "or host, or was built without the cuda-ipc feature)"
                )
        finally:
            _close_fds(f.fds)

    # ---- sending ------------------------------------------------------------------------

    def next_id(self) -> int:
        """A new request id."""
        i = self._next_id
        self._next_id += 1
        return i

    def request(self, method: str, params: object, call_id: int | None) -> Outgoing:
        """A call (or, with `call_id=None`, a notification) as frames to write."""
        tensors: TensorRefs = []
        return self.message(request_json(method, params, call_id, tensors), tensors)

    def batch(self, calls: list[tuple[str, object, int]]) -> Outgoing:
        """Several calls in one message (tensor references numbered across them)."""
        tensors: TensorRefs = []
        reqs = [request_json(m, p, i, tensors) for m, p, i in calls]
        return self.message("[" + ",".join(reqs) + "]", tensors)

    def releases(self) -> bytes:
        """CONTROL frames releasing every lease whose arrays are gone (or nothing)."""
        out = b""
        cuda = self.cuda
        if cuda is not None and cuda.done:
            for body in cuda.take_releases():
                out += frame(CONTROL, {"channel": _cuda.NAME, "body": body})
        receiver = self.receiver
        if receiver is None or not receiver.done:
            return out
        ids = receiver.take_releases()
        if not ids:
            return out
        return out + frame(CONTROL, {"channel": "shm", "body": {"release": ids}})

    def close_channels(self) -> None:
        """The connection ended: the server holds no lease of this side any more, and
        this side's leases on the server's memory are void (PROTOCOL.md 11.5, 17.3)."""
        if self.pool is not None:
            self.pool.forget_leases()
        if self.cuda is not None:
            self.cuda.close()

    def alloc_cuda(
        self, shape: tuple[int, ...], dtype: np.dtype[Any], device: str
    ) -> Any:
        """A writable device array in this connection's cuda-ipc pool."""
        dev = _cuda_ordinal(device)
        if self.cuda is None:
            raise _cuda.CudaUnavailable(
                f"cannot allocate on {device}: {self.cuda_unavailable}"
            )
        return self.cuda.alloc(shape, dtype, dev)

    def message(self, app_json: str, tensors: TensorRefs) -> Outgoing:
        """One MESSAGE frame carrying the application JSON (text) and `tensors`, preceded by
        the pending releases.

        Each tensor goes the cheapest way the channel allows: an array already in shared
        memory as a descriptor (no copy), an empty or small one inline, a large one copied
        once into the pool (PROTOCOL.md 11.3). Nothing is granted if the message turns out
        to be over the server's limits.
        """
        lim = self.peer_limits
        if not tensors:
            header = ('{"header":%s}' % app_json).encode()
            if len(header) > lim.max_header_bytes:
                raise LimitError(
                    f"message header is {len(header)} bytes, over the server's limit "
                    f"max_header_bytes = {lim.max_header_bytes}"
                )
            prefix = _PREFIX_PACK(MESSAGE, 0, 0, len(header), 0)
            return Outgoing(self.releases(), [prefix + header], [], [], [])
        if len(tensors) > lim.max_tensors:
            raise LimitError(
                f"tensors in one message is {len(tensors)}, over the server's limit max_tensors = {lim.max_tensors}"
            )
        if self._sent and self.pool is not None:
            fast = self._resend(app_json, tensors, self.pool)
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
        pool = self.pool
        try:
            memos: list[_Sent] = []
            for arr, dtype in tensors:
                if type(arr) is _cuda.CudaArray:
                    descs.append(self._cuda_desc(arr, dtype, cuda_granted, keep))
                    keep.append(arr.obj)
                    continue
                nbytes = arr.nbytes
                data: str | None = None
                strides: list[int] | None = None
                seg: _shm.Segment | None = None
                own: tuple[_shm.OwnView, _shm.Slot, int, int] | None = None
                if pool is not None and nbytes > 0:
                    found = self._zero_copy(pool, arr, granted)
                    if found is not None:
                        data, strides, seg, own = found
                        keep.append(arr)
                    elif nbytes >= INLINE_BELOW:
                        src = (
                            arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
                        )
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
                    head = desc[: desc.rindex('"lease":') + 8]
                    memos.append(_Sent(arr, dtype, holder, slot, start, span, head))
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
            before = self.releases()
        except BaseException:
            if pool is not None:
                pool.revoke(granted)
                for s in segments:
                    s.announced = False
            if self.cuda is not None:
                self.cuda.revoke(cuda_granted)
            raise
        # Remembered only now: a message that failed left its segments unannounced.
        if memos:
            sent = self._sent
            if len(sent) + len(memos) > _SENT_MAX:
                sent.clear()
            for memo in memos:
                sent[memo.key] = memo
        prefix = _PREFIX_PACK(MESSAGE, 0, len(fds), len(header), offset)
        return Outgoing(before, [prefix + header, *payload], fds, segments, keep)

    def _resend(
        self, app_json: str, tensors: TensorRefs, pool: _shm.ShmPool
    ) -> Outgoing | None:
        """`message` when every tensor is a pool array sent before with the same layout
        (`_Sent`): new leases and the remembered descriptors, nothing else to decide.
        `None` (nothing granted) when any is not, or the header is over the limit."""
        sent = self._sent
        memos: list[_Sent] = []
        for arr, wire in tensors:
            memo = sent.get(id(arr))
            if (
                memo is None
                or type(arr) is not np.ndarray
                or not memo.matches(arr, wire)
            ):
                return None
            memos.append(memo)
        granted: list[int] = []
        descs: list[str] = []
        for memo in memos:
            lease = pool.grant(memo.slot, memo.start, memo.span)
            granted.append(lease)
            descs.append(memo.head + str(lease) + "}}}")
        header = ('{"header":%s,"tensors":[%s]}' % (app_json, ",".join(descs))).encode()
        if len(header) > self.peer_limits.max_header_bytes:
            pool.revoke(granted)
            return None  # (the general way raises the limit error)
        try:
            before = self.releases()
        except BaseException:
            pool.revoke(granted)
            raise
        prefix = _PREFIX_PACK(MESSAGE, 0, 0, len(header), 0)
        keep: list[object] = [arr for arr, _ in tensors]
        return Outgoing(before, [prefix + header], [], [], keep)

    def _cuda_desc(
        self,
        arr: _cuda.CudaArray,
        dtype: str,
        granted: list[int],
        keep: list[object],
    ) -> str:
        """The descriptor of a CUDA array (section 17.2): sent back, zero-copy from the
        pool, or copied once into it."""
        if self.cuda is None:
            raise _cuda.CudaUnavailable(
                f"cannot send a CUDA tensor on this connection: {self.cuda_unavailable}"
            )
        data, device, strides = self.cuda.encode(arr, granted, keep)
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
        self, pool: _shm.ShmPool, arr: npt.NDArray[Any], granted: list[int]
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
        receiver = self.receiver
        if receiver is None or base.lease not in receiver.held:
            return None
        off = address - base.start
        if off < 0 or off + span > base.length:
            return None
        return (
            '{"shm_return":{"lease":%d,"offset":%d,"len":%d}}'
            % (base.lease, off, span),
            strides,
            None,
            None,
        )

    def close_frame(self, code: str = "normal", message: str = "") -> bytes:
        """A CLOSE frame."""
        return frame(CLOSE, {"code": code, "message": message})

    # ---- receiving ----------------------------------------------------------------------

    def on_frame(self, f: Frame) -> list[tuple[object, Outcome]]:
        """A frame after the handshake -> the responses it carries, as (id, outcome).

        Raises `ConnectionClosed` for CLOSE and `ProtocolError` for anything the protocol
        does not allow (the caller then closes the connection with that error's code).
        """
        try:
            if f.kind == MESSAGE:  # (the usual frame first)
                app, arrays = self.decode_message(f)
                return responses(app, arrays)
            return self._on_frame(f)
        except _PEER_FAULTS as e:
            # Anything the checks did not foresee is still the peer's fault, never a crash.
            raise ProtocolError(f"malformed frame: {e!r:.300}") from None
        finally:
            if f.fds:
                _close_fds(f.fds)

    def receive(self, f: Frame) -> tuple[object, list[npt.NDArray[Any]]] | None:
        """A frame after the handshake, at the message level (no JSON-RPC) -> the message
        it carries (its application JSON and its tensors as arrays), or `None` for a frame
        that carries none (the shm channel's control frames).

        Raises as `on_frame` does.
        """
        try:
            if f.kind == MESSAGE:
                return self.decode_message(f)
            self._on_frame(f)  # (control: applied; close: raises)
            return None
        except _PEER_FAULTS as e:
            raise ProtocolError(f"malformed frame: {e!r:.300}") from None
        finally:
            if f.fds:
                _close_fds(f.fds)

    def _on_frame(self, f: Frame) -> list[tuple[object, Outcome]]:
        if f.kind == MESSAGE:
            app, arrays = self.decode_message(f)
            return responses(app, arrays)
        if f.kind == CONTROL:
            h = f.header
            if not isinstance(h, dict) or "channel" not in h or "body" not in h:
                raise ProtocolError(f"malformed frame header: control frame {h!r:.200}")
            if h["channel"] == _cuda.NAME and self.cuda is not None:
                self.cuda.control(h["body"])
                return []
            if h["channel"] != "shm" or self.pool is None:
                raise ProtocolError(
                    f"malformed frame header: control frame for channel {h['channel']!r:.100}, "
                    "which this pipe does not use"
                )
            self.pool.release(h["body"])
            return []
        if f.kind == CLOSE:
            h = f.header if isinstance(f.header, dict) else {}
            code = h.get("code", "normal")
            if code == "normal":
                raise ConnectionClosed("the server closed the connection", "normal")
            raise ConnectionClosed(
                f"the server closed the connection: {code}: {h.get('message', '')}",
                str(code),
            )
        raise ProtocolError(f"unexpected frame kind {f.kind} (after the handshake)")

    def decode_message(self, f: Frame) -> tuple[object, list[Any]]:
        """A MESSAGE frame -> its application JSON and its tensors as arrays (validated)."""
        body = f.header
        if not isinstance(body, dict) or "header" not in body:
            raise ProtocolError(
                "malformed frame header: a MESSAGE needs a `header` field"
            )
        descs = body.get("tensors", [])
        if descs is None:
            descs = []
        if not isinstance(descs, list):
            raise ProtocolError("malformed frame header: `tensors` must be a list")
        if len(descs) > self.limits.max_tensors:
            raise ProtocolError(
                f"tensors in a received message is {len(descs)}, over the limit max_tensors = {self.limits.max_tensors}",
                "limit",
            )
        arrays: list[Any] = []
        for i, d in enumerate(descs):
            try:
                arrays.append(self._tensor(d, f))
            except ProtocolError as e:
                raise ProtocolError(f"tensor {i}: {e}", e.code) from None
        return body["header"], arrays

    def _tensor(self, d: object, f: Frame) -> Any:
        if (
            not isinstance(d, dict)
            or not isinstance(meta := d.get("meta"), dict)
            or not isinstance(data := d.get("data"), dict)
        ):
            raise ProtocolError(f"malformed tensor descriptor {d!r}")
        name = meta.get("dtype")
        dtype = NUMPY_DTYPES.get(name) if isinstance(name, str) else None
        if dtype is None:
            raise ProtocolError(f"unknown dtype {name!r}")
        device = meta.get("device", "cpu")
        if len(data) != 1:
            raise ProtocolError(f"a location has exactly one key, got {sorted(data)}")
        ((kind, loc),) = data.items()
        if device != "cpu":
            if self.cuda is None:
                raise ProtocolError(
                    f"a {device!r:.40} tensor, but this connection has no channel for that "
                    f"device ({self.cuda_unavailable})"
                )
            if kind == "cuda_ipc":
                return self.cuda.decode(meta, loc, dtype)
            if kind == "cuda_ipc_return":
                return self.cuda.returned(loc, meta, dtype)
            raise ProtocolError(
                f"location {kind!r:.40} cannot carry a {device!r:.40} tensor"
            )
        if kind == "inline":
            if not isinstance(loc, dict):
                raise ProtocolError(f"inline location must be an object, got {loc!r}")
            off, n = loc.get("offset"), loc.get("len")
            if type(off) is not int or not 0 <= off <= U64_MAX:
                off = uint(off, "offset")
            if type(n) is not int or not 0 <= n <= U64_MAX:
                n = uint(n, "len")
            if off + n > len(f.payload):
                raise ProtocolError(
                    f"range {off}+{n} is outside the payload of {len(f.payload)} bytes"
                )
            span, strided = checked_span(meta, dtype.itemsize, n)
            shape = tuple(meta["shape"])
            if span == 0:
                return np.empty(shape, dtype)
            raw = np.frombuffer(f.payload, dtype=np.uint8, count=n, offset=off)
            if strided:
                strides = tuple(s * dtype.itemsize for s in meta["strides"])
                strided_view: npt.NDArray[Any] = np.lib.stride_tricks.as_strided(
                    raw[:span].view(dtype), shape, strides
                )
                return strided_view
            return raw.view(dtype).reshape(shape)
        if kind == "shm":
            if self.receiver is None:
                raise ProtocolError(
                    "channel inline: invalid descriptor from peer: unexpected location shm"
                )
            return self.receiver.decode(meta, loc, dtype, f.fds)
        if kind == "shm_return":
            if self.pool is None:
                raise ProtocolError(
                    "channel inline: invalid descriptor from peer: unexpected location shm_return"
                )
            return self.pool.returned(loc, meta, dtype)
        raise ProtocolError(f"unknown location {kind!r}")


def _cuda_ordinal(device: str) -> int:
    """`"cuda:N"` -> N (this process's ordinal)."""
    name, _, num = device.partition(":")
    if name != "cuda" or not num.isdigit():
        raise ValueError(f"device must be 'cpu' or 'cuda:N', got {device!r}")
    return int(num)
