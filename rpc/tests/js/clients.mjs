// Third-party tools against `ferry serve`: @open-rpc/client-js (npm) over HTTP and over the
// unix socket (newline-delimited JSON, its StreamTransport), and the OpenRPC document from
// rpc.discover validated against the OpenRPC meta-schema by @open-rpc/schema-utils-js.
//
// Run by ferry/tests/external_clients.rs (through `cargo xtask ci`) as
// `node clients.mjs unix:NAME http://HOST:PORT/`. Prints one line per check and a closing
// 'N passed, N failed' line; exits non-zero on any failure.

import net from "node:net";
import { Duplex } from "node:stream";
import assert from "node:assert/strict";
import {
  Client,
  RequestManager,
  HTTPTransport,
  StreamTransport,
  NewlineDelimitedMessageFramer,
} from "@open-rpc/client-js";
import schemaUtils from "@open-rpc/schema-utils-js";

const { validateOpenRPCDocument, parseOpenRPCDocument, MethodCallValidator } = schemaUtils;
const [addr, url] = process.argv.slice(2);

function httpClient() {
  return new Client(new RequestManager([new HTTPTransport(url)]));
}

function socketClient() {
  const name = addr.slice("unix:".length);
  const path = name.includes("/") ? name : "\0" + name;
  let socket;
  const transport = new StreamTransport({
    provider: () => {
      socket = net.createConnection({ path });
      const { readable, writable } = Duplex.toWeb(socket);
      return { readable, writable, dispose: () => socket.destroy() };
    },
    framer: new NewlineDelimitedMessageFramer(),
  });
  return new Client(new RequestManager([transport]));
}

async function expectError(promise, code) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.code, code, `expected error ${code}, got ${e.code}: ${e.message}`);
    return e;
  }
  assert.fail(`expected error ${code}, got a result`);
}

const checks = [];
const check = (name, fn) => checks.push([name, fn]);
const both = (name, fn) => {
  check(`${name}[http]`, () => fn(httpClient()));
  check(`${name}[socket]`, () => fn(socketClient()));
};

both("calls", async (c) => {
  assert.equal(await c.request({ method: "add", params: [1, 2] }), 3);
  assert.equal(await c.request({ method: "add", params: { a: 1.5, b: 1 } }), 2.5);
  const t = await c.request({ method: "create_tensor", params: { shape: [2], dtype: "f32", fill: 2 } });
  assert.deepEqual(t.$tensor.shape, [2]);
  const f = new Float32Array(Uint8Array.from(Buffer.from(t.$tensor.data, "base64")).buffer);
  assert.deepEqual(Array.from(f), [2, 2]);
  const sum = await c.request({ method: "sum", params: { tensor: t } });
  assert.equal(sum, 4);
});

both("errors", async (c) => {
  await expectError(c.request({ method: "nope", params: [] }), -32601);
  const e = await expectError(c.request({ method: "add", params: { a: "x", b: 1 } }), -32602);
  assert.equal(e.data.path, "a");
});

check("openrpc document is valid", async () => {
  const doc = await httpClient().request({ method: "rpc.discover" });
  const valid = validateOpenRPCDocument(doc);
  if (valid !== true) {
    assert.fail(`invalid OpenRPC document: ${valid.message ?? JSON.stringify(valid)}`);
  }
  assert.equal(doc.openrpc, "1.3.2");
  const names = doc.methods.map((m) => m.name);
  for (const m of ["add", "echo", "create_tensor", "sum", "matmul", "sleep", "weights", "ferry.task.submit"]) {
    assert.ok(names.includes(m), `${m} missing from ${names}`);
  }
  assert.ok(Array.isArray(doc["x-ferry-errors"]));
});

check("openrpc schemas check params", async () => {
  const doc = await httpClient().request({ method: "rpc.discover" });
  // Resolves every $ref (components/schemas) and validates calls against the schemas.
  const deref = await parseOpenRPCDocument(doc);
  const v = new MethodCallValidator(deref);
  assert.deepEqual(v.validate("add", [1, 2]), []);
  assert.deepEqual(v.validate("add", { a: 1, b: 2 }), []);
  const tensor = { $tensor: { dtype: "f32", shape: [2], data: "AACAPwAAAEA=" } };
  assert.deepEqual(v.validate("sum", { tensor }), []);
  assert.deepEqual(v.validate("sum", { tensor: { $tensor: 0 } }), []);
  assert.notDeepEqual(v.validate("add", { a: "x", b: 2 }), []);
  assert.notDeepEqual(v.validate("sum", { tensor: { $tensor: { dtype: "f99", shape: [], data: "" } } }), []);
});

let passed = 0;
let failed = 0;
for (const [name, fn] of checks) {
  try {
    await fn();
    console.log(`ok      ${name}`);
    passed++;
  } catch (e) {
    console.log(`FAILED  ${name}: ${e.stack ?? e}`);
    failed++;
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
