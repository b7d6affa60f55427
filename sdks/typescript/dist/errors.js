/**
 * Errors. Everything this package throws on purpose is a `FerryError`:
 *
 * - `RpcError` (with `code` and `data`): the server answered a call with a JSON-RPC error.
 *   Known codes get a subclass (`MethodNotFoundError`, `InvalidParamsError`, ...), all
 *   `instanceof RpcError`; `RpcError.from` picks it.
 * - `ConnectionClosedError`: the connection is gone (the server closed it, sent CLOSE, died,
 *   or `close()` was called). `closeCode` / `closeMessage` hold the server's CLOSE frame.
 * - `TimeoutError`: a client-side timeout (connect, handshake, or a call's `timeoutMs`).
 * - `ProtocolError`: the server broke the wire protocol (the connection is then closed).
 * - `RefusedError`: the server refused the handshake (`refusal` holds its REFUSE body).
 * - `LimitError`: a message is over the server's announced limits (nothing was sent).
 */
/** Base class of every error this package throws on purpose. */
export class FerryError extends Error {
    constructor(message, options) {
        super(message, options);
        this.name = new.target.name;
    }
}
/** JSON-RPC error codes (PROTOCOL.md §18.4). */
export const ErrorCode = {
    PARSE_ERROR: -32700,
    INVALID_REQUEST: -32600,
    METHOD_NOT_FOUND: -32601,
    INVALID_PARAMS: -32602,
    INTERNAL_ERROR: -32603,
    SERVER_ERROR: -32000,
    LIMIT_EXCEEDED: -32001,
    CANCELLED: -32002,
    TIMEOUT: -32003,
    TASK_NOT_FOUND: -32004,
    TASK_PENDING: -32005,
    TENSOR_ERROR: -32006,
    UNAVAILABLE: -32007,
    UNAUTHORIZED: -32008,
    NOT_FOUND: -32009,
    FORBIDDEN: -32010,
};
/** The server answered with a JSON-RPC error. */
export class RpcError extends FerryError {
    code;
    data;
    constructor(code, message, data) {
        super(message);
        this.code = code;
        if (data !== undefined)
            this.data = data;
    }
    /** The subclass for `e.code` (or `RpcError` for codes without one). */
    static from(e) {
        const Cls = BY_CODE.get(e.code) ?? RpcError;
        return new Cls(e.code, e.message, e.data);
    }
    /** The error object as it travels. */
    toJSON() {
        return this.data === undefined
            ? { code: this.code, message: this.message }
            : { code: this.code, message: this.message, data: this.data };
    }
}
/** -32700: the server could not parse the request. */
export class ParseError extends RpcError {
}
/** -32600: not a valid request object. */
export class InvalidRequestError extends RpcError {
}
/** -32601: no such method. */
export class MethodNotFoundError extends RpcError {
}
/** -32602: params do not match the method (`data.path`, `data.reason`). */
export class InvalidParamsError extends RpcError {
}
/** -32603: the server failed internally. */
export class InternalError extends RpcError {
}
/** -32000: a handler failed without choosing a code. */
export class ServerError extends RpcError {
}
/** -32001: a server limit (`data.limit`, `data.value`, `data.max`). */
export class LimitExceededError extends RpcError {
}
/** -32002: the call was cancelled. */
export class CancelledError extends RpcError {
}
/** -32003: the call did not finish in time on the server (client-side timeouts are `TimeoutError`). */
export class ServerTimeoutError extends RpcError {
}
/** -32004: unknown, already fetched or expired task. */
export class TaskNotFoundError extends RpcError {
}
/** -32005: the task is still running. */
export class TaskPendingError extends RpcError {
}
/** -32006: a tensor cannot be carried. */
export class TensorError extends RpcError {
}
/** -32007: the server is shutting down. */
export class UnavailableError extends RpcError {
}
/** -32008: the server requires a bearer token, or refused the request before reading it. */
export class UnauthorizedError extends RpcError {
}
/** -32009: no such tensor-store bundle, version or reference (unknown, freed or another identity's). */
export class NotFoundError extends RpcError {
}
/** -32010: the caller's identity may not change this object (a bundle another identity published). */
export class ForbiddenError extends RpcError {
}
const BY_CODE = new Map([
    [ErrorCode.PARSE_ERROR, ParseError],
    [ErrorCode.INVALID_REQUEST, InvalidRequestError],
    [ErrorCode.METHOD_NOT_FOUND, MethodNotFoundError],
    [ErrorCode.INVALID_PARAMS, InvalidParamsError],
    [ErrorCode.INTERNAL_ERROR, InternalError],
    [ErrorCode.SERVER_ERROR, ServerError],
    [ErrorCode.LIMIT_EXCEEDED, LimitExceededError],
    [ErrorCode.CANCELLED, CancelledError],
    [ErrorCode.TIMEOUT, ServerTimeoutError],
    [ErrorCode.TASK_NOT_FOUND, TaskNotFoundError],
    [ErrorCode.TASK_PENDING, TaskPendingError],
    [ErrorCode.TENSOR_ERROR, TensorError],
    [ErrorCode.UNAVAILABLE, UnavailableError],
    [ErrorCode.UNAUTHORIZED, UnauthorizedError],
    [ErrorCode.NOT_FOUND, NotFoundError],
    [ErrorCode.FORBIDDEN, ForbiddenError],
]);
/** The connection is closed: by `close()`, by the server (CLOSE frame or end of stream), or it died. */
export class ConnectionClosedError extends FerryError {
    /** The `code` of the server's CLOSE frame (`normal`, `protocol_error`, `limit`, ...), if it sent one. */
    closeCode;
    /** The `message` of the server's CLOSE frame, if it sent one. */
    closeMessage;
    constructor(message, close, options) {
        super(message, options);
        this.closeCode = close?.code;
        this.closeMessage = close?.message;
    }
}
/** A client-side timeout: connect, handshake, or a call's `timeoutMs`. */
export class TimeoutError extends FerryError {
}
/** The server broke the wire protocol; the client closed the connection. */
export class ProtocolError extends FerryError {
    /** The CLOSE code the client sent for it: `protocol_error` or `limit`. */
    closeCode;
    constructor(message, closeCode = "protocol_error") {
        super(message);
        this.closeCode = closeCode;
    }
}
/** The server refused the handshake (PROTOCOL.md §6.3). */
export class RefusedError extends FerryError {
    /** The REFUSE body, e.g. `{"reason":"version_mismatch","server":1,"client":2}`. */
    refusal;
    constructor(refusal) {
        super(`the server refused the connection: ${JSON.stringify(refusal)}`);
        this.refusal = refusal;
    }
}
/** A message is over one of the server's announced limits; it was not sent. */
export class LimitError extends FerryError {
    /** The limit's name, e.g. `max_payload_bytes`. */
    limit;
    value;
    max;
    constructor(limit, value, max) {
        super(`${limit}: the message needs ${value}, the server accepts at most ${max}`);
        this.limit = limit;
        this.value = value;
        this.max = max;
    }
}
