/**
 * One ferry connection (PROTOCOL.md §3-§10): the handshake offering only `inline`, MESSAGE
 * frames in both directions, CLOSE, and the error paths. The JSON-RPC layer is `client.ts`.
 */
import { endianness } from "node:os";
import { ConnectionClosedError, FerryError, ProtocolError, RefusedError, TimeoutError } from "./errors.js";
import { CLIENT_LIMITS, DEFAULT_LIMITS, FrameReader, Kind, PREAMBLE, VERSION, decodeMessage, encodeHead, encodeMessage, } from "./frame.js";
import { openSocket } from "./socket.js";
export const AGENT = "ferry-ts/0.1.0";
function isObject(v) {
    return typeof v === "object" && v !== null && !Array.isArray(v);
}
function limitsFrom(v) {
    const out = { ...DEFAULT_LIMITS };
    if (!isObject(v))
        return out;
    for (const k of Object.keys(DEFAULT_LIMITS)) {
        const x = v[k];
        if (typeof x === "number" && Number.isInteger(x) && x >= 0)
            out[k] = x;
    }
    return out;
}
/**
 * The server's answer to HELLO, checked (sans-IO): a WELCOME this client (inline for cpu,
 * nothing else) accepts, else `RefusedError` for REFUSE and `ProtocolError` for anything else.
 */
export function acceptWelcome(f) {
    if (f.kind === Kind.REFUSE) {
        const body = isObject(f.header) && typeof f.header["reason"] === "string" ? f.header : { reason: "unknown", body: f.header };
        const e = new RefusedError(body);
        throw e;
    }
    if (f.kind !== Kind.WELCOME)
        throw new ProtocolError(`expected WELCOME or REFUSE, got frame kind ${f.kind}`);
    const w = f.header;
    if (!isObject(w) || !isObject(w["channels"]))
        throw new ProtocolError("malformed WELCOME: no `channels` object");
    const channels = w["channels"];
    for (const [kind, name] of Object.entries(channels)) {
        if (kind !== "cpu" || name !== "inline") {
            throw new ProtocolError(`the server chose channel ${JSON.stringify(name)} for ${kind}; this client offered only inline for cpu`);
        }
    }
    if (channels["cpu"] !== "inline")
        throw new ProtocolError("WELCOME chose no channel for cpu");
    if (w["version"] !== VERSION)
        throw new ProtocolError(`WELCOME has version ${JSON.stringify(w["version"])}, expected ${VERSION}`);
    return {
        version: VERSION,
        channels: { cpu: "inline" },
        limits: limitsFrom(w["limits"]),
        agent: typeof w["agent"] === "string" ? w["agent"] : "",
    };
}
/**
 * A handshaken connection. `onMessage` gets every MESSAGE; `onClosed` is called once with
 * the reason when the connection ends for any reason.
 */
export class Connection {
    socket;
    reader;
    limits;
    welcome;
    onMessage = () => { };
    onClosed = () => { };
    closedWith = null;
    queue = [];
    waitingDrain = false;
    handshake = null;
    constructor(socket, reader, limits, welcome) {
        this.socket = socket;
        this.reader = reader;
        this.limits = limits;
        this.welcome = welcome;
    }
    /** The server's receive limits from WELCOME; messages over them are refused before sending. */
    get serverLimits() {
        return this.welcome.limits;
    }
    /** This client's receive limits (announced in HELLO). */
    get clientLimits() {
        return this.limits;
    }
    /** Why the connection is closed, or null while it is open. */
    get closedReason() {
        return this.closedWith;
    }
    /** Keeps the process alive while the socket is open (true) or not (false). */
    setRef(ref) {
        if (ref)
            this.socket.ref();
        else
            this.socket.unref();
    }
    /** Connects to `addr`, sends the preamble and HELLO at once, and waits for WELCOME. */
    static async open(addr, opts = {}) {
        if (endianness() !== "LE") {
            throw new FerryError("ferry tensors are little-endian; this client supports little-endian hosts only");
        }
        const timeoutMs = opts.timeoutMs ?? 10_000;
        const limits = { ...CLIENT_LIMITS, ...(opts.limits ?? {}) };
        limits.max_payload_bytes = Math.min(limits.max_payload_bytes, CLIENT_LIMITS.max_payload_bytes);
        limits.max_fds = 0;
        let conn = null;
        const early = [];
        const reader = new FrameReader(limits, (f) => {
            if (conn)
                conn.onFrame(f);
            else
                early.push(f);
        });
        let readError = null;
        const onread = {
            buffer: () => reader.nextBuffer(),
            callback: (n, buf) => {
                try {
                    reader.consumed(n, buf);
                }
                catch (e) {
                    readError = e;
                    reader.stop();
                    if (conn)
                        conn.fail(e);
                    return false;
                }
                return true;
            },
        };
        const started = Date.now();
        const socket = await openSocket(addr, onread, timeoutMs);
        socket.setNoDelay?.(true);
        const c = new Connection(socket, reader, limits, { version: VERSION, channels: {}, limits: DEFAULT_LIMITS, agent: "" });
        conn = c;
        const hello = {
            protocol: "ferry",
            version: VERSION,
            channels: [{ name: "inline", devices: ["cpu"], domain: {} }],
        };
        if (opts.token !== undefined)
            hello["token"] = opts.token;
        hello["agent"] = opts.agent ?? AGENT;
        hello["limits"] = limits;
        socket.write(Buffer.concat([PREAMBLE, encodeHead(Kind.HELLO, JSON.stringify(hello), 0)]));
        const welcome = new Promise((resolve, reject) => {
            c.handshake = (f) => {
                c.handshake = null;
                try {
                    resolve(acceptWelcome(f));
                }
                catch (e) {
                    reject(e);
                }
            };
            c.onClosed = (e) => reject(e);
        });
        c.attach();
        if (readError)
            c.fail(readError);
        for (const f of early.splice(0))
            c.onFrame(f);
        let timer;
        const remaining = Math.max(0, timeoutMs - (Date.now() - started));
        const timeout = new Promise((_, reject) => {
            timer = setTimeout(() => reject(new TimeoutError(`the handshake with ${addr} took over ${timeoutMs} ms`)), remaining);
        });
        try {
            c.welcome = await Promise.race([welcome, timeout]);
        }
        catch (e) {
            c.destroy(e instanceof FerryError ? e : new FerryError(String(e)));
            throw e;
        }
        finally {
            clearTimeout(timer);
        }
        c.onClosed = () => { };
        return c;
    }
    attach() {
        const s = this.socket;
        s.on("end", () => {
            const mid = !this.reader.atBoundary;
            this.fail(new ConnectionClosedError(`the server closed the connection${mid ? " in the middle of a frame" : ""}`));
        });
        s.on("error", (e) => {
            this.fail(new ConnectionClosedError(`the connection failed: ${e.code ?? e.message}`, undefined, { cause: e }));
        });
        s.on("close", () => this.fail(new ConnectionClosedError("the connection is closed")));
        s.on("drain", () => {
            this.waitingDrain = false;
            this.pump();
        });
    }
    onFrame(f) {
        if (this.closedWith)
            return;
        if (this.handshake) {
            this.handshake(f);
            return;
        }
        switch (f.kind) {
            case Kind.MESSAGE: {
                let m;
                try {
                    m = decodeMessage(f.header, f.payload, this.limits.max_tensors);
                }
                catch (e) {
                    this.fail(e);
                    return;
                }
                this.onMessage(m);
                return;
            }
            case Kind.CLOSE: {
                const h = isObject(f.header) ? f.header : {};
                const code = typeof h["code"] === "string" ? h["code"] : "normal";
                const message = typeof h["message"] === "string" ? h["message"] : "";
                const text = code === "normal" ? "the server closed the connection" : `the server closed the connection: ${code}: ${message}`;
                this.fail(new ConnectionClosedError(text, { code, message }));
                return;
            }
            case Kind.CONTROL:
                this.fail(new ProtocolError("malformed frame header: control frame on an inline-only connection"));
                return;
            default:
                this.fail(new ProtocolError(`unexpected frame kind ${f.kind} (after the handshake)`));
        }
    }
    /** Encodes and queues a MESSAGE; resolves once it is handed to the kernel. Throws `LimitError` before sending anything. */
    send(header, tensors) {
        if (this.closedWith)
            return Promise.reject(this.closedWith);
        let msg;
        try {
            msg = encodeMessage(header, tensors, this.welcome.limits);
        }
        catch (e) {
            return Promise.reject(e);
        }
        return new Promise((resolve, reject) => {
            this.queue.push({ msg, resolve, reject });
            this.pump();
        });
    }
    pump() {
        const s = this.socket;
        while (!this.waitingDrain && this.queue.length && !this.closedWith) {
            const { msg, resolve, reject } = this.queue.shift();
            // One frame's parts go out back to back (never interleaved with another frame's):
            // header, then each tensor's own bytes and the zero padding, without concatenating.
            const done = (e) => (e ? reject(new ConnectionClosedError(`sending failed: ${e.message}`)) : resolve());
            const parts = [msg.head, ...msg.chunks];
            s.cork();
            let ok = true;
            // `write` callbacks run in order: the last part's callback means the frame is written.
            for (let i = 0; i < parts.length; i++)
                ok = s.write(parts[i], i === parts.length - 1 ? done : undefined);
            s.uncork();
            if (!ok || s.writableNeedDrain)
                this.waitingDrain = true;
        }
    }
    /** Sends CLOSE `normal` (best effort) and ends the connection. */
    close() {
        if (this.closedWith)
            return;
        const err = new ConnectionClosedError("the client closed the connection");
        this.closedWith = err;
        this.rejectQueue(err);
        try {
            this.socket.end(encodeHead(Kind.CLOSE, JSON.stringify({ code: "normal", message: "" }), 0));
        }
        catch {
            // the socket is already gone
        }
        this.reader.stop();
        setTimeout(() => this.socket.destroy(), 1000).unref();
        this.onClosed(err);
    }
    /** Ends the connection because of `e` (a ProtocolError is told to the server in a CLOSE frame first). */
    fail(e) {
        if (this.closedWith)
            return;
        const err = e instanceof ProtocolError || e instanceof ConnectionClosedError
            ? e
            : e instanceof FerryError
                ? new ProtocolError(e.message)
                : new ProtocolError(`internal error: ${e.message}`);
        this.closedWith = err;
        this.reader.stop();
        this.rejectQueue(err);
        if (err instanceof ProtocolError && !this.socket.destroyed) {
            try {
                this.socket.end(encodeHead(Kind.CLOSE, JSON.stringify({ code: err.closeCode, message: err.message }), 0));
            }
            catch {
                // best effort
            }
            setTimeout(() => this.socket.destroy(), 1000).unref();
        }
        else {
            this.socket.destroy();
        }
        this.onClosed(err);
    }
    destroy(e) {
        if (!this.closedWith) {
            this.closedWith = e instanceof ProtocolError || e instanceof ConnectionClosedError ? e : new ConnectionClosedError(e.message);
        }
        this.reader.stop();
        this.socket.destroy();
    }
    rejectQueue(e) {
        for (const o of this.queue.splice(0))
            o.reject(e);
    }
}
