"""`Connection`: what the blocking `Client` and `Pipe` share: one ferry connection
over a unix socket (connecting, the handshake, writing messages, reading frames into the
session's reader, deadlines, and how the connection ends), without JSON-RPC.

- Every blocking step has a deadline: connecting and the handshake (`connect_timeout`),
  and each send and read (`timeout`, the connection's default or the operation's own).
- Writes go under the send lock, whole or not at all: a frame cut short kills the
  connection. Reads poll the socket (spinning up to `busy_poll_us` first), then read in
  place into a payload, or through a scratch buffer.
- When the connection ends (either side, or a broken protocol), `_dead` says why and
  every later operation raises `ConnectionClosed`; a `ProtocolError` is told to the peer
  in a CLOSE frame.
"""

from __future__ import annotations

import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from . import __version__
from ._io import (
    ANCILLARY,
    MAX_IOV,
    advance,
    check_peer,
    received_fds,
    rights,
    socket_address,
)
from ._options import ConnectOptions, new_session, resolve
from ._outgoing import Outgoing
from ._session import Session
from ._wire import Limits
from .errors import CallTimeout, ConnectionClosed, FerryError, ProtocolError

_SCRATCH = 1 << 16
_NO_DEADLINE = math.inf
_CTRUNC = int(socket.MSG_CTRUNC)  # a plain int: `&` on the IntFlag runs Python code
_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: None)
"""Gives the CPU to another runnable thread on it, if any, between polls of a spin."""
_C = TypeVar("_C", bound="Connection")


class Connection:
    """What `Client` and `Pipe` share: one ferry connection (handshake, frames, shm), its
    socket, its deadlines, and how it ends. Make one with `connect(addr)`."""

    def __init__(self, sock: socket.socket, session: Session, timeout: float) -> None:
        self._sock = sock
        self._session = session
        self.timeout = timeout
        """Default seconds a call (or a receive) waits."""
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        """Guards the connection's state (`with self._lock` is the cheap way into
        `self._cond`)."""
        self._cond = threading.Condition(self._lock)
        self._dead: FerryError | None = None
        self._scratch = bytearray(_SCRATCH)
        self._scratch_view = memoryview(self._scratch)
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._spin = 0.0
        """Seconds a read polls without sleeping before it blocks (`busy_poll_us`)."""

    @classmethod
    def connect(
        cls: type[_C],
        addr: str,
        *,
        options: ConnectOptions | None = None,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        shm: bool = True,
        token: str | None = None,
        agent: str | None = None,
        allow_any_user: bool = False,
        pool_limit: int = 2 << 30,
        max_peer_bytes: int = 16 << 30,
        limits: Limits | None = None,
        cuda: bool | None = None,
        cuda_pool_limit: int = 4 << 30,
        cuda_max_peer_allocs: int = 4096,
        busy_poll_us: int | None = None,
    ) -> _C:
        """Connects to `addr` (`unix:NAME` or `unix:/path`) and performs the handshake.

        Args:
            addr: The server's address.
            options: How to connect, as one value (`ConnectOptions`).
            timeout, connect_timeout, shm, token, agent, allow_any_user, pool_limit,
                max_peer_bytes, limits, cuda, cuda_pool_limit, cuda_max_peer_allocs,
                busy_poll_us: The same, one by one: the fields of `ConnectOptions` (see
                there), with the same defaults.

        Raises:
            TypeError: `options` and a keyword argument that disagrees with it.
            Refused: The server refused the handshake.
            CudaUnavailable: `cuda=True` and CuPy or a usable device is missing.
            CallTimeout: No connection or handshake within `connect_timeout`.
            FerryError: Any other failure to connect.
        """
        o = resolve(
            options,
            ConnectOptions(
                timeout=timeout,
                connect_timeout=connect_timeout,
                shm=shm,
                token=token,
                agent=agent,
                allow_any_user=allow_any_user,
                pool_limit=pool_limit,
                max_peer_bytes=max_peer_bytes,
                limits=limits,
                cuda=cuda,
                cuda_pool_limit=cuda_pool_limit,
                cuda_max_peer_allocs=cuda_max_peer_allocs,
                busy_poll_us=busy_poll_us,
            ),
        )
        deadline = time.monotonic() + o.connect_timeout
        session = new_session(o, f"ferry-python/{__version__}")
        target = socket_address(addr)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(o.connect_timeout)
            try:
                sock.connect(target)
            except socket.timeout:
                raise CallTimeout(
                    f"connecting to {addr} took longer than {o.connect_timeout}s"
                ) from None
            except OSError as e:
                raise ConnectionClosed(f"cannot connect to {addr}: {e}") from None
            check_peer(sock, o.allow_any_user)
            sock.setblocking(False)
            client = cls(sock, session, o.timeout)
            client._spin = _busy_poll_seconds(o.busy_poll_us)
            try:
                client._handshake(deadline)
            except CallTimeout:
                raise CallTimeout(
                    f"connected to {addr}, but it did not answer the handshake within "
                    f"connect_timeout={o.connect_timeout}s: is a ferry server listening "
                    "there (not another program), and is it overloaded? Raise "
                    "connect_timeout= to wait longer"
                ) from None
        except BaseException:
            sock.close()
            raise
        return client

    def _handshake(self, deadline: float) -> None:
        self._send_all([self._session.hello()], [], deadline)
        reader = self._session.reader
        while True:
            f = reader.next_frame()
            if f is not None:
                self._session.on_handshake(f)
                return
            self._recv(deadline)

    # ---- public API ---------------------------------------------------------------------

    @property
    def channel(self) -> str:
        """The channel the server chose for CPU tensors: `"shm"` or `"inline"`."""
        return self._session.channel

    @property
    def welcome(self) -> dict[str, Any]:
        """The server's WELCOME (version, channels, limits, agent)."""
        return self._session.welcome

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by either side)."""
        return self._dead is not None

    def alloc(
        self, shape: Sequence[int], dtype: str = "f32", device: str = "cpu"
    ) -> Any:
        """A writable, uninitialised array in this connection's memory: fill it and send it
        without a copy. `device="cpu"`: a numpy array in shared memory (without shm, an
        ordinary array). `device="cuda:N"`: a CuPy array in the cuda-ipc pool
        (`CudaUnavailable` when the connection has no cuda-ipc channel, saying why)."""
        return self._session.alloc(shape, dtype, device)

    def flush_releases(self) -> None:
        """Tells the server now which of its tensors this process no longer uses (this
        otherwise happens with the next call)."""
        self._check()
        with self._send_lock:
            rel = self._session.releases()
            if rel:
                self._send_all([rel], [], self._deadline(None))

    def close(self) -> None:
        """Closes the connection (a CLOSE frame, then end of stream). Arrays received over
        shm stay valid."""
        with self._cond:
            if self._dead is None:
                self._dead = ConnectionClosed(
                    "the connection was closed by this client", "normal"
                )
            first = self._sock.fileno() >= 0
        if first:
            try:
                with self._send_lock:
                    self._send_all(
                        [self._session.close_frame()], [], time.monotonic() + 1.0
                    )
                    self._sock.shutdown(socket.SHUT_WR)
            except (FerryError, OSError):
                pass
        self._teardown()

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        t = self.timeout if timeout is None else timeout
        if t < 0 or math.isnan(t):
            raise ValueError(f"a timeout must be >= 0 seconds, got {t}")
        return time.monotonic() + t if math.isfinite(t) else _NO_DEADLINE

    def _check(self) -> None:
        if self._dead is not None:
            raise ConnectionClosed(
                f"the connection is closed ({self._dead})", self._dead_code()
            )

    def _dead_code(self) -> str | None:
        return getattr(self._dead, "code", None)

    def _send(self, build: Callable[[], Outgoing], deadline: float) -> None:
        """Builds a message and writes it, both under the send lock: building decides
        segment announcements and lease ids, so frames go out in the order they were built."""
        with self._send_lock:
            self._check_open()
            self._write(build(), deadline)

    def _write(self, out: Outgoing, deadline: float) -> None:
        """Writes a built message (under the send lock): pending releases and the frame in
        one `sendmsg` when no descriptors go with it."""
        try:
            if out.fds:
                if out.before:
                    self._send_all([out.before], [], deadline)
                self._send_all(out.parts, out.fds, deadline)
            elif out.before:
                self._send_all([out.before, *out.parts], [], deadline)
            else:
                self._send_all(out.parts, [], deadline)
        finally:
            out.done()

    def _send_all(
        self, parts: list[bytes | memoryview], fds: list[int], deadline: float
    ) -> None:
        """Writes `parts` whole (`fds` with the first byte) or kills the connection: a
        frame cut short cannot be resumed."""
        self._check_open()
        anc = rights(fds) if fds else []
        while parts:
            try:
                if not anc and len(parts) == 1:
                    n = self._sock.send(parts[0])  # (cheaper than sendmsg)
                else:
                    n = self._sock.sendmsg(parts[:MAX_IOV], anc)
            except BlockingIOError:
                if not self._wait_fd(select.POLLOUT, deadline):
                    err = CallTimeout(
                        "the server did not take the request in time; the connection is closed"
                    )
                    self._fail(ConnectionClosed(str(err)))
                    raise err from None
                continue
            except OSError as e:
                self._fail(ConnectionClosed(f"the connection is gone: {e}"))
                raise ConnectionClosed(f"the connection is gone: {e}") from None
            if len(parts) == 1 and n == len(parts[0]):
                return  # all of it (the usual case)
            anc = []
            parts = advance(parts, n)

    def _release_now(self, deadline: float) -> None:
        """Sends the pending releases now, unless another thread is sending (it carries
        them): a loop that only receives must not hold the peer's memory forever."""
        session = self._session
        cuda, receiver = session.cuda, session.receiver
        if not (
            (cuda is not None and cuda.done) or (receiver is not None and receiver.done)
        ):
            return
        if not self._send_lock.acquire(blocking=False):
            return
        try:
            self._check_open()
            rel = session.releases()
            if rel:
                self._send_all([rel], [], deadline)
        finally:
            self._send_lock.release()

    def _check_open(self) -> None:
        if self._dead is not None and self._sock.fileno() < 0:
            raise ConnectionClosed(
                f"the connection is closed ({self._dead})", self._dead_code()
            )

    def _wait_fd(self, event: int, deadline: float) -> bool:
        """Waits until the socket is ready for `event`; False at the deadline."""
        p = select.poll()
        p.register(self._sock.fileno(), event)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ms = (
                -1
                if remaining == math.inf
                else max(1, math.ceil(min(remaining, 3600.0) * 1000))
            )
            if p.poll(ms):
                return True

    def _ready(self, ms: int) -> bool:
        """Whether the socket is readable: polled without sleeping for up to `_spin`
        seconds, then waiting up to `ms` milliseconds."""
        poll = self._poll.poll
        if poll(0):
            return True
        if self._spin:
            clock = time.perf_counter
            end = clock() + self._spin
            while clock() < end:
                # (yield: a server that shares this CPU gets to answer within the spin)
                _yield()
                if poll(0):
                    return True
        return bool(poll(ms))

    def _recv(self, deadline: float) -> None:
        """Reads what the socket has (waiting for it until `deadline`) into the reader."""
        reader = self._session.reader
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # (callers say what was waited for: a call, a message, the handshake)
                raise CallTimeout("timed out waiting for the peer")
            if self._sock.fileno() < 0:
                # Closed by another thread (`close()`): its poll set no longer has the
                # socket, and polling it would sleep until the deadline.
                raise ConnectionClosed("the connection was closed by this client")
            # At most a second per poll, so a close that lands between the check above
            # and the poll is seen within a second.
            ms = max(1, math.ceil(min(remaining, 1.0) * 1000))
            if not self._ready(ms):
                continue
            # (Only in the middle of a payload can it be read in place.)
            direct = reader.direct() if reader.in_payload else None
            target = direct if direct is not None else self._scratch
            try:
                n, anc, flags, _ = self._sock.recvmsg_into([target], ANCILLARY)
            except BlockingIOError:
                continue
            except OSError as e:
                raise ConnectionClosed(f"the connection is gone: {e}") from None
            fds = received_fds(anc, flags) if anc or flags & _CTRUNC else []
            if n == 0 and not fds:
                raise ConnectionClosed(
                    "the server closed the connection (end of stream)"
                )
            if direct is not None:
                reader.filled(n, fds)
            else:
                reader.feed(self._scratch_view[:n], fds)
            return

    def _dead_error(self) -> FerryError:
        dead = self._dead
        assert dead is not None
        if isinstance(dead, ProtocolError):
            return ProtocolError(str(dead), dead.code)
        return ConnectionClosed(str(dead), self._dead_code())

    def _fail(self, err: FerryError) -> None:
        """The connection is over: tells the server why (if it broke the protocol), closes
        the socket and fails every waiting call."""
        with self._cond:
            if self._dead is None:
                self._dead = err
            self._cond.notify_all()
        if isinstance(err, ProtocolError) and self._sock.fileno() >= 0:
            try:
                frame = self._session.close_frame(err.code, str(err))
                self._sock.send(frame)
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self._teardown()

    def _teardown(self) -> None:
        if self._sock.fileno() >= 0:
            # Shut down first: a thread waiting in poll on this socket wakes (end of
            # stream) instead of sleeping on a descriptor that was closed under it.
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                self._poll.unregister(self._sock.fileno())
            except (KeyError, ValueError):
                pass
            self._sock.close()
        self._session.close_channels()


def _busy_poll_seconds(us: int | None) -> float:
    """`busy_poll_us` as seconds (`None`: 50 µs with 2 or more usable CPUs, else 0)."""
    if us is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        us = 50 if cpus >= 2 else 0
    if us < 0:
        raise ValueError(f"busy_poll_us must be >= 0, got {us}")
    return us / 1e6


__all__ = ["Connection"]
