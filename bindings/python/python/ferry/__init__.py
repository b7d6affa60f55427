"""ferry: share Python functions and tensors between processes.

Serve functions from Python on ferry's Rust server (every transport, channel, limit and
access rule of `ferry serve` applies), call them from any ferry client:

```python
import ferry

app = ferry.App("demo")

@app.function
def add(a: float, b: float) -> float:
    return a + b

app.serve("unix:demo")  # or: python -m ferry serve mymodule:app unix:demo
```

- `App`, `Context`, `empty`, `keep`, `RpcError`: serving (`_app`); params and results
  from type hints with pydantic, tensors as zero-copy numpy / torch views; `keep` returns
  a tensor as a reference that stays on the server (a `TensorRef`).
- `spawn(app)`: the app in a child process and a connected `Client`.
- `listen` / `connect`: `Pipe`s of headers and tensors without JSON-RPC.
- `DeviceTensor`: a CUDA tensor over the cuda-ipc channel (received, or from
  `alloc_device`): `__cuda_array_interface__` and DLPack, for torch and CuPy without a
  copy. CUDA torch tensors and CuPy arrays are sent as they are, never through the host
  (`DeviceTensorError` on a connection without cuda-ipc).
- `Client`, `AsyncClient`: calling, on the Rust client (`_client`): every address
  (`unix:`, `quic://host:port#sha256=PIN`), numpy and torch tensors in and out
  (`as_torch`), `closed` / `close_reason`, keep-alive, `connect_timeout`;
  `client.functions.add(1, 2)`: the server's functions as methods, from `rpc.discover`
  (`Functions`, `UnknownFunctionError`).
- `errors` / `rpc_errors`: the exceptions (`FerryError` and its subclasses, `RpcError`
  and the class of each of ferry's codes: `InvalidParamsError`, `NotFoundError`, ...).
- `NDArray`, `AnyTensor`: tensor types for fields of pydantic models (dataclasses and
  TypedDicts may use `np.ndarray` and `torch.Tensor` as they are).
- `tensors`: `Tensor` (an array with an explicit ferry dtype, DLPack export), `BF16`,
  `F8E4M3FN`, `F8E5M2`, `NUMPY_DTYPES`, `DTYPES`, `bf16_to_f32`, `f32_to_bf16`.
- `open_weights`, `open_bundle`, `Bundle` (`store`): versioned weight bundles from a ferry
  tensor store (`ferry serve-weights`), zero-copy numpy or torch, at any address;
  `store.publish` publishes one.
- `TensorRef` and `refs` (`keep`, `fetch`, `free`, `publish`, `list_refs`): tensors a
  server keeps; `placement`: where a tensor store keeps them (cpu, disk, device tiers).
- `generated`: typed clients of the built-in APIs (`demo`, `conformance`), as
  `ferry sdk --lang python` writes them for any server; `types`: their result checks.
- `StoreServer`, `serve_weights`: host a tensor store (`ferry serve-weights`) from Python.
- `weights`: weight sync (`Publisher`, `subscribe`): versions as deltas, applied in place.
- The `ferry` command (also `python -m ferry`): every subcommand of the Rust binary.
- `ferry.ray` (imported on its own, `pip install "ferry-tensors[ray]"`): ferry as a Ray
  tensor transport (`tensor_transport="ferry"`).
"""

from __future__ import annotations

from . import errors, placement, refs, rpc_errors, store, tensors, types, weights
from ._app import App, Context, empty, keep
from ._client import AsyncClient, Client
from ._functions import Function, Functions, UnknownFunctionError
from ._native import DeviceTensor, __version__
from ._pipe import Listener, Pipe, connect, listen
from ._schema import AnyTensor, NDArray
from ._spawn import spawn
from ._store_server import StoreServer, serve_weights
from .errors import (
    CallTimeout,
    ConnectionClosed,
    DeviceTensorError,
    FerryError,
    LimitError,
    ParamsError,
    ProtocolError,
    Refused,
    ResultError,
    RpcError,
)
from .refs import TensorRef
from .rpc_errors import (
    CancelledError,
    ForbiddenError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    LimitExceededError,
    MethodNotFoundError,
    NotFoundError,
    ParseError,
    ServerError,
    ServerTimeoutError,
    TaskNotFoundError,
    TaskPendingError,
    TensorError,
    UnauthorizedError,
    UnavailableError,
)
from .store import Bundle, open_bundle, open_weights
from .tensors import (
    BF16,
    DTYPES,
    F8E4M3FN,
    F8E5M2,
    NUMPY_DTYPES,
    Tensor,
    TensorIn,
    TensorParam,
    bf16_to_f32,
    f32_to_bf16,
)

__all__ = [
    "BF16",
    "DTYPES",
    "F8E4M3FN",
    "F8E5M2",
    "NUMPY_DTYPES",
    "AnyTensor",
    "App",
    "AsyncClient",
    "Bundle",
    "CallTimeout",
    "CancelledError",
    "Client",
    "ConnectionClosed",
    "Context",
    "DeviceTensor",
    "DeviceTensorError",
    "FerryError",
    "ForbiddenError",
    "Function",
    "Functions",
    "InternalError",
    "InvalidParamsError",
    "InvalidRequestError",
    "LimitError",
    "LimitExceededError",
    "Listener",
    "MethodNotFoundError",
    "NDArray",
    "NotFoundError",
    "ParamsError",
    "ParseError",
    "Pipe",
    "ProtocolError",
    "Refused",
    "ResultError",
    "RpcError",
    "ServerError",
    "ServerTimeoutError",
    "StoreServer",
    "TaskNotFoundError",
    "TaskPendingError",
    "Tensor",
    "TensorError",
    "TensorIn",
    "TensorParam",
    "TensorRef",
    "UnauthorizedError",
    "UnavailableError",
    "UnknownFunctionError",
    "__version__",
    "bf16_to_f32",
    "connect",
    "empty",
    "errors",
    "f32_to_bf16",
    "keep",
    "listen",
    "open_bundle",
    "open_weights",
    "placement",
    "refs",
    "rpc_errors",
    "serve_weights",
    "spawn",
    "store",
    "tensors",
    "types",
    "weights",
]
