/**
 * The JSON-RPC error codes (PROTOCOL.md §18.4), generated from the Rust table
* `ferry_rpc::codes::ERROR_CODES`, with one `RpcError` subclass per code. The runtime
* client throws these classes and the generated clients import them (they declare
* classes only for their API's own codes), so `instanceof` holds whichever client threw.
*/
import { RpcError } from "./errors.js";
/** Every code of the table, by name. */
export declare const ErrorCode: {
    readonly PARSE_ERROR: -32700;
    readonly INVALID_REQUEST: -32600;
    readonly METHOD_NOT_FOUND: -32601;
    readonly INVALID_PARAMS: -32602;
    readonly INTERNAL_ERROR: -32603;
    readonly SERVER_ERROR: -32000;
    readonly LIMIT_EXCEEDED: -32001;
    readonly CANCELLED: -32002;
    readonly SERVER_TIMEOUT: -32003;
    readonly TASK_NOT_FOUND: -32004;
    readonly TASK_PENDING: -32005;
    readonly TENSOR_ERROR: -32006;
    readonly UNAVAILABLE: -32007;
    readonly UNAUTHORIZED: -32008;
    readonly NOT_FOUND: -32009;
    readonly FORBIDDEN: -32010;
};
/** -32700 `PARSE_ERROR`: Invalid JSON was received (plain JSON and HTTP connections). */
export declare class ParseError extends RpcError {
    static readonly CODE = -32700;
}
/** -32600 `INVALID_REQUEST`: The JSON sent is not a valid Request object. */
export declare class InvalidRequestError extends RpcError {
    static readonly CODE = -32600;
}
/** -32601 `METHOD_NOT_FOUND`: The method does not exist or is not available. */
export declare class MethodNotFoundError extends RpcError {
    static readonly CODE = -32601;
}
/** -32602 `INVALID_PARAMS`: The params do not match the method's schema; data.path and data.reason say where and why. */
export declare class InvalidParamsError extends RpcError {
    static readonly CODE = -32602;
}
/** -32603 `INTERNAL_ERROR`: The server failed to process the call (e.g. the result did not serialize, or the handler panicked). */
export declare class InternalError extends RpcError {
    static readonly CODE = -32603;
}
/** -32000 `SERVER_ERROR`: A handler returned an error without choosing a code. */
export declare class ServerError extends RpcError {
    static readonly CODE = -32000;
}
/** -32001 `LIMIT_EXCEEDED`: A server limit was exceeded; data.limit names the RpcLimits field, data.value and data.max the numbers. */
export declare class LimitExceededError extends RpcError {
    static readonly CODE = -32001;
}
/** -32002 `CANCELLED`: The call or task was cancelled (ferry.cancel, ferry.task.cancel, or the connection closed). */
export declare class CancelledError extends RpcError {
    static readonly CODE = -32002;
}
/** -32003 `SERVER_TIMEOUT`: The call did not finish in time on the server. */
export declare class ServerTimeoutError extends RpcError {
    static readonly CODE = -32003;
}
/** -32004 `TASK_NOT_FOUND`: No task has this id: never submitted, result already fetched, or expired. */
export declare class TaskNotFoundError extends RpcError {
    static readonly CODE = -32004;
}
/** -32005 `TASK_PENDING`: The task has not finished yet; ask again later or pass wait_ms. */
export declare class TaskPendingError extends RpcError {
    static readonly CODE = -32005;
}
/** -32006 `TENSOR_ERROR`: A tensor reference or inline tensor is invalid, or a tensor cannot be carried on this connection. */
export declare class TensorError extends RpcError {
    static readonly CODE = -32006;
}
/** -32007 `UNAVAILABLE`: The server is shutting down. */
export declare class UnavailableError extends RpcError {
    static readonly CODE = -32007;
}
/** -32008 `UNAUTHORIZED`: The server requires a bearer token that was not presented, or refused the request before reading it (HTTP: a browser origin not allowed, a foreign Host header, a Content-Type other than application/json). */
export declare class UnauthorizedError extends RpcError {
    static readonly CODE = -32008;
}
/** -32009 `NOT_FOUND`: No such object: a tensor-store bundle, version or reference that is unknown, was freed, or belongs to another identity. */
export declare class NotFoundError extends RpcError {
    static readonly CODE = -32009;
}
/** -32010 `FORBIDDEN`: The caller's identity may not change this object (a tensor-store bundle another identity published). */
export declare class ForbiddenError extends RpcError {
    static readonly CODE = -32010;
}
/** A constructor of an error class. */
export type RpcErrorClass = new (code: number, message: string, data?: unknown) => RpcError;
/** The class of each code of the table. */
export declare const ERRORS: ReadonlyMap<number, RpcErrorClass>;
/** The error for an error response: the class of `code` (`RpcError` for codes without one). */
export declare function errorFromCode(code: number, message: string, data?: unknown): RpcError;
