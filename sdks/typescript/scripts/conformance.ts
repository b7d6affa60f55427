/**
 * `npm run conformance`: the cross-language SDK scenario against a real `ferry serve`,
 * written as a conformance report for `cargo xtask conformance` (column `typescript-sdk`):
 *
 * ```json
 * {"backend":"typescript-sdk","viable":true,"reason":null,
 *  "cases":[{"name":"sdk::dtype_f32","outcome":"pass","detail":null,"ms":3}]}
 * ```
 *
 * The report goes to `$FERRY_CONFORMANCE_REPORT` (default
 * `../../target/conformance/typescript-sdk.json`). The server is `$FERRY_BIN`, or a release
 * build made here. Exits 1 if a case failed.
 *
 * The scenario (the same case names in every SDK): every dtype echoed (`sdk::dtype_*`),
 * empty and 0-d tensors, the 24.9 MB f32[1920,1080,3] tensor, named maps in results and
 * params, a batch, method-not-found and invalid-params errors, many calls in flight, a
 * client-side call timeout, tasks (result and cancel), and the server killed mid-call.
 */

import { mkdirSync, writeFileSync } from "node:fs";
import { dirname, resolve } from "node:path";

import {
  CancelledError,
  Client,
  ConnectionClosedError,
  DTYPES,
  type DType,
  InvalidParamsError,
  MethodNotFoundError,
  Tensor,
  TimeoutError,
  arrayType,
} from "../src/index.js";
import { REPO_ROOT, type Server, ensureFerry, startServer, within } from "../test/helpers.js";

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

function sample(dtype: DType, shape: number[]): Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const data = new (arrayType(dtype))(n);
  const bytes = new Uint8Array(data.buffer);
  for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 37 + 11) & 0xff;
  if (dtype === "bool") for (let i = 0; i < n; i++) bytes[i] = i % 3 === 0 ? 1 : 0;
  return new Tensor(dtype, shape, data);
}

type Case = [name: string, run: (c: Client) => Promise<void>];

function cases(): Case[] {
  const out: Case[] = [];
  for (const dtype of DTYPES) {
    out.push([
      `sdk::dtype_${dtype}`,
      async (c) => {
        const t = sample(dtype, [4, 3]);
        const back = await c.call<Tensor>("echo", { tensor: t });
        check(back instanceof Tensor && back.dtype === dtype, `echo returned ${String(back)}`);
        check(back.equals(t), "the echoed elements differ");
        check(back.data instanceof arrayType(dtype), `not a ${arrayType(dtype).name}`);
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
      },
    ],
    [
      "sdk::large_tensor",
      async (c) => {
        const t = Tensor.zeros("f32", [1920, 1080, 3]);
        for (let i = 0; i < t.data.length; i += 1009) t.data[i] = i;
        const back = await c.call<Tensor>("echo", { tensor: t });
        check(back.equals(t), "the 24.9 MB tensor came back different");
      },
    ],
    [
      "sdk::named_map_result",
      async (c) => {
        const w = await c.call<Record<string, Tensor>>("weights");
        check(Object.keys(w).sort().join() === "fc1.bias,fc1.weight,fc2.bias,fc2.weight", `keys ${Object.keys(w)}`);
        check(w["fc1.weight"] instanceof Tensor && w["fc1.weight"].shape.join() === "4,8", "fc1.weight [4,8]");
      },
    ],
    [
      "sdk::named_map_params",
      async (c) => {
        const weights = { a: Tensor.from([1, 2, 3], [3], "f64"), b: Tensor.from([1.5, 2.5], [2], "bf16") };
        const d = await c.call<Record<string, { sum: number; shape: number[] }>>("describe", { weights });
        check(d["a"]?.sum === 6 && d["b"]?.sum === 4, `describe returned ${JSON.stringify(d)}`);
      },
    ],
    [
      "sdk::batch",
      async (c) => {
        const t = sample("u16", [5]);
        const r = await c.batch([
          { method: "add", params: { a: 1, b: 2 } },
          { method: "echo", params: { tensor: t } },
          { method: "add", params: [0, 0], notify: true },
          { method: "no_such_method" },
        ]);
        check(r.length === 3, `${r.length} results`);
        check(r[0]!.ok && r[0].result === 3, "add in a batch");
        check(r[1]!.ok && (r[1].result as Tensor).equals(t), "echo in a batch");
        check(!r[2]!.ok && r[2].error instanceof MethodNotFoundError, "error in a batch");
      },
    ],
    [
      "sdk::error_method_not_found",
      async (c) => {
        const e = await c.call("no_such_method").then(() => null, (x: unknown) => x);
        check(e instanceof MethodNotFoundError && e.code === -32601, `got ${String(e)}`);
      },
    ],
    [
      "sdk::error_invalid_params",
      async (c) => {
        const e = await c.call("add", { a: "one", b: 2 }).then(() => null, (x: unknown) => x);
        check(e instanceof InvalidParamsError && e.code === -32602, `got ${String(e)}`);
      },
    ],
    [
      "sdk::many_in_flight",
      async (c) => {
        const calls = Array.from({ length: 48 }, (_, i) =>
          i % 2 ? c.call<number>("sleep", { ms: 48 - i }) : c.call<number>("add", [i, 1000]),
        );
        const r = await Promise.all(calls);
        r.forEach((v, i) => check(v === (i % 2 ? 48 - i : i + 1000), `call ${i} got ${v}`));
      },
    ],
    [
      "sdk::call_timeout",
      async (c) => {
        const e = await c.call("sleep", { ms: 5000 }, { timeoutMs: 100 }).then(() => null, (x: unknown) => x);
        check(e instanceof TimeoutError, `got ${String(e)}`);
        check((await c.call("add", [1, 1])) === 2, "the connection works after a timeout");
      },
    ],
    [
      "sdk::tasks",
      async (c) => {
        const task = await c.submitTask("create_tensor", { shape: [2], dtype: "f32", fill: 5 });
        const t = await c.waitTask<Tensor>(task, { timeoutMs: 10_000 });
        check(t instanceof Tensor && t.data[0] === 5, `task result ${String(t)}`);
        const slow = await c.submitTask("sleep", { ms: 10_000 });
        const st = await c.cancelTask(slow);
        check(st.state === "cancelled", `state ${st.state}`);
        const e = await c.taskResult(slow).then(() => null, (x: unknown) => x);
        check(e instanceof CancelledError, `cancelled task result: ${String(e)}`);
      },
    ],
    [
      "sdk::server_gone_mid_call",
      async () => {
        // A server of its own, killed (SIGKILL) while a call runs.
        const s = await startServer("path");
        const c = await Client.connect(s.addr);
        const call = c.call("sleep", { ms: 30_000 }).then(() => null, (x: unknown) => x);
        await new Promise((r) => setTimeout(r, 100));
        await s.stop(true);
        const e = await within(5000, call, "the call to fail after the kill");
        check(e instanceof ConnectionClosedError, `got ${String(e)}`);
      },
    ],
  );
  return out;
}

async function main(): Promise<number> {
  const reportPath = resolve(process.env["FERRY_CONFORMANCE_REPORT"] ?? resolve(REPO_ROOT, "target/conformance/typescript-sdk.json"));
  const report = { backend: "typescript-sdk", viable: true, reason: null as string | null, cases: [] as CaseReport[] };
  let server: Server | undefined;
  let client: Client | undefined;
  try {
    process.env["FERRY_BIN"] = ensureFerry();
    server = await startServer("path");
    client = await within(10_000, Client.connect(server.addr), "connect");
  } catch (e) {
    report.viable = false;
    report.reason = `could not start ferry serve and connect: ${(e as Error).message}`;
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
  console.error(`conformance typescript-sdk: ${passed} pass, ${failed} fail`);
  return failed ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    console.error(e);
    process.exit(2);
  },
);
