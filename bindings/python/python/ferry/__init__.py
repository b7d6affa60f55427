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
- `Client`, `AsyncClient`: calling, on the Rust client (`_client`): every address
  (`unix:`, `quic://host:port#sha256=PIN`), numpy and torch tensors in and out
  (`as_torch`), `closed` / `close_reason`, keep-alive, `connect_timeout`.
- `errors` / `rpc_errors`: the exceptions (`FerryError` and its subclasses, `RpcError`
  and the class of each of ferry's codes), the names of `ferry_client`'s.
- `NDArray`, `AnyTensor`: tensor types for fields of pydantic models (dataclasses and
  TypedDicts may use `np.ndarray` and `torch.Tensor` as they are).
- `open_weights`, `open_bundle`, `Bundle`: versioned weight bundles from a ferry tensor
  store (`ferry serve-weights`), zero-copy numpy or torch; `TensorRef`: a tensor a server
  keeps (`ferry_client.refs`). Both from `ferry_client`.
- `StoreServer`, `serve_weights`: host a tensor store (`ferry serve-weights`) from Python.
- The `ferry` command (also `python -m ferry`): every subcommand of the Rust binary.
- `ferry.ray` (imported on its own, `pip install "ferry-tensors[ray]"`): ferry as a Ray
  tensor transport (`tensor_transport="ferry"`).
"""

from __future__ import annotations

from ferry_client import Bundle, TensorRef, open_bundle, open_weights

from . import errors, rpc_errors
from ._app import App, Context, empty, keep
from ._client import AsyncClient, Client
from ._native import __version__
from ._pipe import Listener, Pipe, connect, listen
from ._schema import AnyTensor, NDArray
from ._spawn import spawn
from ._store_server import StoreServer, serve_weights
from .errors import (
    CallTimeout,
    ConnectionClosed,
    FerryError,
    LimitError,
    ParamsError,
    ProtocolError,
    Refused,
    ResultError,
    RpcError,
)

__all__ = [
    "AnyTensor",
    "App",
    "AsyncClient",
    "Bundle",
    "CallTimeout",
    "Client",
    "ConnectionClosed",
    "Context",
    "FerryError",
    "LimitError",
    "Listener",
    "NDArray",
    "ParamsError",
    "Pipe",
    "ProtocolError",
    "Refused",
    "ResultError",
    "RpcError",
    "StoreServer",
    "TensorRef",
    "__version__",
    "connect",
    "empty",
    "errors",
    "keep",
    "listen",
    "open_bundle",
    "open_weights",
    "rpc_errors",
    "serve_weights",
    "spawn",
]
