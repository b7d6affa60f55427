/**
 * Tensors inside JSON-RPC params and results (PROTOCOL.md §18.2): on the way out each
 * `Tensor` becomes `{"$tensor": i}` and goes into the message; on the way in each
 * `{"$tensor": i}` (or inline `{"$tensor": {"dtype", "shape", "data", "strides"?}}`)
 * becomes a `Tensor`. A named tensor map is simply an object whose values are tensors.
 */

import { ProtocolError } from "./errors.js";
import { validateMeta } from "./frame.js";
import { arrayType } from "./dtype.js";
import { Tensor } from "./tensor.js";

/**
 * A remote tensor reference (PROTOCOL.md §21): a tensor kept on the server. A result's
 * `{"$tensor_ref": {...}}` comes back as one; passed in params it is sent as
 * `{"$tensor_ref": {"id"}}`, and the server uses its tensor without moving bytes. Fetch it
 * with `ferry.ref.fetch {ref}`, free it with `ferry.ref.free {ids}`.
 */
export class TensorRef {
  constructor(
    /** 128 random bits: `r` and 32 hex digits. */
    readonly id: string,
    readonly dtype: string,
    readonly shape: readonly number[],
    readonly device: string = "cpu",
    readonly bytes: number = 0,
    /** When it expires (milliseconds since the Unix epoch), or null. */
    readonly expiresMs: number | null = null,
    /** Whether it outlives the connection that made it. */
    readonly published: boolean = false,
  ) {}

  /** The inside of `{"$tensor_ref": {...}}`; `ProtocolError` when malformed. */
  static fromJSON(inner: unknown): TensorRef {
    if (typeof inner !== "object" || inner === null || Array.isArray(inner)) {
      throw new ProtocolError(`malformed tensor reference ${JSON.stringify(inner)}`);
    }
    const r = inner as Record<string, unknown>;
    const shape = r["shape"] ?? [];
    const expires = r["expires_ms"] ?? null;
    if (typeof r["id"] !== "string" || !Array.isArray(shape) || !shape.every((d) => Number.isInteger(d))) {
      throw new ProtocolError(`malformed tensor reference ${JSON.stringify(inner).slice(0, 200)}`);
    }
    if (expires !== null && typeof expires !== "number") throw new ProtocolError("a tensor reference's expires_ms is not a number");
    return new TensorRef(
      r["id"],
      String(r["dtype"] ?? ""),
      shape as number[],
      String(r["device"] ?? "cpu"),
      Number(r["bytes"] ?? 0),
      expires,
      r["published"] === true,
    );
  }

  /** The param form. */
  toJSON(): { $tensor_ref: { id: string } } {
    return { $tensor_ref: { id: this.id } };
  }
}

/** A named tensor map (a model's weights): `{"fc1.weight": Tensor, ...}`. */
export type TensorMap = Record<string, Tensor>;

function isPlainObject(v: object): boolean {
  const p = Object.getPrototypeOf(v);
  return p === Object.prototype || p === null;
}

/**
 * `value` with every `Tensor` replaced by `{"$tensor": i}`, appending the tensors to
 * `out` (the same Tensor object twice is sent once). Walks arrays and plain objects only;
 * other objects go to `JSON.stringify` as they are. A bare typed array is refused (wrap it
 * with `Tensor.from`), and so is a cycle.
 */
export function encodeRefs(value: unknown, out: Tensor[], seen: Map<Tensor, number> = new Map()): unknown {
  const path: object[] = [];
  const walk = (v: unknown): unknown => {
    if (v === null || typeof v !== "object") return v;
    if (v instanceof Tensor) {
      let i = seen.get(v);
      if (i === undefined) {
        i = out.length;
        out.push(v);
        seen.set(v, i);
      }
      return { $tensor: i };
    }
    if (v instanceof TensorRef) return v.toJSON();
    if (ArrayBuffer.isView(v)) {
      throw new TypeError("a typed array in params must be wrapped in a Tensor (Tensor.from(array, shape))");
    }
    const isArray = Array.isArray(v);
    if (!isArray && !isPlainObject(v)) return v;
    if (path.includes(v)) throw new TypeError("params contain a cycle");
    path.push(v);
    let r: unknown;
    if (isArray) {
      r = (v as unknown[]).map(walk);
    } else {
      const o: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(v)) {
        if (x !== undefined) o[k] = walk(x);
      }
      r = o;
    }
    path.pop();
    return r;
  };
  return walk(value);
}

/**
 * Replaces, in place, every `{"$tensor": i}` in `value` (freshly parsed JSON) with
 * `tensors[i]`, and every inline `{"$tensor": {...}}` with a decoded tensor. Returns the
 * result (the value itself may be a tensor). Throws `ProtocolError` for a bad reference.
 */
export function decodeRefs(value: unknown, tensors: readonly Tensor[]): unknown {
  const walk = (v: unknown): unknown => {
    if (v === null || typeof v !== "object") return v;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) v[i] = walk(v[i]);
      return v;
    }
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o);
    if (keys.length === 1 && keys[0] === "$tensor" && isTensorRef(o["$tensor"])) return tensorOf(o["$tensor"], tensors);
    if (keys.length === 1 && keys[0] === "$tensor_ref" && isRemoteRef(o["$tensor_ref"])) return TensorRef.fromJSON(o["$tensor_ref"]);
    for (const k of keys) o[k] = walk(o[k]);
    return o;
  };
  return walk(value);
}

/**
 * Whether the value of a lone `$tensor` member is a reference (a number) or an inline tensor
 * (an object with string `data`). Anything else (e.g. `{"$tensor": {...}}` inside a JSON
 * Schema of `rpc.discover`) is left as it is.
 */
function isTensorRef(v: unknown): boolean {
  if (typeof v === "number") return true;
  return typeof v === "object" && v !== null && !Array.isArray(v) && typeof (v as Record<string, unknown>)["data"] === "string";
}

/** Whether the value of a lone `$tensor_ref` member is a reference (an object with a string
 * `id`); anything else (a JSON Schema's `properties`, say) is left as it is. */
function isRemoteRef(v: unknown): boolean {
  return typeof v === "object" && v !== null && !Array.isArray(v) && typeof (v as Record<string, unknown>)["id"] === "string";
}

function tensorOf(ref: unknown, tensors: readonly Tensor[]): Tensor {
  if (typeof ref === "number") {
    if (!Number.isInteger(ref) || ref < 0 || ref >= tensors.length) {
      throw new ProtocolError(`tensor reference {"$tensor": ${ref}} is not one of the message's ${tensors.length} tensors`);
    }
    return tensors[ref]!;
  }
  if (typeof ref === "object" && ref !== null && !Array.isArray(ref)) {
    const r = ref as Record<string, unknown>;
    if (typeof r["data"] !== "string") throw new ProtocolError("an inline tensor needs base64 `data`");
    const bytes = Buffer.from(r["data"], "base64");
    const { dtype, shape, strides, span } = validateMeta({ ...r, device: "cpu" }, bytes.length);
    // Copy into a fresh buffer: Buffer.from may return a misaligned slice of Node's pool.
    const Ctor = arrayType(dtype);
    const arr = new Ctor(span / Ctor.BYTES_PER_ELEMENT);
    new Uint8Array(arr.buffer).set(bytes.subarray(0, span));
    return new Tensor(dtype, shape, arr, strides);
  }
  throw new ProtocolError(`malformed tensor reference ${JSON.stringify(ref)}`);
}
