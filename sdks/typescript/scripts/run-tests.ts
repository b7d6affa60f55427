/**
 * `npm test`: makes sure there is a `ferry` binary (`$FERRY_BIN`, else
 * `cargo build --release -p ferry-cli --locked` at the repository root), then runs every
 * compiled test file with node's test runner.
 */

import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { ensureFerry } from "../test/helpers.js";

const testDir = resolve(dirname(fileURLToPath(import.meta.url)), "../test");

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

process.exit(main());
