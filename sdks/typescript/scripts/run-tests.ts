/**
 * `npm test`: makes sure there is a `ferry` binary (`$FERRY_BIN`, else
 * `cargo build --release -p ferry --locked` at the repository root), then runs every
 * compiled test file with node's test runner.
 */

import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = resolve(here, "../../../..");
const testDir = resolve(here, "../test");

/** `$FERRY_BIN`, or a freshly built release binary. */
export function ensureFerry(): string {
  const env = process.env["FERRY_BIN"];
  if (env) return env;
  console.error("npm test: building ferry (cargo build --release -p ferry --locked); set FERRY_BIN to skip");
  const r = spawnSync("cargo", ["build", "--release", "-p", "ferry", "--locked"], { cwd: repoRoot, stdio: "inherit" });
  if (r.error) throw new Error(`could not run cargo: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`cargo build failed (${r.status})`);
  return join(repoRoot, "target", "release", "ferry");
}

function main(): number {
  const bin = ensureFerry();
  const files = readdirSync(testDir)
    .filter((f) => f.endsWith(".test.js"))
    .sort()
    .map((f) => join(testDir, f));
  const r = spawnSync(process.execPath, ["--test", ...files], {
    stdio: "inherit",
    env: { ...process.env, FERRY_BIN: bin },
  });
  if (r.error) throw r.error;
  return r.status ?? 1;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) process.exit(main());
