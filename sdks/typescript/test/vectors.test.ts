/**
 * The shared test vectors (`conformance/vectors/*.json`, written from the Rust implementation
 * by `cargo xtask codegen`), read with this package's own implementation: frames through
 * `FrameReader`, MESSAGE frames through `decodeMessage`, WELCOME and REFUSE through
 * `acceptWelcome`, error objects through `errorFromCode`; and the frames written back with
 * `encodeHead`. The Rust tests (`conformance/tests/vectors.rs`) read the same files.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import * as ferry from "ferry-client";
import * as demo from "ferry-client/generated/demo";

import { acceptWelcome } from "../src/connection.js";
import { ProtocolError, RefusedError, RpcError } from "../src/errors.js";
import { DEFAULT_LIMITS, type Frame, FrameReader, type KindNumber, type Limits, PREAMBLE, decodeMessage, encodeHead } from "../src/frame.js";
import * as runtime from "../src/index.js";
import { ERRORS, errorFromCode } from "../src/rpc_errors.js";
import { REPO_ROOT } from "./helpers.js";

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Json = any;

function load(name: string): Json {
  return JSON.parse(readFileSync(join(REPO_ROOT, "conformance/vectors", name), "utf8"));
}

const unhex = (s: string): Buffer => Buffer.from(s, "hex");
const hex = (b: Uint8Array): string => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString("hex");

/** The frames a reader with `limits` makes of a preamble and then `bytes`. Throws what it throws. */
function readFrames(bytes: Buffer, limits: Limits = DEFAULT_LIMITS, preamble = true): Frame[] {
  const frames: Frame[] = [];
  const reader = new FrameReader(limits, (f) => frames.push(f));
  if (preamble) reader.push(PREAMBLE);
  reader.push(bytes);
  return frames;
}

/** Asserts that `f` throws a `ProtocolError` matching the vector's `{kind, contains}`. */
function assertError(name: string, f: () => unknown, want: Json): void {
  assert.throws(f, (e: unknown) => {
    assert.ok(e instanceof ProtocolError, `${name}: ${String(e)}`);
    assert.equal(e.closeCode, want.kind, `${name}: ${e.message}`);
    if (want.contains !== undefined) assert.ok(e.message.includes(want.contains), `${name}: ${e.message} lacks ${want.contains}`);
    return true;
  });
}

function limitsOf(v: Json): Limits {
  return v.limits ? { ...DEFAULT_LIMITS, ...v.limits } : DEFAULT_LIMITS;
}

describe("frames.json", () => {
  const v = load("frames.json");

  test("preambles", () => {
    for (const p of v.preambles) {
      const read = () => readFrames(unhex(p.hex), DEFAULT_LIMITS, false);
      if (p.error) assertError(p.name, read, p.error);
      else assert.deepEqual(read(), [], p.name);
    }
  });

  test("every frame decodes to its meaning and encodes to its bytes", () => {
    const kinds = new Set<number>();
    for (const f of v.frames) {
      const frames = readFrames(unhex(f.hex));
      assert.equal(frames.length, 1, f.name);
      const got = frames[0]!;
      kinds.add(got.kind);
      assert.equal(got.kind, f.kind, f.name);
      assert.deepEqual(got.header, f.header, f.name);
      assert.equal(hex(got.payload), f.payload_hex, f.name);
      const head = encodeHead(f.kind as KindNumber, JSON.stringify(got.header), got.payload.length);
      assert.equal(hex(Buffer.concat([head, got.payload])), f.hex, `${f.name}: written back`);
    }
    assert.equal(kinds.size, 6, "a frame of every kind");
  });

  test("malformed frames are refused with the expected error", () => {
    for (const f of v.malformed) assertError(f.name, () => readFrames(unhex(f.hex), limitsOf(f)), f.error);
  });
});

describe("messages.json", () => {
  const v = load("messages.json");
  const decode = (m: Json) => {
    const limits = limitsOf(m);
    const [f] = readFrames(unhex(m.hex), limits);
    return decodeMessage(f!.header, f!.payload, limits.max_tensors);
  };

  test("MESSAGE frames decode to their header and tensors", () => {
    for (const m of v.messages) {
      const got = decode(m);
      assert.deepEqual(got.header, m.header, m.name);
      assert.equal(got.tensors.length, m.tensors.length, m.name);
      m.tensors.forEach((want: Json, i: number) => {
        const t = got.tensors[i]!;
        assert.equal(t.dtype, want.dtype, `${m.name} ${i}`);
        assert.deepEqual(t.shape, want.shape, `${m.name} ${i}`);
        assert.deepEqual(t.strides, want.strides, `${m.name} ${i}`);
        assert.equal(hex(t.bytes()), want.data_hex, `${m.name} ${i}`);
      });
    }
  });

  test("malformed MESSAGE frames are refused", () => {
    for (const m of v.malformed) assertError(m.name, () => decode(m), m.error);
  });
});

describe("descriptors.json", () => {
  const v = load("descriptors.json");
  /** A MESSAGE holding one descriptor (text), over a zero payload long enough for it. */
  const decodeOne = (desc: string, payloadLen = 0) =>
    decodeMessage(JSON.parse(`{"header":null,"tensors":[${desc}]}`), new Uint8Array(payloadLen), 16);

  test("inline descriptors read; others are refused on an inline connection; compact is never agreed", () => {
    for (const d of v.descriptors) {
      if ("inline" in d.location) {
        const { offset, len } = d.location.inline;
        const [t] = decodeOne(d.object_json, offset + len).tensors;
        assert.equal(t!.dtype, d.meta.dtype, d.name);
        assert.deepEqual(t!.shape, d.meta.shape, d.name);
        assert.deepEqual(t!.strides, d.meta.strides, d.name);
      } else {
        assert.throws(() => decodeOne(d.object_json, 1 << 16), ProtocolError, d.name);
      }
      // This client never offers compact_tensors, so a peer never sends it the array.
      if (d.compact_json !== null) assert.throws(() => decodeOne(d.compact_json, 1 << 16), ProtocolError, d.name);
    }
  });

  test("malformed descriptors are refused", () => {
    for (const d of v.malformed) assert.throws(() => decodeOne(d.json, 16), ProtocolError, d.name);
  });
});

describe("handshake.json", () => {
  const v = load("handshake.json");
  const frame = (kind: KindNumber, json: string): Frame => ({ kind, header: JSON.parse(json), payload: new Uint8Array(0) });

  test("WELCOMEs are accepted or refused as the Rust client does", () => {
    for (const w of v.welcomes) {
      assert.deepEqual(w.offered, ["inline"]);
      const accept = () => acceptWelcome(frame(2, w.welcome_json));
      if (w.error) assertError(w.name, accept, w.error);
      else assert.deepEqual(accept().limits, w.peer_limits, w.name);
    }
  });

  test("REFUSE bodies give a RefusedError with their reason", () => {
    for (const r of v.refusals) {
      assert.throws(
        () => acceptWelcome(frame(3, r.json)),
        (e: unknown) => e instanceof RefusedError && e.refusal.reason === r.reason,
        r.name,
      );
    }
  });
});

describe("errors.json", () => {
  const v = load("errors.json");

  test("error objects become the class of their code, and write back as they came", () => {
    for (const e of v.errors) {
      const obj = JSON.parse(e.json);
      const err = errorFromCode(obj.code, obj.message, obj.data);
      assert.ok(err instanceof RpcError, e.name);
      assert.equal(err.constructor.name, e.class, e.name);
      assert.equal(JSON.stringify(err.toJSON()), e.json, e.name);
      // A generated client's module throws the very classes of the runtime it imports (the
      // installed package, `ferry-client`: dist/, not this test's build of src/).
      const viaDemo = demo.errorFromCode(obj.code, obj.message, obj.data);
      assert.equal(viaDemo.constructor, ferry.errorFromCode(obj.code, obj.message, obj.data).constructor, e.name);
      assert.ok(viaDemo instanceof ferry.RpcError, e.name);
      assert.equal(viaDemo.constructor.name, e.class, e.name);
    }
  });

  test("one class per code, named as in every SDK, none shadowing the runtime's TimeoutError", () => {
    const table = v.table as Record<string, { name: string; class: string }>;
    assert.equal(ERRORS.size, Object.keys(table).length);
    for (const [code, row] of Object.entries(table)) {
      const cls = ERRORS.get(Number(code))!;
      assert.equal(cls.name, row.class, code);
      assert.equal((runtime as Json)[row.class], cls, `${row.class} is exported by the runtime`);
      assert.equal((runtime.ErrorCode as Json)[row.name], Number(code));
    }
    assert.equal(table["-32003"]!.class, "ServerTimeoutError");
    assert.equal((demo as Json).TimeoutError, undefined, "the generated module declares no TimeoutError");
    assert.ok(!(new runtime.ServerTimeoutError(-32003, "t") instanceof runtime.TimeoutError));
  });
});

describe("worked_example.json (PROTOCOL.md §14)", () => {
  test("every step reads, and every frame writes back to the same bytes", () => {
    for (const s of load("worked_example.json").steps) {
      const bytes = unhex(s.hex);
      assert.equal(bytes.length, s.len);
      if (s.what === "preamble") {
        assert.ok(bytes.equals(PREAMBLE), `step ${s.step}`);
        continue;
      }
      const [f] = readFrames(bytes);
      const head = encodeHead(f!.kind, JSON.stringify(f!.header), f!.payload.length);
      assert.equal(hex(Buffer.concat([head, f!.payload])), s.hex, `step ${s.step}`);
    }
  });
});
