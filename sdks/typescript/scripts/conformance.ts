/**
 * `npm run conformance`: the cross-language SDK scenario against a real server of the
 * conformance API (`ferry serve ADDR --api conformance`, documented in
 * `cli/src/conformance_api.rs`: make, echo, inspect, make_map, echo_map, inspect_map,
 * echo_nested, roundtrip, fail, slow, whoami), written as a conformance report for
 * `cargo xtask conformance` (column `typescript-sdk`):
 *
 * ```json
 * {"backend":"typescript-sdk","viable":true,"reason":null,
 *  "cases":[{"name":"sdk::dtype_f32","outcome":"pass","detail":null,"ms":3}]}
 * ```
 *
 * Environment:
 *
 * - `FERRY_BIN`: the `ferry` binary whose `serve --api conformance` is the server (default: a
 *   release build made here). Not needed with `FERRY_CONFORMANCE_SERVER`.
 * - `FERRY_CONFORMANCE_SERVER`: another implementation of the same API to run against: a
 *   command line, split on whitespace (no quoting), in which each literal `{addr}` becomes the
 *   address (`unix:/tmp/ferry-ts-XXXX/s.sock`); it must print `listening on` (stdout or
 *   stderr) once it serves, and stop on SIGTERM (SIGKILL in `sdk::server_gone_mid_call`).
 *   Both the shared server and the one `sdk::server_gone_mid_call` kills are started so. E.g.
 *   `FERRY_CONFORMANCE_SERVER="/path/to/ferry serve {addr} --api conformance"`.
 * - `FERRY_CONFORMANCE_COLUMN`: the report's `backend` (default `typescript-sdk`).
 * - `FERRY_CONFORMANCE_REPORT`: where the report goes (default
 *   `../../target/conformance/<backend>.json`).
 *
 * Exits 1 if a case failed.
 *
 * The scenario (the same case names as the Python client's `bindings/python/tests/client/scenario.py`,
 * where both have a case): every dtype made by the server, echoed and checksummed
 * (`sdk::dtype_*`), empty and 0-d tensors, the 24.9 MB f32[1920,1080,3] tensor, named maps
 * in results and params, nested values, JSON types round-tripped, a batch, notifications,
 * method-not-found and invalid-params errors, many calls in flight, a client-side call
 * timeout, tasks (result and cancel), and the server killed mid-call. Every tensor the server
 * makes is compared with the documented pattern computed here, and every `inspect` checksum
 * with the documented checksum computed here.
 */

import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { isDeepStrictEqual } from "node:util";

import {
  CancelledError,
  Client,
  ConnectionClosedError,
  DTYPES,
  type DType,
  InvalidParamsError,
  MethodNotFoundError,
  RpcError,
  Tensor,
  TimeoutError,
  arrayType,
  f8e4m3fnToNumber,
  f8e5m2ToNumber,
  lanes,
  numberToBf16,
  numberToF16,
  numberToF8e4m3fn,
  numberToF8e5m2,
} from "../src/index.js";
import { type Server, type StartOptions, cargoTargetDir, ensureFerry, startServer, within } from "../test/helpers.js";

interface CaseReport {
  name: string;
  outcome: "pass" | "fail" | "ignored";
  detail: string | null;
  ms: number;
}

class Failed extends Error {}

function check(cond: unknown, what: string): asserts cond {
  if (!cond) throw new Failed(what);
}

const CASE_TIMEOUT_MS = 60_000;

/** How the servers are started: `$FERRY_CONFORMANCE_SERVER`, else `ferry serve --api conformance`. */
const SERVER: StartOptions = {
  api: "conformance",
  command: process.env["FERRY_CONFORMANCE_SERVER"]?.trim() || undefined,
};

/** The report's `backend` (the column of `cargo xtask conformance`). */
const COLUMN = process.env["FERRY_CONFORMANCE_COLUMN"]?.trim() || "typescript-sdk";

/** Bytes that are not the pattern (every byte value, NaN floats included). */
function sample(dtype: DType, shape: number[]): Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const data = new (arrayType(dtype))(n * lanes(dtype));
  const bytes = new Uint8Array(data.buffer);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 37 + 11) & 0xff;
  if (dtype === "bool") for (let i = 0; i < n; i++) bytes[i] = i % 3 === 0 ? 1 : 0;
  return new Tensor(dtype, shape, data);
}

/** The documented value of element `i` of the conformance API's `make` (bool: 0 or 1). */
function patternValue(dtype: DType, i: number): number {
  const r = i % 251;
  switch (dtype) {
    case "bool":
      return i % 3 === 0 ? 1 : 0;
    case "u8":
    case "u16":
    case "u32":
    case "u64":
      return r;
    case "i8":
    case "i16":
    case "i32":
    case "i64":
      return r - 125;
    default:
      return (r - 125) * 0.5;
  }
}

/** The conformance API's `make(dtype, shape)`, computed here (complex: `value + 0i`). */
function pattern<D extends DType>(dtype: D, shape: number[]): Tensor<D> {
  const n = shape.reduce((a, b) => a * b, 1);
  const l = lanes(dtype);
  const data = new (arrayType(dtype))(n * l);
  for (let i = 0; i < n; i++) {
    const v = patternValue(dtype, i);
    if (data instanceof BigInt64Array || data instanceof BigUint64Array) data[i] = BigInt(v);
    else if (dtype === "f16") (data as Uint16Array)[i] = numberToF16(v);
    else if (dtype === "bf16") (data as Uint16Array)[i] = numberToBf16(v);
    else if (dtype === "f8e4m3fn") (data as Uint8Array)[i] = numberToF8e4m3fn(v);
    else if (dtype === "f8e5m2") (data as Uint8Array)[i] = numberToF8e5m2(v);
    else (data as Float64Array)[i * l] = v; // (a complex element's imaginary part stays 0)
  }
  return new Tensor(dtype, shape, data);
}

/** What `toNumbers()` of the pattern must give: float8 values rounded (ties to even),
 * complex elements as `[value, 0]`. */
function patternNumbers(dtype: DType, n: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const v = patternValue(dtype, i);
    if (dtype === "f8e4m3fn") out.push(f8e4m3fnToNumber(numberToF8e4m3fn(v)));
    else if (dtype === "f8e5m2") out.push(f8e5m2ToNumber(numberToF8e5m2(v)));
    else if (lanes(dtype) === 2) out.push(v, 0);
    else out.push(v);
  }
  return out;
}

const CHUNK = 1 << 20;
const MOD64 = 1n << 64n;

/**
 * The conformance API's checksum of a tensor (its bytes b_j, row-major, little-endian):
 * sum(b_j * (j % 251 + 1)) mod 2^64, as a decimal string. A chunk's sum stays below 2^36
 * (exact in a number); the chunks are summed, and reduced mod 2^64, as BigInts.
 */
function checksum(t: Tensor): string {
  const b = t.contiguous().bytes();
  let total = 0n;
  for (let start = 0; start < b.length; start += CHUNK) {
    const end = Math.min(b.length, start + CHUNK);
    let s = 0;
    for (let j = start; j < end; j++) s += b[j]! * ((j % 251) + 1);
    total = (total + BigInt(s)) % MOD64;
  }
  return total.toString();
}

/** The same dtype, typed array class, shape and elements as `want`. */
function same(got: unknown, want: Tensor, what: string): void {
  check(got instanceof Tensor, `${what}: got ${String(got)}, not a Tensor`);
  check(got.dtype === want.dtype, `${what}: dtype ${got.dtype}, want ${want.dtype}`);
  check(got.shape.join() === want.shape.join(), `${what}: shape [${got.shape}], want [${want.shape}]`);
  check(got.data instanceof arrayType(want.dtype), `${what}: not a ${arrayType(want.dtype).name}`);
  if (!got.equals(want)) {
    const a = got.toNumbers();
    const b = want.toNumbers();
    const i = a.findIndex((x, k) => !Object.is(x, b[k]));
    throw new Failed(`${what}: the elements differ (first at ${i}: ${a[i]}, want ${b[i]})`);
  }
}

/** `same(got, pattern(dtype, shape))`, and its decoded numbers are the documented values. */
function isPattern(got: unknown, dtype: DType, shape: number[], what: string): void {
  same(got, pattern(dtype, shape), what);
  const nums = (got as Tensor).toNumbers();
  const want = patternNumbers(dtype, shape.reduce((a, b) => a * b, 1));
  const i = nums.findIndex((x, k) => x !== want[k]);
  check(i < 0 && nums.length === want.length, `${what}: number ${i} is ${nums[i]}, want ${want[i]}`);
}

interface TensorInfo {
  dtype: string;
  shape: number[];
  strides?: number[] | null;
  nbytes: number;
  checksum: string;
}

/** `inspect`'s answer describes `t` (a contiguous tensor): dtype, shape, no strides, bytes, checksum. */
function checkInfo(info: TensorInfo | undefined, t: Tensor, what: string): void {
  check(info && typeof info === "object", `${what}: inspect returned ${JSON.stringify(info)}`);
  const detail = `${what}: ${JSON.stringify(info)}`;
  check(info.dtype === t.dtype, `${detail}: dtype, want ${t.dtype}`);
  check(Array.isArray(info.shape) && info.shape.join() === t.shape.join(), `${detail}: shape, want [${t.shape}]`);
  check(info.strides === null || info.strides === undefined, `${detail}: strides, want none`);
  check(info.nbytes === t.nbytes, `${detail}: nbytes, want ${t.nbytes}`);
  check(typeof info.checksum === "string", `${detail}: the checksum is not a decimal string`);
  check(info.checksum === checksum(t), `${detail}: checksum, want ${checksum(t)}`);
}

/** The rejection of `p` (null if it resolved). */
function rejection(p: Promise<unknown>): Promise<unknown> {
  return p.then(
    () => null,
    (x: unknown) => x,
  );
}

type Case = [name: string, run: (c: Client) => Promise<void>];

function cases(): Case[] {
  const out: Case[] = [];
  for (const dtype of DTYPES) {
    out.push([
      `sdk::dtype_${dtype}`,
      async (c) => {
        // Any bytes: echoed unchanged, checksummed by the server as here.
        const t = sample(dtype, [4, 3]);
        const back = await c.call<Tensor>("echo", { tensor: t });
        check(back instanceof Tensor && back.dtype === dtype, `echo returned ${String(back)}`);
        check(back.equals(t), "the echoed elements differ");
        check(back.data instanceof arrayType(dtype), `not a ${arrayType(dtype).name}`);
        checkInfo(await c.call<TensorInfo>("inspect", { tensor: t }), t, `inspect ${dtype}[4,3]`);
        // The pattern: made by the server as computed here, and sent both ways.
        for (const shape of [[3, 5], [64, 128]]) {
          const what = `${dtype}[${shape}]`;
          const want = pattern(dtype, shape);
          const got = await c.call<Tensor>("make", { dtype, shape });
          isPattern(got, dtype, shape, `make ${what}`);
          same(await c.call<Tensor>("echo", { tensor: got }), want, `echo of make ${what}`);
          checkInfo(await c.call<TensorInfo>("inspect", { tensor: want }), want, `inspect local ${what}`);
          checkInfo(await c.call<TensorInfo>("inspect", { tensor: got }), want, `inspect of make ${what}`);
        }
      },
    ]);
  }
  out.push(
    [
      "sdk::empty_tensors",
      async (c) => {
        for (const shape of [[0], [2, 0, 3]]) {
          const back = await c.call<Tensor>("echo", { tensor: Tensor.zeros("f32", shape) });
          check(back.data.length === 0 && back.shape.join() === shape.join(), `shape [${shape}] came back as ${back}`);
        }
        const s = await c.call<Tensor>("echo", { tensor: Tensor.scalar(4, "i32") });
        check(s.shape.length === 0 && s.data[0] === 4, "0-d tensor");
        for (const dtype of ["f32", "u8", "bf16", "bool"] as const) {
          for (const shape of [[0], [2, 0, 3], []]) {
            const what = `${dtype}[${shape}]`;
            const got = await c.call<Tensor>("make", { dtype, shape });
            isPattern(got, dtype, shape, `make ${what}`);
            const back = await c.call<Tensor>("echo", { tensor: Tensor.zeros(dtype, shape) });
            same(back, Tensor.zeros(dtype, shape), `echo zeros ${what}`);
            checkInfo(await c.call<TensorInfo>("inspect", { tensor: got }), got, `inspect ${what}`);
          }
        }
      },
    ],
    [
      "sdk::large_tensor",
      async (c) => {
        const shape = [1920, 1080, 3];
        const t = Tensor.zeros("f32", shape);
        for (let i = 0; i < t.data.length; i += 1009) t.data[i] = i;
        const back = await c.call<Tensor>("echo", { tensor: t });
        check(back.equals(t), "the 24.9 MB tensor came back different");
        checkInfo(await c.call<TensorInfo>("inspect", { tensor: t }), t, "inspect of the 24.9 MB tensor");
        const want = pattern("f32", shape);
        same(await c.call<Tensor>("make", { dtype: "f32", shape }), want, "make f32[1920,1080,3]");
        checkInfo(await c.call<TensorInfo>("inspect", { tensor: want }), want, "inspect local f32[1920,1080,3]");
      },
    ],
    [
      "sdk::named_map_result",
      async (c) => {
        const names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "layers/0/w", "ünïcode"];
        const w = await c.call<Record<string, Tensor>>("make_map", { names, dtype: "bf16", shape: [4, 8] });
        check(Object.keys(w).sort().join() === [...names].sort().join(), `keys ${Object.keys(w)}`);
        for (const n of names) isPattern(w[n], "bf16", [4, 8], `make_map ${n}`);
        const back = await c.call<Record<string, Tensor>>("echo_map", { tensors: w });
        check(Object.keys(back).sort().join() === [...names].sort().join(), `echo_map keys ${Object.keys(back)}`);
        for (const n of names) same(back[n], w[n]!, `echo_map ${n}`);
        const none = await c.call<Record<string, Tensor>>("make_map", { names: [], dtype: "f32", shape: [2] });
        check(isDeepStrictEqual(none, {}), `make_map of no names: ${JSON.stringify(none)}`);
      },
    ],
    [
      "sdk::named_map_params",
      async (c) => {
        const tensors: Record<string, Tensor> = {
          a: Tensor.from([1, 2, 3], [3], "f64"),
          b: Tensor.from([1.5, 2.5], [2], "bf16"),
          w: pattern("i64", [100, 100]),
          "fc1.bias": pattern("f16", [7]),
          e: pattern("u8", [0]),
        };
        const d = await c.call<Record<string, TensorInfo>>("inspect_map", { tensors });
        const keys = Object.keys(tensors).sort().join();
        check(Object.keys(d).sort().join() === keys, `inspect_map keys ${Object.keys(d)}`);
        for (const [k, t] of Object.entries(tensors)) checkInfo(d[k], t, `inspect_map ${k}`);
        const back = await c.call<Record<string, Tensor>>("echo_map", { tensors });
        for (const [k, t] of Object.entries(tensors)) same(back[k], t, `echo_map ${k}`);
        const empty = await c.call("echo_map", { tensors: {} });
        check(isDeepStrictEqual(empty, {}), `echo_map of {}: ${JSON.stringify(empty)}`);
      },
    ],
    [
      "sdk::nested_values",
      async (c) => {
        const big = pattern("f32", [300, 300]);
        const value: Record<string, unknown> = {
          name: "n",
          list: [pattern("i32", [3]), big],
          map: { a: pattern("u8", [5]) },
          maybe: null,
        };
        const back = await c.call<{ name: string; list: Tensor[]; map: Record<string, Tensor>; maybe?: Tensor | null }>(
          "echo_nested",
          { value },
        );
        check(back.name === "n", `echo_nested name ${JSON.stringify(back.name)}`);
        check(back.maybe === null || back.maybe === undefined, `echo_nested maybe ${String(back.maybe)}`);
        check(Array.isArray(back.list) && back.list.length === 2, `list of ${back.list?.length}`);
        isPattern(back.list[0], "i32", [3], "nested list[0]");
        same(back.list[1], big, "nested list[1]");
        check(Object.keys(back.map).join() === "a", `map keys ${Object.keys(back.map)}`);
        isPattern(back.map["a"], "u8", [5], "nested map");
        value["maybe"] = pattern("f64", [2, 2]);
        const got = await c.call<{ maybe?: Tensor | null }>("echo_nested", { value });
        isPattern(got.maybe, "f64", [2, 2], "nested maybe");
      },
    ],
    [
      "sdk::types_roundtrip",
      async (c) => {
        const child = {
          points: [],
          color: "blue",
          counts: {},
          pair: [-1, ""],
          flag: false,
          big: -(2 ** 53) + 1,
          child: null,
        };
        const value = {
          points: [
            { x: 1.5, y: -2.0, label: "ä ß 東京" },
            { x: 0.0, y: 1e300 },
          ],
          color: "red",
          counts: { a: 1, b: 4294967295 },
          pair: [2 ** 53 - 1, "two"],
          flag: true,
          big: 2 ** 53 - 1,
          child,
        };
        const back = await c.call("roundtrip", { value });
        check(isDeepStrictEqual(back, value), `roundtrip returned ${JSON.stringify(back)}`);
      },
    ],
    [
      "sdk::batch",
      async (c) => {
        const t = sample("u16", [5]);
        const x = pattern("f32", [100, 100]);
        const r = await c.batch([
          { method: "slow", params: { ms: 1 } },
          { method: "echo", params: { tensor: t } },
          { method: "fail", params: { code: 1, message: "never answered" }, notify: true },
          { method: "no_such_method" },
          { method: "make", params: { dtype: "u8", shape: [4] } },
          { method: "fail", params: { code: 42, message: "no", data: { k: [1, "two"] } } },
          { method: "inspect", params: { tensor: x } },
        ]);
        check(r.length === 6, `${r.length} results`);
        check(r[0]!.ok && r[0].result === 1, "slow in a batch");
        check(r[1]!.ok && r[1].result instanceof Tensor && r[1].result.equals(t), "echo in a batch");
        check(!r[2]!.ok && r[2].error instanceof MethodNotFoundError && r[2].error.code === -32601, "error in a batch");
        check(r[3]!.ok, "make in a batch failed");
        isPattern(r[3].result, "u8", [4], "make in a batch");
        const f = r[4]!;
        check(!f.ok && f.error instanceof RpcError, "fail in a batch did not fail");
        check(
          f.error.code === 42 && f.error.message === "no" && isDeepStrictEqual(f.error.data, { k: [1, "two"] }),
          `fail in a batch: ${JSON.stringify(f.error)}`,
        );
        check(r[5]!.ok, "inspect in a batch failed");
        checkInfo(r[5].result as TensorInfo, x, "inspect in a batch");
      },
    ],
    [
      "sdk::notifications",
      async (c) => {
        await c.notify("fail", { code: 1, message: "never answered" });
        await c.notify("echo", { tensor: pattern("f32", [1000]) });
        await c.notify("slow", { ms: 1 });
        const who = await c.call<{ kind: string; channel: string; server_pid: number }>("whoami");
        check(who.kind === "pipe" && who.channel === "inline", `whoami: ${JSON.stringify(who)}`);
        check(Number.isInteger(who.server_pid) && who.server_pid > 0, `whoami: ${JSON.stringify(who)}`);
        check((await c.call("slow", { ms: 2 })) === 2, "the answer after notifications");
      },
    ],
    [
      "sdk::error_method_not_found",
      async (c) => {
        const e = await rejection(c.call("no_such_method"));
        check(e instanceof MethodNotFoundError && e.code === -32601, `got ${String(e)}`);
      },
    ],
    [
      "sdk::error_invalid_params",
      async (c) => {
        for (const [method, params, path] of [
          ["make", { dtype: "f33", shape: [1] }, "dtype"],
          ["slow", { ms: "one" }, "ms"],
        ] as const) {
          const e = await rejection(c.call(method, params));
          const what = `${method} ${JSON.stringify(params)}`;
          check(e instanceof InvalidParamsError && e.code === -32602, `${what}: got ${String(e)}`);
          const data = e.data;
          if (data !== null && typeof data === "object" && "path" in data) {
            check(data.path === path, `${what}: data.path ${JSON.stringify(data.path)}, want ${JSON.stringify(path)}`);
          }
        }
        // The connection is fine after them.
        isPattern(await c.call("make", { dtype: "f32", shape: [1] }), "f32", [1], "make after invalid params");
      },
    ],
    [
      "sdk::many_in_flight",
      async (c) => {
        const calls = Array.from({ length: 48 }, (_, i): Promise<unknown> => {
          switch (i % 4) {
            case 0:
              return c.call<number>("slow", { ms: 48 - i });
            case 1:
              return c.call<Tensor>("make", { dtype: "i32", shape: [i + 1] });
            case 2:
              return c.call<Tensor>("echo", { tensor: Tensor.from([i, -i], [2], "f64") });
            default:
              return rejection(c.call("fail", { code: 1000 + i, message: `call ${i}` }));
          }
        });
        const r = await Promise.all(calls);
        r.forEach((v, i) => {
          switch (i % 4) {
            case 0:
              check(v === 48 - i, `call ${i} got ${String(v)}`);
              break;
            case 1:
              isPattern(v, "i32", [i + 1], `call ${i}`);
              break;
            case 2:
              same(v, Tensor.from([i, -i], [2], "f64"), `call ${i}`);
              break;
            default:
              check(
                v instanceof RpcError && v.code === 1000 + i && v.message === `call ${i}`,
                `call ${i} got ${String(v)}`,
              );
          }
        });
      },
    ],
    [
      "sdk::call_timeout",
      async (c) => {
        const t0 = performance.now();
        const e = await rejection(c.call("slow", { ms: 5000 }, { timeoutMs: 100 }));
        const ms = performance.now() - t0;
        check(e instanceof TimeoutError, `got ${String(e)}`);
        check(ms < 2000, `the 100 ms timeout took ${Math.round(ms)} ms`);
        // The connection works, and a late answer is not mistaken for another call's.
        check((await c.call("slow", { ms: 1 })) === 1, "the connection works after a timeout");
        isPattern(await c.call("make", { dtype: "u8", shape: [3] }), "u8", [3], "make after a timeout");
      },
    ],
    [
      "sdk::tasks",
      async (c) => {
        const task = await c.submitTask("make", { dtype: "i16", shape: [10, 10] });
        const t = await c.waitTask<Tensor>(task, { timeoutMs: 10_000 });
        isPattern(t, "i16", [10, 10], "task result");
        const quick = await c.submitTask("slow", { ms: 300 });
        const st0 = await c.taskStatus(quick);
        check(st0.state === "running", `state of a running task: ${st0.state}`);
        check((await c.waitTask<number>(quick, { timeoutMs: 10_000 })) === 300, "slow as a task");
        const slow = await c.submitTask("slow", { ms: 10_000 });
        const st = await c.cancelTask(slow);
        check(st.state === "cancelled", `state ${st.state}`);
        const e = await rejection(c.taskResult(slow));
        check(e instanceof CancelledError, `cancelled task result: ${String(e)}`);
      },
    ],
    [
      "sdk::server_gone_mid_call",
      async () => {
        // A server of its own, killed (SIGKILL) while a call runs.
        const s = await startServer("path", SERVER);
        try {
          const c = await Client.connect(s.addr);
          const held = await c.call<Tensor>("make", { dtype: "f32", shape: [256, 256] });
          const call = rejection(c.call("slow", { ms: 30_000 }));
          await new Promise((r) => setTimeout(r, 100));
          await s.stop(true);
          const e = await within(5000, call, "the call to fail after the kill");
          check(e instanceof ConnectionClosedError, `got ${String(e)}`);
          const after = await within(5000, rejection(c.call("whoami")), "a call after the kill");
          check(after instanceof ConnectionClosedError, `a call after the kill: ${String(after)}`);
          isPattern(held, "f32", [256, 256], "a tensor of the dead server");
          c.close();
        } finally {
          await s.stop(true).catch(() => {});
        }
      },
    ],
  );
  return out;
}

async function main(): Promise<number> {
  const reportPath = resolve(
    process.env["FERRY_CONFORMANCE_REPORT"] ?? join(cargoTargetDir(), "conformance", `${COLUMN}.json`),
  );
  const report = { backend: COLUMN, viable: true, reason: null as string | null, cases: [] as CaseReport[] };
  let server: Server | undefined;
  let client: Client | undefined;
  try {
    if (!SERVER.command) process.env["FERRY_BIN"] = ensureFerry();
    server = await startServer("path", SERVER);
    client = await within(10_000, Client.connect(server.addr), "connect");
  } catch (e) {
    report.viable = false;
    const what = SERVER.command
      ? `the server ($FERRY_CONFORMANCE_SERVER: ${SERVER.command})`
      : "ferry serve --api conformance";
    report.reason = `could not start ${what} and connect: ${(e as Error).message}`;
  }
  const all = cases();
  for (const [name, run] of all) {
    if (!report.viable || !client) {
      report.cases.push({ name, outcome: "ignored", detail: null, ms: 0 });
      continue;
    }
    const t0 = performance.now();
    let detail: string | null = null;
    try {
      if (client.closed) client = await within(10_000, Client.connect(server!.addr), "reconnect");
      await within(CASE_TIMEOUT_MS, run(client), name);
    } catch (e) {
      detail = e instanceof Failed ? e.message : `${(e as Error).name}: ${(e as Error).message}`;
    }
    const ms = Math.round(performance.now() - t0);
    report.cases.push({ name, outcome: detail === null ? "pass" : "fail", detail, ms });
    console.error(`${detail === null ? "pass" : "FAIL"} ${name} (${ms} ms)${detail ? `: ${detail}` : ""}`);
  }
  client?.close();
  await server?.stop().catch(() => {});
  mkdirSync(dirname(reportPath), { recursive: true });
  writeFileSync(reportPath, JSON.stringify(report, null, 2) + "\n");
  console.error(`conformance: wrote ${reportPath}`);
  const failed = report.cases.filter((c) => c.outcome === "fail").length;
  const passed = report.cases.filter((c) => c.outcome === "pass").length;
  console.error(`conformance ${COLUMN}: ${passed} pass, ${failed} fail`);
  return failed ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    console.error(e);
    process.exit(2);
  },
);
