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

- `App`, `Context`, `empty`, `RpcError`: serving (`_app`); params and results from type
  hints with pydantic, tensors as zero-copy numpy / torch views.
- `spawn(app)`: the app in a child process and a connected `Client`.
- `listen` / `connect`: `Pipe`s of headers and tensors without JSON-RPC.
- `Client`, `AsyncClient`: calling, from `ferry_client` (the runtime of the generated
  clients).
- `NDArray`, `AnyTensor`: tensor types for fields of pydantic models and dataclasses.
"""

from __future__ import annotations

from ferry_client import AsyncClient, Client
from ferry_client.errors import RpcError

from ._app import App, Context, empty
from ._native import __version__
from ._pipe import Listener, Pipe, connect, listen
from ._schema import AnyTensor, NDArray
from ._spawn import spawn

__all__ = [
    "AnyTensor",
    "App",
    "AsyncClient",
    "Client",
    "Context",
    "Listener",
    "NDArray",
    "Pipe",
    "RpcError",
    "__version__",
    "connect",
    "empty",
    "listen",
    "spawn",
]
