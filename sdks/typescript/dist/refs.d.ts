/**
 * Tensors inside JSON-RPC params and results (PROTOCOL.md §18.2): on the way out each
 * `Tensor` becomes `{"$tensor": i}` and goes into the message; on the way in each
 * `{"$tensor": i}` (or inline `{"$tensor": {"dtype", "shape", "data", "strides"?}}`)
 * becomes a `Tensor`. A named tensor map is simply an object whose values are tensors.
 */
import { Tensor } from "./tensor.js";
/**
 * A remote tensor reference (PROTOCOL.md §21): a tensor kept on the server. A result's
 * `{"$tensor_ref": {...}}` comes back as one; passed in params it is sent as
 * `{"$tensor_ref": {"id"}}`, and the server uses its tensor without moving bytes. Fetch it
 * with `ferry.ref.fetch {ref}`, free it with `ferry.ref.free {ids}`.
 */
export declare class TensorRef {
    /** 128 random bits: `r` and 32 hex digits. */
    readonly id: string;
    readonly dtype: string;
    readonly shape: readonly number[];
    readonly device: string;
    readonly bytes: number;
    /** When it expires (milliseconds since the Unix epoch), or null. */
    readonly expiresMs: number | null;
    /** Whether it outlives the connection that made it. */
    readonly published: boolean;
    constructor(
    /** 128 random bits: `r` and 32 hex digits. */
    id: string, dtype: string, shape: readonly number[], device?: string, bytes?: number, 
    /** When it expires (milliseconds since the Unix epoch), or null. */
    expiresMs?: number | null, 
    /** Whether it outlives the connection that made it. */
    published?: boolean);
    /** The inside of `{"$tensor_ref": {...}}`; `ProtocolError` when malformed. */
    static fromJSON(inner: unknown): TensorRef;
    /** The param form. */
    toJSON(): {
        $tensor_ref: {
            id: string;
        };
    };
}
/** A named tensor map (a model's weights): `{"fc1.weight": Tensor, ...}`. */
export type TensorMap = Record<string, Tensor>;
/**
 * `value` with every `Tensor` replaced by `{"$tensor": i}`, appending the tensors to
 * `out` (the same Tensor object twice is sent once). Walks arrays and plain objects only;
 * other objects go to `JSON.stringify` as they are. A bare typed array is refused (wrap it
 * with `Tensor.from`), and so is a cycle.
 */
export declare function encodeRefs(value: unknown, out: Tensor[], seen?: Map<Tensor, number>): unknown;
/**
 * Replaces, in place, every `{"$tensor": i}` in `value` (freshly parsed JSON) with
 * `tensors[i]`, and every inline `{"$tensor": {...}}` with a decoded tensor. Returns the
 * result (the value itself may be a tensor). Throws `ProtocolError` for a bad reference.
 */
export declare function decodeRefs(value: unknown, tensors: readonly Tensor[]): unknown;
