"""`Pipe`: a blocking, message-level connection to a ferry peer (no JSON-RPC).

A message is a JSON header and a list of tensors (PROTOCOL.md section 5): `send(header,
tensors)` writes one, `recv()` returns the next one the peer sent, as a `Message`. The
connection is the same as `Client`'s (handshake, shm or inline channel, limits, leases,
deadlines, hostile-peer checks); only JSON-RPC is missing: nothing matches answers to
requests, so a peer's messages come out of `recv()` in the order it sent them.

- Tensors go as `Client.call` sends them: arrays from `alloc()` (and arrays received
  earlier) without a copy over shm, other arrays copied once into shared memory, or
  inline when small or without shm. Received tensors are numpy arrays; over shm they are
  read-only views of the peer's memory (or of this side's own, for a tensor sent back).
- Any thread may `send()`; `recv()` serves one thread at a time (others wait their turn).
- Received tensors' leases are released when their arrays are gone: with the next
  `send()`, or at the next `recv()` (a loop that only receives frees the peer's memory).
- `recv()` waits up to its `timeout` (default: the pipe's `timeout`) and then raises
  `CallTimeout`; the pipe stays usable. When the peer goes away or breaks the protocol,
  `recv()` raises `ConnectionClosed` or `ProtocolError` once, and every later call
  `ConnectionClosed`.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ._cuda import CudaArrayLike, cuda_array
from ._cuda_channel import dtype_of
from ._connection import Connection
from ._outgoing import ENCODER, little_endian
from ._session import Session
from .errors import CallTimeout, ConnectionClosed, ParamsError, ProtocolError
from .tensors import Tensor, TensorIn, ferry_dtype


class Message(NamedTuple):
    """One received message: its JSON header and its tensors, in order."""

    header: Any
    tensors: list[Any]
    """numpy arrays, and CuPy arrays for CUDA tensors."""


class Pipe(Connection):
    """A message-level connection to a ferry peer. Make one with `Pipe.connect(addr)`
    (the same arguments as `Client.connect`, or a `ConnectOptions`; `timeout` is how long
    `recv()` waits)."""

    def __init__(self, sock: socket.socket, session: Session, timeout: float) -> None:
        super().__init__(sock, session, timeout)
        self._recv_lock = threading.Lock()

    def send(
        self,
        header: object,
        tensors: Sequence[TensorIn | CudaArrayLike] = (),
        *,
        timeout: float | None = None,
    ) -> None:
        """Sends one message: `header` (any JSON value) and `tensors` (numpy arrays,
        `Tensor`s, or CUDA arrays on a connection with the cuda-ipc channel), waiting at most `timeout` seconds for the socket to take it.

        Raises:
            ParamsError: `header` is not JSON, or a tensor is not an array.
            LimitError: The message is over the peer's limits, or the shm pool is full.
            ConnectionClosed: The connection is gone.
            CallTimeout: The peer did not take the message in time (the connection is
                closed: a frame cut short cannot be resumed).
        """
        deadline = self._deadline(timeout)
        self._check()
        items: list[tuple[Any, str]] = []
        for t in tensors:
            if isinstance(t, Tensor):
                items.append((little_endian(t.array), t.dtype))
            elif isinstance(t, np.ndarray):
                items.append((little_endian(t), ferry_dtype(t.dtype)))
            elif (cu := cuda_array(t)) is not None:
                items.append((cu, dtype_of(cu)))
            else:
                raise ParamsError(
                    "a tensor must be a numpy array, a Tensor or a CUDA array, got "
                    f"{type(t).__name__}"
                )
        try:
            app = ENCODER.encode(header)
        except (TypeError, ValueError) as e:
            raise ParamsError(f"the header cannot be sent as JSON: {e}") from None
        with self._send_lock:
            self._check_open()
            self._write(self._session.message(app, items), deadline)

    def recv(self, *, timeout: float | None = None) -> Message:
        """The next message from the peer, waiting at most `timeout` seconds (default:
        `self.timeout`).

        Raises:
            CallTimeout: No message in time (the pipe stays usable).
            ConnectionClosed: The connection is gone.
            ProtocolError: The peer broke the protocol (the connection is closed).
        """
        deadline = self._deadline(timeout)
        with self._recv_lock:
            session = self._session
            reader = session.reader
            if self._dead is None:
                self._release_now(deadline)  # (arrays dropped since the last recv)
            while True:
                self._check()
                try:
                    f = reader.next_frame()
                    if f is None:
                        self._recv(deadline)
                        continue
                    got = session.receive(f)
                except CallTimeout:
                    t = self.timeout if timeout is None else timeout
                    raise CallTimeout(f"no message within {t}s") from None
                except (ProtocolError, ConnectionClosed) as e:
                    self._fail(e)
                    raise
                except Exception as e:  # a bug here must not leave the pipe half-read
                    self._fail(
                        ProtocolError(f"internal error while reading: {e!r:.300}")
                    )
                    raise
                if got is not None:
                    return Message(got[0], got[1])


__all__ = ["Message", "Pipe"]
