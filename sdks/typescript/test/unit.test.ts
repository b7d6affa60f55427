/** Unit tests without a server: dtypes, Tensor, frame encoding/decoding and validation. */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  DTYPES,
  LimitError,
  ProtocolError,
  Tensor,
  bf16ToNumber,
  f16ToNumber,
  f8e4m3fnToNumber,
  f8e5m2ToNumber,
  itemSize,
  lanes,
  numberToBf16,
  numberToF16,
  numberToF8e4m3fn,
  numberToF8e5m2,
  parseAddress,
} from "../src/index.js";
import {
  CLIENT_LIMITS,
  DEFAULT_LIMITS,
  type Frame,
  FrameReader,
  Kind,
  PREAMBLE,
  decodeMessage,
  encodeHead,
  encodeMessage,
  validateMeta,
} from "../src/frame.js";
import { TensorRef, decodeRefs, encodeRefs } from "../src/refs.js";

/** The MESSAGE of PROTOCOL.md §14, step 5 (151 bytes). */
const HEX_EXAMPLE =
  "04 00 00 00 7f 00 00 00 08 00 00 00 00 00 00 00" +
  " 7b 22 68 65 61 64 65 72 22 3a 7b 22 6f 70 22 3a 22 65 63 68 6f 22 7d 2c 22 74 65 6e 73 6f 72 73" +
  " 22 3a 5b 7b 22 6d 65 74 61 22 3a 7b 22 64 74 79 70 65 22 3a 22 66 33 32 22 2c 22 73 68 61 70 65" +
  " 22 3a 5b 32 5d 2c 22 64 65 76 69 63 65 22 3a 22 63 70 75 22 7d 2c 22 64 61 74 61 22 3a 7b 22 69" +
  " 6e 6c 69 6e 65 22 3a 7b 22 6f 66 66 73 65 74 22 3a 30 2c 22 6c 65 6e 22 3a 38 7d 7d 7d 5d 7d 00" +
  " 00 80 3f 00 00 00 40";

function hex(s: string): Buffer {
  return Buffer.from(s.replace(/\s+/g, ""), "hex");
}

function frameBytes(kind: number, header: unknown, payload: Uint8Array = new Uint8Array(0)): Buffer {
  return Buffer.concat([encodeHead(kind as 1, JSON.stringify(header), payload.length), payload]);
}

/** Feeds `bytes` to a fresh reader (after a valid preamble), in chunks of `chunk` bytes. */
function readAll(bytes: Uint8Array, chunk = bytes.length || 1, limits = CLIENT_LIMITS): Frame[] {
  const frames: Frame[] = [];
  const r = new FrameReader(limits, (f) => frames.push(f));
  const all = Buffer.concat([PREAMBLE, bytes]);
  for (let i = 0; i < all.length; i += chunk) r.push(all.subarray(i, i + chunk));
  return frames;
}

function protocolError(fn: () => unknown, re: RegExp, code: "protocol_error" | "limit" = "protocol_error"): void {
  assert.throws(fn, (e: unknown) => {
    assert.ok(e instanceof ProtocolError, `expected ProtocolError, got ${String(e)}`);
    assert.match(e.message, re);
    assert.equal(e.closeCode, code);
    return true;
  });
}

describe("dtype", () => {
  test("f16 bits round trip and known values", () => {
    assert.equal(numberToF16(1.5), 0x3e00);
    assert.equal(numberToF16(-2), 0xc000);
    assert.equal(numberToF16(65504), 0x7bff);
    assert.equal(numberToF16(1e6), 0x7c00);
    assert.equal(numberToF16(2 ** -24), 0x0001);
    assert.ok(Number.isNaN(f16ToNumber(numberToF16(NaN))));
    for (let bits = 0; bits < 0x10000; bits += 7) {
      const x = f16ToNumber(bits);
      if (!Number.isNaN(x)) assert.equal(numberToF16(x), bits, `bits ${bits.toString(16)}`);
    }
  });

  test("bf16 bits round trip and known values", () => {
    assert.equal(numberToBf16(1.5), 0x3fc0);
    assert.equal(bf16ToNumber(0x3fc0), 1.5);
    assert.equal(numberToBf16(-1), 0xbf80);
    for (let bits = 0; bits < 0x10000; bits += 13) {
      const x = bf16ToNumber(bits);
      if (!Number.isNaN(x)) assert.equal(numberToBf16(x), bits);
    }
  });

  test("item sizes", () => {
    assert.deepEqual(
      DTYPES.map(itemSize),
      [1, 1, 1, 2, 2, 4, 4, 8, 8, 2, 2, 4, 8, 1, 1, 8, 16],
    );
    assert.deepEqual(DTYPES.slice(-4), ["f8e4m3fn", "f8e5m2", "c64", "c128"]);
    assert.deepEqual(DTYPES.map(lanes).slice(-4), [1, 1, 2, 2]);
  });

  test("float8 bits: known values, rounding, overflow, every pattern round trips", () => {
    assert.equal(f8e4m3fnToNumber(0x38), 1);
    assert.equal(f8e4m3fnToNumber(0x7e), 448);
    assert.equal(f8e4m3fnToNumber(0x01), 2 ** -9);
    assert.ok(Number.isNaN(f8e4m3fnToNumber(0x7f)) && Number.isNaN(f8e4m3fnToNumber(0xff)));
    assert.equal(f8e5m2ToNumber(0x3c), 1);
    assert.equal(f8e5m2ToNumber(0x7b), 57344);
    assert.equal(f8e5m2ToNumber(0xfc), -Infinity);
    assert.equal(numberToF8e4m3fn(17), 0x58); // 16 or 18: a tie, even (16)
    assert.equal(numberToF8e4m3fn(1.0625), 0x38); // 1 or 1.125: even (1)
    assert.equal(numberToF8e4m3fn(1.1875), 0x3a); // 1.125 or 1.25: even (1.25)
    assert.equal(numberToF8e4m3fn(464), 0x7e); // 448 or (480): even, 448
    assert.equal(numberToF8e4m3fn(465), 0x7f); // past: NaN, e4m3fn has no infinity
    assert.equal(numberToF8e4m3fn(-Infinity), 0xff);
    assert.equal(numberToF8e4m3fn(2 ** -10), 0x00); // half the smallest subnormal: even
    assert.equal(numberToF8e4m3fn(-0), 0x80);
    assert.equal(numberToF8e5m2(61440), 0x7c); // 57344 or 65536 (infinity): even
    assert.equal(numberToF8e5m2(61439), 0x7b);
    assert.equal(numberToF8e5m2(1.125), 0x3c);
    assert.equal(numberToF8e5m2(NaN), 0x7e);
    for (let b = 0; b < 256; b++) {
      const x = f8e4m3fnToNumber(b);
      if (!Number.isNaN(x)) assert.equal(numberToF8e4m3fn(x), b, `e4m3fn ${b}`);
      const y = f8e5m2ToNumber(b);
      if (!Number.isNaN(y)) assert.equal(numberToF8e5m2(y), b, `e5m2 ${b}`);
    }
  });
});

describe("Tensor", () => {
  test("float8 and complex tensors", () => {
    const f = Tensor.from([1.5, -2, 1000], [3], "f8e4m3fn");
    assert.ok(f.data instanceof Uint8Array);
    assert.deepEqual([...f.data], [0x3c, 0xc0, 0x7f]);
    assert.deepEqual(f.toNumbers().slice(0, 2), [1.5, -2]);
    assert.ok(Number.isNaN(f.toNumbers()[2]));
    assert.deepEqual(Tensor.from(new Uint8Array([0x3c, 0x7c]), [2], "f8e5m2").toNumbers(), [1, Infinity]);
    // Complex: two numbers per element, real then imaginary.
    const c = Tensor.from([1, 2, 3, 4, 5, 6], undefined, "c128");
    assert.deepEqual(c.shape, [3]);
    assert.equal(c.numel, 3);
    assert.equal(c.nbytes, 48);
    assert.throws(() => Tensor.from([1, 2, 3], undefined, "c64"), RangeError);
    assert.throws(() => new Tensor("c64", [2], new Float32Array(2)), RangeError);
    assert.deepEqual([...Tensor.scalar(2.5, "c64").data], [2.5, 0]);
    assert.equal(Tensor.zeros("c64", [2, 3]).data.length, 12);
    // Strided: the transpose of [[1+1i, 2+2i, 3+3i], [4+4i, 5+5i, 6+6i]].
    const data = new Float32Array([1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]);
    const t = new Tensor("c64", [3, 2], data, [1, 3]);
    assert.deepEqual(t.contiguous().toNumbers(), [1, 1, 4, 4, 2, 2, 5, 5, 3, 3, 6, 6]);
    assert.throws(() => new Tensor("c64", [3, 2], data.subarray(0, 10), [1, 3]), RangeError);
  });

  test("from typed arrays, plain arrays, and conversions", () => {
    const a = Tensor.from(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    assert.equal(a.dtype, "f32");
    assert.deepEqual(a.shape, [2, 3]);
    assert.equal(a.numel, 6);
    assert.equal(Tensor.from([1n, -2n]).dtype, "i64");
    assert.ok(Tensor.from([1n, 2n], [2], "u64").data instanceof BigUint64Array);
    assert.deepEqual([...Tensor.from([true, false], [2]).data], [1, 0]);
    const h = Tensor.from([1.5, -2], [2], "f16");
    assert.deepEqual([...h.data], [0x3e00, 0xc000]);
    assert.deepEqual(h.toNumbers(), [1.5, -2]);
    assert.deepEqual(Tensor.from([1.5], [1], "bf16").toNumbers(), [1.5]);
    assert.deepEqual(Tensor.scalar(3).shape, []);
    assert.equal(Tensor.zeros("i8", [0, 5]).numel, 0);
  });

  test("rejects wrong arrays and shapes", () => {
    assert.throws(() => new Tensor("f32", [2], new Float64Array(2) as unknown as Float32Array), /needs a Float32Array/);
    assert.throws(() => Tensor.from(new Float32Array(5), [2, 3]), /needs 6 elements/);
    assert.throws(() => Tensor.from(new Float32Array(1), [-1]), /integers >= 0/);
    assert.throws(() => new Tensor("nope" as "f32", [1], new Float32Array(1)), /unknown dtype/);
  });

  test("strided tensors and contiguous()", () => {
    // A [3,2] transpose view of a row-major [2,3].
    const t = new Tensor("i32", [3, 2], new Int32Array([1, 2, 3, 4, 5, 6]), [1, 3]);
    assert.equal(t.isContiguous, false);
    assert.deepEqual([...t.contiguous().data], [1, 4, 2, 5, 3, 6]);
  });
});

describe("encoding", () => {
  test("matches the worked hex example of PROTOCOL.md §14", () => {
    const m = encodeMessage({ op: "echo" }, [Tensor.from(new Float32Array([1, 2]), [2])], DEFAULT_LIMITS);
    const bytes = Buffer.concat([m.head, ...m.chunks]);
    assert.equal(bytes.length, 151);
    assert.deepEqual(bytes, hex(HEX_EXAMPLE));
  });

  test("tensors at 64-byte aligned offsets, zero padding, payload ends at the last tensor's end", () => {
    const m = encodeMessage(
      null,
      [Tensor.from(new Uint8Array([1, 2, 3]), [3]), Tensor.from(new Float32Array([1, 2]), [2]), Tensor.zeros("f64", [0])],
      DEFAULT_LIMITS,
    );
    const payload = Buffer.concat(m.chunks);
    // The empty tensor still gets an aligned offset (as in core's Outgoing::push_payload).
    assert.equal(m.payloadLen, 128);
    assert.equal(payload.length, 128);
    assert.deepEqual([...payload.subarray(0, 3)], [1, 2, 3]);
    assert.ok(payload.subarray(3, 64).every((b) => b === 0));
    const header = JSON.parse(m.head.subarray(16).toString()) as { tensors: { data: { inline: { offset: number } } }[] };
    assert.deepEqual(
      header.tensors.map((t) => t.data.inline.offset),
      [0, 64, 128],
    );
  });

  test("refuses messages over the server's limits", () => {
    const small = { ...DEFAULT_LIMITS, max_payload_bytes: 10, max_tensors: 1 };
    assert.throws(() => encodeMessage(null, [Tensor.zeros("u8", [11])], small), LimitError);
    assert.throws(() => encodeMessage(null, [Tensor.zeros("u8", [1]), Tensor.zeros("u8", [1])], small), LimitError);
  });

  test("refs: tensors out, refs in; the same tensor once; typed arrays refused", () => {
    const a = Tensor.from(new Float32Array([1]), [1]);
    const b = Tensor.from(new Int32Array([2]), [1]);
    const out: Tensor[] = [];
    const wire = encodeRefs({ x: a, list: [b, a], map: { w: b }, n: 1, s: "t", skip: undefined }, out);
    assert.deepEqual(wire, { x: { $tensor: 0 }, list: [{ $tensor: 1 }, { $tensor: 0 }], map: { w: { $tensor: 1 } }, n: 1, s: "t" });
    assert.equal(out.length, 2);
    const back = decodeRefs(JSON.parse(JSON.stringify(wire)), out) as Record<string, unknown>;
    assert.equal(back["x"], a);
    assert.throws(() => encodeRefs({ x: new Float32Array(1) }, []), /wrapped in a Tensor/);
    const cyc: Record<string, unknown> = {};
    cyc["self"] = cyc;
    assert.throws(() => encodeRefs(cyc, []), /cycle/);
    assert.throws(() => decodeRefs({ $tensor: 2 }, out), ProtocolError);
    const inline = decodeRefs({ $tensor: { dtype: "f32", shape: [2], data: "AACAPwAAAEA=" } }, []) as Tensor;
    assert.deepEqual([...inline.data], [1, 2]);
  });

  test("remote tensor references: TensorRef in, {$tensor_ref: {id}} out; schemas left alone", () => {
    const id = "r" + "0a".repeat(16);
    const wire = { $tensor_ref: { id, dtype: "f32", shape: [3], device: "cpu", bytes: 12, expires_ms: null, published: false } };
    const r = decodeRefs({ x: [wire] }, []) as { x: TensorRef[] };
    assert.ok(r.x[0] instanceof TensorRef);
    assert.deepEqual([r.x[0].id, r.x[0].dtype, [...r.x[0].shape], r.x[0].bytes], [id, "f32", [3], 12]);
    assert.deepEqual(encodeRefs({ tensor: r.x[0] }, []), { tensor: { $tensor_ref: { id } } });
    const schema = { properties: { $tensor_ref: { type: "object" } } };
    assert.deepEqual(decodeRefs(structuredClone(schema), []), schema);
    assert.throws(() => decodeRefs({ $tensor_ref: { id, shape: "x" } }, []), ProtocolError);
  });
});

describe("receiving", () => {
  test("frames split at every byte boundary", () => {
    const t = Tensor.from(new Float64Array([1.25, -3]), [2]);
    const m = encodeMessage({ id: 1 }, [Tensor.from(new Uint8Array([9]), [1]), t], DEFAULT_LIMITS);
    const bytes = Buffer.concat([m.head, ...m.chunks, frameBytes(Kind.CLOSE, { code: "normal", message: "" })]);
    for (const chunk of [1, 3, 16, 17, 64, bytes.length]) {
      const frames = readAll(bytes, chunk);
      assert.equal(frames.length, 2);
      assert.equal(frames[0]!.payload.byteOffset, 0, "the payload has its own ArrayBuffer");
      const msg = decodeMessage(frames[0]!.header, frames[0]!.payload, 10);
      assert.deepEqual(msg.header, { id: 1 });
      assert.deepEqual([...msg.tensors[1]!.data], [1.25, -3]);
      assert.equal(frames[1]!.kind, Kind.CLOSE);
    }
  });

  test("direct reads into the payload buffer", () => {
    const big = new Uint8Array(200_000).map((_, i) => i % 251);
    const m = encodeMessage(null, [Tensor.from(big, [big.length])], DEFAULT_LIMITS);
    const bytes = Buffer.concat([PREAMBLE, m.head, ...m.chunks]);
    const frames: Frame[] = [];
    const r = new FrameReader(CLIENT_LIMITS, (f) => frames.push(f));
    let off = 0;
    let direct = 0;
    while (off < bytes.length) {
      const buf = r.nextBuffer();
      const n = Math.min(buf.length, bytes.length - off, 5000);
      buf.set(bytes.subarray(off, off + n));
      if (buf.byteLength !== 64 * 1024) direct++; // not the scratch buffer: a view of the payload
      r.consumed(n, buf);
      off += n;
    }
    assert.ok(direct > 10, `expected direct reads, got ${direct}`);
    const msg = decodeMessage(frames[0]!.header, frames[0]!.payload, 10);
    assert.deepEqual(msg.tensors[0]!.data, big);
  });

  test("prefix checks before anything is read", () => {
    const prefix = (kind: number, flags: number, fds: number, hlen: number, plen: bigint): Buffer => {
      const b = Buffer.alloc(16);
      b.writeUInt8(kind, 0);
      b.writeUInt8(flags, 1);
      b.writeUInt16LE(fds, 2);
      b.writeUInt32LE(hlen, 4);
      b.writeBigUInt64LE(plen, 8);
      return b;
    };
    protocolError(() => readAll(prefix(9, 0, 0, 2, 0n)), /unexpected frame kind 9/);
    protocolError(() => readAll(prefix(4, 1, 0, 2, 0n)), /flags 0x01/);
    protocolError(() => readAll(prefix(4, 0, 1, 2, 0n)), /file descriptors/, "limit");
    protocolError(() => readAll(prefix(4, 0, 0, 0xffffffff, 0n)), /max_header_bytes/, "limit");
    protocolError(() => readAll(prefix(4, 0, 0, 2, (1n << 64n) - 1n)), /max_payload_bytes/, "limit");
    protocolError(() => readAll(Buffer.concat([prefix(4, 0, 0, 2, 0n), Buffer.from("{x")])), /malformed frame header/);
    protocolError(() => readAll(Buffer.concat([prefix(4, 0, 0, 2, 0n), Buffer.from([0xff, 0xfe])])), /UTF-8/);
    const r = new FrameReader(CLIENT_LIMITS, () => {});
    protocolError(() => r.push(Buffer.from("{\"jsonrpc\"")), /not a ferry peer/);
  });

  test("descriptor validation (PROTOCOL.md §7.2)", () => {
    const payload = new Uint8Array(new ArrayBuffer(128));
    const msg = (meta: unknown, data: unknown = { inline: { offset: 0, len: 8 } }): unknown => ({
      header: null,
      tensors: [{ meta, data }],
    });
    const f32 = (shape: unknown, extra: object = {}): object => ({ dtype: "f32", shape, device: "cpu", ...extra });
    const bad = (body: unknown, re: RegExp, code: "protocol_error" | "limit" = "protocol_error"): void =>
      protocolError(() => decodeMessage(body, payload, 4), re, code);
    bad({ tensors: [] }, /needs a `header` field/);
    bad(msg({ dtype: "f8", shape: [2] }), /tensor 0: unknown dtype "f8"/);
    bad(msg(f32([3])), /needs 12 bytes, the descriptor has 8/);
    bad(msg(f32([2]), { inline: { offset: 121, len: 8 } }), /outside the payload/);
    bad(msg(f32([2]), { inline: { offset: 2 ** 53, len: 8 } }), /above 2\^53/);
    bad(msg(f32([2]), { shm: { segment: 1, offset: 0, len: 8, lease: 1 } }), /unexpected location "shm"/);
    bad(msg(f32([2]), { inline: { offset: 0, len: 8 }, shm: {} }), /exactly one key/);
    bad(msg(f32([2], { device: "cuda:0" })), /only cpu tensors/);
    bad(msg(f32([2 ** 32, 2 ** 32, 2])), /overflows 64 bits/);
    bad(msg(f32([2 ** 31, 2 ** 31, 2 ** 2])), /overflows 64 bits/);
    bad(msg(f32([2, 1], { strides: [-1, 1] })), /negative strides/);
    bad(msg(f32([2, 1], { strides: [1] })), /1 strides for 2 dimensions/);
    bad(msg(f32([2 ** 40, 2 ** 40], { strides: [2 ** 40, 2 ** 40] })), /overflows 64 bits/);
    bad(msg(f32(new Array(65).fill(1))), /too many dimensions/);
    bad(msg(f32([1.5])), /unsigned integer/);
    bad({ header: null, tensors: new Array(5).fill({}) }, /max_tensors = 4/, "limit");
    // Valid: zero strides (broadcast) over 4 bytes; an empty tensor; a huge dim with a zero.
    const ok = decodeMessage(
      {
        header: 1,
        tensors: [
          { meta: f32([1000], { strides: [0] }), data: { inline: { offset: 0, len: 4 } } },
          { meta: f32([0, 2 ** 50]), data: { inline: { offset: 64, len: 0 } } },
        ],
      },
      payload,
      4,
    );
    assert.equal(ok.tensors[0]!.data.length, 1);
    assert.equal(ok.tensors[1]!.numel, 0);
    assert.throws(() => validateMeta(f32([2]), 7), ProtocolError);
  });

  test("an unaligned offset from a non-ferry sender is copied, not misviewed", () => {
    const payload = new Uint8Array(new ArrayBuffer(16));
    new DataView(payload.buffer).setFloat64(3, 2.5, true);
    const m = decodeMessage(
      { header: null, tensors: [{ meta: { dtype: "f64", shape: [1] }, data: { inline: { offset: 3, len: 8 } } }] },
      payload,
      4,
    );
    assert.equal(m.tensors[0]!.data[0], 2.5);
  });
});

describe("addresses", () => {
  test("unix:NAME and unix:/path", () => {
    assert.deepEqual(parseAddress("unix:demo"), { kind: "abstract", name: "demo" });
    assert.deepEqual(parseAddress("unix:/tmp/x.sock"), { kind: "path", path: "/tmp/x.sock" });
    assert.deepEqual(parseAddress("unix:./x.sock"), { kind: "path", path: "./x.sock" });
    assert.throws(() => parseAddress("tcp:1"), /unsupported address/);
    assert.throws(() => parseAddress("unix:"), /empty/);
    assert.throws(() => parseAddress("unix:a\0b"), /NUL/);
    assert.throws(() => parseAddress(`unix:${"x".repeat(101)}`), /at most 100/);
  });
});
