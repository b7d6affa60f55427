/**
 * Opening the unix socket for an address (PROTOCOL.md §2).
 *
 * `unix:/path` (any REST with a `/`) is a socket file: `net.createConnection({ path })`.
 *
 * `unix:NAME` is a Linux abstract socket. Node 20's libuv (1.46) connects to
 * `"\0" + NAME` with the full `sizeof(sockaddr_un)` as the address length, so the kernel
 * looks for NAME padded with NUL bytes to 107 bytes, a different abstract name, and the
 * connection is refused. This module first tries Node's own connect (newer Node versions
 * get it right); when that is refused it runs a few lines of Python (`python3`, or
 * `$FERRY_PYTHON`) that connect to the exact name and hand the connected socket to this
 * process over Node's IPC channel (`SCM_RIGHTS`). The socket is then an ordinary Node
 * socket: no relay process, no extra copy.
 */

import { spawn } from "node:child_process";
import * as net from "node:net";

import { ConnectionClosedError, FerryError, TimeoutError } from "./errors.js";

/** Where a unix socket address points. */
export type SocketTarget = { kind: "path"; path: string } | { kind: "abstract"; name: string };

/** Parses `unix:NAME` or `unix:/path` (PROTOCOL.md §2). */
export function parseAddress(addr: string): SocketTarget {
  if (typeof addr !== "string" || !addr.startsWith("unix:")) {
    throw new FerryError(`unsupported address ${JSON.stringify(addr)}: expected unix:NAME or unix:/path/to.sock`);
  }
  const rest = addr.slice("unix:".length);
  if (rest.length === 0) throw new FerryError(`address ${JSON.stringify(addr)} has an empty name`);
  if (rest.includes("\0")) throw new FerryError("NUL bytes are not allowed in addresses");
  const bytes = Buffer.byteLength(rest, "utf8");
  if (rest.includes("/")) {
    if (bytes > 107) throw new FerryError(`socket path ${JSON.stringify(rest)} is ${bytes} bytes; at most 107`);
    return { kind: "path", path: rest };
  }
  if (rest.includes("\\")) throw new FerryError(`abstract name ${JSON.stringify(rest)} contains a backslash`);
  if (bytes > 100) throw new FerryError(`abstract name ${JSON.stringify(rest)} is ${bytes} bytes; at most 100`);
  return { kind: "abstract", name: rest };
}

/** Node's `onread` option: the socket reads into the buffer `buffer()` returns. */
export interface OnRead {
  buffer: () => Uint8Array;
  callback: (n: number, buf: Uint8Array) => boolean | void;
}

function connectPath(path: string, onread: OnRead): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path, onread } as net.IpcNetConnectOpts);
    const onError = (e: Error): void => {
      s.destroy();
      reject(e);
    };
    s.once("error", onError);
    s.once("connect", () => {
      s.off("error", onError);
      resolve(s);
    });
  });
}

const HELPER = String.raw`
import json, os, socket, sys
ch = socket.socket(fileno=int(os.environ["NODE_CHANNEL_FD"]))
def send(obj, fds=()):
    socket.send_fds(ch, [json.dumps(obj).encode() + b"\n"], list(fds))
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0" + sys.argv[1])
except OSError as e:
    send({"ferry": "error", "errno": e.errno, "message": str(e)})
else:
    send({"cmd": "NODE_HANDLE", "type": "net.Native", "msg": {"ferry": "connected"}}, [s.fileno()])
    s.close()
ch.settimeout(5)
try:
    ch.recv(4096)
except OSError:
    pass
`;

interface HelperReply {
  ferry?: string;
  errno?: number;
  message?: string;
}

/** Connects to an abstract name with a Python helper that hands the socket over (see the module docs). */
function connectAbstractViaHelper(name: string, onread: OnRead): Promise<net.Socket> {
  const python = process.env["FERRY_PYTHON"] ?? "python3";
  return new Promise((resolve, reject) => {
    let settled = false;
    let stderr = "";
    const child = spawn(python, ["-c", HELPER, name], {
      stdio: ["ignore", "ignore", "pipe", "ipc"],
      serialization: "json",
    });
    const finish = (err: Error | null, sock?: net.Socket): void => {
      if (settled) return;
      settled = true;
      if (child.connected) child.disconnect();
      child.unref();
      if (err) reject(err);
      else resolve(sock!);
    };
    child.stderr?.on("data", (d: Buffer) => {
      stderr += d.toString();
    });
    child.on("error", (e: NodeJS.ErrnoException) => {
      if (e.code === "ENOENT") {
        finish(
          new FerryError(
            `cannot connect to the abstract socket unix:${name}: Node ${process.version} (libuv ` +
              `${process.versions.uv}) pads abstract socket addresses, so ferry-client opens them with ` +
              `${python}, which was not found. Install python3, set FERRY_PYTHON, or serve on a socket ` +
              "file (unix:/path/to.sock)",
            { cause: e },
          ),
        );
      } else {
        finish(e);
      }
    });
    child.on("exit", (code) => {
      finish(new FerryError(`the abstract-socket helper (${python}) exited with ${code} without a socket: ${stderr.trim()}`));
    });
    child.on("message", (msg: HelperReply, handle?: unknown) => {
      if (msg?.ferry === "connected" && handle) {
        const sock = new net.Socket({ handle, onread, readable: true, writable: true } as net.SocketConstructorOpts);
        finish(null, sock);
      } else if (msg?.ferry === "error") {
        const e = new Error(`connect unix:${name}: ${msg.message}`) as NodeJS.ErrnoException;
        e.code = msg.errno === 111 ? "ECONNREFUSED" : msg.errno === 2 ? "ENOENT" : `ERRNO${msg.errno}`;
        e.errno = msg.errno;
        finish(e);
      }
    });
  });
}

/** Opens a connected socket for `addr` that reads through `onread`, within `timeoutMs`. */
export async function openSocket(addr: string, onread: OnRead, timeoutMs: number): Promise<net.Socket> {
  const target = parseAddress(addr);
  const attempt = async (): Promise<net.Socket> => {
    if (target.kind === "path") return connectPath(target.path, onread);
    try {
      return await connectPath(`\0${target.name}`, onread);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== "ECONNREFUSED") throw e;
      return connectAbstractViaHelper(target.name, onread);
    }
  };
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new TimeoutError(`connecting to ${addr} took over ${timeoutMs} ms`)), timeoutMs);
  });
  const pending = attempt();
  try {
    return await Promise.race([pending, timeout]);
  } catch (e) {
    // A socket that connects after the timeout is closed.
    pending.then((s) => s.destroy()).catch(() => {});
    if (e instanceof FerryError) throw e;
    const err = e as NodeJS.ErrnoException;
    if (err.code === "ECONNREFUSED" || err.code === "ENOENT") {
      throw new ConnectionClosedError(`no ferry server at ${addr} (${err.code})`, undefined, { cause: e });
    }
    throw new FerryError(`connecting to ${addr}: ${err.message}`, { cause: e });
  } finally {
    clearTimeout(timer);
  }
}
