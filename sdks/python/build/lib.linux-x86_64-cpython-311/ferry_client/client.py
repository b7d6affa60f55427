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
import socket
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from ._connection import Connection
from ._rpc import (
    Outcome,
    RpcSession,
    discover_answer,
    status_answer,
    submit_answer,
    submit_params,
)
from ._session import Session
from .errors import CallTimeout, ConnectionClosed, FerryError, ProtocolError, RpcError


class Client(Connection):
    """A connection to a ferry JSON-RPC server. Make one with `Client.connect(addr)`
    (`Connection.connect`: options as keyword arguments or a `ConnectOptions`)."""

    def __init__(self, sock: socket.socket, session: Session, timeout: float) -> None:
        super().__init__(sock, session, timeout)
        self._rpc = RpcSession(session)
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
        rpc = self._rpc
        with self._lock:  # (`_begin`, inline)
            if self._dead is not None:
                self._check()
            call_id = rpc.next_id()
            self._pending.add(call_id)
        ids = [call_id]
        done = False
        try:
            with self._send_lock:
                self._check_open()  # before building: nothing granted on a closed one
                self._write(rpc.request(method, params, call_id), deadline)
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
            lambda: self._rpc.request(method, params, None), self._deadline(None)
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
                lambda: self._rpc.batch([(m, p, i) for (m, p), i in zip(calls, ids)]),
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
        return submit_answer(
            self.call(
                "ferry.task.submit", submit_params(method, params, keep, detached)
            )
        )

    def task_status(self, task: str) -> dict[str, Any]:
        """The task's status: `{"task", "method", "state", "elapsed_ms"}`."""
        return status_answer(self.call("ferry.task.status", {"task": task}))

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
        return status_answer(self.call("ferry.task.cancel", {"task": task}))

    def discover(self) -> dict[str, Any]:
        """The server's OpenRPC document (`rpc.discover`)."""
        return discover_answer(self.call("rpc.discover"))

    # ---- internals ----------------------------------------------------------------------

    def _begin(self) -> int:
        with self._lock:
            self._check()
            call_id = self._rpc.next_id()
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
                        self._rpc.request, "ferry.cancel", {"id": i}, None
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
        rpc = self._rpc
        reader = self._session.reader
        try:
            self._recv(deadline)
            while True:
                f = reader.next_frame()
                if f is None:
                    return
                answers = rpc.on_frame(f)
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


__all__ = ["Client", "RpcError"]
