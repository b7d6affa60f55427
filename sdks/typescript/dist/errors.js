/**
 * Errors. Everything this package throws on purpose is a `FerryError`:
 *
 * - `RpcError` (with `code` and `data`): the server answered a call with a JSON-RPC error.
 *   Known codes get a subclass (`MethodNotFoundError`, `InvalidParamsError`, ...), all
 *   `instanceof RpcError`, generated from the Rust table into `rpc_errors.ts` (with
 *   `ErrorCode` and `errorFromCode`, which picks the class). Generated clients throw the same
 *   classes, so `instanceof` holds whichever client threw.
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
    /** The error object as it travels. */
    toJSON() {
        return this.data === undefined
            ? { code: this.code, message: this.message }
            : { code: this.code, message: this.message, data: this.data };
    }
}
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
