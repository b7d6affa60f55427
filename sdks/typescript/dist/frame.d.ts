/**
 * The ferry wire format (docs/PROTOCOL.md §3-§10), inline channel only: the preamble,
 * frame prefixes, a receiver that validates every number before it allocates or views
 * anything, and MESSAGE encoding/decoding with 64-byte aligned inline tensors.
 */
import { type DType } from "./dtype.js";
import { Kind } from "./constants.js";
import { Tensor } from "./tensor.js";
export { ALIGN, Kind, MAX_DIMS, PREFIX_LEN } from "./constants.js";
export declare const MAGIC: Buffer<ArrayBuffer>;
export declare const VERSION = 1;
export declare const PREAMBLE: Buffer<ArrayBuffer>;
export type KindNumber = (typeof Kind)[keyof typeof Kind];
/** Receive limits (PROTOCOL.md §6.2, §12), as announced in HELLO and WELCOME. */
export interface Limits {
    max_header_bytes: number;
    max_payload_bytes: number;
    max_tensors: number;
    max_fds: number;
}
/** The protocol's default limits (what a server that announces nothing accepts). */
export declare const DEFAULT_LIMITS: Readonly<Limits>;
/** The largest byte length one buffer can have in this Node (2^32 on Node 20, 64-bit). */
export declare const MAX_BUFFER: number;
/** What this client accepts by default; the payload limit is capped by what one ArrayBuffer can hold. */
export declare const CLIENT_LIMITS: Readonly<Limits>;
/** One received frame. `payload` is a view at offset 0 of its own ArrayBuffer (64-byte aligned offsets stay aligned). */
export interface Frame {
    kind: KindNumber;
    header: unknown;
    payload: Uint8Array;
}
/** Prefix + JSON header of a frame, as one buffer. */
export declare function encodeHead(kind: KindNumber, header: string | Buffer, payloadLen: number): Buffer;
/**
 * Turns the byte stream from the server into frames. Bytes are copied at most once: small
 * reads land in a reusable scratch buffer and are copied into the frame's header or payload
 * buffer; once a large part of a frame is missing, `nextBuffer()` hands out the unfilled
 * rest of that buffer itself, so the socket reads straight into it (Node's `onread`).
 *
 * Every prefix is checked before anything is allocated: known kind, flags 0, no file
 * descriptors (the inline channel passes none), header and payload lengths within `limits`.
 * Each payload gets a fresh ArrayBuffer (`Buffer.allocUnsafeSlow`, never a pool slice), so
 * the 64-byte aligned tensor offsets are aligned for every typed array.
 */
export declare class FrameReader {
    private readonly limits;
    private readonly onFrame;
    private state;
    private target;
    private filled;
    private readonly scratch;
    private kind;
    private header;
    private payloadLen;
    constructor(limits: Limits, onFrame: (f: Frame) => void);
    /** The buffer the next socket read should fill. */
    nextBuffer(): Uint8Array;
    /** `n` bytes were read into `buf` (from `nextBuffer()`). Throws `ProtocolError`. */
    consumed(n: number, buf: Uint8Array): void;
    /** Feeds the first `n` bytes of `chunk` (a chunk from a 'data' event, or the scratch buffer). */
    push(chunk: Uint8Array, n?: number): void;
    /** Stops: anything more is an error. */
    stop(): void;
    /** Whether the stream ended between frames (not inside one). */
    get atBoundary(): boolean;
    private expect;
    private advance;
    private parsePrefix;
}
/** A decoded MESSAGE: the application header and its tensors. */
export interface Message {
    header: unknown;
    tensors: Tensor[];
}
/**
 * Validates a TensorMeta against `available` bytes (PROTOCOL.md §5.4) with 64-bit checked
 * arithmetic; returns the dtype, shape, strides and the byte span.
 */
export declare function validateMeta(meta: unknown, available: number): {
    dtype: DType;
    shape: number[];
    strides: number[] | undefined;
    span: number;
};
/**
 * Decodes a MESSAGE frame's header and payload (PROTOCOL.md §7.2): every descriptor must be
 * an inline cpu tensor whose range lies inside the payload and whose meta needs exactly
 * (without strides) or at most (with strides) its bytes. Tensors view the payload without
 * copying; one at an offset that is not a multiple of its item size is copied.
 */
export declare function decodeMessage(body: unknown, payload: Uint8Array, maxTensors: number): Message;
/** A MESSAGE ready to write: prefix + header in `head`, then the payload as `chunks` (not concatenated). */
export interface EncodedMessage {
    head: Buffer;
    chunks: Uint8Array[];
    payloadLen: number;
}
/**
 * Encodes a MESSAGE (PROTOCOL.md §7.1): tensors in order, each at the next multiple of 64,
 * zero padding in between. Checks the message against the server's `limits` first.
 */
export declare function encodeMessage(header: unknown, tensors: readonly Tensor[], limits: Limits): EncodedMessage;
