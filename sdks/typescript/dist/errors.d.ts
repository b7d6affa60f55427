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
export declare class FerryError extends Error {
    constructor(message: string, options?: {
        cause?: unknown;
    });
}
/** JSON-RPC error codes (PROTOCOL.md §18.4). */
export declare const ErrorCode: {
    readonly PARSE_ERROR: -32700;
    readonly INVALID_REQUEST: -32600;
    readonly METHOD_NOT_FOUND: -32601;
    readonly INVALID_PARAMS: -32602;
    readonly INTERNAL_ERROR: -32603;
    readonly SERVER_ERROR: -32000;
    readonly LIMIT_EXCEEDED: -32001;
    readonly CANCELLED: -32002;
    readonly TIMEOUT: -32003;
    readonly TASK_NOT_FOUND: -32004;
    readonly TASK_PENDING: -32005;
    readonly TENSOR_ERROR: -32006;
    readonly UNAVAILABLE: -32007;
    readonly UNAUTHORIZED: -32008;
    readonly NOT_FOUND: -32009;
    readonly FORBIDDEN: -32010;
};
/** A JSON-RPC error object as it travels. */
export interface ErrorObject {
    code: number;
    message: string;
    data?: unknown;
}
/** The server answered with a JSON-RPC error. */
export declare class RpcError extends FerryError {
    readonly code: number;
    readonly data?: unknown;
    constructor(code: number, message: string, data?: unknown);
    /** The subclass for `e.code` (or `RpcError` for codes without one). */
    static from(e: ErrorObject): RpcError;
    /** The error object as it travels. */
    toJSON(): ErrorObject;
}
/** -32700: the server could not parse the request. */
export declare class ParseError extends RpcError {
}
/** -32600: not a valid request object. */
export declare class InvalidRequestError extends RpcError {
}
/** -32601: no such method. */
export declare class MethodNotFoundError extends RpcError {
}
/** -32602: params do not match the method (`data.path`, `data.reason`). */
export declare class InvalidParamsError extends RpcError {
}
/** -32603: the server failed internally. */
export declare class InternalError extends RpcError {
}
/** -32000: a handler failed without choosing a code. */
export declare class ServerError extends RpcError {
}
/** -32001: a server limit (`data.limit`, `data.value`, `data.max`). */
export declare class LimitExceededError extends RpcError {
}
/** -32002: the call was cancelled. */
export declare class CancelledError extends RpcError {
}
/** -32003: the call did not finish in time on the server (client-side timeouts are `TimeoutError`). */
export declare class ServerTimeoutError extends RpcError {
}
/** -32004: unknown, already fetched or expired task. */
export declare class TaskNotFoundError extends RpcError {
}
/** -32005: the task is still running. */
export declare class TaskPendingError extends RpcError {
}
/** -32006: a tensor cannot be carried. */
export declare class TensorError extends RpcError {
}
/** -32007: the server is shutting down. */
export declare class UnavailableError extends RpcError {
}
/** -32008: the server requires a bearer token, or refused the request before reading it. */
export declare class UnauthorizedError extends RpcError {
}
/** -32009: no such tensor-store bundle, version or reference (unknown, freed or another identity's). */
export declare class NotFoundError extends RpcError {
}
/** -32010: the caller's identity may not change this object (a bundle another identity published). */
export declare class ForbiddenError extends RpcError {
}
/** The connection is closed: by `close()`, by the server (CLOSE frame or end of stream), or it died. */
export declare class ConnectionClosedError extends FerryError {
    /** The `code` of the server's CLOSE frame (`normal`, `protocol_error`, `limit`, ...), if it sent one. */
    readonly closeCode: string | undefined;
    /** The `message` of the server's CLOSE frame, if it sent one. */
    readonly closeMessage: string | undefined;
    constructor(message: string, close?: {
        code: string;
        message: string;
    }, options?: {
        cause?: unknown;
    });
}
/** A client-side timeout: connect, handshake, or a call's `timeoutMs`. */
export declare class TimeoutError extends FerryError {
}
/** The server broke the wire protocol; the client closed the connection. */
export declare class ProtocolError extends FerryError {
    /** The CLOSE code the client sent for it: `protocol_error` or `limit`. */
    readonly closeCode: "protocol_error" | "limit";
    constructor(message: string, closeCode?: "protocol_error" | "limit");
}
/** The server refused the handshake (PROTOCOL.md §6.3). */
export declare class RefusedError extends FerryError {
    /** The REFUSE body, e.g. `{"reason":"version_mismatch","server":1,"client":2}`. */
    readonly refusal: {
        reason: string;
        [k: string]: unknown;
    };
    constructor(refusal: {
        reason: string;
        [k: string]: unknown;
    });
}
/** A message is over one of the server's announced limits; it was not sent. */
export declare class LimitError extends FerryError {
    /** The limit's name, e.g. `max_payload_bytes`. */
    readonly limit: string;
    readonly value: number;
    readonly max: number;
    constructor(limit: string, value: number, max: number);
}
