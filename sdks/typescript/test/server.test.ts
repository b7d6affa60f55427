/** The client against a real `ferry serve` (the demo API, cli/src/demo.rs). */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  CancelledError,
  Client,
  ConnectionClosedError,
  DTYPES,
  type DType,
  InvalidParamsError,
  MethodNotFoundError,
  RpcError,
  TaskNotFoundError,
  TaskPendingError,
  Tensor,
  TimeoutError,
  arrayType,
  lanes,
} from "../src/index.js";
import { type Server, startServer, within } from "./helpers.js";

const T = 10_000;

let server: Server;
let client: Client;

before(async () => {
  server = await startServer("path");
  client = await within(T, Client.connect(server.addr), "connect");
});

after(async () => {
  client?.close();
  await server?.stop();
});

/** A tensor of `dtype` with `n` elements holding awkward values (extremes, negatives, NaN bits). */
export function sample(dtype: DType, shape: number[]): Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const data = new (arrayType(dtype))(n * lanes(dtype));
  const bytes = new Uint8Array(data.buffer);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 37 + 11) & 0xff;
  if (dtype === "bool") for (let i = 0; i < n; i++) bytes[i] = i % 3 === 0 ? 1 : 0;
  return new Tensor(dtype, shape, data);
}

describe("tensors", () => {
  for (const dtype of DTYPES) {
    test(`echo ${dtype}`, async () => {
      const t = sample(dtype, [3, 5]);
      const back = await within(T, client.call<Tensor>("echo", { tensor: t }), "echo");
      assert.ok(back instanceof Tensor);
      assert.equal(back.dtype, dtype);
      assert.deepEqual(back.shape, [3, 5]);
      assert.ok(back.data instanceof arrayType(dtype), `${dtype} comes back as ${arrayType(dtype).name}`);
      assert.ok(back.equals(t), `${dtype} bytes differ`);
      assert.equal(back.data.byteOffset % 64, 0, "received tensors are 64-byte aligned in their buffer");
    });
  }

  test("create_tensor of every dtype fills the right values", async () => {
    const expect: Record<DType, number | bigint> = {
      bool: 1,
      u8: 3,
      i8: 3,
      u16: 3,
      i16: 3,
      u32: 3,
      i32: 3,
      u64: 3n,
      i64: 3n,
      f16: 0x4200, // 3.0 as f16 bits
      bf16: 0x4040, // 3.0 as bf16 bits
      f32: 3,
      f64: 3,
      f8e4m3fn: 0x44, // 3.0 as f8e4m3fn bits
      f8e5m2: 0x42, // 3.0 as f8e5m2 bits
      c64: 3, // (3 + 0i: the real parts; the imaginary ones are 0)
      c128: 3,
    };
    for (const dtype of DTYPES) {
      const t = await within(T, client.call<Tensor>("create_tensor", { shape: [2, 2], dtype, fill: 3 }), "create");
      assert.equal(t.dtype, dtype);
      const one = lanes(dtype) === 2 ? [expect[dtype], 0] : [expect[dtype]];
      assert.deepEqual(Array.from(t.data as ArrayLike<number | bigint>), new Array(4).fill(one).flat(), dtype);
      const nums = lanes(dtype) === 2 ? [3, 0, 3, 0, 3, 0, 3, 0] : [3, 3, 3, 3];
      if (dtype !== "bool") assert.deepEqual(t.toNumbers(), nums);
    }
  });

  test("sum sees the values sent (f16, bf16, i64, float8)", async () => {
    assert.equal(await client.call("sum", { tensor: Tensor.from([1.5, 2.25, -1], [3], "f16") }), 2.75);
    assert.equal(await client.call("sum", { tensor: Tensor.from([1.5, 2.5], [2], "bf16") }), 4);
    assert.equal(await client.call("sum", { tensor: Tensor.from([-5n, 7n], [2], "i64") }), 2);
    // 17 rounds to 16 in e4m3fn (a tie: even); 448 is its largest finite value.
    assert.equal(await client.call("sum", { tensor: Tensor.from([17, 448], [2], "f8e4m3fn") }), 464);
    assert.equal(await client.call("sum", { tensor: Tensor.from([1.5, -0.25], [2], "f8e5m2") }), 1.25);
  });

  test("complex tensors: interleaved real and imaginary parts, both ways", async () => {
    const t = Tensor.from([1, 2, -3.5, 0.25], [2], "c64");
    assert.ok(t.data instanceof Float32Array && t.data.length === 4);
    const back = await within(T, client.call<Tensor>("echo", { tensor: t }), "echo c64");
    assert.equal(back.dtype, "c64");
    assert.deepEqual(back.toNumbers(), [1, 2, -3.5, 0.25]);
    const z = await within(T, client.call<Tensor>("create_tensor", { shape: [3], dtype: "c128", fill: -2 }), "c128");
    assert.ok(z.data instanceof Float64Array);
    assert.deepEqual([...z.data], [-2, 0, -2, 0, -2, 0]);
    await assert.rejects(client.call("sum", { tensor: t }), InvalidParamsError); // (a complex sum is no f64)
  });

  test("empty and 0-d tensors", async () => {
    for (const shape of [[0], [3, 0], [0, 0, 7]]) {
      const t = Tensor.zeros("f32", shape);
      const back = await within(T, client.call<Tensor>("echo", { tensor: t }), "echo empty");
      assert.deepEqual(back.shape, shape);
      assert.equal(back.data.length, 0);
    }
    const s = await within(T, client.call<Tensor>("echo", { tensor: Tensor.scalar(2.5) }), "echo scalar");
    assert.deepEqual(s.shape, []);
    assert.equal(s.data[0], 2.5);
  });

  test("a large tensor: f32[1920,1080,3] (24.9 MB) round trip", async () => {
    const t = Tensor.zeros("f32", [1920, 1080, 3]);
    for (let i = 0; i < t.data.length; i += 997) t.data[i] = i;
    const back = await within(30_000, client.call<Tensor>("echo", { tensor: t }), "echo large");
    assert.deepEqual(back.shape, [1920, 1080, 3]);
    assert.ok(back.equals(t));
  });

  test("several tensors in one call, and matmul", async () => {
    const a = Tensor.from(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    const b = Tensor.from(new Float32Array([1, 0, 0, 1, 1, 1]), [3, 2]);
    const c = await within(T, client.call<Tensor>("matmul", { a, b }), "matmul");
    assert.deepEqual([...c.data], [4, 5, 10, 11]);
    // The same tensor twice is one tensor in the message, two refs.
    const d = await within(T, client.call<Tensor>("matmul", [Tensor.from(new Float32Array([2]), [1, 1]), Tensor.from(new Float32Array([3]), [1, 1])]), "pos");
    assert.equal(d.data[0], 6);
  });
});

describe("named tensor maps", () => {
  test("weights returns a map of tensors", async () => {
    const w = await within(T, client.call<Record<string, Tensor>>("weights"), "weights");
    assert.deepEqual(Object.keys(w).sort(), ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]);
    assert.deepEqual(w["fc1.weight"]!.shape, [4, 8]);
    assert.ok(w["fc2.bias"] instanceof Tensor);
  });

  test("describe takes a map and round trips it", async () => {
    const w = await within(T, client.call<Record<string, Tensor>>("weights"), "weights");
    const d = await within(T, client.call<Record<string, { dtype: string; shape: number[]; sum: number }>>("describe", { weights: w }), "describe");
    assert.deepEqual(Object.keys(d).sort(), Object.keys(w).sort());
    for (const [name, t] of Object.entries(w)) {
      assert.deepEqual(d[name]!.shape, t.shape);
      const sum = t.toNumbers().reduce((a, b) => a + b, 0);
      assert.ok(Math.abs(d[name]!.sum - sum) < 1e-4, name);
    }
    const mine = { "layer.0": Tensor.from([1, 2, 3], [3], "f64"), "layer.1": Tensor.from([1n, 2n], [2], "u64") };
    const d2 = await within(T, client.call<Record<string, { sum: number; dtype: string }>>("describe", { weights: mine }), "describe mine");
    assert.equal(d2["layer.0"]!.sum, 6);
    assert.equal(d2["layer.1"]!.dtype, "u64");
  });
});

describe("errors", () => {
  test("method not found", async () => {
    await assert.rejects(within(T, client.call("no_such_method"), "call"), (e: unknown) => {
      assert.ok(e instanceof MethodNotFoundError);
      assert.ok(e instanceof RpcError);
      assert.equal(e.code, -32601);
      return true;
    });
  });

  test("invalid params, with data.path", async () => {
    await assert.rejects(within(T, client.call("add", { a: "x", b: 1 }), "call"), (e: unknown) => {
      assert.ok(e instanceof InvalidParamsError);
      assert.equal(e.code, -32602);
      return true;
    });
    await assert.rejects(within(T, client.call("matmul", { a: Tensor.zeros("f32", [2, 3]), b: Tensor.zeros("f32", [2, 3]) }), "call"), (e: unknown) => {
      assert.ok(e instanceof InvalidParamsError);
      assert.equal((e.data as { path: string }).path, "b");
      return true;
    });
  });

  test("reserved names; a batch of one", async () => {
    await assert.rejects(within(T, client.call("rpc.nope"), "call"), RpcError);
    const [r] = await within(T, client.batch([{ method: "add", params: { a: 1, b: 2 } }]), "batch");
    assert.deepEqual(r, { ok: true, result: 3 });
  });

  test("bad params are refused before sending", async () => {
    await assert.rejects(client.call("echo", { t: new Float32Array(2) }), /wrapped in a Tensor/);
    await assert.rejects(client.call("add", 5), /params must be an object/);
    assert.equal(client.inFlight, 0);
  });

  test("the connection still works after errors", async () => {
    assert.equal(await within(T, client.call("add", { a: 2, b: 3 }), "add"), 5);
  });
});

describe("concurrency", () => {
  test("many calls in flight, answered out of order, matched by id", async () => {
    const calls: Promise<unknown>[] = [];
    for (let i = 0; i < 60; i++) {
      if (i % 3 === 0) calls.push(client.call("sleep", { ms: 60 - i }));
      else if (i % 3 === 1) calls.push(client.call("add", [i, 1]));
      else calls.push(client.call<Tensor>("echo", { tensor: Tensor.from(new Int32Array([i, -i]), [2]) }));
    }
    const results = await within(T, Promise.all(calls), "60 calls");
    results.forEach((r, i) => {
      if (i % 3 === 0) assert.equal(r, 60 - i);
      else if (i % 3 === 1) assert.equal(r, i + 1);
      else assert.deepEqual([...(r as Tensor).data], [i, -i]);
    });
    assert.equal(client.inFlight, 0);
  });

  test("batch: calls, a notification and an error in one message, tensors across the batch", async () => {
    const t1 = Tensor.from(new Float32Array([1, 2]), [2]);
    const t2 = Tensor.from(new Uint8Array([7, 8, 9]), [3]);
    const r = await within(
      T,
      client.batch([
        { method: "echo", params: { tensor: t1 } },
        { method: "add", params: { a: 1, b: 2 } },
        { method: "sleep", params: { ms: 1 }, notify: true },
        { method: "nope" },
        { method: "echo", params: { tensor: t2 } },
        { method: "weights" },
      ]),
      "batch",
    );
    assert.equal(r.length, 5);
    assert.ok(r[0]!.ok && (r[0].result as Tensor).equals(t1));
    assert.deepEqual(r[1], { ok: true, result: 3 });
    assert.ok(!r[2]!.ok && r[2].error instanceof MethodNotFoundError);
    assert.ok(r[3]!.ok && (r[3].result as Tensor).equals(t2));
    assert.ok(r[4]!.ok && (r[4].result as Record<string, Tensor>)["fc1.weight"] instanceof Tensor);
    const none = await within(T, client.batch([{ method: "add", params: [1, 1], notify: true }]), "notify batch");
    assert.deepEqual(none, []);
  });

  test("notify", async () => {
    await within(T, client.notify("add", [1, 2]), "notify");
    assert.equal(await within(T, client.call("add", [1, 2]), "add"), 3);
  });
});

describe("timeouts and cancellation", () => {
  test("a call timeout rejects with TimeoutError and cancels the call on the server", async () => {
    const t0 = Date.now();
    await assert.rejects(within(T, client.call("sleep", { ms: 5000 }, { timeoutMs: 100 }), "call"), TimeoutError);
    assert.ok(Date.now() - t0 < 2000);
    assert.equal(client.inFlight, 0);
    assert.equal(await within(T, client.call("add", [1, 1]), "add"), 2);
  });

  test("an AbortSignal rejects the call", async () => {
    const ac = new AbortController();
    const p = client.call("sleep", { ms: 5000 }, { signal: ac.signal });
    setTimeout(() => ac.abort(new Error("stop")), 50);
    await assert.rejects(within(T, p, "call"), /stop/);
  });

  test("ferry.cancel by id gives CancelledError", async () => {
    // Ids are assigned in order: the next call gets the next id.
    const p = client.call("sleep", { ms: 5000 });
    const id = (client as unknown as { nextId: number }).nextId - 1;
    await new Promise((r) => setTimeout(r, 50));
    await client.notify("ferry.cancel", { id });
    await assert.rejects(within(T, p, "call"), CancelledError);
  });
});

describe("tasks", () => {
  test("submit, status, result", async () => {
    const task = await within(T, client.submitTask("sleep", { ms: 200 }), "submit");
    assert.match(task, /^t/);
    const st = await within(T, client.taskStatus(task), "status");
    assert.equal(st.state, "running");
    await assert.rejects(within(T, client.taskResult(task, { waitMs: 0 }), "result"), TaskPendingError);
    assert.equal(await within(T, client.waitTask<number>(task, { pollMs: 100, timeoutMs: 5000 }), "wait"), 200);
    await assert.rejects(within(T, client.taskResult(task), "gone"), TaskNotFoundError);
  });

  test("a task returning tensors", async () => {
    const task = await within(T, client.submitTask("create_tensor", { shape: [3], dtype: "i16", fill: -2 }), "submit");
    const t = await within(T, client.waitTask<Tensor>(task, { timeoutMs: 5000 }), "wait");
    assert.deepEqual([...t.data], [-2, -2, -2]);
  });

  test("cancel a task", async () => {
    const task = await within(T, client.submitTask("sleep", { ms: 10_000 }), "submit");
    const st = await within(T, client.cancelTask(task), "cancel");
    assert.equal(st.state, "cancelled");
    await assert.rejects(within(T, client.taskResult(task, { waitMs: 1000 }), "result"), CancelledError);
  });
});

describe("connection", () => {
  test("discover and whoami", async () => {
    const doc = await within(T, client.discover(), "discover");
    assert.match(String(doc["openrpc"]), /^1\.3/);
    const methods = (doc["methods"] as { name: string }[]).map((m) => m.name);
    assert.ok(methods.includes("echo"));
    const who = await within(T, client.call<{ kind: string; channel: string; pid: number }>("whoami"), "whoami");
    assert.equal(who.channel, "inline");
    assert.equal(who.pid, process.pid);
  });

  test("an abstract address (unix:NAME)", async () => {
    const s = await startServer("abstract");
    try {
      const c = await within(T, Client.connect(s.addr), "connect abstract");
      assert.equal(await within(T, c.call("add", [20, 22]), "add"), 42);
      c.close();
    } finally {
      await s.stop();
    }
  });

  test("the server killed mid-call: ConnectionClosedError for every call in flight, and after", async () => {
    const s = await startServer("path");
    const c = await within(T, Client.connect(s.addr), "connect");
    const calls = [c.call("sleep", { ms: 10_000 }), c.call("sleep", { ms: 10_000 }), c.batch([{ method: "sleep", params: { ms: 10_000 } }])];
    const outcomes = calls.map((p) => p.then(() => null, (e: unknown) => e));
    await new Promise((r) => setTimeout(r, 100));
    const t0 = Date.now();
    await s.stop(true); // SIGKILL
    for (const e of await within(T, Promise.all(outcomes), "calls after kill")) {
      assert.ok(e instanceof ConnectionClosedError, `expected ConnectionClosedError, got ${String(e)}`);
    }
    assert.ok(Date.now() - t0 < 3000, "the error comes promptly");
    assert.ok(c.closed);
    await assert.rejects(c.call("add", [1, 2]), ConnectionClosedError);
  });

  test("close() rejects calls in flight and later calls", async () => {
    const c = await within(T, Client.connect(server.addr), "connect");
    const p = c.call("sleep", { ms: 5000 });
    c.close();
    await assert.rejects(within(T, p, "call"), ConnectionClosedError);
    await assert.rejects(c.call("add", [1, 2]), ConnectionClosedError);
  });
});
