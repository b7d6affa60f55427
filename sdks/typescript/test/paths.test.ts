/** Where the tests look for the `ferry` binary: `$FERRY_BIN`, else cargo's target directory. */

import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { REPO_ROOT, cargoTargetDir, ferryBin } from "./helpers.js";

test("the target directory is $CARGO_TARGET_DIR when set, else target/ at the repository root", () => {
  assert.equal(cargoTargetDir({}), join(REPO_ROOT, "target"));
  assert.equal(cargoTargetDir({ CARGO_TARGET_DIR: "/elsewhere/t" }), "/elsewhere/t");
  // Relative, it is read from the repository root, as cargo run there reads it.
  assert.equal(cargoTargetDir({ CARGO_TARGET_DIR: "out/t" }), join(REPO_ROOT, "out", "t"));
});

test("ferryBin finds the binary under $CARGO_TARGET_DIR, release before debug", () => {
  const dir = mkdtempSync(join(tmpdir(), "ferry-target-"));
  try {
    const env = { CARGO_TARGET_DIR: dir };
    assert.throws(() => ferryBin(env), (e: Error) => e.message.includes(`no ferry binary in ${dir}/release`));
    mkdirSync(join(dir, "debug"));
    writeFileSync(join(dir, "debug", "ferry"), "");
    assert.equal(ferryBin(env), join(dir, "debug", "ferry"));
    mkdirSync(join(dir, "release"));
    writeFileSync(join(dir, "release", "ferry"), "");
    assert.equal(ferryBin(env), join(dir, "release", "ferry"));
    assert.equal(ferryBin({ ...env, FERRY_BIN: "/opt/ferry" }), "/opt/ferry");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
