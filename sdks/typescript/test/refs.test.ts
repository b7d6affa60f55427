/**
 * Remote tensor references (PROTOCOL.md §21) against a real `ferry serve` (the demo API): a
 * tensor kept on the server and passed back as a param without its bytes, fetched, listed,
 * published (outliving its connection) and freed; and the generated demo client taking a
 * reference where its params take a tensor.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import * as pkg from "ferry-client";
import { DemoClient } from "ferry-client/generated/demo";

import {
  Client,
  ErrorCode,
  NotFoundError,
  ProtocolError,
  Tensor,
  TensorRef,
  fetch,
  free,
  keep,
  listRefs,
  publish,
} from "../src/index.js";
import { type Server, startServer, within } from "./helpers.js";

const T = 10_000;

let server: Server;
let client: Client;

before(async () => {
  // A server of its own: references belong to the caller's identity (the uid here), so
  // another test file's connections must not show up in `listRefs`.
  server = await startServer("path");
  client = await within(T, Client.connect(server.addr), "connect");
});

after(async () => {
  client?.close();
  await server?.stop();
});

/** Rejects unless `p` rejects with `NotFoundError` (code -32009). */
async function notFound(p: Promise<unknown>, what: string): Promise<void> {
  await assert.rejects(within(T, p, what), (e: unknown) => {
    assert.ok(e instanceof NotFoundError, `${what}: ${String(e)}`);
    assert.equal(e.code, ErrorCode.NOT_FOUND);
    assert.equal(e.code, -32009);
    return true;
  });
}

describe("remote tensor references", () => {
  test("keep, pass by reference, fetch, list, publish, free", async () => {
    const a = Tensor.from([1, 2, 3, 4, 5, 6], [2, 3], "f32");
    const r = await within(T, keep(client, a), "keep");
    assert.ok(r instanceof TensorRef);
    assert.match(r.id, /^r[0-9a-f]{32}$/);
    assert.equal(r.dtype, "f32");
    assert.deepEqual(r.shape, [2, 3]);
    assert.equal(r.device, "cpu");
    assert.equal(r.bytes, 24);
    assert.equal(r.expiresMs, null);
    assert.equal(r.published, false);

    // Where a method takes a tensor, the reference stands for it: no bytes sent.
    assert.equal(await within(T, client.call<number>("sum", { tensor: r }), "sum"), 21);
    const b = Tensor.from([1, 0, 0, 1, 1, 1], [3, 2], "f32");
    const ab = await within(T, client.call<Tensor>("matmul", { a: r, b }), "matmul");
    assert.deepEqual(ab.toNumbers(), [1 + 3, 2 + 3, 4 + 6, 5 + 6]);
    const described = await within(T, client.call<Record<string, { sum: number }>>("describe", { weights: { w: r, b } }), "describe");
    assert.equal(described["w"]!.sum, 21);

    // The bytes come back as they went.
    const back = await within(T, fetch(client, r), "fetch");
    assert.ok(back instanceof Tensor);
    assert.equal(back.dtype, "f32");
    assert.deepEqual(back.shape, [2, 3]);
    assert.ok(back.equals(a));
    assert.deepEqual(Buffer.from(back.bytes()), Buffer.from(a.bytes()));

    const listed = await within(T, listRefs(client), "list");
    assert.deepEqual(
      listed.map((x) => x.id),
      [r.id],
    );
    assert.ok(listed[0] instanceof TensorRef);

    const p = await within(T, publish(client, r), "publish");
    assert.equal(p.id, r.id);
    assert.equal(p.published, true);
    assert.equal((await within(T, listRefs(client), "list"))[0]!.published, true);

    assert.equal(await within(T, free(client, r), "free"), 1);
    assert.equal(await within(T, free(client, r), "free again"), 0, "a freed reference counts 0 and is no error");
    await notFound(fetch(client, r), "fetch after free");
    await notFound(client.call("sum", { tensor: r }), "sum after free");
    assert.deepEqual(await within(T, listRefs(client), "list"), []);
  });

  test("a TTL sets expiresMs, and the reference expires", async () => {
    const before = Date.now();
    const r = await within(T, keep(client, Tensor.from([7], [1], "i32"), { ttlMs: 50 }), "keep with a TTL");
    assert.ok(r.expiresMs !== null && r.expiresMs >= before && r.expiresMs <= Date.now() + 60_000, `${r.expiresMs}`);
    await new Promise((resolve) => setTimeout(resolve, 120));
    await notFound(fetch(client, r), "fetch after the TTL");
    assert.equal(await within(T, free(client, r), "free expired"), 0);
    await assert.rejects(keep(client, Tensor.from([1], [1], "f32"), { ttlMs: Number.NaN }), TypeError);
  });

  test("a published reference outlives its connection; another does not", async () => {
    const other = await within(T, Client.connect(server.addr), "connect");
    const gone = await within(T, keep(other, Tensor.from([1, 1], [2], "u8")), "keep");
    const kept = await within(T, publish(other, await keep(other, Tensor.from([2, 2], [2], "u8"))), "publish");
    assert.ok(kept.published);
    other.close();
    // The server frees the unpublished one once it has seen the close: a bounded wait.
    const deadline = Date.now() + T;
    for (;;) {
      try {
        await within(T, fetch(client, gone), "fetch");
      } catch (e) {
        assert.ok(e instanceof NotFoundError, String(e));
        break;
      }
      assert.ok(Date.now() < deadline, "a reference outlived its connection");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    assert.deepEqual((await within(T, fetch(client, kept), "fetch published")).toNumbers(), [2, 2]);
    assert.equal(await within(T, free(client, kept, gone), "free"), 1);
  });

  test("an unknown reference is NotFoundError", async () => {
    await notFound(fetch(client, new TensorRef(`r${"0".repeat(32)}`, "f32", [1])), "fetch unknown");
    await notFound(publish(client, new TensorRef(`r${"0".repeat(32)}`, "f32", [1])), "publish unknown");
  });

  test("helpers check what the server answers", async () => {
    // A server answering the built-ins with the wrong shape (here: a stand-in client whose
    // every call answers 3) is a ProtocolError, not a wrongly typed value.
    const fake = { call: async () => 3 } as unknown as Client;
    await assert.rejects(keep(fake, Tensor.from([1], [1], "f32")), ProtocolError);
    await assert.rejects(fetch(fake, new TensorRef("r1", "f32", [1])), ProtocolError);
    await assert.rejects(free(fake), ProtocolError);
    await assert.rejects(listRefs(fake), ProtocolError);
  });
});

describe("the generated client takes a reference for a tensor param", () => {
  test("DemoClient.sum / echo / matmul with a TensorRef", async () => {
    // Through the package as it is published (`ferry-client`, dist/), as a user imports the
    // generated client; its params are typed `Tensor | TensorRef`.
    const c = await within(T, pkg.Client.connect(server.addr), "connect");
    try {
      const demo = new DemoClient(c);
      const a = pkg.Tensor.from([1, 2, 3, 4], [2, 2], "f32");
      const r: pkg.TensorRef = await within(T, pkg.keep(c, a), "keep");
      assert.equal(await within(T, demo.sum({ tensor: r }), "sum"), 10);
      const echoed = await within(T, demo.echo({ tensor: r }), "echo");
      assert.ok(echoed.equals(a));
      const sq = await within(T, demo.matmul({ a: r, b: r }), "matmul");
      assert.deepEqual(sq.toNumbers(), [7, 10, 15, 22]);
      assert.equal(await within(T, pkg.free(c, r), "free"), 1);
      await assert.rejects(within(T, demo.sum({ tensor: r }), "sum after free"), (e: unknown) => {
        assert.ok(e instanceof pkg.RpcError && e.code === -32009, String(e));
        return true;
      });
    } finally {
      c.close();
    }
  });
});
