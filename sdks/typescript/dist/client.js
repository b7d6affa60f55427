/**
 * The JSON-RPC client (PROTOCOL.md §18): one request or batch per MESSAGE frame, tensors as
 * `{"$tensor": i}` references into the message, many calls in flight matched by id.
 */
import { Connection } from "./connection.js";
import { FerryError, ProtocolError, TimeoutError } from "./errors.js";
import { ErrorCode, TaskPendingError, errorFromCode } from "./rpc_errors.js";
import { decodeRefs, encodeRefs } from "./refs.js";
function isObject(v) {
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
    conn;
    defaultTimeoutMs;
    nextId = 1;
    pending = new Map();
    closedError = null;
    constructor(conn, defaultTimeoutMs) {
        this.conn = conn;
        this.defaultTimeoutMs = defaultTimeoutMs;
        conn.onMessage = (m) => this.onMessage(m);
        conn.onClosed = (e) => this.onClosed(e);
        conn.setRef(false);
    }
    /**
     * Connects to `addr` (`unix:NAME`: a Linux abstract socket; `unix:/path`: a socket file)
     * and does the ferry handshake, offering the inline channel only.
     */
    static async connect(addr, opts = {}) {
        const conn = await Connection.open(addr, opts);
        return new Client(conn, opts.callTimeoutMs);
    }
    /** What the server said in the handshake (chosen channels, its limits, its agent). */
    get welcome() {
        return this.conn.welcome;
    }
    /** The server's receive limits; a message over them fails with `LimitError` before sending. */
    get serverLimits() {
        return this.conn.serverLimits;
    }
    /** Whether the connection is closed (by `close()`, the server, or an error). */
    get closed() {
        return this.closedError !== null;
    }
    /** Calls in flight. */
    get inFlight() {
        return this.pending.size;
    }
    /**
     * Calls `method` with `params` (by name: an object; by position: an array; none:
     * undefined). `Tensor`s anywhere in params travel as tensors; tensors in the result
     * come back as `Tensor`s. Rejects with an `RpcError` (subclass by code) when the server
     * answers with an error, `TimeoutError`, `ConnectionClosedError` or `ProtocolError`.
     */
    call(method, params, opts = {}) {
        return new Promise((resolve, reject) => {
            if (this.closedError) {
                reject(this.closedError);
                return;
            }
            const id = this.nextId++;
            const tensors = [];
            let request;
            try {
                request = this.request(method, params, id, tensors);
            }
            catch (e) {
                reject(e);
                return;
            }
            const entry = this.register(id, resolve, reject, opts);
            if (!entry)
                return;
            this.conn.send(request, tensors).catch((e) => this.settle(id, e));
        });
    }
    /** Sends a notification (no id, never answered); resolves once it is written. */
    notify(method, params) {
        if (this.closedError)
            return Promise.reject(this.closedError);
        const tensors = [];
        try {
            return this.conn.send(this.request(method, params, undefined, tensors), tensors);
        }
        catch (e) {
            return Promise.reject(e);
        }
    }
    /**
     * Sends several calls and notifications in one MESSAGE (a JSON-RPC batch; tensors are
     * numbered across the batch). Resolves with one `BatchResult` per call (notifications
     * have none), in the order given; a call's error is a result, not a rejection.
     */
    batch(calls, opts = {}) {
        return new Promise((resolve, reject) => {
            if (this.closedError) {
                reject(this.closedError);
                return;
            }
            if (calls.length === 0) {
                reject(new TypeError("a batch needs at least one call"));
                return;
            }
            const tensors = [];
            const seen = new Map();
            const requests = [];
            const ids = [];
            try {
                for (const c of calls) {
                    const id = c.notify ? undefined : this.nextId++;
                    if (id !== undefined)
                        ids.push(id);
                    requests.push(this.request(c.method, c.params, id, tensors, seen));
                }
            }
            catch (e) {
                reject(e);
                return;
            }
            const sent = this.conn.send(requests, tensors);
            if (ids.length === 0) {
                sent.then(() => resolve([]), reject);
                return;
            }
            const collector = { ids, results: new Map(), resolve: () => { }, reject: () => { }, done: false };
            sent.catch((e) => collector.reject(e));
            let timer;
            const signal = opts.signal;
            const onAbort = () => {
                collector.reject(abortError(signal));
                for (const id of ids)
                    this.cancelOnServer(id);
            };
            const cleanup = () => {
                clearTimeout(timer);
                signal?.removeEventListener("abort", onAbort);
            };
            collector.reject = (e) => {
                if (collector.done)
                    return;
                collector.done = true;
                cleanup();
                for (const id of ids)
                    this.drop(id);
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
                    for (const id of ids)
                        this.cancelOnServer(id);
                }, timeoutMs);
            }
            if (signal?.aborted) {
                onAbort();
                return;
            }
            signal?.addEventListener("abort", onAbort, { once: true });
            for (const id of ids) {
                this.pending.set(id, { id, resolve: () => { }, reject: collector.reject, timer: undefined, cleanup: () => { }, batch: collector });
            }
            this.conn.setRef(true);
        });
    }
    /** The server's OpenRPC document (`rpc.discover`). */
    discover(opts) {
        return this.call("rpc.discover", undefined, opts);
    }
    /**
     * Starts `method` as a task on the server (`ferry.task.submit`); returns the task id. The
     * task belongs to this client's identity and is cancelled, its result dropped, when this
     * connection closes, unless `detached` (then any connection of the same identity may fetch
     * it until it expires); `keep` keeps the result after it is fetched.
     */
    async submitTask(method, params, opts = {}) {
        const p = { method };
        if (params !== undefined)
            p["params"] = params;
        if (opts.keep !== undefined)
            p["keep"] = opts.keep;
        if (opts.detached)
            p["detached"] = true;
        const r = await this.call("ferry.task.submit", p, opts);
        return r.task;
    }
    /** `ferry.task.status`. */
    taskStatus(task, opts) {
        return this.call("ferry.task.status", { task }, opts);
    }
    /**
     * `ferry.task.result`: the task's own result (or its error), waiting up to `waitMs` on the
     * server; rejects with `TaskPendingError` while it runs.
     */
    taskResult(task, opts = {}) {
        const p = { task };
        if (opts.waitMs !== undefined)
            p["wait_ms"] = opts.waitMs;
        if (opts.keep !== undefined)
            p["keep"] = opts.keep;
        return this.call("ferry.task.result", p, opts);
    }
    /** Waits for a task's result, asking the server to wait `pollMs` (default 1000) at a time. */
    async waitTask(task, opts = {}) {
        const deadline = opts.timeoutMs === undefined ? Infinity : Date.now() + opts.timeoutMs;
        for (;;) {
            const left = deadline - Date.now();
            if (left <= 0)
                throw new TimeoutError(`task ${task} did not finish within ${opts.timeoutMs} ms`);
            const waitMs = Math.max(0, Math.min(opts.pollMs ?? 1000, left));
            try {
                return await this.taskResult(task, { waitMs });
            }
            catch (e) {
                if (!(e instanceof TaskPendingError))
                    throw e;
            }
        }
    }
    /** `ferry.task.cancel`: cancels a running task; returns its status. */
    cancelTask(task, opts) {
        return this.call("ferry.task.cancel", { task }, opts);
    }
    /** Closes the connection (CLOSE `normal`); calls in flight reject with `ConnectionClosedError`. */
    close() {
        this.conn.close();
    }
    // ---- internals ---------------------------------------------------------------------------
    request(method, params, id, tensors, seen) {
        if (typeof method !== "string")
            throw new TypeError("method must be a string");
        const r = { jsonrpc: "2.0", method };
        if (params !== undefined) {
            const p = encodeRefs(params, tensors, seen);
            if (p === null || typeof p !== "object") {
                throw new TypeError("params must be an object (by name) or an array (by position)");
            }
            r["params"] = p;
        }
        if (id !== undefined)
            r["id"] = id;
        return r;
    }
    register(id, resolve, reject, opts) {
        const timeoutMs = opts.timeoutMs ?? this.defaultTimeoutMs;
        const signal = opts.signal;
        if (signal?.aborted) {
            reject(abortError(signal));
            return null;
        }
        const onAbort = () => {
            this.settle(id, abortError(signal));
            this.cancelOnServer(id);
        };
        const entry = {
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
    settle(id, e, value) {
        const p = this.pending.get(id);
        if (!p)
            return;
        this.drop(id);
        if (e)
            p.reject(e);
        else
            p.resolve(value);
    }
    drop(id) {
        const p = this.pending.get(id);
        if (!p)
            return;
        p.cleanup();
        this.pending.delete(id);
        if (this.pending.size === 0 && !this.closedError)
            this.conn.setRef(false);
    }
    cancelOnServer(id) {
        if (this.closedError)
            return;
        this.notify("ferry.cancel", { id }).catch(() => { });
    }
    onMessage(m) {
        const h = m.header;
        if (Array.isArray(h)) {
            for (const r of h)
                this.onResponse(r, m.tensors);
        }
        else {
            this.onResponse(h, m.tensors);
        }
    }
    onResponse(r, tensors) {
        if (!isObject(r) || !("id" in r))
            return; // not a response (a request from the server is not expected)
        const id = r["id"];
        if (id === null) {
            // An error that could not be tied to a request (e.g. a batch over max_batch): it goes
            // to the only call in flight, if there is exactly one; otherwise nobody can tell.
            if (this.pending.size !== 1)
                return;
            const [only] = this.pending.values();
            this.deliver(only, r, tensors);
            return;
        }
        if (typeof id !== "number")
            return;
        const p = this.pending.get(id);
        if (!p)
            return; // a late answer to a call that timed out or was aborted
        this.deliver(p, r, tensors);
    }
    deliver(p, r, tensors) {
        let outcome;
        try {
            if ("error" in r && r["error"] !== undefined && r["error"] !== null) {
                const e = r["error"];
                const obj = isObject(e) ? e : {};
                const code = typeof obj["code"] === "number" ? obj["code"] : ErrorCode.INTERNAL_ERROR;
                const message = typeof obj["message"] === "string" ? obj["message"] : `malformed error object ${JSON.stringify(e)}`;
                const data = obj["data"] === undefined ? undefined : decodeRefs(obj["data"], tensors);
                outcome = { ok: false, error: errorFromCode(code, message, data) };
            }
            else if ("result" in r) {
                outcome = { ok: true, result: decodeRefs(r["result"], tensors) };
            }
            else {
                throw new ProtocolError(`response ${p.id} has neither result nor error`);
            }
        }
        catch (e) {
            if (p.batch)
                p.batch.reject(e);
            else
                this.settle(p.id, e);
            return;
        }
        if (p.batch) {
            const b = p.batch;
            if (b.done)
                return;
            // A batch rejected as a whole (id null) fails every call of it.
            const ids = r["id"] === null ? b.ids : [p.id];
            for (const id of ids) {
                b.results.set(id, outcome);
                this.drop(id);
            }
            if (b.results.size === b.ids.length) {
                b.done = true;
                b.resolve(b.ids.map((id) => b.results.get(id)));
            }
            return;
        }
        if (outcome.ok)
            this.settle(p.id, null, outcome.result);
        else
            this.settle(p.id, outcome.error);
    }
    onClosed(e) {
        this.closedError = e;
        const pending = [...this.pending.values()];
        const batches = new Set();
        for (const p of pending) {
            p.cleanup();
            this.pending.delete(p.id);
            if (p.batch)
                batches.add(p.batch);
            else
                p.reject(e);
        }
        for (const b of batches)
            b.reject(e);
    }
}
function abortError(signal) {
    const r = signal.reason;
    return r instanceof Error ? r : new FerryError(`aborted: ${String(r)}`);
}
