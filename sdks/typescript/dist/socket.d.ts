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
import * as net from "node:net";
/** Where a unix socket address points. */
export type SocketTarget = {
    kind: "path";
    path: string;
} | {
    kind: "abstract";
    name: string;
};
/** Parses `unix:NAME` or `unix:/path` (PROTOCOL.md §2). */
export declare function parseAddress(addr: string): SocketTarget;
/** Node's `onread` option: the socket reads into the buffer `buffer()` returns. */
export interface OnRead {
    buffer: () => Uint8Array;
    callback: (n: number, buf: Uint8Array) => boolean | void;
}
/** Opens a connected socket for `addr` that reads through `onread`, within `timeoutMs`. */
export declare function openSocket(addr: string, onread: OnRead, timeoutMs: number): Promise<net.Socket>;
