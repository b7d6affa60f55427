/**
 * The ferry wire format (docs/PROTOCOL.md §3-§10), inline channel only: the preamble,
 * frame prefixes, a receiver that validates every number before it allocates or views
 * anything, and MESSAGE encoding/decoding with 64-byte aligned inline tensors.
 */
import { constants as bufferConstants } from "node:buffer";
import { arrayType, isDType, itemSize } from "./dtype.js";
import { ALIGN, Kind, MAX_DIMS, PREFIX_LEN, PROTOCOL_VERSION, MAGIC as WIRE_MAGIC, WIRE_DEFAULT_LIMITS } from "./constants.js";
import { LimitError, ProtocolError } from "./errors.js";
import { Tensor } from "./tensor.js";
// The protocol's constants, generated from the Rust tables (constants.ts).
export { ALIGN, Kind, MAX_DIMS, PREFIX_LEN } from "./constants.js";
export const MAGIC = Buffer.from(WIRE_MAGIC);
export const VERSION = PROTOCOL_VERSION;
export const PREAMBLE = Buffer.concat([MAGIC, Buffer.from([VERSION & 0xff, VERSION >> 8])]);
const U64_MAX = (1n << 64n) - 1n;
/** The protocol's default limits (what a server that announces nothing accepts). */
export const DEFAULT_LIMITS = { ...WIRE_DEFAULT_LIMITS };
/** The largest byte length one buffer can have in this Node (2^32 on Node 20, 64-bit). */
export const MAX_BUFFER = Math.min(bufferConstants.MAX_LENGTH, Number.MAX_SAFE_INTEGER);
/** What this client accepts by default; the payload limit is capped by what one ArrayBuffer can hold. */
export const CLIENT_LIMITS = {
    ...DEFAULT_LIMITS,
    max_payload_bytes: Math.min(DEFAULT_LIMITS.max_payload_bytes, MAX_BUFFER),
    max_fds: 0,
};
/** Prefix + JSON header of a frame, as one buffer. */
export function encodeHead(kind, header, payloadLen) {
    const h = typeof header === "string" ? Buffer.from(header, "utf8") : header;
    const out = Buffer.allocUnsafe(PREFIX_LEN + h.length);
    out.writeUInt8(kind, 0);
    out.writeUInt8(0, 1);
    out.writeUInt16LE(0, 2);
    out.writeUInt32LE(h.length, 4);
    out.writeBigUInt64LE(BigInt(payloadLen), 8);
    h.copy(out, PREFIX_LEN);
    return out;
}
const SCRATCH_LEN = 64 * 1024;
/** Reads straight into a frame's header/payload buffer when at least this much of it is missing. */
const DIRECT_MIN = 16 * 1024;
const utf8 = new TextDecoder("utf-8", { fatal: true });
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
export class FrameReader {
    limits;
    onFrame;
    state = 0 /* State.Preamble */;
    target = new Uint8Array(8);
    filled = 0;
    scratch = Buffer.allocUnsafeSlow(SCRATCH_LEN);
    kind = Kind.HELLO;
    header = null;
    payloadLen = 0;
    constructor(limits, onFrame) {
        this.limits = limits;
        this.onFrame = onFrame;
    }
    /** The buffer the next socket read should fill. */
    nextBuffer() {
        if ((this.state === 3 /* State.Payload */ || this.state === 2 /* State.Header */) && this.target.length - this.filled >= DIRECT_MIN) {
            return this.target.subarray(this.filled);
        }
        return this.scratch;
    }
    /** `n` bytes were read into `buf` (from `nextBuffer()`). Throws `ProtocolError`. */
    consumed(n, buf) {
        if (buf === this.scratch) {
            this.push(this.scratch, n);
            return;
        }
        if (this.state === 4 /* State.Done */)
            throw new ProtocolError("data after the end of the stream");
        this.filled += n;
        if (this.filled === this.target.length)
            this.advance();
    }
    /** Feeds the first `n` bytes of `chunk` (a chunk from a 'data' event, or the scratch buffer). */
    push(chunk, n = chunk.length) {
        let off = 0;
        while (off < n) {
            if (this.state === 4 /* State.Done */)
                throw new ProtocolError("data after the end of the stream");
            const k = Math.min(n - off, this.target.length - this.filled);
            this.target.set(chunk.subarray(off, off + k), this.filled);
            this.filled += k;
            off += k;
            if (this.filled === this.target.length)
                this.advance();
        }
    }
    /** Stops: anything more is an error. */
    stop() {
        this.state = 4 /* State.Done */;
    }
    /** Whether the stream ended between frames (not inside one). */
    get atBoundary() {
        return this.state === 1 /* State.Prefix */ && this.filled === 0;
    }
    expect(state, target) {
        this.state = state;
        this.target = target;
        this.filled = 0;
    }
    advance() {
        // Loops through zero-length sections (an empty header cannot happen; empty payloads do).
        for (;;) {
            switch (this.state) {
                case 0 /* State.Preamble */: {
                    const b = this.target;
                    if (!MAGIC.equals(b.subarray(0, 6))) {
                        throw new ProtocolError(`not a ferry peer: the stream starts with ${Buffer.from(b).toString("hex")}`);
                    }
                    this.expect(1 /* State.Prefix */, new Uint8Array(PREFIX_LEN));
                    return;
                }
                case 1 /* State.Prefix */: {
                    this.parsePrefix();
                    if (this.target.length > 0)
                        return;
                    continue;
                }
                case 2 /* State.Header */: {
                    let text;
                    try {
                        text = utf8.decode(this.target);
                    }
                    catch {
                        throw new ProtocolError("malformed frame header: not valid UTF-8");
                    }
                    try {
                        this.header = JSON.parse(text);
                    }
                    catch (e) {
                        throw new ProtocolError(`malformed frame header: ${e.message}`);
                    }
                    const len = this.payloadLen;
                    this.expect(3 /* State.Payload */, len === 0 ? EMPTY : Buffer.allocUnsafeSlow(len));
                    if (len > 0)
                        return;
                    continue;
                }
                case 3 /* State.Payload */: {
                    const frame = { kind: this.kind, header: this.header, payload: this.target };
                    this.header = null;
                    this.expect(1 /* State.Prefix */, new Uint8Array(PREFIX_LEN));
                    this.onFrame(frame);
                    return;
                }
                case 4 /* State.Done */:
                    return;
            }
        }
    }
    parsePrefix() {
        const p = this.target;
        const dv = new DataView(p.buffer, p.byteOffset, PREFIX_LEN);
        const kind = dv.getUint8(0);
        const flags = dv.getUint8(1);
        const fds = dv.getUint16(2, true);
        const hlen = dv.getUint32(4, true);
        const plen = dv.getBigUint64(8, true);
        if (kind < Kind.HELLO || kind > Kind.CLOSE)
            throw new ProtocolError(`unexpected frame kind ${kind} (unknown kind)`);
        if (flags !== 0) {
            throw new ProtocolError(`frame flags 0x${flags.toString(16).padStart(2, "0")} are reserved and must be 0`);
        }
        if (hlen > this.limits.max_header_bytes) {
            throw new ProtocolError(`frame header length is ${hlen} bytes, over the limit max_header_bytes = ${this.limits.max_header_bytes}`, "limit");
        }
        if (plen > BigInt(this.limits.max_payload_bytes)) {
            throw new ProtocolError(`frame payload length is ${plen} bytes, over the limit max_payload_bytes = ${this.limits.max_payload_bytes}`, "limit");
        }
        // (Checked in the Rust reader's order: header, payload, then descriptors.)
        if (fds > this.limits.max_fds) {
            throw new ProtocolError(`file descriptors in one frame is ${fds}, over the limit max_fds = ${this.limits.max_fds} ` +
                "(this client offers only the inline channel, which passes none)", "limit");
        }
        if (fds > 0) {
            throw new ProtocolError(`file descriptor mismatch: frame announces ${fds} descriptors, this client (inline channel only) receives none`);
        }
        if (hlen === 0)
            throw new ProtocolError("malformed frame header: empty (a header is one JSON value)");
        this.kind = kind;
        this.payloadLen = Number(plen);
        this.expect(2 /* State.Header */, Buffer.allocUnsafe(hlen));
    }
}
const EMPTY = new Uint8Array(new ArrayBuffer(0));
function isObject(v) {
    return typeof v === "object" && v !== null && !Array.isArray(v);
}
/** A u64 from JSON, as a number: it must be an exact integer (at most 2^53 - 1 in JavaScript). */
function u64(v, what) {
    if (typeof v !== "number" || !Number.isInteger(v) || v < 0) {
        throw new ProtocolError(`${what} must be an unsigned integer, got ${JSON.stringify(v)}`);
    }
    if (!Number.isSafeInteger(v)) {
        throw new ProtocolError(`${what} is ${v}, above 2^53 - 1: this client cannot represent it exactly`);
    }
    return v;
}
function checked(v) {
    if (v > U64_MAX)
        throw new ProtocolError("tensor size overflows 64 bits");
    return v;
}
/**
 * Validates a TensorMeta against `available` bytes (PROTOCOL.md §5.4) with 64-bit checked
 * arithmetic; returns the dtype, shape, strides and the byte span.
 */
export function validateMeta(meta, available) {
    if (!isObject(meta))
        throw new ProtocolError("meta must be an object");
    const dtype = meta["dtype"];
    if (!isDType(dtype))
        throw new ProtocolError(`unknown dtype ${JSON.stringify(dtype)}`);
    const device = meta["device"] ?? "cpu";
    if (device !== "cpu") {
        throw new ProtocolError(`device ${JSON.stringify(device)}: only cpu tensors travel inline (no channel for it)`);
    }
    const rawShape = meta["shape"];
    if (!Array.isArray(rawShape))
        throw new ProtocolError("shape must be an array");
    if (rawShape.length > MAX_DIMS) {
        throw new ProtocolError(`too many dimensions: ${rawShape.length}, at most ${MAX_DIMS}`);
    }
    const shape = rawShape.map((d, i) => u64(d, `shape[${i}]`));
    const item = BigInt(itemSize(dtype));
    let numel = 1n;
    for (const d of shape)
        numel = checked(numel * BigInt(d));
    const rawStrides = meta["strides"];
    let strides;
    let span;
    if (rawStrides === undefined || rawStrides === null) {
        span = checked(numel * item);
        if (span !== BigInt(available)) {
            throw new ProtocolError(`${dtype}[${shape}] needs ${span} bytes, the descriptor has ${available}`);
        }
    }
    else {
        if (!Array.isArray(rawStrides))
            throw new ProtocolError("strides must be an array or null");
        if (rawStrides.length !== shape.length) {
            throw new ProtocolError(`${rawStrides.length} strides for ${shape.length} dimensions`);
        }
        strides = rawStrides.map((s, i) => {
            if (typeof s === "number" && Number.isInteger(s) && s < 0) {
                throw new ProtocolError("negative strides are not supported");
            }
            return u64(s, `strides[${i}]`);
        });
        if (numel === 0n) {
            span = 0n;
        }
        else {
            let last = 0n;
            for (let i = 0; i < shape.length; i++)
                last = checked(last + checked(BigInt(shape[i] - 1) * BigInt(strides[i])));
            span = checked((last + 1n) * item);
        }
        if (span > BigInt(available)) {
            throw new ProtocolError(`${dtype}[${shape}] with strides [${strides}] spans ${span} bytes, the descriptor has ${available}`);
        }
    }
    return { dtype, shape, strides, span: Number(span) };
}
/**
 * Decodes a MESSAGE frame's header and payload (PROTOCOL.md §7.2): every descriptor must be
 * an inline cpu tensor whose range lies inside the payload and whose meta needs exactly
 * (without strides) or at most (with strides) its bytes. Tensors view the payload without
 * copying; one at an offset that is not a multiple of its item size is copied.
 */
export function decodeMessage(body, payload, maxTensors) {
    if (!isObject(body) || !("header" in body)) {
        throw new ProtocolError("malformed frame header: a MESSAGE header needs a `header` field");
    }
    const descs = body["tensors"] ?? [];
    if (!Array.isArray(descs))
        throw new ProtocolError("malformed frame header: `tensors` must be an array");
    if (descs.length > maxTensors) {
        throw new ProtocolError(`tensors in a received message is ${descs.length}, over the limit max_tensors = ${maxTensors}`, "limit");
    }
    const tensors = [];
    for (let i = 0; i < descs.length; i++) {
        try {
            tensors.push(decodeTensor(descs[i], payload));
        }
        catch (e) {
            if (e instanceof ProtocolError)
                throw new ProtocolError(`tensor ${i}: ${e.message}`, e.closeCode);
            throw e;
        }
    }
    return { header: body["header"], tensors };
}
function decodeTensor(desc, payload) {
    if (!isObject(desc))
        throw new ProtocolError("a tensor descriptor must be an object");
    const data = desc["data"];
    if (!isObject(data))
        throw new ProtocolError("`data` must be an object naming a location");
    const keys = Object.keys(data);
    if (keys.length !== 1)
        throw new ProtocolError(`a location has exactly one key, got ${JSON.stringify(keys)}`);
    if (keys[0] !== "inline") {
        throw new ProtocolError(`unexpected location ${JSON.stringify(keys[0])} (this connection uses the inline channel)`);
    }
    const loc = data["inline"];
    if (!isObject(loc))
        throw new ProtocolError("an inline location must be an object");
    const offset = u64(loc["offset"], "offset");
    const len = u64(loc["len"], "len");
    if (offset + len > payload.length) {
        throw new ProtocolError(`bytes ${offset}..${offset + len} are outside the payload of ${payload.length} bytes`);
    }
    const { dtype, shape, strides, span } = validateMeta(desc["meta"], len);
    const Ctor = arrayType(dtype);
    const item = Ctor.BYTES_PER_ELEMENT;
    const count = Math.floor(span / item);
    const at = payload.byteOffset + offset;
    let arr;
    if (at % item === 0) {
        arr = new Ctor(payload.buffer, at, count);
    }
    else {
        // A non-ferry sender may use unaligned offsets: copy into a fresh, aligned buffer.
        const copy = new ArrayBuffer(count * item);
        new Uint8Array(copy).set(payload.subarray(offset, offset + count * item));
        arr = new Ctor(copy, 0, count);
    }
    return new Tensor(dtype, shape, arr, strides);
}
const ZEROS = new Uint8Array(ALIGN);
/**
 * Encodes a MESSAGE (PROTOCOL.md §7.1): tensors in order, each at the next multiple of 64,
 * zero padding in between. Checks the message against the server's `limits` first.
 */
export function encodeMessage(header, tensors, limits) {
    if (tensors.length > limits.max_tensors)
        throw new LimitError("max_tensors", tensors.length, limits.max_tensors);
    const descs = [];
    const chunks = [];
    let off = 0;
    for (const t of tensors) {
        const pad = (ALIGN - (off % ALIGN)) % ALIGN;
        if (pad) {
            chunks.push(ZEROS.subarray(0, pad));
            off += pad;
        }
        const bytes = t.bytes();
        const meta = { dtype: t.dtype, shape: t.shape };
        if (t.strides !== undefined)
            meta["strides"] = t.strides;
        meta["device"] = "cpu";
        descs.push({ meta, data: { inline: { offset: off, len: bytes.length } } });
        if (bytes.length)
            chunks.push(bytes);
        off += bytes.length;
    }
    if (off > limits.max_payload_bytes)
        throw new LimitError("max_payload_bytes", off, limits.max_payload_bytes);
    const json = Buffer.from(JSON.stringify({ header, tensors: descs }), "utf8");
    if (json.length > limits.max_header_bytes)
        throw new LimitError("max_header_bytes", json.length, limits.max_header_bytes);
    return { head: encodeHead(Kind.MESSAGE, json, off), chunks, payloadLen: off };
}
