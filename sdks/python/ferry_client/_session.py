"""One connection's protocol state, sans-IO: handshake, messages with tensors, JSON-RPC.

`Session` is shared by the blocking and the asyncio client. It builds the bytes to send
(`hello`, `request`, `notification`, `close_frame`) and consumes received frames
(`on_handshake`, `on_frame`), returning what happened; the clients move the bytes.
Call order: `hello()`, then feed frames to `on_handshake()` until it returns True, then
`request()`/`on_frame()` in any order, then `close_frame()`.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import numpy.typing as npt

from . import _shm
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
    byte_span,
    frame,
    plain_span,
    uint,
)
from .errors import (
    ConnectionClosed,
    LimitError,
    ParamsError,
    ProtocolError,
    Refused,
    ResultError,
    RpcError,
)
from .tensors import NUMPY_DTYPES, Tensor, ferry_dtype

INLINE_BELOW = 16384
"""Tensors smaller than this that are not in shared memory travel inline (as ferry's own
sender does); larger ones are copied into the pool once."""

MAX_PARAM_DEPTH = 256
_ZEROS = bytes(ALIGN)
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_PREFIX_PACK = struct.Struct("<BBHIQ").pack
_SHM = '{"shm":{"segment":%d,"offset":%d,"len":%d,"lease":%d}}'
_DESC = '{"meta":{"dtype":"%s","shape":[%s],"device":"cpu"},"data":%s}'
_DESC_STRIDED = (
    '{"meta":{"dtype":"%s","shape":[%s],"strides":[%s],"device":"cpu"},"data":%s}'
)


_METHODS: dict[str, str] = {}
"""`'{"jsonrpc":"2.0","method":"NAME"'` for each method name called so far (up to
`_MAX_METHODS` of them)."""
_MAX_METHODS = 4096


def _request_json(
    method: str,
    params: object,
    call_id: int | None,
    tensors: list[tuple[npt.NDArray[Any], str]],
) -> str:
    """One JSON-RPC request (tensors in `params` become references into `tensors`)."""
    try:
        text = _METHODS.get(method) if type(method) is str else None
        if text is None:
            text = '{"jsonrpc":"2.0","method":' + _ENCODER.encode(method)
            if type(method) is str and len(_METHODS) < _MAX_METHODS:
                _METHODS[method] = text
        if params is not None:
            text += ',"params":' + params_json(params, tensors)
    except ValueError as e:  # NaN or infinity
        raise ParamsError(f"params cannot be sent as JSON: {e}") from None
    if call_id is not None:
        text += ',"id":%d' % call_id
    return text + "}"


_PEER_FAULTS = (
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    OverflowError,
    RecursionError,
)
"""What a malformed frame that no check foresaw can raise while it is decoded."""

Outcome = Union[object, RpcError, ResultError]
"""A call's result, or the error it ended with."""


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

    # ---- handshake ----------------------------------------------------------------------

    def hello(self) -> bytes:
        """The preamble and the HELLO frame (sent at once, PROTOCOL.md 6.4)."""
        channels: list[dict[str, Any]] = []
        if self.domain is not None:
            channels.append({"name": "shm", "devices": ["cpu"], "domain": self.domain})
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
        tensors: list[tuple[npt.NDArray[Any], str]] = []
        return self.message(_request_json(method, params, call_id, tensors), tensors)

    def batch(self, calls: list[tuple[str, object, int]]) -> Outgoing:
        """Several calls in one message (tensor references numbered across them)."""
        tensors: list[tuple[npt.NDArray[Any], str]] = []
        reqs = [_request_json(m, p, i, tensors) for m, p, i in calls]
        return self.message("[" + ",".join(reqs) + "]", tensors)

    def releases(self) -> bytes:
        """A CONTROL frame releasing every lease whose arrays are gone (or nothing)."""
        receiver = self.receiver
        if receiver is None or not receiver.done:
            return b""
        ids = receiver.take_releases()
        if not ids:
            return b""
        return frame(CONTROL, {"channel": "shm", "body": {"release": ids}})

    def message(
        self, app_json: str, tensors: list[tuple[npt.NDArray[Any], str]]
    ) -> Outgoing:
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
        descs: list[str] = []
        payload: list[bytes | memoryview] = []
        offset = 0
        fds: list[int] = []
        segments: list[_shm.Segment] = []
        keep: list[object] = []
        granted: list[int] = []
        pool = self.pool
        try:
            for arr, dtype in tensors:
                nbytes = arr.nbytes
                data: str | None = None
                strides: list[int] | None = None
                seg: _shm.Segment | None = None
                if pool is not None and nbytes > 0:
                    found = self._zero_copy(pool, arr, granted)
                    if found is not None:
                        data, strides, seg = found
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
                    descs.append(_DESC % (dtype, shape, data))
                else:
                    descs.append(
                        _DESC_STRIDED
                        % (dtype, shape, ",".join([str(x) for x in strides]), data)
                    )
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
        except BaseException:
            if pool is not None:
                pool.revoke(granted)
                for s in segments:
                    s.announced = False
            raise
        prefix = _PREFIX_PACK(MESSAGE, 0, len(fds), len(header), offset)
        return Outgoing(
            self.releases(), [prefix + header, *payload], fds, segments, keep
        )

    def _zero_copy(
        self, pool: _shm.ShmPool, arr: npt.NDArray[Any], granted: list[int]
    ) -> tuple[str, list[int] | None, _shm.Segment | None] | None:
        """A descriptor (location JSON, element strides, segment to announce) for an array
        already in shared memory: this side's pool, or a lease of the server's (sent back
        as `shm_return`). `None` for any other array."""
        base: object = arr.base
        for _ in range(64):
            if not isinstance(base, np.ndarray):
                break
            base = base.base
        own = type(base) is _shm.OwnView
        if not own and type(base) is not _shm.PeerView:
            return None
        itemsize = arr.dtype.itemsize
        strides: list[int] | None = None
        if arr.flags.c_contiguous:
            span = arr.nbytes
        elif all(s >= 0 and s % itemsize == 0 for s in arr.strides):
            strides = [s // itemsize for s in arr.strides]
            span, _ = byte_span(
                {"shape": list(arr.shape), "strides": strides}, itemsize
            )
        else:
            return None
        address: int = arr.__array_interface__["data"][0]
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
            return _SHM % (slot.segment.id, start, span, lease), strides, slot.segment
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

    def decode_message(self, f: Frame) -> tuple[object, list[npt.NDArray[Any]]]:
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
        arrays: list[npt.NDArray[Any]] = []
        for i, d in enumerate(descs):
            try:
                arrays.append(self._tensor(d, f))
            except ProtocolError as e:
                raise ProtocolError(f"tensor {i}: {e}", e.code) from None
        return body["header"], arrays

    def _tensor(self, d: object, f: Frame) -> npt.NDArray[Any]:
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
        if device != "cpu":
            raise ProtocolError(
                f"a {device!r} tensor, but this connection has no channel for that device"
            )
        if len(data) != 1:
            raise ProtocolError(f"a location has exactly one key, got {sorted(data)}")
        ((kind, loc),) = data.items()
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
            plain = plain_span(meta, dtype.itemsize)
            if plain is not None:
                span, strided = plain, False
            else:
                span, strided = byte_span(meta, dtype.itemsize)
            if span > n or (not strided and span != n):
                raise ProtocolError(f"tensor needs {span} bytes but {n} are present")
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


class _Slow(Exception):
    """`_fast_json` met something it leaves to `encode_params` and the JSON encoder."""


_FAST_DEPTH = 32
_FAST_ITEMS = 64
_encode_str: Callable[[str], str] = json.encoder.encode_basestring
_int_repr = int.__repr__
_float_repr = float.__repr__
_INF = float("inf")


def params_json(params: object, tensors: list[tuple[npt.NDArray[Any], str]]) -> str:
    """`params` as compact JSON text, numpy arrays and `Tensor`s replaced by
    `{"$tensor": i}` (appended to `tensors`): `_ENCODER.encode(encode_params(..))`, with
    the same text and the same errors.

    Small params of the built-in JSON types and arrays (nearly all calls) are written in
    one pass; anything else (NaN, non-string keys, subclasses, numpy scalars, deep or long
    containers) goes the general way, from the start."""
    start = len(tensors)
    try:
        return _fast_json(params, tensors, 0)
    except _Slow:
        del tensors[start:]
        return _ENCODER.encode(encode_params(params, tensors))


def _fast_json(
    v: object, tensors: list[tuple[npt.NDArray[Any], str]], depth: int
) -> str:
    t = type(v)
    if t is str:
        assert isinstance(v, str)
        return _encode_str(v)
    if t is dict:
        assert isinstance(v, dict)
        if not v:
            return "{}"
        if depth >= _FAST_DEPTH or len(v) > _FAST_ITEMS:
            raise _Slow
        items = []
        for k, x in v.items():
            if type(k) is not str:
                raise _Slow
            items.append(_encode_str(k) + ":" + _fast_json(x, tensors, depth + 1))
        return "{" + ",".join(items) + "}"
    if t is np.ndarray:
        assert isinstance(v, np.ndarray)
        tensors.append((_little_endian(v), ferry_dtype(v.dtype)))
        return '{"$tensor":%d}' % (len(tensors) - 1)
    if t is int:
        return _int_repr(v)
    if t is float:
        if v != v or v == _INF or v == -_INF:
            raise _Slow  # the general way raises the encoder's own ValueError
        return _float_repr(v)
    if t is list or t is tuple:
        assert isinstance(v, (list, tuple))
        if not v:
            return "[]"
        if depth >= _FAST_DEPTH or len(v) > _FAST_ITEMS:
            raise _Slow
        return "[" + ",".join([_fast_json(x, tensors, depth + 1) for x in v]) + "]"
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if t is Tensor:
        assert isinstance(v, Tensor)
        tensors.append((_little_endian(v.array), v.dtype))
        return '{"$tensor":%d}' % (len(tensors) - 1)
    raise _Slow


def encode_params(
    value: object, tensors: list[tuple[npt.NDArray[Any], str]], depth: int = 0
) -> object:
    """`value` as JSON, numpy arrays and `Tensor`s replaced by `{"$tensor": i}` (appended
    to `tensors` with their ferry dtype)."""
    if depth > MAX_PARAM_DEPTH:
        raise ParamsError(f"params nested deeper than {MAX_PARAM_DEPTH} levels")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Tensor):
        tensors.append((_little_endian(value.array), value.dtype))
        return {"$tensor": len(tensors) - 1}
    if isinstance(value, np.ndarray):
        tensors.append((_little_endian(value), ferry_dtype(value.dtype)))
        return {"$tensor": len(tensors) - 1}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        out: dict[str, object] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ParamsError(f"object keys must be strings, got {k!r}")
            out[k] = encode_params(v, tensors, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [encode_params(v, tensors, depth + 1) for v in value]
    raise ParamsError(f"a {type(value).__name__} cannot be sent as JSON: {value!r:.80}")


def _little_endian(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    if a.dtype.byteorder == ">":
        return a.astype(a.dtype.newbyteorder("<"))
    return a


def _is_ref(v: object) -> bool:
    """`{"$tensor": i}` (an index) or `{"$tensor": {"dtype", "shape", "data", ..}}` (inline).

    Only those two shapes are tensors; other objects whose only key is `$tensor` (an
    OpenRPC document describing the tensor schema has one) are left as they are.
    """
    if type(v) is not dict or len(v) != 1 or "$tensor" not in v:
        return False
    inner = v["$tensor"]
    if type(inner) is int:
        return True
    return (
        type(inner) is dict
        and "dtype" in inner
        and "shape" in inner
        and "data" in inner
    )


def inline_tensor(value: dict[str, Any]) -> npt.NDArray[Any]:
    """The inline form `{"dtype", "shape", "strides"?, "data": base64}` as an array."""
    name = value.get("dtype")
    if not isinstance(name, str) or name not in NUMPY_DTYPES:
        raise ResultError(f"inline tensor of unknown dtype {name!r}")
    dtype = NUMPY_DTYPES[name]
    data = value.get("data")
    if not isinstance(data, str):
        raise ResultError("inline tensor without base64 `data`")
    try:
        raw = base64.b64decode(data, validate=True)
        span, strided = byte_span(value, dtype.itemsize)
    except (binascii.Error, ValueError, ProtocolError) as e:
        raise ResultError(f"malformed inline tensor: {e}") from None
    if span > len(raw) or (not strided and span != len(raw)):
        raise ResultError(f"inline tensor needs {span} bytes but has {len(raw)}")
    shape = tuple(value["shape"])
    buf = np.frombuffer(raw, dtype=np.uint8)
    if strided:
        strides = tuple(s * dtype.itemsize for s in value["strides"])
        out: npt.NDArray[Any] = np.lib.stride_tricks.as_strided(
            buf[:span].view(dtype), shape, strides
        )
        return out
    return buf.view(dtype).reshape(shape)


def resolve_tensors(value: object, arrays: list[npt.NDArray[Any]]) -> object:
    """Replaces every tensor in `value` (parsed JSON, changed in place): `{"$tensor": i}`
    by `arrays[i]`, the inline form by its array. Raises `ResultError` for an index the
    message does not have or a malformed inline tensor."""

    def tensor(ref: dict[str, Any]) -> npt.NDArray[Any]:
        i = ref["$tensor"]
        if type(i) is dict:
            return inline_tensor(i)
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(arrays):
            raise ResultError(
                f"tensor reference {ref!r} does not name one of the message's {len(arrays)} tensors"
            )
        return arrays[i]

    if not isinstance(value, (dict, list)):
        return value  # a number, string, bool or null: no tensor in it
    if _is_ref(value):
        assert isinstance(value, dict)
        return tensor(value)
    stack: list[object] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if _is_ref(x):
                    v[k] = tensor(x)
                elif isinstance(x, (dict, list)):
                    stack.append(x)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                if _is_ref(x):
                    v[i] = tensor(x)
                elif isinstance(x, (dict, list)):
                    stack.append(x)
    return value


def responses(
    app: object, arrays: list[npt.NDArray[Any]]
) -> list[tuple[object, Outcome]]:
    """The JSON-RPC responses in a message: (id, result or error) for each."""
    items = app if isinstance(app, list) else [app]
    out: list[tuple[object, Outcome]] = []
    for r in items:
        if not isinstance(r, dict) or "id" not in r:
            raise ProtocolError(f"not a JSON-RPC response: {r!r:.200}")
        rid = r["id"]
        if "error" in r:
            e = r["error"]
            if (
                not isinstance(e, dict)
                or isinstance(e.get("code"), bool)
                or not isinstance(e.get("code"), int)
            ):
                raise ProtocolError(f"malformed JSON-RPC error object: {e!r:.200}")
            message = e.get("message")
            out.append(
                (
                    rid,
                    RpcError(
                        e["code"],
                        message if isinstance(message, str) else str(message),
                        e.get("data"),
                    ),
                )
            )
        elif "result" in r:
            try:
                out.append((rid, resolve_tensors(r["result"], arrays)))
            except ResultError as err:
                out.append((rid, err))
        else:
            raise ProtocolError(
                f"a JSON-RPC response needs `result` or `error`: {r!r:.200}"
            )
    return out
