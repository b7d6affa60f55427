// The installed ferry-client, loaded with require() (a CommonJS program).
"use strict";
const assert = require("node:assert/strict");
const ferry = require("ferry-client");
const demo = require("ferry-client/generated/demo");
const { check } = require("./common.cjs");

(async () => {
  // require() and import() give the same module (one Client class, one RpcError).
  const esm = await import("ferry-client");
  assert.equal(esm.Client, ferry.Client);
  assert.equal(esm.RpcError, ferry.RpcError);
  await check("require", ferry, demo);
  console.log("check.cjs: ok");
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
