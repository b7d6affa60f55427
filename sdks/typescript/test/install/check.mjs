// The installed ferry-client, loaded with import (an ES module program).
import * as ferry from "ferry-client";
import * as demo from "ferry-client/generated/demo";
import { createRequire } from "node:module";
import assert from "node:assert/strict";

const require = createRequire(import.meta.url);
const { check } = require("./common.cjs");

assert.equal(require("ferry-client").Client, ferry.Client);
await check("import", ferry, demo);
console.log("check.mjs: ok");
