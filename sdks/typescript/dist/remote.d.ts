/**
 * Remote tensor references (PROTOCOL.md §21): tensors that stay on the server.
 *
 * A server method may answer with a reference instead of a tensor's bytes; the client gets
 * a `TensorRef` (its id, dtype, shape, device, size, expiry). Passed back in params, where
 * the method takes a tensor, it moves no byte: the server uses the tensor it kept.
 *
 * ```ts
 * const r = await keep(client, Tensor.from([1, 2, 3], [3], "f32")); // sent once
 * await client.call("sum", { tensor: r });                          // no bytes sent
 * const t = await fetch(client, r);                                 // the bytes, when wanted
 * await free(client, r);
 * ```
 *
 * References belong to the caller's identity, die with the connection that made them unless
 * `publish`ed, and may carry a TTL. A reference that is unknown, freed, expired or another
 * identity's is `NotFoundError` (-32009) wherever it is used. These helpers mirror the
 * Python package's `ferry.refs` (`keep`, `fetch`, `free`, `publish`, `list_refs`).
 */
import type { CallOptions, Client } from "./client.js";
import { TensorRef } from "./refs.js";
import { Tensor } from "./tensor.js";
/** Options of `keep`: the call's own, and how long the server keeps the tensor. */
export interface KeepOptions extends CallOptions {
    /** Frees the reference after this many milliseconds (`ttl_ms`); default: no TTL. */
    ttlMs?: number;
}
/**
 * Sends `tensor` once and keeps it on the server (`ferry.ref.keep`); the reference then
 * stands for it in params. `ttlMs` frees it after that long.
 */
export declare function keep(client: Client, tensor: Tensor, opts?: KeepOptions): Promise<TensorRef>;
/** The tensor `ref` names (`ferry.ref.fetch`): its bytes, copied into this process. */
export declare function fetch(client: Client, ref: TensorRef, opts?: CallOptions): Promise<Tensor>;
/**
 * Frees `refs` (`ferry.ref.free`); resolves with how many were the caller's and still held
 * (a reference already freed, expired or unknown counts 0, and is no error).
 */
export declare function free(client: Client, ...refs: TensorRef[]): Promise<number>;
/**
 * Lets `ref` outlive the connection that made it, until freed or expired
 * (`ferry.ref.publish`); resolves with the reference as it now is (`published` true).
 */
export declare function publish(client: Client, ref: TensorRef, opts?: CallOptions): Promise<TensorRef>;
/** The caller's references on the server (`ferry.ref.list`). */
export declare function listRefs(client: Client, opts?: CallOptions): Promise<TensorRef[]>;
