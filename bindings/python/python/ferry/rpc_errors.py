"""The JSON-RPC error codes of ferry (PROTOCOL.md section 18.4) as exception classes: one
`RpcError` subclass per code of the Rust table `ferry_rpc::codes::ERROR_CODES`, the same
names as `ferry_client.rpc_errors` (each also derives from its namesake there, while that
package exists). `tests/test_client_native.py` checks this module against that generated
one, code for code.
"""

from __future__ import annotations

from ferry_client import rpc_errors as _legacy

from .errors import RpcError


class ParseError(RpcError, _legacy.ParseError):
    """Invalid JSON was received (plain JSON and HTTP connections).

    Code -32700, `PARSE_ERROR`: "Parse error".
    """

    CODE = -32700


class InvalidRequestError(RpcError, _legacy.InvalidRequestError):
    """The JSON sent is not a valid Request object.

    Code -32600, `INVALID_REQUEST`: "Invalid Request".
    """

    CODE = -32600


class MethodNotFoundError(RpcError, _legacy.MethodNotFoundError):
    """The method does not exist or is not available.

    Code -32601, `METHOD_NOT_FOUND`: "Method not found".
    """

    CODE = -32601


class InvalidParamsError(RpcError, _legacy.InvalidParamsError):
    """The params do not match the method's schema; data.path and data.reason say where
    and why.

    Code -32602, `INVALID_PARAMS`: "Invalid params".
    """

    CODE = -32602


class InternalError(RpcError, _legacy.InternalError):
    """The server failed to process the call (e.g. the result did not serialize, or the
    handler panicked).

    Code -32603, `INTERNAL_ERROR`: "Internal error".
    """

    CODE = -32603


class ServerError(RpcError, _legacy.ServerError):
    """A handler returned an error without choosing a code.

    Code -32000, `SERVER_ERROR`: "Server error".
    """

    CODE = -32000


class LimitExceededError(RpcError, _legacy.LimitExceededError):
    """A server limit was exceeded; data.limit names the RpcLimits field, data.value
    and data.max the numbers.

    Code -32001, `LIMIT_EXCEEDED`: "Limit exceeded".
    """

    CODE = -32001


class CancelledError(RpcError, _legacy.CancelledError):
    """The call or task was cancelled (ferry.cancel, ferry.task.cancel, or the
    connection closed).

    Code -32002, `CANCELLED`: "Cancelled".
    """

    CODE = -32002


class ServerTimeoutError(RpcError, _legacy.ServerTimeoutError):
    """The call did not finish in time on the server.

    Code -32003, `SERVER_TIMEOUT`: "Timeout".
    """

    CODE = -32003


class TaskNotFoundError(RpcError, _legacy.TaskNotFoundError):
    """No task has this id: never submitted, result already fetched, or expired.

    Code -32004, `TASK_NOT_FOUND`: "Task not found".
    """

    CODE = -32004


class TaskPendingError(RpcError, _legacy.TaskPendingError):
    """The task has not finished yet; ask again later or pass wait_ms.

    Code -32005, `TASK_PENDING`: "Task pending".
    """

    CODE = -32005


class TensorError(RpcError, _legacy.TensorError):
    """A tensor reference or inline tensor is invalid, or a tensor cannot be carried on
    this connection.

    Code -32006, `TENSOR_ERROR`: "Tensor error".
    """

    CODE = -32006


class UnavailableError(RpcError, _legacy.UnavailableError):
    """The server is shutting down.

    Code -32007, `UNAVAILABLE`: "Unavailable".
    """

    CODE = -32007


class UnauthorizedError(RpcError, _legacy.UnauthorizedError):
    """The server requires a bearer token that was not presented, or refused the
    request before reading it (HTTP: a browser origin not allowed, a foreign Host
    header, a Content-Type other than application/json).

    Code -32008, `UNAUTHORIZED`: "Unauthorized".
    """

    CODE = -32008


class NotFoundError(RpcError, _legacy.NotFoundError):
    """No such object: a tensor-store bundle, version or reference that is unknown, was
    freed, or belongs to another identity.

    Code -32009, `NOT_FOUND`: "Not found".
    """

    CODE = -32009


class ForbiddenError(RpcError, _legacy.ForbiddenError):
    """The caller's identity may not change this object (a tensor-store bundle another
    identity published).

    Code -32010, `FORBIDDEN`: "Forbidden".
    """

    CODE = -32010


ERRORS: dict[int, type[RpcError]] = {
    -32700: ParseError,
    -32600: InvalidRequestError,
    -32601: MethodNotFoundError,
    -32602: InvalidParamsError,
    -32603: InternalError,
    -32000: ServerError,
    -32001: LimitExceededError,
    -32002: CancelledError,
    -32003: ServerTimeoutError,
    -32004: TaskNotFoundError,
    -32005: TaskPendingError,
    -32006: TensorError,
    -32007: UnavailableError,
    -32008: UnauthorizedError,
    -32009: NotFoundError,
    -32010: ForbiddenError,
}
"""The exception class of each code."""


def error_from_code(code: int, message: str, data: object = None) -> RpcError:
    """The exception for an error response: the class of `code`, else `RpcError`."""
    return ERRORS.get(code, RpcError)(code, message, data)


__all__ = [
    "ERRORS",
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
    "error_from_code",
]
