"""The exceptions of ferry: one tree for the whole package.

Every exception ferry raises is a `FerryError`. Some also derive from the builtin that
fits, so generic handlers work: `ConnectionClosed` is a `ConnectionError`, `CallTimeout` a
`TimeoutError`, `ParamsError` a `TypeError`. Error responses from a server are `RpcError`s
(`code`, `message`, `data`); for ferry's codes, the subclass of the code
(`InvalidParamsError`, `ServerTimeoutError`, ...: `ferry.rpc_errors`).

The generated clients (`ferry.generated`, `ferry sdk --lang python`) raise and re-export
the same classes, so `except ferry.InvalidParamsError` catches an error whichever client
raised it.
"""

from __future__ import annotations

from typing import Any


class FerryError(Exception):
    """Base class of every exception of ferry."""


class ConnectionClosed(FerryError, ConnectionError):
    """The connection is gone: the server closed it, died, or this client closed it.
    The message names the address.

    `code` is the CLOSE code the server sent (`"normal"`, `"idle"`, `"protocol_error"`,
    `"limit"`), or `None` when the stream simply ended.
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class Refused(FerryError):
    """The server refused the handshake; `refusal` is its JSON, `reason` one of
    `"version_mismatch"`, `"no_common_channel"`, `"bad_token"`, `"malformed"`."""

    def __init__(self, refusal: dict[str, Any], addr: str | None = None) -> None:
        reason = str(refusal.get("reason"))
        text = f"the server refused the connection: {reason} ({refusal})"
        super().__init__(text if addr is None else f"{addr}: {text}")
        self.reason = reason
        self.refusal = refusal
        self.addr = addr


class ProtocolError(FerryError):
    """The server broke the protocol; the connection was closed with `code`."""

    def __init__(self, message: str, code: str = "protocol_error") -> None:
        super().__init__(message)
        self.code = code


class LimitError(FerryError):
    """Something would exceed a limit: a message over the server's announced limits, or
    the shared-memory pool is full. The message names the limit."""


class CallTimeout(FerryError, TimeoutError):
    """No answer within the call's timeout (the call was cancelled on the server), or no
    connection within `connect_timeout`."""


class ParamsError(FerryError, TypeError):
    """The params cannot be sent (a value JSON cannot carry, an unsupported dtype); the
    message says where in the params."""


class DeviceTensorError(ParamsError):
    """A device (CUDA) tensor cannot travel as asked: the connection negotiated no
    cuda-ipc channel (the message says why), or its dtype, strides or mask are not what
    ferry sends. ferry never copies a device tensor to the host on its own: copy it
    yourself (`.cpu()`) to send it on such a connection."""


class ResultError(FerryError):
    """The result refers to a tensor the message does not have, or is malformed."""


class RpcError(FerryError):
    """An error response from the server: `code`, `message` and `data` as sent. Raise one
    from a handler of a `ferry.App` to answer with that code."""

    CODE: int | None = None
    """The code of this class, for subclasses generated from an error table."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data

    def __str__(self) -> str:
        text = f"{self.message} (code {self.code})"
        if self.data is not None:
            text += f": {self.data!r}"
        return text


__all__ = [
    "CallTimeout",
    "ConnectionClosed",
    "DeviceTensorError",
    "FerryError",
    "LimitError",
    "ParamsError",
    "ProtocolError",
    "Refused",
    "ResultError",
    "RpcError",
]
