"""`ferry.App`: Python functions served by ferry's Rust server."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

import numpy as np
import pydantic

from . import _native, _schema, _tensors
from .errors import RpcError
from .refs import TensorRef
from .rpc_errors import error_from_code

F = TypeVar("F", bound=Callable[..., Any])

INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
CANCELLED = -32002
TENSOR_ERROR = -32006

Outcome = tuple[str | bytes, list[_tensors.Out]] | tuple[int, str, str | None]
"""What a handler wrapper gives Rust: `(result_json, tensors)` or `(code, message,
data_json)`."""

_current: contextvars.ContextVar[Context] = contextvars.ContextVar("ferry_context")


class Context:
    """What a handler gets besides its params, when it declares a param annotated
    `ferry.Context` (any name): cancellation, result tensors, the caller."""

    __slots__ = ("_allocated", "_devices", "_given", "_native")

    def __init__(self, native: _native.Context) -> None:
        self._native = native
        self._allocated: list[_native.OutTensor] = []
        self._given: _tensors.Given = []
        self._devices: _tensors.Devices | None = None

    @property
    def cancelled(self) -> bool:
        """True once the call is cancelled (client cancel or timeout, `ferry.task.cancel`,
        the connection closing). Sync handlers should check it in long loops; async ones
        get `asyncio.CancelledError` instead."""
        return self._native.cancelled

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Blocks up to `timeout` seconds for cancellation; whether it came."""
        return self._native.wait_cancelled(timeout)

    @property
    def peer(self) -> dict[str, Any]:
        """The caller: kind, addr, pid, uid, agent, channel."""
        peer: dict[str, Any] = json.loads(self._native.peer)
        return peer

    def alloc(
        self, shape: tuple[int, ...] | list[int], dtype: object = "f32"
    ) -> np.ndarray[Any, Any]:
        """A writable array in the connection's memory: return it (or a torch tensor made
        from it with `torch.from_numpy`) and it travels without a copy. Like `np.empty`,
        its contents are unspecified (a recycled slot holds an earlier result's bytes)."""
        out = self._native.alloc([int(n) for n in shape], _tensors.dtype_name(dtype))
        self._allocated.append(out)
        return _tensors.out_array(out)

    @property
    def device_channel(self) -> str | None:
        """The channel the caller's connection negotiated for CUDA tensors (`"cuda-ipc"`),
        or None: a CUDA result cannot go back to this caller (it gets a `TensorError`);
        return `t.cpu()` to answer it from the host."""
        return self._native.device_channel

    def alloc_device(
        self, shape: tuple[int, ...] | list[int], dtype: object = "f32", device: int = 0
    ) -> _native.DeviceTensor:
        """A tensor on `cuda:device` in the memory of the caller's cuda-ipc channel: fill
        it (through `torch.as_tensor(t, device="cuda")` or `cupy.asarray(t)`) and return
        it, or that view of it: it goes back without a copy. Contents unspecified until
        written. `DeviceTensorError` when the caller has no cuda-ipc channel."""
        out = self._native.alloc_device(
            [int(n) for n in shape], _tensors.dtype_name(dtype), int(device)
        )
        if self._devices is None:
            self._devices = _tensors.new_devices()
        return _tensors.remember(self._devices, out)

    def keep(self, tensor: object, *, ttl: float | None = None) -> TensorRef:
        """Keeps `tensor` on the server as a reference owned by the caller, to return in
        place of its bytes (PROTOCOL.md section 21). The caller passes it back where a
        method takes a tensor (no byte moves: the handler gets this tensor), fetches it
        (zero-copy over shm) or frees it. It is copied once, into shared memory of its own;
        it is freed when the caller's connection closes unless published, after `ttl`
        seconds if given, or by `ferry.ref.free`. Past the server's reference limits it
        raises `RpcError` LIMIT_EXCEEDED naming the limit (the caller gets it if the
        handler does not catch it)."""
        a, dtype = _tensors.host_numpy(tensor)
        out = _tensors.copied(a, dtype, self._native.keep_alloc)
        info, err = self._native.keep(out, ttl)
        if err is not None:
            code, message, data = err
            raise error_from_code(code, message, None if data is None else json.loads(data))
        assert info is not None
        return TensorRef.from_json(json.loads(info))


def keep(tensor: object, *, ttl: float | None = None) -> TensorRef:
    """`Context.keep` of the call being served (from inside a handler): `tensor` kept on
    the server as the caller's reference, to return in place of its bytes."""
    ctx = _current.get(None)
    if ctx is None:
        raise RuntimeError("ferry.keep is for results: call it inside a handler being served")
    return ctx.keep(tensor, ttl=ttl)


def empty(shape: tuple[int, ...] | list[int], dtype: object = "f32", *, like: str = "numpy") -> Any:
    """`Context.alloc` of the call being served (from inside a handler): a writable
    array (`like="torch"`: a torch tensor) that is sent without a copy when returned."""
    ctx = _current.get(None)
    if ctx is None:
        raise RuntimeError("ferry.empty is for results: call it inside a handler being served")
    a = ctx.alloc(shape, dtype)
    if like == "torch":
        import torch

        return _tensors.torch_view(a, _tensors.dtype_name(dtype), torch.from_numpy)
    if like != "numpy":
        raise ValueError(f'like={like!r}: "numpy" or "torch"')
    return a


class _Function:
    """One served function and its wrappers for the Rust side."""

    def __init__(
        self,
        app: App,
        fn: Callable[..., Any],
        name: str,
        *,
        task: bool,
        concurrency: int | None,
        summary: str | None,
        description: str | None,
        deprecated: bool,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.task = task
        self.concurrency = concurrency
        self.deprecated = deprecated
        self.is_async = inspect.iscoroutinefunction(fn)
        self.sig = _schema.signature(fn, Context)
        doc = inspect.getdoc(fn) or ""
        first, _, rest = doc.partition("\n\n")
        self.summary = summary or (" ".join(first.split()) or None)
        self.description = description or (rest.strip() or None)
        if task:
            note = f"Long-running: submit it as a task (ferry.task.submit with method {name!r})."
            self.description = f"{self.description}\n\n{note}" if self.description else note

    # ---- the wrappers Rust calls ----------------------------------------------------

    def sync_wrapper(
        self,
    ) -> Callable[[object, list[_tensors.Received], _native.Context], Outcome]:
        """The sync wrapper Rust calls: `call_sync`, or for a function whose params and
        result are all plain types (float, int, bool, str; taken by position, no
        `Context`) one that checks and encodes them itself and calls `call_sync` for
        anything else (so errors read the same). On a 2-CPU VM: 1.4 us of Python per call
        to `add` against 3.5 us through `call_sync`."""
        plain = _plain_wrapper(self)
        return self.call_sync if plain is None else plain

    def call_sync(
        self, params: object, refs: list[_tensors.Received], native: _native.Context
    ) -> Outcome:
        ctx = Context(native)
        token = _current.set(ctx)
        running = self.app._sync_calls.running
        running.append(None)
        try:
            try:
                kwargs = self._kwargs(params, refs, ctx)
            except (pydantic.ValidationError, ValueError) as e:
                return _invalid_params(e)
            try:
                result = self.fn(**kwargs)
            except BaseException as e:
                return self.app._failure(e)
            return self._encode(result, ctx)
        finally:
            _current.reset(token)
            running.pop()

    def call_async(
        self,
        params: object,
        refs: list[_tensors.Received],
        native: _native.Context,
        done: _native.Done,
    ) -> Any:
        loop = self.app._loop
        if loop is None or loop.is_closed():
            done(
                (
                    INTERNAL_ERROR,
                    "Internal error",
                    json.dumps({"reason": "the app's event loop is not running"}),
                )
            )
            return _Nothing()
        fut = asyncio.run_coroutine_threadsafe(self._run(params, refs, native), loop)

        def finished(f: Any) -> None:
            if f.cancelled():
                done((CANCELLED, "Cancelled: the call was cancelled", None))
            elif f.exception() is not None:
                done(self.app._failure(f.exception()))
            else:
                done(f.result())

        fut.add_done_callback(finished)
        return fut

    async def _run(
        self, params: object, refs: list[_tensors.Received], native: _native.Context
    ) -> Outcome:
        ctx = Context(native)
        _current.set(ctx)  # this task's own context
        try:
            kwargs = self._kwargs(params, refs, ctx)
        except (pydantic.ValidationError, ValueError) as e:
            return _invalid_params(e)
        try:
            result = await self.fn(**kwargs)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            return self.app._failure(e)
        return self._encode(result, ctx)

    # ---- helpers ----------------------------------------------------------------------

    def _kwargs(
        self, params: object, refs: list[_tensors.Received], ctx: Context
    ) -> dict[str, Any]:
        kwargs = self.sig.validate(params, refs, ctx._given)
        if self.sig.ctx_param is not None:
            kwargs = {**kwargs, self.sig.ctx_param: ctx}
        return kwargs

    def _encode(self, result: object, ctx: Context) -> Outcome:
        out = self._encode_result(result, ctx)
        outs = out[1]
        if isinstance(outs, list) and outs:
            device = next((t for t in outs if isinstance(t, _native.DeviceTensor)), None)
            if device is not None and ctx._native.device_channel is None:
                reason = (
                    f"the result of {self.name} holds a {device.device} tensor, but the "
                    "caller's connection negotiated no channel for CUDA tensors (cuda-ipc "
                    "needs both ends on one host, in different processes, sharing a GPU); "
                    "ferry does not copy device tensors to the host on its own: the handler "
                    "can answer such callers with t.cpu() (see Context.device_channel)"
                )
                return (TENSOR_ERROR, "Tensor error", json.dumps({"reason": reason}))
        return out

    def _encode_result(self, result: object, ctx: Context) -> Outcome:
        fast = self.sig.fast_result
        try:
            if fast is not None:
                # Exactly the annotated plain type: what pydantic would write, without it.
                if fast == "ndarray":
                    if type(result) is np.ndarray:
                        t = _tensors.to_out(result, ctx._native.alloc, ctx._allocated, ctx._given)
                        return ('{"$tensor":0}', [t])
                else:
                    text = self.sig.encode_fast(result)
                    if text is not None:
                        return (text, [])
            enc = _schema.Encoding(ctx._native.alloc, ctx._allocated, ctx._given, ctx._devices)
            if self.sig.result_json is not None:
                # pydantic writes the JSON itself (a third of the time); it writes NaN and
                # infinities as such, so a result with them takes the checking path below.
                out = self.sig.result_json(
                    result, context=enc, warnings="error", fallback=enc.fallback
                )
                if b"NaN" not in out and b"Infinity" not in out:
                    return (out, enc.outs)
                enc = _schema.Encoding(ctx._native.alloc, ctx._allocated, ctx._given, ctx._devices)
            if self.sig.result is None:
                obj = _schema.encode_any(result, enc)
            else:
                obj = self.sig.result.dump_python(
                    result,
                    mode="json",
                    context=enc,
                    warnings="error",
                    fallback=enc.fallback,
                )
            text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
        except Exception as e:
            reason = f"the result of {self.name} cannot be sent: {type(e).__qualname__}: {e}"
            return (INTERNAL_ERROR, "Internal error", json.dumps({"reason": reason}))
        return (text, enc.outs)


_PLAIN_TYPES: dict[str, type] = {"float": float, "int": int, "bool": bool, "str": str}
"""The plain kinds `_plain_wrapper` checks itself, and the Python type of each."""


def _plain_wrapper(
    f: _Function,
) -> Callable[[object, list[_tensors.Received], _native.Context], Outcome] | None:
    """`f`'s wrapper for plain params and result (see `_Function.sync_wrapper`), or None
    when `f` is not such a function."""
    sig = f.sig
    fast, result_kind = sig.fast_params, sig.fast_result
    if f.is_async or fast is None or sig.ctx_param is not None or result_kind not in _PLAIN_TYPES:
        return None
    if any(
        kind not in _PLAIN_TYPES or default is not _schema.REQUIRED
        for kind, default in fast.values()
    ):
        return None
    params = list(inspect.signature(f.fn).parameters.values())
    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY
    if [p.name for p in params] != list(fast) or any(p.kind not in positional for p in params):
        return None
    checks = tuple((name, _PLAIN_TYPES[kind], kind == "float") for name, (kind, _) in fast.items())
    n = len(checks)
    fn, encode, general = f.fn, sig.encode_fast, f.call_sync
    running, failure = f.app._sync_calls.running, f.app._failure

    def call(params: object, refs: list[_tensors.Received], native: _native.Context) -> Outcome:
        if type(params) is not dict or len(params) != n or refs:
            return general(params, refs, native)
        args: list[Any] = []
        for name, tp, to_float in checks:
            v = params.get(name, _MISSING)
            t = type(v)
            if t is tp:
                args.append(v)
            elif to_float and t is int:  # JSON 2 for a float param, as pydantic takes it
                args.append(float(v))
            else:
                return general(params, refs, native)
        ctx = Context(native)
        token = _current.set(ctx)
        running.append(None)
        try:
            try:
                result = fn(*args)
            except BaseException as e:
                return failure(e)
            text = encode(result)
            return (text, []) if text is not None else f._encode(result, ctx)
        finally:
            _current.reset(token)
            running.pop()

    return call


_MISSING: Any = object()
"""A param absent from the params given (`_plain_wrapper`)."""


class _Running:
    """How many sync handlers of an app are running, to wait for them at shutdown.

    One item in `running` per handler running: `list.append` and `list.pop` are atomic
    under the GIL, so no lock (a lock cost half a microsecond of a call); `wait_idle`
    polls instead of waiting to be notified."""

    def __init__(self) -> None:
        self.running: list[None] = []

    def wait_idle(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for none to run; whether none does."""
        deadline = time.monotonic() + timeout
        while self.running:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True


SHUTDOWN_WAIT = 10.0
"""Seconds `serve` waits, once stopped, for sync handlers still running (cancelled, they
should end soon). A handler thread that comes back into Python while the interpreter
finalizes aborts the process, so `serve` must not return under a running handler."""


class _Nothing:
    """The handle of a call that never started."""

    def cancel(self) -> bool:
        return False


def _invalid_params(e: Exception) -> Outcome:
    if isinstance(e, pydantic.ValidationError):
        errors = e.errors(include_url=False, include_input=False, include_context=False)
        if errors:
            path = ".".join(str(p) for p in errors[0]["loc"])
            reason = errors[0]["msg"]
        else:  # pydantic raises none without an error, but the text is all there is then
            path, reason = "", str(e)
        data: dict[str, Any] = {"path": path, "reason": reason, "errors": errors}
    else:
        path, reason = "", str(e)
        data = {"path": path, "reason": reason}
    message = f"Invalid params: {path}: {reason}" if path else f"Invalid params: {reason}"
    return (INVALID_PARAMS, message, json.dumps(data, default=str))


class App:
    """A named set of functions to serve.

    ```python
    app = ferry.App("demo")

    @app.function
    def add(a: float, b: float) -> float:
        return a + b

    app.serve("unix:demo")
    ```
    """

    def __init__(
        self,
        name: str,
        *,
        version: str = "0.1.0",
        description: str | None = None,
        debug: bool = False,
    ) -> None:
        self.name = name
        self.version = version
        self.description = description
        self.debug = debug
        """Internal errors carry the handler's traceback (never in production)."""
        self._functions: dict[str, _Function] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._servers: list[_native.Server] = []
        self._sync_calls = _Running()
        self._module = sys._getframe(1).f_globals.get("__name__")

    @overload
    def function(self, fn: F, /) -> F: ...

    @overload
    def function(
        self,
        *,
        name: str | None = None,
        task: bool = False,
        concurrency: int | None = None,
        summary: str | None = None,
        description: str | None = None,
        deprecated: bool = False,
    ) -> Callable[[F], F]: ...

    def function(  # type: ignore[misc]  # mypy: the keyword-only overload is accepted
        self,
        fn: F | None = None,
        /,
        *,
        name: str | None = None,
        task: bool = False,
        concurrency: int | None = None,
        summary: str | None = None,
        description: str | None = None,
        deprecated: bool = False,
    ) -> F | Callable[[F], F]:
        """Registers a function (sync or async) under its name (or `name`). Its params and
        result are described and validated by its type hints; its docstring's first
        paragraph is the summary. `concurrency=N` caps the calls running at once;
        `task=True` documents it as long-running (callers submit it as a task): the OpenRPC
        document marks it `x-ferry-task`, and clients generated from it (`ferry sdk`) get
        `NAME_submit`, `NAME_status` and `NAME_result` helpers beside `NAME`."""

        def register(f: F) -> F:
            n = name or f.__name__
            if n in self._functions:
                raise ValueError(f"{self.name}: a function named {n!r} is already registered")
            if n.startswith(("rpc.", "ferry.")) or not n:
                raise ValueError(f"function name {n!r} is reserved (rpc.*, ferry.*) or empty")
            if concurrency is not None and concurrency < 1:
                raise ValueError(f"{n}: concurrency must be at least 1")
            self._functions[n] = _Function(
                self,
                f,
                n,
                task=task,
                concurrency=concurrency,
                summary=summary,
                description=description,
                deprecated=deprecated,
            )
            return f

        return register(fn) if fn is not None else register

    @property
    def functions(self) -> list[str]:
        """The names of the functions registered."""
        return list(self._functions)

    def _failure(self, e: BaseException) -> Outcome:
        if isinstance(e, RpcError):  # ferry.RpcError (a generated client's classes are too)
            data = None if e.data is None else json.dumps(e.data, default=str)
            return (int(e.code), str(e.message), data)
        if isinstance(e, asyncio.CancelledError):
            return (CANCELLED, "Cancelled: the call was cancelled", None)
        reason: dict[str, Any] = {"reason": f"{type(e).__qualname__}: {e}"}
        if self.debug:
            reason["traceback"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return (INTERNAL_ERROR, "Internal error", json.dumps(reason, default=str))

    def _native_server(self, limits: dict[str, Any]) -> _native.Server:
        s = _native.Server(self.name, self.version, self.description, **limits)
        for f in self._functions.values():
            s.add(
                f.name,
                f.call_async if f.is_async else f.sync_wrapper(),
                is_async=f.is_async,
                params_schema=json.dumps(f.sig.params_schema),
                result_schema=json.dumps(f.sig.result_schema),
                defs=json.dumps(f.sig.defs),
                param_names=f.sig.names,
                summary=f.summary,
                description=f.description,
                deprecated=f.deprecated,
                concurrency=f.concurrency,
                fast_params=f.sig.fast_params is not None,
                task=f.task,
            )
        return s

    def openrpc(self) -> dict[str, Any]:
        """The OpenRPC document `rpc.discover` answers (what `ferry sdk` generates typed
        clients from)."""
        doc: dict[str, Any] = json.loads(self._native_server({}).discover())
        return doc

    def serve(
        self,
        *addrs: str,
        http: str | None = None,
        token: str | None = None,
        allow_unauthenticated: bool = False,
        http_allow_origin: list[str] | tuple[str, ...] = (),
        http_allow_host: list[str] | tuple[str, ...] = (),
        shm_pool_mib: int | None = None,
        busy_poll_us: int | None = None,
        announce: bool = True,
        ready: Callable[[list[str]], None] | None = None,
        max_connections: int | None = None,
        max_in_flight: int | None = None,
        max_request_bytes: int | None = None,
        max_tasks: int | None = None,
        max_tasks_per_identity: int | None = None,
        idle_timeout: float | None = None,
        max_queued_answers: int | None = None,
        max_queued_answer_bytes: int | None = None,
        max_refs: int | None = None,
        max_refs_per_identity: int | None = None,
        max_ref_bytes: int | None = None,
        ref_ttl: float | None = None,
        max_running_handlers: int | None = None,
        max_queued_handlers: int | None = None,
        max_param_bytes_in_flight: int | None = None,
    ) -> None:
        """Serves on `addrs` (default `unix:NAME`; `unix:/path`, `quic://HOST:PORT`) and
        `http` (`HOST:PORT`) until Ctrl-C or SIGTERM (then it returns after a clean
        shutdown) or `stop()`. The options are `ferry serve`'s. Prints `listening on
        ADDR` lines unless `announce=False`; `ready(addresses)` is called once listening.

        Tensor references (`Context.keep`, `ferry.ref.keep`) are bounded by `max_refs`
        (default 4096 held at once), `max_refs_per_identity` (1024), `max_ref_bytes` (8
        GiB in all); one kept over HTTP without a TTL lives `ref_ttl` seconds (600).

        Sync handlers: at most `max_running_handlers` run at once (default 256, at most
        512, the handler threads); calls beyond wait, at most `max_queued_handlers` of
        them (1024; then LIMIT_EXCEEDED naming it). A cancelled call, or one whose
        connection closed, never starts if it is still waiting; one already running is
        answered `cancelled` at once, but its handler runs on until it returns (check
        `ctx.cancelled`) and keeps counting against these limits and against its
        connection's `max_in_flight` (default 64) until then. Params bigger than 64 KiB
        as JSON wait for room under `max_param_bytes_in_flight` (16 MiB of them held by
        handlers at once; a bigger one runs alone)."""
        limits = _limits(
            max_connections,
            max_in_flight,
            max_request_bytes,
            max_tasks,
            max_tasks_per_identity,
            idle_timeout,
            max_queued_answers,
            max_queued_answer_bytes,
            max_refs,
            max_refs_per_identity,
            max_ref_bytes,
            ref_ttl,
            max_running_handlers,
            max_queued_handlers,
            max_param_bytes_in_flight,
        )
        server = self._native_server(limits)
        self._servers.append(server)
        try:
            with self._own_loop(), _on_sigterm(server.stop):
                server.serve(
                    list(addrs) or [f"unix:{self.name}"],
                    http=http,
                    token=token,
                    allow_unauthenticated=allow_unauthenticated,
                    http_allow_origin=list(http_allow_origin),
                    http_allow_host=list(http_allow_host),
                    shm_pool_mib=shm_pool_mib,
                    busy_poll_us=busy_poll_us,
                    announce=announce,
                    ready=ready,
                )
        except KeyboardInterrupt:
            if announce:
                print(f"{self.name}: stopped", file=sys.stderr)
        finally:
            self._servers.remove(server)
            self._sync_calls.wait_idle(SHUTDOWN_WAIT)

    async def serve_async(self, *addrs: str, **options: Any) -> None:
        """`serve` from a running event loop: async handlers run on this loop; cancelling
        the awaiting task stops the server."""
        limits = {k: v for k in _LIMIT_NAMES if (v := options.pop(k, None)) is not None}
        server = self._native_server(limits)
        self._servers.append(server)
        previous, self._loop = self._loop, asyncio.get_running_loop()
        worker = asyncio.ensure_future(
            asyncio.to_thread(server.serve, list(addrs) or [f"unix:{self.name}"], **options)
        )
        try:
            await asyncio.shield(worker)
        except asyncio.CancelledError:
            server.stop()
            await worker
            raise
        finally:
            self._loop = previous
            self._servers.remove(server)
            await asyncio.to_thread(self._sync_calls.wait_idle, SHUTDOWN_WAIT)

    def stop(self) -> None:
        """Stops every `serve` of this app (from another thread or a handler)."""
        for s in list(self._servers):
            s.stop()

    @contextlib.contextmanager
    def _own_loop(self) -> Iterator[None]:
        """Runs an event loop in a thread for the async handlers, if any."""
        if not any(f.is_async for f in self._functions.values()):
            yield
            return
        loop = asyncio.new_event_loop()
        t = threading.Thread(target=loop.run_forever, name=f"ferry-{self.name}-loop", daemon=True)
        t.start()
        previous, self._loop = self._loop, loop
        try:
            yield
        finally:
            self._loop = previous

            async def cancel_all() -> None:
                tasks = [x for x in asyncio.all_tasks() if x is not asyncio.current_task()]
                for x in tasks:
                    x.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=5)
            loop.call_soon_threadsafe(loop.stop)
            t.join(timeout=5)
            if not t.is_alive():
                loop.close()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by reference (module and attribute), for `ferry.spawn`."""
        return (_import_app, _locate(self))


_LIMIT_NAMES = (
    "max_connections",
    "max_in_flight",
    "max_request_bytes",
    "max_tasks",
    "max_tasks_per_identity",
    "idle_timeout",
    "max_queued_answers",
    "max_queued_answer_bytes",
    "max_refs",
    "max_refs_per_identity",
    "max_ref_bytes",
    "ref_ttl",
    "max_running_handlers",
    "max_queued_handlers",
    "max_param_bytes_in_flight",
)
"""The keyword options of `serve` that are limits of the native server."""


def _limits(*values: Any) -> dict[str, Any]:
    return {n: v for n, v in zip(_LIMIT_NAMES, values, strict=True) if v is not None}


def _locate(app: App) -> tuple[str, str]:
    module = sys.modules.get(app._module or "")
    if module is not None:
        for k, v in vars(module).items():
            if v is app:
                return (app._module or "", k)
    raise TypeError(
        f"ferry.App {app.name!r} must be a module-level variable to be started in another process"
    )


def _import_app(module: str, attr: str) -> App:
    import importlib

    obj = getattr(importlib.import_module(module), attr)
    if not isinstance(obj, App):
        raise TypeError(f"{module}:{attr} is not a ferry.App")
    return obj


@contextlib.contextmanager
def _on_sigterm(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM calls `stop` (main thread only: elsewhere Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, lambda signum, frame: stop())
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
