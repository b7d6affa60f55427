"""`Client`: a blocking JSON-RPC client over one ferry connection.

- Any number of threads may call at once; calls are matched to responses by id. The
  calling threads take turns reading the socket (no background thread): the one holding
  the read turn stores answers for the others.
- Every blocking step has a deadline: connecting and the handshake (`connect_timeout`),
  and each call (`timeout`, the client's default or the call's own). A call that times out
  raises `CallTimeout` and is cancelled on the server (`ferry.cancel`).
- When the server goes away, every waiting call fails with `ConnectionClosed` at once, and
  so does every later call. A server that breaks the protocol gets a CLOSE frame with the
  reason; calls fail with `ProtocolError`.
- Tensors: numpy arrays anywhere in params travel as `{"$tensor": i}`; arrays from
  `alloc()` (and arrays received earlier) travel without a copy over shm, other arrays are
  copied once into shared memory (or sent inline when small or without shm). Tensors in
  results are numpy arrays; over shm they view the server's memory, read-only.
"""

from __future__ import annotations

import functools
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import numpy as np
import numpy.typing as npt

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
from ._cupy import make_driver
from ._session import Outcome, Outgoing, Session
from ._wire import Limits
from .errors import CallTimeout, ConnectionClosed, FerryError, ProtocolError, RpcError
from .tensors import numpy_dtype, storage_dtype

_SCRATCH = 1 << 16
_NO_DEADLINE = math.inf
_CTRUNC = int(socket.MSG_CTRUNC)  # a plain int: `&` on the IntFlag runs Python code
_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: None)
"""Gives the CPU to another runnable thread on it, if any, between polls of a spin."""
_C = TypeVar("_C", bound="_Connection")


class _Connection:
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
            timeout: Default seconds each call waits for its answer.
            connect_timeout: Seconds for connecting and the handshake.
            shm: Offer shared memory (zero-copy tensors on one Linux host); the server
                chooses it when it can, else tensors travel inline.
            token: The server's bearer token, if it requires one.
            agent: Free text naming this client in the server's logs.
            allow_any_user: Talk to a server running as another user.
            pool_limit: Bytes of shared memory this client may create for sending.
            max_peer_bytes: Bytes of the server's shared memory this client may map.
            limits: This side's receive limits (announced to the server).
            cuda: Offer the cuda-ipc channel (CUDA tensors without a copy, through
                CuPy): `None` (default) offers it when the application has imported
                `cupy` and a device is usable; `True` requires it (`CudaUnavailable`
                naming what is missing otherwise); `False` never offers it.
            cuda_pool_limit: Bytes of device memory this client may allocate for
                sending CUDA tensors (per connection).
            cuda_max_peer_allocs: Distinct server allocations this client may map.
            busy_poll_us: Microseconds a waiting read keeps polling the socket before it
                sleeps: an answer within that time is picked up without the sleep and
                wake-up (~10 µs here, and a colder CPU after). `None` (default): 50 when
                this process may run on 2 or more CPUs, else 0 (spinning on one CPU
                would only delay the server). A call that takes longer costs at most
                this much extra CPU.

        Raises:
            Refused: The server refused the handshake.
            CudaUnavailable: `cuda=True` and CuPy or a usable device is missing.
            CallTimeout: No connection or handshake within `connect_timeout`.
            FerryError: Any other failure to connect.
        """
        deadline = time.monotonic() + connect_timeout
        session = Session(
            shm=shm,
            token=token,
            agent=agent or f"ferry-python/{__version__}",
            limits=limits or Limits(),
            pool_limit=pool_limit,
            max_peer_bytes=max_peer_bytes,
            **cuda_options(cuda, cuda_pool_limit, cuda_max_peer_allocs),
        )
        target = socket_address(addr)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(connect_timeout)
            try:
                sock.connect(target)
            except socket.timeout:
                raise CallTimeout(
                    f"connecting to {addr} took longer than {connect_timeout}s"
                ) from None
            except OSError as e:
                raise ConnectionClosed(f"cannot connect to {addr}: {e}") from None
            check_peer(sock, allow_any_user)
            sock.setblocking(False)
            client = cls(sock, session, timeout)
            client._spin = _busy_poll_seconds(busy_poll_us)
            client._handshake(deadline)
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
        return alloc(self._session, shape, dtype, device)

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
        return getattr(self._dead, "code", None) if self._dead is not None else None

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
                raise CallTimeout("no answer in time")
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


class Client(_Connection):
    """A connection to a ferry JSON-RPC server. Make one with `Client.connect(addr)`."""

    def __init__(self, sock: socket.socket, session: Session, timeout: float) -> None:
        super().__init__(sock, session, timeout)
        self._waiting = 0
        """Threads inside `self._cond.wait` (notified only when there are some)."""
        self._reading = False
        self._pending: set[object] = set()
        self._results: dict[object, Outcome] = {}

    # ---- public API ---------------------------------------------------------------------

    def call(
        self, method: str, params: object = None, *, timeout: float | None = None
    ) -> Any:
        """Calls `method` with `params` (a dict by name, a list by position, or None) and
        returns its result, tensors as numpy arrays.

        Raises:
            RpcError: The server answered with an error.
            CallTimeout: No answer within `timeout` seconds (default: `self.timeout`); the
                call was cancelled on the server.
            ConnectionClosed: The connection is gone.
            ProtocolError: The server broke the protocol (the connection is closed).
            ParamsError: `params` cannot be sent.
            LimitError: The message is over the server's limits, or the shm pool is full.
        """
        deadline = self._deadline(timeout)
        session = self._session
        with self._lock:  # (`_begin`, inline)
            if self._dead is not None:
                self._check()
            call_id = session.next_id()
            self._pending.add(call_id)
        ids = [call_id]
        done = False
        try:
            with self._send_lock:
                self._check_open()  # before building: nothing granted on a closed one
                self._write(session.request(method, params, call_id), deadline)
            outcome = self._wait(ids, deadline, timeout)[0]
            done = True  # _wait took the call out of the table
        finally:
            if not done:
                self._end(ids)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def notify(self, method: str, params: object = None) -> None:
        """Sends a notification (no answer; errors are not reported)."""
        self._check()
        self._send(
            lambda: self._session.request(method, params, None), self._deadline(None)
        )

    def batch(
        self, calls: Sequence[tuple[str, object]], *, timeout: float | None = None
    ) -> list[Any]:
        """Calls several methods in one message; returns their results in order, with an
        `RpcError` (not raised) in place of each call that failed."""
        if not calls:
            return []
        deadline = self._deadline(timeout)
        ids = [self._begin() for _ in calls]
        try:
            self._send(
                lambda: self._session.batch(
                    [(m, p, i) for (m, p), i in zip(calls, ids)]
                ),
                deadline,
            )
            outcomes = self._wait(ids, deadline, timeout)
        finally:
            self._end(ids)  # (already out of the table unless it failed)
        return list(outcomes)

    def submit(
        self,
        method: str,
        params: object = None,
        *,
        keep: bool = False,
        detached: bool = False,
    ) -> str:
        """Starts `method` as a task on the server (`ferry.task.submit`); returns its id.

        The task belongs to this client's identity (its user on a unix socket, the token
        elsewhere) and is cancelled, its result dropped, when this connection closes,
        unless `detached`: then any connection of the same identity may fetch it until it
        expires. `keep` keeps the result after it is fetched.
        """
        args: dict[str, object] = {"method": method, "keep": keep}
        if detached:
            args["detached"] = True
        if params is not None:
            args["params"] = params
        r = self.call("ferry.task.submit", args)
        if not isinstance(r, dict) or not isinstance(r.get("task"), str):
            raise ProtocolError(f"ferry.task.submit answered {r!r:.200}")
        return str(r["task"])

    def task_status(self, task: str) -> dict[str, Any]:
        """The task's status: `{"task", "method", "state", "elapsed_ms"}`."""
        r = self.call("ferry.task.status", {"task": task})
        return _status(r)

    def task_result(
        self,
        task: str,
        *,
        wait_ms: int = 0,
        keep: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """The task's result (or its error, raised), waiting up to `wait_ms` on the server;
        `RpcError` with code -32005 while it is still running."""
        if timeout is None:
            timeout = max(self.timeout, wait_ms / 1000 + 10)
        return self.call(
            "ferry.task.result",
            {"task": task, "wait_ms": wait_ms, "keep": keep},
            timeout=timeout,
        )

    def task_cancel(self, task: str) -> dict[str, Any]:
        """Cancels the task; returns its status."""
        return _status(self.call("ferry.task.cancel", {"task": task}))

    def discover(self) -> dict[str, Any]:
        """The server's OpenRPC document (`rpc.discover`)."""
        r = self.call("rpc.discover")
        if not isinstance(r, dict):
            raise ProtocolError(
                f"rpc.discover answered {type(r).__name__}, not an object"
            )
        return r

    # ---- internals ----------------------------------------------------------------------

    def _begin(self) -> int:
        with self._lock:
            self._check()
            call_id = self._session.next_id()
            self._pending.add(call_id)
            return call_id

    def _end(self, ids: list[int]) -> None:
        with self._lock:
            for i in ids:
                self._pending.discard(i)
                self._results.pop(i, None)

    def _wait(
        self, ids: list[int], deadline: float, timeout: float | None
    ) -> list[Outcome]:
        """Waits for the answers to `ids`, taking turns with other threads at reading:
        whoever holds the read turn reads the socket itself (no reader thread, so no thread
        switch per call) and stores the answers of the others. The answers returned are
        out of the call table."""
        lock = self._lock
        results = self._results
        single = len(ids) == 1
        while True:
            mine = False
            with lock:
                while True:
                    if ids[0] in results if single else all(i in results for i in ids):
                        return self._take(ids)
                    if self._dead is not None:
                        raise self._dead_error()
                    if not self._reading:
                        self._reading = mine = True
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._waiting += 1
                    try:
                        self._cond.wait(None if remaining == math.inf else remaining)
                    finally:
                        self._waiting -= 1
            if not mine:
                self._timed_out(ids, timeout)
            # The read turn is ours: read (and handle frames) without the lock.
            late = False
            try:
                self._pump(deadline)
            except CallTimeout:
                late = True
            except BaseException:
                with lock:
                    self._reading = False
                    if self._waiting:
                        self._cond.notify_all()
                raise
            with lock:  # the turn back, and (usually) the answer, in one go
                self._reading = False
                if self._waiting:
                    self._cond.notify_all()
                if not late and (
                    ids[0] in results if single else all(i in results for i in ids)
                ):
                    return self._take(ids)
            if late:
                self._timed_out(ids, timeout)

    def _take(self, ids: list[int]) -> list[Outcome]:
        """The answers to `ids`, taken out of the call table (under the lock)."""
        results = self._results
        pending = self._pending
        out = []
        for i in ids:
            out.append(results.pop(i))
            pending.discard(i)
        return out

    def _timed_out(self, ids: list[int], timeout: float | None) -> NoReturn:
        """Cancels `ids` on the server and raises `CallTimeout`."""
        for i in ids:
            try:
                self._send(
                    functools.partial(
                        self._session.request, "ferry.cancel", {"id": i}, None
                    ),
                    time.monotonic() + 1.0,
                )
            except FerryError:
                break
        t = self.timeout if timeout is None else timeout
        raise CallTimeout(
            f"no answer within {t}s; the call was cancelled on the server"
        )

    def _pump(self, deadline: float) -> None:
        """Reads at least once and handles every complete frame (the read turn is ours)."""
        session = self._session
        reader = session.reader
        try:
            self._recv(deadline)
            while True:
                f = reader.next_frame()
                if f is None:
                    return
                answers = session.on_frame(f)
                if answers:
                    with self._lock:
                        pending = self._pending
                        for rid, outcome in answers:
                            if rid in pending:
                                self._results[rid] = outcome
        except (ProtocolError, ConnectionClosed) as e:
            self._fail(e)
        except CallTimeout:
            raise
        except Exception as e:  # a bug here must not leave other calls waiting forever
            self._fail(ProtocolError(f"internal error while reading: {e!r:.300}"))
            raise


def alloc(
    session: Session, shape: Sequence[int], dtype: str, device: str = "cpu"
) -> Any:
    """`Client.alloc` for both clients."""
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"dimensions must be >= 0, got {list(shape)}")
    dt = numpy_dtype(dtype)
    if device != "cpu":
        return session.alloc_cuda(dims, dt, device)
    nbytes = int(np.prod(dims, dtype=object)) * dt.itemsize
    if session.pool is None or nbytes == 0:
        plain = storage_dtype(dt)
        arr: npt.NDArray[Any] = np.zeros(dims, dtype=plain)
        return arr if plain is dt else arr.view(dt)
    return session.pool.alloc(dims, dt)


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


def cuda_options(
    cuda: bool | None, pool_limit: int, max_peer_allocs: int
) -> dict[str, Any]:
    """`Session`'s cuda arguments for a client's `cuda` options."""
    driver, why = make_driver(cuda)
    return {
        "cuda": driver,
        "cuda_unavailable": why,
        "cuda_pool_limit": pool_limit,
        "cuda_max_peer_allocs": max_peer_allocs,
    }


def _status(r: object) -> dict[str, Any]:
    if not isinstance(r, dict) or not isinstance(r.get("state"), str):
        raise ProtocolError(
            f"a task status must be an object with a state, got {r!r:.200}"
        )
    return r


__all__ = ["Client", "RpcError"]
