"""The exceptions of ferry: one tree for the whole package.

Every exception ferry raises is a `FerryError`. Some also derive from the builtin that
fits, so generic handlers work: `ConnectionClosed` is a `ConnectionError`, `CallTimeout` a
`TimeoutError`, `ParamsError` a `TypeError`. Error responses from a server are `RpcError`s
(`code`, `message`, `data`); for ferry's codes, the subclass of the code
(`InvalidParamsError`, `ServerTimeoutError`, ...: `ferry.rpc_errors`).

The names and the hierarchy are `ferry_client.errors`'s: code written against
`ferry_client` migrates by changing the import. While `ferry_client` (the pure-Python
runtime the generated clients, the store and references still use) exists, each class
here also derives from its `ferry_client` namesake, so `except ferry_client.X` keeps
catching what `ferry.Client` raises.
"""

from __future__ import annotations

from typing import Any

from ferry_client import errors as _legacy


class FerryError(_legacy.FerryError):
    """Base class of every exception of ferry."""


class ConnectionClosed(FerryError, _legacy.ConnectionClosed):
    """The connection is gone: the server closed it, died, or this client closed it.
    The message names the address.

    `code` is the CLOSE code the server sent (`"normal"`, `"idle"`, `"protocol_error"`,
    `"limit"`), or `None` when the stream simply ended.
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        _legacy.ConnectionClosed.__init__(self, message, code)


class Refused(FerryError, _legacy.Refused):
    """The server refused the handshake; `refusal` is its JSON, `reason` one of
    `"version_mismatch"`, `"no_common_channel"`, `"bad_token"`, `"malformed"`."""

    def __init__(self, refusal: dict[str, Any], addr: str | None = None) -> None:
        _legacy.Refused.__init__(self, refusal)
        if addr is not None:
            self.args = (f"{addr}: {self.args[0]}",)
        self.addr = addr


class ProtocolError(FerryError, _legacy.ProtocolError):
    """The server broke the protocol; the connection was closed with `code`."""

    def __init__(self, message: str, code: str = "protocol_error") -> None:
        _legacy.ProtocolError.__init__(self, message, code)


class LimitError(FerryError, _legacy.LimitError):
    """Something would exceed a limit: a message over the server's announced limits, or
    the shared-memory pool is full. The message names the limit."""


class CallTimeout(FerryError, _legacy.CallTimeout):
    """No answer within the call's timeout (the call was cancelled on the server), or no
    connection within `connect_timeout`."""


class ParamsError(FerryError, _legacy.ParamsError):
    """The params cannot be sent (a value JSON cannot carry, an unsupported dtype); the
    message says where in the params."""


class ResultError(FerryError, _legacy.ResultError):
    """The result refers to a tensor the message does not have, or is malformed."""


class RpcError(FerryError, _legacy.RpcError):
    """An error response from the server: `code`, `message` and `data` as sent. Raise one
    from a handler of a `ferry.App` to answer with that code."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        _legacy.RpcError.__init__(self, code, message, data)


__all__ = [
    "CallTimeout",
    "ConnectionClosed",
    "FerryError",
    "LimitError",
    "ParamsError",
    "ProtocolError",
    "Refused",
    "ResultError",
    "RpcError",
]
