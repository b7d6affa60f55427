/**
 * The wire constants of the ferry protocol (docs/PROTOCOL.md), generated from the Rust
* tables: frame kinds, limits, dtypes and handshake features. The error codes are in
* `rpc_errors.ts`.
 */
/** The protocol name in HELLO. */
export declare const PROTOCOL = "ferry";
/** The protocol version (preamble, HELLO, WELCOME). */
export declare const PROTOCOL_VERSION = 1;
/** The first six bytes of the preamble: 0x89, then `FERRY`. */
export declare const MAGIC: readonly number[];
/** Bytes of the preamble: the magic and a u16 LE version. */
export declare const PREAMBLE_LEN = 8;
/** Bytes of a frame prefix: kind, flags, fds, header_len, payload_len. */
export declare const PREFIX_LEN = 16;
/** Alignment of inline tensors in a payload. */
export declare const ALIGN = 64;
/** The most dimensions of a tensor. */
export declare const MAX_DIMS = 64;
/** Frame kinds (PROTOCOL.md §4.2). */
export declare const Kind: {
    readonly HELLO: 1;
    readonly WELCOME: 2;
    readonly REFUSE: 3;
    readonly MESSAGE: 4;
    readonly CONTROL: 5;
    readonly CLOSE: 6;
    readonly RING: 7;
};
/** The default limits (PROTOCOL.md §6.2). */
export declare const WIRE_DEFAULT_LIMITS: {
    readonly max_header_bytes: 16777216;
    readonly max_payload_bytes: 4294967296;
    readonly max_tensors: 65536;
    readonly max_fds: 64;
};
/** What a peer may send before the handshake is done. */
export declare const HANDSHAKE_LIMITS: {
    readonly max_header_bytes: 65536;
    readonly max_payload_bytes: 0;
    readonly max_tensors: 0;
    readonly max_fds: 0;
};
/** Every dtype, in the protocol's order (PROTOCOL.md §5.1). */
export declare const DTYPES: readonly ["bool", "u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64", "f16", "bf16", "f32", "f64", "f8e4m3fn", "f8e5m2", "c64", "c128"];
/** Bytes per element of each dtype. */
export declare const ITEM_SIZES: {
    readonly bool: 1;
    readonly u8: 1;
    readonly i8: 1;
    readonly u16: 2;
    readonly i16: 2;
    readonly u32: 4;
    readonly i32: 4;
    readonly u64: 8;
    readonly i64: 8;
    readonly f16: 2;
    readonly bf16: 2;
    readonly f32: 4;
    readonly f64: 8;
    readonly f8e4m3fn: 1;
    readonly f8e5m2: 1;
    readonly c64: 8;
    readonly c128: 16;
};
/** The handshake features the Rust implementation understands. */
export declare const FEATURES: readonly ["compact_tensors", "shm_forget"];
