"""Type stubs of `ferry._native` (the Rust half; see bindings/python/src). Checked against
the compiled module by `mypy.stubtest` in CI (`cargo xtask python-server`)."""

import os
from collections.abc import Callable, Iterable
from typing import Any, final

__all__ = [
    "BuilderSlot",
    "Client",
    "Context",
    "DeviceTensor",
    "Done",
    "FerryError",
    "Listener",
    "Message",
    "OutTensor",
    "Pending",
    "Pipe",
    "Server",
    "SharedBlock",
    "StoreServer",
    "TensorHost",
    "TensorRef",
    "VersionBuilder",
    "WeightsSubscriber",
    "__version__",
    "connect",
    "dtypes",
    "listen",
    "main",
]

__version__: str

FerryError: type[OSError]

@final
class TensorRef:
    """A received tensor: read-only, zero-copy, holding its memory until the last view dies."""

    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def device(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    def _mark_writable(self) -> None: ...
    def _numpy(self) -> Any: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...

@final
class OutTensor:
    """A result tensor being filled by Python: writable, in the connection's memory."""

    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...

@final
class DeviceTensor:
    """A CUDA tensor: received (a CUDA IPC mapping of the peer's memory, open while this
    object or anything made from it lives), from `alloc_device` (the cuda-ipc pool: sent
    without a copy), or wrapping another library's memory (`wrap`) to send."""

    @staticmethod
    def wrap(
        owner: object,
        ptr: int,
        shape: list[int],
        dtype: str,
        device: int,
        strides: list[int] | None = None,
    ) -> DeviceTensor: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def strides(self) -> list[int] | None: ...
    @property
    def device(self) -> str: ...
    @property
    def device_index(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def received(self) -> bool: ...
    @property
    def orphaned(self) -> bool: ...
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> Any: ...

@final
class Done:
    """Where an async handler's outcome goes."""

    def __call__(self, o: tuple[Any, ...]) -> None: ...

@final
class Context:
    """What a handler gets besides its params."""

    @property
    def cancelled(self) -> bool: ...
    def wait_cancelled(self, timeout: float | None = None) -> bool: ...
    def alloc(self, shape: list[int], dtype: str) -> OutTensor: ...
    def alloc_device(self, shape: list[int], dtype: str, device: int = 0) -> DeviceTensor: ...
    @property
    def device_channel(self) -> str | None: ...
    def keep_alloc(self, shape: list[int], dtype: str) -> OutTensor: ...
    def keep(
        self, out: OutTensor, ttl: float | None = None
    ) -> tuple[str | None, tuple[int, str, str | None] | None]: ...
    @property
    def peer(self) -> str: ...

@final
class Server:
    """A method table with Python handlers, and its server once built."""

    def __new__(
        cls,
        title: str,
        version: str,
        description: str | None = None,
        *,
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
    ) -> Server: ...
    def add(
        self,
        name: str,
        call: Callable[..., Any],
        *,
        is_async: bool,
        params_schema: str,
        result_schema: str,
        defs: str,
        param_names: list[str],
        summary: str | None = None,
        description: str | None = None,
        deprecated: bool = False,
        concurrency: int | None = None,
        allow_unknown_params: bool = False,
        fast_params: bool = False,
        task: bool = False,
    ) -> None: ...
    def discover(self) -> str: ...
    def serve(
        self,
        addrs: list[str],
        *,
        http: str | None = None,
        token: str | None = None,
        allow_unauthenticated: bool = False,
        http_allow_origin: list[str] = ...,
        http_allow_host: list[str] = ...,
        shm_pool_mib: int | None = None,
        busy_poll_us: int | None = None,
        announce: bool = True,
        ready: Callable[[list[str]], object] | None = None,
    ) -> None: ...
    def stop(self) -> None: ...

@final
class Message:
    """A received message."""

    @property
    def header(self) -> str: ...
    @property
    def tensors(self) -> list[TensorRef | DeviceTensor]: ...

@final
class Pipe:
    """One end of a pipe."""

    @property
    def channel(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def ring(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    @property
    def device_channel(self) -> str | None: ...
    def stats(self) -> str: ...
    def alloc_device(self, shape: list[int], dtype: str, device: int = 0) -> DeviceTensor: ...
    def alloc(self, shape: list[int], dtype: str) -> OutTensor: ...
    def send(
        self,
        header: str,
        tensors: list[OutTensor | TensorRef | DeviceTensor],
        timeout: float | None = None,
    ) -> None: ...
    def send_objects(
        self,
        header: Any,
        tensors: Iterable[Any],
        timeout: float | None,
        to_out: Callable[[Any], OutTensor | TensorRef | DeviceTensor],
    ) -> None: ...
    def recv_objects(
        self, timeout: float | None, to_numpy: Callable[[TensorRef | DeviceTensor], Any]
    ) -> tuple[Any, list[Any]]: ...
    def recv(self, timeout: float | None = None) -> Message: ...
    def close(self) -> None: ...

@final
class Listener:
    """A listening address."""

    @property
    def address(self) -> str: ...
    def accept(self, timeout: float | None = None) -> Pipe: ...

def listen(addr: str, *, token: str | None = None, shm_pool_mib: int | None = None) -> Listener: ...
def connect(addr: str, *, token: str | None = None, shm_pool_mib: int | None = None) -> Pipe: ...
def dtypes() -> list[tuple[str, str, int]]: ...

_Hooks = tuple[
    Callable[[object, Client], object],
    Callable[[TensorRef | DeviceTensor], Any],
    Callable[[TensorRef | DeviceTensor], Any],
    Callable[[Any], Any],
]
"""`(encode, numpy, torch, tensor_ref)`: what params' non-JSON values and results' tensors
go through (`ferry._client`)."""

@final
class Pending:
    """An asyncio operation on the runtime."""

    def cancel(self) -> None: ...

@final
class Client:
    """The Rust JSON-RPC client (`ferry_rpc::Client`); `ferry.Client` is its face."""

    @staticmethod
    def connect(
        addr: str,
        hooks: _Hooks,
        *,
        token: str | None = None,
        connect_timeout: float | None = None,
        shm_pool_mib: int | None = None,
        keepalive: float | None = None,
        shm: bool = True,
    ) -> Client: ...
    @staticmethod
    def connect_async(
        event_loop: Any,
        future: Any,
        addr: str,
        hooks: _Hooks,
        *,
        token: str | None = None,
        connect_timeout: float | None = None,
        shm_pool_mib: int | None = None,
        keepalive: float | None = None,
        shm: bool = True,
    ) -> Pending: ...
    @property
    def address(self) -> str: ...
    @property
    def channel(self) -> str: ...
    @property
    def transport(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def close_reason(self) -> str | None: ...
    @property
    def device_channel(self) -> str | None: ...
    def alloc_device(self, shape: list[int], dtype: str, device: int = 0) -> DeviceTensor: ...
    def alloc(self, shape: list[int], dtype: str) -> OutTensor: ...
    def call(self, method: str, params: object, timeout: float | None, as_torch: bool) -> Any: ...
    def notify(self, method: str, params: object) -> None: ...
    def batch(self, calls: object, timeout: float | None, as_torch: bool) -> Any: ...
    def start(
        self,
        event_loop: Any,
        future: Any,
        kind: str,
        method: str,
        params: object,
        timeout: float | None,
        as_torch: bool,
    ) -> Pending: ...
    def close(self) -> None: ...

def main(argv: list[str], program: str | os.PathLike[str], prefix: list[str]) -> int:
    """Runs the `ferry` command line `argv` (program name first) in this process; returns its
    exit status. `program prefix...` starts another copy (the benchmark's peers)."""

@final
class StoreServer:
    """A tensor store (`ferry serve-weights`) served in the background by this process."""

    def __new__(
        cls,
        addr: str = ...,
        files: list[str | os.PathLike[str]] = ...,
        *,
        name: str | None = None,
        budget_mib: int | None = None,
        bucket_mib: int = 512,
        digest: bool = True,
        placement: str | None = None,
        cpu_budget_mib: int | None = None,
        disk_budget_mib: int | None = None,
        disk_dir: str | os.PathLike[str] | None = None,
        token: str | None = None,
        max_connections: int = 512,
        announce: bool = False,
        delta_bases: int = 1,
    ) -> StoreServer: ...
    @property
    def addresses(self) -> list[str]: ...
    @property
    def addr(self) -> str: ...
    def _latest(self, name: str) -> tuple[int, list[tuple[str, TensorRef]]] | None: ...
    def _build(
        self, name: str, base: int | None, tensors: list[tuple[str, str, list[int], bool]]
    ) -> VersionBuilder: ...
    @property
    def serving(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...
    def stop(self, timeout: float = 10.0) -> bool: ...
    def __enter__(self) -> StoreServer: ...
    def __exit__(self, *_exc: object) -> bool: ...

@final
class VersionBuilder:
    """A version being made in a store this process hosts (`StoreServer._build`)."""

    def slot(self, i: int) -> BuilderSlot | None: ...
    def __len__(self) -> int: ...
    def commit(self, metadata: str) -> int: ...

@final
class BuilderSlot:
    """Writable bytes of one tensor of a version being built (numpy views it)."""

    @property
    def __array_interface__(self) -> dict[str, Any]: ...

@final
class WeightsSubscriber:
    """A subscriber to one bundle of a tensor store (`ferry.weights.subscribe`)."""

    def __new__(
        cls,
        addr: str,
        name: str,
        *,
        token: str | None = None,
        connect_timeout: float | None = None,
    ) -> WeightsSubscriber: ...
    def latest(self, timeout: float | None = None) -> tuple[int, str] | None: ...
    def update(
        self, to: int | None = None, timeout: float | None = None, wait: float | None = None
    ) -> dict[str, Any]: ...
    @property
    def version(self) -> int | None: ...
    @property
    def tree(self) -> str | None: ...
    @property
    def metadata(self) -> str: ...
    def tensors(self) -> list[tuple[str, TensorRef]]: ...
    def last_delta(
        self,
    ) -> (
        tuple[int | None, str | None, int, list[tuple[str, str, TensorRef | None, TensorRef]]]
        | None
    ): ...
    def store_stats(self, timeout: float | None = None) -> Any: ...
    def store_timings(self, timeout: float | None = None) -> Any: ...
    @property
    def closed(self) -> bool: ...
    @property
    def addr(self) -> str: ...
    @property
    def name(self) -> str: ...

@final
class SharedBlock:
    """Bytes in a shared segment (Linux; a new one, or from a `TensorHost`'s pool), writable
    until a `TensorHost` takes them."""

    def __new__(cls, nbytes: int) -> SharedBlock: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def frozen(self) -> bool: ...
    @property
    def __array_interface__(self) -> dict[str, Any]: ...

@final
class TensorHost:
    """Keeps tensors by id in shared memory and serves them on its addresses (Linux;
    `ferry.ray`)."""

    def __new__(
        cls,
        addrs: list[str],
        *,
        token: str | None = None,
        max_bytes: int = ...,
        pool_bytes: int = ...,
        pool_idle: float = ...,
    ) -> TensorHost: ...
    @property
    def addresses(self) -> list[str]: ...
    def block(self, nbytes: int) -> SharedBlock: ...
    @property
    def pool_stats(self) -> dict[str, int]: ...
    def put(
        self, id: str, block: SharedBlock, layout: list[tuple[int, list[int], str]]
    ) -> None: ...
    def put_device(self, id: str, tensors: list[DeviceTensor]) -> None: ...
    def free(self, id: str) -> bool: ...
    def has(self, id: str) -> bool: ...
    @property
    def count(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def host_copies(self) -> tuple[int, int]: ...
    def close(self) -> None: ...
