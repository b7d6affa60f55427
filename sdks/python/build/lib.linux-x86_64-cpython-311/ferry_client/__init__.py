"""ferry_client: call ferry JSON-RPC servers from Python, tensors as numpy arrays.

The runtime implements the ferry wire protocol (docs/PROTOCOL.md): the handshake
offering the shm and inline channels, frames with checked limits, zero-copy numpy arrays
over shared memory (sealed memfds received with `socket.recv_fds`-style `recvmsg` and
mapped read-only), and JSON-RPC 2.0 with tensors as `{"$tensor": i}` references.

- `Client` (blocking) and `AsyncClient` (asyncio): `call`, `notify`, `batch`, tasks,
  `alloc` (an array in shared memory, sent without a copy), `discover`.
- `Pipe` (blocking): the same connection at the message level, without JSON-RPC: `send`
  a JSON header with tensors, `recv` the peer's next `Message`.
- `ConnectOptions`: how to connect (timeouts, token, channels, memory limits), as one
  value for any of them: `Client.connect(addr, options=opts)`; the same options also
  work one by one as keyword arguments.
- `Tensor`, `BF16`, `bf16_to_f32`, `f32_to_bf16`, `F8E4M3FN`, `F8E5M2`: dtypes numpy
  lacks (float8 through ml_dtypes), and DLPack export.
- CUDA tensors (optional, through CuPy): `connect(..., cuda=True)`, `alloc(...,
  device="cuda:0")`; CuPy arrays (and anything with `__cuda_array_interface__`, e.g.
  torch CUDA tensors) travel over the cuda-ipc channel without a copy, and come back as
  CuPy arrays (`torch.from_dlpack` takes them without a copy). `CudaUnavailable` names
  what is missing; `is_orphaned` tells a tensor whose connection closed.
- Exceptions: `FerryError` and its subclasses (`errors`); error responses are
  `RpcError`s, of the code's subclass for ferry's codes (`InvalidParamsError`,
  `ServerTimeoutError`, ...: `rpc_errors`), whichever client raised them.
- Typed clients generated from OpenRPC documents live in `ferry_client.generated`
  (`demo`, `conformance`); `ferry sdk --lang python` generates one for any server.

Standard library, numpy and ml_dtypes (float8) only; Linux for shared memory (elsewhere,
or with `shm=False`, tensors travel inline). The hot modules are compiled with mypyc at
install time where a C compiler is present (`COMPILED`); else the same code runs
interpreted.
"""

from __future__ import annotations

__version__ = "0.1.0"

from ._cuda import CudaUnavailable
from ._cuda_channel import is_orphaned
from ._options import ConnectOptions
from .aio import AsyncClient
from .client import Client
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
from .pipe import Message, Pipe
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

from importlib.machinery import EXTENSION_SUFFIXES as _EXTENSION_SUFFIXES

from . import client as _client

COMPILED: bool = (_client.__file__ or "").endswith(tuple(_EXTENSION_SUFFIXES))
"""Whether the hot modules run compiled (mypyc, at install time) rather than interpreted."""

__all__ = [
    "COMPILED",
    "AsyncClient",
    "BF16",
    "Bundle",
    "CallTimeout",
    "Client",
    "ConnectOptions",
    "ConnectionClosed",
    "CudaUnavailable",
    "DTYPES",
    "F8E4M3FN",
    "F8E5M2",
    "FerryError",
    "LimitError",
    "Message",
    "NUMPY_DTYPES",
    "ParamsError",
    "Pipe",
    "TensorRef",
    "ProtocolError",
    "Refused",
    "ResultError",
    "RpcError",
    # The classes of ferry's error codes (rpc_errors).
    "CancelledError",
    "ForbiddenError",
    "InternalError",
    "InvalidParamsError",
    "InvalidRequestError",
    "LimitExceededError",
    "MethodNotFoundError",
    "NotFoundError",
    "ParseError",
    "ServerError",
    "ServerTimeoutError",
    "TaskNotFoundError",
    "TaskPendingError",
    "TensorError",
    "UnauthorizedError",
    "UnavailableError",
    "Tensor",
    "TensorIn",
    "TensorParam",
    "__version__",
    "bf16_to_f32",
    "f32_to_bf16",
    "is_orphaned",
    "open_bundle",
    "open_weights",
]
