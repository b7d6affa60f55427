"""One connection's protocol state at the message level, sans-IO: the handshake, and
messages of a JSON header with tensors over the negotiated channels (no JSON-RPC: that is
`_rpc.RpcSession`, on top of this).

`Session` is shared by every connection (`Client`, `AsyncClient`, `Pipe`). It builds the
bytes to send (`hello`, `message`, `releases`, `close_frame`) and consumes received
frames (`on_handshake`, `receive`), returning what happened; the connections move the
bytes. Call order: `hello()`, then the server's answer to `on_handshake()`, then
`message()`/`receive()` in any order, then `close_frame()`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from . import _cuda, _cuda_channel, _shm
from ._outgoing import Outgoing, TensorRefs, _Sent, build_message
from ._wire import (
    CLOSE,
    CONTROL,
    HELLO,
    MESSAGE,
    PREAMBLE,
    REFUSE,
    VERSION,
    WELCOME,
    Frame,
    FrameReader,
    Limits,
    frame,
    checked_span,
    wire_int,
)
from .errors import (
    ConnectionClosed,
    ProtocolError,
    Refused,
)
from .tensors import NUMPY_DTYPES, numpy_dtype, storage_dtype, typed_view

__all__ = ["FEATURES", "PEER_FAULTS", "Session"]


PEER_FAULTS = (
    KeyError,
    TypeError,
    ValueError,
    IndexError,
    OverflowError,
    RecursionError,
)
"""What a malformed frame that no check foresaw can raise while it is decoded."""


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass


class Session:
    """The message-level protocol state of one connection (see the module docs)."""

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
        self.compact = False
        """Both sides take compact tensor descriptors (PROTOCOL.md 7.3)."""
        self.shm_forget = False
        """Both sides agreed to shm `forget` (PROTOCOL.md 11.5)."""
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
        if FEATURES:
            hello["features"] = list(FEATURES)
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
            features = w.get("features", [])
            if not isinstance(features, list):
                raise ProtocolError(
                    f"WELCOME features must be a list, got {features!r}"
                )
            self.compact = (
                "compact_tensors" in features and "compact_tensors" in FEATURES
            )
            self.shm_forget = "shm_forget" in features and "shm_forget" in FEATURES
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
        this side's leases on the server's memory are void (PROTOCOL.md 11.5, 17.3).
        Descriptors that arrived without a frame to claim them are closed."""
        _close_fds(self.reader.take_stray_fds())
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

    def alloc(self, shape: Sequence[int], dtype: str, device: str = "cpu") -> Any:
        """A writable, uninitialised array in this connection's memory (`Client.alloc`):
        on `"cpu"` in the shm pool (an ordinary array without one, or when empty), on
        `"cuda:N"` in the cuda-ipc pool."""
        dims = tuple(int(d) for d in shape)
        if any(d < 0 for d in dims):
            raise ValueError(f"dimensions must be >= 0, got {list(shape)}")
        dt = numpy_dtype(dtype)
        if device != "cpu":
            return self.alloc_cuda(dims, dt, device)
        nbytes = int(np.prod(dims, dtype=object)) * dt.itemsize
        if self.pool is None or nbytes == 0:
            plain = storage_dtype(dt)
            arr: npt.NDArray[Any] = np.zeros(dims, dtype=plain)
            return arr if plain is dt else arr.view(dt)
        return self.pool.alloc(dims, dt)

    def message(self, app_json: str, tensors: TensorRefs) -> Outgoing:
        """One MESSAGE frame carrying the application JSON (text) and `tensors`, preceded by
        the pending releases (`_outgoing.build_message`)."""
        return build_message(self, app_json, tensors)

    def close_frame(self, code: str = "normal", message: str = "") -> bytes:
        """A CLOSE frame."""
        return frame(CLOSE, {"code": code, "message": message})

    # ---- receiving ----------------------------------------------------------------------

    def receive(self, f: Frame) -> tuple[object, list[npt.NDArray[Any]]] | None:
        """A frame after the handshake -> the message it carries (its application JSON
        and its tensors as arrays), or `None` for a frame that carries none (the
        channels' control frames, applied).

        Raises `ConnectionClosed` for CLOSE and `ProtocolError` for anything the protocol
        does not allow (the caller then closes the connection with that error's code).
        """
        try:
            if f.kind == MESSAGE:  # (the usual frame first)
                return self.decode_message(f)
            self._control(f)
            return None
        except PEER_FAULTS as e:
            # Anything the checks did not foresee is still the peer's fault, never a crash.
            raise ProtocolError(f"malformed frame: {e!r:.300}") from None
        finally:
            if f.fds:
                _close_fds(f.fds)

    def _control(self, f: Frame) -> None:
        """A frame other than MESSAGE after the handshake: CONTROL is applied, CLOSE raises
        `ConnectionClosed`, anything else is a `ProtocolError`."""
        if f.kind == CONTROL:
            h = f.header
            if not isinstance(h, dict) or "channel" not in h or "body" not in h:
                raise ProtocolError(f"malformed frame header: control frame {h!r:.200}")
            if h["channel"] == _cuda.NAME and self.cuda is not None:
                self.cuda.control(h["body"])
                return
            if h["channel"] != "shm" or self.pool is None:
                raise ProtocolError(
                    f"malformed frame header: control frame for channel {h['channel']!r:.100}, "
                    "which this pipe does not use"
                )
            body = h["body"]
            if isinstance(body, dict) and "forget" in body:
                if not self.shm_forget or self.receiver is None:
                    raise ProtocolError(
                        "forget without the shm_forget feature (PROTOCOL.md 11.5)"
                    )
                body = dict(body)
                self.receiver.forget(body.pop("forget"))
            self.pool.release(body)
            return
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
        if type(d) is list:
            return self._compact(d, f)
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
            return _inline(meta, loc.get("offset"), loc.get("len"), dtype, f)
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

    def _compact(self, d: list[Any], f: Frame) -> Any:
        """A compact descriptor (PROTOCOL.md 7.3): `[dtype, shape, location, ..]` of a CPU
        tensor without strides, checked as strictly as the object form."""
        n = len(d)
        kind = d[2] if n >= 3 else None
        arity = _COMPACT_ARITY.get(kind) if type(kind) is str else None
        if arity is None or not arity[0] <= n <= arity[1]:
            raise ProtocolError(f"malformed compact tensor descriptor {d!r:.200}")
        name = d[0]
        dtype = NUMPY_DTYPES.get(name) if type(name) is str else None
        if dtype is None:
            raise ProtocolError(f"unknown dtype {name!r}")
        meta = {"dtype": name, "shape": d[1]}
        if kind == "shm_return":
            if self.pool is None:
                raise ProtocolError(
                    "channel inline: invalid descriptor from peer: unexpected location shm_return"
                )
            return self.pool.returned_at(d[3], d[4], d[5], meta, dtype)
        if kind == "shm":
            if self.receiver is None:
                raise ProtocolError(
                    "channel inline: invalid descriptor from peer: unexpected location shm"
                )
            loc = {"segment": d[3], "offset": d[4], "len": d[5], "lease": d[6]}
            if n == 8:
                loc["lazy_release"] = d[7]  # (checked by `decode`)
            return self.receiver.decode(meta, loc, dtype, f.fds)
        return _inline(meta, d[3], d[4], dtype, f)


_COMPACT_ARITY: dict[str, tuple[int, int]] = {
    "inline": (5, 5),
    "shm": (7, 8),
    "shm_return": (6, 6),
}
"""Elements of a compact descriptor by location: [dtype, shape, location, ..fields]."""

FEATURES: list[str] = ["compact_tensors", "shm_forget"]
"""Protocol features this client offers in HELLO (PROTOCOL.md 6.2): those it implements,
each one of the protocol's (`_constants.FEATURES`; `test_vectors.py` checks)."""


def _inline(
    meta: dict[str, Any], off: object, n: object, dtype: np.dtype[Any], f: Frame
) -> Any:
    """An `inline` location (bytes `off..off+n` of the frame's payload) as an array."""
    off = wire_int(off, "offset")
    n = wire_int(n, "len")
    if off + n > len(f.payload):
        raise ProtocolError(
            f"range {off}+{n} is outside the payload of {len(f.payload)} bytes"
        )
    span, strided = checked_span(meta, dtype.itemsize, n)
    if span == 0:
        return np.empty(tuple(meta["shape"]), dtype)
    raw = np.frombuffer(f.payload, dtype=np.uint8, count=n, offset=off)
    return typed_view(raw, dtype, meta, span, strided)


def _cuda_ordinal(device: str) -> int:
    """`"cuda:N"` -> N (this process's ordinal)."""
    name, _, num = device.partition(":")
    if name != "cuda" or not num.isdigit():
        raise ValueError(f"device must be 'cpu' or 'cuda:N', got {device!r}")
    return int(num)
