/**
 * Test helpers: a real `ferry serve` child process (or another server's command line) on a
 * unique address, and timeouts for every await.
 */

import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (this file is build/test/helpers.js or build/scripts/...). */
export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");

/**
 * Cargo's target directory: `$CARGO_TARGET_DIR` (relative to the repository root, as cargo
 * reads it there), else `target/` at the repository root.
 */
export function cargoTargetDir(env: NodeJS.ProcessEnv = process.env): string {
  const dir = env["CARGO_TARGET_DIR"];
  return dir ? resolve(REPO_ROOT, dir) : join(REPO_ROOT, "target");
}

/** The `ferry` binary: `$FERRY_BIN`, else release/ferry, else debug/ferry in [`cargoTargetDir`]. */
export function ferryBin(env: NodeJS.ProcessEnv = process.env): string {
  const bin = env["FERRY_BIN"];
  if (bin) return bin;
  const target = cargoTargetDir(env);
  for (const profile of ["release", "debug"]) {
    const full = join(target, profile, "ferry");
    if (existsSync(full)) return full;
  }
  throw new Error(
    `no ferry binary in ${target}/release or ${target}/debug: set FERRY_BIN or run \`cargo build --release -p ferry-cli\` (npm test does)`,
  );
}

/** `$FERRY_BIN`, or a freshly built release binary (`cargo build --release -p ferry-cli --locked`). */
export function ensureFerry(): string {
  const env = process.env["FERRY_BIN"];
  if (env) return env;
  console.error("building ferry (cargo build --release -p ferry-cli --locked); set FERRY_BIN to skip");
  const r = spawnSync("cargo", ["build", "--release", "-p", "ferry-cli", "--locked"], { cwd: REPO_ROOT, stdio: "inherit" });
  if (r.error) throw new Error(`could not run cargo: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`cargo build failed (${r.status})`);
  return join(cargoTargetDir(), "release", "ferry");
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

/** A running `ferry serve` (or the server a `command` started). */
export interface Server {
  addr: string;
  proc: ChildProcess;
  /** The server's output so far (for failure messages). */
  output(): string;
  /** Kills the server (SIGKILL if `hard`) and waits for it to exit. */
  stop(hard?: boolean): Promise<void>;
}

/** How `startServer` starts its server. */
export interface StartOptions {
  /** `ferry serve --api API` (default: no `--api`, i.e. the demo API). */
  api?: string;
  /**
   * A command line to run instead of `ferry serve`: split on whitespace (no quoting), each
   * literal `{addr}` replaced by the address. It must print `listening on` (stdout or
   * stderr) once it serves. Empty or undefined: `$FERRY_BIN serve ADDR [--api API]`.
   */
  command?: string;
  /** How long to wait for `listening on` (default 30 s). */
  timeoutMs?: number;
}

/** The argv `startServer` runs: `opts.command` with `{addr}` filled in, else `ferry serve`. */
export function serverArgv(addr: string, opts: StartOptions = {}): string[] {
  const command = opts.command?.trim();
  if (!command) return [ferryBin(), "serve", addr, ...(opts.api ? ["--api", opts.api] : [])];
  const words = command.split(/\s+/);
  if (!words.some((w) => w.includes("{addr}"))) {
    throw new Error(`the server command ${JSON.stringify(command)} has no {addr} to put the address in`);
  }
  return words.map((w) => w.replaceAll("{addr}", addr));
}

/**
 * Starts `ferry serve ADDR` (or `opts.command`) and waits for its `listening on` line.
 * `kind: "path"` serves on a socket file in a fresh temporary directory, `"abstract"` on a
 * unique abstract name.
 */
export async function startServer(kind: "path" | "abstract" = "path", opts: StartOptions = {}): Promise<Server> {
  let dir: string | undefined;
  let addr: string;
  if (kind === "path") {
    dir = mkdtempSync(join(tmpdir(), "ferry-ts-"));
    addr = `unix:${join(dir, "s.sock")}`;
  } else {
    addr = `unix:${uniqueName("srv")}`;
  }
  let argv: string[];
  try {
    argv = serverArgv(addr, opts);
  } catch (e) {
    if (dir) rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  const what = opts.command?.trim() ? argv.join(" ") : `ferry serve ${addr}`;
  const proc = spawn(argv[0]!, argv.slice(1), { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  const ready = new Promise<void>((resolveReady, reject) => {
    const onData = (d: Buffer): void => {
      out += d.toString();
      if (out.includes("listening on")) resolveReady();
    };
    proc.stdout!.on("data", onData);
    proc.stderr!.on("data", onData);
    proc.once("error", (e) => reject(new Error(`could not run ${what}: ${e.message}`)));
    proc.once("exit", (code, sig) => reject(new Error(`${what} exited (${code ?? sig}) before listening: ${out}`)));
  });
  const exited = new Promise<void>((r) => {
    proc.once("exit", () => r());
    // A command that could not be started never exits.
    proc.once("error", () => {
      if (proc.pid === undefined) r();
    });
  });
  const server: Server = {
    addr,
    proc,
    output: () => out,
    stop: async (hard = false) => {
      if (proc.pid !== undefined && proc.exitCode === null && proc.signalCode === null) {
        proc.kill(hard ? "SIGKILL" : "SIGTERM");
      }
      await within(10_000, exited, `${what} to exit`);
      if (dir) rmSync(dir, { recursive: true, force: true });
    },
  };
  try {
    await within(opts.timeoutMs ?? 30_000, ready, `${what} to listen`);
  } catch (e) {
    await server.stop(true).catch(() => {});
    throw e;
  }
  return server;
}
