/**
 * Tensors inside JSON-RPC params and results (PROTOCOL.md §18.2): on the way out each
 * `Tensor` becomes `{"$tensor": i}` and goes into the message; on the way in each
 * `{"$tensor": i}` (or inline `{"$tensor": {"dtype", "shape", "data", "strides"?}}`)
 * becomes a `Tensor`. A named tensor map is simply an object whose values are tensors.
 */
import { Tensor } from "./tensor.js";
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
