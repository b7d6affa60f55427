"""`AsyncClient`: an asyncio JSON-RPC client over one ferry connection.

The same protocol engine as `Client` (`_session.Session` for messages, `_rpc.RpcSession`
for JSON-RPC on top), driven by the event loop: the
socket's readable callback reads frames and resolves the waiting calls' futures, so any
number of calls may be in flight from any number of tasks. Every call has a deadline (the
client's `timeout` or the call's own); a call that times out, or whose task is cancelled,
is cancelled on the server (`ferry.cancel`). When the server goes away every waiting call
fails with `ConnectionClosed` at once.
"""

from __future__ import annotations

import asyncio
import functools
import math
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

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
from ._rpc import (
    Outcome,
    RpcSession,
    discover_answer,
    status_answer,
    submit_answer,
    submit_params,
)
from ._session import Session
from ._wire import Limits
from .errors import (
    CallTimeout,
    ConnectionClosed,
    FerryError,
    ProtocolError,
    Refused,
    RpcError,
)

_SCRATCH = 1 << 16


async def _answers(
    futures: list[asyncio.Future[Outcome]], timeout: float | None
) -> list[Outcome]:
    """The answers of `futures`, in order; `asyncio.TimeoutError` after `timeout`
    seconds.

    Not `asyncio.gather`: a gather cancelled (the caller's task cancelled, or `wait_for`
    timing out) keeps a CancelledError that nobody retrieves, and asyncio then printed
    "_GatheringFuture exception was never retrieved" for every cancelled call.
    """
    if len(futures) == 1:
        return [await asyncio.wait_for(futures[0], timeout)]
    done, pending = await asyncio.wait(
        futures, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION
    )
    # Each exception is retrieved (the connection's end sets one on every future).
    errors = [e for f in done if not f.cancelled() and (e := f.exception()) is not None]
    if errors:
        raise errors[0]
    if pending:
        raise asyncio.TimeoutError
    return [f.result() for f in futures]


class AsyncClient:
    """A connection to a ferry JSON-RPC server, for asyncio. Make one with
    `await AsyncClient.connect(addr)`; the methods mirror `Client`'s."""

    def __init__(self, sock: socket.socket, session: Session, timeout: float) -> None:
        self._sock = sock
        self._session = session
        self._rpc = RpcSession(session)
        self.timeout = timeout
        """Default seconds a call waits for its answer."""
        self._loop = asyncio.get_running_loop()
        self._send_lock = asyncio.Lock()
        self._pending: dict[object, asyncio.Future[Outcome]] = {}
        self._dead: FerryError | None = None
        self._scratch = bytearray(_SCRATCH)
        self._handshake: asyncio.Future[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._fd = sock.fileno()

    @classmethod
    async def connect(
        cls,
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
    ) -> AsyncClient:
        """Connects to `addr` and performs the handshake; arguments as `Client.connect`
        (`options`, or the fields of `ConnectOptions` one by one), less `busy_poll_us`
        (the event loop waits for the socket)."""
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
            ),
        )
        session = new_session(o, f"ferry-python-asyncio/{__version__}")
        target = socket_address(addr)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        client: AsyncClient | None = None
        try:
            try:
                await asyncio.wait_for(
                    loop.sock_connect(sock, target), o.connect_timeout
                )
            except asyncio.TimeoutError:
                raise CallTimeout(
                    f"connecting to {addr} took longer than {o.connect_timeout}s"
                ) from None
            except OSError as e:
                raise ConnectionClosed(f"cannot connect to {addr}: {e}") from None
            check_peer(sock, o.allow_any_user)
            client = cls(sock, session, o.timeout)
            client._handshake = loop.create_future()
            loop.add_reader(client._fd, client._on_readable)
            deadline = time.monotonic() + o.connect_timeout
            await client._send(
                lambda: Outgoing(b"", [session.hello()], [], [], []), deadline
            )
            try:
                await asyncio.wait_for(
                    asyncio.shield(client._handshake), o.connect_timeout
                )
            except asyncio.TimeoutError:
                raise CallTimeout(
                    f"connected to {addr}, but it did not answer the handshake within "
                    f"connect_timeout={o.connect_timeout}s: is a ferry server listening "
                    "there (not another program), and is it overloaded? Raise "
                    "connect_timeout= to wait longer"
                ) from None
        except BaseException:
            if client is not None:
                client._teardown()
                hs = client._handshake
                if hs is not None and hs.done() and not hs.cancelled():
                    hs.exception()  # (retrieved: the error raised here says it all)
            else:
                sock.close()
            raise
        return client

    # ---- public API ---------------------------------------------------------------------

    @property
    def channel(self) -> str:
        """The channel the server chose for CPU tensors: `"shm"` or `"inline"`."""
        return self._session.channel

    @property
    def welcome(self) -> dict[str, Any]:
        """The server's WELCOME."""
        return self._session.welcome

    @property
    def closed(self) -> bool:
        """Whether the connection is closed (by either side)."""
        return self._dead is not None

    async def call(
        self, method: str, params: object = None, *, timeout: float | None = None
    ) -> Any:
        """Calls `method` with `params`; as `Client.call`."""
        outcome = (await self._calls([(method, params)], timeout, single=True))[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def batch(
        self, calls: Sequence[tuple[str, object]], *, timeout: float | None = None
    ) -> list[Any]:
        """Several calls in one message; results in order, an `RpcError` (not raised) in
        place of each call that failed."""
        if not calls:
            return []
        return list(await self._calls(list(calls), timeout, single=False))

    async def notify(self, method: str, params: object = None) -> None:
        """Sends a notification (no answer)."""
        self._check()
        await self._send(
            lambda: self._rpc.request(method, params, None), self._deadline(None)
        )

    def alloc(
        self, shape: Sequence[int], dtype: str = "f32", device: str = "cpu"
    ) -> Any:
        """A writable array in this connection's memory, on `device` (see
        `Client.alloc`)."""
        return self._session.alloc(shape, dtype, device)

    async def submit(
        self,
        method: str,
        params: object = None,
        *,
        keep: bool = False,
        detached: bool = False,
    ) -> str:
        """Starts `method` as a task on the server; returns its id (see
        `ferry_client.Client.submit` for `keep` and `detached`)."""
        args = submit_params(method, params, keep, detached)
        return submit_answer(await self.call("ferry.task.submit", args))

    async def task_status(self, task: str) -> dict[str, Any]:
        """The task's status."""
        return status_answer(await self.call("ferry.task.status", {"task": task}))

    async def task_result(
        self,
        task: str,
        *,
        wait_ms: int = 0,
        keep: bool = False,
        timeout: float | None = None,
    ) -> Any:
        """The task's result (or its error, raised), waiting up to `wait_ms` on the server."""
        if timeout is None:
            timeout = max(self.timeout, wait_ms / 1000 + 10)
        return await self.call(
            "ferry.task.result",
            {"task": task, "wait_ms": wait_ms, "keep": keep},
            timeout=timeout,
        )

    async def task_cancel(self, task: str) -> dict[str, Any]:
        """Cancels the task; returns its status."""
        return status_answer(await self.call("ferry.task.cancel", {"task": task}))

    async def discover(self) -> dict[str, Any]:
        """The server's OpenRPC document."""
        return discover_answer(await self.call("rpc.discover"))

    async def flush_releases(self) -> None:
        """Tells the server now which of its tensors this process no longer uses."""
        self._check()
        await self._send(
            lambda: Outgoing(self._session.releases(), [], [], [], []),
            self._deadline(None),
        )

    async def close(self) -> None:
        """Closes the connection (a CLOSE frame, then end of stream)."""
        if self._dead is None:
            self._dead = ConnectionClosed(
                "the connection was closed by this client", "normal"
            )
            try:
                close = self._session.close_frame()
                await self._send(
                    lambda: Outgoing(b"", [close], [], [], []), time.monotonic() + 1.0
                )
                self._sock.shutdown(socket.SHUT_WR)
            except (FerryError, OSError):
                pass
        self._teardown()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- internals ----------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float:
        t = self.timeout if timeout is None else timeout
        if t < 0 or math.isnan(t):
            raise ValueError(f"a timeout must be >= 0 seconds, got {t}")
        return time.monotonic() + t if math.isfinite(t) else math.inf

    def _check(self) -> None:
        if self._dead is not None:
            raise ConnectionClosed(
                f"the connection is closed ({self._dead})",
                getattr(self._dead, "code", None),
            )

    async def _calls(
        self, calls: list[tuple[str, object]], timeout: float | None, single: bool
    ) -> list[Outcome]:
        self._check()
        deadline = self._deadline(timeout)
        ids = [self._rpc.next_id() for _ in calls]
        futures = [self._loop.create_future() for _ in ids]
        for i, f in zip(ids, futures):
            self._pending[i] = f
        done = False
        try:
            if single:
                (method, params), call_id = calls[0], ids[0]
                await self._send(
                    lambda: self._rpc.request(method, params, call_id), deadline
                )
            else:
                await self._send(
                    lambda: self._rpc.batch(
                        [(m, p, i) for (m, p), i in zip(calls, ids)]
                    ),
                    deadline,
                )
            remaining = deadline - time.monotonic()
            try:
                outcomes = await _answers(
                    futures, None if remaining == math.inf else max(remaining, 0)
                )
            except asyncio.TimeoutError:
                t = self.timeout if timeout is None else timeout
                raise CallTimeout(
                    f"no answer within {t}s; the call was cancelled on the server"
                ) from None
            done = True
            return outcomes
        finally:
            for i, f in zip(ids, futures):
                self._pending.pop(i, None)
                f.cancel()  # (no-op once answered)
            if not done and self._dead is None:
                self._cancel_remote(ids)

    def _cancel_remote(self, ids: list[int]) -> None:
        async def cancel() -> None:
            for i in ids:
                try:
                    build = functools.partial(
                        self._rpc.request, "ferry.cancel", {"id": i}, None
                    )
                    await self._send(build, time.monotonic() + 1.0)
                except FerryError:
                    return

        task = self._loop.create_task(cancel())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send(self, build: Callable[[], Outgoing], deadline: float) -> None:
        async with self._send_lock:
            if self._sock.fileno() < 0:
                self._check()
                raise ConnectionClosed("the connection is closed")
            out = build()
            try:
                if out.fds:
                    if out.before:
                        await self._send_all([out.before], [], deadline)
                    await self._send_all(out.parts, out.fds, deadline)
                else:
                    await self._send_all(
                        [out.before, *out.parts] if out.before else out.parts,
                        [],
                        deadline,
                    )
            finally:
                out.done()

    async def _send_all(
        self, parts: list[bytes | memoryview], fds: list[int], deadline: float
    ) -> None:
        anc = rights(fds)
        while parts:
            try:
                n = self._sock.sendmsg(parts[:MAX_IOV], anc)
            except BlockingIOError:
                if not await self._writable(deadline):
                    err = CallTimeout(
                        "the server did not take the request in time; the connection is closed"
                    )
                    self._fail(ConnectionClosed(str(err)))
                    raise err from None
                continue
            except OSError as e:
                self._fail(ConnectionClosed(f"the connection is gone: {e}"))
                raise ConnectionClosed(f"the connection is gone: {e}") from None
            anc = []
            parts = advance(parts, n)

    async def _writable(self, deadline: float) -> bool:
        fut: asyncio.Future[None] = self._loop.create_future()

        def ready() -> None:
            if not fut.done():
                fut.set_result(None)

        self._loop.add_writer(self._fd, ready)
        try:
            remaining = deadline - time.monotonic()
            await asyncio.wait_for(
                fut, None if remaining == math.inf else max(remaining, 0)
            )
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self._loop.remove_writer(self._fd)

    def _on_readable(self) -> None:
        """The event loop's callback: reads what is there and handles complete frames."""
        session = self._session
        rpc = self._rpc
        reader = session.reader
        try:
            direct = reader.direct()
            target = direct if direct is not None else self._scratch
            try:
                n, anc, flags, _ = self._sock.recvmsg_into([target], ANCILLARY)
            except BlockingIOError:
                return
            except OSError as e:
                raise ConnectionClosed(f"the connection is gone: {e}") from None
            fds = received_fds(anc, flags)
            if n == 0 and not fds:
                raise ConnectionClosed(
                    "the server closed the connection (end of stream)"
                )
            if direct is not None:
                reader.filled(n, fds)
            else:
                reader.feed(memoryview(self._scratch)[:n], fds)
            while True:
                f = reader.next_frame()
                if f is None:
                    return
                if self._handshake is not None and not self._handshake.done():
                    session.on_handshake(f)
                    self._handshake.set_result(None)
                    continue
                for rid, outcome in rpc.on_frame(f):
                    fut = self._pending.get(rid)
                    if fut is not None and not fut.done():
                        fut.set_result(outcome)
        except FerryError as e:
            self._fail(e)
        except Exception as e:  # a bug here must not leave calls waiting forever
            self._fail(ProtocolError(f"internal error while reading: {e!r:.300}"))

    def _fail(self, err: FerryError) -> None:
        if self._dead is None:
            self._dead = err
        if isinstance(err, ProtocolError) and self._sock.fileno() >= 0:
            try:
                self._sock.send(self._session.close_frame(err.code, str(err)))
                self._sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self._teardown()

    def _teardown(self) -> None:
        err = self._dead or ConnectionClosed("the connection is closed")
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(_copy(err))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(_copy(err))
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._fd)
            self._loop.remove_writer(self._fd)
            self._sock.close()
        self._session.close_channels()


def _copy(err: FerryError) -> FerryError:
    """A fresh exception like `err` for each waiter (one instance raised in many places
    would collect all their tracebacks)."""
    if isinstance(err, ProtocolError):
        return ProtocolError(str(err), err.code)
    if isinstance(err, Refused):
        return Refused(err.refusal)
    return ConnectionClosed(str(err), getattr(err, "code", None))


__all__ = ["AsyncClient", "RpcError"]
