// Shared by check.cjs and check.mjs: starts `ferry serve` ($FERRY_BIN) on an abstract name
// and on a socket file, and checks one installed ferry-client against both.
"use strict";
const { spawn } = require("node:child_process");
const { mkdtempSync, rmSync } = require("node:fs");
const { tmpdir } = require("node:os");
const { join } = require("node:path");
const assert = require("node:assert/strict");

/** `ferry serve ADDR`, resolved once it prints `listening on`. */
function serve(addr) {
  const bin = process.env.FERRY_BIN;
  assert.ok(bin, "FERRY_BIN is not set (the ferry binary to serve the demo API)");
  const proc = spawn(bin, ["serve", addr], { stdio: ["ignore", "pipe", "inherit"] });
  return new Promise((resolve, reject) => {
    let out = "";
    proc.stdout.on("data", (d) => {
      out += d.toString();
      if (out.includes("listening on")) resolve(proc);
    });
    proc.on("exit", (code) => reject(new Error(`ferry serve ${addr} exited with ${code}: ${out}`)));
  });
}

/**
 * `ferry` is the package as imported (`import` or `require`), `demo` its generated demo
 * client module. Connects to both addresses, calls through the generated client, checks
 * its error classes, and reports the connect times.
 */
async function check(how, ferry, demo) {
  assert.equal(typeof ferry.Client, "function", `${how}: no Client`);
  assert.equal(typeof demo.DemoClient, "function", `${how}: no DemoClient`);
  const dir = mkdtempSync(join(tmpdir(), "ferry-ts-install-"));
  const addrs = [`unix:ferry-ts-install-${process.pid}-${how}`, `unix:${join(dir, "s.sock")}`];
  const servers = [];
  try {
    for (const addr of addrs) servers.push(await serve(addr));
    for (const addr of addrs) {
      for (let i = 0; i < 3; i++) {
        const t0 = performance.now();
        const client = await ferry.Client.connect(addr);
        const ms = performance.now() - t0;
        try {
          const api = new demo.DemoClient(client);
          assert.equal(await api.add({ a: 1, b: 2 }), 3);
          const t = ferry.Tensor.from([1, 2, 3], [3], "f32");
          const back = await api.echo({ tensor: t });
          assert.ok(back instanceof ferry.Tensor, `${how}: echo gave ${back}`);
          assert.ok(back.equals(t));
          await assert.rejects(
            api.add({ a: "one" }),
            (e) => e instanceof ferry.InvalidParamsError && e instanceof ferry.RpcError && e.code === -32602,
          );
        } finally {
          client.close();
        }
        console.log(`${how}: ${addr.includes("/") ? "socket file" : "abstract name"} connect ${ms.toFixed(1)} ms`);
      }
    }
  } finally {
    for (const s of servers) s.kill("SIGKILL");
    rmSync(dir, { recursive: true, force: true });
  }
}

module.exports = { check };
