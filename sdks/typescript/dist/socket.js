/**
 * Opening the unix socket for an address (PROTOCOL.md §2).
 *
 * `unix:/path` (any REST with a `/`) is a socket file: `net.createConnection({ path })`.
 *
 * `unix:NAME` is a Linux abstract socket. Node 20's libuv (1.46) connects to
 * `"\0" + NAME` with the full `sizeof(sockaddr_un)` as the address length, so the kernel
 * looks for NAME padded with NUL bytes to 107 bytes, a different abstract name, and the
 * connection is refused. This module first tries Node's own connect (newer Node versions
 * get it right); when that is refused it asks a helper, a few lines of Python (`python3`,
 * or `$FERRY_PYTHON`), to connect to the exact name and hand the connected socket to this
 * process over Node's IPC channel (`SCM_RIGHTS`). The socket is then an ordinary Node
 * socket: no relay process, no extra copy. The helper is started once per process: the
 * first `unix:NAME` connect costs a Python start, the next ones milliseconds. A socket
 * file (`unix:/path/to.sock`) needs no helper: milliseconds from the first connect.
 */
import { spawn } from "node:child_process";
import * as net from "node:net";
import { ConnectionClosedError, FerryError, TimeoutError } from "./errors.js";
/** Parses `unix:NAME` or `unix:/path` (PROTOCOL.md §2). */
export function parseAddress(addr) {
    if (typeof addr !== "string" || !addr.startsWith("unix:")) {
        throw new FerryError(`unsupported address ${JSON.stringify(addr)}: expected unix:NAME or unix:/path/to.sock`);
    }
    const rest = addr.slice("unix:".length);
    if (rest.length === 0)
        throw new FerryError(`address ${JSON.stringify(addr)} has an empty name`);
    if (rest.includes("\0"))
        throw new FerryError("NUL bytes are not allowed in addresses");
    const bytes = Buffer.byteLength(rest, "utf8");
    if (rest.includes("/")) {
        if (bytes > 107)
            throw new FerryError(`socket path ${JSON.stringify(rest)} is ${bytes} bytes; at most 107`);
        return { kind: "path", path: rest };
    }
    if (rest.includes("\\"))
        throw new FerryError(`abstract name ${JSON.stringify(rest)} contains a backslash`);
    if (bytes > 100)
        throw new FerryError(`abstract name ${JSON.stringify(rest)} is ${bytes} bytes; at most 100`);
    return { kind: "abstract", name: rest };
}
function connectPath(path, onread) {
    return new Promise((resolve, reject) => {
        const s = net.createConnection({ path, onread });
        const onError = (e) => {
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
/*
 * The helper: one `python3` per Node process, started at the first `unix:NAME` connect and
 * kept (unref'd, so it never keeps Node alive) for the next ones, which then cost a
 * message round trip on the IPC channel (milliseconds) instead of a Python start (tens to
 * hundreds of milliseconds). It reads `{"ferry": "connect", "id", "name"}` lines and
 * answers each with the connected socket (`NODE_HANDLE`, `SCM_RIGHTS`) or an errno; it
 * exits when the channel closes, that is when this process exits.
 */
const HELPER = String.raw `
import json, os, socket
ch = socket.socket(fileno=int(os.environ["NODE_CHANNEL_FD"]))
def send(obj, fds=()):
    socket.send_fds(ch, [json.dumps(obj).encode() + b"\n"], list(fds))
buf = b""
while True:
    try:
        data = ch.recv(65536)
    except InterruptedError:
        continue
    if not data:
        break
    buf += data
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        try:
            req = json.loads(line)
        except ValueError:
            continue
        if not isinstance(req, dict) or req.get("ferry") != "connect":
            continue
        i = req.get("id")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("\0" + str(req.get("name")))
        except OSError as e:
            s.close()
            send({"ferry": "error", "id": i, "errno": e.errno, "message": str(e)})
        else:
            send({"cmd": "NODE_HANDLE", "type": "net.Native", "msg": {"ferry": "connected", "id": i}}, [s.fileno()])
            s.close()
`;
/** The running helper process, shared by every abstract-socket connect of this process. */
class Helper {
    python;
    child;
    waiting = new Map();
    nextId = 0;
    dead = null;
    stderr = "";
    constructor(python, child) {
        this.python = python;
        this.child = child;
        child.stderr?.on("data", (d) => {
            this.stderr = (this.stderr + d.toString()).slice(-2000);
        });
        child.on("error", (e) => this.fail(this.explain(e)));
        child.on("exit", (code) => {
            this.fail(new FerryError(`the abstract-socket helper (${python}) exited with ${code}: ${this.stderr.trim()}`));
        });
        child.on("message", (msg, handle) => this.answer(msg, handle));
        // Neither the process, its stderr nor (while no connect waits) its channel keeps
        // this process alive.
        child.unref();
        child.stderr?.unref();
        this.idle();
    }
    static current = null;
    /** The helper, started if there is none (or the last one died). */
    static get() {
        if (Helper.current === null || Helper.current.dead !== null) {
            const python = process.env["FERRY_PYTHON"] ?? "python3";
            // -S: no site-packages scan (the helper needs the standard library only).
            const child = spawn(python, ["-S", "-c", HELPER], {
                stdio: ["ignore", "ignore", "pipe", "ipc"],
                serialization: "json",
            });
            Helper.current = new Helper(python, child);
        }
        return Helper.current;
    }
    /** Asks the helper for a socket connected to the abstract `name`. */
    connect(name) {
        if (this.dead !== null)
            return Promise.reject(this.dead);
        const id = this.nextId++;
        return new Promise((resolve, reject) => {
            this.waiting.set(id, { resolve, reject });
            this.busy();
            this.child.send({ ferry: "connect", id, name }, (e) => {
                if (e)
                    this.settle(id)?.reject(e);
            });
        });
    }
    settle(id) {
        if (id === undefined)
            return undefined;
        const w = this.waiting.get(id);
        this.waiting.delete(id);
        if (this.waiting.size === 0)
            this.idle();
        return w;
    }
    answer(msg, handle) {
        if (msg?.ferry === "connected" && handle) {
            const w = this.settle(msg.id);
            if (w)
                w.resolve(handle);
            else
                handle.close?.(); // its connect timed out
        }
        else if (msg?.ferry === "error") {
            const e = new Error(`connect: ${msg.message}`);
            e.code = msg.errno === 111 ? "ECONNREFUSED" : msg.errno === 2 ? "ENOENT" : `ERRNO${msg.errno}`;
            e.errno = msg.errno;
            this.settle(msg.id)?.reject(e);
        }
    }
    fail(e) {
        if (this.dead !== null)
            return;
        this.dead = e;
        for (const w of this.waiting.values())
            w.reject(e);
        this.waiting.clear();
        if (this.child.connected)
            this.child.disconnect();
    }
    explain(e) {
        if (e.code !== "ENOENT")
            return e;
        return new FerryError(`cannot connect to an abstract socket: Node ${process.version} (libuv ${process.versions.uv}) ` +
            `pads abstract socket addresses, so ferry-client opens them with ${this.python}, which was not ` +
            "found. Install python3, set FERRY_PYTHON, or serve on a socket file (unix:/path/to.sock)", { cause: e });
    }
    /** While a connect waits, the channel keeps the process alive; otherwise it does not. */
    busy() {
        this.child.channel?.ref();
    }
    idle() {
        this.child.channel?.unref();
    }
}
/** Connects to an abstract name through the helper (see the module docs). */
async function connectAbstractViaHelper(name, onread) {
    const handle = await Helper.get().connect(name);
    return new net.Socket({ handle, onread, readable: true, writable: true });
}
/** Opens a connected socket for `addr` that reads through `onread`, within `timeoutMs`. */
export async function openSocket(addr, onread, timeoutMs) {
    const target = parseAddress(addr);
    const attempt = async () => {
        if (target.kind === "path")
            return connectPath(target.path, onread);
        try {
            return await connectPath(`\0${target.name}`, onread);
        }
        catch (e) {
            if (e.code !== "ECONNREFUSED")
                throw e;
            return connectAbstractViaHelper(target.name, onread);
        }
    };
    let timer;
    const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new TimeoutError(`connecting to ${addr} took over ${timeoutMs} ms`)), timeoutMs);
    });
    const pending = attempt();
    try {
        return await Promise.race([pending, timeout]);
    }
    catch (e) {
        // A socket that connects after the timeout is closed.
        pending.then((s) => s.destroy()).catch(() => { });
        if (e instanceof FerryError)
            throw e;
        const err = e;
        if (err.code === "ECONNREFUSED" || err.code === "ENOENT") {
            throw new ConnectionClosedError(`no ferry server at ${addr} (${err.code})`, undefined, { cause: e });
        }
        throw new FerryError(`connecting to ${addr}: ${err.message}`, { cause: e });
    }
    finally {
        clearTimeout(timer);
    }
}
