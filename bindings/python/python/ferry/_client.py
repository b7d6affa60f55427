"""`Client` and `AsyncClient`: calling ferry JSON-RPC servers on the Rust core.

The Rust client (`ferry_rpc::Client`, `_native.Client`) does the work: the connection on
any address (`unix:NAME`, `unix:/path.sock`, `quic://host:port#sha256=PIN` with a token),
the handshake and channels (shm: zero-copy tensors on one host), calls matched by id, many
in flight at once, from any threads or asyncio tasks. This module is its typed face.

- Params: JSON values (None, bool, int, float, str, lists, tuples, dicts with str keys),
  numpy arrays and CPU torch tensors of every dtype ferry has (bf16 and float8 as torch
  dtypes or ml_dtypes' numpy types), tensors received earlier, tensor references. A tensor
  from `alloc()` travels without a copy over shm; any other is copied once into the
  connection's memory.
- Results: tensors are numpy arrays, or torch tensors when the client or the call asks
  (`as_torch`), viewing the received memory without a copy. **Read-only**: a numpy result
  is not writeable (numpy refuses writes); a torch result (torch has no read-only
  tensors) is copy-on-write: a write copies the pages it touches into this process, so
  the server never sees it, and such a tensor, sent back, is sent as a copy.
- Lifecycle: `closed` turns true as soon as the server closes the connection (or dies),
  `close_reason` says why; `keepalive` seconds (default 60) between do-nothing
  notifications keep a held, idle client from a server's `idle_timeout`;
  `reconnect=True` connects again before a call on a closed client (never re-sending a
  call that was in flight). `connect_timeout` waits for a server that is starting.
- Errors are `ferry.errors`' (`ferry.rpc_errors` for error responses), each naming the
  address.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from . import _native, _tensors
from ._functions import Functions
from .errors import ProtocolError
from .refs import TensorRef as _TensorRef
from .tensors import Tensor as _RawBits

DEFAULT_TIMEOUT = 60.0
"""Seconds a call waits for its answer unless the client or the call says otherwise."""

DEFAULT_KEEPALIVE = 60.0
"""Seconds between keep-alive notifications (a server closes pipes idle for its
`idle_timeout`, 300 s by default)."""

_T = TypeVar("_T")


def _received(a: np.ndarray[Any, Any]) -> _native.TensorRef | _native.OutTensor | None:
    """The native tensor `a` views (its base chain), if any."""
    base: object = a.base
    for _ in range(8):
        if isinstance(base, (_native.TensorRef, _native.OutTensor)):
            return base
        base = getattr(base, "base", None)
        if base is None:
            return None
    return None


def _whole(t: _native.TensorRef | _native.OutTensor, a: np.ndarray[Any, Any], dtype: str) -> bool:
    """Whether `a` (of ferry dtype `dtype`) is exactly `t`: same bytes, shape and dtype."""
    return (
        a.flags.c_contiguous
        and t.nbytes == a.nbytes
        and t.dtype == dtype
        and tuple(t.shape) == a.shape
        and t.data_ptr == a.__array_interface__["data"][0]
    )


class _Allocated:
    """The arrays a client's `alloc` made, by address, while they live: a torch tensor
    over one (no numpy base chain to follow) is recognised by its address."""

    def __init__(self) -> None:
        self.by_ptr: weakref.WeakValueDictionary[int, np.ndarray[Any, Any]] = (
            weakref.WeakValueDictionary()
        )
        self.devices = _tensors.new_devices()

    def encode(self, x: object, client: _native.Client) -> object:
        """The `encode` hook of `_native.Client`: what sends `x`, which is not plain JSON
        (a tensor, a stand-in JSON value, or None when ferry cannot send it)."""
        if isinstance(x, (_native.TensorRef, _native.OutTensor)):
            return x
        if _tensors.is_device(x):
            return _tensors.device_out(x, self.devices)
        if isinstance(x, _TensorRef):
            return x.to_json()
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, _RawBits):  # raw bits of a dtype numpy lacks (`ferry.Tensor`)
            a, dtype = x.array, x.dtype
        elif _tensors.is_tensor_like(x):
            a, dtype = _tensors.host_numpy(x)
        else:
            return None
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        mine = _received(a)
        if mine is None and a.flags.c_contiguous and a.size:
            own = self.by_ptr.get(a.__array_interface__["data"][0])
            mine = None if own is None else _received(own)
        if mine is not None and _whole(mine, a, dtype):
            if isinstance(mine, _native.OutTensor):
                return mine  # from alloc(): no copy
            if isinstance(x, np.ndarray) and not x.flags.writeable:
                return mine  # a received tensor, read-only, sent back as it is
        return _tensors.copied(a, dtype, client.alloc)

    def alloc(self, client: _native.Client, shape: Sequence[int], dtype: object) -> Any:
        out = client.alloc([int(n) for n in shape], _tensors.dtype_name(dtype))
        a = _tensors.out_array(out)
        if a.size:
            self.by_ptr[a.__array_interface__["data"][0]] = a
        return a


def _hooks(allocated: _Allocated) -> tuple[Any, Any, Any, Any]:
    return (allocated.encode, _tensors.to_numpy, _tensors.to_torch, _TensorRef.from_json)


def _task_status(r: object) -> dict[str, Any]:
    if not isinstance(r, dict) or not isinstance(r.get("state"), str):
        raise ProtocolError(f"a task status must be an object with a state, got {r!r:.200}")
    return r


def _submit_params(method: str, params: object, keep: bool, detached: bool) -> dict[str, object]:
    args: dict[str, object] = {"method": method, "keep": keep}
    if detached:
        args["detached"] = True
    if params is not None:
        args["params"] = params
    return args


def _task_id(r: object) -> str:
    if not isinstance(r, dict) or not isinstance(r.get("task"), str):
        raise ProtocolError(f"ferry.task.submit answered {r!r:.200}")
    return str(r["task"])


def _document(r: object) -> dict[str, Any]:
    if not isinstance(r, dict):
        raise ProtocolError(f"rpc.discover answered {type(r).__name__}, not an object")
    return r


class _Base:
    """What `Client` and `AsyncClient` share: the options and the native client."""

    def __init__(
        self,
        native: _native.Client,
        allocated: _Allocated,
        connect: dict[str, Any],
        *,
        timeout: float | None,
        as_torch: bool,
        reconnect: bool,
    ) -> None:
        self._native = native
        self._allocated = allocated
        self._connect = connect
        self.timeout = timeout
        """Default seconds a call waits for its answer (`None`: no limit)."""
        self.as_torch = as_torch
        """Whether results' tensors are torch tensors (else numpy arrays) by default."""
        self.reconnect = reconnect
        """Whether a call on a closed client connects again first."""
        self._functions: Functions | None = None

    @property
    def address(self) -> str:
        """The server's address, as given to `connect`."""
        return self._native.address

    @property
    def channel(self) -> str:
        """The channel tensors travel on: `"shm"` (zero-copy, one host), `"inline"`,
        `"quic"`."""
        return self._native.channel

    @property
    def transport(self) -> str:
        """`"unix"` or `"quic"`."""
        return self._native.transport

    @property
    def closed(self) -> bool:
        """True once the connection ended: the server closed it or went away (seen at
        once), or `close()`."""
        return self._native.closed

    @property
    def close_reason(self) -> str | None:
        """Why the connection ended (the server's reason when it gave one, e.g. its
        `idle_timeout`), or None while it is open."""
        return self._native.close_reason

    def alloc(self, shape: Sequence[int], dtype: object = "f32", *, as_torch: bool = False) -> Any:
        """A writable, uninitialised array (`as_torch`: a torch tensor) in this
        connection's memory: fill it and pass it in params, and it travels without a
        copy (over shm)."""
        a = self._allocated.alloc(self._native, shape, dtype)
        if not as_torch:
            return a
        import torch

        return _tensors.torch_view(a, _tensors.dtype_name(dtype), torch.from_numpy)

    @property
    def device_channel(self) -> str | None:
        """The channel negotiated for CUDA tensors (`"cuda-ipc"`), or None: CUDA tensors
        cannot go in params on this connection (`DeviceTensorError`)."""
        return self._native.device_channel

    def alloc_device(
        self, shape: Sequence[int], dtype: object = "f32", device: int = 0
    ) -> _native.DeviceTensor:
        """A tensor on `cuda:device` in this connection's cuda-ipc memory: fill it (through
        `torch.as_tensor(t, device="cuda")` or `cupy.asarray(t)`) and pass it, or that
        view of it, in params: it travels without a copy. Contents unspecified until
        written. `DeviceTensorError` without a cuda-ipc channel."""
        out = self._native.alloc_device(
            [int(n) for n in shape], _tensors.dtype_name(dtype), int(device)
        )
        return _tensors.remember(self._allocated.devices, out)

    def flush_releases(self) -> None:
        """Nothing to do: the Rust core tells the server which of its tensors this process
        no longer uses as soon as the last view of one is gone (kept for code written
        against the retired pure-Python client, which waited for the next call)."""

    def _limit(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def _torch(self, as_torch: bool | None) -> bool:
        return self.as_torch if as_torch is None else as_torch

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._native!r})"


class Client(_Base):
    """A connection to a ferry JSON-RPC server (blocking; any number of threads may call
    at once). Make one with `Client.connect(addr)`."""

    @classmethod
    def connect(
        cls,
        addr: str,
        *,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float | None = None,
        as_torch: bool = False,
        keepalive: float | None = DEFAULT_KEEPALIVE,
        reconnect: bool = False,
        shm_pool_mib: int | None = None,
        shm: bool = True,
    ) -> Client:
        """Connects to `addr`: `unix:NAME`, `unix:/path.sock`, or
        `quic://host:port#sha256=PIN` (the pin `ferry serve` prints).

        Args:
            token: The server's bearer token, if it requires one.
            timeout: Default seconds a call waits (None: no limit).
            connect_timeout: Seconds to keep trying while nothing listens at `addr` yet (a
                server that is starting); None: one attempt.
            as_torch: Results' tensors as torch tensors by default.
            keepalive: Seconds between keep-alive notifications (None or 0: none).
            reconnect: Connect again before a call on a closed client.
            shm_pool_mib: MiB of shared memory this client may allocate (default 2048).
            shm: Offer shared memory (the shm channel and the ring: zero-copy tensors on
                one host); False sends tensors inline in the socket's bytes.

        Raises:
            ConnectionClosed: Nothing to connect to (the message names the address).
            CallTimeout: No connection within `connect_timeout`.
            Refused: The server refused the handshake (e.g. a wrong token).
        """
        allocated = _Allocated()
        opts: dict[str, Any] = {
            "token": token,
            "connect_timeout": connect_timeout,
            "shm_pool_mib": shm_pool_mib,
            "keepalive": keepalive,
            "shm": shm,
        }
        native = _native.Client.connect(addr, _hooks(allocated), **opts)
        return cls(
            native,
            allocated,
            {"addr": addr, **opts},
            timeout=timeout,
            as_torch=as_torch,
            reconnect=reconnect,
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reconnecting = threading.Lock()

    def _live(self) -> _native.Client:
        n = self._native
        if self.reconnect and n.closed:
            with self._reconnecting:
                if self._native.closed:
                    c = dict(self._connect)
                    addr = c.pop("addr")
                    self._native = _native.Client.connect(addr, _hooks(self._allocated), **c)
                n = self._native
        return n

    def call(
        self,
        method: str,
        params: object = None,
        *,
        timeout: float | None = None,
        as_torch: bool | None = None,
    ) -> Any:
        """Calls `method` with `params` (a dict by name, a list or tuple by position, or
        None) and returns its result.

        Raises:
            RpcError: The server answered with an error (the class of its code).
            CallTimeout: No answer within `timeout` seconds (default `self.timeout`); the
                call was cancelled on the server.
            ConnectionClosed: The connection is gone.
            ParamsError: `params` cannot be sent (the message says where).
        """
        return self._live().call(method, params, self._limit(timeout), self._torch(as_torch))

    def notify(self, method: str, params: object = None) -> None:
        """Sends a notification (no answer; the server reports no error)."""
        self._live().notify(method, params)

    def batch(
        self,
        calls: Sequence[tuple[str, object]],
        *,
        timeout: float | None = None,
        as_torch: bool | None = None,
    ) -> list[Any]:
        """Calls several methods in one message; their results in order, with an
        `RpcError` (not raised) in place of each call that failed."""
        if not calls:
            return []
        out: list[Any] = self._live().batch(
            list(calls), self._limit(timeout), self._torch(as_torch)
        )
        return out

    def discover(self) -> dict[str, Any]:
        """The server's OpenRPC document (`rpc.discover`)."""
        return _document(self.call("rpc.discover"))

    @property
    def functions(self) -> Functions:
        """The server's functions as methods: `client.functions.add(1, 2)` (built from
        `discover()`, fetched on first use and kept; see `ferry._functions`)."""
        if self._functions is None:
            self._functions = Functions(self.discover(), self.call, f"the server at {self.address}")
        return self._functions

    def submit(
        self, method: str, params: object = None, *, keep: bool = False, detached: bool = False
    ) -> str:
        """Starts `method` as a task (`ferry.task.submit`); returns its id. It is cancelled
        when this connection closes unless `detached`; `keep` keeps its result after it
        is fetched."""
        return _task_id(
            self.call("ferry.task.submit", _submit_params(method, params, keep, detached))
        )

    def task_status(self, task: str) -> dict[str, Any]:
        """The task's status: `{"task", "method", "state", "elapsed_ms"}`."""
        return _task_status(self.call("ferry.task.status", {"task": task}))

    def task_result(
        self,
        task: str,
        *,
        wait_ms: int = 0,
        keep: bool = False,
        timeout: float | None = None,
        as_torch: bool | None = None,
    ) -> Any:
        """The task's result (its error raised), waiting up to `wait_ms` on the server;
        `TaskPendingError` while it still runs."""
        if timeout is None and self.timeout is not None:
            timeout = max(self.timeout, wait_ms / 1000 + 10)
        return self.call(
            "ferry.task.result",
            {"task": task, "wait_ms": wait_ms, "keep": keep},
            timeout=timeout,
            as_torch=as_torch,
        )

    def task_cancel(self, task: str) -> dict[str, Any]:
        """Cancels the task; returns its status."""
        return _task_status(self.call("ferry.task.cancel", {"task": task}))

    def close(self) -> None:
        """Closes the connection; calls waiting fail with `ConnectionClosed`."""
        self._native.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Resolves `future` (on its loop; called by `_native`'s settling thread through
    `call_soon_threadsafe`), unless it was cancelled meanwhile."""
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


async def _run(
    start: Callable[[asyncio.AbstractEventLoop, asyncio.Future[Any]], _native.Pending],
) -> Any:
    """Starts a native operation that resolves a future of the running loop, and awaits
    it; a cancelled await drops the operation on the runtime (a call is then cancelled on
    the server)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    pending = start(loop, future)
    future.add_done_callback(lambda f: pending.cancel() if f.cancelled() else None)
    return await future


class AsyncClient(_Base):
    """A connection to a ferry JSON-RPC server for asyncio: `await
    AsyncClient.connect(addr)`; the methods are `Client`'s, awaited. Calls run on
    ferry's runtime (no thread per call) and any number may be in flight at once."""

    @classmethod
    async def connect(
        cls,
        addr: str,
        *,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float | None = None,
        as_torch: bool = False,
        keepalive: float | None = DEFAULT_KEEPALIVE,
        reconnect: bool = False,
        shm_pool_mib: int | None = None,
        shm: bool = True,
    ) -> AsyncClient:
        """Connects to `addr`; the arguments are `Client.connect`'s."""
        allocated = _Allocated()
        opts: dict[str, Any] = {
            "token": token,
            "connect_timeout": connect_timeout,
            "shm_pool_mib": shm_pool_mib,
            "keepalive": keepalive,
            "shm": shm,
        }
        native = await cls._open(addr, allocated, opts)
        return cls(
            native,
            allocated,
            {"addr": addr, **opts},
            timeout=timeout,
            as_torch=as_torch,
            reconnect=reconnect,
        )

    @staticmethod
    async def _open(addr: str, allocated: _Allocated, opts: dict[str, Any]) -> _native.Client:
        native: _native.Client = await _run(
            lambda loop, f: _native.Client.connect_async(loop, f, addr, _hooks(allocated), **opts)
        )
        return native

    async def _live(self) -> _native.Client:
        if self.reconnect and self._native.closed:
            c = dict(self._connect)
            addr = c.pop("addr")
            self._native = await self._open(addr, self._allocated, c)
        return self._native

    async def _start(
        self, kind: str, method: str, params: object, timeout: float | None, as_torch: bool
    ) -> Any:
        n = await self._live()
        return await _run(lambda loop, f: n.start(loop, f, kind, method, params, timeout, as_torch))

    async def call(
        self,
        method: str,
        params: object = None,
        *,
        timeout: float | None = None,
        as_torch: bool | None = None,
    ) -> Any:
        """`Client.call`, awaited. A cancelled await cancels the call on the server."""
        return await self._start(
            "call", method, params, self._limit(timeout), self._torch(as_torch)
        )

    async def notify(self, method: str, params: object = None) -> None:
        """Sends a notification (no answer)."""
        await self._start("notify", method, params, None, False)

    async def batch(
        self,
        calls: Sequence[tuple[str, object]],
        *,
        timeout: float | None = None,
        as_torch: bool | None = None,
    ) -> list[Any]:
        """`Client.batch`, awaited."""
        if not calls:
            return []
        out: list[Any] = await self._start(
            "batch", "", list(calls), self._limit(timeout), self._torch(as_torch)
        )
        return out

    async def discover(self) -> dict[str, Any]:
        """The server's OpenRPC document (`rpc.discover`)."""
        return _document(await self.call("rpc.discover"))

    async def load_functions(self) -> Functions:
        """Fetches the document `functions` is built from (once), without blocking the
        event loop; returns `functions`."""
        if self._functions is None:
            doc = await self.discover()
            self._functions = Functions(doc, self.call, f"the server at {self.address}")
        return self._functions

    @property
    def functions(self) -> Functions:
        """The server's functions as methods returning awaitables: `await
        client.functions.add(1, 2)`. Built from the server's OpenRPC document: `await
        client.load_functions()` fetches it first; otherwise the first use fetches it
        with one blocking round trip."""
        if self._functions is None:
            doc = _document((self._native).call("rpc.discover", None, self._limit(None), False))
            self._functions = Functions(doc, self.call, f"the server at {self.address}")
        return self._functions

    async def submit(
        self, method: str, params: object = None, *, keep: bool = False, detached: bool = False
    ) -> str:
        """`Client.submit`, awaited."""
        p = _submit_params(method, params, keep, detached)
        return _task_id(await self.call("ferry.task.submit", p))

    async def task_status(self, task: str) -> dict[str, Any]:
        """`Client.task_status`, awaited."""
        return _task_status(await self.call("ferry.task.status", {"task": task}))

    async def task_result(
        self,
        task: str,
        *,
        wait_ms: int = 0,
        keep: bool = False,
        timeout: float | None = None,
        as_torch: bool | None = None,
    ) -> Any:
        """`Client.task_result`, awaited."""
        if timeout is None and self.timeout is not None:
            timeout = max(self.timeout, wait_ms / 1000 + 10)
        return await self.call(
            "ferry.task.result",
            {"task": task, "wait_ms": wait_ms, "keep": keep},
            timeout=timeout,
            as_torch=as_torch,
        )

    async def task_cancel(self, task: str) -> dict[str, Any]:
        """`Client.task_cancel`, awaited."""
        return _task_status(await self.call("ferry.task.cancel", {"task": task}))

    async def close(self) -> None:
        """Closes the connection (at most 0.1 s for the close notice)."""
        await asyncio.get_running_loop().run_in_executor(None, self._native.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


__all__ = ["AsyncClient", "Client"]
