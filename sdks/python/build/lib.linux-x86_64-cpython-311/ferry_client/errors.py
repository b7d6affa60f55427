"""The exceptions of ferry_client.

Every exception the client raises is a `FerryError`. Some also derive from the builtin
that fits, so generic handlers work: `ConnectionClosed` is a `ConnectionError`,
`CallTimeout` a `TimeoutError`, `ParamsError` a `TypeError`.

Error responses from the server are `RpcError`s (`code`, `message`, `data`): for
ferry's codes, the subclass of the code (`ferry_client.InvalidParamsError`,
`ServerTimeoutError`, ...: `ferry_client.rpc_errors`, generated from the Rust table),
whichever client raised it; the generated clients re-export those classes and declare
subclasses only for their API's own codes.
"""

from __future__ import annotations

from typing import Any


class FerryError(Exception):
    """Base class of every exception of ferry_client."""


class ConnectionClosed(FerryError, ConnectionError):
    """The connection is gone: the server closed it, died, or this client closed it.

    `code` is the CLOSE code the server sent (`"normal"`, `"protocol_error"`, `"limit"`),
    or `None` when the stream simply ended.
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class Refused(FerryError):
    """The server refused the handshake (REFUSE frame); `refusal` is its JSON.

    `reason` is `"version_mismatch"`, `"no_common_channel"`, `"bad_token"` or
    `"malformed"`.
    """

    def __init__(self, refusal: dict[str, Any]) -> None:
        reason = str(refusal.get("reason"))
        super().__init__(f"the server refused the connection: {reason} ({refusal})")
        self.reason = reason
        self.refusal = refusal


class ProtocolError(FerryError):
    """The server broke the protocol; the connection was closed with `code`.

    `code` is the CLOSE code sent to the server: `"protocol_error"` or `"limit"`.
    """

    def __init__(self, message: str, code: str = "protocol_error") -> None:
        super().__init__(message)
        self.code = code


class LimitError(FerryError):
    """Something would exceed a limit: a message over the server's announced limits, or
    the shared-memory pool is full. The message names the limit."""


class CallTimeout(FerryError, TimeoutError):
    """No answer within the call's timeout; the call was cancelled on the server."""


class ParamsError(FerryError, TypeError):
    """The params cannot be sent (a value JSON cannot carry, an unsupported dtype)."""


class ResultError(FerryError):
    """The result does not have the type the API declares for it, or refers to a tensor
    the message does not have."""


class RpcError(FerryError):
    """An error response from the server: `code`, `message` and `data` as sent."""

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
