"""The frame layer of the ferry protocol (docs/PROTOCOL.md sections 3-10), sans-IO.

`FrameReader` turns the bytes (and file descriptors) read from a socket into checked
frames; `frame()` builds the bytes of one frame. Nothing here touches a socket.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from . import _constants as wire
from ._constants import ALIGN as ALIGN
from ._constants import CLOSE as CLOSE
from ._constants import CONTROL as CONTROL
from ._constants import HELLO as HELLO
from ._constants import MAGIC as MAGIC
from ._constants import MAX_DIMS as MAX_DIMS
from ._constants import MESSAGE as MESSAGE
from ._constants import REFUSE as REFUSE
from ._constants import WELCOME as WELCOME
from .errors import ProtocolError

# (The protocol's constants are generated from the Rust tables into `_constants`; this
# module re-exports those the rest of the package takes from here.)
VERSION = wire.PROTOCOL_VERSION
PREAMBLE = MAGIC + struct.pack("<H", VERSION)
PREFIX = struct.Struct("<BBHIQ")
"""kind, flags, descriptor count, header length, payload length."""
_UNPACK = PREFIX.unpack_from
_DECODER = json.JSONDecoder()
_SCAN: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
"""The decoder's scanner: one JSON value at an index -> (value, end)."""

U64_MAX: Final = 2**64 - 1
SMALL_UINT: Final = 2**62 - 1
"""The largest integer a compiled module compares without a call (mypyc's short ints):
`uint` tests `0 <= x <= SMALL_UINT` first and only larger values against its top."""
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
MAX_FDS_PER_RECV = 253
"""Linux SCM_MAX_FD: the most descriptors one recvmsg may carry."""
MAX_QUEUED_FDS = 1024
"""The most received descriptors waiting for a frame to claim them."""


@dataclass(frozen=True)
class Limits:
    """Receive limits of one side (PROTOCOL.md section 6.2); each side announces its own."""

    max_header_bytes: int = wire.DEFAULT_MAX_HEADER_BYTES
    max_payload_bytes: int = wire.DEFAULT_MAX_PAYLOAD_BYTES
    max_tensors: int = wire.DEFAULT_MAX_TENSORS
    max_fds: int = wire.DEFAULT_MAX_FDS

    def to_json(self) -> dict[str, int]:
        """The `Limits` JSON object."""
        return {
            "max_header_bytes": self.max_header_bytes,
            "max_payload_bytes": self.max_payload_bytes,
            "max_tensors": self.max_tensors,
            "max_fds": self.max_fds,
        }

    @staticmethod
    def from_json(value: object) -> Limits:
        """Limits announced by the peer; missing fields take their defaults."""
        if value is None:
            return Limits()
        if not isinstance(value, dict):
            raise ProtocolError(f"limits must be an object, got {value!r}")
        bounds = {
            "max_header_bytes": 2**32 - 1,
            "max_payload_bytes": U64_MAX,
            "max_tensors": 2**32 - 1,
            "max_fds": 2**16 - 1,
        }
        fields: dict[str, int] = {}
        for name, top in bounds.items():
            if name in value:
                fields[name] = uint(value[name], f"limits.{name}", top)
        return Limits(**fields)


def dumps(value: object) -> bytes:
    """Compact JSON as serde_json writes it; NaN and infinities are refused."""
    return json.dumps(
        value, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def decode_json(text: str) -> Any:
    """`json.JSONDecoder().decode(text)`, with the same result and the same exceptions,
    minus two regex matches and two Python calls when `text` is one JSON value with no
    surrounding whitespace (every frame header a ferry peer writes)."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:  # leading whitespace, or no value: decode() says which
        return _DECODER.decode(text)
    if end != len(text):  # trailing whitespace or extra data: decode() decides
        return _DECODER.decode(text)
    return value


def loads(data: bytes | bytearray | memoryview, what: str) -> Any:
    """Parses JSON (UTF-8) from the peer; anything wrong is a `ProtocolError`."""
    return _loads_text(data, what)[0]


def _loads_text(data: bytes | bytearray | memoryview, what: str) -> tuple[Any, str]:
    """The parsed JSON and its text."""
    try:
        text = bytes(data).decode()
        return decode_json(text), text
    except (ValueError, RecursionError) as e:
        raise ProtocolError(f"malformed {what}: {e}") from None


def tensor_keys(text: str) -> int:
    """How many `{"$tensor": ...}` (and `{"$tensor_ref": ...}`) objects JSON `text` holds
    at most, or -1 when it cannot tell (a `\\u` escape could spell the key).

    Counts the quoted key `"$tensor"` at C speed: in JSON text those nine characters are the
    key, or a string value equal to it (a count too high is harmless), never part of another
    string (whose quotes would be escaped). `resolve_tensors` stops walking a result once it
    has replaced that many, so a result with a large manifest and few tensors (a tensor
    store's `store.open`) is not walked to its end, and one with no tensor not at all.
    """
    if "\\u" in text:
        return -1
    return text.count('"$tensor"') + text.count('"$tensor_ref"')


MAX_WIRE_INT: Final = 2**53 - 1
"""The largest 64-bit value in a channel's JSON (tensor locations and CONTROL bodies: ids,
leases, offsets, lengths, sizes): 2^53 - 1, the largest integer a JSON number keeps exactly
in JavaScript. Integers are JSON numbers, never strings (PROTOCOL.md 5.5)."""


def wire_int(value: object, what: str) -> int:
    """`value` if it is an integer in `0..=MAX_WIRE_INT`, else a `ProtocolError`."""
    if type(value) is int and 0 <= value <= MAX_WIRE_INT:
        return value
    return uint(value, what, MAX_WIRE_INT)


def uint(value: object, what: str, top: int | None = None) -> int:
    """`value` if it is an integer in `0..=top` (default `U64_MAX`), else a
    `ProtocolError`."""
    if top is None:
        if type(value) is int and 0 <= value <= SMALL_UINT:
            return value  # (the common case, without a call into the long-integer code)
        top = U64_MAX
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
        raise ProtocolError(f"{what}: expected an integer in 0..={top}, got {value!r}")
    return value


def frame(kind: int, header: object, payload_len: int = 0, fds: int = 0) -> bytes:
    """Prefix and header of one frame (the payload, if any, follows separately)."""
    h = dumps(header)
    return PREFIX.pack(kind, 0, fds, len(h), payload_len) + h


class Frame:
    """One received frame: its kind, parsed JSON header, payload and descriptors.

    `fds` are the frame's descriptors, in order; whoever uses one sets its slot to -1, and
    the rest are closed by `close_fds`.
    """

    # (A plain class, not a dataclass: mypyc cannot compile a dataclass field typed
    # `bytearray`.)
    __slots__ = ("kind", "header", "payload", "fds", "refs")

    def __init__(
        self,
        kind: int,
        header: Any,
        payload: bytearray | mmap.mmap,
        fds: list[int],
        refs: int = -1,
    ) -> None:
        self.kind = kind
        self.header = header
        self.payload = payload
        self.fds = fds
        self.refs = refs
        """At most this many `{"$tensor": ...}` objects in `header` (-1: unknown), see
        `tensor_keys`."""

    def __repr__(self) -> str:
        return (
            f"Frame(kind={self.kind}, header={self.header!r:.200}, "
            f"payload={len(self.payload)} bytes, fds={self.fds})"
        )


_SCRATCH = 1 << 16

# Payloads larger than this are read into an anonymous mapping, whose pages the kernel
# backs only as bytes land in them: a peer announcing gigabytes and sending a few bytes
# costs a few bytes (a bytearray would be zeroed, all of it, before the first byte).
_LAZY_PAYLOAD = 256 << 10


def _payload_buffer(n: int) -> bytearray | mmap.mmap:
    """A writable buffer of `n` bytes that commits memory only as it is written."""
    if n <= _LAZY_PAYLOAD:
        return bytearray(n)
    try:
        return mmap.mmap(-1, n)
    except (OSError, OverflowError, ValueError) as e:
        raise ProtocolError(
            f"cannot reserve {n} bytes for a frame payload: {e}", "limit"
        ) from None


class FrameReader:
    """Frames out of a byte stream, checked against this side's `Limits` before any body
    byte is read or allocated.

    Feed it with `feed(data, fds)` (bytes read with `recvmsg`, and the descriptors that came
    with them), or, while it is in the middle of a large payload, read straight into
    `direct()` and report with `filled(n, fds)`. Take frames out with `next_frame()` until it
    returns `None`. Descriptors join one FIFO queue and are given to frames by their prefix's
    count (PROTOCOL.md section 8).
    """

    def __init__(self, limits: Limits, expect_preamble: bool = True) -> None:
        self.limits = limits
        self._buf = bytearray()
        self._fds: deque[int] = deque()
        self._preamble = expect_preamble
        self._prefix: tuple[int, int, int, int] | None = None  # kind, nfds, hlen, plen
        self._header: Any = None
        self._have_header = False
        self._refs = -1
        self._payload: bytearray | mmap.mmap | None = None
        self._got = 0

    def _queue(self, fds: list[int]) -> None:
        if not fds:
            return
        self._fds.extend(fds)
        if len(self._fds) > MAX_QUEUED_FDS:
            raise ProtocolError(
                f"{len(self._fds)} file descriptors arrived that no frame claims "
                f"(at most {MAX_QUEUED_FDS} may wait)"
            )

    def feed(self, data: bytes | bytearray | memoryview, fds: list[int]) -> None:
        """Bytes read from the stream, and the descriptors that arrived with them."""
        if fds:
            self._queue(fds)
        if self._payload is not None:
            take = min(len(data), len(self._payload) - self._got)
            self._payload[self._got : self._got + take] = data[:take]
            self._got += take
            data = data[take:]
        self._buf += data

    @property
    def in_payload(self) -> bool:
        """Whether a frame's payload is being read (only then can `direct()` say where)."""
        return self._payload is not None

    def direct(self) -> memoryview | None:
        """Where to read the rest of a large payload without copying it, if anywhere."""
        if self._payload is None or self._buf:
            return None
        rest = len(self._payload) - self._got
        if rest < _SCRATCH:
            return None
        return memoryview(self._payload)[self._got :]

    def filled(self, n: int, fds: list[int]) -> None:
        """`n` bytes were read into `direct()`, with these descriptors."""
        self._queue(fds)
        self._got += n

    def next_frame(self) -> Frame | None:
        """The next complete frame, or `None` until more bytes arrive."""
        buf = self._buf
        if self._prefix is None and not self._preamble:
            if len(buf) < 16:
                return None  # not even a prefix
            # Fast path: a whole frame without payload or descriptors (most of them).
            kind, flags, nfds, hlen, plen = _UNPACK(buf)
            end = 16 + hlen
            if (
                not flags
                and not nfds
                and not plen
                and HELLO <= kind <= CLOSE
                and len(buf) >= end
                and hlen <= self.limits.max_header_bytes
            ):
                try:
                    text = buf[16:end].decode()
                    header = decode_json(text)
                except (ValueError, RecursionError) as e:
                    raise ProtocolError(f"malformed frame header: {e}") from None
                del buf[:end]
                return Frame(kind, header, bytearray(), [], tensor_keys(text))
        return self._next_frame()

    def _next_frame(self) -> Frame | None:
        if self._preamble:
            if len(self._buf) < len(PREAMBLE):
                return None
            if bytes(self._buf[:6]) != MAGIC:
                head = bytes(self._buf[:8]).hex(" ")
                raise ProtocolError(f"not a ferry peer: the stream starts with {head}")
            del self._buf[:8]
            self._preamble = False
        if self._prefix is None:
            if len(self._buf) < PREFIX.size:
                return None
            kind, flags, nfds, hlen, plen = PREFIX.unpack_from(self._buf)
            del self._buf[: PREFIX.size]
            if not HELLO <= kind <= CLOSE:
                raise ProtocolError(f"unexpected frame kind {kind} (unknown kind)")
            if flags != 0:
                raise ProtocolError(
                    f"frame flags {flags:#04x} are reserved and must be 0"
                )
            lim = self.limits
            if hlen > lim.max_header_bytes:
                raise ProtocolError(
                    f"frame header length is {hlen}, over the limit max_header_bytes = "
                    f"{lim.max_header_bytes}",
                    "limit",
                )
            if plen > lim.max_payload_bytes:
                raise ProtocolError(
                    f"frame payload length is {plen}, over the limit max_payload_bytes = "
                    f"{lim.max_payload_bytes}",
                    "limit",
                )
            if nfds > lim.max_fds:
                raise ProtocolError(
                    f"file descriptors in one frame is {nfds}, over the limit max_fds = "
                    f"{lim.max_fds}",
                    "limit",
                )
            # Descriptors travel with the prefix's first byte, so they are here by now.
            if nfds > len(self._fds):
                raise ProtocolError(
                    f"file descriptor mismatch: frame announces {nfds} descriptors, "
                    f"{len(self._fds)} arrived"
                )
            self._prefix = (kind, nfds, hlen, plen)
        kind, nfds, hlen, plen = self._prefix
        if not self._have_header:
            if len(self._buf) < hlen:
                return None
            self._header, text = _loads_text(
                memoryview(self._buf)[:hlen], "frame header"
            )
            self._refs = tensor_keys(text)
            del self._buf[:hlen]
            self._have_header = True
            self._payload = _payload_buffer(plen)
            self._got = 0
            take = min(plen, len(self._buf))
            if take:
                self._payload[:take] = memoryview(self._buf)[:take]
                del self._buf[:take]
                self._got = take
        assert self._payload is not None
        if self._got < len(self._payload):
            return None
        fds = [self._fds.popleft() for _ in range(nfds)]
        out = Frame(kind, self._header, self._payload, fds, self._refs)
        self._prefix = None
        self._header = None
        self._have_header = False
        self._payload = None
        self._got = 0
        return out

    def take_stray_fds(self) -> list[int]:
        """Descriptors queued but claimed by no frame (closed by the caller on close)."""
        out = list(self._fds)
        self._fds.clear()
        return out


def plain_span(meta: dict[str, Any], itemsize: int) -> int | None:
    """`byte_span(meta, itemsize)[0]` for a tensor without strides whose dimensions are
    all integers >= 1 and whose size fits in 64 bits (nearly every tensor); `None` for
    any other, which `byte_span` then checks (and, if need be, refuses)."""
    shape = meta.get("shape")
    if type(shape) is not list or len(shape) > MAX_DIMS or "strides" in meta:
        return None
    numel = itemsize
    for d in shape:
        if type(d) is not int or d < 1:
            return None
        numel *= d
    # Every factor is >= 1, so no partial product exceeds the whole.
    return numel if numel <= SMALL_UINT or numel <= U64_MAX else None


def byte_span(meta: dict[str, Any], itemsize: int) -> tuple[int, bool]:
    """Bytes a tensor needs (PROTOCOL.md section 5.4) and whether it has strides.

    Checked 64-bit arithmetic: anything over 2**64 - 1 is an error, never a wrap-around.
    """
    shape = meta.get("shape")
    strides = meta.get("strides")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise ProtocolError("shape must be a list of at most 64 dimensions")
    numel = 1
    for d in shape:
        numel *= uint(d, "shape")
        if numel > U64_MAX:
            raise ProtocolError("tensor size overflows 64 bits")
    if strides is None:
        if numel * itemsize > U64_MAX:
            raise ProtocolError("tensor size overflows 64 bits")
        return numel * itemsize, False
    if not isinstance(strides, list) or len(strides) != len(shape):
        raise ProtocolError("one stride per dimension is required")
    for s in strides:
        if isinstance(s, bool) or not isinstance(s, int) or not I64_MIN <= s <= I64_MAX:
            raise ProtocolError(f"bad stride {s!r}")
        if s < 0:
            raise ProtocolError("negative strides are not supported")
    if numel == 0:
        return 0, True
    last = 0
    for d, s in zip(shape, strides):
        last += (d - 1) * s
        if last > U64_MAX:
            raise ProtocolError("tensor size overflows 64 bits")
    if (last + 1) * itemsize > U64_MAX:
        raise ProtocolError("tensor size overflows 64 bits")
    return (last + 1) * itemsize, True


def layout(
    shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int, nbytes: int
) -> tuple[int, list[int] | None] | None:
    """How an array of `shape` with byte `strides` (`None`: C-contiguous) goes on the
    wire: (byte span, element strides or `None` for C-contiguous), or `None` when its
    strides cannot be described (negative, or not whole elements)."""
    if strides is None:
        return nbytes, None
    if not all(s >= 0 and s % itemsize == 0 for s in strides):
        return None
    elems = [s // itemsize for s in strides]
    span, _ = byte_span({"shape": list(shape), "strides": elems}, itemsize)
    return span, elems


def checked_span(meta: dict[str, Any], itemsize: int, n: int) -> tuple[int, bool]:
    """`byte_span` of a received tensor whose location holds `n` bytes, checked against
    them: (bytes it needs, whether it has strides). A `ProtocolError` when it needs more
    than `n`, or (without strides) not exactly `n`."""
    plain = plain_span(meta, itemsize)
    span, strided = (plain, False) if plain is not None else byte_span(meta, itemsize)
    if span > n or (not strided and span != n):
        raise ProtocolError(f"tensor needs {span} bytes but {n} are present")
    return span, strided
