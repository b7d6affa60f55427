/**
 * One ferry connection (PROTOCOL.md §3-§10): the handshake offering only `inline`, MESSAGE
 * frames in both directions, CLOSE, and the error paths. The JSON-RPC layer is `client.ts`.
 */
import { ConnectionClosedError, ProtocolError } from "./errors.js";
import { type Frame, type Limits, type Message } from "./frame.js";
import type { Tensor } from "./tensor.js";
/** Options of `Connection.open`. */
export interface ConnectionOptions {
    /** Time for connecting and the handshake (default 10 000 ms). */
    timeoutMs?: number;
    /** Bearer token for servers that require one. */
    token?: string;
    /** Names this client in the server's logs. */
    agent?: string;
    /** This client's receive limits, announced in HELLO (defaults: PROTOCOL.md §6.2, payload capped by Node's buffer size). */
    limits?: Partial<Limits>;
}
/** What the server said in WELCOME. */
export interface Welcome {
    version: number;
    channels: Record<string, string>;
    limits: Limits;
    agent: string;
}
export declare const AGENT = "ferry-ts/0.1.0";
/**
 * The server's answer to HELLO, checked (sans-IO): a WELCOME this client (inline for cpu,
 * nothing else) accepts, else `RefusedError` for REFUSE and `ProtocolError` for anything else.
 */
export declare function acceptWelcome(f: Frame): Welcome;
/**
 * A handshaken connection. `onMessage` gets every MESSAGE; `onClosed` is called once with
 * the reason when the connection ends for any reason.
 */
export declare class Connection {
    private socket;
    private readonly reader;
    private readonly limits;
    welcome: Welcome;
    onMessage: (m: Message) => void;
    onClosed: (e: ConnectionClosedError | ProtocolError) => void;
    private closedWith;
    private readonly queue;
    private waitingDrain;
    private handshake;
    private constructor();
    /** The server's receive limits from WELCOME; messages over them are refused before sending. */
    get serverLimits(): Limits;
    /** This client's receive limits (announced in HELLO). */
    get clientLimits(): Limits;
    /** Why the connection is closed, or null while it is open. */
    get closedReason(): ConnectionClosedError | ProtocolError | null;
    /** Keeps the process alive while the socket is open (true) or not (false). */
    setRef(ref: boolean): void;
    /** Connects to `addr`, sends the preamble and HELLO at once, and waits for WELCOME. */
    static open(addr: string, opts?: ConnectionOptions): Promise<Connection>;
    private attach;
    private onFrame;
    /** Encodes and queues a MESSAGE; resolves once it is handed to the kernel. Throws `LimitError` before sending anything. */
    send(header: unknown, tensors: readonly Tensor[]): Promise<void>;
    private pump;
    /** Sends CLOSE `normal` (best effort) and ends the connection. */
    close(): void;
    /** Ends the connection because of `e` (a ProtocolError is told to the server in a CLOSE frame first). */
    fail(e: Error): void;
    private destroy;
    private rejectQueue;
}
