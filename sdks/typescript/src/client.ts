/**
 * The JSON-RPC client (PROTOCOL.md §18): one request or batch per MESSAGE frame, tensors as
 * `{"$tensor": i}` references into the message, many calls in flight matched by id.
 */

import { Connection, type ConnectionOptions, type Welcome } from "./connection.js";
import { ConnectionClosedError, FerryError, ProtocolError, RpcError, TimeoutError } from "./errors.js";
import { ErrorCode, TaskPendingError, errorFromCode } from "./rpc_errors.js";
import type { Limits, Message } from "./frame.js";
import { decodeRefs, encodeRefs } from "./refs.js";
import type { Tensor } from "./tensor.js";

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
export type BatchResult<R = unknown> = { ok: true; result: R } | { ok: false; error: RpcError };

/** `ferry.task.status`. */
export interface TaskStatus {
  task: string;
  method: string;
  state: "running" | "done" | "failed" | "cancelled";
  elapsed_ms: number;
}

interface Pending {
  id: number;
  resolve: (v: unknown) => void;
  reject: (e: Error) => void;
  timer: NodeJS.Timeout | undefined;
  cleanup: () => void;
  /** Set for the calls of a batch: all share one collector. */
  batch?: BatchCollector;
}

interface BatchCollector {
  ids: number[];
  results: Map<number, BatchResult>;
  resolve: (r: BatchResult[]) => void;
  reject: (e: Error) => void;
  done: boolean;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
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
export class Client {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private closedError: ConnectionClosedError | ProtocolError | null = null;

  private constructor(
    private readonly conn: Connection,
    private readonly defaultTimeoutMs: number | undefined,
  ) {
    conn.onMessage = (m) => this.onMessage(m);
    conn.onClosed = (e) => this.onClosed(e);
    conn.setRef(false);
  }

  /**
   * Connects to `addr` (`unix:NAME`: a Linux abstract socket; `unix:/path`: a socket file)
   * and does the ferry handshake, offering the inline channel only.
   */
  static async connect(addr: string, opts: ConnectOptions = {}): Promise<Client> {
    const conn = await Connection.open(addr, opts);
    return new Client(conn, opts.callTimeoutMs);
  }

  /** What the server said in the handshake (chosen channels, its limits, its agent). */
  get welcome(): Welcome {
    return this.conn.welcome;
  }

  /** The server's receive limits; a message over them fails with `LimitError` before sending. */
  get serverLimits(): Limits {
    return this.conn.serverLimits;
  }

  /** Whether the connection is closed (by `close()`, the server, or an error). */
  get closed(): boolean {
    return this.closedError !== null;
  }

  /** Calls in flight. */
  get inFlight(): number {
    return this.pending.size;
  }

  /**
   * Calls `method` with `params` (by name: an object; by position: an array; none:
   * undefined). `Tensor`s anywhere in params travel as tensors; tensors in the result
   * come back as `Tensor`s. Rejects with an `RpcError` (subclass by code) when the server
   * answers with an error, `TimeoutError`, `ConnectionClosedError` or `ProtocolError`.
   */
  call<R = unknown>(method: string, params?: unknown, opts: CallOptions = {}): Promise<R> {
    return new Promise<R>((resolve, reject) => {
      if (this.closedError) {
        reject(this.closedError);
        return;
      }
      const id = this.nextId++;
      const tensors: Tensor[] = [];
      let request: Record<string, unknown>;
      try {
        request = this.request(method, params, id, tensors);
      } catch (e) {
        reject(e);
        return;
      }
      const entry = this.register(id, resolve as (v: unknown) => void, reject, opts);
      if (!entry) return;
      this.conn.send(request, tensors).catch((e: Error) => this.settle(id, e));
    });
  }

  /** Sends a notification (no id, never answered); resolves once it is written. */
  notify(method: string, params?: unknown): Promise<void> {
    if (this.closedError) return Promise.reject(this.closedError);
    const tensors: Tensor[] = [];
    try {
      return this.conn.send(this.request(method, params, undefined, tensors), tensors);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * Sends several calls and notifications in one MESSAGE (a JSON-RPC batch; tensors are
   * numbered across the batch). Resolves with one `BatchResult` per call (notifications
   * have none), in the order given; a call's error is a result, not a rejection.
   */
  batch(calls: readonly BatchCall[], opts: CallOptions = {}): Promise<BatchResult[]> {
    return new Promise<BatchResult[]>((resolve, reject) => {
      if (this.closedError) {
        reject(this.closedError);
        return;
      }
      if (calls.length === 0) {
        reject(new TypeError("a batch needs at least one call"));
        return;
      }
      const tensors: Tensor[] = [];
      const seen = new Map<Tensor, number>();
      const requests: unknown[] = [];
      const ids: number[] = [];
      try {
        for (const c of calls) {
          const id = c.notify ? undefined : this.nextId++;
          if (id !== undefined) ids.push(id);
          requests.push(this.request(c.method, c.params, id, tensors, seen));
        }
      } catch (e) {
        reject(e);
        return;
      }
      const sent = this.conn.send(requests, tensors);
      if (ids.length === 0) {
        sent.then(() => resolve([]), reject);
        return;
      }
      const collector: BatchCollector = { ids, results: new Map(), resolve: () => {}, reject: () => {}, done: false };
      sent.catch((e: Error) => collector.reject(e));
      let timer: NodeJS.Timeout | undefined;
      const signal = opts.signal;
      const onAbort = (): void => {
        collector.reject(abortError(signal!));
        for (const id of ids) this.cancelOnServer(id);
      };
      const cleanup = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      collector.reject = (e) => {
        if (collector.done) return;
        collector.done = true;
        cleanup();
        for (const id of ids) this.drop(id);
        reject(e);
      };
      collector.resolve = (r) => {
        cleanup();
        resolve(r);
      };
      const timeoutMs = opts.timeoutMs ?? this.defaultTimeoutMs;
      if (timeoutMs !== undefined) {
        timer = setTimeout(() => {
          collector.reject(new TimeoutError(`batch of ${calls.length} did not finish within ${timeoutMs} ms`));
          for (const id of ids) this.cancelOnServer(id);
        }, timeoutMs);
      }
      if (signal?.aborted) {
        onAbort();
        return;
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      for (const id of ids) {
        this.pending.set(id, { id, resolve: () => {}, reject: collector.reject, timer: undefined, cleanup: () => {}, batch: collector });
      }
      this.conn.setRef(true);
    });
  }

  /** The server's OpenRPC document (`rpc.discover`). */
  discover(opts?: CallOptions): Promise<Record<string, unknown>> {
    return this.call("rpc.discover", undefined, opts);
  }

  /**
   * Starts `method` as a task on the server (`ferry.task.submit`); returns the task id. The
   * task belongs to this client's identity and is cancelled, its result dropped, when this
   * connection closes, unless `detached` (then any connection of the same identity may fetch
   * it until it expires); `keep` keeps the result after it is fetched.
   */
  async submitTask(
    method: string,
    params?: unknown,
    opts: { keep?: boolean; detached?: boolean } & CallOptions = {},
  ): Promise<string> {
    const p: Record<string, unknown> = { method };
    if (params !== undefined) p["params"] = params;
    if (opts.keep !== undefined) p["keep"] = opts.keep;
    if (opts.detached) p["detached"] = true;
    const r = await this.call<{ task: string }>("ferry.task.submit", p, opts);
    return r.task;
  }

  /** `ferry.task.status`. */
  taskStatus(task: string, opts?: CallOptions): Promise<TaskStatus> {
    return this.call("ferry.task.status", { task }, opts);
  }

  /**
   * `ferry.task.result`: the task's own result (or its error), waiting up to `waitMs` on the
   * server; rejects with `TaskPendingError` while it runs.
   */
  taskResult<R = unknown>(task: string, opts: { waitMs?: number; keep?: boolean } & CallOptions = {}): Promise<R> {
    const p: Record<string, unknown> = { task };
    if (opts.waitMs !== undefined) p["wait_ms"] = opts.waitMs;
    if (opts.keep !== undefined) p["keep"] = opts.keep;
    return this.call("ferry.task.result", p, opts);
  }

  /** Waits for a task's result, asking the server to wait `pollMs` (default 1000) at a time. */
  async waitTask<R = unknown>(task: string, opts: { pollMs?: number; timeoutMs?: number } = {}): Promise<R> {
    const deadline = opts.timeoutMs === undefined ? Infinity : Date.now() + opts.timeoutMs;
    for (;;) {
      const left = deadline - Date.now();
      if (left <= 0) throw new TimeoutError(`task ${task} did not finish within ${opts.timeoutMs} ms`);
      const waitMs = Math.max(0, Math.min(opts.pollMs ?? 1000, left));
      try {
        return await this.taskResult<R>(task, { waitMs });
      } catch (e) {
        if (!(e instanceof TaskPendingError)) throw e;
      }
    }
  }

  /** `ferry.task.cancel`: cancels a running task; returns its status. */
  cancelTask(task: string, opts?: CallOptions): Promise<TaskStatus> {
    return this.call("ferry.task.cancel", { task }, opts);
  }

  /** Closes the connection (CLOSE `normal`); calls in flight reject with `ConnectionClosedError`. */
  close(): void {
    this.conn.close();
  }

  // ---- internals ---------------------------------------------------------------------------

  private request(
    method: string,
    params: unknown,
    id: number | undefined,
    tensors: Tensor[],
    seen?: Map<Tensor, number>,
  ): Record<string, unknown> {
    if (typeof method !== "string") throw new TypeError("method must be a string");
    const r: Record<string, unknown> = { jsonrpc: "2.0", method };
    if (params !== undefined) {
      const p = encodeRefs(params, tensors, seen);
      if (p === null || typeof p !== "object") {
        throw new TypeError("params must be an object (by name) or an array (by position)");
      }
      r["params"] = p;
    }
    if (id !== undefined) r["id"] = id;
    return r;
  }

  private register(id: number, resolve: (v: unknown) => void, reject: (e: Error) => void, opts: CallOptions): Pending | null {
    const timeoutMs = opts.timeoutMs ?? this.defaultTimeoutMs;
    const signal = opts.signal;
    if (signal?.aborted) {
      reject(abortError(signal));
      return null;
    }
    const onAbort = (): void => {
      this.settle(id, abortError(signal!));
      this.cancelOnServer(id);
    };
    const entry: Pending = {
      id,
      resolve,
      reject,
      timer: undefined,
      cleanup: () => {
        clearTimeout(entry.timer);
        signal?.removeEventListener("abort", onAbort);
      },
    };
    if (timeoutMs !== undefined) {
      entry.timer = setTimeout(() => {
        this.settle(id, new TimeoutError(`call ${id} did not finish within ${timeoutMs} ms`));
        this.cancelOnServer(id);
      }, timeoutMs);
    }
    signal?.addEventListener("abort", onAbort, { once: true });
    this.pending.set(id, entry);
    this.conn.setRef(true);
    return entry;
  }

  /** Removes a pending call and settles it with `e` (an Error) or the value. */
  private settle(id: number, e: Error | null, value?: unknown): void {
    const p = this.pending.get(id);
    if (!p) return;
    this.drop(id);
    if (e) p.reject(e);
    else p.resolve(value);
  }

  private drop(id: number): void {
    const p = this.pending.get(id);
    if (!p) return;
    p.cleanup();
    this.pending.delete(id);
    if (this.pending.size === 0 && !this.closedError) this.conn.setRef(false);
  }

  private cancelOnServer(id: number): void {
    if (this.closedError) return;
    this.notify("ferry.cancel", { id }).catch(() => {});
  }

  private onMessage(m: Message): void {
    const h = m.header;
    if (Array.isArray(h)) {
      for (const r of h) this.onResponse(r, m.tensors);
    } else {
      this.onResponse(h, m.tensors);
    }
  }

  private onResponse(r: unknown, tensors: readonly Tensor[]): void {
    if (!isObject(r) || !("id" in r)) return; // not a response (a request from the server is not expected)
    const id = r["id"];
    if (id === null) {
      // An error that could not be tied to a request (e.g. a batch over max_batch): it goes
      // to the only call in flight, if there is exactly one; otherwise nobody can tell.
      if (this.pending.size !== 1) return;
      const [only] = this.pending.values();
      this.deliver(only!, r, tensors);
      return;
    }
    if (typeof id !== "number") return;
    const p = this.pending.get(id);
    if (!p) return; // a late answer to a call that timed out or was aborted
    this.deliver(p, r, tensors);
  }

  private deliver(p: Pending, r: Record<string, unknown>, tensors: readonly Tensor[]): void {
    let outcome: BatchResult;
    try {
      if ("error" in r && r["error"] !== undefined && r["error"] !== null) {
        const e = r["error"];
        const obj = isObject(e) ? e : {};
        const code = typeof obj["code"] === "number" ? obj["code"] : ErrorCode.INTERNAL_ERROR;
        const message = typeof obj["message"] === "string" ? obj["message"] : `malformed error object ${JSON.stringify(e)}`;
        const data = obj["data"] === undefined ? undefined : decodeRefs(obj["data"], tensors);
        outcome = { ok: false, error: errorFromCode(code, message, data) };
      } else if ("result" in r) {
        outcome = { ok: true, result: decodeRefs(r["result"], tensors) };
      } else {
        throw new ProtocolError(`response ${p.id} has neither result nor error`);
      }
    } catch (e) {
      if (p.batch) p.batch.reject(e as Error);
      else this.settle(p.id, e as Error);
      return;
    }
    if (p.batch) {
      const b = p.batch;
      if (b.done) return;
      // A batch rejected as a whole (id null) fails every call of it.
      const ids = r["id"] === null ? b.ids : [p.id];
      for (const id of ids) {
        b.results.set(id, outcome);
        this.drop(id);
      }
      if (b.results.size === b.ids.length) {
        b.done = true;
        b.resolve(b.ids.map((id) => b.results.get(id)!));
      }
      return;
    }
    if (outcome.ok) this.settle(p.id, null, outcome.result);
    else this.settle(p.id, outcome.error);
  }

  private onClosed(e: ConnectionClosedError | ProtocolError): void {
    this.closedError = e;
    const pending = [...this.pending.values()];
    const batches = new Set<BatchCollector>();
    for (const p of pending) {
      p.cleanup();
      this.pending.delete(p.id);
      if (p.batch) batches.add(p.batch);
      else p.reject(e);
    }
    for (const b of batches) b.reject(e);
  }
}

function abortError(signal: AbortSignal): Error {
  const r: unknown = signal.reason;
  return r instanceof Error ? r : new FerryError(`aborted: ${String(r)}`);
}
