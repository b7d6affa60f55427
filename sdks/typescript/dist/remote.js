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
import { ProtocolError } from "./errors.js";
import { TensorRef } from "./refs.js";
import { Tensor } from "./tensor.js";
/** A result for an error message: short, and a tensor by its dtype and shape only. */
function shown(v) {
    if (v instanceof Tensor)
        return `a ${v.dtype}[${v.shape.join(", ")}] tensor`;
    return String(JSON.stringify(v)).slice(0, 100);
}
function asRef(result, method) {
    if (!(result instanceof TensorRef))
        throw new ProtocolError(`${method} answered ${shown(result)}, not a tensor reference`);
    return result;
}
function callOptions(opts) {
    const o = {};
    if (opts.timeoutMs !== undefined)
        o.timeoutMs = opts.timeoutMs;
    if (opts.signal !== undefined)
        o.signal = opts.signal;
    return o;
}
/**
 * Sends `tensor` once and keeps it on the server (`ferry.ref.keep`); the reference then
 * stands for it in params. `ttlMs` frees it after that long.
 */
export async function keep(client, tensor, opts = {}) {
    if (!(tensor instanceof Tensor))
        throw new TypeError("keep takes a Tensor");
    const params = { tensor };
    if (opts.ttlMs !== undefined) {
        if (typeof opts.ttlMs !== "number" || !Number.isFinite(opts.ttlMs)) {
            throw new TypeError(`ttlMs must be a finite number of milliseconds, not ${String(opts.ttlMs)}`);
        }
        params["ttl_ms"] = Math.max(0, Math.round(opts.ttlMs));
    }
    return asRef(await client.call("ferry.ref.keep", params, callOptions(opts)), "ferry.ref.keep");
}
/** The tensor `ref` names (`ferry.ref.fetch`): its bytes, copied into this process. */
export async function fetch(client, ref, opts = {}) {
    const r = await client.call("ferry.ref.fetch", { ref }, callOptions(opts));
    if (!(r instanceof Tensor))
        throw new ProtocolError(`ferry.ref.fetch answered ${shown(r)}, not a tensor`);
    return r;
}
/**
 * Frees `refs` (`ferry.ref.free`); resolves with how many were the caller's and still held
 * (a reference already freed, expired or unknown counts 0, and is no error).
 */
export async function free(client, ...refs) {
    const r = await client.call("ferry.ref.free", { ids: refs.map((x) => x.id) });
    const freed = typeof r === "object" && r !== null ? r["freed"] : undefined;
    if (typeof freed !== "number" || !Number.isInteger(freed)) {
        throw new ProtocolError(`ferry.ref.free answered ${shown(r)}`);
    }
    return freed;
}
/**
 * Lets `ref` outlive the connection that made it, until freed or expired
 * (`ferry.ref.publish`); resolves with the reference as it now is (`published` true).
 */
export async function publish(client, ref, opts = {}) {
    return asRef(await client.call("ferry.ref.publish", { id: ref.id }, callOptions(opts)), "ferry.ref.publish");
}
/** The caller's references on the server (`ferry.ref.list`). */
export async function listRefs(client, opts = {}) {
    const r = await client.call("ferry.ref.list", {}, callOptions(opts));
    if (!Array.isArray(r))
        throw new ProtocolError(`ferry.ref.list answered ${shown(r)}`);
    return r.map((x) => asRef(x, "ferry.ref.list"));
}
