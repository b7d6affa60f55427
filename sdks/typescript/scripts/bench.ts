/**
 * `npm run bench [-- --iters N --big-iters N]`: JSON-RPC calls from TypeScript to
 * `ferry serve` (a second process) over the inline channel, one JSON line per row with the
 * keys of `ferry bench --json` (`backend`, `channel`, `case`, `tensor`, `bytes`, `iters`,
 * `p50_us`, `p99_us`, `min_us`, `gbps`, plus `calls_per_s`):
 *
 * - `call-tensor` f32[1920,1080,3]: `echo` of the 24.9 MB tensor; GB/s counts both directions.
 * - `call-64B` u8[64]: `echo` of a 64-byte tensor (the small round trip).
 * - `call-add`: `add`, no tensor.
 *
 * The server is `$FERRY_BIN`, or a release build made here.
 */

import { Client, Tensor } from "../src/index.js";
import { ensureFerry, startServer, within } from "../test/helpers.js";

function arg(name: string, dflt: number): number {
  const i = process.argv.indexOf(name);
  if (i < 0) return dflt;
  const v = Number(process.argv[i + 1]);
  if (!Number.isInteger(v) || v <= 0) throw new Error(`${name} needs a positive integer`);
  return v;
}

function pick(sorted: number[], q: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.round((sorted.length - 1) * q))]!;
}

async function measure(
  name: string,
  tensor: string,
  bytes: number,
  factor: number,
  warmup: number,
  iters: number,
  once: () => Promise<void>,
): Promise<void> {
  for (let i = 0; i < warmup; i++) await once();
  const times: number[] = [];
  const wall0 = performance.now();
  for (let i = 0; i < iters; i++) {
    const t0 = performance.now();
    await once();
    times.push((performance.now() - t0) * 1000);
  }
  const wall = (performance.now() - wall0) / 1000;
  times.sort((a, b) => a - b);
  const p50 = pick(times, 0.5);
  const row = {
    backend: "typescript-sdk",
    channel: "inline",
    case: name,
    tensor,
    bytes,
    iters,
    p50_us: round(p50),
    p99_us: round(pick(times, 0.99)),
    min_us: round(times[0] ?? 0),
    gbps: p50 > 0 ? round((factor * bytes) / (p50 * 1e-6) / 1e9, 3) : 0,
    calls_per_s: round(iters / wall),
  };
  console.log(JSON.stringify(row));
}

function round(x: number, digits = 1): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

async function main(): Promise<void> {
  const iters = arg("--iters", 2000);
  const bigIters = arg("--big-iters", 50);
  process.env["FERRY_BIN"] = ensureFerry();
  const server = await startServer("path");
  try {
    const client = await within(10_000, Client.connect(server.addr), "connect");
    console.error(`ferry serve at ${server.addr}; node ${process.version}; channel ${client.welcome.channels["cpu"]}`);

    const big = Tensor.zeros("f32", [1920, 1080, 3]);
    for (let i = 0; i < big.data.length; i++) big.data[i] = i & 0xffff;
    let check = true;
    await measure("call-tensor", "f32[1920,1080,3]", big.nbytes, 2, 3, bigIters, async () => {
      const back = await client.call<Tensor>("echo", { tensor: big });
      if (check) {
        if (!back.equals(big)) throw new Error("the echoed tensor differs");
        check = false;
      }
    });

    const small = Tensor.from(new Uint8Array(64).map((_, i) => i), [64]);
    await measure("call-64B", "u8[64]", 64, 2, 200, iters, async () => {
      await client.call<Tensor>("echo", { tensor: small });
    });

    await measure("call-add", "-", 0, 2, 200, iters, async () => {
      await client.call<number>("add", { a: 1, b: 2 });
    });
    client.close();
  } finally {
    await server.stop();
  }
}

main().then(
  () => process.exit(0),
  (e: unknown) => {
    console.error(e);
    process.exit(1);
  },
);
