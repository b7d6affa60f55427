/**
 * The client against a fake server that breaks the protocol: every violation must end in a
 * typed error (and a CLOSE frame naming it), never a hang or a crash.
 */

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";

import { Client, ConnectionClosedError, LimitError, ProtocolError, RefusedError, Tensor, TimeoutError } from "../src/index.js";
import { Kind, PREAMBLE, encodeHead } from "../src/frame.js";
import { within } from "./helpers.js";

const dir = mkdtempSync(join(tmpdir(), "ferry-ts-fake-"));
after(() => rmSync(dir, { recursive: true, force: true }));
let n = 0;

function frame(kind: number, header: unknown, payload: Uint8Array = new Uint8Array(0)): Buffer {
  return Buffer.concat([encodeHead(kind as 1, JSON.stringify(header), payload.length), payload]);
}

const WELCOME = { version: 1, channels: { cpu: "inline" }, limits: {}, agent: "fake/0" };

interface Fake {
  addr: string;
  /** Everything the client sent after its HELLO. */
  received: () => Buffer;
  hello: Promise<Record<string, unknown>>;
  close: () => Promise<void>;
}

/**
 * A server that answers the handshake by writing `reply(hello)` (raw bytes, preamble
 * included) and then runs `after(socket, clientBytesSoFar)` each time the client writes.
 */
async function fake(
  reply: (hello: Record<string, unknown>) => Buffer,
  onData?: (sock: net.Socket, sent: Buffer) => void,
): Promise<Fake> {
  const path = join(dir, `s${++n}.sock`);
  let received = Buffer.alloc(0);
  let resolveHello!: (h: Record<string, unknown>) => void;
  const hello = new Promise<Record<string, unknown>>((r) => (resolveHello = r));
  const sockets = new Set<net.Socket>();
  const server = net.createServer((sock) => {
    sockets.add(sock);
    let buf = Buffer.alloc(0);
    let greeted = false;
    sock.on("error", () => {});
    sock.on("data", (d: Buffer) => {
      if (greeted) {
        received = Buffer.concat([received, d]);
        onData?.(sock, received);
        return;
      }
      buf = Buffer.concat([buf, d]);
      if (buf.length < 24) return;
      const hlen = buf.readUInt32LE(8 + 4);
      if (buf.length < 24 + hlen) return;
      greeted = true;
      const h = JSON.parse(buf.subarray(24, 24 + hlen).toString()) as Record<string, unknown>;
      received = buf.subarray(24 + hlen);
      resolveHello(h);
      sock.write(reply(h));
      if (received.length) onData?.(sock, received);
    });
  });
  await new Promise<void>((r) => server.listen(path, r));
  return {
    addr: `unix:${path}`,
    received: () => received,
    hello,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

/** Connects, runs one call, and returns the error it ends with. */
async function callError(f: Fake, method = "x"): Promise<unknown> {
  const c = await within(5000, Client.connect(f.addr, { timeoutMs: 3000 }), "connect");
  try {
    await within(5000, c.call(method, {}), "call");
    return null;
  } catch (e) {
    return e;
  } finally {
    c.close();
  }
}

/** Parses the frames the client sent (after HELLO). */
function framesOf(b: Buffer): { kind: number; header: unknown }[] {
  const out = [];
  let off = 0;
  while (off + 16 <= b.length) {
    const hlen = b.readUInt32LE(off + 4);
    const plen = Number(b.readBigUInt64LE(off + 8));
    if (off + 16 + hlen + plen > b.length) break;
    out.push({ kind: b[off]!, header: JSON.parse(b.subarray(off + 16, off + 16 + hlen).toString()) as unknown });
    off += 16 + hlen + plen;
  }
  return out;
}

/** After the handshake, answers the first request with `bytes`. */
function answerWith(bytes: (id: number) => Buffer): (sock: net.Socket, sent: Buffer) => void {
  let done = false;
  return (sock, sent) => {
    const frames = framesOf(sent);
    if (done || frames.length === 0) return;
    done = true;
    const req = (frames[0]!.header as { header: { id: number } }).header;
    sock.write(bytes(req.id));
  };
}

async function sleep(ms: number): Promise<void> {
  await new Promise((r) => setTimeout(r, ms));
}

describe("handshake", () => {
  test("HELLO offers inline only, announces limits and no fds", async () => {
    const f = await fake(() => Buffer.concat([PREAMBLE, frame(Kind.WELCOME, WELCOME)]));
    const c = await within(5000, Client.connect(f.addr), "connect");
    const hello = await within(5000, f.hello, "hello");
    assert.deepEqual(hello["channels"], [{ name: "inline", devices: ["cpu"], domain: {} }]);
    assert.equal(hello["protocol"], "ferry");
    assert.equal(hello["version"], 1);
    assert.equal((hello["limits"] as { max_fds: number }).max_fds, 0);
    c.close();
    await f.close();
  });

  test("REFUSE becomes RefusedError", async () => {
    const f = await fake(() => Buffer.concat([PREAMBLE, frame(Kind.REFUSE, { reason: "version_mismatch", server: 1, client: 2 })]));
    await assert.rejects(within(5000, Client.connect(f.addr), "connect"), (e: unknown) => {
      assert.ok(e instanceof RefusedError);
      assert.equal(e.refusal.reason, "version_mismatch");
      return true;
    });
    await f.close();
  });

  test("a WELCOME choosing a channel that was not offered is a ProtocolError", async () => {
    const f = await fake(() => Buffer.concat([PREAMBLE, frame(Kind.WELCOME, { ...WELCOME, channels: { cpu: "shm" } })]));
    await assert.rejects(within(5000, Client.connect(f.addr), "connect"), ProtocolError);
    await f.close();
  });

  test("not a ferry server", async () => {
    const f = await fake(() => Buffer.from("HTTP/1.1 400 Bad Request\r\n\r\n"));
    await assert.rejects(within(5000, Client.connect(f.addr), "connect"), /not a ferry peer/);
    await f.close();
  });

  test("a server that never answers: TimeoutError", async () => {
    const f = await fake(() => Buffer.alloc(0));
    await assert.rejects(within(5000, Client.connect(f.addr, { timeoutMs: 200 }), "connect"), TimeoutError);
    await f.close();
  });

  test("nobody listening: ConnectionClosedError", async () => {
    await assert.rejects(within(5000, Client.connect(`unix:${join(dir, "nobody.sock")}`), "connect"), ConnectionClosedError);
  });
});

describe("after the handshake", () => {
  const welcome = (): Buffer => Buffer.concat([PREAMBLE, frame(Kind.WELCOME, WELCOME)]);

  const cases: [string, (id: number) => Buffer, RegExp, string][] = [
    [
      "a header over max_header_bytes",
      () => {
        const b = Buffer.alloc(16);
        b.writeUInt8(Kind.MESSAGE, 0);
        b.writeUInt32LE(0xfffffff0, 4);
        return b;
      },
      /max_header_bytes/,
      "limit",
    ],
    [
      "a payload over max_payload_bytes",
      () => {
        const b = Buffer.alloc(16);
        b.writeUInt8(Kind.MESSAGE, 0);
        b.writeUInt32LE(2, 4);
        b.writeBigUInt64LE(1n << 62n, 8);
        return b;
      },
      /max_payload_bytes/,
      "limit",
    ],
    ["an unknown frame kind", () => Buffer.from([42, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]), /kind 42/, "protocol_error"],
    ["a second WELCOME", () => frame(Kind.WELCOME, WELCOME), /after the handshake/, "protocol_error"],
    ["a CONTROL frame", () => frame(Kind.CONTROL, { channel: "shm", body: {} }), /control frame/, "protocol_error"],
    [
      "a tensor range outside the payload",
      (id) =>
        frame(
          Kind.MESSAGE,
          {
            header: { jsonrpc: "2.0", id, result: { $tensor: 0 } },
            tensors: [{ meta: { dtype: "f32", shape: [4], device: "cpu" }, data: { inline: { offset: 8, len: 16 } } }],
          },
          new Uint8Array(16),
        ),
      /tensor 0: bytes 8\.\.24 are outside/,
      "protocol_error",
    ],
    [
      "a size that overflows 64 bits",
      (id) =>
        frame(Kind.MESSAGE, {
          header: { jsonrpc: "2.0", id, result: null },
          tensors: [{ meta: { dtype: "f64", shape: [2 ** 40, 2 ** 40], device: "cpu" }, data: { inline: { offset: 0, len: 0 } } }],
        }),
      /overflows 64 bits/,
      "protocol_error",
    ],
    [
      "an unknown dtype",
      (id) =>
        frame(Kind.MESSAGE, {
          header: { jsonrpc: "2.0", id, result: null },
          tensors: [{ meta: { dtype: "f128", shape: [1] }, data: { inline: { offset: 0, len: 0 } } }],
        }),
      /unknown dtype/,
      "protocol_error",
    ],
  ];

  for (const [name, bytes, re, code] of cases) {
    test(`${name}: ProtocolError, CLOSE ${code} sent, calls fail`, async () => {
      const f = await fake(welcome, answerWith(bytes));
      const e = await callError(f);
      assert.ok(e instanceof ProtocolError, `expected ProtocolError, got ${String(e)}`);
      assert.match(e.message, re);
      await sleep(50);
      const close = framesOf(f.received()).find((fr) => fr.kind === Kind.CLOSE);
      assert.ok(close, "the client sends CLOSE");
      assert.equal((close.header as { code: string }).code, code);
      await f.close();
    });
  }

  test("a bad tensor reference fails that call only", async () => {
    const f = await fake(welcome, (sock, sent) => {
      for (const fr of framesOf(sent)) {
        const req = (fr.header as { header: { id: number; method: string } }).header;
        const result = req.method === "bad" ? { $tensor: 3 } : 1;
        sock.write(frame(Kind.MESSAGE, { header: { jsonrpc: "2.0", id: req.id, result } }));
      }
    });
    const c = await within(5000, Client.connect(f.addr), "connect");
    await assert.rejects(within(5000, c.call("bad"), "call"), /not one of the message's 0 tensors/);
    c.close();
    await f.close();
  });

  test("CLOSE from the server: ConnectionClosedError with its code", async () => {
    const f = await fake(welcome, answerWith(() => frame(Kind.CLOSE, { code: "limit", message: "too much" })));
    const e = await callError(f);
    assert.ok(e instanceof ConnectionClosedError, String(e));
    assert.equal(e.closeCode, "limit");
    assert.equal(e.closeMessage, "too much");
    await f.close();
  });

  test("end of stream in the middle of a frame", async () => {
    const f = await fake(welcome, (sock, sent) => {
      if (framesOf(sent).length) sock.end(Buffer.from([4, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x7b]));
    });
    const e = await callError(f);
    assert.ok(e instanceof ConnectionClosedError, String(e));
    assert.match(e.message, /middle of a frame/);
    await f.close();
  });

  test("LimitError before sending anything over the server's limits", async () => {
    const f = await fake(() =>
      Buffer.concat([PREAMBLE, frame(Kind.WELCOME, { ...WELCOME, limits: { max_payload_bytes: 100, max_tensors: 2 } })]),
    );
    const c = await within(5000, Client.connect(f.addr), "connect");
    await assert.rejects(within(5000, c.call("echo", { t: Tensor.zeros("u8", [101]) }), "call"), LimitError);
    assert.equal(c.inFlight, 0);
    await sleep(20);
    assert.equal(framesOf(f.received()).length, 0, "nothing was sent");
    c.close();
    await f.close();
  });
});
