/**
 * Test helpers: a real `ferry serve` child process on a unique address, and timeouts for
 * every await.
 */

import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (this file is build/test/helpers.js or build/scripts/...). */
export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/** The `ferry` binary: `$FERRY_BIN`, else target/release/ferry, else target/debug/ferry. */
export function ferryBin(): string {
  const env = process.env["FERRY_BIN"];
  if (env) return env;
  for (const p of ["target/release/ferry", "target/debug/ferry"]) {
    const full = join(REPO_ROOT, p);
    if (existsSync(full)) return full;
  }
  throw new Error("no ferry binary: set FERRY_BIN or run `cargo build --release -p ferry-cli` (npm test does)");
}

/** `$FERRY_BIN`, or a freshly built release binary (`cargo build --release -p ferry-cli --locked`). */
export function ensureFerry(): string {
  const env = process.env["FERRY_BIN"];
  if (env) return env;
  console.error("building ferry (cargo build --release -p ferry-cli --locked); set FERRY_BIN to skip");
  const r = spawnSync("cargo", ["build", "--release", "-p", "ferry", "--locked"], { cwd: REPO_ROOT, stdio: "inherit" });
  if (r.error) throw new Error(`could not run cargo: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`cargo build failed (${r.status})`);
  return join(REPO_ROOT, "target", "release", "ferry");
}

/** Rejects with a clear message if `p` does not settle within `ms`. */
export function within<T>(ms: number, p: Promise<T>, what = "operation"): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`test timeout: ${what} took over ${ms} ms`)), ms);
  });
  return Promise.race([p, t]).finally(() => clearTimeout(timer));
}

let counter = 0;

/** A unique abstract name for this process. */
export function uniqueName(tag: string): string {
  counter += 1;
  return `ferry-ts-${tag}-${process.pid}-${counter}-${Math.random().toString(36).slice(2, 8)}`;
}

/** A running `ferry serve`. */
export interface Server {
  addr: string;
  proc: ChildProcess;
  /** The server's output so far (for failure messages). */
  output(): string;
  /** Kills the server (SIGKILL if `hard`) and waits for it to exit. */
  stop(hard?: boolean): Promise<void>;
}

/**
 * Starts `ferry serve ADDR` and waits for its `listening on` line. `kind: "path"` serves on
 * a socket file in a fresh temporary directory, `"abstract"` on a unique abstract name.
 */
export async function startServer(kind: "path" | "abstract" = "path", timeoutMs = 30_000): Promise<Server> {
  let dir: string | undefined;
  let addr: string;
  if (kind === "path") {
    dir = mkdtempSync(join(tmpdir(), "ferry-ts-"));
    addr = `unix:${join(dir, "s.sock")}`;
  } else {
    addr = `unix:${uniqueName("srv")}`;
  }
  const proc = spawn(ferryBin(), ["serve", addr], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  const ready = new Promise<void>((resolveReady, reject) => {
    const onData = (d: Buffer): void => {
      out += d.toString();
      if (out.includes("listening on")) resolveReady();
    };
    proc.stdout!.on("data", onData);
    proc.stderr!.on("data", onData);
    proc.once("error", reject);
    proc.once("exit", (code, sig) => reject(new Error(`ferry serve exited (${code ?? sig}) before listening: ${out}`)));
  });
  const exited = new Promise<void>((r) => proc.once("exit", () => r()));
  const server: Server = {
    addr,
    proc,
    output: () => out,
    stop: async (hard = false) => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(hard ? "SIGKILL" : "SIGTERM");
      await within(10_000, exited, "ferry serve to exit");
      if (dir) rmSync(dir, { recursive: true, force: true });
    },
  };
  try {
    await within(timeoutMs, ready, `ferry serve ${addr} to listen`);
  } catch (e) {
    await server.stop(true).catch(() => {});
    throw e;
  }
  return server;
}
