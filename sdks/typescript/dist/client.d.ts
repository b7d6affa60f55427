/**
 * The JSON-RPC client (PROTOCOL.md §18): one request or batch per MESSAGE frame, tensors as
 * `{"$tensor": i}` references into the message, many calls in flight matched by id.
 */
import { type ConnectionOptions, type Welcome } from "./connection.js";
import { RpcError } from "./errors.js";
import type { Limits } from "./frame.js";
/** Options of `Client.connect`. */
export interface ConnectOptions extends ConnectionOptions {
    /** Time for connecting and the handshake (default 10 000 ms). */
    timeoutMs?: number;
    /** Default `timeoutMs` of every call (default: none). */
    callTimeoutMs?: number;
}
/** Options of one call. */
export interface CallOptions {
    /**
     * Reject with `TimeoutError` after this many ms; the client then tells the server to
     * cancel the call (`ferry.cancel`) and ignores a late answer.
     */
    timeoutMs?: number;
    /** Aborting it rejects the call (with the signal's reason) and cancels it on the server. */
    signal?: AbortSignal;
}
/** One entry of `batch()`. */
export interface BatchCall {
    method: string;
    params?: unknown;
    /** Send as a notification (no answer; no entry in the result). */
    notify?: boolean;
}
/** The outcome of one call of a batch. */
export type BatchResult<R = unknown> = {
    ok: true;
    result: R;
} | {
    ok: false;
    error: RpcError;
};
/** `ferry.task.status`. */
export interface TaskStatus {
    task: string;
    method: string;
    state: "running" | "done" | "failed" | "cancelled";
    elapsed_ms: number;
}
/**
 * A ferry JSON-RPC client over a unix socket (inline channel).
 *
 * ```ts
 * const client = await Client.connect("unix:ferry-demo");
 * const t = await client.call<Tensor>("echo", { tensor: Tensor.from(new Float32Array([1, 2]), [2]) });
 * client.close();
 * ```
 */
export declare class Client {
    private readonly conn;
    private readonly defaultTimeoutMs;
    private nextId;
    private readonly pending;
    private closedError;
    private constructor();
    /**
     * Connects to `addr` (`unix:NAME`: a Linux abstract socket; `unix:/path`: a socket file)
     * and does the ferry handshake, offering the inline channel only.
     */
    static connect(addr: string, opts?: ConnectOptions): Promise<Client>;
    /** What the server said in the handshake (chosen channels, its limits, its agent). */
    get welcome(): Welcome;
    /** The server's receive limits; a message over them fails with `LimitError` before sending. */
    get serverLimits(): Limits;
    /** Whether the connection is closed (by `close()`, the server, or an error). */
    get closed(): boolean;
    /** Calls in flight. */
    get inFlight(): number;
    /**
     * Calls `method` with `params` (by name: an object; by position: an array; none:
     * undefined). `Tensor`s anywhere in params travel as tensors; tensors in the result
     * come back as `Tensor`s. Rejects with an `RpcError` (subclass by code) when the server
     * answers with an error, `TimeoutError`, `ConnectionClosedError` or `ProtocolError`.
     */
    call<R = unknown>(method: string, params?: unknown, opts?: CallOptions): Promise<R>;
    /** Sends a notification (no id, never answered); resolves once it is written. */
    notify(method: string, params?: unknown): Promise<void>;
    /**
     * Sends several calls and notifications in one MESSAGE (a JSON-RPC batch; tensors are
     * numbered across the batch). Resolves with one `BatchResult` per call (notifications
     * have none), in the order given; a call's error is a result, not a rejection.
     */
    batch(calls: readonly BatchCall[], opts?: CallOptions): Promise<BatchResult[]>;
    /** The server's OpenRPC document (`rpc.discover`). */
    discover(opts?: CallOptions): Promise<Record<string, unknown>>;
    /**
     * Starts `method` as a task on the server (`ferry.task.submit`); returns the task id. The
     * task belongs to this client's identity and is cancelled, its result dropped, when this
     * connection closes, unless `detached` (then any connection of the same identity may fetch
     * it until it expires); `keep` keeps the result after it is fetched.
     */
    submitTask(method: string, params?: unknown, opts?: {
        keep?: boolean;
        detached?: boolean;
    } & CallOptions): Promise<string>;
    /** `ferry.task.status`. */
    taskStatus(task: string, opts?: CallOptions): Promise<TaskStatus>;
    /**
     * `ferry.task.result`: the task's own result (or its error), waiting up to `waitMs` on the
     * server; rejects with `TaskPendingError` while it runs.
     */
    taskResult<R = unknown>(task: string, opts?: {
        waitMs?: number;
        keep?: boolean;
    } & CallOptions): Promise<R>;
    /** Waits for a task's result, asking the server to wait `pollMs` (default 1000) at a time. */
    waitTask<R = unknown>(task: string, opts?: {
        pollMs?: number;
        timeoutMs?: number;
    }): Promise<R>;
    /** `ferry.task.cancel`: cancels a running task; returns its status. */
    cancelTask(task: string, opts?: CallOptions): Promise<TaskStatus>;
    /** Closes the connection (CLOSE `normal`); calls in flight reject with `ConnectionClosedError`. */
    close(): void;
    private request;
    private register;
    /** Removes a pending call and settles it with `e` (an Error) or the value. */
    private settle;
    private drop;
    private cancelOnServer;
    private onMessage;
    private onResponse;
    private deliver;
    private onClosed;
}
